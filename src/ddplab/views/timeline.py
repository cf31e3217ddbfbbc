"""A run's collectives on a timeline: one row per rank (or per group of ranks in the same state),
one mark per collective, the stall and the first divergence marked.

    from ddplab.views.timeline import figure
    figure(result)                 # in a notebook: the figure shows itself

``save(result)`` writes ``timeline.png`` into the run folder; the launcher calls it when a run
ends hung or failed. It uses matplotlib's Agg canvas directly (no pyplot, no GUI backend) and never
raises: a picture that cannot be drawn is not a reason to lose the run.
"""
from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING

from ddplab.engine import groups

if TYPE_CHECKING:  # pragma: no cover
    from ddplab.result import RunResult

FILE = "timeline.png"
PER_RANK_UP_TO = 16      # more ranks than this: one row per group of ranks in the same state
OP_COLOURS = {"all_reduce": "#0969da", "barrier": "#cf222e", "broadcast": "#8250df", "all_gather": "#1a7f37",
              "reduce_scatter": "#bf8700", "send": "#6e7781", "recv": "#6e7781"}
OTHER = "#57606a"


def _rows(result: "RunResult", by: str) -> list[tuple[str, object, bool]]:
    """(label, representative rank, odd) per row."""
    if by == "auto":
        by = "rank" if result.nproc <= PER_RANK_UP_TO else "group"
    gs = groups.group(result)
    if by == "group":
        return [(g.label, g.rep, g.odd) for g in gs]
    odd = {r for g in gs if g.odd for r in g.ranks}
    return [(f"rank {r.rank}", r, r.rank in odd) for r in sorted(result.ranks, key=lambda r: r.rank)]


def figure(result: "RunResult", by: str = "auto", width: float = 9.0, fig=None):
    """The timeline as a matplotlib Figure (Agg canvas: works with or without pyplot). ``fig``: an empty
    figure to draw into instead (ddplab.views.plots.timeline passes a pyplot one, which a notebook shows)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    rows = _rows(result, by)
    starts = [c.created_ns for _, r, _ in rows for c in r.ledger if c.created_ns]
    t0 = min(starts) if starts else 0
    if fig is None:
        fig = Figure()
        FigureCanvasAgg(fig)
    fig.set_size_inches(width, 1.4 + 0.42 * len(rows))
    ax = fig.add_subplot()
    d = result.divergence
    ops_seen: dict[str, str] = {}
    last_t = 0.0
    errors = False
    for y, (label, r, odd) in enumerate(rows):
        marks: dict[tuple[str, bool], list[float]] = {}
        for c in r.ledger:
            if not c.created_ns:
                continue
            x = (c.created_ns - t0) / 1e9
            marks.setdefault((c.op, c.completed), []).append(x)
            if d is not None and c.seq == d.seq and c.pg == d.pg:
                ax.plot(x, y, "o", ms=17, mfc="none", mec="#cf222e", mew=1.5, zorder=3)
            last_t = max(last_t, x)
        if r.error is not None and r.error.time and t0:
            x = r.error.time - t0 / 1e9
            ax.plot(x, y, "*", ms=14, color="#cf222e", zorder=4)
            ax.annotate(r.error.type, (x, y), xytext=(-8, 6), textcoords="offset points", ha="right", fontsize=7,
                        color="#cf222e")
            marks.setdefault(("error", True), [])
            errors = True
            last_t = max(last_t, x)
        xs = [x for v in marks.values() for x in v] + ([x] if r.error is not None and r.error.time and t0 else [])
        ax.hlines(y, 0, max(xs, default=0), color="#d0d7de", lw=1, zorder=0)
        for (op, done), x in marks.items():
            if op == "error":
                continue
            colour = ops_seen.setdefault(op, OP_COLOURS.get(op, OTHER))
            ax.plot(x, [y] * len(x), "o" if done else "X", ls="", ms=6 if done else 11, color=colour,
                    mfc=colour if done else "white", mew=2, zorder=2)
        if not r.ledger:
            ax.text(0, y, "  no collective recorded", va="center", fontsize=8, color=OTHER)
    if result.stall is not None:
        st = result.stall
        ax.axvspan(last_t, last_t + st.idle_s, color="#bf8700", alpha=0.15, zorder=0)
        ax.annotate(f"no progress for {st.idle_s:.1f} s (stall window {st.window_s:g} s)",
                    (last_t + st.idle_s / 2, 1.0), xycoords=("data", "axes fraction"), xytext=(0, -4),
                    textcoords="offset points", ha="center", va="top", fontsize=8, color="#9a6700")
        ax.set_xlim(right=last_t + st.idle_s * 1.05)
    ax.set_yticks(range(len(rows)), [label for label, _, _ in rows])
    for tick, (_, _, odd) in zip(ax.get_yticklabels(), rows):
        if odd:
            tick.set_color("#cf222e")
            tick.set_fontweight("bold")
    ax.set_ylim(len(rows) - 0.4, -0.6)
    ax.set_xlabel("seconds since the first collective")
    title = f"{result.target}{' --variant ' + result.variant if result.variant else ''}: {result.status}"
    if d is not None:
        title += f", ranks diverge at collective #{d.seq}"
    ax.set_title(title, fontsize=10)
    handles = [Line2D([], [], ls="", marker="o", color=c, label=op) for op, c in ops_seen.items()]
    handles.append(Line2D([], [], ls="", marker="X", ms=9, color=OTHER, mfc="white", mew=2, label="not finished"))
    if errors:
        handles.append(Line2D([], [], ls="", marker="*", ms=11, color="#cf222e", label="its exception"))
    if d is not None:
        handles.append(Line2D([], [], ls="", marker="o", ms=12, mfc="none", mec="#cf222e", label=f"#{d.seq}: diverges"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8, frameon=False)
    ax.grid(axis="x", color="#eaeef2")
    longest = max((len(label) for label, _, _ in rows), default=6)
    fig.subplots_adjust(left=min(0.45, 0.04 + 0.0085 * longest * 9 / width), right=0.8,
                        bottom=0.55 / fig.get_figheight(), top=1 - 0.35 / fig.get_figheight())
    return fig


def save(result: "RunResult", path: str | Path | None = None, dpi: int = 90) -> Path | None:
    """Write the timeline as a PNG (``timeline.png`` in the run folder; written aside, then renamed,
    so a reader never sees half a file); None, never an exception, when it cannot be drawn."""
    try:
        path = Path(path or Path(result.run_dir) / FILE)
        part = path.with_name(path.name + ".part")
        figure(result).savefig(part, dpi=dpi, format="png")
        part.replace(path)
        return path
    except Exception:   # a picture must never cost the run its result
        return None


def save_later(result: "RunResult") -> threading.Thread | None:
    """``save`` on a thread of its own, for a run that ended hung or failed: the explanation is not
    kept waiting for matplotlib (about 2.5 s to import and 1 s to draw on this loaded 2-core machine).
    Not a daemon: a CLI process finishes the file before it exits."""
    if result.status not in ("hung", "failed"):
        return None
    t = threading.Thread(target=save, args=(result,), name="ddplab-timeline")
    t.start()
    return t
