"""Host registration ("wrapper") objects, as clang-linker-wrapper generates them, without Clang.

After the device images are linked, clang-linker-wrapper builds a small host module that embeds them
and registers them with the offload runtime from a constructor (``wrapOpenMPBinaries``,
``wrapCudaBinary`` and ``wrapHIPBinary`` in ``llvm/lib/Frontend/Offloading/OffloadWrapper.cpp``, with
the entry table from ``Utility.cpp``), then compiles it in-process to a PIC object.  This module
builds the same IR with :mod:`llvmlite.ir` and compiles it with :mod:`llvmlite.binding`, so a build
system can run the wrap step as a node of its own.

What is reproduced (checked against clang-linker-wrapper 19.1.7 and llvm-offload-wrapper 22.1.8 in
``tests/test_registration.py``, which compare the modules instruction for instruction):

* **OpenMP**: one ``.omp_offloading.device_image[.N]`` per image (section ``.llvm.offloading``,
  align 8), the ``__tgt_device_image`` array, the ``__tgt_bin_desc`` descriptor and a priority-101
  constructor calling ``__tgt_register_lib`` and ``atexit(__tgt_unregister_lib ...)``.  Every image
  shares the host entry table ``__start_<section>``..``__stop_<section>``.
* **CUDA / HIP**: the fatbinary in ``.nv_fatbin`` / ``.hip_fatbin``, the ``fatbin_wrapper`` in
  ``.nvFatBinSegment`` / ``.hipFatBinSegment`` (magic 0x466243B1 / 0x48495046), and a priority-101
  constructor that registers the binary, walks the host entry table registering kernels and
  variables (``.cuda.globals_reg`` / ``.hip.globals_reg``), and unregisters through ``atexit``.

Not from LLVM: **OpenMP image groups** (:func:`openmp_group_module`), several ``__tgt_bin_desc`` in one
program, each with its own images and its own part of the entry table, split by entry name at start-up, as
separately built shared libraries would register them; a device link per group instead of one for the program.

The entry table changed in LLVM 21 (see :func:`entry_layout`): LLVM 19 and 20 use a 32-byte
``__tgt_offload_entry`` in one section per offload kind, LLVM 21 and later a 56-byte versioned entry
in the shared ``llvm_offload_entries`` section, where the CUDA/HIP walk skips entries of other kinds.
Only ELF hosts are supported (Mach-O and COFF use other section names).
"""
from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Final, Union

from llvmlite import ir

from offload_builders.errors import (
    BundleFormatError,
    OffloadBinaryFormatError,
    OffloadError,
    OffloadFormatError,
    TargetIDError,
)
from offload_builders.formats.offload_binary import (
    MAGIC as OFFLOAD_BINARY_MAGIC,
    ImageKind,
    OffloadingImage,
    OffloadKind,
    encode_offload_binary,
    kind_table,
    parse_offload_binary,
)

__all__ = [
    "CUDA",
    "CUDA_FAT_MAGIC",
    "DEFAULT_HOST_TRIPLE",
    "HIP",
    "HIP_FAT_MAGIC",
    "OMP_REGISTER_REQUIRES",
    "OPENMP",
    "OPENMP_GROUPS",
    "REQUIRES_ENTRY_NAMES",
    "ImageGroup",
    "compile_module",
    "cuda_module",
    "entry_layout",
    "hip_module",
    "openmp_group_module",
    "openmp_image_binary",
    "openmp_module",
    "wrap",
    "wrap_kinds",
    "wrap_openmp_groups",
]

OPENMP: Final = "openmp"
#: :func:`wrap`'s kind for OpenMP image groups, each registered as its own descriptor (:func:`openmp_group_module`).
OPENMP_GROUPS: Final = "openmp-groups"
CUDA: Final = "cuda"
HIP: Final = "hip"
KINDS: Final = (OPENMP, CUDA, HIP)

DEFAULT_HOST_TRIPLE: Final = "x86_64-unknown-linux-gnu"
#: ``CudaFatMagic`` / ``HIPFatMagic``: the first word of the fatbin wrapper the runtime checks.
CUDA_FAT_MAGIC: Final = 0x466243B1
HIP_FAT_MAGIC: Final = 0x48495046
#: The registration constructors' priority (``appendToGlobalCtors(M, Func, 101)``, LLVM 19+).
CTOR_PRIORITY: Final = 101
#: What ``fatbinary --create`` files start with (0xBA55ED50, little-endian).
NV_FATBIN_MAGIC: Final = b"\x50\xed\x55\xba"
_BUNDLE_MAGIC: Final = b"__CLANG_OFFLOAD_BUNDLE__"
_CCOB_MAGIC: Final = b"CCOB"

PathArg = Union[str, "os.PathLike[str]"]

_I16 = ir.IntType(16)
_I32 = ir.IntType(32)
_I64 = ir.IntType(64)
_VOID = ir.VoidType()
#: Always the opaque ``ptr``: llvmlite prints typed pointers (``i8*``) unless told otherwise through an
#: environment variable, and LLVM 17+ (which Clang's modules and llvmlite's own LLVM are) has only ``ptr``.
_PTR = ir.PointerType()


# ------------------------------------------------------------------------------------------------
# Versions and layouts


def _check_version(llvm_version: int) -> int:
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
    return 19 if _check_version(llvm_version) <= 20 else 21


def _entry_section(kind: str, layout: int) -> str:
    return "llvm_offload_entries" if layout >= 21 else f"{'omp' if kind == OPENMP else kind}_offloading_entries"


_NON_ELF_OS: Final = ("darwin", "macos", "ios", "tvos", "watchos", "xros", "driverkit", "windows", "win32",
                       "mingw", "cygwin", "uefi")


def _check_host_triple(host_triple: str) -> str:
    if not isinstance(host_triple, str) or not host_triple or host_triple.count("-") < 1:
        raise OffloadError(f"invalid host triple {host_triple!r}")
    parts = host_triple.lower().split("-")
    if ("apple" in parts[1:2] or any(p.startswith(_NON_ELF_OS) for p in parts[1:])
            or any(p in ("msvc", "coff", "macho") for p in parts[2:])):
        raise OffloadError(f"host triple {host_triple!r} is not an ELF target: only ELF hosts are supported "
                           "(Mach-O and COFF use other section names)")
    return host_triple


# ------------------------------------------------------------------------------------------------
# llvmlite helpers


class _Global(ir.GlobalVariable):
    """A global variable whose address is an opaque ``ptr`` and that may carry a visibility.

    llvmlite has no visibility field; LLVM's grammar puts it right after the linkage.
    """

    def __init__(self, module: ir.Module, typ: ir.Type, name: str, *, linkage: str = "internal",
                 constant: bool = True, section: str = "", align: int | None = None,
                 initializer: ir.Constant | None = None, unnamed_addr: bool = False,
                 visibility: str = "") -> None:
        super().__init__(module, typ, name)
        self.type = _PTR
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
        self.type = _PTR

    @property
    def function_type(self) -> ir.FunctionType:
        # llvmlite finds the signature through a typed pointer, which an opaque ``ptr`` does not have.
        return self.ftype


