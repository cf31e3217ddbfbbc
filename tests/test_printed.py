"""What the ranks printed, compared across ranks (issue 41, ddplab.engine.printed): labelled quantities read from
each rank's own output by their shape, a difference named only where the values show the quantity is one the ranks
share. Real 2-rank runs of tests/scripts/printed.py (right, wrong and adversarial), and the comparison on text."""
from pathlib import Path

import pytest

import ddplab
from conftest import assert_nothing_left
from ddplab.engine import signatures
from ddplab.engine.printed import compare, from_run, qualify, quantities
from ddplab.engine.reasons import FailureFacts
from ddplab.facts import ErrorPath
from ddplab.facts import CheckReport, Finding, PrintedDiff
from ddplab.result import RunResult
from ddplab.views.render_check import finding_sentence
from ddplab.views.render_printed import printed_sentence

SCRIPT = Path(__file__).resolve().parent / "scripts" / "printed.py"


def _lines(fmt, values):
    return "".join(fmt.format(*v) + "\n" for v in values)


def _one(diffs, label):
    found = [d for d in diffs if d.label == label]
    assert len(found) == 1, diffs
    return found[0]


# --- the comparison on text -----------------------------------------------------------------------------

def test_identical_outputs_give_nothing():
    text = "config: lr 0.1 | epochs 3\n" + _lines("epoch {} | loss {}", [(e, 0.5 - e / 10) for e in range(3)])
    assert compare({0: text, 1: text}) == ()


def test_per_rank_losses_are_measured_not_shared():
    # each rank's own loss every epoch: different at every print and changing within each rank
    r0 = _lines("epoch {} | loss {:.4f}", [(0, 0.6931), (1, 0.5012), (2, 0.4410)])
    r1 = _lines("epoch {} | loss {:.4f}", [(0, 0.7012), (1, 0.5523), (2, 0.4019)])
    assert compare({0: r0, 1: r1}) == ()
    # printed at two decimals the first print can tie by chance; one tie before parting is not "shared"
    r0 = _lines("epoch {} | loss {:.2f}", [(0, 0.69), (1, 0.50), (2, 0.44)])
    r1 = _lines("epoch {} | loss {:.2f}", [(0, 0.69), (1, 0.55), (2, 0.40)])
    assert compare({0: r0, 1: r1}) == ()
    # a loss printed once at the end, beside one count both ranks share
    assert compare({0: "final: step 40 | loss 0.5312\n", 1: "final: step 40 | loss 0.6121\n"}) == ()


def test_rank_numbers_pids_and_per_rank_paths_are_identity():
    def out(rank, pid):
        return (f"[rank{rank}] rank {rank} pid {pid} local_rank={rank} device: cuda:{rank}\n"
                f"saving to /tmp/run/optim_rank{rank}.pt\n") * 2
    assert compare({0: out(0, 4242), 1: out(1, 4343)}, {0: (0, 0, 4242), 1: (1, 1, 4343)}) == ()


def test_a_setting_held_on_each_rank_and_different():
    r0, r1 = ("Namespace(batch_size=32, epochs=3, lr=%s, seed=0)\n" % lr
              + _lines("epoch {} | lr {}", [(e, lr) for e in range(3)]) for lr in (0.1, 0.2))
    d = _one(compare({0: r0, 1: r1}), "lr")
    assert (d.kind, d.occurrence, d.first, d.held, d.by_rank) == ("value", 0, 1, True, False)
    assert [(v.rank, v.value, v.line) for v in d.values] == [(0, "0.1", 1), (1, "0.2", 1)]
    assert "lr=0.2" in d.of(1).text
    s = printed_sentence(d)
    assert "`lr`" in s and "rank 0 0.1; rank 1 0.2" in s and "line 1" in s


def test_a_scheduler_stepped_on_one_rank_parts_after_the_first_print():
    r0 = _lines("step {}: lr {}", [(0, 0.1), (4, 0.05), (8, 0.025)])
    r1 = _lines("step {}: lr {}", [(0, 0.1), (4, 0.1), (8, 0.1)])
    d = _one(compare({0: r0, 1: r1}), "lr")
    assert (d.occurrence, d.agreed, d.held, d.first) == (1, 1, True, 1)
    assert [v.value for v in d.values] == ["0.05", "0.1"] and d.of(1).line == 2


