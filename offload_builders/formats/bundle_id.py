"""Bundle entry IDs (``<kind>-<triple>[-<target-id>]``) exactly as clang-offload-bundler 19 handles them.

clang-offload-bundler rewrites every ``-targets`` string before it writes a bundle ("standardization"):
the triple is rebuilt from its first four ``-``-separated fields, which is where the double dash of
``hip-amdgcn-amd-amdhsa--gfx908`` comes from.  :func:`parse_bundle_entry_id` reproduces that parse, so
``str(parse_bundle_entry_id(s))`` is byte-for-byte the ID Clang 19 writes for ``s``, and
:func:`is_code_object_compatible` reproduces ``isCodeObjectCompatible`` (the unbundling rules).

Where Clang 19 is buggy we decided case by case (the reasons are in the docstrings below):

* a trailing ``-`` (``host-x86_64-pc-linux-gnu-``): Clang 19 matches the empty string against its
  ``OffloadArch`` table (the ``UNUSED`` entry) and writes ``host-x86_64-pc-linux-gnu-host-x86_64-pc-linux-gnu-``.
  We read the trailing dash as an empty target ID instead, so standardization is idempotent: every ID
  Clang writes (``--list`` output included) parses back to itself.  This is the one bundling input
  where our bytes differ from Clang's on purpose.  The same bug gives every standardized ID without
  a target ID (all host IDs) the whole ID as target ID, so such IDs only match an identical ID when
  unbundling; that behaviour we keep, since it decides what unbundling extracts.
* a processor Clang 19 does not know (an alternative name such as ``fiji``, or ``gfx950``) silently
  becomes part of the triple's environment (``hip-amdgcn-amd-amdhsa--fiji-``) and any ``:features``
  after it are dropped.  Such an ID can never match a device, so the strict parse (used for
  ``-targets``) reports it as a :class:`TargetIDError` naming the canonical name; IDs read from a
  file are taken as they are.
* ``gfx9-generic`` and the other generic processors are split by Clang 19 into environment
  ``-gfx9`` and target ID ``generic``; the written bytes are still right, so we accept them and, like
  Clang, match them only exactly.
* AMDGPU target-ID features are validated when bundling (Clang 19 accepts ``gfx908:foo+``), the
  conflict check uses the symmetric documented rule (Clang 19's is order dependent), and duplicates
  are found after standardization (Clang compares the raw strings, then writes the same ID twice).

``llvm_version`` 21 and later select the rewritten parse (fields by position, normalized triple),
checked against clang-offload-bundler 22.

Clang keeps bundle entries and unbundling targets in ``llvm::StringMap``, so its ``--list`` order and
the choice between several compatible entries follow the map's hash order.  :func:`clang_stringmap_order`
emulates that map (xxh3-64 hashing, quadratic probing, growth at 3/4 load) so we agree with Clang
even in those cases.
"""
from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence

from offload_builders.errors import TargetIDError
from offload_builders.formats._record import Record

# typing is imported for type checkers only: it costs the command line ~3 ms of start-up.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Final

#: Offload kinds ``OffloadTargetInfo::isOffloadKindValid`` accepts.
VALID_KINDS: Final[tuple[str, ...]] = ("host", "openmp", "hip", "hipv4")
HOST_KIND: Final = "host"

# --------------------------------------------------------------------------------------------
# clang/lib/Basic/Cuda.cpp ``arch_names[]`` (LLVM 19): the names StringToOffloadArch knows.  The
# empty string is the UNUSED entry, the source of the trailing-dash bug described above.
# --------------------------------------------------------------------------------------------
_SM_19: Final = ("20", "21", "30", "32", "35", "37", "50", "52", "53", "60", "61", "62", "70", "72",
                 "75", "80", "86", "87", "89", "90", "90a")
_GFX_19: Final = ("600", "601", "602", "700", "701", "702", "703", "704", "705", "801", "802", "803",
                  "805", "810", "9-generic", "900", "902", "904", "906", "908", "909", "90a", "90c",
                  "940", "941", "942", "10-1-generic", "1010", "1011", "1012", "1013", "10-3-generic",
                  "1030", "1031", "1032", "1033", "1034", "1035", "1036", "11-generic", "1100", "1101",
                  "1102", "1103", "1150", "1151", "1152", "12-generic", "1200", "1201")
OFFLOAD_ARCH_NAMES_19: Final[frozenset[str]] = frozenset(
    [""] + [f"sm_{s}" for s in _SM_19] + [f"gfx{g}" for g in _GFX_19] + ["amdgcnspirv", "generic"])
#: Names added and removed after LLVM 19, checked with clang-offload-bundler 22.1.8 (which also
#: reads IDs differently; only its table is used here, for 20 and 21 too).
_ADDED_AFTER_19: Final = frozenset({
    "sm_100", "sm_100a", "sm_101", "sm_101a", "sm_103", "sm_103a", "sm_110", "sm_110a", "sm_120",
    "sm_120a", "sm_121", "sm_121a", "gfx950", "gfx9-4-generic", "gfx1153", "gfx1250", "gfx1251"})
