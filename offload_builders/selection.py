"""Runtime selection: which device image of a fat binary a given GPU's runtime would load, and why no other.

A fat object, fat binary, shared object or executable carries device images as bundle entries (HIP:
``.hip_fatbin`` sections, plain or ``CCOB`` compressed; ``-fgpu-rdc`` object bundles), as offload binaries
(OpenMP and the new driver: ``.llvm.offloading``) or as NVIDIA fat binaries. :mod:`~offload_builders.formats.inspect`
finds them all; this module decides, for one device, which image a runtime loads.

The model is the one proposed in the review of D99235 (``hipv4``): an image carries *requirements*, a
device has *capabilities*, and an image fits when the device meets every requirement. The requirements
come from the image's ID: its triple, its processor, each target-ID feature it sets (``xnack+`` is a
requirement, an unset feature is "Any" and requires nothing), and the code-object version (``cov5``, read
from the AMDGPU ELF header, or ``cov4+``/``cov2-3`` from the offload kind ``hipv4``/``hip`` when the payload
is not an ELF file). A new kind of requirement is one more :class:`Requirement` name plus one more
capability in :class:`Device`; ``name=value`` capabilities given by the caller already match requirements
of any name.

The order is the HIP runtime's (ROCm CLR ``hip_fatbin.cpp``: ``ExtractFatBinaryUsingCOMGR``): the
device's own ISA, then its generic family (``TargetToGeneric``: gfx1031 -> gfx10-3-generic, features
kept), then SPIR-V (``spirv64-amd-amdhsa--amdgcnspirv``, compiled at load time). Within one of these
tiers the *first* fitting image in file order wins, as comgr's ``lookUpCodeObject`` walks the bundle
header. (clang-offload-bundler picks among several compatible entries in its ``StringMap`` hash order
instead; Clang's conflict rule keeps a driver-built bundle from holding two entries that both fit one
device, so the difference shows only in hand-made bundles.) NVPTX follows the CUDA rule: a cubin for
``sm_XY`` runs on compute capability X.Z with Z >= Y (``sm_90a``: 9.0 only), PTX is JIT-compiled for any
newer device. An OpenMP cubin must also pass the OpenMP runtime's own ELF checks, in the layout that runtime
reads (:mod:`offload_builders.formats.cubin`: libomptarget 19 refuses CUDA 13's ABI-8 cubins); the device's
runtime is LLVM ``llvm_version`` (the file's), or ``libomptarget=X.Y.Z`` among its capabilities.

Each registration unit (one bundle, the offload binaries of one object or executable, one NVIDIA fat
binary) is a :class:`Module` and is selected on its own: a program links several HIP fat binaries, and
every one of them needs an image for the device.
"""
from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from offload_builders.errors import OffloadError, TargetIDError
from offload_builders.formats import cubin as cubin_format
from offload_builders.formats.bundle_id import TripleKey, split_triple
from offload_builders.targets import (
    AMDGPU_TRIPLE,
    MODEL_TARGET_KINDS,
    TargetID,
    amdgpu_processor,
    generic_processor,
    parse_target_id,
)

__all__ = [
    "ALL_CODE_OBJECT_VERSIONS",
    "Device",
    "FileSelection",
    "Image",
    "Module",
    "Requirement",
    "Selection",
    "SelectionError",
    "Verdict",
    "check_deployment",
    "image_requirements",
    "judge",
    "loads_module",
    "modules_in",
    "parse_capability",
    "parse_device",
    "select",
    "select_file",
    "select_modules",
]

