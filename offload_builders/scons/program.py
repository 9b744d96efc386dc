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
depend on what the objects hold. What the tool compiled itself it knows then (:class:`KnownInputs`: the model
of each ``OffloadObject``, through ``OffloadStaticLibrary`` too); other inputs (an ``env.Object``, a prebuilt
object or library) may hold any code. With ``$OFFLOAD_MODEL='hip'`` only relocatable device code has the link
side (``$OFFLOAD_HIP_RDC``), and non-RDC programs link as they are. Otherwise the program's link is OpenMP's
where an input holds OpenMP code, or, in an ``'openmp'`` environment (the default), where an input may and the
OpenMP device runtime is installed: then there is always the link side above, and the OpenMP device runtime is
an input of every extract node (as ``clang++ -fopenmp`` passes ``-lomptarget.devicertl``, so a group with only
HIP code whose link needs a device-runtime member gets OpenMP's registration too, as with Clang). A program
without OpenMP code (only CUDA and HIP objects, or Clang 22 without an OpenMP device runtime) links as
``clang++`` without ``-fopenmp`` would: no OpenMP device runtime, no OpenMP runtime on the host link, and the
link side only for relocatable device code, for the GPU targets of the kinds present (:func:`device_code_link`).

The host link adds the runtime of each offload kind present: OpenMP's, ``$OFFLOAD_CUDA_RUNTIME`` (default
``libcudart`` of the CUDA installation) and ``$OFFLOAD_HIP_RUNTIME``.
"""
from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import SCons.Builder
import SCons.Errors
import SCons.Util
import SCons.Warnings

from offload_builders import linking
from offload_builders.driver import CommandTemplate
from offload_builders.errors import OffloadError
from offload_builders.phase_table import CUDA, HIP, LINK, OPENMP, Phase, row
from offload_builders.scons import groups, hip, openmp
from offload_builders.scons.actions import FUNCTION_PHASE_VARLIST, function_phase, in_process_action
from offload_builders.scons.construction_variables import SET_BY_PROGRAM, defaults_of
from offload_builders.scons.groups import GROUPLINK_IN_PROCESS, GROUPS_IN_PROCESS
from offload_builders.scons.link_nodes import (
    OffloadLinkWarning,
    extract_device_inputs,
    input_offload_kinds,
    program_link_nodes,
    scanned_inputs,
    static_libraries,
)
from offload_builders.scons.outputs import CLEAN_LEFTOVERS, clean_leftovers, partial_path
from offload_builders.scons.rendering import node_model
from offload_builders.scons.tool_dependencies import check_tools_for, depend_on_stamps
from offload_builders.scons.variables import (
    model_targets_for,
    node_target,
    selected_targets,
    set_default,
    toolchain_for,
    warn_unmatched_keys,
)
from offload_builders.targets import MODEL_TARGET_KINDS, TargetID, parse_target_id


def _model(env) -> str:
    """The environment's model (``$OFFLOAD_MODEL``): HIP, CUDA or OpenMP."""
    chosen = env.subst("$OFFLOAD_MODEL")
    return chosen if chosen in (HIP, CUDA) else OPENMP


#: How a HIP or CUDA object's device side is named when it is relocatable device code (an offload binary).
_PACKAGE_SUFFIX = row(Phase.PACKAGE, CUDA).node.format(stem="")
assert _PACKAGE_SUFFIX == row(Phase.PACKAGE, HIP).node.format(stem="")


@dataclass(frozen=True)
class KnownInputs:
    """What a program's inputs hold as far as the tool knows when the SConscripts are read: the offload kinds
    of the objects ``OffloadObject`` made (also inside ``OffloadStaticLibrary`` libraries), those of them with
    relocatable device code (OpenMP's always is), and whether some other input (``env.Object``, a prebuilt
    object or library) may hold any code."""

    kinds: frozenset[str]
    rdc_kinds: frozenset[str]
    unknown: bool


def library_emitter(target, source, env):
    """``OffloadStaticLibrary``'s: mark the library, so that a program linking it reads its objects' models."""
    for node in target:
        node.attributes.offload_library = True
    return target, source


def known_inputs(nodes: Iterable) -> KnownInputs:
    """:class:`KnownInputs` of ``nodes`` (objects and libraries)."""
    kinds: set[str] = set()
    rdc: set[str] = set()
    unknown = False
    pending, seen = list(nodes), set()
    while pending:
        node = pending.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        model = node_model([node])
        if model is not None:
            kinds.add(model)
            device_side = getattr(node.attributes, "offload_inputs", None) or ()
            if model == OPENMP or (device_side and str(device_side[0]).endswith(_PACKAGE_SUFFIX)):
                rdc.add(model)
        elif getattr(node.attributes, "offload_library", False) and node.sources:
            pending.extend(node.sources)
        else:
            unknown = True
    return KnownInputs(frozenset(kinds), frozenset(rdc), unknown)


def links_openmp(env, model: str, known: KnownInputs) -> bool:
    """Whether a program (not of the HIP model) links OpenMP's way: an input holds OpenMP code, or, in an OpenMP
    environment, one may and the OpenMP device runtime is installed (so such programs link as they always did)."""
    if OPENMP in known.kinds:
        return True
    return model == OPENMP and known.unknown and openmp.has_device_runtime(env)


def _device_files(target, env, scanned: linking.ScannedInputs, tid: TargetID,
                  key: linking.GroupKey) -> list[linking.FoundBinary]:
    """Clang 19's selection for ``tid``, every offload kind together; an object that registers OpenMP entries
    (any target) or HIP entries (an AMDGPU target) without code for ``tid`` stops the link (Clang links it
    and the program fails when it runs such a region or kernel)."""
    from offload_builders.linking import nvptx_runtime  # the NVPTX runtime split: only where a link step runs

    problems = linking.check_entries(scanned, key, str(tid))
    if tid.kind == "amdgpu":
        problems += [f"{obj.path}: HIP kernels or device variables but no device code for {tid}; compile with"
                     f" that target in OFFLOAD_ARCHS or drop {tid} from the link"
                     for obj in linking.objects_without_code(scanned, key, linking.HIP_ENTRY_SECTIONS)]
    if problems:
        raise SCons.Errors.BuildError(node=target[0], errstr="\n".join(problems))
    files = linking.select_device_files(scanned, key)
    if getattr(target[0].attributes, "offload_without_openmp", False):
        _check_no_openmp_code(target, env, files, tid)
    runtime = getattr(target[0].attributes, "offload_nvptx_runtime", None)
    if runtime is not None and files and os.path.getsize(str(runtime)):
        split = nvptx_runtime.split_device_files(files, linking.device_runtime(toolchain_for(env)))
        if split is not None:  # the runtime's cubin in place of its bitcode, first: clang-nvlink-wrapper's order
            files = [*nvptx_runtime.read_runtime_package(str(runtime)), *split.user]
    if not files and not getattr(target[0].attributes, "offload_without_openmp", False):
        # (without OpenMP, an empty image is what plain objects give: they register their own fat binaries)
        what = ("HIP device code", "code object") if _model(env) == HIP else ("device code", "image")
        SCons.Warnings.warn(OffloadLinkWarning, f"{target[0]}: no {what[0]} for {tid} in any input: the program"
                                                 f" has no {tid} {what[1]}")
    return files


def _check_no_openmp_code(target, env, files: Sequence[linking.FoundBinary], tid: TargetID) -> None:
    """A program linked without OpenMP's runtime (see :func:`links_openmp`) whose inputs turn out to hold OpenMP
    code stops here, rather than linking code that would call a device runtime it does not have."""
    major = toolchain_for(env).major
    found = [f for f in files if f.binary.offload_kind != 0 and f.binary.offload_kind_name(major) == OPENMP]
    if not found:
        return
    reason = (openmp.device_runtime_problem(env) or "the program's environment has OFFLOAD_MODEL="
              f"{env.subst('$OFFLOAD_MODEL')!r}; link it from one whose OFFLOAD_MODEL is 'openmp'")
    raise SCons.Errors.BuildError(node=target[0], errstr=f"{found[0].origin}: OpenMP device code for {tid}, but the"
                                                          f" program links no OpenMP device runtime: {reason}")


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
    kind present (see the module's docstring and :func:`offload_builders.linking.wrapping.registration_object`); an
    empty image (no device code for that target) is not registered. With no image of any kind: OpenMP's
    empty descriptor, or an empty object for HIP."""
    from offload_builders.linking import wrapping  # llvmlite: only where a program is wrapped

    toolchain = toolchain_for(env)
    model = _model(env)
    images = [wrapping.LinkedImage(linking.group_key(parse_target_id(tid_text)), str(node),
                                   _group_kinds(node, toolchain.major, model))
              for node, tid_text in zip(source, env["_OFFLOAD_WRAP_TARGETS"])]
    output = partial_path(env, target[0])
    try:
        data = wrapping.registration_object(images, toolchain, output, empty_kind=model,
                                            hip_compression=hip.link_compression(target, source, env))
    except OffloadError as error:
        raise SCons.Errors.BuildError(node=target[0], errstr=str(error)) from None
    assert data is not None  # an empty kind always gives an object
    with open(output, "wb") as f:
        f.write(data)
    return 0


def offload_wrap_without_openmp(target, source, env) -> int:
    """The default ``$OFFLOAD_WRAPCOM`` of a program without OpenMP code (:func:`device_code_link`):
    :func:`offload_wrap`, except that with no image of any kind the object holds no empty OpenMP descriptor, which
    would need libomptarget."""
    return offload_wrap(target, source, env.Override({"OFFLOAD_MODEL": CUDA}))


# --------------------------------------------------------------------------------------------------
# The NVPTX device runtime's own nodes (see offload_builders.linking.nvptx_runtime).

#: The nodes of one NVPTX image's runtime part: what the user's cubins take from the runtime, the runtime's
#: selected bitcode (a device input file), and its linked cubin (a device input file of one image).
RUNTIME_NODE_NAMES = (row(Phase.RUNTIMESYMS, OPENMP, LINK).node,
                      row(Phase.RUNTIMESYMS, OPENMP, LINK).node.replace(".syms", ".devin"),
                      row(Phase.RUNTIMELINK, OPENMP, LINK).node)


def _lto_job(target, source, env) -> CommandTemplate | None:
    """The target's device-link job (``clang-nvlink-wrapper``), as probed when the program was declared, for
    the flags the device link renders now; None where it is not that (the driver then links in one step)."""
    from offload_builders.linking import nvptx_runtime  # the NVPTX runtime split: only where a link step runs

    tid = node_target(env)
    flags = [str(f) for f in env.subst_list("$OFFLOAD_DEVICE_LINKFLAGS $_OFFLOAD_TARGET_LINKFLAGS",
                                            target=target, source=source)[0]]
    job = linking.known_device_link(toolchain_for(env), linking.group_key(tid), flags=flags)
    return job if job is not None and nvptx_runtime.is_nvlink_wrapper_job([str(job.argv[0])]) else None


def offload_runtime_symbols(target, source, env) -> int:
    """``$OFFLOAD_RUNTIMESYMSCOM``: from the link inputs, write what one NVPTX target's cubins take from the
    device runtime (the interface) and the runtime's selected bitcode; both empty where the link is not split."""
    from offload_builders.linking import nvptx_runtime  # the NVPTX runtime split: only where a link step runs

    tid = parse_target_id(env.subst("$OFFLOAD_TARGET"))
    split = None
    if _lto_job(target, source, env) is not None:
        files = linking.select_device_files(scanned_inputs([str(node) for node in source]), linking.group_key(tid))
        split = nvptx_runtime.split_device_files(files, linking.device_runtime(toolchain_for(env)))
    try:
        with open(partial_path(env, target[0]), "wb") as f:
            f.write(nvptx_runtime.format_interface(nvptx_runtime.interface(split) if split else []))
        linking.write_device_inputs(list(split.runtime) if split else [], partial_path(env, target[1]))
    except OffloadError as error:
        raise SCons.Errors.BuildError(node=target[0], errstr=str(error)) from None
    return 0


def offload_runtime_link(target, source, env) -> int:
    """``$OFFLOAD_RUNTIMELINKCOM``: link the runtime's part of one NVPTX image from the interface and the
    runtime's bitcode alone (LTO and ptxas, as the one-step device link would), or write an empty file."""
    from offload_builders.linking import nvptx_runtime  # the NVPTX runtime split: only where a link step runs

    tid = parse_target_id(env.subst("$OFFLOAD_TARGET"))
    job = _lto_job(target, source, env)
    scratch = str(target[0]) + ".inputs"  # with the link's $TMPDIR: what a killed run left goes first
    shutil.rmtree(scratch, ignore_errors=True)
    os.makedirs(scratch)
    try:
        if job is None:
            open(partial_path(env, target[0]), "wb").close()
        else:
            nvptx_runtime.link_runtime(
                lambda inputs, output: linking.render_device_link(job, inputs, output), toolchain_for(env),
                linking.group_key(tid), str(source[0]), str(source[1]), partial_path(env, target[0]), scratch,
                toolchain_for(env).major)
    except OffloadError as error:
        raise SCons.Errors.BuildError(node=target[0], errstr=str(error)) from None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


#: What the runtime's link reads besides its two files: the device link's flags, the compiler, the target.
RUNTIME_VARLIST = ("OFFLOAD_TARGET", "OFFLOAD_CLANG", "OFFLOAD_DEVICE_LINKFLAGS", "_OFFLOAD_TARGET_LINKFLAGS")
_RUNTIME_CODE = ("offload_builders.scons.program:_lto_job", "offload_builders.linking.nvptx_runtime",
                 "offload_builders.linking.inputs", "offload_builders.linking.device_link")
RUNTIMESYMS_IN_PROCESS = in_process_action(offload_runtime_symbols, "RUNTIMESYMS", RUNTIME_VARLIST,
                                           name="device runtime interface", version=1, covers=_RUNTIME_CODE)
RUNTIMELINK_IN_PROCESS = in_process_action(offload_runtime_link, "RUNTIMELINK", RUNTIME_VARLIST,
                                           name="device runtime link", version=1, covers=_RUNTIME_CODE)
_RUNTIMESYMS_BUILDER = SCons.Builder.Builder(action=function_phase("RUNTIMESYMS", varlist=RUNTIME_VARLIST),
                                             emitter=CLEAN_LEFTOVERS)
_RUNTIMELINK_BUILDER = SCons.Builder.Builder(action=function_phase("RUNTIMELINK", varlist=RUNTIME_VARLIST),
                                             emitter=clean_leftovers([".inputs"]))


def _runtime_nodes(env, program, inputs, targets: Sequence[TargetID], images: list) -> None:
    """For each NVPTX image, the runtime's nodes in front of its extract node (``$OFFLOAD_NVPTX_RUNTIME_NODE``,
    default on): the extract then puts the runtime's cubin in place of the runtime's bitcode."""
    if not env.get("OFFLOAD_NVPTX_RUNTIME_NODE", True):
        return
    programs: list[str] = []
    for tid, image in zip(targets, images):
        if tid.kind != "nvptx":
            continue
        if not programs:
            toolchain = toolchain_for(env)
            wrapper = toolchain.optional_tool("clang-nvlink-wrapper")
            programs = [str(toolchain.cuda_tool("ptxas")), *([str(wrapper)] if wrapper else [])]
        names = [program.dir.File(name.format(program=program.name, target=tid.file_token))
                 for name in RUNTIME_NODE_NAMES]
        symbols = _RUNTIMESYMS_BUILDER(env, names[:2], inputs, OFFLOAD_TARGET=tid)
        runtime = _RUNTIMELINK_BUILDER(env, names[2:], symbols, OFFLOAD_TARGET=tid)
        # The programs it runs, as the compile nodes name theirs: a CUDA or LLVM update relinks the runtime
        # with the user's cubins, which the same update rebuilds (its two files would not change).
        depend_on_stamps(runtime, programs)
        extract = image.sources[0]
        extract.attributes.offload_nvptx_runtime = runtime[0]
        env.Depends(extract, runtime)


#: The wrap node's signature: the targets, the compiler and the HIP fat binary's parameters.
WRAP_VARLIST = ("OFFLOAD_CLANG", "_OFFLOAD_WRAP_TARGETS", "_OFFLOAD_HIP_WRAP_SIG")
EXTRACT_IN_PROCESS = in_process_action(
    offload_extract, "EXTRACT", FUNCTION_PHASE_VARLIST, name="extract device code", version=1,
    covers=["offload_builders.scons.program:_device_files", "offload_builders.scons.link_nodes:extract_device_inputs",
            "offload_builders.linking.inputs", "offload_builders.linking.nvptx_runtime"])
#: What makes a registration object: the wrap step's code, the registration code, the fat binaries.
_WRAP_CODE = ("offload_builders.scons.program:offload_wrap", "offload_builders.scons.program:_group_kinds",
              "offload_builders.linking.wrapping", "offload_builders.linking.registration",
              "offload_builders.linking.registration_ir", "offload_builders.linking.registration_codegen",
              "offload_builders.linking.inputs", "offload_builders.scons.hip:link_compression",
              "offload_builders.formats.fatbinary", "offload_builders.formats.bundle",
              "offload_builders.formats.clang_zstd", "offload_builders.formats.compressed",
              "offload_builders.formats.cubin", "offload_builders.models.hip:program_fatbinary",
              "offload_builders.models.cuda:program_fatbinary")
WRAP_IN_PROCESS = in_process_action(offload_wrap, "WRAP", WRAP_VARLIST, name="registration", version=1,
                                    covers=_WRAP_CODE[1:])
WRAP_WITHOUT_OPENMP_IN_PROCESS = in_process_action(offload_wrap_without_openmp, "WRAP", WRAP_VARLIST,
                                                   name="registration without OpenMP", version=1, covers=_WRAP_CODE)
_WRAP_BUILDER = SCons.Builder.Builder(action=function_phase("WRAP", varlist=WRAP_VARLIST), emitter=CLEAN_LEFTOVERS)


def _wrap_without_openmp(env, target, source, **overrides):
    """The wrap node of a program without OpenMP code: :data:`WRAP_WITHOUT_OPENMP_IN_PROCESS` in place of the
    default ``$OFFLOAD_WRAPCOM`` (a user's own stays)."""
    if env.get("OFFLOAD_WRAPCOM") is WRAP_IN_PROCESS:
        overrides["OFFLOAD_WRAPCOM"] = WRAP_WITHOUT_OPENMP_IN_PROCESS
    return _WRAP_BUILDER(env, target, source, **overrides)


def program_emitter(target, source, env):
    """Expand the link into per-target extract and device-link nodes and one wrap node (the program itself
    is the host link); a HIP-model program without relocatable device code gets none, nor does a program
    without OpenMP and relocatable device code (see the module)."""
    program = target[0]
    model = _model(env)
    known = known_inputs(list(source) + static_libraries(env))
    if model == HIP:
        program.attributes.offload_link_kinds = frozenset({HIP}) | known.kinds
        if env.get("OFFLOAD_IMAGE_GROUPS"):
            raise SCons.Errors.UserError(f"{program}: OFFLOAD_IMAGE_GROUPS links OpenMP programs only (this "
                                         "environment's OFFLOAD_MODEL is 'hip'): leave it off for this program")
        targets = model_targets_for(env, program, HIP)  # the AMDGPU IDs of $OFFLOAD_ARCHS
        hip.check_program_targets(targets)
        hip.check_runtime(env, target, source)
        if CUDA in known.kinds:
            check_cuda_runtime(env, target)
        if not hip.links_device_code(env, target, source):
            return target, source
        hip.check_device_linker(env)
        # The wrapper's bundle order (target ID descending); fixed here, so the list's order changes nothing.
        ordered = sorted(targets, key=str, reverse=True)
        program_link_nodes(env, program, list(source) + static_libraries(env), ordered, HIP, _WRAP_BUILDER)
        return target, source
    if not links_openmp(env, model, known):
        device_code_link(env, program, source, model, known)
        return target, source
    program.attributes.offload_link_kinds = frozenset({OPENMP}) | known.kinds
    if CUDA in known.kinds:
        check_cuda_runtime(env, target)
    targets = selected_targets(env)
    check_tools_for(env, targets)
    openmp.check_link_tools_for(env, targets)
    warn_unmatched_keys(env, "OFFLOAD_TARGET_LINKFLAGS", targets)
    openmp.check_deploy_devices(env)
    inputs = list(source) + static_libraries(env) + [openmp.device_runtime(env)]
    grouped = bool(env.get("OFFLOAD_IMAGE_GROUPS"))
    if grouped:
        # The wrap registers the groups (unless $OFFLOAD_WRAPCOM is the user's own): a step of its own, so the
        # default wrap's version says nothing of groups.
        default = env.get("OFFLOAD_WRAPCOM") is WRAP_IN_PROCESS
        wrap = {"OFFLOAD_WRAPCOM": groups.GROUP_WRAP_IN_PROCESS} if default else {}
        images = groups.program_group_nodes(env, program, inputs, targets, _WRAP_BUILDER, **wrap)
    else:
        images = program_link_nodes(env, program, inputs, targets, OPENMP, _WRAP_BUILDER, probe=True)
    _runtime_nodes(env, program, inputs, targets, images)
    # the host link's entry check reads whole images; each group's link checks its own entries
    program.attributes.offload_images = [] if grouped else [(str(tid), image) for tid, image in zip(targets, images)]
    return target, source


def device_code_link(env, program, source, model: str, known: KnownInputs) -> None:
    """The link of a program without OpenMP code (of an OpenMP or CUDA environment), as ``clang++`` without
    ``-fopenmp`` links it: plain HIP and CUDA objects register themselves; relocatable device code (an RDC object
    the tool compiled, or any input it did not: it may hold some) gets per GPU target of its kinds an extract and
    a device link, and the wrap node's registration, with no OpenMP device runtime (an input holding OpenMP code
    after all stops its extract node). ``$OFFLOAD_IMAGE_GROUPS`` has nothing to group here."""
    kinds = known.kinds | ({CUDA} if model == CUDA else frozenset())
    program.attributes.offload_link_kinds = kinds
    if model == CUDA and env.get("OFFLOAD_IMAGE_GROUPS"):
        raise SCons.Errors.UserError(f"{program}: OFFLOAD_IMAGE_GROUPS links OpenMP programs only (this "
                                     "environment's OFFLOAD_MODEL is 'cuda'): leave it off for this program")
    if CUDA in kinds:
        check_cuda_runtime(env, [program])
    if HIP in kinds:
        hip.check_runtime(env, [program], source)
    openmp.check_deploy_devices(env)
    linked = (set(known.rdc_kinds) | ({HIP, CUDA} if known.unknown else set())) - {OPENMP}
    target_kinds = {kind for linked_model in linked for kind in MODEL_TARGET_KINDS[linked_model]}
    targets = [tid for tid in selected_targets(env) if tid.kind in target_kinds]
    if not targets:
        return
    openmp.check_link_tools_for(env, targets, device_runtime=False)
    warn_unmatched_keys(env, "OFFLOAD_TARGET_LINKFLAGS", targets)
    images = program_link_nodes(env, program, list(source) + static_libraries(env), targets, OPENMP,
                                _wrap_without_openmp, probe=True)
    for image in images:
        image.sources[0].attributes.offload_without_openmp = True  # the extract node


def wrapper_object(target, source, env, for_signature) -> list[str]:
    """``$_OFFLOAD_WRAPPER_OBJECT``: the program's registration object (none for a non-RDC HIP program)."""
    wrapper = getattr(target[0].attributes, "offload_wrapper", None)
    return [str(wrapper)] if wrapper is not None else []


def host_runtime(target, source, env, for_signature) -> list[str]:
    """``$_OFFLOAD_HOST_RUNTIME``: the runtime of each offload kind the program links, as its emitter decided
    (``offload_link_kinds``: OpenMP's for a program linked OpenMP's way, and the kinds of the objects the tool
    compiled), and of each kind the program's inputs (objects and ``$LIBS``' static libraries, read when the link
    runs) carry code of; OpenMP's first, then CUDA's and HIP's (the wrap node's registration order)."""
    paths = [str(node) for node in source] + [str(node) for node in static_libraries(env)]
    decided = getattr(target[0].attributes, "offload_link_kinds", None) if target else None
    kinds = set(decided if decided is not None else {_model(env)})
    kinds |= input_offload_kinds(paths, toolchain_for(env).major)
    arguments = []
    if OPENMP in kinds:
        arguments += openmp.runtime_arguments(target, source, env, for_signature)
    if CUDA in kinds:
        arguments += cuda_runtime_arguments(target, source, env, for_signature)
    if HIP in kinds:
        arguments += hip.runtime_arguments(target, source, env, for_signature)
    return arguments


# --------------------------------------------------------------------------------------------------
# The CUDA runtime, which a program with CUDA code links ($OFFLOAD_CUDA_RUNTIME).

#: The CUDA runtime's library name (``-lcudart``).
CUDA_RUNTIME_LIBRARY = "cudart"


def cuda_runtime_library(env) -> str | None:
    """``libcudart.so`` of the CUDA installation (the toolchain's ``$CUDA_PATH``), in ``lib64`` or ``lib``, as the
    path found (``/usr/local/cuda/lib64/libcudart.so``); None without one."""
    root = toolchain_for(env).cuda_path
    if root is None:
        return None
    for directory in ("lib64", "lib"):
        candidate = os.path.join(str(root), directory, f"lib{CUDA_RUNTIME_LIBRARY}.so")
        if os.path.exists(candidate):
            return candidate
    return None


def cuda_runtime_arguments(target, source, env, for_signature) -> list[str]:
    """The host link's CUDA runtime: ``$OFFLOAD_CUDA_RUNTIME``'s libraries, or (None) the installation's
    ``libcudart`` (``-L<CUDA_PATH>/lib64 -lcudart``), nothing where there is none. As HIP's runtime
    (:func:`offload_builders.scons.hip.runtime_arguments`), with no run path: the program finds ``libcudart.so.13``
    where the loader looks (``ld.so.conf``, ``$LD_LIBRARY_PATH``) or where ``$LINKFLAGS`` puts one."""
    value = env.get("OFFLOAD_CUDA_RUNTIME")
    if value is None:
        found = cuda_runtime_library(env)
        return [] if found is None else [f"-L{os.path.dirname(found)}", f"-l{CUDA_RUNTIME_LIBRARY}"]
    return [f"-l{env.subst(str(name))}" for name in SCons.Util.flatten(value)]


#: Programs already warned about a missing CUDA runtime in this run.
_WARNED_CUDA_RUNTIME: set[str] = set()


def check_cuda_runtime(env, target) -> None:
    """Say once, at read time, that a program with CUDA code links without the CUDA runtime because none was
    found (``$OFFLOAD_CUDA_RUNTIME`` unset)."""
    if env.get("OFFLOAD_CUDA_RUNTIME") is not None or str(target[0]) in _WARNED_CUDA_RUNTIME:
        return
    if cuda_runtime_library(env) is None:
        _WARNED_CUDA_RUNTIME.add(str(target[0]))
        where = toolchain_for(env).cuda_path
        SCons.Warnings.warn(OffloadLinkWarning, f"{target[0]}: no CUDA runtime (lib{CUDA_RUNTIME_LIBRARY}.so in"
                            f" lib64 or lib of {where or 'a CUDA installation: none found'}) found, so the program is"
                            " linked without it; set $CUDA_PATH to the CUDA installation, or OFFLOAD_CUDA_RUNTIME to"
                            " the libraries to link ([] for none, which also silences this)")


def generate(env) -> None:
    """Give ``env`` the program's variables (called by the tool's ``generate``, for every model)."""
    env["_OFFLOAD_WRAPPER_OBJECT"] = wrapper_object
    env["_OFFLOAD_HOST_RUNTIME"] = host_runtime
    env["_OFFLOAD_HIP_WRAP_SIG"] = hip.wrap_signature
    for key, value in defaults_of(SET_BY_PROGRAM, globals()).items():  # the in-process link phases
        set_default(env, key, value)


__all__ = ["CUDA_RUNTIME_LIBRARY", "EXTRACT_IN_PROCESS", "GROUPLINK_IN_PROCESS", "GROUPS_IN_PROCESS",
           "RUNTIMELINK_IN_PROCESS", "RUNTIMESYMS_IN_PROCESS", "RUNTIME_NODE_NAMES", "WRAP_IN_PROCESS",
           "WRAP_WITHOUT_OPENMP_IN_PROCESS", "KnownInputs",
           "check_cuda_runtime", "cuda_runtime_arguments", "cuda_runtime_library", "device_code_link", "generate",
           "host_runtime", "known_inputs", "library_emitter", "links_openmp", "offload_extract",
           "offload_runtime_link", "offload_runtime_symbols", "offload_wrap", "offload_wrap_without_openmp",
           "program_emitter", "wrapper_object"]
