"""The device link of one target, and the host link, as the commands ``clang-linker-wrapper`` 19 runs.

:func:`device_link_command` is the ``clang`` command the wrapper runs for one target's device image
(AMDGPU through ld.lld's LTO, NVPTX through ``clang-nvlink-wrapper``, the host CPU as a shared object
libomptarget loads); :func:`known_device_link` and :func:`host_link_job` ask the driver once for its own job
(``-###``) and keep it as a command template, so a link does not start the driver again. The optimisation
level of a device link follows the driver's mapping of ``-O`` (:func:`device_link_opt_flag`).
"""
from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from offload_builders import nvptx_tools
from offload_builders.driver import Arg, CommandTemplate, Slot, remembered_jobs, run_driver
from offload_builders.job_words import parse_driver_jobs
from offload_builders.linking.inputs import GroupKey
from offload_builders.targets import AMDGPU_TRIPLE, NVPTX_TRIPLE
from offload_builders.toolchain import ProbeCache, Toolchain

#: The OpenMP device runtime every device image links (the driver adds ``-lomptarget.devicertl``).
DEVICE_RUNTIME = "libomptarget.devicertl.a"

# --------------------------------------------------------------------------------------------------
# Commands.


def device_link_command(toolchain: Toolchain, key: GroupKey, inputs: Sequence[str], output: str, *,
                        flags: Sequence[str] = ("-O2",), host_libraries: Sequence[str] = (),
                        use_lld: bool = True) -> list[str]:
    """The command that links one target's device image, as ``clang-linker-wrapper`` 19 runs it.

    AMDGPU: bitcode through ld.lld's LTO with ``-plugin-opt=mcpu``; NVPTX: ``clang-nvlink-wrapper`` (its
    own LTO of bitcode inputs, then ptxas and nvlink); the host CPU: a ``-shared -Bsymbolic`` object that
    libomptarget ``dlopen``s, linked against the host libraries.
    """
    triple, arch = key
    argv = [str(toolchain.clang), "--no-default-config", "-o", output, f"--target={triple}"]
    if triple == AMDGPU_TRIPLE:
        argv.extend([f"-mcpu={arch}", "-flto"])  # with -flto the driver turns a target ID into lld's mcpu/mattr
    elif triple == NVPTX_TRIPLE:
        argv.append(f"-march={arch}")
        if (tools := nvptx_tools.openmp_cuda_path(toolchain)) is not None:  # ptxas and nvlink the runtime loads
            argv.append(f"--cuda-path={tools}")
    argv.extend(flags)
    if triple == NVPTX_TRIPLE and (level := _ptxas_opt_level(flags)) is not None:
        # clang-linker-wrapper runs LTO at this level and then ptxas at the driver's mapping of it;
        # clang-nvlink-wrapper does both from one --plugin-opt (left alone, it runs ptxas at -O3).
        argv.append(f"-Wl,--plugin-opt=O{level}")
    if triple != NVPTX_TRIPLE:
        argv.append("-Wl,--no-undefined")
    argv.extend(inputs)
    if triple not in (AMDGPU_TRIPLE, NVPTX_TRIPLE):
        if use_lld and toolchain.optional_tool("ld.lld"):
            argv.append("-fuse-ld=lld")
        argv.extend(["-Wl,-Bsymbolic", "-shared"])
        argv.extend(host_libraries)
        argv.extend([f"-L{toolchain.lib_dir}", "-lstdc++", "-lm", "-lomp", "-lomptarget"])
    return argv


def _ptxas_opt_level(flags: Sequence[str]) -> str | None:
    """The ptxas level the Clang 19 driver gives for the last ``-O`` in ``flags`` (its NVPTX assembler
    maps -O4/-Ofast to 3, -O0 to 0, -O1..3 to themselves and anything else to 2), or None."""
    level = None
    for flag in flags:
        if flag in ("-O4", "-Ofast"):
            level = "3"
        elif flag.startswith("-O"):
            level = flag[2:] if flag[2:] in ("0", "1", "2", "3") else "2"
    return level


def driver_opt_level(flags: Sequence[str]) -> str | None:
    """The ``clang-linker-wrapper --opt-level`` the Clang 19 driver passes for the last ``-O`` among ``flags``
    (its link line): ``-O0``..``-O3`` as they are, ``-O``/``-Og`` 1, ``-Os``/``-Oz`` 2, ``-O4``/``-Ofast`` 3,
    any other value 0; None without an ``-O``, where the wrapper links at O2."""
    level = None
    for flag in flags:
        if flag in ("-O4", "-Ofast"):
            level = "O3"
        elif flag.startswith("-O"):
            value = flag[2:]
            level = "O" + {"": "1", "1": "1", "2": "2", "3": "3", "s": "2", "z": "2", "g": "1"}.get(value, "0")
    return level