SPIRV_TRIPLE = "spirv64-amd-amdhsa"
SPIRV_PROCESSOR = "amdgcnspirv"
#: Code-object versions a loader may support (v2/v3 with the ``hip`` kind, v4+ with ``hipv4``).
ALL_CODE_OBJECT_VERSIONS: frozenset[int] = frozenset({2, 3, 4, 5, 6})
#: Offload kinds and the runtime that loads them (comgr accepts ``hip``, ``hipv4`` and ``hcc`` entries).
RUNTIME_OF_KIND: dict[str, str] = {"hip": "hip", "hipv4": "hip", "hcc": "hip", "openmp": "openmp", "cuda": "cuda"}
ALL_RUNTIMES: frozenset[str] = frozenset({"hip", "openmp", "cuda"})
#: The devices each runtime loads images for: OpenMP's offload to any device; a HIP fat binary
#: (``.hip_fatbin``) holds AMD code only (HIP on NVIDIA builds CUDA fat binaries), CUDA's NVIDIA code only.
#: A mixed program's module of one runtime is not judged for the other vendor's devices.
DEVICE_KINDS_OF_RUNTIME: Mapping[str, frozenset[str]] = MODEL_TARGET_KINDS  # a runtime is named after its model
#: Tiers in the order a runtime tries them.
NATIVE, GENERIC, JIT = "native", "generic", "jit"
TIERS = (NATIVE, GENERIC, JIT)

_ELFOSABI_AMDGPU_HSA = 64
_EM_AMDGPU = 224
#: ``e_ident[EI_ABIVERSION]`` of an ``ELFOSABI_AMDGPU_HSA`` file -> code-object version
#: (ELFABIVERSION_AMDGPU_HSA_V2..V6).
_COV_OF_ABI = {0: 2, 1: 3, 2: 4, 3: 5, 4: 6}
_SM = re.compile(r"^(sm|compute)_(\d+)([a-z]?)$")


class SelectionError(OffloadError):
    """A device description or capability cannot be understood."""


# --------------------------------------------------------------------------------------------------
# Requirements and devices


@dataclass(frozen=True)
class Requirement:
    """One thing an image needs from the device, e.g. ``xnack+``, ``processor=gfx90a`` or ``cov5``.

    ``value`` is a string; ``cov`` values are a version (``5``), ``N+`` or ``N-M``.
    """

    name: str
    value: str

    def __str__(self) -> str:
        if self.name in ("xnack", "sramecc"):
            return f"{self.name}{self.value}"
        if self.name == "cov":
            return f"cov{self.value}"
        return f"{self.name}={self.value}"


def _cov_range(value: str) -> range:
    """``5`` -> 5..5, ``4+`` -> 4..99, ``2-3`` -> 2..3."""
    if value.endswith("+"):
        return range(int(value[:-1]), 100)
    low, _, high = value.partition("-")
    return range(int(low), int(high or low) + 1)


def _sm_version(name: str) -> tuple[int, int, str] | None:
    """``sm_86`` -> (8, 6, ""), ``sm_90a`` -> (9, 0, "a"), ``compute_80`` -> (8, 0, "")."""
    match = _SM.match(name)
    if not match:
        return None
    number = int(match.group(2))
    return number // 10, number % 10, match.group(3)


