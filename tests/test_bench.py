"""``bench/bench_build.py --scale``: its generated trees are what it says, SCons trees with real files and the
signatures a real build records, so the no-ops it times are real no-ops (checked with SCons' own ``$SPAWN``)."""
from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO_ROOT
from test_scons_tool import SCONS

pytestmark = pytest.mark.slow


def _bench():
    spec = importlib.util.spec_from_file_location("bench_build", REPO_ROOT / "bench" / "bench_build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_build"] = module
    spec.loader.exec_module(module)
    return module


def _up_to_date(root: Path, mode: str, archs: str, *extra: str) -> bool:
    """SCons' question mode: exit status 0 only when every target is up to date (it runs nothing)."""
    return subprocess.run([SCONS, "-q", f"mode={mode}", f"archs={archs}", *extra], cwd=root,
                          stdout=subprocess.DEVNULL).returncode == 0


def _generated_trees(bench, tmp_path: Path, archs: list[str]) -> dict[str, Path]:
    """Both sides' generated trees of 3 sources (see the bench's docstring), built."""
    roots = {mode: tmp_path / f"{mode}-3" for mode in ("ours", "mono")}
    for root in roots.values():
        bench.generate(root, 3)
    bench.generated_build(tmp_path, roots, archs)
    return roots


def test_a_generated_tree_is_up_to_date_with_real_files_and_signatures(tmp_path):
    bench = _bench()
    archs = ["gfx90a", "sm_80"]
    roots = _generated_trees(bench, tmp_path, archs)
    for mode, root in roots.items():
        template = tmp_path / f"template-{mode}-{len(archs)}"
        assert _up_to_date(root, mode, ",".join(archs)), mode
        # every kernel's outputs are the template's kernel_0 files, under the kernel's own names
        outputs = sorted(path.name for path in (template / "src").iterdir() if path.name.startswith("kernel_0."))
        expected = {"kernel_0.cpp", "kernel_0.o"} | ({"kernel_0.host.bc", "kernel_0.sm_80.dev.cubin.o"}
                                                      if mode == "ours" else set())
        assert expected <= set(outputs), outputs
        for name in outputs:
            if not name.endswith(".cpp"):
                copy = root / "src" / name.replace("kernel_0.", "kernel_2.")
                assert copy.read_bytes() == (template / "src" / name).read_bytes(), copy
        # and the question is not vacuous: an edited source is out of date
        (root / "src" / "kernel_1.cpp").write_text(bench.source_text(1, device_edits=1))
        assert not _up_to_date(root, mode, ",".join(archs)), mode


@pytest.mark.parametrize(("model", "archs", "suffix", "outputs"), [
    ("hip", ["gfx90a", "gfx942"], ".hip", {"kernel_0.gfx90a.hsaco", "kernel_0.hipfb"}),
    ("cuda", ["sm_80", "sm_90"], ".cu", {"kernel_0.sm_80.cubin", "kernel_0.sm_80.dev.s", "kernel_0.fatbin"}),
])
def test_a_generated_hip_or_cuda_tree_is_up_to_date_with_real_files(tmp_path, monkeypatch, model, archs, suffix,
                                                                     outputs):
    """``--model hip``/``cuda``: both sides' generated trees of kernels (ours: our nodes; the driver's: one
    ``clang++ -x hip``/``-x cuda`` per source) are up to date, each kernel's outputs the template's; an edited
    kernel puts both out of date."""
    bench = _bench()
    monkeypatch.setattr(bench, "MODEL", model)
    roots = _generated_trees(bench, tmp_path, archs)
    for mode, root in roots.items():
        assert _up_to_date(root, mode, ",".join(archs), f"model={model}"), mode
        built = {path.name for path in (root / "src").iterdir()}
        expected = {f"kernel_{i}{suffix}" for i in range(3)} | {f"kernel_{i}.o" for i in range(3)}
        assert expected <= built and not any(name.startswith("main.") for name in built), sorted(built)
        if mode == "ours":
            assert {name.replace("kernel_0.", "kernel_2.") for name in outputs} <= built, sorted(built)
        template = tmp_path / f"template-{mode}-{len(archs)}"
        assert (root / "src" / "kernel_2.o").read_bytes() == (template / "src" / "kernel_0.o").read_bytes()
        edited = root / "src" / f"kernel_1{suffix}"
        edited.write_text("// edited\n" + edited.read_text())
        assert not _up_to_date(root, mode, ",".join(archs), f"model={model}"), mode


