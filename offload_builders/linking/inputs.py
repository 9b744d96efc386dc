"""The extract step of a link: which device files of the link inputs each target's device link takes.

* :func:`scan_link_inputs` finds the offload binaries of every input (fat objects, static archives,
  ``-flto`` bitcode objects; shared objects are skipped as ``clang-linker-wrapper`` skips them);
* :func:`select_device_files` picks one target's device files with Clang 19's rules: every matching
  binary of a regular input, and an archive member's only when it resolves a still-undefined symbol of
  that target or defines a new non-hidden global (``--whole-archive`` takes all), repeated until nothing
  changes, so library order does not matter; compatible AMDGPU target IDs and ``generic`` join the group;
* :func:`check_entries` reports objects that have offload entries but no device code for a target, the
  case in which a Clang-linked program crashes at run time; archive members count where the host linker
  takes them (:meth:`ScannedInputs.linked_members`), and thin archives are read as it reads them.

It also says which offload kinds the inputs carry (:func:`offload_kinds` for the host link's runtimes,
:func:`device_input_kinds` for one target's image) and gives OpenMP's images as its registration holds them
(:func:`openmp_image_binaries`): what the wrap step asks of the inputs.

Device files travel between the extract and device-link steps as a *device input file*: the selected
offload binaries, concatenated byte for byte. It is deterministic, so an unchanged target's device link
sees unchanged input and is not re-run when another target is added.
"""
from __future__ import annotations

import json
import mmap
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from offload_builders.errors import OffloadError
from offload_builders.formats._io import atomic_output, write_all
from offload_builders.targets import AMDGPU_TRIPLE, TargetID, is_target_name

if TYPE_CHECKING:  # the format readers load when a link step reads a file, not with the SCons tool
    from offload_builders.formats.containers import ContainerKind, FoundBinary, StoredMember
    from offload_builders.formats.elf import ElfSections
    from offload_builders.formats.offload_binary import OffloadBinary

#: (triple, arch) as a packager image names it; the grouping key of the device link.
GroupKey = tuple[str, str]

#: The sections holding host offload entries (LLVM 19/20, then 21+): an object with a non-empty one
#: registers kernels or globals and needs device code for every device it may run on.
ENTRY_SECTIONS: tuple[str, ...] = ("omp_offloading_entries", "llvm_offload_entries")
#: HIP's entry section (relocatable device code; LLVM 21+ shares ``llvm_offload_entries``).
HIP_ENTRY_SECTIONS: tuple[str, ...] = ("hip_offloading_entries",)
_KNOWN_ENTRY_SECTIONS = ENTRY_SECTIONS + HIP_ENTRY_SECTIONS

class LinkError(OffloadError):
    """The device side of a link cannot be done as asked (missing device code, a failed device link)."""


def group_key(target: TargetID) -> GroupKey:
    """The (triple, arch) a target's device files are packaged under."""
    return target.triple, target.package_arch


def targets_compatible(lhs: GroupKey, rhs: GroupKey) -> bool:
    """LLVM 19's ``areTargetsCompatible``: *different* keys whose code may be linked together.

    Same triple, and either side ``generic``, or AMDGPU with the same processor and no feature set on
    one side and cleared on the other (``gfx90a`` joins ``gfx90a:xnack+``; ``xnack+`` never joins ``xnack-``).
    """
    if lhs == rhs or lhs[0] != rhs[0]:
        return False
    if lhs[1] == "generic" or rhs[1] == "generic":
        return True
    if lhs[0] != AMDGPU_TRIPLE or lhs[1].split(":")[0] != rhs[1].split(":")[0]:
        return False
    for feature in ("xnack", "sramecc"):
        for on, off in (("+", "-"), ("-", "+")):
            if f"{feature}{on}" in lhs[1] and f"{feature}{off}" in rhs[1]:
                return False
    return True


def belongs_to(key: GroupKey, target: GroupKey) -> bool:
    """Whether a binary packaged as ``key`` is linked into ``target``'s device image."""
    return key == target or targets_compatible(key, target)


# --------------------------------------------------------------------------------------------------
# Link inputs.


@dataclass(frozen=True)
class LinkInput:
    """One host link input: a path, and whether ``--whole-archive`` was in effect for it."""

    path: str
    whole_archive: bool = False