@dataclass(frozen=True)
class Device:
    """A device as a runtime sees it: its target ID and what its software stack can load.

    ``target.features`` is the device's configuration (a real AMDGPU reports every feature its processor
    has, e.g. ``gfx90a:sramecc+:xnack-``); a feature left out is *unknown*, so an image that requires it
    does not fit, as in clang-offload-bundler. ``code_object_versions`` are what the loader accepts,
    ``spirv`` whether SPIR-V is compiled at load time (AMDGPU), ``ptx_jit`` whether PTX is (NVPTX),
    ``runtimes`` which runtimes may load images, ``extra`` further capabilities for new requirements.
    """

    target: TargetID
    code_object_versions: frozenset[int] = ALL_CODE_OBJECT_VERSIONS
    spirv: bool = True
    ptx_jit: bool = True
    runtimes: frozenset[str] = ALL_RUNTIMES
    extra: frozenset[Requirement] = frozenset()
    libomptarget: tuple[int, ...] | None = None  # the OpenMP runtime's LLVM version (None: the file's LLVM)

    def __str__(self) -> str:
        return str(self.target)

    @property
    def triple(self) -> str:
        return self.target.triple

    @property
    def generic(self) -> str | None:
        """The generic processor whose code objects this device also runs (gfx1031 -> gfx10-3-generic)."""
        return generic_processor(self.target.processor)

    def queries(self) -> list[tuple[str, str]]:
        """``(tier, "<triple>--<target ID>")`` in the order the HIP runtime asks comgr (CLR's query set)."""
        result = [(NATIVE, f"{self.triple}--{self.target}")]
        if self.target.kind == "amdgpu":
            family = amdgpu_processor(self.generic) if self.generic else None
            if family is not None:
                # CLR's TargetToGeneric keeps both features (gfx906:sramecc+:xnack- -> gfx9-generic:sramecc+:xnack-)
                # and comgr ignores the one the generic processor lacks; dropping it keeps the query a valid
                # target ID (clang-offload-bundler would reject it) with the same result.
                features = tuple((n, on) for n, on in self.target.features if n in family.features)
                result.append((GENERIC, f"{self.triple}--{TargetID(family.name, features)}"))
            if self.spirv:
                result.append((JIT, f"{SPIRV_TRIPLE}--{SPIRV_PROCESSOR}"))
        return result

    def capabilities(self) -> dict[str, Any]:
        """What the device offers, for messages and ``--json``."""
        return {
            "target_id": str(self.target), "triple": self.triple, "generic": self.generic,
            "code_object_versions": sorted(self.code_object_versions), "spirv": self.spirv,
            "ptx_jit": self.ptx_jit, "runtimes": sorted(self.runtimes),
            "extra": sorted(str(r) for r in self.extra),
            "libomptarget": cubin_format.version_text(self.libomptarget) if self.libomptarget else None,
        }


def _parse_target(text: str) -> TargetID:
    """A device target ID; newer processors (gfx950) and retired ones (gfx940) are both devices."""
    isa = text
    for prefix in (f"{AMDGPU_TRIPLE}--", f"{AMDGPU_TRIPLE}-"):
        if isa.startswith(prefix):  # an HSA ISA name, as rocminfo and HSA_* logs print it
            isa = isa[len(prefix):]
            break
    error: TargetIDError | None = None
    for version in (22, 20):
        try:
            return parse_target_id(isa, llvm_version=version)
        except TargetIDError as exc:
            error = error or exc
    assert error is not None
    raise SelectionError(f"invalid device {text!r}: {error}") from None


def parse_capability(text: str, device: Device) -> Device:
    """Add one capability to ``device``: ``cov5`` (the loader takes code object v5; the first ``covN`` replaces
    the default set), ``spirv``/``no-spirv``, ``ptx-jit``/``no-ptx-jit``, ``hip``/``openmp``/``cuda`` (the first
    one replaces the default "any runtime"), ``libomptarget=19.1.7`` (the OpenMP runtime's LLVM version, whose
    cubin checks apply), or ``NAME=VALUE`` for a requirement of any other name."""
    tag = text.strip()
    if match := re.fullmatch(r"cov(\d+)", tag):
        versions = device.code_object_versions
        if versions == ALL_CODE_OBJECT_VERSIONS:
            versions = frozenset()
        return replace(device, code_object_versions=versions | {int(match.group(1))})
    if tag in ("spirv", "no-spirv"):
        return replace(device, spirv=tag == "spirv")
    if tag in ("ptx-jit", "no-ptx-jit"):
        return replace(device, ptx_jit=tag == "ptx-jit")
    if match := re.fullmatch(r"libomptarget=(\d+(?:\.\d+){0,2})", tag):
        return replace(device, libomptarget=tuple(int(part) for part in match.group(1).split(".")))
    if tag in ALL_RUNTIMES:
        runtimes = device.runtimes if device.runtimes != ALL_RUNTIMES else frozenset()
        return replace(device, runtimes=runtimes | {tag})
    name, eq, value = tag.partition("=")
    if eq and re.fullmatch(r"[A-Za-z][\w.-]*", name) and value:
        return replace(device, extra=device.extra | {Requirement(name, value)})
    raise SelectionError(f"unknown device capability {text!r}; expected covN (e.g. cov5), spirv, no-spirv, "
                         "ptx-jit, no-ptx-jit, hip, openmp, cuda, libomptarget=X.Y.Z or NAME=VALUE")


