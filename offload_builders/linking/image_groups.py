"""Image groups: a program's OpenMP device code linked as one image per *group* of link inputs and target,
each group registered on its own, so a kernel edit relinks its group alone.

Clang links every OpenMP device file of a target into one image (full LTO with the device runtime). For
AMDGPU that link grows faster than the program: OpenMPOpt's Attributor takes 26.7 of the 32 s an image of
64 bench sources takes with Clang 19, and it reruns on every kernel edit. The offload runtime also accepts
several registered descriptors, each with its own images and host entries: what a program made of
separately built shared libraries registers. Here the link inputs are partitioned so that no device symbol
crosses a group: objects whose device code shares a symbol (a ``declare target`` function or variable, a
named ``critical``'s lock, an inline function's static variable) are in one group, as are objects registering
the same entry. What each device file takes from the runtime (``__kmpc_*``), the runtime's weak copies in NVPTX
units, and the per-unit copies every unit carries (``__omp_rtl_*``, ptxas's ``__cuda_sm*``) connect nothing:
every group's image gets its own runtime, as a shared library's would; a user's strong definition of a runtime
name (its own ``malloc``) connects every unit naming it. Device code from a static library (other than the
OpenMP device runtime) puts the whole program in one group, since the library's members are linked where the
link needs them.

What stays the same: each group's image is what the driver links from that group's files (the same job, with
the runtime); the kernels and globals the host registers; the program's behaviour, as long as no state is
shared through the device runtime between groups (each image has its own, as with shared libraries; the two
per-device singletons of libomptarget 19's loader, the AMDGPU heap and the RPC server, are checked by
:mod:`offload_builders.scons.groups`).
"""
from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from offload_builders.errors import OffloadError
from offload_builders.formats._io import atomic_output
from offload_builders.linking import (
    ScannedInputs,
    device_symbols,
    read_device_inputs,
    registered_entries,
)

#: What every device unit gets a copy of: the runtime's configuration (``__omp_rtl_*``, ``__oclc_*``) and the
#: reductions' scratch buffer, which Clang emits, and the ``shfl.sync`` helpers ptxas adds to each relocatable
#: cubin (``__cuda_sm70_shflsync_down``...). They never tie two groups together.
PER_UNIT_PREFIXES = ("__omp_rtl_", "__oclc_", "__cuda_sm")
PER_UNIT_NAMES = frozenset({"__openmp_nvptx_data_transfer_temporary_storage"})

PLAN_VERSION = 3  # 2: runtime names tie only where a user defines them strongly; 3: ptxas helpers


@dataclass(frozen=True)
class ImageGroup:
    """Link inputs (objects, link order) whose device code is linked into one image per target."""

    objects: tuple[str, ...]
    entries: tuple[str, ...]  # the offload entries (kernels, globals) those objects register


@dataclass(frozen=True)
class GroupPlan:
    """The groups of a program, and which files of each target's device input file each group links."""

    groups: tuple[ImageGroup, ...]
    members: Mapping[str, tuple[tuple[int, ...], ...]]  # target label -> per group, device input indices
    single: str = ""  # why the program is one group ("" where it was partitioned)


def _digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=20).hexdigest()


def _per_unit(name: str) -> bool:
    return name.startswith(PER_UNIT_PREFIXES) or name in PER_UNIT_NAMES


class _Components:
    """Union-find over object indices."""

    def __init__(self, count: int) -> None:
        self.parent = list(range(count))

    def find(self, item: int) -> int:
        while self.parent[item] != item:
            self.parent[item] = self.parent[self.parent[item]]
            item = self.parent[item]
        return item

    def union(self, items: Sequence[int]) -> None:
        roots = sorted({self.find(item) for item in items})
        for root in roots[1:]:
            self.parent[root] = roots[0]