@dataclass
class InputObject:
    """What a regular (non-archive) input contributes: its binaries and its non-empty entry sections. For an
    archive member the host link takes (:meth:`ScannedInputs.linked_members`), ``path`` is ``lib.a(x.o)``
    and ``member`` says where its bytes are."""

    path: str
    binaries: list[FoundBinary]
    entry_sections: frozenset[str] = frozenset()
    member: StoredMember | None = None

    def registers_entries(self, sections: Sequence[str] = ENTRY_SECTIONS) -> bool:
        """Whether it registers kernels or globals through one of ``sections``."""
        return not self.entry_sections.isdisjoint(sections)


@dataclass
class _ScannedArchive:
    """An archive input that may hold offload code: its members (as the host linker reads them) with their
    binaries, for :meth:`ScannedInputs.linked_members`."""

    members: list[tuple[StoredMember, list[FoundBinary]]]
    whole: bool


@dataclass
class ScannedInputs:
    """Every offload binary of a link, split as LLVM 19 splits them."""

    objects: list[InputObject] = field(default_factory=list)
    archive_members: list[FoundBinary] = field(default_factory=list)  # lazily extracted
    #: Inputs the host linker reads symbols from (ELF relocatable and bitcode files) and archives that may hold
    #: offload code: what :meth:`linked_members` needs, read only when a member registers entries.
    host_objects: list[str] = field(default_factory=list, repr=False)
    archives: list[_ScannedArchive] = field(default_factory=list, repr=False)
    _linked: list[InputObject] | None = field(default=None, repr=False, compare=False)

    @property
    def regular(self) -> list[FoundBinary]:
        return [found for obj in self.objects for found in obj.binaries]

    def keys(self) -> list[GroupKey]:
        """Every (triple, arch) of the regular inputs, in first-seen order."""
        seen: dict[GroupKey, None] = {}
        for found in self.regular:
            seen.setdefault(_key(found.binary), None)
        return list(seen)

    def linked_members(self) -> list[InputObject]:
        """The archive members that register offload entries and that the host link takes: every member of a
        ``--whole-archive`` archive, and the members that define a symbol still undefined (ld.lld's rule,
        library order aside), so the entry checks cover the code a library brings into the program."""
        if self._linked is None:
            self._linked = _linked_members(self)
        return self._linked


def _key(binary: OffloadBinary) -> GroupKey:
    return binary.triple, binary.arch


def scan_link_inputs(inputs: Iterable[LinkInput | str]) -> ScannedInputs:
    """Find the offload binaries of the link inputs. Missing files are the host linker's business; a thin
    archive's members are read from the files they name, as the host linker reads them (one whose file is
    missing is an error naming the archive and the member)."""
    from offload_builders.formats.containers import (
        ContainerKind,
        archive_members,
        extract_member_binaries,
        extract_offload_binaries,
        identify,
    )
    scanned = ScannedInputs()
    archives_seen: set[tuple[str, bool]] = set()
    for item in inputs:
        link_input = item if isinstance(item, LinkInput) else LinkInput(os.fspath(item))
        path = link_input.path
        if not os.path.isfile(path):
            continue
        if (seen := (os.path.realpath(path), link_input.whole_archive)) in archives_seen:
            continue  # an archive named again (the driver's "-lgcc ... -lgcc"): its members are in already
        with open(path, "rb") as f:
            kind = identify(f.read(64))
        if kind in (ContainerKind.ELF_RELOCATABLE, ContainerKind.BITCODE):
            scanned.host_objects.append(path)
        if kind is ContainerKind.ELF_SHARED_OBJECT or not _may_hold_offload_code(path, kind):
            continue
        if kind in (ContainerKind.ARCHIVE, ContainerKind.THIN_ARCHIVE):
            archives_seen.add(seen)
            members = [(member, extract_member_binaries(member, include_shared_objects=False))
                       for member in archive_members(path)]
            scanned.archives.append(_ScannedArchive(members, link_input.whole_archive))
            found = [binary for _, binaries in members for binary in binaries]
            if link_input.whole_archive:
                scanned.objects.append(InputObject(path, found))
            else:
                scanned.archive_members.extend(found)
        else:
            found = extract_offload_binaries(path, include_shared_objects=False)
            scanned.objects.append(InputObject(path, found, _entry_sections(path, kind)))
    return scanned


