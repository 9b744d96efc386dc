"""Issue 28, defects 1, 4 and 7: another local user, the caches' contents and the build file's values.

* Another local user must not get code run as this one through a directory the tool keeps programs or
  trusted answers in (the link shim, the per-user caches): where the tests run as root, a second user is
  made for the test and plants what the old code trusted.
* A damaged cache entry is a miss everywhere (the per-user caches and the project's probe cache), so the
  build probes again and succeeds.
* ``$OFFLOAD_PARTIAL_SUFFIX`` and ``$OFFLOAD_ARCHS`` values that cannot work are one clear error each.
"""
from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections import UserList
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from offload_builders import toolchain
from offload_builders.cli import link_shim
from offload_builders.errors import OffloadError, TargetIDError, ToolchainError
from offload_builders.leftovers import check_partial_suffix
from offload_builders.private_dirs import (
    UnsafeDirectoryError,
    private_directory,
    replace_private_file,
    trusted_file_text,
)
from offload_builders.targets import offload_arch_words, parse_offload_archs
from offload_builders.toolchain import CACHE_FORMAT, ProbeCache

LLVM_BIN = Path("/usr/lib/llvm-19/bin")
SHIM_NAME = link_shim.shim_name()


def stored(key: str) -> str:
    """``key`` as a cache file holds it (with the entries' layout)."""
    return f"v{CACHE_FORMAT}:{key}"


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


# --------------------------------------------------------------------------------------------------
# Private directories, as any user.

def test_a_private_directory_is_made_0700_with_its_parents(tmp_path):
    made = private_directory(tmp_path / "a" / "b")
    assert made == tmp_path / "a" / "b" and mode(made) == 0o700 and mode(tmp_path / "a") == 0o700
    assert private_directory(made) == made  # checked again, unchanged


@pytest.mark.parametrize("bits", [0o777, 0o770, 0o720, 0o702])
def test_a_directory_others_may_write_is_refused(tmp_path, bits):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(bits)
    with pytest.raises(UnsafeDirectoryError, match="only this user may write"):
        private_directory(shared)


def test_a_path_through_a_directory_anyone_may_write_is_refused(tmp_path):
    """Without the sticky bit anyone may rename what is in it: the private directory below could be swapped."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(UnsafeDirectoryError, match="anyone may write"):
        private_directory(shared / "mine")
    assert not (shared / "mine").exists()
    shared.chmod(0o1777)  # sticky, as /tmp: entries are their owners' alone
    assert mode(private_directory(shared / "mine")) == 0o700


def test_links_of_this_user_are_followed_to_a_private_directory_only(tmp_path):
    real = private_directory(tmp_path / "real")
    (tmp_path / "link").symlink_to(real)
    assert private_directory(tmp_path / "link") == tmp_path / "link"
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    (tmp_path / "bad").symlink_to(shared)
    with pytest.raises(UnsafeDirectoryError):
        private_directory(tmp_path / "bad")
    (tmp_path / "file").write_text("")
    with pytest.raises(ToolchainError, match="not a directory"):
        private_directory(tmp_path / "file" / "below")
    with pytest.raises(ToolchainError, match="does not exist"):
        private_directory(tmp_path / "absent", create=False)


def test_a_file_is_trusted_only_when_it_is_this_users_alone(tmp_path):
    directory = private_directory(tmp_path / "d")
    replace_private_file(directory / "f", "text", 0o700)
    assert trusted_file_text(directory / "f") == "text" and mode(directory / "f") == 0o700
    (directory / "f").chmod(0o666)
    assert trusted_file_text(directory / "f") is None
    (directory / "g").symlink_to(directory / "f")
    (directory / "f").chmod(0o600)
    assert trusted_file_text(directory / "g") is None  # a link is never followed
    replace_private_file(directory / "g", "new")  # replaced, not written through
    assert (directory / "f").read_text() == "text" and not (directory / "g").is_symlink()
    assert sorted(os.listdir(directory)) == ["f", "g"]  # no temporary file left


# --------------------------------------------------------------------------------------------------
# The link shim, as any user.

@pytest.fixture
def shim_env(tmp_path, monkeypatch) -> Path:
    """Caches off, a home of the test's own, no runtime directory: the shim's last resort."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("OFFLOAD_BUILDERS_CACHE_DIR", "")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    return home