def _function(module: ir.Module, name: str, ret: ir.Type, args: Sequence[ir.Type]) -> ir.Function:
    return _Function(module, ir.FunctionType(ret, list(args)), name)


def _define(module: ir.Module, name: str, args: Sequence[ir.Type] = ()) -> ir.Function:
    """An internal ``void`` function in ``.text.startup``, as every wrapper function is."""
    fn = _function(module, name, _VOID, args)
    fn.linkage = "internal"
    fn.section = ".text.startup"
    return fn


def _new_module(host_triple: str) -> ir.Module:
    # A fresh type context each time: identified struct types are per context, and every module
    # defines its own %struct.__tgt_offload_entry.
    module = ir.Module("offload.wrapper.module", context=ir.Context())
    module.triple = _check_host_triple(host_triple)
    return module


def _i32(value: int) -> ir.Constant:
    return ir.Constant(_I32, value)


def _i64(value: int) -> ir.Constant:
    return ir.Constant(_I64, value)


def _null() -> ir.Constant:
    return ir.Constant(_PTR, None)


def _byte_array(data: bytes) -> ir.Constant:
    return ir.Constant(ir.ArrayType(ir.IntType(8), len(data)), bytearray(data))


def _element(base: ir.GlobalVariable, offset: int) -> ir.Constant:
    """``getelementptr ([N x i8], ptr @base, i64 0, i64 offset)``; LLVM folds offset 0 to ``@base``."""
    if offset == 0:
        return base
    return ir.values.FormattedConstant(
        _PTR, f"getelementptr ({base.value_type}, ptr {base.get_reference()}, i64 0, i64 {offset})")


def _entry_type(module: ir.Module, layout: int) -> ir.IdentifiedStructType:
    """``%struct.__tgt_offload_entry`` (``offloading::getEntryTy``): the 19 or the 21 layout."""
    entry = module.context.get_identified_type("struct.__tgt_offload_entry")
    if layout >= 21:
        entry.set_body(_I64, _I16, _I16, _I32, _PTR, _PTR, _I64, _I64, _PTR)
    else:
        entry.set_body(_PTR, _PTR, _I64, _I32, _I32)
    return entry


def _entry_array(module: ir.Module, entry: ir.Type, section: str, layout: int) -> tuple[_Global, _Global]:
    """``offloading::getOffloadEntryArray``: the linker-defined bounds of the entry section.

    ``__dummy.<section>`` (zero bytes, kept by ``llvm.compiler.used``) makes sure the section, and so
    ``__start_``/``__stop_``, exist even when no object defines an entry.
    """
    table = ir.ArrayType(entry, 0)
    start = _Global(module, table, f"__start_{section}", linkage="external", visibility="hidden")
    stop = _Global(module, table, f"__stop_{section}", linkage="external", visibility="hidden")
    dummy = _Global(module, table, f"__dummy.{section}", section=section, initializer=ir.Constant(table, None),
                    align=8 if layout >= 21 else None)
    used_type = ir.ArrayType(_PTR, 1)
    _Global(module, used_type, "llvm.compiler.used", linkage="appending", constant=False,
            section="llvm.metadata", initializer=ir.Constant(used_type, [dummy]))
    return start, stop


def _append_ctor(module: ir.Module, fn: ir.Function) -> None:
    """``appendToGlobalCtors(M, Func, 101)``."""
    element = ir.LiteralStructType([_I32, _PTR, _PTR])
    array = ir.ArrayType(element, 1)
    _Global(module, array, "llvm.global_ctors", linkage="appending", constant=False,
            initializer=ir.Constant(array, [ir.Constant(element, [_i32(CTOR_PRIORITY), fn, _null()])]))


# ------------------------------------------------------------------------------------------------
# OpenMP


def _image_range(image: bytes, index: int, llvm_version: int) -> tuple[int, int]:
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


def new_module(host_triple: str = DEFAULT_HOST_TRIPLE) -> ir.Module:
    """An empty module for ``host_triple`` (a link with no device images still gets a wrapper object)."""
    return _new_module(host_triple)


def _openmp_module_types(host_triple: str, layout: int) -> tuple[ir.Module, ir.IdentifiedStructType,
                                                                  ir.IdentifiedStructType, ir.IdentifiedStructType,
                                                                  _Global, _Global]:
    """A new module with OpenMP's registration types (entry, ``__tgt_device_image``, ``__tgt_bin_desc``) and the
    entry table's bounds, made in LLVM's order."""
    module = _new_module(host_triple)
    entry = _entry_type(module, layout)
    device_image = module.context.get_identified_type("__tgt_device_image")
    device_image.set_body(_PTR, _PTR, _PTR, _PTR)
    bin_desc = module.context.get_identified_type("__tgt_bin_desc")
    bin_desc.set_body(_I32, _PTR, _PTR, _PTR)
    begin, end = _entry_array(module, entry, _entry_section(OPENMP, layout), layout)
    return module, entry, device_image, bin_desc, begin, end


def openmp_module(images: Sequence[bytes], *, llvm_version: int = 19,
                  host_triple: str = DEFAULT_HOST_TRIPLE) -> ir.Module:
    """``wrapOpenMPBinaries``: register ``images`` (one OffloadBinary each, in this order) with libomptarget.

    ``ImageStart``/``ImageEnd`` point at the raw device image inside each binary, which is what the
    runtime loads; the binary's header stays in front of it for tools such as ``llvm-objdump --offloading``.
    """
    layout = entry_layout(llvm_version)
    if isinstance(images, (bytes, bytearray, memoryview, str)) or not isinstance(images, Sequence):
        raise OffloadError("openmp_module() takes a sequence of images (one OffloadBinary each), "
                           f"not {type(images).__name__}")
    buffers = [_as_bytes(image, f"image {i}") for i, image in enumerate(images)]
    ranges = [_image_range(image, i, llvm_version) for i, image in enumerate(buffers)]

    module, entry, device_image, bin_desc, begin, end = _openmp_module_types(host_triple, layout)

    inits = []
    for i, (data, (start, stop)) in enumerate(zip(buffers, ranges)):
        blob = _byte_array(data)
        image = _Global(module, blob.type, ".omp_offloading.device_image" + (f".{i}" if i else ""),
                        initializer=blob, unnamed_addr=True, section=".llvm.offloading", align=8)
        inits.append(ir.Constant(device_image, [_element(image, start), _element(image, stop), begin, end]))
    images_type = ir.ArrayType(device_image, len(inits))
    images_global = _Global(module, images_type, ".omp_offloading.device_images", unnamed_addr=True,
                            initializer=ir.Constant(images_type, inits if inits else None))
    descriptor = _Global(module, bin_desc, ".omp_offloading.descriptor",
                         initializer=ir.Constant(bin_desc, [_i32(len(inits)), images_global, begin, end]))

    # createRegisterFunction: the same creation order as LLVM, so the printed modules line up.
    reg = _define(module, ".omp_offloading.descriptor_reg")
    register_lib = _function(module, "__tgt_register_lib", _VOID, [_PTR])
    atexit = _function(module, "atexit", _I32, [_PTR])
    unreg = _define(module, ".omp_offloading.descriptor_unreg")
    unregister_lib = _function(module, "__tgt_unregister_lib", _VOID, [_PTR])
    builder = ir.IRBuilder(unreg.append_basic_block("entry"))
    builder.call(unregister_lib, [descriptor])
    builder.ret_void()
    builder = ir.IRBuilder(reg.append_basic_block("entry"))
    builder.call(register_lib, [descriptor])
    # Unregister through atexit, after the plugins are up, so it runs before they are torn down.
    builder.call(atexit, [unreg])
    builder.ret_void()
    _append_ctor(module, reg)
    return module