#: Bytes every file with offload code or offload entries holds: the section names (``omp_offloading_entries``,
#: ``hip_offloading_entries``, ``llvm_offload_entries``: an object that registers entries and has lost its
#: device code must still be seen, to be reported) and the bitcode magics.
_OFFLOAD_MARKERS = (b".llvm.offloading", b"offloading_entries", b"llvm_offload_entries", b"BC\xc0\xde",
                    b"\xde\xc0\x17\x0b")


#: Files at least this large that hold no offload code are remembered per user (by path, size and
#: modification time): the search costs about 5 ms for libgcc.a (3 MB), in every link.
_REMEMBERED_SIZE = 1 << 20


def _content_files(path: str, kind: ContainerKind) -> list[str]:
    """The files holding the bytes of the link input ``path``: itself, or a thin archive's member files (the
    archive holds only their names and symbol table)."""
    from offload_builders.formats.containers import ContainerKind, archive_members
    if kind is ContainerKind.THIN_ARCHIVE:
        return [member.file for member in archive_members(path)]
    return [path]


def _may_hold_offload_code(path: str, kind: ContainerKind) -> bool:
    """A quick byte search that rules out most host libraries (libgcc.a has hundreds of members).

    An ELF file with offload data names its ``.llvm.offloading`` section (and its entry sections) in its
    string table; bitcode may encode the name in ways a byte search cannot see, so any file holding bitcode is
    scanned in full. A thin archive is searched in its members' files.
    """
    return any(_file_may_hold_offload_code(file) for file in _content_files(path, kind))


def _file_may_hold_offload_code(path: str) -> bool:
    with open(path, "rb") as f:
        status = os.fstat(f.fileno())
        if status.st_size == 0:
            return False
        key, cache = "", None
        if status.st_size >= _REMEMBERED_SIZE:
            from offload_builders.toolchain import user_cache

            cache = user_cache("host-libraries.json", max_entries=256)
            key = json.dumps(["no-offload-code-v2", os.path.realpath(path), status.st_size, status.st_mtime_ns])
            if cache is not None and cache.get(key) == ():
                return False
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:  # large libraries stay out of memory
            found = any(data.find(marker) >= 0 for marker in _OFFLOAD_MARKERS)
        if not found and cache is not None:
            cache.put(key, ())
        return found


def _entry_sections(path: str, kind: ContainerKind) -> frozenset[str]:
    """The offload entry sections (of any offload kind) an ELF relocatable object has, non-empty."""
    from offload_builders.formats.containers import ContainerKind
    from offload_builders.formats.elf import file_reader, read_sections
    if kind is not ContainerKind.ELF_RELOCATABLE:
        return frozenset()
    with open(path, "rb") as f:
        table = read_sections(file_reader(f.fileno()), os.fstat(f.fileno()).st_size, path=path)
    return _nonempty_entry_sections(table)


def _nonempty_entry_sections(table: ElfSections) -> frozenset[str]:
    return frozenset(section.name for section in table.sections
                     if section.name in _KNOWN_ENTRY_SECTIONS and section.sh_size > 0)


# --------------------------------------------------------------------------------------------------
# The archive members the host link takes.


@dataclass
class _HostFile:
    """A file (or archive member) as the host linker sees it: its entry sections and global symbols."""

    entry_sections: frozenset[str]
    symbols: list[DeviceSymbol]