def plan_groups(scanned: ScannedInputs, device_inputs: Mapping[str, str], runtime_archive: str,
                llvm_version: int, runtime_files: Sequence[str] = ()) -> GroupPlan:
    """Partition a program's link inputs into image groups (see the module's docstring).

    ``device_inputs`` maps each target's label to its device input file (the extract node's: every device
    file that target's link takes, in link order); ``runtime_archive`` is the OpenMP device runtime, whose
    members every group links; ``runtime_files`` are the runtime bitcode Clang links into device units at
    compile time (NVPTX's ``libomptarget-nvptx-<sm>.bc``), whose weak copies in the units tie nothing together.
    Raises :class:`OffloadError` for device code of another offload kind."""
    objects = scanned.objects
    owner: dict[str, int] = {}  # image digest -> object index
    for index, obj in enumerate(objects):
        for found in obj.binaries:
            owner.setdefault(_digest(found.read_image()), index)
    runtime = os.path.realpath(runtime_archive)
    library_images = {_digest(found.read_image()) for found in scanned.archive_members
                      if os.path.realpath(found.origin.file) != runtime}
    # What the device runtime defines (every member: the names are the same for every target). NVPTX units
    # carry weak copies of the runtime functions Clang inlined; those tie nothing together, but a user's
    # strong definition (its own malloc over the runtime's weak one) does.
    runtime_defined = {symbol.name for found in scanned.archive_members
                       if os.path.realpath(found.origin.file) == runtime
                       for symbol in device_symbols(found.read_image(), found.describe()) if not symbol.undefined}
    for path in runtime_files:
        with open(path, "rb") as f:
            runtime_defined.update(symbol.name for symbol in device_symbols(f.read(), path) if not symbol.undefined)

    components = _Components(len(objects))
    has_code = [False] * len(objects)
    file_owner: dict[str, list[int | None]] = {}  # target -> owner of each device input file (None: shared)
    single = ""
    # Symbols: a name a user file defines ties together every user file that names it.
    defined: dict[str, set[int]] = {}
    named: dict[str, set[int]] = {}
    for label, path in device_inputs.items():
        binaries = read_device_inputs(path)
        owners: list[int | None] = []
        user_symbols: list[tuple[int, list]] = []
        shared_defined: set[str] = set()
        for position, binary in enumerate(binaries):
            kind = binary.offload_kind_name(llvm_version)
            if kind != "openmp":
                raise OffloadError(f"{path}: device file {position} is {kind} device code; image groups "
                                   "(OFFLOAD_IMAGE_GROUPS) link OpenMP programs only: leave them off for this program")
            image = binary.read_image(path)
            digest = _digest(image)
            who = owner.get(digest)
            owners.append(who)
            symbols = device_symbols(image, f"{path}: device file {position}")
            if who is None:
                if digest in library_images and not single:
                    single = "device code from a static library"
                shared_defined.update(symbol.name for symbol in symbols if not symbol.undefined)
            else:
                has_code[who] = True
                user_symbols.append((who, symbols))
        provided = runtime_defined | shared_defined
        for who, symbols in user_symbols:
            for symbol in symbols:
                if _per_unit(symbol.name):
                    continue
                named.setdefault(symbol.name, set()).add(who)
                if symbol.undefined or (symbol.name in provided and symbol.weak):
                    continue  # the runtime's (or a copy of it): each group links its own
                defined.setdefault(symbol.name, set()).add(who)
        file_owner[label] = owners
    for name, users in named.items():
        if name in defined:
            components.union(sorted(users | defined[name]))
    from offload_builders.linking.registration import REQUIRES_ENTRY_NAMES  # (LLVM loads in the background)

    entries = [registered_entries(obj.path) if has_code[index] else [] for index, obj in enumerate(objects)]
    by_entry: dict[str, list[int]] = {}
    for index, names in enumerate(entries):
        for name in names:
            if name not in REQUIRES_ENTRY_NAMES:  # `#pragma omp requires`: every group gets it
                by_entry.setdefault(name, []).append(index)
    for users_list in by_entry.values():
        components.union(users_list)
    coded = [index for index in range(len(objects)) if has_code[index]]
    if single:
        components.union(coded)

    roots: dict[int, list[int]] = {}
    for index in coded:
        roots.setdefault(components.find(index), []).append(index)
    # A group that registers nothing cannot be reached from the host: it gets no image. One group made so
    # by a static library is kept whatever its objects register: the library's objects register theirs.
    kept = [members for members in roots.values()
            if single or any(name not in REQUIRES_ENTRY_NAMES for i in members for name in entries[i])]
    if single and not kept and any(owner is None for owners in file_owner.values() for owner in owners):
        kept = [[]]  # every device file is a library's: one group of no object, which every file joins
    kept.sort(key=lambda members: members[0] if members else -1)
    group_of = {index: number for number, members in enumerate(kept) for index in members}
    groups = tuple(ImageGroup(tuple(objects[i].path for i in members),
                              tuple(name for i in members for name in entries[i])) for members in kept)
    plan_members: dict[str, tuple[tuple[int, ...], ...]] = {}
    for label, owners in file_owner.items():
        per_group: list[list[int]] = [[] for _ in kept]
        for position, who in enumerate(owners):
            if who is None:
                for files in per_group:
                    files.append(position)
            elif who in group_of:
                per_group[group_of[who]].append(position)
        plan_members[label] = tuple(tuple(files) for files in per_group)
    return GroupPlan(groups, plan_members, single)


