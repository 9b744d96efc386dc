"""scripts/gpu-check, with the real toolchain and no GPU: ``--bundle DIR --arch sm_90`` builds the GPU check
programs (sample_project/gpu) and writes a bundle that runs on a GPU machine without LLVM or the CUDA toolkit.

* Every shared library of the bundle's programs and libraries resolves from ``DIR/lib`` alone, or is a C/C++
  system library (which, with the NVIDIA driver's libcuda, the GPU machine has).
* ``DIR/run`` is valid bash; here, without a driver, it fails loudly; with ``GPU_CHECK_HOST_DEVICE=1`` it runs the
  OpenMP check on the x86_64 host-plugin device with the bundle's own libomptarget, and passes.
* The OpenMP program has an sm_90 image that libomptarget 19 loads (``offload-select``'s cubin checks); the CUDA
  program's host side registers only kernels that its sm_90 cubin defines (a kernel it names but the cubin lacks
  is CUDA's "named symbol not found" on the GPU).
"""
from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

from conftest import LLVM19_BIN, REPO_ROOT

pytestmark = pytest.mark.slow

GPU_CHECK = REPO_ROOT / "scripts" / "gpu-check"
BIN = Path(sys.executable).parent
ARCH = "sm_90"

#: What any x86_64 Linux machine has, so a bundle carries none of it (sonames; the vDSO has no file).
SYSTEM_LIBRARIES = {"linux-vdso.so.1", "ld-linux-x86-64.so.2", "libc.so.6", "libm.so.6", "libstdc++.so.6",
                    "libgcc_s.so.1", "libpthread.so.0", "libdl.so.2", "librt.so.1"}


@dataclass(frozen=True)
class Bundle:
    root: Path
    build: Path
    output: str


def _bundle_env() -> dict[str, str]:
    """The caller's environment without a library path, so nothing outside the bundle is found by accident."""
    return {key: value for key, value in os.environ.items() if key != "LD_LIBRARY_PATH"}


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Bundle:
    top = tmp_path_factory.mktemp("gpu-check")
    root, build = top / "bundle", top / "build"
    done = subprocess.run([str(GPU_CHECK), "--bundle", str(root), "--arch", ARCH, "--build-dir", str(build)],
                          capture_output=True, text=True, env=_bundle_env())
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    return Bundle(root, build, output)


def _ldd(path: Path, library_path: Path) -> list[tuple[str, str]]:
    """``(name, resolved path)`` of each library ``ldd`` lists for ``path``; the path is 'not found' if none."""
    done = subprocess.run(["ldd", str(path)], capture_output=True, text=True, check=True,
                          env=dict(_bundle_env(), LD_LIBRARY_PATH=str(library_path)))
    found = []
    for line in done.stdout.splitlines():
        words = line.split()
        if len(words) >= 3 and words[1] == "=>":
            found.append((words[0], "not found" if words[2] == "not" else words[2]))
        elif words and words[0].startswith("/"):  # the dynamic loader, by its path
            found.append((Path(words[0]).name, words[0]))
    return found


def test_the_bundle_holds_the_programs_their_libraries_and_no_system_or_driver_library(bundle):
    assert sorted(path.name for path in (bundle.root / "bin").iterdir()) == ["cuda_check", "omp_check",
                                                                             "omp_check_host"]
    libraries = {path.name for path in (bundle.root / "lib").iterdir()}
    # libomptarget 19 and what it loads (libLLVM and below), the OpenMP host runtime, the CUDA runtime
    for name in ("libomptarget.so.19.1", "libomp.so.5", "libLLVM.so.19.1", "libz3.so.4", "libxml2.so.2",
                 "libcudart.so.13"):
        assert name in libraries, sorted(libraries)
    assert not libraries & SYSTEM_LIBRARIES, sorted(libraries)
    assert not [name for name in libraries if name.startswith("libcuda.so")], sorted(libraries)  # the driver's
    for line in ("gpu-check: wrote", "bundle size", "bin/omp_check", "lib/libomptarget.so.19.1"):
        assert line in bundle.output, bundle.output
    assert (bundle.root / "MANIFEST").read_text().startswith(f"offload-builders GPU check bundle for {ARCH}\n")


