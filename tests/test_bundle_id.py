"""Bundle entry IDs: standardization, validation, StringMap order and unbundling compatibility,
each checked against the real clang-offload-bundler 19 (no mocks).

Clang is asked what it writes (bundle, then ``-list``) and what it extracts (``-unbundle`` of a bundle
it wrote); its calls run concurrently in module fixtures.
"""
from __future__ import annotations

import random
import struct
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from offload_builders.errors import TargetIDError
from offload_builders.formats import bundle as bundle_mod
from offload_builders.formats.bundle_id import (
    BundleEntryID,
    clang19_target_id_field,
    clang_stringmap_order,
    is_code_object_compatible,
    is_offload_kind_compatible,
    parse_bundle_entry_id,
    standardize,
    validate_targets,
    xxh3_64,
)

WORKERS = 4
HOST = "host-x86_64-unknown-linux-gnu"


@pytest.fixture(scope="module")
def bundler(llvm19) -> Path:
    return llvm19("clang-offload-bundler")


def run(cmd: list[str | Path], **kwargs) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kwargs)


def clang_error(result: subprocess.CompletedProcess[str]) -> str:
    """The message after ``error: `` of a failed clang-offload-bundler run."""
    assert result.returncode != 0, result
    return result.stderr.strip().splitlines()[-1].split("error: ", 1)[1]


def clang_writes(bundler: Path, work: Path, targets: list[str]) -> subprocess.CompletedProcess[str]:
    """Bundle one small input per target with Clang and list the IDs it wrote (stdout)."""
    name = str(abs(hash(tuple(targets))))
    (work / "in").write_bytes(b"x")
    out = work / f"{name}.bundle"
    made = run([bundler, "-type=bc", "-targets=" + ",".join(targets), f"-output={out}"]
               + ["-input=" + str(work / "in")] * len(targets))
    if made.returncode:
        return made
    return run([bundler, "-list", "-type=bc", f"-input={out}"])


# --------------------------------------------------------------------------------------------
# Standardization
# --------------------------------------------------------------------------------------------
#: -targets strings both tools accept; Clang's written ID must equal str(parse_bundle_entry_id()).
STANDARDIZE = [
    "hip-amdgcn-amd-amdhsa-gfx908", "hip-amdgcn-amd-amdhsa--gfx908", "hip-amdgcn-amd-amdhsa-unknown-gfx908",
    "hipv4-amdgcn-amd-amdhsa--gfx90a:xnack+:sramecc-", "hipv4-amdgcn-amd-amdhsa-gfx90a:sramecc+:xnack+",
    "openmp-nvptx64-nvidia-cuda-sm_80", "openmp-nvptx64-nvidia-cuda--sm_90a",
    "openmp-amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-", "hip-amdgcn-amd-amdhsa--gfx9-generic",
    "hip-amdgcn-amd-amdhsa--gfx10-3-generic", "hip-spirv64-amd-amdhsa--amdgcnspirv",
    "hip-amdgcn-amd-amdhsa-a-b-c-gfx908", "openmp-x86_64-pc-linux-gnu", "hip-amdgcn-amd-amdhsa",
    "hip-amdgcn", "hipv4-amdgcn-amd-amdhsa--gfx1201", "hip-amdgcn-amd-amdhsa--gfx1010:xnack-",
    "hip-amdgcn-amd-amdhsa--generic", "openmp-aarch64-unknown-linux-gnu",
    "host-x86_64-unknown-linux-gnu", "host-x86_64-unknown-linux", "host-x86_64-linux",
    "host-powerpc64le-unknown-linux-gnu", "host-x86_64-pc-windows-msvc",
]


@pytest.fixture(scope="module")
def clang_standardized(bundler, tmp_path_factory) -> dict[str, subprocess.CompletedProcess[str]]:
    work = tmp_path_factory.mktemp("std")

    def one(text: str) -> subprocess.CompletedProcess[str]:
        sub = work / str(STANDARDIZE.index(text))
        sub.mkdir()
        targets = [text] if text.startswith(("host-", "hip-", "hipv4-")) else [HOST, text]
        return clang_writes(bundler, sub, targets)

    with ThreadPoolExecutor(WORKERS) as pool:
        return dict(zip(STANDARDIZE, pool.map(one, STANDARDIZE)))


