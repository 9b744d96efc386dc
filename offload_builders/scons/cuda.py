"""The CUDA model of the ``offload`` SCons tool: ``.cu`` sources, and C/C++ ones where ``$OFFLOAD_MODEL`` is ``'cuda'``.

``OffloadObject`` expands one ``.cu`` source into build nodes that mirror what ``clang++ -x cuda
--cuda-gpu-arch=... -c`` does in one process (see :mod:`offload_builders.models.cuda`), for the NVPTX target
IDs of ``$OFFLOAD_ARCHS``:

* per target ID a device compile to PTX (``<stem>.<target>.dev.s``) and ``ptxas`` (``<stem>.<target>.cubin``),
  one node with both files as its targets (the cubin first);
* the fat binary (``<stem>.fatbin``), written by the toolkit's ``fatbinary`` in CUDA 13's ``--image3``
  syntax (``$OFFLOAD_BUNDLECOM``; for CUDA nodes its default is ``$_OFFLOAD_FATBINARY_CMD``);
* the host compile, which is the object itself and embeds the fat binary (``.nv_fatbin``) through
  ``-fcuda-include-gpubinary``;
* relocatable-device-code mode (``$OFFLOAD_RDC`` or ``-fgpu-rdc``; Clang's new offload driver): the same
  device compiles and ``ptxas -c`` (relocatable cubins), one offload binary of kind ``cuda``
  (``<stem>.offload.pkg``, ``$OFFLOAD_PACKAGECOM``), and the host compile embedding it as
  ``.llvm.offloading``. ``OffloadProgram`` links them (:mod:`offload_builders.scons.program`): per target
  extract and device link (nvlink, through ``clang --target=nvptx64-nvidia-cuda``), one fat binary of the
  linked cubins (:func:`offload_builders.models.cuda.program_fatbinary`) registered by
  ``__cudaRegisterFatBinary`` in the wrap node.

Adding a target ID compiles and assembles only that target (plus the fat binary and the host compile) with
Clang 19. From Clang 20 the driver defines ``__CUDA_ARCH_LIST__`` from all of a compile's targets in the host
and every device compile (CUB and Thrust name their namespace after it), and so do these nodes: each node of
a source holds the source's target list (:data:`TARGETS_ATTRIBUTE`). The host compile signs the list; a device
node signs instead its list check's record (``<stem>.<target>.archlist``, :func:`_run_arch_list_check`: the digest
of its preprocessed text without the list's ``#define``, or the list where that text cannot tell), so adding a
target reruns only the device compiles whose output the list can change (CUB's, not a plain kernel's).
Host and device compiles of a source share one pinned ``-cuid`` (``$OFFLOAD_CUDA_CUID``, default: the
:func:`~offload_builders.models.gpu.default_cuid` of the source's path, as for HIP). Objects register their
own fat binary (``__cudaRegisterFatBinary``) and link as plain host objects with the CUDA runtime
(``libcudart``) or one of the project's; the tool adds no CUDA runtime to a link.

Variables, set only where the user has not:

* ``$OFFLOAD_CUDA_FLAGS`` (``[]``): driver flags of every CUDA compile. With Clang 19 the tool adds
  ``-nocudainc -nocudalib`` (it cannot parse CUDA 13's headers) unless these flags choose, with a newer
  Clang ``-isystem <CUDA_PATH>/include/cccl`` (CUB, Thrust, libcu++) unless they say ``-nocudainc``; the CUDA
  installation is the toolchain's (``$CUDA_PATH``, default ``/usr/local/cuda``), given to the driver as
  ``--cuda-path``.
* ``$OFFLOAD_CUDA_CUID``: the CUID, substituted per source (default ``$_OFFLOAD_CUDA_DEFAULT_CUID``).
"""
from __future__ import annotations

import os

import SCons.Action
import SCons.Builder
import SCons.Errors

