"""Figures made from real runs (ddplab.views.plots): each test checks that what a figure draws is the
runs' own numbers (each rank's ledger, its status), not that its pixels look a certain way."""
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
def test_lab12_figure_shows_each_runs_curves_and_what_check_found(tmp_path):
    """Lab 12's figure: the top panel's lines are the ranks' own validation records, the bottom panel's
    bars what --check counted for the pair's finding: the broken run's harm against the fix's none."""
    from ddplab.course import lab12

    runs = {v: lab12.run_variant(v, run_root=tmp_path / v) for v in ("bn-unsynced", "bn-unsynced-fixed")}
    fig = lab12.plot(runs)
    top, bottom = fig.axes[0], fig.axes[1]
    lines = [list(line.get_ydata()) for line in top.get_lines()]
    assert lines == [[p["val_loss"] for p in c] for v in runs for c in lab12.curves(runs[v]).values()]
    heights = [p.get_height() for p in bottom.patches]
    assert heights == [lab12.harm(runs[v], "buffers-differ") for v in runs]
    assert heights[0] > 0 and heights[1] == 0
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
def test_lab11_loader_bars_are_the_ranks_records(tmp_path):
    """Lab 11's slow-loader figure: each rank's bars are its own seconds waiting and computing."""
    from ddplab.course import lab11

    r = lab11.run_variant("slow-loader", run_root=tmp_path)
    fig = lab11.plot_loader(r)
    rows = lab11.loader(r)
    widths = [round(p.get_width(), 9) for p in fig.axes[0].patches]
    assert widths == [round(x, 9) for k in (0, 1) for x in (rows[k]["data_wait_s"], rows[k]["compute_s"])]
    assert fig.axes[0].get_legend() is None and fig.legends   # under the axes, off rank 1's bar
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


@pytest.mark.timeout(300)
def test_lab10_consequences_are_the_runs_measurements(tmp_path):
    """Lab 10's four panels: the step times, the batchnorm errors and the replica differences are the
    runs' own; the two legends sit above the tallest bars (headroom), not on them."""
    from ddplab.course import lab10

    rs = {v: lab10.run_variant(v, run_root=tmp_path / v) for v in ("unused-fixed", "batchnorm", "module-forward",
                                                                    "rank-init")}
    fig = lab10.plot_consequences(rs["unused-fixed"], rs["batchnorm"], rs["module-forward"], rs["rank-init"])
    cost = lab10.unused_cost(rs["unused-fixed"])
    assert [p.get_height() for p in fig.axes[0].patches] == [c["ms_per_step"] for c in cost.values()]
    bn = lab10.bn_summary(rs["batchnorm"])
    want = sorted(bn[m][k][rank] for k in ("mean_error", "var_error") for rank in (0, 1) for m in bn)
    assert sorted(p.get_height() for p in fig.axes[1].patches) == want
    for ax in (fig.axes[1], fig.axes[3]):
        top = max(p.get_y() + p.get_height() for p in ax.patches)
        assert ax.get_ylim()[1] > top * 1.4      # the legend's room above the data
    plt.close(fig)


@pytest.mark.timeout(400)
def test_lab09_firewall_against_its_fix_is_the_ranks_ledgers(tmp_path):
    """Notebook 09's fix figure: behind the firewall no rank completes a collective; with the subnet open
    every rank completes its steps' collectives (each rank's own ledger)."""
    from ddplab.course import lab09

    if lab09.requirement():
        pytest.skip(lab09.requirement())
    firewall, fixed = (lab09.run_variant(v, steps=2, run_root=tmp_path / v) for v in ("firewall", "fixed-firewall"))
    fig = plots.progress([firewall, fixed])
    assert firewall.status == "hung" and fixed.status == "ok"
    assert plots.ranks_in_group(firewall) == 0 and not fig.axes[0].get_lines()
    assert plots.ranks_in_group(fixed) == fixed.nproc
    ends = sorted(int(line.get_ydata()[-1]) for line in fig.axes[1].get_lines())
    assert ends == sorted(len(xs) for xs in plots.completed_collectives(fixed).values())
    plt.close(fig)
