"""The NVPTX device runtime's part of a device link as a step of its own (``offload_builders.linking.nvptx_runtime``),
against the real Clang 19 and CUDA: linked from the cubins' interface alone, the image is byte for byte the
one-step ``clang-nvlink-wrapper`` link's, with the driver's kernels, symbols and code."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from conftest import driver_library_flags
from offload_builders import linking
from offload_builders.linking import nvptx_runtime
from offload_builders.linking.nvptx_runtime import InterfaceSymbol
from offload_builders.targets import NVPTX_TRIPLE, parse_offload_archs
from offload_builders.toolchain import find_toolchain

KEY = (NVPTX_TRIPLE, "sm_80")

#: A generic-mode kernel: its state machine calls __kmpc_get_hardware_thread_id_in_block after the runtime
#: was linked into the device compile, so the cubin needs the runtime at link time.
GENERIC = """
#include <omp.h>
int on_device() {
  int on = 0;
  #pragma omp target map(from : on)
  on = !omp_is_initial_device();
  return on;
}
"""
#: An SPMD kernel: everything it calls from the runtime is inlined at compile time.
SPMD = """
void scale(double *x, int n) {
  #pragma omp target teams distribute parallel for map(tofrom : x[0 : n])
  for (int i = 0; i < n; ++i) x[i] *= 2;
}
"""


def test_the_empty_runtime_module_is_its_source_assembled(llvm19, tmp_path):
    source = nvptx_runtime.NO_RUNTIME_BITCODE.with_suffix(".ll")
    subprocess.run([str(llvm19("llvm-as")), str(source), "-o", str(tmp_path / "x.bc")], check=True)
    assert (tmp_path / "x.bc").read_bytes() == nvptx_runtime.NO_RUNTIME_BITCODE.read_bytes()


def test_stub_object_holds_exactly_the_interface(llvm19):
    symbols = [InterfaceSymbol("__kmpc_a", False, False), InterfaceSymbol("__kmpc_w", False, True),
               InterfaceSymbol("__omp_d", True, False), InterfaceSymbol("__omp_rtl_x", True, True)]
    stub = nvptx_runtime.stub_object(symbols)
    read = {(s.name, s.undefined, s.weak) for s in linking.device_symbols(stub, "stub")}
    assert read == {(s.name, not s.defined, s.weak) for s in symbols}
    listing = subprocess.run([str(llvm19("llvm-nm")), "-"], input=stub, capture_output=True, check=True).stdout.decode()
    assert [line.split()[-2:] for line in listing.splitlines()] == [
        ["U", "__kmpc_a"], ["w", "__kmpc_w"], ["T", "__omp_d"], ["W", "__omp_rtl_x"]], listing


def test_interface_text_round_trips_and_a_bad_line_names_the_file():
    symbols = [InterfaceSymbol("__kmpc_a", False, False), InterfaceSymbol("__omp_rtl_x", True, True)]
    text = nvptx_runtime.format_interface(symbols)
    assert text == b"__kmpc_a U\n__omp_rtl_x DW\n"
    assert nvptx_runtime.parse_interface(text, "x.syms") == symbols
    with pytest.raises(linking.LinkError, match=r"x\.syms:3: not a runtime-interface line"):
        nvptx_runtime.parse_interface(text + b"garbage\n", "x.syms")


@pytest.fixture(scope="module")
def objects(tmp_path_factory, llvm19, cuda) -> Path:
    """generic.o and spmd.o compiled by the driver for sm_80, with the device libraries the tool links."""
    work = tmp_path_factory.mktemp("nvptx-runtime")
    flags = ["-fopenmp", "--offload-arch=sm_80", "-O2", *driver_library_flags(parse_offload_archs("sm_80"))]
    for name, text in (("generic", GENERIC), ("spmd", SPMD)):
        (work / f"{name}.cpp").write_text(text)
        subprocess.run([str(llvm19("clang++")), *flags, "-c", f"{name}.cpp", "-o", f"{name}.o"], cwd=work, check=True)
    return work


def _link(job, files, directory: Path, image: Path) -> None:
    """The device link's own job on ``files`` (device files, in order)."""
    directory.mkdir()
    inputs = directory / "inputs.devin"
    linking.write_device_inputs(files, inputs)
    paths = linking.unpack_device_inputs(inputs, directory / "inputs")
    subprocess.run(linking.render_device_link(job, paths, str(image)), check=True)


