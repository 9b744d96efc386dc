"""``$OFFLOAD_IMAGE_GROUPS``: one device image per group of sources and target, each group registered on its
own (offload_builders.linking.image_groups, scons/groups.py), with the real toolchain and libomptarget.

The x86_64 device runs the programs for real; the AMDGPU images are compared with the whole-program image
the default link makes of the same objects (kernel resources, no traps), since no GPU runs here.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SCONS = str(Path(sys.executable).with_name("scons"))
REPO_ROOT = Path(__file__).resolve().parent.parent

SCONSTRUCT = textwrap.dedent("""
    import offload_builders.scons
    env = Environment(tools=["default", "offload"], toolpath=[offload_builders.scons.toolpath()],
                      OFFLOAD_ARCHS=ARGUMENTS.get("archs", "x86_64"), OFFLOAD_FLAGS=["-O2"],
                      OFFLOAD_IMAGE_GROUPS=ARGUMENTS.get("groups", "1") == "1")
    sources = ARGUMENTS.get("sources", "a.cpp b.cpp c.cpp main.cpp").split()
    env.OffloadProgram("prog", [env.OffloadObject(source) for source in sources])
""")

#: a.cpp's kernel calls b.cpp's declare-target function (one group); c.cpp stands alone; main.cpp has no
#: target region (its device code registers nothing: no image).
SOURCES = {
    "a.cpp": """
        #pragma omp declare target
        int helper(int);
        #pragma omp end declare target
        int run_a(int n) {
          int r = 0;
        #pragma omp target map(tofrom : r)
          r = helper(n) + 1;
          return r;
        }
    """,
    "b.cpp": """
        #pragma omp declare target
        int b_scale = 3;
        int helper(int x) { return x * b_scale; }
        #pragma omp end declare target
        int run_b(int n) {
          int r = 0;
        #pragma omp target map(tofrom : r)
          r = helper(n) + 2;
          return r;
        }
    """,
    "c.cpp": """
        #pragma omp declare target
        int c_value = 40;
        #pragma omp end declare target
        int run_c(int n) {
          int r = 0;
        #pragma omp target map(tofrom : r)
          r = c_value + n + C_EXTRA;
          return r;
        }
    """,
    "main.cpp": """
        #include <cstdio>
        int run_a(int); int run_b(int); int run_c(int);
        int main() {
          std::printf("a=%d b=%d c=%d\\n", run_a(2), run_b(2), run_c(2));
          return 0;
        }
    """,
}

RUN_ENV = {"OMP_TARGET_OFFLOAD": "MANDATORY", "LD_LIBRARY_PATH": "/usr/lib/llvm-19/lib", "LIBOMPTARGET_INFO": "1"}


def _write(root: Path, c_extra: int = 0) -> None:
    (root / "SConstruct").write_text(SCONSTRUCT)
    for name, text in SOURCES.items():
        (root / name).write_text(textwrap.dedent(text).replace("C_EXTRA", str(c_extra)))


def _scons(root: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    done = subprocess.run([SCONS, "-Q", *args], cwd=root, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def _group_links(output: str) -> list[str]:
    """The group links a build ran (each prints its device-link command)."""
    return [line for line in output.splitlines() if ".groups.cache/link.partial" in line]


def _run(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["./prog"], cwd=root, env=dict(os.environ, **RUN_ENV), capture_output=True, text=True,
                          check=False)


def test_groups_follow_device_symbols_and_the_program_runs(tmp_path):
    _write(tmp_path)
    _scons(tmp_path)
    plan = json.loads((tmp_path / "prog.offload.groups").read_text())
    assert [group["objects"] for group in plan["groups"]] == [["a.o", "b.o"], ["c.o"]]
    entries = [group["entries"] for group in plan["groups"]]
    assert "b_scale" in entries[0] and "c_value" in entries[1]
    assert sum(name.startswith("__omp_offloading_") for name in entries[0]) == 2
    done = _run(tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "a=7 b=8 c=42"
    # every region ran on the device (libomptarget's info lines name each launch), and no table went wrong
    assert len(re.findall(r"Entering OpenMP kernel at", done.stderr)) == 3, done.stderr
    assert "Failed to load" not in done.stderr and "mismatch" not in done.stderr


def test_a_kernel_edit_relinks_its_group_alone(tmp_path):
    _write(tmp_path)
    first = _scons(tmp_path)
    assert len(_group_links(first.stdout)) == 2
    _write(tmp_path, c_extra=5)
    second = _scons(tmp_path)
    links = _group_links(second.stdout)
    assert len(links) == 1, second.stdout  # c.cpp's group; a.cpp and b.cpp's image comes from the cache
    assert _run(tmp_path).stdout.strip() == "a=7 b=8 c=47"
    assert len(list((tmp_path / "prog.x86_64.groups.cache").iterdir())) == 2  # the old image of c's group is gone
    assert "is up to date" in _scons(tmp_path).stdout


def test_without_groups_one_image(tmp_path):
    """The default: one image per target, as the driver links it (no plan node, no group links)."""
    _write(tmp_path)
    done = _scons(tmp_path, "groups=0")
    assert not _group_links(done.stdout) and not (tmp_path / "prog.offload.groups").exists()
    assert _run(tmp_path).stdout.strip() == "a=7 b=8 c=42"


def test_a_named_critical_section_keeps_its_sources_together(tmp_path):
    """Two sources locking the same named critical section share its lock variable: one group."""
    (tmp_path / "SConstruct").write_text(SCONSTRUCT)
    for name in ("p", "q"):
        (tmp_path / f"{name}.cpp").write_text(textwrap.dedent(f"""
            int run_{name}() {{
              int r = 0;
            #pragma omp target teams distribute parallel for map(tofrom : r)
              for (int i = 0; i < 64; ++i) {{
            #pragma omp critical(shared_lock)
                r += 1;
              }}
              return r;
            }}
        """))
    (tmp_path / "main.cpp").write_text("#include <cstdio>\nint run_p(); int run_q();\n"
                                       "int main() { std::printf(\"%d\\n\", run_p() + run_q()); }\n")
    _scons(tmp_path, "sources=p.cpp q.cpp main.cpp")
    plan = json.loads((tmp_path / "prog.offload.groups").read_text())
    assert [group["objects"] for group in plan["groups"]] == [["p.o", "q.o"]]
    assert _run(tmp_path).stdout.strip() == "128"


def _kernel_resources(image: Path) -> dict[str, dict[str, str]]:
    """Each kernel's resource numbers from an AMDGPU image's code-object metadata."""
    notes = subprocess.run(["/usr/lib/llvm-19/bin/llvm-readelf", "--notes", str(image)], capture_output=True,
                           text=True, check=True).stdout
    kernels = {}
    for block in re.split(r"\n  - \.", notes)[1:]:
        name = re.search(r"\n    \.name:\s+(\S+)", block)
        if name is None:
            continue
        kernels[name.group(1)] = {key: found.group(1) for key in (
            "vgpr_count", "sgpr_count", "agpr_count", "group_segment_fixed_size", "private_segment_fixed_size",
            "uses_dynamic_stack", "kernarg_segment_size") if (found := re.search(
                rf"(?:^|\n    \.){key}:\s+(\S+)", block))}
    return kernels


def test_amdgpu_group_images_keep_the_kernels_resources(tmp_path):
    """Each group's gfx90a image is a whole-program LTO link of its own: its kernels use the registers, LDS
    and stack they use in the one image of the default link, and no runtime function traps for lack of a
    kernel (what a device runtime linked apart would do)."""
    _write(tmp_path)
    sources = "sources=a.cpp b.cpp c.cpp main.cpp"
    _scons(tmp_path, "archs=gfx90a", "groups=0", sources)
    whole = _kernel_resources(tmp_path / "prog.gfx90a.img")
    _scons(tmp_path, "archs=gfx90a", "groups=1", sources)
    images = sorted((tmp_path / "prog.gfx90a.groups.cache").iterdir())
    assert len(images) == 2
    parts: dict[str, dict[str, str]] = {}
    for image in images:
        parts.update(_kernel_resources(image))
        disassembly = subprocess.run(["/usr/lib/llvm-19/bin/llvm-objdump", "-d", "--mcpu=gfx90a", str(image)],
                                     capture_output=True, text=True, check=True).stdout
        assert "s_trap" not in disassembly
    assert len(whole) == 3 and parts == whole


def test_device_code_from_a_static_library_makes_one_group(tmp_path):
    """A library's members are linked where the link needs them, so their code is not split: one group."""
    _write(tmp_path)
    (tmp_path / "SConstruct").write_text(SCONSTRUCT.replace(
        'env.OffloadProgram("prog", [env.OffloadObject(source) for source in sources])',
        'lib = env.OffloadStaticLibrary("c", ["c.cpp"])\n'
        'env.OffloadProgram("prog", [env.OffloadObject(s) for s in ("a.cpp", "b.cpp", "main.cpp")], LIBS=[lib])'))
    _scons(tmp_path)
    plan = json.loads((tmp_path / "prog.offload.groups").read_text())
    assert plan["single"] == "device code from a static library"
    assert [group["objects"] for group in plan["groups"]] == [["a.o", "b.o", "main.o"]]
    assert _run(tmp_path).stdout.strip() == "a=7 b=8 c=42"