_REMOVED_AFTER_19: Final = frozenset({"gfx940", "gfx941"})


def offload_arch_names(llvm_version: int = 19) -> frozenset[str]:
    """The processor names clang-offload-bundler ``llvm_version`` recognizes at the end of an ID."""
    if llvm_version < 19:
        raise ValueError(f"LLVM {llvm_version} is not supported (19 or later)")
    if llvm_version == 19:
        return OFFLOAD_ARCH_NAMES_19
    return (OFFLOAD_ARCH_NAMES_19 | _ADDED_AFTER_19) - _REMOVED_AFTER_19


# --------------------------------------------------------------------------------------------
# llvm::Triple, reduced to what isTripleValid and isCompatibleWith need: the parsed enums.
# --------------------------------------------------------------------------------------------
_ARCH_ALIASES: Final[dict[str, str]] = {
    **dict.fromkeys(("i386", "i486", "i586", "i686", "i786", "i886", "i986"), "x86"),
    **dict.fromkeys(("amd64", "x86_64", "x86_64h"), "x86_64"),
    **dict.fromkeys(("powerpc", "powerpcspe", "ppc", "ppc32"), "ppc"),
    **dict.fromkeys(("powerpcle", "ppcle", "ppc32le"), "ppcle"),
    **dict.fromkeys(("powerpc64", "ppu", "ppc64"), "ppc64"),
    **dict.fromkeys(("powerpc64le", "ppc64le"), "ppc64le"),
    "xscale": "arm", "xscaleeb": "armeb", "aarch64": "aarch64", "aarch64_be": "aarch64_be",
    "aarch64_32": "aarch64_32", "arc": "arc", "arm64": "aarch64", "arm64_32": "aarch64_32",
    "arm64e": "aarch64", "arm64ec": "aarch64", "arm": "arm", "armeb": "armeb", "thumb": "thumb",
    "thumbeb": "thumbeb", "avr": "avr", "m68k": "m68k", "msp430": "msp430",
    **dict.fromkeys(("mips", "mipseb", "mipsallegrex", "mipsisa32r6", "mipsr6"), "mips"),
    **dict.fromkeys(("mipsel", "mipsallegrexel", "mipsisa32r6el", "mipsr6el"), "mipsel"),
    **dict.fromkeys(("mips64", "mips64eb", "mipsn32", "mipsisa64r6", "mips64r6", "mipsn32r6"), "mips64"),
    **dict.fromkeys(("mips64el", "mipsn32el", "mipsisa64r6el", "mips64r6el", "mipsn32r6el"), "mips64el"),
    "r600": "r600", "amdgcn": "amdgcn", "riscv32": "riscv32", "riscv64": "riscv64",
    "hexagon": "hexagon", "s390x": "systemz", "systemz": "systemz", "sparc": "sparc",
    "sparcel": "sparcel", "sparcv9": "sparcv9", "sparc64": "sparcv9", "tce": "tce", "tcele": "tcele",
    "xcore": "xcore", "nvptx": "nvptx", "nvptx64": "nvptx64", "le32": "le32", "le64": "le64",
    "amdil": "amdil", "amdil64": "amdil64", "hsail": "hsail", "hsail64": "hsail64", "spir": "spir",
    "spir64": "spir64", "spirv": "spirv", "spirv1.5": "spirv", "spirv1.6": "spirv",
    **{f"spirv32v1.{i}": "spirv32" for i in range(7)}, "spirv32": "spirv32",
    **{f"spirv64v1.{i}": "spirv64" for i in range(7)}, "spirv64": "spirv64",
    "lanai": "lanai", "renderscript32": "renderscript32", "renderscript64": "renderscript64",
    "shave": "shave", "ve": "ve", "wasm32": "wasm32", "wasm64": "wasm64", "csky": "csky",
    "loongarch32": "loongarch32", "loongarch64": "loongarch64", "dxil": "dxil",
    **{f"dxilv1.{i}": "dxil" for i in range(9)}, "xtensa": "xtensa",
}
_VENDORS: Final = {"apple": "apple", "pc": "pc", "scei": "scei", "sie": "scei", "fsl": "fsl",
                   "ibm": "ibm", "img": "img", "mti": "mti", "nvidia": "nvidia", "csr": "csr",
                   "amd": "amd", "mesa": "mesa", "suse": "suse", "oe": "oe"}
#: parseOS matches prefixes, in this order (so a version suffix such as ``macosx10.15`` is fine).
_OS_PREFIXES: Final = (
    ("darwin", "darwin"), ("dragonfly", "dragonfly"), ("freebsd", "freebsd"), ("fuchsia", "fuchsia"),
    ("ios", "ios"), ("kfreebsd", "kfreebsd"), ("linux", "linux"), ("lv2", "lv2"), ("macos", "macosx"),
    ("netbsd", "netbsd"), ("openbsd", "openbsd"), ("solaris", "solaris"), ("uefi", "uefi"),
    ("win32", "win32"), ("windows", "win32"), ("zos", "zos"), ("haiku", "haiku"), ("rtems", "rtems"),
    ("nacl", "nacl"), ("aix", "aix"), ("cuda", "cuda"), ("nvcl", "nvcl"), ("amdhsa", "amdhsa"),
    ("ps4", "ps4"), ("ps5", "ps5"), ("elfiamcu", "elfiamcu"), ("tvos", "tvos"),
    ("watchos", "watchos"), ("bridgeos", "bridgeos"), ("driverkit", "driverkit"), ("xros", "xros"),
    ("visionos", "xros"), ("mesa3d", "mesa3d"), ("amdpal", "amdpal"), ("hermit", "hermit"),
    ("hurd", "hurd"), ("wasi", "wasi"), ("emscripten", "emscripten"), ("shadermodel", "shadermodel"),
    ("liteos", "liteos"), ("serenity", "serenity"), ("vulkan", "vulkan"))