from offload_builders.driver import CommandTemplate
from offload_builders.errors import OffloadError
from offload_builders.models.cuda import (
    ARCH_LIST_CHECKED,
    ARCH_LIST_RECORD_VERSION,
    ARCH_LIST_SLOT,
    CUDA_SUFFIXES,
    CudaDeviceSteps,
    CudaHostSteps,
    CudaPhaseModel,
    check_arch_list,
    default_flags,
    fatbin_order,
    fatbinary_command,
    preprocess_command,
    records_arch_list,
)
from offload_builders.phase_table import CUDA, Phase, node_name
from offload_builders.scons import gpu, hip
from offload_builders.scons.actions import PhaseCommandAction, node_action, phase_action
from offload_builders.scons.construction_variables import SET_BY_CUDA, defaults_of
from offload_builders.scons.outputs import COMMIT, REMOVE_STALE, own_outputs, partial_path
from offload_builders.scons.rendering import Renderer, node_flags, node_memo
from offload_builders.scons.scanning import SHARED_SOURCE_SCANNER, override_environment
from offload_builders.scons.tool_dependencies import depend_on_stamps
from offload_builders.scons.variables import (
    model_targets_for,
    node_target,
    node_targets,
    phase_model,
    target_flags,
    toolchain_exists,
    toolchain_for,
    top_directory,
    user_error,
)
from offload_builders.targets import TargetID

#: The fat binary's command of CUDA nodes while ``$OFFLOAD_BUNDLECOM`` is HIP's in-process bundle writer.
FATBINARY_COM = "$_OFFLOAD_FATBINARY_CMD"

#: The node attribute holding a source's target IDs (in fat-binary order) on its object and device nodes, set
#: by the emitter: the renderers give the driver's ``__CUDA_ARCH_LIST__`` for them (Clang 20+).
TARGETS_ATTRIBUTE = "offload_cuda_targets"


#: The node attribute of a device node whose list check (:data:`ARCH_LIST_CHECK_SUFFIX`) signs what the target list
#: changes of its compile: its signature holds :data:`~offload_builders.models.cuda.ARCH_LIST_CHECKED` in place of
#: the list, and it depends on the check's record.
CHECKED_ATTRIBUTE = "offload_cuda_arch_list_checked"

#: The list check's record beside the cubin: ``<stem>.<target>.archlist``.
ARCH_LIST_CHECK_SUFFIX = ".archlist"

#: The variable whose value is a CUDA source's CUID.
CUID_VARIABLE = "OFFLOAD_CUDA_CUID"


def _model(env) -> CudaPhaseModel:
    return phase_model(env, CudaPhaseModel)


def _rendered_flags(env, target, source, for_signature: bool) -> tuple[str, ...]:
    return node_flags(target, source, for_signature, lambda: _flags(env, target, source, for_signature))


def _flags(env, target, source, for_signature: bool) -> tuple[str, ...]:
    """The flags of a CUDA compile of ``source``: the C++ ones, ``$OFFLOAD_CUDA_FLAGS``, RDC, the tool's defaults."""
    flags = gpu.user_flags(env, target, source, for_signature, "OFFLOAD_CUDA_FLAGS")
    return flags + default_flags(toolchain_for(env), flags)


def _device_steps(env, target, source, for_signature: bool, tid: TargetID | None = None) -> CudaDeviceSteps:
    """``tid``'s (default: the node's ``$OFFLOAD_TARGET``) device steps, once per node, source, mode and target:
    a device node's compile and ``ptxas`` ask, and a fat binary's command for each of its targets."""
    tid = tid if tid is not None else node_target(env)
    return node_memo(target, ("cuda device steps", str(source[0]), bool(for_signature), str(tid)),
                     lambda: _device_steps_for(env, tid, _rendered_flags(env, target, source, for_signature)))


def _device_steps_for(env, tid: TargetID, flags: tuple[str, ...]) -> CudaDeviceSteps:
    """``tid``'s device steps for the compile ``flags``, with the target's own."""
    return _model(env).device_steps(tid, flags + tuple(target_flags(env, tid)))


def _host_steps(env, target, source, for_signature: bool) -> CudaHostSteps:
    return node_memo(target, ("cuda host steps", str(source[0]), bool(for_signature)),
                     lambda: _model(env).host_steps(_rendered_flags(env, target, source, for_signature)))