def _read_host_file(file: str, offset: int, size: int, label: str, *, symbols: bool) -> _HostFile:
    """The entry sections of an ELF relocatable object at ``[offset, offset + size)`` of ``file`` and, if asked,
    the global symbols of it or of a bitcode file (``-flto``); nothing for anything else."""
    from offload_builders.formats.containers import ContainerKind, identify
    from offload_builders.formats.elf import (
        STB_LOCAL,
        STB_WEAK,
        STT_FILE,
        STT_SECTION,
        file_reader,
        read_sections,
        read_symbols,
    )
    with open(file, "rb") as f:
        kind = identify(os.pread(f.fileno(), min(size, 64), offset))
        if kind is ContainerKind.BITCODE:
            return _HostFile(frozenset(), _bitcode_symbols(os.pread(f.fileno(), size, offset), label) if symbols
                             else [])
        if kind is not ContainerKind.ELF_RELOCATABLE:
            return _HostFile(frozenset(), [])
        reader = file_reader(f.fileno(), offset)
        table = read_sections(reader, size, path=label, base=offset)
        found = read_symbols(reader, size, table, path=label, base=offset) if symbols else []
    return _HostFile(_nonempty_entry_sections(table),
                     [DeviceSymbol(sym.name.decode("utf-8", "surrogateescape"), sym.undefined,
                                   sym.binding == STB_WEAK, False)
                      for sym in found if sym.binding != STB_LOCAL and sym.name
                      and sym.symbol_type not in (STT_SECTION, STT_FILE)])


def _linked_members(scanned: ScannedInputs) -> list[InputObject]:
    """:meth:`ScannedInputs.linked_members`: nothing is read beyond section tables unless a member registers
    entries. Members of archives without offload code (libgcc.a) are not read: their references are left out,
    so a member only such a library needs is not checked (never one the link does not take)."""
    members = []
    for archive in scanned.archives:
        for member, binaries in archive.members:
            sections = _read_host_file(member.file, member.offset, member.size, member.label,
                                       symbols=False).entry_sections
            members.append((member, binaries, archive.whole, sections))
    if not any(sections for *_, sections in members):
        return []
    defined: set[str] = set()
    wanted: set[str] = set()  # names some taken file references strongly (a weak reference extracts nothing)

    def take(symbols: Sequence[DeviceSymbol]) -> None:
        for symbol in symbols:
            if not symbol.undefined:
                defined.add(symbol.name)
            elif not symbol.weak:
                wanted.add(symbol.name)

    for path in scanned.host_objects:
        take(_read_host_file(path, 0, os.path.getsize(path), path, symbols=True).symbols)
    pending = []
    taken: list[InputObject] = []
    for member, binaries, whole, sections in members:
        symbols = _read_host_file(member.file, member.offset, member.size, member.label, symbols=True).symbols
        if whole:
            take(symbols)
            taken.append(InputObject(member.label, binaries, sections, member))
        else:
            pending.append((member, binaries, sections, symbols))
    progress = True
    while progress:
        progress = False
        for item in list(pending):
            member, binaries, sections, symbols = item
            if any(not symbol.undefined and symbol.name in wanted and symbol.name not in defined for symbol in symbols):
                take(symbols)
                taken.append(InputObject(member.label, binaries, sections, member))
                pending.remove(item)
                progress = True
    return [obj for obj in taken if obj.entry_sections]


# --------------------------------------------------------------------------------------------------
# Symbols of device files and Clang 19's lazy archive extraction.

_UNDEFINED, _WEAK = 1 << 1, 1 << 2


class DeviceSymbol(NamedTuple):
    """A global symbol of a device file, with the flags the extraction rule looks at (a tuple: a device
    runtime member has some 500, and a frozen dataclass takes five times as long to make)."""

    name: str
    undefined: bool
    weak: bool
    hidden: bool
    #: Bitcode only: ``GlobalValue::canBeOmittedFromSymbolTable`` (a ``linkonce_odr`` definition whose address
    #: nothing takes), which does not make an archive member worth extracting.
    may_omit: bool = False


def device_symbols(image: bytes, label: str) -> list[DeviceSymbol]:
    """The global symbols of a device ELF relocatable object or LLVM bitcode file; others have none."""
    from offload_builders.formats.containers import ContainerKind, identify
    kind = identify(image[:64])
    if kind is ContainerKind.BITCODE:
        return _bitcode_symbols(image, label)
    if kind is ContainerKind.ELF_RELOCATABLE:
        return _elf_symbols(image, label)
    return []