_ENV_PREFIXES: Final = (
    "eabihf", "eabi", "gnuabin32", "gnuabi64", "gnueabihft64", "gnueabihf", "gnueabit64", "gnueabi",
    "gnuf32", "gnuf64", "gnusf", "gnux32", "gnu_ilp32", "code16", "gnut64", "gnu", "android",
    "musleabihf", "musleabi", "muslx32", "musl", "msvc", "itanium", "cygnus", "coreclr", "simulator",
    "macabi", "pixel", "vertex", "geometry", "hull", "domain", "compute", "library", "raygeneration",
    "intersection", "anyhit", "closesthit", "miss", "callable", "mesh", "amplification", "opencl",
    "ohos", "pauthtest")
_FORMAT_SUFFIXES: Final = ("xcoff", "coff", "elf", "goff", "macho", "wasm", "spirv")
#: The words of LLVM's triple grammar (vendors, OS and environment names), and "unknown".  None is a
#: processor name of any LLVM release (test_bundle_id checks the tables), so an ID whose last field is
#: one of them names no processor: see ``_known_processor``.
_TRIPLE_WORDS: Final = frozenset({*_VENDORS, *(prefix for prefix, _ in _OS_PREFIXES), *_ENV_PREFIXES, "unknown"})
_DARWIN_OSES: Final = frozenset({"darwin", "ios", "macosx", "tvos", "watchos", "bridgeos",
                                 "driverkit", "xros"})


def _parse_arch(name: str) -> str:
    arch = _ARCH_ALIASES.get(name)
    if arch is not None:
        return arch
    if name.startswith("kalimba"):
        return "kalimba"
    if name.startswith("bpf"):
        return {"bpf": "bpfel", "bpf_le": "bpfel", "bpfel": "bpfel", "bpf_be": "bpfeb",
                "bpfeb": "bpfeb"}.get(name, "")
    # ARM sub-architectures (armv7a, thumbv8m.main, aarch64_be...) keep their name as sub-arch.
    if name.startswith(("arm", "thumb", "aarch64")) and len(name) > 3:
        big = name.endswith("eb") or name.startswith("aarch64_be")
        if name.startswith("aarch64") or name.startswith("arm64"):
            return "aarch64_be" if big else "aarch64"
        if name.startswith("thumb"):
            return "thumbeb" if big else "thumb"
        return "armeb" if big else "arm"
    return ""


def _sub_arch(name: str) -> str:
    """``Triple::parseSubArch``, reduced to a comparable string (ARM versions kept as written)."""
    if name.startswith("mips") and name.endswith(("r6el", "r6")):
        return "r6"
    if name in ("powerpcspe", "arm64e", "arm64ec"):
        return name
    if name.startswith(("spirv", "dxil")):
        version = name.rpartition("v")[2]
        return f"v{version}" if version.startswith("1.") else ""
    if name.startswith(("arm", "thumb")) and not name.startswith("arm64"):
        return name.removeprefix("arm").removeprefix("thumb").removesuffix("eb")
    if name.startswith("kalimba") and name[-1:] in ("3", "4", "5"):
        return name[-1]
    return ""


def _parse_prefix(name: str, table: Iterable[tuple[str, str]]) -> str:
    for prefix, value in table:
        if name.startswith(prefix):
            return value
    return ""