def test_a_schedule_computed_per_rank_that_drifts():
    # nanochat#857: the lr multiplier follows each rank's own data progress; alike for a while, then apart
    r0 = _lines("Step {} | lrm: {:.9f}", [(0, 1.0), (1, 0.9), (2, 0.8), (3, 0.7)])
    r1 = _lines("Step {} | lrm: {:.9f}", [(0, 1.0), (1, 0.9), (2, 0.75), (3, 0.6)])
    d = _one(compare({0: r0, 1: r1}), "lrm")
    assert (d.occurrence, d.agreed, d.held) == (2, 2, False)


def test_a_configuration_line_printed_once():
    r0 = "batch_size=32 epochs=3 workers=2 lr=0.1\n"
    r1 = "batch_size=32 epochs=3 workers=2 lr=0.4\n"
    assert _one(compare({0: r0, 1: r1}), "lr").values[1].value == "0.4"
    # with another quantity that differs too (a time, a loss), it is no configuration line
    assert compare({0: "batch 32 epochs 3 workers 2 lr 0.1 took 12.3\n",
                    1: "batch 32 epochs 3 workers 2 lr 0.4 took 13.1\n"}) == ()


def test_a_path_printed_once_and_a_seed_offset_by_the_rank():
    d = _one(compare({0: "run dir: /tmp/out/2026-12-06_09-43-34.000001\n",
                      1: "run dir: /tmp/out/2026-12-06_09-43-34.000007\n"}), "dir")
    assert not d.numeric and d.first == 1
    r0, r1 = "seed 1337 epochs 3 batch 8 workers 2\n", "seed 1338 epochs 3 batch 8 workers 2\n"
    d = _one(compare({0: r0, 1: r1}), "seed")
    assert d.by_rank and "plus its rank number" in printed_sentence(d)


def test_a_label_printed_a_different_number_of_times():
    r0 = _lines("epoch {} | steps {}", [(e, 4) for e in range(3)])
    r1 = _lines("epoch {} | steps {}", [(e, 4) for e in range(4)])
    # the rank that printed fewer ended on its own: a fact
    d = _one(compare({0: r0, 1: r1}, ended_clean={0}), "epoch")
    assert (d.kind, d.occurrence, d.first) == ("count", 3, 1)
    assert d.of(0).value is None and d.of(1).value == "3" and d.of(1).line == 4
    assert "a different number of times" in printed_sentence(d)
    # it failed or was stopped: it printed less because it stopped
    assert compare({0: r0, 1: r1}, ended_clean={1}) == ()
    assert compare({0: r0, 1: r1}) == ()


def test_lines_only_some_ranks_print_and_tracebacks_are_not_compared():
    assert compare({0: "step 0: val loss 4.21\nstep 4: val loss 3.90\n", 1: "hello\n"}) == ()
    tb = 'Traceback (most recent call last):\n  File "x.py", line {}, in main\nValueError: bad record {}\n'
    w = "/x/y.py:3: UserWarning: lr {} is high\n"
    # each rank failed twice (a retry), at its own line: read as prints, the line numbers would be a held setting
    assert compare({0: tb.format(12, 6) * 2 + w.format(1) * 2, 1: tb.format(40, 9) * 2 + w.format(2) * 2}) == ()
    # torch writes a rank's stderr with "[rankN]:" before each line
    prefixed = ["".join(f"[rank{r}]:{ln}\n" for ln in (tb.format(line, rec) * 2).splitlines()) for r, line, rec in
                ((0, 12, 6), (1, 40, 9))]
    assert compare({0: prefixed[0], 1: prefixed[1]}) == ()
    # the captured runs of tests/data (failures and hangs of the h41 round): nothing the ranks printed differs
    from ddplab.engine.evidence import read_run
    folders = sorted((Path(__file__).resolve().parent / "data").glob("run_*"))
    read = [read_run(d) for d in folders]
    assert sum(bool(ev.logs) for ev in read) >= 10
    for d, ev in zip(folders, read):
        assert from_run(ev) == (), d.name