@Renderer
def _device_cc1(target, source, env, for_signature):
    """The first step of a device node (targets: the cubin, the PTX): the compile to the PTX."""
    steps = _device_steps(env, target, source, for_signature)
    arch_list = _arch_list_values(steps.compile, env, target, source, for_signature)
    if for_signature and arch_list and getattr(target[0].attributes, CHECKED_ATTRIBUTE, False):
        arch_list = {ARCH_LIST_SLOT: ARCH_LIST_CHECKED}  # the list check's record signs what the list changes
    return steps.compile.bind(source=str(source[0]), main_file_name=source[0].name,
                              output=partial_path(env, target[1]),
                              **gpu.cuid_value(steps.compile, env, target, source, CUID_VARIABLE), **arch_list)


@Renderer
def _assemble_cmd(target, source, env, for_signature):
    """The second step of a device node: ``ptxas`` of the PTX just written (both are committed after it)."""
    steps = _device_steps(env, target, source, for_signature)
    return steps.assemble.bind(input=partial_path(env, target[1]), output=partial_path(env, target[0]))


@Renderer
def _fatbinary_cmd(target, source, env, for_signature):
    """The sources are each target's (PTX, cubin) pair, in fat-binary order."""
    original = gpu.original_source(env, source)
    tids = node_targets(env, "_OFFLOAD_BUNDLE_TARGETS")
    pairs = list(zip(source[0::2], source[1::2]))
    images = [(_device_steps(env, target, original, for_signature, tid), str(ptx), str(cubin))
              for tid, (ptx, cubin) in zip(tids, pairs)]
    return fatbinary_command(_host_steps(env, target, original, for_signature), images,
                             partial_path(env, target[0]))


@Renderer
def _package_cmd(target, source, env, for_signature):
    """RDC: the sources are each target's relocatable cubin, in target order."""
    return gpu.package_argv(env, target, source, for_signature, _device_steps)


@Renderer
def _host_cc1(target, source, env, for_signature):
    """The object's source is the ``.cu`` file; the emitter recorded its fat binary or package."""
    device_side = gpu.object_device_side(target)
    steps = _host_steps(env, target, source, for_signature)
    slot = "fatbin" if steps.fatbinary is not None else "package"
    return steps.compile.bind(source=str(source[0]), main_file_name=source[0].name,
                              output=partial_path(env, target[0]), **{slot: str(device_side[0])},
                              **gpu.cuid_value(steps.compile, env, target, source, CUID_VARIABLE),
                              **_arch_list_values(steps.compile, env, target, source, for_signature))


def _arch_list_values(template: CommandTemplate, env, target, source, for_signature: bool) -> dict[str, str]:
    """The arch-list slot's value (Clang 20+): the driver's for all the source's targets, which the emitter
    recorded on the node, with the compile flags the node renders with (not its target's own: one driver
    command has one set). ``{}`` where the template has no slot (Clang 19)."""
    if ARCH_LIST_SLOT not in template.slots:
        return {}
    targets = getattr(target[0].attributes, TARGETS_ATTRIBUTE, None)
    if targets is None:
        raise SCons.Errors.UserError(f"{target[0]} was not made by OffloadObject")
    return _model(env).arch_list_values(template, targets, _rendered_flags(env, target, source, for_signature))


def _check_command(env, target, source, for_signature: bool) -> tuple[list[str], str, str | None]:
    """A list check's command (its device compile's preprocessing, :func:`preprocess_command`, with the driver's
    list), the list, and why the compile depends on the list whatever its text (None: the text decides)."""
    steps = _device_steps(env, target, source, for_signature)
    arch_list = _arch_list_values(steps.compile, env, target, source, for_signature)
    bound = steps.compile.bind(source=str(source[0]), main_file_name=source[0].name, output="-",
                               **gpu.cuid_value(steps.compile, env, target, source, CUID_VARIABLE), **arch_list)
    words = bound.signature(top_directory(env)) if for_signature else bound.words()
    flags = _rendered_flags(env, target, source, for_signature)
    why = records_arch_list(flags, words)
    try:
        words = preprocess_command(words)
    except ValueError as error:
        why = why or str(error)
    return words, arch_list[ARCH_LIST_SLOT], why


