"""The OpenMP model of the ``offload`` SCons tool: C and C++ sources where ``$OFFLOAD_MODEL`` is ``'openmp'``
(the default).

``OffloadObject`` expands a C or C++ source into a host front end (``<stem>.host.bc``) and per target ID a
device compile (``<stem>.<target>.dev<suffix>``; for NVPTX the compile and ``ptxas`` make one node, the cubin
``<stem>.<target>.dev.cubin.o``), and makes the object itself the package and embed steps. A step's output
that only the next step of the same node reads (NVPTX's PTX, the package) is a file written and read within
the node's action rather than a node of its own: SCons' no-op cost grows with nodes. The renderers ask
:class:`offload_builders.models.openmp.PhaseModel` for the driver's own jobs. Its link-side pieces (the device
runtime, the host runtime, the link tools' checks) serve ``OffloadProgram``, which every model shares
(:mod:`offload_builders.scons.program`).
"""
from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import SCons.Action
import SCons.Builder
import SCons.Errors
import SCons.Node.FS
import SCons.Tool
import SCons.Warnings

from offload_builders import linking, nvptx_tools
from offload_builders.errors import OffloadError
from offload_builders.leftovers import PACKAGE_SUFFIX, PTX_SUFFIX
from offload_builders.models.openmp import (
    LANGUAGE_BY_SUFFIX,
    DeviceSteps,
    HostSteps,
    PhaseModel,
    dependency_values,
    language_of,
    target_selection_flags,
)
from offload_builders.phase_table import OPENMP, Phase, node_name
from offload_builders.scons.actions import PhaseCommandAction, RemoveSideFile, node_action, phase_action
from offload_builders.scons.construction_variables import SET_BY_OPENMP, defaults_of
from offload_builders.scons.outputs import COMMIT, REMOVE_STALE, own_outputs, partial_path, side_path
from offload_builders.scons.rendering import Renderer, compile_flags, mark_model, node_memo
from offload_builders.scons.scanning import SHARED_SOURCE_SCANNER, command_dependency_overrides, override_environment
from offload_builders.scons.tool_dependencies import check_tools_for, depend_on_device_libraries, depend_on_program
from offload_builders.scons.variables import (
    deploy_devices,
    model_targets_for,
    node_target,
    phase_model,
    set_default,
    target_flags,
    toolchain_for,
    user_error,
    warn_unmatched_keys,
)
from offload_builders.scons.versioned_actions import VersionedFunctionAction, declare, versioned_action
from offload_builders.source_identity import identity_signature
from offload_builders.targets import TargetID

#: The source suffixes of this model (C and C++), each with the language the driver is told.
SOURCE_SUFFIXES: tuple[str, ...] = tuple(LANGUAGE_BY_SUFFIX)


def _model(env) -> PhaseModel:
    return phase_model(env, PhaseModel)


def _object_of(target) -> list:
    """The fat object a compile node belongs to, as a target list: ``$TARGET`` in the user's compile flags
    means it in every phase (``-MF ${TARGET}.d`` names one dependency file, written by the host front end),
    and all phases of a source share one driver probe."""
    obj = getattr(target[0].attributes, "offload_object", None) if target else None
    return target if obj is None else [obj]


def _object_memo(target, key: tuple, make: Callable[[], Any]) -> Any:
    """``make()``, once per fat object and ``key`` while SCons renders commands (after the SConscripts are
    read): the host front end and the embed step share the host steps, a target's device compile, ``ptxas``
    and the package its device steps. All of an object's nodes have its environment, with only our own
    variables overridden (``$OFFLOAD_TARGET``: part of the key), and its target for ``$TARGET``."""
    return node_memo(_object_of(target), ("object",) + key, make)


