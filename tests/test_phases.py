"""The phase model against the driver it is derived from.

The backbone: a fat object built phase by phase with our templates is byte-identical to the one
``clang++ -fopenmp ... -c`` builds in one process.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from conftest import driver_library_flags
from offload_builders.models.openmp import (
    HOST_OFFLOAD_TRIPLES,
    PhaseModel,
    ProbeError,
    parse_driver_jobs,
    probe,
)
from offload_builders.targets import parse_offload_archs, parse_target_id
from offload_builders.toolchain import find_toolchain

SOURCE = r"""
#include <cstdio>
#pragma omp declare target
int counter = 7;
#pragma omp end declare target
double sum(const double *x, int n) {
  double s = 0;
#pragma omp target teams distribute parallel for reduction(+ : s) map(to : x[0 : n])
  for (int i = 0; i < n; ++i) s += x[i] * counter;
  return s;
}
"""

FLAGS = ("-O2",)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("phases")
    (workdir / "kernel.cpp").write_text(SOURCE)
    return PhaseModel(find_toolchain(), workdir)


def _run(argv, cwd):
    subprocess.run(argv, cwd=cwd, check=True, capture_output=True)


def _build_by_phases(model: PhaseModel, targets, workdir: Path) -> Path:
    host = model.host_steps("c++", FLAGS)
    _run(host.frontend.render(source="kernel.cpp", main_file_name="kernel.cpp", output="k.host.bc"), workdir)
    images = []
    for tid in targets:
        steps = model.device_steps(tid, "c++", FLAGS)
        out = f"k.{tid.file_token}.dev{steps.compile_suffix}"
        _run(steps.compile.render(source="kernel.cpp", main_file_name="kernel.cpp", host_bc="k.host.bc", output=out),
             workdir)
        if steps.assemble is not None:
            assembled = f"k.{tid.file_token}.dev.cubin{steps.image_suffix}"
            _run(steps.assemble.render(input=out, output=assembled), workdir)
            out = assembled
        images.append((steps, out))
    _run(model.package_command(images, "k.pkg"), workdir)
    _run(host.embed.render(host_bc="k.host.bc", main_file_name="kernel.cpp", package="k.pkg", output="k.o"), workdir)
    return workdir / "k.o"


# The driver cannot combine -fopenmp-targets=x86_64 with --offload-arch, so mixed lists are checked
# per target here and for their images in test_mixed_cpu_and_gpu_object_carries_every_image.
@pytest.mark.parametrize("archs", ["x86_64", "sm_90", "gfx90a:xnack+", "sm_80,gfx942,gfx90a:xnack-"])
def test_fat_object_is_byte_identical_to_the_driver(model, archs):
    workdir = Path(model.cwd)
    targets = parse_offload_archs(archs)
    ours = _build_by_phases(model, targets, workdir).read_bytes()
    gpu = [str(t) for t in targets if t.kind != "host-cpu"]
    selection = ["-fopenmp-targets=x86_64-unknown-linux-gnu"] if not gpu else []
    if gpu:
        selection += [f"--offload-arch={','.join(gpu)}", *driver_library_flags(targets, FLAGS)]
    _run([str(model.toolchain.clangxx), "-fopenmp", *selection, *FLAGS, "-c", "kernel.cpp", "-o", "mono.o"], workdir)
    assert ours == (workdir / "mono.o").read_bytes()


def test_mixed_cpu_and_gpu_object_carries_every_image(model):
    workdir = Path(model.cwd)
    targets = parse_offload_archs("x86_64,sm_80,gfx942,gfx90a:xnack-")
    obj = _build_by_phases(model, targets, workdir)
    listing = subprocess.run([str(model.toolchain.tool("llvm-objdump")), "--offloading", str(obj)],
                             capture_output=True, text=True, check=True).stdout
    arches = [line.split()[1] if len(line.split()) > 1 else ""
              for line in listing.splitlines() if line.startswith("arch")]
    assert sorted(arches) == sorted(["", "sm_80", "gfx942", "gfx90a:xnack-"])


def test_host_bitcode_does_not_depend_on_the_device_triples(model):
    """Why the host front end runs once whatever $OFFLOAD_ARCHS says: its output ignores the triple list."""
    workdir = Path(model.cwd)
    outputs = []
    for triples in ["x86_64-unknown-linux-gnu", "nvptx64-nvidia-cuda", ",".join(HOST_OFFLOAD_TRIPLES)]:
        _run([str(model.toolchain.clangxx), "-fopenmp", f"-fopenmp-targets={triples}", "--offload-host-only",
              *FLAGS, "-emit-llvm", "-c", "-Xclang", "-disable-llvm-passes", "kernel.cpp", "-o", "h.bc"], workdir)
        outputs.append((workdir / "h.bc").read_bytes())
    assert outputs[0] == outputs[1] == outputs[2]


def test_device_job_of_one_target_ignores_the_others(model):
    """Why each target is probed alone: the driver gives a target the same device job in any company."""
    toolchain = model.toolchain
    alone = probe(str(toolchain.clangxx), "c++", ("-nogpulib", "--offload-arch=gfx942"), model.cwd)
    together = probe(str(toolchain.clangxx), "c++", ("-nogpulib", "--offload-arch=sm_80,gfx942,gfx90a"), model.cwd)

    def gfx942_job(jobs):
        (job,) = [j for j in jobs if "-fopenmp-is-target-device" in j and "gfx942" in j]
        return [a for a in job if "__offload_probe__" not in a]

    assert gfx942_job(alone) == gfx942_job(together)


def test_device_templates_follow_the_target(model):
    nvptx = model.device_steps(parse_target_id("sm_90"), "c++", FLAGS)
    assert nvptx.compile_suffix == ".s" and nvptx.assemble is not None
    rendered = nvptx.compile.render(source="a.cpp", main_file_name="a.cpp", host_bc="a.bc", output="a.s")
    assert rendered[rendered.index("-target-cpu") + 1] == "sm_90"
    assert rendered[rendered.index("-fopenmp-host-ir-file-path") + 1] == "a.bc"
    assert "--offload-device-only" not in rendered
    assert "sm_90" in nvptx.assemble.render(input="a.s", output="a.o")
    amd = model.device_steps(parse_target_id("gfx90a:xnack+"), "c++", FLAGS)
    assert amd.compile_suffix == ".bc" and amd.assemble is None
    assert "arch=gfx90a:xnack+" in amd.image_spec and "feature=+xnack" in amd.image_spec
    cpu = model.device_steps(parse_target_id("x86_64"), "c++", FLAGS)
    assert cpu.compile_suffix == ".o" and "arch=" in cpu.image_spec


def test_probe_is_memoized(model):
    first = model.device_steps(parse_target_id("sm_80"), "c++", ("-O1",))
    before = probe.cache_info()
    assert model.device_steps(parse_target_id("sm_80"), "c++", ("-O1",)) is first  # the model keeps its steps
    assert probe.cache_info() == before
    other = PhaseModel(model.toolchain, model.cwd, model.cache)
    assert other.device_steps(parse_target_id("sm_80"), "c++", ("-O1",)) == first  # the process keeps the probe
    after = probe.cache_info()
    assert after.misses == before.misses and after.hits == before.hits + 1


def test_rejected_flags_are_a_probe_error(model):
    with pytest.raises(ProbeError, match="unknown argument.*--no-such-flag"):
        model.device_steps(parse_target_id("x86_64"), "c++", ("--no-such-flag",))


def test_a_rejected_configuration_shows_the_drivers_error_first_and_briefly(model):
    """``-mcpu=`` on x86_64: the driver prints its error amid 5 KB of jobs; the message is the error line
    and a short reminder of the flags, not the jobs."""
    with pytest.raises(ProbeError) as caught:
        model.host_steps("c++", ("-O1", "-mcpu=nosuchcpu"))
    message = str(caught.value)
    assert message.startswith("clang") and ": error: unsupported option '-mcpu=' for target" in message.split(" (")[0]
    assert "-cc1" not in message and len(message) < 600, message
    assert "-mcpu=nosuchcpu" in message


def test_parse_driver_jobs_keeps_quoted_arguments():
    text = ' "/bin/clang" "-cc1" "-o" "a b.o"\nclang version 19\n "/bin/ptxas" "-c"\n'
    assert parse_driver_jobs(text) == [["/bin/clang", "-cc1", "-o", "a b.o"], ["/bin/ptxas", "-c"]]


def test_probe_cache_survives_the_process_and_notices_a_new_compiler(tmp_path, model):
    from offload_builders.models.openmp import ProbeCache

    driver = tmp_path / "clang++"
    driver.symlink_to(model.toolchain.clangxx)
    cache = ProbeCache(tmp_path / "probes.json")
    flags = ("-O2", "--offload-arch=sm_80", "-nogpulib")
    jobs = probe(str(driver), "c++", flags, model.cwd, cache)
    cache.save()
    reloaded = ProbeCache(tmp_path / "probes.json")
    key = ProbeCache.key(str(driver), "c++", flags, model.cwd)
    assert reloaded.get(key) == jobs
    # clang and clang++ are one binary in two driver modes: different keys.
    assert ProbeCache.key(str(model.toolchain.clang), "c++", flags, model.cwd) != \
        ProbeCache.key(str(model.toolchain.clangxx), "c++", flags, model.cwd)
    # A different compiler behind the same name is a miss.
    driver.unlink()
    driver.symlink_to(model.toolchain.tool("clang-offload-packager"))
    assert ProbeCache.key(str(driver), "c++", flags, model.cwd) != key


def test_a_fresh_tree_finds_its_probes_in_the_per_user_cache(tmp_path, model, monkeypatch):
    """`git clean -fdx` (or a new worktree at the same path) drops the project's probe cache; the driver is
    not asked again for a configuration this user has probed there before."""
    from offload_builders import toolchain
    from offload_builders.models.openmp import ProbeCache

    monkeypatch.setenv("OFFLOAD_BUILDERS_CACHE_DIR", str(tmp_path / "user"))
    log = tmp_path / "calls"
    driver = tmp_path / "bin" / "clang++"
    driver.parent.mkdir()
    driver.write_text(f'#!/bin/sh\necho probe >> {log}\nexec {model.toolchain.clangxx} "$@"\n')
    driver.chmod(0o755)
    flags = ("-O2", "--offload-arch=gfx90a", "-nogpulib")
    first = probe(str(driver), "c++", flags, model.cwd, ProbeCache(tmp_path / "tree1.json"))
    assert log.read_text().split() == ["probe"]
    probe.cache_clear()  # as in a new SCons process
    fresh = ProbeCache(tmp_path / "tree2.json")
    assert probe(str(driver), "c++", flags, model.cwd, fresh) == first
    assert log.read_text().split() == ["probe"]  # answered from the per-user cache
    assert fresh.get(ProbeCache.key(str(driver), "c++", flags, model.cwd)) == first  # and kept in the tree's
    probe.cache_clear()
    monkeypatch.setenv("OFFLOAD_BUILDERS_CACHE_DIR", "")
    again = probe(str(driver), "c++", flags, model.cwd, ProbeCache(tmp_path / "tree3.json"))
    assert log.read_text().split() == ["probe", "probe"]  # with the per-user caches off, the driver is asked
    assert [job[:2] for job in again] == [job[:2] for job in first]
    toolchain._PROBE_CACHES.pop(str(tmp_path / "user" / "driver-probes.json"), None)