class TripleKey(Record):
    """The parsed enums of an ``llvm::Triple``: what ``Triple::operator==`` compares."""

    __slots__ = ("arch", "sub_arch", "vendor", "os", "environment", "object_format")
    arch: str
    sub_arch: str
    vendor: str
    os: str
    environment: str
    object_format: str

    def __init__(self, arch: str, sub_arch: str, vendor: str, os: str, environment: str, object_format: str) -> None:
        self._init(arch, sub_arch, vendor, os, environment, object_format)

    @classmethod
    def parse(cls, triple: str) -> TripleKey:
        arch_name, vendor, os_name, env = split_triple(triple)
        arch = _parse_arch(arch_name)
        os_type = _parse_prefix(os_name, _OS_PREFIXES)
        env_type = next((p for p in _ENV_PREFIXES if env.startswith(p)), "")
        fmt = next((f for f in _FORMAT_SUFFIXES if env.endswith(f)), "")
        if not fmt:
            fmt = cls._default_format(arch, os_type)
        return cls(arch, _sub_arch(arch_name), _VENDORS.get(vendor, ""), os_type, env_type, fmt)

    @staticmethod
    def _default_format(arch: str, os_type: str) -> str:
        """Triple::getDefaultFormat, for the architectures a bundle can name."""
        if arch.startswith("spirv"):
            return "spirv"
        if arch.startswith("wasm"):
            return "wasm"
        if arch == "dxil":
            return "dxcontainer"
        if os_type in _DARWIN_OSES:
            return "macho"
        if os_type == "win32":
            return "coff"
        if os_type == "aix":
            return "xcoff"
        if os_type == "zos":
            return "goff"
        return "elf"

    def is_compatible_with(self, other: TripleKey) -> bool:
        """``Triple::isCompatibleWith``: equal enums, with ARM/Thumb and Apple leniencies."""
        arm_pairs = {("thumb", "arm"), ("arm", "thumb"), ("thumbeb", "armeb"), ("armeb", "thumbeb")}
        if (self.arch, other.arch) in arm_pairs:
            same = (self.sub_arch == other.sub_arch and self.vendor == other.vendor
                    and self.os == other.os)
            if self.vendor == "apple":
                return same
            return (same and self.environment == other.environment
                    and self.object_format == other.object_format)
        if self.vendor == "apple":
            return (self.arch == other.arch and self.sub_arch == other.sub_arch
                    and self.vendor == other.vendor and self.os == other.os)
        return self == other


def split_triple(triple: str) -> tuple[str, str, str, str]:
    """Split like ``Triple::get{Arch,Vendor,OS,Environment}Name``: the environment keeps any further dashes."""
    arch, _, rest = triple.partition("-")
    vendor, _, rest = rest.partition("-")
    os_name, _, env = rest.partition("-")
    return arch, vendor, os_name, env


# --------------------------------------------------------------------------------------------
# Bundle entry IDs.
# --------------------------------------------------------------------------------------------
class BundleEntryID(Record):
    """One bundle entry ID as ``OffloadTargetInfo`` holds it: ``str()`` is the standardized text.

    ``triple`` always has exactly four ``-``-separated fields (the environment may be empty, and it
    keeps any further dashes); ``target_id`` is empty when the ID names no processor.
    """

    __slots__ = ("kind", "triple", "target_id")
    kind: str
    triple: str
    target_id: str

    def __init__(self, kind: str, triple: str, target_id: str = "") -> None:
        self._init(kind, triple, target_id)

    def __str__(self) -> str:
        return f"{self.kind}-{self.triple}-{self.target_id}"

    @property
    def is_host(self) -> bool:
        return self.kind == HOST_KIND

    @property
    def kind_triple(self) -> str:
        """``<kind>-<triple>``: the group the target-ID conflict check runs over."""
        return f"{self.kind}-{self.triple}"

    @property
    def triple_key(self) -> TripleKey:
        return TripleKey.parse(self.triple)

    @property
    def is_kind_valid(self) -> bool:
        return self.kind in VALID_KINDS

    @property
    def is_triple_valid(self) -> bool:
        """``isTripleValid``: the architecture is one LLVM knows."""
        return bool(self.triple_key.arch)

    @property
    def is_amdgpu(self) -> bool:
        return self.triple_key.arch in ("amdgcn", "r600")


def _standard_triple(text: str) -> str:
    """``Triple(arch, vendor, os, env)`` rebuilt from ``Triple(text)``'s names: always four fields."""
    return "-".join(split_triple(text))


def parse_bundle_entry_id(text: str, *, llvm_version: int = 19, strict: bool = True,
                          check_features: bool = True) -> BundleEntryID:
    """Parse ``text`` the way the LLVM 19 ``OffloadTargetInfo`` constructor does (``llvm_version``
    21 and later: the rewritten constructor, see :func:`_parse_llvm21`).

    ``strict`` (for user-supplied ``-targets``) also applies the tool's validation, with Clang's
    messages for an unknown kind or architecture, and rejects the IDs Clang 19 would silently
    misparse (see the module docstring); ``check_features`` also validates an AMDGPU target ID's
    features against the processor (wanted when writing a bundle, not when asking for an entry of an
    existing one).  ``strict=False`` (for IDs read from a bundle) only parses.
    """
    if llvm_version >= 21:
        return _parse_llvm21(text, llvm_version=llvm_version, strict=strict, check_features=check_features)
    head, colon, _features = text.partition(":")
    triple_or_gpu, dash, last = head.rpartition("-")
    arch_names = offload_arch_names(llvm_version)
    if dash and last == "":
        # Clang 19 matches "" against the UNUSED OffloadArch and doubles the whole ID; we read a
        # trailing dash as "no target ID" so that standardized IDs parse back to themselves.
        kind, _, triple = triple_or_gpu.partition("-")
        entry = BundleEntryID(kind, _standard_triple(triple), text[len(head):])
    elif dash and last in arch_names:
        # Clang 19 cuts the target ID at the *first* occurrence of the processor name, which differs
        # from its real position only when the name also appears inside the triple (never in a valid
        # one); we cut at its position, so every standardized ID parses back to itself.
        kind, _, triple = triple_or_gpu.partition("-")
        entry = BundleEntryID(kind, _standard_triple(triple), text[len(triple_or_gpu) + 1:])
    else:
        kind, _, triple = head.partition("-")
        entry = BundleEntryID(kind, _standard_triple(triple), "")
    if strict:
        _validate(text, entry, last if dash else "", bool(colon), llvm_version, check_features)
    return entry


