"""The collective ledger (ddplab.engine.ledger) on flight-recorder dumps captured from real runs.

tests/data/run_<case>/ranks/rankN.fr_trace.json: torch's own dump, read through the rank's worker
server while the job hung (tests/data/capture_runs.py); rankN.exit.json: the ledger a rank left
at its exit. The comparison (``ledger.match``) is checked against torch's own flight-recorder
analysis (``torch.distributed.flight_recorder.components.types.Op.match``) on the same entries.
"""
import json
from pathlib import Path

import pytest

from ddplab.engine import ledger

DATA = Path(__file__).parent / "data"


def dump(case: str, rank: int) -> dict:
    ranks = DATA / f"run_{case}" / "ranks"
    live = ranks / f"rank{rank}.fr_trace.json"
    if live.exists():
        return json.loads(live.read_text())
    return json.loads((ranks / f"rank{rank}.exit.json").read_text())["ledger"]


def ledgers(case: str) -> dict:
    return {r: ledger.parse(dump(case, r)) for r in (0, 1)}


def test_parse_a_real_dump():
    l0, l1 = ledgers("hang_different_op").values()
    assert [c.seq for c in l0] == list(range(1, len(l0) + 1))
    assert all(c.backend == "gloo" and c.pg == "0" for c in l0 + l1)
    assert all(c.completed for c in l0[:-1]) and all(c.completed for c in l1[:-1])
    assert ledger.pending(l0).op == "barrier" and ledger.pending(l0).sizes == ()
    p1 = ledger.pending(l1)
    assert p1.op == "all_reduce" and p1.dtypes == ("Float",) and p1.numel == 5   # Linear(4, 1): 4 + 1
    assert p1.timeout_ms == 1800000 and p1.created_ns > 0
    assert ledger.last_completed(l0) == ledger.last_completed(l1) == p1.seq - 1
    assert ledger.position(l0) == (len(l0), len(l0) - 1)
    assert ledger.parse(None) == () and ledger.parse({}) == ()
    assert all(ledger.Collective.from_dict(c.to_dict()) == c for c in l1)


def test_ddp_construction_is_in_the_ledger():
    l0 = ledgers("hang_different_op")[0]
    assert [c.op for c in l0[:2]] == ["all_gather", "broadcast"]   # shapes check, then module states


@pytest.mark.parametrize("case,kind,ops", [
    ("hang_different_op", "different-op", {0: "barrier", 1: "all_reduce"}),
    ("hang_buffer_sync", "different-op", {0: "all_reduce", 1: "broadcast"}),
    ("hang_different_sizes", "different-sizes", {0: "all_reduce", 1: "all_reduce"}),
    ("hang_rank_exited", "shorter-ledger", {0: "all_reduce", 1: None}),
    ("failed_rank_exited", "shorter-ledger", {0: "all_reduce", 1: None}),
])
def test_divergence_of_real_ledgers(case, kind, ops):
    ls = ledgers(case)
    d = ledger.divergence(ls)
    assert (d.kind, d.ops, d.pg) == (kind, ops, "0")
    assert d.last == {r: l[-1].seq for r, l in ls.items()}
    assert ledger.Divergence.from_dict(json.loads(json.dumps(d.to_dict()))) == d
    # every number before it agrees
    for seq in range(1, d.seq):
        a, b = (next(c for c in ls[r] if c.seq == seq) for r in (0, 1))
        assert ledger.match(a, b) is None


def test_the_sizes_at_the_divergence():
    d = ledger.divergence(ledgers("hang_different_sizes"))
    assert d.sizes == {0: ((1,),), 1: ((3,),)}


def test_a_shorter_ledger_names_the_rank_that_stopped():
    ls = ledgers("hang_rank_exited")
    d = ledger.divergence(ls)
    assert d.seq == ls[1][-1].seq + 1 and d.sizes[1] is None


def test_agreeing_ledgers_and_a_single_rank_have_no_divergence():
    l0 = ledgers("hang_different_op")[0]
    done = tuple(c for c in l0 if c.completed)
    assert ledger.divergence({0: done, 1: done}) is None
    assert ledger.divergence({0: l0}) is None
    assert ledger.divergence({0: l0, 1: ()}) is None


def test_a_ring_buffer_that_dropped_old_entries_compares_what_both_still_hold():
    ls = ledgers("hang_different_op")
    trimmed = {0: ls[0][3:], 1: ls[1]}
    assert ledger.divergence(trimmed) == ledger.divergence(ls)


def test_a_group_not_every_rank_is_in_is_left_out():
    ls = ledgers("hang_different_op")
    sub = tuple(ledger.Collective(**{**c.to_dict(), "sizes": c.sizes, "dtypes": c.dtypes, "pg": "1"}) for c in ls[0])
    d = ledger.divergence({0: ls[0] + sub, 1: ls[1]})
    assert d.pg == "0" and d.kind == "different-op"


# --- torch's own analysis ---------------------------------------------------------------------------

CASES = ["hang_different_op", "hang_buffer_sync", "hang_different_sizes", "hang_rank_exited", "failed_rank_exited"]


def _torch_kind(a: dict, b: dict):
    """torch's flight-recorder verdict on two ranks' entries of one number, in ddplab's words."""
    types = pytest.importorskip("torch.distributed.flight_recorder.components.types")
    members = {"0": {0, 1}}
    info = types.Op(a, members, "0").match(types.Op(b, members, "0"))
    return {types.MatchState.FULLY_MATCHED: None,
            types.MatchState.COLLECTIVE_STATE_MISMATCH: None,   # one finished, one waits: not a mismatch of the call
            types.MatchState.COLLECTIVE_TYPE_MISMATCH: "different-op",
            types.MatchState.SIZE_OR_SYNTAX_MISMATCH: "different-sizes",
            types.MatchState.COLLECTIVE_DTYPE_MISMATCH: "different-sizes"}[info.state]


@pytest.mark.parametrize("case", CASES)
def test_match_agrees_with_torchs_flight_recorder(case):
    raw = {r: {e["collective_seq_id"]: e for e in dump(case, r)["entries"]} for r in (0, 1)}
    parsed = {r: {c.seq: c for c in ledger.parse(dump(case, r))} for r in (0, 1)}
    common = sorted(set(raw[0]) & set(raw[1]))
    assert common
    kinds = []
    for seq in common:
        ours = ledger.match(parsed[0][seq], parsed[1][seq])
        assert ours == _torch_kind(raw[0][seq], raw[1][seq]), (case, seq, raw[0][seq]["profiling_name"],
                                                              raw[1][seq]["profiling_name"])
        kinds.append(ours)
    d = ledger.divergence({r: tuple(parsed[r].values()) for r in (0, 1)})
    first_torch = next((k for k in kinds if k), None)
    if d.kind != "shorter-ledger":
        assert d.kind == first_torch