def _run_arch_list_check(target, source, env) -> int:
    """Write the list check's record (:func:`~offload_builders.models.cuda.check_arch_list`) to the partial file."""
    steps = _device_steps(env, target, source, False)
    arch_list = _arch_list_values(steps.compile, env, target, source, False)[ARCH_LIST_SLOT]
    words = steps.compile.render(source=str(source[0]), main_file_name=source[0].name, output="-",
                                 **gpu.cuid_value(steps.compile, env, target, source, CUID_VARIABLE),
                                 **{ARCH_LIST_SLOT: arch_list})
    record = check_arch_list(words, _rendered_flags(env, target, source, False), arch_list, env["ENV"])
    with open(partial_path(env, target[0]), "w", encoding="utf-8") as f:
        f.write(record)
    return 0


class _ArchListCheckAction(SCons.Action.FunctionAction):
    """The list check's step. Its signature is its preprocessing command with the list (so a new list checks
    again), the record's version and why the compile depends on the list whatever its text; not the
    function's bytecode. Its message is ``$OFFLOAD_ARCHLISTCOMSTR``, else the preprocessing command."""

    def __init__(self) -> None:
        super().__init__(_run_arch_list_check, {})

    def _command(self, target, source, env, executor, for_signature: bool):
        if executor:
            target, source = executor.get_all_targets(), executor.get_all_sources()
        try:
            return _check_command(env, target, source, for_signature)
        except OffloadError as error:
            raise user_error(error) from None

    def get_presig(self, target, source, env, executor=None) -> bytes:
        words, _, why = self._command(target, source, env, executor, True)
        return "\0".join([ARCH_LIST_RECORD_VERSION, why or "", *words]).encode()

    def get_implicit_deps(self, target, source, env, executor=None) -> list:
        return []

    def get_varlist(self, target, source, env, executor=None) -> tuple:
        return ()

    def strfunction(self, target, source, env, executor=None):
        shown = env.subst("$OFFLOAD_ARCHLISTCOMSTR", 0, target, source) if "OFFLOAD_ARCHLISTCOMSTR" in env else ""
        return shown or " ".join(self._command(target, source, env, executor, False)[0])

    def __str__(self) -> str:
        return "offload __CUDA_ARCH_LIST__ check"


#: A list check: per source and target (Clang 20+), what the target list changes of the device compile: the
#: digest of its preprocessed text without the list's own ``#define`` (or the list, where the text cannot tell).
#: The device node depends on it, so adding a target reruns only the device compiles whose text it changes.
_CHECK_BUILDER = SCons.Builder.Builder(
    action=SCons.Action.ListAction([REMOVE_STALE, _ArchListCheckAction(), COMMIT]),
    source_scanner=SHARED_SOURCE_SCANNER, single_source=True)


# No emitter: object_emitter hands their nodes to own_outputs itself.
#: The device compile to PTX and ``ptxas``, one node whose targets are the cubin and the PTX (the fat binary
#: holds both).
_DEVICE_BUILDER = SCons.Builder.Builder(
    action=node_action([REMOVE_STALE, PhaseCommandAction("DEVICE"), PhaseCommandAction("ASSEMBLE"), COMMIT]),
    source_scanner=SHARED_SOURCE_SCANNER, single_source=True)
_FATBIN_BUILDER = SCons.Builder.Builder(action=phase_action("BUNDLE"))


