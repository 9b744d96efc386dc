"""The HIP model of the ``offload`` SCons tool: ``.hip`` sources, and C/C++ ones where ``$OFFLOAD_MODEL`` is ``'hip'``.

``OffloadObject`` expands one ``.hip`` source into build nodes that mirror what
``clang++ -x hip --offload-arch=... -c`` does in one process (see :mod:`offload_builders.models.hip`):

* default mode, per target ID in ``$OFFLOAD_ARCHS``: one node, the code object (``<stem>.<target>.hsaco``),
  whose action is the device compile (to ``<stem>.<target>.hsaco.partial.device.o``, read by the next step
  alone) and the device link; then the fat binary (``<stem>.hipfb``),
  written in-process by our bundle writer; then the host compile, which is the object itself and
  embeds the fat binary through ``-fcuda-include-gpubinary``;
* relocatable-device-code mode (``$OFFLOAD_RDC`` or ``-fgpu-rdc`` in the flags; Clang's new
  offload driver): per target a device compile to bitcode (``<stem>.<target>.dev.bc``), one offload
  binary of kind ``hip`` (``<stem>.offload.pkg``), and the host compile embedding it as
  ``.llvm.offloading``.

``OffloadProgram`` links non-RDC objects as the plain host objects they are. RDC objects are linked as
``clang-linker-wrapper`` 19 links them, one node per step and target, and without running it:

* per target ID an extract node (``<prog>.<target>.devin``: the ``hip``-kind device files of the objects
  and static libraries, chosen by Clang 19's rules, see :mod:`offload_builders.linking`) and a device
  link to a code object (``<prog>.<target>.hsaco``: ``clang --target=amdgcn-amd-amdhsa -mcpu=<target ID>
  -flto $OFFLOAD_DEVICE_LINKFLAGS``, ld.lld doing the LTO);
* one wrap node (``<prog>.offload.wrapper.o``): the code objects in the wrapper's bundle
  (``hip-amdgcn-amd-amdhsa--<target ID>`` entries, 4096-aligned, optionally ``CCOB``-compressed) inside
  ``wrapHIPBinary``'s registration code, generated in-process (:mod:`offload_builders.linking.registration`);
* the program itself: the host link, with the wrapper object first.

Adding a target ID links only that target's code object again (plus the wrap and the host link).

Host and device compiles of a source share one pinned ``-cuid`` (``$OFFLOAD_HIP_CUID``); without it the
driver hashes its whole command line, ``-o`` included, and no per-target node could ever be reused.
The default is :func:`default_cuid` of the source's path, so it is deterministic and needs no setting.

Phases and their ``$OFFLOAD_<PHASE>COM`` / ``COMSTR`` pairs: ``DEVICE``, ``DEVICELINK`` (an object's,
or an RDC program's per target), ``BUNDLE`` (default: :data:`BUNDLE_IN_PROCESS`, :func:`offload_bundle` in-process),
``PACKAGE`` (RDC) and ``HOST``; for RDC programs also ``EXTRACT``, ``WRAP`` and ``LINK``
(the program's nodes, shared with OpenMP: :mod:`offload_builders.scons.program`).

Headers, device libraries and runtime are found as the driver finds them
(:func:`offload_builders.models.hip.default_flags`), per compile: with ROCm (Debian's ``libamdhip64-dev``
and ``rocm-device-libs``) a source builds with ROCm's ``<hip/hip_runtime.h>`` and links ROCm's device
libraries (``--rocm-device-lib-path``, which Debian's directory needs), and a program links the HIP
runtime; ``-nogpuinc`` is added only where no HIP installation is found, ``-nogpulib`` only where the
device libraries for a target are missing, and neither where the user's flags choose (``-nogpuinc``,
``-nogpulib``, ``--rocm-path``, ``--rocm-device-lib-path``, ``--hip-path``, or ``$HIP_PATH``,
``$ROCM_PATH``, ``$HIP_DEVICE_LIB_PATH``). Variables, set only where the user has not:

* ``$OFFLOAD_HIP_FLAGS`` (``[]``): driver flags of every HIP compile. A machine without ROCm, or a
  project with a HIP runtime of its own, sets ``['-nogpulib', '-nogpuinc']`` (sample_project/hip).
* ``$OFFLOAD_HIP_RUNTIME`` (None): the libraries a program links for the HIP runtime. None links
  ``libamdhip64`` of the HIP installation as ``clang++ --hip-link`` does (``-L<its directory>
  -lamdhip64``), or nothing, with a warning, where there is none; a list links ``-l`` each (their
  directories from ``$LIBPATH``), ``[]`` none.
* ``$OFFLOAD_HIP_CUID``: the CUID, substituted per source (default ``$_OFFLOAD_HIP_DEFAULT_CUID``).
* ``$OFFLOAD_RDC`` (None: off): relocatable device code; ``$OFFLOAD_HIP_RDC`` is its old name, and the two set
  and disagreeing is an error (:func:`offload_builders.models.rdc_setting`).
* ``$OFFLOAD_HIP_COMPRESS`` (None, 2 or 3): write the fat binary compressed in that ``CCOB`` format
  version; None keeps what the flags say (``--offload-compress`` gives version 2, as Clang 19 does). For
  an RDC program's fat binary the flags are the compile flags plus ``$OFFLOAD_LINKFLAGS $LINKFLAGS``.
* ``$OFFLOAD_HIP_COMPRESSION_LEVEL`` (None): zstd level; None keeps the flags' ``--offload-compression-level``
  or the bundler's default.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

import SCons.Action
import SCons.Builder
import SCons.Errors
import SCons.Util
import SCons.Warnings

from offload_builders.errors import OffloadError
from offload_builders.leftovers import DEVICE_OBJECT_SUFFIX
from offload_builders.models.hip import (
    HIP_RUNTIME_LIBRARY,
    HIP_SUFFIXES,
    HOST_PROBE_TARGET,
    LINK_BUNDLE_KIND,
    FatbinSpec,
    HipDeviceSteps,
    HipHostSteps,
    HipPhaseModel,
    check_targets,
    default_cuid,
    default_flags,
    fatbin_compression,
    hip_runtime_library,
    is_rdc,
    link_compression_flags,
    link_fatbin_spec,
    write_fatbin,
)
from offload_builders.phase_table import HIP, Phase, node_name
from offload_builders.scons import gpu
from offload_builders.scons.actions import (
    CachingLazyAction,
    PhaseCommandAction,
    RemoveSideFile,
    node_action,
    phase_action,
)
from offload_builders.scons.construction_variables import SET_BY_HIP, defaults_of
from offload_builders.scons.gpu import source_cuid
from offload_builders.scons.link_nodes import OffloadLinkWarning
from offload_builders.scons.outputs import COMMIT, REMOVE_STALE, partial_path, side_path
from offload_builders.scons.rendering import Renderer, node_flags, node_memo
from offload_builders.scons.scanning import SHARED_SOURCE_SCANNER, override_environment
from offload_builders.scons.tool_dependencies import check_tools_for, depend_on_device_libraries
from offload_builders.scons.variables import (
    model_targets_for,
    node_target,
    node_targets,
    phase_model,
    target_flags,
    toolchain_exists,
    toolchain_for,
    user_error,
)
from offload_builders.scons.versioned_actions import versioned_action
from offload_builders.targets import TargetID

if TYPE_CHECKING:
    from offload_builders.formats.compressed import CompressionOptions

#: The variable whose value is a HIP source's CUID.
CUID_VARIABLE = "OFFLOAD_HIP_CUID"


def _hip_model(env) -> HipPhaseModel:
    return phase_model(env, HipPhaseModel)


def _rendered_flags(env, target, source, for_signature: bool) -> tuple[str, ...]:
    return node_flags(target, source, for_signature, lambda: _hip_flags(env, target, source, for_signature))


def _hip_flags(env, target, source, for_signature: bool) -> tuple[str, ...]:
    """The user's flags for a HIP compile of ``source``: the C++ ones, ``$OFFLOAD_HIP_FLAGS`` and RDC."""
    return gpu.user_flags(env, target, source, for_signature, "OFFLOAD_HIP_FLAGS")


