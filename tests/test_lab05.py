"""Lab 05: port conflicts and two jobs on one port, run for real (2 ranks, gloo, 127.0.0.1)."""
from pathlib import Path

import psutil
import pytest

import ddplab
from ddplab.course import claims
from ddplab.rank import ports
from ddplab.engine import signatures
from ddplab.course import lab05

import exercise_cases
import notebook_check
from conftest import assert_nothing_left
from notebook_check import test_notebook_executes_once_and_its_checked_cells_match  # noqa: F401
from fixit_check import test_the_notebooks_unfixed_attempt_is_graded_not_yet  # noqa: F401

DATA = Path(__file__).parent / "data"
RACE_STEPS = 100    # the notebook's race_steps: its two-jobs runs (one alone, one racing pair) serve the tests


def test_eaddrinuse_message_is_port_in_use():
    sig, line = signatures.match_text((DATA / "lab05_eaddrinuse.txt").read_text())
    assert sig.id == "port-in-use" and "EADDRINUSE" in line


def test_cross_joined_jobs_message_is_peer_lost():
    sig, _ = signatures.match_text((DATA / "lab05_cross_join_peer_lost.txt").read_text())
    assert sig.id == "peer-lost"


def test_article_netstat_check_cannot_see_the_port():
    with lab05.hold_port() as port:
        c = lab05.article_netstat(port)
        assert c.taken and "taken" in c.working
        if lab05.netstat_installed():
            assert c.article_says == "Port check successful"   # although the port is taken
        else:
            assert "FileNotFoundError" in c.article_says
    assert ports.check_port(port).free


def test_bad_repetitions_is_a_clear_error():
    with pytest.raises(ddplab.DdplabError, match="repetitions"):
        lab05.two_jobs("two-jobs", repetitions=0)


# the lab's notebook, executed once here; its runs serve the fixture below
notebook = notebook_check.notebook_fixture("05")


def _port(notebook, r) -> int:
    """The fixed port (--master-port) ``r`` was launched with."""
    return notebook.knobs_of(r)["port"]


def _jobs(notebook, variant, size, **knobs) -> list[tuple]:
    """The notebook's jobs of ``variant`` with these knobs on a port of their own (size 1), or its pairs
    (size 2: lab05.pair, two jobs started at once on one fixed port), as tuples of runs: its runs
    grouped by the port they were given, which the notebook chose free (so any port matches)."""
    by_port: dict = {}
    for r in notebook.runs_of(variant, ignore=("port",), **knobs):
        by_port.setdefault(_port(notebook, r), []).append(r)
    return [tuple(rs) for rs in by_port.values() if len(rs) == size]


def _pair(notebook, variant, **knobs):
    """The notebook's first pair of ``variant`` rebuilt as lab05.pair returned it (its wall_s, the pair's
    own clock, is not saved: the longer job's), or None."""
    found = _jobs(notebook, variant, 2, **knobs)
    if not found:
        return None
    rs = found[0]
    return lab05.Pair(lab05.classify(rs), _port(notebook, rs[0]), rs, max(r.wall_s for r in rs))


