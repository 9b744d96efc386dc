"""``offload-compile`` for HIP (``.hip``) and CUDA (``.cu``) sources: a device compile per target (plus its
``lld`` link or ``ptxas``), the fat binary or (``-fgpu-rdc``) the offload package, and the host compile, which is
the object; each the installed driver's own job, as the GPU phase models render them
(:class:`~offload_builders.models.gpu.GpuPhaseModel`).

Host and device compiles of a source without ``-fgpu-rdc`` share one CUID (``--cuid``, else one derived from
the source's path, :func:`~offload_builders.models.gpu.default_cuid`); CUDA's compiles also take all the source's
targets, from which Clang 20+ defines ``__CUDA_ARCH_LIST__``. This module is imported only for such sources.
"""
from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence

from offload_builders.cli._common import UsageError
from offload_builders.cli.phase_options import (
    PROG,
    PhaseOptions,
    input_file,
    paired_images,
    refuse,
    require,
    source_file,
    source_model,
    target_id,
    target_list,
)
from offload_builders.cli.phase_runs import (
    commit_text,
    compile_jobs,
    compile_one_job,
    compiler_files,
    job_files,
    partial_path,
    produce_outputs,
    remote_lookup,
    run_to,
    write_depfile,
)
from offload_builders.depfiles import read_make_dependencies
from offload_builders.driver import CommandTemplate
from offload_builders.errors import OffloadError
from offload_builders.job_words import with_dependency_file
from offload_builders.models.cuda import ARCH_LIST_RECORD_VERSION, ARCH_LIST_SLOT, CudaPhaseModel, check_arch_list
from offload_builders.models.gpu import GpuDeviceSteps, GpuPhaseModel, check_cuid, default_cuid, is_rdc
from offload_builders.models.hip import HipPhaseModel
from offload_builders.phase_table import CUDA, HIP, OPENMP
from offload_builders.source_identity import stat_stamp
from offload_builders.targets import TargetID
from offload_builders.toolchain import find_toolchain, user_cache

#: The phase model of each GPU model's sources.
GPU_MODELS: dict[str, type[GpuPhaseModel]] = {HIP: HipPhaseModel, CUDA: CudaPhaseModel}


def _model_of(opts: PhaseOptions) -> str:
    """The model of the command's source (the caller routed it here by its suffix)."""
    return source_model(opts.positional[0])


def _gpu_model(model: str) -> GpuPhaseModel:
    return GPU_MODELS[model](find_toolchain(), os.getcwd(), user_cache("driver-probes.json", max_entries=256))


def _host_flags(phases: GpuPhaseModel, flags: Sequence[str]) -> tuple[str, ...]:
    """The user's flags plus what the SCons tool adds (:meth:`~offload_builders.models.gpu.GpuPhaseModel.flags_for`)
    for a host compile or a fat binary's parameters, probed with the model's fixed target (neither depends on it)."""
    return phases.flags_for(phases.host_probe_target, flags)


def _check_gpu_targets(phases: GpuPhaseModel, targets: Sequence[TargetID], option: str) -> None:
    """Each of ``targets`` a processor the model offloads to, else one line naming ``option``."""
    for target in targets:
        try:
            phases.check_targets([target])
        except OffloadError as error:
            raise UsageError(f"{option}: {error}") from None


def _gpu_target(phases: GpuPhaseModel, model: str, text: str, option: str) -> TargetID:
    target = target_id(text, option, model)
    _check_gpu_targets(phases, [target], option)
    return target


def _device_steps_of(phases: GpuPhaseModel, target: TargetID, flags: Sequence[str]) -> GpuDeviceSteps:
    return phases.device_steps(target, phases.flags_for(target, flags))


def _cuid(opts: PhaseOptions, source: str, rdc: bool) -> dict[str, str]:
    """The ``cuid`` slot's value: ``--cuid``, else :func:`~offload_builders.models.gpu.default_cuid` of the
    source's path relative to ``--source-root`` (the SCons tool's rule when that is its top directory), else
    of its absolute path; never the path as given, so every build directory gives the same objects. RDC
    compiles pin none (the new driver does not forward ``-cuid``)."""
    if rdc:
        refuse(opts, "cuid", why="is for compiles without -fgpu-rdc (relocatable device code has no CUID)")
        return {}
    if opts.cuid is not None:
        try:
            return {"cuid": check_cuid(opts.cuid)}
        except OffloadError as error:
            raise UsageError(f"--cuid: {error}") from None
    path = os.path.abspath(source)
    if opts.source_root is not None:
        path = os.path.relpath(path, os.path.abspath(opts.source_root))
        if path == os.pardir or path.startswith(os.pardir + os.sep):
            raise UsageError(f"--source-root: '{source}' is not inside '{opts.source_root}'")
    return {"cuid": default_cuid(path)}


