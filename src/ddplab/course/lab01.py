"""Lab 01 (anatomy of a hang): the runs, the time-to-answer measurement, claim check and exercises
that notebooks/01_hang.ipynb shows. Every number comes from a run made by these functions."""
from __future__ import annotations

import html
import re
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Mapping

import ddplab
from ddplab.course import answers, claims
from ddplab.engine import stacks
from ddplab.course import contract
from ddplab.course.notebook import Check
from ddplab.views.render import _first_line
from ddplab.result import RunResult

LAB = "01"


def validate(**knobs) -> None:
    """Refuse an unknown knob or a bad value before any rank starts (the script's declared knobs)."""
    contract.validate_knobs(LAB, knobs, run_variant)


def run_variant(variant: str, **kw) -> RunResult:
    validate(**kw)
    args, kw = contract.script_args(LAB, kw)
    return ddplab.run(LAB, variant=variant, args=args, **kw)


def default_pg_timeout_s() -> float:
    """PyTorch's own default collective timeout for gloo, read from torch (not waited for)."""
    from torch.distributed.constants import default_pg_timeout

    return default_pg_timeout.total_seconds()


@dataclass(frozen=True)
class TimeToAnswer:
    """Seconds until the learner knows what happened: three ways, four with the debug server."""
    default_timeout_s: float      # quoted from torch: the bare job would wait this long
    pg_timeout_s: float           # the timeout set with init_process_group(timeout=...)
    with_timeout: RunResult       # the bare job with that timeout: PyTorch's own error
    by_stall: RunResult           # ddplab's stall verdict ("no rank made progress for N s") and stacks
    in_job: "InJobStacks | None" = None  # torch's debug server, polled while the job ran

    def rows(self) -> list[tuple[str, float, bool]]:
        rows = [
            ("bare job, PyTorch's default timeout", self.default_timeout_s, False),
            (f"init_process_group(timeout={self.pg_timeout_s:g} s)", self.with_timeout.wall_s, True),
            (f"ddplab: no progress for {self.by_stall.stall_s:g} s + stacks", self.by_stall.wall_s, True),
        ]
        if self.in_job is not None and self.in_job.seen_at_s is not None:
            rows.append(("torch debug server /stacks (code change)", self.in_job.seen_at_s, True))
        return rows

    def to_dict(self) -> dict:
        return {"default_timeout_s": self.default_timeout_s, "pg_timeout_s": self.pg_timeout_s,
                "with_timeout": self.with_timeout.to_dict(), "by_stall": self.by_stall.to_dict(),
                "in_job": self.in_job.to_dict() if self.in_job else None}

    def plot(self):
        from ddplab.views.plots import time_to_answer

        labels, secs, measured = zip(*self.rows())
        return time_to_answer(labels, secs, measured, title="Lab 01: seconds until the hang is explained")


def measure_time_to_answer(pg_timeout_s: float = 10, broken: RunResult | None = None,
                           in_job: "InJobStacks | None" = None, **kw) -> TimeToAnswer:
    """Run the broken job with a short process-group timeout (PyTorch's own error: ddplab waits for
    a timeout that fires within 30 s), and reuse (or make) the broken run that ddplab's stall rule
    ended. ``in_job`` (from ``debug_server_view``) adds the moment torch's debug server first showed
    the hang. Other keywords go to ddplab.run (``progress=None``: no status line, whose seconds are
    exercise 2's answer)."""
    with_timeout = run_variant("broken", pg_timeout_s=pg_timeout_s, **kw)
    by_stall = broken or run_variant("broken")
    return TimeToAnswer(default_pg_timeout_s(), pg_timeout_s, with_timeout, by_stall, in_job)


def _key(where: "stacks.Where | None") -> tuple[str | None, str | None, str | None]:
    """What both routes must agree on, as fields: the collective, who issued it, the user's line."""
    if where is None:
        return (None, None, None)
    return (where.op, where.via, where.frame.short() if where.frame else None)


