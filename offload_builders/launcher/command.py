"""What a compiler command line asks for, as far as ``offload-cache`` must know: whether it splits it, and why not.

The launcher splits one kind of command: a compile (``-c``) of one source to one object file with offload targets,
OpenMP (``-fopenmp``), or HIP or CUDA (``-x hip``/``-x cuda``, a ``.hip``/``.cu`` source; their jobs must not carry a
CUID the command did not pin, :mod:`offload_builders.launcher.jobs` checks). Everything else (no offloading, compile
and link in one command, several sources, preprocessing, ``-o -``, ``-###``, ``--version``, a command it cannot
read) runs the compiler unchanged: the launcher never guesses.

A link with offloading (:attr:`Command.link`) is not split either: the launcher gives it ``offload-link`` in the
driver's ``clang-linker-wrapper``'s place (see :mod:`offload_builders.cli.cache`).

Response files (``@file``) are read here only to decide (GNU quoting, as Clang reads them on Linux); the driver
is given the command as it was written.
"""
from __future__ import annotations

import os

TYPE_CHECKING = False  # typing costs every compile's start-up: for type checkers only
if TYPE_CHECKING:
    from collections.abc import Sequence

#: Suffixes of the sources the launcher splits (C and C++; the driver infers the language from them).
SOURCE_SUFFIXES = (".c", ".cc", ".cp", ".cpp", ".cxx", ".c++", ".C", ".CPP", ".i", ".ii")
#: Options after which the next word is their value (so not an input), as Clang's driver parses them.
_SEPARATE_VALUE = frozenset({
    "-o", "-x", "-I", "-isystem", "-iquote", "-idirafter", "-include", "-imacros", "-D", "-U", "-MF", "-MT", "-MQ",
    "-Xclang", "-Xopenmp-target", "-Xarch_device", "-Xarch_host", "-Xlinker", "-Xassembler", "-Xpreprocessor",
    "-target", "--target", "-arch", "-isysroot", "--sysroot", "-iprefix", "-iwithprefix", "-iwithprefixbefore",
    "-L", "-l", "-T", "-u", "-z", "-mllvm", "-working-directory", "-ivfsoverlay", "-resource-dir", "-B",
    "-Xcuda-ptxas", "-Xcuda-fatbinary", "-Xoffload-linker", "--offload-arch", "-fopenmp-targets", "-Xopenmp",
    "-F", "-cxx-isystem", "-isystem-after", "-Xanalyzer", "-dependency-file", "-MJ", "-serialize-diagnostics",
    "--config", "-fmodules-cache-path", "-fprofile-instr-use", "-fprofile-use",
})
#: Options that make the command something other than one compile to an object file.
_NOT_A_COMPILE = frozenset({
    "-E", "-S", "-M", "-MM", "-###", "-v", "--version", "-help", "--help", "-fsyntax-only", "-emit-llvm",
    "-emit-ast", "-print-search-dirs", "-fdriver-only", "-save-temps", "--save-temps", "-fmodule-header",
    "-fmodules", "-fcxx-modules", "-fembed-bitcode", "-fuse-cuid=random",
})
#: Prefixes of such options (``-save-temps=obj``, ``-print-...``), and of those by which the jobs write files
#: besides their outputs (optimization records, statistics, split DWARF, serialized diagnostics) or the driver does
#: (``-MJ``'s compilation database entry), which a cached job or ``-###`` would not write.
_NOT_A_COMPILE_PREFIXES = ("-save-temps=", "-print-", "--print-", "-fprofile-generate", "-fprofile-instr-generate",
                           "-ftime-trace", "-fcrash-diagnostics", "--driver-mode=cl", "-fsave-optimization-record",
                           "-foptimization-record-", "-save-stats", "-fproc-stat-report", "-gsplit-dwarf", "-MJ",
                           "--serialize-diagnostics", "-serialize-diagnostics")