def _with_defaults(env, tid: TargetID, flags: tuple[str, ...]) -> tuple[str, ...]:
    """``flags`` and what the tool adds to them for ``tid`` (ROCm's device libraries, ``-nogpuinc``
    without a HIP installation; nothing the user's flags already choose)."""
    return flags + default_flags(toolchain_for(env), tid, flags)


def _device_steps(env, target, source, for_signature: bool, tid: TargetID | None = None) -> HipDeviceSteps:
    """``tid``'s (default: the node's ``$OFFLOAD_TARGET``) device steps, once per node, source, mode and target:
    a device node's compile and link ask, and a fat binary's command for each of its targets."""
    tid = tid if tid is not None else node_target(env)
    return node_memo(target, ("hip device steps", str(source[0]), bool(for_signature), str(tid)),
                     lambda: _device_steps_for(env, tid, _rendered_flags(env, target, source, for_signature)))


def _device_steps_for(env, tid: TargetID, flags: tuple[str, ...]) -> HipDeviceSteps:
    """``tid``'s device steps for the user's ``flags``, with the target's own and the tool's defaults."""
    return _hip_model(env).device_steps(tid, _with_defaults(env, tid, flags + tuple(target_flags(env, tid))))


def _host_steps(env, target, source, for_signature: bool) -> HipHostSteps:
    """The host compile, probed with :data:`HOST_PROBE_TARGET` and that target's defaults (the host job does
    not depend on the target, and the driver only checks the device libraries it is given)."""
    return node_memo(target, ("hip host steps", str(source[0]), bool(for_signature)),
                     lambda: _host_steps_for(env, _rendered_flags(env, target, source, for_signature)))


