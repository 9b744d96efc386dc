"""The link side of a program that every model shares: the scan of the link inputs (once per build; their offload
kinds also remembered per user), per target an extract node and a device-link node (:data:`EXTRACT_BUILDER`,
:data:`DEVICE_LINK_BUILDER`: the device link's command, its probe at read time and its hint for a missing device
library), the static libraries a program links, the checks around the host link (:func:`check_registered_entries`,
:func:`check_deployable`), and :func:`program_link_nodes`, which declares them for a program.
:mod:`offload_builders.scons.program` and :mod:`offload_builders.scons.groups` build on it.
"""
from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Callable, Sequence
from typing import Any

import SCons.Action
import SCons.Builder
import SCons.Errors
import SCons.Node.FS
import SCons.Subst
import SCons.Util
import SCons.Warnings

from offload_builders import device_libraries, leftovers, linking
from offload_builders.errors import OffloadError
from offload_builders.phase_table import LINK, Phase, node_name
from offload_builders.scons.actions import SHELL_SPAWN, PhaseCommandAction, function_phase, spawn_keeping_stderr
from offload_builders.scons.outputs import CLEAN_LEFTOVERS, clean_leftovers, partial_path
from offload_builders.scons.rendering import Renderer
from offload_builders.scons.variables import (
    deploy_devices,
    node_target,
    probe_cache_for,
    target_flags,
    toolchain_for,
    user_error,
)
from offload_builders.scons.versioned_actions import versioned_action
from offload_builders.targets import TargetID


class OffloadLinkWarning(SCons.Warnings.WarningOnByDefault):
    """A link-time offload problem that does not stop the build (a target with no device code)."""


def static_libraries(env) -> list:
    """The static libraries ``$LIBS`` names, found in ``$LIBPATH`` as the linker would (shared ones have no
    device code to extract)."""
    dirs = tuple(env.Dir(d) for d in SCons.Util.flatten(env.subst_list("$LIBPATH")[0] if env.get("LIBPATH") else []))
    prefix, suffix = env.subst("$LIBPREFIX"), env.subst("$LIBSUFFIX")
    found = []
    for lib in SCons.Util.flatten(env.get("LIBS", [])):
        if not isinstance(lib, str):
            if str(lib).endswith(suffix):
                found.append(lib)
            continue
        name = env.subst(lib)
        if os.sep in name or name.endswith(suffix):
            found.append(env.File(name))
            continue
        node = SCons.Node.FS.find_file(f"{prefix}{name}{suffix}", dirs)
        if node is not None:
            found.append(node)
    return found


_SCANS: dict[tuple, linking.ScannedInputs] = {}


def scanned_inputs(paths: Sequence[str]) -> linking.ScannedInputs:
    """Scan the link inputs once per build for all targets (keyed on the files' identity)."""
    key = _identity_key(paths)
    if key not in _SCANS:
        _SCANS.clear()
        _SCANS[key] = linking.scan_link_inputs(paths)
    return _SCANS[key]


def _identity_key(paths: Sequence[str]) -> tuple:
    """The files as they are now (path, modification time, size; a missing one by its path alone)."""
    key: list[tuple] = []
    for path in paths:
        try:
            status = os.stat(path)
        except OSError:
            key.append((path,))
        else:
            key.append((path, status.st_mtime_ns, status.st_size))
    return tuple(key)


_KINDS: dict[tuple, frozenset[str]] = {}


def input_offload_kinds(paths: Sequence[str], llvm_version: int) -> frozenset[str]:
    """:func:`offload_builders.linking.offload_kinds` of the link inputs, read once per build: SCons renders
    the host link's runtime (which depends on them) for its signature, its command scan and its run. The
    answer is also remembered per user by the inputs' absolute paths, sizes and modification times, so a
    no-op build reads no object (reading every object cost a no-op of 64 sources about 5%)."""
    key = (llvm_version, _identity_key(paths))
    if key not in _KINDS:
        from offload_builders.toolchain import user_cache

        cache = user_cache("link-input-kinds.json", max_entries=256)
        remembered = "link-input-kinds-v1:" + hashlib.blake2b(
            repr((llvm_version, [(os.path.abspath(entry[0]), *entry[1:]) for entry in key[1]])).encode(),
            digest_size=20).hexdigest()
        known = cache.get(remembered) if cache is not None else None
        if known is not None and len(known) == 1:
            _KINDS[key] = frozenset(known[0])
        else:
            _KINDS[key] = linking.offload_kinds(paths, llvm_version)
            if cache is not None:
                cache.put(remembered, (tuple(sorted(_KINDS[key])),))
    return _KINDS[key]