def test_a_hip_model_program_refuses_groups(tmp_path):
    (tmp_path / "SConstruct").write_text(textwrap.dedent("""
        import offload_builders.scons
        env = Environment(tools=["default", "offload"], toolpath=[offload_builders.scons.toolpath()],
                          OFFLOAD_MODEL="hip", OFFLOAD_ARCHS="gfx90a", OFFLOAD_IMAGE_GROUPS=True)
        env.OffloadProgram("prog", ["main.o"])
    """))
    done = subprocess.run([SCONS, "-Q", "-n"], cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)),
                          capture_output=True, text=True)
    assert done.returncode == 2
    assert "OFFLOAD_IMAGE_GROUPS links OpenMP programs only" in done.stderr
    assert "Traceback" not in done.stderr


DYNAMIC = """
    void run_{name}(double *x, int n) {{
    #pragma omp target teams distribute parallel for schedule(dynamic) map(tofrom : x[0 : n])
      for (int i = 0; i < n; ++i) x[i] *= 2;
    }}
"""
PLAIN = """
    void run_{name}(double *x, int n) {{
    #pragma omp target teams distribute parallel for map(tofrom : x[0 : n])
      for (int i = 0; i < n; ++i) x[i] += 1;
    }}
"""


def test_two_groups_using_the_gpu_libc_rpc_client_stop_the_link(tmp_path):
    """libomptarget 19 serves the RPC client (device printf, malloc) of one image per device: two groups whose
    images define it would leave one waiting forever, so the group link refuses them. The client comes from a
    device library on the link line, as the GPU libc's would, so every group's image gets it."""
    sources = _heap_project(tmp_path, {"p": PLAIN, "q": PLAIN})
    (tmp_path / "SConstruct").write_text(SCONSTRUCT.replace(
        "sources = ", "env.Append(OFFLOAD_DEVICE_LINKFLAGS=ARGUMENTS.get('lib', '').split())\nsources = "))
    (tmp_path / "rpc.cpp").write_text(textwrap.dedent("""
        #pragma omp declare target
        extern "C" __attribute__((used, visibility("default"))) void *__llvm_libc_rpc_client = nullptr;
        #pragma omp end declare target
    """))
    subprocess.run(["/usr/lib/llvm-19/bin/clang++", "-fopenmp", "--offload-arch=gfx90a", "--offload-device-only",
                    "-nogpulib", "-O2", "-c", "-emit-llvm", "rpc.cpp", "-o", "rpc.bc"], cwd=tmp_path, check=True)
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    done = subprocess.run([SCONS, "-Q", "archs=gfx90a", sources, f"lib=-Wl,{tmp_path / 'rpc.bc'}"], cwd=tmp_path,
                          env=env, capture_output=True, text=True)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "2 image groups of gfx90a use the GPU libc's RPC client" in done.stderr, done.stderr
    assert not (tmp_path / "prog.gfx90a.groups").exists() and not (tmp_path / "prog").exists()
    assert _scons(tmp_path, "archs=gfx90a", "groups=0", sources, f"lib=-Wl,{tmp_path / 'rpc.bc'}")
    assert _scons(tmp_path, "archs=gfx90a", "groups=1", sources)  # without the client: two groups, linked

