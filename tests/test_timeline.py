"""A run's ledger drawn as a timeline (ddplab.views.timeline): rows per rank or per group, marks per
collective, the stall and the divergence marked; timeline.png written when a run hangs or fails."""
import sys
import threading
from pathlib import Path

import pytest

from ddplab.views import timeline

sys.path.insert(0, str(Path(__file__).parent))
import many_ranks  # noqa: E402

SCRIPTS = Path(__file__).parent / "scripts"


def _labels(fig):
    return [t.get_text() for t in fig.axes[0].get_yticklabels()]


def test_1024_ranks_are_drawn_as_groups_the_odd_one_first_and_marked():
    r = many_ranks.judged(1024, 517)
    fig = timeline.figure(r)
    assert _labels(fig) == ["rank 517", "ranks 0-516,518-1023"]
    assert fig.axes[0].get_yticklabels()[0].get_color() == "#cf222e"
    assert "diverge at collective #21" in fig.axes[0].get_title()
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert {"all_reduce", "barrier", "not finished", "#21: diverges"} <= set(legend)


def test_few_ranks_get_a_row_each(tmp_path):
    r = many_ranks.judged(8, 7)
    assert _labels(timeline.figure(r)) == [f"rank {i}" for i in range(8)]
    p = timeline.save(r, tmp_path / "t.png")
    assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_save_never_raises():
    r = many_ranks.judged(2, 1)
    assert timeline.save(r, "/nonexistent-folder/timeline.png") is None


@pytest.mark.timeout(240)
def test_a_real_hang_leaves_timeline_png(run_lab):
    r = run_lab(SCRIPTS / "hang_n.py", nproc=4)
    assert r.status == "hung", r.explain()
    for t in [t for t in threading.enumerate() if t.name == "ddplab-timeline"]:
        t.join()
    png = Path(r.run_dir) / timeline.FILE
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert _labels(timeline.figure(r)) == ["rank 0", "rank 1", "rank 2", "rank 3"]


def test_a_rank_exception_is_marked_where_it_happened():
    import dataclasses
    from ddplab.result import RankError
    r = many_ranks.judged(4, 1)
    ranks = tuple(dataclasses.replace(x, error=RankError("RuntimeError", "Timed out waiting 3000ms", (), 1.6))
                  if x.rank == 0 else x for x in r.ranks)
    fig = timeline.figure(dataclasses.replace(r, ranks=ranks, status="failed", first_failure=0, stall=None))
    assert "its exception" in [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert fig.axes[0].get_xlim()[1] >= 1.6 - 0.05       # seconds after the first collective (0.05 s)
