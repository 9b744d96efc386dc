"""The phase model: Clang's OpenMP offload compile, split into one command per phase.

For a source S and targets T the monolithic driver runs, inside one process:

* host front end: S -> host bitcode (once, whatever T is);
* device compile, one per target ID: (S, host bitcode) -> device code, via ``-fopenmp-host-ir-file-path``;
* assemble (NVPTX only): PTX -> cubin with ``ptxas``;
* package: all device outputs -> one offload binary (``clang-offload-packager``);
* embed: (host bitcode, package) -> the fat object with its ``.llvm.offloading`` section.

We do not re-invent those command lines: :class:`PhaseModel` asks the installed driver (``clang -###``)
once per configuration, classifies the jobs it prints, and turns each into a :class:`CommandTemplate`
whose input and output paths are named slots. So our per-phase commands are exactly the driver's own
``-cc1`` jobs, and they stay right when the driver changes its flags.

Two facts make per-target build nodes possible, and the tests check both against the real driver:

* the host bitcode does not depend on which device triples ``-fopenmp-targets`` lists, so the host
  front end gets one fixed list (:data:`HOST_OFFLOAD_TRIPLES`) and adding a target never re-runs it;
* the device job of one target does not depend on the other targets, so each target is probed alone.

The driver itself is asked through the shared layer, :mod:`offload_builders.driver`. This module has no SCons
imports; the SCons tool and the CLIs are thin layers over it.
"""
from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from offload_builders.driver import (
    COMPILATION_DIR_FLAGS,
    PREFIX_MAP_FLAGS,
    SIGNATURE_TOP,
    Arg,
    CommandTemplate,
    JobList,
    ProbeError,
    Slot,
    dependency_values,
    driver_errors,
    image_spec,
    job_template,
    portable_signature,
    probe,
    quote_make_target,
    remembered_jobs,
    run_driver,
    target_selection_flags,
)
from offload_builders.errors import ToolchainError
from offload_builders.job_words import is_cc1, parse_driver_jobs, tool_name, value_after
from offload_builders.models.base import BasePhaseModel
from offload_builders.targets import (
    AMDGPU_PROCESSORS,
    AMDGPU_TRIPLE,
    HOST_CPU_TRIPLE,
    NVPTX_TRIPLE,
    TargetID,
    generic_target_problem,
)
from offload_builders.toolchain import ProbeCache

#: The shared driver layer's names, still importable from here (the OpenMP model was their first home).
__all__ = [
    "COMPILATION_DIR_FLAGS", "PREFIX_MAP_FLAGS", "SIGNATURE_TOP", "Arg", "CommandTemplate", "JobList", "ProbeError",
    "ProbeCache", "Slot", "dependency_values", "driver_errors", "parse_driver_jobs", "portable_signature", "probe",
    "quote_make_target", "remembered_jobs", "run_driver", "target_selection_flags",
    "HOST_OFFLOAD_TRIPLES", "LANGUAGE_BY_SUFFIX", "DeviceSteps", "HostSteps", "PhaseModel", "language_of",
    "selection_flags",
]

#: The device triples every host compile declares. Host IR is identical for any non-empty list,
#: so a fixed list keeps the host front end's command (and its cache key) independent of $OFFLOAD_ARCHS.
HOST_OFFLOAD_TRIPLES: tuple[str, ...] = (AMDGPU_TRIPLE, NVPTX_TRIPLE, HOST_CPU_TRIPLE)

#: Source suffix -> the language the driver is told (``-x``).
LANGUAGE_BY_SUFFIX: Mapping[str, str] = {
    ".c": "c",
    ".cpp": "c++",
    ".cc": "c++",
    ".cxx": "c++",
    ".c++": "c++",
    ".C": "c++",
}


@dataclass(frozen=True)
class DeviceSteps:
    """Everything one target contributes to one source's fat object."""

    target: TargetID
    compile: CommandTemplate        # slots: source, main_file_name, host_bc, output
    compile_suffix: str             # ".bc" (AMDGPU), ".s" (NVPTX PTX), ".o" (host-CPU object)
    assemble: CommandTemplate | None  # NVPTX: ptxas, slots: input, output
    image_suffix: str               # what goes into the package: ".bc", ".o"
    image_spec: tuple[str, ...]     # the packager's key=value pairs except file=, in the driver's order


@dataclass(frozen=True)
class HostSteps:
    frontend: CommandTemplate       # slots: source, main_file_name, output
    embed: CommandTemplate          # slots: host_bc, main_file_name, package, output


def language_of(source: str) -> str:
    """Return the driver language for ``source`` from its suffix, or raise naming the file."""
    suffix = os.path.splitext(source)[1]
    try:
        return LANGUAGE_BY_SUFFIX[suffix]
    except KeyError:
        raise ToolchainError(
            f"{source}: cannot tell the language from the suffix {suffix!r};"
            f" offload sources end in one of {', '.join(sorted(LANGUAGE_BY_SUFFIX))}"
        ) from None


def selection_flags(target: TargetID) -> tuple[str, ...]:
    """The driver flags that make a compile offload to ``target`` alone."""
    if target.kind == "host-cpu":
        return (f"-fopenmp-targets={target.triple}",)
    return (f"--offload-arch={target}",)