#: LLVM 21+ (PR #122629) wants exactly ``<kind>-<arch>-<vendor>-<os>-<env>[-<target id>]``.
_FORMAT_21: Final = ("Targets need to follow the format '<offload kind>-<target triple>', where '<target triple>' "
                     "follows the format '<kind>-<arch>-<vendor>-<os>-<env>[-<target id>[:target features]]'.")


def _parse_llvm21(text: str, *, llvm_version: int, strict: bool, check_features: bool) -> BundleEntryID:
    """The ``OffloadTargetInfo`` of LLVM 21 and later: fields by position, the triple normalized.

    Checked against clang-offload-bundler 22.1.8: empty fields become ``unknown``, an AMDHSA triple
    keeps three fields and an empty environment (``amdgcn-amd-amdhsa-``), and a last field that is
    not a known processor is dropped.  Normalization is reproduced for well-formed triples only
    (LLVM's ``Triple::normalize`` also reorders misplaced fields).
    """
    fields = text.split("-", 5)
    if len(fields) not in (5, 6):
        if strict:
            raise TargetIDError(_FORMAT_21)
        return parse_bundle_entry_id(text, llvm_version=19, strict=False)
    kind, *triple_fields = fields[:5]
    candidate = fields[5] if len(fields) == 6 else ""
    target_id = candidate if candidate and candidate.split(":", 1)[0] in offload_arch_names(llvm_version) else ""
    named = [field or "unknown" for field in triple_fields]
    if _parse_prefix(triple_fields[2], _OS_PREFIXES) == "amdhsa":
        triple = "-".join(named[:3]) + "-"
    else:
        triple = "-".join(named)
    entry = BundleEntryID(kind, triple, target_id)
    if strict:
        # a processor in the environment field, or an unknown last field, is dropped: report it
        last = candidate.split(":", 1)[0] or triple_fields[3]
        _validate(text, entry, last, ":" in candidate, llvm_version, check_features)
    return entry


def _validate(text: str, entry: BundleEntryID, last: str, has_features: bool, llvm_version: int,
              check_features: bool) -> None:
    """The checks clang-offload-bundler's ``main`` runs, plus the misparses Clang 19 lets through."""
    problems = []
    if not entry.is_kind_valid:
        problems.append(f"unknown offloading kind '{entry.kind}'")
    if not entry.is_triple_valid:
        problems.append(f"unknown target triple '{entry.triple}'")
    if problems:
        raise TargetIDError(f"invalid target '{text}', " + ", ".join(problems))
    if entry.target_id.startswith(":"):
        raise TargetIDError(f"invalid target '{text}': a target ID needs a processor before ':'")
    if not entry.target_id and last:
        canonical = _known_processor(last, llvm_version)
        if canonical is not None or has_features:
            hint = f" (use '{canonical}')" if canonical and canonical != last else ""
            raise TargetIDError(
                f"invalid target '{text}': clang-offload-bundler {llvm_version} does not recognize the "
                f"processor '{last}'{hint}; it would become part of the triple and never match a device")
    if entry.target_id and entry.is_amdgpu and check_features and not _is_generic_misparse(entry):
        from offload_builders import targets

        try:
            targets.parse_target_id(entry.target_id, llvm_version=llvm_version)
        except TargetIDError as exc:
            raise TargetIDError(f"invalid target '{text}': {exc}") from None
    elif entry.target_id:
        _format_only(entry.target_id, text)


def _is_generic_misparse(entry: BundleEntryID) -> bool:
    """Clang 19 splits ``gfx9-generic`` into environment ``-gfx9`` and target ID ``generic``."""
    return entry.target_id.split(":", 1)[0] == "generic"


def _known_processor(name: str, llvm_version: int) -> str | None:
    """The canonical name if ``name`` is a GPU processor of any LLVM release (``fiji`` -> ``gfx803``)."""
    if name in _TRIPLE_WORDS:
        return None  # the usual case, a triple's last field: decided without loading the tables
    from offload_builders import targets

    if (amd := targets.amdgpu_processor(name)) is not None:
        return amd.name
    if (nv := targets.nvptx_arch(name)) is not None:
        return nv.name
    if name.startswith(("gfx", "sm_")) and name[3:4].isalnum():
        return name
    return None


def _split_target_id(target_id: str) -> tuple[str, dict[str, bool]] | None:
    """``targets.parse_target_id_format`` for the IDs it accepts, None for those it rejects (it is then
    called to word the error): spares loading the processor tables (and ``dataclasses``) on the
    command line's start-up path.  test_bundle_id checks that the two agree."""
    processor, *components = target_id.split(":")
    if not processor or any(ch.isspace() for ch in target_id):
        return None
    features: dict[str, bool] = {}
    for component in components:
        name, sign = component[:-1], component[-1:]
        if not name or sign not in ("+", "-") or name in features:
            return None
        features[name] = sign == "+"
    return processor, features