def device_link_opt_flag(link_flags: Sequence[str], compile_flags: Sequence[str] = ()) -> str:
    """The ``-O`` of a device link: the driver's level for the link line's ``-O``, else for the compile's
    (a one-command build, ``clang++ -O3 -fopenmp x.cpp``, has it on its link line), else ``-O2``."""
    return "-" + (driver_opt_level(link_flags) or driver_opt_level(compile_flags) or "O2")


def host_runtime_arguments(toolchain: Toolchain) -> list[str]:
    """What the host link needs for offloading without the linker wrapper: libomp and libomptarget."""
    return ["-fopenmp", f"-L{toolchain.lib_dir}", "-lomptarget"]


def load_wrapper_compiler() -> None:
    """Start loading LLVM for the registration code in the background, so that it overlaps a link's
    scan and device links (see :func:`offload_builders.linking.registration.load_llvm_in_background`)."""
    from offload_builders.linking import registration

    registration.load_llvm_in_background()


def device_runtime(toolchain: Toolchain) -> Path:
    return toolchain.runtime_library(DEVICE_RUNTIME)




# --------------------------------------------------------------------------------------------------
# Device links as the driver's own job, probed once.

_PROBE_INPUT = "__offload_link_probe_input_{}.o"
_PROBE_OUTPUT = "__offload_link_probe_output.img"
_PROBE_LIBRARY = "__offload_link_probe_library_{}{}"
#: Host-library words whose next word is the flag's value, not a file.
_VALUE_FLAGS = frozenset({"-L", "-l", "-Xlinker", "-T", "-u", "-z", "-rpath", "-o"})
#: In-process answers of :func:`probe_device_link` (a template, or None where the driver's job is not one
#: plain command we can fill in).
_DEVICE_LINK_JOBS: dict[tuple, CommandTemplate | None] = {}


def _library_files(host_libraries: Sequence[str]) -> list[int]:
    """The positions of the host-library words that are files (a library node given by path), not flags."""
    return [index for index, word in enumerate(host_libraries)
            if not word.startswith("-") and (index == 0 or host_libraries[index - 1] not in _VALUE_FLAGS)]


def _probe_libraries(host_libraries: Sequence[str]) -> tuple[str, ...]:
    """``host_libraries`` with every file replaced by a placeholder of the same suffix (the driver only
    looks at the suffix): the probe runs in a scratch directory, and one answer serves every project."""
    words = list(host_libraries)
    for number, index in enumerate(_library_files(host_libraries)):
        words[index] = _PROBE_LIBRARY.format(number, os.path.splitext(words[index])[1])
    return tuple(words)


def probe_device_link(toolchain: Toolchain, key: GroupKey, *, flags: Sequence[str] = ("-O2",),
                      host_libraries: Sequence[str] = (), cache: ProbeCache | None = None,
                      warn: Callable[[str], None] | None = None) -> CommandTemplate | None:
    """The one job the driver runs for :func:`device_link_command` (``ld.lld`` for AMDGPU and the host CPU,
    ``clang-nvlink-wrapper`` for NVPTX), as a template with an ``inputs`` (a list) and an ``output`` slot,
    and a ``library_<n>`` slot per file among ``host_libraries`` (fill it with :func:`render_device_link`).

    Running that job directly saves the driver's start and its search for GCC and CUDA, about 20 ms a
    device link. Every file of the probe is a placeholder in a scratch directory. Memoized; ``cache``
    (with the per-user probe cache) keeps the answer across runs, a failure included: a driver that
    rejects the probe is asked once, ``warn`` gets its command and message, and the link runs the driver
    command (:func:`device_link_command`). None there and where the driver prints anything but one job
    holding our inputs in order, and the output, as plain arguments.
    """
    libraries = _probe_libraries(host_libraries)
    memo = _device_link_memo(toolchain, key, flags, libraries)
    if memo not in _DEVICE_LINK_JOBS:
        inputs = [_PROBE_INPUT.format(index) for index in range(2)]
        argv = device_link_command(toolchain, key, inputs, _PROBE_OUTPUT, flags=flags, host_libraries=libraries)
        files = [*inputs, *(libraries[index] for index in _library_files(libraries))]

        def ask_driver() -> tuple[tuple[str, ...], ...]:
            with tempfile.TemporaryDirectory(prefix="offload-link-probe-") as scratch:
                for name in files:
                    open(os.path.join(scratch, name), "wb").close()
                done = run_driver([*argv, "-###"], scratch)
            if done.returncode == 0:
                return tuple(tuple(job) for job in parse_driver_jobs(done.stderr))
            if warn is not None:
                errors = [line.strip() for line in done.stderr.splitlines() if "error" in line]
                warn(f"the device-link probe failed, so the {key[1] or key[0]} device link runs the driver: "
                     f"{' '.join(errors or done.stderr.strip().splitlines()[-1:])} (from: {' '.join([*argv, '-###'])})")
            return ()  # remembered: the driver command is used, and the driver is not asked again

        cache_key = ProbeCache.key(argv[0], "device-link", tuple(argv[1:]), "") if cache is not None else ""
        jobs = remembered_jobs(cache_key, cache, ask_driver)
        _DEVICE_LINK_JOBS[memo] = _device_link_template(jobs[0], inputs, libraries) if len(jobs) == 1 else None
    return _DEVICE_LINK_JOBS[memo]


