"""``offload-cache``: a compiler launcher that caches each job of a Clang OpenMP offload compile on its own.

Used as ccache and sccache are::

    cmake -DCMAKE_CXX_COMPILER_LAUNCHER=offload-cache -DCMAKE_CXX_COMPILER=clang++-19 ...
    make CXX="offload-cache clang++-19"
    # Meson: [binaries] cpp = ['offload-cache', 'clang++-19']

A compile with OpenMP offloading (``-fopenmp`` with ``--offload-arch=`` or ``-fopenmp-targets=``, ``-c``, one
source) is looked up as a whole first: the command's key (:func:`~offload_builders.launcher.keys.command_key`)
and the files its last runs read, hashed as they are now (ccache's direct mode), name the object, the dependency
file and the diagnostics to replay; such a hit imports little and runs no compiler. Otherwise the driver's jobs
(``-###``) run one by one, each kept in the cache under its own key (:mod:`offload_builders.launcher.jobs`), so
adding a target runs that target's device compile, the packager and the embedding back end only. A link with
offloading (as CMake's ``CMAKE_<LANG>_LINKER_LAUNCHER``) runs with ``offload-link`` in the place of the driver's
``clang-linker-wrapper`` (``-B``, :mod:`offload_builders.cli.link_shim`), which keeps each target's device image:
adding a target links that target's image alone. Every other command runs the compiler unchanged
(:mod:`offload_builders.launcher.command` says which).

The object equals the driver's for the same command, byte for byte: the launcher adds nothing to the command.
"""
from __future__ import annotations

import os
import sys

from offload_builders.cli._common import UsageError, run_guarded
from offload_builders.launcher.command import Command, diagnostics_shown, read_command
from offload_builders.launcher.keys import Key, command_key, lookup_by_files, program_entry, store_by_files
from offload_builders.launcher.store import CacheStore, parse_size

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

PROG = "offload-cache"

_HELP = f"""OVERVIEW: A compiler launcher that caches each job of a Clang OpenMP offload compile on its own.

USAGE: {PROG} <compiler> <arguments...>     compile through the cache (as CMAKE_<LANG>_COMPILER_LAUNCHER)
       {PROG} -s | --show-stats            print the statistics and the cache's size
       {PROG} -z | --zero-stats            zero the statistics
       {PROG} -C | --clear                 remove every entry
       {PROG} -M | --max-size <size>       set the size limit (e.g. 10G, 500M; 0: no limit)

The cache lives in $OFFLOAD_CACHE_DIR, else offload-cache in the per-user cache directory
($OFFLOAD_BUILDERS_CACHE_DIR, else $XDG_CACHE_HOME/offload-builders or ~/.cache/offload-builders).
OFFLOAD_CACHE_DISABLE=1 runs every command unchanged; OFFLOAD_CACHE_RECACHE=1 runs every job and stores it anew;
OFFLOAD_CACHE_READONLY=1 looks up but stores nothing; OFFLOAD_CACHE_LOGFILE=<file> gets a line per miss saying why;
OFFLOAD_CACHE_JOBS=<n> runs up to n jobs of one OpenMP compile at once (default: one after another, as the
driver, or on make's jobserver slots where there is one). OFFLOAD_REMOTE=grpc://HOST:PORT/INSTANCE adds a REAPI
cache behind the local one. A link with offloading runs with offload-link in the linker wrapper's place.
"""


def _set(name: str) -> bool:
    return os.environ.get(name, "") not in ("", "0")


def _run_unchanged(argv: Sequence[str], environ: dict[str, str] | None = None) -> int:
    """Run the compiler as it was asked for (this process becomes it), in ``environ`` where given."""
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        if environ is None:
            os.execvp(argv[0], list(argv))
        else:
            os.execvpe(argv[0], list(argv), environ)
    except OSError as error:
        print(f"{PROG}: error: cannot run '{argv[0]}': {error.strerror}", file=sys.stderr)
        return 127
    return 0  # not reached