def _distinct_processors(a: BundleEntryID, b: BundleEntryID) -> bool:
    """Whether two target IDs name different processors without any table lookup being able to make
    them equal: two different ``gfx*``/``sm_*`` spellings (those are always canonical names; no
    alternative name starts so, which test_bundle_id checks against the tables)."""
    first, second = a.target_id.split(":", 1)[0], b.target_id.split(":", 1)[0]
    return first != second and first.startswith(("gfx", "sm_")) and second.startswith(("gfx", "sm_"))


def _format_only(target_id: str, text: str) -> tuple[str, dict[str, bool]]:
    split = _split_target_id(target_id)
    if split is not None:
        return split
    from offload_builders import targets

    try:
        return targets.parse_target_id_format(target_id)
    except TargetIDError as exc:
        raise TargetIDError(f"invalid target '{text}': {exc}") from None


def standardize(text: str, *, llvm_version: int = 19) -> str:
    """The ID clang-offload-bundler writes for the ``-targets`` entry ``text`` (strictly validated)."""
    return str(parse_bundle_entry_id(text, llvm_version=llvm_version))


def validate_targets(texts: Sequence[str], *, bundling: bool, llvm_version: int = 19) -> list[BundleEntryID]:
    """Check a ``-targets`` list as clang-offload-bundler's ``main`` does and standardize it.

    Errors carry Clang's messages: an invalid kind or triple, "Duplicate targets are not allowed"
    (checked after standardization: Clang compares the raw strings and then writes two identical
    IDs for ``...amdhsa-gfx908`` and ``...amdhsa--gfx908``), "Cannot bundle inputs with conflicting
    targets", and the host count ("expecting exactly one host target but got N"; a bundle of only
    hip/hipv4 entries needs no host, and unbundling accepts at most one).
    """
    if not texts:
        raise TargetIDError("for the --targets option: must be specified at least once!")
    ids: list[BundleEntryID] = []
    seen: set[str] = set()
    for text in texts:
        entry = parse_bundle_entry_id(text, llvm_version=llvm_version, check_features=bundling)
        if str(entry) in seen:
            raise TargetIDError("Duplicate targets are not allowed")
        seen.add(str(entry))
        ids.append(entry)
    conflict = find_target_conflict(ids)  # Clang runs it when unbundling too, with the same message
    if conflict is not None:
        raise TargetIDError(f"Cannot bundle inputs with conflicting targets: '{conflict[0]}' and "
                            f"'{conflict[1]}'")
    hosts = sum(entry.is_host for entry in ids)
    hip_only = all(entry.kind in ("hip", "hipv4") for entry in ids)
    if (not bundling and hosts > 1) or (bundling and hosts != 1 and not hip_only):
        raise TargetIDError(f"expecting exactly one host target but got {hosts}")
    return ids


def clang19_target_id_field(text: str) -> str:
    """The literal ``OffloadTargetInfo::TargetID`` Clang 19 derives from ``text``, bugs included.

    Only used where Clang looks at that string itself (the extension of archive member names).
    """
    head = text.partition(":")[0]
    prefix, dash, last = head.rpartition("-")
    if not dash or last == "":
        return text  # the "" OffloadArch: the whole ID
    return text[text.find(last):] if last in OFFLOAD_ARCH_NAMES_19 else ""


# --------------------------------------------------------------------------------------------
# Compatibility (clang/lib/Driver/OffloadBundler.cpp isCodeObjectCompatible).
# --------------------------------------------------------------------------------------------
def is_offload_kind_compatible(code_object_kind: str, target_kind: str, *,
                               hip_openmp_compatible: bool = False) -> bool:
    """``OffloadTargetInfo::isOffloadKindCompatible``: equal, hip<->hipv4, and optionally hip*<->openmp."""
    if code_object_kind == target_kind or {code_object_kind, target_kind} == {"hip", "hipv4"}:
        return True
    if hip_openmp_compatible:
        return ((code_object_kind.lower().startswith("hip") and target_kind == "openmp")
                or (code_object_kind == "openmp" and target_kind.lower().startswith("hip")))
    return False


def _processor_and_features(entry: BundleEntryID, llvm_version: int):  # -> targets.TargetID | None
    """``clang::parseTargetID(Triple, TargetID)``: None where Clang returns std::nullopt."""
    from offload_builders import targets

    if not entry.target_id:
        return None  # an empty processor never canonicalizes
    try:
        if entry.is_amdgpu:
            return targets.parse_target_id(entry.target_id, llvm_version=llvm_version)
        processor, features = targets.parse_target_id_format(entry.target_id)
    except (TargetIDError, ValueError):
        return None
    if features or not processor:  # non-AMDGPU targets have no target-ID features
        return None
    return targets.TargetID(processor, ())