@dataclass(frozen=True)
class InJobStacks:
    """The same hang seen two ways: torch's debug server inside the job (stacks over HTTP while it
    runs), and ddplab from outside (the ranks' stacks when its stall rule judged the job hung)."""
    url: str                       # what a learner would open in a browser
    seen_at_s: float | None        # seconds from launch until /stacks first showed every rank stuck
    polls: int                     # how many times /stacks was fetched
    waits: tuple[tuple[int, str | None, str | None, str | None], ...]  # (rank, op, via, user frame) from /stacks
    page: str                      # the stacks text the server returned (per rank, as served)
    outside: RunResult             # ddplab's run of the same job, judged hung by its stall rule

    @property
    def agree(self) -> bool:
        """Both routes name the same collective (op and via) and the same line on every rank."""
        theirs = {(r.rank, *_key(r.where)) for r in self.outside.ranks}
        return bool(self.waits) and set(self.waits) == theirs

    def rows(self) -> list[tuple[int, str, str]]:
        from ddplab.views.render import wait_phrase

        mine = {rank: (op, via, f) for rank, op, via, f in self.waits}
        out = []
        for r in self.outside.ranks:
            op, via, f = mine.get(r.rank, (None, None, None))
            inside = f"{wait_phrase(stacks.Where('collective', op, via)) if op else '?'} at {f or '?'}"
            out.append((r.rank, inside, f"{r.waits_in} at {r.user_frame}"))
        return out

    def to_dict(self) -> dict:
        return {"url": self.url, "seen_at_s": self.seen_at_s, "polls": self.polls,
                "waits": [list(w) for w in self.waits], "agree": self.agree, "page": self.page,
                "outside": self.outside.to_dict()}

    def _repr_html_(self) -> str:
        seen = f"{self.seen_at_s:.1f} s after launch" if self.seen_at_s is not None else "never"
        body = "".join(f"<tr><td>{r}</td><td><code>{html.escape(a)}</code></td><td><code>{html.escape(b)}</code></td></tr>"
                       for r, a, b in self.rows())
        return (f"<p>torch's debug server (<code>{html.escape(self.url)}</code>) showed every rank stuck {seen} "
                f"({self.polls} fetches); ddplab judged the job hung (no rank made progress for "
                f"{self.outside.stall_s:g} s) and ended it at {self.outside.wall_s:.1f} s. "
                f"Same collectives and lines: <b>{'yes' if self.agree else 'no'}</b></p>"
                f"<table><tr><th>rank</th><th>debug server /stacks (inside the job)</th>"
                f"<th>ddplab (outside, no code change)</th></tr>{body}</table>")


_RANK_BLOCK = re.compile(r"<h2>Rank (\d+): [^<]*</h2>\s*(?:<p>[^<]*</p>\s*)?<pre>(.*?)</pre>", re.S)


def stacks_by_rank(page: str) -> dict[int, str]:
    """Each rank's stacks text from the debug server's /stacks page."""
    return {int(m.group(1)): html.unescape(m.group(2)) for m in _RANK_BLOCK.finditer(page)}


def _read_stacks_page(url: str) -> dict[int, str] | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            page = resp.read().decode("utf-8", "replace")
    except (urllib.error.URLError, OSError):
        return None  # not up yet, or the job is gone
    return stacks_by_rank(page)


