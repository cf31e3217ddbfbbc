"""One contract for every ddplab.course lab module (the notebooks, `make workbook` and the tests
rely on it). The claims themselves are the register's (tests/test_claims.py)."""
import html
import importlib
import inspect
import json
import re
from pathlib import Path

import pytest

from ddplab.course import articles, claims
from ddplab.origins import catalog

ROOT = Path(__file__).resolve().parents[1]
MODULES = sorted(p.stem for p in (ROOT / "src" / "ddplab" / "course").glob("lab[0-9][0-9].py"))
SEED_NAME = re.compile(r"\d{3}_[0-9a-f]{16}\.txt")


def test_every_lab_has_a_workbook_module():
    assert {lab.number for lab in catalog.labs()} <= {m[3:] for m in MODULES}


@pytest.mark.parametrize("name", MODULES)
def test_lab_module_contract(name):
    m = importlib.import_module(f"ddplab.course.{name}")
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
def test_lab_module_keeps_the_protocol_by_signature(name):
    """`ddplab.course.contract.WorkbookLab`, checked with inspect.signature: validate(**knobs),
    run_variant(variant, **knobs) -> RunResult, EXERCISES of answers.Exercise, claim_inputs(runs) -> claims.Inputs;
    and validate refuses an unknown knob with a DdplabError before any rank starts."""
    from ddplab import DdplabError
    from ddplab.course import contract

    m = importlib.import_module(f"ddplab.course.{name}")
    assert contract.problems(m) == []
    assert isinstance(m, contract.WorkbookLab)
    m.validate()
    with pytest.raises(DdplabError, match="unknown knob"):
        m.validate(no_such_knob=1)


def test_contract_check_reads_signatures_not_names():
    """A module with every name but the wrong signatures fails the check, one problem per member."""
    import types

    from ddplab.course import answers
    from ddplab.course import contract

    def validate(mem_limit_mb):            # a required knob, no **knobs
        pass

    def run_variant(v, steps):             # not `variant`, a knob without a default, no **knobs, no RunResult
        pass

    def judge(value, run):                 # not `answer` first, no Check
        pass

    bad = types.SimpleNamespace(LAB="1", validate=validate, run_variant=run_variant,
                                EXERCISES={"x": answers.Exercise("y", answers.Rank(2), judge)},
                                claim_inputs=lambda a, b: None)
    got = contract.problems(bad)
    for words in ("two-digit", "validate must take **knobs", "defaults (validate()", "first parameter is `variant`",
                  "run_variant must take **knobs", "return a RunResult", "EXERCISES['x']", "claim_inputs takes one",
                  "claim_inputs is annotated to return"):
        assert any(words in p for p in got), (words, got)


@pytest.mark.parametrize("name", MODULES)
def test_every_claim_is_shown_by_its_notebook(name):
    """The stored notebook shows every claim the module declares (its quotation in an output)."""
    nb = next((ROOT / "course-src" / "executed").glob(f"{name[3:]}_*.ipynb"))     # the stored execution
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