def _elf_symbols(image: bytes, label: str) -> list[DeviceSymbol]:
    from offload_builders.formats.elf import (
        STB_LOCAL,
        STB_WEAK,
        STT_FILE,
        STT_SECTION,
        STV_HIDDEN,
        STV_INTERNAL,
        read_sections,
        read_symbols,
    )

    def pread(length: int, offset: int) -> bytes:
        return image[offset:offset + max(0, length)]

    table = read_sections(pread, len(image), path=label)
    return [DeviceSymbol(sym.name.decode("utf-8", "surrogateescape"), sym.undefined, sym.binding == STB_WEAK,
                         sym.visibility in (STV_HIDDEN, STV_INTERNAL))
            for sym in read_symbols(pread, len(image), table, path=label)
            if sym.binding != STB_LOCAL and sym.symbol_type not in (STT_SECTION, STT_FILE) and sym.name]


def _bitcode_symbols(image: bytes, label: str) -> list[DeviceSymbol]:
    """The symbols ``clang-linker-wrapper`` looks at (``getSymbolsFromBitcode``): those of the file's own
    symbol table (:mod:`offload_builders.formats.irsymtab`) that are global and not format-specific.

    A file without one (of LLVM 4 or older, or of another table version) is read by LLVM in a child
    process, and what it read remembered per user by the bitcode's hash; that path has no may-omit flag
    (every definition counts as one the wrapper would extract for)."""
    import hashlib

    from offload_builders.formats.containers import bitcode_linker_symbols
    from offload_builders.formats.irsymtab import SymbolFlag, Visibility, read_symbols
    from offload_builders.toolchain import user_cache

    table = read_symbols(image, label)
    if table is not None:
        undefined, weak, omit = SymbolFlag.UNDEFINED.value, SymbolFlag.WEAK.value, SymbolFlag.MAY_OMIT.value
        linked, skipped, hidden = SymbolFlag.GLOBAL.value, SymbolFlag.FORMAT_SPECIFIC.value, Visibility.HIDDEN.value
        return [DeviceSymbol(symbol.name, bool(symbol.flags & undefined), bool(symbol.flags & weak),
                             symbol.flags & 3 == hidden, bool(symbol.flags & omit))
                for symbol in table if symbol.flags & linked and not symbol.flags & skipped]
    cache = user_cache("device-symbols.json")
    key = "bitcode-symbols-v1:" + hashlib.blake2b(image, digest_size=20).hexdigest()
    if cache is not None and (known := cache.get(key)) is not None and all(len(entry) == 2 for entry in known):
        return [DeviceSymbol(name, "u" in flags, "w" in flags, "h" in flags) for name, flags in known]
    symbols = [DeviceSymbol(name, undefined, weak, hidden)
               for name, undefined, weak, hidden in bitcode_linker_symbols(image, label)]
    if cache is not None:
        cache.put(key, tuple((s.name, "u" * s.undefined + "w" * s.weak + "h" * s.hidden) for s in symbols))
    return symbols


class _SymbolTable:
    """One target's symbol table as ``getSymbolsFromObject``/``getSymbolsFromBitcode`` keep it."""

    def __init__(self) -> None:
        self._flags: dict[str, int] = {}

    def add(self, symbols: Sequence[DeviceSymbol], *, is_archive: bool, has_offload_kind: bool) -> bool:
        """Record a file's symbols if it is extracted; returns whether it is (always, unless lazy)."""
        extract = not is_archive
        pending: dict[str, int] = {}
        for sym in symbols:
            new = sym.name not in self._flags
            old = self._flags.get(sym.name, 0)
            resolves_strong = bool(old & _UNDEFINED) and not old & _WEAK and not sym.undefined
            new_global = ((new or bool(old & _UNDEFINED)) and not sym.undefined and not sym.may_omit
                          and has_offload_kind and not sym.hidden)
            extract = extract or resolves_strong or new_global
            if old & _UNDEFINED and not sym.undefined:
                pending[sym.name] = old & ~_UNDEFINED
            if sym.undefined and new:
                pending[sym.name] = old | _UNDEFINED
            if sym.weak:
                pending[sym.name] = old | _WEAK
        if extract:
            self._flags.update(pending)
        return extract


class _SymbolCache:
    """Symbols per device image, read once per process (the device runtime archive is read every link)."""

    def __init__(self) -> None:
        self._cache: dict[tuple[str, int, int, int], list[DeviceSymbol]] = {}

    def symbols(self, found: FoundBinary) -> list[DeviceSymbol]:
        source = found.origin.file
        try:
            stamp = os.stat(source).st_mtime_ns if found.binary.data is None else id(found.binary.data)
        except OSError:
            stamp = 0
        key = (source, found.binary.image_offset, found.binary.image_size, stamp)
        if key not in self._cache:
            self._cache[key] = device_symbols(found.read_image(), found.describe())
        return self._cache[key]