def openmp_image_binary(image: bytes | PathArg, *, triple: str, arch: str, llvm_version: int = 19) -> bytes:
    """One linked device image as clang-linker-wrapper's ``bundleOpenMP`` wraps it before embedding.

    An OffloadBinary with image kind ``IMG_Object``, offload kind ``openmp`` and the strings ``triple``
    and ``arch`` of the link group, in that order (``arch`` is "" for CPU targets, and still written).
    """
    _check_version(llvm_version)
    table = kind_table(llvm_version)
    for name, value in (("triple", triple), ("arch", arch)):
        if not isinstance(value, str):
            raise OffloadError(f"{name} must be a string, not {type(value).__name__}")
    if not triple:
        raise TargetIDError("an OpenMP device image needs its target triple")
    if isinstance(image, (bytearray, memoryview)):
        image = bytes(image)
    try:
        entry = OffloadingImage(image=image, image_kind=table.image_value(ImageKind.OBJECT),
                                offload_kind=table.offload_value(OffloadKind.OPENMP),
                                strings=(("triple", triple), ("arch", arch)))
    except ValueError as exc:
        raise OffloadError(str(exc)) from None
    return encode_offload_binary(entry)


# ------------------------------------------------------------------------------------------------
# OpenMP image groups: several descriptors in one program

#: One image group: its device images (one OffloadBinary each, one per target) and the names of the host
#: entries (kernels, globals) its images define, as :func:`offload_builders.linking.registered_entries` reads them.
ImageGroup = tuple[Sequence[bytes], Sequence[str]]
#: ``OMP_REGISTER_REQUIRES``: an entry that carries ``#pragma omp requires`` flags (in ``data``), address null.
OMP_REGISTER_REQUIRES: Final = 0x10
#: The names Clang gives that entry (its symbol ``.offloading.entry.<name>``): "" (Clang 19), ".requires"
#: (Clang 22), so they may come in every group's names; the entry goes to every group by its null address anyway.
REQUIRES_ENTRY_NAMES: Final = frozenset({"", ".requires"})


def _check_groups(groups: Sequence[ImageGroup], llvm_version: int) -> tuple[list[list[bytes]], list[list[bytes]]]:
    """The groups' image buffers and their entry names (UTF-8, as C strings compare), validated."""
    if isinstance(groups, (bytes, bytearray, memoryview, str)) or not isinstance(groups, Sequence):
        raise OffloadError("openmp_group_module() takes a sequence of (images, entry names) groups, "
                           f"not {type(groups).__name__}")
    if not groups:
        raise OffloadError("openmp_group_module() needs at least one image group")
    all_images: list[list[bytes]] = []
    all_names: list[list[bytes]] = []
    owner: dict[bytes, int] = {}
    targets: list[tuple[int, list[tuple[str, str]]]] = []
    for g, group in enumerate(groups):
        if not isinstance(group, tuple) or len(group) != 2:
            raise OffloadError(f"image group {g} must be a pair (images, entry names), not {type(group).__name__}")
        images, names = group
        if isinstance(images, (bytes, bytearray, memoryview, str)) or not isinstance(images, Sequence):
            raise OffloadError(f"image group {g}: its images must be a sequence (one OffloadBinary each), "
                               f"not {type(images).__name__}")
        if not images:
            raise OffloadError(f"image group {g} has no device image: every group needs one image per target of "
                               "the program (libomptarget registers each descriptor against every image so far)")
        if isinstance(names, (bytes, str)) or not isinstance(names, Sequence):
            raise OffloadError(f"image group {g}: its entry names must be a sequence of strings, "
                               f"not {type(names).__name__}")
        buffers = [_as_bytes(image, f"image {i} of group {g}") for i, image in enumerate(images)]
        keys = []
        for i, data in enumerate(buffers):
            _image_range(data, i, llvm_version)
            if data[:4] == OFFLOAD_BINARY_MAGIC:
                binary = parse_offload_binary(data, path=f"image {i} of group {g}")
                keys.append((binary.triple, binary.arch))
        if len(keys) == len(buffers):
            targets.append((g, keys))
        encoded = []
        for name in names:
            if not isinstance(name, str):
                raise OffloadError(f"image group {g}: entry names must be strings, not {type(name).__name__}")
            if name in REQUIRES_ENTRY_NAMES:
                continue  # every group's, by its null address
            raw = name.encode("utf-8", "surrogateescape")
            if b"\0" in raw:
                raise OffloadError(f"image group {g}: invalid entry name {name!r} (a NUL byte)")
            first = owner.setdefault(raw, g)
            if first != g:
                raise OffloadError(f"entry {name!r} is in image groups {first} and {g}: each entry belongs to one "
                                   "group (sources that share device symbols must be in the same group)")
            encoded.append(raw)
        all_images.append(buffers)
        all_names.append(encoded)
    if len(targets) == len(groups):
        first_group, first_keys = targets[0]
        for g, keys in targets[1:]:
            if sorted(keys) != sorted(first_keys):
                raise OffloadError(f"image groups {first_group} and {g} have images for different targets "
                                   f"({_target_list(first_keys)} vs {_target_list(keys)}): every group needs an "
                                   "image for each target (libomptarget registers each descriptor against every "
                                   "image registered before it, the last one per device winning)")
    return all_images, all_names


def _target_list(keys: Sequence[tuple[str, str]]) -> str:
    return ", ".join(f"{triple} {arch}".strip() for triple, arch in sorted(keys)) or "none"