def write_plan(plan: GroupPlan, path: str) -> None:
    """Write ``plan`` as JSON (atomically)."""
    data = {"version": PLAN_VERSION, "single": plan.single,
            "groups": [{"objects": list(group.objects), "entries": list(group.entries)} for group in plan.groups],
            "members": {label: [list(files) for files in groups] for label, groups in plan.members.items()}}
    with atomic_output(path) as fd:
        os.write(fd, json.dumps(data, indent=1, sort_keys=True).encode())


def read_plan(path: str) -> GroupPlan:
    """The plan :func:`write_plan` wrote; :class:`OffloadError` for anything else."""
    try:
        with open(path, "rb") as f:
            data = json.load(f)
        if data.get("version") != PLAN_VERSION:
            raise ValueError(f"version {data.get('version')!r}, expected {PLAN_VERSION}")
        groups = tuple(ImageGroup(tuple(group["objects"]), tuple(group["entries"])) for group in data["groups"])
        members = {label: tuple(tuple(int(i) for i in files) for files in per_group)
                   for label, per_group in data["members"].items()}
        return GroupPlan(groups, members, str(data.get("single", "")))
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise OffloadError(f"{path}: not an image-group plan ({error}); build again") from None


#: The AMDGPU device runtime's heap (``DeviceRTL/src/Allocator.cpp``): device ``malloc``, and the runtime's own
#: allocations (dynamic schedules, tasks, thread states, a full shared-memory stack) bump through it.
MEMORY_POOL = "__omp_rtl_device_memory_pool"


def referenced_symbols_and_strip(image: str, objcopy: str) -> frozenset[str]:
    """The symbols the code and data of a device image linked with ``--emit-relocs`` refer to; then remove
    those relocation sections again (``objcopy``: llvm-objcopy), which leaves every loaded byte as a link
    without ``--emit-relocs`` makes it (checked in ``tests/test_image_groups.py``)."""
    import subprocess

    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile
    from elftools.elf.relocation import RelocationSection
    from elftools.elf.sections import SymbolTableSection

    names: set[str] = set()
    emitted: list[str] = []
    try:
        with open(image, "rb") as f:
            elf = ELFFile(f)
            for section in elf.iter_sections():
                if not isinstance(section, RelocationSection) or section["sh_flags"] & 0x2:  # SHF_ALLOC: .rela.dyn
                    continue
                emitted.append(section.name)
                symbols = elf.get_section(section["sh_link"])
                if not isinstance(symbols, SymbolTableSection):
                    continue
                for relocation in section.iter_relocations():
                    if relocation["r_info_sym"]:
                        names.add(symbols.get_symbol(relocation["r_info_sym"]).name)
    except (ELFError, OSError, ValueError) as error:
        raise OffloadError(f"{image}: cannot read its relocations ({error})") from None
    if emitted:
        done = subprocess.run([objcopy, *(f"--remove-section={name}" for name in emitted), image], check=False,
                              capture_output=True, text=True, errors="surrogateescape")
        if done.returncode:
            raise OffloadError(f"{objcopy} failed on {image}: {done.stderr.strip()}")
    return frozenset(names)


def file_digest(path: str) -> bytes:
    """The content digest :func:`link_key` takes for an input file (read once per file, whatever the groups)."""
    with open(path, "rb") as f:
        return hashlib.blake2b(f.read(), digest_size=20).digest()


def link_key(argv: Sequence[str], inputs: Sequence[tuple[str, bytes]], output: str, programs: Sequence[str]) -> str:
    """The cache key of one group's link: the command (its input and output paths as placeholders), the
    inputs' contents (``(path, file_digest(path))`` in link order) and the programs it runs (path, size,
    modification time)."""
    digest = hashlib.blake2b(digest_size=20)
    positions = {path: f"<input {index}>" for index, (path, _) in enumerate(inputs)}
    for word in argv:
        digest.update((positions.get(word, "<output>" if word == output else word) + "\0").encode())
    for _, content in inputs:
        digest.update(content)
    for program in programs:
        try:
            status = os.stat(program)
            digest.update(f"{os.path.realpath(program)}:{status.st_size}:{status.st_mtime_ns}\0".encode())
        except OSError:
            digest.update(f"{program}:missing\0".encode())
    return digest.hexdigest()


__all__ = ["MEMORY_POOL", "PER_UNIT_NAMES", "PER_UNIT_PREFIXES", "PLAN_VERSION", "GroupPlan", "ImageGroup",
           "file_digest", "link_key", "plan_groups", "read_plan", "referenced_symbols_and_strip", "write_plan"]
