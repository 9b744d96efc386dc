"""Runtime selection (offload_builders.selection) against clang-offload-bundler's compatibility rule.

The table below is differential: every case is built into a real bundle with clang-offload-bundler, and
for every image and every query the runtime would make (the device's ISA, its generic family, SPIR-V) the
real bundler is asked, on a bundle holding only that image, whether it would unbundle the image for that
query (``-unbundle -targets=hipv4-<query> -allow-missing-bundles``: empty output = not compatible). Our
verdicts must equal the bundler's, except where our device has a capability the bundler does not model (a
loader limited by ``covN``), which the test applies on top of the bundler's answer. The whole bundle is
unbundled too: where one image fits, the bundler's pick is ours; where several fit, the bundler takes the
first in its StringMap hash order and we the first in file order (comgr's ``lookUpCodeObject``).

Queries with generic processors or processors newer than LLVM 19 go to clang-offload-bundler 22: the 19
bundler splits ``gfx9-generic`` into environment ``-gfx9`` and target ID ``generic`` and so matches generic
entries only by identical ID, which is a bundler bug no runtime shares.
"""
from __future__ import annotations

import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from offload_builders.formats.bundle_id import OFFLOAD_ARCH_NAMES_19, clang_stringmap_order
from offload_builders.selection import (
    GENERIC,
    JIT,
    NATIVE,
    Device,
    Image,
    Requirement,
    SelectionError,
    check_deployment,
    image_requirements,
    modules_in,
    parse_device,
    select,
    select_file,
)

AMD = "amdgcn-amd-amdhsa-"
HOST_ID = "host-x86_64-unknown-linux-gnu"


def hip(target: str, kind: str = "hipv4") -> str:
    return f"{kind}-{AMD}-{target}"


SPIRV = "hip-spirv64-amd-amdhsa--amdgcnspirv"


@dataclass(frozen=True)
class Case:
    """A bundle (entry IDs in file order), a device, and the entry the runtime loads (None: no image fits).

    ``why`` must appear in the reasons when nothing fits; ``tier`` is the chosen image's tier.
    """

    name: str
    entries: tuple[str, ...]
    device: str
    chosen: str | None
    caps: tuple[str, ...] = ()
    tier: str = NATIVE
    why: str = ""


# Any/On/Off for both features of gfx90a: image (row) against device (column), Y = the image fits.
# Devices: s+x+ = gfx90a:sramecc+:xnack+, s+x- , s-x-, "x+" = gfx90a:xnack+ (sramecc unset), "-" = gfx90a.
GRID_DEVICES = ("gfx90a:sramecc+:xnack+", "gfx90a:sramecc+:xnack-", "gfx90a:sramecc-:xnack-", "gfx90a:xnack+",
                "gfx90a")
GRID = {
    #                          s+x+ s+x- s-x- x+   -
    "gfx90a":                 "Y    Y    Y    Y    Y",
    "gfx90a:xnack+":          "Y    .    .    Y    .",
    "gfx90a:xnack-":          ".    Y    Y    .    .",
    "gfx90a:sramecc+":        "Y    Y    .    .    .",
    "gfx90a:sramecc-":        ".    .    Y    .    .",
    "gfx90a:sramecc+:xnack+": "Y    .    .    .    .",
    "gfx90a:sramecc-:xnack-": ".    .    Y    .    .",
}
GRID_CASES = [
    Case(f"grid {image} on {device}", (hip(image),), device, hip(image) if row.split()[col] == "Y" else None)
    for image, row in GRID.items() for col, device in enumerate(GRID_DEVICES)
]