def _host_steps_for(env, flags: tuple[str, ...]) -> HipHostSteps:
    return _hip_model(env).host_steps(_with_defaults(env, HOST_PROBE_TARGET, flags))


def device_object_path(env, code_object) -> str:
    """Where a HIP device node's compile writes the device object that its link step reads (and its last step
    removes; see :func:`~offload_builders.scons.outputs.side_path`)."""
    return side_path(env, code_object, DEVICE_OBJECT_SUFFIX)


@Renderer
def _device_cc1(target, source, env, for_signature):
    """A device compile: RDC's node is its output; otherwise the node is the code object, and the compile
    writes the device object its link step reads."""
    steps = _device_steps(env, target, source, for_signature)
    output = partial_path(env, target[0]) if steps.link is None else device_object_path(env, target[0])
    return steps.compile.bind(source=str(source[0]), main_file_name=source[0].name, output=output,
                              **gpu.cuid_value(steps.compile, env, target, source, CUID_VARIABLE))


@Renderer
def _object_devicelink_cmd(target, source, env, for_signature):
    """The link to the code object, the second step of a device node (whose source is the ``.hip`` file)."""
    steps = _device_steps(env, target, source, for_signature)
    if steps.link is None:
        raise SCons.Errors.UserError(f"{target[0]}: RDC device code is linked by the linker wrapper, not per object")
    return steps.link.bind(input=device_object_path(env, target[0]), output=partial_path(env, target[0]))


@Renderer
def _package_cmd(target, source, env, for_signature):
    """RDC: the sources are each target's device bitcode, in target order."""
    return gpu.package_argv(env, target, source, for_signature, _device_steps)


@Renderer
def _host_cc1(target, source, env, for_signature):
    """The object's source is the ``.hip`` file; the emitter recorded its fat binary or package."""
    device_side = gpu.object_device_side(target)
    steps = _host_steps(env, target, source, for_signature)
    slot = "package" if steps.rdc else "fatbin"
    return steps.compile.bind(source=str(source[0]), main_file_name=source[0].name,
                              output=partial_path(env, target[0]), **{slot: str(device_side[0])},
                              **gpu.cuid_value(steps.compile, env, target, source, CUID_VARIABLE))


