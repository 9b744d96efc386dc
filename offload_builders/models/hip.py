"""The HIP phase model: Clang's HIP compile of one source, split into one command per phase.

For a source S and AMDGPU target IDs T, ``clang++ -x hip --offload-arch=... -c S`` runs, in one process:

* default (non-RDC) mode, per target ID: a device ``-cc1 -emit-obj`` (S -> device object) and an
  ``lld`` link (device object -> code object); then ``clang-offload-bundler -type=o -bundle-align=4096``
  (host entry from ``/dev/null`` + every code object -> the ``.hipfb`` fat binary); then the host
  ``-cc1`` with ``-fcuda-include-gpubinary <hipfb>`` (S -> the object, fat binary in ``.hip_fatbin``);
* relocatable-device-code mode (``-fgpu-rdc --offload-new-driver``), per target ID: a device
  ``-cc1 -emit-llvm-bc`` (S -> bitcode); then ``clang-offload-packager`` (kind ``hip``); then the host
  ``-cc1`` with ``-fembed-offload-object=<package>`` (the ``.llvm.offloading`` section). Device
  linking and registration happen at link time (the linker wrapper), not here.

As in :mod:`offload_builders.models.openmp`, the commands are not re-invented: :class:`HipPhaseModel` asks the
installed driver (``clang++ -### -x hip --offload-arch=<one target> -cuid=<probe> -c``) once per
configuration and turns its jobs into :class:`~offload_builders.driver.CommandTemplate` objects whose
paths (and the ``-cuid`` value) are slots. The bundler job is not run: its parameters (entry IDs,
alignment, compression) are read from it and the fat binary is written by
:func:`offload_builders.formats.bundle.bundle`.

Two facts make per-target nodes possible, and ``tests/test_hip.py`` checks both against the driver:

* the device jobs of one target do not depend on the other targets, so each target is probed alone;
* with ``-cuid`` pinned, no job depends on the command line as a whole (the driver otherwise hashes
  it, ``-o`` included, into the CUID that host and device code share).

Which headers, device libraries and runtime a HIP build uses is found here as the driver finds them
(:func:`default_flags`, :func:`hip_installation`, :func:`hip_runtime_library`): with ROCm installed
(Debian: ``libamdhip64-dev``, ``rocm-device-libs``) a HIP source builds with ROCm's ``hip_runtime.h``
and device libraries and a program links ``libamdhip64``, as ``clang++ --hip-link`` does; without it,
``-nogpuinc``/``-nogpulib`` keep a source that brings its own declarations buildable.

This module has no SCons imports.
"""
from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from offload_builders import device_libraries
from offload_builders.driver import CommandTemplate, Slot, image_spec, job_template, probe as driver_probe
from offload_builders.errors import ToolchainError
from offload_builders.formats.fatbinary import hip_fatbinary
from offload_builders.job_words import CompileTimeLink, is_cc1, tool_name, value_after
from offload_builders.models import reject_reserved_flags, require_target_kind
from offload_builders.models.gpu import (
    CUID_PATTERN,
    PROBE_CUID,
    RDC_FLAGS,
    FatbinJob,
    GpuPhaseModel,
    check_cuid,
    default_cuid,
    is_rdc,
    mode_flags,
    pins_cuid,
    uses_new_driver,
)
from offload_builders.targets import AMDGPU_TRIPLE, TargetID, generic_target_problem
from offload_builders.toolchain import ProbeCache, Toolchain

if TYPE_CHECKING:  # the bundle and compression writers load where a fat binary is written
    from offload_builders.formats.compressed import CompressionOptions

#: The language every HIP compile is told (``-x hip``), and the source suffixes that select it.
HIP_LANGUAGE = "hip"
HIP_SUFFIXES: tuple[str, ...] = (".hip",)

#: The host compile does not depend on which targets are selected (checked by the tests), so one fixed
#: target serves for its probe and the probe is shared by every target list.
HOST_PROBE_TARGET = TargetID("gfx90a")

