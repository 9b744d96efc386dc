"""Remote cache keys (offload_builders.remote.actions): independent of the checkout's path where the output is,
dependent on it where the output holds it, and on everything else that decides the output."""
from __future__ import annotations

from pathlib import Path

import pytest

from offload_builders.remote.actions import (
    CHECKOUT_TOKEN,
    NodeJob,
    cache_key,
    command_action,
    input_tree,
    outside_file_line,
    path_sensitive,
    portable_steps,
    relative_path,
)
from offload_builders.remote.digests import digest_of_bytes
from offload_builders.remote.protos import remote_execution_pb2

DEVICE_COMPILE = ("/usr/lib/llvm-19/bin/clang -cc1 -triple amdgcn-amd-amdhsa -emit-obj -fcuda-is-device "
                  "-fdebug-compilation-dir={root} -I {root}/include -o build/x.gfx90a.o.partial -x hip src/x.hip")


def job(root: str, step: str = DEVICE_COMPILE, source: bytes = b"__global__ void k() {}\n", **changes) -> NodeJob:
    fields = dict(root=root, steps=(step.format(root=root),), inputs={"src/x.hip": digest_of_bytes(source)},
                  salt_lines=("file /usr/lib/llvm-19/bin/clang abc/1",), outputs=("build/x.gfx90a.o",))
    fields.update(changes)
    return NodeJob(**fields)  # type: ignore[arg-type]


def test_the_key_does_not_depend_on_the_checkout_path():
    assert cache_key(job("/home/a/project")).action_digest == cache_key(job("/srv/ci/b")).action_digest
    step = portable_steps(job("/home/a/project").steps, "/home/a/project")[0]
    assert "/home/a/project" not in step and f"-fdebug-compilation-dir={CHECKOUT_TOKEN}" in step
    assert f"-I {CHECKOUT_TOKEN}/include" in step


def test_a_path_that_merely_starts_like_the_checkout_is_kept():
    step = portable_steps(("-I /home/a/project2/include -I /home/a/project/include",), "/home/a/project")[0]
    assert step == f"-I /home/a/project2/include -I {CHECKOUT_TOKEN}/include"


@pytest.mark.parametrize("flag", ["-debug-info-kind=constructor", "-fcoverage-mapping", "-lineinfo", "-g",
                                  "-coverage-notes-file={root}/x.gcno", "-record-command-line"])
def test_debug_information_keeps_the_checkout_path_in_the_key(flag):
    """``DW_AT_comp_dir`` (and coverage mappings, PTX line information) hold the compilation directory: such a
    node shares only with checkouts at the same path."""
    step = DEVICE_COMPILE + " " + flag
    assert path_sensitive([step.format(root="/a")])
    assert cache_key(job("/a", step)).action_digest != cache_key(job("/b", step)).action_digest
    assert cache_key(job("/a", step)).action_digest == cache_key(job("/a", step)).action_digest


def test_every_input_output_and_tool_is_in_the_key():
    base = cache_key(job("/a")).action_digest
    assert cache_key(job("/a", source=b"__global__ void k2() {}\n")).action_digest != base
    assert cache_key(job("/a", salt_lines=("file /usr/lib/llvm-19/bin/clang def/1",))).action_digest != base
    assert cache_key(job("/a", outputs=("build/y.gfx90a.o",))).action_digest != base
    assert cache_key(job("/a", step=DEVICE_COMPILE.replace("-emit-obj", "-emit-obj -O3"))).action_digest != base
    renamed = job("/a", inputs={"src/y.hip": digest_of_bytes(b"__global__ void k() {}\n")})
    assert cache_key(renamed).action_digest != base