TYPICAL = tuple(hip(t) for t in ("gfx906", "gfx908", "gfx90a:xnack+", "gfx90a:xnack-"))
CASES = GRID_CASES + [
    # The reference's table (bundler-and-target-id.md 3.2), a fat object holding gfx90a:xnack+.
    Case("ref: Any device", (hip("gfx90a:xnack+"),), "gfx90a", None, why="leaves xnack unset"),
    Case("ref: sramecc+:xnack+", (hip("gfx90a:xnack+"),), "gfx90a:sramecc+:xnack+", hip("gfx90a:xnack+")),
    Case("ref: xnack-", (hip("gfx90a:xnack+"),), "gfx90a:xnack-", None, why="the device has xnack-"),
    Case("ref: hip entry, hipv4 request", (hip("gfx908", "hip"),), "gfx908:sramecc+:xnack-", hip("gfx908", "hip")),
    Case("ref: vendor mismatch", ("hip-amdgcn-unknown-amdhsa--gfx908",), "gfx908:sramecc+:xnack-", None,
         why="needs triple amdgcn-unknown-amdhsa"),
    # hip (code object v2/v3) against hipv4 (v4+): the cov requirement.
    Case("hip entry, loader cov4,5", (hip("gfx908", "hip"),), "gfx908:sramecc+:xnack-", None, caps=("cov4", "cov5"),
         why="needs cov2-3"),
    Case("hipv4 entry, loader cov3", (hip("gfx908"),), "gfx908:sramecc+:xnack-", None, caps=("cov3",),
         why="needs cov4+"),
    Case("hip then hipv4, any loader: file order", (hip("gfx908", "hip"), hip("gfx908")), "gfx908:sramecc+:xnack-",
         hip("gfx908", "hip")),
    Case("hip then hipv4, loader cov5", (hip("gfx908", "hip"), hip("gfx908")), "gfx908:sramecc+:xnack-", hip("gfx908"),
         caps=("cov5",)),
    Case("hipv4 then hip, loader cov3", (hip("gfx908"), hip("gfx908", "hip")), "gfx908:sramecc+:xnack-",
         hip("gfx908", "hip"), caps=("cov3",)),
    Case("hip xnack+ and hipv4 Any", (hip("gfx90a:xnack+", "hip"), hip("gfx90a")), "gfx90a:sramecc+:xnack+",
         hip("gfx90a:xnack+", "hip")),
    # Typical fat binaries.
    Case("typical: gfx90a xnack-", TYPICAL, "gfx90a:sramecc+:xnack-", hip("gfx90a:xnack-")),
    Case("typical: gfx90a xnack+", TYPICAL, "gfx90a:sramecc-:xnack+", hip("gfx90a:xnack+")),
    Case("typical: gfx908", TYPICAL, "gfx908:sramecc+:xnack-", hip("gfx908")),
    Case("typical: gfx906 as an HSA ISA name", TYPICAL, "amdgcn-amd-amdhsa--gfx906:sramecc-:xnack+", hip("gfx906")),
    Case("typical: gfx942 finds nothing", TYPICAL, "gfx942:sramecc+:xnack-", None, why="needs processor gfx90a"),
    Case("other families only", (hip("gfx1100"), hip("gfx1030")), "gfx90a:sramecc+:xnack-", None,
         why="needs processor gfx1100"),
    Case("alternative device name", (hip("gfx801:xnack+"),), "carrizo:xnack+", hip("gfx801:xnack+")),
    Case("sramecc only, device has both", (hip("gfx908:sramecc+"),), "gfx908:sramecc+:xnack-", hip("gfx908:sramecc+")),
    # Generic families (code object v6).
    Case("generic fallback", (hip("gfx1030"), hip("gfx10-3-generic")), "gfx1031", hip("gfx10-3-generic"), tier=GENERIC),
    Case("native before generic", (hip("gfx10-3-generic"), hip("gfx1030")), "gfx1030", hip("gfx1030")),
    Case("generic xnack+ on xnack+", (hip("gfx9-generic:xnack+"),), "gfx906:sramecc+:xnack+",
         hip("gfx9-generic:xnack+"), tier=GENERIC),
    Case("generic xnack+ on xnack-", (hip("gfx9-generic:xnack+"),), "gfx906:sramecc+:xnack-", None,
         why="needs xnack+; the device has xnack-"),
    Case("gfx9-4-generic for gfx942", (hip("gfx90a"), hip("gfx9-4-generic:xnack-")), "gfx942:sramecc+:xnack-",
         hip("gfx9-4-generic:xnack-"), tier=GENERIC),
    Case("gfx950 takes the generic, not gfx942", (hip("gfx942"), hip("gfx9-4-generic")), "gfx950:sramecc+:xnack-",
         hip("gfx9-4-generic"), tier=GENERIC),
    Case("gfx90a has no generic family", (hip("gfx9-generic"),), "gfx90a:sramecc+:xnack-", None,
         why="no generic family"),
    Case("generic with a loader without cov6 is kind-checked only", (hip("gfx10-3-generic"),), "gfx1032",
         hip("gfx10-3-generic"), caps=("cov5",), tier=GENERIC),
    # SPIR-V last.
    Case("SPIR-V fallback", (hip("gfx942"), SPIRV), "gfx90a:sramecc+:xnack-", SPIRV, tier=JIT),
    Case("SPIR-V disabled", (hip("gfx942"), SPIRV), "gfx90a:sramecc+:xnack-", None, caps=("no-spirv",),
         why="no-spirv"),
    Case("native before SPIR-V", (SPIRV, hip("gfx90a")), "gfx90a:sramecc+:xnack-", hip("gfx90a")),
    Case("generic before SPIR-V", (SPIRV, hip("gfx9-generic")), "gfx900:xnack-", hip("gfx9-generic"), tier=GENERIC),
    Case("SPIR-V is AMD only", (SPIRV,), "gfx1100", SPIRV, tier=JIT),
    # OpenMP bundles (the old driver's), asked for with the openmp kind.
    Case("openmp gfx942", (f"openmp-{AMD}-gfx90a:xnack-", f"openmp-{AMD}-gfx942"), "gfx942:sramecc-:xnack+",
         f"openmp-{AMD}-gfx942"),
    Case("openmp xnack- only", (f"openmp-{AMD}-gfx90a:xnack-",), "gfx90a:sramecc+:xnack+", None, why="xnack-"),
    Case("openmp, HIP runtime only", (f"openmp-{AMD}-gfx90a",), "gfx90a:sramecc+:xnack+", None, caps=("hip",),
         why="needs the openmp runtime"),
]