def parse_device(text: str, capabilities: Iterable[str] = ()) -> Device:
    """Parse ``gfx90a:sramecc+:xnack-`` (or ``amdgcn-amd-amdhsa--gfx90a:...``, ``sm_90``, ``x86_64``) and
    capability tags (see :func:`parse_capability`; items may be comma-separated)."""
    if not isinstance(text, str) or not text.strip():
        raise SelectionError("empty device; expected a target ID such as 'gfx90a:sramecc+:xnack-' or 'sm_90'")
    device = Device(_parse_target(text.strip()))
    for item in capabilities:
        for tag in item.split(","):
            if tag.strip():
                device = parse_capability(tag, device)
    return device


# --------------------------------------------------------------------------------------------------
# Images and their requirements


@dataclass(frozen=True)
class Image:
    """One device image: ``entry_id`` is its bundle entry ID (``hipv4-amdgcn-amd-amdhsa--gfx90a:xnack+``), or
    the same spelling built from an offload binary's kind, triple and arch."""

    entry_id: str
    kind: str
    triple: str
    target_id: str
    image_kind: str
    origin: str
    index: int
    requirements: tuple[Requirement, ...]
    code_object_version: int | None = None
    cubin: cubin_format.CubinHeader | None = None   # an NVIDIA ELF image's header
    llvm_version: int = 19                          # of the file, the runtime's where the device names none

    def as_dict(self) -> dict[str, Any]:
        return {"entry_id": self.entry_id, "kind": self.kind, "triple": self.triple, "target_id": self.target_id,
                "image_kind": self.image_kind, "origin": self.origin, "index": self.index,
                "code_object_version": self.code_object_version,
                "cubin": self.cubin.describe() if self.cubin else None,
                "requirements": [str(r) for r in self.requirements]}


def _four_field(triple: str) -> str:
    return "-".join(split_triple(triple))


def image_requirements(kind: str, triple: str, target_id: str, *, image_kind: str = "",
                       code_object_version: int | None = None) -> tuple[Requirement, ...]:
    """What an image with this offload kind, triple and target ID needs from a device.

    ``code_object_version`` is the AMDGPU ELF's version when known; otherwise ``hipv4`` means v4 or later
    and ``hip`` v2 or v3 (the reason the ``hipv4`` kind exists, D99235).
    """
    reqs = [Requirement("runtime", RUNTIME_OF_KIND.get(kind, kind)), Requirement("triple", triple)]
    processor, features = _split_target(target_id)
    if processor:
        name = "ptx" if image_kind == "ptx" or processor.startswith("compute_") else "processor"
        reqs.append(Requirement(name, processor))
    reqs.extend(Requirement(feature, "+" if on else "-") for feature, on in sorted(features.items()))
    if code_object_version is not None:
        reqs.append(Requirement("cov", str(code_object_version)))
    elif kind == "hipv4" and TripleKey.parse(triple).arch == "amdgcn":
        reqs.append(Requirement("cov", "4+"))
    elif kind == "hip" and TripleKey.parse(triple).arch == "amdgcn":
        reqs.append(Requirement("cov", "2-3"))
    return tuple(reqs)


def _split_target(target_id: str) -> tuple[str, dict[str, bool]]:
    """Processor (canonical where known) and features; lenient, as comgr's parse of IDs in files."""
    processor, *parts = target_id.split(":") if target_id else ("",)
    features: dict[str, bool] = {}
    for part in parts:
        if len(part) > 1 and part[-1] in "+-":
            features[part[:-1]] = part[-1] == "+"
    known = amdgpu_processor(processor)
    return (known.name if known else processor), features


# --------------------------------------------------------------------------------------------------
# Matching


