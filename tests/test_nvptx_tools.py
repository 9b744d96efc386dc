"""OpenMP NVPTX images the installed runtime loads: cubin ABIs, the choice of NVPTX tools, the nvJitLink nvlink,
the build-time refusal and offload-select's refusal (issue 27).

Facts checked on a real H100 (shared/reference/gpu-runs-and-remote.md): libomptarget 19 refuses CUDA 13's
ABI-8 cubins and loads CUDA 12.9's ABI-7 ones. Here, with no GPU, the tests read what the real tools write.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

from conftest import driver_library_flags
from offload_builders import nvptx_tools
from offload_builders.errors import ToolchainError
from offload_builders.formats import cubin
from offload_builders.selection import check_deployment, parse_device, select_file
from offload_builders.targets import TargetID
from offload_builders.toolchain import find_toolchain

PTX = ".version 7.8\n.target sm_90\n.address_size 64\n.visible .entry k() { ret; }\n"
REGION = r"""
#include <cstdio>
int main() {
  int n = 0;
#pragma omp target teams distribute parallel for map(tofrom: n) reduction(+: n)
  for (int i = 0; i < 64; ++i) n += i;
  std::printf("%d\n", n);
  return n == 2016 ? 0 : 1;
}
"""


@pytest.fixture(scope="module")
def wheel_tools() -> Path:
    found = nvptx_tools.wheel_directories()
    if found is None:
        pytest.fail("the CUDA 12 wheels (offload-builders[nvptx]) are missing: run the README's test command")
    return nvptx_tools.compose_wheel_tools(*found)


def _ptxas(ptxas: Path, tmp_path: Path, name: str, *args: str) -> Path:
    source, out = tmp_path / f"{name}.ptx", tmp_path / f"{name}.cubin"
    source.write_text(PTX)
    subprocess.run([str(ptxas), *args, "-arch", "sm_90", str(source), "-o", str(out)], check=True)
    return out


def test_the_headers_of_cuda_13_and_cuda_12_cubins_and_what_each_runtime_says(cuda, wheel_tools, tmp_path):
    new = cubin.read_file_header(str(_ptxas(cuda("ptxas"), tmp_path, "new")))
    old = cubin.read_file_header(str(_ptxas(wheel_tools / "bin" / "ptxas", tmp_path, "old")))
    assert (new.ei_abiversion, new.sm, new.e_flags & 0xFF) == (8, 90, 0x04)
    assert (old.ei_abiversion, old.sm, old.e_flags) == (7, 90, 0x5A055A)
    refusal = cubin.runtime_refusal(new, (19, 1, 7), 90)
    assert refusal is not None and "ABI 8" in refusal and cubin.UPSTREAM_ISSUE in refusal
    assert cubin.runtime_refusal(new, (21, 1, 1), 90) is not None
    assert cubin.runtime_refusal(new, (21, 1, 2), 90) is None
    assert cubin.runtime_refusal(new, (22,), 90) is None
    assert cubin.runtime_refusal(old, (19, 1, 7), 90) is None
    assert cubin.runtime_refusal(old, (22, 1, 0), 90) is None
    assert "compute capability 8.0" in (cubin.runtime_refusal(old, (19,), 80) or "")
    relocatable = cubin.read_file_header(str(_ptxas(wheel_tools / "bin" / "ptxas", tmp_path, "rel", "-c")))
    assert "not device-linked" in (cubin.runtime_refusal(relocatable, (19,), 90) or "")


def test_a_malformed_header_is_one_error_with_its_offset():
    with pytest.raises(Exception, match="offset 0x4: ELF class 1"):
        cubin.read_header(b"\x7fELF\x01\x01" + bytes(58), "x.cubin")
    with pytest.raises(Exception, match="truncated"):
        cubin.read_header(b"\x7fELF\x02\x01\x01", "x.cubin")


def test_nvjitlink_nvlink_keeps_abi_7_and_says_one_line_for_what_it_cannot(wheel_tools, tmp_path):
    relocatable = _ptxas(wheel_tools / "bin" / "ptxas", tmp_path, "rel", "-c")
    out = tmp_path / "linked.cubin"
    nvlink = str(wheel_tools / "bin" / "nvlink")
    subprocess.run([nvlink, "-o", str(out), "-arch", "sm_90", "-L", str(tmp_path), str(relocatable)], check=True)
    header = cubin.read_file_header(str(out))
    assert (header.ei_abiversion, header.e_type, header.sm) == (7, cubin.ET_EXEC, 90)
    with open(out, "rb") as f:
        assert any(section.name == ".text.k" for section in ELFFile(f).iter_sections())
    failed = subprocess.run([nvlink, "-o", str(out), "-arch", "sm_90", "-lfoo", str(relocatable)],
                            capture_output=True, text=True)
    assert failed.returncode == 1 and failed.stderr.count("\n") == 1 and "-lfoo" in failed.stderr
    bare = subprocess.run([sys.executable, "-m", "offload_builders.cli.nvlink", "-o", str(out), "-arch", "sm_90",
                           str(relocatable)], capture_output=True, text=True,
                          env={k: v for k, v in os.environ.items() if k != "OFFLOAD_NVJITLINK"})
    assert bare.returncode == 1 and "OFFLOAD_NVJITLINK" in bare.stderr and "Traceback" not in bare.stderr


def test_the_tools_for_openmp_images_write_what_the_runtime_loads():
    toolchain = find_toolchain()
    assert toolchain.major == 19
    assert nvptx_tools.written_abi(Path("/usr/local/cuda")) == 8  # CUDA 13: what libomptarget 19 refuses
    chosen = nvptx_tools.openmp_tools(toolchain, {})
    assert chosen is not None and chosen.abi == 7 and "wheels" in chosen.origin
    with pytest.raises(ToolchainError) as refused:
        nvptx_tools.openmp_tools(toolchain, {nvptx_tools.VARIABLE: "/usr/local/cuda"})
    message = str(refused.value)
    assert "\n" not in message and "libomptarget 19.1.7" in message and "ABI 8" in message
    assert cubin.UPSTREAM_ISSUE in message and "offload-builders[nvptx]" in message


def test_the_composed_directory_is_refused_when_another_may_write_it(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    os.chmod(shared, 0o777)
    with pytest.raises(ToolchainError, match="only this user may write"):
        nvptx_tools.private_directory(shared)
    link = tmp_path / "link"
    link.symlink_to(shared)
    with pytest.raises(ToolchainError):
        nvptx_tools.private_directory(link)
    assert oct(nvptx_tools.private_directory(tmp_path / "fresh").stat().st_mode & 0o777) == "0o700"


SCONSTRUCT = """
import offload_builders.scons
env = Environment(tools=["default", "offload"], toolpath=[offload_builders.scons.toolpath()],
                  OFFLOAD_ARCHS=["sm_90"], OFFLOAD_FLAGS=["-O2"])
