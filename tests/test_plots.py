"""Figures made from real runs (ddplab.views.plots): each test checks that what a figure draws is the
runs' own numbers (each rank's ledger, its status), not that its pixels look a certain way. The figures
of labs 09-12 are tested in their lab's file, on the runs their notebook made."""
import matplotlib
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from ddplab.views import plots  # noqa: E402

pytestmark = pytest.mark.multiprocess


@pytest.fixture(scope="module")
def lab01_runs(tmp_path_factory):
    """Lab 01's deadlock and its fix (DistributedSampler), one real 2-rank run each."""
    import ddplab
    from conftest import assert_nothing_left

    root = tmp_path_factory.mktemp("plots")
    runs = [ddplab.run("01", variant=v, run_root=root / v) for v in ("broken", "fixed-sampler")]
    assert all(r.leftover == () for r in runs)
    assert_nothing_left(str(root))
    return runs


@pytest.mark.timeout(180)
def test_timeline_is_a_figure_the_notebook_shows_and_marks_every_collective(lab01_runs):
    broken, _ = lab01_runs
    fig = plots.timeline(broken)
    # pyplot holds it, so the notebook's inline backend shows it at the end of the cell (notebook 01, cell 11)
    assert fig.number in plt.get_fignums()
    marks = sum(len(line.get_xdata()) for line in fig.axes[0].get_lines() if line.get_linestyle() == "None"
                and line.get_marker() in ("o", "X") and line.get_markersize() in (6, 11))
    assert marks == sum(1 for k in broken.ranks for c in k.ledger if c.created_ns)
    plt.close(fig)


@pytest.mark.timeout(180)
def test_progress_draws_each_ranks_completed_collectives_broken_against_fixed(lab01_runs):
    broken, fixed = lab01_runs
    fig = plots.progress([broken, fixed])
    for ax, r in zip(fig.axes, (broken, fixed)):
        done = plots.completed_collectives(r)
        ends = sorted(int(line.get_ydata()[-1]) for line in ax.get_lines())
        assert ends == sorted(len(xs) for xs in done.values() if xs)
        assert r.status in ax.get_title()
    # the measured difference: the deadlocked ranks stopped short of what the fixed ranks completed
    b, f = plots.completed_collectives(broken), plots.completed_collectives(fixed)
    assert broken.status == "hung" and fixed.status == "ok"
    assert max(len(xs) for xs in b.values()) < min(len(xs) for xs in f.values())
    assert fig.axes[0].patches, "the broken run's stall window is shaded"
    plt.close(fig)


@pytest.mark.timeout(300)
def test_lab04_replica_lengths_are_the_runs_records(tmp_path):
    """Lab 04's DataParallel figure: every bar is a length the runs recorded, the failing step is marked,
    and the legend sits under the panels (it covered step 0's bars)."""
    from ddplab.course import lab04

    broken, fixed = (lab04.run_variant(v, run_root=tmp_path / v) for v in ("dp-broken", "dp-fixed"))
    fig = lab04.plot_dp(broken, fixed)
    for ax, r in zip(fig.axes, (broken, fixed)):
        s = lab04.dp_summary(r)
        want = sorted(x for st in s["steps"] for x in [st["padded_len"], *(st["replica_out_lengths"] or [])])
        assert sorted(p.get_height() for p in ax.patches) == want
        marked = [t.get_text() for t in ax.texts if t.get_text() == "gather fails"]
        assert len(marked) == (s["failed_at_step"] is not None)
        assert ax.get_legend() is None
    assert s["failed_at_step"] is None and lab04.dp_summary(broken)["failed_at_step"] is not None
    assert fig.legends
    plt.close(fig)


@pytest.mark.timeout(300)
def test_lab07_step_breakdown_is_the_grids_timings(tmp_path):
    """Lab 07's breakdown: each bar segment is the summarized timing of its configuration; the legend is
    under the axes, not on the longest bars."""
    from ddplab.course import lab07

    r = lab07.run_grid(widths=(256,), batches=(8, 64), nproc=2, steps=2, run_root=tmp_path)
    rows = lab07.summarize(r)
    fig = lab07.plot_breakdown(rows)
    got = [round(p.get_width(), 6) for p in fig.axes[0].patches]
    want = [round(x, 6) for row in rows for x in (max(0.0, row["compute_s"] - row["overlap_s"]) * 1e3,
                                                  row["overlap_s"] * 1e3, row["exposed_s"] * 1e3)]
    assert got == want and len(rows) == 2
    assert fig.axes[0].get_legend() is None and fig.legends
    plt.close(fig)