def _object_flags(env, target, source, for_signature: bool) -> tuple[str, tuple[str, ...]]:
    """The language and the user's compile flags of the object ``target`` belongs to: the same for all its
    phases, so expanded once per object and mode, in the object's environment (our per-node overrides,
    ``$OFFLOAD_TARGET`` and the like, are not the user's flags; per-target flags are ``$OFFLOAD_TARGET_FLAGS``)."""
    obj = _object_of(target)
    language = language_of(str(source[0]))
    build_env = obj[0].get_build_env() if obj and obj[0].has_builder() else env
    return _object_memo(target, ("flags", str(source[0]), bool(for_signature)), lambda: (
        language, compile_flags(build_env, obj, source, for_signature, language)))


def _object_model(env, target) -> PhaseModel:
    return _object_memo(target, ("model",), lambda: _model(env))


def _host_steps(env, target, source, for_signature: bool) -> HostSteps:
    def make() -> HostSteps:
        return _object_model(env, target).host_steps(*_object_flags(env, target, source, for_signature))

    return _object_memo(target, ("host", str(source[0]), bool(for_signature)), make)


def _device_steps(env, target, source, for_signature: bool) -> DeviceSteps:
    def make() -> DeviceSteps:
        language, flags = _object_flags(env, target, source, for_signature)
        tid = node_target(env)
        return _object_model(env, target).device_steps(tid, language, flags + tuple(target_flags(env, tid)))

    selected = env.get("OFFLOAD_TARGET")  # the emitters' TargetID: one memo per node and target
    key = ("device", str(source[0]), bool(for_signature), selected if isinstance(selected, TargetID) else None)
    return make() if key[-1] is None else _object_memo(target, key, make)


@Renderer
def _host_cc1(target, source, env, for_signature):
    steps = _host_steps(env, target, source, for_signature)
    return steps.frontend.bind(source=str(source[0]), main_file_name=source[0].name,
                               output=partial_path(env, target[0]),
                               **dependency_values(steps.frontend, str(_object_of(target)[0])))


def ptx_path(env, cubin) -> str:
    """Where an NVPTX device node's compile writes the PTX that its ``ptxas`` step reads (and its last step
    removes; see :func:`~offload_builders.scons.outputs.side_path`)."""
    return side_path(env, cubin, PTX_SUFFIX)


@Renderer
def _device_cc1(target, source, env, for_signature):
    steps = _device_steps(env, target, source, for_signature)
    output = partial_path(env, target[0]) if steps.assemble is None else ptx_path(env, target[0])
    return steps.compile.bind(source=str(source[0]), main_file_name=source[0].name,
                              host_bc=str(source[1]), output=output)


@Renderer
def _assemble_cmd(target, source, env, for_signature):
    """``ptxas``, the second step of an NVPTX device node: the node's source is the original source."""
    steps = _device_steps(env, target, source, for_signature)
    assert steps.assemble is not None
    return steps.assemble.bind(input=ptx_path(env, target[0]), output=partial_path(env, target[0]))


def _object_inputs(target) -> tuple[Any, tuple[tuple[str, Any], ...]]:
    """What the object's emitter recorded: its host bitcode, and per target ID (as text) its device image."""
    inputs = getattr(target[0].attributes, "offload_inputs", None) if target else None
    if inputs is None:
        raise SCons.Errors.UserError(f"{target[0] if target else 'a node'} was not made by OffloadObject")
    return inputs


def package_path(env, obj) -> str:
    """Where the object's action writes its package for the embed step to read (and then removes; see
    :func:`~offload_builders.scons.outputs.side_path`)."""
    return side_path(env, obj, PACKAGE_SUFFIX)


@Renderer
def _package_cmd(target, source, env, for_signature):
    """The packager's command for the object ``target`` (its source is the original source)."""
    images = []
    for tid_text, node in _object_inputs(target)[1]:
        steps = _device_steps(env.Override({"OFFLOAD_TARGET": tid_text}), target, source, for_signature)
        images.append((steps, str(node)))
    return _model(env).package_command(images, package_path(env, target[0]))


class _InProcessPackage(VersionedFunctionAction):
    """The default ``$OFFLOAD_PACKAGECOM``: the package written in the SCons process, with the packager's
    command (its ``--image=`` specs: which image of which target, and how the driver describes it) in the
    object's signature, as the command would be."""

    def get_presig(self, target, source, env, executor=None) -> bytes:
        if executor:
            target, source = executor.get_all_targets(), executor.get_all_sources()
        words = _package_cmd.words(target, source, env, True)
        return super().get_presig(target, source, env, executor) + " ".join(words).encode()


