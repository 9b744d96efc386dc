"""The Python processes the tool starts never import code from their working directory: the link shim that Clang
runs in ``clang-linker-wrapper``'s place, the composed NVPTX tools' ``nvlink`` and the bitcode reader's child all
run with ``-P``. Each test runs one from a directory holding a package of the name it imports (``offload_builders``,
``llvmlite``) whose import would stop it: a build directory, or the source tree of an in-source build."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from offload_builders import nvptx_tools
from offload_builders.cli import link_shim

HIJACK = "raise SystemExit('imported from the working directory')\n"


def hostile_directory(tmp_path: Path, package: str) -> Path:
    """A working directory with a package named ``package`` that stops whoever imports it."""
    cwd = tmp_path / "build"
    (cwd / package).mkdir(parents=True)
    (cwd / package / "__init__.py").write_text(HIJACK)
    return cwd


def test_the_link_shim_runs_the_installed_offload_link(tmp_path):
    wrapper = Path(link_shim.shim_dir()) / link_shim.WRAPPER_NAME
    done = subprocess.run([str(wrapper), "--version"], cwd=hostile_directory(tmp_path, "offload_builders"),
                          capture_output=True, text=True)
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    assert done.stdout.startswith("offload-link (offload-builders)")


def test_the_composed_nvlink_runs_the_installed_package(tmp_path):
    wheels = nvptx_tools.wheel_directories()
    assert wheels is not None, "the CUDA 12 wheels are missing: pip install 'offload-builders[nvptx]'"
    root = nvptx_tools.compose_wheel_tools(*wheels, into=tmp_path / "tools")
    done = subprocess.run([str(root / "bin" / "nvlink"), "--version"],
                          cwd=hostile_directory(tmp_path, "offload_builders"), capture_output=True, text=True)
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    assert "nvJitLink" in done.stdout


def test_the_bitcode_reader_child_imports_the_installed_llvmlite(tmp_path, llvm19):
    source = tmp_path / "k.c"
    source.write_text("int kernel_entry(int x) { return x + 1; }\n")
    bitcode = tmp_path / "k.bc"
    subprocess.run([str(llvm19("clang")), "-c", "-emit-llvm", str(source), "-o", str(bitcode)], check=True)
    # A script file, not -c: the parent itself must not import from the hostile directory either.
    script = tmp_path / "read.py"
    script.write_text(textwrap.dedent(f"""
        from offload_builders.formats.containers import bitcode_linker_symbols
        print([name for name, *_ in bitcode_linker_symbols(open({str(bitcode)!r}, "rb").read(), "k.bc")])
    """))
    done = subprocess.run([sys.executable, str(script)], cwd=hostile_directory(tmp_path, "llvmlite"),
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['kernel_entry']"
