"""Our link side against clang-linker-wrapper 19: same device files, same kernels, programs that run.

The fat objects are built by the real Clang 19 driver; the reference links are the driver's own (through
``clang-linker-wrapper``, with ``-save-temps`` to keep its device images); ours go through
``offload-link``, which the driver runs in the wrapper's place when ``-B`` points at a directory whose
``clang-linker-wrapper`` starts it.
"""
from __future__ import annotations

import mmap
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from offload_builders import linking
from offload_builders.linking import DeviceSymbol, LinkInput
from offload_builders.linking.inputs import _SymbolTable
from offload_builders.targets import AMDGPU_TRIPLE, NVPTX_TRIPLE
from offload_builders.toolchain import find_toolchain

pytestmark = pytest.mark.slow

OFFLOAD_LINK = str(Path(sys.executable).with_name("offload-link"))
RUN_ENV = dict(os.environ, OMP_TARGET_OFFLOAD="MANDATORY", LD_LIBRARY_PATH="/usr/lib/llvm-19/lib")
X86 = "-fopenmp-targets=x86_64-unknown-linux-gnu"

MAIN = textwrap.dedent("""
    #include <cstdio>
    #include <omp.h>
    void scale(double *x, int n, double f);
    #pragma omp declare target
    double twice(double v);
    #pragma omp end declare target
    int main() {
      double x[16];
      for (int i = 0; i < 16; ++i) x[i] = i;
      scale(x, 16, 3.0);
      int on_device = 0;
      double t = 0;
      #pragma omp target map(from : on_device, t)
      { on_device = !omp_is_initial_device(); t = twice(21.0); }
      std::printf("on_device=%d x[5]=%g t=%g\\n", on_device, x[5], t);
      return on_device && x[5] == 15.0 && t == 42.0 ? 0 : 1;
    }
""")
SCALE = textwrap.dedent("""
    void scale(double *x, int n, double f) {
      #pragma omp target teams distribute parallel for map(tofrom : x[0 : n])
      for (int i = 0; i < n; ++i) x[i] *= f;
    }
""")
TWICE = textwrap.dedent("""
    #pragma omp declare target
    double twice(double v) { return 2 * v; }
    #pragma omp end declare target
""")
UNUSED = textwrap.dedent("""
    void never_called(int *p) {
      #pragma omp target map(tofrom : p[0 : 1])
      p[0] += 1;
    }
""")


@pytest.fixture(scope="module")
def objects(tmp_path_factory, llvm19) -> Path:
    """main.o plus libkern.a (scale, twice, unused) built for the x86_64 device and for sm_80 + gfx90a."""
    root = tmp_path_factory.mktemp("link")
    for name, text in (("main", MAIN), ("scale", SCALE), ("twice", TWICE), ("unused", UNUSED)):
        (root / f"{name}.cpp").write_text(text)
    clangxx = str(llvm19("clang++"))
    for flavour, flags in (("x86", [X86]), ("gpu", ["--offload-arch=sm_80,gfx90a", "-nogpulib"])):
        out = root / flavour
        out.mkdir()
        for name in ("main", "scale", "twice", "unused"):
            subprocess.run([clangxx, "-fopenmp", *flags, "-O2", "-c", str(root / f"{name}.cpp"), "-o",
                            str(out / f"{name}.o")], check=True)
        subprocess.run([str(llvm19("llvm-ar")), "rcs", str(out / "libkern.a"),
                        *(str(out / f"{n}.o") for n in ("scale", "twice", "unused"))], check=True)
    shim = root / "shim"
    shim.mkdir()
    (shim / "clang-linker-wrapper").write_text(f"#!/bin/sh\nexec {OFFLOAD_LINK} \"$@\"\n")
    (shim / "clang-linker-wrapper").chmod(0o755)
    return root


def _driver_link(llvm19, cwd: Path, args: list[str], ours: bool) -> subprocess.CompletedProcess:
    argv = [str(llvm19("clang++")), "-fopenmp", "-O2", "-fuse-ld=lld", *args]
    if ours:
        argv.insert(1, f"-B{cwd.parent / 'shim'}")
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True)


