"""Apply one operator (operators.py) to its base program: a mutant file and its label, by construction.

A site is the line that carries ``# @site:NAME`` in a base (or, for a lab script, the first line that matches
``re:REGEX``). An edit replaces that line, inserts lines before or after it (each new line indented like the
site line), or deletes it. The line to fix is the first edit's ``fault``-th new line (for a deletion: the
line that now stands where the deleted one was); ``also_fix`` sites add the lines where a fix is as right.
Every ``# @site:`` marker is removed from the mutant, so it reads like the user's code.
"""
from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from operators import BASES, OPERATORS

ROOT = Path(__file__).resolve().parents[2]
MARK = re.compile(r"\s*# @site:[\w-]+\s*$")
COUNTS = (2, 4, 8)


@dataclass(frozen=True)
class Mutant:
    id: str
    path: str                  # the mutant file
    args: tuple[str, ...]      # the script's arguments
    status: str                # expected: "failed", "hung", "ok"
    culprit: str               # "0", "last", "nonzero", "all"
    fix_lines: tuple[int, ...]  # 1-based lines of the mutant where the fix belongs
    cause: str
    check: bool
    ranks: tuple[int, ...]

    def culprits(self, nproc: int) -> tuple[int, ...]:
        return {"0": (0,), "last": (nproc - 1,), "nonzero": tuple(range(1, nproc)),
                "all": tuple(range(nproc))}[self.culprit]

    def to_dict(self) -> dict:
        return asdict(self)


def _find(lines: list[list], site: str) -> int:
    if site.startswith("re:"):
        rx = re.compile(site[3:])
        hits = [i for i, (text, _) in enumerate(lines) if rx.search(text)]
    else:
        rx = re.compile(rf"# @site:{re.escape(site)}\s*$")
        hits = [i for i, (text, _) in enumerate(lines) if rx.search(text)]
    if len(hits) != 1:
        raise ValueError(f"site {site!r}: {len(hits)} matching lines (need exactly one)")
    return hits[0]


def apply(op: dict, base_text: str) -> tuple[str, tuple[int, ...]]:
    """The mutant's text and its fix lines (1-based)."""
    lines = [[t, set()] for t in base_text.splitlines()]
    for site in op["also_fix"]:
        lines[_find(lines, site)][1].add("fix")
    for n, (site, action, code) in enumerate(op["edits"]):
        i = _find(lines, site)
        indent = re.match(r"\s*", lines[i][0]).group(0)
        new = [[indent + c if c.strip() else "", set()] for c in code.split("\n")] if action != "delete" else []
        if n == 0 and new:
            new[op["fault"]][1].add("fix")
        if action == "replace":
            lines[i:i + 1] = new
        elif action == "before":
            lines[i:i] = new
        elif action == "after":
            lines[i + 1:i + 1] = new
        elif action == "delete":
            del lines[i]
            if n == 0:
                lines[i][1].add("fix")
        else:
            raise ValueError(f"{op['id']}: unknown action {action!r}")
    text = "\n".join(MARK.sub("", t) for t, _ in lines) + "\n"
    return text, tuple(k + 1 for k, (_, tags) in enumerate(lines) if "fix" in tags)


def build(op: dict, out_dir: Path) -> Mutant:
    base = BASES[op["base"]]
    text, fix = apply(op, (ROOT / base["path"]).read_text())
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{op['id']}.py"
    path.write_text(text)
    return Mutant(op["id"], str(path), tuple(base["args"]), op["status"], op["culprit"], fix, op["cause"],
                  op["check"], tuple(op["ranks"]))


def load_causes() -> dict:
    return json.loads((Path(__file__).parent / "causes.json").read_text())


def operators() -> list[dict]:
    return list(OPERATORS)