_SYMBOLS = _SymbolCache()


def select_device_files(scanned: ScannedInputs, target: GroupKey) -> list[FoundBinary]:
    """The device files linked into ``target``'s image, in link order (Clang 19's ``getDeviceInput``).

    Archive members are only considered once a regular input brought device code for the target (with
    none, the target gets no image, as with Clang: see :func:`check_entries`).
    """
    table = _SymbolTable()
    selected: list[FoundBinary] = []
    for found in scanned.regular:
        if belongs_to(_key(found.binary), target):
            table.add(_SYMBOLS.symbols(found), is_archive=False, has_offload_kind=found.binary.offload_kind != 0)
            selected.append(found)
    if not selected:
        return []
    candidates = [found for found in scanned.archive_members if belongs_to(_key(found.binary), target)]
    taken = [False] * len(candidates)
    progress = True
    while progress:
        progress = False
        for index, found in enumerate(candidates):
            if taken[index]:
                continue
            if table.add(_SYMBOLS.symbols(found), is_archive=True, has_offload_kind=found.binary.offload_kind != 0):
                taken[index] = True
                selected.append(found)
                progress = True
                break  # an extracted member may make earlier ones needed: check them all again
    return selected


def group_device_files(scanned: ScannedInputs) -> dict[GroupKey, list[FoundBinary]]:
    """Every device-link group of a link, as ``clang-linker-wrapper`` forms them (for ``offload-link``)."""
    return {key: select_device_files(scanned, key) for key in scanned.keys()}


def objects_without_code(scanned: ScannedInputs, target: GroupKey,
                         sections: Sequence[str] = ENTRY_SECTIONS) -> list[InputObject]:
    """Objects (and archive members the host link takes) that register entries through ``sections`` but
    carry no device code for ``target``.

    Clang links such a program without complaint and it crashes (or silently falls back) at run time.
    """
    return [obj for obj in [*scanned.objects, *scanned.linked_members()]
            if obj.registers_entries(sections) and not any(belongs_to(_key(f.binary), target) for f in obj.binaries)]


def check_entries(scanned: ScannedInputs, target: GroupKey, label: str) -> list[str]:
    """One message per object with OpenMP offload entries but no device code for ``target``."""
    return [f"{obj.path}: has offload entries but no device code for {label}; recompile it with "
            f"that target in OFFLOAD_ARCHS (--offload-arch), or drop {label} from the link"
            for obj in objects_without_code(scanned, target)]


def check_untargeted_entries(scanned: ScannedInputs) -> list[str]:
    """A message naming the objects (and archive members the host link takes) with OpenMP offload entries, in a
    link where no regular input has device code: Clang 19 takes an archive's device code only for the targets of
    the regular inputs, so such a link gets no device image, and the program fails where it offloads."""
    if scanned.keys():
        return []
    objects = [obj.path for obj in [*scanned.objects, *scanned.linked_members()] if obj.registers_entries()]
    if not objects:
        return []
    more = f" (and {len(objects) - 2} more)" if len(objects) > 2 else ""
    return [f"{', '.join(objects[:2])}{more}: offload entries, but no object of the link has device code, so no "
            "device image is linked (a static library's device code is taken only for the targets the program's "
            "own objects have): compile the program's objects with the same offload targets"]


def check_target_names(scanned: ScannedInputs) -> list[str]:
    """One message per device image of a regular input whose triple or arch is no target name (a ``/``, a
    control character, 4 KB): no device link can be for it, and nothing may be named after it."""
    problems: dict[GroupKey, str] = {}
    for found in scanned.regular:
        triple, arch = key = _key(found.binary)
        for what, value in (("triple", triple), ("arch", arch)):
            if key not in problems and (value or what == "triple") and not is_target_name(value):
                shown = ascii(value[:64]) + (f" ({len(value)} characters)" if len(value) > 64 else "")
                problems[key] = (f"{found.describe()}: the device image's {what} {shown} is not a target name "
                                 "(letters, digits and '_.+:-' only, at most 128): a damaged or crafted input")
    return list(problems.values())


