"""A sample of the fault-injection suite (benchmarks/faults): a few mutants per family (init, crash, hang,
silent), each run for real at 2 ranks through ddplab.run and scored by the suite's own rules
(benchmarks/faults/run.py: score). The engine must give the labelled status, point at the culprit rank
and the line to fix, and name no cause of another class; a regression in any of these fails here.

The mutants are built from the operators' data (labelled by construction, see operators.py); the full
suite and its table are `python benchmarks/faults/run.py`.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

import ddplab
from conftest import assert_nothing_left

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "faults"))
import mutate  # noqa: E402
import run as suite  # noqa: E402

# One per family (init, crash, hang, silent): a text-signature failure, a crash the catalog has no entry
# for (no cause may be named then, and place still counts), a collective on rank 0 only (the engine blames
# rank 0 from the rank condition above it), and a silent mistake found by --check; and one whose place is
# the line that set the failure up, not the line that raised (a layer __init__ defines and forward never uses,
# found from DDP's unused-parameters error: result.fix_at; the argument-parse case runs in test_reasoning).
# Five runs keep the file around a minute on a loaded 2-core machine.
SAMPLE = ("init-twice", "device-count-modulo", "barrier-in-save-branch", "no-set-epoch", "unused-parameter")
BY_ID = {op["id"]: op for op in mutate.operators()}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Each sampled mutant run once, at 2 ranks, for real: {id: (Mutant, RunResult)}, filled on first use."""
    root = tmp_path_factory.mktemp("faults")
    done = {}

    def get(op_id):
        if op_id not in done:
            m = mutate.build(BY_ID[op_id], root / "mutants")
            result = ddplab.run(Path(m.path), nproc=2, args=list(m.args), stall_s=suite.STALL_S, check=m.check,
                                deadline_s=suite.DEADLINE_S, progress=None, run_root=root / "runs")
            suite.remove_temp_of(result.port)   # the snapshot and folders it wrote in the temp folder
            assert_nothing_left(str(root / "runs"))
            done[op_id] = (m, result)
        return done[op_id]
    return get


@pytest.mark.parametrize("op_id", SAMPLE)
def test_engine_status_place_and_no_wrong_cause(op_id, runs):
    m, result = runs(op_id)
    s = suite.score(m, 2, result, mutate.load_causes())
    assert s["status_ok"], f"{op_id}: status {s['status']}, labelled {m.status}"
    if s["place_ok"] is not None:
        assert s["place_ok"], (f"{op_id}: culprits {m.culprits(2)}, fix lines {m.fix_lines}; engine: first failure "
                               f"{s['first_failure']}, frames {s['frames']}")
    assert not s["wrong_causes"], f"{op_id}: named {s['wrong_causes']}, not of class {m.cause}"


def test_scoring_catches_a_wrong_place_and_a_wrong_cause(runs):
    """The scorer is not a rubber stamp: the same run, scored against a label that moves the fix line and
    the class, fails on both counts (so the sample above can fail)."""
    m, result = runs("init-twice")
    moved = mutate.Mutant(**{**m.to_dict(), "fix_lines": (1,), "cause": "duplicate-rank"})
    s = suite.score(moved, 2, result, mutate.load_causes())
    assert s["status_ok"] and s["place_ok"] is False
    assert result.signature == "process-group-initialized-twice" and s["wrong_causes"] == [result.signature]
    hung = mutate.Mutant(**{**m.to_dict(), "status": "hung"})
    assert suite.score(hung, 2, result, mutate.load_causes())["status_ok"] is False


def test_every_operator_builds_a_labelled_mutant_with_a_source(tmp_path):
    """Every operator applies to its base (one site each), compiles, has a line to fix and a reported source,
    and its class is in causes.json (the one map to the engine's ids)."""
    classes = mutate.load_causes()["classes"]
    for op in mutate.operators():
        m = mutate.build(op, tmp_path)
        text = Path(m.path).read_text()
        compile(text, m.path, "exec")
        assert not any(mutate.MARK.search(line) for line in text.splitlines()), op["id"]
        assert m.fix_lines and all(1 <= n <= len(text.splitlines()) for n in m.fix_lines), op["id"]
        assert op["source"].startswith("https://github.com/"), op["id"]
        assert op["cause"] in classes, op["id"]
        assert op["status"] in ("failed", "hung", "ok") and op["culprit"] in ("0", "last", "nonzero", "all")
    assert len(mutate.operators()) >= 40


def test_scoring_checks_the_engines_culprits_and_its_fix_line(runs):
    """Place counts the ranks the engine blames and the line it says set the failure up: a run whose
    fix_at is the labelled line places; moved off it (and off the raising line) it does not; a hang whose
    engine blames a rank the label does not is misplaced even where that rank's line is a line to fix."""
    import dataclasses
    m, result = runs("local-rank-argparse")
    assert result.fix_at is not None and result.fix_at.line in m.fix_lines
    assert result.rank(result.first_failure).frame.line not in m.fix_lines   # raised one line below
    assert suite.score(m, 2, result, mutate.load_causes())["place_ok"] is True
    off = dataclasses.replace(result, fix_at=dataclasses.replace(result.fix_at, line=1))
    assert suite.score(m, 2, off, mutate.load_causes())["place_ok"] is False
    m, result = runs("barrier-in-save-branch")
    assert result.culprits == (0,)
    wrong = dataclasses.replace(result, culprits=(1,))
    assert suite.score(m, 2, wrong, mutate.load_causes())["place_ok"] is False