def test_the_table_is_large_enough() -> None:
    assert len(CASES) >= 40
    assert len({c.name for c in CASES}) == len(CASES)


# --------------------------------------------------------------------------------------------------
# The real bundler


def _run(cmd: list[str]) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(cmd, capture_output=True)


def _needs_22(*names: str) -> bool:
    """Whether an ID names a processor the 19 bundler cannot match (generic, or newer than 19)."""
    for name in names:
        target = name.split("--", 1)[-1]
        processor = target.split(":", 1)[0]
        if processor.endswith("-generic") or processor not in OFFLOAD_ARCH_NAMES_19:
            return True
    return False


class Bundler:
    """Builds bundles and asks clang-offload-bundler 19/22 what it extracts; every answer is cached."""

    def __init__(self, root: Path, llvm19, llvm22) -> None:
        self.root = root
        self.tools = {19: str(llvm19("clang-offload-bundler")), 22: str(llvm22("clang-offload-bundler"))}
        self.bundles: dict[tuple[str, ...], Path] = {}

    def bundle(self, entries: tuple[str, ...]) -> Path:
        """The bundle of ``entries`` (after a host entry), built by :meth:`build_all` or now."""
        if entries not in self.bundles:
            self.build_all([entries])
        return self.bundles[entries]

    def build_all(self, sets: list[tuple[str, ...]]) -> None:
        todo = [e for e in dict.fromkeys(sets) if e not in self.bundles]
        start = len(self.bundles)
        for number, entries in enumerate(todo, start):
            self.bundles[entries] = self.root / f"b{number}" / "bundle.bin"
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(self._build, todo))

    def _build(self, entries: tuple[str, ...]) -> None:
        out = self.bundles[entries]
        out.parent.mkdir()
        inputs = []
        for i, entry in enumerate((HOST_ID, *entries)):
            (out.parent / f"in{i}").write_bytes(entry.encode())
            inputs.append(f"-input={out.parent / f'in{i}'}")
        tool = self.tools[22 if _needs_22(*entries) else 19]
        result = _run([tool, "-type=o", f"-targets={','.join((HOST_ID, *entries))}", *inputs, f"-output={out}"])
        assert result.returncode == 0, result.stderr

    def unbundle(self, entries: tuple[str, ...], request: str) -> str | None:
        """The entry ID whose bytes the bundler writes for ``request``, or None (empty output)."""
        bundle = self.bundle(entries)
        out = bundle.parent / f"out-{request.replace(':', '_')}"
        tool = self.tools[22 if _needs_22(request, *entries) else 19]
        result = _run([tool, "-unbundle", "-type=o", f"-targets={request}", f"-input={bundle}", f"-output={out}",
                       "-allow-missing-bundles"])
        assert result.returncode == 0, (request, result.stderr)
        data = out.read_bytes()
        out.unlink()
        return data.decode() or None


def _request(entry_kind: str, query: str) -> str:
    return f"{'openmp' if entry_kind == 'openmp' else 'hipv4'}-{query}"


def _kind(entry: str) -> str:
    return entry.split("-", 1)[0]


def _cov_ok(entry: str, device: Device) -> bool:
    """The one capability the bundler does not model: which code-object versions the loader takes."""
    wanted = {"hip": {2, 3}, "hipv4": {4, 5, 6}}.get(_kind(entry))
    if wanted is None or not entry.startswith(("hip-amdgcn", "hipv4-amdgcn")):
        return True
    return bool(wanted & device.code_object_versions)


def _image(entry: str, index: int = 0, image_kind: str = "") -> Image:
    """An image with the requirements its entry ID gives (no payload to read a code-object version from)."""
    kind, rest = entry.split("-", 1)
    triple, target = rest.split("--", 1)
    return Image(entry, kind, triple, target, image_kind, "", index,
                 image_requirements(kind, triple, target, image_kind=image_kind))