def test_with_the_caches_off_the_shim_goes_to_the_runtime_directory_else_the_home_cache(tmp_path, shim_env,
                                                                                         monkeypatch):
    directory = Path(link_shim.shim_dir())
    assert directory == shim_env / ".cache" / "offload-builders" / SHIM_NAME
    assert mode(directory) == 0o700 and mode(directory / "clang-linker-wrapper") == 0o700
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    assert Path(link_shim.shim_dir()) == runtime / "offload-builders" / SHIM_NAME
    assert not (tmp_path / "tmp").exists()  # never a shared temporary directory
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "absent"))  # no session directory: the home cache
    assert Path(link_shim.shim_dir()) == directory


def test_a_runtime_directory_others_may_write_is_refused(tmp_path, shim_env, monkeypatch):
    runtime = tmp_path / "run"
    runtime.mkdir()
    runtime.chmod(0o777)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    with pytest.raises(ToolchainError, match=r"^\$XDG_RUNTIME_DIR: .*only this user may write.*unset XDG_RUNTIME_DIR"):
        link_shim.shim_dir()


def test_a_tampered_shim_script_is_replaced(shim_env):
    directory = Path(link_shim.shim_dir())
    script = directory / "clang-linker-wrapper"
    text = script.read_text()
    script.chmod(0o777)
    assert Path(link_shim.shim_dir()) == directory and mode(script) == 0o700 and script.read_text() == text
    script.unlink()
    (directory / "elsewhere").write_text("#!/bin/sh\nexit 0\n")
    script.symlink_to(directory / "elsewhere")
    link_shim.shim_dir()
    assert not script.is_symlink() and script.read_text() == text


def test_a_link_at_the_shim_directorys_name_to_a_shared_directory_is_refused(tmp_path, shim_env):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    root = private_directory(shim_env / ".cache" / "offload-builders")
    (root / SHIM_NAME).symlink_to(shared)
    with pytest.raises(UnsafeDirectoryError):
        link_shim.shim_dir()
    assert os.listdir(shared) == []


def test_the_print_options_say_one_line_when_refused(tmp_path, shim_env):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    env = dict(os.environ, OFFLOAD_BUILDERS_CACHE_DIR=str(shared))
    for option in ("--print-shim-dir", "--print-link-args"):
        done = subprocess.run([sys.executable, "-m", "offload_builders.cli.link", option], env=env,
                              capture_output=True, text=True)
        assert done.returncode == 1 and done.stdout == "", done
        assert done.stderr.count("\n") == 1 and "only this user may write" in done.stderr, done.stderr


# --------------------------------------------------------------------------------------------------
# The per-user caches' directory and files, as any user.

def test_a_cache_directory_others_may_write_turns_the_caches_off_with_one_warning(tmp_path, monkeypatch, capsys):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv("OFFLOAD_BUILDERS_CACHE_DIR", str(shared))
    assert toolchain.user_cache_dir() is None and toolchain.user_cache("driver-probes.json") is None
    warnings = capsys.readouterr().err.splitlines()
    assert len(warnings) == 1 and "per-user caches are off" in warnings[0] and str(shared) in warnings[0], warnings
    shared.chmod(0o700)
    assert toolchain.user_cache_dir() == str(shared)  # checked at each use


def test_a_cache_file_others_may_write_is_not_read(tmp_path, monkeypatch):
    directory = private_directory(tmp_path / "cache")
    monkeypatch.setenv("OFFLOAD_BUILDERS_CACHE_DIR", str(directory))
    key = "k"
    (directory / "mine.json").write_text(json.dumps({stored(key): [["echo", "planted"]]}))
    (directory / "mine.json").chmod(0o666)
    cache = toolchain.user_cache("mine.json")
    assert cache is not None and cache.private and cache.get(key) is None
    cache.put(key, (("echo", "ours"),))
    cache.save()
    assert mode(directory / "mine.json") == 0o600  # rewritten, this user's alone
    assert ProbeCache(directory / "mine.json", private=True).get(key) == (("echo", "ours"),)