def _counted_loop(builder: ir.IRBuilder, name: str, start: ir.Value, end: ir.Value, step: ir.Value | ir.Type,
                  body: Callable[[ir.Value], None]) -> None:
    """``for (v = start; v != end; v += step) body(v)`` (``v`` an integer, or a pointer stepped by ``step``
    elements, ``step`` then being the element type); the builder ends after the loop."""
    fn = builder.function
    before = builder.block
    head = fn.append_basic_block(f"{name}.head")
    loop = fn.append_basic_block(f"{name}.body")
    done = fn.append_basic_block(f"{name}.end")
    builder.branch(head)
    builder.position_at_end(head)
    value = builder.phi(start.type, name=name)
    value.add_incoming(start, before)
    builder.cbranch(builder.icmp_unsigned("!=", value, end), loop, done)
    builder.position_at_end(loop)
    body(value)
    if isinstance(step, ir.Type):
        following = builder.gep(value, [_i64(1)], inbounds=True, source_etype=step)
    else:
        following = builder.add(value, step)
    value.add_incoming(following, builder.block)
    builder.branch(head)
    builder.position_at_end(done)


def _entry_group_function(module: ir.Module, entry: ir.Type, layout: int,
                          names: Sequence[tuple[bytes, int]]) -> ir.Function:
    """``i32 .omp_offloading.entry_group(ptr entry)``: the group of one host entry, -1 for every group.

    A null address (a ``requires`` entry) is every group's; a name found by binary search (``strcmp``) in the
    sorted constant table of ``(name, group)`` is that group's; anything else (a null name, a name no group
    listed) is group 0's.
    """
    blob = _byte_array(b"".join(name + b"\0" for name, _ in names))
    strings = _Global(module, blob.type, ".omp_offloading.entry_group_names", linkage="private", initializer=blob,
                      unnamed_addr=True)
    record = ir.LiteralStructType([_PTR, _I32])
    rows = []
    offset = 0
    for name, group in names:
        rows.append(ir.Constant(record, [_element(strings, offset), _i32(group)]))
        offset += len(name) + 1
    table_type = ir.ArrayType(record, len(rows))
    table = _Global(module, table_type, ".omp_offloading.entry_groups", linkage="private", unnamed_addr=True,
                    initializer=ir.Constant(table_type, rows if rows else None))
    strcmp = _function(module, "strcmp", _I32, [_PTR, _PTR])

    fn = _function(module, ".omp_offloading.entry_group", _I32, [_PTR])
    fn.linkage = "internal"
    fn.section = ".text.startup"
    blocks = {name: fn.append_basic_block(name) for name in
              ("entry", "named", "search", "probe", "found", "narrow", "every", "other")}
    builder = ir.IRBuilder(blocks["entry"])
    cursor = fn.args[0]
    addr_field, name_field = (4, 5) if layout >= 21 else (0, 1)
    zero = _i32(0) if layout >= 21 else _i64(0)
    addr = builder.load(builder.gep(cursor, [zero, _i32(addr_field)], inbounds=True, source_etype=entry),
                        name="addr", typ=_PTR, align=1)
    builder.cbranch(builder.icmp_unsigned("==", addr, _null()), blocks["every"], blocks["named"])

    builder.position_at_end(blocks["named"])
    name = builder.load(builder.gep(cursor, [zero, _i32(name_field)], inbounds=True, source_etype=entry),
                        name="name", typ=_PTR, align=1)
    builder.cbranch(builder.icmp_unsigned("==", name, _null()), blocks["other"], blocks["search"])

    builder.position_at_end(blocks["search"])
    low = builder.phi(_I64, name="low")
    high = builder.phi(_I64, name="high")
    low.add_incoming(_i64(0), blocks["named"])
    high.add_incoming(_i64(len(rows)), blocks["named"])
    builder.cbranch(builder.icmp_unsigned("<", low, high), blocks["probe"], blocks["other"])

    builder.position_at_end(blocks["probe"])
    middle = builder.lshr(builder.add(low, high), _i64(1), name="middle")
    row = builder.gep(table, [_i64(0), middle], inbounds=True, source_etype=table_type)
    known = builder.load(builder.gep(row, [_i32(0), _i32(0)], inbounds=True, source_etype=record),
                         name="known", typ=_PTR, align=8)
    order = builder.call(strcmp, [name, known], name="order")
    builder.cbranch(builder.icmp_signed("==", order, _i32(0)), blocks["found"], blocks["narrow"])

    builder.position_at_end(blocks["found"])
    builder.ret(builder.load(builder.gep(row, [_i32(0), _i32(1)], inbounds=True, source_etype=record),
                             name="group", typ=_I32, align=8))

    builder.position_at_end(blocks["narrow"])
    before = builder.icmp_signed("<", order, _i32(0), name="before")
    low.add_incoming(builder.select(before, low, builder.add(middle, _i64(1))), blocks["narrow"])
    high.add_incoming(builder.select(before, middle, high), blocks["narrow"])
    builder.branch(blocks["search"])

    builder.position_at_end(blocks["every"])
    builder.ret(_i32(-1))
    builder.position_at_end(blocks["other"])
    builder.ret(_i32(0))
    return fn