def extract_device_inputs(target, source, env, choose: Callable[..., list[linking.FoundBinary]]) -> int:
    """An extract node's action: scan the link inputs (once per build for all targets), let the model's
    ``choose(target, env, scanned, tid, key)`` pick one target's device files (it raises ``BuildError``
    for what stops the link), and write them to the node's device input file."""
    tid = node_target(env)
    try:
        files = choose(target, env, scanned_inputs([str(node) for node in source]), tid, linking.group_key(tid))
        linking.write_device_inputs(files, partial_path(env, target[0]))
    except OffloadError as error:
        raise SCons.Errors.BuildError(node=target[0], errstr=str(error)) from None
    return 0


def _inputs_dir(env, node) -> str:
    return str(node) + ".inputs"


def _unpack_device_inputs(target, source, env) -> int:
    """Unpack the device input file next to the image; with no device code the image is an empty file."""
    linking.load_wrapper_compiler()  # the wrap node follows: LLVM loads while the device link's process runs
    directory = _inputs_dir(env, target[0])
    _empty_directory(directory)
    try:
        paths = linking.unpack_device_inputs(str(source[0]), directory)
    except OffloadError as error:
        raise SCons.Errors.BuildError(node=target[0], errstr=str(error)) from None
    if not paths:
        open(partial_path(env, target[0]), "wb").close()
    return 0


def _remove_inputs_dir(target, source, env) -> int:
    directory = _inputs_dir(env, target[0])
    if _empty_directory(directory):
        os.rmdir(directory)
    return 0


def _empty_directory(directory: str) -> bool:
    """Delete what an unpacked-inputs directory holds (a killed link's ``$TMPDIR`` too); whether it exists."""
    if not os.path.isdir(directory):
        return False
    leftovers.remove_leftovers(os.path.join(directory, name) for name in os.listdir(directory))
    return True


class _DeviceLinkCommandAction(PhaseCommandAction):
    """``$OFFLOAD_DEVICELINKCOM``: a device link that fails on a device-library symbol (``__ocml_sin_f64``,
    ``__nv_sinf``) ends with one line naming the library and what to install, rather than only the linker's
    "undefined symbol" (see :func:`offload_builders.device_libraries.missing_library_hint`). Its messages
    still reach the terminal as they come; they are kept to be read once it fails."""

    def execute(self, target, source, env, executor=None):
        renderer = self.renderer(env)
        if env.get("SPAWN") is not SHELL_SPAWN or renderer is None:
            return super().execute(target, source, env, executor)
        messages: list[str] = []
        spawn = functools.partial(spawn_keeping_stderr, messages, _inputs_dir(env, target[0]) if target else None,
                                  shell_words=self.shell_words(renderer, target, source, env, executor))
        env = env.Override({"SPAWN": spawn, "ESCAPE": str})
        status = super().execute(target, source, env, executor)
        if status and messages:
            hint = device_libraries.missing_library_hint("".join(messages), env.subst("$OFFLOAD_TARGET"))
            if hint is not None and isinstance(status, SCons.Errors.BuildError):
                status.errstr = hint  # SCons prints it in place of "Error 1"
            elif hint is not None:
                return SCons.Errors.BuildError(node=target[0] if target else None, errstr=hint, status=status,
                                               exitstatus=status)
        return status


@Renderer
def device_link_cmd(target, source, env, for_signature):
    """The device link of one target; nothing to run when no input has device code for it."""
    tid = node_target(env)
    if for_signature:
        inputs = [str(source[0])]
    elif not os.path.exists(str(source[0])):
        # Not extracted yet (scons -n on a clean tree): the command as it will run, its inputs as a pattern.
        inputs = [os.path.join(_inputs_dir(env, target[0]), "*.o")]
    else:
        count = len(linking.read_device_inputs(str(source[0])))
        if count == 0:
            return []
        inputs = [os.path.join(_inputs_dir(env, target[0]), f"{index:03d}.o") for index in range(count)]
    return device_link_argv(env, tid, target, source, inputs, partial_path(env, target[0]), for_signature)