#: Clang 19 names the host's record of each registered kernel or global ``.offloading.entry.<name>``.
_ENTRY_SYMBOL_PREFIX = b".offloading.entry."
_ET_REL = 1


def registered_entries(path: str | InputObject) -> list[str]:
    """The names of the OpenMP offload entries (kernels, globals) that the ELF relocatable object ``path`` (or
    archive member, as :meth:`ScannedInputs.linked_members` gives it) registers, in order; [] for anything
    else (an archive, bitcode, a shared object)."""
    from offload_builders.formats.elf import file_reader, read_sections, read_symbols
    member = path.member if isinstance(path, InputObject) else None
    label = path.path if isinstance(path, InputObject) else path
    file, start = (member.file, member.offset) if member is not None else (label, 0)
    with open(file, "rb") as f:
        if os.pread(f.fileno(), 4, start) != b"\x7fELF":
            return []
        reader = file_reader(f.fileno(), start)
        size = member.size if member is not None else os.fstat(f.fileno()).st_size
        table = read_sections(reader, size, path=label, base=start)
        entry_sections = {section.index for section in table.sections if section.name in ENTRY_SECTIONS}
        if table.e_type != _ET_REL or not entry_sections:
            return []
        return [symbol.name[len(_ENTRY_SYMBOL_PREFIX):].decode("utf-8", "surrogateescape")
                for symbol in read_symbols(reader, size, table, path=label, base=start)
                if symbol.st_shndx in entry_sections and symbol.name.startswith(_ENTRY_SYMBOL_PREFIX)]


def defined_symbols(image: str) -> frozenset[str] | None:
    """The global names a linked device image (ELF) defines; None where it has no symbol table to tell."""
    from offload_builders.formats.elf import STB_LOCAL, file_reader, read_sections, read_symbols
    with open(image, "rb") as f:
        reader, size = file_reader(f.fileno()), os.fstat(f.fileno()).st_size
        table = read_sections(reader, size, path=image)
        symbols = read_symbols(reader, size, table, path=image)
    if not symbols:
        return None
    return frozenset(symbol.name.decode("utf-8", "surrogateescape") for symbol in symbols
                     if not symbol.undefined and symbol.binding != STB_LOCAL)  # the runtime finds global ones


def missing_entries(objects: Sequence[str | InputObject], images: Sequence[tuple[str, str]]) -> list[str]:
    """One message per (object, target) whose registered entries the target's linked image lacks.

    ``objects`` are paths, or archive members the host link takes (:meth:`ScannedInputs.linked_members`).
    ``images`` holds (target label, image path); an empty image (no device code) is left to
    :func:`check_entries`. Clang links such a program, and it fails at run time (``Failed to load kernel``):
    the object and the device code come from compiles that saw different files (see
    :mod:`offload_builders.source_identity`) or different sources.
    """
    from offload_builders.formats.containers import printable_name
    entries = {(obj.path if isinstance(obj, InputObject) else obj): names
               for obj in objects if (names := registered_entries(obj))}
    problems = []
    for label, image in images:
        if not entries or os.path.getsize(image) == 0 or (defined := defined_symbols(image)) is None:
            continue
        for path, names in entries.items():
            absent = [name for name in names if name not in defined]
            if absent:
                more = f" (and {len(absent) - 1} more)" if len(absent) > 1 else ""
                problems.append(f"{path}: registers the offload entry {printable_name(absent[0])}{more}, which the "
                                f"{label} device image {image} does not define: the object and that device code were "
                                "compiled from different files (was a source replaced while the build ran?); build "
                                "again")
    return problems


# --------------------------------------------------------------------------------------------------
# Device input files: the selected offload binaries, concatenated.


def write_device_inputs(files: Sequence[FoundBinary], output: str | os.PathLike[str]) -> None:
    """Write the selected binaries, byte for byte, to ``output`` (atomically). Empty when there are none."""
    with atomic_output(output) as fd:
        for found in files:
            binary = found.binary
            if binary.data is not None:
                write_all(fd, binary.data[binary.offset:binary.end])
            else:
                with open(found.origin.file, "rb") as f:
                    f.seek(binary.offset)
                    write_all(fd, f.read(binary.size))


