"""What the engine knows about the libraries users train with, as data: one module per library
(``lightning``, ``accelerate``, ``torch`` for torch's own wrappers), each a ``Library``: which files
are its own, what its frames do, what its own exceptions mean. Nothing here reads a run; the engine
asks ``entry`` for the library frame a user's call leads into, and ``exception`` for a library's own
exception type.

A place inside a library is the user's innermost frame (``ddplab.engine.stacks.where``) plus the
library frame it leads into: the frame the user called, when its library says what that frame
does (``LightningModule.log``, ``Accelerator.gather_for_metrics``), else the innermost frame of that
library that it describes (Lightning's backward inside ``trainer.fit``), else the frame the user
called, named by its package and function (any library, described or not).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

from ddplab.engine.libraries import accelerate as _accelerate
from ddplab.engine.libraries import lightning as _lightning
from ddplab.engine.libraries import torch as _torch


@dataclass(frozen=True)
class Library:
    id: str                                   # "lightning"
    name: str                                 # as shown: "Lightning"
    packages: tuple[str, ...]                 # top-level package folders whose files are its own
    frames: Mapping[tuple[str, str], str]     # (file inside the package, function) -> what it does
    # its own exception type -> (what it means, the fix)
    exceptions: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    sources: tuple[str, ...] = ()             # where users reported its exceptions
    # frames that are the library's own but not an entry point worth naming ("lightning/pytorch/...")
    skip: tuple[str, ...] = ()


def _load(module) -> Library:
    return Library(module.ID, module.NAME, tuple(module.PACKAGES), dict(module.FRAMES),
                   exceptions=dict(getattr(module, "EXCEPTIONS", {})), sources=tuple(getattr(module, "SOURCES", ())),
                   skip=tuple(getattr(module, "SKIP", ())))


LIBRARIES: tuple[Library, ...] = tuple(_load(m) for m in (_lightning, _accelerate, _torch))
BY_ID = {lib.id: lib for lib in LIBRARIES}


def _package_path(file: str) -> str | None:
    """The file's path from its top-level package ("lightning/pytorch/core/module.py"), or None for
    a file that is not an installed package's."""
    path = file.replace("\\", "/")
    for marker in ("site-packages/", "dist-packages/"):
        if marker in path:
            return path.split(marker, 1)[1]
    for lib in LIBRARIES:           # a library installed from a clone (pip install -e)
        for pkg in lib.packages:
            if f"/{pkg}/" in path:
                return pkg + "/" + path.split(f"/{pkg}/", 1)[1]
    return None


def owner(file: str) -> tuple[Library | None, str | None]:
    """(the library whose file it is, the path inside its package); (None, path) for another
    installed package; (None, None) for a file of no package."""
    rel = _package_path(file)
    if rel is None:
        return None, None
    for lib in LIBRARIES:
        for pkg in lib.packages:
            if rel.startswith(pkg + "/"):
                return lib, rel
    return None, rel


def role(lib: Library, rel: str, func: str) -> str | None:
    """The key ("core/module.py:log") of what the library's frame ``func`` in ``rel`` does, where
    the library says; ``describe`` gives its words."""
    name = func.rsplit(".", 1)[-1]
    for (tail, fn) in lib.frames:
        if fn == name and rel.endswith(tail):
            return f"{tail}:{fn}"
    return None


def describe(library: str, role_key: str | None) -> str | None:
    """What a library's frame does, in words ("Lightning's logging of self.log(...)"), or None."""
    lib = BY_ID.get(library)
    if lib is None or role_key is None:
        return None
    tail, _, fn = role_key.rpartition(":")
    return lib.frames.get((tail, fn))


@dataclass(frozen=True)
class Entry:
    """The library frame a user's call leads into: index into the frames, the library's id (or the
    package's name for a library described nowhere) and the role's description, if any."""
    index: int
    library: str
    role: str | None


def entry(frames: Sequence, user_index: int | None) -> Entry | None:
    """The library frame that the user's frame ``frames[user_index]`` (innermost first) leads into,
    or None when the user's frame calls torch.distributed itself (the op names the call then)."""
    if user_index is None or user_index == 0:
        return None
    inside = list(range(user_index - 1, -1, -1))          # from the user's call inwards
    first = inside[0]
    lib, rel = owner(frames[first].file)
    if rel is None:
        return None
    if lib is None:
        package = rel.split("/", 1)[0]
        return Entry(first, package, None)
    what = role(lib, rel, frames[first].func)
    if what is not None:
        return Entry(first, lib.id, what)
    for i in reversed(inside):                             # innermost described frame of that library
        l2, r2 = owner(frames[i].file)
        if l2 is lib:
            w2 = role(lib, r2, frames[i].func)
            if w2 is not None:
                return Entry(i, lib.id, w2)
    if any(rel.startswith(s) for s in lib.skip):
        return None
    return Entry(first, lib.id, None)


def name_of(library: str) -> str:
    """A library's name as shown ("Lightning"), or the package's own name."""
    lib = BY_ID.get(library)
    return lib.name if lib is not None else library


def raised_by(lib: Library):
    """A premise (over ``reasons.FailureFacts``): the exception was raised in one of ``lib``'s own files."""
    def holds(facts) -> bool:
        frames = getattr(facts, "frames", ())
        return bool(frames) and owner(frames[0].file)[0] is lib
    return holds
