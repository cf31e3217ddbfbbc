"""Lab 05 (port conflicts, two jobs on one port): everything the notebook calls.

Every number comes from a real run in this execution (``ddplab.run``); two jobs "at the same
moment" are two threads that each call ``ddplab.run`` after meeting at a barrier.
"""
from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Mapping

import ddplab
from ddplab.course import claims
from ddplab.rank import ports
from ddplab.errors import DdplabError
from ddplab.course import answers
from ddplab.facts import short_paths
from ddplab.course import contract
from ddplab.course.notebook import Check

LAB = "05"
DEFAULT_PG_TIMEOUT_S = 1800.0     # torch.distributed.constants.default_pg_timeout (gloo)
OUTCOMES = ("both ok", "one failed", "both failed", "hang", "cross-joined")
OUTCOME_COLOURS = {"both ok": "#2da44e", "one failed": "#cf222e", "both failed": "#82071e",
                   "hang": "#bf8700", "cross-joined": "#8250df"}
NEXT_STEP = ("use a port nobody chose by hand: `ddplab run --port 0` / `torchrun --rdzv-endpoint 127.0.0.1:0` "
             "(or `--standalone`), or stop the other job")


def _check_reps(repetitions) -> int:
    if isinstance(repetitions, bool) or not isinstance(repetitions, int) or repetitions < 1:
        raise DdplabError(f"repetitions must be a whole number of at least 1, not {repetitions!r}",
                          hint="for example repetitions=3 (each pair of jobs takes a few seconds)")
    return repetitions


def validate(**knobs) -> None:
    """Refuse an unknown knob or a value the script's declaration refuses, before any rank starts."""
    contract.validate_knobs(LAB, knobs, run_variant)


def run_variant(variant: str, **kw) -> "ddplab.RunResult":
    """One job of lab 05 whose fixed MASTER_PORT is ``port`` (a free one if None). A hang is found by
    the stall rule (no rank made progress for the stall window); other keywords go to ddplab.run."""
    validate(**kw)
    kw["port"] = kw.get("port") or ports.free_port()
    args, kw = contract.script_args(LAB, kw)
    return ddplab.run(LAB, variant=variant, args=args, **kw)


# ----------------------------------------------------------------------------------------------
# Diagnosis of a taken port, from the facts rank 0 recorded when init failed
# ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PortDiagnosis:
    port: int | None
    error: str | None            # PyTorch's message, first line
    seconds_to_error: float | None  # from init_process_group's call to its exception, on rank 0
    holder_pid: int | None
    holder: str | None           # process name and command line, as psutil saw them then
    standin: bool                # the holder was the lab's own stand-in listener
    next_step: str = NEXT_STEP

    def __repr__(self) -> str:
        if self.port is None:
            return "no port conflict recorded in this run"
        who = f"pid {self.holder_pid} ({self.holder})" if self.holder_pid else "a process this user cannot see"
        tag = " [the lab's STAND-IN listener, emulating another job]" if self.standin else ""
        return (f"port {self.port} is taken by {who}{tag}; init_process_group failed after "
                f"{self.seconds_to_error} s with: {self.error}\nnext step: {self.next_step}")


def diagnose(result) -> PortDiagnosis:
    """Name the port and the process that held it when rank 0 failed (psutil, recorded by the rank)."""
    rec = next((r for r in result.records if r.get("event") in ("init_failed", "port_busy")), None)
    if rec is None:
        return PortDiagnosis(None, None, None, None, None, False)
    h = rec.get("holder") or {}
    standin = {r.get("pid") for r in result.records_of("standin")}
    who = None
    if h.get("pid"):
        cmd = short_paths((h.get("cmdline") or "").splitlines()[0])[:70]
        who = f"{h.get('process')}: {cmd}"
    return PortDiagnosis(rec.get("port") or h.get("port") or result_port(result), rec.get("error"),
                         rec.get("seconds"), h.get("pid"), who, h.get("pid") in standin)


