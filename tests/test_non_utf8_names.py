"""Names are bytes where the OS gives bytes: a source and a header whose names are not UTF-8 (Latin-1 bytes) go
through every ``offload-compile`` phase, the identity record and the depfiles keep their bytes, the device compile
checks the identity record, and the program links through ``offload-link`` and runs its target region. Before,
the host phase stopped with ``internal error (UnicodeEncodeError)`` after committing the host bitcode."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from offload_builders.toolchain import find_toolchain

pytestmark = pytest.mark.slow

SOURCE = b"k\xfd.cpp"
INCLUDE = b"inc\xff"
HEADER = b"h\xfe.h"
HEADER_TEXT = b"#pragma once\nstatic int offset() { return 0; }\n"
PROGRAM = b"""#include <cstdio>
#include <omp.h>
#include "h\xfe.h"
int main() {
  int on_device = 0;
#pragma omp target map(from: on_device)
  on_device = !omp_is_initial_device() + offset();
  std::printf("on device: %d\\n", on_device);
  return on_device == 1 ? 0 : 1;
}
"""


def oc(work: Path, *args: bytes | str) -> subprocess.CompletedProcess:
    argv = [os.fsencode(sys.executable), b"-P", b"-m", b"offload_builders.cli.compile",
            *(os.fsencode(arg) for arg in args)]
    done = subprocess.run(argv, cwd=work, capture_output=True)
    assert done.returncode == 0, done.stderr.decode(errors="backslashreplace")
    assert done.stderr == b""
    return done


def test_names_that_are_not_utf8_go_through_every_phase_and_the_program_runs(tmp_path):
    work = tmp_path / "work"
    (work / os.fsdecode(INCLUDE)).mkdir(parents=True)
    (work / os.fsdecode(INCLUDE) / os.fsdecode(HEADER)).write_bytes(HEADER_TEXT)
    (work / os.fsdecode(SOURCE)).write_bytes(PROGRAM)
    flags = (b"--", b"-O2", b"-I" + INCLUDE)
    oc(work, b"host", SOURCE, b"-o", b"k.host.bc", b"--depfile", b"k.host.d", *flags)
    # The identity record and the depfile name the files by their bytes.
    identity = (work / "k.host.bc.identity").read_bytes()
    assert identity.startswith(SOURCE + b" dev=") and INCLUDE + b"/" + HEADER + b" dev=" in identity
    assert b" " + SOURCE + b" \\\n  " + INCLUDE + b"/" + HEADER in (work / "k.host.d").read_bytes()
    oc(work, b"device", SOURCE, b"--host-bc", b"k.host.bc", b"--target", b"x86_64", b"-o", b"k.x86_64.o",
       b"--depfile", b"k.dev.d", *flags)
    assert INCLUDE + b"/" + HEADER in (work / "k.dev.d").read_bytes()
    oc(work, b"package", SOURCE, b"--targets", b"x86_64", b"-o", b"k.pkg", b"k.x86_64.o", *flags)
    oc(work, b"embed", SOURCE, b"--host-bc", b"k.host.bc", b"--package", b"k.pkg", b"-o", b"k.o", *flags)
    link_args = subprocess.run([sys.executable, "-P", "-m", "offload_builders.cli.link", "--print-link-args"],
                               check=True, capture_output=True, text=True).stdout.split()
    runtime = subprocess.run([sys.executable, "-P", "-m", "offload_builders.cli.link", "--print-runtime-dir"],
                             check=True, capture_output=True, text=True).stdout.strip()
    subprocess.run([str(find_toolchain().clangxx), "k.o", "-o", "k", *link_args, f"-Wl,-rpath,{runtime}"],
                   cwd=work, check=True, capture_output=True)
    done = subprocess.run([str(work / "k")], capture_output=True, text=True,
                          env=dict(os.environ, OMP_TARGET_OFFLOAD="MANDATORY"))
    assert (done.returncode, done.stdout) == (0, "on device: 1\n"), done.stderr


def test_a_recreated_header_with_such_a_name_stops_the_device_compile_naming_it(tmp_path):
    """The identity check reads the record back by its bytes: a header re-created (another inode) is named."""
    work = tmp_path / "work"
    (work / os.fsdecode(INCLUDE)).mkdir(parents=True)
    header = work / os.fsdecode(INCLUDE) / os.fsdecode(HEADER)
    header.write_bytes(HEADER_TEXT)
    (work / os.fsdecode(SOURCE)).write_bytes(PROGRAM)
    flags = (b"--", b"-O2", b"-I" + INCLUDE)
    oc(work, b"host", SOURCE, b"-o", b"k.host.bc", *flags)
    temporary = header.with_name("saved.tmp")
    temporary.write_bytes(header.read_bytes())
    os.replace(temporary, header)  # same bytes, new inode (made while the old one lives: a safe-save)
    argv = [sys.executable, "-P", "-m", "offload_builders.cli.compile", "device", os.fsdecode(SOURCE), "--host-bc",
            "k.host.bc", "--target", "x86_64", "-o", "k.x86_64.o", "--", "-O2", "-I" + os.fsdecode(INCLUDE)]
    done = subprocess.run(argv, cwd=work, capture_output=True)
    assert done.returncode == 1
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and b"is not the file 'k.host.bc' was made from" in lines[0], done.stderr
    assert b"Traceback" not in done.stderr
