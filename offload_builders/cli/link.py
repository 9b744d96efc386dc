"""``offload-link``: the linker-wrapper pipeline outside SCons (extract, device links, wrap, host link).

It takes ``clang-linker-wrapper``'s common options and, after them, the host linker's arguments, so a
Meson/Ninja rule can call it where it would call the wrapper, and the Clang driver can even run it in the
wrapper's place (``clang -B<dir>`` with ``<dir>/clang-linker-wrapper`` running ``offload-link``)::

    offload-link --host-triple=x86_64-unknown-linux-gnu --linker-path=/usr/bin/ld.lld \\
        [--wrapper-jobs=N] [--save-temps] [--dry-run] [--opt-level=O2] [--device-linker=[<triple>=]<arg>] \\
        -- <linker arguments: -o a.out x.o -L... -l... --whole-archive ...>

Device images are linked by :mod:`offload_builders.linking` (one ``clang`` per target, ``--wrapper-jobs``
at a time) and registered per offload kind of their device files by :mod:`offload_builders.linking.wrapping`, the
code ``OffloadProgram``'s wrap node runs (OpenMP images with libomptarget, CUDA's linked cubins in a fat
binary, HIP's code objects in a fat binary; no Clang process), and the wrapper object is put right after
``-o <output>`` on the host link, as the wrapper does. The runtimes those registrations call come with the
linker arguments, as for the wrapper. Errors are one line, exit 1.

The inputs are data, not names: each target's files are called ``<output>.<triple>.<arch>`` only once
:func:`~offload_builders.linking.check_target_names` has found the offload binaries' triples and arches to be
target names (one with ``/``, a control character or 4 KB stops the link before anything is written), and the
device files unpacked for a device link are numbered. Thin archives are read as the host linker reads them, and
the entry checks cover the archive members it takes, so no program links without the device code its entries
name.

Each GPU target's image of this output's last link is kept in the per-user cache and taken again where that
target's device link would be the same (:mod:`offload_builders.linking.kept_images`; ``--no-keep-images``): adding
a target links that target's image alone. With ``$OFFLOAD_REMOTE`` (as for ``offload-compile``) each GPU target's
device link and the wrapper object are looked up in that remote cache first and stored after a local run (see
"the remote cache" below); the host CPU's device link and the host link always run here.
"""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from offload_builders import __version__
from offload_builders.cli._common import UsageError, answered_help_or_version, run_guarded
from offload_builders.cli.options import APPEND, FLAG_ANY, Option, Parser
from offload_builders.errors import OffloadError
from offload_builders.formats._io import atomic_output, write_all
from offload_builders.leftovers import private_tmpdir

if TYPE_CHECKING:
    from offload_builders import linking
    from offload_builders.formats.compressed import CompressionOptions
    from offload_builders.linking import wrapping
    from offload_builders.remote.actions import NodeJob
    from offload_builders.remote.cli_jobs import CachedStep, RemoteSteps
    from offload_builders.toolchain import Toolchain

PROG = "offload-link"

_HELP = f"""OVERVIEW: Link an offloading program: extract device code, link one image per target, wrap, host link.

USAGE: {PROG} [options] [--] <linker arguments>

OPTIONS:
  --host-triple=<triple>         - Host triple (only x86_64 Linux hosts are supported)
  --linker-path=<path>           - The host linker to run (e.g. /usr/bin/ld.lld); required
  -o <file>                      - Output (also read from the linker arguments)
  --wrapper-jobs=<n>             - Device links to run at once (default 1, like clang-linker-wrapper)
  --opt-level=O<n>               - Optimization level of the device links (default O2)
  --device-linker=[<triple>=]<a> - Extra argument for the device links (of one triple)
  --cuda-path=<dir>              - CUDA installation (ptxas, nvlink, fatbinary)
  --compress                     - Compress the HIP fat binary (zstd, as --offload-compress; also -compress)
  --compression-level=<n>        - Its zstd level (also -compression-level=<n>)
  --save-temps                   - Keep the device inputs, images and wrapper object next to the output
  --no-keep-images               - Link every GPU image again (by default one whose device link is the same as
                                   in this output's last link is taken from the per-user cache)
  --dry-run                      - Print the commands instead of running them
  --wrapper-verbose, -v          - Print each command before running it
  --print-shim-dir               - Print a directory for clang's -B whose clang-linker-wrapper runs this tool
  --print-link-args              - Print the clang++ link flags (one a line) that link through this tool
  --print-runtime-dir            - Print the directory of libomptarget.so (for a run path)
  --help                         - Display available options
  --version                      - Display the version of this program
Other clang-linker-wrapper options the Clang driver passes (--bitcode-library, --embed-bitcode, ...) are
rejected by name. Everything not recognised above is a linker argument.
With $OFFLOAD_REMOTE=grpc://HOST:PORT/INSTANCE the GPU device links and the wrapper object are looked up in that
remote cache (REAPI) first.
"""

