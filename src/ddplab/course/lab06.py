"""Lab 06 - initialization that never finishes: runs, sweeps, the silent-master namespace, plots,
claim checks and exercise checkers for notebooks/06_init.ipynb and benchmarks/lab06_timeouts.py.

Everything stays on this machine: loopback, or a network namespace (made and always removed by
ddplab.origins.cluster.silent_master) whose address never answers.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping, Sequence

if TYPE_CHECKING:
    from concurrent.futures import Future

import ddplab
from ddplab.errors import DdplabError
from ddplab.course import answers, claims
from ddplab.course import contract
from ddplab.course.notebook import Check
from ddplab.origins.cluster import SilentMaster, namespaces_owned_by, netns_available, silent_master  # noqa: F401

LAB = "06"
DEFAULT_PG_TIMEOUT_S = 1800.0     # torch.distributed.constants.default_pg_timeout (gloo; NCCL: 10 min)
ARTICLE_SLEEP_S = 60.0            # Example 2's time.sleep(60)


# ----------------------------------------------------------------------------------------------
# A master address where nothing answers: made by ddplab.origins.cluster, which owns every network
# namespace ddplab creates (an owner file per object, removed by the next run if its owner was killed)
# ----------------------------------------------------------------------------------------------

def leftover_namespaces(pid: int | None = None) -> list[str]:
    """Namespaces this lab's silent masters made that still exist (must be empty after every run):
    those of process ``pid`` (default: this one), or of any process with pid=0."""
    return namespaces_owned_by(None if pid == 0 else (pid or os.getpid()))


# ----------------------------------------------------------------------------------------------
# Runs
# ----------------------------------------------------------------------------------------------

def validate(**knobs) -> None:
    """Refuse an unknown knob or a value the script's declaration refuses, before any rank starts."""
    contract.validate_knobs(LAB, knobs, run_variant)


def run_variant(variant: str, args: Sequence[str] = (), **kw) -> "ddplab.RunResult":
    """One real run of a lab 06 variant (a torchrun job through ddplab.run): the script's knobs
    by name (timeout_s=2) or as its command line (``args``). A hang is found by the stall rule (no
    rank made progress for the stall window); other keywords go to ddplab.run."""
    validate(**kw)
    knob_args, kw = contract.script_args(LAB, kw)
    return ddplab.run(LAB, variant=variant, args=(*knob_args, *args), **kw)


def start(variant: str, args: Sequence[str] = (), **kw) -> "Future":
    """Start a run of a lab 06 variant in a background thread and return at once; ``.result()``
    waits for its RunResult."""
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"lab06-{variant}")
    job = pool.submit(run_variant, variant, args, **kw)
    pool.shutdown(wait=False)
    return job


def run_unreachable(timeout_s: float = 3.0, prefer: str = "netns", **kw) -> tuple["ddplab.RunResult", SilentMaster]:
    """unreachable-master against a silent master made for this run (and removed right after)."""
    with silent_master(prefer) as m:
        r = run_variant("unreachable-master", master_addr=m.address, timeout_s=timeout_s, **kw)
    return r, m


def init_failures(r) -> list[dict]:
    """Each rank's init error as recorded by the rank itself: rank, error type, message, seconds."""
    return [{k: rec.get(k) for k in ("rank", "error", "message", "seconds", "timeout_s")}
            for rec in sorted(r.records_of("init_failed"), key=lambda x: x["rank"])]


def give_up_seconds(r, rank: int = 1) -> float | None:
    """Seconds from init_process_group's call to its error on ``rank`` (measured inside the rank)."""
    got = [rec["seconds"] for rec in r.records_of("init_failed") if rec["rank"] == rank and "seconds" in rec]
    return got[0] if got else None


# ----------------------------------------------------------------------------------------------
# The timeout sweep (timeout-sweep: late-rank's trials, many in one job)
# ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Sweep:
    points: tuple[dict, ...]     # rank 0's trials: timeout_s, delay_s, outcome ("ok"/"failed"), seconds
    status: str
    wall_s: float
    run_dir: str

    def to_dict(self) -> dict:
        return {"points": [dict(p) for p in self.points], "status": self.status, "wall_s": self.wall_s,
                "run_dir": self.run_dir}

    def table(self) -> str:
        rows = [f"{'delay s':>8} {'timeout s':>10} {'outcome':>8} {'answered after s':>17}"]
        rows += [f"{p['delay_s']:>8g} {p['timeout_s']:>10g} {p['outcome']:>8} {p['seconds']:>17.2f}" for p in self.points]
        return "\n".join(rows)