def test_split_link_is_byte_identical_to_the_one_step_link(objects, tmp_path):
    toolchain = find_toolchain()
    runtime_archive = str(linking.device_runtime(toolchain))
    scanned = linking.scan_link_inputs([str(objects / "spmd.o"), str(objects / "generic.o"), runtime_archive])
    files = linking.select_device_files(scanned, KEY)
    job = linking.probe_device_link(toolchain, KEY, flags=["-O2"])
    assert job is not None and nvptx_runtime.is_nvlink_wrapper_job([str(job.argv[0])])
    _link(job, files, tmp_path / "one", tmp_path / "one.img")  # LTO of the runtime, ptxas and nvlink together

    split = nvptx_runtime.split_device_files(files, runtime_archive)
    assert split is not None and len(split.user) == 2 and len(split.runtime) == 1
    symbols = nvptx_runtime.interface(split)
    assert InterfaceSymbol("__kmpc_get_hardware_thread_id_in_block", False, False) in symbols
    assert all(not s.name.startswith("__omp_offloading_") for s in symbols)  # kernels are not in it
    (tmp_path / "syms").write_bytes(nvptx_runtime.format_interface(symbols))
    linking.write_device_inputs(list(split.runtime), tmp_path / "runtime.devin")
    (tmp_path / "scratch").mkdir()
    commands = nvptx_runtime.link_runtime(lambda inputs, out: linking.render_device_link(job, inputs, out), toolchain,
                                          KEY, str(tmp_path / "syms"), str(tmp_path / "runtime.devin"),
                                          str(tmp_path / "runtime.pkg"), str(tmp_path / "scratch"), toolchain.major)
    assert [os.path.basename(argv[0]) for argv in commands] == ["clang-nvlink-wrapper", "ptxas"]
    assert "--lto-emit-asm" in commands[0] and "-O2" in commands[1]
    runtime = nvptx_runtime.read_runtime_package(str(tmp_path / "runtime.pkg"))
    _link(job, [*runtime, *split.user], tmp_path / "split", tmp_path / "split.img")  # nvlink alone
    assert (tmp_path / "split.img").read_bytes() == (tmp_path / "one.img").read_bytes()


def test_nothing_to_split_without_a_runtime_member_or_with_user_bitcode(objects, tmp_path, llvm19):
    runtime_archive = str(linking.device_runtime(find_toolchain()))
    spmd_only = linking.select_device_files(linking.scan_link_inputs([str(objects / "spmd.o"), runtime_archive]), KEY)
    assert len(spmd_only) == 1 and nvptx_runtime.split_device_files(spmd_only, runtime_archive) is None
    # -foffload-lto: the user's device code is bitcode, which the runtime's LTO must see: one step.
    subprocess.run([str(llvm19("clang++")), "-fopenmp", "--offload-arch=sm_80", "-foffload-lto", "-O2", "-c",
                    str(objects / "generic.cpp"), "-o", str(tmp_path / "lto.o")], check=True)
    lto = linking.select_device_files(linking.scan_link_inputs([str(tmp_path / "lto.o"), runtime_archive]), KEY)
    assert len(lto) == 2 and nvptx_runtime.split_device_files(lto, runtime_archive) is None


def _sections(image: Path, llvm19) -> dict[str, bytes]:
    """The code sections of an image, by name."""
    listing = subprocess.run([str(llvm19("llvm-readelf")), "-S", "-W", str(image)], capture_output=True, text=True,
                             check=True).stdout
    names = [word for line in listing.splitlines() for word in line.split()[1:2] if word.startswith(".text")]
    found = {}
    for name in names:
        out = image.with_suffix(".section")
        subprocess.run([str(llvm19("llvm-objcopy")), f"--dump-section={name}={out}", str(image), os.devnull],
                       check=True)
        found[name] = out.read_bytes()
    return found


def _globals(image: Path, llvm19) -> list[str]:
    listing = subprocess.run([str(llvm19("llvm-nm")), "-S", "--defined-only", "--extern-only", str(image)],
                             capture_output=True, text=True, check=True).stdout
    return sorted(" ".join(line.split()[1:]) for line in listing.splitlines())


def test_the_split_image_has_the_drivers_kernels_symbols_and_code(objects, tmp_path, llvm19):
    """``clang++ -fopenmp --offload-arch=sm_80`` (clang-linker-wrapper's in-process LTO) links the same kernels
    and global symbols, of the same sizes, with the same code; only the sizes of the data sections
    ``.nv.global``/``.nv.constant3`` differ, as they did before the split (the wrapper's LTO, not the split)."""
    test_split_link_is_byte_identical_to_the_one_step_link(objects, tmp_path)
    flags = ["-fopenmp", "--offload-arch=sm_80", "-O2", *driver_library_flags(parse_offload_archs("sm_80"))]
    (tmp_path / "main.cpp").write_text("int main() { return 0; }\n")
    subprocess.run([str(llvm19("clang++")), *flags, "-save-temps", "main.cpp", str(objects / "generic.o"),
                    str(objects / "spmd.o"), "-o", "prog"], cwd=tmp_path, check=True, capture_output=True)
    driver, ours = tmp_path / "prog.nvptx64.sm_80.img", tmp_path / "split.img"
    assert _globals(ours, llvm19) == _globals(driver, llvm19)
    kernels = {name for obj in ("generic.o", "spmd.o") for name in linking.registered_entries(str(objects / obj))}
    assert len(kernels) == 2 and kernels <= set(" ".join(_globals(ours, llvm19)).split())
    assert _sections(ours, llvm19) == _sections(driver, llvm19)
