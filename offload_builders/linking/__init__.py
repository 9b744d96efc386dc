"""The link side of offloading, split into steps a build system can schedule: extract, device link, wrap.

``clang-linker-wrapper`` (LLVM 19) does all of this inside one serial process: it scans the link inputs
for offload binaries, groups them by (triple, arch), links each group's device image, wraps the images in
registration code and finally runs the host linker. Here each step is a pure function, so that the SCons
tool can make one node per target and ``offload-link`` can run the same pipeline in parallel:

* :mod:`~offload_builders.linking.inputs`: the extract step (scanning link inputs, choosing each target's
  device files with Clang 19's rules, the link-time checks, the device input file between the steps);
* :mod:`~offload_builders.linking.device_link`: one target's device-link command, and the host link job;
* :mod:`~offload_builders.linking.nvptx_runtime`: the NVPTX device runtime's part of a device link as a
  step of its own;
* :mod:`~offload_builders.linking.kept_images`: ``offload-link``'s images of an output's last link, taken again
  where a target's device link is the same;
* :mod:`~offload_builders.linking.image_groups`: ``OFFLOAD_IMAGE_GROUPS``, one image per group of objects;
* :mod:`~offload_builders.linking.wrapping`: which offload kinds register each image, and the one
  registration object of a program;
* :mod:`~offload_builders.linking.registration`: the registration code itself, as
  ``clang-linker-wrapper`` generates it, over its IR vocabulary
  (:mod:`~offload_builders.linking.registration_ir`), with the image groups' registration
  (:mod:`~offload_builders.linking.group_registration`) and the code generation to an object
  (:mod:`~offload_builders.linking.registration_codegen`).

The extract and device-link steps' names are re-exported here, where the SCons tool and ``offload-link``
use them (``linking.scan_link_inputs``).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from offload_builders.linking.device_link import (
    DEVICE_RUNTIME,
    device_link_command,
    device_link_opt_flag,
    device_runtime,
    driver_opt_level,
    host_link_job,
    host_runtime_arguments,
    known_device_link,
    load_wrapper_compiler,
    probe_device_link,
    render_device_link,
)
from offload_builders.linking.inputs import (
    ENTRY_SECTIONS,
    HIP_ENTRY_SECTIONS,
    DeviceSymbol,
    GroupKey,
    InputObject,
    LinkError,
    LinkInput,
    ScannedInputs,
    belongs_to,
    check_entries,
    check_target_names,
    check_untargeted_entries,
    defined_symbols,
    device_input_kinds,
    device_symbols,
    group_device_files,
    group_key,
    missing_entries,
    objects_without_code,
    offload_kinds,
    openmp_image_binaries,
    read_device_inputs,
    registered_entries,
    scan_link_inputs,
    select_device_files,
    targets_compatible,
    unpack_device_inputs,
    write_device_inputs,
)

if TYPE_CHECKING:  # annotations name a found binary as ``linking.FoundBinary`` (the format readers load later)
    from offload_builders.formats.containers import FoundBinary as FoundBinary

__all__ = [
    "DEVICE_RUNTIME",
    "ENTRY_SECTIONS",
    "HIP_ENTRY_SECTIONS",
    "DeviceSymbol",
    "GroupKey",
    "InputObject",
    "LinkError",
    "LinkInput",
    "ScannedInputs",
    "belongs_to",
    "check_entries",
    "check_target_names",
    "check_untargeted_entries",
    "defined_symbols",
    "device_input_kinds",
    "device_link_command",
    "device_link_opt_flag",
    "device_runtime",
    "device_symbols",
    "driver_opt_level",
    "group_device_files",
    "group_key",
    "host_link_job",
    "host_runtime_arguments",
    "known_device_link",
    "load_wrapper_compiler",
    "missing_entries",
    "objects_without_code",
    "offload_kinds",
    "openmp_image_binaries",
    "probe_device_link",
    "read_device_inputs",
    "registered_entries",
    "render_device_link",
    "scan_link_inputs",
    "select_device_files",
    "targets_compatible",
    "unpack_device_inputs",
    "write_device_inputs",
]