def _arch_list(opts: PhaseOptions, phases: GpuPhaseModel, template: CommandTemplate, flags: Sequence[str],
               target: TargetID | None = None) -> dict[str, str]:
    """CUDA: the arch-list slot's value for ``--targets`` (all the source's targets, ``target`` among them), the
    driver's ``__CUDA_ARCH_LIST__`` for one command compiling them all (Clang 20+); ``{}`` where ``template``
    has no such slot (Clang 19: ``--targets`` is checked and has no effect). HIP compiles take no list."""
    if not phases.takes_target_list:
        refuse(opts, "targets", why=f"is for `{opts.command}` of CUDA (.cu) sources (a HIP {opts.command}"
                " compile does not depend on the other targets)")
        return {}
    if opts.targets is None:
        if ARCH_LIST_SLOT in template.slots:
            raise UsageError(f"{opts.command}: --targets is required with Clang {phases.toolchain.major}: its CUDA"
                             " compiles define __CUDA_ARCH_LIST__ from all the source's targets; give them all, as"
                             " to `bundle` (e.g. --targets sm_80,sm_90)")
        return {}
    targets = target_list(opts)
    _check_gpu_targets(phases, targets, "--targets")
    if target is not None and target not in targets:
        raise UsageError(f"{opts.command}: --targets '{opts.targets}' does not name --target {target}: give all"
                         " the source's targets")
    return phases.arch_list_values(template, targets, flags)


def _read_targets_file(opts: PhaseOptions) -> None:
    """``--targets-file F``: ``--targets`` read from F (one line), so that the list is not on the command
    line, which Ninja compares: a CUDA ``device`` whose output the list cannot change then does not rerun when
    only the list changes (its ``arch-list-check`` record, which the build makes it depend on, decides)."""
    if opts.targets_file is None:
        return
    refuse(opts, "targets", why="and --targets-file both give the target list: give one")
    if source_model(opts.positional[0]) != CUDA:
        raise UsageError(f"{opts.command}: --targets-file is for CUDA (.cu) sources")
    try:
        with open(opts.targets_file, encoding="utf-8") as f:
            text = f.read().strip()
    except OSError as error:
        raise UsageError(f"--targets-file: cannot read '{opts.targets_file}': {error.strerror}") from None
    if not text or "\n" in text:
        raise UsageError(f"--targets-file: '{opts.targets_file}' must hold one line, the comma-separated target IDs")
    opts.targets = text
    try:
        target_list(opts)
    except UsageError as error:
        raise UsageError(f"--targets-file: '{opts.targets_file}': {error}") from None


def device(opts: PhaseOptions) -> int:
    """HIP: the device compile and (without -fgpu-rdc) its lld link to the code object; CUDA: the device
    compile to PTX and ptxas to the cubin, the PTX kept as ``<output>.ptx`` for the fat binary."""
    model = _model_of(opts)
    refuse(opts, "host_bc", why="is for OpenMP sources (a HIP or CUDA device compile reads only the source)")
    source_file(opts)
    _read_targets_file(opts)
    require(opts, "output", "target")
    assert opts.output is not None and opts.target is not None
    source = source_file(opts)
    phases = _gpu_model(model)
    target = _gpu_target(phases, model, opts.target, "--target")
    flags = phases.flags_for(target, opts.flags)
    rdc = is_rdc(flags)
    cuid = _cuid(opts, source, rdc)
    steps = phases.device_steps(target, flags)
    arch_list = _arch_list(opts, phases, steps.compile, flags, target)
    second = steps.second_step
    ptx = phases.kept_compile_output(opts.output, rdc)
    partial = partial_path(opts.output)
    with tempfile.TemporaryDirectory(prefix="offload-compile-") as scratch:
        if second is None:
            compiled = partial                      # HIP with -fgpu-rdc: the device bitcode is the output
        elif ptx is not None:
            compiled = partial_path(ptx)            # CUDA: the PTX is kept for the fat binary
        else:
            compiled = os.path.join(scratch, "device" + steps.compile_suffix)
        ran = [steps.compile.render(source=source, main_file_name=os.path.basename(source), output=compiled,
                                    **cuid, **arch_list)]
        if second is not None:
            ran.append(second.render(input=compiled, output=partial))
        outputs = [opts.output] if ptx is None else [ptx, opts.output]
        seen = None
        if opts.archlist_record is not None:
            unlisted = [steps.compile.render(source=source, main_file_name=os.path.basename(source),
                                             output=compiled, **cuid, **dict.fromkeys(arch_list, "<list>")), *ran[1:]]
            unlisted = [[word.replace(scratch, "<scratch>") for word in job] for job in unlisted]
            seen = _archlist_seen(opts.archlist_record, unlisted, compiler_files(phases))
            if all(os.path.exists(path) for path in outputs) and _read_seen(opts.output) == seen:
                return 0  # what the list changes of this compile's text is as it was: the outputs are its own
        read = compile_jobs(opts, ran, outputs, scratch, tools=compiler_files(phases))
    programs = [path for job in ran for path in job_files(job)]
    write_depfile(opts, [*read, *programs, *compiler_files(phases)])
    if seen is not None:
        commit_text(opts.output + SEEN_SUFFIX, seen)
    return 0