def _compression(env, spec: FatbinSpec) -> CompressionOptions | None:
    """``$OFFLOAD_HIP_COMPRESS``/``_LEVEL`` over what the flags asked the driver for (zstd, in the toolchain's
    default format: 2 for Clang 19, 3 for Clang 22)."""
    try:
        return fatbin_compression(spec, env.get("OFFLOAD_HIP_COMPRESS"), env.get("OFFLOAD_HIP_COMPRESSION_LEVEL"),
                                  llvm_version=toolchain_for(env).major, environ=env["ENV"])
    except (TypeError, ValueError) as error:
        raise SCons.Errors.UserError(f"OFFLOAD_HIP_COMPRESS={env.get('OFFLOAD_HIP_COMPRESS')!r},"
                                     f" OFFLOAD_HIP_COMPRESSION_LEVEL={env.get('OFFLOAD_HIP_COMPRESSION_LEVEL')!r}:"
                                     f" {error}; the version is None, 2 or 3 and the level an integer") from None


def _bundle_plan(target, source, env, for_signature: bool) -> tuple[FatbinSpec, list[str], CompressionOptions | None]:
    """What the fat binary of ``target`` holds: the bundler parameters, the entry IDs, the compression."""
    original = gpu.original_source(env, source)
    spec = _host_steps(env, target, original, for_signature).fatbin
    assert spec is not None
    ids = [spec.host_id] + [
        _device_steps(env, target, original, for_signature, tid).bundle_id or ""
        for tid in node_targets(env, "_OFFLOAD_BUNDLE_TARGETS")]
    return spec, ids, _compression(env, spec)


def _bundle_signature(target, source, env, for_signature) -> str:
    """``$_OFFLOAD_BUNDLE_SIG``: the bundle parameters, so a change in any of them rebuilds the fat binary."""
    try:
        spec, ids, compression = _bundle_plan(target, source, env, True)
    except OffloadError as error:
        raise user_error(error) from None
    packing = "none" if compression is None else (
        f"{compression.method.name}/v{compression.version}/level={compression.effective_level}")
    return f"type={spec.file_type} align={spec.alignment} ids={','.join(ids)} compress={packing}"


def offload_bundle(target, source, env) -> int:
    """``$OFFLOAD_BUNDLECOM``: write the HIP fat binary in-process, as Clang's bundler job would.

    Host entry from ``/dev/null``, one ``hipv4-...--<target-id>`` entry per code object, each aligned to
    4096 bytes, optionally ``CCOB``-compressed; written to ``<target>.partial`` (committed afterwards).
    """
    try:
        spec, ids, compression = _bundle_plan(target, source, env, False)
        write_fatbin(spec, ids, [str(node) for node in source], partial_path(env, target[0]), compression)
    except OffloadError as error:
        raise SCons.Errors.BuildError(node=target[0], errstr=str(error)) from None
    return 0


#: The default ``$OFFLOAD_BUNDLECOM``: :func:`offload_bundle`, signed by its version and the bundle's parameters.
BUNDLE_IN_PROCESS = versioned_action(
    offload_bundle, "HIP fat binary", 1, "$OFFLOAD_BUNDLECOMSTR", ("_OFFLOAD_BUNDLE_SIG",),
    covers=["offload_builders.scons.hip:_bundle_plan", "offload_builders.models.hip:write_fatbin",
            "offload_builders.models.hip:fatbin_compression", "offload_builders.formats.bundle",
            "offload_builders.formats.clang_zstd", "offload_builders.formats.compressed"])