def validate_sweep(timeouts: Sequence[float], delays: Sequence[float], max_trials: int = 40) -> None:
    """Reject a sweep that cannot run well, before any rank starts."""
    for name, xs in (("timeouts", timeouts), ("delays", delays)):
        if not xs:
            raise DdplabError(f"the sweep needs at least one value in {name}", hint=f"for example {name}=[0.5, 1, 2]")
        bad = [x for x in xs if not isinstance(x, (int, float)) or isinstance(x, bool) or not 0 < x <= 120]
        if bad:
            raise DdplabError(f"{name} must be seconds between 0 and 120, got {bad}", hint=f"for example {name}=[0.5, 1, 2]")
    close = [(t, d) for t in timeouts for d in delays if abs(t - d) < 0.3]
    if close:
        raise DdplabError(f"timeout and delay too close to call: {close}",
                          hint="keep every timeout at least 0.3 s away from every delay (the outcome is a race there)")
    if len(timeouts) * len(delays) > max_trials:
        raise DdplabError(f"{len(timeouts) * len(delays)} trials is too many for one run",
                          hint=f"use at most {max_trials} timeout x delay pairs")


def timeout_sweep(timeouts: Sequence[float] = (0.5, 1, 2, 4), delays: Sequence[float] = (1.5,), **kw) -> Sweep:
    """timeout-sweep: late-rank for each (timeout, delay) pair, in one torchrun job: every trial is a real
    init_process_group with that timeout, and rank 1 joining ``delay`` seconds late."""
    validate_sweep(list(timeouts), list(delays))
    # Rank 1 idles `delay` s on purpose in each trial while rank 0 waits in init_process_group. ddplab
    # waits for PyTorch's own timeout only when it fires within 30 s, so for a longer timeout the stall
    # window must cover the delay, or a deliberate wait would be judged a hang.
    if max(timeouts) > 25 and max(delays) > 2:
        kw.setdefault("stall_s", max(delays) + 3.0)
    r = run_variant("timeout-sweep", sweep_timeouts=list(timeouts), sweep_delays=list(delays), **kw)
    points = tuple(sorted(({k: p[k] for k in ("timeout_s", "delay_s", "outcome", "seconds", "error")}
                           for p in r.records_of("trial") if p["rank"] == 0),
                          key=lambda p: (p["delay_s"], p["timeout_s"])))
    return Sweep(points, r.status, r.wall_s, r.run_dir)


def plot_sweep(sweep: Sweep, title: str = "When does a late rank make init_process_group fail?"):
    """Observed seconds until init_process_group answered, against the configured timeout; the
    default timeout (30 min) marked."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    delays = sorted({p["delay_s"] for p in sweep.points})
    for i, d in enumerate(delays):
        pts = [p for p in sweep.points if p["delay_s"] == d]
        for outcome, marker, colour in (("failed", "x", "#cf222e"), ("ok", "o", "#2da44e")):
            sel = [p for p in pts if p["outcome"] == outcome]
            ax.scatter([p["timeout_s"] for p in sel], [p["seconds"] for p in sel], marker=marker, s=60, color=colour,
                       label=f"{'failed' if outcome == 'failed' else 'succeeded'}, rank 1 {d:g} s late")
        ax.axhline(d, color="#8c959f", lw=0.8, ls=":")
    xs = [p["timeout_s"] for p in sweep.points] + [DEFAULT_PG_TIMEOUT_S]
    lo, hi = min(xs) / 1.5, DEFAULT_PG_TIMEOUT_S * 1.5
    ax.plot([lo, hi], [lo, hi], color="#0969da", lw=0.8, label="answer = timeout")
    ax.axvline(DEFAULT_PG_TIMEOUT_S, color="#9a6700", ls="--", label="PyTorch default: 30 min (not run)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(min(p["seconds"] for p in sweep.points) / 1.5 if sweep.points else 0.1, hi)
    ax.set_xlabel("configured init_process_group timeout (s, log)")
    ax.set_ylabel("measured seconds until init answered (s, log)")
    ax.set_title(title)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    return fig


def waited_without_answer(article) -> float | None:
    """Longest time a rank of the article-sleep run had waited in init_process_group, no answer yet:
    the ranks' own heartbeat (every 2 s), or at least how long no rank had made progress at the verdict."""
    got = [rec["seconds"] for rec in article.records_of("waiting")]
    if article.stall is not None:
        got.append(article.stall.idle_s)
    return max(got) if got else None