@pytest.fixture(scope="module")
def answers(tmp_path_factory: pytest.TempPathFactory, llvm19, llvm22):
    """For every case: per entry, the first tier whose query the bundler answers with that entry (alone in a
    bundle); and per query, which entry the bundler extracts from the whole bundle."""
    bundler = Bundler(tmp_path_factory.mktemp("select"), llvm19, llvm22)
    jobs = {}
    for case in CASES:
        device = parse_device(case.device, case.caps)
        for _tier, query in device.queries():
            for entry in case.entries:
                jobs[((entry,), _request(_kind(entry), query))] = None
            jobs[(case.entries, _request(_kind(case.entries[0]), query))] = None
    bundler.build_all([key[0] for key in jobs])
    with ThreadPoolExecutor(16) as pool:
        results = dict(zip(jobs, pool.map(lambda key: bundler.unbundle(*key), jobs)))
    return bundler, results


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_selection_agrees_with_the_bundler(case: Case, answers) -> None:
    bundler, answers = answers
    device = parse_device(case.device, case.caps)
    (module,) = modules_in(bundler.bundle(case.entries))  # the real bundle, read as any fat binary
    assert [i.entry_id for i in module.images] == list(case.entries)
    selection = select(module, device)
    # the spelled-out expectation
    assert (selection.chosen.entry_id if selection.chosen else None) == case.chosen
    if case.chosen is not None:
        (verdict,) = [v for v in selection.verdicts if v.image is selection.chosen]
        assert verdict.tier == case.tier
    else:
        assert any(case.why in reason for reason in selection.reasons()), selection.reasons()
    # every image against the real bundler, query by query (first tier the bundler matches wins)
    for verdict in selection.verdicts:
        entry = verdict.image.entry_id
        bundler_tier = next((tier for tier, query in device.queries()
                             if answers[((entry,), _request(_kind(entry), query))] == entry), None)
        expected = bundler_tier if _cov_ok(entry, device) and _kind(entry) in _allowed(device) else None
        assert (verdict.tier if verdict.fits else None) == expected, (entry, verdict)
    # the whole bundle: where one image of a tier fits, the bundler extracts it too
    for tier, query in device.queries():
        fitting = [v.image.entry_id for v in selection.verdicts if v.fits and v.tier == tier]
        picked = answers[(case.entries, _request(_kind(case.entries[0]), query))]
        compatible = [e for e in case.entries if answers[((e,), _request(_kind(e), query))] == e]
        if compatible:
            # several compatible entries: clang-offload-bundler takes the first in its hash order
            assert picked == [e for e in clang_stringmap_order((HOST_ID + "-", *case.entries)) if e in compatible][0]
        else:
            assert picked is None
        assert set(fitting) <= set(compatible)


def _allowed(device: Device) -> set[str]:
    kinds = {"hip": {"hip", "hipv4"}, "openmp": {"openmp"}, "cuda": {"cuda"}}
    return set().union(*(kinds[r] for r in device.runtimes))


def test_file_order_differs_from_the_bundlers_hash_order(answers) -> None:
    """The one documented difference: two fitting entries (possible only across kinds)."""
    bundler, answers = answers
    case = next(c for c in CASES if c.name == "hip then hipv4, any loader: file order")
    query = parse_device(case.device).queries()[0][1]
    (module,) = modules_in(bundler.bundle(case.entries))
    assert select(module, parse_device(case.device)).chosen.entry_id == case.entries[0]
    assert answers[(case.entries, _request("hip", query))] == case.entries[1]


# --------------------------------------------------------------------------------------------------
# Model details that need no bundler


def test_requirements_of_an_image() -> None:
    reqs = image_requirements("hipv4", "amdgcn-amd-amdhsa", "gfx90a:xnack+:sramecc-")
    assert [str(r) for r in reqs] == ["runtime=hip", "triple=amdgcn-amd-amdhsa", "processor=gfx90a", "sramecc-",
                                      "xnack+", "cov4+"]
    cov3 = image_requirements("hip", "amdgcn-amd-amdhsa", "gfx908", code_object_version=3)
    assert [str(r) for r in cov3][-1] == "cov3"
    assert str(Requirement("cov", "2-3")) == "cov2-3"