@pytest.mark.parametrize("text", STANDARDIZE)
def test_standardized_id_is_what_clang_writes(text, clang_standardized):
    listed = clang_standardized[text]
    assert listed.returncode == 0, listed.stderr
    written = set(listed.stdout.split()) - ({f"{HOST}-"} if not text.startswith("host-") else set())
    assert written == {standardize(text)}


@pytest.mark.parametrize("text", STANDARDIZE)
def test_standardization_is_idempotent(text):
    once = standardize(text)
    assert standardize(once) == once
    assert str(parse_bundle_entry_id(once, strict=False)) == once


def test_trailing_dash_is_read_as_no_target_id_where_clang_19_doubles_the_id(bundler, tmp_path):
    """Clang 19's "" OffloadArch entry turns ``X-`` into ``X-X-``; we keep ``X-`` (documented choice)."""
    listed = clang_writes(bundler, tmp_path, ["host-x86_64-pc-linux-gnu-"])
    assert listed.stdout.split() == ["host-x86_64-pc-linux-gnu-host-x86_64-pc-linux-gnu-"]
    assert standardize("host-x86_64-pc-linux-gnu-") == "host-x86_64-pc-linux-gnu-"
    entry = parse_bundle_entry_id("host-x86_64-unknown-linux--")
    assert entry == BundleEntryID("host", "x86_64-unknown-linux-", "")
    assert clang19_target_id_field("host-x86_64-unknown-linux--") == "host-x86_64-unknown-linux--"


@pytest.mark.parametrize("text, canonical", [
    ("hip-amdgcn-amd-amdhsa--fiji", "gfx803"),
    ("hip-amdgcn-amd-amdhsa--carrizo:xnack+", "gfx801"),
    ("hip-amdgcn-amd-amdhsa--gfx950", "gfx950"),
    ("openmp-nvptx64-nvidia-cuda--sm_100", "sm_100"),
])
def test_processors_clang_19_misparses_are_errors(bundler, tmp_path, text, canonical):
    """Clang 19 writes such names into the triple's environment (and drops features); we refuse."""
    listed = clang_writes(bundler, tmp_path, [HOST, text])
    assert listed.returncode == 0
    written = (set(listed.stdout.split()) - {f"{HOST}-"}).pop()
    assert written.endswith("-") and canonical not in written.rsplit("-", 2)[-1]
    with pytest.raises(TargetIDError, match="does not recognize the processor") as info:
        parse_bundle_entry_id(text)
    if canonical != text.rsplit("-", 1)[-1].split(":")[0]:
        assert canonical in str(info.value)
    assert str(parse_bundle_entry_id(text, strict=False)) == written


@pytest.mark.parametrize("text", ["hip-amdgcn-amd-amdhsa--gfx950", "hip-amdgcn-amd-amdhsa--gfx1153",
                                  "openmp-nvptx64-nvidia-cuda--sm_100a", "hip-amdgcn-amd-amdhsa--gfx9-4-generic"])
def test_llvm_22_processor_table(llvm22, tmp_path, text):
    """With ``llvm_version=22`` the processors LLVM 20-22 added are recognized, as 22 writes them."""
    listed = clang_writes(llvm22("clang-offload-bundler"), tmp_path, [HOST, text])
    assert listed.returncode == 0, listed.stderr
    assert text.rsplit("-", 1)[-1] in listed.stdout
    assert standardize(text, llvm_version=22) in listed.stdout.split()
    if not text.endswith("generic"):  # Clang 19 splits generic names but writes them unchanged
        with pytest.raises(TargetIDError):
            parse_bundle_entry_id(text, llvm_version=19)
    with pytest.raises(TargetIDError):  # gfx940 is gone from LLVM 22's table
        parse_bundle_entry_id("hip-amdgcn-amd-amdhsa--gfx940", llvm_version=22)


