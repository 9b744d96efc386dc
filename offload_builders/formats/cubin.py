"""NVIDIA cubins: what their ELF header says, and whether a given LLVM OpenMP runtime loads them.

A cubin records its SM in ``e_flags``, in one of two layouts chosen by ``e_ident[EI_ABIVERSION]``:

* ABI 7 (``ELFABIVERSION_CUDA_V1``, CUDA 12 and older): the SM in the low byte (``EF_CUDA_SM``, 0x5a for
  sm_90), ``EF_CUDA_64BIT_ADDRESS`` (0x400) set for 64-bit code; e.g. ``0x5a055a``.
* ABI 8 (``ELFABIVERSION_CUDA_V2``, every cubin CUDA 13's ``ptxas`` and ``nvlink`` write): the SM in bits 8-15
  (``EF_CUDA_SM_MASK``), no address-size flag; e.g. ``0x6005a04``.

libomptarget before the fix of llvm/llvm-project#159088 (LLVM 19 and 20, 21.1.0 and 21.1.1) knows only the
first layout: its generic check (``offload/plugins-nextgen/common/src/Utils/ELF.cpp``, ``checkMachine``)
refuses an ABI-8 cubin ("Invalid CUDA addressing mode": bit 0x400 is clear), and its CUDA plugin would read
the SM from the low byte. LLVM 22 (PR 159354) and 21.1.2 (the backport, PR 159451) read both. The rules here
are those two functions', so the build and ``offload-select`` refuse what that runtime refuses, and say why.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

from offload_builders.errors import OffloadFormatError

EM_CUDA = 190
ET_EXEC, ET_DYN = 2, 3
ELFABIVERSION_CUDA_V1, ELFABIVERSION_CUDA_V2 = 7, 8
EF_CUDA_SM = 0xFF
EF_CUDA_SM_MASK = 0xFF00
EF_CUDA_SM_OFFSET = 8
EF_CUDA_64BIT_ADDRESS = 0x400
EF_CUDA_SM35 = 0x23
#: LLVM 22's ``EF_CUDA_SM100``, which its ABI-8 check compares with the masked (unshifted) flags.
_EF_CUDA_SM100 = 0x64

#: The first releases of each LLVM major whose OpenMP runtime reads ABI-8 cubins (llvm/llvm-project#159088).
FIRST_READING_ABI8: dict[int, tuple[int, int, int]] = {21: (21, 1, 2), 22: (22, 0, 0)}
UPSTREAM_ISSUE = "llvm/llvm-project#159088"

_HEADER = struct.Struct("<16sHHIQQQIHHHHHH")  # Elf64_Ehdr: e_ident, e_type, e_machine, e_version, ..., e_flags, ...


@dataclass(frozen=True)
class CubinHeader:
    """The fields of a cubin's ELF header that decide whether a runtime loads it (spec field names)."""

    ei_class: int
    ei_osabi: int
    ei_abiversion: int
    e_type: int
    e_machine: int
    e_flags: int

    @property
    def sm(self) -> int:
        """The SM number in the layout the header's ABI version names (90 for sm_90)."""
        if self.ei_abiversion == ELFABIVERSION_CUDA_V2:
            return (self.e_flags & EF_CUDA_SM_MASK) >> EF_CUDA_SM_OFFSET
        return self.e_flags & EF_CUDA_SM

    def describe(self) -> str:
        return f"ELF ABI {self.ei_abiversion}, e_flags {self.e_flags:#x} (sm_{self.sm})"


def read_header(data: bytes, path: str | None = None) -> CubinHeader:
    """The header of the cubin whose first bytes are ``data`` (64 suffice); a malformed one is an error."""
    if len(data) < 4 or data[:4] != b"\x7fELF":
        raise OffloadFormatError("not an ELF file (a cubin starts with \\x7fELF)", path=path, offset=0)
    if data[4] != 2 or data[5] != 1:
        raise OffloadFormatError(f"ELF class {data[4]}, data {data[5]}: a cubin is 64-bit little-endian",
                                 path=path, offset=4)
    if len(data) < _HEADER.size:
        raise OffloadFormatError(f"ELF header truncated at {len(data)} of {_HEADER.size} bytes", path=path,
                                 offset=len(data))
    ident, e_type, e_machine, _version, _entry, _phoff, _shoff, e_flags = _HEADER.unpack_from(data)[:8]
    return CubinHeader(ident[4], ident[7], ident[8], e_type, e_machine, e_flags)