def waiting_at_rendezvous(article) -> tuple[int, ...]:
    """Ranks that were blocked in init_process_group's rendezvous when the run was judged hung."""
    return tuple(k.rank for k in article.ranks if k.where is not None and k.where.kind == "rendezvous")


def time_to_answer(explicit, article, explicit_timeout_s: float):
    """Bars: seconds inside init_process_group until the learner had a clear error (measured in the
    ranks, so a slow start-up does not count), explicit timeout vs the article's pattern."""
    from ddplab.views import plots

    clear = max((f["seconds"] for f in init_failures(explicit) if f["seconds"] is not None), default=float("nan"))
    waited = waited_without_answer(article) or float("nan")
    labels = [f"explicit timeout={explicit_timeout_s:g} s: error (measured)",
              "article's pattern: still no error when stopped (measured)",
              "article's pattern: 30 min + sleep(60) (quoted)"]
    return plots.time_to_answer(labels, [clear, waited, DEFAULT_PG_TIMEOUT_S + ARTICLE_SLEEP_S], [True, True, False],
                                title="Seconds in init_process_group until a missing rank is reported")


# ----------------------------------------------------------------------------------------------
# Claims and exercises
# ----------------------------------------------------------------------------------------------

def _init_raised(r) -> list[int]:
    """Ranks whose own exception was raised inside init_process_group (the frames of its error record)."""
    return [k.rank for k in r.ranks if k.error is not None and any(f.func == "init_process_group" for f in k.error.frames)]


def _failed_in_init(r) -> bool:
    """The run failed, and at least one rank's init_process_group raised: the group never formed."""
    return r.status == "failed" and bool(_init_raised(r))


def _within_stay(r) -> tuple[bool, str]:
    """(every other rank's init error came while the first failing rank still stayed, a sentence)."""
    fails = sorted(r.records_of("init_failed"), key=lambda x: x["t"])
    if len(fails) < r.nproc:
        return False, f"{len(fails)} of {r.nproc} ranks reported an init error"
    first = fails[0]
    stay = first.get("linger_s") or 0.0
    late = [round(f["t"] - first["t"], 2) for f in fails[1:]]
    return all(d <= stay for d in late), (f"rank {first['rank']} failed first and stayed {stay:g} s; the other rank's "
                                          f"error came {', '.join(f'{d:g}' for d in late)} s later")


def backend_report(r) -> dict:
    """wrong-backend / fixed-backend: how the run ended, the backend and device each rank got (absent
    where init_process_group raised), and the first failing rank's own error."""
    got = {x["rank"]: x for x in r.records_of("backend")}
    return {"status": r.status, "signature": r.signature,
            "backend": sorted({x["backend"] for x in got.values()}), "device": sorted({x["device"] for x in got.values()}),
            "error": f"{r.cause.type}: {r.cause.message}" if r.cause else None, "in_init": _failed_in_init(r)}


def rank_report(r) -> dict:
    """duplicate-rank / rank-outside-world / rank-from-env: the rank each process (torchrun's rank) asked
    init_process_group for, how the run ended, and whether the all-reduce of the ranks summed as a
    world of 0..N-1 must."""
    sums = r.records_of("ranks_sum")
    return {"status": r.status, "signature": r.signature,
            "asked": {a["rank"]: a["asked_rank"] for a in r.records_of("asked")},
            "sum_right": bool(sums) and all(s["sum"] == s["expected"] for s in sums)}


def fd_report(r) -> dict:
    """fd-limit / fd-limit-raised: the master's (rank 0's) descriptors open before init_process_group, the
    soft limit it ran with, the hard limit, and how many it had open after init and one all-reduce (None
    where init failed)."""
    lim = (r.records_of("fd_limit") or [{}])[0]
    used = (r.records_of("fd_used") or [{}])[0].get("open_after")
    return {"status": r.status, "signature": r.signature, "open_before": lim.get("open_before"),
            "limit": lim.get("soft"), "hard": lim.get("hard"), "headroom": lim.get("headroom"), "used": used}