def _heap_project(root: Path, kinds: dict[str, str]) -> str:
    (root / "SConstruct").write_text(SCONSTRUCT)
    for name, text in kinds.items():
        (root / f"{name}.cpp").write_text(textwrap.dedent(text.format(name=name)))
    calls = " ".join(f"run_{name}(x, 8);" for name in kinds)
    (root / "main.cpp").write_text("".join(f"void run_{name}(double *, int);\n" for name in kinds)
                                   + f"int main() {{ double x[8] = {{}}; {calls} return 0; }}\n")
    return "sources=" + " ".join(f"{name}.cpp" for name in kinds) + " main.cpp"


def test_two_groups_using_the_amdgpu_device_heap_stop_the_link(tmp_path):
    """libomptarget 19 frees an image's device heap when it loads the next image on that device, so two groups
    whose kernels allocate (here: dynamic schedules) cannot be registered apart."""
    sources = _heap_project(tmp_path, {"p": DYNAMIC, "q": DYNAMIC})
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    done = subprocess.run([SCONS, "-Q", "archs=gfx90a", sources], cwd=tmp_path, env=env, capture_output=True,
                          text=True)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "2 image groups use the AMDGPU device heap" in done.stderr, done.stderr
    assert "the groups of p.o and q.o" in done.stderr
    assert not (tmp_path / "prog").exists()