def result_port(result) -> int | None:
    rec = next(iter(result.records_of("init_start")), {})
    return rec.get("port")


def seconds_to_error(result) -> float | None:
    rec = next(iter(result.records_of("init_failed")), None)
    return rec.get("seconds") if rec else None


def run_article_retry(port: int | None = None, **kw):
    """The article's try/except + sleep(60) on a taken port. Judged by the stall rule: rank 0 sleeps on
    its error and rank 1 waits at the rendezvous with PyTorch's default timeout, so no rank makes
    progress and the run is reported hung seconds after the ranks got there, not after 60 s."""
    return run_variant("article-retry", port=port, **kw)


@dataclass(frozen=True)
class RetryPicture:
    """What each rank of the article-retry run was doing when it was judged hung (from fields)."""
    status: str
    signature: str | None
    sleeping: tuple[int, ...]          # ranks in time.sleep (rank 0: it knew the port was taken)
    at_rendezvous: tuple[int, ...]     # ranks waiting in init_process_group's store
    knew_after_s: float | None         # seconds from init_process_group's call to rank 0's error
    idle_s: float | None               # how long no rank had made progress at the verdict
    wall_s: float

    @property
    def as_article_says(self) -> bool:
        """Rank 0 asleep on an error it already had, rank 1 left waiting for a store that never answers."""
        return self.status == "hung" and 0 in self.sleeping and bool(self.at_rendezvous)


def retry_picture(result) -> RetryPicture:
    """Which ranks slept and which waited at the rendezvous, read from each rank's ``where``."""
    kinds = {k.rank: k.where.kind for k in result.ranks if k.where is not None}
    return RetryPicture(result.status, result.signature,
                        tuple(r for r, k in sorted(kinds.items()) if k == "sleep"),
                        tuple(r for r, k in sorted(kinds.items()) if k == "rendezvous"),
                        seconds_to_error(result), result.stall.idle_s if result.stall else None, result.wall_s)


# ----------------------------------------------------------------------------------------------
# Two jobs at the same moment
# ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Pair:
    outcome: str                 # one of OUTCOMES
    port: int
    results: tuple               # the two RunResults
    wall_s: float                # until both jobs had ended

    @property
    def statuses(self) -> tuple[str, str]:
        return tuple(r.status for r in self.results)

    @property
    def cross_joined(self) -> bool:
        return any(rec.get("cross_joined") for r in self.results for rec in r.records_of("joined"))

    def __repr__(self) -> str:
        s = ", ".join(f"{r.status}" + (f" [{r.signature}]" if r.signature else "") for r in self.results)
        return f"Pair(port {self.port}: {self.outcome}; jobs: {s}; {self.wall_s:.1f} s)"


def classify(results) -> str:
    """both ok / one failed / both failed / hang / cross-joined (ranks of one job met the other's)."""
    if any(rec.get("cross_joined") for r in results for rec in r.records_of("joined")):
        return "cross-joined"
    st = [r.status for r in results]
    if "hung" in st or "deadline" in st:
        return "hang"
    failed = st.count("failed")
    return {0: "both ok", 1: "one failed"}.get(failed, "both failed")


def pair(variant: str = "two-jobs", port: int | None = None, **kw) -> Pair:
    """Start two independent 2-rank jobs of ``variant`` at the same moment, with the same fixed port."""
    port = port or ports.free_port()
    gate = threading.Barrier(2)
    out: list = [None, None]

    def one(i: int) -> None:
        gate.wait()
        try:
            out[i] = run_variant(variant, port=port, **kw)
        except BaseException as e:  # noqa: BLE001 - reported below, in the caller's thread
            out[i] = e

    t0 = time.monotonic()
    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for o in out:
        if isinstance(o, BaseException):
            raise o
    return Pair(classify(out), port, tuple(out), round(time.monotonic() - t0, 2))


def two_jobs(variant: str = "two-jobs", repetitions: int = 3, **kw) -> list[Pair]:
    """``repetitions`` pairs, each on a fresh port: it is a race, so the outcomes are counted."""
    return [pair(variant, **kw) for _ in range(_check_reps(repetitions))]