def is_code_object_compatible(code_object: BundleEntryID, requested: BundleEntryID, *,
                              hip_openmp_compatible: bool = False, llvm_version: int = 19) -> bool:
    """May the bundle entry ``code_object`` be extracted for the ``-targets`` entry ``requested``?

    Clang's steps in order: an exact match; otherwise compatible kinds and triples, the same
    canonical processor, and every feature the code object specifies present in the request with the
    same sign (a feature the code object leaves out means Any).  The request is a device
    configuration, the code object's features are requirements.  An ID without a target ID (every
    host ID) matches only the identical ID, as in Clang 19.
    """
    if llvm_version < 21 and (not code_object.target_id or not requested.target_id):
        # Clang 19 gives such IDs (standardized, they end in '-') the whole ID as target ID (the ""
        # OffloadArch bug), so they only ever match an identical ID.
        return str(code_object) == str(requested)
    key_co, key_req = code_object.triple_key, requested.triple_key
    if not key_co.is_compatible_with(key_req):
        return False
    if code_object.kind == requested.kind and code_object.target_id == requested.target_id:
        return True
    if not is_offload_kind_compatible(code_object.kind, requested.kind,
                                      hip_openmp_compatible=hip_openmp_compatible):
        return False
    if _distinct_processors(code_object, requested):
        return False  # what the tables would say (different canonical processors), without loading them
    co = _processor_and_features(code_object, llvm_version)
    req = _processor_and_features(requested, llvm_version)
    if co is None or req is None or co.processor != req.processor:
        return False
    from offload_builders import targets

    return targets.is_compatible(co, req)


def find_target_conflict(ids: Sequence[BundleEntryID]) -> tuple[BundleEntryID, BundleEntryID] | None:
    """Two IDs of one ``<kind>-<triple>`` whose target IDs break the "a feature is given for all or
    none" rule, or None.  Uses the symmetric rule from the documentation (Clang 19's check depends on
    the sort order and misses ``gfx908:sramecc+:xnack+`` with ``gfx908:xnack+``)."""
    groups: dict[str, list[BundleEntryID]] = {}
    for entry in ids:
        if entry.target_id:
            groups.setdefault(entry.kind_triple, []).append(entry)
    for members in groups.values():
        if len(members) < 2:
            continue  # nothing to conflict with (and no need to load the target-ID tables)
        from offload_builders import targets

        parsed = {}
        for entry in sorted(members, key=lambda e: e.target_id):
            processor, features = _format_only(entry.target_id, str(entry))
            parsed[targets.TargetID(processor, tuple(sorted(features.items())))] = entry
        conflict = targets.find_conflict(list(parsed))
        if conflict is not None:
            first, second = sorted((parsed[conflict[0]], parsed[conflict[1]]), key=lambda e: e.target_id)
            return first, second
    return None


# --------------------------------------------------------------------------------------------
# llvm::StringMap iteration order (LLVM 19: xxh3_64bits truncated to 32 bits, 16 initial buckets).
# --------------------------------------------------------------------------------------------
_M64: Final = (1 << 64) - 1
_P32_1, _P32_2, _P32_3 = 0x9E3779B1, 0x85EBCA77, 0xC2B2AE3D
_P64_1, _P64_2, _P64_3 = 0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9
_P64_4, _P64_5 = 0x85EBCA77C2B2AE63, 0x27D4EB2F165667C5
_PMX1, _PMX2 = 0x165667919E3779F9, 0x9FB21C651E98DF25
_SECRET: Final = bytes.fromhex(
    "b8fe6c3923a44bbe7c01812cf721ad1cded46de9839097db7240a4a4b7b3671fcb79e64eccc0e578825ad07dccff7221"
    "b8084674f743248ee03590e6813a264c3c2852bb91c300cb88d0658b1b532ea371644897a20df94e3819ef46a9deacd8"
    "a8fa763fe39c343ff9dcbbc7c70b4f1d8a51e04bcdb45931c89f7ec9d9787364eac5ac8334d3ebc3c581a0fffa1363eb"
    "170ddd51b7f0da49d316552629d4689e2b16be587d47a1fc8ff8b8d17ad031ce45cb3a8f95160428afd7fbcabb4b407e")
_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")


def _r64(b: bytes, i: int) -> int:
    return _U64.unpack_from(b, i)[0]


def _r32(b: bytes, i: int) -> int:
    return _U32.unpack_from(b, i)[0]


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & _M64


def _fold(a: int, b: int) -> int:
    p = a * b
    return (p & _M64) ^ (p >> 64)


def _avalanche(h: int) -> int:
    h ^= h >> 37
    h = (h * _PMX1) & _M64
    return h ^ (h >> 32)


def _xxh64_avalanche(h: int) -> int:
    h ^= h >> 33
    h = (h * _P64_2) & _M64
    h ^= h >> 29
    h = (h * _P64_3) & _M64
    return h ^ (h >> 32)


def _mix16(d: bytes, i: int, s: int) -> int:
    return _fold(_r64(d, i) ^ _r64(_SECRET, s), _r64(d, i + 8) ^ _r64(_SECRET, s + 8))