def _family_example(generic: str) -> str:
    """Two processors of ``generic``'s family, for an error's hint."""
    members = [p.name for p in AMDGPU_PROCESSORS if p.generic == generic]
    return ",".join(members[:2]) or "gfx90a"


class PhaseModel(BasePhaseModel):
    """Per-phase OpenMP command templates for one toolchain, derived from its driver and memoized.

    ``cwd`` is the directory the commands will run in (the driver records it in debug info);
    ``cache``, when given, keeps probe results across processes.
    """

    def driver(self, language: str) -> str:
        return str(self.toolchain.clangxx if language == "c++" else self.toolchain.clang)

    def _jobs(self, language: str, flags: Iterable[str]) -> tuple[tuple[str, ...], ...]:
        return probe(self.driver(language), language, tuple(flags), self.cwd, self.cache)

    def host_steps(self, language: str, flags: Sequence[str] = ()) -> HostSteps:
        """Templates for the host front end and the embed step (independent of the targets)."""
        flags = tuple(flags)
        return self.memo(("host", language, flags), lambda: self._host_steps(language, flags))

    def device_steps(self, target: TargetID, language: str, flags: Sequence[str] = ()) -> DeviceSteps:
        """Templates for one target's device compile (and assemble), probed for that target alone."""
        flags = tuple(flags)
        return self.memo((target, language, flags), lambda: self._device_steps(target, language, flags))

    def _host_steps(self, language: str, flags: Sequence[str]) -> HostSteps:
        host_probe = TargetID("x86_64")
        jobs = self._jobs(language, (*flags, *selection_flags(host_probe)))
        frontend = next((job for job in jobs if is_cc1(job) and "-emit-llvm-bc" in job
                         and "-fopenmp-is-target-device" not in job), None)
        embed = next((job for job in jobs if is_cc1(job)
                      and any(arg.startswith("-fembed-offload-object=") for arg in job)), None)
        if frontend is None or embed is None:
            raise ToolchainError(f"{self.driver(language)} -### printed no host front-end/embed job for OpenMP offload;"
                                 " is this Clang 19 with OpenMP offload support?")
        triples = ",".join(HOST_OFFLOAD_TRIPLES)
        names, targets = {"-main-file-name": "main_file_name"}, {"-fopenmp-targets=": triples}
        return HostSteps(
            frontend=job_template(frontend, input_slot="source", dependencies=True, value_slots=names,
                               replace_prefix=targets),
            embed=job_template(embed, input_slot="host_bc", prefix_slots={"-fembed-offload-object=": "package"},
                            value_slots=names, replace_prefix=targets),
        )

    def _device_steps(self, target: TargetID, language: str, flags: Sequence[str]) -> DeviceSteps:
        # The GPU math and device libraries as the driver would link them (or -nogpulib where none are found);
        # imported here: a host, package or embed phase command never needs them (its start-up).
        from offload_builders.device_libraries import device_library_flags

        runtime = self.toolchain.lib_dir / f"libomptarget-amdgpu-{target.processor}.bc"
        per_processor = self.toolchain.major <= 19  # LLVM 20+ ship one device runtime for every processor
        if target.kind == "amdgpu" and target.processor.endswith("-generic") and per_processor \
                and not runtime.is_file():
            raise ToolchainError(f"{target}: this LLVM's OpenMP device runtime has no image for generic targets (no"
                                 f" {runtime}): offload to the family's processors instead (e.g."
                                 f" {_family_example(target.processor)})")
        if (problem := generic_target_problem(target, flags, self.toolchain.major)) is not None:
            raise ToolchainError(problem)
        extra = device_library_flags(self.toolchain, target, flags)
        jobs = self._jobs(language, (*flags, *extra, *selection_flags(target)))
        device = [job for job in jobs if is_cc1(job) and "-fopenmp-is-target-device" in job]
        packagers = [job for job in jobs if tool_name(job).startswith("clang-offload-packager")]
        if len(device) != 1 or len(packagers) != 1:
            raise ToolchainError(f"{self.driver(language)} -### for {target} printed {len(device)} device jobs and"
                                 f" {len(packagers)} packager jobs; expected one of each")
        device_job = device[0]
        compile_output = value_after(device_job, "-o") or ""
        compile_suffix = os.path.splitext(compile_output)[1]
        compile_template = job_template(device_job, input_slot="source",
                                     value_slots={"-main-file-name": "main_file_name",
                                                  "-fopenmp-host-ir-file-path": "host_bc"})
        assemble = None
        image_suffix = compile_suffix
        assemblers = [job for job in jobs if tool_name(job) == "ptxas"]
        if assemblers:
            assemble = job_template(assemblers[0], input_slot="input", input_value=compile_output)
            image_suffix = os.path.splitext(value_after(assemblers[0], "--output-file") or ".o")[1]
        return DeviceSteps(
            target=target,
            compile=compile_template,
            compile_suffix=compile_suffix,
            assemble=assemble,
            image_suffix=image_suffix,
            image_spec=image_spec(packagers[0]),
        )
