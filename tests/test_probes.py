"""Driver probes never leak into real commands and settle: asked once per key, answered or failed.

The projects are the SCons tool tests' (``test_scons_tool.Project``); an audit hook in the SConstruct
logs the argv of every process the SCons process starts, so a test sees each probe and each command.
"""
from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest

from test_scons_tool import PHASE_COMMANDS, SCONSTRUCT, Project

pytestmark = pytest.mark.slow

#: Logs every process the SCons process starts (probes included) to ``$PROCESS_LOG``, one JSON argv a line.
PROCESS_LOG_HOOK = textwrap.dedent("""
    import json as _json, os as _os, sys as _sys
    def _log_processes(event, args, _path=_os.environ.get("PROCESS_LOG")):
        if _path and event == "subprocess.Popen":
            with open(_path, "a") as log:
                log.write(_json.dumps([str(arg) for arg in args[1]]) + "\\n")
    _sys.addaudithook(_log_processes)
""")

#: Run inside the SConstruct: print every phase command of the program as it would run, one a line.
PRINT_COMMANDS = PHASE_COMMANDS + textwrap.dedent("""
    for node, action, targets, sources, env_, executor in phase_commands():
        argv = action.process(targets, sources, env_, executor)[0][0]
        print("rendered", json.dumps([str(node), [str(arg) for arg in argv]]))
""")

#: The SConscript with a library node in ``$LIBS``, the README's pattern for ``OffloadStaticLibrary``.
LIBRARY_SCONSCRIPT = textwrap.dedent("""
    Import("env")
    lib = env.OffloadStaticLibrary("scale", ["scale.cpp"])
    env.OffloadProgram("prog", ["main.cpp"], LIBS=[lib])
""")


class LoggedProject(Project):
    """A project whose SConstruct logs the processes SCons starts."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        (root / "SConstruct").write_text("import json\n" + PROCESS_LOG_HOOK + SCONSTRUCT)
        self.log = root.parent / "processes.log"

    def processes(self) -> list[list[str]]:
        """The processes started since the last call, without SCons' own compiler detection (the
        ``default`` tools ask ``gcc --version``)."""
        lines = self.log.read_text().splitlines() if self.log.exists() else []
        self.log.unlink(missing_ok=True)
        started = [json.loads(line) for line in lines]
        return [argv for argv in started if os.path.basename(argv[0]) not in ("gcc", "g++")]

    def scons_logged(self, *args: str, check: bool = True):
        return self.scons(*args, env=dict(os.environ, PROCESS_LOG=str(self.log)), check=check)


@pytest.fixture
def project(tmp_path) -> LoggedProject:
    return LoggedProject(tmp_path / "proj")


def _device_links(processes: list[list[str]]) -> list[list[str]]:
    return [argv for argv in processes if any(arg.endswith(".img.partial") for arg in argv)]


def test_a_library_node_in_libs_settles_its_device_link_probe(project):
    """``LIBS=[library node]``: the device-link probe sees a placeholder for the archive, so it succeeds,
    the device link runs the driver's own ``ld.lld`` job, and a no-op rebuild starts no process at all."""
    (project.root / "src" / "SConscript").write_text(LIBRARY_SCONSCRIPT)
    build = project.scons_logged()
    assert build.count("DEVICELINK") == 1 and build.count("LINK") == 1
    links = _device_links(project.processes())
    assert len(links) == 1 and os.path.basename(links[0][0]) == "ld.lld", links
    assert "build/libscale.a" in links[0]  # the real archive where the probe had its placeholder
    run = project.run_program()
    assert run.returncode == 0, run.stdout + run.stderr
    again = project.scons_logged()
    assert again.commands == [] and "is up to date" in again.output
    assert project.processes() == []


def test_a_failed_device_link_probe_warns_once_and_is_not_asked_again(project):
    """The driver rejects the device-link flags: one warning with its message and the command, then the
    link runs the driver command (which fails the same way); the next run does not probe again."""
    (project.root / "SConstruct").write_text(project.root.joinpath("SConstruct").read_text().replace(
        "SConscript(", 'env["OFFLOAD_TARGET_LINKFLAGS"] = {"x86_64": ["--no-such-driver-flag"]}\nSConscript('))
    failed = project.scons_logged(check=False)
    assert failed.returncode != 0
    warnings = [line for line in failed.output.splitlines() if "device-link probe failed" in line]
    assert len(warnings) == 1, failed.output
    assert "unknown argument: '--no-such-driver-flag'" in warnings[0], warnings
    assert "--target=x86_64-unknown-linux-gnu" in warnings[0] and "-###" in warnings[0], warnings
    probes = [argv for argv in project.processes() if "-###" in argv and "--no-such-driver-flag" in argv]
    assert len(probes) == 1, probes
    again = project.scons_logged(check=False)
    assert again.returncode != 0 and "device-link probe failed" not in again.output
    started = project.processes()
    assert not [argv for argv in started if "-###" in argv], started
    assert [os.path.basename(argv[0]) for argv in _device_links(started)] == ["clang-19"] or \
        [os.path.basename(argv[0]) for argv in _device_links(started)] == ["clang"]


def _rendered(project: LoggedProject, tmp_path: Path, *args: str) -> list[tuple[str, list[str]]]:
    """Each phase command, with its node (an NVPTX device node has two: the compile and ptxas)."""
    script = tmp_path / "print_commands.py"
    script.write_text(PRINT_COMMANDS)
    output = project.scons(*args, f"check_render={script}", "-n").output
    return [tuple(json.loads(line[len("rendered "):])) for line in output.splitlines() if line.startswith("rendered ")]


@pytest.mark.parametrize("ccflags", ["-MMD -MF ${TARGET}.d", "-MMD"])
def test_dependency_files_name_no_probe_path_and_belong_to_one_node(project, tmp_path, ccflags):
    """``-MMD -MF ${TARGET}.d`` (SCons' ninja tool adds it) or a bare ``-MMD``: no rendered command names a
    probe file, the host front end writes the dependency file the driver would write for the object
    (``-MT`` the object), and no other node writes one."""
    archs = "archs=x86_64,sm_80,gfx90a"
    build = project.scons(archs, f"ccflags={ccflags}")
    assert build.count("LINK") == 1
    commands = _rendered(project, tmp_path, archs, f"ccflags={ccflags}")
    assert len(commands) == 2 * 6 + 3, sorted(commands)  # per source host, embed, 3 devices, 1 assemble; 3 links
    assert len({node for node, _ in commands}) == 2 * 5 + 3  # the sm_80 compile and its ptxas: one node
    for node, argv in commands:
        assert not [arg for arg in argv if "offload-probe" in arg or "__offload_probe__" in arg], (node, argv)
    writers = {node: argv[argv.index("-dependency-file") + 1] for node, argv in commands
               if "-dependency-file" in argv}
    suffix = ".o.d" if "TARGET" in ccflags else ".d"
    assert writers == {"build/main.host.bc": f"build/main{suffix}", "build/scale.host.bc": f"build/scale{suffix}"}
    for node, argv in commands:
        if node in writers:
            assert argv[argv.index("-MT") + 1] == node.replace(".host.bc", ".o")
    dependencies = (project.root / f"build/scale{suffix}").read_text()
    assert dependencies.startswith("build/scale.o: src/scale.cpp") and "scale.hpp" in dependencies
    run = project.run_program()
    assert run.returncode == 0, run.stdout + run.stderr