def debug_server_view(nproc: int = 2, poll_s: float = 0.5, deadline_s: float | None = 120,
                      **run_kw) -> InJobStacks:
    """Run the broken job with torch's debug server on (``--debug-server-port``) and, while it runs,
    fetch http://127.0.0.1:<port>/stacks as a browser would, until two fetches in a row show every
    rank waiting in a collective at the same place. Then the fetching stops, and ddplab's stall rule
    (no rank made progress for the stall window) ends the job and gives its own diagnosis of the same
    stacks, from outside. Each fetch makes the ranks work (the server gathers every rank's stacks),
    which is progress, so the job is judged hung only once nobody is looking; ``deadline_s`` is an
    outer limit in case the server never answers."""
    from ddplab.rank.ports import free_port

    port = free_port()  # the server's port; torch's default 25999 would collide between learners
    url = f"http://127.0.0.1:{port}/stacks"
    done = threading.Event()
    found: dict = {"polls": 0, "seen_at_s": None, "waits": (), "page": ""}
    t0 = time.monotonic()

    def poll() -> None:
        last = None
        while not done.is_set():
            blocks = _read_stacks_page(url)
            if blocks is not None:
                found["polls"] += 1
                waits = []
                for rank, text in sorted(blocks.items()):
                    w = stacks.where(stacks.parse_faulthandler_main(text))
                    waits.append((rank, *_key(w)) if w.in_collective else (rank, None, None, None))
                stuck = len(waits) == nproc and all(op and f for _, op, _, f in waits)
                if stuck and waits == last:  # the same answer twice: stuck, not passing through
                    found.update(seen_at_s=round(time.monotonic() - t0, 2), waits=tuple(waits),
                                 page=stacks.short_paths("\n".join(f"=== rank {r} ===\n{t.strip()}"
                                                                  for r, t in sorted(blocks.items()))))
                    return
                last = waits if stuck else None
            done.wait(poll_s)

    poller = threading.Thread(target=poll, name="ddplab-debug-server-poll", daemon=True)
    poller.start()
    try:
        outside = run_variant("broken", nproc=nproc, deadline_s=deadline_s,
                              debug_server_port=port, quiet=True, **run_kw)
    finally:
        done.set()
        poller.join(timeout=10)
    return InJobStacks(url, found["seen_at_s"], found["polls"], found["waits"], found["page"], outside)


def who_waits_where(r: RunResult) -> list[str]:
    """The deterministic part of a hang diagnosis, from the fields: rank, state, collective and who
    issued it, and the user's function (no paths, no line numbers, no times)."""
    from ddplab.views.render import wait_phrase

    out = []
    for rank in r.ranks:
        w = rank.where
        func = w.frame.func if w is not None and w.frame is not None else "?"
        waits = wait_phrase(w) if w is not None and w.in_collective else None
        out.append(f"rank {rank.rank}: {rank.state}, waits in {waits or 'nothing'} (in {func})")
    return out


def _deadlocked(r: RunResult) -> bool:
    return r.status == "hung" and r.divergence is not None and r.divergence.kind == "different-op"


def _indefinite(tta: TimeToAnswer) -> claims.Part:
    """The claim's 'indefinite' is about PyTorch's default timeout: a run with another timeout shows what
    that timeout does, and a run ddplab stopped before the default ran out shows nothing about its end."""
    timed = tta.with_timeout
    if timed.status == "hung" and tta.pg_timeout_s <= tta.default_timeout_s:
        return claims.fact(True)            # not even a timeout as short as the default, or shorter, ended it
    if tta.pg_timeout_s >= tta.default_timeout_s:
        return claims.fact(False)           # the default's own timeout ended it: not indefinite
    return claims.not_established(
        f"the default ({tta.default_timeout_s / 60:g} min for gloo) was not sat out: ddplab stopped the bare job when "
        f"no rank made progress, and init_process_group(timeout={tta.pg_timeout_s:g} s) shows what that "
        "shorter timeout does, not the default's")


def claim_inputs(runs: Mapping[str, RunResult]) -> claims.Inputs:
    """What these runs measured for the register's claims (ddplab.course.claim_register); judged there.
    Keys read: "broken", "fixed-sampler" and/or "fixed-join" (the higher-level APIs' runs), "time-to-answer"
    (a TimeToAnswer), "rank-conditional" (optional)."""
    broken, tta, conditional = runs["broken"], runs["time-to-answer"], runs.get("rank-conditional")
    fixed = [runs[v] for v in ("fixed-sampler", "fixed-join") if v in runs]
    custom = [broken] + ([conditional] if conditional is not None else [])
    hung = "; ".join(f"{r.variant}: {r.status}" + (f", {_parted(r)}" if r.divergence else "") for r in custom)
    done = ", ".join(f"{r.variant}: {r.status}" for r in fixed)
    in_grad = [x.rank for x in broken.ranks if x.where is not None and (x.where.op, x.where.via) == ("all_reduce", "ddp-backward")]
    others = [f"rank {x.rank} in {x.waits_in}" for x in broken.ranks if x.rank not in in_grad and x.waits_in]
    timed = tta.with_timeout
    return claims.Inputs(LAB, {
        "custom-loop-deadlock": claims.evidence(
            f"custom loops: {hung}. Higher-level APIs on the same data: {done}",
            custom_loops_deadlock=all(_deadlocked(r) for r in custom),
            higher_level_apis_finish=bool(fixed) and all(r.status == "ok" for r in fixed)),
        "indefinite-sync": claims.evidence(
            f"broken: rank(s) {in_grad} in DDP's gradient all-reduce while {', '.join(others) or 'no other rank waits'}; "
            f"with init_process_group(timeout={tta.pg_timeout_s:g} s) the job ended {timed.status}"
            + (f" [{timed.signature}] after {timed.wall_s:.1f} s: {_short(timed)}" if timed.status != "hung" else "")
            + f" (PyTorch's default for gloo is {tta.default_timeout_s / 60:g} min, read from torch, not waited for)",
            sync_at_gradient_aggregation=_deadlocked(broken) and bool(in_grad) and bool(others),
            indefinite=_indefinite(tta)),
    })


