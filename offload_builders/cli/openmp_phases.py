"""``offload-compile`` for OpenMP sources: the host front end, a device compile per target, the offload package
and the object that embeds it, each the installed driver's own job (:class:`~offload_builders.models.openmp.
PhaseModel`).

Target regions are named after the device and inode numbers of the files the host front end read
(:mod:`offload_builders.source_identity`): ``host`` writes ``<output>.identity`` with them, and ``device`` fails,
naming the file, where one was re-created since (and removes that record, so that the host step runs again).
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
    remove_file,
    run_to,
    write_depfile,
)
from offload_builders.models.openmp import DeviceSteps, PhaseModel, language_of
from offload_builders.phase_table import OPENMP
from offload_builders.source_identity import file_identity
from offload_builders.targets import TargetID
from offload_builders.toolchain import find_toolchain, user_cache

#: Beside the host bitcode: the identity of every file the host front end read.
IDENTITY_SUFFIX = ".identity"


def _model() -> PhaseModel:
    return PhaseModel(find_toolchain(), os.getcwd(), user_cache("driver-probes.json", max_entries=256))


def host(opts: PhaseOptions) -> int:
    refuse(opts, "fatbin", "cuid", why="is for HIP (.hip) and CUDA (.cu) sources")
    require(opts, "output")
    assert opts.output is not None
    source = source_file(opts)
    model = _model()
    steps = model.host_steps(language_of(source), opts.flags)
    argv = steps.frontend.render(source=source, main_file_name=os.path.basename(source),
                                 output=partial_path(opts.output))
    read = compile_one_job(opts, argv, opts.output, tools=compiler_files(model), identity=True)
    # Every file whose inode names target regions in this bitcode (the source first, then its headers).
    commit_text(opts.output + IDENTITY_SUFFIX, "".join(file_identity(path) + "\n" for path in read))
    write_depfile(opts, [*read, *job_files(argv), *compiler_files(model)])
    return 0


def _check_identity(host_bc: str) -> None:
    """Fail, naming the file, where a file the host front end read is now another file (another inode)."""
    record = host_bc + IDENTITY_SUFFIX
    try:
        with open(record, "rb") as f:
            lines = [line for line in os.fsdecode(f.read()).split("\n") if line.strip()]
    except OSError:
        raise UsageError(f"'{record}' not found: make '{host_bc}' with `{PROG} host` (it writes this file"
                         " beside it) and declare both as outputs of the host step") from None
    for line in lines:
        path = line.rsplit(" dev=", 1)[0].removesuffix(" missing")
        if file_identity(path) != line:
            remove_file(record)
            raise UsageError(f"'{path}' is not the file '{host_bc}' was made from (re-created: another inode),"
                             f" so this compile would emit no kernels; removed '{record}' so that the host step"
                             " runs again: run the build again")


def _device_steps(model: PhaseModel, source: str, target: TargetID, flags: Sequence[str]) -> DeviceSteps:
    return model.device_steps(target, language_of(source), flags)


def device(opts: PhaseOptions) -> int:
    refuse(opts, "cuid", why="is for HIP (.hip) and CUDA (.cu) sources")
    require(opts, "output", "target", "host_bc")
    assert opts.output is not None and opts.target is not None and opts.host_bc is not None
    source = source_file(opts)
    host_bc = input_file(opts.host_bc, "--host-bc")
    target = target_id(opts.target, "--target")
    _check_identity(host_bc)
    model = _model()
    steps = _device_steps(model, source, target, opts.flags)
    partial = partial_path(opts.output)
    with tempfile.TemporaryDirectory(prefix="offload-compile-") as scratch:
        compiled = os.path.join(scratch, "device" + steps.compile_suffix) if steps.assemble else partial
        argv = steps.compile.render(source=source, main_file_name=os.path.basename(source), host_bc=host_bc,
                                    output=compiled)
        ran = [argv] if steps.assemble is None else [argv, steps.assemble.render(input=compiled, output=partial)]
        read = compile_jobs(opts, ran, [opts.output], scratch, tools=compiler_files(model), inputs=[host_bc],
                            identity=True)
    programs = [path for job in ran for path in job_files(job)]
    write_depfile(opts, [*read, host_bc, *programs, *compiler_files(model)])
    return 0


def package(opts: PhaseOptions) -> int:
    from offload_builders.formats.offload_binary import kind_table, packager_images, write_offload_binaries

    require(opts, "output", "targets")
    assert opts.output is not None
    source = source_file(opts)
    pairs = paired_images(opts, "package image")
    model = _model()
    # Each image is named with its phase's suffix, as the SCons tool names it: the packager takes the image
    # kind from it (an object from ".o"), so the build system may name its files as it likes.
    named: dict[str, str] = {}
    steps = []
    for index, (target, path) in enumerate(pairs):
        target_steps = _device_steps(model, source, target, opts.flags)
        named[f"image{index}{target_steps.image_suffix}"] = path
        steps.append((target_steps, f"image{index}{target_steps.image_suffix}"))
    partial = partial_path(opts.output)
    command = model.package_command(steps, partial)

    def produce() -> list[str]:
        table = kind_table(model.toolchain.major)
        offload_images = [image for arg in command if arg.startswith("--image=")
                          for image in packager_images(arg[len("--image="):], table, named.__getitem__)]
        write_offload_binaries(offload_images, partial)
        return list(named.values())

    # Written here as the packager would write it: keyed by what it is given and by our code.
    described = ["offload-builders-package", *command[1:], *(f"{name}={path}" for name, path in named.items())]
    lookup = remote_lookup(opts, [described], [opts.output], inputs=list(named.values()), tools=compiler_files(model),
                           in_process=True)
    produce_outputs([opts.output], produce, lookup)
    write_depfile(opts, [*(path for _, path in pairs), *compiler_files(model)])
    return 0


def embed(opts: PhaseOptions) -> int:
    require(opts, "output", "host_bc", "package")
    assert opts.output is not None and opts.host_bc is not None and opts.package is not None
    source = source_file(opts)
    if source_model(source) != OPENMP:
        raise UsageError(f"embed: '{source}' is {source_model(source).upper()}: `{PROG} host` makes its object"
                         " (with --fatbin, or --package with -fgpu-rdc)")
    host_bc = input_file(opts.host_bc, "--host-bc")
    package = input_file(opts.package, "--package")
    model = _model()
    steps = model.host_steps(language_of(source), opts.flags)
    argv = steps.embed.render(host_bc=host_bc, main_file_name=os.path.basename(source), package=package,
                              output=partial_path(opts.output))
    run_to(opts, argv, opts.output, inputs=[host_bc, package], tools=compiler_files(model))
    write_depfile(opts, [host_bc, package, *job_files(argv), *compiler_files(model)])
    return 0
