"""The ``offload`` SCons tool's construction variables, each declared once: name, default, meaning, and the
documentation page whose variable table lists it.

SCons declares each of its tools' variables once (the ``<cvar>`` entries its manual is generated from). So does
this list: the modules that set defaults take them from it (:func:`defaults_of`), and
``tests/test_construction_variables.py`` checks the documentation's tables and a loaded tool against it.

Below every other module of :mod:`offload_builders.scons` (:mod:`~offload_builders.scons.variables` included): it
imports none of them and nothing of SCons, only the standard library and the core phase table.
"""
from __future__ import annotations

import copy
import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from offload_builders.phase_table import COMPILE, HIP, LINK, OPENMP, Default, Phase, row

#: The documentation pages (under ``docs/``) whose ``| variable | default | meaning |`` tables list the variables.
SCONS_TOOL_PAGE = "scons-tool.md"
HIP_PAGE = "hip.md"
CUDA_PAGE = "cuda.md"
REMOTE_PAGE = "remote.md"

#: The modules of :mod:`offload_builders.scons` that set defaults, each in its ``generate`` (the module's name).
SET_BY_TOOL = "tool"
SET_BY_OPENMP = "openmp"
SET_BY_PROGRAM = "program"
SET_BY_HIP = "hip"
SET_BY_CUDA = "cuda"


class Marker(enum.Enum):
    """A default that is no value of this list's."""

    COMPUTED = "computed as the tool loads"  # from the toolchain found or other variables: the setter computes it
    UNSET = "never set by the tool"  # read where the user sets it; default_text says what unset means


COMPUTED = Marker.COMPUTED
UNSET = Marker.UNSET


@dataclass(frozen=True)
class ModuleObject:
    """A default that is an object of the module that sets it (an in-process action, a class), by its name there."""

    name: str


@dataclass(frozen=True)
class ConstructionVariable:
    """One variable: ``default`` is the value the tool sets where the user has not (a list becomes a ``CLVar``),
    a :class:`ModuleObject`, :data:`COMPUTED` or :data:`UNSET`; ``default_text`` is the documentation table's
    default where it is not the value's ``repr`` as code."""

    name: str
    default: Any = field(hash=False)
    meaning: str
    page: str
    set_by: str | None  # the SET_BY_* module whose generate sets it; None: UNSET, the tool only reads it
    default_text: str = ""

    def __post_init__(self) -> None:
        if (self.default is UNSET) != (self.set_by is None):
            raise ValueError(f"{self.name}: a variable the tool never sets has no setter, and only it")
        if isinstance(self.default, (Marker, ModuleObject)) and not self.default_text:
            raise ValueError(f"{self.name}: a default that is no value needs its default_text")

    @property
    def documented_default(self) -> str:
        """The default as the documentation's table writes it."""
        return self.default_text or f"`{self.default!r}`"


def _phase_default(phase: Phase, model: str = OPENMP, side: str = COMPILE) -> Any:
    """``$OFFLOAD_<PHASE>COM``'s default as the phase table declares it: the command as written, or the in-process
    action of the module that sets it."""
    spec = row(phase, model, side)
    return spec.default if spec.default_kind is Default.COMMAND else ModuleObject(spec.default)


def _phase_message(phase: Phase) -> str:
    """``$OFFLOAD_<PHASE>COMSTR``'s default as the phase table declares it (OpenMP's link side)."""
    return row(phase, OPENMP, LINK).message


#: The documentation's default of the phase commands, which its own section describes.
PHASE_COMMANDS = "see [Phase commands](#phase-commands)"
#: The documentation's default of a variable the tool reads as a construction variable, else from the environment.
FROM_THE_ENVIRONMENT = "the environment variable"
#: The phase commands' meaning.
_PHASE_COMMAND = "the command of the {} phase (its message: the ``COMSTR`` variable of the same name)"

