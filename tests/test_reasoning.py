"""The explanation of a failure beyond its catalog entry, from real 2-rank runs: the first failing
rank's whole exception (every line, its chained causes), the user's call that led into the library
with the values on that line, and the point-to-point waits and rendezvous asks of a hang."""
from pathlib import Path

import pytest

from ddplab import render

SCRIPTS = Path(__file__).parent / "scripts" / "reasons"

pytestmark = pytest.mark.timeout(240)


def test_a_multi_line_exception_keeps_every_line_and_the_users_call(run_lab):
    r = run_lab(SCRIPTS / "load_state_dict.py", nproc=2)
    assert r.status == "failed" and r.first_failure is not None, r.explain()
    e = r.rank(r.first_failure).error
    assert "Missing key(s)" in e.message and "Unexpected key(s)" in e.message
    assert e.frame.func == "restore" and "load_state_dict(state)" in e.frame.text
    assert set(e.values) == {"model", "state"} and "4 items" in e.values["state"]
    text = r.explain()
    assert '"backbone.weight", "backbone.bias"' in text and '"encoder.weight", "encoder.bias"' in text
    assert "called from your code at" in text and "`model.load_state_dict(state)`" in text


def test_a_chained_exception_shows_its_cause(run_lab):
    r = run_lab(SCRIPTS / "chained.py", nproc=2)
    e = r.rank(r.first_failure).error
    assert (r.first_failure, e.type) == (0, "ValueError"), r.explain()
    assert [(c.type, c.relation) for c in e.chain] == [("JSONDecodeError", "cause")]
    assert e.chain[0].frames[-1].func == "read_config"
    text = r.explain()
    assert "It was raised from JSONDecodeError: Expecting property name" in text
    assert "`return json.loads(text)`" in text


def test_an_exception_a_framework_turns_into_sys_exit_is_the_ranks_error(run_lab):
    r = run_lab(SCRIPTS / "hydra_like.py", nproc=2)
    e = r.rank(r.first_failure).error
    assert (e.type, e.message) == ("KeyError", "'optim'"), r.explain()
    assert e.frame.func == "train" and e.exited["code"] == "1"
    assert e.values == {"cfg": "{'optimizer': {'lr': 0.1}}"}
    assert "sys.exit(1) was called" in render.diagnosis(r)