def _kernels(image: Path, llvm19) -> set[str]:
    listing = subprocess.run([str(llvm19("llvm-nm")), "--defined-only", "-D", str(image)],
                             capture_output=True, text=True, check=True).stdout
    return {line.split()[-1] for line in listing.splitlines() if line.split()[-1].startswith("__omp_offloading_")}


def test_static_library_program_runs_and_links_the_same_kernels(objects, llvm19):
    work = objects / "x86"
    theirs = _driver_link(llvm19, work, [X86, "-save-temps", "main.o", "libkern.a", "-o", "theirs"], ours=False)
    assert theirs.returncode == 0, theirs.stderr
    ours = _driver_link(llvm19, work, [X86, "-save-temps", "main.o", "libkern.a", "-o", "ours"], ours=True)
    assert ours.returncode == 0, ours.stderr
    for program in ("theirs", "ours"):
        run = subprocess.run([str(work / program)], capture_output=True, text=True, env=RUN_ENV)
        assert (run.returncode, run.stdout) == (0, "on_device=1 x[5]=15 t=42\n"), run.stderr
    their_image = next(work.glob("theirs.x86_64*.img"))
    our_image = work / "ours.x86_64-unknown-linux-gnu.native.img"
    assert _kernels(our_image, llvm19) == _kernels(their_image, llvm19)
    assert len(_kernels(our_image, llvm19)) == 3  # main's region, scale's loop, and unused.o's kernel


def test_selection_matches_the_wrapper_and_ignores_library_order(objects):
    work = objects / "gpu"
    runtime = "/usr/lib/llvm-19/lib/libomptarget.devicertl.a"
    forward = linking.scan_link_inputs([str(work / "main.o"), str(work / "libkern.a"), runtime])
    backward = linking.scan_link_inputs([runtime, str(work / "libkern.a"), str(work / "main.o")])
    for key in (("nvptx64-nvidia-cuda", "sm_80"), ("amdgcn-amd-amdhsa", "gfx90a")):
        chosen = {f.describe() for f in linking.select_device_files(forward, key)}
        assert chosen == {f.describe() for f in linking.select_device_files(backward, key)}
        members = sorted(d.split("(")[1].split(")")[0] for d in chosen if "(" in d)
        arch = key[1]
        device_rtl = "devicertl-nvptx-sm_80.o" if arch == "sm_80" else "devicertl-amdgpu-gfx90a.o"
        assert members == sorted([device_rtl, "scale.o", "twice.o", "unused.o"])


def test_whole_archive_takes_every_member_and_archives_alone_give_nothing(objects):
    work = objects / "gpu"
    key = ("amdgcn-amd-amdhsa", "gfx90a")
    alone = linking.scan_link_inputs([str(work / "libkern.a")])
    assert linking.select_device_files(alone, key) == []
    whole = linking.scan_link_inputs([LinkInput(str(work / "libkern.a"), whole_archive=True)])
    assert len(linking.select_device_files(whole, key)) == 3


def test_lazy_rule_on_symbols():
    """The two reasons an archive member is taken, and the ones that are not enough."""
    table = _SymbolTable()
    assert table.add([DeviceSymbol("f", True, False, False), DeviceSymbol("w", True, True, False)],
                     is_archive=False, has_offload_kind=True)
    assert not table.add([DeviceSymbol("w", False, False, True)], is_archive=True, has_offload_kind=True)  # weak ref
    assert not table.add([DeviceSymbol("h", False, False, True)], is_archive=True, has_offload_kind=True)  # hidden
    assert table.add([DeviceSymbol("f", False, False, True)], is_archive=True, has_offload_kind=True)  # resolves f
    assert not table.add([DeviceSymbol("f", False, False, False)], is_archive=True, has_offload_kind=True)  # f known
    # a new global
    assert table.add([DeviceSymbol("kernel", False, False, False)], is_archive=True, has_offload_kind=True)
    assert not table.add([DeviceSymbol("other", False, False, False)], is_archive=True, has_offload_kind=False)
    # a new definition the symbol table may omit (linkonce_odr unnamed_addr bitcode)
    assert not table.add([DeviceSymbol("inline_fn", False, True, False, True)], is_archive=True, has_offload_kind=True)


