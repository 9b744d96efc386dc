"""Target IDs: our parser, conflict rule and compatibility check against the real Clang 19 and 22 tools.

The differential tests ask the driver what it would do (``clang++ -### --offload-arch=...``; no compile
runs) and read the canonical IDs back from the bundler ``-targets=`` argument (HIP) or the device
``-target-cpu`` (CUDA). All driver and bundler calls run once, concurrently, in module fixtures.
"""
from __future__ import annotations

import re
import subprocess
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import permutations, product
from pathlib import Path

import pytest

from offload_builders.errors import OffloadError, TargetIDError
from offload_builders.targets import (
    AMDGPU_PROCESSORS,
    AMDGPU_TRIPLE,
    HOST_CPU_TRIPLE,
    NVPTX_ARCH_TABLE,
    NVPTX_ARCHS,
    NVPTX_TRIPLE,
    AMDGPUProcessor,
    TargetID,
    amdgpu_processor,
    find_conflict,
    generic_processor,
    is_compatible,
    known_processors,
    parse_offload_archs,
    parse_target_id,
    parse_target_id_format,
)

WORKERS = 4
LLVM_VERSIONS = (19, 22)


# --------------------------------------------------------------------------------------------------
# Driving the real tools


@dataclass(frozen=True)
class DriverResult:
    """What ``clang++ -###`` decided for one ``--offload-arch`` value."""

    ok: bool
    ids: tuple[str, ...]  # canonical device IDs in the driver's order (HIP) or sorted (CUDA)
    output: str


def _language(archs: str) -> str:
    return "cuda" if all(a.startswith("sm_") for a in archs.split(",")) else "hip"