def test_device_parsing_and_capabilities() -> None:
    d = parse_device("gfx90a:xnack-:sramecc+", ["cov4,cov5", "no-spirv", "hip", "ecc=on"])
    assert str(d) == "gfx90a:sramecc+:xnack-"
    assert d.code_object_versions == {4, 5} and not d.spirv and d.runtimes == {"hip"}
    assert Requirement("ecc", "on") in d.extra
    assert [q for _, q in parse_device("gfx1031").queries()] == [
        "amdgcn-amd-amdhsa--gfx1031", "amdgcn-amd-amdhsa--gfx10-3-generic", "spirv64-amd-amdhsa--amdgcnspirv"]
    assert [q for _, q in parse_device("gfx906:xnack+").queries()][1] == "amdgcn-amd-amdhsa--gfx9-generic:xnack+"
    assert parse_device("gfx940:sramecc+:xnack-").target.processor == "gfx940"  # retired in LLVM 21, still a device
    for bad, message in (("gfx9000", "unknown processor"), ("gfx1030:xnack+", "does not support"), ("", "empty"),
                         ("gfx90a:xnack", "sign")):
        with pytest.raises(SelectionError, match=message):
            parse_device(bad)
    with pytest.raises(SelectionError, match="unknown device capability"):
        parse_device("gfx90a", ["cov"])


def test_extra_requirements_need_a_matching_capability() -> None:
    base = _image(hip("gfx90a"))
    image = Image(base.entry_id, base.kind, base.triple, base.target_id, "", "", 0,
                  (*base.requirements, Requirement("ecc", "on")))
    assert not select([image], parse_device("gfx90a")).ok
    assert "needs ecc=on" in select([image], parse_device("gfx90a")).reasons()[0]
    assert select([image], parse_device("gfx90a", ["ecc=on"])).ok


@pytest.mark.parametrize("image, device, fits", [
    ("sm_80", "sm_80", True), ("sm_80", "sm_86", True), ("sm_86", "sm_80", False), ("sm_80", "sm_90", False),
    ("sm_90a", "sm_90", True), ("sm_90a", "sm_90a", True), ("sm_90", "sm_100", False),
])
def test_nvptx_cubin_rule(image: str, device: str, fits: bool) -> None:
    """CUDA's binary compatibility (and libomptarget's CUDA plugin): same major, minor not above the device's."""
    module = [_image(f"openmp-nvptx64-nvidia-cuda--{image}", image_kind="elf")]
    assert select(module, parse_device(device)).ok is fits


def test_ptx_is_jit_compiled_for_newer_devices_after_cubins() -> None:
    cubin = _image("cuda-nvptx64-nvidia-cuda--sm_80", image_kind="elf")
    ptx = _image("cuda-nvptx64-nvidia-cuda--compute_80", 1, image_kind="ptx")
    assert select([ptx, cubin], parse_device("sm_86")).chosen is cubin
    assert select([ptx, cubin], parse_device("sm_90")).chosen is ptx
    assert not select([ptx, cubin], parse_device("sm_90", ["no-ptx-jit"])).ok
    assert not select([ptx, cubin], parse_device("sm_75")).ok


# --------------------------------------------------------------------------------------------------
# Real fat objects and executables


HIP_SOURCE = """\
struct dim3 { unsigned x, y, z; };
extern "C" int hipLaunchKernel(const void *, dim3, dim3, void **, unsigned long, void *);
__attribute__((global)) void KERNEL(int *p) { p[0] = 1; }
"""
# A device runtime is not installed (-nogpulib): the two calls of a target region get stubs, so the
# executable links and carries real, linked device images.
OMP_SOURCE = """\
#pragma omp begin declare target device_type(nohost)
extern "C" int __kmpc_target_init(void *, void *) { return -1; }
extern "C" void __kmpc_target_deinit(void) {}
#pragma omp end declare target
int main() {
  int x = 0;
#pragma omp target map(tofrom: x)
  x = 42;
  return x != 42;
}
"""


CUDA_SOURCE = """\
struct dim3 { unsigned x, y, z; };
typedef struct CUstream_st *cudaStream_t;
extern "C" int cudaLaunchKernel(const void *, dim3, dim3, void **, unsigned long, cudaStream_t);
__attribute__((global)) void k(int *p) { p[0] = 1; }
"""