def test_the_floor_rows_count_what_scons_built_and_time_trivial_trees_of_as_many_nodes_and_inputs(tmp_path):
    """``--scale``'s "SCons floor" rows: as many trivial nodes as our tree has built nodes (counted from the
    ``.sconsign``, checked here against the files the build wrote), with one input each or with as many file and
    value inputs as ours have on average, in trees that are then up to date."""
    bench = _bench()
    archs = ["gfx90a", "sm_80"]
    roots = _generated_trees(bench, tmp_path, archs)
    for root in roots.values():
        written = [path for path in root.rglob("*") if path.is_file() and path.suffix != ".cpp"
                   and path.name != "SConstruct" and not path.name.startswith(".sconsign")]
        assert bench.built_graph(root).nodes == len(written) > 0, sorted(map(str, written))
    # the memory row: each side's SCons process reports its own peak (the driver's side also runs clang probes)
    memory = {mode: bench.peak_memory_mb(root, mode, archs, 2) for mode, root in roots.items()}
    assert all(10 < megabytes < 1000 for megabytes in memory.values()), memory
    graph, driver = bench.built_graph(roots["ours"]), bench.built_graph(roots["mono"])
    # per source (two kernels and main) the host bitcode, a device node per target and the object; per target the
    # extract and the image; the wrapper and the program: against the driver's object per source and program
    assert graph.nodes >= 3 * (2 + len(archs)) + 2 * len(archs) + 2 and graph.nodes > 4 * driver.nodes
    # a device compile reads its source and host bitcode and depends on the stamps of clang and the device libraries
    # it links; the driver's object has its source and the compiler, and no value node
    files, values = graph.inputs_per_node()
    assert files >= 2 and values >= 1 and driver.value_inputs == 0, graph
    for name, shape in (("floor", (1, 0)), ("floor-inputs", (files, values))):
        floor = tmp_path / name
        bench.floor_tree(floor, graph.nodes, *shape)
        assert len(list((floor / "out").iterdir())) == graph.nodes
        assert bench.built_graph(floor) == (graph.nodes, graph.nodes * shape[0], graph.nodes * shape[1])
        assert subprocess.run([SCONS, "-q", *bench.floor_arguments(graph.nodes, *shape)], cwd=floor).returncode == 0
        assert bench.floor_noop(graph.nodes, archs, *shape)("ours", floor) > 0


def test_headers_option_makes_every_kernel_depend_on_a_chain_of_headers(tmp_path, monkeypatch):
    """``--headers 3``: each kernel includes h0.h, which includes h1.h, which includes h2.h; a generated tree is
    up to date, and an edit of the last header alone puts both sides out of date (SCons found the chain)."""
    bench = _bench()
    monkeypatch.setattr(bench, "HEADERS", 3)
    archs = ["gfx90a", "sm_80"]
    roots = _generated_trees(bench, tmp_path, archs)
    for mode, root in roots.items():
        assert (root / "src" / "kernel_1.cpp").read_text().startswith('#include "h0.h"\n')
        assert (root / "src" / "h1.h").read_text().startswith('#include "h2.h"\n')
        assert _up_to_date(root, mode, ",".join(archs)), mode
        (root / "src" / "h2.h").write_text("inline int header_2() { return 22; }\n")
        assert not _up_to_date(root, mode, ",".join(archs)), mode


def test_the_cmake_trees_configure_and_are_up_to_date_after_a_build(tmp_path):
    """``--scale --cmake``: both sides' CMake trees (ours: the package's CMake module; mono: CMake driving the
    one-command driver with the driver side's device-library flags) configure with Ninja, build, and are then up to
    date (Ninja's dry run has no work); a reconfigure with one more target puts both out of date."""
    bench = _bench()
    archs = ["gfx90a", "sm_80"]
    for mode in ("ours", "mono"):
        root = tmp_path / mode
        bench.cmake_tree(root, 2)
        bench.cmake_configure(root, mode, archs)
        ninja_file = (root / "build" / "build.ninja").read_text()
        if mode == "ours":
            assert "offload-compile" in ninja_file and "--offload-arch" not in ninja_file
        else:
            assert "offload-compile" not in ninja_file and "--offload-arch=gfx90a,sm_80" in ninja_file
            assert "--rocm-device-lib-path=" in ninja_file  # the driver side's device-library flags
        assert not bench.cmake_up_to_date(root), mode
        bench.cmake_build(root)
        assert (root / "build" / "prog").is_file(), mode
        assert bench.cmake_up_to_date(root), mode
        bench.cmake_configure(root, mode, [*archs, "gfx942"])
        assert not bench.cmake_up_to_date(root), mode


def test_a_generated_cmake_tree_has_the_log_and_deps_of_a_compiled_one(tmp_path):
    """``--scale --cmake`` above ``--real-up-to``: a tree built through the stand-in is up to date, and Ninja's log
    and deps log hold what a compiled tree's hold (as many entries, the same dependencies under kernel_<n>'s names),
    on both sides; kernel_1's outputs are kernel_0's copies and the link ran nothing."""
    bench = _bench()
    archs = ["gfx90a", "sm_80"]

    def ninja_records(root: Path) -> tuple[int, str, int]:
        build = root / "build"
        deps = subprocess.run([bench.NINJA, "-C", str(build), "-t", "deps"], capture_output=True, text=True,
                              check=True).stdout
        shape = "\n".join(sorted(re.sub(r", deps mtime [0-9]+ [(].*[)]", "", line).strip()
                                  for line in deps.splitlines() if line.strip()))
        return len((build / ".ninja_log").read_text().splitlines()), shape, (build / ".ninja_deps").stat().st_size

    for mode in ("ours", "mono"):
        compiled, generated = tmp_path / "real" / mode, tmp_path / "made" / mode  # paths of one length
        for root, stand_in in ((compiled, False), (generated, True)):
            bench.cmake_tree(root, 3)
            bench.cmake_configure(root, mode, archs, stand_in)
        bench.cmake_build(compiled)
        bench.cmake_generated_build(generated, mode)
        assert bench.cmake_up_to_date(generated), mode
        real, made = ninja_records(compiled), ninja_records(generated)
        assert made[0] == real[0] and made[2] == real[2], (mode, real[0], made[0], real[2], made[2])
        assert made[1].replace(str(generated), "") == real[1].replace(str(compiled), ""), mode
        objects = "prog.offload/src" if mode == "ours" else "CMakeFiles/prog.dir/src"
        assert ((generated / "build" / objects / "kernel_1.cpp.o").read_bytes()
                == (generated / "build" / objects / "kernel_0.cpp.o").read_bytes()), mode
        assert (generated / "build" / "prog").stat().st_size == 0 < (compiled / "build" / "prog").stat().st_size