#: The options that ask the driver for offload targets.
_TARGET_PREFIXES = ("--offload-arch=", "-fopenmp-targets=", "--offload-targets=", "--cuda-gpu-arch=")
#: The most response files one command may nest (as Clang's own limit, roughly).
_MAX_RESPONSE_FILES = 32


class Command:
    """One compiler command as the launcher sees it: the compiler, its arguments (response files read), and, where
    it splits it, the source and the object."""

    __slots__ = ("compiler", "arguments", "expanded", "source", "output", "reason", "gpu", "colour", "link")

    def __init__(self, compiler: str, arguments: Sequence[str]) -> None:
        self.compiler = compiler
        self.arguments = tuple(arguments)
        self.expanded: tuple[str, ...] = ()
        self.source: str | None = None
        self.output: str | None = None
        #: Why the launcher runs this command unchanged (None: it splits it).
        self.reason: str | None = None
        #: A HIP or CUDA compile (else OpenMP): after a failed job the driver runs no further offloading job.
        self.gpu = False
        #: Coloured diagnostics: "always" or "never" as the command asks, else "auto" (the driver's choice: where
        #: its standard error is a terminal). See :func:`diagnostics_shown`.
        self.colour = "auto"
        #: A link (objects and libraries only, no source) whose words ask for offloading (``-fopenmp``, offload
        #: targets, ``--offload-link``): the driver may run its linker wrapper, which the launcher replaces.
        self.link = False

    @property
    def splits(self) -> bool:
        return self.reason is None


#: Launchers that may come after this one (``offload-cache ccache clang++ ...``): the command runs through them as
#: it is (ccache caches it whole; before this launcher, ``ccache offload-cache clang++``, it sees a compiler).
OTHER_LAUNCHERS = frozenset({"ccache", "sccache", "distcc", "icecc", "buildcache"})


def read_command(argv: Sequence[str], cwd: str | None = None) -> Command:
    """``argv`` (the compiler and its arguments, as the build system ran them) read: see :class:`Command`."""
    command = Command(argv[0], argv[1:])
    if os.path.basename(argv[0]) in OTHER_LAUNCHERS:
        command.reason = f"{os.path.basename(argv[0])} launches the compiler: the command goes to it as it is"
        return command
    try:
        command.expanded = tuple(_expanded(argv[1:], cwd or os.getcwd()))
    except (OSError, ValueError) as error:
        command.reason = f"cannot read a response file: {error}"
        return command
    command.reason = _why_not(command)
    for word in command.expanded:
        if word in ("-fcolor-diagnostics", "-fdiagnostics-color", "-fdiagnostics-color=always"):
            command.colour = "always"
        elif word in ("-fno-color-diagnostics", "-fno-diagnostics-color", "-fdiagnostics-color=never"):
            command.colour = "never"
        elif word == "-fdiagnostics-color=auto":
            command.colour = "auto"
    return command


def diagnostics_shown(data: bytes, colour: str, terminal: bool) -> bytes:
    """Diagnostics as the driver would print them. Where the command leaves colour to the driver ("auto"), the
    launcher runs its jobs with colour (so that what it keeps serves a terminal too, as ccache does) and takes the
    colour out here where standard error is not a terminal: the text is the driver's either way."""
    if colour != "auto" or terminal or b"\x1b[" not in data:
        return data
    out = bytearray()
    start = 0
    while (found := data.find(b"\x1b[", start)) >= 0:
        end = found + 2
        while end < len(data) and data[end] in b"0123456789;":
            end += 1
        if end < len(data) and data[end] == ord("m"):  # a colour (SGR) sequence: dropped
            out += data[start:found]
            start = end + 1
        else:
            out += data[start:end]
            start = end
    out += data[start:]
    return bytes(out)