#: clang-linker-wrapper options we accept and ignore, because they do not change what we produce here (the
#: driver passes ``-Rpass=X`` on as ``--offload-opt=-pass-remarks=X``: diagnostics only).
_IGNORED_PREFIXES = ("--wrapper-time-trace", "--device-debug", "--pass-remarks", "--offload-opt=-pass-remarks")
#: clang-linker-wrapper options whose behaviour we do not implement: refused rather than silently dropped.
_UNSUPPORTED = ("--embed-bitcode", "--bitcode-library", "--builtin-bitcode", "--clang-backend", "--override-image",
                "--relocatable", "--print-wrapped-module", "--ptxas-arg", "-mllvm", "--should-extract",
                "--offload-opt", "--device-compiler")
#: Host linker options that take their value as the next argument (so it is not taken for an input).
_LINKER_VALUE_OPTIONS = frozenset({"-o", "-m", "-dynamic-linker", "--dynamic-linker", "-L", "-l", "-rpath", "-R",
                                   "-soname", "-h", "-z", "-T", "-e", "-u", "-y", "-Map", "--version-script",
                                   "-plugin", "-plugin-opt", "--sysroot", "-a", "--hash-style", "-O"})


@dataclass
class _Options:
    host_triple: str = "x86_64-unknown-linux-gnu"
    linker_path: str | None = None
    output: str | None = None
    jobs: int = 1
    opt_level: str = "O2"
    device_linker: list[tuple[str | None, str]] = field(default_factory=list)
    cuda_path: str | None = None
    compress: bool = False
    compression_level: int | None = None
    save_temps: bool = False
    no_keep_images: bool = False
    dry_run: bool = False
    verbose: bool = False
    linker_args: list[str] = field(default_factory=list)
    help: bool = False
    version: bool = False


def _jobs(text: str) -> int:
    if not text.isdigit() or int(text) == 0:
        raise UsageError(f"--wrapper-jobs: expected a positive integer, got '{text}'")
    return int(text)


def _opt_level(text: str) -> str:
    if text not in ("O0", "O1", "O2", "O3", "Os", "Oz"):
        raise UsageError(f"--opt-level: expected O0, O1, O2, O3, Os or Oz, got '{text}'")
    return text


def _device_linker(text: str) -> tuple[str | None, str]:
    triple, sep, value = text.partition("=")
    return (triple, value) if sep and not triple.startswith("-") else (None, text)


def _compression_level(text: str) -> int:
    if not text.lstrip("-").isdigit():
        raise UsageError(f"--compression-level: expected an integer, got '{text}'")
    return int(text)


_PARSER = Parser(PROG, [
    Option("--help", "-help", "--help-hidden", action=FLAG_ANY),
    Option("--version", action=FLAG_ANY),
    Option("--host-triple"),
    Option("--linker-path"),
    Option("--wrapper-jobs", dest="jobs", check=_jobs),
    Option("--opt-level", check=_opt_level),
    Option("--device-linker", action=APPEND, check=_device_linker),
    Option("--cuda-path"),
    # The Clang 19 driver passes --offload-compress on as -compress (which its wrapper hands to ld).
    Option("--compress", "-compress", dest="compress", action=FLAG_ANY),
    Option("--compression-level", "-compression-level", dest="compression_level", check=_compression_level),
    Option("--save-temps", action=FLAG_ANY),
    Option("--no-keep-images", action=FLAG_ANY),
    Option("--dry-run", action=FLAG_ANY),
    Option("--wrapper-verbose", "-v", "--verbose", dest="verbose", action=FLAG_ANY),
], dashes="exact", missing="missing value for {name}")