def xxh3_64(data: bytes) -> int:
    """XXH3-64 with seed 0 and the default secret (``llvm::xxh3_64bits``)."""
    n = len(data)
    if n == 0:
        return _xxh64_avalanche(_r64(_SECRET, 56) ^ _r64(_SECRET, 64))
    if n <= 3:
        combined = (data[0] << 16) | (data[n >> 1] << 24) | data[n - 1] | (n << 8)
        return _xxh64_avalanche(combined ^ (_r32(_SECRET, 0) ^ _r32(_SECRET, 4)))
    if n <= 8:
        keyed = ((_r32(data, n - 4) + (_r32(data, 0) << 32)) ^ (_r64(_SECRET, 8) ^ _r64(_SECRET, 16)))
        h = keyed ^ _rotl(keyed, 49) ^ _rotl(keyed, 24)
        h = (h * _PMX2) & _M64
        h ^= (h >> 35) + n
        h = (h * _PMX2) & _M64
        return h ^ (h >> 28)
    if n <= 16:
        lo = _r64(data, 0) ^ (_r64(_SECRET, 24) ^ _r64(_SECRET, 32))
        hi = _r64(data, n - 8) ^ (_r64(_SECRET, 40) ^ _r64(_SECRET, 48))
        swapped = int.from_bytes(lo.to_bytes(8, "little"), "big")
        return _avalanche((n + swapped + hi + _fold(lo, hi)) & _M64)
    if n <= 128:
        acc = n * _P64_1
        if n > 32:
            if n > 64:
                if n > 96:
                    acc += _mix16(data, 48, 96) + _mix16(data, n - 64, 112)
                acc += _mix16(data, 32, 64) + _mix16(data, n - 48, 80)
            acc += _mix16(data, 16, 32) + _mix16(data, n - 32, 48)
        acc += _mix16(data, 0, 0) + _mix16(data, n - 16, 16)
        return _avalanche(acc & _M64)
    if n <= 240:
        acc = n * _P64_1
        for i in range(8):
            acc += _mix16(data, 16 * i, 16 * i)
        acc = _avalanche(acc & _M64)
        for i in range(8, n // 16):
            acc += _mix16(data, 16 * i, 16 * (i - 8) + 3)
        acc += _mix16(data, n - 16, 136 - 17)
        return _avalanche(acc & _M64)
    return _xxh3_long(data)


def _xxh3_long(data: bytes) -> int:
    acc = [_P32_3, _P64_1, _P64_2, _P64_3, _P64_4, _P32_2, _P64_5, _P32_1]

    def stripe(at: int, s: int) -> None:
        for i in range(8):
            value = _r64(data, at + 8 * i)
            key = value ^ _r64(_SECRET, s + 8 * i)
            acc[i ^ 1] = (acc[i ^ 1] + value) & _M64
            acc[i] = (acc[i] + (key & 0xFFFFFFFF) * (key >> 32)) & _M64

    n = len(data)
    stripes_per_block = (len(_SECRET) - 64) // 8
    block = 64 * stripes_per_block
    blocks = (n - 1) // block
    for b in range(blocks):
        for s in range(stripes_per_block):
            stripe(b * block + 64 * s, 8 * s)
        for i in range(8):
            a = acc[i]
            a ^= a >> 47
            a ^= _r64(_SECRET, len(_SECRET) - 64 + 8 * i)
            acc[i] = (a * _P32_1) & _M64
    for s in range(((n - 1) - block * blocks) // 64):
        stripe(blocks * block + 64 * s, 8 * s)
    stripe(n - 64, len(_SECRET) - 64 - 7)
    result = n * _P64_1
    for i in range(4):
        result += _fold(acc[2 * i] ^ _r64(_SECRET, 11 + 16 * i), acc[2 * i + 1] ^ _r64(_SECRET, 11 + 16 * i + 8))
    return _avalanche(result & _M64)


def clang_stringmap_order(keys: Iterable[str]) -> list[str]:
    """The order an ``llvm::StringMap`` filled with ``keys`` (in this order) iterates in.

    A repeated key keeps its first slot, as ``Map[Key] = Value`` does.
    """
    buckets: list[str | None] = [None] * 16
    hashes: list[int] = [0] * 16
    count = 0
    for key in keys:
        full = xxh3_64(key.encode("utf-8", "surrogateescape")) & 0xFFFFFFFF
        size = len(buckets)
        slot, probe = full & (size - 1), 1
        while buckets[slot] is not None and buckets[slot] != key:
            slot = (slot + probe) & (size - 1)
            probe += 1
        if buckets[slot] == key:
            continue
        buckets[slot], hashes[slot] = key, full
        count += 1
        if count * 4 > size * 3:
            new_size = size * 2
            new_buckets: list[str | None] = [None] * new_size
            new_hashes = [0] * new_size
            for old, item in enumerate(buckets):
                if item is None:
                    continue
                slot, probe = hashes[old] & (new_size - 1), 1
                while new_buckets[slot] is not None:
                    slot = (slot + probe) & (new_size - 1)
                    probe += 1
                new_buckets[slot], new_hashes[slot] = item, hashes[old]
            buckets, hashes = new_buckets, new_hashes
    return [key for key in buckets if key is not None]