def openmp_group_module(groups: Sequence[ImageGroup], *, llvm_version: int = 19,
                        host_triple: str = DEFAULT_HOST_TRIPLE) -> ir.Module:
    """Register each image group with libomptarget as its own ``__tgt_bin_desc``, as separately built shared
    libraries do: a device link per group instead of one for the whole program.

    ``groups`` holds ``(images, entry names)``: each group's images (one OffloadBinary each, one per target, the
    same targets in every group) and the names of the host entries its images define.  The priority-101
    constructor splits the linker's entry table ``__start_<section>``..``__stop_<section>`` by name: an entry
    named in group g goes to g's table, an entry with a null address (``#pragma omp requires`` flags) to every
    group's, any other entry to group 0's.  Each table is a ``malloc``ed copy (never freed: libomptarget keeps
    pointers into it); each descriptor and each of its images get that group's range (libomptarget requires the
    image's range to match its descriptor's, and finds a host address in the first table whose range holds it).
    The descriptors are registered in group order and unregistered in reverse through one ``atexit`` function.
    """
    layout = entry_layout(llvm_version)
    buffers, names = _check_groups(groups, llvm_version)
    ranges = [[_image_range(image, i, llvm_version) for i, image in enumerate(group)] for group in buffers]
    # strcmp compares unsigned bytes, as Python orders bytes.
    table = sorted((name, g) for g, group in enumerate(names) for name in set(group))

    module, entry, device_image, bin_desc, begin, end = _openmp_module_types(host_triple, layout)

    descs = []
    for g, (group, group_ranges) in enumerate(zip(buffers, ranges)):
        inits = []
        for i, (data, (start, stop)) in enumerate(zip(group, group_ranges)):
            blob = _byte_array(data)
            image = _Global(module, blob.type, f".omp_offloading.device_image.{g}.{i}", initializer=blob,
                            unnamed_addr=True, section=".llvm.offloading", align=8)
            inits.append(ir.Constant(device_image, [_element(image, start), _element(image, stop), _null(), _null()]))
        images_type = ir.ArrayType(device_image, len(inits))
        images_global = _Global(module, images_type, f".omp_offloading.device_images.{g}", constant=False,
                                initializer=ir.Constant(images_type, inits))
        descs.append(ir.Constant(bin_desc, [_i32(len(inits)), images_global, _null(), _null()]))
    count = len(descs)
    descs_type = ir.ArrayType(bin_desc, count)
    descriptors = _Global(module, descs_type, ".omp_offloading.descriptors", constant=False,
                          initializer=ir.Constant(descs_type, descs))
    sizes_type = ir.ArrayType(_I64, count)
    sizes = _Global(module, sizes_type, ".omp_offloading.group_sizes", constant=False,
                    initializer=ir.Constant(sizes_type, None))

    entry_group = _entry_group_function(module, entry, layout, table)
    reg = _define(module, ".omp_offloading.descriptor_reg")
    register_lib = _function(module, "__tgt_register_lib", _VOID, [_PTR])
    atexit = _function(module, "atexit", _I32, [_PTR])
    malloc = _function(module, "malloc", _PTR, [_I64])
    abort = _function(module, "abort", _VOID, [])
    unreg = _define(module, ".omp_offloading.descriptor_unreg")
    unregister_lib = _function(module, "__tgt_unregister_lib", _VOID, [_PTR])

    def desc_field(builder: ir.IRBuilder, g: ir.Value, field: int) -> ir.Value:
        return builder.gep(descriptors, [_i64(0), g, _i32(field)], inbounds=True, source_etype=descs_type)

    builder = ir.IRBuilder(unreg.append_basic_block("entry"))

    def unregister(k: ir.Value) -> None:
        g = builder.sub(_i64(count - 1), k, name="g")
        builder.call(unregister_lib, [builder.gep(descriptors, [_i64(0), g], inbounds=True, source_etype=descs_type)])

    _counted_loop(builder, "unreg", _i64(0), _i64(count), _i64(1), unregister)
    builder.ret_void()

    builder = ir.IRBuilder(reg.append_basic_block("entry"))

    def for_groups(name: str, body: Callable[[ir.Value], None]) -> None:
        _counted_loop(builder, name, _i64(0), _i64(count), _i64(1), body)

    def for_entries(name: str, body: Callable[[ir.Value, ir.Value], None]) -> None:
        """``body(entry, group)`` for each entry; ``group`` is an i64, -1 for every group."""
        def visit(cursor: ir.Value) -> None:
            body(cursor, builder.sext(builder.call(entry_group, [cursor], name="group"), _I64))
        _counted_loop(builder, name, begin, end, entry, visit)

    def to_groups(group: ir.Value, action: Callable[[ir.Value], None], name: str) -> None:
        """``action(g)`` for ``group``, or for every group where it is -1."""
        with builder.if_else(builder.icmp_signed("<", group, _i64(0))) as (every, one):
            with every:
                for_groups(f"{name}.every", action)
            with one:
                action(group)

    def count_entry(g: ir.Value) -> None:
        slot = builder.gep(sizes, [_i64(0), g], inbounds=True, source_etype=sizes_type)
        builder.store(builder.add(builder.load(slot, typ=_I64, align=8), _i64(1)), slot, align=8)

    for_entries("count", lambda cursor, group: to_groups(group, count_entry, "count"))

    entry_size = builder.ptrtoint(builder.gep(_null(), [_i64(1)], source_etype=entry), _I64, name="entry_size")

    def allocate(g: ir.Value) -> None:
        # One spare entry: never malloc(0), and no two groups share a HostEntriesBegin (libomptarget's key).
        used = builder.load(builder.gep(sizes, [_i64(0), g], inbounds=True, source_etype=sizes_type), typ=_I64,
                            align=8)
        table_start = builder.call(malloc, [builder.mul(builder.add(used, _i64(1)), entry_size)], name="table")
        with builder.if_then(builder.icmp_unsigned("==", table_start, _null()), likely=False):
            builder.call(abort, [])
        builder.store(table_start, desc_field(builder, g, 2), align=8)
        builder.store(table_start, desc_field(builder, g, 3), align=8)

    for_groups("allocate", allocate)

    def copy_entries(cursor: ir.Value, group: ir.Value) -> None:
        def append(g: ir.Value) -> None:
            slot = desc_field(builder, g, 3)
            target = builder.load(slot, typ=_PTR, align=8)
            builder.store(builder.load(cursor, typ=entry, align=1), target, align=1)
            builder.store(builder.gep(target, [_i64(1)], inbounds=True, source_etype=entry), slot, align=8)
        to_groups(group, append, "copy")

    for_entries("copy", copy_entries)

    def register(g: ir.Value) -> None:
        table_start = builder.load(desc_field(builder, g, 2), typ=_PTR, align=8)
        table_end = builder.load(desc_field(builder, g, 3), typ=_PTR, align=8)
        images = builder.load(desc_field(builder, g, 1), typ=_PTR, align=8)
        number = builder.zext(builder.load(desc_field(builder, g, 0), typ=_I32, align=8), _I64)

        def set_range(i: ir.Value) -> None:
            for field, value in ((2, table_start), (3, table_end)):
                pointer = builder.gep(images, [i, _i32(field)], inbounds=True, source_etype=device_image)
                builder.store(value, pointer, align=8)

        _counted_loop(builder, "image", _i64(0), number, _i64(1), set_range)
        builder.call(register_lib, [builder.gep(descriptors, [_i64(0), g], inbounds=True, source_etype=descs_type)])

    for_groups("register", register)
    # Unregister through atexit, after the plugins are up, so it runs before they are torn down.
    builder.call(atexit, [unreg])
    builder.ret_void()
    _append_ctor(module, reg)
    return module


# ------------------------------------------------------------------------------------------------
# CUDA and HIP


def _check_fatbin(fatbin: bytes, hip: bool) -> bytes:
    data = _as_bytes(fatbin, "fatbinary")
    if hip:
        if not (data.startswith(_BUNDLE_MAGIC) or data.startswith(_CCOB_MAGIC)):
            raise BundleFormatError("a HIP fatbinary must be a clang-offload-bundler bundle "
                                    "(__CLANG_OFFLOAD_BUNDLE__ or CCOB): see offload_builders.formats.fatbinary",
                                    offset=0)
    elif not data.startswith(NV_FATBIN_MAGIC):
        raise OffloadFormatError("a CUDA fatbinary must start with the fatbin magic 0xBA55ED50 "
                                 "(the output of `fatbinary --create`)", offset=0)
    return data


