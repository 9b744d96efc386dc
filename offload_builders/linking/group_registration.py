"""OpenMP image groups: several ``__tgt_bin_desc`` in one program, each with its own images and its own part of the
host entry table, split by entry name at start-up, as separately built shared libraries would register them.

Not from LLVM: it lets a program take a device link per group instead of one for the whole program
(``OFFLOAD_IMAGE_GROUPS``, :mod:`offload_builders.linking.image_groups`).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final

from llvmlite import ir

from offload_builders.errors import OffloadError
from offload_builders.formats.offload_binary import MAGIC as OFFLOAD_BINARY_MAGIC, parse_offload_binary
from offload_builders.linking.registration_ir import (
    DEFAULT_HOST_TRIPLE,
    I32,
    I64,
    PTR,
    VOID,
    Global,
    append_ctor,
    byte_array,
    declare,
    define_startup,
    element,
    entry_layout,
    i32,
    i64,
    null,
    openmp_image_buffers,
    openmp_image_range,
    openmp_module_types,
)

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
        buffers, _ = openmp_image_buffers(images, llvm_version, f" of group {g}")
        keys = []
        for i, data in enumerate(buffers):
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
        following = builder.gep(value, [i64(1)], inbounds=True, source_etype=step)
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
    blob = byte_array(b"".join(name + b"\0" for name, _ in names))
    strings = Global(module, blob.type, ".omp_offloading.entry_group_names", linkage="private", initializer=blob,
                     unnamed_addr=True)
    record = ir.LiteralStructType([PTR, I32])
    rows = []
    offset = 0
    for name, group in names:
        rows.append(ir.Constant(record, [element(strings, offset), i32(group)]))
        offset += len(name) + 1
    table_type = ir.ArrayType(record, len(rows))
    table = Global(module, table_type, ".omp_offloading.entry_groups", linkage="private", unnamed_addr=True,
                   initializer=ir.Constant(table_type, rows if rows else None))
    strcmp = declare(module, "strcmp", I32, [PTR, PTR])

    fn = declare(module, ".omp_offloading.entry_group", I32, [PTR])
    fn.linkage = "internal"
    fn.section = ".text.startup"
    blocks = {name: fn.append_basic_block(name) for name in
              ("entry", "named", "search", "probe", "found", "narrow", "every", "other")}
    builder = ir.IRBuilder(blocks["entry"])
    cursor = fn.args[0]
    addr_field, name_field = (4, 5) if layout >= 21 else (0, 1)
    zero = i32(0) if layout >= 21 else i64(0)
    addr = builder.load(builder.gep(cursor, [zero, i32(addr_field)], inbounds=True, source_etype=entry),
                        name="addr", typ=PTR, align=1)
    builder.cbranch(builder.icmp_unsigned("==", addr, null()), blocks["every"], blocks["named"])

    builder.position_at_end(blocks["named"])
    name = builder.load(builder.gep(cursor, [zero, i32(name_field)], inbounds=True, source_etype=entry),
                        name="name", typ=PTR, align=1)
    builder.cbranch(builder.icmp_unsigned("==", name, null()), blocks["other"], blocks["search"])

    builder.position_at_end(blocks["search"])
    low = builder.phi(I64, name="low")
    high = builder.phi(I64, name="high")
    low.add_incoming(i64(0), blocks["named"])
    high.add_incoming(i64(len(rows)), blocks["named"])
    builder.cbranch(builder.icmp_unsigned("<", low, high), blocks["probe"], blocks["other"])

    builder.position_at_end(blocks["probe"])
    middle = builder.lshr(builder.add(low, high), i64(1), name="middle")
    row = builder.gep(table, [i64(0), middle], inbounds=True, source_etype=table_type)
    known = builder.load(builder.gep(row, [i32(0), i32(0)], inbounds=True, source_etype=record),
                         name="known", typ=PTR, align=8)
    order = builder.call(strcmp, [name, known], name="order")
    builder.cbranch(builder.icmp_signed("==", order, i32(0)), blocks["found"], blocks["narrow"])

    builder.position_at_end(blocks["found"])
    builder.ret(builder.load(builder.gep(row, [i32(0), i32(1)], inbounds=True, source_etype=record),
                             name="group", typ=I32, align=8))

    builder.position_at_end(blocks["narrow"])
    before = builder.icmp_signed("<", order, i32(0), name="before")
    low.add_incoming(builder.select(before, low, builder.add(middle, i64(1))), blocks["narrow"])
    high.add_incoming(builder.select(before, middle, high), blocks["narrow"])
    builder.branch(blocks["search"])

    builder.position_at_end(blocks["every"])
    builder.ret(i32(-1))
    builder.position_at_end(blocks["other"])
    builder.ret(i32(0))
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
    ranges = [[openmp_image_range(image, i, llvm_version) for i, image in enumerate(group)] for group in buffers]
    # strcmp compares unsigned bytes, as Python orders bytes.
    table = sorted((name, g) for g, group in enumerate(names) for name in set(group))

    module, entry, device_image, bin_desc, begin, end = openmp_module_types(host_triple, layout)

    descs = []
    for g, (group, group_ranges) in enumerate(zip(buffers, ranges)):
        inits = []
        for i, (data, (start, stop)) in enumerate(zip(group, group_ranges)):
            blob = byte_array(data)
            image = Global(module, blob.type, f".omp_offloading.device_image.{g}.{i}", initializer=blob,
                           unnamed_addr=True, section=".llvm.offloading", align=8)
            inits.append(ir.Constant(device_image, [element(image, start), element(image, stop), null(), null()]))
        images_type = ir.ArrayType(device_image, len(inits))
        images_global = Global(module, images_type, f".omp_offloading.device_images.{g}", constant=False,
                               initializer=ir.Constant(images_type, inits))
        descs.append(ir.Constant(bin_desc, [i32(len(inits)), images_global, null(), null()]))
    count = len(descs)
    descs_type = ir.ArrayType(bin_desc, count)
    descriptors = Global(module, descs_type, ".omp_offloading.descriptors", constant=False,
                         initializer=ir.Constant(descs_type, descs))
    sizes_type = ir.ArrayType(I64, count)
    sizes = Global(module, sizes_type, ".omp_offloading.group_sizes", constant=False,
                   initializer=ir.Constant(sizes_type, None))

    entry_group = _entry_group_function(module, entry, layout, table)
    reg = define_startup(module, ".omp_offloading.descriptor_reg")
    register_lib = declare(module, "__tgt_register_lib", VOID, [PTR])
    atexit = declare(module, "atexit", I32, [PTR])
    malloc = declare(module, "malloc", PTR, [I64])
    abort = declare(module, "abort", VOID, [])
    unreg = define_startup(module, ".omp_offloading.descriptor_unreg")
    unregister_lib = declare(module, "__tgt_unregister_lib", VOID, [PTR])

    def desc_field(builder: ir.IRBuilder, g: ir.Value, field: int) -> ir.Value:
        return builder.gep(descriptors, [i64(0), g, i32(field)], inbounds=True, source_etype=descs_type)

    builder = ir.IRBuilder(unreg.append_basic_block("entry"))

    def unregister(k: ir.Value) -> None:
        g = builder.sub(i64(count - 1), k, name="g")
        builder.call(unregister_lib, [builder.gep(descriptors, [i64(0), g], inbounds=True, source_etype=descs_type)])

    _counted_loop(builder, "unreg", i64(0), i64(count), i64(1), unregister)
    builder.ret_void()

    builder = ir.IRBuilder(reg.append_basic_block("entry"))

    def for_groups(name: str, body: Callable[[ir.Value], None]) -> None:
        _counted_loop(builder, name, i64(0), i64(count), i64(1), body)

    def for_entries(name: str, body: Callable[[ir.Value, ir.Value], None]) -> None:
        """``body(entry, group)`` for each entry; ``group`` is an i64, -1 for every group."""
        def visit(cursor: ir.Value) -> None:
            body(cursor, builder.sext(builder.call(entry_group, [cursor], name="group"), I64))
        _counted_loop(builder, name, begin, end, entry, visit)

    def to_groups(group: ir.Value, action: Callable[[ir.Value], None], name: str) -> None:
        """``action(g)`` for ``group``, or for every group where it is -1."""
        with builder.if_else(builder.icmp_signed("<", group, i64(0))) as (every, one):
            with every:
                for_groups(f"{name}.every", action)
            with one:
                action(group)

    def count_entry(g: ir.Value) -> None:
        slot = builder.gep(sizes, [i64(0), g], inbounds=True, source_etype=sizes_type)
        builder.store(builder.add(builder.load(slot, typ=I64, align=8), i64(1)), slot, align=8)

    for_entries("count", lambda cursor, group: to_groups(group, count_entry, "count"))

    entry_size = builder.ptrtoint(builder.gep(null(), [i64(1)], source_etype=entry), I64, name="entry_size")

    def allocate(g: ir.Value) -> None:
        # One spare entry: never malloc(0), and no two groups share a HostEntriesBegin (libomptarget's key).
        used = builder.load(builder.gep(sizes, [i64(0), g], inbounds=True, source_etype=sizes_type), typ=I64,
                            align=8)
        table_start = builder.call(malloc, [builder.mul(builder.add(used, i64(1)), entry_size)], name="table")
        with builder.if_then(builder.icmp_unsigned("==", table_start, null()), likely=False):
            builder.call(abort, [])
        builder.store(table_start, desc_field(builder, g, 2), align=8)
        builder.store(table_start, desc_field(builder, g, 3), align=8)

    for_groups("allocate", allocate)

    def copy_entries(cursor: ir.Value, group: ir.Value) -> None:
        def append(g: ir.Value) -> None:
            slot = desc_field(builder, g, 3)
            target = builder.load(slot, typ=PTR, align=8)
            builder.store(builder.load(cursor, typ=entry, align=1), target, align=1)
            builder.store(builder.gep(target, [i64(1)], inbounds=True, source_etype=entry), slot, align=8)
        to_groups(group, append, "copy")

    for_entries("copy", copy_entries)

    def register(g: ir.Value) -> None:
        table_start = builder.load(desc_field(builder, g, 2), typ=PTR, align=8)
        table_end = builder.load(desc_field(builder, g, 3), typ=PTR, align=8)
        images = builder.load(desc_field(builder, g, 1), typ=PTR, align=8)
        number = builder.zext(builder.load(desc_field(builder, g, 0), typ=I32, align=8), I64)

        def set_range(i: ir.Value) -> None:
            for field, value in ((2, table_start), (3, table_end)):
                pointer = builder.gep(images, [i, i32(field)], inbounds=True, source_etype=device_image)
                builder.store(value, pointer, align=8)

        _counted_loop(builder, "image", i64(0), number, i64(1), set_range)
        builder.call(register_lib, [builder.gep(descriptors, [i64(0), g], inbounds=True, source_etype=descs_type)])

    for_groups("register", register)
    # Unregister through atexit, after the plugins are up, so it runs before they are torn down.
    builder.call(atexit, [unreg])
    builder.ret_void()
    append_ctor(module, reg)
    return module
