"""The CUDA phase model: Clang's CUDA compile of one source, split into one command per phase.

For a source S and NVPTX target IDs T, ``clang++ -x cuda --cuda-gpu-arch=... -c S`` runs, in one process:

* default (non-RDC) mode, per target ID a device ``-cc1 -S -fcuda-is-device`` (S -> PTX) and ``ptxas``
  (PTX -> cubin); then the toolkit's ``fatbinary`` (every cubin, and with Clang 19 every PTX, -> the fat
  binary); then the host ``-cc1`` with ``-fcuda-include-gpubinary <fatbin>`` (S -> the object, fat binary
  in ``.nv_fatbin``);
* relocatable-device-code mode (``-fgpu-rdc --offload-new-driver``), per target ID the device compile and
  ``ptxas -c`` (a relocatable cubin); then ``clang-offload-packager`` (kind ``cuda``); then the host
  ``-cc1`` with ``-fembed-offload-object=<package>``. Device linking (nvlink) and registration happen at
  link time.

As for HIP (:mod:`offload_builders.models.hip`), :class:`CudaPhaseModel` asks the driver (``clang++ -###
-x cuda --cuda-gpu-arch=<one target> -cuid=<probe> --cuda-path=<CUDA_PATH> -c``) once per configuration
and turns its jobs into templates; with ``-cuid`` pinned, no job depends on the other targets but for one
word (below). The ``fatbinary`` job is not run as probed: its images are read per target and written in the
syntax CUDA 13's ``fatbinary`` takes (``--image3=kind=elf|ptx,sm=NN,file=...``): Clang 19 writes
``--image=profile=sm_80``, which CUDA 13 rejects (``Unknown option '-image'``), Clang 22 writes ``--image3``
itself. The images go in target-ID order as Clang's driver sorts them (its architecture set is ordered by name).

That word: from Clang 20 the driver defines ``__CUDA_ARCH_LIST__`` (the numeric architectures of all the
command's targets) in every job, host and device. CUB, Thrust and libcu++ name their inline namespace after
it (``cub::CUB_300001_SM_800_900``), so a host object compiled with another list than its cubins launches
kernels they do not define ("named symbol not found"). The templates hold it as the slot
:data:`ARCH_LIST_SLOT`, and :meth:`CudaPhaseModel.arch_list` asks the driver for a source's whole target list
(a probe with every target), so the rule stays the driver's. Clang 19 defines no such macro: no slot, no
extra probe, and its compiles still depend on their own target alone.

One CUDA installation serves everything: the toolchain's (``$CUDA_PATH``, default ``/usr/local/cuda``) is
where our checks look and what the driver gets (``--cuda-path``). Clang 19 cannot parse CUDA 13's headers
(its wrapper includes ``texture_fetch_functions.h``, which CUDA 13 removed), so with Clang 19 the model adds
``-nocudainc -nocudalib`` and a source declares what it uses (:func:`default_flags`). CUDA 13 moved CUB,
Thrust and libcu++ to ``<CUDA_PATH>/include/cccl``, which ``nvcc`` adds (``-isystem``, its ``nvcc.profile``)
and Clang does not: where the compile uses the real headers, the model adds it as ``nvcc`` does.

This module has no SCons imports.
"""
from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from offload_builders.driver import CommandTemplate, Slot, image_spec, job_template, probe as driver_probe
from offload_builders.errors import ToolchainError
from offload_builders.formats.fatbinary import cuda_fatbinary_command
from offload_builders.job_words import is_cc1, tool_name, value_after
from offload_builders.models import reject_reserved_flags, require_target_kind
from offload_builders.models.base import package_command
from offload_builders.models.gpu import FatbinJob, GpuPhaseModel, is_rdc, mode_flags, pins_cuid
from offload_builders.targets import TargetID
from offload_builders.toolchain import ProbeCache, Toolchain

#: The language every CUDA compile is told (``-x cuda``), and the source suffixes that select it.
CUDA_LANGUAGE = "cuda"
CUDA_SUFFIXES: tuple[str, ...] = (".cu",)

