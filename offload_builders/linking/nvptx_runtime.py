"""The OpenMP device runtime's part of an NVPTX device link as a step of its own, so that an edit of the
user's device code relinks with ``nvlink`` alone.

Clang 19 links the NVPTX runtime into each source's device code (``-mlink-builtin-bitcode
libomptarget-nvptx-<sm>.bc``, internalized), but the optimizer may then add calls the linked copy no longer
provides: a generic-mode kernel's state machine calls ``__kmpc_get_hardware_thread_id_in_block``. Such a
cubin keeps an undefined reference, so the link takes the runtime's bitcode from ``libomptarget.devicertl.a``
and ``clang-nvlink-wrapper`` runs LTO on that bitcode *alone* (every other input is a cubin), ``ptxas`` on the
result, then ``nvlink``: 0.2-0.3 s per target after every edit, for a result that rarely changes. (A device
compile given an empty runtime, ``--libomptarget-nvptx-bc-path=<empty.bc>``, calls the whole runtime that
way; there the LTO and ``ptxas`` of the runtime take seconds.)

What that LTO gets from the cubins is only the symbol resolution: for each symbol the runtime's bitcode
names, whether some cubin uses it and whether the first cubin to define it does so weakly
(``clang-nvlink-wrapper``'s ``getSymbolsFromObject``). That is the *interface* (:func:`interface`), a few
lines of text. Here the runtime is linked from the interface and the runtime's bitcode alone: a stub ELF
object with exactly the interface's symbols (:func:`stub_object`) stands in for the cubins,
``clang-nvlink-wrapper --lto-emit-asm`` writes the PTX the one-step link would assemble, and ``ptxas`` gets
the arguments that link gives it (:func:`ptxas_command`). The device link then gets that cubin first and
the user's cubins after it, the order ``clang-nvlink-wrapper`` gives ``nvlink``: the image is byte for byte
the one-step link's. Where any user input is bitcode (``-foffload-lto``) the runtime's LTO includes it, and
nothing is split (:func:`split_device_files` says None).

This module has no SCons imports.
"""
from __future__ import annotations

import os
import struct
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from offload_builders import linking, nvptx_tools
from offload_builders.formats._io import atomic_output, write_all
from offload_builders.formats.containers import ContainerKind, FoundBinary, Origin, identify
from offload_builders.formats.offload_binary import (
    ImageKind,
    OffloadingImage,
    OffloadKind,
    encode_offload_binary,
    kind_table,
)
from offload_builders.leftovers import private_tmpdir
from offload_builders.toolchain import Toolchain

#: An empty NVPTX module (``data/nvptx-no-devicertl.ll``, assembled by ``llvm-as``) to give the device compile as
#: the runtime (:func:`link_time_runtime_flags`).
NO_RUNTIME_BITCODE = Path(__file__).parent.parent / "data" / "nvptx-no-devicertl.bc"


def link_time_runtime_flags() -> list[str]:
    """Device-compile flags for an NVPTX target that leave the OpenMP runtime out of each source's device code
    (the driver's own ``--libomptarget-nvptx-bc-path``, naming an empty module; libdevice stays): the code then
    calls the runtime, which the runtime's node links once per target. Device compiles take about half the
    time and an edit relinks with ``nvlink`` alone, but no runtime call is inlined into a kernel any more, which
    costs run time (``__kmpc_parallel_51``, the loop-schedule and reduction calls become real calls)."""
    return [f"--libomptarget-nvptx-bc-path={NO_RUNTIME_BITCODE}"]


@dataclass(frozen=True)
class RuntimeSplit:
    """One target's selected device files, split into the user's cubins and the device runtime's bitcode."""

    user: tuple[FoundBinary, ...]
    runtime: tuple[FoundBinary, ...]


@dataclass(frozen=True)
class InterfaceSymbol:
    """One symbol of the runtime as the cubins resolve it: used only (undefined), or defined (weakly)."""

    name: str
    defined: bool
    weak: bool


def _kind(found: FoundBinary) -> ContainerKind:
    return identify(found.read_image()[:64])


def split_device_files(files: Sequence[FoundBinary], runtime_archive: str | os.PathLike[str]) -> RuntimeSplit | None:
    """``files`` (a target's selection, :func:`offload_builders.linking.select_device_files`) split into the
    user's ELF objects and the members of ``runtime_archive``; None where nothing comes from the runtime, the
    runtime's part is not all bitcode, or a user file is not an ELF object (its bitcode and the runtime's are
    optimized together: one step)."""
    archive = os.path.realpath(runtime_archive)
    runtime = tuple(found for found in files if os.path.realpath(found.origin.file) == archive)
    user = tuple(found for found in files if os.path.realpath(found.origin.file) != archive)
    if not runtime or any(_kind(found) is not ContainerKind.BITCODE for found in runtime):
        return None
    if any(_kind(found) is not ContainerKind.ELF_RELOCATABLE for found in user):
        return None
    return RuntimeSplit(user, runtime)


