"""``OffloadProgram`` for every offload model: one program from any mix of OpenMP objects, plain HIP objects,
HIP relocatable-device-code objects, static libraries of any of them and plain host objects.

What ``clang-linker-wrapper`` 19 does with such a link, without running it (checked against it: the
device files are grouped by (triple, arch) *across* offload kinds, one device link per group, and that
group's one image registered once per offload kind present in it):

* per target ID an extract node (the device files of every kind that target's link needs, Clang 19's
  kind-agnostic selection, :func:`offload_builders.linking.select_device_files`) and one device-link node;
* one wrap node: at build time it reads each target's device input file for the offload kinds it holds
  (:func:`offload_builders.linking.device_input_kinds`) and writes one object with the registration of
  each kind present, OpenMP's (``__tgt_register_lib`` over the images of the groups holding OpenMP code),
  then CUDA's (CUDA 13's ``fatbinary`` of the linked cubins of the groups holding CUDA relocatable device
  code, and ``__cudaRegisterFatBinary``), then HIP's (a fat binary of the images of the groups holding HIP
  code and ``__hipRegisterFatBinary``), all priority-101 constructors, as the wrapper's objects run in its
  link order;
* the host link: the wrapper object first, the user's objects and libraries, and the runtime of each
  kind present (``$_OFFLOAD_HOST_RUNTIME``, read when the link runs: the environment's model's always,
  the other model's when an input carries its code).

Plain (non-RDC) HIP and CUDA objects register their own fat binary; they are host objects here, as for the wrapper.
The graph is fixed when the SConscripts are read; only the wrap node's contents and the runtime libraries
depend on what the objects hold. The program's environment decides the nodes as before: with
``$OFFLOAD_MODEL='openmp'`` (the default) there is always the link side above, and the OpenMP device runtime
is an input of every extract node (as ``clang++ -fopenmp`` passes ``-lomptarget.devicertl``, so a group with
only HIP code whose link needs a device-runtime member gets OpenMP's registration too, as with Clang); with
``'hip'`` only relocatable device code has it (``$OFFLOAD_HIP_RDC``), and non-RDC programs link as they are.
"""
from __future__ import annotations

import os

import SCons.Builder
import SCons.Errors
import SCons.Warnings

from offload_builders import linking, registration
from offload_builders.errors import OffloadError
from offload_builders.phase_table import CUDA, HIP, OPENMP
from offload_builders.scons import cuda, hip, openmp
from offload_builders.scons.common import (
    CLEAN_LEFTOVERS,
    FUNCTION_PHASE_VARLIST,
    OffloadLinkWarning,
    check_tools_for,
    extract_device_inputs,
    function_phase,
    in_process_action,
    input_offload_kinds,
    model_targets_for,
    partial_path,
    program_link_nodes,
    selected_targets,
    static_libraries,
    toolchain_for,
    warn_unmatched_keys,
)
from offload_builders.targets import TargetID, parse_target_id


def _model(env) -> str:
    return HIP if env.subst("$OFFLOAD_MODEL") == HIP else OPENMP


def _device_files(target, env, scanned: linking.ScannedInputs, tid: TargetID,
                  key: linking.GroupKey) -> list[linking.FoundBinary]:
    """Clang 19's selection for ``tid``, every offload kind together; an object that registers OpenMP entries
    (any target) or HIP entries (an AMDGPU target) without code for ``tid`` stops the link (Clang links it
    and the program fails when it runs such a region or kernel)."""
    problems = linking.check_entries(scanned, key, str(tid))
    if tid.kind == "amdgpu":
        problems += [f"{obj.path}: HIP kernels or device variables but no device code for {tid}; compile with"
                     f" that target in OFFLOAD_ARCHS or drop {tid} from the link"
                     for obj in linking.objects_without_code(scanned, key, linking.HIP_ENTRY_SECTIONS)]
    if problems:
        raise SCons.Errors.BuildError(node=target[0], errstr="\n".join(problems))
    files = linking.select_device_files(scanned, key)
    if not files:
        what = ("HIP device code", "code object") if _model(env) == HIP else ("device code", "image")
        SCons.Warnings.warn(OffloadLinkWarning, f"{target[0]}: no {what[0]} for {tid} in any input: the program"
                                                 f" has no {tid} {what[1]}")
    return files


def offload_extract(target, source, env) -> int:
    """``$OFFLOAD_EXTRACTCOM``: write one target's device files (all kinds) to its device input file."""
    return extract_device_inputs(target, source, env, _device_files)


def _group_kinds(image, major: int, default: str) -> frozenset[str]:
    """The offload kinds of the group an image was linked from: its device input file's (the image node's
    source, the extract node); ``default`` where the image was not made by our nodes."""
    sources = getattr(image, "sources", None) or []
    if len(sources) == 1 and os.path.isfile(str(sources[0])):
        try:
            return linking.device_input_kinds(str(sources[0]), major)
        except OffloadError:
            pass
    return frozenset({default})


