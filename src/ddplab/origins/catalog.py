"""The lab list, read from the lab scripts themselves.

Each ``labs/NN_name.py`` holds a literal ``LAB = {...}`` dict (title, article, variants with the
outcome each one must show, the stall window if not the default). It is read with ``ast`` so listing the labs does not
import torch, and the script stays the one place its variants are named (its argparse ``choices``
come from the same dict).
"""
from __future__ import annotations

import ast
import os
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path

from ddplab.defaults import DEFAULT_STALL_S
from ddplab.errors import DdplabError

PACKAGE_DIR = Path(__file__).resolve().parents[1]
REPO_DIR = PACKAGE_DIR.parent.parent
# the stored execution of the notebooks (make notebooks; notebooks/ holds the learner's copies, no output)
EXECUTED_DIR = REPO_DIR / "course-src" / "executed"


def labs_dir() -> Path:
    """Where the lab scripts live: $DDPLAB_LABS_DIR, else ``labs/`` of this checkout."""
    return Path(os.environ.get("DDPLAB_LABS_DIR", REPO_DIR / "labs"))


@dataclass(frozen=True)
class Variant:
    name: str
    expect: str               # "ok", "failed" or "hung"
    signature: str | None     # the failure signature it must show (None for ok)
    about: str
    measured: str | None = None   # what it measures, when its verdicts compare times: it runs alone (ddplab.origins.turns)

    def to_dict(self) -> dict:
        return {"name": self.name, "expect": self.expect, "signature": self.signature, "about": self.about,
                "measured": self.measured}


@dataclass(frozen=True)
class Lab:
    number: str               # "01"
    name: str                 # "hang"
    title: str
    article: str              # seed file name
    path: Path
    variants: tuple[Variant, ...]
    stall_s: float            # the stall window its runs are judged with (ddplab.engine.supervise)
    nproc: int
    min_nproc: int = 1
    extra: dict = field(default_factory=dict, compare=False)

    @property
    def id(self) -> str:
        return f"{self.number}_{self.name}"

    @property
    def default_variant(self) -> str:
        return self.variants[0].name

    def variant(self, name: str) -> Variant:
        for v in self.variants:
            if v.name == name:
                return v
        names = ", ".join(v.name for v in self.variants)
        raise DdplabError(f"lab {self.number} has no variant '{name}'", hint=f"choose one of: {names}")

    def to_dict(self) -> dict:
        return {"number": self.number, "name": self.name, "title": self.title, "article": self.article,
                "path": str(self.path), "variants": [v.to_dict() for v in self.variants],
                "stall_s": self.stall_s, "nproc": self.nproc, "min_nproc": self.min_nproc}


_LAB_FILE = re.compile(r"^(\d\d)_([a-z0-9_]+)\.py$")


_PARSE = threading.Lock()
_TREES: dict[tuple[str, int, int], ast.Module] = {}


def parse(path: Path) -> ast.Module:
    """The syntax tree of a Python file, parsed once per (path, mtime, size).

    CPython 3.11 before 3.11.8 keeps ast.parse's recursion counter in shared state
    (python/cpython#106905): a parse that overlaps another thread's (traceback formatting in 3.11
    calls ast.parse too, which no lock here can cover) raises a spurious
    "SystemError: AST constructor recursion depth mismatch". The lock covers ddplab's own parses;
    a spurious error is retried, and a real one (a SyntaxError, a mismatch that repeats) is raised.
    """
    st = path.stat()
    key = (str(path), st.st_mtime_ns, st.st_size)
    with _PARSE:
        tree = _TREES.get(key)
        if tree is None:
            source = path.read_text()
            for attempt in range(5):
                try:
                    tree = ast.parse(source, filename=str(path))
                    break
                except SystemError as e:
                    if "recursion depth mismatch" not in str(e) or attempt == 4:
                        raise
            _TREES[key] = tree
    return tree


def read_lab(path: Path) -> Lab:
    """Parse the literal ``LAB`` dict of one lab script."""
    m = _LAB_FILE.match(path.name)
    if not m:
        raise ValueError(f"{path.name}: lab scripts are named NN_name.py")
    tree = parse(path)
    spec = None
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "LAB" for t in node.targets):
            spec = ast.literal_eval(node.value)
    if spec is None:
        raise ValueError(f"{path}: no literal LAB = {{...}} dict at module level")
    variants = tuple(
        Variant(name, v.get("expect", "ok"), v.get("signature"), v.get("about", ""), v.get("measured"))
        for name, v in spec["variants"].items()
    )
    known = {"title", "article", "variants", "stall_s", "nproc", "min_nproc"}
    return Lab(number=m.group(1), name=m.group(2), title=spec["title"], article=spec.get("article", ""),
               path=path, variants=variants, stall_s=float(spec.get("stall_s", DEFAULT_STALL_S)),
               nproc=int(spec.get("nproc", 2)), min_nproc=int(spec.get("min_nproc", 1)),
               extra={k: v for k, v in spec.items() if k not in known})


def labs() -> list[Lab]:
    """Every lab, in number order."""
    folder = labs_dir()
    if not folder.is_dir():
        return []
    return [read_lab(p) for p in sorted(folder.glob("[0-9][0-9]_*.py"))]


def find_lab(target: str | int) -> Lab | None:
    """A lab by number (1, "1", "01"), id ("01_hang") or name ("hang"); None if there is none."""
    key = str(target).strip()
    if key.endswith(".py"):
        return None
    for lab in labs():
        if key in (lab.number, lab.id, lab.name) or (key.isdigit() and int(key) == int(lab.number)):
            return lab
    return None