def _bundle_action() -> SCons.Action.ListAction:
    """Like ``phase_action('BUNDLE')``, with the bundle's parameters in the signature (``_OFFLOAD_BUNDLE_SIG``)
    where the command is a function of the user's (the default, :data:`BUNDLE_IN_PROCESS`, carries them)."""
    return node_action([
        REMOVE_STALE,
        CachingLazyAction("OFFLOAD_BUNDLECOM",
                          {"cmdstr": "$OFFLOAD_BUNDLECOMSTR", "varlist": ("_OFFLOAD_BUNDLE_SIG",)}),
        COMMIT,
    ])


# No emitter: object_emitter hands their nodes to own_outputs itself.
_DEVICE_BUILDER = SCons.Builder.Builder(action=phase_action("DEVICE"), source_scanner=SHARED_SOURCE_SCANNER,
                                        single_source=True)
#: Not RDC: the device compile and its link to the code object, one node (its target the code object).
_DEVICE_AND_LINK_BUILDER = SCons.Builder.Builder(
    action=node_action([REMOVE_STALE, PhaseCommandAction("DEVICE"), PhaseCommandAction("DEVICELINK"),
                        COMMIT, RemoveSideFile(DEVICE_OBJECT_SUFFIX, "the device object")]),
    source_scanner=SHARED_SOURCE_SCANNER, single_source=True)
_BUNDLE_BUILDER = SCons.Builder.Builder(action=_bundle_action())


def _device_linker(steps: HipDeviceSteps) -> str | None:
    """The ``lld`` a device link runs: the job's own program (the old driver's ``lld``), or, where the job is a
    ``clang -flto`` link (the new driver's, Clang 22), the ``ld.lld`` beside that clang, which it runs."""
    if steps.link is None:
        return None
    program = str(steps.link.argv[0])
    if os.path.basename(program).startswith("clang"):
        return os.path.join(os.path.dirname(os.path.realpath(program)), "ld.lld")
    return program


def _check_link_tool(steps: HipDeviceSteps) -> None:
    """The device link runs the driver's ``lld``; a missing one should fail at read time, not mid-build."""
    linker = _device_linker(steps)
    if linker is not None and not (os.path.isfile(linker) and os.access(linker, os.X_OK)):
        version = os.path.basename(os.path.dirname(os.path.dirname(os.path.realpath(linker))))
        package = "lld-" + version.rpartition("-")[2] if version.startswith("llvm-") else "lld"
        raise SCons.Errors.UserError(f"{linker} (the AMDGPU device linker) not found;"
                                     f" install it with: apt-get install {package}")


def _object_emitter(target, source, env):
    """Expand one fat object into per-target device compiles (and links), the fat binary or package."""
    obj, src = gpu.one_source(target, source)
    # The AMDGPU targets of $OFFLOAD_ARCHS; the conflict rule is enforced here, before anything compiles.
    targets = model_targets_for(env, src, HIP)
    check_tools_for(env, targets)
    stem = os.path.splitext(obj.name)[0]
    directory = obj.dir
    try:
        # Probe now, at read time, so a configuration the driver rejects stops the build before any compile.
        flags = _hip_flags(env, [obj], [src], False)  # substituted once: the same for every target here
        host = _host_steps_for(env, flags)
        plans = {tid: _device_steps_for(env, tid, flags) for tid in targets}
        if not host.rdc:
            gpu.source_cuid(env, [src], CUID_VARIABLE)  # checked now, before any compile
    except OffloadError as error:
        raise SCons.Errors.UserError(f"{src}: {error}") from None
    if any((steps.link is None) != host.rdc for steps in plans.values()):
        raise SCons.Errors.UserError(f"{src}: -fgpu-rdc must hold for every target ($OFFLOAD_RDC), not per target")
    for steps in plans.values():
        _check_link_tool(steps)

    images, made = [], []
    for tid, steps in plans.items():
        if steps.link is None:  # RDC: the device compile's output goes into the package
            builder = _DEVICE_BUILDER
            name = node_name(Phase.DEVICE, HIP, stem=stem, target=tid.file_token, suffix=steps.compile_suffix)
        else:  # the code object, of the device object the node's compile writes for its link
            builder = _DEVICE_AND_LINK_BUILDER
            name = node_name(Phase.DEVICELINK, HIP, stem=stem, target=tid.file_token)
        device = builder(override_environment(env, {"OFFLOAD_TARGET": tid}),  # one per target
                         [directory.File(name)], [src])
        depend_on_device_libraries(env, device, steps.compile)  # a new ROCm release compiles them again
        linker = _device_linker(steps)
        if steps.link is not None and linker is not None and linker != str(steps.link.argv[0]):
            env.Depends(device, env.File(linker))  # the lld a clang -flto link runs: SCons sees clang
        made.extend(device)
        images.extend(device)
    device_side = gpu.device_side_node(env, HIP, obj, src, images, tuple(plans), rdc=host.rdc,
                                       bundle_builder=_BUNDLE_BUILDER)
    gpu.record_object(env, HIP, obj, made, device_side)
    return target, source