env.OffloadProgram("region", ["region.cpp"])
"""


def _scons(directory: Path, **environ: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "SCons", "-Q"], cwd=directory, capture_output=True, text=True,
                          env={**os.environ, **environ})


def _symbols(image: Path) -> set[str]:
    with open(image, "rb") as f:
        elf = ELFFile(f)
        table = elf.get_section_by_name(".symtab")
        return {s.name for s in table.iter_symbols() if s.name and s["st_info"]["bind"] != "STB_LOCAL"}


def test_cuda_13_tools_under_the_llvm_19_runtime_stop_the_build_before_any_compile(tmp_path):
    (tmp_path / "SConstruct").write_text(SCONSTRUCT)
    (tmp_path / "region.cpp").write_text(REGION)
    done = _scons(tmp_path, OFFLOAD_NVPTX_TOOLS="/usr/local/cuda")
    assert done.returncode == 2, done.stdout + done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("scons: ***")]
    assert len(errors) == 1 and "libomptarget 19.1.7" in errors[0] and cubin.UPSTREAM_ISSUE in errors[0], errors
    assert not any(tmp_path.glob("*.o")) and not any(tmp_path.glob("*.bc"))


def test_the_cuda_12_configuration_gives_abi_7_images_with_the_drivers_kernels_and_symbols(tmp_path, wheel_tools):
    (tmp_path / "SConstruct").write_text(SCONSTRUCT)
    (tmp_path / "region.cpp").write_text(REGION)
    done = _scons(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    image = tmp_path / "region.sm_90.img"
    header = cubin.read_file_header(str(image))
    assert (header.ei_abiversion, header.e_type, header.sm) == (7, cubin.ET_EXEC, 90)
    assert select_file(tmp_path / "region", parse_device("sm_90")).ok
    assert check_deployment(tmp_path / "region", ["sm_90"], runtime=(19, 1, 7)) == []
    # The driver's one command with the same tools (its --cuda-path): the same kernels and symbols.
    driver = tmp_path / "driver"
    driver.mkdir()
    flags = driver_library_flags([TargetID("sm_90")])
    assert f"--cuda-path={wheel_tools}" in flags
    subprocess.run(["clang++-19", "-fopenmp", "--offload-arch=sm_90", "-O2", *flags, "-Wno-unknown-cuda-version",
                    str(tmp_path / "region.cpp"), "-o", str(driver / "region"), "-save-temps"], cwd=driver, check=True)
    images = [p for p in driver.iterdir() if p.name.endswith(".img") and "sm_90" in p.name]
    assert len(images) == 1
    assert cubin.read_file_header(str(images[0])).ei_abiversion == 7
    ours, theirs = _symbols(image), _symbols(images[0])
    assert ours == theirs and any(name.startswith("__omp_offloading_") for name in ours)


def test_offload_select_refuses_a_cuda_13_image_for_the_llvm_19_runtime_and_says_why(tmp_path):
    source = tmp_path / "region.cpp"
    source.write_text(REGION)
    program = tmp_path / "region"
    subprocess.run(["clang++-19", "-fopenmp", "--offload-arch=sm_90", "-O2", "--cuda-path=/usr/local/cuda",
                    "-Wno-unknown-cuda-version", "--libomptarget-nvptx-bc-path=/usr/lib/llvm-19/lib", str(source),
                    "-o", str(program)], check=True, cwd=tmp_path)
    refused = subprocess.run([sys.executable, "-m", "offload_builders.cli.select", "--device", "sm_90", str(program)],
                             capture_output=True, text=True)
    assert refused.returncode == 1 and "ABI 8" in refused.stderr and cubin.UPSTREAM_ISSUE in refused.stderr
    newer = subprocess.run([sys.executable, "-m", "offload_builders.cli.select", "--device", "sm_90",
                            "--device-cap", "libomptarget=22", str(program)], capture_output=True, text=True)
    assert newer.returncode == 0 and newer.stdout.strip() == "openmp-nvptx64-nvidia-cuda--sm_90"
    problems = check_deployment(program, ["sm_90"], runtime=(19, 1, 7))
    assert len(problems) == 1 and "ABI 8" in problems[0]


def test_the_wrap_refuses_to_register_an_image_the_runtime_would_not_load(cuda, wheel_tools, tmp_path):
    """The last line of defence, shared by OffloadProgram's wrap node and offload-link: an OpenMP NVPTX image
    from CUDA 13's tools (here ptxas's executable cubin) is one error, not a program that cannot load."""
    from offload_builders.errors import OffloadError
    from offload_builders.linking.wrapping import LinkedImage, registration_object

    toolchain = find_toolchain()
    new = _ptxas(cuda("ptxas"), tmp_path, "new")
    with pytest.raises(OffloadError, match=r"new\.cubin: the OpenMP runtime would not load this sm_90 image: "
                                           r"libomptarget 19\.1\.7 reads only cubin ELF ABI 7"):
        registration_object([LinkedImage(("nvptx64-nvidia-cuda", "sm_90"), str(new), frozenset({"openmp"}))],
                            toolchain, str(tmp_path / "scratch"))
    old = _ptxas(wheel_tools / "bin" / "ptxas", tmp_path, "old")
    wrapped = registration_object([LinkedImage(("nvptx64-nvidia-cuda", "sm_90"), str(old), frozenset({"openmp"}))],
                                  toolchain, str(tmp_path / "scratch"))
    assert wrapped is not None and wrapped[:4] == b"\x7fELF"
