"""Figures from results: each function takes measurements and returns a matplotlib Figure.

Every number plotted comes from a run of the same execution; a value that was not measured (a
quoted default, a model's prediction) is drawn hatched and says so in its label.
"""
from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt

from ddplab.views.timeline import figure as timeline   # noqa: F401  (a run's collectives on a timeline: ddplab.views.plots.timeline(result))

STATUS_COLOURS = {"ok": "#2da44e", "failed": "#cf222e", "hung": "#bf8700", "interrupted": "#8c959f"}


def time_to_answer(labels: Sequence[str], seconds: Sequence[float], measured: Sequence[bool],
                   title: str = "Seconds until the learner knows what happened", log: bool = True):
    """Horizontal bars, one per way of finding out; unmeasured (quoted) values are hatched."""
    fig, ax = plt.subplots(figsize=(7, 0.6 + 0.55 * len(labels)))
    for i, (lab, s, m) in enumerate(zip(labels, seconds, measured)):
        ax.barh(i, s, color="#0969da" if m else "white", edgecolor="#0969da", hatch=None if m else "//")
        ax.text(s, i, f"  {s:,.1f} s" + ("" if m else " (quoted, not run)"), va="center")
    ax.set_yticks(range(len(labels)), labels)
    ax.invert_yaxis()
    if log:
        ax.set_xscale("log")
    ax.set_xlabel("seconds (log scale)" if log else "seconds")
    ax.set_title(title)
    ax.set_xlim(right=max(seconds) * (8 if log else 1.4))
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