@dataclass(frozen=True)
class Verdict:
    """What one image means for the device: the tier it would be loaded in, and each unmet requirement in words."""

    image: Image
    tier: str | None
    unmet: tuple[str, ...]
    note: str = ""

    @property
    def fits(self) -> bool:
        return not self.unmet

    def reason(self) -> str:
        """One line: ``<entry ID>: <why>``."""
        why = "; ".join(self.unmet) if self.unmet else (self.note or "fits")
        return f"{self.image.entry_id}: {why}"

    def as_dict(self) -> dict[str, Any]:
        return {**self.image.as_dict(), "tier": self.tier, "fits": self.fits, "unmet": list(self.unmet),
                "note": self.note}


def _triple_ok(image_triple: str, wanted: str) -> bool:
    return TripleKey.parse(image_triple).is_compatible_with(TripleKey.parse(wanted))


def _tier(image: Image, device: Device) -> tuple[str | None, list[str]]:
    """The tier the image would be loaded in, or the reasons its triple and processor rule it out."""
    reqs = {r.name: r.value for r in image.requirements}
    processor = reqs.get("processor", reqs.get("ptx", ""))
    triple = reqs.get("triple", "")
    dev = device.target
    if dev.kind == "amdgpu" and _triple_ok(triple, SPIRV_TRIPLE) and processor == SPIRV_PROCESSOR:
        return (JIT, []) if device.spirv else (None, ["needs SPIR-V compilation at load time; the device "
                                                      "has the no-spirv capability"])
    if not _triple_ok(triple, device.triple):
        return None, [f"needs triple {triple or '(none)'}; the device is {device.triple}"]
    if dev.kind == "nvptx":
        return _nvptx_tier(image, processor, device)
    if processor == dev.processor or (dev.kind == "host-cpu" and processor in ("", dev.processor)):
        return NATIVE, []
    if device.generic and processor == device.generic:
        return GENERIC, []
    family = f" (generic family {device.generic})" if device.generic else " (no generic family)"
    return None, [f"needs processor {processor or '(none)'}; the device is {dev.processor}{family}"]


def _nvptx_tier(image: Image, processor: str, device: Device) -> tuple[str | None, list[str]]:
    want, have = _sm_version(processor), _sm_version(device.target.processor)
    if want is None or have is None:
        return None, [f"needs processor {processor or '(none)'}; the device is {device.target.processor}"]
    if processor.startswith("compute_") or image.image_kind == "ptx":
        if want[:2] > have[:2]:
            return None, [f"PTX for {processor} needs compute capability {want[0]}.{want[1]} or newer; "
                          f"the device is {have[0]}.{have[1]}"]
        if not device.ptx_jit:
            return None, [f"PTX for {processor} needs JIT compilation; the device has the no-ptx-jit capability"]
        return JIT, []
    if want[2] and want[:2] != have[:2]:
        return None, [f"needs processor {processor} (compute capability {want[0]}.{want[1]} exactly); "
                      f"the device is {have[0]}.{have[1]}"]
    if want[0] != have[0] or want[1] > have[1]:
        return None, [f"needs processor {processor} (a cubin runs on compute capability {want[0]}.{want[1]} to "
                      f"{want[0]}.9); the device is {have[0]}.{have[1]}"]
    return NATIVE, []


def _unmet(req: Requirement, device: Device) -> str | None:
    """Why ``device`` does not meet ``req``, or None. Triple and processor are judged by :func:`_tier`."""
    if req.name in ("triple", "processor", "ptx"):
        return None
    if req.name == "runtime":
        if req.value in device.runtimes:
            return None
        return f"needs the {req.value} runtime; the device is limited to {', '.join(sorted(device.runtimes))}"
    if req.name in ("xnack", "sramecc"):
        have = device.target.feature(req.name)
        if have is None:
            return (f"needs {req}; the device description leaves {req.name} unset "
                    f"(say {device.target.processor}:{req.name}+ or :{req.name}-)")
        if ("+" if have else "-") != req.value:
            return f"needs {req}; the device has {req.name}{'+' if have else '-'}"
        return None
    if req.name == "cov":
        wanted = _cov_range(req.value)
        if any(v in wanted for v in device.code_object_versions):
            return None
        supported = ", ".join(f"cov{v}" for v in sorted(device.code_object_versions))
        return f"needs {req} (code object version); the device's loader supports {supported}"
    if req in device.extra:
        return None
    return f"needs {req}; the device does not have that capability"


