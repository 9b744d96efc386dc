"""The IR vocabulary every registration module shares: offload kinds, LLVM versions and entry layouts, llvmlite
helpers for opaque pointers, the host entry table and OpenMP's descriptor types.

One module below the registrations (OpenMP, image groups, CUDA/HIP) and their compiling, so each imports it
and none imports another.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from llvmlite import ir

from offload_builders.errors import OffloadBinaryFormatError, OffloadError
from offload_builders.formats.offload_binary import MAGIC as OFFLOAD_BINARY_MAGIC, parse_offload_binary

OPENMP: Final = "openmp"
#: The kind for OpenMP image groups, each registered as its own descriptor (``group_registration``).
OPENMP_GROUPS: Final = "openmp-groups"
CUDA: Final = "cuda"
HIP: Final = "hip"
KINDS: Final = (OPENMP, CUDA, HIP)

DEFAULT_HOST_TRIPLE: Final = "x86_64-unknown-linux-gnu"
#: The registration constructors' priority (``appendToGlobalCtors(M, Func, 101)``, LLVM 19+).
CTOR_PRIORITY: Final = 101

I16: Final = ir.IntType(16)
I32: Final = ir.IntType(32)
I64: Final = ir.IntType(64)
VOID: Final = ir.VoidType()
#: Always the opaque ``ptr``: llvmlite prints typed pointers (``i8*``) unless told otherwise through an
#: environment variable, and LLVM 17+ (which Clang's modules and llvmlite's own LLVM are) has only ``ptr``.
PTR: Final = ir.PointerType()


# ------------------------------------------------------------------------------------------------
# Versions and layouts


def check_version(llvm_version: int) -> int:
    """``llvm_version``, if the registration code is modelled on it (LLVM 19 and later)."""
    if not isinstance(llvm_version, int) or isinstance(llvm_version, bool) or llvm_version < 19:
        raise OffloadError(f"unsupported LLVM version {llvm_version!r}: the registration code is modelled "
                           "on LLVM 19 and later (earlier releases use a priority-1 constructor and a global "
                           "destructor)")
    return llvm_version


def entry_layout(llvm_version: int) -> int:
    """Which host entry table LLVM ``llvm_version`` uses: 19 or 21.

    19 (LLVM 19 and 20): ``__tgt_offload_entry {ptr addr, ptr name, i64 size, i32 flags, i32 data}``,
    32 bytes, in ``omp_offloading_entries`` / ``cuda_offloading_entries`` / ``hip_offloading_entries``.
    21 (LLVM 21+, PRs #124018 and #125731): ``{i64 Reserved, i16 Version, i16 Kind, i32 Flags, ptr Address,
    ptr SymbolName, i64 Size, i64 Data, ptr AuxAddr}``, 56 bytes, in ``llvm_offload_entries`` for all kinds.
    """
    return 19 if check_version(llvm_version) <= 20 else 21


def entry_section(kind: str, layout: int) -> str:
    """The section of ``kind``'s host entries in ``layout``: one per kind before LLVM 21, then one for all."""
    return "llvm_offload_entries" if layout >= 21 else f"{'omp' if kind == OPENMP else kind}_offloading_entries"


_NON_ELF_OS: Final = ("darwin", "macos", "ios", "tvos", "watchos", "xros", "driverkit", "windows", "win32",
                      "mingw", "cygwin", "uefi")


def check_host_triple(host_triple: str) -> str:
    """``host_triple``, if it names an ELF host (the only kind whose section names the modules use)."""
    if not isinstance(host_triple, str) or not host_triple or host_triple.count("-") < 1:
        raise OffloadError(f"invalid host triple {host_triple!r}")
    parts = host_triple.lower().split("-")
    if ("apple" in parts[1:2] or any(p.startswith(_NON_ELF_OS) for p in parts[1:])
            or any(p in ("msvc", "coff", "macho") for p in parts[2:])):
        raise OffloadError(f"host triple {host_triple!r} is not an ELF target: only ELF hosts are supported "
                           "(Mach-O and COFF use other section names)")
    return host_triple