def _fatbin_module(fatbin: bytes, hip: bool, llvm_version: int, host_triple: str) -> ir.Module:
    """``wrapCudaBinary`` / ``wrapHIPBinary`` (``createFatbinDesc`` + ``createRegisterFatbinFunction``)."""
    layout = entry_layout(llvm_version)
    data = _check_fatbin(fatbin, hip)
    prefix = ".hip" if hip else ".cuda"
    api = "__hip" if hip else "__cuda"

    module = _new_module(host_triple)
    entry = _entry_type(module, layout)
    wrapper_type = module.context.get_identified_type("fatbin_wrapper")
    wrapper_type.set_body(_I32, _I32, _PTR, _PTR)
    begin, end = _entry_array(module, entry, _entry_section(HIP if hip else CUDA, layout), layout)

    blob = _byte_array(data)
    image = _Global(module, blob.type, ".fatbin_image", initializer=blob,
                    section=".hip_fatbin" if hip else ".nv_fatbin")
    wrapper = _Global(module, wrapper_type, ".fatbin_wrapper", align=8,
                      section=".hipFatBinSegment" if hip else ".nvFatBinSegment",
                      initializer=ir.Constant(wrapper_type, [_i32(HIP_FAT_MAGIC if hip else CUDA_FAT_MAGIC),
                                                             _i32(1), image, _null()]))
    handle = _Global(module, _PTR, f"{prefix}.binary_handle", constant=False, initializer=_null())

    ctor = _define(module, f"{prefix}.fatbin_reg")
    dtor = _define(module, f"{prefix}.fatbin_unreg")
    register_fatbin = _function(module, f"{api}RegisterFatBinary", _PTR, [_PTR])
    # Declared for HIP too (LLVM declares it unconditionally), but only CUDA calls it.
    register_end = _function(module, "__cudaRegisterFatBinaryEnd", _VOID, [_PTR])
    unregister_fatbin = _function(module, f"{api}UnregisterFatBinary", _VOID, [_PTR])
    atexit = _function(module, "atexit", _I32, [_PTR])
    globals_reg = _register_globals(module, entry, begin, end, hip, layout, llvm_version)

    builder = ir.IRBuilder(ctor.append_basic_block("entry"))
    binary = builder.call(register_fatbin, [wrapper])
    builder.store(binary, handle, align=8)
    builder.call(globals_reg, [binary])
    if not hip:
        builder.call(register_end, [binary])
    # CUDA >= 9.2 forbids unregistering from a global destructor: atexit it is.
    builder.call(atexit, [dtor])
    builder.ret_void()

    builder = ir.IRBuilder(dtor.append_basic_block("entry"))
    builder.call(unregister_fatbin, [builder.load(handle, typ=_PTR, align=8)])
    builder.ret_void()
    _append_ctor(module, ctor)
    return module


def _register_globals(module: ir.Module, entry: ir.Type, begin: _Global, end: _Global, hip: bool, layout: int,
                      llvm_version: int) -> ir.Function:
    """``createRegisterGlobalsFunction``: walk the entry table, registering kernels and variables.

    Per entry: ``size == 0`` is a kernel (``__cudaRegisterFunction``); otherwise ``flags & 7`` selects
    a variable (0), managed variable (1; registered from LLVM 21), surface (2) or texture (3).  Surfaces
    and textures are only registered for HIP (the linker wrapper passes ``EmitSurfacesAndTextures``
    false for CUDA).  From LLVM 21 the table is shared, so entries of another ``Kind`` are skipped.
    """
    api = "__hip" if hip else "__cuda"
    register_function = _function(module, f"{api}RegisterFunction", _I32,
                                  [_PTR, _PTR, _PTR, _PTR, _I32, _PTR, _PTR, _PTR, _PTR, _PTR])
    register_var = _function(module, f"{api}RegisterVar", _VOID, [_PTR, _PTR, _PTR, _PTR, _I32, _I64, _I32, _I32])
    register_managed = (_function(module, f"{api}RegisterManagedVar", _VOID, [_PTR, _PTR, _PTR, _PTR, _I64, _I32])
                        if layout >= 21 else None)
    register_surface = _function(module, f"{api}RegisterSurface", _VOID, [_PTR, _PTR, _PTR, _PTR, _I32, _I32])
    register_texture = _function(module, f"{api}RegisterTexture", _VOID, [_PTR, _PTR, _PTR, _PTR, _I32, _I32, _I32])

    fn = _define(module, ".hip.globals_reg" if hip else ".cuda.globals_reg", [_PTR])
    handle = fn.args[0]
    names = ["entry", "while.entry"] + (["if.kind"] if layout >= 21 else []) + [
        "if.then", "if.else", "sw.global", "sw.managed", "sw.surface", "sw.texture", "if.end", "while.end"]
    blocks = {name: fn.append_basic_block(name) for name in names}

    builder = ir.IRBuilder(blocks["entry"])
    builder.cbranch(builder.icmp_unsigned("!=", begin, end), blocks["while.entry"], blocks["while.end"])

    builder.position_at_end(blocks["while.entry"])
    # LLVM names this phi "entry" and, the block having that name, prints it as %entry1.
    cursor = builder.phi(_PTR, name="entry1")

    def field(index: int, typ: ir.Type, name: str, align: int) -> ir.Instruction:
        # The module has no data layout when LLVM builds it, so i64 loads get the default ABI alignment 4.
        zero = _i32(0) if layout >= 21 else _i64(0)
        pointer = builder.gep(cursor, [zero, _i32(index)], inbounds=True, source_etype=entry)
        return builder.load(pointer, name=name, typ=typ, align=align)

    if layout >= 21:
        addr = field(4, _PTR, "addr", 8)
        aux_addr = field(8, _PTR, "aux_addr", 8)
        kind = field(2, _I16, "kind", 2)
        name = field(5, _PTR, "name", 8)
        size = field(6, _I64, "size", 4)
        flags = field(3, _I32, "flags", 4)
        data = builder.trunc(field(7, _I64, "data", 4), _I32)
    else:
        addr = field(0, _PTR, "addr", 8)
        name = field(1, _PTR, "name", 8)
        size = field(2, _I64, "size", 4)
        flags = field(3, _I32, "flags", 4)
        data = field(4, _I32, "textype", 4)
    var_type = builder.and_(flags, _i32(0x7), name="type")
    extern = builder.lshr(builder.and_(flags, _i32(0x8)), _i32(3), name="extern")
    constant = builder.lshr(builder.and_(flags, _i32(0x10)), _i32(4), name="constant")
    normalized = builder.lshr(builder.and_(flags, _i32(0x20)), _i32(5), name="normalized")
    if layout >= 21:
        wanted = kind_table(llvm_version).offload_value(OffloadKind.HIP if hip else OffloadKind.CUDA)
        builder.cbranch(builder.icmp_unsigned("==", kind, ir.Constant(_I16, wanted)), blocks["if.kind"],
                        blocks["if.end"])
        builder.position_at_end(blocks["if.kind"])
    builder.cbranch(builder.icmp_unsigned("==", size, _i64(0)), blocks["if.then"], blocks["if.else"])

    builder.position_at_end(blocks["if.then"])
    builder.call(register_function, [handle, addr, name, name, _i32(-1)] + [_null()] * 5)
    builder.branch(blocks["if.end"])

    builder.position_at_end(blocks["if.else"])
    switch = builder.switch(var_type, blocks["if.end"])
    for value, label in enumerate(("sw.global", "sw.managed", "sw.surface", "sw.texture")):
        switch.add_case(_i32(value), blocks[label])

    builder.position_at_end(blocks["sw.global"])
    builder.call(register_var, [handle, addr, name, name, extern, size, constant, _i32(0)])
    builder.branch(blocks["if.end"])
    builder.position_at_end(blocks["sw.managed"])
    if register_managed is not None:
        builder.call(register_managed, [handle, aux_addr, addr, name, size, data])
    builder.branch(blocks["if.end"])
    builder.position_at_end(blocks["sw.surface"])
    if hip:
        builder.call(register_surface, [handle, addr, name, name, data, extern])
    builder.branch(blocks["if.end"])
    builder.position_at_end(blocks["sw.texture"])
    if hip:
        builder.call(register_texture, [handle, addr, name, name, data, normalized, extern])
    builder.branch(blocks["if.end"])

    builder.position_at_end(blocks["if.end"])
    following = builder.gep(cursor, [_i64(1)], inbounds=True, source_etype=entry)
    done = builder.icmp_unsigned("==", following, end)
    cursor.add_incoming(begin, blocks["entry"])
    cursor.add_incoming(following, blocks["if.end"])
    builder.cbranch(done, blocks["while.end"], blocks["while.entry"])

    builder.position_at_end(blocks["while.end"])
    builder.ret_void()
    return fn