def _openmp_cubin_refusal(image: Image, device: Device) -> str | None:
    """Why the device's OpenMP runtime refuses an OpenMP cubin by its ELF header (its ``checkMachine`` and the
    CUDA plugin's SM check, in the layout that runtime version reads), or None. A relocatable cubin (a fat
    object's) is not what the runtime loads: the device link writes that, so it is judged in the program."""
    if image.cubin is None or RUNTIME_OF_KIND.get(image.kind) != "openmp" or device.target.kind != "nvptx":
        return None
    if image.cubin.e_type not in (cubin_format.ET_EXEC, cubin_format.ET_DYN):
        return None
    have = _sm_version(device.target.processor)
    runtime = device.libomptarget or (image.llvm_version,)
    return cubin_format.runtime_refusal(image.cubin, runtime, have[0] * 10 + have[1] if have else None)


def judge(image: Image, device: Device) -> Verdict:
    """Every unmet requirement of ``image`` on ``device``, and its tier when it fits."""
    problems = [p for r in image.requirements if r.name == "runtime" and (p := _unmet(r, device))]
    tier, placement = _tier(image, device)
    if not placement and (refusal := _openmp_cubin_refusal(image, device)):
        placement = [refusal]
    problems += placement
    if not placement:  # features and code-object version only mean something for the right processor
        problems += [p for r in image.requirements if r.name != "runtime" and (p := _unmet(r, device))]
    return Verdict(image, tier if not problems else None, tuple(problems))


# --------------------------------------------------------------------------------------------------
# Modules and selection


@dataclass(frozen=True)
class Module:
    """The images a runtime registers together: one bundle, the offload binaries of one object or
    executable, or one NVIDIA fat binary. ``origin`` says where it is in the file."""

    origin: str
    images: tuple[Image, ...]


@dataclass(frozen=True)
class Selection:
    """The image ``device`` would load from ``module`` (None when none fits) and a verdict on every image."""

    device: Device
    module: Module
    chosen: Image | None
    verdicts: tuple[Verdict, ...]

    @property
    def ok(self) -> bool:
        return self.chosen is not None

    def reasons(self) -> list[str]:
        """One line per image that was not chosen, saying why."""
        return [v.reason() for v in self.verdicts if v.image is not self.chosen]

    def as_dict(self) -> dict[str, Any]:
        return {"origin": self.module.origin, "device": str(self.device), "ok": self.ok,
                "chosen": self.chosen.as_dict() if self.chosen else None,
                "images": [v.as_dict() for v in self.verdicts]}


def select(module: Module | Sequence[Image], device: Device) -> Selection:
    """Choose as the runtime does: the first fitting image (file order) of the first tier that has one."""
    if not isinstance(module, Module):
        module = Module("", tuple(module))
    verdicts = [judge(image, device) for image in module.images]
    chosen: Verdict | None = None
    for tier in TIERS:
        chosen = next((v for v in verdicts if v.fits and v.tier == tier), None)
        if chosen is not None:
            break
    final = []
    for verdict in verdicts:
        if verdict.fits and verdict is not chosen:
            assert chosen is not None
            if verdict.tier != chosen.tier:
                note = (f"fits ({verdict.tier}), but {chosen.image.entry_id} ({chosen.tier}) comes first in the "
                        f"runtime's order: native ISA, generic ISA, then SPIR-V/PTX JIT")
            else:
                note = f"fits, but {chosen.image.entry_id} comes first in the file"
            verdict = Verdict(verdict.image, verdict.tier, (), note)
        final.append(verdict)
    return Selection(device, module, chosen.image if chosen else None, tuple(final))