def interface(split: RuntimeSplit) -> list[InterfaceSymbol]:
    """What the runtime's LTO learns from the user's cubins, sorted by name: each symbol the runtime's bitcode
    names that a cubin has, as ``clang-nvlink-wrapper`` 19 resolves it reading the cubins in order (the first
    mention, replaced by the first definition if that mention was undefined)."""
    names = {symbol.name for found in split.runtime for symbol in linking.device_symbols(found.read_image(),
                                                                                          found.describe())}
    resolved: dict[str, InterfaceSymbol] = {}
    for found in split.user:
        for symbol in linking.device_symbols(found.read_image(), found.describe()):
            if symbol.name not in names:
                continue
            old = resolved.get(symbol.name)
            if old is None or (not old.defined and not symbol.undefined):
                resolved[symbol.name] = InterfaceSymbol(symbol.name, not symbol.undefined, symbol.weak)
    return [resolved[name] for name in sorted(resolved)]


def format_interface(symbols: Sequence[InterfaceSymbol]) -> bytes:
    """The interface as text, one ``<name> U|UW|D|DW`` line per symbol: byte-stable for a given set."""
    return "".join(f"{s.name} {'D' if s.defined else 'U'}{'W' if s.weak else ''}\n" for s in symbols).encode()


def parse_interface(data: bytes, path: str) -> list[InterfaceSymbol]:
    """Read :func:`format_interface`'s text back; a line of another shape is an error naming ``path``."""
    symbols = []
    for number, line in enumerate(data.decode("utf-8", "surrogateescape").splitlines(), 1):
        name, _, state = line.rpartition(" ")
        if not name or state not in ("U", "UW", "D", "DW"):
            raise linking.LinkError(f"{path}:{number}: not a runtime-interface line: {line!r}; remove the file and"
                                    f" build again")
        symbols.append(InterfaceSymbol(name, state.startswith("D"), state.endswith("W")))
    return symbols


_EM_CUDA = 190
_ELFOSABI_CUDA = 51
_STB_GLOBAL, _STB_WEAK = 1, 2


def stub_object(symbols: Sequence[InterfaceSymbol]) -> bytes:
    """A relocatable ELF64 object for the CUDA machine holding only ``symbols`` (defined ones in an empty
    section), which ``clang-nvlink-wrapper`` reads as it reads the cubins: it looks at names, definedness and
    binding alone. Never given to ``nvlink``."""
    shstrtab = b"\0.shstrtab\0.strtab\0.symtab\0.text\0"
    strtab, entries = bytearray(b"\0"), [bytes(24)]
    for symbol in symbols:
        offset = len(strtab)
        strtab += symbol.name.encode("utf-8", "surrogateescape") + b"\0"
        info = (_STB_WEAK if symbol.weak else _STB_GLOBAL) << 4  # STT_NOTYPE
        entries.append(struct.pack("<IBBHQQ", offset, info, 0, 4 if symbol.defined else 0, 0, 0))
    data = bytearray(64)
    placed = []
    for blob in (shstrtab, bytes(strtab), b"".join(entries)):
        data += bytes(-len(data) % 8)
        placed.append((len(data), len(blob)))
        data += blob
    data += bytes(-len(data) % 8)
    section_offset = len(data)

    def header(name: bytes, kind: int, flags: int, offset: int, size: int, link: int = 0, info: int = 0,
               align: int = 1, entsize: int = 0) -> bytes:
        return struct.pack("<IIQQQQIIQQ", shstrtab.index(name + b"\0"), kind, flags, 0, offset, size, link, info,
                           align, entsize)

    data += bytes(64)  # the null section
    data += header(b".shstrtab", 3, 0, *placed[0])
    data += header(b".strtab", 3, 0, *placed[1])
    data += header(b".symtab", 2, 0, *placed[2], link=2, info=1, align=8, entsize=24)
    data += header(b".text", 8, 6, section_offset, 0)  # SHT_NOBITS, SHF_ALLOC|SHF_EXECINSTR: empty
    ident = b"\x7fELF" + bytes([2, 1, 1, _ELFOSABI_CUDA]) + bytes(8)
    data[:64] = ident + struct.pack("<HHIQQQIHHHHHH", 1, _EM_CUDA, 1, 0, 0, section_offset, 0, 64, 0, 0, 64, 5, 1)
    return bytes(data)


def is_nvlink_wrapper_job(argv: Sequence[str]) -> bool:
    """Whether a device link's job is ``clang-nvlink-wrapper`` (Clang 19's NVPTX link), which the split needs."""
    return bool(argv) and os.path.basename(argv[0]).startswith("clang-nvlink-wrapper")