#: The host compile depends on the targets only through the arch-list slot, so one fixed target serves its probe.
HOST_PROBE_TARGET = TargetID("sm_80")

#: Flags the user must not pass: the model selects targets, the CUID and the CUDA installation itself.
RESERVED_FLAG_PREFIXES: tuple[str, ...] = ("--offload-arch=", "--cuda-gpu-arch=", "--no-offload-arch=",
                                           "--no-cuda-gpu-arch=", "-cuid=", "-fuse-cuid=", "--cuda-path=",
                                           "--offload-device-only", "--offload-host-only", "--cuda-device-only",
                                           "--cuda-host-only")

#: The driver's packager job: ``clang-offload-packager`` (Clang 19), ``llvm-offload-binary`` (Clang 20+).
PACKAGER_NAMES = ("clang-offload-packager", "llvm-offload-binary")

#: The last Clang major version that cannot parse CUDA 13's headers (and whose driver still probes fine).
_LAST_WITHOUT_HEADERS = 19
#: User flags that choose the headers or libdevice: with one of them the tool adds neither.
_INCLUDE_CHOICES = ("-nocudainc", "-nocudalib", "-nogpuinc", "-nogpulib")
#: User flags by which a compile does without CUDA's headers (then ``include/cccl`` is not added either).
_HEADER_CHOICES = ("-nocudainc", "-nogpuinc")

#: The driver's definition of the target list (Clang 20+, every job of a CUDA compile), and its slot.
ARCH_LIST_PREFIX = "-D__CUDA_ARCH_LIST__="
ARCH_LIST_SLOT = "arch_list"
#: Where CUDA 13 keeps CUB, Thrust and libcu++ (``nvcc`` adds it; Clang does not).
CCCL_INCLUDE = os.path.join("include", "cccl")

#: Where ``offload-compile device`` keeps a cubin's PTX, which the fat binary holds beside it: ``<cubin>.ptx``.
KEPT_PTX_SUFFIX = ".ptx"

_IMAGE_RE = re.compile(r"--image=profile=(?P<kind>sm|compute)_(?P<sm>\w+),file=(?P<file>.+)")
_IMAGE3_RE = re.compile(r"--image3=kind=(?P<kind>elf|ptx),sm=(?P<sm>\w+),file=(?P<file>.+)")


#: The word a device compile's signature holds in place of the list where a list check signs what the list changes.
ARCH_LIST_CHECKED = "<checked>"
#: The first line of a list check's record (:func:`arch_list_record`); a new rule of the check gets a new one.
ARCH_LIST_RECORD_VERSION = "offload __CUDA_ARCH_LIST__ check 1"
#: A ``-cc1`` job's action words that a device compile may have: its preprocessing replaces the first one.
_CC1_ACTIONS = ("-S", "-emit-llvm-bc", "-emit-llvm", "-emit-obj")
#: User flags and ``-cc1`` words by which an output records macro definitions or the command line, the list's
#: value among them: such a compile always depends on the list.
_RECORDING_FLAGS = frozenset(("-g3", "-ggdb3", "-fdebug-macro", "-grecord-command-line", "-grecord-gcc-switches",
                              "-frecord-command-line", "-frecord-gcc-switches"))
_RECORDING_CC1 = frozenset(("-debug-info-macro", "-dwarf-debug-flags", "-record-command-line"))
_IDENTIFIER = re.compile(rb"[A-Za-z_][A-Za-z0-9_]*")
_DEFINE = re.compile(rb"#define ([A-Za-z_][A-Za-z0-9_]*)(\([^)]*\))?(.*)")


def records_arch_list(flags: Iterable[str], words: Iterable[str]) -> str | None:
    """Why a device compile's output can record the list's value (its macros or its command line: ``-g3``,
    ``-fdebug-macro``, ``-grecord-command-line``, ``-frecord-command-line``, or the ``-cc1`` words they become),
    or None."""
    for word in (*flags, *words):
        if word in _RECORDING_FLAGS or word in _RECORDING_CC1 or word.partition("=")[2] in _RECORDING_FLAGS:
            return f"{word} records macros or the command line"
    return None


