"""The jobs offload-cache makes in its own process: the packager's output against Clang 19's
``clang-offload-packager`` and Clang 22's ``llvm-offload-binary`` run on the same words, byte for byte; words it
does not follow (HIP's kind, whose number changed in LLVM 21; an option it does not know) are left to the tool.
The embedding back end is checked against Clang in ``test_elf_object_layout.py`` and ``test_offload_cache.py``."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from conftest import LLVM19_BIN
from offload_builders.launcher.in_process import embedding_of, packaged_here


def _images(tmp: Path) -> list[str]:
    source = tmp / "k.c"
    source.write_text("int k(int x) { return x + 1; }\n")
    bitcode = tmp / "k-gfx90a.bc"
    subprocess.run([str(LLVM19_BIN / "clang"), "--target=amdgcn-amd-amdhsa", "-mcpu=gfx90a", "-nogpulib",
                    "-emit-llvm", "-c", str(source), "-o", str(bitcode)], check=True)
    cubin = tmp / "k-sm_80.cubin"
    cubin.write_bytes(b"\x7fELF" + bytes(range(251)))
    return [f"--image=file={bitcode},triple=amdgcn-amd-amdhsa,arch=gfx90a,kind=openmp",
            f"--image=file={cubin},triple=nvptx64-nvidia-cuda,arch=sm_80,kind=openmp,feature=+ptx80",
            f"--image=file={cubin},triple=nvptx64-nvidia-cuda,arch=sm_80,kind=cuda"]


@pytest.mark.parametrize("release", ["19", "22"])
def test_the_package_is_the_packagers(tmp_path, llvm22, release):
    tool = str(LLVM19_BIN / "clang-offload-packager") if release == "19" else str(llvm22("llvm-offload-binary"))
    images = _images(tmp_path)
    expected = tmp_path / "tool.out"
    subprocess.run([tool, "-o", str(expected), *images], check=True)
    ours = tmp_path / "ours.out"
    assert packaged_here([tool, "-o", str(ours), *images], str(ours))
    assert ours.read_bytes() == expected.read_bytes()


def test_words_it_does_not_follow_are_left_to_the_tool(tmp_path):
    tool = str(LLVM19_BIN / "clang-offload-packager")
    images = _images(tmp_path)
    out = tmp_path / "p.out"
    hip = images[0].replace("kind=openmp", "kind=hip")
    assert not packaged_here([tool, "-o", str(out), hip], str(out))
    assert not packaged_here([tool, "-o", str(out), "--archive", *images], str(out))
    assert not packaged_here([tool, "-o", str(tmp_path / "elsewhere"), *images], str(out))
    assert not packaged_here([str(LLVM19_BIN / "clang"), "-o", str(out), *images], str(out))
    assert not packaged_here([tool, "-o", str(out), images[0].replace("k-gfx90a.bc", "missing.bc")], str(out))
    assert not out.exists()


def test_only_a_back_end_embedding_an_earlier_jobs_package_is_rewritten():
    words = ["clang", "-cc1", "-emit-obj", "-fembed-offload-object=/tmp/p.out", "-x", "ir", "/tmp/h.bc"]
    parts = ["clang 1 2", "-cc1", "-emit-obj", "-fembed-offload-object=@abc@", "-x", "ir", "@def@"]
    one, other = embedding_of(words, parts), embedding_of(words, [*parts[:3], "-fembed-offload-object=@xyz@",
                                                                  *parts[4:]])
    assert one is not None and other is not None and one.package == "abc" and one.key == other.key
    assert embedding_of(words, [*parts[:3], "-fembed-offload-object=/a/user/file", *parts[4:]]) is None
    assert embedding_of([*words[:2], "-emit-llvm-bc", *words[3:]], parts) is None
    assert embedding_of(words, [*parts, "-fembed-offload-object=@second@"]) is None