def _sh(cmd: list[object], cwd: Path) -> None:
    result = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True)
    assert result.returncode == 0, (cmd, result.stderr)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, llvm19, cuda) -> Path:
    d = tmp_path_factory.mktemp("select-real")
    cxx = llvm19("clang++")
    for name in ("k", "k2"):
        (d / f"{name}.hip").write_text(HIP_SOURCE.replace("KERNEL", name))
    (d / "omp.cpp").write_text(OMP_SOURCE)
    hip_cmd = [cxx, "-x", "hip", "-nogpulib", "-nogpuinc", "-c"]
    lld = ["-fuse-ld=lld", f"--ld-path={llvm19('ld.lld')}"]
    with ThreadPoolExecutor(8) as pool:
        for future in [pool.submit(_sh, cmd, d) for cmd in (
            [*hip_cmd, "--offload-arch=gfx90a:xnack+,gfx942", "k.hip", "-o", "hip.o"],
            [*hip_cmd, "--offload-arch=gfx90a:xnack+,gfx942", "--offload-compress", "k.hip", "-o", "hipc.o"],
            [*hip_cmd, "--offload-arch=gfx942", "k2.hip", "-o", "hip2.o"],
            [*hip_cmd, "--offload-arch=gfx1030,gfx10-3-generic", "-mcode-object-version=6", "k.hip", "-o", "gen.o"],
            [cxx, "-fopenmp", "--offload-arch=gfx90a,sm_90", "-nogpulib", f"--cuda-path={cuda('ptxas').parent.parent}",
             "-c", "omp.cpp", "-o", "omp.o"],
            [cxx, "-fopenmp", "--offload-arch=gfx90a:xnack+,gfx942,sm_90", "-nogpulib",
             f"--cuda-path={cuda('ptxas').parent.parent}", *lld, "omp.cpp", "-o", "omp.out"],
        )]:
            future.result()
    _sh([cxx, "-shared", *lld, "hip.o", "hip2.o", "-o", "libtwo.so"], d)
    for name in ("hip.o", "hipc.o"):  # the fat binaries themselves, for the bundler
        _sh([llvm19("llvm-objcopy"), "--dump-section", f".hip_fatbin={name}.fatbin", name, f"{name}.stripped"], d)
    (d / "truncated.fatbin").write_bytes((d / "hip.o.fatbin").read_bytes()[:200])
    # an NVIDIA fat binary with a cubin and PTX for sm_80 (the CUDA runtime's choice between them)
    (d / "k.cu").write_text(CUDA_SOURCE)
    _sh([cxx, "-x", "cuda", "--cuda-device-only", "--offload-arch=sm_80", "-nocudalib", "-nocudainc", "-S",
         "-Wno-unknown-cuda-version", "k.cu", "-o", "k.ptx"], d)
    _sh([cuda("ptxas"), "-arch=sm_80", "k.ptx", "-o", "k.cubin"], d)
    _sh([cuda("fatbinary"), "--create=k.fatbin", "--image3=kind=elf,sm=80,file=k.cubin",
         "--image3=kind=ptx,sm=80,file=k.ptx"], d)
    return d


def _chosen(path: Path, device: str, *caps: str) -> list[str | None]:
    result = select_file(path, parse_device(device, caps))
    return [s.chosen.entry_id if s.chosen else None for s in result.selections]


def test_real_hip_fat_objects(built: Path, llvm19) -> None:
    for name in ("hip.o", "hipc.o"):  # plain and CCOB-compressed .hip_fatbin
        assert _chosen(built / name, "gfx90a:sramecc+:xnack+") == [hip("gfx90a:xnack+")]
        assert _chosen(built / name, "gfx942:sramecc+:xnack-") == [hip("gfx942")]
        assert _chosen(built / name, "gfx90a:sramecc+:xnack-") == [None]
        # Clang 19 writes code object v5: the ELF header, not the kind, sets the requirement
        assert _chosen(built / name, "gfx942:sramecc+:xnack-", "cov4") == [None]
        assert _chosen(built / name, "gfx942:sramecc+:xnack-", "cov4", "cov5") == [hip("gfx942")]
    (image,) = [i for m in modules_in(built / "hipc.o") for i in m.images if i.target_id == "gfx942"]
    assert image.code_object_version == 5 and "cov5" in [str(r) for r in image.requirements]
    # and the real bundler, asked for the same devices on the extracted .hip_fatbin, extracts the same entries
    bundler = llvm19("clang-offload-bundler")
    for name in ("hip.o", "hipc.o"):
        for device, want in (("gfx942:sramecc+:xnack-", "gfx942"), ("gfx90a:sramecc-:xnack+", "gfx90a:xnack+")):
            out = built / f"{name}.{want}.co"
            _sh([bundler, "-unbundle", "-type=o", f"-targets=hipv4-{AMD}-{device}", f"-input={name}.fatbin",
                 f"-output={out.name}"], built)
            (chosen,) = select_file(built / name, device).selections
            assert out.read_bytes()[:4] == b"\x7fELF"
            assert chosen.chosen is not None and chosen.chosen.target_id == want


def test_real_generic_fat_object(built: Path) -> None:
    assert _chosen(built / "gen.o", "gfx1030") == [hip("gfx1030")]
    assert _chosen(built / "gen.o", "gfx1035") == [hip("gfx10-3-generic")]
    # generic code objects are v6: a loader without v6 cannot use them
    result = select_file(built / "gen.o", parse_device("gfx1035", ["cov5"]))
    assert not result.ok and "needs cov6" in " ".join(result.problems())
    assert _chosen(built / "gen.o", "gfx1100") == [None]