def test_streams_apart_give_each_line_its_own_number():
    r0 = {"stderr": "INFO starting\nINFO lr 0.1 set\n", "stdout": "epoch 0 | lr 0.1\nepoch 1 | lr 0.1\n"}
    r1 = {"stderr": "INFO starting\nINFO lr 0.2 set\n", "stdout": "epoch 0 | lr 0.2\nepoch 1 | lr 0.2\n"}
    d = _one(compare({0: r0, 1: r1}), "lr")
    # stdout's line first (the same values on stderr's line are the same fact)
    assert (d.of(1).stream, d.of(1).line, d.held) == ("stdout", 1, True)
    assert "rank 1's stdout line 1" in printed_sentence(d)


def test_quantities_by_shape():
    q = quantities("at 09:43:34 date 2026-12-06 v2.13.0 Epoch 3/10 lr: [0.1] loss tensor(0.5000) out='/tmp/a/b.pt'\n")
    assert sorted((v[0][0], v[0][1]) for v in q.values()) == \
        [("Epoch", "3/10"), ("loss", "0.5000"), ("lr", "0.1"), ("out", "/tmp/a/b.pt")]


def test_qualify_a_replicas_finding_with_a_printed_setting():
    f = Finding("replicas-differ", (1,), "weight", step=3, count=2, of=2)
    report = CheckReport(10, findings=(f,))
    r0 = _lines("epoch {} | lr {}", [(e, 0.01) for e in range(3)])
    r1 = _lines("epoch {} | lr {}", [(e, 0.02) for e in range(3)])
    q = qualify(report, compare({0: r0, 1: r1})).findings[0]
    assert (q.cause, q.label, q.values) == ("printed-setting-differs", "lr", ((0, "0.01"), (1, "0.02")))
    assert "same on every rank" in q.fix and "`lr`" in finding_sentence(q)
    assert Finding.from_dict(q.to_dict()) == q
    # nothing a rank printed differs, or only a seed offset by the rank, or a path: the finding stays as it was
    assert qualify(report, ()) is report
    seed = compare({0: "seed 1337 a 1 b 2 c 3\n" * 2, 1: "seed 1338 a 1 b 2 c 3\n" * 2})
    assert seed and qualify(report, seed).findings[0] == f
    other = CheckReport(10, findings=(Finding("same-order", (0, 1), "DataLoader #0", epoch=1, count=1, of=2),))
    assert qualify(other, compare({0: r0, 1: r1})) == other


def test_path_differs_across_ranks_needs_the_failing_file_under_a_path_printed_apart():
    cause = signatures.get("path-differs-across-ranks")
    r0 = "run dir: /tmp/out/2026-12-06_09-43-34.000001\n"
    r1 = "run dir: /tmp/out/2026-12-06_09-43-34.000007\n"
    apart = compare({0: r0, 1: r1})
    missing = (ErrorPath("/tmp/out/2026-12-06_09-43-34.000007/last.pt", True, True),)
    assert signatures.holds(cause, FailureFacts(rank=1, paths=missing, printed=apart))
    # the file is elsewhere (not under the path rank 1 printed)
    assert not signatures.holds(cause, FailureFacts(rank=1, paths=(ErrorPath("/data/x.pt", True, True),),
                                                    printed=apart))
    # every rank printed the same folder: nothing printed apart
    assert not signatures.holds(cause, FailureFacts(rank=1, paths=missing, printed=compare({0: r1, 1: r1})))
    # a number printed apart is no path; the failing rank is another one; raised in a DataLoader worker
    lr = compare({0: "lr 0.1 a 1 b 2 c 3\n", 1: "lr 0.2 a 1 b 2 c 3\n"})
    assert lr and not signatures.holds(cause, FailureFacts(rank=1, paths=missing, printed=lr))
    assert not signatures.holds(cause, FailureFacts(rank=0, paths=missing, printed=apart))
    from ddplab.facts import Nested
    assert not signatures.holds(cause, FailureFacts(rank=1, paths=missing, printed=apart,
                                                    nested=Nested("FileNotFoundError", "worker 0", "", ())))


