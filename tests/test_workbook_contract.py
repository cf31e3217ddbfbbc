"""One contract for every ddplab.workbook lab module (the notebooks, `make workbook` and the tests
rely on it). The claims themselves are the register's (tests/test_claims.py)."""
import html
import importlib
import inspect
import json
import re
from pathlib import Path

import pytest

from ddplab import articles, catalog, claims

ROOT = Path(__file__).resolve().parents[1]
MODULES = sorted(p.stem for p in (ROOT / "src" / "ddplab" / "workbook").glob("lab[0-9][0-9].py"))
SEED_NAME = re.compile(r"\d{3}_[0-9a-f]{16}\.txt")


def test_every_lab_has_a_workbook_module():
    assert {lab.number for lab in catalog.labs()} <= {m[3:] for m in MODULES}


@pytest.mark.parametrize("name", MODULES)
def test_lab_module_contract(name):
    m = importlib.import_module(f"ddplab.workbook.{name}")
    number = name[3:]
    lab = catalog.find_lab(number)
    assert lab is not None and m.LAB == number
    assert callable(m.run_variant) and callable(m.claim_inputs)
    # lab facts come from the catalog: no module re-declares its article's file name
    assert not [k for k, v in vars(m).items() if isinstance(v, str) and SEED_NAME.fullmatch(v)]
    src = inspect.getsource(m)
    assert not re.search(r"\b(Claim|verdict)\(|\bverdict=", src), "a lab supplies parts; the register judges"
    assert claims.for_lab(number), "the register gives every lab its claims"
    # exercises: a dict of checkers, each tested in the lab's test file, each answered in its solutions file
    assert isinstance(m.EXERCISES, dict) and m.EXERCISES
    tests = (ROOT / "tests" / f"test_lab{number}.py").read_text()
    solutions = list((ROOT / "solutions").glob(f"{number}_*.md"))
    assert len(solutions) == 1, f"solutions/{number}_<topic>.md holds the instructor's answers"
    answers = solutions[0].read_text()
    for key, fn in m.EXERCISES.items():
        assert callable(fn) and fn.__name__ in tests, f"{fn.__name__} has no test in test_lab{number}.py"
        assert key in answers, f"{solutions[0].name} does not answer exercise {key!r}"


@pytest.mark.parametrize("name", MODULES)
def test_every_claim_is_shown_by_its_notebook(name):
    """The stored notebook shows every claim the module declares (its quotation in an output)."""
    nb = next((ROOT / "notebooks").glob(f"{name[3:]}_*.ipynb"))
    cells = json.loads(nb.read_text())["cells"]
    shown = "\n".join("".join(v) if isinstance(v, list) else str(v)
                      for c in cells for o in c.get("outputs", []) for v in o.get("data", {}).values())
    shown = html.unescape(shown)
    missing = [c.key for c in claims.for_lab(name[3:]) if articles.normalise(c.quote) not in articles.normalise(shown)]
    assert not missing, f"{nb.name} does not show claims {missing}"


def test_quotation_check_rejects_altered_words():
    if articles.articles_dir() is None:
        pytest.skip("the articles are not beside this checkout")
    real = "Packets might be dropped or delayed, causing processes to stall indefinitely while waiting for others."
    assert articles.quoted_in(real, "000")
    assert not articles.quoted_in(real.replace("might", "may"), "000")
    assert not articles.quoted_in(real, "001")