def cuda_module(fatbin: bytes, *, llvm_version: int = 19, host_triple: str = DEFAULT_HOST_TRIPLE) -> ir.Module:
    """``wrapCudaBinary``: register an NVIDIA fatbinary (``fatbinary --create`` output) with the CUDA runtime."""
    return _fatbin_module(fatbin, False, llvm_version, host_triple)


def hip_module(fatbin: bytes, *, llvm_version: int = 19, host_triple: str = DEFAULT_HOST_TRIPLE) -> ir.Module:
    """``wrapHIPBinary``: register a HIP fatbinary (an offload bundle: see
    :func:`offload_builders.formats.fatbinary.hip_fatbinary`) with HIP."""
    return _fatbin_module(fatbin, True, llvm_version, host_triple)


# ------------------------------------------------------------------------------------------------
# Compiling


_BINDING: ModuleType | None = None
_BINDING_LOCK = threading.Lock()
_LOADING: threading.Thread | None = None


def _binding() -> ModuleType:
    """``llvmlite.binding``, imported on first use (building modules does not need it) with every target
    and assembly printer registered once."""
    global _BINDING
    with _BINDING_LOCK:
        if _BINDING is None:
            import llvmlite.binding as llvm

            llvm.initialize_all_targets()
            llvm.initialize_all_asmprinters()
            _BINDING = llvm
        return _BINDING


def load_llvm_in_background() -> None:
    """Start loading LLVM for :func:`compile_module` in a daemon thread (once per process).

    Importing llvmlite and registering its targets takes 60 to 90 ms, as long as the whole wrap
    after it. A link calls this before its scan and device links, which wait on files and child
    processes, so the wrap finds LLVM ready. A failure here is ignored: the wrap loads LLVM again
    itself and reports it.
    """
    global _LOADING
    with _BINDING_LOCK:
        if _LOADING is not None or _BINDING is not None:
            return
        _LOADING = threading.Thread(target=_load_quietly, name="offload-builders-llvm", daemon=True)
    _LOADING.start()


def _load_quietly() -> None:
    try:
        _binding()
    except Exception:  # noqa: BLE001 - reported by the wrap that needs it
        pass


def _codegen_text(module: ir.Module) -> str:
    """The module's text as the code generator should see it.

    Two things llvmlite does not do as Clang's tools do:

    * ``source_filename`` (the object's ``STT_FILE`` symbol) is not printed by llvmlite; it is the
      module name, as for Clang's ``offload.wrapper.module``.
    * Clang's tools create their target machines with ``UseInitArray``, so a priority-101 constructor
      lands in ``.init_array.101``; llvmlite's leaves it unset, which would emit the legacy
      ``.ctors.65434`` that lld and glibc's start files never run as an init_array entry.  So the
      ``llvm.global_ctors`` list is lowered here to what the code generator emits with ``UseInitArray``:
      a private (symbol-less) pointer per constructor in ``.init_array[.<priority>]``, kept alive by
      ``llvm.compiler.used`` (``llvm.used`` would add ``SHF_GNU_RETAIN``, which Clang's objects lack).
    """
    text = str(module)
    ctors = module.globals.get("llvm.global_ctors")
    if ctors is not None:
        init = ctors.initializer
        entries = [] if init is None or init.constant is None else list(init.constant)
        lines, kept = [], []
        for i, entry in enumerate(entries):
            priority, fn, data = entry.constant
            if not (isinstance(data, ir.Constant) and data.constant is None):
                raise OffloadError("llvm.global_ctors entries with a comdat key are not supported")
            number = int(priority.constant)
            section = ".init_array" if number == 65535 else f".init_array.{number}"
            name = f'@"__init_array_entry.{i}"'
            lines.append(f'{name} = private constant ptr {fn.get_reference()}, section "{section}", align 8')
            kept.append(f"ptr {name}")
        used = module.globals.get("llvm.compiler.used")
        if used is not None:
            used_init = used.initializer
            kept = [f"ptr {c.get_reference()}" for c in (used_init.constant or [])] + kept
            text = text.replace(str(used), "", 1)
        if kept:
            lines.append(f'@"llvm.compiler.used" = appending global [{len(kept)} x ptr] [{", ".join(kept)}], '
                         'section "llvm.metadata"')
        text = text.replace(str(ctors), "\n".join(lines), 1)
    return f'source_filename = "{module.name}"\n{text}'


def _detach_blobs(module: ir.Module) -> list[tuple[ir.GlobalVariable, ir.Constant]]:
    """Swap every non-private byte-array initializer for ``zeroinitializer``; return what to restore.

    Printing a 100 MB image as ``c"..."`` text and having LLVM parse it back costs seconds; compiling
    zeros of the same size costs nothing, and the bytes are then written into the object where the
    zeros are (:func:`_patch_blobs`).  A constant with an explicit section never goes to ``.bss``, so the
    zeros are really in the file.
    """
    detached = []
    for value in module.global_values:
        if not isinstance(value, ir.GlobalVariable) or value.linkage == "private":
            continue
        init = value.initializer
        if (isinstance(init, ir.Constant) and isinstance(init.constant, (bytes, bytearray)) and len(init.constant)
                and value.global_constant and value.section):
            detached.append((value, init))
            _set_initializer(value, ir.Constant(init.type, None))
    return detached


def _set_initializer(value: ir.GlobalVariable, init: ir.Constant) -> None:
    value.initializer = init
    # llvmlite caches a value's printed form: drop it, or the old initializer would be printed again.
    clear = getattr(value, "_clear_string_cache", None)
    if clear is not None:
        clear()