#: Every variable, each once. A setter's own are in the order its ``generate`` sets them; the ones the tool only
#: reads come last.
VARIABLES: tuple[ConstructionVariable, ...] = (
    # offload_builders.scons.tool
    ConstructionVariable("CACHEDIR_CLASS", ModuleObject("JournalingCacheDir"),
                         "SCons' CacheDir class: ours journals each retrieval, as each output is journaled",
                         SCONS_TOOL_PAGE, SET_BY_TOOL, "`JournalingCacheDir`"),
    ConstructionVariable("OFFLOAD_CC", COMPUTED, "the C driver: the clang found", SCONS_TOOL_PAGE, SET_BY_TOOL,
                         "found"),
    ConstructionVariable("OFFLOAD_CXX", COMPUTED,
                         "the C++ driver, which links: the clang++ beside the clang found, else it in g++ mode",
                         SCONS_TOOL_PAGE, SET_BY_TOOL, "found"),
    ConstructionVariable("OFFLOAD_MODEL", "openmp", "the model of C and C++ sources, read per source",
                         SCONS_TOOL_PAGE, SET_BY_TOOL),
    ConstructionVariable("OFFLOAD_RDC", None, "relocatable device code (HIP and CUDA); None: off",
                         SCONS_TOOL_PAGE, SET_BY_TOOL, "`None` (off)"),
    ConstructionVariable("OFFLOAD_ARCHS", ["x86_64"], "the target IDs of the project", SCONS_TOOL_PAGE, SET_BY_TOOL),
    ConstructionVariable("OFFLOAD_FLAGS", [], "driver flags of every offload compile", SCONS_TOOL_PAGE,
                         SET_BY_TOOL),
    ConstructionVariable("OFFLOAD_TARGET_FLAGS", {}, "{target ID: flags} of that target's device compiles",
                         SCONS_TOOL_PAGE, SET_BY_TOOL),
    ConstructionVariable("OFFLOAD_LINKFLAGS", COMPUTED, "host link flags", SCONS_TOOL_PAGE, SET_BY_TOOL,
                         "`['-fuse-ld=lld']` if `ld.lld` is installed and `$LINKFLAGS` chooses no linker, else `[]`"),
    ConstructionVariable("OFFLOAD_PARTIAL_SUFFIX", ".partial",
                         "the suffix of the file a command writes, renamed into place on success",
                         SCONS_TOOL_PAGE, SET_BY_TOOL),
    ConstructionVariable("OFFLOAD_PROBE_CACHE", ".sconsign.offload-probes.json",
                         "the driver probes' cache, relative to the top directory; '' disables it",
                         SCONS_TOOL_PAGE, SET_BY_TOOL),
    ConstructionVariable("OFFLOAD_HOSTCOM", _phase_default(Phase.HOST), _PHASE_COMMAND.format("host"),
                         SCONS_TOOL_PAGE, SET_BY_TOOL, PHASE_COMMANDS),
    ConstructionVariable("OFFLOAD_DEVICECOM", _phase_default(Phase.DEVICE), _PHASE_COMMAND.format("device compile"),
                         SCONS_TOOL_PAGE, SET_BY_TOOL, PHASE_COMMANDS),
    ConstructionVariable("OFFLOAD_ASSEMBLECOM", _phase_default(Phase.ASSEMBLE), _PHASE_COMMAND.format("ptxas"),
                         SCONS_TOOL_PAGE, SET_BY_TOOL, PHASE_COMMANDS),
    ConstructionVariable("OFFLOAD_EMBEDCOM", _phase_default(Phase.EMBED), _PHASE_COMMAND.format("OpenMP embed"),
                         SCONS_TOOL_PAGE, SET_BY_TOOL, PHASE_COMMANDS),
    ConstructionVariable("OFFLOAD_ARCOM", _phase_default(Phase.AR, side=LINK),
                         _PHASE_COMMAND.format("static library"), SCONS_TOOL_PAGE, SET_BY_TOOL, PHASE_COMMANDS),
    ConstructionVariable("OFFLOAD_DEVICELINKCOM", _phase_default(Phase.DEVICELINK, side=LINK),
                         _PHASE_COMMAND.format("device link (a program's per target, a HIP object's)"),
                         SCONS_TOOL_PAGE, SET_BY_TOOL, PHASE_COMMANDS),
    ConstructionVariable("OFFLOAD_LINKCOM", _phase_default(Phase.LINK, side=LINK), _PHASE_COMMAND.format("host link"),
                         SCONS_TOOL_PAGE, SET_BY_TOOL, PHASE_COMMANDS),
    ConstructionVariable("OFFLOAD_RUNTIMESYMSCOMSTR", _phase_message(Phase.RUNTIMESYMS),
                         "the message of the NVPTX device runtime's interface node", SCONS_TOOL_PAGE, SET_BY_TOOL),
    ConstructionVariable("OFFLOAD_RUNTIMELINKCOMSTR", _phase_message(Phase.RUNTIMELINK),
                         "the message of the NVPTX device runtime's link node", SCONS_TOOL_PAGE, SET_BY_TOOL),
    ConstructionVariable("OFFLOAD_DEVICE_LINKFLAGS", ["$_OFFLOAD_DEVICE_LINK_LEVEL"],
                         "flags of every device link; the default is the link's -O level", SCONS_TOOL_PAGE,
                         SET_BY_TOOL, "`['$_OFFLOAD_DEVICE_LINK_LEVEL']`: the link's `-O` level"),
    ConstructionVariable("OFFLOAD_TARGET_LINKFLAGS", {}, "{target ID: flags} of that target's device links",
                         SCONS_TOOL_PAGE, SET_BY_TOOL),
    ConstructionVariable("OFFLOAD_DEPLOY_DEVICES", [], "devices each of which a program must have an image for",
                         SCONS_TOOL_PAGE, SET_BY_TOOL),
    ConstructionVariable("OFFLOAD_CUDA_RUNTIME", None,
                         "the libraries a program with CUDA code links for the CUDA runtime; None: libcudart",
                         SCONS_TOOL_PAGE, SET_BY_TOOL),
    # offload_builders.scons.openmp
    ConstructionVariable("OFFLOAD_PACKAGECOM", _phase_default(Phase.PACKAGE), _PHASE_COMMAND.format("package"),
                         SCONS_TOOL_PAGE, SET_BY_OPENMP, PHASE_COMMANDS),
    # offload_builders.scons.program
    ConstructionVariable("OFFLOAD_EXTRACTCOM", _phase_default(Phase.EXTRACT, side=LINK),
                         _PHASE_COMMAND.format("extract"), SCONS_TOOL_PAGE, SET_BY_PROGRAM, PHASE_COMMANDS),
    ConstructionVariable("OFFLOAD_WRAPCOM", _phase_default(Phase.WRAP, side=LINK), _PHASE_COMMAND.format("wrap"),
                         SCONS_TOOL_PAGE, SET_BY_PROGRAM, PHASE_COMMANDS),
    ConstructionVariable("OFFLOAD_RUNTIMESYMSCOM", _phase_default(Phase.RUNTIMESYMS, side=LINK),
                         _PHASE_COMMAND.format("NVPTX device runtime interface"), SCONS_TOOL_PAGE, SET_BY_PROGRAM,
                         PHASE_COMMANDS),
    ConstructionVariable("OFFLOAD_RUNTIMELINKCOM", _phase_default(Phase.RUNTIMELINK, side=LINK),
                         _PHASE_COMMAND.format("NVPTX device runtime link"), SCONS_TOOL_PAGE, SET_BY_PROGRAM,
                         PHASE_COMMANDS),
    ConstructionVariable("OFFLOAD_GROUPSCOM", _phase_default(Phase.GROUPS, side=LINK),
                         _PHASE_COMMAND.format("image groups"), SCONS_TOOL_PAGE, SET_BY_PROGRAM, PHASE_COMMANDS),
    ConstructionVariable("OFFLOAD_GROUPLINKCOM", _phase_default(Phase.GROUPLINK, side=LINK),
                         _PHASE_COMMAND.format("group device links"), SCONS_TOOL_PAGE, SET_BY_PROGRAM,
                         PHASE_COMMANDS),
    # offload_builders.scons.hip
    ConstructionVariable("OFFLOAD_HIP_FLAGS", [], "driver flags of every HIP compile", HIP_PAGE, SET_BY_HIP),
    ConstructionVariable("OFFLOAD_HIP_RUNTIME", None,
                         "the libraries a HIP program links for the HIP runtime; None: the installation's libamdhip64",
                         HIP_PAGE, SET_BY_HIP),
    ConstructionVariable("OFFLOAD_HIP_CUID", "$_OFFLOAD_HIP_DEFAULT_CUID",
                         "the -cuid of a HIP source's compiles, substituted per source", HIP_PAGE, SET_BY_HIP),
    ConstructionVariable("OFFLOAD_HIP_RDC", None, "the old name of $OFFLOAD_RDC; None: unset", HIP_PAGE, SET_BY_HIP),
    ConstructionVariable("OFFLOAD_HIP_COMPRESS", None,
                         "the CCOB format version (2 or 3) of a compressed fat binary; None: as the flags ask",
                         HIP_PAGE, SET_BY_HIP),
    ConstructionVariable("OFFLOAD_HIP_COMPRESSION_LEVEL", None,
                         "the fat binary's zstd level; None: the flags' or the bundler's default", HIP_PAGE,
                         SET_BY_HIP),
    ConstructionVariable("OFFLOAD_BUNDLECOM", _phase_default(Phase.BUNDLE, HIP),
                         "the fat binary's command: the in-process bundle writer (CUDA nodes: the toolkit's "
                         "fatbinary while it is that)", HIP_PAGE, SET_BY_HIP, "the in-process bundle writer"),
    # offload_builders.scons.cuda
    ConstructionVariable("OFFLOAD_CUDA_FLAGS", [], "driver flags of every CUDA compile", CUDA_PAGE, SET_BY_CUDA),
    ConstructionVariable("OFFLOAD_CUDA_CUID", "$_OFFLOAD_CUDA_DEFAULT_CUID",
                         "the -cuid of a CUDA source's compiles, substituted per source", CUDA_PAGE, SET_BY_CUDA),
    # Read only: the tool sets no default.
    ConstructionVariable("OFFLOAD_CLANG", UNSET, "the Clang to use; unset: $OFFLOAD_CLANG of the environment, then"
                         " a search", SCONS_TOOL_PAGE, None, "search"),
    ConstructionVariable("OFFLOAD_RPATH", UNSET, "the program's run-time search path for libomptarget",
                         SCONS_TOOL_PAGE, None, "the LLVM lib directory"),
    ConstructionVariable("OFFLOAD_IMAGE_GROUPS", UNSET, "OpenMP programs: one device image per group of objects",
                         SCONS_TOOL_PAGE, None, "`False`"),
    ConstructionVariable("OFFLOAD_NVPTX_RUNTIME_NODE", UNSET,
                         "OpenMP NVPTX programs: the device runtime's link a node of its own", SCONS_TOOL_PAGE,
                         None, "`True`"),
    ConstructionVariable("OFFLOAD_AMDGPU_ARCH_TOOL", UNSET, "the amdgpu-arch that `native` asks", SCONS_TOOL_PAGE,
                         None, "the toolchain's"),
    ConstructionVariable("OFFLOAD_NVPTX_ARCH_TOOL", UNSET, "the nvptx-arch that `native` asks", SCONS_TOOL_PAGE,
                         None, "the toolchain's"),
    ConstructionVariable("OFFLOAD_ARCHLISTCOMSTR", UNSET, "the message of CUDA's __CUDA_ARCH_LIST__ check nodes",
                         CUDA_PAGE, None, "its command"),
    ConstructionVariable("OFFLOAD_REMOTE", UNSET, "the remote cache's URL", REMOTE_PAGE, None, FROM_THE_ENVIRONMENT),
    ConstructionVariable("OFFLOAD_REMOTE_EXECUTE", UNSET, "the remote execution service's URL", REMOTE_PAGE, None,
                         FROM_THE_ENVIRONMENT),
    *(ConstructionVariable(f"OFFLOAD_REMOTE_{setting}", UNSET, "a setting of the remote cache and execution",
                           REMOTE_PAGE, None, FROM_THE_ENVIRONMENT)
      for setting in ("INSTANCE", "CA", "CERT", "KEY", "HEADERS", "HEADER_FILE", "TIMEOUT", "RETRIES", "MAX_BLOB",
                      "EXECUTE_TIMEOUT", "PLATFORM", "UPLOAD")),
)

