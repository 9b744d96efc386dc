"""Offload target IDs: Clang's ``--offload-arch`` values, parsed and canonicalized in pure Python.

A target ID names the device code is compiled for (clang/lib/Basic/TargetID.cpp, ClangOffloadBundler.rst
"Target ID")::

    <target-id> ::= <processor> ( ":" <target-feature> ( "+" | "-" ) )*

Build nodes, bundle entry IDs, file names and packager ``arch=`` values all need the *canonical* spelling
(canonical processor name, features sorted by name), and a build must reject what Clang would reject
before it spends minutes compiling. Hence this module keeps one record per processor that Clang knows,
with the LLVM release that added (or removed) it, and reproduces Clang's rules:

* :func:`parse_target_id` = ``parseTargetID`` + ``getCanonicalTargetID``, checked against the Clang 19
  and Clang 22 drivers (``tests/test_targets.py``).
* :func:`find_conflict` = the *documented* rule behind ``getConflictTargetIDCombination``; Clang 19 and
  22.1 implement it asymmetrically and miss some conflicts, which we report.
* :func:`is_compatible` = ``isCodeObjectCompatible`` / comgr ``isCompatibleIsaName``.

Besides AMDGPU processors, NVPTX ``sm_*`` names (no target-ID features) and ``x86_64`` (the host CPU used
as an OpenMP offload device, packaged with an empty ``arch=``) are target IDs here too, so one list such as
``x86_64,sm_90,gfx90a:xnack+`` can describe every device of a build.
"""
from __future__ import annotations

import functools
import re
from collections import UserList
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from offload_builders.errors import TargetIDError
from offload_builders.phase_table import CUDA, HIP, OPENMP

HOST_CPU_TRIPLE = "x86_64-unknown-linux-gnu"
NVPTX_TRIPLE = "nvptx64-nvidia-cuda"
AMDGPU_TRIPLE = "amdgcn-amd-amdhsa"

#: The processor name of the host-CPU offload device, and the spellings that select it.
HOST_CPU_PROCESSOR = "x86_64"
HOST_CPU_NAMES: tuple[str, ...] = (HOST_CPU_PROCESSOR, HOST_CPU_TRIPLE)

#: Oldest LLVM release whose tables are recorded here; rows say ``since_llvm=19`` when they are older.
MIN_LLVM_VERSION = 19
DEFAULT_LLVM_VERSION = 19

#: The only AMDGPU target-ID features (``getAllPossibleTargetIDFeatures``); ``tgsplit``, ``cumode``,
#: ``wavefrontsize64`` and the like are ordinary ``-m`` options, never part of a target ID.
FEATURE_SRAMECC = "sramecc"
FEATURE_XNACK = "xnack"

#: Clang's format error text, quoted in ours so users can search for either.
CLANG_FORMAT_HINT = (
    "a processor name followed by an optional colon-delimited list of features followed by an "
    "enable/disable sign (e.g., 'gfx908:sramecc+:xnack-')"
)
CONFLICT_RULE = "for one processor a feature must appear in all target IDs or in none"


@dataclass(frozen=True)
class AMDGPUProcessor:
    """One row of LLVM's ``AMDGCNGPUs[]`` table (llvm/lib/TargetParser/TargetParser.cpp).

    ``xnack``/``sramecc`` say whether the processor accepts that target-ID feature (``FEATURE_XNACK``,
    ``FEATURE_SRAMECC``). ``since_llvm``/``until_llvm`` bound the LLVM releases whose Clang accepts the
    name, so a build can reject ``gfx950`` before handing it to Clang 19. ``generic`` is the generic
    processor whose code objects also run on this one (AMDGPUUsage "AMDGPU Generic Processors").
    """

    name: str
    alternative_names: tuple[str, ...] = ()
    xnack: bool = False
    sramecc: bool = False
    since_llvm: int = 19
    generic: str | None = None
    until_llvm: int | None = None  # last LLVM release that still knows it (gfx940/gfx941: 20)

    @property
    def features(self) -> tuple[str, ...]:
        """The target-ID features this processor accepts, sorted like a canonical target ID."""
        return tuple(name for name, ok in ((FEATURE_SRAMECC, self.sramecc), (FEATURE_XNACK, self.xnack)) if ok)

    @property
    def is_generic(self) -> bool:
        return self.name.endswith("-generic")

    def known_in(self, llvm_version: int) -> bool:
        """Whether Clang ``llvm_version`` accepts this processor."""
        return self.since_llvm <= llvm_version and (self.until_llvm is None or llvm_version <= self.until_llvm)