def _expanded(arguments: Sequence[str], cwd: str, depth: int = 0) -> list[str]:
    words: list[str] = []
    for word in arguments:
        if word.startswith("@") and len(word) > 1:
            if depth >= _MAX_RESPONSE_FILES:
                raise ValueError(f"response files nested deeper than {_MAX_RESPONSE_FILES}")
            import shlex  # only here: it imports re, which a compile without response files never needs

            path = os.path.join(cwd, word[1:])
            with open(path, encoding="utf-8", errors="surrogateescape") as f:
                text = f.read()
            words += _expanded(shlex.split(text, comments=False, posix=True), cwd, depth + 1)
        else:
            words.append(word)
    return words


def _why_not(command: Command) -> str | None:
    """None where the launcher splits ``command``, else why it runs the compiler unchanged."""
    words = command.expanded
    inputs: list[str] = []
    compiles = openmp = targets = False
    language: str | None = None
    index = 0
    while index < len(words):
        word = words[index]
        if word in _NOT_A_COMPILE or word.startswith(_NOT_A_COMPILE_PREFIXES):
            return f"{word} is not a compile to an object file"
        if word == "-c":
            compiles = True
        elif word in ("-fopenmp", "-fopenmp=libomp"):
            openmp = True
        elif word in ("-fno-openmp",) or (word.startswith("-fopenmp=") and word != "-fopenmp=libomp"):
            openmp = False
        elif word.startswith(_TARGET_PREFIXES):
            targets = True
        elif word in ("--offload-arch", "-fopenmp-targets"):
            targets = True
        elif word == "-o":
            command.output = words[index + 1] if index + 1 < len(words) else None
        elif word.startswith("-o") and len(word) > 2:
            command.output = word[2:]
        elif word == "-x":
            language = words[index + 1] if index + 1 < len(words) else None
        elif word.startswith("-x") and len(word) > 2:
            language = word[2:]
        elif word == "-" or not word.startswith("-"):
            inputs.append(word)
        if word in _SEPARATE_VALUE:
            index += 1
        index += 1
    if not compiles:
        command.link = bool(inputs) and (openmp or targets or "--offload-link" in words) and language is None \
            and all(_linker_input(word) for word in inputs)
        return "not a compile (-c): a link, or compile and link in one command"
    if len(inputs) != 1:
        return f"{len(inputs)} inputs: the launcher splits a compile of one source"
    if inputs[0] == "-":
        return "the source is read from standard input"
    gpu = _gpu_language(language, inputs[0])
    if not targets or not (openmp or gpu):
        return ("no offloading (-fopenmp, or a HIP or CUDA source, with --offload-arch=, --cuda-gpu-arch= or"
                " -fopenmp-targets=)")
    if not gpu and language is None and not inputs[0].endswith(SOURCE_SUFFIXES):
        return f"'{inputs[0]}' is not a C, C++, HIP or CUDA source"
    if not gpu and language is not None and language not in ("c", "c++"):
        return f"-x {language}: the launcher splits C, C++, HIP and CUDA sources"
    if command.output == "-":
        return "-o -: the object goes to standard output"
    if command.output is None:
        command.output = os.path.splitext(os.path.basename(inputs[0]))[0] + ".o"
    command.source = inputs[0]
    command.gpu = gpu is not None
    return None


#: The inputs of a link: objects, archives and shared libraries (``libfoo.so.1`` too).
_LINKER_INPUT_SUFFIXES = (".o", ".a", ".so", ".lo", ".obj")


def _linker_input(word: str) -> bool:
    """Whether ``word`` names what a link reads (not a source, which would make the command compile too)."""
    return word.endswith(_LINKER_INPUT_SUFFIXES) or ".so." in os.path.basename(word)


def _gpu_language(language: str | None, source: str) -> str | None:
    """"HIP" or "CUDA" where the source is compiled as one (``-x``, else its suffix, as the driver decides)."""
    if language is None:
        language = {".hip": "hip", ".cu": "cuda"}.get(os.path.splitext(source)[1])
    return {"hip": "HIP", "cuda": "CUDA"}.get(language or "")