# --------------------------------------------------------------------------------------------------
# Another local user (the tests make one where they run as root).

@dataclass(frozen=True)
class OtherUser:
    name: str
    uid: int
    gid: int

    def run(self, script: str) -> None:
        """Run ``script`` with ``sh`` as this user (what the other user does on the machine)."""
        subprocess.run(["sh", "-ec", script], user=self.uid, group=self.gid, extra_groups=[], cwd="/",
                       check=True, capture_output=True, env={"PATH": "/usr/bin:/bin"})


@pytest.fixture
def other_user() -> Iterator[OtherUser]:
    if os.geteuid() != 0:
        pytest.skip("needs root to make a second local user (useradd) and act as that user")
    if shutil.which("useradd") is None or shutil.which("userdel") is None:
        pytest.skip("needs useradd and userdel to make a second local user")
    import pwd

    name = f"obt{os.getpid()}"
    subprocess.run(["useradd", "--no-create-home", "--user-group", "--shell", "/bin/false", name], check=True,
                   capture_output=True)
    try:
        entry = pwd.getpwnam(name)
        yield OtherUser(name, entry.pw_uid, entry.pw_gid)
    finally:
        subprocess.run(["userdel", name], check=False, capture_output=True)
        subprocess.run(["groupdel", name], check=False, capture_output=True)


@pytest.fixture
def sticky_tmp() -> Iterator[Path]:
    """A directory like /tmp (mode 1777) that both users reach (the test's own tmp_path is root's alone)."""
    directory = Path(tempfile.mkdtemp(prefix="offload-hardening-", dir="/tmp"))
    directory.chmod(0o1777)
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


PLANTED_WRAPPER = '#!/bin/sh\nid > "$(dirname "$0")/../PWNED"\nexec {real} "$@"\n'


def _plant_shim(user: OtherUser, directory: Path) -> None:
    """What the other user does: make ``directory`` world-writable with a clang-linker-wrapper of theirs."""
    wrapper = PLANTED_WRAPPER.format(real=LLVM_BIN / "clang-linker-wrapper")
    script = directory / "clang-linker-wrapper"
    user.run(f"mkdir -p '{directory}'; chmod 777 '{directory.parent}' '{directory}';"
             f" printf '%s' '{wrapper}' > '{script}'; chmod 777 '{script}'")


def _victim_env(home: Path, **variables: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in ("XDG_RUNTIME_DIR", "XDG_CACHE_HOME")}
    env.update({"HOME": str(home), "OFFLOAD_BUILDERS_CACHE_DIR": "", **variables})
    return env


def _offload_link(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "offload_builders.cli.link", *args], env=env, capture_output=True,
                          text=True)


def _is_private(directory: Path) -> bool:
    info = directory.lstat()
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and not info.st_mode & 0o022