def preprocess_command(words: Sequence[str]) -> list[str]:
    """A device compile's ``-cc1`` words made its preprocessing: the action (``-S``) replaced by ``-E -dD``
    (macro definitions kept in the output, see :func:`arch_list_record`), the output standard output."""
    argv = list(words)
    at = next((i for i, word in enumerate(argv) if word in _CC1_ACTIONS), None)
    if at is None or "-o" not in argv[:-1]:
        raise ValueError(f"not a -cc1 compile with one of {', '.join(_CC1_ACTIONS)} and -o")
    argv[at:at + 1] = ["-E", "-dD"]
    out = argv.index("-o")
    argv[out + 1] = "-"
    return argv


def arch_list_record(preprocessed: bytes, arch_list: str) -> str:
    """What a device compile's output depends on of ``-D__CUDA_ARCH_LIST__=<arch_list>``, from its preprocessed
    text (``-E -dD``, :func:`preprocess_command`): the text's digest without the list's own ``#define``, which
    is the same for two lists exactly where the compile reads the same tokens. Where ``-E`` does not show what
    the compile sees, the record holds the list itself: a ``#pragma`` is printed unexpanded (``#pragma unroll
    N``) while the compiler expands its macros, so a pragma naming a macro whose definition can reach the list
    (names it, or names such a macro, or pastes tokens with ``##``, which can form its name) makes the compile
    depend on the list."""
    own = f"#define __CUDA_ARCH_LIST__ {arch_list}".encode()
    digest = hashlib.sha256()
    named_in: dict[bytes, set[bytes]] = {}      # identifier -> the macros whose definitions name it
    tainted: set[bytes] = {b"__CUDA_ARCH_LIST__"}
    in_pragmas: set[bytes] = set()
    for line in preprocessed.split(b"\n"):
        if line == own:
            continue
        digest.update(line + b"\n")
        if line.startswith(b"#define "):
            match = _DEFINE.match(line)
            if match is None:
                continue
            name, body = match[1], match[3]
            if b"##" in body:
                tainted.add(name)
            for word in set(_IDENTIFIER.findall(body)):
                named_in.setdefault(word, set()).add(name)
        elif line.lstrip().startswith(b"#pragma"):
            in_pragmas.update(_IDENTIFIER.findall(line))
    work = list(tainted)
    while work:
        for name in named_in.get(work.pop(), ()):
            if name not in tainted:
                tainted.add(name)
                work.append(name)
    lines = [ARCH_LIST_RECORD_VERSION, f"preprocessed: sha256:{digest.hexdigest()}"]
    reached = sorted(in_pragmas & tainted)
    if reached:
        lines += [f"list: {arch_list}", f"why: a #pragma names {reached[0].decode(errors='replace')}, whose"
                  " expansion can reach __CUDA_ARCH_LIST__ (-E prints pragmas unexpanded)"]
    return "\n".join(lines) + "\n"


def arch_list_listed(arch_list: str, why: str) -> str:
    """The record of a compile that depends on the list whatever its text (:func:`records_arch_list`), or whose
    preprocessing failed (the compile reports why)."""
    return f"{ARCH_LIST_RECORD_VERSION}\nlist: {arch_list}\nwhy: {why}\n"


def check_arch_list(words: Sequence[str], flags: Sequence[str], arch_list: str,
                    environ: Mapping[str, str] | None = None) -> str:
    """The list check of one device compile (its ``-cc1`` words, with ``-D__CUDA_ARCH_LIST__=<arch_list>``, and
    the user's ``flags``): :func:`arch_list_record` of its preprocessing, or :func:`arch_list_listed`."""
    import subprocess

    why = records_arch_list(flags, words)
    if why is not None:
        return arch_list_listed(arch_list, why)
    try:
        argv = preprocess_command(words)
    except ValueError as error:
        return arch_list_listed(arch_list, str(error))
    try:
        done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                              env=None if environ is None else dict(environ), check=False)
    except OSError as error:
        return arch_list_listed(arch_list, f"{argv[0]}: {error.strerror}")
    if done.returncode != 0:
        return arch_list_listed(arch_list, f"its preprocessing failed (exit status {done.returncode})")
    return arch_list_record(done.stdout, arch_list)