def as_bytes(data: object, what: str) -> bytes:
    """``data`` as ``bytes`` (from ``bytes``, ``bytearray`` or ``memoryview``); ``what`` names it in the error."""
    if isinstance(data, bytes):
        return data
    if isinstance(data, (bytearray, memoryview)):
        return bytes(data)
    raise OffloadError(f"{what} must be bytes, not {type(data).__name__}")


# ------------------------------------------------------------------------------------------------
# llvmlite helpers


class Global(ir.GlobalVariable):
    """A global variable whose address is an opaque ``ptr`` and that may carry a visibility.

    llvmlite has no visibility field; LLVM's grammar puts it right after the linkage.
    """

    def __init__(self, module: ir.Module, typ: ir.Type, name: str, *, linkage: str = "internal",
                 constant: bool = True, section: str = "", align: int | None = None,
                 initializer: ir.Constant | None = None, unnamed_addr: bool = False,
                 visibility: str = "") -> None:
        super().__init__(module, typ, name)
        self.type = PTR
        self.linkage = linkage
        self.global_constant = constant
        self.section = section
        self.align = align
        self.initializer = initializer
        self.unnamed_addr = unnamed_addr
        self.visibility = visibility

    def descr(self, buf: list[str]) -> None:
        text: list[str] = []
        super().descr(text)
        line = "".join(text)
        if self.visibility:
            line = line.replace(f"{self.linkage} ", f"{self.linkage} {self.visibility} ", 1)
        buf.append(line)


class _Function(ir.Function):
    """A function (declared until blocks are added) whose address is an opaque ``ptr``."""

    def __init__(self, module: ir.Module, ftype: ir.FunctionType, name: str) -> None:
        super().__init__(module, ftype, name=name)
        self.type = PTR

    @property
    def function_type(self) -> ir.FunctionType:
        # llvmlite finds the signature through a typed pointer, which an opaque ``ptr`` does not have.
        return self.ftype


def declare(module: ir.Module, name: str, ret: ir.Type, args: Sequence[ir.Type]) -> ir.Function:
    """A function of ``module`` whose address is an opaque ``ptr``, declared until blocks are added."""
    return _Function(module, ir.FunctionType(ret, list(args)), name)


def define_startup(module: ir.Module, name: str, args: Sequence[ir.Type] = ()) -> ir.Function:
    """An internal ``void`` function in ``.text.startup``, as every wrapper function is."""
    fn = declare(module, name, VOID, args)
    fn.linkage = "internal"
    fn.section = ".text.startup"
    return fn


def new_module(host_triple: str = DEFAULT_HOST_TRIPLE) -> ir.Module:
    """An empty module for ``host_triple`` (a link with no device images still gets a wrapper object)."""
    # A fresh type context each time: identified struct types are per context, and every module
    # defines its own %struct.__tgt_offload_entry.
    module = ir.Module("offload.wrapper.module", context=ir.Context())
    module.triple = check_host_triple(host_triple)
    return module


def i32(value: int) -> ir.Constant:
    """An ``i32`` constant."""
    return ir.Constant(I32, value)


def i64(value: int) -> ir.Constant:
    """An ``i64`` constant."""
    return ir.Constant(I64, value)


def null() -> ir.Constant:
    """The null ``ptr``."""
    return ir.Constant(PTR, None)


def byte_array(data: bytes) -> ir.Constant:
    """``data`` as an ``[N x i8]`` constant."""
    return ir.Constant(ir.ArrayType(ir.IntType(8), len(data)), bytearray(data))


def element(base: ir.GlobalVariable, offset: int) -> ir.Constant:
    """``getelementptr ([N x i8], ptr @base, i64 0, i64 offset)``; LLVM folds offset 0 to ``@base``."""
    if offset == 0:
        return base
    return ir.values.FormattedConstant(
        PTR, f"getelementptr ({base.value_type}, ptr {base.get_reference()}, i64 0, i64 {offset})")


# ------------------------------------------------------------------------------------------------
# The host entry table and the constructor


def entry_type(module: ir.Module, layout: int) -> ir.IdentifiedStructType:
    """``%struct.__tgt_offload_entry`` (``offloading::getEntryTy``): the 19 or the 21 layout."""
    entry = module.context.get_identified_type("struct.__tgt_offload_entry")
    if layout >= 21:
        entry.set_body(I64, I16, I16, I32, PTR, PTR, I64, I64, PTR)
    else:
        entry.set_body(PTR, PTR, I64, I32, I32)
    return entry


