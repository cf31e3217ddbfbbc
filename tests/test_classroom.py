"""`ddplab classroom check --learners N`: each item judged from this machine's facts, the user's
mistakes answered on one line, the facts as JSON."""
import json
import socket
import subprocess
import sys

import pytest

from ddplab.tools import classroom
from ddplab.errors import DdplabError

CLEAN = {"PATH": "/usr/bin", "DDPLAB_RUNS_DIR": "/tmp/learner-a"}


def test_one_learner_holds_and_the_facts_are_data():
    c = classroom.check(1, env=CLEAN)
    assert c.learners == 1
    d = c.to_dict()
    assert d["holds"] == c.holds and {i["name"] for i in d["items"]} == {
        "memory", "cores", "threads", "ports", "run folders", "debug server"}
    assert c.item("memory").facts["needed_mb"] == c.facts["per_learner_mb"]
    assert c.item("cores").facts["ranks_at_once"] == classroom.NPROC
    assert isinstance(c.facts["most_learners"], int) and c.facts["most_learners"] >= 0
    json.dumps(d)  # every fact serialises


@pytest.mark.parametrize("bad", [0, -3, True, "4", 2.5, None])
def test_learners_must_be_a_whole_number_of_at_least_one(bad):
    with pytest.raises(DdplabError, match="--learners"):
        classroom.check(bad, env=CLEAN)


def test_too_many_learners_for_memory_and_cores():
    c = classroom.check(10_000, env=CLEAN)
    assert not c.holds
    assert not c.item("memory").ok and not c.item("cores").ok
    assert "does not hold 10000 learners" in c.verdict() and "memory" in c.verdict()
    # the largest number it names does hold, by memory and cores; one more does not
    most = c.facts["most_learners"]
    if most >= 1:
        fit = classroom.check(most, env=CLEAN)
        assert fit.item("memory").ok and fit.item("cores").ok
    over = classroom.check(most + 1, env=CLEAN)
    assert not (over.item("memory").ok and over.item("cores").ok)


def test_a_fixed_master_port_in_the_shared_environment_is_named():
    assert classroom.check(2, env=CLEAN).item("ports").ok
    c = classroom.check(2, env={**CLEAN, "MASTER_PORT": "12355"})
    assert not c.item("ports").ok and c.item("ports").facts["MASTER_PORT"] == "12355"


def test_run_folders_must_be_kept_apart_for_more_than_one_learner():
    no_own = {"PATH": "/usr/bin"}
    assert classroom.check(1, env=no_own).item("run folders").ok
    assert not classroom.check(2, env=no_own).item("run folders").ok
    assert classroom.check(2, env=CLEAN).item("run folders").ok


def test_threads_per_rank_over_one_with_several_learners():
    assert classroom.check(3, env={**CLEAN, "OMP_NUM_THREADS": "1"}).item("threads").ok
    c = classroom.check(3, env={**CLEAN, "OMP_NUM_THREADS": "4"})
    assert not c.item("threads").ok and c.item("threads").facts["threads_at_once"] == 3 * classroom.NPROC * 4


def test_something_listening_on_the_debug_server_port_is_found():
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind(("0.0.0.0", classroom.DEBUG_SERVER_PORT))
    except OSError:
        s.close()
        pytest.skip(f"port {classroom.DEBUG_SERVER_PORT} is already in use here")
    try:
        s.listen()
        item = classroom.check(2, env=CLEAN).item("debug server")
        assert not item.ok and "0.0.0.0" in item.facts["listening_on"]
    finally:
        s.close()
    assert classroom.check(2, env=CLEAN).item("debug server").ok


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "ddplab.cli", "classroom", *args], capture_output=True, text=True)


def test_cli_verdict_line_json_and_exit_status():
    one = _cli("check", "--learners", "1")
    assert one.stdout.splitlines()[0].startswith("this machine holds 1 learner ")
    many = _cli("check", "--learners", "100000", "--json")
    d = json.loads(many.stdout)
    assert many.returncode == 1 and d["holds"] is False and d["learners"] == 100000
    for bad in (["check", "--learners", "0"], ["check", "--learners", "x"], ["check"], []):
        r = _cli(*bad)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, bad