#: LLVM 21+ reads IDs by position and normalizes the triple (PR #122629, #139112).
STANDARDIZE_22 = [
    "hip-amdgcn-amd-amdhsa-foo-gfx908", "hip-amdgcn-amd-amdhsa-unknown-gfx908", "host-x86_64--linux-gnu",
    "host-x86_64-unknown-linux-", "hip-amdgcn--amdhsa--gfx908", "hip-amdgcn-amd-amdhsa--gfx908:xnack+:sramecc-",
    "host-x86_64-unknown-linux-gnu-", "hip-spirv64-amd-amdhsa--amdgcnspirv", "host-i686-pc-windows-msvc",
    "hip-amdgcn-amd-amdhsa--gfx9-4-generic:xnack+", "host-x86_64-unknown-linux-gnu--", "host-amd64-unknown-linux-gnu",
]


def test_llvm_22_standardization(llvm22, tmp_path):
    tool = llvm22("clang-offload-bundler")
    with ThreadPoolExecutor(WORKERS) as pool:
        results = list(pool.map(lambda item: clang_writes(tool, _subdir(tmp_path, item[0]), [item[1]]),
                                enumerate(STANDARDIZE_22)))
    for text, listed in zip(STANDARDIZE_22, results):
        assert listed.returncode == 0, listed.stderr
        assert listed.stdout.split() == [standardize(text, llvm_version=22)], text
    with pytest.raises(TargetIDError, match="Targets need to follow the format"):
        standardize("hip-amdgcn-amd-amdhsa", llvm_version=22)
    with pytest.raises(TargetIDError, match="does not recognize the processor 'gfx908'"):
        standardize("hip-amdgcn-amd-amdhsa-gfx908", llvm_version=22)  # 22 writes ...amdhsa-- for it


def _subdir(root: Path, index: int) -> Path:
    path = root / str(index)
    path.mkdir()
    return path


@pytest.mark.parametrize("text", [
    "cuda-nvptx64-nvidia-cuda--sm_70", "hip-bogus-amd-amdhsa--gfx908", "sycl-bogus-unknown-linux-gnu",
    "hipv5-amdgcn-amd-amdhsa--gfx908", "host",
])
def test_invalid_kind_and_triple_messages_match_clang(bundler, tmp_path, text):
    made = run([bundler, "-type=bc", f"-targets={HOST},{text}", "-input=/dev/null", "-input=/dev/null",
                f"-output={tmp_path / 'o'}"])
    with pytest.raises(TargetIDError) as info:
        parse_bundle_entry_id(text)
    assert str(info.value) == clang_error(made)


def test_amdgpu_features_are_validated_when_bundling_only():
    with pytest.raises(TargetIDError, match="does not support target-ID feature 'foo'"):
        validate_targets([HOST, "hip-amdgcn-amd-amdhsa--gfx908:foo+"], bundling=True)
    with pytest.raises(TargetIDError, match="no '\\+' or '-' sign"):
        validate_targets(["hip-amdgcn-amd-amdhsa--gfx908:xnack"], bundling=False)
    ids = validate_targets(["hip-amdgcn-amd-amdhsa--gfx1100:xnack-"], bundling=False)
    assert [str(i) for i in ids] == ["hip-amdgcn-amd-amdhsa--gfx1100:xnack-"]


# --------------------------------------------------------------------------------------------
# -targets validation messages
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("targets, unbundling", [
    ([HOST, HOST], False),
    (["openmp-amdgcn-amd-amdhsa--gfx908"], False),
    ([HOST, "host-x86_64-pc-linux-gnu", "hip-amdgcn-amd-amdhsa--gfx908"], False),
    ([HOST, "host-x86_64-pc-linux-gnu"], True),
    ([HOST, "hip-amdgcn-amd-amdhsa--gfx908", "hip-amdgcn-amd-amdhsa--gfx908:xnack+"], False),
    (["hip-amdgcn-amd-amdhsa--gfx908:sramecc+", "hip-amdgcn-amd-amdhsa--gfx908:xnack+"], False),
    (["hip-amdgcn-amd-amdhsa--gfx90a", "hip-amdgcn-amd-amdhsa--gfx90a:xnack+:sramecc+"], True),
])
def test_validation_messages_match_clang(bundler, tmp_path, targets, unbundling):
    if unbundling:
        cmd = [bundler, "-unbundle", "-type=bc", "-input=/dev/null"] + [f"-output={tmp_path / str(i)}"
                                                                       for i in range(len(targets))]
    else:
        cmd = [bundler, "-type=bc", f"-output={tmp_path / 'o'}"] + ["-input=/dev/null"] * len(targets)
    made = run(cmd + ["-targets=" + ",".join(targets)])
    with pytest.raises(TargetIDError) as info:
        validate_targets(targets, bundling=not unbundling)
    assert str(info.value) == clang_error(made)


