"""``offload-compile --depfile`` escapes every name as Clang's own dependency file does (issue 28, defect 5).

Clang writes ``$`` as ``$$``; we read that back as two dollars and wrote ``$$$$``, a file that does not
exist, so Ninja reran the host front end on every build. For tricky header names our depfile must say what
Clang's says, and under real Ninja a source including ``we$ird#h.h`` must settle ("no work to do").
"""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import LLVM19_BIN

OFFLOAD_COMPILE = [sys.executable, "-m", "offload_builders.cli.compile"]
NINJA = str(Path(sys.executable).with_name("ninja"))

#: Header names a file system allows and Clang lists: each of what its writer escapes (space, ``#``, ``$``, a
#: backslash before a space or ``#``), what it writes as it is (colon, non-ASCII, tab, shell characters).
TRICKY_NAMES = ["sp ace.h", "ha#sh.h", "do$llar.h", "a$$b.h", "we$ird#h.h", "back\\slash.h", "bs\\ sp.h",
                "tr\\\\ x.h", "bs\\#h.h", "co:lon.h", "nön-äscii ünï.h", "ta\tb.h", "qu'ote.h", 'dq"uote.h',
                "b`t.h", "pct%x.h", "st*r.h", "br[k].h", "pi|pe.h", "semi;c&x.h", "$(paren).h", "eq=x.h"]


def _rule_body(text: str) -> str:
    """A one-rule dependency file's prerequisites as written, line continuations made single spaces."""
    rest = re.split(r":(?= )", text, maxsplit=1)[1]
    return re.sub(r"\s*\\\n\s*", " ", rest).strip()