def offload_wrap(target, source, env) -> int:
    """``$OFFLOAD_WRAPCOM``: the registration object of the linked images, one registration per offload
    kind present (see the module's docstring); an empty image (no device code for that target) is not
    registered. With no image of any kind: OpenMP's empty descriptor, or an empty object for HIP."""
    major = toolchain_for(env).major
    model = _model(env)
    openmp_images: list[tuple[linking.GroupKey, str]] = []
    hip_images: list[tuple[str, str]] = []
    cuda_images: list[tuple[str, str]] = []
    for node, tid_text in zip(source, env["_OFFLOAD_WRAP_TARGETS"]):
        if os.path.getsize(str(node)) == 0:
            continue
        kinds = _group_kinds(node, major, model)
        if OPENMP in kinds:
            openmp_images.append((linking.group_key(parse_target_id(tid_text)), str(node)))
        if HIP in kinds:
            hip_images.append((tid_text, str(node)))
        if CUDA in kinds:
            cuda_images.append((tid_text, str(node)))
    output = partial_path(env, target[0])
    try:
        payloads: list[tuple[str, object]] = []
        if openmp_images or (model == OPENMP and not hip_images and not cuda_images):
            payloads.append((registration.OPENMP, linking.openmp_image_binaries(openmp_images, major)))
        if cuda_images:
            payloads.append((registration.CUDA, cuda.program_fatbinary(env, sorted(cuda_images), output)))
        if hip_images:
            payloads.append((registration.HIP, hip.program_fatbinary(target, source, env, hip_images, output)))
        if payloads:
            data = registration.wrap_kinds(payloads, llvm_version=major)  # type: ignore[arg-type]
        else:
            triple = registration.DEFAULT_HOST_TRIPLE
            data = registration.compile_module(registration.new_module(triple), triple)
    except OffloadError as error:
        raise SCons.Errors.BuildError(node=target[0], errstr=str(error)) from None
    with open(output, "wb") as f:
        f.write(data)
    return 0


#: The wrap node's signature: the targets, the compiler and the HIP fat binary's parameters.
WRAP_VARLIST = ("OFFLOAD_CLANG", "_OFFLOAD_WRAP_TARGETS", "_OFFLOAD_HIP_WRAP_SIG")
EXTRACT_IN_PROCESS = in_process_action(offload_extract, "EXTRACT", FUNCTION_PHASE_VARLIST)
WRAP_IN_PROCESS = in_process_action(offload_wrap, "WRAP", WRAP_VARLIST)
_WRAP_BUILDER = SCons.Builder.Builder(action=function_phase("WRAP", varlist=WRAP_VARLIST), emitter=CLEAN_LEFTOVERS)


def program_emitter(target, source, env):
    """Expand the link into per-target extract and device-link nodes and one wrap node (the program itself
    is the host link); a HIP-model program without relocatable device code gets none (see the module)."""
    targets = selected_targets(env)
    program = target[0]
    if _model(env) == HIP:
        targets = model_targets_for(env, program, HIP)  # the AMDGPU IDs of $OFFLOAD_ARCHS
        hip.check_program_targets(targets)
        hip.check_runtime(env, target, source)
        if not hip.links_device_code(env, target, source):
            return target, source
        hip.check_device_linker(env)
        # The wrapper's bundle order (target ID descending); fixed here, so the list's order changes nothing.
        ordered = sorted(targets, key=str, reverse=True)
        program_link_nodes(env, program, list(source) + static_libraries(env), ordered, HIP, _WRAP_BUILDER)
        return target, source
    check_tools_for(env, targets)
    openmp.check_link_tools_for(env, targets)
    warn_unmatched_keys(env, "OFFLOAD_TARGET_LINKFLAGS", targets)
    openmp.check_deploy_devices(env)
    inputs = list(source) + static_libraries(env) + [openmp.device_runtime(env)]
    images = program_link_nodes(env, program, inputs, targets, OPENMP, _WRAP_BUILDER, probe=True)
    program.attributes.offload_images = [(str(tid), image) for tid, image in zip(targets, images)]
    return target, source


def wrapper_object(target, source, env, for_signature) -> list[str]:
    """``$_OFFLOAD_WRAPPER_OBJECT``: the program's registration object (none for a non-RDC HIP program)."""
    wrapper = getattr(target[0].attributes, "offload_wrapper", None)
    return [str(wrapper)] if wrapper is not None else []


def host_runtime(target, source, env, for_signature) -> list[str]:
    """``$_OFFLOAD_HOST_RUNTIME``: the runtime of the environment's model, and of the other model where the
    program's inputs (objects and ``$LIBS``' static libraries, read when the link runs) carry its code;
    OpenMP's first."""
    model = _model(env)
    paths = [str(node) for node in source] + [str(node) for node in static_libraries(env)]
    kinds = {model} | set(input_offload_kinds(paths, toolchain_for(env).major))
    arguments = []
    if OPENMP in kinds:
        arguments += openmp.runtime_arguments(target, source, env, for_signature)
    if HIP in kinds:
        arguments += hip.runtime_arguments(target, source, env, for_signature)
    return arguments


def generate(env) -> None:
    """Give ``env`` the program's variables (called by the tool's ``generate``, for every model)."""
    env["_OFFLOAD_WRAPPER_OBJECT"] = wrapper_object
    env["_OFFLOAD_HOST_RUNTIME"] = host_runtime
    env["_OFFLOAD_HIP_WRAP_SIG"] = hip.wrap_signature
    if "OFFLOAD_EXTRACTCOM" not in env:
        env["OFFLOAD_EXTRACTCOM"] = EXTRACT_IN_PROCESS
    if "OFFLOAD_WRAPCOM" not in env:
        env["OFFLOAD_WRAPCOM"] = WRAP_IN_PROCESS


__all__ = ["EXTRACT_IN_PROCESS", "WRAP_IN_PROCESS", "generate", "host_runtime", "offload_extract", "offload_wrap",
           "program_emitter", "wrapper_object"]