def _patch_blobs(obj: bytes, blobs: Sequence[tuple[str, bytes]]) -> bytes:
    """Write each ``(symbol, bytes)`` over the zeros its symbol covers in the object file."""
    if not blobs:
        return obj
    from offload_builders.formats.elf import SHT_NOBITS, read_sections, read_symbols

    def pread(length: int, offset: int) -> bytes:
        return obj[offset:offset + max(0, length)]

    table = read_sections(pread, len(obj))
    by_name: dict[bytes, list] = {}
    for symbol in read_symbols(pread, len(obj), table):
        by_name.setdefault(symbol.name, []).append(symbol)
    out = bytearray(obj)
    for name, data in blobs:
        symbols = by_name.get(name.encode())
        if not symbols or len(symbols) != 1 or symbols[0].st_shndx >= len(table.sections):
            raise OffloadError(f"internal error: the object has no single symbol {name!r} to place its bytes at")
        symbol = symbols[0]
        section = table.sections[symbol.st_shndx]
        start = section.sh_offset + symbol.st_value
        if (section.sh_type == SHT_NOBITS or symbol.st_size != len(data)
                or symbol.st_value + len(data) > section.sh_size
                or out.count(0, start, start + len(data)) != len(data)):
            raise OffloadError(f"internal error: {name!r} is not a zero-filled {len(data)}-byte range in the object")
        out[start:start + len(data)] = data
    return bytes(out)


def compile_module(module: ir.Module, host_triple: str) -> bytes:
    """Compile a wrapper module to a relocatable object, as ``compileModule`` in the linker wrapper does.

    Code generation only (no IR passes), position-independent (``Reloc::PIC_``), default code model and
    the default optimization level (2); the data layout is the target machine's.  Images go into the
    object directly rather than through LLVM's text parser (see :func:`_detach_blobs`); ``module`` is
    left as it was (but should not be printed by another thread meanwhile).
    """
    return compile_modules([module], host_triple)


def compile_modules(modules: Sequence[ir.Module], host_triple: str) -> bytes:
    """Compile wrapper modules to one relocatable object: LLVM's IR linker joins them (their
    ``llvm.global_ctors`` in the order given), then as :func:`compile_module`. One object for the
    registrations of several offload kinds, where ``clang-linker-wrapper`` writes one object per kind."""
    llvm = _binding()
    _check_host_triple(host_triple)
    try:
        target = llvm.Target.from_triple(host_triple)
    except RuntimeError as exc:
        raise OffloadError(f"no LLVM target for host triple {host_triple!r}: {exc}") from None
    machine = target.create_target_machine(cpu="", features="", opt=2, reloc="pic", codemodel="default")
    context = llvm.create_context()
    parsed = None
    blobs: list[tuple[str, bytes]] = []
    for index, module in enumerate(modules):
        detached = _detach_blobs(module)
        try:
            text = _codegen_text(module)
        finally:
            for value, init in detached:
                _set_initializer(value, init)
        one = llvm.parse_assembly(text, context=context)
        taken = {name for name, _ in blobs}
        for value, init in detached:
            name = value.name
            if name in taken:
                # Two kinds' internal globals of one name (CUDA's and HIP's ``.fatbin_image``): the IR linker
                # would rename one where its bytes could not be found again, so name it here.
                name = f"{name}.{index}"
                found = [gv for gv in one.global_variables if gv.name == value.name]
                if len(found) != 1:
                    raise OffloadError(f"internal error: no single global {value.name!r} in a wrapper module")
                found[0].name = name
            blobs.append((name, bytes(init.constant)))
        if parsed is None:
            parsed = one
        else:
            parsed.link_in(one)
    if parsed is None:
        raise OffloadError("compile_modules() needs at least one module")
    parsed.triple = host_triple
    parsed.data_layout = str(machine.target_data)
    parsed.verify()
    return _patch_blobs(machine.emit_object(parsed), blobs)


def _kind_module(kind: str, payload: object, llvm_version: int, host_triple: str) -> ir.Module:
    if kind == OPENMP:
        return openmp_module(payload, llvm_version=llvm_version, host_triple=host_triple)  # type: ignore[arg-type]
    if kind == OPENMP_GROUPS:
        return openmp_group_module(payload, llvm_version=llvm_version,  # type: ignore[arg-type]
                                   host_triple=host_triple)
    if kind in (CUDA, HIP):
        if not isinstance(payload, (bytes, bytearray, memoryview)):
            raise OffloadError(f"wrapping {kind} takes one fatbinary (bytes), not {type(payload).__name__}")
        build = cuda_module if kind == CUDA else hip_module
        return build(bytes(payload), llvm_version=llvm_version, host_triple=host_triple)
    raise OffloadError(f"unknown offload kind {kind!r}: expected one of {', '.join(KINDS + (OPENMP_GROUPS,))}")


def wrap(kind: str, payload: Sequence[bytes] | bytes | Sequence[ImageGroup], *, llvm_version: int = 19,
         host_triple: str = DEFAULT_HOST_TRIPLE) -> bytes:
    """The registration object for ``kind``: OpenMP images (a sequence), OpenMP image groups (``openmp-groups``:
    see :func:`openmp_group_module`) or a CUDA/HIP fatbinary (bytes)."""
    return compile_module(_kind_module(kind, payload, llvm_version, host_triple), host_triple)


def wrap_openmp_groups(groups: Sequence[ImageGroup], *, llvm_version: int = 19,
                       host_triple: str = DEFAULT_HOST_TRIPLE) -> bytes:
    """The registration object for OpenMP image groups (:func:`openmp_group_module`)."""
    return compile_module(openmp_group_module(groups, llvm_version=llvm_version, host_triple=host_triple),
                          host_triple)


def wrap_kinds(payloads: Sequence[tuple[str, Sequence[bytes] | bytes | Sequence[ImageGroup]]], *,
               llvm_version: int = 19, host_triple: str = DEFAULT_HOST_TRIPLE) -> bytes:
    """One registration object for several offload kinds, ``(kind, payload)`` as for :func:`wrap`; their
    constructors (all priority 101) run in the order given, as the per-kind objects of
    ``clang-linker-wrapper`` do in their link order (OpenMP before HIP)."""
    if len(payloads) == 1:
        return wrap(payloads[0][0], payloads[0][1], llvm_version=llvm_version, host_triple=host_triple)
    modules = []
    for kind, payload in payloads:
        if kind in (CUDA, HIP) and not isinstance(payload, (bytes, bytearray, memoryview)):
            raise OffloadError(f"cannot wrap {kind!r} with {type(payload).__name__}: expected one of "
                               f"{', '.join(KINDS)} (OpenMP: images; CUDA, HIP: one fatbinary)")
        modules.append(_kind_module(kind, payload, llvm_version, host_triple))
    return compile_modules(modules, host_triple)


def _as_bytes(data: object, what: str) -> bytes:
    if isinstance(data, bytes):
        return data
    if isinstance(data, (bytearray, memoryview)):
        return bytes(data)
    raise OffloadError(f"{what} must be bytes, not {type(data).__name__}")