def counts(pairs) -> dict[str, int]:
    c = Counter(p.outcome for p in pairs)
    return {o: c.get(o, 0) for o in OUTCOMES}


def pair_table(pairs) -> str:
    lines = [f"{'rep':>3}  {'outcome':<13} {'job A':<28} {'job B':<28} seconds"]
    for i, p in enumerate(pairs):
        a, b = (f"{r.status} [{r.signature}]" if r.signature else r.status for r in p.results)
        lines.append(f"{i:>3}  {p.outcome:<13} {a:<28} {b:<28} {p.wall_s:.1f}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# The article's netstat check, run as written, and the check that works
# ----------------------------------------------------------------------------------------------

@contextlib.contextmanager
def hold_port():
    """A listener on 127.0.0.1 in this process, for the duration of a ``with`` block (its port)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        yield s.getsockname()[1]
    finally:
        s.close()


@dataclass(frozen=True)
class NetstatCheck:
    port: int
    taken: bool                  # the truth, from binding the port / psutil
    article_says: str            # what the article's snippet printed (or raised)
    returncode: int | None
    listed_lines: int            # lines netstat printed: every listener, not only this port's
    mentions_port: bool
    working: str                 # ddplab.rank.ports.check_port(port).describe()

    def __repr__(self) -> str:
        return (f"port {self.port} really taken: {self.taken}\n"
                f"article's snippet: {self.article_says} (exit {self.returncode}, {self.listed_lines} lines, "
                f"the port in them: {self.mentions_port})\n"
                f"psutil / bind check: {self.working}")


def article_netstat(port: int) -> NetstatCheck:
    """Run article 003's Example 3 as written, with ``port`` in place of 12355."""
    truth = ports.check_port(port)
    rc, lines, mentions = None, 0, False
    try:
        # As in the article: "| grep" is one more *argument* of netstat; no shell, so no pipe runs.
        r = subprocess.run(["netstat", "-tulnp", f"| grep {port}"], capture_output=True, text=True, check=True)
        said, rc = "Port check successful", r.returncode
        lines, mentions = len(r.stdout.splitlines()), f":{port} " in r.stdout
    except subprocess.CalledProcessError as e:
        said, rc = f"Port check failed: {e}", e.returncode
    except FileNotFoundError as e:
        said = f"raised FileNotFoundError ({e.strerror}: netstat is not installed), not caught by the snippet"
    return NetstatCheck(port, not truth.free, said, rc, lines, mentions, truth.describe())


def netstat_installed() -> bool:
    return shutil.which("netstat") is not None


# ----------------------------------------------------------------------------------------------
# Plot, claim check, exercises
# ----------------------------------------------------------------------------------------------

def plot(pairs_by_variant: dict, times: dict):
    """Left: how many pairs of jobs ended each way, per variant (counts, n given). Right: wall seconds
    until each run ended, measured."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.8), gridspec_kw={"width_ratios": [1, 1.4]})
    names = list(pairs_by_variant)
    # the variant's name broken at its parenthesis: side by side, two long names ran into each other
    pairs_n = {n: len(pairs_by_variant[n]) for n in names}
    ticks = [n.replace(" (", "\n(") + f"\nn = {pairs_n[n]} pair{'s' if pairs_n[n] != 1 else ''}" for n in names]
    bottoms = [0] * len(names)
    for o in OUTCOMES:
        vals = [counts(pairs_by_variant[n])[o] for n in names]
        if any(vals):
            bars = ax1.bar(ticks, vals, bottom=bottoms, color=OUTCOME_COLOURS[o], label=o)
            ax1.bar_label(bars, labels=[str(v) if v else "" for v in vals], label_type="center", color="white")
            bottoms = [b + v for b, v in zip(bottoms, vals)]
    ax1.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax1.set_ylim(0, max(bottoms) + 0.5)
    ax1.set_ylabel("pairs of jobs (count, measured)")
    ax1.set_title("Two jobs started at once on one port:\nhow each pair ended")
    ax1.legend(fontsize=8)
    labels = list(times)
    secs = [times[k][0] for k in labels]
    for i, (k, (s, final)) in enumerate(times.items()):
        ax2.barh(i, s, color="#0969da" if final else "white", edgecolor="#0969da", hatch=None if final else "//")
        ax2.text(s, i, f"  {s:.1f} s" + ("" if final else " (the job itself still silent: ended by ddplab's stall rule)"),
                 va="center", fontsize=8)
    ax2.set_yticks(range(len(labels)), labels, fontsize=8)
    ax2.invert_yaxis()
    ax2.set_xlim(right=max(secs) * 1.9)
    ax2.set_xlabel("wall seconds from launch to the run's end (measured)")
    ax2.set_title("Time to a clear outcome")
    fig.tight_layout()
    return fig


def claim_inputs(runs: Mapping[str, "ddplab.RunResult"]) -> claims.Inputs:
    """What these runs measured for the register's claims (ddplab.course.claim_register); judged there.
    Keys read: "port-taken", "article-retry", "two-jobs" (one two-jobs job by itself on a hand-chosen
    free port), "two-jobs-pairs" and "fixed-free-port-pairs" (two_jobs()'s Pairs of that variant),
    "netstat-taken" and "netstat-free" (article_netstat()'s NetstatCheck on the held, then released, port)."""
    taken, article, alone = runs["port-taken"], runs["article-retry"], runs["two-jobs"]
    two_pairs, fixed_pairs = runs["two-jobs-pairs"], runs["fixed-free-port-pairs"]
    netstat_taken, netstat_free = runs["netstat-taken"], runs["netstat-free"]
    d = diagnose(taken)
    c2 = counts(two_pairs)
    joined = [r for p in two_pairs for r in p.results if r.status == "ok"]
    two = ", ".join(f"{k}: {v}" for k, v in c2.items() if v)
    pic = retry_picture(article)
    start = {rec["rank"]: rec for rec in article.records_of("init_start")}
    peers = [k for k in article.ranks if k.rank not in pic.sleeping]
    sleep_s = next((rec.get("sleep_s") for rec in start.values() if rec.get("sleep_s") is not None), 60.0)
    peer_timeouts = [start.get(k.rank, {}).get("timeout_s") or DEFAULT_PG_TIMEOUT_S for k in peers]
    peer_errors = [k.rank for k in peers if k.error is not None] + \
                  [rec["rank"] for rec in article.records_of("init_failed") if rec["rank"] not in pic.sleeping]
    reports = bool(peer_errors) or (bool(peer_timeouts) and max(peer_timeouts) <= sleep_s)
    where = ", ".join(f"rank {k.rank}: {k.where.kind if k.where else k.state}" for k in article.ranks)
    return claims.Inputs(LAB, {
        "choose-a-port": claims.evidence(
            f"port taken by another listener: job {taken.status} [{taken.signature}] ({'EADDRINUSE' if 'EADDRINUSE' in (d.error or '') else d.error} "
            f"after {d.seconds_to_error} s on rank 0); one job alone on a hand-chosen free port: {alone.status}; "
            f"{len(two_pairs)} pair(s) of jobs started at once on one free "
            f"port: {two}; jobs that joined: {len(joined)} of {2 * len(two_pairs)}. Port 0 from the launcher "
            f"(fixed-free-port): {counts(fixed_pairs)['both ok']} of {len(fixed_pairs)} pair(s) both ok",
            alone_joins=alone.status == "ok",
            two_at_once_join=bool(two_pairs) and c2["both ok"] == len(two_pairs)),
        "sleep-lets-others-report": claims.evidence(
            f"article-retry (a taken port): {article.status} [{article.signature}]; {where}; rank 0's error came "
            f"{pic.knew_after_s} s after its init_process_group call; errors from the other rank: "
            f"{peer_errors or 'none'}; its init timeout {max(peer_timeouts, default=float('nan')):g} s "
            f"({'PyTorch default, as the article calls it' if not any(start.get(k.rank, {}).get('timeout_s') for k in peers) else 'set'}) "
            f"against a {sleep_s:g} s sleep; ddplab ended the job {article.wall_s:.1f} s after launch "
            f"(no rank made progress for {pic.idle_s} s)",
            taken_port_peer_reports=reports),
        "netstat-check": claims.evidence(
            f"port {netstat_taken.port} held by a listener: the snippet said '{netstat_taken.article_says}'; "
            f"port {netstat_free.port} free: '{netstat_free.article_says}' (exit {netstat_free.returncode}); "
            f"'| grep' went to netstat as an argument, no pipe ran ({netstat_taken.listed_lines} lines listed); "
            f"the bind/psutil check: {netstat_taken.working}",
            tells_taken_from_free=(netstat_taken.article_says.startswith("Port check failed")
                                   and netstat_free.article_says == "Port check successful")),
    })


def _first_failure(taken) -> list[int]:
    return [taken.first_failure] if taken.first_failure is not None else []


@answers.exercise("failing-rank", answers.Rank(2), accepted=_first_failure, name="predicted_rank")
def check_failing_rank(answer: int, taken) -> Check:
    """Exercise "failing-rank" (predicted before the port-taken run): which rank raises first when
    MASTER_PORT is held by another process? Checked against the run's first failure (the ranks' own
    time-ordered error records)."""
    if taken.first_failure is None:
        return Check(False, f"the run recorded no failing rank ({taken.status}); run the port-taken cell again")
    if answer == taken.first_failure:
        return Check(True, f"rank {answer} raised {taken.cause.type if taken.cause else 'an error'} first: it is the "
                           "rank that hosts the store on MASTER_PORT, so it is the one that must bind the port")
    return Check(False, f"not rank {answer}: which rank *binds* MASTER_PORT (hosts the TCPStore), and which only "
                        "connects to it? Read each rank's `error` in taken.ranks")


def errno_name(result) -> str | None:
    """The errno name in PyTorch's own message (``... code: -98, name: EADDRINUSE, message: ...``)."""
    import re

    text = result.cause.message if result.cause is not None else (diagnose(result).error or "")
    m = re.search(r"\bname: (E[A-Z0-9]+)\b", text or "")
    return m.group(1) if m else None


ERRNO_NAMES = ("EADDRINUSE", "EADDRNOTAVAIL", "EACCES", "ECONNREFUSED", "ECONNRESET", "ETIMEDOUT", "EHOSTUNREACH")


def _errno(taken) -> list[str]:
    return [n for n in [errno_name(taken)] if n]


# the words that name each errno in an output (its strerror, a signature): above the checker, none may show
ERRNO_WORDS = {"EADDRINUSE": r"in[- ]use", "EADDRNOTAVAIL": r"cannot assign requested|addr(ess)?[- ]not[- ]avail",
               "EACCES": r"permission denied", "ECONNREFUSED": r"connection refused",
               "ECONNRESET": r"connection reset", "ETIMEDOUT": r"timed out", "EHOSTUNREACH": r"no route to host"}


@answers.exercise("errno-name", answers.Choice(ERRNO_NAMES, reveals=ERRNO_WORDS), accepted=_errno,
                  name="predicted_errno")
def check_error_answer(answer: str, taken) -> Check:
    """Exercise "errno-name" (predicted before the run): the errno name PyTorch prints when the port is
    taken, checked against the real run's message."""
    truth = errno_name(taken)
    if truth is None:
        return Check(False, f"this port-taken run printed no errno name ({taken.status}); run it again")
    if answer == truth:
        return Check(True, f"{truth}: rank 0's real error, in PyTorch's words: {(taken.cause.message if taken.cause else '')[:120]}")
    return Check(False, f"not {answer}: rank 0 does not connect anywhere, it *binds* MASTER_PORT; which errno does "
                        "bind() give for a port another process listens on?")


EXERCISES = answers.exercises(check_failing_rank, check_error_answer)