def test_a_shim_directory_another_user_made_first_is_never_used(other_user, sticky_tmp, tmp_path):
    """The issue's repro: with the caches off, the old code's shim directory was
    ``$TMPDIR/offload-builders-<uid>/link-shim-<hash>``, a name anyone can compute; the other user makes it
    first, world-writable, with a clang-linker-wrapper of theirs. Now the shim goes elsewhere, and a program
    linked with the printed flags links through our shim: the planted wrapper never runs."""
    planted = sticky_tmp / f"offload-builders-{os.getuid()}" / SHIM_NAME
    _plant_shim(other_user, planted)
    home = tmp_path / "home"
    home.mkdir()
    env = _victim_env(home, TMPDIR=str(sticky_tmp))
    shim = _offload_link(env, "--print-shim-dir")
    assert shim.returncode == 0, shim.stderr
    directory = Path(shim.stdout.strip())
    assert directory == home / ".cache" / "offload-builders" / SHIM_NAME and _is_private(directory)
    args = _offload_link(env, "--print-link-args")
    assert args.returncode == 0, args.stderr
    assert f"-B{directory}" in args.stdout.split() and str(sticky_tmp) not in args.stdout
    source = tmp_path / "t.c"
    source.write_text("#include <omp.h>\n#include <stdio.h>\nint main(void) { int dev = 0;\n"
                      "#pragma omp target map(from: dev)\n  dev = !omp_is_initial_device();\n"
                      "  printf(\"on_device=%d\\n\", dev); return 0; }\n")
    clang = str(LLVM_BIN / "clang")
    subprocess.run([clang, "-fopenmp", "-fopenmp-targets=x86_64-unknown-linux-gnu", "-c", str(source), "-o",
                    str(tmp_path / "t.o")], check=True)
    runtime = _offload_link(env, "--print-runtime-dir").stdout.strip()
    subprocess.run([clang, *args.stdout.split(), str(tmp_path / "t.o"), "-o", str(tmp_path / "t"),
                    f"-Wl,-rpath,{runtime}"], check=True, env=env)
    ran = subprocess.run([str(tmp_path / "t")], capture_output=True, text=True,
                         env=dict(env, OMP_TARGET_OFFLOAD="MANDATORY"))
    assert ran.stdout == "on_device=1\n", ran.stdout + ran.stderr
    assert not (planted.parent / "PWNED").exists()


def test_a_runtime_directory_of_another_user_is_refused(other_user, sticky_tmp, tmp_path):
    runtime = sticky_tmp / "run"
    other_user.run(f"mkdir -m 700 '{runtime}'")
    _plant_shim(other_user, runtime / "offload-builders" / SHIM_NAME)
    home = tmp_path / "home"
    home.mkdir()
    for option in ("--print-shim-dir", "--print-link-args"):
        done = _offload_link(_victim_env(home, XDG_RUNTIME_DIR=str(runtime)), option)
        assert done.returncode == 1 and done.stdout == "", done
        assert done.stderr.count("\n") == 1 and "XDG_RUNTIME_DIR" in done.stderr, done.stderr
        assert f"uid {other_user.uid}" in done.stderr, done.stderr


def test_a_cache_directory_another_user_made_first_is_refused(other_user, sticky_tmp, tmp_path):
    """``OFFLOAD_BUILDERS_CACHE_DIR`` at a name in a shared directory that the other user took first (their
    directory, their shim, their driver probes): the shim is refused, the caches are off with one warning."""
    cache = sticky_tmp / "victim-cache"
    _plant_shim(other_user, cache / SHIM_NAME)
    other_user.run(f"chmod 755 '{cache}'; echo '{{}}' > '{cache}/driver-probes.json'")
    home = tmp_path / "home"
    home.mkdir()
    env = _victim_env(home, OFFLOAD_BUILDERS_CACHE_DIR=str(cache))
    done = _offload_link(env, "--print-link-args")
    assert done.returncode == 1 and done.stdout == "" and f"uid {other_user.uid}" in done.stderr, done
    code = ("from offload_builders import toolchain\n"
            "print(toolchain.user_cache_dir(), toolchain.user_cache('driver-probes.json'))\n"
            "toolchain.find_toolchain()\n")
    child = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert child.stdout == "None None\n"
    warnings = child.stderr.splitlines()
    assert len(warnings) == 1 and "caches are off" in warnings[0] and str(cache) in warnings[0], warnings
    assert sorted(os.listdir(cache)) == ["driver-probes.json", SHIM_NAME]  # nothing of ours written there


