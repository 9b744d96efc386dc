"""Registration modules compiled to a PIC object with :mod:`llvmlite.binding`, as the linker wrapper's
``compileModule`` does, with the images written into the object rather than parsed as IR text.

Kept apart from building the modules because only compiling needs LLVM itself: ``llvmlite.binding`` is imported
on first use, or ahead of it in a background thread (:func:`load_llvm_in_background`), never at import.
"""
from __future__ import annotations

import threading
from collections.abc import Sequence
from types import ModuleType

from llvmlite import ir

from offload_builders.errors import OffloadError
from offload_builders.linking.registration_ir import check_host_triple

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
    check_host_triple(host_triple)
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