def _code_object_version(head: bytes) -> int | None:
    """The code-object version of an AMDGPU HSA ELF file from its first bytes, else None."""
    if len(head) < 20 or head[:4] != b"\x7fELF" or head[7] != _ELFOSABI_AMDGPU_HSA:
        return None
    machine = int.from_bytes(head[18:20], "little" if head[5] == 1 else "big")
    return _COV_OF_ABI.get(head[8]) if machine == _EM_AMDGPU else None


def _payload_head(payload: Any, path: str, size: int = 64) -> bytes:
    """The first bytes of a payload: read in place when they lie in ``path``, else by the payload's own
    :meth:`~offload_builders.formats.inspect.Payload.head` (a compressed bundle's entry: decompressed that
    far, not whole)."""
    if payload.offset_in == "file" and os.path.realpath(payload.file) == os.path.realpath(path):
        with open(path, "rb") as f:
            return os.pread(f.fileno(), min(size, payload.size), payload.offset)
    return bytes(payload.head(size))


def _image(kind: str, triple: str, target: str, image_kind: str, origin: str, index: int, entry_id: str,
           head: Callable[[], bytes] | None, llvm_version: int = 19) -> Image:
    cov, header = None, None
    arch = TripleKey.parse(triple).arch
    if head is not None and image_kind in ("elf", "object") and arch == "amdgcn":
        cov = _code_object_version(head())
    elif head is not None and image_kind in ("elf", "object", "cubin") and arch.startswith("nvptx"):
        data = head()
        if data[:4] == b"\x7fELF":
            header = cubin_format.read_header(data)
    reqs = image_requirements(kind, triple, target, image_kind=image_kind, code_object_version=cov)
    return Image(entry_id, kind, triple, target, image_kind, origin, index, reqs, cov, header, llvm_version)


def modules_in(path: str | os.PathLike[str], *, llvm_version: int = 19, display: str | None = None,
               notify: Callable[[str], None] | None = None) -> list[Module]:
    """Every registration unit of device images in the file at ``path`` (host entries are left out).

    ``display`` names the file in origins instead of ``path``. Uses
    :func:`offload_builders.formats.inspect.inspect_file`, so it reads whatever offload-inspect reads;
    malformed content raises :class:`~offload_builders.errors.OffloadFormatError`. Of a payload only the
    first 64 bytes are read (for its ELF header; compressed bundles are decompressed no further); ``notify``
    hears first where reading them means decompressing much.
    """
    from offload_builders.formats.inspect import inspect_file

    fspath = os.fspath(path)
    groups: dict[tuple[Any, ...], list[Image]] = {}
    origins: dict[tuple[Any, ...], str] = {}
    with inspect_file(fspath, llvm_version=llvm_version, display=display, notify=notify) as inspection:
        for p in inspection.payloads:
            place = (p.file, p.members, p.section, p.symbol)
            if p.format == "offload binary":
                key: tuple[Any, ...] = (*place[:2], "offload binaries", p.section, p.symbol)
                where = p.origin
            elif p.format == "object bundle":
                key = (*place[:2], "object bundle")
                where = p.file + "".join(f"({m})" for m in p.members) + ": object bundle sections"
            elif p.format == "nvidia fatbin":
                key = (*place, "fatbin", p.index)
                where = f"{p.origin}: nvidia fatbin {p.index}"
            else:  # bundle, text bundle, compressed ...
                key = (*place, "bundle", p.index)
                where = f"{p.origin}: bundle {p.index}" + (f" (CCOB v{p.compression.version})"
                                                           if p.compression is not None else "")
            origins.setdefault(key, where)
            images = groups.setdefault(key, [])
            if p.format == "nvidia fatbin":
                for e in p.entries:
                    arch = e.arch or "?"
                    images.append(_image("cuda", p.triple, arch, "ptx" if e.kind == "ptx" else e.kind, where,
                                         len(images), f"cuda-{_four_field(p.triple)}-{arch}", None))
                continue
            if p.kind == "host":
                continue
            entry_id = p.bundle_id or f"{p.kind}-{_four_field(p.triple)}-{p.arch}"
            image_kind = "elf" if p.image_kind in ("elf", "object") else p.image_kind
            images.append(_image(p.kind, p.triple, p.arch, image_kind, where, len(images), entry_id,
                                 functools.partial(_payload_head, p, fspath), llvm_version))
    return [Module(origins[key], tuple(images)) for key, images in groups.items() if images]