def check_flags(flags: Iterable[str]) -> None:
    """Reject flags that would fight the per-node split (targets, CUID, installation, host/device-only)."""
    reject_reserved_flags(flags, RESERVED_FLAG_PREFIXES, "CUDA", "targets come from $OFFLOAD_ARCHS, the CUID from"
                          " $OFFLOAD_CUDA_CUID, the CUDA installation from $CUDA_PATH")


def check_targets(targets: Iterable[TargetID]) -> None:
    """CUDA offloads to NVPTX processors only."""
    require_target_kind(targets, "nvptx", "CUDA", "NVPTX processors (e.g. sm_90)")


def default_flags(toolchain: Toolchain, flags: Sequence[str]) -> tuple[str, ...]:
    """What the tool adds to a CUDA compile's flags: with Clang 19 or older ``-nocudainc -nocudalib`` (it
    cannot parse CUDA 13's headers); with a newer Clang and the real headers, ``-isystem <CUDA_PATH>/include/cccl``
    where the installation has it (CUDA 13's CUB, Thrust and libcu++, which ``nvcc`` adds and Clang does not);
    nothing where ``flags`` choose. (``--cuda-path`` the model adds itself.)"""
    if toolchain.major <= _LAST_WITHOUT_HEADERS:
        return () if any(flag in _INCLUDE_CHOICES for flag in flags) else ("-nocudainc", "-nocudalib")
    if toolchain.cuda_path is None or any(flag in _HEADER_CHOICES for flag in flags):
        return ()
    cccl = os.path.join(str(toolchain.cuda_path), CCCL_INCLUDE)
    if not os.path.isdir(cccl) or any(cccl in flag for flag in flags):  # absent, or the user's flags name it
        return ()
    return ("-isystem", cccl)


@dataclass(frozen=True)
class FatbinImage:
    """One image of one target in the fat binary: a cubin (``elf``) or the PTX it was assembled from."""

    kind: str                       # "elf" or "ptx"
    sm: str                         # "80", "90a"

    def argument(self, path: str) -> str:
        """The image in CUDA 13's ``fatbinary`` syntax."""
        return f"--image3=kind={self.kind},sm={self.sm},file={path}"


@dataclass(frozen=True)
class CudaDeviceSteps:
    """Everything one target contributes to one source's object."""

    target: TargetID
    compile: CommandTemplate        # slots: source, main_file_name, output, cuid (non-RDC), arch_list (Clang 20+)
    compile_suffix: str             # ".s" (PTX)
    assemble: CommandTemplate       # ptxas (RDC: -c); slots: input, output
    images: tuple[FatbinImage, ...]  # non-RDC: what the fat binary holds; RDC: ()
    image_spec: tuple[str, ...] | None = None  # RDC: the packager's key=value pairs except file=

    @property
    def second_step(self) -> CommandTemplate:
        """The job on the device compile's output: ``ptxas``."""
        return self.assemble


@dataclass(frozen=True)
class CudaHostSteps:
    """The host compile (slots: source, main_file_name, output, and fatbin and cuid, or RDC: package; Clang 20+
    also arch_list) and, non-RDC, the fat binary's command without its images (slot: output)."""

    compile: CommandTemplate
    fatbinary: CommandTemplate | None


def probe(driver: str, flags: tuple[str, ...], cwd: str,
           cache: ProbeCache | None = None) -> tuple[tuple[str, ...], ...]:
    """Run ``driver -### -x cuda <flags> -c`` on an empty probe source; return the jobs (memoized, cached)."""
    return driver_probe(driver, CUDA_LANGUAGE, flags, cwd, cache, mode=("-x", CUDA_LANGUAGE), extension=".cu",
                         what="CUDA")


def fatbin_order(targets: Iterable[TargetID]) -> tuple[TargetID, ...]:
    """The order of the images in a source's fat binary: Clang's, by architecture name."""
    return tuple(sorted(targets, key=str))