def test_the_one_group_using_the_device_heap_is_registered_last(tmp_path):
    """One heap-using group is safe when its image loads last: its descriptor is registered last."""
    sources = _heap_project(tmp_path, {"p": DYNAMIC, "q": PLAIN})
    _scons(tmp_path, "archs=gfx90a,x86_64", sources)
    plan = json.loads((tmp_path / "prog.offload.groups").read_text())
    assert [group["objects"] for group in plan["groups"]] == [["p.o"], ["q.o"]]
    assert (tmp_path / "prog.gfx90a.groups.heap").read_text() == "0\n"
    assert (tmp_path / "prog.x86_64.groups.heap").read_text() == ""
    # descriptors register in group order (.omp_offloading.device_image.<group>.<n>): q's group first, p's last
    listing = subprocess.run(["/usr/lib/llvm-19/bin/llvm-objdump", "--offloading", str(tmp_path / "prog")],
                             capture_output=True, text=True, check=True).stdout
    assert listing.count("OFFLOADING IMAGE") == 4
    images = _wrapper_images(tmp_path / "prog.offload.wrapper.o")
    assert all(b"run_qPdi" in data and b"run_pPdi" not in data for name, data in images.items() if ".0." in name)
    assert all(b"run_pPdi" in data and b"run_qPdi" not in data for name, data in images.items() if ".1." in name)
    assert len(images) == 4
    done = _run(tmp_path)  # the x86_64 images run
    assert done.returncode == 0, done.stderr


def _wrapper_images(path: Path) -> dict[str, bytes]:
    """The device images of a registration object, by symbol (``.omp_offloading.device_image.<group>.<n>``)."""
    from elftools.elf.elffile import ELFFile
    from elftools.elf.sections import SymbolTableSection

    with open(path, "rb") as f:
        elf = ELFFile(f)
        table = next(s for s in elf.iter_sections() if isinstance(s, SymbolTableSection))
        found = {}
        for symbol in table.iter_symbols():
            if symbol.name.startswith(".omp_offloading.device_image."):
                data = elf.get_section(symbol["st_shndx"]).data()
                found[symbol.name] = data[symbol["st_value"]:symbol["st_value"] + symbol["st_size"]]
        return found


def test_a_stripped_group_image_loads_the_bytes_of_a_plain_link(tmp_path):
    """The group link adds --emit-relocs to find heap users and strips those sections again: every allocated
    section and every program header is what the plain link gives."""
    from elftools.elf.elffile import ELFFile

    sources = _heap_project(tmp_path, {"p": DYNAMIC})
    _scons(tmp_path, "archs=gfx90a", "groups=0", sources)
    plain = tmp_path / "prog.gfx90a.img"
    _scons(tmp_path, "archs=gfx90a", "groups=1", sources)
    (image,) = (tmp_path / "prog.gfx90a.groups.cache").iterdir()
    assert image.name.endswith(".pool.img")

    def loaded(path: Path):
        with open(path, "rb") as f:
            elf = ELFFile(f)
            return ([(s.name, s["sh_addr"], s.data()) for s in elf.iter_sections() if s["sh_flags"] & 2],
                    [(seg["p_type"], seg["p_vaddr"], seg["p_filesz"], seg["p_memsz"]) for seg in elf.iter_segments()],
                    [s.name for s in elf.iter_sections() if s.name.startswith(".rela")])

    assert loaded(image) == loaded(plain)
    assert loaded(image)[2] == [".rela.dyn"]


def _project(root: Path, files: dict[str, str]) -> None:
    (root / "SConstruct").write_text(SCONSTRUCT)
    for name, text in files.items():
        (root / name).write_text(textwrap.dedent(text))


def test_a_program_without_target_regions_builds_with_groups(tmp_path):
    """No object registers an entry: no group, and the wrap registers OpenMP's empty descriptor, as without groups."""
    _project(tmp_path, {"main.cpp": "#include <cstdio>\nint main() { std::puts(\"plain\"); }\n"})
    _scons(tmp_path, "sources=main.cpp")
    assert json.loads((tmp_path / "prog.offload.groups").read_text())["groups"] == []
    assert _run(tmp_path).stdout.strip() == "plain"