def test_the_input_tree_is_the_canonical_reapi_merkle_tree():
    """Directories nest by path component, entries sorted by name, each Directory's digest over its
    serialization; the same files in another order give the same root."""
    a, b, c = (digest_of_bytes(data) for data in (b"a", b"b", b"c"))
    root, blobs = input_tree({"src/z.hip": a, "include/k.h": b, "src/a.hip": c})
    again, _ = input_tree({"src/a.hip": c, "src/z.hip": a, "include/k.h": b})
    assert root == again
    top = remote_execution_pb2.Directory.FromString(blobs[root])
    assert [entry.name for entry in top.directories] == ["include", "src"] and not top.files
    src = remote_execution_pb2.Directory.FromString(blobs[next(
        key for key in blobs if key.hash == top.directories[1].digest.hash)])
    assert [(entry.name, entry.digest.hash) for entry in src.files] == [("a.hip", c.hash), ("z.hip", a.hash)]
    for digest, data in blobs.items():
        assert digest_of_bytes(data) == digest


def test_an_action_for_a_worker_runs_the_argv_from_the_input_root():
    messages = command_action(["/bin/sh", "-c", "true"], job("/a"), environment={"PATH": "/usr/bin"})
    action = remote_execution_pb2.Action.FromString(messages.blobs[messages.action_digest])
    command = remote_execution_pb2.Command.FromString(messages.blobs[messages.command_digest])
    assert list(command.arguments) == ["/bin/sh", "-c", "true"]
    assert list(command.output_paths) == ["build/x.gfx90a.o"]
    assert action.input_root_digest.hash == messages.input_root_digest.hash
    assert b"/usr/lib/llvm-19/bin/clang abc/1" in action.salt


def test_relative_paths_never_leave_the_checkout(tmp_path: Path):
    assert relative_path(str(tmp_path / "a" / "b"), str(tmp_path)) == "a/b"
    assert relative_path(str(tmp_path.parent / "x"), str(tmp_path)) is None
    assert relative_path(str(tmp_path), str(tmp_path)) is None


def test_a_file_outside_the_checkout_is_named_by_its_content(tmp_path: Path):
    library = tmp_path / "libdevice.bc"
    library.write_bytes(b"one")
    first = outside_file_line(str(library))
    library.write_bytes(b"two")
    assert outside_file_line(str(library)) != first
    assert outside_file_line(str(tmp_path / "missing")).endswith(" missing")


def test_a_launcher_is_keyed_with_the_libraries_it_loads_from_its_run_path(tmp_path: Path, llvm19):
    """LLVM's clang is a small launcher over libclang-cpp and libLLVM: a rebuilt library under an unchanged
    launcher must change the key. A program linked here with RUNPATH $ORIGIN/../lib shows it."""
    import subprocess

    (tmp_path / "bin").mkdir()
    (tmp_path / "lib").mkdir()
    (tmp_path / "main.c").write_text("int answer(void);\nint main(void) { return answer(); }\n")
    clang = str(llvm19("clang"))
    lines = []
    for value in (1, 2):
        (tmp_path / "answer.c").write_text(f"int answer(void) {{ return {value}; }}\n")
        subprocess.run([clang, "-shared", "-fPIC", "-Wl,--build-id", "-o", str(tmp_path / "lib" / "libanswer.so"),
                        str(tmp_path / "answer.c")], check=True)
        subprocess.run([clang, "-o", str(tmp_path / "bin" / "prog"), str(tmp_path / "main.c"),
                        "-L", str(tmp_path / "lib"), "-lanswer", "-Wl,-rpath,$ORIGIN/../lib"], check=True)
        if value == 1:
            launcher = (tmp_path / "bin" / "prog").read_bytes()
        else:
            (tmp_path / "bin" / "prog").write_bytes(launcher)  # the same launcher bytes over a new library
        lines.append(outside_file_line(str(tmp_path / "bin" / "prog")))
    assert all(f"loads {tmp_path / 'lib' / 'libanswer.so'} build-id " in line for line in lines), lines
    assert lines[0].splitlines()[0] == lines[1].splitlines()[0] and lines[0] != lines[1]
    assert "libLLVM.so.19.1 build-id " in outside_file_line(clang)