def _package_in_process(target, source, env) -> int:
    """The package step without a process: our OffloadBinary writer, byte-identical to the packager's
    output for the very ``--image=`` specs the driver would pass it (``$_OFFLOAD_PACKAGE_CMD`` runs the tool)."""
    from offload_builders.formats.offload_binary import kind_table, packager_images, write_offload_binaries

    command = _package_cmd(target, source, env, False)
    table = kind_table(toolchain_for(env).major)
    images = []
    for arg in command:
        if str(arg).startswith("--image="):
            images.extend(packager_images(str(arg)[len("--image="):], table))
    write_offload_binaries(images, package_path(env, target[0]))
    return 0


def _remove_package(target, source, env) -> int:
    """After the embed: the package is in the object now."""
    try:
        os.unlink(package_path(env, target[0]))
    except FileNotFoundError:
        pass
    return 0


@Renderer
def _embed_cc1(target, source, env, for_signature):
    """The object's source is the original source; the emitter recorded its host bitcode, and the package
    step before it wrote the package."""
    host_bc = _object_inputs(target)[0]
    steps = _host_steps(env, target, source, for_signature)
    return steps.embed.bind(host_bc=str(host_bc), main_file_name=source[0].name,
                            package=package_path(env, target[0]), output=partial_path(env, target[0]))


class _SourceIdentityAction(SCons.Action.ActionBase):
    """Puts the identity (device, inode) of the source and of every header it includes into the host front
    end's build signature; runs nothing. OpenMP target regions are named after it, so a file re-created with
    the same bytes must run the host front end, and through its new bitcode every device compile, again
    (see :mod:`offload_builders.source_identity`). SCons computes the signature once the source and its
    headers are built and scanned, just before it decides whether the node runs."""

    def __call__(self, target, source, env, *args, **kwargs) -> int:
        return 0

    def __str__(self) -> str:
        return "source identity"

    def get_presig(self, target, source, env, executor=None) -> bytes:
        if executor:
            target, source = executor.get_all_targets(), executor.get_all_sources()
        paths = [str(SCons.Action.rfile(node)) for node in source]
        for node in target[0].implicit or ():
            if isinstance(node, SCons.Node.FS.File):
                paths.append(str(SCons.Action.rfile(node)))
        return identity_signature(paths).encode()

    def get_implicit_deps(self, target, source, env, executor=None) -> list:
        return []

    def get_varlist(self, target, source, env, executor=None) -> tuple:
        return ()


# The phase builders have no emitter: object_emitter hands their nodes to own_outputs itself.
_HOST_BUILDER = SCons.Builder.Builder(action=node_action([_SourceIdentityAction(), *phase_action("HOST").list]),
                                      source_scanner=SHARED_SOURCE_SCANNER, single_source=True)


_DEVICE_BUILDER = SCons.Builder.Builder(action=phase_action("DEVICE"), source_scanner=SHARED_SOURCE_SCANNER)


#: NVPTX: the device compile to PTX and ``ptxas``, one node (its target the cubin).
_NVPTX_DEVICE_BUILDER = SCons.Builder.Builder(
    action=node_action([REMOVE_STALE, PhaseCommandAction("DEVICE"), PhaseCommandAction("ASSEMBLE"),
                        COMMIT, RemoveSideFile(PTX_SUFFIX, "the PTX")]),
    source_scanner=SHARED_SOURCE_SCANNER)