def _parted(r: RunResult) -> str:
    d = r.divergence
    return f"parted at collective #{d.seq}: " + ", ".join(f"rank {k} {v}" for k, v in sorted(d.ops.items()))


def _short(r: RunResult, n: int = 90) -> str:
    """The failing rank's exception, "Type: first line of its message", from its error record."""
    if r.cause is None:
        return f"no exception ({r.status})"
    return _first_line(f"{r.cause.type}: {_first_line(r.cause.message)}", n)


# --- exercises ------------------------------------------------------------------------------------

def _waiting(broken: RunResult) -> dict[int, str]:
    return {r.rank: r.where.op for r in broken.ranks if r.where is not None and r.where.in_collective}


def _waiting_answers(broken: RunResult) -> list[tuple[int, str]]:
    truth = _waiting(broken)
    barrier = [k for k, v in truth.items() if v == "barrier"]
    others = {v for k, v in truth.items() if k not in barrier}
    return [(barrier[0], others.pop())] if len(barrier) == 1 and len(others) == 1 else []


@answers.exercise("waiting-rank", answers.Pair(answers.Rank(2), answers.collective(), names=("rank", "collective"),
                                               what="a rank and a collective"),
                  accepted=_waiting_answers, name="(rank, collective)")
def check_waiting_rank(answer: tuple[int, str], broken: RunResult) -> Check:
    """Exercise 1 (predicted before the run): ``(rank, collective)``: which rank ends up waiting in
    the barrier, and in which collective (its torch.distributed name) does the OTHER rank wait?"""
    rank, name = answer
    if answer in _waiting_answers(broken):
        return Check(True, f"rank {rank} waits in {broken.rank(rank).waits_in}; the other in {name}, as the stacks show")
    if [k for k, v in _waiting(broken).items() if v == "barrier"] != [rank]:
        return Check(False, "not that rank: count each rank's batches (rows per rank / batch size); the rank that "
                            "runs out first leaves the loop. Then read each rank's `where.op` in broken.ranks")
    return Check(False, f"right rank; the other rank is not in {name}: where is the step it is still running "
                        "(forward, backward, optimizer)? Read `broken.rank(n).where` for the other rank")


ERROR_AFTER_SLACK_S = 1.0   # check_error_seconds: this much either side of the prediction and the measurement


def hang_begins_s(tta: TimeToAnswer) -> float:
    """Seconds after launch of the broken run's last progress (its stall verdict above: "since N s after
    launch"): when the collective that never completes was issued, on this machine, in this execution."""
    r = tta.by_stall
    return r.stall.since_s if r.stall is not None else max(0.0, r.wall_s - r.stall_s)


def _error_after(tta: TimeToAnswer) -> list[answers.Interval]:
    """The timeout counted from the collective that never completes: the timeout plus when the broken run
    above reached its hang (what the learner can read), and what the timeout run measured, each with
    ERROR_AFTER_SLACK_S either side. Never below the timeout plus half the start-up: "the timeout counts
    from launch" (10 s, 11 s) is the misconception the exercise is about. Both numbers are this machine's
    (a loaded machine starts up slower), so the interval moves with them."""
    begins = hang_begins_s(tta)
    predicted, measured = tta.pg_timeout_s + begins, tta.with_timeout.wall_s
    lo = max(min(predicted, measured) - ERROR_AFTER_SLACK_S, tta.pg_timeout_s + 0.5 * begins)
    return [answers.Interval(round(lo, 2), round(max(predicted, measured) + ERROR_AFTER_SLACK_S, 2))]