def _oc(work: Path, *args: str) -> None:
    done = subprocess.run([*OFFLOAD_COMPILE, *args], cwd=work, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.fixture
def tricky(tmp_path) -> Path:
    (tmp_path / "inc").mkdir()
    for name in TRICKY_NAMES:
        (tmp_path / "inc" / name).write_text("\n")
    includes = "".join(f"#include <{name}>\n" for name in TRICKY_NAMES)
    (tmp_path / "k.cpp").write_text(includes + textwrap.dedent("""\
        int f(int *x) {
        #pragma omp target map(tofrom : x[0 : 1])
          x[0] += 1;
          return x[0];
        }
    """))
    return tmp_path


def test_each_name_is_escaped_as_clangs_own_dependency_file_escapes_it(tricky):
    """Host and device depfiles name the source and headers exactly as ``clang -MD -MF`` does for the same
    includes (then our own prerequisites: the host bitcode, the compilers)."""
    subprocess.run([str(LLVM19_BIN / "clang++"), "-Iinc", "-E", "-o", os.devnull, "-MD", "-MF", "clang.d", "k.cpp"],
                   cwd=tricky, check=True, capture_output=True)
    _oc(tricky, "host", "k.cpp", "-o", "k.host.bc", "--depfile", "k.host.d", "--", "-Iinc")
    _oc(tricky, "device", "k.cpp", "--host-bc", "k.host.bc", "--target", "x86_64", "-o", "k.x86_64.o",
        "--depfile", "k.x86_64.d", "--", "-Iinc")
    clang = _rule_body((tricky / "clang.d").read_bytes().decode())
    assert "we$$ird\\#h.h" in clang and "sp\\ ace.h" in clang  # what Clang 19 writes, as the issue measured
    for ours in ("k.host.d", "k.x86_64.d"):
        text = (tricky / ours).read_bytes().decode()
        assert text.startswith(f"{ours[:-2]}.{'bc' if 'host' in ours else 'o'}: \\\n"), text
        assert _rule_body(text).startswith(clang + " "), (ours, text)
        assert "$$$$" not in text.replace("a$$$$b", "")


def test_absolute_depfile_names_every_prerequisite_by_absolute_path(tricky):
    """``--absolute-depfile`` (CMake, which reads relative depfile paths from its binary directory): the same
    prerequisites, escaped the same way, each named from the working directory by absolute path."""
    _oc(tricky, "host", "k.cpp", "-o", "k.host.bc", "--depfile", "relative.d", "--", "-Iinc")
    _oc(tricky, "host", "k.cpp", "-o", "k.host.bc", "--depfile", "absolute.d", "--absolute-depfile", "--", "-Iinc")
    from offload_builders.depfiles import read_make_dependencies

    relative = read_make_dependencies(str(tricky / "relative.d"))
    absolute = read_make_dependencies(str(tricky / "absolute.d"))
    assert relative[:2] == ["k.cpp", "inc/sp ace.h"] and len(absolute) == len(relative)
    assert absolute == [path if os.path.isabs(path) else str(tricky / path) for path in relative]


def test_reading_clangs_file_gives_the_files_and_writes_its_text_back(tricky):
    """The paths read from Clang's file are the files themselves (but for a backslash, which Clang 19 itself
    writes as a ``/``), and escaped again they are Clang's text byte for byte."""
    from offload_builders.depfiles import escape, read_make_dependencies

    subprocess.run([str(LLVM19_BIN / "clang++"), "-Iinc", "-E", "-o", os.devnull, "-MD", "-MF", "clang.d", "k.cpp"],
                   cwd=tricky, check=True, capture_output=True)
    paths = read_make_dependencies(str(tricky / "clang.d"))
    assert paths[0] == "k.cpp" and len(paths) == 1 + len(TRICKY_NAMES)
    assert [path for path in paths[1:] if not (tricky / path).is_file()] == \
        [f"inc/{name.replace(chr(92), '/')}" for name in TRICKY_NAMES if "\\" in name]
    assert " ".join(escape(path) for path in paths) == _rule_body((tricky / "clang.d").read_bytes().decode())


@pytest.mark.parametrize("path", ["a b", "a\\ b", "a\\\\ b", "a\\#b", "x$y$$z", "#$ \\x", "\\b\\c", "tab\there:"])
def test_our_own_names_read_back_as_they_are(tmp_path, path):
    """Names we add (the output, the host bitcode, the compilers) read back through our reader, the inverse of
    our writer (not a name ending in a backslash: before the separating space, in Clang's files too, it reads
    as an escaped space)."""
    from offload_builders.depfiles import escape, read_make_dependencies

    depfile = tmp_path / "x.d"
    depfile.write_text(f"out.o: {escape(path)} \\\n  {escape('next one')}\n")
    assert read_make_dependencies(str(depfile)) == [path, "next one"]


BUILD_NINJA = textwrap.dedent("""\
    python = {python}
    flags = -O1 -Iinc
    # restat: an output whose bytes did not change keeps its mtime (offload-compile), as the README says.
    rule host
      command = $python -m offload_builders.cli.compile host $in -o $out --depfile $out.d -- $flags
      depfile = $out.d
      restat = 1
      {deps}
    rule device
      command = $python -m offload_builders.cli.compile device $in --host-bc $hostbc --target x86_64 -o $out $
                --depfile $out.d -- $flags
      depfile = $out.d
      restat = 1
      {deps}
    build k.host.bc | k.host.bc.identity: host k.cpp
    build k.x86_64.o: device k.cpp | k.host.bc
      hostbc = k.host.bc
""")


@pytest.mark.parametrize("deps", ["deps = gcc", ""], ids=["deps-gcc", "depfile-only"])
def test_ninja_settles_with_a_dollar_and_a_hash_in_a_header_name(tmp_path, deps):
    """A source including ``we$ird#h.h``: the first ``ninja`` builds, the second has no work to do, and an edit
    of that header reruns both nodes, once."""
    (tmp_path / "inc").mkdir()
    header = tmp_path / "inc" / "we$ird#h.h"
    header.write_text("inline int weird() { return 3; }\n")
    (tmp_path / "k.cpp").write_text(textwrap.dedent("""\
        #include "we$ird#h.h"
        int f(int *x) {
        #pragma omp target map(tofrom : x[0 : 1])
          x[0] += weird();
          return x[0];
        }
    """))
    (tmp_path / "build.ninja").write_text(BUILD_NINJA.format(python=shlex.quote(sys.executable), deps=deps))

    def ninja() -> str:
        done = subprocess.run([NINJA, "-d", "explain"], cwd=tmp_path, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout + done.stderr

    first = ninja()
    assert "[2/2]" in first
    second = ninja()
    assert "no work to do" in second, second
    if deps:
        recorded = subprocess.run([NINJA, "-t", "deps", "k.host.bc"], cwd=tmp_path, capture_output=True, text=True,
                                  check=True).stdout
        assert "inc/we$ird#h.h" in recorded.split(), recorded
    header.write_text("inline int weird() { return 4; }\n")
    third = ninja()
    assert "[2/2]" in third, third
    assert "no work to do" in ninja()
