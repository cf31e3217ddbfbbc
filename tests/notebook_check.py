"""One notebook executed once (papermill) and its cells tagged nbval-check-output compared with the stored
outputs: shared by tests/test_notebooks.py (00-06) and tests/test_notebooks_later.py (07-11), two
files so that pytest-xdist's --dist loadfile puts the executions on both workers."""
import json
from pathlib import Path

from ddplab.course import build

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
OUT = ROOT / "build" / "test-notebooks"
SPLIT = "07"     # about half of the stored execution's seconds on each side
FIRST = [p for p in NOTEBOOKS if p.name[:2] < SPLIT]
LATER = [p for p in NOTEBOOKS if p.name[:2] >= SPLIT]


def execute_and_compare(path: Path, runs_dir: Path) -> None:
    need = build.requirement(path.name[:2])      # the build skips the same notebooks, for the same reason
    if need is not None:
        import pytest
        pytest.skip(f"{path.stem}: {need}")
    OUT.mkdir(parents=True, exist_ok=True)
    out = OUT / path.name
    build.execute_notebook(path, out, runs_dir=runs_dir / path.stem)
    nb = json.loads(out.read_text())
    errors = [o for c in nb["cells"] for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
    if path.name[:2] != "00":
        images = [o for c in nb["cells"] for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
        assert images, "a lab notebook plots its measured difference"
    differ = build.compare_checked(json.loads(path.read_text()), nb)
    assert not differ, "\n".join(map(str, differ))
    from conftest import assert_nothing_left
    assert_nothing_left(str(runs_dir))