def _parse(argv: Sequence[str]) -> _Options:
    opts = _Options()

    def other(arg: str) -> None:
        name = arg.split("=", 1)[0]
        if arg.startswith(_IGNORED_PREFIXES):
            return
        if name in _UNSUPPORTED:
            raise UsageError(f"{name} is a clang-linker-wrapper option {PROG} does not implement; "
                             "use clang-linker-wrapper for it")
        opts.linker_args.append(arg)

    _PARSER.parse(argv, opts, opts.linker_args.append, rest=opts.linker_args.extend, unknown=other)
    if opts.help or opts.version:
        return opts
    if not opts.host_triple.startswith("x86_64") or "linux" not in opts.host_triple:
        raise UsageError(f"--host-triple={opts.host_triple}: only x86_64 Linux hosts are supported")
    if opts.linker_path is None:
        raise UsageError("--linker-path=<host linker> is required (e.g. --linker-path=/usr/bin/ld.lld)")
    output = _linker_output(opts.linker_args)
    opts.output = output or opts.output or "a.out"
    return opts


def refused_options(argv: Sequence[str]) -> str | None:
    """Why this tool would not take ``argv`` (``clang-linker-wrapper``'s words, as the driver gives them), else
    None: what ``offload-cache`` asks before it puts this tool in the wrapper's place for a link."""
    try:
        _parse(argv)
    except (UsageError, OffloadError) as error:
        return str(error)
    return None


def _linker_output(args: Sequence[str]) -> str | None:
    output = None
    for index, arg in enumerate(args):
        if arg == "-o" and index + 1 < len(args):
            output = args[index + 1]
        elif arg.startswith("-o") and len(arg) > 2 and not arg.startswith("--"):
            output = arg[2:]
    return output


def link_inputs(args: Sequence[str]):
    """The files a host linker reads from ``args``, with ``--whole-archive`` state and ``-l`` searched in ``-L``."""
    from offload_builders.linking import LinkInput

    search: list[str] = []
    sysroot = ""
    i = 0
    while i < len(args):  # -L applies to every -l, wherever it appears
        arg = args[i]
        if arg in ("-L", "--library-path") and i + 1 < len(args):
            search.append(args[i + 1])
            i += 1
        elif arg.startswith("-L") and len(arg) > 2:
            search.append(arg[2:])
        elif arg.startswith("--library-path="):
            search.append(arg.split("=", 1)[1])
        elif arg.startswith("--sysroot="):
            sysroot = arg.split("=", 1)[1]
        i += 1
    inputs = []
    whole = False
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if arg in ("--whole-archive", "-whole-archive"):
            whole = True
        elif arg in ("--no-whole-archive", "-no-whole-archive"):
            whole = False
        elif arg in ("-l", "--library") or (arg.startswith("-l") and len(arg) > 2) or arg.startswith("--library="):
            if arg in ("-l", "--library"):
                if i >= len(args):
                    raise UsageError(f"missing value for {arg}")
                name, i = args[i], i + 1
            else:
                name = arg.split("=", 1)[1] if arg.startswith("--library=") else arg[2:]
            path = _search_library(name, search, sysroot)
            if path is None:
                raise UsageError(f"unable to find library -l{name}")
            inputs.append(LinkInput(path, whole))
        elif arg in _LINKER_VALUE_OPTIONS:
            i += 1
        elif not arg.startswith("-"):
            inputs.append(LinkInput(arg, whole))
    return inputs


def _search_library(name: str, search: Sequence[str], sysroot: str) -> str | None:
    """``searchLibrary``: ``-l:file`` by name, else ``lib<name>.so`` then ``lib<name>.a`` per directory."""
    names = [name[1:]] if name.startswith(":") else [f"lib{name}.so", f"lib{name}.a"]
    for directory in search:
        if directory.startswith("=") and sysroot:
            directory = os.path.join(sysroot, directory[1:])
        for candidate in names:
            path = os.path.join(directory, candidate)
            if os.path.exists(path):
                return path
    return None