def plot_fixes(pairs: Sequence[tuple]):
    """Each init failure against its fix: how many ranks completed a collective in each run (from the
    ranks' ledgers; ddplab.views.plots.fix_pairs). ``pairs``: (broken run, fixed run) tuples."""
    from ddplab.views import plots

    return plots.fix_pairs(pairs, title="Ranks that formed a working group: each init failure against its fix")


def plot_descriptors(broken, fixed):
    """fd-limit against fd-limit-raised, on the master: descriptors open before init_process_group, the soft
    limit the broken run had, and what the fixed run had open after init and one all-reduce (measured)."""
    import matplotlib.pyplot as plt

    b, f = fd_report(broken), fd_report(fixed)
    labels = ["open before init (fd-limit)", "soft limit (fd-limit)", "open after init (fd-limit-raised)"]
    values = [b["open_before"], b["limit"], f["used"]]
    fig, ax = plt.subplots(figsize=(7.5, 2.4))
    colours = ["#8c959f", "#cf222e", "#2da44e"]
    for i, (v, c) in enumerate(zip(values, colours)):
        ax.barh(i, v or 0, color=c)
        ax.text(v or 0, i, f"  {v}" if v is not None else "  not measured", va="center", fontsize=8)
    ax.set_yticks(range(3), labels)
    ax.invert_yaxis()
    ax.set_xlim(0, max(v or 0 for v in values) * 1.25 + 1)
    ax.set_xlabel("file descriptors of the master (rank 0)")
    ax.set_title(f"The master's descriptors: fd-limit ended {b['status']}, fd-limit-raised {f['status']}",
                 fontsize=10)
    fig.tight_layout()
    return fig