def test_duplicates_are_checked_after_standardization(bundler, tmp_path):
    """Clang compares the raw strings and writes the same ID twice; we report the duplicate."""
    pair = ["hip-amdgcn-amd-amdhsa-gfx908", "hip-amdgcn-amd-amdhsa--gfx908"]
    out = tmp_path / "dup.bundle"
    made = run([bundler, "-type=bc", "-targets=" + ",".join(pair), f"-output={out}", "-input=/dev/null",
                "-input=/dev/null"])
    assert made.returncode == 0
    data = out.read_bytes()
    assert struct.unpack_from("<Q", data, 24)[0] == 2 and data.count(b"hip-amdgcn-amd-amdhsa--gfx908") == 2
    with pytest.raises(TargetIDError, match="^Duplicate targets are not allowed$"):
        validate_targets(pair, bundling=True)


def test_conflict_rule_is_symmetric_where_clang_19_is_not(bundler, tmp_path):
    """Clang 19 accepts gfx908:sramecc+:xnack+ with gfx908:xnack+ (it only compares with the first
    ID in sorted order); the documented rule, which we apply, rejects it."""
    pair = ["hip-amdgcn-amd-amdhsa--gfx908:sramecc+:xnack+", "hip-amdgcn-amd-amdhsa--gfx908:xnack+"]
    listed = clang_writes(bundler, tmp_path, pair)
    assert listed.returncode == 0
    with pytest.raises(TargetIDError, match="Cannot bundle inputs with conflicting targets"):
        validate_targets(pair, bundling=True)
    # different kinds are never compared, as in Clang
    validate_targets(["hip-amdgcn-amd-amdhsa--gfx908", "hipv4-amdgcn-amd-amdhsa--gfx908:xnack+"], bundling=True)


# --------------------------------------------------------------------------------------------
# StringMap order (xxh3)
# --------------------------------------------------------------------------------------------
def test_xxh3_known_value():
    assert xxh3_64(b"") == 0x2D06800538D394C2


def test_stringmap_order_matches_clang_list(bundler, tmp_path):
    """Random ID sets (IDs of 1 to 1100 characters, every xxh3 length class, up to 40 entries so the
    map grows twice) are listed by Clang in exactly the order we compute."""
    rng = random.Random(1234)
    cases = []
    for index in range(16):
        size = rng.choice([1, 2, 5, 12, 13, 25, 40])
        ids: set[str] = set()
        while len(ids) < size:
            length = rng.choice([1, 3, 6, 12, 20, 50, 100, 130, 200, 250, 400, 1100])
            env = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(length))
            ids.add(f"hip-amdgcn-amd-amdhsa-{env}-gfx908")
        ordered = sorted(ids)
        rng.shuffle(ordered)
        sub = tmp_path / str(index)
        sub.mkdir()
        cases.append((sub, ordered))
    with ThreadPoolExecutor(WORKERS) as pool:
        results = list(pool.map(lambda case: clang_writes(bundler, *case), cases))
    for (_, ids), listed in zip(cases, results):
        assert listed.returncode == 0, listed.stderr
        assert listed.stdout.split("\n")[:-1] == clang_stringmap_order(ids)


def test_stringmap_order_keeps_the_first_slot_of_a_repeated_key():
    assert clang_stringmap_order(["b", "a", "b"]) == clang_stringmap_order(["b", "a"])