_P = AMDGPUProcessor
_G9, _G94, _G101, _G103, _G11, _G12 = (
    "gfx9-generic", "gfx9-4-generic", "gfx10-1-generic", "gfx10-3-generic", "gfx11-generic", "gfx12-generic")

#: LLVM 19's AMDGCN processors, in ``AMDGCNGPUs[]`` order, plus those later Clang releases added.
#: Verified against ``clang++ -x hip --offload-arch=`` and ``llc -march=amdgcn -mcpu=help`` of 19.1.7 and 22.1.8;
#: the 20/21 boundaries come from the upstream commits (gfx940/941 removed Feb 2025, after the 20 branch).
AMDGPU_PROCESSORS: tuple[AMDGPUProcessor, ...] = (
    # GCN GFX6 (Southern Islands)
    _P("gfx600", ("tahiti",)),                                          # Radeon HD 7970
    _P("gfx601", ("pitcairn", "verde")),                                # Radeon HD 7870 / 7770
    _P("gfx602", ("hainan", "oland")),                                  # Radeon HD 8570, R7 240
    # GCN GFX7 (Sea Islands)
    _P("gfx700", ("kaveri",)),                                          # Kaveri APUs (A10-7850K)
    _P("gfx701", ("hawaii",)),                                          # FirePro W8100/W9100, S9150
    _P("gfx702"),                                                       # Radeon R9 290/290X, R9 390
    _P("gfx703", ("kabini", "mullins")),                                # Kabini/Mullins APUs
    _P("gfx704", ("bonaire",)),                                         # Radeon HD 7790, R7 260
    _P("gfx705"),                                                       # Godavari APUs
    # GCN GFX8 (Volcanic Islands)
    _P("gfx801", ("carrizo",), xnack=True),                             # Carrizo APUs (A12-8800B)
    _P("gfx802", ("iceland", "tonga")),                                 # Radeon R9 285, FirePro S7150
    _P("gfx803", ("fiji", "polaris10", "polaris11")),                   # R9 Fury/Nano, RX 470-580
    _P("gfx805", ("tongapro",)),                                        # FirePro S7150x2
    _P("gfx810", ("stoney",), xnack=True),                              # Stoney Ridge APUs
    # GCN GFX9 (Vega, CDNA 1-3)
    _P("gfx900", xnack=True, generic=_G9),                              # Radeon Vega 56/64, Instinct MI25
    _P("gfx902", xnack=True, generic=_G9),                              # Raven Ridge APUs
    _P("gfx904", xnack=True, generic=_G9),                              # Vega 12
    _P("gfx906", xnack=True, sramecc=True, generic=_G9),                # Radeon VII, Instinct MI50/MI60
    _P("gfx908", xnack=True, sramecc=True),                             # Instinct MI100 (CDNA 1)
    _P("gfx909", xnack=True, generic=_G9),                              # Raven Ridge 2 APUs
    _P("gfx90a", xnack=True, sramecc=True),                             # Instinct MI210/MI250/MI250X (CDNA 2)
    _P("gfx90c", xnack=True, generic=_G9),                              # Renoir/Cezanne APUs
    _P("gfx940", xnack=True, sramecc=True, generic=_G94, until_llvm=20),  # early Instinct MI300 (retired)
    _P("gfx941", xnack=True, sramecc=True, generic=_G94, until_llvm=20),  # early Instinct MI300X (retired)
    _P("gfx942", xnack=True, sramecc=True, generic=_G94),               # Instinct MI300A/MI300X/MI325X (CDNA 3)
    _P("gfx950", xnack=True, sramecc=True, since_llvm=20, generic=_G94),  # Instinct MI350X/MI355X (CDNA 4)
    # GCN GFX10.1 (RDNA 1)
    _P("gfx1010", xnack=True, generic=_G101),                           # Radeon RX 5700 / 5700 XT
    _P("gfx1011", xnack=True, generic=_G101),                           # Radeon Pro V520
    _P("gfx1012", xnack=True, generic=_G101),                           # Radeon RX 5500 XT
    _P("gfx1013", xnack=True, generic=_G101),                           # RDNA 1 APU
    # GCN GFX10.3 (RDNA 2)
    _P("gfx1030", generic=_G103),                                       # Radeon RX 6800/6900 XT, PRO W6800
    _P("gfx1031", generic=_G103),                                       # Radeon RX 6700 XT
    _P("gfx1032", generic=_G103),                                       # Radeon RX 6600 XT
    _P("gfx1033", generic=_G103),                                       # Van Gogh APU (Steam Deck)
    _P("gfx1034", generic=_G103),                                       # Radeon RX 6500 XT
    _P("gfx1035", generic=_G103),                                       # Rembrandt APUs (Radeon 680M)
    _P("gfx1036", generic=_G103),                                       # Raphael APUs (Ryzen 7000 iGPU)
    # GCN GFX11 (RDNA 3, 3.5)
    _P("gfx1100", generic=_G11),                                        # Radeon RX 7900 XTX, PRO W7900
    _P("gfx1101", generic=_G11),                                        # Radeon RX 7800 XT / 7700 XT
    _P("gfx1102", generic=_G11),                                        # Radeon RX 7600
    _P("gfx1103", generic=_G11),                                        # Phoenix APUs (Radeon 780M)
    _P("gfx1150", generic=_G11),                                        # Strix Point APUs (Radeon 890M)
    _P("gfx1151", generic=_G11),                                        # Strix Halo APUs (Radeon 8060S)
    _P("gfx1152", generic=_G11),                                        # Krackan Point APUs (Radeon 860M)
    _P("gfx1153", since_llvm=20, generic=_G11),                         # RDNA 3.5 APU
    # GCN GFX12 (RDNA 4)
    _P("gfx1200", generic=_G12),                                        # Radeon RX 9060 XT
    _P("gfx1201", generic=_G12),                                        # Radeon RX 9070 / 9070 XT
    # GCN GFX12.5
    _P("gfx1250", since_llvm=21),                                       # next-generation Instinct (TBA)
    _P("gfx1251", since_llvm=22),                                       # (TBA)
    # Generic processors: one code object for a family (code object v6)
    _P(_G9, xnack=True),                                                # gfx900-gfx906, gfx909, gfx90c
    _P(_G94, xnack=True, sramecc=True, since_llvm=20),                  # gfx940-gfx942, gfx950
    _P(_G101, xnack=True),                                              # gfx1010-gfx1013
    _P(_G103),                                                          # gfx1030-gfx1036
    _P(_G11),                                                           # gfx1100-gfx1103, gfx1150-gfx1153
    _P(_G12),                                                           # gfx1200, gfx1201
)
del _P