class CudaPhaseModel(GpuPhaseModel):
    """Per-phase CUDA command templates for one toolchain, derived from its driver and memoized.

    ``flags`` are the user's driver flags plus :func:`default_flags`.
    """

    host_probe_target = HOST_PROBE_TARGET
    takes_target_list = True

    check_flags = staticmethod(check_flags)
    check_targets = staticmethod(check_targets)

    def default_flags(self, target: TargetID, flags: Sequence[str]) -> tuple[str, ...]:
        """With Clang 19 ``-nocudainc -nocudalib``, with a newer one CUDA 13's ``include/cccl``
        (:func:`default_flags`); the same for every target."""
        return default_flags(self.toolchain, flags)

    def _jobs(self, targets: Sequence[TargetID], flags: Sequence[str]) -> tuple[tuple[str, ...], ...]:
        """The driver's jobs for a compile of ``targets`` (one, except :meth:`arch_list`'s probe)."""
        check_targets(targets)
        path = () if self.toolchain.cuda_path is None else (f"--cuda-path={self.toolchain.cuda_path}",)
        arches = tuple(f"--cuda-gpu-arch={target}" for target in targets)
        return probe(self.driver, (*flags, *path, *mode_flags(flags, arches)), self.cwd, self.cache)

    def _fail(self, targets: TargetID | Sequence[TargetID], what: str) -> ToolchainError:
        arches = " ".join(f"--cuda-gpu-arch={target}"
                          for target in ([targets] if isinstance(targets, TargetID) else targets))
        return ToolchainError(f"{self.driver} -### -x cuda {arches}: {what};"
                              " is this Clang with NVPTX support and a CUDA toolkit in $CUDA_PATH?")

    def _one(self, target: TargetID, jobs: Sequence[Sequence[str]], what: str, found: list) -> Sequence[str]:
        if len(found) != 1:
            raise self._fail(target, f"expected one {what} job, got {len(found)}")
        return found[0]

    def device_steps(self, target: TargetID, flags: Sequence[str] = ()) -> CudaDeviceSteps:
        """Templates for one target's device compile and ptxas, and the images it puts in the fat binary."""
        flags = tuple(flags)
        return self.memo((target, flags), lambda: self._device_steps(target, flags))

    def host_steps(self, flags: Sequence[str] = ()) -> CudaHostSteps:
        """The host compile's template and the fat binary's command; the template's only word that depends on
        the targets is the slot :data:`ARCH_LIST_SLOT` (Clang 20+, see :meth:`arch_list_values`)."""
        flags = tuple(flags)
        return self.memo(("host", flags), lambda: self._host_steps(flags))

    def arch_list(self, targets: Iterable[TargetID], flags: Sequence[str] = ()) -> str | None:
        """The value of ``-D__CUDA_ARCH_LIST__`` that the driver gives every job of one compile for all of
        ``targets``, or None where it defines no such macro (Clang 19). Asked of the driver itself (one
        ``-###`` probe with every target, memoized and cached like the others), so the rule (numeric, sorted,
        deduplicated, features such as ``90a`` dropped) is the driver's, whatever its version."""
        given, flags = tuple(targets), tuple(flags)  # every node of a source asks: keyed as given, sorted once
        if not given:
            raise ValueError("a CUDA compile has at least one target")
        return self.memo(("arch list", given, flags),
                         lambda: self._arch_list(tuple(sorted(set(given), key=str)), flags))

    def arch_list_values(self, template: CommandTemplate, targets: Iterable[TargetID],
                         flags: Sequence[str] = ()) -> dict[str, str]:
        """The value of ``template``'s :data:`ARCH_LIST_SLOT` for a source compiled for ``targets`` (a device
        or host compile's keyword for ``render``/``bind``); ``{}``, and no probe, where it has none."""
        if ARCH_LIST_SLOT not in template.slots:
            return {}
        targets = tuple(targets)
        value = self.arch_list(targets, flags)
        if value is None:
            raise self._fail(targets, f"the one-target jobs define {ARCH_LIST_PREFIX}... but these do not")
        return {ARCH_LIST_SLOT: value}

    def _arch_list(self, targets: tuple[TargetID, ...], flags: tuple[str, ...]) -> str | None:
        check_flags(flags)
        jobs = self._jobs(targets, flags)
        values = {arg[len(ARCH_LIST_PREFIX):] for job in jobs if is_cc1(job)
                  for arg in job if arg.startswith(ARCH_LIST_PREFIX)}
        if len(values) > 1:
            raise self._fail(targets, f"its jobs define different {ARCH_LIST_PREFIX} values {sorted(values)}")
        return values.pop() if values else None

    def _device_steps(self, target: TargetID, flags: tuple[str, ...]) -> CudaDeviceSteps:
        check_flags(flags)
        jobs = self._jobs([target], flags)
        rdc = is_rdc(flags)
        device = self._one(target, jobs, "device -cc1",
                           [job for job in jobs if is_cc1(job) and "-fcuda-is-device" in job])
        if not rdc and not pins_cuid(device):
            raise self._fail(target, "the device job does not carry the pinned -cuid")
        ptx = value_after(device, "-o") or ""
        ptxas = self._one(target, jobs, "ptxas", [job for job in jobs if tool_name(job).startswith("ptxas")])
        cubin = value_after(ptxas, "--output-file") or ""
        prefixes = {ARCH_LIST_PREFIX: ARCH_LIST_SLOT} if rdc else {"-cuid=": "cuid", ARCH_LIST_PREFIX: ARCH_LIST_SLOT}
        compile_template = job_template(device, input_slot="source", value_slots={"-main-file-name": "main_file_name"},
                                        prefix_slots=prefixes)
        assemble = job_template(ptxas, input_slot="input", input_value=ptx)
        suffix = os.path.splitext(ptx)[1]
        if rdc:
            # Clang 20+ names the packager llvm-offload-binary; the offload binary is the same format
            packager = self._one(target, jobs, "clang-offload-packager",
                                 [job for job in jobs if tool_name(job).startswith(PACKAGER_NAMES)])
            return CudaDeviceSteps(target, compile_template, suffix, assemble, (), image_spec(packager))
        fatbinary = self._one(target, jobs, "fatbinary",
                              [job for job in jobs if tool_name(job).startswith("fatbinary")])
        images = []
        for arg in fatbinary:
            match = _IMAGE_RE.fullmatch(arg) or _IMAGE3_RE.fullmatch(arg)
            if match is None:
                continue
            kind = {"sm": "elf", "compute": "ptx"}.get(match["kind"], match["kind"])
            if match["file"] != (cubin if kind == "elf" else ptx):
                raise self._fail(target, f"the fatbinary image {arg} is not this target's {kind}")
            images.append(FatbinImage(kind, match["sm"]))
        if not images:
            raise self._fail(target, f"cannot read the images of {' '.join(fatbinary)}")
        return CudaDeviceSteps(target, compile_template, suffix, assemble, tuple(images))

    def _host_steps(self, flags: tuple[str, ...]) -> CudaHostSteps:
        check_flags(flags)
        target = HOST_PROBE_TARGET
        jobs = self._jobs([target], flags)
        host = self._one(target, jobs, "host -cc1",
                         [job for job in jobs if is_cc1(job) and "-fcuda-is-device" not in job])
        if is_rdc(flags):
            if not any(arg.startswith("-fembed-offload-object=") for arg in host):
                raise self._fail(target, "the RDC host job does not embed an offload binary")
            template = job_template(host, input_slot="source", value_slots={"-main-file-name": "main_file_name"},
                                    prefix_slots={"-fembed-offload-object=": "package",
                                                  ARCH_LIST_PREFIX: ARCH_LIST_SLOT})
            return CudaHostSteps(template, None)
        if "-fcuda-include-gpubinary" not in host or not pins_cuid(host):
            raise self._fail(target, "the host job does not include a GPU binary with the pinned -cuid")
        compile_template = job_template(host, input_slot="source",
                                        prefix_slots={"-cuid=": "cuid", ARCH_LIST_PREFIX: ARCH_LIST_SLOT},
                                        value_slots={"-main-file-name": "main_file_name",
                                                     "-fcuda-include-gpubinary": "fatbin"})
        fatbinary = self._one(target, jobs, "fatbinary",
                              [job for job in jobs if tool_name(job).startswith("fatbinary")])
        argv: list[str | Slot] = []
        skip = False
        for arg in fatbinary:
            if skip:
                skip = False
            elif arg == "--create":
                argv += [arg, Slot("output")]
                skip = True
            elif not arg.startswith(("--image=", "--image3=")):
                argv.append(arg)
        return CudaHostSteps(compile_template, CommandTemplate(tuple(argv)))

    def kept_compile_output(self, image: str, rdc: bool) -> str | None:
        """The PTX beside the cubin (``<cubin>.ptx``), without relocatable device code."""
        return None if rdc else image + KEPT_PTX_SUFFIX

    def fatbin_job(self, flags: Sequence[str], images: Sequence[tuple[TargetID, str]], output: str, *,
                   environ: Mapping[str, str]) -> FatbinJob:
        """The toolkit's ``fatbinary`` of the cubins and, where the driver puts it in, the PTX kept beside each
        (:meth:`kept_compile_output`)."""
        host_flags = self.flags_for(self.host_probe_target, flags)
        cubins, kept, parts = [], [], []
        for target, cubin in images:
            steps = self.device_steps(target, self.flags_for(target, flags))
            ptx = cubin + KEPT_PTX_SUFFIX
            if any(image.kind == "ptx" for image in steps.images):
                kept.append(ptx)
            cubins.append(cubin)
            parts.append((steps, ptx, cubin))
        argv = fatbinary_command(self.host_steps(host_flags), parts, output)
        return FatbinJob((*cubins, *kept), tuple(kept), command=tuple(argv))