#: The variables by name.
BY_NAME: Mapping[str, ConstructionVariable] = MappingProxyType({variable.name: variable for variable in VARIABLES})

_NOTHING: Mapping[str, Any] = MappingProxyType({})


def variables_set_by(set_by: str) -> tuple[ConstructionVariable, ...]:
    """The variables the module ``set_by`` (a ``SET_BY_*``) sets, in the order it sets them."""
    return tuple(variable for variable in VARIABLES if variable.set_by == set_by)


def defaults_of(set_by: str, module_objects: Mapping[str, Any] = _NOTHING,
                computed: Mapping[str, Any] = _NOTHING) -> dict[str, Any]:
    """The defaults the module ``set_by`` sets, in its order, each where the user has not set the variable: a value
    of this list as a copy of its own (an environment may change it in place), a :class:`ModuleObject` as that
    name of ``module_objects`` (the setter's ``globals()``), a :data:`COMPUTED` one as ``computed[variable name]``,
    which holds exactly the setter's computed variables."""
    own = variables_set_by(set_by)
    expected = {variable.name for variable in own if variable.default is COMPUTED}
    if set(computed) != expected:
        raise ValueError(f"{set_by} computes the defaults of {sorted(expected)}, not {sorted(computed)}")
    defaults: dict[str, Any] = {}
    for variable in own:
        if variable.default is COMPUTED:
            defaults[variable.name] = computed[variable.name]
        elif isinstance(variable.default, ModuleObject):
            if variable.default.name not in module_objects:
                raise ValueError(f"{variable.name}'s default {variable.default.name} is not an object of {set_by}")
            defaults[variable.name] = module_objects[variable.default.name]
        else:
            defaults[variable.name] = copy.deepcopy(variable.default)
    return defaults


__all__ = ["BY_NAME", "COMPUTED", "CUDA_PAGE", "FROM_THE_ENVIRONMENT", "HIP_PAGE", "PHASE_COMMANDS", "REMOTE_PAGE",
           "SCONS_TOOL_PAGE", "SET_BY_CUDA", "SET_BY_HIP", "SET_BY_OPENMP", "SET_BY_PROGRAM", "SET_BY_TOOL", "UNSET",
           "VARIABLES", "ConstructionVariable", "Marker", "ModuleObject", "defaults_of", "variables_set_by"]