def read_device_inputs(path: str | os.PathLike[str]) -> list[OffloadBinary]:
    """The binaries of a device input file ([] for an empty one: the target has no device code)."""
    from offload_builders.formats.offload_binary import read_offload_binaries
    if os.path.getsize(path) == 0:
        return []
    return read_offload_binaries(os.fspath(path), path=os.fspath(path))


def unpack_device_inputs(path: str | os.PathLike[str], directory: str | os.PathLike[str]) -> list[str]:
    """Write each image of a device input file to ``directory/NNN.o`` and return the paths, in order.

    Every image is named ``.o`` because the driver links ``.o`` files by content (ELF or bitcode), while
    it would compile a ``.bc`` file first. The names are indices, never the images' own names, and each file
    is created anew in the directory, which must be one (not a symbolic link): whatever stood there before,
    a symbolic link included, is replaced rather than followed.
    """
    os.makedirs(directory, exist_ok=True)
    binaries = read_device_inputs(path)
    paths = []
    directory_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        for index, binary in enumerate(binaries):
            name = f"{index:03d}.o"
            with os.fdopen(_create_new_file(name, directory_fd), "wb") as f:
                binary.copy_image(f, os.fspath(path))
            paths.append(os.path.join(os.fspath(directory), name))
    finally:
        os.close(directory_fd)
    return paths


def _create_new_file(name: str, directory_fd: int) -> int:
    """``name`` in the directory ``directory_fd`` created for writing, never through a symbolic link: what is
    there (a leftover of a killed run, or a link planted to redirect the write) is removed first."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(name, flags, 0o666, dir_fd=directory_fd)
    except FileExistsError:
        os.unlink(name, dir_fd=directory_fd)
        return os.open(name, flags, 0o666, dir_fd=directory_fd)


#: The section every plain (non-RDC) HIP object registers its own fat binary from (``__hip_module_ctor``).
HIP_FATBIN_SEGMENT = b".hipFatBinSegment"


def offload_kinds(paths: Iterable[str], llvm_version: int) -> frozenset[str]:
    """The offload kinds the host link inputs ``paths`` (objects, archives) carry code of: the kinds of their
    offload binaries (``openmp``, ``hip``: what ``clang-linker-wrapper`` registers), plus ``hip`` for a plain
    HIP object, which has no offload binary but a fat binary registering itself (found by its section's
    name, as :func:`_may_hold_offload_code` finds ``.llvm.offloading``; a thin archive's in its members' files)."""
    from offload_builders.formats.containers import identify
    kinds: set[str] = set()
    existing = [path for path in paths if os.path.isfile(path)]
    scanned = scan_link_inputs(existing)
    for found in scanned.regular + scanned.archive_members:
        if found.binary.offload_kind != 0:
            kinds.add(found.binary.offload_kind_name(llvm_version))
    for path in existing:
        if "hip" in kinds:
            break
        with open(path, "rb") as f:
            kind = identify(f.read(64))
        if any(_holds_hip_fatbin_segment(file) for file in _content_files(path, kind)):
            kinds.add("hip")
    return frozenset(kinds)


def _holds_hip_fatbin_segment(path: str) -> bool:
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return False
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return data.find(HIP_FATBIN_SEGMENT) >= 0


def device_input_kinds(path: str | os.PathLike[str], llvm_version: int) -> frozenset[str]:
    """The offload kinds of one target's device input file (an extract node's output): the kinds whose
    registration code gets that target's image, as ``clang-linker-wrapper`` 19's ``ActiveOffloadKinds``."""
    return frozenset(binary.offload_kind_name(llvm_version) for binary in read_device_inputs(path)
                     if binary.offload_kind != 0)


def openmp_image_binaries(images: Iterable[tuple[GroupKey, str]], llvm_version: int) -> list[bytes]:
    """The images OpenMP's registration holds, each in an offload binary, in ``clang-linker-wrapper``'s
    order: triple descending, then arch."""
    from offload_builders.linking import registration

    ordered = sorted(sorted(images, key=lambda item: item[0][1]), key=lambda item: item[0][0], reverse=True)
    return [registration.openmp_image_binary(path, triple=triple, arch=arch, llvm_version=llvm_version)
            for (triple, arch), path in ordered]