@dataclass(frozen=True)
class NVPTXArch:
    """One NVPTX ``sm_*`` entry of Clang's ``arch_names[]`` (clang/lib/Basic/Cuda.cpp).

    ``virtual_arch`` is the PTX profile ``fatbinary`` pairs with it (``compute_*``). NVPTX target IDs take
    no features.
    """

    name: str
    virtual_arch: str
    since_llvm: int = 19


def _sm(number: str, since_llvm: int = 19, virtual: str | None = None) -> NVPTXArch:
    return NVPTXArch(f"sm_{number}", virtual or f"compute_{number}", since_llvm)


#: Verified with ``clang++ -x cuda --offload-arch=`` of 19.1.7 and 22.1.8. The 20 and 21 boundaries come
#: from the upstream commits; the ``sm_*f`` family variants are newer than Clang 22.
NVPTX_ARCH_TABLE: tuple[NVPTXArch, ...] = (
    _sm("20", virtual="compute_20"), _sm("21", virtual="compute_20"),   # Fermi
    _sm("30"), _sm("32"), _sm("35"), _sm("37"),                         # Kepler
    _sm("50"), _sm("52"), _sm("53"),                                    # Maxwell
    _sm("60"), _sm("61"), _sm("62"),                                    # Pascal
    _sm("70"), _sm("72"),                                               # Volta
    _sm("75"),                                                          # Turing
    _sm("80"), _sm("86"),                                               # Ampere
    _sm("87"),                                                          # Jetson/Drive AGX Orin
    _sm("88", 22),                                                      # Ampere (CUDA 13)
    _sm("89"),                                                          # Ada Lovelace
    _sm("90"), _sm("90a"),                                              # Hopper
    _sm("100", 20), _sm("100a", 20),                                    # Blackwell B100/B200
    _sm("101", 21), _sm("101a", 21),                                    # Blackwell Thor (CUDA 12.8 name)
    _sm("103", 22), _sm("103a", 22),                                    # Blackwell Ultra B300
    _sm("110", 22), _sm("110a", 22),                                    # Blackwell Thor (CUDA 13 name)
    _sm("120", 21), _sm("120a", 21),                                    # Blackwell RTX 50
    _sm("121", 22), _sm("121a", 22),                                    # Blackwell DGX Spark
)
NVPTX_ARCHS: tuple[str, ...] = tuple(arch.name for arch in NVPTX_ARCH_TABLE)