def device_link_argv(env, tid: TargetID, target, source, inputs: Sequence[str], output: str,
                     for_signature: bool = False) -> list[str]:
    """One device link of ``inputs`` to ``output`` with the flags of the node ``target``: the driver's own
    job, probed when the program was declared; the driver command if the flags differ now."""
    flags, host_libraries = _device_link_arguments(env, tid, target, source, for_signature)
    toolchain, key = toolchain_for(env), linking.group_key(tid)
    job = linking.known_device_link(toolchain, key, flags=flags, host_libraries=host_libraries)
    if job is not None:
        return linking.render_device_link(job, inputs, output, host_libraries)
    return linking.device_link_command(toolchain, key, inputs, output, flags=flags, host_libraries=host_libraries)


def _device_link_arguments(env, tid: TargetID, target, source, for_signature: bool) -> tuple[list[str], list[str]]:
    """The device-link flags and (for the host-CPU image, a shared object linked against the host's
    libraries) the library flags of one device-link node."""
    flags = [str(f) for f in env.subst_list("$OFFLOAD_DEVICE_LINKFLAGS $_OFFLOAD_TARGET_LINKFLAGS",
                                            SCons.Subst.SUBST_SIG if for_signature else SCons.Subst.SUBST_CMD,
                                            target=target, source=source)[0]]
    host_libraries = []
    if tid.kind == "host-cpu":
        host_libraries = [str(f) for f in env.subst_list("$_LIBDIRFLAGS $_LIBFLAGS", target=target, source=source)[0]]
    return flags, host_libraries


def probe_device_link(node, tid: TargetID) -> str | None:
    """Ask the driver, at read time, for the job of this device-link node (see :func:`device_link_cmd`);
    the program that job runs (None where the link runs the driver)."""
    executor = node.get_executor()
    env = executor.get_build_env()
    targets, sources = executor.get_all_targets(), executor.get_all_sources()
    program = None
    try:
        for for_signature in (True, False):
            flags, host_libraries = _device_link_arguments(env, tid, targets, sources, for_signature)
            job = linking.probe_device_link(toolchain_for(env), linking.group_key(tid), flags=flags,
                                            host_libraries=host_libraries, cache=probe_cache_for(env),
                                            warn=functools.partial(SCons.Warnings.warn, OffloadLinkWarning))
            program = str(job.argv[0]) if job is not None else None
    except OffloadError as error:
        raise user_error(error) from None
    return program


def device_link_level(target, source, env, for_signature):
    """The default of ``$OFFLOAD_DEVICE_LINKFLAGS``: the device link's ``-O``, as the driver maps the link line's
    ``-O`` to ``clang-linker-wrapper --opt-level`` (``$OFFLOAD_LINKFLAGS $LINKFLAGS``), else the compile's
    (``$OFFLOAD_FLAGS $CCFLAGS $CXXFLAGS``, and ``$OFFLOAD_HIP_FLAGS`` for HIP: a one-command build has it on
    its link line), else ``-O2``."""
    def words(text: str) -> list[str]:
        mode = SCons.Subst.SUBST_SIG if for_signature else SCons.Subst.SUBST_CMD
        return [str(word) for word in env.subst_list(text, mode, target=target, source=source)[0]]

    hip = " $OFFLOAD_HIP_FLAGS" if env.get("OFFLOAD_MODEL") == "hip" else ""
    return [linking.device_link_opt_flag(words("$OFFLOAD_LINKFLAGS $LINKFLAGS"),
                                         words("$OFFLOAD_FLAGS $CCFLAGS $CXXFLAGS" + hip))]


def target_link_flags(target, source, env, for_signature):
    """``$OFFLOAD_TARGET_LINKFLAGS[target]``: device-link flags for one target ID."""
    return target_flags(env, node_target(env), "OFFLOAD_TARGET_LINKFLAGS")