#: Flags the user must not pass: the model selects targets and the CUID itself, one node at a time.
RESERVED_FLAG_PREFIXES: tuple[str, ...] = ("--offload-arch=", "--cuda-gpu-arch=", "--no-offload-arch=",
                                           "-cuid=", "-fuse-cuid=", "--offload-device-only",
                                           "--offload-host-only", "--cuda-device-only", "--cuda-host-only")


def check_flags(flags: Iterable[str]) -> None:
    """Reject flags that would fight the per-node split (target selection, CUID, host/device-only)."""
    reject_reserved_flags(flags, RESERVED_FLAG_PREFIXES, "HIP",
                          "targets come from $OFFLOAD_ARCHS, the CUID from $OFFLOAD_HIP_CUID")


def check_targets(targets: Iterable[TargetID]) -> None:
    """HIP offloads to AMDGPU processors only."""
    require_target_kind(targets, "amdgpu", "HIP", "AMDGPU processors (e.g. gfx90a:xnack+)")


#: The ROCm device libraries a HIP device compile links besides OpenMP's ``ocml`` and ``oclc_*`` set.
HIP_DEVICE_LIBRARIES: tuple[str, ...] = ("hip.bc", "ockl.bc")
#: User flags that choose the HIP headers (or none): with one of them the tool adds no ``-nogpuinc``.
_INCLUDE_CHOICE_PREFIXES = ("-nogpuinc", "--hip-path=", "--rocm-path=")
#: The HIP runtime library ``clang++ --hip-link`` links (``-L<HIP installation>/lib -lamdhip64``).
HIP_RUNTIME_LIBRARY = "amdhip64"


def _last_value(flags: Sequence[str], prefix: str) -> str | None:
    values = [flag[len(prefix):] for flag in flags if flag.startswith(prefix)]
    return values[-1] if values else None


def _has_version_file(root: Path) -> bool:
    """Whether ``root`` looks like a HIP installation to Clang 19 (``share/hip/version``, the parent's
    ``share/hip/version`` except under ``/usr/local``, or ``bin/.hipVersion``)."""
    files = [root / "share" / "hip" / "version", root / "bin" / ".hipVersion"]
    if root != Path("/usr/local"):
        files.append(root.parent / "share" / "hip" / "version")
    return any(path.is_file() for path in files)


def hip_root_candidates(toolchain: Toolchain) -> list[Path]:
    """Where Clang 19 looks for a HIP installation when no flag or environment variable names one: its
    own prefix and resource directory, the newest ``/opt/rocm-<version>``, ``/opt/rocm``, ``/usr/local``,
    ``/usr``."""
    versioned = sorted(Path("/opt").glob("rocm-*")) if Path("/opt").is_dir() else []
    return [toolchain.bin_dir.parent, toolchain.resource_dir, *versioned[-1:],
            *map(Path, device_libraries.ROCM_ROOT_CANDIDATES)]


def hip_installation(toolchain: Toolchain, flags: Sequence[str] = (), environ: Mapping[str, str] | None = None,
                     candidates: Sequence[Path] | None = None) -> Path | None:
    """The HIP installation the driver uses for ``flags``: ``--hip-path``, else ``$HIP_PATH``, else
    ``--rocm-path``, else ``$ROCM_PATH`` (each taken if it exists), else the first of ``candidates``
    (default :func:`hip_root_candidates`) with a HIP version file; None without one."""
    environ = os.environ if environ is None else environ
    named = (_last_value(flags, "--hip-path=") or environ.get("HIP_PATH") or _last_value(flags, "--rocm-path=")
             or environ.get("ROCM_PATH"))
    if named:
        return Path(named) if Path(named).exists() else None
    for root in hip_root_candidates(toolchain) if candidates is None else candidates:
        if root.is_dir() and _has_version_file(root):
            return root
    return None


def include_flags(toolchain: Toolchain, flags: Sequence[str], environ: Mapping[str, str] | None = None,
                  candidates: Sequence[Path] | None = None) -> tuple[str, ...]:
    """``-nogpuinc`` where the driver would find no HIP installation (it would stop with "cannot find HIP
    runtime"); nothing where it finds one or where ``flags`` or the environment choose."""
    environ = os.environ if environ is None else environ
    if any(flag.startswith(_INCLUDE_CHOICE_PREFIXES) for flag in flags) or environ.get("HIP_PATH") \
            or environ.get("ROCM_PATH"):
        return ()
    return () if hip_installation(toolchain, flags, environ, candidates) is not None else ("-nogpuinc",)


