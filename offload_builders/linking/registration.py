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

This module holds the OpenMP and CUDA/HIP registrations and the entry points (:func:`wrap`, :func:`wrap_kinds`);
the shared IR vocabulary is in :mod:`~offload_builders.linking.registration_ir`, the image groups in
:mod:`~offload_builders.linking.group_registration`, the compiling in
:mod:`~offload_builders.linking.registration_codegen`, and their public names are importable from here too.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Final, Union

from llvmlite import ir

from offload_builders.errors import BundleFormatError, OffloadError, OffloadFormatError, TargetIDError
from offload_builders.formats.offload_binary import (
    ImageKind,
    OffloadingImage,
    OffloadKind,
    encode_offload_binary,
    kind_table,
)
from offload_builders.linking.group_registration import (
    OMP_REGISTER_REQUIRES,
    REQUIRES_ENTRY_NAMES,
    ImageGroup,
    openmp_group_module,
)
from offload_builders.linking.registration_codegen import (
    compile_module,
    compile_modules,
    load_llvm_in_background as load_llvm_in_background,  # re-exported: the link steps call it here
)
from offload_builders.linking.registration_ir import (
    CTOR_PRIORITY as CTOR_PRIORITY,  # re-exported, as before the split
    CUDA,
    DEFAULT_HOST_TRIPLE,
    HIP,
    I16,
    I32,
    I64,
    KINDS,
    OPENMP,
    OPENMP_GROUPS,
    PTR,
    VOID,
    Global,
    append_ctor,
    as_bytes,
    byte_array,
    check_version,
    declare,
    define_startup,
    element,
    entry_array,
    entry_layout,
    entry_section,
    entry_type,
    i32,
    i64,
    new_module as new_module,  # re-exported: wrapping.py calls it here
    null,
    openmp_image_buffers,
    openmp_module_types,
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

#: ``CudaFatMagic`` / ``HIPFatMagic``: the first word of the fatbin wrapper the runtime checks.
CUDA_FAT_MAGIC: Final = 0x466243B1
HIP_FAT_MAGIC: Final = 0x48495046
#: What ``fatbinary --create`` files start with (0xBA55ED50, little-endian).
NV_FATBIN_MAGIC: Final = b"\x50\xed\x55\xba"
_BUNDLE_MAGIC: Final = b"__CLANG_OFFLOAD_BUNDLE__"
_CCOB_MAGIC: Final = b"CCOB"

PathArg = Union[str, "os.PathLike[str]"]


# ------------------------------------------------------------------------------------------------
# OpenMP


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
    buffers, ranges = openmp_image_buffers(images, llvm_version)

    module, entry, device_image, bin_desc, begin, end = openmp_module_types(host_triple, layout)

    inits = []
    for i, (data, (start, stop)) in enumerate(zip(buffers, ranges)):
        blob = byte_array(data)
        image = Global(module, blob.type, ".omp_offloading.device_image" + (f".{i}" if i else ""),
                       initializer=blob, unnamed_addr=True, section=".llvm.offloading", align=8)
        inits.append(ir.Constant(device_image, [element(image, start), element(image, stop), begin, end]))
    images_type = ir.ArrayType(device_image, len(inits))
    images_global = Global(module, images_type, ".omp_offloading.device_images", unnamed_addr=True,
                           initializer=ir.Constant(images_type, inits if inits else None))
    descriptor = Global(module, bin_desc, ".omp_offloading.descriptor",
                        initializer=ir.Constant(bin_desc, [i32(len(inits)), images_global, begin, end]))

    # createRegisterFunction: the same creation order as LLVM, so the printed modules line up.
    reg = define_startup(module, ".omp_offloading.descriptor_reg")
    register_lib = declare(module, "__tgt_register_lib", VOID, [PTR])
    atexit = declare(module, "atexit", I32, [PTR])
    unreg = define_startup(module, ".omp_offloading.descriptor_unreg")
    unregister_lib = declare(module, "__tgt_unregister_lib", VOID, [PTR])
    builder = ir.IRBuilder(unreg.append_basic_block("entry"))
    builder.call(unregister_lib, [descriptor])
    builder.ret_void()
    builder = ir.IRBuilder(reg.append_basic_block("entry"))
    builder.call(register_lib, [descriptor])
    # Unregister through atexit, after the plugins are up, so it runs before they are torn down.
    builder.call(atexit, [unreg])
    builder.ret_void()
    append_ctor(module, reg)
    return module


def openmp_image_binary(image: bytes | PathArg, *, triple: str, arch: str, llvm_version: int = 19) -> bytes:
    """One linked device image as clang-linker-wrapper's ``bundleOpenMP`` wraps it before embedding.

    An OffloadBinary with image kind ``IMG_Object``, offload kind ``openmp`` and the strings ``triple``
    and ``arch`` of the link group, in that order (``arch`` is "" for CPU targets, and still written).
    """
    check_version(llvm_version)
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
# CUDA and HIP


def _check_fatbin(fatbin: bytes, hip: bool) -> bytes:
    data = as_bytes(fatbin, "fatbinary")
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

    module = new_module(host_triple)
    entry = entry_type(module, layout)
    wrapper_type = module.context.get_identified_type("fatbin_wrapper")
    wrapper_type.set_body(I32, I32, PTR, PTR)
    begin, end = entry_array(module, entry, entry_section(HIP if hip else CUDA, layout), layout)

    blob = byte_array(data)
    image = Global(module, blob.type, ".fatbin_image", initializer=blob,
                   section=".hip_fatbin" if hip else ".nv_fatbin")
    wrapper = Global(module, wrapper_type, ".fatbin_wrapper", align=8,
                     section=".hipFatBinSegment" if hip else ".nvFatBinSegment",
                     initializer=ir.Constant(wrapper_type, [i32(HIP_FAT_MAGIC if hip else CUDA_FAT_MAGIC),
                                                            i32(1), image, null()]))
    handle = Global(module, PTR, f"{prefix}.binary_handle", constant=False, initializer=null())

    ctor = define_startup(module, f"{prefix}.fatbin_reg")
    dtor = define_startup(module, f"{prefix}.fatbin_unreg")
    register_fatbin = declare(module, f"{api}RegisterFatBinary", PTR, [PTR])
    # Declared for HIP too (LLVM declares it unconditionally), but only CUDA calls it.
    register_end = declare(module, "__cudaRegisterFatBinaryEnd", VOID, [PTR])
    unregister_fatbin = declare(module, f"{api}UnregisterFatBinary", VOID, [PTR])
    atexit = declare(module, "atexit", I32, [PTR])
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
    builder.call(unregister_fatbin, [builder.load(handle, typ=PTR, align=8)])
    builder.ret_void()
    append_ctor(module, ctor)
    return module


def _register_globals(module: ir.Module, entry: ir.Type, begin: Global, end: Global, hip: bool, layout: int,
                      llvm_version: int) -> ir.Function:
    """``createRegisterGlobalsFunction``: walk the entry table, registering kernels and variables.

    Per entry: ``size == 0`` is a kernel (``__cudaRegisterFunction``); otherwise ``flags & 7`` selects
    a variable (0), managed variable (1; registered from LLVM 21), surface (2) or texture (3).  Surfaces
    and textures are only registered for HIP (the linker wrapper passes ``EmitSurfacesAndTextures``
    false for CUDA).  From LLVM 21 the table is shared, so entries of another ``Kind`` are skipped.
    """
    api = "__hip" if hip else "__cuda"
    register_function = declare(module, f"{api}RegisterFunction", I32,
                                [PTR, PTR, PTR, PTR, I32, PTR, PTR, PTR, PTR, PTR])
    register_var = declare(module, f"{api}RegisterVar", VOID, [PTR, PTR, PTR, PTR, I32, I64, I32, I32])
    register_managed = (declare(module, f"{api}RegisterManagedVar", VOID, [PTR, PTR, PTR, PTR, I64, I32])
                        if layout >= 21 else None)
    register_surface = declare(module, f"{api}RegisterSurface", VOID, [PTR, PTR, PTR, PTR, I32, I32])
    register_texture = declare(module, f"{api}RegisterTexture", VOID, [PTR, PTR, PTR, PTR, I32, I32, I32])

    fn = define_startup(module, ".hip.globals_reg" if hip else ".cuda.globals_reg", [PTR])
    handle = fn.args[0]
    names = ["entry", "while.entry"] + (["if.kind"] if layout >= 21 else []) + [
        "if.then", "if.else", "sw.global", "sw.managed", "sw.surface", "sw.texture", "if.end", "while.end"]
    blocks = {name: fn.append_basic_block(name) for name in names}

    builder = ir.IRBuilder(blocks["entry"])
    builder.cbranch(builder.icmp_unsigned("!=", begin, end), blocks["while.entry"], blocks["while.end"])

    builder.position_at_end(blocks["while.entry"])
    # LLVM names this phi "entry" and, the block having that name, prints it as %entry1.
    cursor = builder.phi(PTR, name="entry1")

    def field(index: int, typ: ir.Type, name: str, align: int) -> ir.Instruction:
        # The module has no data layout when LLVM builds it, so i64 loads get the default ABI alignment 4.
        zero = i32(0) if layout >= 21 else i64(0)
        pointer = builder.gep(cursor, [zero, i32(index)], inbounds=True, source_etype=entry)
        return builder.load(pointer, name=name, typ=typ, align=align)

    if layout >= 21:
        addr = field(4, PTR, "addr", 8)
        aux_addr = field(8, PTR, "aux_addr", 8)
        kind = field(2, I16, "kind", 2)
        name = field(5, PTR, "name", 8)
        size = field(6, I64, "size", 4)
        flags = field(3, I32, "flags", 4)
        data = builder.trunc(field(7, I64, "data", 4), I32)
    else:
        addr = field(0, PTR, "addr", 8)
        name = field(1, PTR, "name", 8)
        size = field(2, I64, "size", 4)
        flags = field(3, I32, "flags", 4)
        data = field(4, I32, "textype", 4)
    var_type = builder.and_(flags, i32(0x7), name="type")
    extern = builder.lshr(builder.and_(flags, i32(0x8)), i32(3), name="extern")
    constant = builder.lshr(builder.and_(flags, i32(0x10)), i32(4), name="constant")
    normalized = builder.lshr(builder.and_(flags, i32(0x20)), i32(5), name="normalized")
    if layout >= 21:
        wanted = kind_table(llvm_version).offload_value(OffloadKind.HIP if hip else OffloadKind.CUDA)
        builder.cbranch(builder.icmp_unsigned("==", kind, ir.Constant(I16, wanted)), blocks["if.kind"],
                        blocks["if.end"])
        builder.position_at_end(blocks["if.kind"])
    builder.cbranch(builder.icmp_unsigned("==", size, i64(0)), blocks["if.then"], blocks["if.else"])

    builder.position_at_end(blocks["if.then"])
    builder.call(register_function, [handle, addr, name, name, i32(-1)] + [null()] * 5)
    builder.branch(blocks["if.end"])

    builder.position_at_end(blocks["if.else"])
    switch = builder.switch(var_type, blocks["if.end"])
    for value, label in enumerate(("sw.global", "sw.managed", "sw.surface", "sw.texture")):
        switch.add_case(i32(value), blocks[label])

    builder.position_at_end(blocks["sw.global"])
    builder.call(register_var, [handle, addr, name, name, extern, size, constant, i32(0)])
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
    following = builder.gep(cursor, [i64(1)], inbounds=True, source_etype=entry)
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
# Wrapping: the registration object of one offload kind or several


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