def _print(argv: Sequence[str]) -> None:
    print(" ".join(shlex.quote(a) for a in argv), file=sys.stderr, flush=True)


#: The runtime each registration calls into, and how a link gets it (the wrapper adds none, nor do we).
_RUNTIME_HINTS = {
    "__tgt_register_lib": "the OpenMP images' registration needs libomptarget: link with -fopenmp (or -lomptarget)",
    "__hipRegisterFatBinary": "the HIP fat binary's registration needs the HIP runtime: link with --hip-link"
                              " (or -lamdhip64, or your own runtime's library)",
    "__cudaRegisterFatBinary": "the CUDA fat binary's registration needs the CUDA runtime: add -lcudart (or your"
                               " own runtime's library)",
}


def _missing_runtime_hint(stderr: str) -> str | None:
    """What to add to a host link that failed on a registration's runtime entry point."""
    for symbol, hint in _RUNTIME_HINTS.items():
        if f"undefined symbol: {symbol}" in stderr or f"undefined reference to `{symbol}'" in stderr:
            return hint
    return None


def _run(argv: Sequence[str], verbose: bool, target: str | None = None) -> None:
    """Run one command; a failed device link of ``target`` on a device-library symbol says which library."""
    if verbose:
        _print(argv)
    with private_tmpdir() as environ:
        done = subprocess.run(list(argv), stdout=sys.stdout, stderr=subprocess.PIPE, text=True,
                              errors="surrogateescape", env=environ)
    if done.returncode != 0:
        sys.stderr.write(done.stderr)
        from offload_builders.device_libraries import missing_library_hint

        hint = (missing_library_hint(done.stderr, target, "the compile flags") if target
                else _missing_runtime_hint(done.stderr))
        raise UsageError(f"'{os.path.basename(argv[0])}' failed with exit code {done.returncode}"
                         + (f": {hint}" if hint else ""))
    if done.stderr:
        sys.stderr.write(done.stderr)


def _hip_compression(opts: _Options, llvm_version: int) -> CompressionOptions | None:
    """The HIP fat binary's compression: ``--compress`` (in the toolchain's default format, as its bundler
    writes it: 2 for Clang 19, 3 for Clang 22) at the level asked."""
    from offload_builders.models.hip import fatbin_compression, link_fatbin_spec

    try:
        return fatbin_compression(link_fatbin_spec(opts.compress, opts.compression_level), llvm_version=llvm_version,
                                  environ=os.environ)
    except ValueError as error:
        raise UsageError(f"--compression-level={opts.compression_level}: {error}") from None