def object_emitter(target, source, env):
    """Expand one fat object into host front end, per-target device nodes, package and embed."""
    if len(source) != 1:
        raise SCons.Errors.UserError(f"OffloadObject builds one object per source, got {len(source)} sources"
                                     f" for {target[0]}")
    obj, src = target[0], source[0]
    targets = model_targets_for(env, src, OPENMP)  # all of $OFFLOAD_ARCHS: OpenMP compiles for every kind
    check_tools_for(env, targets)
    stem = os.path.splitext(obj.name)[0]
    directory = obj.dir
    try:
        language = language_of(str(src))
        # Probe now, at read time, so a configuration the driver rejects stops the build before any compile.
        flags = compile_flags(env, [obj], [src], False, language)
        warn_unmatched_keys(env, "OFFLOAD_TARGET_FLAGS", targets)
        per_target = {tid: tuple(target_flags(env, tid)) for tid in targets}
        _check_no_target_selection(flags, "$OFFLOAD_FLAGS, $CCFLAGS, $CXXFLAGS/$CFLAGS or $CPPFLAGS", targets)
        for tid, extra in per_target.items():
            _check_no_target_selection(extra, f"$OFFLOAD_TARGET_FLAGS[{str(tid)!r}]", targets)
        model = _model(env)
        host = model.host_steps(language, flags)
        plans = {tid: model.device_steps(tid, language, flags + extra) for tid, extra in per_target.items()}
    except OffloadError as error:
        raise SCons.Errors.UserError(f"{src}: {error}") from None

    overrides = command_dependency_overrides(env)
    # The same overrides for every source (a target's device compiles): one environment, made once.
    host_bc = _HOST_BUILDER(override_environment(env, overrides),
                            [directory.File(node_name(Phase.HOST, OPENMP, stem=stem))], [src])
    depend_on_program(env, host_bc, overrides, host.frontend)
    images, compiled = [], []  # images: per target ID (as text), its device image
    for tid, steps in plans.items():
        if steps.assemble is None:
            builder = _DEVICE_BUILDER
            name = node_name(Phase.DEVICE, OPENMP, stem=stem, target=tid.file_token, suffix=steps.compile_suffix)
        else:
            builder = _NVPTX_DEVICE_BUILDER
            name = node_name(Phase.ASSEMBLE, OPENMP, stem=stem, target=tid.file_token, suffix=steps.image_suffix)
        device = builder(override_environment(env, {"OFFLOAD_TARGET": tid, **overrides}),
                         [directory.File(name)], [src] + host_bc)
        depend_on_program(env, device, overrides, steps.compile)
        if steps.assemble is not None:
            depend_on_program(env, device, overrides, steps.assemble)
        depend_on_device_libraries(env, device, steps.compile)
        compiled.extend(device)
        images.append((str(tid), device[0]))
    own_outputs(env, [*host_bc, *compiled])
    for node in [*host_bc, *compiled]:
        node.attributes.offload_object = obj
    mark_model([obj, *host_bc, *compiled], OPENMP)
    obj.attributes.offload_inputs = (host_bc[0], tuple(images))
    env.Depends(obj, host_bc + [image for _, image in images])
    depend_on_program(env, [obj], overrides, host.embed)  # SCons' scan also finds clang, by contents
    return target, source


def _check_no_target_selection(flags: Sequence[str], where: str, targets: Sequence[TargetID]) -> None:
    """One clear error for a flag that chooses offload targets itself (``--offload-arch=``): the tool makes
    one node per target of ``$OFFLOAD_ARCHS``, and the driver would add that flag's targets to each."""
    chosen = target_selection_flags(flags)
    if chosen:
        raise SCons.Errors.UserError(
            f"{chosen[0]} in {where}: the offload targets belong in $OFFLOAD_ARCHS (now "
            f"{','.join(str(tid) for tid in targets)}), e.g. OFFLOAD_ARCHS=['x86_64', 'sm_90']; remove the flag")


def device_runtime(env):
    """The OpenMP device runtime archive (``libomptarget.devicertl.a``), an input of every extract node of a
    program that links the OpenMP runtime, as ``clang++ -fopenmp`` puts ``-lomptarget.devicertl`` on the
    linker wrapper's line. Only such programs ask (see :func:`offload_builders.scons.program.links_openmp`):
    a Clang without it (Clang 22 beside Debian's ``libomp-19-dev``) still links CUDA and HIP programs."""
    try:
        return env.File(str(linking.device_runtime(toolchain_for(env))))
    except OffloadError as error:
        raise user_error(error) from None