_AMDGPU_BY_NAME: dict[str, AMDGPUProcessor] = {
    name: proc for proc in AMDGPU_PROCESSORS for name in (proc.name, *proc.alternative_names)
}
_NVPTX_BY_NAME: dict[str, NVPTXArch] = {arch.name: arch for arch in NVPTX_ARCH_TABLE}

#: Clang accepts these offload archs, but they are not processors this package compiles for.
_UNSUPPORTED_ARCHS: dict[str, str] = {
    "amdgcnspirv": "AMDGCN SPIR-V (triple spirv64-amd-amdhsa) is not supported by offload_builders",
}


def amdgpu_processor(name: str) -> AMDGPUProcessor | None:
    """The table row for a canonical or alternative AMDGPU processor name, whatever the LLVM version."""
    return _AMDGPU_BY_NAME.get(name)


def nvptx_arch(name: str) -> NVPTXArch | None:
    """The table row for an ``sm_*`` name, whatever the LLVM version."""
    return _NVPTX_BY_NAME.get(name)


def known_processors(llvm_version: int = DEFAULT_LLVM_VERSION) -> tuple[str, ...]:
    """Every processor spelling Clang ``llvm_version`` accepts (alternative names included), for messages."""
    amd = [n for p in AMDGPU_PROCESSORS if p.known_in(llvm_version) for n in (p.name, *p.alternative_names)]
    nv = [a.name for a in NVPTX_ARCH_TABLE if a.since_llvm <= llvm_version]
    return (*amd, *nv, HOST_CPU_PROCESSOR)


def generic_processor(processor: str) -> str | None:
    """The generic processor whose code objects run on ``processor`` (gfx1030 -> "gfx10-3-generic").

    None for processors outside any generic family (gfx908, gfx90a, ...), for generic processors themselves,
    and for non-AMDGPU names. Alternative names are accepted.
    """
    proc = _AMDGPU_BY_NAME.get(processor)
    return proc.generic if proc else None


@dataclass(frozen=True, order=True)
class TargetID:
    """A canonical offload target ID.

    ``processor`` is canonical ("gfx801", never "carrizo"); ``features`` are (name, enabled) pairs, kept
    sorted by name so that equal IDs compare and hash equal. Construct through :func:`parse_target_id` to
    validate; direct construction (e.g. from a bundle written by a newer Clang) only sorts the features.
    ``order=True`` orders by fields, which is *not* Clang's order: sort with ``key=str`` for that.
    """

    processor: str
    features: tuple[tuple[str, bool], ...] = ()

    def __post_init__(self) -> None:
        features = tuple(sorted((str(name), bool(on)) for name, on in self.features))
        names = [name for name, _ in features]
        if len(set(names)) != len(names):
            raise TargetIDError(f"target ID {self.processor!r} repeats a feature: {', '.join(names)}")
        object.__setattr__(self, "features", features)

    def __str__(self) -> str:
        return self.processor + "".join(f":{name}{'+' if on else '-'}" for name, on in self.features)

    @property
    def kind(self) -> str:
        """"amdgpu", "nvptx" or "host-cpu": selects the triple, toolchain and packaging."""
        if self.processor == HOST_CPU_PROCESSOR:
            return "host-cpu"
        if self.processor in _NVPTX_BY_NAME or self.processor.startswith("sm_"):
            return "nvptx"
        return "amdgpu"

    @property
    def triple(self) -> str:
        return {"amdgpu": AMDGPU_TRIPLE, "nvptx": NVPTX_TRIPLE, "host-cpu": HOST_CPU_TRIPLE}[self.kind]

    @property
    def package_arch(self) -> str:
        """The ``arch=`` of a clang-offload-packager image: the target ID, empty for the host CPU."""
        return "" if self.kind == "host-cpu" else str(self)

    @property
    def file_token(self) -> str:
        """A deterministic file-name fragment: ':' is not allowed in Windows names, nor handy in Make."""
        return str(self).replace(":", "_")

    def feature(self, name: str) -> bool | None:
        """The feature's setting: True (+), False (-), or None when the ID leaves it unspecified (Any)."""
        for feature_name, on in self.features:
            if feature_name == name:
                return on
        return None


