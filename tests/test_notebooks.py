"""Every notebook executes headless under papermill with its CI-sized parameters (into
build/test-notebooks/). nbval, run by `make test` over notebooks/ with --nbval-lax, re-checks the
cells marked NBVAL_CHECK_OUTPUT against their committed outputs."""
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
OUT = ROOT / "build" / "test-notebooks"


def test_every_lab_has_a_notebook():
    from ddplab import catalog
    have = {p.name[:2] for p in NOTEBOOKS}
    assert {lab.number for lab in catalog.labs()} <= have


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_structure(path):
    nb = json.loads(path.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert "parameters" in code[0].get("metadata", {}).get("tags", []), "first code cell must be tagged parameters"
    src = "\n".join("".join(c["source"]) for c in code)
    assert "multiprocessing" not in src and "mp.spawn" not in src and "subprocess" not in src
    checked = [c for c in code if "NBVAL_CHECK_OUTPUT" in "".join(c["source"])]
    assert checked, "at least one deterministic cell is checked by nbval"
    assert all(c.get("outputs") for c in checked), "checked cells are committed with their outputs"


@pytest.mark.notebook
@pytest.mark.multiprocess
@pytest.mark.timeout(600)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes_under_papermill(path, session_runs_dir):
    from ddplab.workbook.build import execute_notebook

    OUT.mkdir(parents=True, exist_ok=True)
    out = OUT / path.name
    execute_notebook(path, out)
    nb = json.loads(out.read_text())
    errors = [o for c in nb["cells"] for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
    if path.name[:2] != "00":
        images = [o for c in nb["cells"] for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
        assert images, "a lab notebook plots its measured difference"
    from conftest import assert_nothing_left
    assert_nothing_left(str(session_runs_dir))