def read_file_header(path: str) -> CubinHeader:
    """:func:`read_header` of the file at ``path``."""
    with open(path, "rb") as f:
        return read_header(f.read(_HEADER.size), path)


def runtime_reads_abi8(version: tuple[int, ...]) -> bool:
    """Whether the LLVM OpenMP runtime of this LLVM version reads ABI-8 cubins (see the module's docstring)."""
    major = version[0]
    if major in FIRST_READING_ABI8:  # a bare major (22) or major.minor counts as its .0 release
        return (*version, 0, 0)[:3] >= FIRST_READING_ABI8[major]
    return major > max(FIRST_READING_ABI8)


def runtime_abis(version: tuple[int, ...]) -> tuple[int, ...]:
    """The cubin ELF ABI versions the LLVM OpenMP runtime of this LLVM version loads."""
    return (ELFABIVERSION_CUDA_V1, ELFABIVERSION_CUDA_V2) if runtime_reads_abi8(version) else (ELFABIVERSION_CUDA_V1,)


def version_text(version: tuple[int, ...]) -> str:
    return ".".join(str(part) for part in version)


def runtime_refusal(header: CubinHeader, runtime: tuple[int, ...], device_sm: int | None = None) -> str | None:
    """Why the LLVM OpenMP runtime of version ``runtime`` refuses this cubin (on a device of SM ``device_sm``,
    e.g. 90, when given), or None when it loads it: ``checkMachine`` and the CUDA plugin's
    ``isELFCompatible``, as that version has them."""
    name = f"libomptarget {version_text(runtime)}"
    if header.ei_class != 2:
        return f"{name} loads only 64-bit ELF files"
    if header.e_type not in (ET_EXEC, ET_DYN):
        return f"{name} loads only executable ELF files (this cubin has e_type {header.e_type}: not device-linked)"
    if header.e_machine != EM_CUDA:
        return f"not an NVIDIA cubin (e_machine {header.e_machine}, expected {EM_CUDA})"
    if not runtime_reads_abi8(runtime):
        if header.ei_abiversion != ELFABIVERSION_CUDA_V1:
            return (f"{name} reads only cubin ELF ABI {ELFABIVERSION_CUDA_V1} (the SM in the low byte of e_flags);"
                    f" this cubin has {header.describe()}, as CUDA 13's ptxas and nvlink write, so it would read"
                    f" sm_{header.e_flags & EF_CUDA_SM} and an addressing mode it does not support"
                    f" ({UPSTREAM_ISSUE}, fixed in LLVM 22 and 21.1.2)")
        sm = header.e_flags & EF_CUDA_SM
        if not header.e_flags & EF_CUDA_64BIT_ADDRESS:
            return f"{name} refuses it: invalid CUDA addressing mode (e_flags {header.e_flags:#x} lacks 0x400)"
    elif header.ei_abiversion == ELFABIVERSION_CUDA_V1:
        sm = header.e_flags & EF_CUDA_SM
        if not header.e_flags & EF_CUDA_64BIT_ADDRESS:
            return f"{name} refuses it: invalid CUDA addressing mode (e_flags {header.e_flags:#x} lacks 0x400)"
    elif header.ei_abiversion == ELFABIVERSION_CUDA_V2:
        sm = header.sm
        if (header.e_flags & EF_CUDA_SM_MASK) < _EF_CUDA_SM100:
            return f"{name} refuses it: unsupported NVPTX architecture (e_flags {header.e_flags:#x})"
    else:
        return f"{name} refuses it: invalid CUDA ABI version {header.ei_abiversion}"
    if sm < EF_CUDA_SM35:
        return f"{name} refuses it: unsupported NVPTX architecture sm_{sm}"
    if device_sm is not None and (sm // 10 != device_sm // 10 or sm % 10 > device_sm % 10):
        return (f"{name} reads sm_{sm} from it, which a device of compute capability"
                f" {device_sm // 10}.{device_sm % 10} does not run")
    return None


__all__ = [
    "ELFABIVERSION_CUDA_V1", "ELFABIVERSION_CUDA_V2", "EM_CUDA", "FIRST_READING_ABI8", "UPSTREAM_ISSUE",
    "CubinHeader", "read_file_header", "read_header", "runtime_abis", "runtime_reads_abi8", "runtime_refusal",
    "version_text",
]