#: An archive member whose one global definition is ``helper``; its device constructor prints when the member
#: is linked into the x86_64 device image (a shared object the plugin loads).
MEMBER_IR = textwrap.dedent("""\
    target triple = "x86_64-unknown-linux-gnu"
    @.str = private unnamed_addr constant [24 x i8] c"member constructor ran\\0A\\00"
    @llvm.global_ctors = appending global [1 x {{ i32, ptr, ptr }}]
                         [{{ i32, ptr, ptr }} {{ i32 65535, ptr @ctor, ptr null }}]
    declare i32 @printf(ptr, ...)
    define linkonce_odr i32 @helper(){unnamed_addr} {{
      ret i32 7
    }}
    define internal void @ctor() {{
      %1 = call i32 (ptr, ...) @printf(ptr @.str)
      ret void
    }}
""")
TARGET_REGION = "int main() { int r = 0;\n#pragma omp target map(from : r)\n  r = 1;\n  return r == 1 ? 0 : 1; }\n"


@pytest.mark.parametrize("unnamed_addr, extracted", [(" unnamed_addr", False), ("", True)],
                         ids=["may-omit", "kept"])
def test_a_member_whose_definitions_may_be_omitted_is_not_extracted(llvm19, tmp_path, unnamed_addr, extracted):
    """``clang-linker-wrapper`` extracts an archive member for a new global definition only if the symbol
    table must keep it (``getSymbolsFromBitcode``: not ``canBeOmittedFromSymbolTable``, which a
    ``linkonce_odr unnamed_addr`` function is). The member's device constructor shows what the driver's
    link took; our selection must take the same."""
    layout = subprocess.run([str(llvm19("clang")), "-S", "-emit-llvm", "-x", "c", "-", "-o", "-"], input="",
                            capture_output=True, text=True, check=True).stdout
    (tmp_path / "member.ll").write_text(next(line for line in layout.splitlines() if "datalayout" in line) + "\n"
                                        + MEMBER_IR.format(unnamed_addr=unnamed_addr))
    (tmp_path / "member_host.c").write_text("int member_host_symbol = 1;\n")
    (tmp_path / "main.cpp").write_text(TARGET_REGION)
    for argv in (["llvm-as", "member.ll", "-o", "member.bc"],
                 ["clang-offload-packager", "-o", "member.pkg",
                  "--image=file=member.bc,triple=x86_64-unknown-linux-gnu,arch=generic,kind=openmp"],
                 ["clang", "-c", "member_host.c", "-Xclang", "-fembed-offload-object=member.pkg", "-o", "member.o"],
                 ["llvm-ar", "rcs", "libmember.a", "member.o"],
                 ["clang++", "-fopenmp", X86, "-O2", "-c", "main.cpp", "-o", "main.o"],
                 ["clang++", "-fopenmp", X86, "-O2", "-fuse-ld=lld", "main.o", "libmember.a", "-o", "theirs"]):
        subprocess.run([str(llvm19(argv[0])), *argv[1:]], cwd=tmp_path, check=True)
    run = subprocess.run([str(tmp_path / "theirs")], capture_output=True, text=True, env=RUN_ENV)
    assert run.returncode == 0, run.stderr
    assert ("member constructor ran" in run.stdout) == extracted, run.stdout
    scanned = linking.scan_link_inputs([str(tmp_path / "main.o"), str(tmp_path / "libmember.a")])
    chosen = [found.describe() for found in linking.select_device_files(scanned, ("x86_64-unknown-linux-gnu", ""))]
    assert any("libmember.a(member.o)" in name for name in chosen) == extracted, chosen


@pytest.mark.parametrize("lhs, rhs, compatible", [
    (("amdgcn-amd-amdhsa", "gfx90a"), ("amdgcn-amd-amdhsa", "gfx90a:xnack+"), True),
    (("amdgcn-amd-amdhsa", "gfx90a:xnack-"), ("amdgcn-amd-amdhsa", "gfx90a:xnack+"), False),
    (("amdgcn-amd-amdhsa", "gfx90a:sramecc+"), ("amdgcn-amd-amdhsa", "gfx90a:xnack+"), True),
    (("amdgcn-amd-amdhsa", "gfx90a"), ("amdgcn-amd-amdhsa", "gfx942"), False),
    (("amdgcn-amd-amdhsa", "generic"), ("amdgcn-amd-amdhsa", "gfx942"), True),
    (("nvptx64-nvidia-cuda", "sm_80"), ("nvptx64-nvidia-cuda", "sm_90"), False),
    (("nvptx64-nvidia-cuda", "sm_80"), ("nvptx64-nvidia-cuda", "sm_80"), False),  # equal is not "compatible"
    (("nvptx64-nvidia-cuda", "generic"), ("amdgcn-amd-amdhsa", "generic"), False),
])
def test_target_compatibility(lhs, rhs, compatible):
    assert linking.targets_compatible(lhs, rhs) is compatible
    assert linking.targets_compatible(rhs, lhs) is compatible