#: Beside a CUDA device output made with ``--archlist-record``: what its compile saw (:func:`_archlist_seen`).
SEEN_SUFFIX = ".archlist-seen"


def _archlist_seen(record: str, jobs: Sequence[Sequence[str]], compilers: Sequence[str]) -> str:
    """What a CUDA device compile's output depends on besides the target list (under a build tool that compares
    times only, make): its arch-list-check record (the digest of its preprocessed text without the list, or the
    list itself where the text cannot tell), its jobs with the list left out, and the identity of the compilers.
    Where this is what the last compile saw, that compile's outputs are this one's."""
    import hashlib

    try:
        with open(record, "rb") as f:
            text = f.read()
    except OSError as error:
        raise UsageError(f"--archlist-record: cannot read '{record}': {error.strerror}") from None
    digest = hashlib.sha256(text + b"\0")
    for job in jobs:
        digest.update("\0".join(job).encode("utf-8", "surrogateescape") + b"\n")
    for path in compilers:
        try:
            digest.update(f"{path} {stat_stamp(os.stat(path))}\n".encode("utf-8", "surrogateescape"))
        except OSError:
            continue
    return digest.hexdigest() + "\n"


def _read_seen(output: str) -> str | None:
    try:
        with open(output + SEEN_SUFFIX, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError):
        return None


def arch_list_check(opts: PhaseOptions) -> int:
    """CUDA: what ``--targets`` changes of ``device --target T``'s output, as the SCons tool's list check
    records it (:func:`~offload_builders.models.cuda.check_arch_list`): T's device ``-cc1`` rendered as ``device``
    renders it, with the driver's ``__CUDA_ARCH_LIST__``, run with ``-E -dD``; the record is the digest of that
    text without the list's own ``#define``, or the list itself where the text cannot tell. Written atomically
    and left untouched (mtime too) when its bytes are unchanged, so a device command that depends on it (and
    takes the list from ``--targets-file``) reruns exactly where the list can change its output. The depfile
    names the source, the headers the preprocessing read and the compiler. With Clang 19, which defines no
    list, the record is constant."""
    if _model_of(opts) != CUDA:
        raise UsageError(f"arch-list-check: '{opts.positional[0]}' is not CUDA (.cu): only CUDA compiles define"
                         " __CUDA_ARCH_LIST__")
    refuse(opts, "host_bc", "package", "fatbin", "targets_file",
           why="is not for arch-list-check (it takes what `device` takes, and the list as --targets)")
    require(opts, "output", "target")
    assert opts.output is not None and opts.target is not None
    source = source_file(opts)
    phases = _gpu_model(CUDA)
    target = _gpu_target(phases, CUDA, opts.target, "--target")
    flags = phases.flags_for(target, opts.flags)
    cuid = _cuid(opts, source, is_rdc(flags))
    steps = phases.device_steps(target, flags)
    arch_list = _arch_list(opts, phases, steps.compile, flags, target)
    words = steps.compile.render(source=source, main_file_name=os.path.basename(source), output="-", **cuid,
                                 **arch_list)
    read = [source]
    if ARCH_LIST_SLOT not in arch_list:
        record = f"{ARCH_LIST_RECORD_VERSION}\nno list: Clang {phases.toolchain.major} defines no __CUDA_ARCH_LIST__\n"
    else:
        with tempfile.TemporaryDirectory(prefix="offload-compile-") as scratch:
            headers_file = os.path.join(scratch, "deps.d")
            record = check_arch_list(with_dependency_file(words, headers_file, opts.output), flags,
                                     arch_list[ARCH_LIST_SLOT], os.environ)
            if os.path.isfile(headers_file):
                read = read_make_dependencies(headers_file) or read
    commit_text(opts.output, record)
    write_depfile(opts, [*read, *job_files(words), *compiler_files(phases)])
    return 0