@pytest.fixture(scope="module")
def runs(notebook, tmp_path_factory):
    """The runs the assertions, the claim check and the exercise checkers below share: port-taken and
    article-retry on one port, one pair of two-jobs at once on one port, one pair of fixed-free-port, one
    two-jobs alone, fixed-retry: the notebook's own where it ran them (loaded from their result.json),
    else started here."""
    root = tmp_path_factory.mktemp("lab05")
    port = ports.free_port()

    def one(variant, **knobs):
        found = _jobs(notebook, variant, 1, **knobs)
        return found[0][0] if found else lab05.run_variant(variant, port=port, run_root=root / variant, **knobs)
    out = {"taken": one("port-taken"),
           # no deadline: the stall rule ends it (the article's sleep is 60 s, rank 1's init timeout 30 min)
           "article": one("article-retry"),
           "race": [_pair(notebook, "two-jobs", steps=RACE_STEPS)      # 5 s overlap
                    or lab05.pair("two-jobs", run_root=root / "race", steps=RACE_STEPS)],
           "fixed": [_pair(notebook, "fixed-free-port")
                     or lab05.pair("fixed-free-port", run_root=root / "fixed")],
           # one job by itself on a hand-chosen free port: the other half of "choose an available port"
           "alone": one("two-jobs", steps=RACE_STEPS),
           "retry": one("fixed-retry")}
    out["port"] = _port(notebook, out["taken"])
    for r in (out["taken"], out["article"], out["alone"], out["retry"],
              *(x for p in out["race"] + out["fixed"] for x in p.results)):
        assert r.leftover == (), f"{r.variant}: launcher reported leftovers: {r.leftover}"
    assert_nothing_left(str(root))
    return out


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_port_taken_fails_with_eaddrinuse_and_names_the_holder(runs):
    r, port = runs["taken"], runs["port"]
    assert (r.status, r.signature) == ("failed", "port-in-use")
    assert r.first_failure == 0 and r.cause.type == "DistNetworkError" and "EADDRINUSE" in r.cause.message
    assert r.cause.env["MASTER_PORT"] == str(port)            # the port the article's code set, as rank 0 had it
    assert r.cause.frame.file.endswith("labs/05_ports.py")
    d = lab05.diagnose(r)
    assert d.port == port and d.holder_pid and d.standin and "EADDRINUSE" in d.error
    # fails fast: rank 0's init_process_group raised (recorded by the rank), and the job ended on that
    # error, not on the stall rule after a wait
    assert d.seconds_to_error is not None and r.stall is None
    assert not psutil.pid_exists(d.holder_pid) or psutil.Process(d.holder_pid).status() == psutil.STATUS_ZOMBIE
    assert lab05.errno_name(r) == "EADDRINUSE"


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_article_retry_is_a_hang_rank_0_asleep_rank_1_at_the_rendezvous(runs):
    r = runs["article"]
    assert (r.status, r.signature) == ("hung", "hang-rendezvous")
    assert r.records_of("init_failed")[0]["rank"] == 0       # rank 0 knew at once, and slept on it
    r0, r1 = r.rank(0), r.rank(1)
    assert (r0.state, r0.where.kind, r0.where.op) == ("hung", "sleep", "sleep")
    assert r0.where.frame.file.endswith("labs/05_ports.py") and r0.where.frame.func == "main"
    assert (r1.state, r1.where.kind, r1.where.via) == ("hung", "rendezvous", "init_process_group")
    assert r0.error is None and r1.error is None             # nothing raised: the job said nothing
    assert r.stall is not None and r.stall.waited_for_timeout_s is None
    assert {rec["rank"]: rec["timeout_s"] for rec in r.records_of("init_start")} == {0: None, 1: None}   # the default
    pic = lab05.retry_picture(r)
    assert pic.as_article_says and pic.sleeping == (0,) and pic.at_rendezvous == (1,)


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_two_jobs_at_once_on_one_port_do_not_both_succeed(runs):
    (p,) = runs["race"]
    assert p.outcome != "both ok", p
    assert p.outcome in lab05.OUTCOMES


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_fixed_free_port_pair_both_succeed(runs):
    # One pair here (CI budget); benchmarks/lab05_two_jobs.py runs 20 pairs and needs 20 of 20.
    pairs = runs["fixed"]
    assert [p.outcome for p in pairs] == ["both ok"], lab05.pair_table(pairs)
    for r in pairs[0].results:
        assert (r.status, r.signature) == ("ok", None)
        assert all(d["same_weights"] for d in r.records_of("done")) and len(r.records_of("done")) == 2


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_claim_check_is_computed_from_the_runs(runs):
    with lab05.hold_port() as held:
        taken = lab05.article_netstat(held)
    free = lab05.article_netstat(held)
    cc = claims.check(lab05.claim_inputs({"port-taken": runs["taken"], "article-retry": runs["article"],
                                          "fixed-free-port-pairs": runs["fixed"], "two-jobs-pairs": runs["race"],
                                          "netstat-taken": taken, "netstat-free": free, "two-jobs": runs["alone"]}),
                      others={})
    v = cc.verdicts()
    # rank 1: no error, 1800 s timeout > 60 s sleep: the article's own code shows the sentence wrong
    assert v["sleep-lets-others-report"] == "wrong"
    # the job alone joins; the racing pair never both joined (test above), whatever way it went
    assert {k: p.state for k, p in cc.row("choose-a-port").parts.items()} == {"alone_joins": "holds",
                                                                              "two_at_once_join": "fails"}
    assert v["choose-a-port"] == "partly"
    assert v["netstat-check"] == "wrong"                     # "successful" on a taken port, or netstat missing
    assert list(v) == [c.key for c in claims.for_lab("05")]
    said = cc.row("sleep-lets-others-report").measured["05"]
    assert "1800" in said and "60" in said


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_check_failing_rank(runs):
    exercise_cases.check_all(lab05.check_failing_rank, runs["taken"], right=0, neighbour=-1, other_rank=1,
                             shown=12355, wrong=[2])   # 12355: the article's port, in the notebook's text
    c = lab05.check_failing_rank._verdict(1, runs["taken"])
    assert "rank 0 " not in c.message and "rank 0:" not in c.message


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_check_error_answer(runs):
    exercise_cases.check_all(
        lab05.check_error_answer, runs["taken"], right=["EADDRINUSE", " eaddrinuse "], neighbour="EADDRNOTAVAIL",
        shown="12355", wrong=["E", "EADDR", "ADDRINUSE", "INUSE", "EADDRINUSE!", "name: EADDRINUSE", 98, -98,
                              "ECONNREFUSED", "DistNetworkError"])   # parts, more than the name, the number, the type
    for wrong in ("ECONNREFUSED", "ETIMEDOUT"):
        assert "EADDRINUSE" not in lab05.check_error_answer._verdict(wrong, runs["taken"]).message