# --------------------------------------------------------------------------------------------------
# The link side of RDC mode: what clang-linker-wrapper 19 does for HIP, one node per step and target.

def link_compression(target, source, env) -> CompressionOptions | None:
    """The program's fat binary compression: ``$OFFLOAD_HIP_COMPRESS``/``_LEVEL`` over the flags' (compile
    and link flags: ``--offload-compress``, ``--offload-compression-level=N``; see
    :func:`offload_builders.models.hip.link_compression_flags`)."""
    flags = list(_hip_flags(env, target, source, False))
    flags += [str(flag) for flag in env.subst_list("$OFFLOAD_LINKFLAGS $LINKFLAGS", target=target, source=source)[0]]
    try:
        compress, level = link_compression_flags(flags)
    except ValueError as error:
        raise SCons.Errors.UserError(str(error)) from None
    return _compression(env, link_fatbin_spec(compress, level))


def wrap_signature(target, source, env, for_signature) -> str:
    """``$_OFFLOAD_HIP_WRAP_SIG``: what a program's HIP fat binary depends on besides its images."""
    compression = link_compression(target, source, env)
    packing = "none" if compression is None else (
        f"{compression.method.name}/v{compression.version}/level={compression.effective_level}")
    return f"kind={LINK_BUNDLE_KIND} llvm={toolchain_for(env).major} compress={packing}"


def check_device_linker(env) -> None:
    try:
        toolchain_for(env).tool("ld.lld")
    except OffloadError:
        raise SCons.Errors.UserError("ld.lld (the AMDGPU device linker) not found; install it with:"
                                     " apt-get install lld-19") from None


def check_program_targets(targets) -> None:
    """A HIP program's ``$OFFLOAD_ARCHS``: AMDGPU target IDs that do not conflict."""
    try:
        check_targets(targets)
    except OffloadError as error:
        raise SCons.Errors.UserError(f"OFFLOAD_ARCHS: {error}") from None


def links_device_code(env, target, source) -> bool:
    """Whether a HIP-model program links device code (relocatable device code: ``$OFFLOAD_HIP_RDC`` or
    ``-fgpu-rdc``); non-RDC objects register their own code and link as plain host objects."""
    return is_rdc(_hip_flags(env, target, source, False))


def _no_link_arguments(target, source, env, for_signature) -> list[str]:
    """No OpenMP runtime and no offload targets on the host link line."""
    return []


def _link_flags(env, target, source) -> tuple[str, ...]:
    """The driver flags that name a HIP installation for a program's link: its compile and link flags."""
    flags = _hip_flags(env, target, source, False)
    return flags + tuple(str(flag) for flag in env.subst_list("$OFFLOAD_LINKFLAGS $LINKFLAGS", target=target,
                                                               source=source)[0])


