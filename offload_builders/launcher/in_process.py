"""Jobs the launcher makes itself, byte for byte as their tools would, where starting the tool costs more than
the work: the packager, and the host back end's object where only the package it embeds changed.

* **The packager** (``clang-offload-packager``, Clang 22's ``llvm-offload-binary``): its output is
  :func:`~offload_builders.formats.offload_binary.write_offload_binaries` of its ``--image=`` words, the same
  bytes (the format's differential tests). Only for images of kind ``openmp`` or ``cuda`` (or none), whose enum
  values are the same in every LLVM release since 15; anything else in its words runs the tool.
* **The embedding back end** (``clang -cc1 ... -emit-obj -fembed-offload-object=<package> -x ir <host.bc>``): the
  package is a constant in the object's ``.llvm.offloading`` section that nothing refers to, so the object for
  another package is the same object with that section's bytes replaced and the sections after it moved
  (:func:`~offload_builders.formats.elf.llvm_object_with_section`, which first checks that the stored object's
  own layout is exactly the writer's). Adding a target changes the package only: the object the same job made
  with the earlier package (same words, same host bitcode, same compiler) is found by the job's key without the
  package, its section checked to hold exactly that package, and rewritten. Without one, the job runs.
"""
from __future__ import annotations

import os

from offload_builders.launcher.keys import Key, bytes_digest
from offload_builders.launcher.store import CacheStore

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

#: The packager's names: Clang up to 21, and 22's (the same format and options for these images).
PACKAGERS = ("clang-offload-packager", "llvm-offload-binary")
#: Offload kinds whose numbers no LLVM release has changed (HIP's went from 3 to 4 in 21).
_STABLE_KINDS = ("openmp", "cuda")
_EMBED = "-fembed-offload-object="
_OFFLOADING_SECTION = ".llvm.offloading"


def packaged_here(words: Sequence[str], output: str) -> bool:
    """Write the package the packager job ``words`` (its output already named ``output``) would write; False, with
    nothing written, where the words are not ones this follows (the tool then runs, and says what it says)."""
    if os.path.basename(words[0]) not in PACKAGERS:
        return False
    from offload_builders.formats.offload_binary import (
        OffloadingImage,
        kind_table,
        packager_arguments,
        packager_images,
        write_offload_binaries,
    )

    specs = []
    rest = list(words[1:])
    while rest:
        word = rest.pop(0)
        if word == "-o" and rest and rest[0] == output:
            rest.pop(0)
        elif word.startswith("--image="):
            specs.append(word[len("--image="):])
        else:
            return False
    if not specs or any(dict(packager_arguments(spec)).get("kind", "openmp") not in _STABLE_KINDS for spec in specs):
        return False
    table = kind_table(19)
    try:
        images: list[OffloadingImage] = [image for spec in specs for image in packager_images(spec, table)]
        write_offload_binaries(images, output)
    except (OSError, ValueError):
        return False
    return True


class Embedding:
    """An embedding back-end job on a miss: where the objects it made with other packages are recorded."""

    __slots__ = ("key", "package", "named")

    def __init__(self, key: str, package: str, named: str) -> None:
        #: The job's key without its package (a file list name in the store).
        self.key = key
        #: The digest of the package this run embeds.
        self.package = package
        #: The package as the job's words name it (the earlier job's output).
        self.named = named


def embedding_of(words: Sequence[str], key_parts: Sequence[str]) -> Embedding | None:
    """The :class:`Embedding` of a job whose key is made of ``key_parts`` (its words among them with the earlier
    jobs' outputs as ``@<digest>@``), if it is a back end that writes an object with one package an earlier job
    made; else None."""
    if "-cc1" not in words[1:2] or "-emit-obj" not in words:
        return None
    embedded = [part for part in key_parts if part.startswith(_EMBED)]
    named = [word for word in words if word.startswith(_EMBED)]
    if len(embedded) != 1 or len(named) != 1:
        return None
    package = embedded[0][len(_EMBED):]
    if not (package.startswith("@") and package.endswith("@")):
        return None
    parts = [_EMBED + "@package@" if part == embedded[0] else part for part in key_parts]
    return Embedding(Key("embedding", *parts).hex(), package.strip("@"), named[0][len(_EMBED):])


def embedded_here(store: CacheStore, embedding: Embedding, package: str, output: str) -> str | None:
    """Write to ``output`` the object the job of ``embedding`` makes with the package at ``package``, from an
    object the same job made with another package; its diagnostics. None: there is none, or it is not one whose
    section can be replaced exactly (the job then runs)."""
    import json

    from offload_builders.formats.elf import llvm_object_with_section

    content: bytes | None = None
    for listed in store.file_lists(embedding.key):
        object_key, earlier = listed[0]
        if len(listed) != 1 or earlier == embedding.package:
            continue
        entry = store.lookup(object_key, remote=False)
        if entry is None:
            continue
        with entry:
            try:
                meta = json.loads(entry.meta)
                stderr = str(meta["stderr"])
                made = entry.read("out")
            except (OSError, KeyError, ValueError, TypeError):
                continue
        if _section_digest(made) != earlier:
            continue
        if content is None:
            with open(package, "rb") as f:
                content = f.read()
        rewritten = llvm_object_with_section(made, _OFFLOADING_SECTION, content)
        if rewritten is None:
            continue
        with open(output, "wb") as f:
            f.write(rewritten)
        return stderr
    return None


def remember_embedding(store: CacheStore, embedding: Embedding, object_key: str) -> None:
    """Record that the entry ``object_key`` holds the object of ``embedding``'s job with its package."""
    store.add_file_list(embedding.key, [(object_key, embedding.package)])


def _section_digest(data: bytes) -> str | None:
    """The digest of the bytes of the object's ``.llvm.offloading`` section (None: no such one section)."""
    from offload_builders.errors import OffloadFormatError
    from offload_builders.formats.elf import read_sections

    try:
        table = read_sections(lambda length, at: data[at:at + max(0, length)], len(data))
    except OffloadFormatError:
        return None
    found = [section for section in table.sections if section.name == _OFFLOADING_SECTION]
    if len(found) != 1:
        return None
    return bytes_digest(data[found[0].sh_offset:found[0].sh_offset + found[0].file_size])