def test_a_link_planted_at_the_directorys_name_is_refused(other_user, sticky_tmp, tmp_path):
    """The other user's symbolic link at the name, even to a directory of ours that is private: they could
    point it elsewhere at any time."""
    ours = private_directory(tmp_path / "ours")
    theirs = sticky_tmp / "theirs"
    other_user.run(f"mkdir -m 777 '{theirs}'")
    home = tmp_path / "home"
    home.mkdir()
    for target in (ours, theirs):
        link = sticky_tmp / f"link-to-{target.name}"
        other_user.run(f"ln -s '{target}' '{link}'")
        done = _offload_link(_victim_env(home, OFFLOAD_BUILDERS_CACHE_DIR=str(link)), "--print-shim-dir")
        assert done.returncode == 1 and done.stdout == "", done
        assert "only this user may write" in done.stderr, done.stderr
    assert os.listdir(ours) == [] and os.listdir(theirs) == []


# --------------------------------------------------------------------------------------------------
# Damaged cache entries (defect 4).

def _job_key(language: str) -> str:
    return ProbeCache.key(str(LLVM_BIN / "clang"), language, ("-O2",), "/")


JOB = ["/usr/lib/llvm-19/bin/clang", "-cc1", "-o", "x.o"]


@pytest.mark.parametrize("value", [[[]], "junk", [[["nested"]]], [[1, 2]], [["a\0b"]], [], {"a": [["b"]]},
                                   [[""]], [JOB, []]])
def test_a_damaged_driver_probe_entry_is_a_miss(tmp_path, value):
    path = tmp_path / "probes.json"
    path.write_text(json.dumps({stored(_job_key("c++")): value}))
    assert ProbeCache(path).get(_job_key("c++")) is None


def test_driver_probe_entries_by_what_they_answer(tmp_path):
    path = tmp_path / "probes.json"
    entries = {stored(_job_key("c++")): [JOB], stored(_job_key("device-link")): [],
               stored(_job_key("host-link")): [], stored(_job_key("hip")): [JOB, JOB]}
    path.write_text(json.dumps(entries))
    cache = ProbeCache(path)
    assert cache.get(_job_key("c++")) == (tuple(JOB),) and cache.get(_job_key("hip")) == (tuple(JOB),) * 2
    assert cache.get(_job_key("device-link")) == () and cache.get(_job_key("host-link")) == ()
    path.write_text(json.dumps({stored(_job_key("host-link")): [JOB, JOB], _job_key("c++"): [JOB],
                                f"v{CACHE_FORMAT - 1}:{_job_key('c++')}": [JOB]}))
    cache = ProbeCache(path)
    assert cache.get(_job_key("host-link")) is None  # one job at most
    assert cache.get(_job_key("c++")) is None  # the entry of another layout
    cache.put(_job_key("c"), ())  # never read back: not kept
    cache.save()
    assert cache.get(_job_key("c")) is None and stored(_job_key("c")) not in json.loads(path.read_text())


@pytest.mark.parametrize(("name", "good", "bad"), [
    ("toolchains.json", [["clang version 19.1.7", "/usr/bin", "/usr/lib/clang/19"], ["", "/usr/bin/clang", "1", "2"]],
     [[["clang version 19.1.7", "/usr/bin", "/usr/lib/clang/19"], ["", "x"], ["extra"]],
      [["no version", "/usr/bin", "/r"], ["", "x"]], [["clang version 19.1.7", "bin", "/r"], ["", "x"]], [[]]]),
    ("nvptx-tools.json", [["7"]], [[["²"]], [["7", "8"]], [[""]], [["x"]], [], [[]]]),
    ("link-input-kinds.json", [["hip", "openmp"]], [[["Open MP"]], [], [["hip"], ["cuda"]]]),
    ("link-input-kinds.json", [[]], [[[""]]]),
    ("host-libraries.json", [], [[[]], [["x"]]]),
    ("device-symbols.json", [["f", "uw"], ["g", ""]], [[["f"]], [["", "u"]], [["f", "x"]], [["f", "wu"]]]),
])
def test_each_user_cache_checks_what_its_writer_puts_there(tmp_path, monkeypatch, name, good, bad):
    for index, (value, expected) in enumerate([(good, True)] + [(junk, False) for junk in bad]):
        directory = private_directory(tmp_path / f"cache{index}")  # a new file: a new cache object
        monkeypatch.setenv("OFFLOAD_BUILDERS_CACHE_DIR", str(directory))
        (directory / name).write_text(json.dumps({stored("k"): value}))
        (directory / name).chmod(0o600)
        cache = toolchain.user_cache(name)
        assert cache is not None and (cache.get("k") is not None) == expected, value