def device_runtime_problem(env) -> str | None:
    """Why the toolchain has no OpenMP device runtime (the error naming the file and its package); None where it
    has one."""
    try:
        linking.device_runtime(toolchain_for(env))
    except OffloadError as error:
        return str(error)
    return None


def has_device_runtime(env) -> bool:
    """Whether the toolchain has the OpenMP device runtime (see :func:`device_runtime`)."""
    return device_runtime_problem(env) is None


def runtime_arguments(target, source, env, for_signature) -> list[str]:
    """The host link's OpenMP runtime: ``-fopenmp`` (libomp) and libomptarget."""
    return linking.host_runtime_arguments(toolchain_for(env))


#: The default ``$OFFLOAD_PACKAGECOM`` (see :class:`_InProcessPackage`).
PACKAGE_IN_PROCESS = _InProcessPackage(
    declare("OpenMP package", 1, _package_in_process, covers=["offload_builders.formats.offload_binary"]),
    {"cmdstr": "$OFFLOAD_PACKAGECOMSTR"})


def check_link_tools_for(env, targets: Sequence[TargetID], *, device_runtime: bool = True) -> None:
    """The device linkers the targets need, and the OpenMP device runtime unless ``device_runtime`` is false (a
    program without OpenMP code), at read time."""
    toolchain = toolchain_for(env)
    try:
        if device_runtime:
            linking.device_runtime(toolchain)
        if any(tid.kind == "amdgpu" for tid in targets):
            toolchain.tool("ld.lld")
        if any(tid.kind == "nvptx" for tid in targets):
            toolchain.tool("clang-nvlink-wrapper")
            nvptx_tools.openmp_tool(toolchain, "nvlink")
    except OffloadError as error:
        raise user_error(error) from None


def check_deploy_devices(env) -> None:
    """``$OFFLOAD_DEPLOY_DEVICES``, each parsed now, so a misspelt device stops the build before it starts."""
    devices = deploy_devices(env)
    if devices:
        from offload_builders.selection import parse_device

        try:
            for device in devices:
                name, *capabilities = device.replace(";", " ").split()
                parse_device(name, capabilities)
        except OffloadError as error:
            raise SCons.Errors.UserError(f"OFFLOAD_DEPLOY_DEVICES: {error}") from None


#: This model's renderers of the command variables the models share (see :class:`~offload_builders.scons.rendering.
#: ModelRenderer`); its own one (``$_OFFLOAD_EMBED_CC1``) :func:`generate` sets.
RENDERERS: dict[str, Renderer] = {
    "_OFFLOAD_HOST_CC1": _host_cc1,
    "_OFFLOAD_DEVICE_CC1": _device_cc1,
    "_OFFLOAD_ASSEMBLE_CMD": _assemble_cmd,  # ptxas, shared with CUDA
    "_OFFLOAD_PACKAGE_CMD": _package_cmd,
}

#: The action of an object this model makes from a source: the package step, then the embed step, which
#: reads the package and commits the object.
OBJECT_ACTION = node_action([
    REMOVE_STALE,
    SCons.Action.Action("$OFFLOAD_PACKAGECOM", "$OFFLOAD_PACKAGECOMSTR"),
    *phase_action("EMBED").list[1:],
    versioned_action(_remove_package, "remove package", 1),
])


def generate(env) -> None:
    """Give ``env`` this model's own renderers (``$_OFFLOAD_EMBED_CC1`` and friends) and its in-process
    default of ``$OFFLOAD_PACKAGECOM`` (called by the tool's ``generate``; the renderers both models share
    dispatch per node, see :class:`offload_builders.scons.rendering.ModelRenderer`)."""
    env["_OFFLOAD_EMBED_CC1"] = _embed_cc1
    for key, value in defaults_of(SET_BY_OPENMP, globals()).items():  # '$_OFFLOAD_PACKAGE_CMD' runs the packager
        set_default(env, key, value)