# --------------------------------------------------------------------------------------------
# Compatibility (isCodeObjectCompatible) against Clang's unbundling
# --------------------------------------------------------------------------------------------
ENTRIES = [HOST, "hip-amdgcn-amd-amdhsa--gfx90a:xnack+", "hip-amdgcn-amd-amdhsa--gfx908",
           "hipv4-amdgcn-amd-amdhsa--gfx1030", "openmp-amdgcn-amd-amdhsa--gfx906:sramecc+",
           "hip-amdgcn-amd-amdhsa--gfx9-generic", "hip-spirv64-amd-amdhsa--amdgcnspirv",
           "openmp-nvptx64-nvidia-cuda--sm_80", "hipv4-amdgcn-amd-amdhsa--generic",
           "hip-amdgcn-amd-amdhsa--gfx1100:xnack-"]
#: The reference's compatibility table, and the corners around it (host IDs, environments, vendors).
REQUESTS = [
    "hip-amdgcn-amd-amdhsa--gfx90a", "hip-amdgcn-amd-amdhsa--gfx90a:sramecc+:xnack+",
    "hip-amdgcn-amd-amdhsa--gfx90a:xnack-", "hip-amdgcn-amd-amdhsa--gfx90a:xnack+",
    "hipv4-amdgcn-amd-amdhsa--gfx908", "openmp-amdgcn-amd-amdhsa--gfx908", "hip-amdgcn-unknown-amdhsa--gfx908",
    "hip-amdgcn-amd-amdhsa-unknown-gfx908", "hip-amdgcn-amd-amdhsa-foo-gfx908", "hip-amdgcn-amd-amdhsafoo-gfx908",
    "hip-amdgcn-amd-amdhsa--gfx908:xnack+", "hip-amdgcn-amd-amdhsa--gfx1030",
    "openmp-amdgcn-amd-amdhsa--gfx906:sramecc+:xnack-", "openmp-amdgcn-amd-amdhsa--gfx906",
    "hip-amdgcn-amd-amdhsa--gfx9-generic:xnack+", "hipv4-amdgcn-amd-amdhsa--gfx9-generic",
    "hip-amdgcn-amd-amdhsa--gfx9-generic", "hipv4-spirv64-amd-amdhsa--amdgcnspirv",
    "openmp-nvptx64-nvidia-cuda--sm_80", "openmp-nvptx64-nvidia-cuda--sm_86", HOST, "host-x86_64-pc-linux-gnu",
    "host-amd64-unknown-linux-gnu", "host-x86_64-foo-linux-gnu", "host-x86_64-unknown-linux-gnux",
    "hip-amdgcn-amd-amdhsa--generic", "hipv4-amdgcn-amd-amdhsa--generic", "hip-amdgcn-amd-amdhsa--gfx1100",
    "hip-amdgcn-amd-amdhsa--gfx1100:xnack-", "openmp-amdgcn-amd-amdhsa--gfx1100:xnack-",
]