def test_every_target_region_in_a_static_library(tmp_path):
    """The only entries are a library's: its one group keeps the library's device code and entries."""
    _write(tmp_path)
    (tmp_path / "main.cpp").write_text("#include <cstdio>\nint run_c(int);\n"
                                       "int main() { std::printf(\"c=%d\\n\", run_c(2)); }\n")
    (tmp_path / "SConstruct").write_text(SCONSTRUCT.replace(
        'env.OffloadProgram("prog", [env.OffloadObject(source) for source in sources])',
        'env.OffloadProgram("prog", [env.OffloadObject("main.cpp")], LIBS=[env.OffloadStaticLibrary("c", ["c.cpp"])])'))
    _scons(tmp_path)
    plan = json.loads((tmp_path / "prog.offload.groups").read_text())
    assert [group["objects"] for group in plan["groups"]] == [["main.o"]]
    assert _run(tmp_path).stdout.strip() == "c=42"


def test_a_user_function_named_like_the_runtime_ties_its_callers(tmp_path):
    """Only what the runtime defines (or Clang copies into every unit) ties nothing: a user's `omp_`-named
    device function called from another source keeps both in one group."""
    _project(tmp_path, {
        "oa.cpp": """
            #pragma omp declare target
            extern "C" int omp_user_helper(int x) { return x * 7; }
            #pragma omp end declare target
            int run_oa(int n) { int r = 0;
            #pragma omp target map(tofrom : r)
              r = omp_user_helper(n);
              return r; }
        """,
        "ob.cpp": """
            #pragma omp declare target
            extern "C" int omp_user_helper(int);
            #pragma omp end declare target
            int run_ob(int n) { int r = 0;
            #pragma omp target map(tofrom : r)
              r = omp_user_helper(n) + 1;
              return r; }
        """,
        "main.cpp": """
            #include <cstdio>
            int run_oa(int); int run_ob(int);
            int main() { std::printf("oa=%d ob=%d\\n", run_oa(2), run_ob(2)); }
        """})
    _scons(tmp_path, "sources=oa.cpp ob.cpp main.cpp")
    plan = json.loads((tmp_path / "prog.offload.groups").read_text())
    assert [group["objects"] for group in plan["groups"]] == [["oa.o", "ob.o"]]
    assert _run(tmp_path).stdout.strip() == "oa=14 ob=15"


def test_a_user_malloc_over_the_runtimes_weak_one_ties_its_callers(tmp_path):
    """The AMDGPU runtime's malloc is weak so that a program may replace it; a source calling malloc must then
    link with the source defining it, as in the one-image link (else it would get the runtime's heap)."""
    _project(tmp_path, {
        "ma.cpp": """
            #include <cstddef>
            #pragma omp declare target
            static char arena[1 << 16]; static unsigned long used_bytes;
            extern "C" void *malloc(size_t n) {
              void *p = arena + used_bytes; used_bytes += (n + 15) & ~15ul; return p; }
            extern "C" void free(void *) {}
            #pragma omp end declare target
            int run_ma() { int r = 0;
            #pragma omp target map(tofrom : r)
              { int *p = (int *)malloc(sizeof(int)); *p = 5; r = *p; }
              return r; }
        """,
        "mb.cpp": """
            #include <cstdlib>
            int run_mb() { int r = 0;
            #pragma omp target map(tofrom : r)
              { int *p = (int *)malloc(sizeof(int)); *p = 7; r = *p; free(p); }
              return r; }
        """,
        "main.cpp": "int run_ma(); int run_mb();\nint main() { return run_ma() + run_mb() - 12; }\n"})
    _scons(tmp_path, "archs=gfx90a", "sources=ma.cpp mb.cpp main.cpp")
    plan = json.loads((tmp_path / "prog.offload.groups").read_text())
    assert [group["objects"] for group in plan["groups"]] == [["ma.o", "mb.o"]]
    (image,) = (tmp_path / "prog.gfx90a.groups.cache").iterdir()
    assert not image.name.endswith(".pool.img")  # the user's malloc, not the runtime's heap


REDUCTION = """
    double run_{name}(double *x, int n) {{
      double sum = 0;
    #pragma omp target teams distribute parallel for reduction(+ : sum) map(tofrom : x[0 : n])
      for (int i = 0; i < n; ++i) sum += x[i];
      return sum;
    }}
"""


def test_what_every_nvptx_unit_carries_ties_nothing(tmp_path):
    """NVPTX cubins each carry weak copies of what ptxas adds (``__cuda_sm70_shflsync_down`` for a reduction's
    shuffles) and Clang emits (the reduction buffer, the runtime's configuration): two independent sources
    with reductions stay two groups."""
    sources = _heap_project(tmp_path, {"p": REDUCTION, "q": REDUCTION})
    _scons(tmp_path, "archs=sm_80,gfx90a", sources)
    plan = json.loads((tmp_path / "prog.offload.groups").read_text())
    assert [group["objects"] for group in plan["groups"]] == [["p.o"], ["q.o"]]