def test_real_openmp_objects_and_executables(built: Path) -> None:
    assert _chosen(built / "omp.o", "gfx90a:sramecc+:xnack-") == ["openmp-amdgcn-amd-amdhsa--gfx90a"]
    assert _chosen(built / "omp.o", "sm_90") == ["openmp-nvptx64-nvidia-cuda--sm_90"]
    assert _chosen(built / "omp.o", "sm_80") == [None]
    assert _chosen(built / "omp.out", "gfx90a:sramecc+:xnack+") == ["openmp-amdgcn-amd-amdhsa--gfx90a:xnack+"]
    assert _chosen(built / "omp.out", "gfx90a:sramecc+:xnack-") == [None]
    assert _chosen(built / "omp.out", "gfx942:sramecc-:xnack-") == ["openmp-amdgcn-amd-amdhsa--gfx942"]
    # omp.out's sm_90 image comes from CUDA 13's nvlink (cubin ELF ABI 8): LLVM 19's runtime refuses it (issue 27),
    # a runtime with the fix of llvm/llvm-project#159088 loads it
    assert _chosen(built / "omp.out", "sm_90a") == [None]
    assert _chosen(built / "omp.out", "sm_90a", "libomptarget=22") == ["openmp-nvptx64-nvidia-cuda--sm_90"]
    assert _chosen(built / "omp.out", "sm_90a", "libomptarget=21.1.2") == ["openmp-nvptx64-nvidia-cuda--sm_90"]
    assert _chosen(built / "omp.out", "sm_90a", "libomptarget=21.1.1") == [None]
    assert _chosen(built / "omp.out", "gfx942", "hip") == [None]  # an OpenMP image needs the OpenMP runtime


def test_real_nvidia_fat_binary(built: Path) -> None:
    """Cubin first (same major, minor not above the device's), then PTX JIT for newer devices."""
    assert _chosen(built / "k.fatbin", "sm_86") == ["cuda-nvptx64-nvidia-cuda--sm_80"]
    assert _chosen(built / "k.fatbin", "sm_90") == ["cuda-nvptx64-nvidia-cuda--compute_80"]
    assert _chosen(built / "k.fatbin", "sm_90", "no-ptx-jit") == [None]
    assert _chosen(built / "k.fatbin", "sm_75") == [None]


def test_every_linked_fat_binary_needs_an_image(built: Path) -> None:
    """A shared object of two HIP objects registers two fat binaries; each must have an image."""
    assert _chosen(built / "libtwo.so", "gfx942:sramecc+:xnack-") == [hip("gfx942"), hip("gfx942")]
    assert _chosen(built / "libtwo.so", "gfx90a:sramecc+:xnack+") == [hip("gfx90a:xnack+"), None]


def test_check_deployment(built: Path) -> None:
    assert check_deployment(built / "hip.o", ["gfx90a:sramecc+:xnack+", "gfx942:sramecc+:xnack-"]) == []
    problems = check_deployment(built / "libtwo.so", ["gfx942:sramecc+:xnack-", "gfx90a:sramecc-:xnack+",
                                                      "gfx90a:sramecc-:xnack- cov5"])
    assert len(problems) == 3, problems  # gfx90a xnack+: the second fat binary; xnack-: both
    assert all("no image for gfx90a" in p for p in problems)
    assert "needs xnack+; the device has xnack-" in problems[1]
    (problem,) = check_deployment(built / "gen.o", ["gfx1035;cov5"])
    assert "needs cov6 (code object version); the device's loader supports cov5" in problem
    (problem,) = check_deployment(built / "k.hip", ["gfx942"])
    assert "no device images" in problem
    with pytest.raises(SelectionError):
        check_deployment(built / "hip.o", ["gfx42"])


# --------------------------------------------------------------------------------------------------
# offload-select


def _select_cli(*args: object, stdin: bytes | None = None) -> subprocess.CompletedProcess[str]:
    import sys

    return subprocess.run([sys.executable, "-m", "offload_builders.cli.select", *map(str, args)], input=stdin,
                          capture_output=True, text=stdin is None)


def test_cli_prints_the_chosen_entry(built: Path) -> None:
    result = _select_cli("--device", "gfx90a:sramecc+:xnack+", built / "hipc.o")
    assert (result.returncode, result.stdout, result.stderr) == (0, hip("gfx90a:xnack+") + "\n", "")
    result = _select_cli("--device=amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-", built / "omp.out")
    assert (result.returncode, result.stdout) == (0, "openmp-amdgcn-amd-amdhsa--gfx942\n")


