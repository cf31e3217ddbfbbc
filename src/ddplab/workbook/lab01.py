"""Lab 01 (anatomy of a hang): the runs, the time-to-answer measurement, claim check and exercises
that notebooks/01_hang.ipynb shows. Every number comes from a run made by these functions."""
from __future__ import annotations

from dataclasses import dataclass

import ddplab
from ddplab.notebook import Check, Claim, ClaimCheck
from ddplab.result import RunResult

LAB = "01"
ARTICLE = "000_5eac2459042e419e.txt"


def run_variant(variant: str, **kw) -> RunResult:
    return ddplab.run(LAB, variant=variant, **kw)


def default_pg_timeout_s() -> float:
    """PyTorch's own default collective timeout for gloo, read from torch (not waited for)."""
    from torch.distributed.constants import default_pg_timeout

    return default_pg_timeout.total_seconds()


@dataclass(frozen=True)
class TimeToAnswer:
    """Seconds until the learner knows what happened, three ways."""
    default_timeout_s: float      # quoted from torch: the bare job would wait this long
    pg_timeout_s: float           # the timeout set with init_process_group(timeout=...)
    with_timeout: RunResult       # the bare job with that timeout: PyTorch's own error
    with_deadline: RunResult      # ddplab's deadline and stack diagnosis

    def rows(self) -> list[tuple[str, float, bool]]:
        return [
            ("bare job, PyTorch's default timeout", self.default_timeout_s, False),
            (f"init_process_group(timeout={self.pg_timeout_s:g} s)", self.with_timeout.wall_s, True),
            (f"ddplab deadline ({self.with_deadline.deadline_s:g} s) + stacks", self.with_deadline.wall_s, True),
        ]

    def to_dict(self) -> dict:
        return {"default_timeout_s": self.default_timeout_s, "pg_timeout_s": self.pg_timeout_s,
                "with_timeout": self.with_timeout.to_dict(), "with_deadline": self.with_deadline.to_dict()}

    def plot(self):
        from ddplab.plots import time_to_answer

        labels, secs, measured = zip(*self.rows())
        return time_to_answer(labels, secs, measured, title="Lab 01: seconds until the hang is explained")


def measure_time_to_answer(pg_timeout_s: float = 10, deadline_s: float | None = None,
                           broken: RunResult | None = None) -> TimeToAnswer:
    """Run the broken job with a short process-group timeout (PyTorch's error), and reuse (or make)
    the broken run that ddplab's deadline ended."""
    with_timeout = run_variant("broken", args=["--pg-timeout-s", str(pg_timeout_s)],
                               deadline_s=max(60, 4 * pg_timeout_s))
    with_deadline = broken or run_variant("broken", deadline_s=deadline_s)
    return TimeToAnswer(default_pg_timeout_s(), pg_timeout_s, with_timeout, with_deadline)


def who_waits_where(r: RunResult) -> list[str]:
    """The deterministic part of a hang diagnosis: rank, collective, function (no paths, no times)."""
    out = []
    for rank in r.ranks:
        func = rank.user_frame.rsplit(" in ", 1)[-1] if rank.user_frame else "?"
        out.append(f"rank {rank.rank}: {rank.state}, waits in {rank.waits_in or 'nothing'} (in {func})")
    return out


def claim_check(broken: RunResult, fixed: list[RunResult], tta: TimeToAnswer) -> ClaimCheck:
    waits = ", ".join(f"rank {r.rank} in {r.waits_in}" for r in broken.ranks if r.waits_in)
    fixed_ok = ", ".join(f"{r.variant}: {r.status} in {r.wall_s:.1f} s" for r in fixed)
    return ClaimCheck([
        Claim("Hangs come mostly from 'neglecting the intricacies of data movement across processes', "
              "less frequently from deadlocks caused by improper barrier synchronization.",
              f"{ARTICLE}, opening paragraph",
              f"a 2-rank job on loopback (no network at all) hung: {waits}; only the number of batches per rank differed",
              "partly"),
        Claim("Deadlocks 'are less frequent with PyTorch's higher-level APIs' and occur in custom training loops.",
              f"{ARTICLE}, section 1, Deadlocks",
              f"the hang used only DDP, a DataLoader and one barrier; the fixes (DistributedSampler, Join) are "
              f"also high-level APIs: {fixed_ok}",
              "wrong"),
        Claim("DDP 'hangs indefinitely'.",
              f"{ARTICLE}, title",
              f"not indefinitely: the gloo default timeout is {tta.default_timeout_s / 60:g} min; with "
              f"timeout={tta.pg_timeout_s:g} s PyTorch raised '{_short(tta.with_timeout.excerpt)}' after "
              f"{tta.with_timeout.wall_s:.1f} s",
              "partly"),
    ])


def _short(text: str | None, n: int = 90) -> str:
    text = (text or "").split("RuntimeError: ")[-1]
    return text if len(text) <= n else text[: n - 3] + "..."


# --- exercises ------------------------------------------------------------------------------------

def check_waiting_rank(broken: RunResult, rank: int | None, collective: str | None) -> Check:
    """Exercise 1: which rank waits in the barrier? Answer with its number and the collective name."""
    if rank is None or collective is None:
        return Check(False, "set `rank` and `collective`, then run this cell again")
    truth = {r.rank: r.waits_in for r in broken.ranks}
    if truth.get(rank) and collective.strip().lower() in truth[rank].lower():
        return Check(True, f"rank {rank} waits in {truth[rank]}, as the stacks show")
    return Check(False, f"the stacks say: " + "; ".join(f"rank {k} waits in {v}" for k, v in truth.items())
                 + ". Read the table above again.")


def check_timeout_answer(timeout_s: float | None, must_fail_within_s: float = 20) -> Check:
    """Exercise 2: choose --pg-timeout-s so that PyTorch itself reports the broken job within
    ``must_fail_within_s`` seconds. The checker runs the job for real with your value."""
    if timeout_s is None:
        return Check(False, "set `timeout_s` to a number of seconds, then run this cell again")
    if timeout_s <= 0:
        return Check(False, "a timeout must be more than 0 seconds")
    r = run_variant("broken", args=["--pg-timeout-s", str(timeout_s)], deadline_s=must_fail_within_s + 30)
    if r.status == "failed" and r.signature == "collective-timeout" and r.wall_s <= must_fail_within_s:
        return Check(True, f"PyTorch raised its own timeout error after {r.wall_s:.1f} s: {_short(r.excerpt)}")
    return Check(False, f"the run ended {r.status} ({r.signature}) after {r.wall_s:.1f} s; "
                 f"it must fail with collective-timeout within {must_fail_within_s:g} s")