@dataclass
class FileSelection:
    """The selection for every module of one file."""

    file: str
    device: Device
    selections: list[Selection] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.selections) and all(s.ok for s in self.selections)

    def problems(self) -> list[str]:
        """One line per module without an image for the device (a file without images is one problem)."""
        if not self.selections:
            return [f"{self.file}: no device images, so none for {self.device}"]
        lines = []
        for s in self.selections:
            if not s.ok:
                why = " | ".join(s.reasons()) or "no images"
                lines.append(f"{s.module.origin}: no image for {self.device}: {why}")
        return lines

    def as_dict(self) -> dict[str, Any]:
        return {"file": self.file, "device": self.device.capabilities(), "ok": self.ok,
                "modules": [s.as_dict() for s in self.selections]}


def loads_module(module: Module, device: Device) -> bool:
    """Whether a runtime that registers ``module`` would offer it to ``device`` at all
    (:data:`DEVICE_KINDS_OF_RUNTIME`): the CUDA runtime never looks into a HIP fat binary for an NVIDIA device,
    nor the HIP runtime into a CUDA one. A module of unknown or no kind is judged as before."""
    runtimes = {RUNTIME_OF_KIND.get(image.kind, image.kind) for image in module.images}
    return not runtimes or any(device.target.kind in DEVICE_KINDS_OF_RUNTIME.get(runtime, {device.target.kind})
                               for runtime in runtimes)


def select_modules(modules: Sequence[Module], device: Device, path: str) -> FileSelection:
    """:func:`select` for every module of ``modules`` that a runtime would offer ``device``
    (:func:`loads_module`)."""
    return FileSelection(path, device, [select(m, device) for m in modules if loads_module(m, device)])


def select_file(path: str | os.PathLike[str], device: Device | str, *, llvm_version: int = 19) -> FileSelection:
    """:func:`select` for every module of the file at ``path`` that a runtime would offer ``device``."""
    if isinstance(device, str):
        device = parse_device(device)
    return select_modules(modules_in(path, llvm_version=llvm_version), device, os.fspath(path))


def check_deployment(path: str | os.PathLike[str], devices: Sequence[str | Device], *,
                     llvm_version: int = 19, runtime: tuple[int, ...] | None = None) -> list[str]:
    """The problems keeping the file at ``path`` from running on each of ``devices``; empty when every
    device finds an image in every module. For a build step: fail the build when this is not empty.

    A device string may carry capabilities after whitespace or ``;`` (``"gfx90a:sramecc+:xnack- cov5"``).
    ``runtime`` is the OpenMP runtime's LLVM version where a device names none (``libomptarget=``).
    Raises :class:`SelectionError` for a device that cannot be parsed, and
    :class:`~offload_builders.errors.OffloadFormatError` for a malformed file.
    """
    if isinstance(devices, (str, Device)):
        devices = [devices]
    parsed = []
    for item in devices:
        if isinstance(item, Device):
            parsed.append(item)
        else:
            name, *caps = item.replace(";", " ").split() or [""]
            parsed.append(parse_device(name, caps))
    if runtime is not None:
        parsed = [device if device.libomptarget else replace(device, libomptarget=runtime) for device in parsed]
    modules = modules_in(path, llvm_version=llvm_version)
    problems: list[str] = []
    for device in parsed:
        problems.extend(select_modules(modules, device, os.fspath(path)).problems())
    return problems