def test_every_library_resolves_from_the_bundle_or_the_system(bundle):
    root = bundle.root.resolve()
    files = [path for folder in ("bin", "lib") for path in sorted((bundle.root / folder).iterdir())
             if not path.is_symlink()]
    checked = 0
    for path in files:
        for name, resolved in _ldd(path, bundle.root / "lib"):
            assert resolved != "not found", f"{path.name}: {name} not found"
            inside = Path(resolved).resolve().is_relative_to(root)
            assert inside or name in SYSTEM_LIBRARIES, f"{path.name}: {name} => {resolved}, outside the bundle"
            checked += inside
    assert checked > 10  # (ldd listed the bundle's libraries at all)


def test_the_run_script_is_executable_bash(bundle):
    run = bundle.root / "run"
    assert run.is_file() and os.access(run, os.X_OK)
    subprocess.run(["bash", "-n", str(run)], check=True)


def assert_loaded_from_the_bundle(loaded: str) -> None:
    """The loader's log (LD_DEBUG=libs) shows libomptarget, libomp and libLLVM loaded from the bundle's ``lib``,
    which the run script names by a link in its private directory (``.../gpu-check.XXXXXX/lib0``)."""
    for library in ("libomptarget.so.19.1", "libomp.so.5", "libLLVM.so.19.1"):
        assert re.search(rf"calling init: /\S*/gpu-check\.\w+/lib0/{re.escape(library)}\b", loaded), library
    assert "calling init: /usr/lib/llvm-19" not in loaded


def test_the_run_script_runs_the_openmp_check_on_the_host_device_with_the_bundles_runtime(bundle, tmp_path):
    """Moved elsewhere (no path of the build machine inside it counts) and with no LLVM on PATH, the bundle's
    run script runs the x86_64 check; libomptarget and libomp come from the bundle (the process's own map)."""
    moved = tmp_path / "moved"
    shutil.copytree(bundle.root, moved, symlinks=True)
    env = dict(_bundle_env(), GPU_CHECK_HOST_DEVICE="1", GPU_CHECK_N="100000", PATH="/usr/bin:/bin",
               LD_DEBUG="libs", LD_DEBUG_OUTPUT=str(tmp_path / "ld-debug"))
    done = subprocess.run([str(moved / "run")], capture_output=True, text=True, env=env)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "device kind: host/x86_64" in output and "PASS  omp_check_host" in output, output
    assert "gpu-check: all passed" in output, output
    loaded = "".join(path.read_text() for path in tmp_path.glob("ld-debug.*"))
    assert_loaded_from_the_bundle(loaded)


def test_a_bundle_under_a_path_with_colons_and_semicolons_loads_only_its_own_libraries(bundle, tmp_path, llvm19):
    """LD_LIBRARY_PATH splits at ':' and ';': the run script names its library directory through a link, so a
    bundle at ``.../a:b;c/moved`` loads its own libomp, not a decoy in ``.../a`` (the first piece's directory)."""
    moved = tmp_path / "a:b;c" / "moved"
    shutil.copytree(bundle.root, moved, symlinks=True)
    decoy_dir = tmp_path / "a"
    decoy_dir.mkdir()
    source = tmp_path / "decoy.c"
    source.write_text('#include <unistd.h>\n__attribute__((constructor)) static void decoy(void) {'
                      ' write(2, "DECOY\\n", 6); _exit(3); }\n')
    for name in ("libomp.so.5", "libomptarget.so.19.1"):
        subprocess.run([str(llvm19("clang")), "-shared", "-fPIC", f"-Wl,-soname,{name}", str(source), "-o",
                        str(decoy_dir / name)], check=True)
    env = dict(_bundle_env(), GPU_CHECK_HOST_DEVICE="1", GPU_CHECK_N="100000", PATH="/usr/bin:/bin",
               LD_DEBUG="libs", LD_DEBUG_OUTPUT=str(tmp_path / "ld-debug"))
    done = subprocess.run([str(moved / "run")], capture_output=True, text=True, env=env)
    output = done.stdout + done.stderr
    assert done.returncode == 0 and "DECOY" not in output, output
    assert "PASS  omp_check_host" in output, output
    loaded = "".join(path.read_text() for path in tmp_path.glob("ld-debug.*"))
    assert f"calling init: {decoy_dir}" not in loaded
    assert_loaded_from_the_bundle(loaded)


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has an NVIDIA driver")
def test_without_a_driver_the_run_script_and_the_gpu_check_fail_loudly(bundle):
    listed = subprocess.run(["/sbin/ldconfig", "-p"], capture_output=True, text=True).stdout
    if "libcuda.so.1 " in listed:
        pytest.skip("libcuda.so.1 is installed here")
    done = subprocess.run([str(bundle.root / "run")], capture_output=True, text=True, env=_bundle_env())
    assert done.returncode == 1 and "no libcuda.so.1" in done.stderr, done.stdout + done.stderr
    local = subprocess.run([str(GPU_CHECK), "--build-dir", str(bundle.build)], capture_output=True, text=True)
    assert local.returncode == 2 and "no NVIDIA GPU found" in local.stderr, local.stdout + local.stderr
    # Told the architecture, it builds (here: nothing to do) and runs this machine's run script, which fails.
    local = subprocess.run([str(GPU_CHECK), "--arch", ARCH, "--build-dir", str(bundle.build)], capture_output=True,
                           text=True, env=_bundle_env())
    assert local.returncode == 1 and "no libcuda.so.1" in local.stderr, local.stdout + local.stderr
    # That script runs the host-device check with this machine's LLVM libraries.
    run = bundle.build / "build" / f"run-{ARCH}"
    host = subprocess.run([str(run)], capture_output=True, text=True,
                          env=dict(_bundle_env(), GPU_CHECK_HOST_DEVICE="1", GPU_CHECK_N="1000"))
    assert host.returncode == 0 and "PASS  omp_check_host" in host.stdout, host.stdout + host.stderr