def _object_emitter(target, source, env):
    """Expand one object into per-target device compiles and ptxas, the fat binary and the host compile."""
    obj, src = gpu.one_source(target, source)
    targets = fatbin_order(model_targets_for(env, src, CUDA))  # the NVPTX targets of $OFFLOAD_ARCHS
    stem = os.path.splitext(obj.name)[0]
    directory = obj.dir
    try:
        toolchain_for(env).cuda_tool("ptxas")
        toolchain_for(env).cuda_tool("fatbinary")
        flags = _flags(env, [obj], [src], False)  # substituted once: the same for every target here
        host = _model(env).host_steps(flags)  # probe now: a rejected configuration stops before any compile
        plans = {tid: _device_steps_for(env, tid, flags) for tid in targets}
        _model(env).arch_list_values(host.compile, targets, flags)  # Clang 20+: the probe with every target
        gpu.source_cuid(env, [src], CUID_VARIABLE)  # checked now, before any compile
    except OffloadError as error:
        raise user_error(OffloadError(f"{src}: {error}")) from None

    images, cubins, made, checks = [], [], [], []
    for tid, steps in plans.items():
        cubin = directory.File(node_name(Phase.ASSEMBLE, CUDA, stem=stem, target=tid.file_token))
        ptx = directory.File(node_name(Phase.DEVICE, CUDA, stem=stem, target=tid.file_token,
                                       suffix=steps.compile_suffix))
        target_env = override_environment(env, {"OFFLOAD_TARGET": tid})
        nodes = _DEVICE_BUILDER(target_env, [cubin, ptx], [src])  # one per target
        if ARCH_LIST_SLOT in steps.compile.slots:  # Clang 20+: sign what the list changes, not the list
            check = directory.File(f"{os.path.splitext(cubin.name)[0]}{ARCH_LIST_CHECK_SUFFIX}")
            checks += _CHECK_BUILDER(target_env, [check], [src])
            depend_on_stamps(checks[-1:], [str(steps.compile.argv[0])])
            for node in nodes:
                node.add_dependency(checks[-1:])
                setattr(node.attributes, CHECKED_ATTRIBUTE, True)
        made += nodes
        images += [ptx, cubin]
        cubins.append(cubin)
    rdc = host.fatbinary is None
    # HIP's in-process bundle writer is the default $OFFLOAD_BUNDLECOM: CUDA runs the toolkit's fatbinary.
    fatbinary = {"OFFLOAD_BUNDLECOM": FATBINARY_COM} if env.get("OFFLOAD_BUNDLECOM") is hip.BUNDLE_IN_PROCESS else {}
    device_side = gpu.device_side_node(env, CUDA, obj, src, cubins if rdc else images, tuple(plans), rdc=rdc,
                                       bundle_builder=_FATBIN_BUILDER, bundle_overrides=fatbinary)
    gpu.record_object(env, CUDA, obj, made, device_side)
    # Every compile of the source gets the driver's __CUDA_ARCH_LIST__ for all its targets (Clang 20+).
    for node in (obj, *made, *checks):
        setattr(node.attributes, TARGETS_ATTRIBUTE, tuple(plans))
    if checks:
        own_outputs(env, checks)
    return target, source


#: This model's renderers of the command variables the models share.
RENDERERS: dict[str, Renderer] = {
    "_OFFLOAD_HOST_CC1": _host_cc1,
    "_OFFLOAD_DEVICE_CC1": _device_cc1,
    "_OFFLOAD_ASSEMBLE_CMD": _assemble_cmd,
    "_OFFLOAD_PACKAGE_CMD": _package_cmd,
}

#: The action of an object this model makes from a source: the host compile.
OBJECT_ACTION = phase_action("HOST")

#: The object emitter, for the ``offload`` tool's per-suffix registration.
object_emitter = _object_emitter


def generate_objects(env) -> None:
    """What every environment needs to compile CUDA sources, whatever its ``$OFFLOAD_MODEL``."""
    # The variables, and header dependencies of .cu sources, as for C++.
    gpu.generate_sources(env, defaults_of(SET_BY_CUDA), CUDA_SUFFIXES)
    env["_OFFLOAD_CUDA_DEFAULT_CUID"] = gpu.default_cuid_var
    env["_OFFLOAD_FATBINARY_CMD"] = _fatbinary_cmd


def exists(env) -> bool:
    return toolchain_exists(env)


__all__ = ["ARCH_LIST_CHECK_SUFFIX", "CHECKED_ATTRIBUTE",
           "FATBINARY_COM", "OBJECT_ACTION", "RENDERERS", "TARGETS_ATTRIBUTE", "exists", "generate_objects",
           "object_emitter"]
