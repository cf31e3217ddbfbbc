"""Figures from results: each function takes measurements and returns a matplotlib Figure.

Every number plotted comes from a run of the same execution; a value that was not measured (a
quoted default, a model's prediction) is drawn hatched and says so in its label.
"""
from __future__ import annotations

import textwrap
from typing import Sequence

import matplotlib.pyplot as plt

from ddplab.views import timeline as _timeline

def timeline(result, by: str = "auto", width: float = 9.0):
    """A run's collectives on a timeline (ddplab.views.timeline.figure), drawn into a pyplot figure: a
    notebook shows it at the end of the cell like every other figure here (the Agg-only figure that
    timeline.save writes was never shown: notebook 01 promised "the hang as a picture" and showed none)."""
    return _timeline.figure(result, by=by, width=width, fig=plt.figure())


STATUS_COLOURS = {"ok": "#2da44e", "failed": "#cf222e", "hung": "#bf8700", "interrupted": "#8c959f"}


def time_to_answer(labels: Sequence[str], seconds: Sequence[float], measured: Sequence[bool],
                   title: str = "Seconds until the learner knows what happened", log: bool = True):
    """Horizontal bars, one per way of finding out; unmeasured (quoted) values are hatched."""
    # labels wrapped, and a height per bar that fits two lines: long labels no longer squash the axes
    fig, ax = plt.subplots(figsize=(8, 1.2 + 0.75 * len(labels)))
    for i, (lab, s, m) in enumerate(zip(labels, seconds, measured)):
        ax.barh(i, s, color="#0969da" if m else "white", edgecolor="#0969da", hatch=None if m else "//")
        ax.text(s, i, f"  {s:,.1f} s" + ("" if m else " (quoted, not run)"), va="center")
    ax.set_yticks(range(len(labels)), [textwrap.fill(lab, 34) for lab in labels])
    ax.invert_yaxis()
    if log:
        ax.set_xscale("log")
    ax.set_xlabel("seconds (log scale)" if log else "seconds")
    ax.set_title(title)
    ax.set_xlim(right=max(seconds) * (60 if log else 1.6))   # room for the longest bar's label
    fig.tight_layout()
    return fig


def run_outcomes(results, title: str = "Outcome of each run"):
    """One bar per result: wall seconds, coloured by status, labelled with the signature."""
    fig, ax = plt.subplots(figsize=(7, 0.6 + 0.5 * len(results)))
    for i, r in enumerate(results):
        ax.barh(i, r.wall_s, color=STATUS_COLOURS.get(r.status, "#8c959f"))
        ax.text(r.wall_s, i, f"  {r.status}" + (f" [{r.signature}]" if r.signature else ""), va="center")
    ax.set_yticks(range(len(results)), [r.variant or r.target for r in results])
    ax.invert_yaxis()
    ax.set_xlabel("wall seconds")
    ax.set_xlim(right=max(r.wall_s for r in results) * 1.8)
    ax.set_title(title)
    fig.tight_layout()
    return fig


def completed_collectives(result) -> dict[int, list[float]]:
    """{rank: seconds, since the run's first collective, at which each of its completed collectives was
    issued}, from each rank's flight-recorder ledger (the last snapshot: a long run keeps its newest
    entries). A rank that completed none has an empty list."""
    starts = [c.created_ns for k in result.ranks for c in k.ledger if c.created_ns]
    t0 = min(starts) if starts else 0
    return {k.rank: sorted((c.created_ns - t0) / 1e9 for c in k.ledger if c.completed and c.created_ns)
            for k in result.ranks}


def ranks_in_group(result) -> int:
    """How many ranks completed at least one collective: the process group formed and worked on them."""
    return sum(1 for xs in completed_collectives(result).values() if xs)


def progress(results, title: str = "Collectives each rank completed, broken against fixed"):
    """One panel per run (broken first, then its fix): each rank's count of completed collectives against
    seconds since the run's first collective, from the ranks' own ledgers. A hung run's line stops where
    the ranks stopped; its stall window is shaded. Nothing here is drawn by hand: a run whose ranks
    completed no collective says so."""
    fig, axes = plt.subplots(1, len(results), figsize=(4.2 * len(results) + 0.6, 3.6), sharey=True, squeeze=False)
    top = max([len(xs) for r in results for xs in completed_collectives(r).values()] + [1])
    for ax, r in zip(axes[0], results):
        done = completed_collectives(r)
        last = 0.0
        for rank, xs in sorted(done.items()):
            if xs:
                ax.step([0.0, *xs], [0, *range(1, len(xs) + 1)], where="post", lw=1.8, label=f"rank {rank}")
                last = max(last, xs[-1])
        if not any(done.values()):
            ax.text(0.5, 0.5, "no rank completed\na collective", transform=ax.transAxes, ha="center", va="center",
                    color=STATUS_COLOURS.get(r.status, "#57606a"))
        if r.stall is not None:
            ax.axvspan(last, last + r.stall.idle_s, color=STATUS_COLOURS["hung"], alpha=0.15,
                       label=f"no progress {r.stall.idle_s:.1f} s")
            ax.set_xlim(left=0, right=last + r.stall.idle_s * 1.05)
        name = r.variant or r.target
        sig = f"\n[{r.signature}]" if r.signature else ""
        ax.set_title(f"{name}: {r.status}{sig}", fontsize=9, color=STATUS_COLOURS.get(r.status, "#24292f"))
        ax.set_xlabel("seconds since the first collective")
        ax.grid(color="#eaeef2")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="upper left")
    axes[0][0].set_ylabel("collectives completed")
    axes[0][0].set_ylim(0, top * 1.15)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def fix_pairs(pairs, title: str = "Ranks that formed a working group, each failure against its fix"):
    """One row per run, each broken run above its fix: how many of its ranks completed a collective
    (ranks_in_group, from the ledgers), coloured by how the run ended, with its signature beside it.
    ``pairs``: (broken RunResult, fixed RunResult) tuples."""
    rows = [r for pair in pairs for r in pair]
    fig, ax = plt.subplots(figsize=(8, 0.8 + 0.42 * len(rows)))
    y = 0.0
    ticks, labels = [], []
    for broken, fixed in pairs:
        for r in (broken, fixed):
            n = ranks_in_group(r)
            ax.barh(y, n, color=STATUS_COLOURS.get(r.status, "#8c959f"), height=0.7)
            ax.text(n, y, f"  {n} of {r.nproc}: {r.status}" + (f" [{r.signature}]" if r.signature else ""),
                    va="center", fontsize=8)
            ticks.append(y)
            labels.append(r.variant or r.target)
            y += 1
        y += 0.5
    ax.set_yticks(ticks, labels)
    ax.invert_yaxis()
    most = max(r.nproc for r in rows)
    ax.set_xlim(0, most * 2.6)
    ax.set_xticks(range(most + 1))
    ax.set_xlabel("ranks that completed a collective (from each rank's flight-recorder ledger)")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig
