"""``OffloadProgram`` with ``$OFFLOAD_IMAGE_GROUPS``: one device image per group of link inputs and target
(see :mod:`offload_builders.linking.image_groups`), each group registered with its own descriptor.

Nodes, after the extract nodes (one per target, as without groups):

* ``<program>.offload.groups``: the plan, from the link inputs and every target's device input file (which
  objects form a group, which entries each registers, which device files each group's link takes);
* per target ``<program>.<target>.groups``: every group's image for that target, each in an offload binary,
  in group order. Each group's link is the device link the driver runs for it (the node's
  ``$OFFLOAD_DEVICE_LINKFLAGS``/``$OFFLOAD_TARGET_LINKFLAGS`` apply); an image is kept in
  ``<program>.<target>.groups.cache/`` under a key of its command, inputs and linker, so a group whose files
  did not change is not linked again;
* the wrap node registers each group's images (one per target) and entries with a descriptor of its own.

The graph is fixed when the SConscripts are read; the groups are found when the plan node runs.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence

import SCons.Builder
import SCons.Errors
import SCons.Script

from offload_builders import device_libraries, leftovers, linking, nvptx_tools
from offload_builders.errors import OffloadError
from offload_builders.linking import image_groups
from offload_builders.phase_table import LINK, OPENMP, Phase, node_name
from offload_builders.scons.actions import function_phase, in_process_action
from offload_builders.scons.link_nodes import EXTRACT_BUILDER, device_link_argv, probe_device_link, scanned_inputs
from offload_builders.scons.outputs import CLEAN_LEFTOVERS, clean_leftovers, partial_path
from offload_builders.scons.tool_dependencies import depend_on_stamps
from offload_builders.scons.variables import toolchain_for
from offload_builders.targets import TargetID, parse_target_id

CACHE_SUFFIX = ".cache"
#: A cached AMDGPU image whose code uses the device heap (image_groups.MEMORY_POOL).
POOL_SUFFIX = ".pool.img"
#: The group-link node's second file: the groups whose image uses the device heap, one number a line.
POOL_FILE_SUFFIX = ".heap"


def _plan_path(env) -> str:
    return env.subst("$_OFFLOAD_GROUP_PLAN")


def offload_groups(target, source, env) -> int:
    """``$OFFLOAD_GROUPSCOM``: write the program's group plan. Sources: each target's device input file (in
    ``$_OFFLOAD_WRAP_TARGETS``' order), then the link inputs."""
    labels = list(env["_OFFLOAD_WRAP_TARGETS"])
    devins, inputs = source[:len(labels)], source[len(labels):]
    toolchain = toolchain_for(env)
    # NVPTX units carry weak copies of the runtime bitcode the compile linked in (see device_libraries)
    compiled_in = [path for label in labels if (tid := parse_target_id(label)).kind == "nvptx"
                   and (path := toolchain.lib_dir / f"libomptarget-nvptx-{tid.processor}.bc").is_file()]
    try:
        plan = image_groups.plan_groups(scanned_inputs([str(node) for node in inputs]),
                                        {label: str(node) for label, node in zip(labels, devins)},
                                        str(linking.device_runtime(toolchain)), toolchain.major,
                                        [str(path) for path in compiled_in])
        image_groups.write_plan(plan, partial_path(env, target[0]))
    except OffloadError as error:
        raise SCons.Errors.BuildError(node=target[0], errstr=str(error)) from None
    return 0


def offload_group_link(target, source, env) -> int:
    """``$OFFLOAD_GROUPLINKCOM``: link each group's image for one target (or take it from the node's cache),
    check it defines the entries its group registers, and write them all, each in an offload binary."""
    tid = parse_target_id(env.subst("$OFFLOAD_TARGET"))
    key = linking.group_key(tid)
    toolchain = toolchain_for(env)
    output = str(target[0])
    cache = output + CACHE_SUFFIX
    scratch = output + ".inputs"
    try:
        plan = image_groups.read_plan(str(source[1]))
        members = plan.members.get(str(tid))
        if members is None:
            raise OffloadError(f"{source[1]}: no groups for {tid}; build again")
        # every device file once (the runtime's goes to every group), and its digest for the cache keys
        unpacked = linking.unpack_device_inputs(str(source[0]), scratch)
        digests = [image_groups.file_digest(path) for path in unpacked]
        # what the link runs besides argv[0]: CUDA's tools behind clang-nvlink-wrapper
        programs = ([str(nvptx_tools.openmp_tool(toolchain, name)) for name in ("ptxas", "nvlink")]
                    if tid.kind == "nvptx" else [])
        os.makedirs(cache, exist_ok=True)
        used: set[str] = set()
        rpc_users: list[image_groups.ImageGroup] = []
        pool_users: list[int] = []
        images: list[tuple[linking.GroupKey, str]] = []
        for number, (group, files) in enumerate(zip(plan.groups, members)):
            if any(index >= len(unpacked) for index in files):
                raise OffloadError(f"{source[1]} names device files that {source[0]} does not hold; build again")
            inputs = [unpacked[index] for index in files]
            placeholder = os.path.join(cache, "link.partial")
            argv = device_link_argv(env, tid, target, source, inputs, placeholder)
            if tid.kind == "amdgpu":  # which images use the device heap (see _check_memory_pools)
                argv.append("--emit-relocs" if os.path.basename(argv[0]).startswith("ld.lld") else "-Wl,--emit-relocs")
            keyed = [(unpacked[index], digests[index]) for index in files]
            stem = os.path.join(cache, image_groups.link_key(argv, keyed, placeholder, [argv[0], *programs]))
            image = next((path for path in (stem + ".img", stem + POOL_SUFFIX) if os.path.exists(path)), "")
            if not image:
                _run_link(env, tid, argv, placeholder, target[0], group, scratch)
                uses_pool = False
                if tid.kind == "amdgpu":
                    objcopy = str(toolchain.tool("llvm-objcopy"))
                    uses_pool = image_groups.MEMORY_POOL in image_groups.referenced_symbols_and_strip(placeholder,
                                                                                                      objcopy)
                image = stem + (POOL_SUFFIX if uses_pool else ".img")
                os.replace(placeholder, image)
            if image.endswith(POOL_SUFFIX):
                pool_users.append(number)
            if RPC_CLIENT in _check_entries(image, group, tid, target[0]):
                rpc_users.append(group)
            used.add(os.path.basename(image))
            images.append((key, image))
        if len(rpc_users) > 1:
            raise OffloadError(
                f"{len(rpc_users)} image groups of {tid} use the GPU libc's RPC client ({RPC_CLIENT}: device printf,"
                f" malloc, I/O), in the groups of {rpc_users[0].objects[0]} and {rpc_users[1].objects[0]}; "
                "libomptarget 19 serves only the last image loaded on a device, so the others would wait forever: "
                "leave OFFLOAD_IMAGE_GROUPS off for this program")
        with open(partial_path(env, target[0]), "wb") as out:
            for data in linking.openmp_image_binaries(images, toolchain.major):
                out.write(data)
        with open(partial_path(env, target[1]), "w") as out:
            out.write("".join(f"{number}\n" for number in pool_users))
        for name in os.listdir(cache):  # what no group links any more
            if name not in used:
                os.unlink(os.path.join(cache, name))
    except OffloadError as error:
        raise SCons.Errors.BuildError(node=target[0], errstr=str(error)) from None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


def _run_link(env, tid: TargetID, argv: list[str], placeholder: str, node, group: image_groups.ImageGroup,
              scratch: str) -> None:
    """Run one group's device link to ``placeholder``; the caller moves it into the cache once complete. Its
    ``$TMPDIR`` is a directory of its own in the node's scratch directory ``scratch``, which the node removes
    when it ends and ``scons -c`` removes after a killed build."""
    if not SCons.Script.GetOption("silent"):
        print(" ".join(argv))
    with leftovers.private_tmpdir({k: str(v) for k, v in env["ENV"].items()}, scratch) as environ:
        done = subprocess.run(argv, env=environ, stderr=subprocess.PIPE, check=False)
    messages = done.stderr.decode(errors="replace")
    if messages:
        print(messages, end="")
    if done.returncode:
        if os.path.lexists(placeholder):
            os.unlink(placeholder)
        hint = device_libraries.missing_library_hint(messages, str(tid))
        raise SCons.Errors.BuildError(node=node, errstr=hint or (
            f"the device link of the image group of {', '.join(group.objects) or 'the static libraries'} failed "
            f"(exit status {done.returncode}); if it links without groups, OFFLOAD_IMAGE_GROUPS=False links the "
            "whole program in one image (and please report the program)"))


#: The GPU libc's RPC client, which the plugin sets up per image but serves for one image per device (LLVM 19:
#: ``RPCServerTy::initDevice`` keeps the last image's server in ``Handles[DeviceId]``).
RPC_CLIENT = "__llvm_libc_rpc_client"


def _check_entries(image: str, group: image_groups.ImageGroup, tid: TargetID, node) -> frozenset[str]:
    """Every entry the group's objects register must be in its image (see :func:`linking.missing_entries`);
    returns the names the image defines."""
    defined = linking.defined_symbols(image) if os.path.getsize(image) else None
    if defined is None:
        return frozenset()
    from offload_builders.linking.registration import REQUIRES_ENTRY_NAMES

    absent = [name for name in group.entries if name not in defined and name not in REQUIRES_ENTRY_NAMES]
    if absent:
        raise SCons.Errors.BuildError(node=node, errstr=(
            f"{', '.join(group.objects)}: register the offload entry {absent[0]}, which the {tid} image of their"
            " group does not define: the objects and that device code were compiled from different files; build"
            " again"))
    return defined


def offload_group_wrap(target, source, env) -> int:
    """``$OFFLOAD_WRAPCOM`` of a program with image groups: the registration object of its groups (sources: the
    group-link nodes' image files, their heap files, the plan)."""
    try:
        data = group_registration(target, source, env)
    except OffloadError as error:
        raise SCons.Errors.BuildError(node=target[0], errstr=str(error)) from None
    with open(partial_path(env, target[0]), "wb") as f:
        f.write(data)
    return 0


#: What the group links read besides their files: as the device link's command.
GROUPLINK_VARLIST = ("OFFLOAD_TARGET", "OFFLOAD_CLANG", "OFFLOAD_DEVICE_LINKFLAGS", "_OFFLOAD_TARGET_LINKFLAGS",
                     "_LIBDIRFLAGS", "_LIBFLAGS")
#: The plan's signature: the targets, the compiler, and the grouping rules' version (image_groups.PLAN_VERSION:
#: a change of the rules regroups trees built before).
GROUPS_VARLIST = ("OFFLOAD_CLANG", "_OFFLOAD_WRAP_TARGETS", "_OFFLOAD_GROUPS_VERSION")
GROUPS_IN_PROCESS = in_process_action(offload_groups, "GROUPS", GROUPS_VARLIST, name="image group plan", version=1,
                                      covers=["offload_builders.linking.image_groups",
                                              "offload_builders.scons.link_nodes:scanned_inputs",
                                              "offload_builders.linking.device_link"])
GROUPLINK_IN_PROCESS = in_process_action(
    offload_group_link, "GROUPLINK", GROUPLINK_VARLIST, name="image group link", version=1,
    covers=["offload_builders.scons.groups:_run_link", "offload_builders.scons.groups:_check_entries",
            "offload_builders.scons.link_nodes:device_link_argv", "offload_builders.linking.image_groups",
            "offload_builders.linking.device_link", "offload_builders.linking.inputs",
            "offload_builders.linking.registration", "offload_builders.formats.offload_binary"])
GROUP_WRAP_IN_PROCESS = in_process_action(
    offload_group_wrap, "WRAP", ("OFFLOAD_CLANG", "_OFFLOAD_WRAP_TARGETS", "_OFFLOAD_GROUP_PLAN"),
    name="image group registration", version=1,
    covers=["offload_builders.scons.groups:group_registration", "offload_builders.scons.groups:_check_memory_pools",
            "offload_builders.linking.image_groups", "offload_builders.linking.registration",
            "offload_builders.linking.group_registration", "offload_builders.linking.registration_ir",
            "offload_builders.linking.registration_codegen"])
_GROUPS_BUILDER = SCons.Builder.Builder(action=function_phase("GROUPS", varlist=GROUPS_VARLIST),
                                        emitter=CLEAN_LEFTOVERS)
_GROUPLINK_BUILDER = SCons.Builder.Builder(action=function_phase("GROUPLINK", varlist=GROUPLINK_VARLIST),
                                           emitter=clean_leftovers([".inputs", CACHE_SUFFIX]))


def program_group_nodes(env, program, inputs, targets: Sequence[TargetID], wrap_builder, **wrap_overrides) -> list:
    """The link side of a program with image groups: per target an extract node, one plan node, per target a
    group-link node, one wrap node (which the program depends on and records). Returns the group-link nodes,
    in the order of ``targets``."""
    major = toolchain_for(env).major
    if major != 19:
        raise SCons.Errors.UserError(
            f"{program}: OFFLOAD_IMAGE_GROUPS is checked against libomptarget 19's loader (its heap, RPC and entry "
            f"tables), and this toolchain is LLVM {major}: leave it off for this program")
    stem, directory = program.name, program.dir
    labels = tuple(str(tid) for tid in targets)
    extracts = []
    for tid in targets:
        names = {"program": stem, "target": tid.file_token}
        extracts.extend(EXTRACT_BUILDER(env, [directory.File(node_name(Phase.EXTRACT, OPENMP, LINK, **names))],
                                        inputs, OFFLOAD_TARGET=tid))
    plan = _GROUPS_BUILDER(env, [directory.File(node_name(Phase.GROUPS, OPENMP, LINK, program=stem))],
                           extracts + list(inputs), _OFFLOAD_WRAP_TARGETS=labels,
                           _OFFLOAD_GROUPS_VERSION=image_groups.PLAN_VERSION)
    images, heaps = [], []
    for tid, extract in zip(targets, extracts):
        names = {"program": stem, "target": tid.file_token}
        name = node_name(Phase.GROUPLINK, OPENMP, LINK, **names)
        image = _GROUPLINK_BUILDER(env, [directory.File(name), directory.File(name + POOL_FILE_SUFFIX)],
                                   [extract, plan[0]], OFFLOAD_TARGET=tid)
        program_run = probe_device_link(image[0], tid)
        if program_run is not None:  # the linker, as the compile nodes name their programs
            depend_on_stamps(image, [program_run])
        images.append(image[0])
        heaps.append(image[1])
    wrapper_name = node_name(Phase.WRAP, OPENMP, LINK, program=stem, obj=env.subst("$OBJSUFFIX"))
    wrapper = wrap_builder(env, [directory.File(wrapper_name)], images + heaps + [plan[0]],
                           # the node, not its path: read in a variant directory, str() is relative to it
                           _OFFLOAD_WRAP_TARGETS=labels, _OFFLOAD_GROUP_PLAN=plan[0], **wrap_overrides)
    program.attributes.offload_wrapper = wrapper[0]
    env.Depends(program, wrapper)
    return images


def _check_memory_pools(plan: image_groups.GroupPlan, heap_files: Sequence[str]) -> int | None:
    """The one group whose AMDGPU images use the device heap, or None; more than one stops the link.

    libomptarget 19's plugin gives each image it loads a heap (``GenericDeviceTy::setupDeviceMemoryPool``, 512 MiB
    on AMDGPU) and first frees the heap of the image loaded before on that device, which that image's runtime
    still bumps through: device ``malloc``, dynamic schedules, tasks and the runtime's other allocations in its
    kernels would use freed memory. Images load in registration order, so one group using the heap is safe when
    registered last; two are not."""
    users: set[int] = set()
    for path in heap_files:
        try:
            with open(path) as f:
                users.update(int(line) for line in f.read().split())
        except (OSError, ValueError) as error:
            raise OffloadError(f"{path}: not a list of image groups ({error}); build again") from None
    if len(users) > 1:
        first, second = sorted(users)[:2]
        raise OffloadError(
            f"{len(users)} image groups use the AMDGPU device heap ({image_groups.MEMORY_POOL}: device malloc, "
            f"dynamic schedules, tasks), the groups of {plan.groups[first].objects[0]} and "
            f"{plan.groups[second].objects[0]}; libomptarget 19 frees an image's heap when it loads the next image "
            "on the device: leave OFFLOAD_IMAGE_GROUPS off for this program")
    return users.pop() if users else None


def group_registration(target, source, env) -> bytes:
    """The wrap node's object for a program with groups: per group a descriptor of its images (one per
    target, each group-link node's binary of that group) and its entries."""
    from offload_builders.formats.offload_binary import read_offload_binaries
    from offload_builders.linking import registration

    labels = list(env["_OFFLOAD_WRAP_TARGETS"])
    plan = image_groups.read_plan(_plan_path(env))
    major = toolchain_for(env).major
    if not plan.groups:  # nothing registers an entry: OpenMP's empty descriptor, as without groups
        return registration.wrap_kinds([(registration.OPENMP, [])], llvm_version=major)
    per_target = []
    for label, node in zip(labels, source):
        path = str(node)
        with open(path, "rb") as f:
            data = f.read()
        binaries = read_offload_binaries(path, path=path) if data else []
        if len(binaries) != len(plan.groups):
            raise OffloadError(f"{path}: {len(binaries)} images for {len(plan.groups)} groups; build again")
        per_target.append((linking.group_key(parse_target_id(label)),
                           [data[binary.offset:binary.end] for binary in binaries]))
    # The wrapper's image order within a descriptor: triple descending, then arch.
    per_target.sort(key=lambda item: item[0][1])
    per_target.sort(key=lambda item: item[0][0], reverse=True)
    groups = [([images[number] for _, images in per_target], list(group.entries))
              for number, group in enumerate(plan.groups)]
    heap = _check_memory_pools(plan, [str(node) for node in source[len(labels):2 * len(labels)]])
    if heap is not None:  # registered last, so its image is loaded last: see _check_memory_pools
        groups.append(groups.pop(heap))
    return registration.wrap_openmp_groups(groups, llvm_version=major)


__all__ = ["GROUPLINK_IN_PROCESS", "GROUPS_IN_PROCESS", "GROUP_WRAP_IN_PROCESS", "group_registration",
           "offload_group_link", "offload_group_wrap", "offload_groups", "program_group_nodes"]