def device_library_flags(toolchain: Toolchain, target: TargetID, flags: Sequence[str],
                         environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """What a HIP compile for ``target`` adds for ROCm's device libraries: OpenMP's choice
    (:func:`offload_builders.device_libraries.device_library_flags`), and ``-nogpulib`` also where HIP's
    own ``hip.bc`` or ``ockl.bc`` is missing; nothing where ``flags`` or the environment choose."""
    if device_libraries.user_chooses(target, flags, environ):
        return ()
    chosen = device_libraries.device_library_flags(toolchain, target, flags, environ)
    if "-nogpulib" in chosen:
        return chosen
    directory = device_libraries.rocm_bitcode_dir(toolchain)
    if directory is None or not all((directory / name).is_file() for name in HIP_DEVICE_LIBRARIES):
        return ("-nogpulib",)
    return chosen


def default_flags(toolchain: Toolchain, target: TargetID, flags: Sequence[str],
                  environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The flags the tool adds to the user's ``flags`` for a HIP compile probed with ``target``: the device
    libraries (:func:`device_library_flags`) and, without a HIP installation, ``-nogpuinc``."""
    return (*device_library_flags(toolchain, target, flags, environ), *include_flags(toolchain, flags, environ))


def _multiarch() -> str:
    import platform
    import sysconfig

    return sysconfig.get_config_var("MULTIARCH") or f"{platform.machine()}-linux-gnu"


def hip_runtime_library(toolchain: Toolchain, flags: Sequence[str] = (),
                        environ: Mapping[str, str] | None = None) -> Path | None:
    """``libamdhip64.so`` of the HIP installation (:func:`hip_installation`), in its ``lib`` directory or
    that directory's multiarch subdirectory (Debian: ``/usr/lib/x86_64-linux-gnu``); None without one."""
    root = hip_installation(toolchain, flags, environ)
    if root is None:
        return None
    name = f"lib{HIP_RUNTIME_LIBRARY}.so"
    for directory in (root / "lib", root / "lib" / _multiarch()):
        if (directory / name).exists():
            return directory / name
    return None


@dataclass(frozen=True)
class FatbinSpec:
    """The parameters of the driver's ``clang-offload-bundler`` job, shared by all targets."""

    file_type: str                  # "o": with a /dev/null host input that gives the binary format
    alignment: int                  # -bundle-align (4096 in Clang 19's HIPUtility.cpp)
    host_id: str                    # "host-x86_64-unknown-linux" (hard-coded by Clang 19)
    host_input: str                 # "/dev/null"
    compress: bool                  # -compress (from --offload-compress)
    compression_level: int | None   # -compression-level=N (from --offload-compression-level=N)
    #: The entries by ID descending, as clang-linker-wrapper's ``bundleHIP`` orders them (Clang 22's new driver
    #: links at compile time), not in the given order (the driver's bundler job).
    descending: bool = False


def default_compression_version(llvm_version: int, environ: Mapping[str, object] | None = None) -> int:
    """The compressed bundle format the toolchain's bundler writes, run in ``environ``: from LLVM 20 the one
    ``COMPRESSED_BUNDLE_FORMAT_VERSION`` names (2 or 3; another value is ignored, as the bundler ignores it
    with a warning), else 2 up to LLVM 21 and 3 from LLVM 22 (llvm-project PR #152600; Clang 22's
    ``clang-offload-bundler --compress`` writes version 3 here)."""
    chosen = str((environ or {}).get("COMPRESSED_BUNDLE_FORMAT_VERSION", ""))
    if llvm_version >= 20 and chosen in ("2", "3"):
        return int(chosen)
    return 3 if llvm_version >= 22 else 2


def fatbin_compression(spec: FatbinSpec, version: object = None, level: object = None, *, llvm_version: int = 19,
                       environ: Mapping[str, object] | None = None) -> CompressionOptions | None:
    """How a source's fat binary is compressed: ``version`` (2 or 3; None, ``''``, 0 or False: what the flags
    asked the driver for, ``--offload-compress`` giving the format the toolchain's bundler would write in
    ``environ``, :func:`default_compression_version`) and ``level`` (None or ``''``: the flags'
    ``--offload-compression-level``, else the bundler's default) over ``spec``. A bad value is a
    ``ValueError`` or ``TypeError`` for the caller to word (``$OFFLOAD_HIP_COMPRESS``, ...)."""
    from offload_builders.formats.compressed import CompressionOptions, Method

    if version in (None, "", 0, False):
        if not spec.compress:
            return None
        version = default_compression_version(llvm_version, environ)
    number = int(version)  # type: ignore[call-overload]
    if number not in (2, 3):
        raise ValueError(f"no compressed bundle format version {number} here")
    chosen = spec.compression_level if level in (None, "") else int(level)  # type: ignore[call-overload]
    return CompressionOptions(Method.ZSTD, chosen, number)


def write_fatbin(spec: FatbinSpec, ids: Sequence[str], code_objects: Sequence[str], output: str,
                 compression: CompressionOptions | None, *, llvm_version: int = 19) -> None:
    """Write a source's fat binary as the driver's bundler job would: ``spec``'s host entry, then one entry
    per code object (``ids`` holds the host ID first), aligned, ``CCOB``-compressed with Clang's zstd bytes
    when ``compression`` says so. One writer for the SCons tool and ``offload-compile bundle``."""
    from offload_builders.formats.bundle import bundle
    from offload_builders.formats.clang_zstd import compress_file

    plain = output + ".uncompressed"
    if spec.descending:
        ordered = sorted(zip(ids[1:], code_objects), key=lambda entry: entry[0], reverse=True)
        ids, code_objects = [ids[0], *(entry for entry, _ in ordered)], [path for _, path in ordered]
    try:
        bundle([spec.host_input, *code_objects], list(ids), output if compression is None else plain,
               file_type=spec.file_type, bundle_align=spec.alignment, llvm_version=llvm_version)
        if compression is not None:
            compress_file(plain, output, compression)
    finally:
        if os.path.exists(plain):
            os.unlink(plain)


# --------------------------------------------------------------------------------------------------
# A program's fat binary (relocatable device code): what clang-linker-wrapper 19's ``bundleHIP`` writes.

#: The offload kind of clang-linker-wrapper's own bundle entries (``bundleHIP``), not the driver's ``hipv4``.
LINK_BUNDLE_KIND = "hip"


def link_fatbin_spec(compress: bool = False, level: int | None = None) -> FatbinSpec:
    """The bundler parameters of a program's HIP fat binary: ``clang-offload-bundler -type=o -bundle-align=4096
    -targets=host-x86_64-unknown-linux,...`` with ``-compress`` (and ``-compression-level=N``) as asked."""
    return FatbinSpec("o", 4096, "host-x86_64-unknown-linux", os.devnull, compress, level)


def link_compression_flags(flags: Iterable[str]) -> tuple[bool, int | None]:
    """Whether, and at which zstd level, driver flags (a program's compile and link flags) ask the link to
    compress its HIP fat binary: ``--offload-compress``, ``--no-offload-compress`` (the last wins),
    ``--offload-compression-level=N``. A level that is not an integer is a ``ValueError`` naming the flag."""
    compress, level = False, None
    for flag in flags:
        if flag == "--offload-compress":
            compress = True
        elif flag == "--no-offload-compress":
            compress = False
        elif flag.startswith("--offload-compression-level="):
            try:
                level = int(flag.partition("=")[2])
            except ValueError:
                raise ValueError(f"{flag}: the compression level is an integer") from None
    return compress, level


def program_fatbinary(images: Sequence[tuple[str, str]], compression: CompressionOptions | None, scratch: str, *,
                      llvm_version: int = 19) -> bytes:
    """The fat binary of a program's HIP registration, ``images`` as ``(target ID, code object)``: the one
    ``clang-linker-wrapper`` 19 writes (host entry, then ``hip-amdgcn-amd-amdhsa--<target ID>`` entries by
    target ID descending, 4096-aligned; ``CCOB`` with Clang's zstd bytes when ``compression`` says so).
    ``scratch`` is a path prefix for the compressor's files (removed again). One writer for the SCons tool's
    wrap node and ``offload-link`` (:mod:`offload_builders.linking.wrapping`)."""
    from offload_builders.formats.clang_zstd import compress_file
    ordered = sorted(images, key=lambda image: image[0], reverse=True)
    fatbin = hip_fatbinary(ordered, offload_kind=LINK_BUNDLE_KIND, llvm_version=llvm_version)
    if compression is None:
        return fatbin
    plain, packed = scratch + ".hipfb.uncompressed", scratch + ".hipfb"
    try:
        with open(plain, "wb") as f:
            f.write(fatbin)
        compress_file(plain, packed, compression)
        with open(packed, "rb") as f:
            return f.read()
    finally:
        for path in (plain, packed):
            if os.path.exists(path):
                os.unlink(path)


@dataclass(frozen=True)
class HipDeviceSteps:
    """Everything one target contributes to one source's object."""

    target: TargetID
    compile: CommandTemplate        # slots: source, main_file_name, output, and cuid (non-RDC)
    compile_suffix: str             # ".o" (non-RDC device object) or ".bc" (RDC bitcode)
    link: CommandTemplate | None    # non-RDC: lld -> code object, slots: input, output; RDC: None
    bundle_id: str | None           # non-RDC: "hipv4-amdgcn-amd-amdhsa--gfx90a:xnack+"; RDC: None
    image_spec: tuple[str, ...] | None  # RDC: the packager's key=value pairs except file=; else None

    @property
    def second_step(self) -> CommandTemplate | None:
        """The job on the device compile's output: the link to the code object (RDC: none)."""
        return self.link


@dataclass(frozen=True)
class HipHostSteps:
    """The host compile: the source plus the device side's result (fat binary or package) -> object."""

    compile: CommandTemplate        # slots: source, main_file_name, output, and fatbin+cuid or package
    rdc: bool
    fatbin: FatbinSpec | None       # non-RDC only


def _cl_arg(arg: str) -> str:
    """A tool argument as LLVM's option parser reads it: ``--name`` and ``-name`` are one option (Clang 19's
    driver gives the bundler ``-compress``, Clang 22's ``--compress``)."""
    return arg[1:] if arg.startswith("--") else arg


def _int_option(job: Sequence[str], prefix: str) -> int | None:
    for arg in map(_cl_arg, job):
        if arg.startswith(prefix):
            return int(arg[len(prefix):])
    return None


def _list_option(job: Sequence[str], prefix: str) -> list[str]:
    return [arg[len(prefix):] for arg in map(_cl_arg, job) if arg.startswith(prefix)]


def _compile_time_link(jobs: Sequence[Sequence[str]]) -> Sequence[str] | None:
    """The ``clang-linker-wrapper --emit-fatbin-only`` job of Clang 22's new driver without RDC, if any."""
    return next((job for job in jobs if tool_name(job) == "clang-linker-wrapper" and "--emit-fatbin-only" in job),
                None)


def probe(driver: str, flags: tuple[str, ...], cwd: str,
           cache: ProbeCache | None = None) -> tuple[tuple[str, ...], ...]:
    """Run ``driver -### -x hip <flags> -c`` on an empty probe source; return the jobs (memoized, cached)."""
    return driver_probe(driver, HIP_LANGUAGE, flags, cwd, cache, mode=("-x", HIP_LANGUAGE), extension=".hip",
                         what="HIP")


class HipPhaseModel(GpuPhaseModel):
    """Per-phase HIP command templates for one toolchain, derived from its driver and memoized.

    ``flags`` everywhere are the user's driver flags (``-O2``, ``-I``, ``-nogpulib -nogpuinc``, ...);
    ``-fgpu-rdc`` among them selects RDC mode, to which the model adds ``--offload-new-driver``.
    """

    host_probe_target = HOST_PROBE_TARGET

    check_flags = staticmethod(check_flags)
    check_targets = staticmethod(check_targets)

    def default_flags(self, target: TargetID, flags: Sequence[str]) -> tuple[str, ...]:
        """ROCm's device libraries for ``target`` and, without a HIP installation, ``-nogpuinc``
        (:func:`default_flags`)."""
        return default_flags(self.toolchain, target, flags)

    def probe_flags(self, target: TargetID, flags: Sequence[str]) -> tuple[str, ...]:
        """The flags a one-target probe passes: the user's, the mode's, the target and (non-RDC) the CUID."""
        check_flags(flags)
        check_targets([target])
        if (problem := generic_target_problem(target, flags, self.toolchain.major)) is not None:
            raise ToolchainError(problem)
        return (*flags, *mode_flags(flags, (f"--offload-arch={target}",)))

    def _jobs(self, target: TargetID, flags: Sequence[str]) -> tuple[tuple[str, ...], ...]:
        return probe(self.driver, self.probe_flags(target, flags), self.cwd, self.cache)

    def _fail(self, target: TargetID, what: str) -> ToolchainError:
        return ToolchainError(f"{self.driver} -### -x hip --offload-arch={target}: {what};"
                              " is this Clang 19 with AMDGPU support?")

    def _linked_at_compile_time(self, target: TargetID, jobs: Sequence[Sequence[str]], wrapper: Sequence[str],
                                flags: Sequence[str]) -> HipDeviceSteps:
        """Clang 22's new offload driver without RDC: a device compile to bitcode per target, then one
        ``clang-linker-wrapper --emit-fatbin-only`` that links each target (``clang --target=amdgcn-amd-amdhsa
        -mcpu=<target> -flto``, the extracted bitcode as a ``.o``) and bundles the code objects. Split here into the
        device compile and that link per target, and the fat binary written by :func:`write_fatbin` in the
        wrapper's order; the code objects and the fat binary are the wrapper's, byte for byte."""
        device_job = self._device_job(target, jobs)
        link_args = self._wrapper_link_args(target, wrapper)
        compile_template = job_template(device_job, input_slot="source",
                                        value_slots={"-main-file-name": "main_file_name"},
                                        prefix_slots=self._cuid_slots(device_job, target, flags))
        link = CommandTemplate((str(self.toolchain.clang), "--no-default-config", "-o", Slot("output"),
                                f"--target={AMDGPU_TRIPLE}", f"-mcpu={target}", "-flto", "-Wl,--no-undefined",
                                Slot("input"), *link_args))
        # The wrapper hands the bitcode to clang as an object file (".o": linked, not compiled again).
        return HipDeviceSteps(target, compile_template, ".o", link, f"{LINK_BUNDLE_KIND}-{AMDGPU_TRIPLE}--{target}",
                              None)

    def _wrapper_link_args(self, target: TargetID, wrapper: Sequence[str]) -> tuple[str, ...]:
        """The device compiler's arguments of a compile-time ``clang-linker-wrapper`` job; one error naming an
        option the split does not follow."""
        link = CompileTimeLink(wrapper)
        if link.unfollowed is not None:
            raise ToolchainError(f"{self.driver} -### -x hip --offload-new-driver --offload-arch={target}: its"
                                 f" compile-time device link (clang-linker-wrapper --emit-fatbin-only) has"
                                 f" {link.unfollowed}, which the tool does not follow; leave out --offload-new-driver"
                                 " (or pass --no-offload-new-driver), or add -fgpu-rdc")
        return tuple(link.device_args)

    def _device_job(self, target: TargetID, jobs: Sequence[Sequence[str]]) -> Sequence[str]:
        device = [job for job in jobs if is_cc1(job) and "-fcuda-is-device" in job]
        if len(device) != 1:
            raise self._fail(target, f"expected one device -cc1 job, got {len(device)}")
        return device[0]

    def _cuid_slots(self, job: Sequence[str], target: TargetID, flags: Sequence[str]) -> dict[str, str]:
        """The ``cuid`` slot of a non-RDC job. Clang 19's new offload driver forwards no ``-cuid`` (its non-RDC
        jobs are the old driver's with ``--offload-new-driver``), so such jobs have none, and need none: nothing
        in them depends on the rest of the command."""
        if is_rdc(flags):
            return {}
        if not pins_cuid(job):
            if uses_new_driver(flags) and not any(word.startswith("-cuid=") for word in job):
                return {}
            raise self._fail(target, "a -cc1 job does not carry the pinned -cuid")
        return {"-cuid=": "cuid"}

    def device_steps(self, target: TargetID, flags: Sequence[str] = ()) -> HipDeviceSteps:
        """Templates for one target's device compile (and, non-RDC, its code-object link)."""
        flags = tuple(flags)
        return self.memo((target, flags), lambda: self._device_steps(target, flags))

    def host_steps(self, flags: Sequence[str] = ()) -> HipHostSteps:
        """The host compile's template (independent of the targets) and, non-RDC, the bundler's parameters."""
        flags = tuple(flags)
        return self.memo(("host", flags), lambda: self._host_steps(flags))

    def _device_steps(self, target: TargetID, flags: tuple[str, ...]) -> HipDeviceSteps:
        rdc = is_rdc(flags)
        jobs = self._jobs(target, flags)
        if not rdc and (wrapper := _compile_time_link(jobs)) is not None:
            return self._linked_at_compile_time(target, jobs, wrapper, flags)
        device_job = self._device_job(target, jobs)
        compile_output = value_after(device_job, "-o") or ""
        compile_template = job_template(device_job, input_slot="source",
                                     value_slots={"-main-file-name": "main_file_name"},
                                     prefix_slots=self._cuid_slots(device_job, target, flags))
        compile_suffix = os.path.splitext(compile_output)[1]
        if rdc:
            packagers = [job for job in jobs if tool_name(job).startswith("clang-offload-packager")]
            if len(packagers) != 1:
                raise self._fail(target, f"expected one clang-offload-packager job in RDC mode, got {len(packagers)}")
            return HipDeviceSteps(target, compile_template, compile_suffix, None, None, image_spec(packagers[0]))
        links = [job for job in jobs if compile_output in job and job is not device_job]
        bundlers = [job for job in jobs if tool_name(job).startswith("clang-offload-bundler")]
        if len(links) != 1 or len(bundlers) != 1:
            raise self._fail(target, f"expected one device link and one bundler job,"
                                     f" got {len(links)} and {len(bundlers)}")
        link_template = job_template(links[0], input_slot="input", input_value=compile_output)
        targets = _list_option(bundlers[0], "-targets=")
        ids = targets[0].split(",") if len(targets) == 1 else []
        device_ids = [entry for entry in ids if not entry.startswith("host-")]
        if len(device_ids) != 1:
            raise self._fail(target, f"expected one device entry in the bundler's -targets, got {ids}")
        return HipDeviceSteps(target, compile_template, compile_suffix, link_template, device_ids[0], None)

    def _host_steps(self, flags: tuple[str, ...]) -> HipHostSteps:
        rdc = is_rdc(flags)
        target = HOST_PROBE_TARGET
        jobs = self._jobs(target, flags)
        hosts = [job for job in jobs if is_cc1(job) and "-fcuda-is-device" not in job]
        if len(hosts) != 1:
            raise self._fail(target, f"expected one host -cc1 job, got {len(hosts)}")
        host = hosts[0]
        if rdc:
            if not any(arg.startswith("-fembed-offload-object=") for arg in host):
                raise self._fail(target, "the RDC host job does not embed an offload binary")
            template = job_template(host, input_slot="source", value_slots={"-main-file-name": "main_file_name"},
                                 prefix_slots={"-fembed-offload-object=": "package"})
            return HipHostSteps(template, True, None)
        if "-fcuda-include-gpubinary" not in host:
            raise self._fail(target, "the host job does not include a GPU binary")
        template = job_template(host, input_slot="source",
                             value_slots={"-main-file-name": "main_file_name", "-fcuda-include-gpubinary": "fatbin"},
                             prefix_slots=self._cuid_slots(host, target, flags))
        if (wrapper := _compile_time_link(jobs)) is not None:
            level = _int_option(wrapper, "-compression-level=")
            spec = FatbinSpec("o", 4096, "host-x86_64-unknown-linux-gnu", os.devnull,
                              "-compress" in map(_cl_arg, wrapper), level, descending=True)
            return HipHostSteps(template, False, spec)
        bundlers = [job for job in jobs if tool_name(job).startswith("clang-offload-bundler")]
        if len(bundlers) != 1:
            raise self._fail(target, f"expected one bundler job, got {len(bundlers)}")
        return HipHostSteps(template, False, self._fatbin_spec(target, bundlers[0]))

    def _fatbin_spec(self, target: TargetID, job: Sequence[str]) -> FatbinSpec:
        types = _list_option(job, "-type=")
        targets = _list_option(job, "-targets=")
        inputs = _list_option(job, "-input=")
        ids = targets[0].split(",") if len(targets) == 1 else []
        host_index = next((i for i, entry in enumerate(ids) if entry.startswith("host-")), None)
        if len(types) != 1 or host_index is None or len(inputs) != len(ids):
            raise self._fail(target, f"cannot read the bundler job {' '.join(job)}")
        return FatbinSpec(
            file_type=types[0],
            alignment=_int_option(job, "-bundle-align=") or 1,
            host_id=ids[host_index],
            host_input=inputs[host_index],
            compress="-compress" in map(_cl_arg, job),
            compression_level=_int_option(job, "-compression-level="),
        )

    def fatbin_job(self, flags: Sequence[str], images: Sequence[tuple[TargetID, str]], output: str, *,
                   environ: Mapping[str, str]) -> FatbinJob:
        """The fat binary written in this process as the driver's bundler job would write it (:func:`write_fatbin`:
        the host entry, one entry per code object, compressed as the flags say in ``environ``)."""
        spec = self.host_steps(self.flags_for(self.host_probe_target, flags)).fatbin
        if spec is None:
            raise ValueError("relocatable device code has no fat binary per source")
        ids = [spec.host_id, *(self._bundle_id(target, flags) for target, _ in images)]
        read = [path for _, path in images]
        major = self.toolchain.major
        compression = fatbin_compression(spec, llvm_version=major, environ=environ)

        def write() -> None:
            write_fatbin(spec, ids, read, output, compression, llvm_version=major)

        # Keyed by what the writer is given and by our code, as a bundler's command would be.
        described = ("offload-builders-bundle", repr(spec), repr(compression), f"llvm={major}", "-o", output,
                     *(f"{bundle_id}={path}" for bundle_id, path in zip(ids[1:], read)))
        return FatbinJob(tuple(read), write=write, described=described)

    def _bundle_id(self, target: TargetID, flags: Sequence[str]) -> str:
        bundle_id = self.device_steps(target, self.flags_for(target, flags)).bundle_id
        if bundle_id is None:
            raise ValueError(f"{target}: relocatable device code has no bundle entry")
        return bundle_id


__all__ = [
    "CUID_PATTERN",
    "HIP_DEVICE_LIBRARIES",
    "HIP_LANGUAGE",
    "HIP_RUNTIME_LIBRARY",
    "HIP_SUFFIXES",
    "HOST_PROBE_TARGET",
    "LINK_BUNDLE_KIND",
    "PROBE_CUID",
    "RDC_FLAGS",
    "FatbinSpec",
    "HipDeviceSteps",
    "HipHostSteps",
    "HipPhaseModel",
    "check_cuid",
    "check_flags",
    "check_targets",
    "default_cuid",
    "default_flags",
    "device_library_flags",
    "fatbin_compression",
    "hip_installation",
    "hip_root_candidates",
    "hip_runtime_library",
    "include_flags",
    "is_rdc",
    "link_compression_flags",
    "link_fatbin_spec",
    "probe",
    "program_fatbinary",
    "write_fatbin",
]