def run_driver(clang: Path, archs: str) -> DriverResult:
    """Ask the driver to plan a compile for ``archs`` and read back the device IDs it would build."""
    lang = _language(archs)
    gpu_flags = (["-nogpulib", "-nogpuinc"] if lang == "hip"
                 else ["-nocudalib", "-nocudainc", "--no-cuda-version-check"])
    cmd = [str(clang), "-###", "-x", lang, f"--offload-arch={archs}", *gpu_flags, "-c", "/dev/null",
           "-o", "/dev/null"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    output = proc.stdout + proc.stderr
    ok = proc.returncode == 0 and "error:" not in output
    if lang == "hip":
        match = re.search(r'"-targets=([^"]*)"', output)
        entries = match.group(1).split(",") if match else []
        ids = tuple(e.split("--", 1)[1] for e in entries if not e.startswith("host-"))
    else:
        ids = tuple(sorted(set(re.findall(r'"-target-cpu" "(sm_[^"]*)"', output))))
    return DriverResult(ok, ids if ok else (), output)


def prefetch(jobs: Iterable[tuple[object, Callable[[], object]]]) -> dict[object, object]:
    """Run independent tool calls concurrently; the suite stays fast on two cores."""
    jobs = list(jobs)
    with ThreadPoolExecutor(WORKERS) as pool:
        futures = {key: pool.submit(fn) for key, fn in jobs}
    return {key: future.result() for key, future in futures.items()}


def ours(text: str, llvm_version: int) -> str | None:
    """Our canonical spelling, or None where we reject the ID."""
    try:
        return str(parse_target_id(text, llvm_version=llvm_version))
    except TargetIDError:
        return None


def parse_offload_archs_strs(text: str, version: int) -> tuple[str, ...]:
    return tuple(str(t) for t in parse_offload_archs(text, llvm_version=version))


def ours_list(archs: str, llvm_version: int) -> tuple[str, ...] | None:
    try:
        return tuple(map(str, parse_offload_archs(archs, llvm_version=llvm_version)))
    except TargetIDError:
        return None


# --------------------------------------------------------------------------------------------------
# Cases compared with the drivers

#: Single IDs compared with Clang 19: acceptance and canonical spelling must agree.
DIFF_19 = (
    # valid: reordering, alternative names, every feature shape, generics, NVPTX
    "gfx90a:xnack+:sramecc-", "carrizo:xnack+", "polaris10", "hainan", "fiji", "tongapro", "stoney:xnack-",
    "gfx908", "gfx906:xnack-:sramecc+", "gfx942:sramecc-", "gfx940:sramecc+", "gfx90c:xnack+", "gfx1030",
    "gfx1036", "gfx1152", "gfx1201", "gfx9-generic:xnack+", "gfx10-1-generic:xnack-", "gfx10-3-generic",
    "gfx11-generic", "gfx12-generic", "sm_20", "sm_35", "sm_70", "sm_89", "sm_90a",
    # invalid
    "gfx900:sramecc+", "gfx90a:xnack", "gfx90a:xnack+:xnack-", "gfx1030:xnack+", "gfx10-3-generic:xnack+",
    "fiji:xnack+", "gfx950", "gfx1153", "gfx9-4-generic", "gfx1250", "GFX90A", "gfx90a::xnack+", "gfx90a:+",
    "gfx90a:Xnack+", "gfx90a:tgsplit+", "r600", "generic", "sm_100", "sm_120a", "compute_90",
)

#: Single IDs compared with Clang 22: later processors, removals, and unchanged rules.
DIFF_22 = (
    "gfx950", "gfx950:xnack+:sramecc-", "gfx1153", "gfx9-4-generic:sramecc-", "gfx9-4-generic:xnack+",
    "gfx1250", "gfx1251", "gfx940", "gfx941:xnack+", "gfx942:xnack-", "gfx1153:xnack+", "gfx1030:xnack+",
    "carrizo:xnack+", "sm_88", "sm_100a", "sm_101", "sm_103a", "sm_110", "sm_120", "sm_121a", "sm_100f",
)

#: Where we differ from Clang on purpose; Clang accepts each of these, we reject it.
DELIBERATE_DIVERGENCES = {
    "gfx90a:": "empty trailing component (Clang drops it silently)",
    "gfx90a:xnack+:": "empty trailing component (Clang drops it silently)",
    "amdgcnspirv": "SPIR-V is not a processor this package compiles for",
}

#: Lists whose conflict/dedup/sort behaviour Clang 19 and we agree on.
LISTS_19 = (
    "gfx908,gfx908:xnack+",                       # conflict: feature in one ID only
    "gfx908:sramecc+,gfx908:xnack+",              # conflict: different features
    "gfx908:xnack+,gfx908:xnack-",                # fine: same feature, both signs
    "gfx908:xnack-,gfx908:xnack+",
    "carrizo,gfx801:xnack+",                      # conflict found after canonicalizing the alternative name
    "carrizo:xnack+,gfx801:xnack-",
    "polaris10,gfx803,fiji",                      # dedup after canonicalization
    "gfx90a:xnack+,gfx90a:xnack+",                # dedup of equal IDs
    "gfx90a:xnack-,gfx900,gfx1030,gfx90a:xnack+",  # Clang's string sort: gfx1030 < gfx900 < gfx90a:xnack+
    "gfx908:xnack+,gfx90a",                       # different processors never conflict
    "gfx90a:sramecc+:xnack-,gfx90a:xnack+:sramecc+,gfx90a:xnack-:sramecc-",
    "sm_90,sm_80,sm_90a,sm_80",
    "gfx90a,",                                    # empty item
)

#: The asymmetric check in Clang 19 accepts these; the documented rule (and we) reject them.
CLANG19_MISSED_CONFLICTS = (
    ("gfx908:sramecc+:xnack+,gfx908:xnack+", ("gfx908:sramecc+:xnack+", "gfx908:xnack+")),
    ("gfx90a:xnack+,gfx90a:sramecc-:xnack-", ("gfx90a:sramecc-:xnack-", "gfx90a:xnack+")),
)


def _names_known(version: int) -> list[str]:
    return [n for p in AMDGPU_PROCESSORS if p.known_in(version) for n in (p.name, *p.alternative_names)]


def _feature_list(version: int, feature: str) -> str:
    """One list holding every processor that accepts ``feature``: all must be accepted together."""
    return ",".join(f"{p.name}:{feature}+" for p in AMDGPU_PROCESSORS
                    if p.known_in(version) and feature in p.features)


def _driver_jobs(clang: dict[int, Path]) -> list[tuple[tuple[int, str], Callable[[], DriverResult]]]:
    queries: set[tuple[int, str]] = set()
    queries |= {(19, t) for t in DIFF_19} | {(22, t) for t in DIFF_22}
    queries |= {(19, t) for t in DELIBERATE_DIVERGENCES}
    queries |= {(19, lst) for lst in LISTS_19} | {(19, lst) for lst, _ in CLANG19_MISSED_CONFLICTS}
    for version in LLVM_VERSIONS:
        queries.add((version, ",".join(_names_known(version))))
        queries.add((version, ",".join(a.name for a in NVPTX_ARCH_TABLE if a.since_llvm <= version)))
        for feature in ("xnack", "sramecc"):
            queries.add((version, _feature_list(version, feature)))
        for proc in AMDGPU_PROCESSORS:
            if not proc.known_in(version):
                queries.add((version, proc.name))
        for arch in NVPTX_ARCH_TABLE:
            if arch.since_llvm > version:
                queries.add((version, arch.name))
    return [((v, a), (lambda v=v, a=a: run_driver(clang[v], a))) for v, a in sorted(queries)]


@pytest.fixture(scope="module")
def driver(llvm19, llvm22) -> dict[tuple[int, str], DriverResult]:
    """Every driver query of this module, keyed by (LLVM version, --offload-arch value)."""
    clang = {19: llvm19("clang++"), 22: llvm22("clang++")}
    return prefetch(_driver_jobs(clang))  # type: ignore[return-value]


# --------------------------------------------------------------------------------------------------
# Canonicalization (pure)


@pytest.mark.parametrize(("text", "canonical"), [
    # the reference's verified driver examples
    ("gfx90a:xnack+:sramecc-", "gfx90a:sramecc-:xnack+"),
    ("carrizo:xnack+", "gfx801:xnack+"),
    ("polaris10", "gfx803"),
    ("hainan", "gfx602"),
    # more alternative names and orderings
    ("tahiti", "gfx600"), ("verde", "gfx601"), ("oland", "gfx602"), ("kaveri", "gfx700"), ("hawaii", "gfx701"),
    ("mullins", "gfx703"), ("bonaire", "gfx704"), ("iceland", "gfx802"), ("tonga", "gfx802"), ("fiji", "gfx803"),
    ("polaris11", "gfx803"), ("tongapro", "gfx805"), ("stoney:xnack-", "gfx810:xnack-"),
    ("gfx908:xnack-:sramecc+", "gfx908:sramecc+:xnack-"),
    ("gfx942:sramecc-", "gfx942:sramecc-"),
    ("gfx10-1-generic:xnack+", "gfx10-1-generic:xnack+"),
    ("sm_90a", "sm_90a"),
    ("x86_64", "x86_64"),
    (HOST_CPU_TRIPLE, "x86_64"),
])
def test_canonical_spelling(text: str, canonical: str) -> None:
    assert str(parse_target_id(text)) == canonical


def test_every_spelling_round_trips() -> None:
    """All processors, names, feature subsets, signs and orders canonicalize to one stable spelling."""
    for proc in AMDGPU_PROCESSORS:
        version = max(proc.since_llvm, 19)
        for name in (proc.name, *proc.alternative_names):
            for signs in product((None, True, False), repeat=len(proc.features)):
                chosen = [(f, s) for f, s in zip(proc.features, signs) if s is not None]
                expected = TargetID(proc.name, tuple(chosen))
                for order in permutations(chosen):
                    text = name + "".join(f":{f}{'+' if s else '-'}" for f, s in order)
                    parsed = parse_target_id(text, llvm_version=version)
                    assert parsed == expected, text
                    assert parse_target_id(str(parsed), llvm_version=version) == parsed
                    assert str(parsed) == proc.name + "".join(
                        f":{f}{'+' if s else '-'}" for f, s in sorted(chosen))


def test_target_id_properties() -> None:
    amd = parse_target_id("gfx90a:xnack+:sramecc-")
    assert (amd.kind, amd.triple, amd.package_arch, amd.file_token) == (
        "amdgpu", AMDGPU_TRIPLE, "gfx90a:sramecc-:xnack+", "gfx90a_sramecc-_xnack+")
    assert (amd.feature("xnack"), amd.feature("sramecc"), amd.feature("tgsplit")) == (True, False, None)
    nv = parse_target_id("sm_90")
    assert (nv.kind, nv.triple, nv.package_arch, nv.file_token) == ("nvptx", NVPTX_TRIPLE, "sm_90", "sm_90")
    host = parse_target_id("x86_64")
    assert host == TargetID("x86_64")
    assert (host.kind, host.triple, host.package_arch, host.file_token) == (
        "host-cpu", HOST_CPU_TRIPLE, "", "x86_64")
    assert parse_target_id("gfx90a").feature("xnack") is None


def test_direct_construction_sorts_features() -> None:
    """Equal IDs must hash equal however they were built (bundle readers construct them directly)."""
    built = TargetID("gfx90a", (("xnack", True), ("sramecc", False)))
    assert built.features == (("sramecc", False), ("xnack", True))
    assert built == parse_target_id("gfx90a:xnack+:sramecc-")
    assert len({built, parse_target_id("gfx90a:sramecc-:xnack+")}) == 1
    with pytest.raises(TargetIDError, match="repeats a feature"):
        TargetID("gfx90a", (("xnack", True), ("xnack", False)))


def test_format_only_parse_accepts_unknown_names() -> None:
    """Like parseTargetIDWithFormatCheckingOnly: IDs from newer tools stay readable."""
    assert parse_target_id_format("gfx9999:foo+:bar-") == ("gfx9999", {"foo": True, "bar": False})
    assert parse_target_id_format("gfx90a") == ("gfx90a", {})
    for bad in ("", ":xnack+", "gfx90a:xnack", "gfx90a:xnack+:xnack-", "gfx90a::xnack+", "gfx90a:", "gfx90a:+",
                "gfx90a :xnack+"):
        with pytest.raises(TargetIDError):
            parse_target_id_format(bad)


def test_version_gates() -> None:
    assert ours("gfx950", 19) is None and ours("gfx950", 20) == "gfx950" and ours("gfx950", 22) == "gfx950"
    assert ours("gfx1153", 19) is None and ours("gfx1153", 22) == "gfx1153"
    assert ours("gfx9-4-generic:xnack+", 19) is None and ours("gfx9-4-generic:xnack+", 20) is not None
    assert ours("gfx940", 20) == "gfx940" and ours("gfx940", 21) is None
    assert ours("sm_100a", 19) is None and ours("sm_100a", 22) == "sm_100a"
    with pytest.raises(ValueError):
        parse_target_id("gfx90a", llvm_version=18)


# --------------------------------------------------------------------------------------------------
# Differential: single IDs


@pytest.mark.parametrize("text", DIFF_19)
def test_matches_clang19_driver(driver: dict, text: str) -> None:
    result = driver[(19, text)]
    expected = ours(text, 19)
    assert result.ok == (expected is not None), result.output[-2000:]
    if expected is not None:
        assert result.ids == (expected,)


@pytest.mark.parametrize("text", DIFF_22)
def test_matches_clang22_driver(driver: dict, text: str) -> None:
    result = driver[(22, text)]
    expected = ours(text, 22)
    assert result.ok == (expected is not None), result.output[-2000:]
    if expected is not None:
        assert result.ids == (expected,)


@pytest.mark.parametrize("text", sorted(DELIBERATE_DIVERGENCES))
def test_deliberate_divergence_from_clang19(driver: dict, text: str) -> None:
    assert driver[(19, text)].ok, "Clang 19 now rejects it: the divergence is gone, update DELIBERATE_DIVERGENCES"
    assert ours(text, 19) is None, DELIBERATE_DIVERGENCES[text]


@pytest.mark.parametrize("version", LLVM_VERSIONS)
def test_amdgpu_table_matches_driver(driver: dict, version: int) -> None:
    """Every name the table knows at ``version`` is accepted, and canonicalized as the driver does."""
    names = _names_known(version)
    result = driver[(version, ",".join(names))]
    assert result.ok, result.output[-2000:]
    assert result.ids == tuple(sorted({ours(n, version) for n in names}))  # type: ignore[type-var]
    for proc in AMDGPU_PROCESSORS:
        if not proc.known_in(version):
            assert not driver[(version, proc.name)].ok, proc.name
            assert ours(proc.name, version) is None


@pytest.mark.parametrize("version", LLVM_VERSIONS)
@pytest.mark.parametrize("feature", ["xnack", "sramecc"])
def test_feature_table_matches_driver(driver: dict, version: int, feature: str) -> None:
    text = _feature_list(version, feature)
    result = driver[(version, text)]
    assert result.ok, result.output[-2000:]
    assert result.ids == parse_offload_archs_strs(text, version)



@pytest.mark.parametrize("version", LLVM_VERSIONS)
def test_nvptx_table_matches_driver(driver: dict, version: int) -> None:
    known = [a.name for a in NVPTX_ARCH_TABLE if a.since_llvm <= version]
    result = driver[(version, ",".join(known))]
    assert result.ok, result.output[-2000:]
    assert result.ids == tuple(sorted(known))
    for arch in NVPTX_ARCH_TABLE:
        if arch.since_llvm > version:
            assert not driver[(version, arch.name)].ok, arch.name
            assert ours(arch.name, version) is None


@pytest.mark.parametrize("version", LLVM_VERSIONS)
def test_amdgpu_table_matches_llc(llvm19, llvm22, version: int) -> None:
    """The backend's processor list (``llc -mcpu=help``) names exactly the table's rows for that release."""
    llc = (llvm19 if version == 19 else llvm22)("llc")
    out = subprocess.run([str(llc), "-march=amdgcn", "-mcpu=help"], capture_output=True, text=True, timeout=60)
    text = out.stdout + out.stderr
    block = text.split("Available CPUs for this target:", 1)[1].split("Available features", 1)[0]
    cpus = {line.split()[0] for line in block.splitlines() if line.strip()}
    assert cpus - {"generic", "generic-hsa"} == set(_names_known(version))


# --------------------------------------------------------------------------------------------------
# Lists and the conflict rule


@pytest.mark.parametrize("archs", LISTS_19)
def test_offload_arch_lists_match_clang19(driver: dict, archs: str) -> None:
    result = driver[(19, archs)]
    expected = ours_list(archs, 19)
    assert result.ok == (expected is not None), result.output[-2000:]
    if expected is not None:
        assert result.ids == (tuple(sorted(expected)) if _language(archs) == "cuda" else expected)


@pytest.mark.parametrize(("archs", "pair"), CLANG19_MISSED_CONFLICTS)
def test_conflict_clang19_misses(driver: dict, archs: str, pair: tuple[str, str]) -> None:
    """Clang 19 compares each ID only with the sorted-first one; the documented rule is symmetric."""
    assert driver[(19, archs)].ok, "Clang 19 rejects it now: its asymmetric check has changed"
    with pytest.raises(TargetIDError) as err:
        parse_offload_archs(archs)
    assert f"'{pair[0]}' and '{pair[1]}'" in str(err.value)
    assert "for one processor a feature must appear in all target IDs or in none" in str(err.value)


def test_conflict_message_names_both_ids() -> None:
    with pytest.raises(TargetIDError) as err:
        parse_offload_archs(["gfx90a:xnack+", "gfx90a"])
    assert str(err.value) == ("conflicting offload target IDs 'gfx90a' and 'gfx90a:xnack+': for one processor "
                              "a feature must appear in all target IDs or in none")


def test_find_conflict_is_symmetric_and_order_independent() -> None:
    a, b = parse_target_id("gfx908:sramecc+:xnack+"), parse_target_id("gfx908:xnack+")
    assert find_conflict([a, b]) == find_conflict([b, a]) == (a, b)
    assert find_conflict([parse_target_id("gfx908:xnack+"), parse_target_id("gfx908:xnack-")]) is None
    assert find_conflict([parse_target_id("gfx908"), parse_target_id("gfx90a:xnack+")]) is None
    assert find_conflict([]) is None
    three = [parse_target_id(t) for t in ("gfx90a:xnack-", "gfx90a:xnack+", "gfx90a:sramecc+:xnack+")]
    assert find_conflict(three) == (parse_target_id("gfx90a:sramecc+:xnack+"), parse_target_id("gfx90a:xnack+"))


def test_parse_offload_archs_inputs() -> None:
    mixed = parse_offload_archs("x86_64, sm_90 ,gfx90a:xnack+")
    assert [str(t) for t in mixed] == ["gfx90a:xnack+", "sm_90", "x86_64"]
    assert [t.kind for t in mixed] == ["amdgpu", "nvptx", "host-cpu"]
    from_list = parse_offload_archs(["gfx1030,gfx900", " gfx90a:xnack- ", "gfx90a:xnack+", "polaris10", "gfx803"])
    assert [str(t) for t in from_list] == ["gfx1030", "gfx803", "gfx900", "gfx90a:xnack+", "gfx90a:xnack-"]
    assert parse_offload_archs(x for x in ["x86_64-unknown-linux-gnu", "x86_64"]) == (TargetID("x86_64"),)
    for empty in ("", " ", [], [""], ["", " "]):
        with pytest.raises(TargetIDError, match="no offload target IDs"):
            parse_offload_archs(empty)
    with pytest.raises(TargetIDError, match="empty item"):
        parse_offload_archs("gfx90a,,sm_90")
    with pytest.raises(TargetIDError, match="'gfx950'.*added in LLVM 20"):
        parse_offload_archs("gfx90a,gfx950")
    assert [str(t) for t in parse_offload_archs("gfx90a,gfx950", llvm_version=22)] == ["gfx90a", "gfx950"]


# --------------------------------------------------------------------------------------------------
# Compatibility


#: The reference's unbundling table: a code object built for gfx90a:xnack+, requested as each device.
REFERENCE_COMPAT = (
    ("gfx90a:xnack+", "gfx90a", False),
    ("gfx90a:xnack+", "gfx90a:sramecc+:xnack+", True),
    ("gfx90a:xnack+", "gfx90a:xnack-", False),
)
COMPAT_CODE_OBJECTS = ("gfx90a:xnack+", "gfx90a", "gfx90a:sramecc-:xnack+", "gfx908:sramecc+")
COMPAT_DEVICES = ("gfx90a", "gfx90a:xnack+", "gfx90a:xnack-", "gfx90a:sramecc+:xnack+", "gfx90a:sramecc-:xnack+",
                  "gfx908", "gfx908:sramecc+", "gfx908:sramecc+:xnack-")


@pytest.mark.parametrize(("code_object", "device", "expected"), [
    *REFERENCE_COMPAT,
    ("gfx90a:xnack+", "gfx90a:xnack+", True),
    ("gfx90a", "gfx90a:sramecc+:xnack-", True),             # Any runs everywhere
    ("gfx90a:sramecc-:xnack+", "gfx90a:xnack+", False),     # device leaves sramecc unspecified
    ("gfx908:xnack+", "gfx90a:xnack+", False),              # processor differs
    ("gfx1030", "gfx10-3-generic", False),                  # generic fallback is not name compatibility
    ("sm_90", "sm_90", True),
    ("sm_90", "sm_90a", False),
    ("x86_64", "x86_64", True),
])
def test_compatibility_table(code_object: str, device: str, expected: bool) -> None:
    assert is_compatible(parse_target_id(code_object), parse_target_id(device)) is expected


@pytest.fixture(scope="module")
def bundler_compat(llvm19, tmp_path_factory) -> dict[tuple[str, str], bool]:
    """Clang 19's own verdict: bundle one code object, then unbundle it requesting each device."""
    bundler = str(llvm19("clang-offload-bundler"))
    root = tmp_path_factory.mktemp("compat")
    (root / "host.s").write_text("host\n")
    (root / "dev.s").write_text("device\n")

    def bundle(index: int, code_object: str) -> Path:
        out = root / f"bundle{index}.s"
        subprocess.run([bundler, "-type=s", f"-targets=host-{HOST_CPU_TRIPLE},hip-{AMDGPU_TRIPLE}--{code_object}",
                        f"-input={root / 'host.s'}", f"-input={root / 'dev.s'}", f"-output={out}"],
                       check=True, capture_output=True, timeout=60)
        return out

    bundles = prefetch((co, (lambda i=i, co=co: bundle(i, co))) for i, co in enumerate(COMPAT_CODE_OBJECTS))

    def unbundle(code_object: str, device: str) -> bool:
        out = root / f"{bundles[code_object].stem}-{device.replace(':', '_')}.s"
        proc = subprocess.run([bundler, "-type=s", "-unbundle", f"-targets=hip-{AMDGPU_TRIPLE}--{device}",
                               f"-input={bundles[code_object]}", f"-output={out}"], capture_output=True, timeout=60)
        return proc.returncode == 0 and out.read_text() == "device\n"

    pairs = [(co, dev) for co in COMPAT_CODE_OBJECTS for dev in COMPAT_DEVICES]
    return prefetch((pair, (lambda pair=pair: unbundle(*pair))) for pair in pairs)  # type: ignore[return-value]


def test_compatibility_matches_clang19_bundler(bundler_compat: dict[tuple[str, str], bool]) -> None:
    for (code_object, device), clang_says in bundler_compat.items():
        assert is_compatible(parse_target_id(code_object), parse_target_id(device)) is clang_says, (code_object, device)
    for code_object, device, expected in REFERENCE_COMPAT:
        assert bundler_compat[(code_object, device)] is expected


def test_compatibility_is_reflexive() -> None:
    for text in ("gfx90a", "gfx90a:sramecc+:xnack-", "carrizo:xnack+", "sm_90a", "x86_64"):
        target = parse_target_id(text)
        assert is_compatible(target, target)


# --------------------------------------------------------------------------------------------------
# Tables


def test_generic_processor() -> None:
    assert generic_processor("gfx1030") == "gfx10-3-generic"
    assert generic_processor("gfx942") == "gfx9-4-generic"
    assert generic_processor("gfx950") == "gfx9-4-generic"
    assert generic_processor("gfx906") == "gfx9-generic"
    assert generic_processor("gfx1013") == "gfx10-1-generic"
    assert generic_processor("gfx1153") == "gfx11-generic"
    assert generic_processor("gfx1201") == "gfx12-generic"
    for none in ("gfx908", "gfx90a", "gfx803", "fiji", "gfx9-generic", "sm_90", "x86_64", "nonsense"):
        assert generic_processor(none) is None, none
    families = {}
    for proc in AMDGPU_PROCESSORS:
        if proc.generic:
            families.setdefault(proc.generic, []).append(proc.name)
    # AMDGPUUsage "AMDGPU Generic Processors" (gfx940/gfx941 were listed until their removal)
    assert families == {
        "gfx9-generic": ["gfx900", "gfx902", "gfx904", "gfx906", "gfx909", "gfx90c"],
        "gfx9-4-generic": ["gfx940", "gfx941", "gfx942", "gfx950"],
        "gfx10-1-generic": ["gfx1010", "gfx1011", "gfx1012", "gfx1013"],
        "gfx10-3-generic": [f"gfx103{i}" for i in range(7)],
        "gfx11-generic": ["gfx1100", "gfx1101", "gfx1102", "gfx1103", "gfx1150", "gfx1151", "gfx1152", "gfx1153"],
        "gfx12-generic": ["gfx1200", "gfx1201"],
    }


def test_table_is_consistent() -> None:
    names = [n for p in AMDGPU_PROCESSORS for n in (p.name, *p.alternative_names)]
    assert len(names) == len(set(names))
    assert len(NVPTX_ARCHS) == len(set(NVPTX_ARCHS)) and all(a.startswith("sm_") for a in NVPTX_ARCHS)
    for proc in AMDGPU_PROCESSORS:
        assert isinstance(proc, AMDGPUProcessor) and amdgpu_processor(proc.name) is proc
        if proc.generic:
            family = amdgpu_processor(proc.generic)
            assert family is not None and family.is_generic
            # a generic accepts only what all its members accept (gfx906 has sramecc, gfx9-generic not)
            assert set(family.features) <= set(proc.features), proc.name
    xnack = {p.name for p in AMDGPU_PROCESSORS if p.xnack and p.since_llvm == 19}
    sramecc = {p.name for p in AMDGPU_PROCESSORS if p.sramecc and p.since_llvm == 19}
    # reference section 4.1, the LLVM 19 totals
    assert xnack == {"gfx801", "gfx810", "gfx900", "gfx902", "gfx904", "gfx906", "gfx908", "gfx909", "gfx90a",
                     "gfx90c", "gfx940", "gfx941", "gfx942", "gfx1010", "gfx1011", "gfx1012", "gfx1013",
                     "gfx9-generic", "gfx10-1-generic"}
    assert sramecc == {"gfx906", "gfx908", "gfx90a", "gfx940", "gfx941", "gfx942"}
    assert "x86_64" in known_processors(19) and "gfx950" not in known_processors(19)


# --------------------------------------------------------------------------------------------------
# Error messages


@pytest.mark.parametrize(("text", "version", "fragments"), [
    ("gfx90b:xnack+", 19, ["'gfx90b:xnack+'", "unknown processor 'gfx90b'", "did you mean", "'gfx90a'",
                           "offload_builders.targets.AMDGPU_PROCESSORS"]),
    ("GFX90A", 19, ["'GFX90A'", "did you mean 'gfx90a'?"]),
    ("sm_9O", 19, ["'sm_9O'", "'sm_90'"]),
    ("bogus", 19, ["'bogus'", "valid processors:", "gfx90a", "carrizo", "sm_90a", "x86_64"]),
    ("gfx950:xnack+", 19, ["'gfx950:xnack+'", "'gfx950' was added in LLVM 20", "LLVM version is 19"]),
    ("sm_120", 19, ["'sm_120'", "added in LLVM 21"]),
    ("gfx940", 22, ["'gfx940'", "removed after LLVM 20"]),
    ("gfx1030:xnack+", 19, ["'gfx1030:xnack+'", "processor 'gfx1030'", "feature 'xnack'",
                            "accepts no target-ID features"]),
    ("gfx900:sramecc+", 19, ["'gfx900:sramecc+'", "processor 'gfx900'", "feature 'sramecc'", "only 'xnack'"]),
    ("gfx90a:tgsplit+", 19, ["processor 'gfx90a'", "'tgsplit'", "only 'sramecc', 'xnack'"]),
    ("sm_90:xnack+", 19, ["'sm_90:xnack+'", "NVPTX processor 'sm_90'", "no target-ID features"]),
    ("gfx90a:xnack", 19, ["'gfx90a:xnack'", "feature 'xnack' has no '+' or '-' sign",
                          "e.g., 'gfx908:sramecc+:xnack-'"]),
    ("gfx90a:xnack+:xnack-", 19, ["'gfx90a:xnack+:xnack-'", "feature 'xnack' appears more than once"]),
    ("gfx90a::xnack+", 19, ["'gfx90a::xnack+'", "component 2 is empty"]),
    ("gfx90a:xnack+:", 19, ["'gfx90a:xnack+:'", "component 3 is empty"]),
    (":xnack+", 19, ["':xnack+'", "processor (component 1) is empty"]),
    ("gfx90a:+", 19, ["'gfx90a:+'", "component 2 ('+')", "no feature name"]),
    ("amdgcnspirv", 19, ["'amdgcnspirv'", "not supported"]),
])
def test_error_messages_name_the_offending_text(text: str, version: int, fragments: list[str]) -> None:
    with pytest.raises(TargetIDError) as err:
        parse_target_id(text, llvm_version=version)
    assert isinstance(err.value, OffloadError) and isinstance(err.value, ValueError)
    for fragment in fragments:
        assert fragment in str(err.value), (fragment, str(err.value))