def _format_error(text: str, problem: str) -> TargetIDError:
    return TargetIDError(f"invalid target ID {text!r}: {problem}; expected {CLANG_FORMAT_HINT}")


def parse_target_id_format(text: str) -> tuple[str, dict[str, bool]]:
    """Split ``text`` into processor and features, checking only the syntax.

    Like Clang's ``parseTargetIDWithFormatCheckingOnly``: neither the processor nor the feature names are
    validated, so IDs from newer tools can still be read. Stricter than Clang in one respect: an empty
    component (``gfx90a:`` or ``gfx90a:xnack+:``, which Clang 19 and 22 silently accept) is an error.
    """
    if not isinstance(text, str):
        raise TargetIDError(f"a target ID must be a string, not {type(text).__name__} ({text!r})")
    if not text:
        raise TargetIDError(f"empty target ID; expected {CLANG_FORMAT_HINT}")
    if any(ch.isspace() for ch in text):
        raise _format_error(text, "it contains whitespace")
    processor, *components = text.split(":")
    if not processor:
        raise _format_error(text, "the processor (component 1) is empty")
    features: dict[str, bool] = {}
    for index, component in enumerate(components, start=2):
        if not component:
            raise _format_error(text, f"component {index} is empty")
        sign = component[-1]
        name = component[:-1]
        if sign not in "+-":
            raise _format_error(text, f"feature {component!r} has no '+' or '-' sign")
        if not name:
            raise _format_error(text, f"component {index} ({component!r}) has a sign but no feature name")
        if name in features:
            raise _format_error(text, f"feature {name!r} appears more than once")
        features[name] = sign == "+"
    return processor, features


def _version_error(text: str, name: str, since: int, until: int | None, llvm_version: int) -> TargetIDError | None:
    if llvm_version < since:
        return TargetIDError(
            f"invalid target ID {text!r}: processor {name!r} was added in LLVM {since}, "
            f"but the target LLVM version is {llvm_version}")
    if until is not None and llvm_version > until:
        return TargetIDError(
            f"invalid target ID {text!r}: processor {name!r} was removed after LLVM {until}, "
            f"but the target LLVM version is {llvm_version}")
    return None


def _unknown_processor(text: str, processor: str, llvm_version: int) -> TargetIDError:
    if processor == "native":  # offload_builders.native_targets replaces it in the lists that take it
        return TargetIDError(f"invalid target ID {text!r}: 'native' (this machine's GPUs) is taken by target lists"
                             " only (OFFLOAD_ARCHS, CMake's ARCHS, offload-compile's check, --targets and --target),"
                             " which replace it before target IDs are parsed; name the target IDs here")
    valid = known_processors(llvm_version)
    lowered = {name.lower(): name for name in valid}
    if processor.lower() in lowered:  # a case slip: Clang names are case-sensitive
        close = [lowered[processor.lower()]]
    else:
        import difflib  # only for the error message

        close = [lowered[m] for m in difflib.get_close_matches(processor.lower(), list(lowered), n=4, cutoff=0.7)]
    head = f"invalid target ID {text!r}: unknown processor {processor!r} for LLVM {llvm_version}"
    if close:
        listed = ", ".join(repr(name) for name in close)
        return TargetIDError(
            f"{head}; did you mean {listed}? (see offload_builders.targets.AMDGPU_PROCESSORS and NVPTX_ARCHS)")
    return TargetIDError(f"{head}; valid processors: {', '.join(valid)}")


