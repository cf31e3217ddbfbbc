"""ddplab.rank.agreement: the ranks' launch records compared (pure), and the exchange through a real TCPStore.

Only one torch build exists on this machine, so a torch or NCCL version disagreement is tested here on
records, not on a run; lab 09's test runs the WORLD_SIZE disagreement for real on two nodes."""
import datetime
import threading

import pytest
import torch.distributed as dist

from ddplab.rank import agreement
from ddplab.rank.agreement import Launched, compare, exchange


def rec(rank, world, node, local=1, torch="2.13.0+cpu", python="3.11.7", nccl=None, pid=None, identical=False):
    return Launched(rank, world, local, node, torch, python, nccl, f"node{node}", pid or 1000 + rank, identical)


def test_agreeing_ranks_have_nothing_to_say():
    assert compare([rec(0, 3, 0), rec(1, 3, 1, local=2), rec(2, 3, 1, local=2)]) == ()   # uneven nodes are fine


def test_world_size_disagreement_is_grouped_by_node_and_names_the_fast_path():
    recs = [rec(0, 2, 0, identical=True), rec(2, 4, 1, local=2, identical=True), rec(3, 4, 1, local=2, identical=True)]
    ws, ranks = compare(recs)
    assert ws.field == "world_size" and [(s.value, s.nodes, s.ranks) for s in ws.sides] == [(2, (0,), (0,)),
                                                                                              (4, (1,), (2, 3))]
    assert agreement.IDENTICAL_ENV in ws.fix and "1 and 2" in ws.fix
    assert "node 0 (rank 0) WORLD_SIZE 2; node 1 (ranks 2-3) WORLD_SIZE 4" in ws.sentence()
    assert ranks.field == "ranks" and ranks.missing == (1,) and ranks.repeated == ()
    # without the fast path the fix is the launch itself
    plain = compare([rec(0, 2, 0), rec(1, 3, 1)])[0]
    assert agreement.IDENTICAL_ENV not in plain.fix and "--nnodes" in plain.fix


def test_the_odd_side_comes_first():
    recs = [rec(r, 8, r // 2, local=2) for r in range(8) if r not in (4, 5)] + [rec(4, 6, 2, local=2),
                                                                                  rec(5, 6, 2, local=2)]
    (ws,) = [d for d in compare(recs) if d.field == "world_size"]
    assert [(s.value, s.nodes) for s in ws.sides] == [(6, (2,)), (8, (0, 1, 3))]
    assert ws.sentence().startswith("ranks disagree on WORLD_SIZE: node 2 (ranks 4-5) WORLD_SIZE 6; "
                                     "nodes 0-1,3 (ranks 0-3,6-7) WORLD_SIZE 8")


@pytest.mark.parametrize("field,odd,named", [("torch", "2.12.1+cu121", "torch"), ("python", "3.10.14", "Python"),
                                             ("nccl", "2.18.1", "NCCL")])
def test_a_version_disagreement_names_the_node_and_the_version(field, odd, named):
    recs = [rec(0, 4, 0, local=2), rec(1, 4, 0, local=2), rec(2, 4, 1, local=2, **{field: odd}),
            rec(3, 4, 1, local=2, **{field: odd})]
    (d,) = compare(recs)
    assert d.field == field
    assert {s.value: s.nodes for s in d.sides} == {odd: (1,), getattr(recs[0], field): (0,)}
    assert f"node 1 (ranks 2-3) {named} {odd}" in d.sentence() and d.fix == agreement.COMPARED[field][1]


def test_two_processes_with_one_rank_number_are_both_kept():
    # node 0 with 2 ranks and node 1 with 1, fast path: node 1's only rank is numbered 1 as well
    recs = [rec(0, 4, 0, local=2, pid=10), rec(1, 4, 0, local=2, pid=11), rec(1, 2, 1, pid=20)]
    found = {d.field: d for d in compare(recs)}
    assert set(found) == {"world_size", "ranks"}
    assert found["ranks"].repeated == (1,) and found["ranks"].missing == (2, 3)
    assert compare(recs + [recs[0]]) == compare(recs)          # one process seen twice counts once


def test_records_read_back_from_dicts():
    r = rec(2, 4, 1, local=2)
    assert Launched.from_dict({"event": "preflight", "t": 1.0, **r.to_dict()}) == r
    ag = agreement.from_records([r.to_dict()], [{"seen": [r.to_dict(), rec(0, 2, 0).to_dict()], "waited_s": 1.2,
                                                "complete": False}])
    assert len(ag.ranks) == 2 and not ag.ok and ag.waited_s == 1.2 and ag.problems()[0].startswith("ranks disagree")


def _store_pair():
    master = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                           timeout=datetime.timedelta(seconds=30))
    return master, lambda: dist.TCPStore("127.0.0.1", master.port, is_master=False,
                                         timeout=datetime.timedelta(seconds=30))


def _exchange_all(recs, **kw):
    master, client = _store_pair()
    out = {}

    def one(r):
        out[r.key] = exchange(client(), r, **kw)
    threads = [threading.Thread(target=one, args=(r,)) for r in recs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def test_exchange_through_a_real_store_ends_when_all_agree():
    recs = [rec(r, 3, r // 2) for r in range(3)]
    out = _exchange_all(recs, wait_s=60)
    for seen, waited, complete in out.values():
        assert complete and sorted(x.rank for x in seen) == [0, 1, 2]


def test_exchange_with_a_disagreement_ends_after_it_settles_not_at_its_bound():
    recs = [rec(0, 2, 0, identical=True), rec(2, 4, 1, local=2, identical=True), rec(3, 4, 1, local=2, identical=True)]
    out = _exchange_all(recs, wait_s=600, settle_s=0.5)       # a bound no test would wait out
    for seen, waited, complete in out.values():
        assert not complete and sorted(x.rank for x in seen) == [0, 2, 3]
        assert compare(seen)[0].field == "world_size"