EXTRACT_BUILDER = SCons.Builder.Builder(action=function_phase("EXTRACT"), emitter=CLEAN_LEFTOVERS)


DEVICE_LINK_BUILDER = SCons.Builder.Builder(action=function_phase(
    "DEVICELINK",
    before=[versioned_action(_unpack_device_inputs, "unpack device inputs", 1,
                             covers=["offload_builders.linking.inputs"])],
    after=[versioned_action(_remove_inputs_dir, "remove device inputs", 1)], command=_DeviceLinkCommandAction),
    emitter=clean_leftovers([".inputs"]))  # _inputs_dir: the unpacked inputs, a scratch directory


def check_deployable(target, source, env) -> int:
    """Fail the link when a deployment device would find no image it can load (see ``offload-select``)."""
    devices = deploy_devices(env)
    if not devices:
        return 0
    from offload_builders.selection import check_deployment

    partial = partial_path(env, target[0])
    try:
        problems = check_deployment(partial, devices, llvm_version=toolchain_for(env).major)
        message = f"{target[0]}: not deployable: " + "; ".join(problems) if problems else ""
    except OffloadError as error:
        message = str(error)
    if message:
        if os.path.lexists(partial):
            os.unlink(partial)  # a program that is not deployable is not kept, not even as a leftover
        raise SCons.Errors.BuildError(node=target[0], errstr=message)
    return 0


def check_registered_entries(target, source, env) -> int:
    """Before the host link: every offload entry the program's objects register must be defined by every
    target's linked image (Clang links a program that fails at run time otherwise)."""
    images = getattr(target[0].attributes, "offload_images", ())
    objects = [str(SCons.Action.rfile(node)) for node in source]
    try:
        problems = linking.missing_entries(objects, [(label, str(node)) for label, node in images])
    except OffloadError as error:
        raise SCons.Errors.BuildError(node=target[0], errstr=str(error)) from None
    if problems:
        raise SCons.Errors.BuildError(node=target[0], errstr="\n".join(problems))
    return 0


#: The program's checks around its host link, as steps of its action (see :func:`check_registered_entries` and
#: :func:`check_deployable`).
CHECK_REGISTERED_ENTRIES = versioned_action(check_registered_entries, "check registered entries", 1,
                                            covers=["offload_builders.linking.inputs:missing_entries"])
CHECK_DEPLOYABLE = versioned_action(check_deployable, "check deployable", 1, varlist=["OFFLOAD_DEPLOY_DEVICES"],
                                    covers=["offload_builders.selection:check_deployment"])


def program_link_nodes(env, program, inputs, targets: Sequence[TargetID], model: str, wrap_builder, *,
                       probe: bool = False, **link_overrides: Any) -> list:
    """The link side of ``program`` both models share: per target ID, in the order given, an extract node
    over ``inputs`` and a device-link node (``link_overrides`` on it; ``probe``: ask the driver for its job
    now, see :func:`probe_device_link`), then one ``wrap_builder`` node over the images, which the program
    depends on and records (``offload_wrapper``). Node names are the phase table's for ``model``. Returns
    the images, in the order of ``targets``."""
    stem, directory = program.name, program.dir
    images = []
    for tid in targets:
        names = {"program": stem, "target": tid.file_token}
        device_inputs = EXTRACT_BUILDER(env, [directory.File(node_name(Phase.EXTRACT, model, LINK, **names))], inputs,
                                        OFFLOAD_TARGET=tid)
        image = DEVICE_LINK_BUILDER(env, [directory.File(node_name(Phase.DEVICELINK, model, LINK, **names))],
                                    device_inputs, OFFLOAD_TARGET=tid, **link_overrides)
        if probe:
            probe_device_link(image[0], tid)
        images.extend(image)
    wrapper_name = node_name(Phase.WRAP, model, LINK, program=stem, obj=env.subst("$OBJSUFFIX"))
    wrapper = wrap_builder(env, [directory.File(wrapper_name)], images,
                           _OFFLOAD_WRAP_TARGETS=tuple(str(tid) for tid in targets))
    program.attributes.offload_wrapper = wrapper[0]
    env.Depends(program, wrapper)
    return images