def runtime_arguments(target, source, env, for_signature) -> list[str]:
    """``$_OFFLOAD_HOST_RUNTIME`` of a HIP program: ``$OFFLOAD_HIP_RUNTIME``'s libraries, or (None) the HIP
    installation's ``libamdhip64`` as ``clang++ --hip-link`` links it, nothing where there is none."""
    value = env.get("OFFLOAD_HIP_RUNTIME")
    if value is None:
        found = hip_runtime_library(toolchain_for(env), _link_flags(env, target, source))
        return [] if found is None else [f"-L{found.parent}", f"-l{HIP_RUNTIME_LIBRARY}"]
    return [f"-l{env.subst(str(name))}" for name in SCons.Util.flatten(value)]


#: Programs already warned about a missing HIP runtime in this run.
_WARNED_RUNTIME: set[str] = set()


def check_runtime(env, target, source) -> None:
    """Say once, at read time, that a program links without the HIP runtime because none was found."""
    if env.get("OFFLOAD_HIP_RUNTIME") is not None or str(target[0]) in _WARNED_RUNTIME:
        return
    if hip_runtime_library(toolchain_for(env), _link_flags(env, target, source)) is None:
        _WARNED_RUNTIME.add(str(target[0]))
        SCons.Warnings.warn(OffloadLinkWarning, f"{target[0]}: no HIP runtime (lib{HIP_RUNTIME_LIBRARY}.so of a HIP"
                            " installation) found, so the program is linked without it; install it (Debian:"
                            " apt-get install libamdhip64-dev), or set OFFLOAD_HIP_RUNTIME to the libraries to link"
                            " ([] for none, which also silences this)")


#: This model's renderers of the command variables the models share (see :class:`~offload_builders.scons.rendering.
#: ModelRenderer`). A program's device link (RDC) is the shared one, ``link_nodes.device_link_cmd``: the OpenMP
#: link's ``clang --target=amdgcn-amd-amdhsa -mcpu=<target ID> -flto $OFFLOAD_DEVICE_LINKFLAGS
#: -Wl,--no-undefined`` over the extracted bitcode, which is what the wrapper's in-process LTO plus its
#: ``clang`` call amount to.
RENDERERS: dict[str, Renderer] = {
    "_OFFLOAD_HOST_CC1": _host_cc1,
    "_OFFLOAD_DEVICE_CC1": _device_cc1,
    "_OFFLOAD_PACKAGE_CMD": _package_cmd,
    "_OFFLOAD_DEVICE_LINK_CMD": _object_devicelink_cmd,
}

#: The action of an object this model makes from a source: the host compile.
OBJECT_ACTION = phase_action("HOST")

#: The object emitter, for the ``offload`` tool's per-suffix registration.
object_emitter = _object_emitter


def generate_objects(env) -> None:
    """What every environment needs to compile HIP sources, whatever its ``$OFFLOAD_MODEL`` (called by the
    ``offload`` tool's generate): the variables, set only where the user has not, and the bundle writer."""
    # The variables ($OFFLOAD_BUNDLECOM: the in-process bundle writer) and header dependencies of .hip sources.
    gpu.generate_sources(env, defaults_of(SET_BY_HIP, globals()), HIP_SUFFIXES)
    env["_OFFLOAD_HIP_DEFAULT_CUID"] = gpu.default_cuid_var
    env["_OFFLOAD_BUNDLE_SIG"] = _bundle_signature


def generate(env) -> None:
    """What a HIP-model environment's programs need besides the shared program builder (called by the
    ``offload`` tool's generate when ``$OFFLOAD_MODEL`` is ``'hip'`` as it loads)."""
    env["_OFFLOAD_LINK_TARGETS"] = _no_link_arguments  # the OpenMP link's targets have no HIP counterpart


def exists(env) -> bool:
    """The HIP model needs what the ``offload`` tool needs (a Clang with AMDGPU support)."""
    return toolchain_exists(env)


__all__ = ["BUNDLE_IN_PROCESS", "check_device_linker", "check_program_targets", "check_runtime", "default_cuid",
           "exists", "generate", "link_compression", "links_device_code", "offload_bundle", "runtime_arguments",
           "source_cuid", "wrap_signature"]
