"""``bench/bench_build.py --scale``: its generated trees are what it says, SCons trees with real files and the
signatures a real build records, so the no-ops it times are real no-ops (checked with SCons' own ``$SPAWN``)."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO_ROOT
from test_scons_tool import SCONS

pytestmark = pytest.mark.slow


def _bench():
    spec = importlib.util.spec_from_file_location("bench_build", REPO_ROOT / "bench" / "bench_build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_build"] = module
    spec.loader.exec_module(module)
    return module


def _up_to_date(root: Path, mode: str, archs: str) -> bool:
    """SCons' question mode: exit status 0 only when every target is up to date (it runs nothing)."""
    return subprocess.run([SCONS, "-q", f"mode={mode}", f"archs={archs}"], cwd=root,
                          stdout=subprocess.DEVNULL).returncode == 0


def test_a_generated_tree_is_up_to_date_with_real_files_and_signatures(tmp_path):
    bench = _bench()
    archs = ["gfx90a", "sm_80"]
    roots = {mode: tmp_path / f"{mode}-3" for mode in ("ours", "mono")}
    for root in roots.values():
        bench.generate(root, 3)
    bench.generated_build(tmp_path, roots, archs)
    for mode, root in roots.items():
        template = tmp_path / f"template-{mode}-{len(archs)}"
        assert _up_to_date(root, mode, ",".join(archs)), mode
        # every kernel's outputs are the template's kernel_0 files, under the kernel's own names
        outputs = sorted(path.name for path in (template / "src").iterdir() if path.name.startswith("kernel_0."))
        expected = {"kernel_0.cpp", "kernel_0.o"} | ({"kernel_0.host.bc", "kernel_0.offload.pkg"} if mode == "ours"
                                                      else set())
        assert expected <= set(outputs), outputs
        for name in outputs:
            if not name.endswith(".cpp"):
                copy = root / "src" / name.replace("kernel_0.", "kernel_2.")
                assert copy.read_bytes() == (template / "src" / name).read_bytes(), copy
        # and the question is not vacuous: an edited source is out of date
        (root / "src" / "kernel_1.cpp").write_text(bench.source_text(1, device_edits=1))
        assert not _up_to_date(root, mode, ",".join(archs)), mode