def _check_llvm_version(llvm_version: int) -> None:
    if not isinstance(llvm_version, int) or llvm_version < MIN_LLVM_VERSION:
        raise ValueError(f"llvm_version must be an integer >= {MIN_LLVM_VERSION}, not {llvm_version!r}")


@functools.lru_cache(maxsize=1024)  # a build parses the same few IDs for each of its nodes
def parse_target_id(text: str, *, llvm_version: int = DEFAULT_LLVM_VERSION) -> TargetID:
    """Parse, validate and canonicalize one target ID as Clang ``llvm_version`` would.

    Alternative AMDGPU names become canonical ones (``carrizo:xnack+`` -> ``gfx801:xnack+``), features are
    sorted, and ``x86_64``/``x86_64-unknown-linux-gnu`` select the host-CPU device. Raises
    :class:`TargetIDError` naming the offending text and what would be accepted.
    """
    _check_llvm_version(llvm_version)
    processor, features = parse_target_id_format(text)

    accepted: tuple[str, ...]  # the target-ID features the processor takes (none but on AMDGPU)
    if processor in HOST_CPU_NAMES:
        canonical, accepted, kind_name = HOST_CPU_PROCESSOR, (), "the host CPU"
    elif (nv := _NVPTX_BY_NAME.get(processor)) is not None:
        if err := _version_error(text, processor, nv.since_llvm, None, llvm_version):
            raise err
        canonical, accepted, kind_name = nv.name, (), f"NVPTX processor {nv.name!r}"
    elif (amd := _AMDGPU_BY_NAME.get(processor)) is not None:
        if err := _version_error(text, processor, amd.since_llvm, amd.until_llvm, llvm_version):
            raise err
        canonical, accepted, kind_name = amd.name, amd.features, f"processor {amd.name!r}"
    elif processor in _UNSUPPORTED_ARCHS:
        raise TargetIDError(f"invalid target ID {text!r}: {_UNSUPPORTED_ARCHS[processor]}")
    else:
        raise _unknown_processor(text, processor, llvm_version)

    for name in features:
        if name not in accepted:
            what = f"only {', '.join(repr(f) for f in accepted)}" if accepted else "no target-ID features"
            raise TargetIDError(
                f"invalid target ID {text!r}: {kind_name} does not support target-ID feature {name!r}; "
                f"it accepts {what}")
    return TargetID(canonical, tuple(features.items()))


def _processor_key(target: TargetID) -> tuple[str, str]:
    return (target.kind, target.processor)


def find_conflict(ids: Iterable[TargetID]) -> tuple[TargetID, TargetID] | None:
    """Return two IDs that break the documented rule, or None.

    The rule (ClangOffloadBundler.rst, TargetID.cpp): for one processor, each feature either shows up in
    all target IDs or in none, because a runtime picks among same-processor code objects by feature
    setting and a mix of "Any" and "specified" would be ambiguous. Clang 19's implementation compares
    every ID only with the first one in sorted order, so it accepts ``gfx908:sramecc+:xnack+`` with
    ``gfx908:xnack+``; this check is symmetric and rejects that pair. IDs are compared in sorted string
    order, so the pair returned does not depend on the input order.
    """
    first: dict[tuple[str, str], TargetID] = {}
    for target in sorted(set(ids), key=str):
        key = _processor_key(target)
        seen = first.setdefault(key, target)
        if {n for n, _ in seen.features} != {n for n, _ in target.features}:
            return seen, target
    return None


def _split_items(value: str | Iterable[str]) -> list[str]:
    chunks = [value] if isinstance(value, str) else list(value)
    items: list[str] = []
    for chunk in chunks:
        if not isinstance(chunk, str):
            raise TargetIDError(f"offload archs must be strings, not {type(chunk).__name__} ({chunk!r})")
        items.extend(chunk.split(","))
    return items