def claim_inputs(runs: Mapping[str, "ddplab.RunResult"]) -> claims.Inputs:
    """What these runs measured for the register's claims (ddplab.course.claim_register); judged there.
    Keys read: "missing-rank", "unreachable-master", "article-sleep" (runs of those variants),
    "timeout-sweep" (timeout_sweep()'s Sweep), "silent-master" (run_unreachable()'s SilentMaster),
    "env-mismatch": {"port": run, "world-size": run} of env-mismatch, "wrong-backend", "fixed-backend",
    "fd-limit" and "fd-limit-raised"."""
    missing, unreachable, article = runs["missing-rank"], runs["unreachable-master"], runs["article-sleep"]
    sweep: Sweep = runs["timeout-sweep"]
    master: SilentMaster = runs["silent-master"]
    mismatches: dict = runs["env-mismatch"]
    sleep_s = ARTICLE_SLEEP_S
    fails = [p for p in sweep.points if p["outcome"] == "failed"]
    oks = [p for p in sweep.points if p["outcome"] == "ok"]
    named = [("missing-rank", missing), ("unreachable-master", unreachable),
             *((f"env-mismatch ({k})", r) for k, r in mismatches.items())]
    late_only = fails          # rank 1 merely late: no step broken, the job could have waited for it
    late_t = ", ".join(f"{p['timeout_s']:g}" for p in late_only)
    delays = ", ".join(sorted({f"{p['delay_s']:g}" for p in sweep.points}))
    gave_up = give_up_seconds(unreachable, 1)
    missing_s = max((f["seconds"] for f in init_failures(missing) if f["seconds"] is not None), default=float("nan"))
    within, within_text = _within_stay(missing)
    start = article.records_of("start")
    art_timeout = next((s.get("timeout_s") for s in start), None)
    art_timeout_s = art_timeout if art_timeout is not None else DEFAULT_PG_TIMEOUT_S
    art_errors = article.records_of("init_failed")
    mm = {k: (r.status, r.signature, _failed_in_init(r)) for k, r in mismatches.items()}
    world_size_fails = mm.get("world-size", (None, None, False))[2]   # lab 06's part of two claims
    wrong, right = backend_report(runs["wrong-backend"]), backend_report(runs["fixed-backend"])
    fd_low, fd_raised = fd_report(runs["fd-limit"]), fd_report(runs["fd-limit-raised"])
    fd_in_init = _failed_in_init(runs["fd-limit"]) and fd_low["signature"] == "fd-limit"
    return claims.Inputs(LAB, {
        "timeout-at-these-steps": claims.evidence(
            "failed inside init_process_group: " + ", ".join(f"{name} [{r.signature}]: {_failed_in_init(r)}"
                                                             for name, r in named)
            + f"; the sweep, rank 1 merely late (nothing broken): {len(late_only)} of {len(sweep.points)} trials "
              f"timed out (timeouts {late_t or 'none'} s; delays {delays} s)",
            failed_inside_these_steps=all(_failed_in_init(r) for _, r in named),
            only_when_a_step_failed=not late_only),
        "sleep-lets-others-report": claims.evidence(
            f"missing-rank (3 s timeouts, a 2 s stay after an error): {within_text}. Example 2 as written: "
            f"{article.status} [{article.signature}], ranks {list(waiting_at_rendezvous(article))} waiting at the "
            f"rendezvous with no error ({len(art_errors)} reported), init timeout {art_timeout_s:g} s "
            f"({'PyTorch default: none given' if art_timeout is None else 'given'}) against a {sleep_s:g} s sleep; "
            f"ddplab ended it {article.wall_s:.1f} s after launch (no rank made progress for "
            f"{article.stall.idle_s if article.stall else float('nan'):g} s)",
            errors_arrive_within_the_stay=within,
            as_written_reports=bool(art_errors) or art_timeout_s <= sleep_s),
        "firewall": claims.evidence(
            f"{master.note}: rank 1 gave up after {gave_up if gave_up is not None else float('nan'):.1f} s "
            f"({unreachable.status} [{unreachable.signature}]), with init timeout "
            f"{(init_failures(unreachable)[-1:] or [{}])[0].get('timeout_s')} s",
            dropped_packets_stop_init=claims.fact(unreachable.signature == "store-unreachable" and gave_up is not None)
            if master.kind == "netns" else claims.stand_in(
                "loopback: a closed port refuses the connection at once; a firewall that drops packets was not made here")),
        "env-inconsistent": claims.evidence(
            "; ".join(f"rank 1 with another {'MASTER_PORT' if k == 'port' else 'WORLD_SIZE'}: {st} [{sig}]"
                      for k, (st, sig, _) in mm.items()),
            port_mismatch_fails=mm.get("port", (None, None, False))[2],
            world_size_mismatch_fails=world_size_fails),
        "wrong-backend": claims.evidence(
            f"nccl on CPU tensors: {wrong['status']} [{wrong['signature']}] ({wrong['error']}); the backend chosen from "
            f"the hardware ({', '.join(right['backend'])} on {', '.join(right['device'])}): {right['status']}; rank 1 with "
            f"another WORLD_SIZE: {mm.get('world-size', ('not run', None))[0]}",
            wrong_backend_fails=wrong["status"] == "failed" and wrong["signature"] in ("nccl-without-gpu",
                                                                                      "no-backend-for-device"),
            right_backend_runs=right["status"] == "ok",
            world_size_mismatch_fails=world_size_fails),
        "resource-limits-init": claims.evidence(
            f"the master with {fd_low['open_before']} descriptors open and a soft limit of {fd_low['limit']}: "
            f"{fd_low['status']} [{fd_low['signature']}] in init_process_group: {fd_in_init}; the same limit "
            f"raised to the hard one ({fd_raised['limit']}): {fd_raised['status']}, {fd_raised['used']} descriptors open after "
            f"init and one all-reduce",
            fd_limit_stops_init=fd_in_init, raised_limit_initializes=fd_raised["status"] == "ok"),
        "slow-network-default": claims.evidence(
            f"a rank arriving late stood in for a slow network: init answered after at most "
            f"{max((p['seconds'] for p in oks), default=float('nan')):.2f} s whenever the timeout exceeded the delay "
            f"({len(oks)} trials); a missing rank: {missing.signature} after {missing_s:.1f} s with a 3 s timeout",
            exceeds_default=claims.stand_in("a rank that starts late (time.sleep) in place of a slow or congested network")),
    })


