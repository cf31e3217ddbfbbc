"""Ranks grouped by state: the explanation grows with the distinct states, not with the ranks.
A real 8-rank hang (tests/scripts/hang_n.py) and synthetic evidence of 1,024 ranks."""
import dataclasses
import json
import sys
from pathlib import Path

import pytest

from ddplab.engine import groups
from ddplab.views.render import status_line
from ddplab.result import RankError
from ddplab.result import Snapshot

sys.path.insert(0, str(Path(__file__).parent))
import many_ranks  # noqa: E402
from ddplab.facts import short_path  # noqa: E402

SCRIPTS = Path(__file__).parent / "scripts"


def test_span_writes_ranges():
    assert groups.span([0, 1, 2, 3, 4, 5, 6]) == "0-6"
    assert groups.span([7]) == "7"
    assert groups.span([6, 0, 2, 4, 5]) == "0,2,4-6"
    assert groups.label([7]) == "rank 7" and groups.label([0, 1]) == "ranks 0-1"


@pytest.mark.parametrize("odd", [0, 517, 1023])
def test_1024_ranks_one_odd_explained_in_two_group_lines(odd):
    r = many_ranks.judged(1024, odd)
    gs = groups.group(r)
    assert [len(g.ranks) for g in gs] == [1, 1023]
    assert gs[0].odd and gs[0].ranks == (odd,) and gs[0].rep.where.op == "barrier"
    assert gs[1].rep.where.op == "all_reduce" and odd not in gs[1].ranks
    text = r.explain()
    assert len(text.splitlines()) <= 10, text
    assert f"rank {odd}: in barrier #21" in text.splitlines()[6]
    assert "likely cause" in text.splitlines()[6]
    shown = short_path(many_ranks.SCRIPT)                # as every view shows a path (relative where it can)
    assert text.count(shown) == 1                       # in full once, then by name
    html = r._repr_html_()
    assert html.count("<tr") == 3                          # header and two groups


def test_1024_ranks_failed_peers_are_one_group():
    """A failure on one rank and the same consequence on the 1,023 others, each naming its own port."""
    r = many_ranks.judged(1024, 3)
    err = RankError("ValueError", "bad batch", (), 1.0)
    ranks = [dataclasses.replace(x, state="exited", exit_code=1, signal=None, where=None,
                                 error=err if x.rank == 3 else RankError(
                                     "RuntimeError", f"Connection closed by peer [127.0.0.1]:{40000 + x.rank}", (), 2.0),
                                 consequence=x.rank != 3) for x in r.ranks]
    failed = dataclasses.replace(r, status="failed", ranks=tuple(ranks), first_failure=3, stall=None)
    gs = groups.group(failed)
    assert [g.ranks[0] for g in gs][:1] == [3] and gs[0].odd and len(gs) == 2
    d = failed.diagnosis
    assert d.startswith("Rank 3 failed first: ValueError: bad batch")
    assert "Ranks 0-2,4-1023 then failed with RuntimeError: Connection closed by peer" in d
    assert len(failed.explain().splitlines()) <= 10


def test_json_summary_holds_the_groups():
    r = many_ranks.judged(64, 63)
    out = json.loads(json.dumps(groups.to_dicts(r)))
    assert out[0] | {"frame": None} == {"ranks": "63", "count": 1, "odd": True, "state": "hung", "kind": "collective",
                                        "op": "barrier", "seq": 21, "via": None, "frame": None, "exit_code": None,
                                        "signal": "SIGTERM", "error": None}
    assert out[1]["ranks"] == "0-62" and out[1]["op"] == "all_reduce"


def test_the_status_line_groups_ranks():
    rows = tuple({"rank": r, "state": "waiting", "op": "barrier" if r == 7 else "all_reduce", "seq": 21}
                 for r in range(8))
    line = status_line(Snapshot(12.0, 8, rows, 4.0, 3.0))
    assert "ranks 0-6: in all_reduce #21 | rank 7: in barrier #21" in line


@pytest.mark.timeout(240)
def test_a_real_8_rank_hang_names_rank_7(run_lab):
    r = run_lab(SCRIPTS / "hang_n.py", nproc=8)
    assert (r.status, r.signature) == ("hung", "hang-different-collectives"), r.explain()
    gs = groups.group(r)
    assert gs[0].odd and gs[0].ranks == (7,) and gs[0].rep.where.op == "barrier"
    assert gs[1].ranks == tuple(range(7)) and gs[1].rep.where.op == "all_reduce"
    text = r.explain()
    lines = text.splitlines()
    assert len(lines) <= 10, text
    odd = next(l for l in lines if "likely cause" in l)
    assert odd.strip().startswith("rank 7: in barrier #21 at hang_n.py:16"), text
    assert text.count("tests/scripts/hang_n.py") == 1, text          # a path in full once, relative
    assert "Ranks 0-6 waited in all_reduce #21 for rank 7, which was blocked, in barrier #21" in text, text
    assert "it last printed 'rank 7: 20 steps done'" in text
    assert any(l.strip().startswith("ranks 0-6: in all_reduce #21 of 1000 elements") for l in lines), text