#: How a list of offload targets may be given (for the error that names what was given instead).
ACCEPTED_ARCH_LISTS = ("a list or tuple of target ID strings or one comma-separated string, e.g."
                       " ['x86_64', 'sm_90'] or 'x86_64,sm_90'")


def offload_arch_words(value: object, variable: str = "OFFLOAD_ARCHS") -> str | tuple[str, ...]:
    """The words of an offload target list as a build file gives it (``$OFFLOAD_ARCHS``): a string as it is,
    a list or tuple (nested ones flattened, as SCons flattens them; ``UserList`` such as SCons' ``CLVar``
    too) as a tuple of its strings. Anything else, or an item that is not a string, is one
    :class:`TargetIDError` naming ``variable``, what it holds and what it takes, rather than a target
    parsed from a Python ``repr`` (``"{'sm_90'}"``, ``"b'sm_90'"``, ``'None'``). A set is refused too: SCons
    takes no set for a list (``SCons.Util.flatten`` keeps it whole, ``$OFFLOAD_ARCHS`` substitutes its repr)."""
    if isinstance(value, str):
        return value
    if not isinstance(value, (list, tuple, UserList)):
        raise TargetIDError(f"{variable} must be {ACCEPTED_ARCH_LISTS}; it is {_type_words(value)}")
    words: list[str] = []
    pending: list[object] = list(value)
    while pending:
        item = pending.pop(0)
        if isinstance(item, (list, tuple, UserList)):
            pending[:0] = list(item)
        elif isinstance(item, str):
            words.append(item)
        else:
            raise TargetIDError(f"{variable} must be {ACCEPTED_ARCH_LISTS}; it holds {_type_words(item)}")
    return tuple(words)


def _type_words(value: object) -> str:
    """What ``value`` is, in words (no repr: a set or bytes repr reads as a target name gone wrong)."""
    if value is None:
        return "None"
    if isinstance(value, (bytes, bytearray)):
        return "bytes (decode them to a string)"
    if isinstance(value, (set, frozenset)):
        return "a set (SCons takes no set for a list)"
    if isinstance(value, dict):
        return "a dict"
    return f"a value of type {type(value).__name__}"


def parse_offload_archs(
    value: str | Iterable[str], *, llvm_version: int = DEFAULT_LLVM_VERSION
) -> tuple[TargetID, ...]:
    """Parse an ``--offload-arch`` list into canonical, deduplicated IDs sorted as Clang sorts them.

    ``value`` is a comma-separated string or an iterable of such strings; whitespace around items is
    ignored, an empty item is an error (as in Clang). Raises :class:`TargetIDError` for an empty list,
    an invalid item, or a conflicting pair (see :func:`find_conflict`).
    """
    _check_llvm_version(llvm_version)
    if not isinstance(value, str):
        value = list(value)  # an iterator must survive being read twice
    shown = value if isinstance(value, str) else ",".join(map(str, value))
    stripped = [item.strip() for item in _split_items(value)]
    if not any(stripped):
        raise TargetIDError(f"no offload target IDs given in {shown!r}; expected e.g. 'gfx90a,sm_90'")
    if "" in stripped:
        raise TargetIDError(f"empty item in offload arch list {shown!r}; expected comma-separated target IDs")
    ids = sorted({parse_target_id(item, llvm_version=llvm_version) for item in stripped}, key=str)
    conflict = find_conflict(ids)
    if conflict:
        a, b = conflict
        raise TargetIDError(f"conflicting offload target IDs '{a}' and '{b}': {CONFLICT_RULE}")
    return tuple(ids)


def is_compatible(code_object: TargetID, device: TargetID) -> bool:
    """Whether a code object built for ``code_object`` may run on (or be unbundled for) ``device``.

    The code object's features are requirements and the device's are its configuration: processors must
    match exactly and each feature the code object specifies must be specified by the device with the
    same sign; a feature the code object omits is "Any". This is Clang's ``isCodeObjectCompatible``
    (after the exact-match shortcut) and comgr's ``isCompatibleIsaName``. Generic code objects are
    matched only by name here; a runtime's generic fallback is a separate query.
    """
    if _processor_key(code_object) != _processor_key(device):
        return False
    return all(device.feature(name) == on for name, on in code_object.features)