def test_a_damaged_toolchain_entry_is_probed_again(tmp_path):
    """A version line that is no version (kept by a crash, an edit) used to stop every build ("does not look
    like clang") until the file was deleted."""
    cache = tmp_path / "cache"
    env = dict(os.environ, OFFLOAD_BUILDERS_CACHE_DIR=str(cache))
    code = ("from offload_builders.toolchain import find_toolchain\n"
            f"print(find_toolchain({{'OFFLOAD_CLANG': '{LLVM_BIN / 'clang'}', 'PATH': ''}}).version)\n")
    first = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    entries = json.loads((cache / "toolchains.json").read_text())
    damaged = {key: [["clang version junk", "/usr/bin", "/r"], ["", "x"]] for key in entries}
    damaged.update({key.partition(":")[2]: [["clang version junk", "/usr/bin", "/r"], ["", "x"]] for key in entries})
    (cache / "toolchains.json").write_text(json.dumps(damaged))
    again = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert again.returncode == 0 and again.stdout == first.stdout, again.stderr
    kept = json.loads((cache / "toolchains.json").read_text())
    current = [value for key, value in kept.items() if key.startswith(f"v{CACHE_FORMAT}:")]
    assert current and all("clang version 19." in value[0][0] for value in current), current


#: Ways a cache entry is damaged: each value of a file replaced (``[[]]`` is the issue's), or the file's entries
#: moved to another layout (an older version's keys, with jobs that would fail the build if used).
DAMAGE = {
    "empty job": lambda key, value: {key: [[]]},
    "string": lambda key, value: {key: "junk"},
    "nested": lambda key, value: {key: [[["x"], {"y": 1}]]},
    "other layout": lambda key, value: {key.partition(":")[2]: [[]], f"v{CACHE_FORMAT + 1}:" + key.partition(":")[2]:
                                        [["/bin/false"]]},
}


@pytest.mark.slow
def test_damaged_probe_entries_in_both_caches_are_probed_again(tmp_path):
    """The issue's repro: every entry of the per-user ``driver-probes.json`` and of the project's
    ``.sconsign.offload-probes.json`` damaged (``[[]]``, junk, another layout); the build probes again,
    succeeds, and the program runs; the files hold good entries again."""
    from test_probes import LoggedProject

    project = LoggedProject(tmp_path / "proj")
    user = tmp_path / "user"
    env = dict(os.environ, OFFLOAD_BUILDERS_CACHE_DIR=str(user), PROCESS_LOG=str(project.log))
    project.scons(env=env)
    files = [user / "driver-probes.json", project.root / ".sconsign.offload-probes.json"]
    good = {path: json.loads(path.read_text()) for path in files}
    assert all(good.values())
    for name, damage in DAMAGE.items():
        for path in files:
            damaged: dict = {}
            for key, value in good[path].items():
                damaged.update(damage(key, value))
            path.write_text(json.dumps(damaged))
        shutil.rmtree(project.root / "build")
        project.processes()
        build = project.scons(env=env, check=False)
        assert build.returncode == 0, f"{name}: {build.output}"
        assert any("-###" in argv for argv in project.processes()), name  # probed again
        run = project.run_program()
        assert run.returncode == 0 and run.stdout == "on_device=1 sum=6048\n", f"{name}: {run.stdout}{run.stderr}"
        for path in files:
            cache = ProbeCache(path)
            kept = json.loads(path.read_text())
            assert all(cache.check(key.partition(":")[2], value) for key, value in kept.items()
                       if key.startswith(f"v{CACHE_FORMAT}:")), name
            assert {key for key in good[path]} <= set(kept), name