def _link(opts: _Options) -> int:
    from offload_builders import linking
    from offload_builders.linking import wrapping
    from offload_builders.targets import HOST_CPU_TRIPLE
    from offload_builders.toolchain import find_toolchain, user_cache

    environ = dict(os.environ)
    if opts.cuda_path:
        environ["CUDA_PATH"] = opts.cuda_path
    toolchain = find_toolchain(environ)
    hip_compression = _hip_compression(opts, toolchain.major)  # a bad level stops the link before any device link
    output = opts.output or "a.out"
    inputs = link_inputs(opts.linker_args)
    scanned = linking.scan_link_inputs(inputs)
    # Names from the inputs become file names below: refused before anything is written, if not target names.
    problems = linking.check_target_names(scanned)
    if problems:
        raise linking.LinkError("; ".join(problems))
    groups = {key: files for key, files in linking.group_device_files(scanned).items() if files}
    # As the SCons tool: objects, and archive members the host link takes, whose entries lack device code.
    problems = [p for key in groups for p in linking.check_entries(scanned, key, key[1] or key[0])]
    problems += linking.check_untargeted_entries(scanned)
    if problems:
        raise linking.LinkError(problems[0] if len(problems) == 1 else "; ".join(problems))

    temp_root = (os.path.dirname(os.path.abspath(output)) if opts.save_temps
                 else tempfile.mkdtemp(prefix="offload-link-"))
    stem = os.path.basename(output)
    names = _target_file_names(stem, list(groups))
    remote = None if opts.dry_run else _remote_steps()
    kept = None if opts.dry_run or opts.no_keep_images else _kept_images(output)
    try:
        jobs = []
        image_inputs: list[tuple[linking.GroupKey, str, str]] = []  # (group, image, its device input file)
        steps: dict[str, CachedStep | None] = {}  # each image's device link through the remote cache
        kept_keys: dict[str, tuple[str, str]] = {}  # each GPU image's name and key among the kept images
        for key, files in groups.items():
            base = os.path.join(temp_root, names[key])
            device_inputs = base + ".devin"
            linking.write_device_inputs(files, device_inputs)
            paths = linking.unpack_device_inputs(device_inputs, base + ".inputs")
            extra = [value for triple, value in opts.device_linker if triple in (None, key[0])]
            host_libraries = ([a for a in opts.linker_args if a.startswith(("-L", "-l"))]
                              if key[0] == HOST_CPU_TRIPLE else [])
            flags = [f"-{opts.opt_level}", *extra]
            # The driver's own job (ld.lld, clang-nvlink-wrapper), remembered per user: no driver start.
            job = linking.probe_device_link(toolchain, key, flags=flags, host_libraries=host_libraries,
                                            cache=user_cache("link-probes.json", max_entries=64))
            command = (job.render(inputs=paths, output=base + ".img") if job is not None else
                       linking.device_link_command(toolchain, key, paths, base + ".img", flags=flags,
                                                   host_libraries=host_libraries))
            jobs.append((key, base + ".img", command))
            image_inputs.append((key, base + ".img", device_inputs))
            # One key for both: the remote cache's and the kept image's.
            keyed = (None if remote is None and kept is None else
                     _device_link_job(toolchain, key, temp_root, command, paths, base + ".img", cwd=bool(extra),
                                      remote=remote))
            if remote is not None and keyed is not None:
                steps[base + ".img"] = remote.keyed(keyed, [base + ".img"])
            if kept is not None and keyed is not None:
                kept_keys[base + ".img"] = (names[key], _kept_key(keyed))
        if opts.dry_run:
            for _, _, command in jobs:
                _print(command)
        else:
            linking.load_wrapper_compiler()  # LLVM loads while the device links' processes run

            def device_link(key: linking.GroupKey, image: str, command: list[str]) -> None:
                name, kept_key = kept_keys.get(image, ("", ""))
                if kept is not None and kept_key and kept.fetch(name, kept_key, image):
                    if opts.verbose:
                        print(f"kept image: {image} (the same device link as the last)", file=sys.stderr,
                              flush=True)
                    return

                def link() -> bool:
                    _run(command, opts.verbose, key[1] or key[0])
                    return True

                _through(steps.get(image), link, opts.verbose)
                if kept is not None and kept_key:
                    kept.keep(name, kept_key, image)

            if opts.jobs > 1 and len(jobs) > 1:
                from concurrent.futures import ThreadPoolExecutor  # (and logging): only when links run in parallel

                with ThreadPoolExecutor(max_workers=opts.jobs) as pool:
                    for future in [pool.submit(device_link, key, image, command) for key, image, command in jobs]:
                        future.result()
            else:
                for key, image, command in jobs:
                    device_link(key, image, command)
        # One object registering each image once per offload kind of its device files (none without any).
        wrapper: str | None = os.path.join(temp_root, f"{stem}.offload.wrapper.o") if jobs else None
        if not opts.dry_run and wrapper is not None:
            objects: list[str | linking.InputObject] = [item.path for item in inputs if os.path.isfile(item.path)]
            objects += scanned.linked_members()
            problems = linking.missing_entries(objects, [(key[1] or key[0], image) for key, image, _ in jobs])
            if problems:
                raise linking.LinkError("; ".join(problems))
            images = [wrapping.LinkedImage(key, image, linking.device_input_kinds(device_inputs, toolchain.major))
                      for key, image, device_inputs in image_inputs]
            path = wrapper

            def wrap() -> bool:
                data = wrapping.registration_object(images, toolchain, path, hip_compression=hip_compression)
                if data is None:
                    return False
                with atomic_output(path) as fd:  # a new file: a symbolic link in its place is not followed
                    write_all(fd, data)
                return True

            step = _wrapper_step(remote, temp_root, toolchain, images, hip_compression, path) if remote else None
            if not _through(step, wrap, opts.verbose):
                wrapper = None
        host = [opts.linker_path or "ld.lld",
                *(opts.linker_args if wrapper is None else _insert_after_output(opts.linker_args, wrapper))]
        if opts.dry_run:
            _print(host)
        else:
            _run(host, opts.verbose)
    finally:
        if not opts.save_temps:
            shutil.rmtree(temp_root, ignore_errors=True)
    return 0