def _smallest_ok(sweep: Sweep, delay_s: float | None = None) -> list[float]:
    delay_s = delay_s if delay_s is not None else max(p["delay_s"] for p in sweep.points)
    return sorted(p["timeout_s"] for p in sweep.points if p["delay_s"] == delay_s and p["outcome"] == "ok")[:1]


@answers.exercise("smallest-timeout", answers.Number(0, 3600, "a number of seconds, one of sweep_timeouts",
                                                     label="timeout s"),
                  accepted=_smallest_ok, name="predicted_smallest_timeout")
def check_smallest_timeout(answer: float, sweep: Sweep, delay_s: float | None = None) -> Check:
    """Exercise "smallest-timeout" (predicted before the sweep): the smallest swept timeout that let
    rank 1 (``delay_s`` late) join."""
    delay_s = delay_s if delay_s is not None else max(p["delay_s"] for p in sweep.points)
    swept = sorted(p["timeout_s"] for p in sweep.points if p["delay_s"] == delay_s)
    ok = _smallest_ok(sweep, delay_s)
    if not ok:
        return Check(False, f"no swept timeout was long enough for a {delay_s:g} s delay; sweep longer timeouts")
    if not any(abs(answer - t) < 1e-9 for t in swept):
        return Check(False, f"{answer:g} s was not swept; the sweep tried {', '.join(f'{t:g}' for t in swept)} s")
    if abs(answer - ok[0]) < 1e-9:
        return Check(True, f"measured: {ok[0]:g} s is the smallest swept timeout that let a rank {delay_s:g} s late join")
    return Check(False, f"not {answer:g} s: compare each swept timeout with how late rank 1 was, and read the "
                        f"sweep's outcome column for delay {delay_s:g} s")


INIT_ERRORS = ("DistStoreError", "DistNetworkError", "DistError", "TimeoutError", "ConnectionRefusedError",
               "RuntimeError")
CAUGHT_BY = "RuntimeError"   # the article's Example 2: `except RuntimeError:` around init_process_group


def _rank1_error(unreachable) -> list[str]:
    """What rank 1's init_process_group raised (its class name, as recorded): the answer to hide."""
    return [f["error"] for f in init_failures(unreachable) if f["rank"] == 1 and f["error"]][:1]


def _parents(name: str) -> list[str]:
    """The options that are ``name``'s classes up to the one the article's ``except`` catches
    (DistNetworkError -> DistError, RuntimeError): an ``except`` of any of them catches it."""
    import builtins

    import torch.distributed as dist

    cls = getattr(dist, name, None) or getattr(builtins, name, None)
    if not isinstance(cls, type):
        return []
    up = [c.__name__ for c in cls.__mro__[1:]]
    up = up[:up.index(CAUGHT_BY) + 1] if CAUGHT_BY in up else []
    return [c for c in up if c in INIT_ERRORS]


@answers.exercise("unreachable-error", answers.Choice(INIT_ERRORS, reveals={"DistNetworkError": r"store-unreachable"}),
                  accepted=_rank1_error, name="predicted_error")
def check_unreachable_error(answer: str, unreachable) -> Check:
    """Exercise "unreachable-error" (predicted before the run): rank 1 dials a master address where
    nothing answers; which exception does its init_process_group raise? Checked against the error
    rank 1 recorded; its parent classes up to RuntimeError (what the article's `except` catches) pass
    too, saying which class it was. (The missing-rank run above raised DistStoreError: a store that
    answers but waits; here nothing answers at all.)"""
    truth = _rank1_error(unreachable)
    if not truth:
        return Check(False, "the unreachable-master run recorded no init error for rank 1; run it again")
    mine = next(f for f in init_failures(unreachable) if f["rank"] == 1)
    if answer == truth[0]:
        return Check(True, f"rank 1 raised {truth[0]} after {mine['seconds']} s: {mine['message']}")
    if answer in _parents(truth[0]):
        return Check(True, f"rank 1 raised {truth[0]}, a {answer} (an `except {answer}:` catches it, as the article's "
                           f"`except {CAUGHT_BY}:` does) after {mine['seconds']} s: {mine['message']}")
    return Check(False, f"not {answer}: in the missing-rank run the store answered and then waited (a store "
                        "error); here no packet comes back at all. Which layer gives up first?")


EXERCISES = answers.exercises(check_smallest_timeout, check_unreachable_error)