# --------------------------------------------------------------------------------------------------
# The build file's values (defect 7); the SCons tool raises these as its one UserError.

@pytest.mark.parametrize("suffix", ["/x", "x/y", "", ".", "..", "a b", ".p;x", ".p$x", "`x`", ".p\n", "x\\y"])
def test_a_partial_suffix_that_cannot_name_a_file_beside_its_target_is_refused(suffix):
    with pytest.raises(OffloadError) as refused:
        check_partial_suffix(suffix)
    message = str(refused.value)
    assert message.startswith("OFFLOAD_PARTIAL_SUFFIX ") and "\n" not in message.replace(repr(suffix), "")


@pytest.mark.parametrize("suffix", [".partial", ".tmp", "~", ".part-1", "_p", ".é"])
def test_usual_partial_suffixes_are_taken(suffix):
    assert check_partial_suffix(suffix) == suffix


@pytest.mark.parametrize(("value", "said"), [
    ({"x86_64"}, "it is a set"), (frozenset({"sm_90"}), "it is a set"), (b"sm_90", "it is bytes"),
    (None, "it is None"), (["x86_64", b"sm_90"], "it holds bytes"), (["x86_64", None], "it holds None"),
    (90, "it is a value of type int"), ({"sm_90": 1}, "it is a dict"), (("x86_64", 7), "it holds a value of type int"),
])
def test_offload_archs_of_another_type_name_the_variable_and_what_it_takes(value, said):
    with pytest.raises(TargetIDError) as refused:
        offload_arch_words(value)
    message = str(refused.value)
    assert message.startswith("OFFLOAD_ARCHS must be a list or tuple of target ID strings or one comma-separated"
                              " string") and said in message
    assert "{" not in message and "b'" not in message  # no repr of the value


@pytest.mark.parametrize(("value", "words"), [
    ("x86_64,sm_90", "x86_64,sm_90"), (["x86_64", "sm_90"], ("x86_64", "sm_90")),
    (("x86_64", ["sm_90", ("gfx90a",)]), ("x86_64", "sm_90", "gfx90a")), (UserList(["sm_90"]), ("sm_90",)),
    ([], ()),
])
def test_offload_archs_lists_and_strings_are_taken(value, words):
    assert offload_arch_words(value) == words
    if words:
        assert parse_offload_archs(offload_arch_words(value))


@pytest.mark.parametrize(("setting", "named"), [
    ("OFFLOAD_PARTIAL_SUFFIX='/x'", "OFFLOAD_PARTIAL_SUFFIX"),
    ("OFFLOAD_ARCHS={'x86_64'}", "OFFLOAD_ARCHS"),
    ("OFFLOAD_ARCHS=b'x86_64'", "OFFLOAD_ARCHS"),
    ("OFFLOAD_ARCHS=None", "OFFLOAD_ARCHS"),
])
def test_a_bad_variable_stops_the_build_with_one_line_before_any_command(tmp_path, setting, named):
    """Defect 7 through SCons: one ``scons: ***`` line naming the variable, no Python repr, nothing run."""
    (tmp_path / "SConstruct").write_text(
        "import offload_builders.scons\n"
        "env = Environment(tools=['default', 'offload'], toolpath=[offload_builders.scons.toolpath()])\n"
        f"env.Replace({setting})\n"
        "env.OffloadProgram('prog', ['k.cpp'])\n")
    (tmp_path / "k.cpp").write_text("int main() {\n#pragma omp target\n  {}\n  return 0;\n}\n")
    done = subprocess.run([sys.executable, "-m", "SCons", "-Q"], cwd=tmp_path, capture_output=True, text=True)
    errors = [line for line in done.stderr.splitlines() if line.startswith("scons: ***")]
    assert done.returncode == 2 and len(errors) == 1 and named in errors[0], done.stdout + done.stderr
    assert "{'" not in errors[0] and "b'" not in errors[0]
    assert sorted(path.name for path in tmp_path.iterdir() if not path.name.startswith(".sconsign")) == [
        "SConstruct", "k.cpp"]