# --- the remote cache ($OFFLOAD_REMOTE) -------------------------------------------------------------------
#
# Each GPU target's device link and the wrapper object are looked up in the remote cache before they run
# (:mod:`offload_builders.remote.cli_jobs`), keyed in the link's scratch directory (or, with --save-temps, the
# output's; either is $SCRATCH in the key): the device link by its command, the unpacked device files it reads
# and the programs it runs (NVPTX: also clang-nvlink-wrapper and the ptxas and nvlink it runs, with the CUDA 12
# wheels' libnvJitLink behind that nvlink; :func:`_device_link_tools`); the wrapper object by
# the images it registers, their offload kinds, the HIP compression, the toolchain's version, CUDA's fatbinary,
# llvmlite's version and our code. The host CPU's device link is not cached: it links the host libraries the
# linker finds by its own search (-L/-l, the C++ and OpenMP runtimes, crt files), which the key could only name
# by repeating that search. Nor is the host link: it is the build system's own step, over inputs it names.


def _remote_steps() -> RemoteSteps | None:
    """The remote cache where ``$OFFLOAD_REMOTE`` names one."""
    from offload_builders.remote.cli_jobs import remote_steps

    return remote_steps(PROG)


def _through(step: CachedStep | None, run: Callable[[], bool], verbose: bool) -> bool:
    """Get a step's outputs (scratch files, written in place) from the remote cache, else ``run`` it and store
    them. ``run`` answers whether it wrote them (a wrapper object may have nothing to register); so does this."""
    if step is not None and step.fetch(lambda path: path):
        if verbose:
            print(f"remote cache: {' '.join(step.outputs.values())}", file=sys.stderr, flush=True)
        return True
    if not run():
        return False
    if step is not None:
        step.store()
    return True


def _device_link_job(toolchain: Toolchain, key: linking.GroupKey, root: str, command: Sequence[str],
                     inputs: Sequence[str], image: str, *, cwd: bool, remote: RemoteSteps | None) -> NodeJob | None:
    """A GPU target's device link as the remote cache and the kept images key it
    (:func:`offload_builders.remote.cli_jobs.step_job`); None where it has no key (the host CPU's, see above).
    ``cwd``: whether the command has words of the user's (``--device-linker``), which may name files relative
    to it. Neither cache ever fails the link: a key that cannot be made is none (and the remote, if any, says
    why once, as for its other failures)."""
    from offload_builders.remote.cli_jobs import step_job

    tools = _device_link_tools(toolchain, key, command)
    if tools is None:
        return None
    try:
        return step_job(root, [command], inputs=inputs, outputs=[image], tools=tools, scratch=root, cwd=cwd,
                        persistent=True)
    except (OSError, ValueError):  # (UnicodeError is a ValueError) a name or file the key cannot hold
        return None
    except Exception as error:  # noqa: BLE001 - the caches never fail the link
        if remote is not None:
            remote.failed(error)
        return None


def _device_link_tools(toolchain: Toolchain, key: linking.GroupKey, command: Sequence[str]) -> list[str] | None:
    """The programs a GPU target's device link runs, which its key names by path and content; None for the host
    CPU's (see above), which is neither cached nor kept."""
    from offload_builders import nvptx_tools
    from offload_builders.targets import AMDGPU_TRIPLE, NVPTX_TRIPLE

    tools = [command[0]]
    try:
        if key[0] == NVPTX_TRIPLE:
            nvlink = nvptx_tools.openmp_tool(toolchain, "nvlink")
            tools += [str(nvptx_tools.openmp_tool(toolchain, "ptxas")), str(nvlink)]
            if (wrapper := toolchain.optional_tool("clang-nvlink-wrapper")) is not None:  # the driver runs it
                tools.append(str(wrapper))
            if (library := nvptx_tools.nvlink_library(nvlink)) is not None:  # the CUDA 12 wheels' nvlink
                tools.append(str(library))
        elif key[0] == AMDGPU_TRIPLE:
            tools += [str(lld)] if (lld := toolchain.optional_tool("ld.lld")) is not None else []
        else:
            return None
    except OffloadError:  # no CUDA tools: the link says so itself
        return None
    return tools