def _log(line: str) -> None:
    path = os.environ.get("OFFLOAD_CACHE_LOGFILE")
    if not path:
        return
    try:
        with open(path, "a", encoding="utf-8", errors="surrogateescape") as f:
            f.write(f"{PROG}[{os.getpid()}] {line}\n")
    except OSError:
        pass


def _write_atomically(path: str, data: bytes) -> None:
    partial = path + ".partial"
    with open(partial, "wb") as f:
        f.write(data)
    os.replace(partial, path)


def _replayed(command: Command, store: CacheStore, base: Key) -> bool:
    """The whole command from the cache (the direct mode's hit): the object, the dependency file and the
    diagnostics of the run that stored it. False: a miss."""
    if _set("OFFLOAD_CACHE_RECACHE"):
        return False
    assert command.output is not None
    entry = lookup_by_files(store, base.hex())
    if entry is None:
        return False
    with entry:
        entry.copy_to("out", command.output)
        depfile = os.fsdecode(entry.meta)  # the dependency file's name, where the command writes one
        if depfile:
            _write_atomically(depfile, entry.read("deps"))
        stderr = entry.read("stderr") if "stderr" in entry.names else b""
    stderr = diagnostics_shown(stderr, command.colour, sys.stderr.isatty())
    if stderr:
        sys.stderr.buffer.write(stderr)
        sys.stderr.buffer.flush()
    return True


def launch(argv: Sequence[str]) -> int:
    """Compile ``argv`` (a compiler and its arguments) through the cache; every failure of the cache itself is a
    compile as if there were none."""
    if _set("OFFLOAD_CACHE_DISABLE"):
        return _run_unchanged(argv)
    command = read_command(argv)
    if command.link:
        return _link(command)
    store = CacheStore.open() if command.splits else None
    if store is None:
        if command.reason is not None:
            _log(f"runs unchanged: {command.reason}: {' '.join(argv)}")
            if (counted := CacheStore.open()) is not None:
                counted.count("pass-through")
        return _run_unchanged(argv)
    assert command.output is not None and command.source is not None
    cwd = os.getcwd()
    base = command_key(command.compiler, command.expanded, cwd, os.environ)
    if _replayed(command, store, base):
        store.count("hits")
        return 0
    return _compile(command, store, base, cwd)


def _link(command: Command) -> int:
    """A link: where the driver runs its linker wrapper, the same link with ``offload-link`` in the wrapper's place
    (the driver's own decision, read from ``-###``: ``-fopenmp`` without targets runs none; old-driver HIP and CUDA
    device links run ``lld``/``nvlink`` and pass through), unless ``offload-link`` would refuse the wrapper's
    options; otherwise the link as it was asked for."""
    import subprocess

    from offload_builders.cli.link import refused_options
    from offload_builders.cli.link_shim import WRAPPER_NAME, shim_dir
    from offload_builders.errors import OffloadError
    from offload_builders.job_words import parse_driver_jobs

    argv = [command.compiler, *command.arguments]
    try:
        shim = shim_dir()
        shimmed = [command.compiler, f"-B{shim}", *command.arguments]
        done = subprocess.run([shimmed[0], "-###", *shimmed[1:]], capture_output=True, text=True,
                              errors="surrogateescape", check=False)
    except (OSError, OffloadError) as error:
        _log(f"link runs unchanged: {error}: {' '.join(argv)}")
        return _run_unchanged(argv)
    wrapper = os.path.join(shim, WRAPPER_NAME)
    wrappers = [job for job in parse_driver_jobs(done.stderr) if job[0] == wrapper] if done.returncode == 0 else []
    why = ("the driver runs no linker wrapper" if not wrappers else refused_options(wrappers[0][1:]))
    if why is not None:
        _log(f"link runs unchanged: {why}: {' '.join(argv)}")
        return _run_unchanged(argv)
    _log(f"link through offload-link: {' '.join(argv)}")
    environ = dict(os.environ)
    store = CacheStore.open()
    if store is not None and not store.read_only:  # the kept images count in this cache's size limit
        from offload_builders.launcher.store import KEPT_IMAGES
        from offload_builders.linking.kept_images import DIRECTORY_VARIABLE

        environ[DIRECTORY_VARIABLE] = os.path.join(store.root, KEPT_IMAGES)
    return _run_unchanged(shimmed, environ)