def bundle(opts: PhaseOptions) -> int:
    """The fat binary of a source compiled without -fgpu-rdc, as its model makes it
    (:meth:`~offload_builders.models.gpu.GpuPhaseModel.fatbin_job`): HIP's written in-process (compressed as the
    flags say), CUDA's by the toolkit's ``fatbinary`` (each cubin, and the PTX beside it where the driver puts PTX
    in)."""
    require(opts, "output", "targets")
    assert opts.output is not None
    source = source_file(opts)
    model = source_model(source)
    if model == OPENMP:
        raise UsageError(f"bundle: '{source}' is neither HIP (.hip) nor CUDA (.cu): its offload package is made by"
                         f" `{PROG} package`")
    pairs = paired_images(opts, "code object" if model == HIP else "cubin")
    phases = _gpu_model(model)
    _check_gpu_targets(phases, [target for target, _ in pairs], "--targets")
    if is_rdc(_host_flags(phases, opts.flags)):
        raise UsageError(f"bundle: with -fgpu-rdc the device code goes into an offload package: use `{PROG} package`")
    partial = partial_path(opts.output)
    job = phases.fatbin_job(opts.flags, pairs, partial, environ=os.environ)
    for path in job.kept:
        input_file(path, "the device compile's output (kept beside its image by `device`)")
    if job.command is None:
        write = job.write
        assert write is not None

        def produce() -> list[str]:
            write()
            return list(job.reads)

        # Written here: keyed by what the writer is given and by our code.
        lookup = remote_lookup(opts, [list(job.described)], [opts.output], inputs=job.reads,
                               tools=compiler_files(phases), in_process=True)
        produce_outputs([opts.output], produce, lookup)
        programs: list[str] = []
    else:
        run_to(opts, job.command, opts.output, inputs=job.reads, tools=compiler_files(phases))
        programs = job_files(job.command)
    write_depfile(opts, [*job.reads, *programs, *compiler_files(phases)])
    return 0


def package(opts: PhaseOptions) -> int:
    """-fgpu-rdc: the offload package of a source's per-target device code (HIP bitcode, CUDA relocatable
    cubins), by ``clang-offload-packager`` as the SCons tool runs it."""
    require(opts, "output", "targets")
    assert opts.output is not None
    source = source_file(opts)
    model = source_model(source)
    pairs = paired_images(opts, "device image")
    phases = _gpu_model(model)
    _check_gpu_targets(phases, [target for target, _ in pairs], "--targets")
    if not is_rdc(_host_flags(phases, opts.flags)):
        raise UsageError(f"package: '{source}' is {model.upper()} without -fgpu-rdc: its fat binary is made by"
                         f" `{PROG} bundle` (add -fgpu-rdc to every phase's flags for relocatable device code)")
    images = [(_device_steps_of(phases, target, opts.flags), path) for target, path in pairs]
    partial = partial_path(opts.output)
    argv = phases.package_command(images, partial)
    run_to(opts, argv, opts.output, inputs=[path for _, path in pairs], tools=compiler_files(phases))
    write_depfile(opts, [*(path for _, path in pairs), *job_files(argv), *compiler_files(phases)])
    return 0


def host(opts: PhaseOptions) -> int:
    """The host compile, which is the object: with the fat binary (``--fatbin``, and the CUID its device
    code was compiled with) or, with -fgpu-rdc, the offload package (``--package``)."""
    model = _model_of(opts)
    refuse(opts, "host_bc", why="is for OpenMP sources (a HIP or CUDA host compile reads the source)")
    require(opts, "output")
    assert opts.output is not None
    source = source_file(opts)
    phases = _gpu_model(model)
    flags = _host_flags(phases, opts.flags)
    rdc = is_rdc(flags)
    if rdc:
        refuse(opts, "fatbin", why="is for compiles without -fgpu-rdc; with it the host compile takes --package")
        require(opts, "package")
        assert opts.package is not None
        device_side = {"package": input_file(opts.package, "--package")}
    else:
        refuse(opts, "package", why="is for -fgpu-rdc compiles; without it the host compile takes --fatbin")
        require(opts, "fatbin")
        assert opts.fatbin is not None
        device_side = {"fatbin": input_file(opts.fatbin, "--fatbin")}
    cuid = _cuid(opts, source, rdc)
    steps = phases.host_steps(flags)
    arch_list = _arch_list(opts, phases, steps.compile, flags)
    argv = steps.compile.render(source=source, main_file_name=os.path.basename(source),
                                output=partial_path(opts.output), **device_side, **cuid, **arch_list)
    read = compile_one_job(opts, argv, opts.output, tools=compiler_files(phases), inputs=list(device_side.values()))
    write_depfile(opts, [*read, *device_side.values(), *job_files(argv), *compiler_files(phases)])
    return 0