def fatbinary_command(host: CudaHostSteps, images: Sequence[tuple[CudaDeviceSteps, str, str]],
                      output: str) -> list[str]:
    """The ``fatbinary`` call of one source: ``images`` as (steps, PTX path, cubin path) in fat-binary order."""
    if host.fatbinary is None:
        raise ValueError("RDC: no fat binary per source")
    argv = host.fatbinary.render(output=output)
    for steps, ptx, cubin in images:
        argv += [image.argument(cubin if image.kind == "elf" else ptx) for image in steps.images]
    return argv


def program_fatbinary(toolchain: Toolchain, images: Sequence[tuple[str, str]], scratch: str) -> bytes:
    """The fat binary of a program's CUDA registration, ``images`` as ``(target ID, linked cubin)``: CUDA 13's
    ``fatbinary --image3=kind=elf,sm=NN`` of each, in target-ID order (Clang 19's linker wrapper writes
    ``--image=profile=``, which CUDA 13 rejects). Written to ``scratch.fatbin``, read and removed. One writer
    for the SCons tool's wrap node and ``offload-link`` (:mod:`offload_builders.linking.wrapping`)."""
    import subprocess

    from offload_builders.errors import OffloadError
    fatbin = scratch + ".fatbin"
    try:
        argv = cuda_fatbinary_command(str(toolchain.cuda_tool("fatbinary")), sorted(images), fatbin)
        done = subprocess.run(argv, capture_output=True, text=True, errors="surrogateescape")
        if done.returncode != 0:
            raise OffloadError(f"{' '.join(argv)} failed: {done.stderr.strip() or done.stdout.strip()}")
        with open(fatbin, "rb") as f:
            return f.read()
    finally:
        if os.path.exists(fatbin):
            os.unlink(fatbin)


__all__ = [
    "ARCH_LIST_CHECKED", "ARCH_LIST_PREFIX", "ARCH_LIST_RECORD_VERSION", "ARCH_LIST_SLOT", "CCCL_INCLUDE",
    "CUDA_LANGUAGE", "CUDA_SUFFIXES", "CudaDeviceSteps", "CudaHostSteps", "CudaPhaseModel", "FatbinImage",
    "HOST_PROBE_TARGET", "RESERVED_FLAG_PREFIXES", "arch_list_listed", "arch_list_record", "check_arch_list",
    "check_flags", "check_targets", "default_flags", "fatbin_order", "fatbinary_command", "package_command",
    "preprocess_command", "probe", "program_fatbinary", "records_arch_list",
]