def _compile(command: Command, store: CacheStore, base: Key, cwd: str) -> int:
    """A miss: the driver's jobs, each from the cache or run here; then the whole command is stored."""
    from offload_builders.launcher.jobs import JobsFailed, UnfollowedJobs, driver_jobs, run_jobs
    from offload_builders.launcher.store import remove_tree, scratch_directory

    assert command.output is not None
    found = driver_jobs(command, store, base)
    if found is None:  # the driver refused the command: it says why itself
        store.count("pass-through")
        return _run_unchanged([command.compiler, *command.arguments])
    log: list[str] = []
    try:
        result = run_jobs(command, found, store, cwd, command.output, log)
    except JobsFailed as failed:
        store.count("failed")
        _log(f"compile failed: {command.source}")
        return failed.status
    except UnfollowedJobs as why:  # nothing was printed or written yet
        store.count("pass-through")
        _log(f"runs unchanged: {why}: {' '.join([command.compiler, *command.arguments])}")
        return _run_unchanged([command.compiler, *command.arguments])
    if result.depfile is not None and result.depfile_text is not None:
        _write_atomically(result.depfile, result.depfile_text)
    store.count("misses")
    _log(f"miss {command.source}: {'; '.join(log) or 'every job was a hit'}")
    if result.read and result.read_listed:
        scratch = scratch_directory()
        try:
            files = {"out": command.output}
            for name, data in (("stderr", result.stderr), ("deps", result.depfile_text)):
                if data:
                    files[name] = os.path.join(scratch, name)
                    with open(files[name], "wb") as f:
                        f.write(data)
            listed = [*result.read, *(program_entry(program) for program in result.programs)]
            store_by_files(store, base.hex(), listed, files, os.fsencode(result.depfile or ""))
        finally:
            remove_tree(scratch)
    return 0


def _manage(args: Sequence[str]) -> int:
    """The options that manage the cache (no compiler named)."""
    from offload_builders import __version__

    if not args or args[0] in ("-h", "--help", "-help"):
        sys.stdout.write(_HELP)
        return 0
    if args[0] == "--version":
        print(f"{PROG} (offload-builders) {__version__}")
        return 0
    store = CacheStore.open()
    if store is None:
        raise UsageError("the cache is off or cannot be used (see $OFFLOAD_CACHE_DIR)")
    option, rest = args[0], list(args[1:])
    if option.startswith("--max-size="):
        option, rest = "--max-size", [option.split("=", 1)[1], *rest]
    expected = 1 if option in ("-M", "--max-size") else 0
    if len(rest) != expected:
        raise UsageError(f"{option}: expected {expected} value(s), got {len(rest)} (see --help)")
    if option in ("-s", "--show-stats"):
        sys.stdout.write(store.show_stats())
    elif option in ("-z", "--zero-stats"):
        store.zero_stats()
    elif option in ("-C", "--clear"):
        store.clear()
    elif option in ("-M", "--max-size"):
        try:
            store.set_max_size(parse_size(rest[0]))
        except ValueError as error:
            raise UsageError(f"{option}: {error}") from None
    else:
        raise UsageError(f"unknown option '{option}' (see --help); a compile names the compiler first")
    return 0


def _launch_or_compile(argv: Sequence[str]) -> int:
    """:func:`launch`, and where the cache itself fails (a bug, a file system that misbehaves), one warning and
    the compile as if there were no cache: the launcher never fails a build the compiler would not."""
    try:
        return launch(argv)
    except Exception as error:  # noqa: BLE001 - the cache must never be why a compile fails
        print(f"{PROG}: warning: the cache failed ({type(error).__name__}: {error}); compiling without it",
              file=sys.stderr)
        return _run_unchanged(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0].startswith("-"):
        return run_guarded(PROG, lambda: _manage(args))
    return _launch_or_compile(args)


if __name__ == "__main__":
    sys.exit(main())