# --- kept images (offload_builders.linking.kept_images) --------------------------------------------------------
#
# Each GPU target's image of this output's last link, reused where the device link's key (as the remote cache's:
# its command, the device files it reads, the programs it runs) is the same: adding a target to a CMake or Meson
# build links that target's image alone, as the SCons tool's device-link nodes do. --no-keep-images turns it off.


def _kept_images(output: str) -> linking.kept_images.KeptImages | None:
    from offload_builders.linking.kept_images import kept_images

    return kept_images(output)


def _kept_key(job: NodeJob) -> str:
    """A device link's key among the kept images."""
    from offload_builders.linking.kept_images import job_key

    return job_key(job)


def _wrapper_step(remote: RemoteSteps, root: str, toolchain: Toolchain, images: Sequence[wrapping.LinkedImage],
                  hip_compression: CompressionOptions | None, wrapper: str) -> CachedStep | None:
    """The wrapper object (:func:`offload_builders.linking.wrapping.registration_object`) through the remote cache."""
    from importlib.metadata import PackageNotFoundError, version

    from offload_builders.phase_table import CUDA

    tools = []
    try:
        if any(CUDA in image.kinds for image in images):
            tools.append(str(toolchain.cuda_tool("fatbinary")))
        llvmlite = version("llvmlite")
    except (OffloadError, PackageNotFoundError):  # the wrap says what is missing
        return None
    described = ["offload-builders-wrap", f"clang={'.'.join(map(str, toolchain.version))}", repr(hip_compression),
                 "-o", wrapper, *(f"{image.key[0]},{image.key[1]},{'+'.join(sorted(image.kinds))}={image.path}"
                                  for image in images)]
    return remote.step(root, [described], inputs=[image.path for image in images], outputs=[wrapper], tools=tools,
                       values=[f"llvmlite {llvmlite}"], scratch=root, in_process=True, cwd=False, persistent=True)


def _target_file_names(stem: str, keys: Sequence[linking.GroupKey]) -> dict[linking.GroupKey, str]:
    """The name of each target's files (``<stem>.<triple>.<arch>``, ``:`` as ``_``; ``native`` for no arch),
    made only of names :func:`linking.check_target_names` let through, and one per target: two keys that would
    share a name (``t`` + ``d.x`` and ``t.d`` + ``x``) get a number after it."""
    names: dict[linking.GroupKey, str] = {}
    for triple, arch in keys:
        name = base = f"{stem}.{triple}.{arch or 'native'}".replace(":", "_")
        number = 0
        while name in names.values():
            number += 1
            name = f"{base}.{number}"
        names[triple, arch] = name
    return names


def _insert_after_output(args: Sequence[str], wrapper: str) -> list[str]:
    """The wrapper object goes right after ``-o <output>``, where clang-linker-wrapper puts it."""
    result = list(args)
    for index, arg in enumerate(result):
        if arg == "-o" and index + 1 < len(result):
            return result[:index + 2] + [wrapper] + result[index + 2:]
        if arg.startswith("-o") and len(arg) > 2 and not arg.startswith("--"):
            return result[:index + 1] + [wrapper] + result[index + 1:]
    return [wrapper] + result


def _main(argv: Sequence[str]) -> int:
    if list(argv) in (["--print-shim-dir"], ["--print-link-args"], ["--print-runtime-dir"]):
        from offload_builders.cli.link_shim import link_args, runtime_dir, shim_dir

        printers = {"--print-shim-dir": shim_dir, "--print-runtime-dir": runtime_dir,
                    "--print-link-args": lambda: "\n".join(link_args())}
        print(printers[argv[0]]())
        return 0
    opts = _parse(argv)
    if answered_help_or_version(opts.help, opts.version, _HELP, f"{PROG} (offload-builders) {__version__}"):
        return 0
    return _link(opts)


def main(argv: Sequence[str] | None = None) -> int:
    return run_guarded(PROG, lambda: _main(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