def test_a_bad_architecture_is_one_error():
    done = subprocess.run([str(GPU_CHECK), "--arch", "gfx90a", "--bundle", "/nonexistent/x"], capture_output=True,
                          text=True)
    assert done.returncode == 2 and "expected an NVIDIA architecture such as sm_90" in done.stderr, done.stderr


def test_the_openmp_program_has_an_sm_90_image_libomptarget_19_loads(bundle):
    program = bundle.root / "bin" / "omp_check"
    listing = subprocess.run([str(LLVM19_BIN / "llvm-objdump"), "--offloading", str(program)], capture_output=True,
                             text=True, check=True).stdout
    assert "arch            sm_90" in listing and "triple          nvptx64-nvidia-cuda" in listing, listing
    # offload-select applies libomptarget 19's checks (the cubin's ELF ABI and SM among them)
    select = subprocess.run([str(BIN / "offload-select"), "--device", ARCH, str(program)], capture_output=True,
                            text=True)
    assert select.returncode == 0, select.stdout + select.stderr
    assert select.stdout.strip() == "openmp-nvptx64-nvidia-cuda--sm_90"


def _demangle(names: list[str]) -> list[str]:
    done = subprocess.run([str(LLVM19_BIN / "llvm-cxxfilt")], input="\n".join(names), capture_output=True, text=True,
                          check=True)
    return done.stdout.splitlines()


def test_the_cuda_program_registers_only_kernels_its_sm_90_cubin_defines(bundle):
    """Each kernel's host stub (``__device_stub__<kernel>``) names the kernel the host side registers; the cubin
    in the program's fat binary must define it, CUB's templates (whose namespace encodes __CUDA_ARCH_LIST__)
    included."""
    program = bundle.root / "bin" / "cuda_check"
    select = subprocess.run([str(BIN / "offload-select"), "--device", ARCH, str(program)], capture_output=True,
                            text=True)
    assert select.returncode == 0 and select.stdout.strip() == "cuda-nvptx64-nvidia-cuda--sm_90", select.stdout
    from offload_builders.formats.inspect import inspect_file

    entries = [entry for payload in inspect_file(program).payloads if payload.format == "nvidia fatbin"
               for entry in payload.entries]
    assert [(entry.kind, entry.arch) for entry in entries] == [("elf", ARCH)]
    data = program.read_bytes()
    cubin = ELFFile(io.BytesIO(data[entries[0].offset:entries[0].offset + entries[0].size]))
    defined = {symbol.name for symbol in cubin.get_section_by_name(".symtab").iter_symbols()
               if symbol["st_info"]["type"] == "STT_FUNC" and symbol["st_shndx"] != "SHN_UNDEF"}
    nm = subprocess.run([str(LLVM19_BIN / "llvm-nm"), "--defined-only", "--format=just-symbols", str(program)],
                        capture_output=True, text=True, check=True).stdout.split()
    stubs = sorted({name for name in nm if "__device_stub__" in name})
    assert len(stubs) >= 3, stubs  # our kernel and CUB's reduction kernels
    kernels = dict(zip(_demangle(sorted(defined)), sorted(defined)))
    missing = [stub for stub, text in zip(stubs, _demangle(stubs))
               if text.replace("__device_stub__", "", 1) not in kernels]
    assert not missing, f"registered by the host, not in the {ARCH} cubin: {missing}"