@answers.exercise("timeout-seconds", answers.Number(0, 3600, "a number of seconds", label="timeout"),
                  accepted=_error_after, name="error_after_s")
def check_error_seconds(answer: float, tta: TimeToAnswer) -> Check:
    """Exercise 2 (predicted before the run): with ``init_process_group(timeout=pg_timeout_s)``, how many
    seconds after launch does the broken job end with PyTorch's own timeout error? Right: the timeout
    counted from the collective that never completes (when the broken run above reached its hang), not
    from the launch, within a second of that or of what this execution measured (`_error_after`)."""
    r = tta.with_timeout
    if r.signature != "collective-timeout":
        return Check(False, f"the timeout run ended {r.status} ({r.signature}), not with PyTorch's timeout error; "
                            "run the time-to-answer cell again")
    if answer in _error_after(tta)[0]:
        return Check(True, f"measured {r.wall_s:.1f} s: the {tta.pg_timeout_s:g} s count from the collective that never "
                           f"completes, after the start-up and the steps before it; you said {answer:g} s")
    return Check(False, f"not {answer:g} s: when does a collective's timeout start counting, and how long did the "
                        "broken run take to reach its hang (its stall verdict above: 'since N s after launch')?")


EXERCISES = answers.exercises(check_waiting_rank, check_error_seconds)


def keypoints(runs: Mapping[str, object]) -> "KeyPoints":
    """The notebook's key points from its runs (issue 42: a learner's run measured 38.7 / 18.1 / 19.5 s where
    the typed text said 13 / 6 / 3, in another order). Keys read: "broken", "rank-conditional", "fixed-sampler",
    "fixed-join" (RunResults) and "time-to-answer" (a TimeToAnswer)."""
    from ddplab.course.notebook import KeyPoints
    broken, conditional, tta = runs["broken"], runs.get("rank-conditional"), runs["time-to-answer"]
    fixed = [runs[v] for v in ("fixed-sampler", "fixed-join") if v in runs]
    waits = "; ".join(w.split(" (in ")[0] for w in who_waits_where(broken))
    first = (f"The uneven shards ended `{broken.status}`"
             + (f", with the [signature](../docs/glossary.md#signature) `{broken.signature}`" if broken.signature else "")
             + f": {waits}.")
    if conditional is not None:
        first += (f" A `barrier` under `if rank == 0:` ended `{conditional.status}`"
                  + (" the same way." if (conditional.status, conditional.signature) == (broken.status, broken.signature)
                     else f" (`{conditional.signature}`)." if conditional.signature else "."))
    done = "; ".join(f"`{r.variant}` ended `{r.status}`" for r in fixed)
    join = next((r for r in fixed if r.variant == "fixed-join"), None)
    join_steps = [d["steps"] for d in join.records_of("done")] if join is not None else []
    second = done + (f"; with `Join` the ranks took {' and '.join(map(str, join_steps))} steps, the one that "
                     "finished first shadowing the other's all-reduces." if len(set(join_steps)) > 1 else ".")
    timed = sorted(tta.rows(), key=lambda row: row[1])
    third = ("Time to an answer in this run, soonest first: "
             + "; ".join(f"{label} {seconds:.1f} s" + ("" if measured else " (quoted from torch, not waited for)")
                         for label, seconds, measured in timed)
             + ".")
    if tta.with_timeout.wall_s > tta.pg_timeout_s:
        third += (f" With `timeout={tta.pg_timeout_s:g}` PyTorch's error came {tta.with_timeout.wall_s:.1f} s after "
                  "launch: the timeout counts from the collective that waits, not from the launch.")
    return KeyPoints((
        first, second, third,
        "PyTorch's error says that a collective timed out; the stacks and ledgers say that the ranks wait in "
        "different collectives, and where in the script.",
    ))