@pytest.mark.multiprocess
@pytest.mark.timeout(90)
def test_fixed_retry_succeeds_on_another_port(runs, notebook):
    r = runs["retry"]
    port = _port(notebook, r)
    assert (r.status, r.signature) == ("ok", None)
    joined = r.records_of("joined")
    assert len(joined) == 2 and len({j["port"] for j in joined}) == 1 and joined[0]["port"] != port
    assert r.records_of("port_busy")[0]["holder"]["free"] is False


@pytest.mark.multiprocess
@pytest.mark.timeout(90)
def test_two_jobs_alone_succeeds(runs):
    # fixed-free-port alone: covered by the pair test below (each of its jobs is checked the same way).
    r = runs["alone"]
    assert (r.status, r.signature) == ("ok", None)
    assert all(d["same_weights"] for d in r.records_of("done")) and len(r.records_of("done")) == 2




@pytest.mark.multiprocess
@pytest.mark.timeout(150)
def test_checkers_under_a_cpu_burner(tmp_path):
    """Both exercises' right answers with a core burning beside the run: the rank that binds the port
    fails first, with the errno the OS gave (issue 34 read the checkers under load)."""
    from burner import load

    with load("burner"):
        taken = lab05.run_variant("port-taken", port=ports.free_port(), run_root=tmp_path, progress=None)
    assert_nothing_left(str(tmp_path))
    assert lab05.check_failing_rank.accepted(taken) == [0]
    assert lab05.check_error_answer.accepted(taken) == ["EADDRINUSE"]
    exercise_cases.check_all(lab05.check_failing_rank, taken, right=0, neighbour=-1, other_rank=1)
    exercise_cases.check_all(lab05.check_error_answer, taken, right="EADDRINUSE", neighbour="EADDRNOTAVAIL",
                             wrong=["ECONNREFUSED", "INUSE"])