def test_cli_explains_why_nothing_fits(built: Path) -> None:
    result = _select_cli("--device", "gfx90a:sramecc+:xnack-", built / "hip.o")
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.splitlines() == [
        f"offload-select: {built / 'hip.o'}: no image fits gfx90a:sramecc+:xnack-",
        f"  {hip('gfx90a:xnack+')}: needs xnack+; the device has xnack-",
        f"  {hip('gfx942')}: needs processor gfx942; the device is gfx90a (no generic family)",
    ]
    result = _select_cli("--device", "gfx942:sramecc+:xnack-", "--cov", "4", built / "hip.o")
    assert result.returncode == 1
    assert f"  {hip('gfx942')}: needs cov5 (code object version); the device's loader supports cov4" in \
        result.stderr.splitlines()


def test_cli_several_devices_and_modules(built: Path) -> None:
    result = _select_cli("--device", "gfx942:sramecc+:xnack-", "--device", "gfx90a:sramecc+:xnack+",
                         built / "libtwo.so")
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert len(lines) == 3 and all(line.endswith(hip("gfx942")) for line in lines[:2])
    assert lines[0].startswith("gfx942:sramecc+:xnack-: ") and ": bundle 0: " in lines[0] and ": bundle 1: " in lines[1]
    assert lines[2].startswith("gfx90a:sramecc+:xnack+: ") and lines[2].endswith(hip("gfx90a:xnack+"))
    assert "bundle 1: no image fits gfx90a:sramecc+:xnack+" in result.stderr


def test_cli_json(built: Path) -> None:
    import json

    result = _select_cli("--json", "--device", "gfx1035", "--device-cap", "cov5,no-spirv", built / "gen.o")
    assert result.returncode == 1
    data = json.loads(result.stdout)
    assert data["ok"] is False
    (res,) = data["results"]
    assert res["device"]["code_object_versions"] == [5] and res["device"]["spirv"] is False
    (module,) = res["modules"]
    assert module["chosen"] is None
    generic = next(i for i in module["images"] if i["target_id"] == "gfx10-3-generic")
    assert generic["code_object_version"] == 6 and generic["unmet"][0].startswith("needs cov6")
    data = json.loads(_select_cli("--json", "--device", "gfx1035", built / "gen.o").stdout)
    assert data["ok"] and data["results"][0]["modules"][0]["chosen"]["entry_id"] == hip("gfx10-3-generic")
    images = {i["target_id"]: i for i in data["results"][0]["modules"][0]["images"]}
    assert images["gfx10-3-generic"]["tier"] == "generic" and images["gfx1030"]["fits"] is False


def test_cli_reads_standard_input(built: Path) -> None:
    result = _select_cli("--device", "gfx942:sramecc-:xnack-", "-", stdin=(built / "hipc.o").read_bytes())
    assert (result.returncode, result.stdout) == (0, hip("gfx942").encode() + b"\n")


@pytest.mark.parametrize("args, message", [
    (("--device", "gfx9000", "FILE"), "invalid device 'gfx9000'"),
    (("--device", "gfx90a:xnack", "FILE"), "has no '+' or '-' sign"),
    (("--device", "gfx90a", "--device-cap", "cov", "FILE"), "unknown device capability 'cov'"),
    (("--device", "gfx90a", "--cov", "four", "FILE"), "--cov: 'four'"),
    (("FILE",), "no --device given"),
    (("--device", "gfx90a"), "expected one input file, got 0"),
    (("--device", "gfx90a", "--frobnicate", "FILE"), "unknown option '--frobnicate'"),
    (("--device", "gfx90a", "MISSING"), "No such file or directory"),
    (("--device", "gfx90a", "DIR"), "Is a directory"),
    (("--device", "gfx90a", "TRUNCATED"), "truncated.fatbin: offset 0x28: entry 0"),
    (("--device", "gfx90a", "--device"), "option --device requires a value"),
])
def test_cli_errors_are_one_line(built: Path, args: tuple[str, ...], message: str) -> None:
    paths = {"FILE": built / "hip.o", "MISSING": built / "missing.o", "DIR": built,
             "TRUNCATED": built / "truncated.fatbin"}
    result = _select_cli(*(paths.get(a, a) for a in args))
    assert result.returncode == 1 and result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith("offload-select: error: ") and message in line, line
    assert "Traceback" not in result.stderr


def test_cli_help_and_version() -> None:
    result = _select_cli("--help")
    assert result.returncode == 0 and "--device-cap" in result.stdout
    assert _select_cli("--version").stdout.startswith("offload-select (offload-builders ")