@pytest.fixture(scope="module")
def compat_bundle(bundler, tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("compat")
    inputs = []
    for index, entry in enumerate(ENTRIES):
        path = work / f"in{index}"
        path.write_text(f"DATA{index}:{entry}")
        inputs.append(f"-input={path}")
    out = work / "A.bundle"
    made = run([bundler, "-type=bc", "-targets=" + ",".join(ENTRIES), f"-output={out}", *inputs])
    assert made.returncode == 0, made.stderr
    return out


def _unbundle_both(bundler: Path, bundle: Path, work: Path, requests: list[str], flags: list[str]):
    """(Clang's result, ours) as (ok, [output contents]) for one unbundling."""
    results = []
    for tool in ("clang", "ours"):
        outs = [work / f"{tool}{i}" for i in range(len(requests))]
        for o in outs:
            o.unlink(missing_ok=True)
        if tool == "clang":
            made = run([bundler, "-unbundle", "-type=bc", "-targets=" + ",".join(requests), f"-input={bundle}",
                        *[f"-output={o}" for o in outs], *flags])
            ok = made.returncode == 0
        else:
            try:
                bundle_mod.unbundle(bundle, requests, outs, file_type="bc",
                                    allow_missing_bundles="-allow-missing-bundles" in flags,
                                    hip_openmp_compatible="-hip-openmp-compatible" in flags)
                ok = True
            except Exception as exc:  # noqa: BLE001 - compared with Clang's failure below
                ok = False
                assert isinstance(exc, (TargetIDError, bundle_mod.OffloadError)), exc
        results.append((ok, [o.read_text() if ok and o.exists() else None for o in outs]))
    return results


@pytest.mark.parametrize("flags", [[], ["-hip-openmp-compatible"]], ids=["plain", "hip-openmp"])
def test_single_target_compatibility_matches_clang(bundler, compat_bundle, tmp_path, flags):
    def one(item):
        index, request = item
        sub = tmp_path / str(index)
        sub.mkdir()
        return request, _unbundle_both(bundler, compat_bundle, sub, [request], flags)

    with ThreadPoolExecutor(WORKERS) as pool:
        results = list(pool.map(one, enumerate(REQUESTS)))
    mismatches = [(request, clang, ours) for request, (clang, ours) in results if clang != ours]
    assert not mismatches
    matched = {request for request, (clang, _) in results if clang[0]}
    # the reference's table
    assert "hip-amdgcn-amd-amdhsa--gfx90a" not in matched
    assert "hip-amdgcn-amd-amdhsa--gfx90a:sramecc+:xnack+" in matched
    assert "hip-amdgcn-amd-amdhsa--gfx90a:xnack-" not in matched
    assert "hipv4-amdgcn-amd-amdhsa--gfx908" in matched
    assert ("openmp-amdgcn-amd-amdhsa--gfx908" in matched) == bool(flags)
    assert "hip-amdgcn-unknown-amdhsa--gfx908" not in matched
    assert "host-amd64-unknown-linux-gnu" not in matched  # an ID without target ID matches only itself


def test_several_compatible_entries_resolve_as_clang_does(bundler, tmp_path):
    """With several compatible entries and targets, the winner depends on Clang's hash order; random
    combinations (allow-missing, so every run completes) must agree output for output."""
    rng = random.Random(5)
    pool_entries = ["hip-amdgcn-amd-amdhsa--gfx90a", "hipv4-amdgcn-amd-amdhsa--gfx90a:xnack+",
                    "openmp-amdgcn-amd-amdhsa--gfx90a:xnack-:sramecc+", "hip-amdgcn-amd-amdhsa-unknown-gfx90a:sramecc-",
                    "hipv4-amdgcn-amd-amdhsa-foo-gfx90a", HOST]
    pool_requests = ["hip-amdgcn-amd-amdhsa--gfx90a:xnack+:sramecc+", "hipv4-amdgcn-amd-amdhsa--gfx90a:xnack-:sramecc-",
                     "openmp-amdgcn-amd-amdhsa--gfx90a:xnack-:sramecc+", "hip-amdgcn-amd-amdhsa--gfx90a",
                     "hipv4-amdgcn-amd-amdhsa--gfx90a:sramecc-", "hip-amdgcn-amd-amdhsa--gfx90a:xnack+"]
    cases = []
    while len(cases) < 14:
        entries = rng.sample(pool_entries, rng.randint(2, len(pool_entries)))
        requests = rng.sample(pool_requests, rng.randint(1, 4))
        if HOST not in entries:
            continue
        try:
            validate_targets(requests, bundling=False)
        except TargetIDError:
            continue  # conflicting requests: covered by the validation tests
        cases.append((entries, requests, rng.choice([[], ["-hip-openmp-compatible"]])))

    def one(item):
        index, (entries, requests, flags) = item
        sub = tmp_path / str(index)
        sub.mkdir()
        inputs = []
        for i, entry in enumerate(entries):
            (sub / f"in{i}").write_text(entry)
            inputs.append(f"-input={sub / f'in{i}'}")
        made = run([bundler, "-type=bc", "-targets=" + ",".join(entries), f"-output={sub / 'b'}", *inputs])
        assert made.returncode == 0, made.stderr
        return _unbundle_both(bundler, sub / "b", sub, requests, ["-allow-missing-bundles", *flags])

    with ThreadPoolExecutor(WORKERS) as pool:
        for case, (clang, ours) in zip(cases, pool.map(one, enumerate(cases))):
            assert clang == ours, case


def test_offload_kind_compatibility():
    assert is_offload_kind_compatible("hip", "hipv4") and is_offload_kind_compatible("hipv4", "hip")
    assert not is_offload_kind_compatible("hip", "openmp")
    assert is_offload_kind_compatible("hipv4", "openmp", hip_openmp_compatible=True)
    assert is_offload_kind_compatible("openmp", "hip", hip_openmp_compatible=True)
    assert not is_offload_kind_compatible("host", "openmp", hip_openmp_compatible=True)


def test_code_object_features_are_requirements():
    def cc(co: str, req: str) -> bool:
        return is_code_object_compatible(parse_bundle_entry_id(co, strict=False), parse_bundle_entry_id(req))

    assert cc("hip-amdgcn-amd-amdhsa--gfx90a", "hip-amdgcn-amd-amdhsa--gfx90a:xnack+")
    assert not cc("hip-amdgcn-amd-amdhsa--gfx90a:xnack+", "hip-amdgcn-amd-amdhsa--gfx90a")
    assert cc("hip-amdgcn-amd-amdhsa--gfx90a:xnack+", "hip-amdgcn-amd-amdhsa--gfx90a:xnack+:sramecc-")
    assert not cc("hip-amdgcn-amd-amdhsa--gfx90a:xnack+", "hip-amdgcn-amd-amdhsa--gfx908:xnack+")


# --------------------------------------------------------------------------------------------
# Properties
# --------------------------------------------------------------------------------------------
_component = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_", min_size=0, max_size=8)
_processor = st.sampled_from(["gfx908", "gfx90a", "gfx1030", "sm_80", "gfx9-generic", "generic", "fiji", ""])
_features = st.lists(st.sampled_from([":xnack+", ":xnack-", ":sramecc+", ":sramecc-"]), max_size=2, unique=True)


_KNOWN_TRIPLES = [["amdgcn", "amd", "amdhsa", ""], ["amdgcn", "amd", "amdhsa"], ["nvptx64", "nvidia", "cuda", ""],
                  ["x86_64", "unknown", "linux", "gnu"]]
#: Processors of the strategy that take the xnack and sramecc features (the generic names are misparsed by
#: Clang 19 and not checked, see _is_generic_misparse).
_FEATURED = {"gfx908", "gfx90a", "generic", "gfx9-generic"}


@settings(max_examples=300, deadline=None)
@given(kind=st.sampled_from(["host", "hip", "hipv4", "openmp", "cuda"]),
       fields=st.one_of(st.lists(_component, min_size=0, max_size=5), st.sampled_from(_KNOWN_TRIPLES)),
       processor=_processor, features=_features)
def test_parse_never_fails_and_standard_ids_are_fixed_points(kind, fields, processor, features):
    text = "-".join([kind, *fields, processor]) + ("".join(features) if processor else "")
    entry = parse_bundle_entry_id(text, strict=False)
    assert entry.triple.count("-") >= 3
    standard = str(entry)
    assert str(parse_bundle_entry_id(standard, strict=False)) == standard
    # Strict standardization either gives the same ID or refuses for a reason the parts show.
    features = features if processor else []
    names = [feature[1:-1] for feature in features]
    bad_kind = kind not in ("host", "hip", "hipv4", "openmp")  # Clang 19's isOffloadKindValid
    expected = None
    if bad_kind:
        expected = f"unknown offloading kind '{kind}'"
    elif fields in _KNOWN_TRIPLES:
        if processor == "fiji":
            expected = "does not recognize the processor 'fiji' (use 'gfx803')"
        elif len(set(names)) < len(names):
            expected = "appears more than once"
        elif features and processor not in _FEATURED and fields[0] == "amdgcn":  # other triples: format only
            expected = "does not support target-ID feature"
    try:
        got = standardize(text)
    except TargetIDError as exc:
        message = str(exc)
        assert message.startswith(f"invalid target '{text}'"), message
        if expected is not None:
            assert expected in message, message
        else:  # only a triple of random fields may be refused for a reason not listed above
            assert fields not in _KNOWN_TRIPLES, message
        assert ("unknown offloading kind" in message) == bad_kind, message
    else:
        assert expected is None, (text, got)
        assert got == standard


def test_processor_name_inside_the_triple_still_round_trips():
    """Found by hypothesis: Clang 19 cuts at the first occurrence of the processor name; we cut at its position."""
    text = "host-gfx908----gfx908-gfx908"
    standard = str(parse_bundle_entry_id(text, strict=False))
    assert standard == text
    assert str(parse_bundle_entry_id(standard, strict=False)) == standard


# --------------------------------------------------------------------------------------------
# The shortcuts that keep offload-bundler from loading the processor tables (offload_builders.targets,
# and dataclasses with it) at start-up must say what the tables say.
# --------------------------------------------------------------------------------------------
def test_triple_words_and_gpu_spellings_are_never_alternative_processor_names():
    from offload_builders import targets
    from offload_builders.formats import bundle_id

    amd_names = {n for p in targets.AMDGPU_PROCESSORS for n in (p.name, *p.alternative_names)}
    nv_names = {a.name for a in targets.NVPTX_ARCH_TABLE}
    assert not (amd_names | nv_names | set(targets.HOST_CPU_NAMES)) & bundle_id._TRIPLE_WORDS
    for word in bundle_id._TRIPLE_WORDS:
        assert not word.startswith(("gfx", "sm_")) and bundle_id._known_processor(word, 19) is None
    # every gfx*/sm_* spelling the tables know is canonical: two different ones never canonicalize alike
    assert not {n for p in targets.AMDGPU_PROCESSORS for n in p.alternative_names if n.startswith(("gfx", "sm_"))}
    for name in amd_names | nv_names:
        if name.startswith(("gfx", "sm_")):
            for version in (19, 22):
                try:
                    assert targets.parse_target_id(name, llvm_version=version).processor == name
                except TargetIDError:
                    pass  # not known to that release


TARGET_ID_TEXT = st.text(st.sampled_from("gfx90a:+-xnack sramecc\t:"), max_size=24)


@settings(max_examples=500, deadline=None)
@given(text=st.one_of(TARGET_ID_TEXT, st.sampled_from(["gfx908", "gfx90a:xnack+", "gfx90a:xnack+:sramecc-",
                                                        "gfx90a:xnack+:xnack-", "gfx90a:", ":xnack+", "gfx90a:+",
                                                        "gfx90a:xnack", "sm_80", "gfx 90a", ""])))
def test_split_target_id_agrees_with_the_targets_module(text):
    from offload_builders import targets
    from offload_builders.formats import bundle_id

    try:
        expected = targets.parse_target_id_format(text)
    except TargetIDError:
        expected = None
    assert bundle_id._split_target_id(text) == expected


@settings(max_examples=300, deadline=None)
@given(first=st.sampled_from(["gfx908", "gfx90a", "gfx90a:xnack+", "gfx1030", "fiji", "gfx803", "sm_80", "sm_90a",
                              "gfx9-generic", "carrizo:xnack-", "gfx801:xnack-", "x86_64", "bogus"]),
       second=st.sampled_from(["gfx908", "gfx90a:xnack-", "gfx1030", "gfx803", "polaris10", "sm_80", "sm_90",
                               "gfx942", "gfx801", "stoney", "x86_64"]),
       kind=st.sampled_from(["hip", "hipv4", "openmp"]),
       triple=st.sampled_from(["amdgcn-amd-amdhsa-", "nvptx64-nvidia-cuda-"]))
def test_distinct_processor_shortcut_agrees_with_the_tables(first, second, kind, triple):
    """is_code_object_compatible with the shortcut equals the answer from the canonical processors."""
    from offload_builders.formats import bundle_id

    co, req = BundleEntryID(kind, triple, first), BundleEntryID("hip", triple, second)
    if bundle_id._distinct_processors(co, req):
        for version in (19, 22):
            a, b = bundle_id._processor_and_features(co, version), bundle_id._processor_and_features(req, version)
            assert a is None or b is None or a.processor != b.processor
            assert not is_code_object_compatible(co, req, llvm_version=version)