def entry_array(module: ir.Module, entry: ir.Type, section: str, layout: int) -> tuple[Global, Global]:
    """``offloading::getOffloadEntryArray``: the linker-defined bounds of the entry section.

    ``__dummy.<section>`` (zero bytes, kept by ``llvm.compiler.used``) makes sure the section, and so
    ``__start_``/``__stop_``, exist even when no object defines an entry.
    """
    table = ir.ArrayType(entry, 0)
    start = Global(module, table, f"__start_{section}", linkage="external", visibility="hidden")
    stop = Global(module, table, f"__stop_{section}", linkage="external", visibility="hidden")
    dummy = Global(module, table, f"__dummy.{section}", section=section, initializer=ir.Constant(table, None),
                   align=8 if layout >= 21 else None)
    used_type = ir.ArrayType(PTR, 1)
    Global(module, used_type, "llvm.compiler.used", linkage="appending", constant=False,
           section="llvm.metadata", initializer=ir.Constant(used_type, [dummy]))
    return start, stop


def append_ctor(module: ir.Module, fn: ir.Function) -> None:
    """``appendToGlobalCtors(M, Func, 101)``."""
    element_type = ir.LiteralStructType([I32, PTR, PTR])
    array = ir.ArrayType(element_type, 1)
    Global(module, array, "llvm.global_ctors", linkage="appending", constant=False,
           initializer=ir.Constant(array, [ir.Constant(element_type, [i32(CTOR_PRIORITY), fn, null()])]))


# ------------------------------------------------------------------------------------------------
# OpenMP's descriptor, for one descriptor and for image groups


def openmp_image_range(image: bytes, index: int, llvm_version: int) -> tuple[int, int]:
    """Where the device image lies in one wrapped buffer: ``(ImageStart, ImageEnd)`` offsets.

    LLVM 19-21 require an OffloadBinary (``createBinDesc`` asserts it); LLVM 22 also wraps a raw image,
    whole.  A buffer that starts with the OffloadBinary magic must be a valid, single binary.
    """
    label = f"image {index}"
    if image[:4] != OFFLOAD_BINARY_MAGIC:
        if llvm_version >= 22:
            return 0, len(image)
        raise OffloadBinaryFormatError(f"not an offload binary (magic 0x10FF10AD): LLVM {llvm_version} wraps "
                                       "each OpenMP image in one; see openmp_image_binary()", path=label, offset=0)
    binary = parse_offload_binary(image, path=label)
    if binary.size != len(image):
        raise OffloadBinaryFormatError(f"the buffer is {len(image)} bytes but its offload binary is {binary.size}: "
                                       "pass exactly one binary per image", path=label, offset=binary.size)
    return binary.image_offset, binary.image_offset + binary.image_size


def openmp_image_buffers(images: Sequence[object], llvm_version: int,
                         where: str = "") -> tuple[list[bytes], list[tuple[int, int]]]:
    """OpenMP's images as bytes, and where each device image lies in its buffer (:func:`openmp_image_range`);
    ``where`` follows each image's label in the errors (``" of group 2"``)."""
    buffers = [as_bytes(image, f"image {i}{where}") for i, image in enumerate(images)]
    return buffers, [openmp_image_range(image, i, llvm_version) for i, image in enumerate(buffers)]


def openmp_module_types(host_triple: str, layout: int) -> tuple[ir.Module, ir.IdentifiedStructType,
                                                                ir.IdentifiedStructType, ir.IdentifiedStructType,
                                                                Global, Global]:
    """A new module with OpenMP's registration types (entry, ``__tgt_device_image``, ``__tgt_bin_desc``) and the
    entry table's bounds, made in LLVM's order."""
    module = new_module(host_triple)
    entry = entry_type(module, layout)
    device_image = module.context.get_identified_type("__tgt_device_image")
    device_image.set_body(PTR, PTR, PTR, PTR)
    bin_desc = module.context.get_identified_type("__tgt_bin_desc")
    bin_desc.set_body(I32, PTR, PTR, PTR)
    begin, end = entry_array(module, entry, entry_section(OPENMP, layout), layout)
    return module, entry, device_image, bin_desc, begin, end