def test_printed_diff_round_trips():
    d = compare({0: _lines("lr {} x", [(0.1,), (0.1,)]), 1: _lines("lr {} x", [(0.2,), (0.2,)])})[0]
    assert PrintedDiff.from_dict(d.to_dict()) == d


# --- real runs ----------------------------------------------------------------------------------------------

@pytest.mark.multiprocess
@pytest.mark.timeout(600)
@pytest.mark.parametrize("mode", ["same", "own-loss", "crash-early"])
def test_nothing_differs_where_nothing_is_shared(mode, tmp_path):
    r = ddplab.run(SCRIPT, args=["--mode", mode], run_root=tmp_path, progress=None)
    assert r.status == ("failed" if mode == "crash-early" else "ok"), r.explain()
    # crash-early: rank 1 printed one epoch, rank 0 more, but rank 1 stopped because it failed
    assert r.printed == (), r.printed
    assert "printed different" not in r.explain()
    assert_nothing_left(str(tmp_path))


@pytest.mark.multiprocess
@pytest.mark.timeout(600)
def test_a_path_per_rank_is_the_evidence_and_the_cause(tmp_path):
    r = ddplab.run(SCRIPT, args=["--mode", "run-dir"], run_root=tmp_path, progress=None)
    assert r.status == "failed" and r.first_failure == 1 and r.cause.type == "FileNotFoundError", r.explain()
    # the file rank 1 did not find lies in the folder it printed, which rank 0 printed otherwise
    assert r.signature == "path-differs-across-ranks", r.explain()
    d = r.printed[0]
    assert (d.label, d.kind, d.first, d.numeric) == ("dir", "value", 1, False)
    assert d.of(1).value in r.cause.message and d.of(0).value != d.of(1).value
    assert (d.of(1).stream, d.of(1).text) == ("stdout", f"run dir: {d.of(1).value}")
    text = r.explain()
    assert "Each rank worked in a folder of its own" in text and "different values of `dir`" in text
    assert "different values of `dir`" in r._repr_html_()
    assert RunResult.load(r.run_dir).printed == r.printed
    assert_nothing_left(str(tmp_path))


@pytest.mark.multiprocess
@pytest.mark.timeout(600)
def test_replicas_that_parted_under_a_printed_setting_get_that_fix(tmp_path):
    r = ddplab.run(SCRIPT, args=["--mode", "lr-by-rank"], check=True, run_root=tmp_path, progress=None)
    assert r.status == "ok", r.explain()
    d = _one(r.printed, "lr")
    assert d.held and [(v.rank, v.value) for v in d.values] == [(0, "0.01"), (1, "0.02")]
    f = r.check.of_kind("replicas-differ")[0]
    assert (f.cause, f.label) == ("printed-setting-differs", "lr"), r.explain()
    assert "same on every rank" in f.fix and "printed different" not in r.explain()   # ok: no cause-not-identified
    assert_nothing_left(str(tmp_path))


@pytest.mark.multiprocess
@pytest.mark.timeout(600)
def test_a_printed_difference_beside_an_identified_cause_is_kept_not_shown(tmp_path):
    # epochs from an argument each rank reads for itself: rank 1 starts a 4th epoch alone and the job hangs; the
    # catalog names the hang (its advice, the same number of steps on every rank, holds), the printed epochs are kept
    r = ddplab.run(SCRIPT, args=["--mode", "epochs-by-rank"], run_root=tmp_path, progress=None, stall_s=3)
    assert r.status == "hung" and r.signature == "hang-different-collectives", r.explain()
    d = _one(r.printed, "epochs")
    assert [(v.rank, v.value) for v in d.values] == [(0, "3"), (1, "4")] and d.kind == "value"
    assert "printed different" not in r.explain()
    assert_nothing_left(str(tmp_path))