def ptxas_command(lto_argv: Sequence[str], toolchain: Toolchain, assembly: str, output: str) -> list[str]:
    """The ``ptxas`` job ``clang-nvlink-wrapper`` (``runPTXAs``) would run on the LTO result of ``lto_argv``:
    ``-m64 -c``, its ``-O`` (``--plugin-opt=O<n>``, default 3; ``-O0 -g`` with ``-g``), ``-arch``."""
    level, debug, arch = "3", False, ""
    ptxas = ""
    for index, arg in enumerate(lto_argv):
        if arg.startswith(("--plugin-opt=O", "-plugin-opt=O")) or (len(arg) == 3 and arg.startswith("-O")):
            level = arg[-1]
        elif arg in ("-g", "--debug"):
            debug = True
        elif arg in ("-arch", "--arch") and index + 1 < len(lto_argv):
            arch = lto_argv[index + 1]
        elif arg.startswith(("--arch=", "-arch=")):
            arch = arg.partition("=")[2]
        elif arg.startswith("--cuda-path=") and not ptxas:
            candidate = Path(arg.partition("=")[2]) / "bin" / "ptxas"
            ptxas = str(candidate) if candidate.is_file() else ""
        elif arg.startswith("--ptxas-path=") and not ptxas:
            candidate = Path(arg.partition("=")[2]) / "ptxas"
            ptxas = str(candidate) if candidate.is_file() else ""
    ptxas = ptxas or str(nvptx_tools.openmp_tool(toolchain, "ptxas"))
    return [ptxas, "-m64", "-c", assembly, *(["-O0", "-g"] if debug else [f"-O{level}"]), "-arch", arch,
            "-o", output]


def read_runtime_package(path: str) -> list[FoundBinary]:
    """The runtime's linked cubin from :func:`link_runtime`'s output, as device files ([] for an empty one)."""
    return [FoundBinary(binary, Origin(path, ContainerKind.OFFLOAD_BINARY))
            for binary in linking.read_device_inputs(path)]


def runtime_binary(cubin: bytes, key: linking.GroupKey, llvm_version: int) -> bytes:
    """The runtime's cubin as one offload binary (a device input file of one image, kind ``openmp``)."""
    table = kind_table(llvm_version)
    return encode_offload_binary(OffloadingImage(
        image=cubin, image_kind=table.image_value(ImageKind.CUBIN),
        offload_kind=table.offload_value(OffloadKind.OPENMP), strings=(("triple", key[0]), ("arch", key[1]))))


def link_runtime(lto_job: Callable[[list[str], str], list[str]], toolchain: Toolchain, key: linking.GroupKey,
                 symbols_file: str, runtime_file: str, output: str, scratch: str, llvm_version: int) -> list[list[str]]:
    """Link the runtime's part of one NVPTX image: from the interface (``symbols_file``) and the runtime's
    bitcode (``runtime_file``, a device input file), write ``output``, a device input file holding the runtime's
    cubin, or an empty file where ``runtime_file`` is empty (nothing to split). ``lto_job(inputs, output)``
    gives the device link's own job for those files. Returns the commands run."""
    runtime = linking.unpack_device_inputs(runtime_file, scratch) if os.path.getsize(runtime_file) else []
    if not runtime:
        with atomic_output(output):
            pass
        return []
    with open(symbols_file, "rb") as f:
        symbols = parse_interface(f.read(), symbols_file)
    stub = os.path.join(scratch, "interface.o")
    with open(stub, "wb") as f:
        f.write(stub_object(symbols))
    assembly, cubin = os.path.join(scratch, "devicertl.s"), os.path.join(scratch, "devicertl.cubin")
    lto = [*lto_job([stub, *runtime], assembly), "--lto-emit-asm"]
    commands = [lto, ptxas_command(lto, toolchain, assembly, cubin)]
    for argv in commands:
        with private_tmpdir(inside=scratch) as environ:  # a killed link's temporaries go with the scratch
            done = subprocess.run(argv, capture_output=True, text=True, errors="surrogateescape", check=False,
                                  env=environ)
        if done.returncode != 0:
            raise linking.LinkError(f"the {key[1]} device runtime's link failed: {' '.join(argv)}\n"
                                    f"{(done.stdout + done.stderr).strip()}")
    with open(cubin, "rb") as f:
        data = runtime_binary(f.read(), key, llvm_version)
    with atomic_output(output) as fd:
        write_all(fd, data)
    return commands


__all__ = [
    "NO_RUNTIME_BITCODE",
    "InterfaceSymbol",
    "RuntimeSplit",
    "format_interface",
    "interface",
    "is_nvlink_wrapper_job",
    "link_runtime",
    "link_time_runtime_flags",
    "parse_interface",
    "ptxas_command",
    "read_runtime_package",
    "runtime_binary",
    "split_device_files",
    "stub_object",
]
