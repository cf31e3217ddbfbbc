"""`make workbook`: run every lab's variants, execute every notebook headless, write a summary.

    python -m ddplab.workbook.build --out build [--labs 01 02] [--no-notebooks]

Prints one line per run as it finishes, then a table (lab, variant, expected, status, signature,
wall seconds) that is also written to build/summary.md; results go to build/results/*.json and the
executed notebooks to build/notebooks/. Exits 1 if any variant did not show its expected outcome or
any notebook failed.
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .. import catalog
from ..launch import run
from ..result import RunResult


@dataclass(frozen=True)
class Row:
    lab: str
    variant: str
    expected: str
    status: str
    signature: str | None
    wall_s: float
    as_expected: bool

    def to_dict(self) -> dict:
        return self.__dict__.copy()


def run_labs(numbers: list[str] | None, out: Path) -> list[Row]:
    rows = []
    (out / "results").mkdir(parents=True, exist_ok=True)
    for lab in catalog.labs():
        if numbers and lab.number not in numbers:
            continue
        runner = _runner(lab.number)
        for v in lab.variants:
            r: RunResult = runner(v.name)
            ok = r.status == v.expect and (v.signature is None or r.signature == v.signature)
            row = Row(lab.number, v.name, f"{v.expect}" + (f" [{v.signature}]" if v.signature else ""),
                      r.status, r.signature, r.wall_s, ok)
            rows.append(row)
            r.save(out / "results" / f"{lab.id}-{v.name}.json")
            print(f"{'  ' if ok else '!!'} {lab.number} {v.name:<24} {r.status:<7} {r.signature or '':<28} "
                  f"{r.wall_s:6.1f} s", flush=True)
    return rows


def _runner(number: str):
    """A lab's own workbook runner when it has one (it sets the variant's knobs: a port held by
    another process, a rank that starts late, ...), else the plain launcher with the lab's defaults."""
    try:
        mod = importlib.import_module(f"ddplab.workbook.lab{number}")
    except ModuleNotFoundError:
        mod = None
    fn = getattr(mod, "run_variant", None) or getattr(mod, "run", None)
    return fn if fn is not None else (lambda variant: run(number, variant=variant, progress=None))


def execute_notebook(nb: Path, out: Path) -> None:
    """Execute one notebook headless with papermill, in its own folder (as `make workbook` and the
    tests do); raises papermill's error with the failing cell's output."""
    import papermill as pm

    pm.execute_notebook(str(nb), str(out), cwd=str(nb.parent), progress_bar=False, kernel_name="python3",
                        # the kernel's own startup warning (TCP without encryption, on localhost)
                        # printed once per notebook would bury the table
                        extra_arguments=["--IPKernelApp.log_level=ERROR"])


def run_notebooks(numbers: list[str] | None, out: Path) -> list[tuple[str, str, float]]:
    folder = catalog.REPO_DIR / "notebooks"
    (out / "notebooks").mkdir(parents=True, exist_ok=True)
    done = []
    for nb in sorted(folder.glob("[0-9][0-9]_*.ipynb")):
        if numbers and nb.name[:2] not in numbers and nb.name[:2] != "00":
            continue
        t0 = time.monotonic()
        try:
            execute_notebook(nb, out / "notebooks" / nb.name)
            status = "ok"
        except Exception as e:  # papermill raises PapermillExecutionError with the cell's error
            status = f"failed: {str(e).strip().splitlines()[-1][:120] if str(e).strip() else type(e).__name__}"
        done.append((nb.name, status, time.monotonic() - t0))
        print(f"{'  ' if status == 'ok' else '!!'} notebook {nb.name:<28} {status} {done[-1][2]:6.1f} s", flush=True)
    return done


def summary(rows: list[Row], notebooks: list[tuple[str, str, float]]) -> str:
    lines = ["| lab | variant | expected | status | failure signature | wall s | as expected |",
             "|---|---|---|---|---|---:|---|"]
    for r in rows:
        lines.append(f"| {r.lab} | {r.variant} | {r.expected} | {r.status} | {r.signature or ''} | "
                     f"{r.wall_s:.1f} | {'yes' if r.as_expected else 'NO'} |")
    if notebooks:
        lines += ["", "| notebook | status | seconds |", "|---|---|---:|"]
        lines += [f"| {n} | {s} | {t:.1f} |" for n, s, t in notebooks]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="build", help="output folder (default: build)")
    p.add_argument("--labs", nargs="*", help="only these lab numbers (default: all)")
    p.add_argument("--no-notebooks", action="store_true", help="run the variants only")
    a = p.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    print(f"ddplab workbook: running every lab variant ({len(catalog.labs())} labs), then the notebooks", flush=True)
    rows = run_labs(a.labs, out)
    notebooks = [] if a.no_notebooks else run_notebooks(a.labs, out)
    text = summary(rows, notebooks)
    (out / "summary.md").write_text(text)
    (out / "summary.json").write_text(json.dumps({"runs": [r.to_dict() for r in rows],
                                                  "notebooks": notebooks}, indent=2))
    print("\n" + text + f"\nwritten to {out / 'summary.md'} in {time.monotonic() - t0:.0f} s")
    bad = [r for r in rows if not r.as_expected] + [n for n in notebooks if n[1] != "ok"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