def known_device_link(toolchain: Toolchain, key: GroupKey, *, flags: Sequence[str] = ("-O2",),
                      host_libraries: Sequence[str] = ()) -> CommandTemplate | None:
    """What :func:`probe_device_link` found in this process for these arguments, without probing."""
    return _DEVICE_LINK_JOBS.get(_device_link_memo(toolchain, key, flags, _probe_libraries(host_libraries)))


def render_device_link(job: CommandTemplate, inputs: Sequence[str], output: str,
                       host_libraries: Sequence[str] = ()) -> list[str]:
    """``job`` (from :func:`probe_device_link` for these ``host_libraries``) filled in for one link."""
    files = {f"library_{number}": host_libraries[index]
             for number, index in enumerate(_library_files(host_libraries))}
    return job.render(inputs=inputs, output=output, **files)


def _device_link_memo(toolchain: Toolchain, key: GroupKey, flags: Sequence[str],
                      libraries: Sequence[str]) -> tuple:
    return str(toolchain.clang), key, tuple(flags), tuple(libraries)


def _device_link_template(job: Sequence[str], inputs: Sequence[str],
                          libraries: Sequence[str]) -> CommandTemplate | None:
    """``job`` with our probe inputs (one run, in order), library placeholders and output turned into
    slots, or None."""
    positions = [index for index, arg in enumerate(job) if arg in inputs]
    if not positions or [job[index] for index in positions] != list(inputs) \
            or positions != list(range(positions[0], positions[0] + len(inputs))) or job.count(_PROBE_OUTPUT) != 1:
        return None
    library_slots = {libraries[index]: f"library_{number}" for number, index in enumerate(_library_files(libraries))}
    argv: list[Arg] = []
    for index, arg in enumerate(job):
        if index == positions[0]:
            argv.append(Slot("inputs"))
        elif index in positions:
            continue
        elif arg == _PROBE_OUTPUT:
            argv.append(Slot("output"))
        elif arg in library_slots:
            argv.append(Slot(library_slots[arg]))
        elif "__offload_link_probe" in arg:
            return None  # a path derived from ours (a temporary file name): not a plain template
        else:
            argv.append(arg)
    template = CommandTemplate(tuple(argv))
    return template if template.slots == {"inputs", "output", *library_slots.values()} else None


# --------------------------------------------------------------------------------------------------
# The host link as the driver's own job, probed once per command line.

#: What ``clang -###`` prints besides its jobs when it has nothing to say (anything else, a warning
#: for one, is for the user to see on every link, so the driver runs).
_DRIVER_HEADER_PREFIXES = ("Target: ", "Thread model: ", "InstalledDir: ", "Configuration file: ")


def host_link_job(argv: Sequence[str], cwd: str, environ: Mapping[str, str],
                  cache: ProbeCache) -> tuple[str, ...] | None:
    """The one job (``ld.lld``, or the system linker) the driver runs for the host link ``argv`` in ``cwd``
    with ``environ``, so the link can run it without the driver's start (about 20 ms).

    Kept in ``cache`` under the whole command line and environment, so asked once per program and set of
    flags; the key also names the driver binary and the GCC and CUDA installations its job refers to.
    None where the driver says anything but its one job, where it fails, or for a response file
    (``@file``: its contents are not in the key).
    """
    if any(arg.startswith("@") for arg in argv):
        return None
    key = ProbeCache.key(argv[0], "host-link", (*argv[1:], "\0", *sorted(f"{k}={v}" for k, v in environ.items())), cwd)
    jobs = cache.get(key)
    if jobs is None:
        done = run_driver([*argv, "-###"], cwd, environ)
        lines = done.stderr.splitlines()
        said = [line for line in lines if not line.startswith((' "', *_DRIVER_HEADER_PREFIXES))
                and " clang version " not in f" {line}"]
        found = parse_driver_jobs(done.stderr)
        usable = done.returncode == 0 and not said and len(found) == 1
        jobs = (tuple(found[0]),) if usable else ()  # () remembers "run the driver"
        if done.returncode == 0:
            cache.put(key, jobs)
    return jobs[0] if jobs else None