#: What a triple or an arch (a target ID) read from a file may hold for a tool to name files after it: the
#: characters LLVM's triples and target IDs use (``amdgcn-amd-amdhsa``, ``gfx90a:xnack+``, ``sm_90a``), a letter
#: or digit first, and not more than any target name needs (no ``/``, no ``..`` alone, no control character).
_TARGET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+:-]{0,127}")


def is_target_name(value: str) -> bool:
    """Whether ``value`` (a triple or arch from an input file) may be part of a file name (see ``_TARGET_NAME``)."""
    return bool(_TARGET_NAME.fullmatch(value))

#: The one rule for which targets an offload model takes (:attr:`TargetID.kind`): OpenMP every kind, HIP the AMDGPU
#: ones, CUDA the NVPTX ones. The SCons tool, ``offload-compile`` (and through ``offload-compile check --model``,
#: the CMake module) and run-time image selection (a runtime loads the images of its model's kinds) read it.
MODEL_TARGET_KINDS: Mapping[str, frozenset[str]] = {
    OPENMP: frozenset({"host-cpu", "amdgpu", "nvptx"}),
    HIP: frozenset({"amdgpu"}),
    CUDA: frozenset({"nvptx"}),
}


#: The code object version Clang writes for AMDGPU unless ``-mcode-object-version=`` says: 5 up to Clang 21, 6 from
#: Clang 22 (checked with ``.amdhsa_code_object_version`` of 19.1.7 and 22.1.8).
def default_code_object_version(llvm_version: int) -> int:
    return 6 if llvm_version >= 22 else 5


def code_object_version(flags: Iterable[str], llvm_version: int) -> int:
    """The code object version a compile with ``flags`` writes (the last ``-mcode-object-version=``)."""
    chosen = default_code_object_version(llvm_version)
    for flag in flags:
        value = flag[len("-mcode-object-version="):] if flag.startswith("-mcode-object-version=") else None
        if value is not None and value.isdigit():
            chosen = int(value)
    return chosen


def generic_target_problem(target: TargetID, flags: Iterable[str], llvm_version: int) -> str | None:
    """Why a compile with ``flags`` cannot give ``target`` a code object, where it is a generic AMDGPU processor
    (``gfx11-generic``) and the code object version is below 6 (the back end stops with "is only available on code
    object version 6 or better"); None otherwise. The tool does not add the flag itself: version 6 changes every
    code object of the compile, and Clang 19 warns that it is "still in development" (an error under
    ``-Werror``), so it is the user's choice."""
    version = code_object_version(flags, llvm_version)
    if target.kind != "amdgpu" or not target.processor.endswith("-generic") or version >= 6:
        return None
    return (f"{target}: a generic AMDGPU target needs code object version 6, and Clang {llvm_version} writes version"
            f" {version} here: add -mcode-object-version=6 to the compile flags (Clang 19 then warns that version 6"
            " is still in development, which -Werror makes an error)")


def model_targets(model: str, targets: Iterable[TargetID]) -> tuple[TargetID, ...]:
    """The targets of ``targets`` (in their order) that ``model`` compiles for (:data:`MODEL_TARGET_KINDS`)."""
    kinds = MODEL_TARGET_KINDS[model]
    return tuple(tid for tid in targets if tid.kind in kinds)


__all__ = [
    "code_object_version",
    "default_code_object_version",
    "generic_target_problem",
    "MODEL_TARGET_KINDS",
    "model_targets",
    "is_target_name",
    "ACCEPTED_ARCH_LISTS",
    "AMDGPU_PROCESSORS",
    "AMDGPU_TRIPLE",
    "AMDGPUProcessor",
    "HOST_CPU_TRIPLE",
    "NVPTX_ARCHS",
    "NVPTX_ARCH_TABLE",
    "NVPTX_TRIPLE",
    "NVPTXArch",
    "TargetID",
    "amdgpu_processor",
    "find_conflict",
    "generic_processor",
    "is_compatible",
    "known_processors",
    "nvptx_arch",
    "offload_arch_words",
    "parse_offload_archs",
    "parse_target_id",
    "parse_target_id_format",
]
