"""A project's path is data, never shell syntax (issue 28, defect 3).

Driver jobs hold the absolute top directory (``-fdebug-compilation-dir=``, ``-fcoverage-compilation-dir=``).
Under a directory named with a backtick or ``$(...)`` the tool used to hand such a word to ``sh -c`` in double
quotes, which ran the command in the name; one with a ``"`` broke the build. Only words of the user's own flags
written for the shell may reach one (README, "Construction variables"); every other word reaches its program
unchanged. The sample project and a small OpenMP project are copied under such directories, built and run, and
no command named in a path may leave its file anywhere.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from conftest import LLVM19_BIN, REPO_ROOT
from offload_builders.job_words import parse_driver_jobs

pytestmark = pytest.mark.slow

SCONS = str(Path(sys.executable).with_name("scons"))

#: Directory names that a shell would act on, each with the file its command would make (or none).
HOSTILE_DIRECTORIES = {
    "backtick": ("q4 `touch PWN4`", "-x"),
    "command-substitution": ("q5 $(touch PWN5)", "-x"),
    "double-quote": ('q1 "dq', "-x"),
    "single-quote": ("q2 'sq", "-x"),
}


def _pwned(*places: Path) -> list[Path]:
    """Files a command named in a project path would have made: under each place, and where the test runs."""
    found = [path for place in places for path in place.rglob("PWN*")]
    found += list(Path.cwd().glob("PWN*")) + list(Path(tempfile.gettempdir()).glob("PWN*"))
    return found


def _scons(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([SCONS, "-Q", *args], cwd=cwd, capture_output=True, text=True)


@pytest.mark.parametrize("kind", sorted(HOSTILE_DIRECTORIES))
def test_the_sample_builds_and_runs_under_a_path_a_shell_would_act_on(tmp_path, kind):
    """The sample as a user runs it (``scons`` builds and runs its OpenMP, HIP and CUDA programs, with
    ``OMP_TARGET_OFFLOAD=MANDATORY``): it passes, and nothing named in the path runs."""
    project = tmp_path.joinpath(*HOSTILE_DIRECTORIES[kind])
    shutil.copytree(REPO_ROOT / "sample_project", project, ignore=shutil.ignore_patterns("build", ".sconsign*"))
    done = _scons(project)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (project / "build" / "zaxpy.run.log").read_text().endswith("PASSED\n")
    assert (project / "build" / "mixed" / "mixed.run.log").read_text().endswith("PASSED\n")
    assert (project / "build" / "cuda" / "hetero.run.log").read_text().endswith("PASSED\n")
    assert _pwned(tmp_path) == []
    assert "is up to date" in _scons(project).stdout  # the words of the signatures are stable too
    assert _pwned(tmp_path) == []


SCONSTRUCT = textwrap.dedent("""\
    import offload_builders.scons
    env = Environment(tools=["default", "offload"], toolpath=[offload_builders.scons.toolpath()],
                      OFFLOAD_ARCHS="x86_64", OFFLOAD_FLAGS=["-O1", "-g"], CPPPATH=["#include"])
    # Written for the shell, the way SCons users write them: the shell drops the backslashes, and reads $ORIGIN.
    env.Append(CPPDEFINES=[("GREETING", '\\\\"it\\'s a fine day\\\\"')], LINKFLAGS=["-Wl,-rpath,\\\\$$ORIGIN"])
    if ARGUMENTS.get("wrapped"):  # not our renderer alone: SCons' own substitution and $ESCAPE run these
        env["OFFLOAD_HOSTCOM"] = "env $_OFFLOAD_HOST_CC1"
        env["OFFLOAD_DEVICECOM"] = "env $_OFFLOAD_DEVICE_CC1"
        env["OFFLOAD_DEVICELINKCOM"] = "env $_OFFLOAD_DEVICE_LINK_CMD"
    env.OffloadProgram("build/prog", ["src/main.cpp"])
""")

MAIN_CPP = textwrap.dedent("""\
    #include <cstdio>
    #include <omp.h>
    #include "greeting.hpp"
    int main() {
      int on_device = 0;
      #pragma omp target map(from : on_device)
      on_device = !omp_is_initial_device();
      std::printf("on_device=%d %s\\n", on_device, GREETING);
      return on_device ? 0 : 1;
    }
""")


def _small_project(root: Path) -> Path:
    (root / "src").mkdir(parents=True)
    (root / "include").mkdir()
    (root / "SConstruct").write_text(SCONSTRUCT)
    (root / "src" / "main.cpp").write_text(MAIN_CPP)
    (root / "include" / "greeting.hpp").write_text("#ifndef GREETING\n#define GREETING \"none\"\n#endif\n")
    return root


def _run(program: Path) -> subprocess.CompletedProcess:
    environ = dict(os.environ, LD_LIBRARY_PATH="/usr/lib/llvm-19/lib", OMP_TARGET_OFFLOAD="MANDATORY")
    return subprocess.run([str(program)], capture_output=True, text=True, env=environ)


@pytest.mark.parametrize(("kind", "wrapped"), [
    ("backtick", False), ("command-substitution", False), ("double-quote", False),
    # Not "command-substitution" wrapped: with -g the signature keeps the top directory, and SCons' own
    # signature of a wrapped line stops at a word holding "$(" ("Unbalanced $(/$)"), before anything runs.
    ("backtick", True), ("double-quote", True), ("single-quote", True),
])
def test_flags_for_the_shell_and_a_hostile_path_in_one_command(tmp_path, kind, wrapped):
    """One ``-cc1`` line holds both: the user's define written for the shell reaches the compiler as SCons means
    it, the top directory (``-g``: it is recorded in the debug info) as it is, with the tool's own commands
    (argv) and with a wrapper in front (SCons' substitution, our quoting); the host link with a flag for the
    shell goes through SCons' line, its file names quoted."""
    project = _small_project(tmp_path.joinpath(*HOSTILE_DIRECTORIES[kind]))
    done = _scons(project, *(["wrapped=1"] if wrapped else []))
    assert done.returncode == 0, done.stdout + done.stderr
    run = _run(project / "build" / "prog")
    assert run.returncode == 0 and run.stdout == "on_device=1 it's a fine day\n", run.stdout + run.stderr
    dynamic = subprocess.run([str(LLVM19_BIN / "llvm-readelf"), "-d", str(project / "build" / "prog")],
                             capture_output=True, text=True, check=True).stdout
    assert "$ORIGIN" in dynamic
    # The debug info of the host and the device code records the project's directory exactly as it is.
    for obj in ("main.o", "main.x86_64.dev.o"):
        assert str(project).encode() + b"\0" in (project / "src" / obj).read_bytes(), obj
    assert _pwned(tmp_path) == []


def test_driver_jobs_are_read_as_the_driver_prints_them(tmp_path):
    """``clang -###`` escapes ``"``, ``\\`` and ``$`` with a backslash inside double quotes; ``shlex.split`` kept
    the backslash of ``\\$`` (a word the job never had). Each flag comes back exactly as it was passed."""
    flags = ["-DA=x$y", '-DB="q" \\s\\', "-DC=`t` $(u)", "-DD=it's", "-DE=tab\there", "-DF=ünï cödé"]
    source = tmp_path / "p$q.cpp"
    source.write_text("")
    done = subprocess.run([str(LLVM19_BIN / "clang++"), "-###", "-c", str(source), *flags],
                          capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    (job,) = [job for job in parse_driver_jobs(done.stderr) if "-cc1" in job]
    assert [job[index + 1] for index, word in enumerate(job) if word == "-D"] == [flag[2:] for flag in flags]
    assert job[-1] == str(source) and f"-fdebug-compilation-dir={tmp_path}" in job


def test_only_the_users_words_for_the_shell_reach_one():
    """The spawn's choice, word by word: a word the driver made runs as argv even where a shell would act on
    it; where the user's own word needs the shell, every other word is quoted for it."""
    from offload_builders.scons import actions

    top = "/tmp/q4 `touch PWN4`/-x"
    job = ["/usr/bin/clang", "-cc1", f"-fdebug-compilation-dir={top}", "-D", "V=\\\"1.0\\\"", "-o", "a$b.o"]
    assert actions._command("/bin/sh", job, frozenset()) == job
    user = frozenset({"-DV=\\\"1.0\\\"", "V=\\\"1.0\\\""})  # what _user_shell_words gives for that define
    shell, dash_c, line = actions._command("/bin/sh", job, user)
    assert (shell, dash_c) == ("/bin/sh", "-c")
    echoed = subprocess.run(["/bin/sh", "-c", f"printf '%s\\n' {line.split(' ', 1)[1]}"], capture_output=True,
                            text=True, check=True).stdout.splitlines()
    assert echoed == ["-cc1", f"-fdebug-compilation-dir={top}", "-D", 'V="1.0"', "-o", "a$b.o"]
    # An -f...= value the user wrote for the shell, repeated under another option, is still theirs.
    assert actions._from_user("-fdebug-prefix-map=/a\\ b=.", frozenset({"/a\\ b=."}))
    assert not actions._from_user(f"-fdebug-compilation-dir={top}", frozenset({"/a\\ b=.", "V=\\\"1.0\\\""}))