def test_gpu_link_through_offload_link_registers_each_image(objects, llvm19):
    work = objects / "gpu"
    linked = _driver_link(llvm19, work, ["--offload-arch=sm_80,gfx90a", "main.o", "libkern.a", "-o", "gpu_ours"],
                          ours=True)
    assert linked.returncode == 0, linked.stderr
    listing = subprocess.run([sys.executable, "-m", "offload_builders.cli.inspect", str(work / "gpu_ours")],
                             capture_output=True, text=True, check=True).stdout
    assert "triple=nvptx64-nvidia-cuda arch=sm_80 image=elf" in listing
    assert "triple=amdgcn-amd-amdhsa arch=gfx90a image=elf" in listing
    assert listing.count("offload binary") == 2


def _offload_link(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([OFFLOAD_LINK, *args], cwd=cwd, capture_output=True, text=True)


def test_dry_run_prints_the_commands_and_writes_nothing(objects, llvm19):
    work = objects / "x86"
    done = _offload_link("--dry-run", f"--linker-path={llvm19('ld.lld')}", "--", "-o", "dry", "main.o",
                         "libkern.a", cwd=work)
    assert done.returncode == 0, done.stderr
    # The x86_64 device link is the driver's own ld.lld job (a shared object), then the host link.
    assert done.stderr.count("ld.lld") == 2 and " -shared " in done.stderr
    assert not (work / "dry").exists()


def test_remarks_the_driver_passes_are_ignored_and_other_llvm_options_refused(objects, llvm19):
    """``-Rpass=inline`` reaches the wrapper as ``--offload-opt=-pass-remarks=inline`` (diagnostics only):
    accepted and kept from the host linker; any other ``--offload-opt`` would change the device code: refused."""
    work = objects / "x86"
    done = _offload_link("--dry-run", f"--linker-path={llvm19('ld.lld')}", "--offload-opt=-pass-remarks=inline",
                         "--", "-o", "dry", "main.o", "libkern.a", cwd=work)
    assert done.returncode == 0, done.stderr
    assert "pass-remarks" not in done.stderr
    done = _offload_link(f"--linker-path={llvm19('ld.lld')}", "--offload-opt=-amdgpu-early-inline-all", "main.o",
                         cwd=work)
    assert done.returncode == 1 and done.stderr.startswith("offload-link: error: --offload-opt is a")


@pytest.mark.parametrize("args, message", [
    (["--", "-o", "x", "main.o"], "--linker-path"),
    (["--linker-path=/usr/bin/ld", "--wrapper-jobs=zero", "main.o"], "--wrapper-jobs"),
    (["--linker-path=/usr/bin/ld", "--embed-bitcode", "main.o"], "--embed-bitcode"),
    (["--linker-path=/usr/bin/ld", "--host-triple=aarch64-apple-darwin", "main.o"], "x86_64 Linux"),
    (["--linker-path=/usr/bin/ld", "-lnosuchlibrary", "main.o"], "-lnosuchlibrary"),
    (["--linker-path=/usr/bin/ld", "--compression-level=fast", "main.o"],
     "--compression-level: expected an integer, got 'fast'"),
])
def test_usage_errors_are_one_line(objects, args, message):
    done = _offload_link(*args, cwd=objects / "x86")
    assert done.returncode == 1
    assert done.stderr.startswith("offload-link: error:") and message in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr


def test_a_link_without_device_code_gets_no_registration_code(objects, llvm19, tmp_path):
    """As with clang-linker-wrapper, host objects alone link through offload-link with no registration object,
    so they need no offload runtime (an empty OpenMP descriptor would need libomptarget)."""
    (tmp_path / "plain.cpp").write_text("int main() { return 0; }\n")
    clangxx = str(llvm19("clang++"))
    subprocess.run([clangxx, "-c", "plain.cpp"], cwd=tmp_path, check=True)
    linked = subprocess.run([clangxx, f"-B{objects / 'shim'}", "--offload-link", "-fuse-ld=lld", "plain.o", "-o",
                             "plain"], cwd=tmp_path, capture_output=True, text=True)
    assert linked.returncode == 0, linked.stderr
    assert subprocess.run([str(tmp_path / "plain")]).returncode == 0


def test_damaged_input_is_one_line_naming_the_file(objects, llvm19, tmp_path):
    good = (objects / "x86" / "scale.o").read_bytes()
    damaged = tmp_path / "damaged.o"
    at = good.index(b"\x10\xff\x10\xad")
    damaged.write_bytes(good[:at + 8] + b"\xff" * 16 + good[at + 24:])
    done = _offload_link(f"--linker-path={llvm19('ld.lld')}", "-o", str(tmp_path / "out"), str(damaged),
                         cwd=tmp_path)
    assert done.returncode == 1 and "damaged.o" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists()


SELECT_IN_CHILD = """
import sys
from offload_builders import linking
from offload_builders.formats import containers, irsymtab
work, runtime, table = sys.argv[1], sys.argv[2], sys.argv[3]
if table == "without":  # as for bitcode with no symbol table of its own (LLVM 4, another table version)
    irsymtab.read_symbols = lambda data, label="": None
scanned = linking.scan_link_inputs([work + "/main.o", work + "/libkern.a", runtime])
chosen = sorted(f.describe() for f in linking.select_device_files(scanned, ("nvptx64-nvidia-cuda", "sm_80")))
print(containers._BitcodeChild._current is not None, *chosen)
"""


def _select(objects, env, table: str) -> list[str]:
    argv = [sys.executable, "-c", SELECT_IN_CHILD, str(objects / "gpu"),
            "/usr/lib/llvm-19/lib/libomptarget.devicertl.a", table]
    return subprocess.run(argv, env=env, capture_output=True, text=True, check=True).stdout.split()


def test_device_bitcode_symbols_come_from_the_files_symbol_table(objects, tmp_path):
    """The device runtime's bitcode members are read through their own symbol table, as clang-linker-wrapper
    reads them: no LLVM child process, nothing cached, and the files LLVM's parse of each module selects."""
    env = dict(os.environ, OFFLOAD_BUILDERS_CACHE_DIR=str(tmp_path / "cache"))
    with_table = _select(objects, env, "with")
    assert with_table[0] == "False" and any("devicertl-nvptx-sm_80.o" in d for d in with_table[1:])
    assert not (tmp_path / "cache" / "device-symbols.json").exists()
    assert _select(objects, dict(env, OFFLOAD_BUILDERS_CACHE_DIR=""), "without")[1:] == with_table[1:]


def test_device_bitcode_symbols_without_a_table_are_remembered_across_links(objects, tmp_path):
    """Bitcode without a symbol table is read by LLVM (in a child process) once per user, not once per link:
    the second link selects the same files without starting the child."""
    env = dict(os.environ, OFFLOAD_BUILDERS_CACHE_DIR=str(tmp_path / "cache"))
    first, second = _select(objects, env, "without"), _select(objects, env, "without")
    assert first[0] == "True" and second[0] == "False"  # the child parsed bitcode only the first time
    assert first[1:] == second[1:] and any("devicertl-nvptx-sm_80.o" in d for d in first[1:])
    assert (tmp_path / "cache" / "device-symbols.json").is_file()
    assert _select(objects, dict(env, OFFLOAD_BUILDERS_CACHE_DIR=""), "without") == first


def test_large_host_libraries_without_offload_code_are_searched_once(objects, tmp_path, monkeypatch):
    """libgcc.a (3 MB, named twice by the driver) is searched for offload code once per user, not twice
    per link; a changed file is searched again, and files with offload code are never remembered."""
    monkeypatch.setenv("OFFLOAD_BUILDERS_CACHE_DIR", str(tmp_path / "cache"))
    library = tmp_path / "libbig.a"
    library.write_bytes(Path("/usr/lib/gcc/x86_64-linux-gnu/12/libgcc.a").read_bytes())
    searched: list[str] = []
    search = mmap.mmap

    def counting_mmap(fileno, length, **kwargs):
        searched.append(os.readlink(f"/proc/self/fd/{fileno}"))
        return search(fileno, length, **kwargs)

    monkeypatch.setattr(mmap, "mmap", counting_mmap)
    inputs = [str(objects / "gpu" / "main.o"), str(library), str(library), str(objects / "gpu" / "libkern.a")]
    first = linking.scan_link_inputs(inputs)
    assert searched.count(str(library)) == 1  # the second naming adds nothing: its members are in already
    searched.clear()
    second = linking.scan_link_inputs(inputs)
    assert str(library) not in searched and str(objects / "gpu" / "main.o") in searched
    assert [f.describe() for f in second.archive_members] == [f.describe() for f in first.archive_members]
    assert len(first.archive_members) > 0 and [o.path for o in second.objects] == [str(objects / "gpu" / "main.o")]
    os.utime(library, ns=(library.stat().st_atime_ns, library.stat().st_mtime_ns + 10**9))
    searched.clear()
    linking.scan_link_inputs(inputs)
    assert searched.count(str(library)) == 1


@pytest.mark.parametrize("flag", ["-O2", "-O3", "-Os", "-O0", "-Ofast"])
def test_nvptx_device_link_assembles_at_the_drivers_level(tmp_path, llvm19, flag):
    """clang-linker-wrapper hands the LTO result to the driver, whose ptxas level follows ``-O``;
    clang-nvlink-wrapper left alone would run ptxas at -O3, so our link passes the level on."""
    (tmp_path / "k.c").write_text("int f(int x) { return x + 1; }\n")
    (tmp_path / "k.s").write_text("")
    nvptx = [llvm19("clang"), "--target=nvptx64-nvidia-cuda", "-march=sm_80", "-nogpulib"]
    subprocess.run([*nvptx, "-flto", "-c", "k.c", "-o", "k.o"], cwd=tmp_path, check=True)
    argv = linking.device_link_command(find_toolchain(), (NVPTX_TRIPLE, "sm_80"), ["k.o"], "k.img",
                                       flags=(flag,))
    ours = subprocess.run([*argv, "-Wl,--dry-run"], cwd=tmp_path, capture_output=True, text=True, check=True)
    driver = subprocess.run([*nvptx, flag, "-###", "-c", "k.s"], cwd=tmp_path, capture_output=True, text=True,
                            check=True)

    def ptxas_level(output: str) -> str:
        line = next(line for line in output.splitlines() if "ptxas" in line)
        return next(arg.strip('"') for arg in line.split() if arg.strip('"').startswith("-O"))

    assert ptxas_level(ours.stdout + ours.stderr) == ptxas_level(driver.stderr)


@pytest.mark.parametrize("key", [("x86_64-unknown-linux-gnu", "x86_64"), (AMDGPU_TRIPLE, "gfx90a"),
                                 (NVPTX_TRIPLE, "sm_80")])
def test_probed_device_link_job_links_what_the_driver_links(objects, key, tmp_path):
    """The driver's device-link job, filled in with other inputs, gives the image the driver gives."""
    flavour = "x86" if key[1] == "x86_64" else "gpu"
    scanned = linking.scan_link_inputs([objects / flavour / "main.o", objects / flavour / "libkern.a",
                                        "/usr/lib/llvm-19/lib/libomptarget.devicertl.a"])
    linking.write_device_inputs(linking.select_device_files(scanned, key), tmp_path / "inputs.devin")
    inputs = linking.unpack_device_inputs(tmp_path / "inputs.devin", tmp_path / "in")
    toolchain = find_toolchain()
    job = linking.probe_device_link(toolchain, key)
    assert job is not None and os.path.basename(str(job.argv[0])) in ("ld.lld", "clang-nvlink-wrapper")
    by_driver = linking.device_link_command(toolchain, key, inputs, str(tmp_path / "driver.img"))
    direct = job.render(inputs=inputs, output=str(tmp_path / "direct.img"))
    for argv in (by_driver, direct):
        subprocess.run(argv, cwd=tmp_path, check=True, capture_output=True)
    assert (tmp_path / "driver.img").read_bytes() == (tmp_path / "direct.img").read_bytes()
