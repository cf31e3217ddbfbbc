"""Lab 03 (mismatched shapes across ranks): everything the notebook calls.

Every number shown comes from a real 2-rank run in this execution (``ddplab.run``).
"""
from __future__ import annotations

import re
from typing import Mapping

import ddplab
from ddplab.errors import DdplabError
from ddplab.course import answers, claims
from ddplab.course import contract
from ddplab.course.notebook import Check

LAB = "03"
SHAPES = ("article-example", "gather-ragged", "model-mismatch", "fixed-pad-gather", "fixed-guard")
DTYPES = ("dtype-mismatch", "dtype-same-width", "fixed-dtype")
VARIANTS = SHAPES + DTYPES
BUILDS_DDP = ("article-example", "model-mismatch", "fixed-guard")
DETAIL_ENV = {"TORCH_DISTRIBUTED_DEBUG": "DETAIL", "TORCH_CPP_LOG_LEVEL": "INFO"}


def check_request(variant: str, detail: bool = False, on_mismatch: str = "pad") -> None:
    """Reject what cannot work together before any rank starts (one line naming the fix); each
    knob's own values are the script's declaration (contract.validate_knobs)."""
    if variant not in VARIANTS:
        raise DdplabError(f"lab 03 has no variant {variant!r}", hint="choose one of: " + ", ".join(VARIANTS))
    if detail and variant in BUILDS_DDP:
        raise DdplabError(f"TORCH_DISTRIBUTED_DEBUG=DETAIL crashes (SIGSEGV) when DDP is constructed on gloo with "
                          f"torch 2.13, and variant {variant!r} constructs DDP",
                          hint="use detail=True only with gather-ragged or fixed-pad-gather (plain collectives)")
    if on_mismatch != "pad" and variant != "fixed-guard":
        raise DdplabError(f"on_mismatch is an option of fixed-guard, not of {variant!r}",
                          hint="run variant='fixed-guard' with on_mismatch='raise'")


def validate(variant: str = "gather-ragged", detail: bool = False, **knobs) -> None:
    """Refuse a bad request before any rank starts: an unknown knob or value (the script's
    declaration), or knobs ``variant`` cannot take."""
    contract.validate_knobs(LAB, knobs, run_variant)
    check_request(variant, detail, knobs.get("on_mismatch", "pad"))


def run_variant(variant: str, detail: bool = False, **kw) -> ddplab.RunResult:
    """One real run of lab 03; ``detail=True`` adds TORCH_DISTRIBUTED_DEBUG=DETAIL (and C++ INFO logs)."""
    validate(variant, detail, **kw)
    args, kw = contract.script_args(LAB, kw)
    env = {**kw.pop("env", {}), **(DETAIL_ENV if detail else {})}
    return ddplab.run(LAB, variant=variant, args=args, env=env, **kw)


# ----------------------------------------------------------------------------------------------
# Reading the records
# ----------------------------------------------------------------------------------------------

def _first(result, event: str) -> dict | None:
    recs = sorted(result.records_of(event), key=lambda r: r["rank"])
    return recs[0] if recs else None


def grad_check(result) -> dict:
    """article-example: relative error of DDP's averaged gradient against the 30-row gradient."""
    rec = _first(result, "grad_check")
    if rec is None:
        raise DdplabError(f"no gradient check in this run ({result.headline()})", hint="pass an article-example result")
    return {"rows": [r["rows"] for r in sorted(result.records_of("start"), key=lambda r: r["rank"])],
            "rel_err_naive": rec["rel_err_naive"], "rel_err_weighted": rec["rel_err_weighted"]}


def compare(result) -> dict:
    """fixed-pad-gather / fixed-guard: the gathered predictions against the single-process ones (every rank)."""
    recs = result.records_of("compare")
    if not recs:
        return {"equal": False, "max_abs_diff": None, "rows": None}
    return {"equal": all(r["equal"] for r in recs) and len(recs) == result.nproc,
            "max_abs_diff": max((r["max_abs_diff"] or 0.0) for r in recs), "rows": recs[0]["rows"]}


def guard_caught(result) -> dict | None:
    """The guard's finding: shapes per rank, its message and how long it took (slowest rank)."""
    recs = result.records_of("guard_caught")
    if not recs:
        return None
    return {"shapes": recs[0]["shapes"], "message": recs[0]["message"].split(" (batch")[0],
            "ms": max(r["ms"] for r in recs), "batch": recs[0]["batch"]}


def guard_cost(result) -> dict:
    """Median guard time and step time per training step, slowest rank."""
    recs = result.records_of("guard_cost")
    if not recs:
        raise DdplabError(f"no guard cost in this run ({result.headline()})", hint="pass an ok fixed-guard result")
    g = max(r["guard_ms"] for r in recs)
    s = max(r["step_ms"] for r in recs)
    return {"guard_ms": g, "step_ms": s, "overhead_pct": 100 * g / s, "steps": recs[0]["steps"]}


_SHAPE = re.compile(r"Rank (\d+) is running collective: CollectiveFingerPrint\(SequenceNumber=(\d+), OpType=(\w+), "
                    r"TensorShape=\[([^\]]*)\].*?but Rank (\d+) is running collective: CollectiveFingerPrint\("
                    r"SequenceNumber=\d+, OpType=(\w+), TensorShape=\[([^\]]*)\]")


def detail_report(result) -> dict | None:
    """What TORCH_DISTRIBUTED_DEBUG=DETAIL said: the collective, and each rank's tensor shape."""
    text = "\n".join(r.log_tail for r in result.ranks) + "\n" + (result.excerpt or "")
    m = _SHAPE.search(text)
    if not m:
        return None
    shape = lambda s: [int(v) for v in s.split(",") if v.strip()]
    return {"op": m.group(3), "sequence_number": int(m.group(2)),
            "shapes": {int(m.group(1)): shape(m.group(4)), int(m.group(5)): shape(m.group(7))}}


def dtype_report(result) -> dict:
    """dtype variants: each rank's dtype and bytes per element, and whether its all-reduced sums equal
    the single-process ones (absent for a rank that did not get past the all_reduce)."""
    start = {r["rank"]: r for r in result.records_of("start")}
    done = {r["rank"]: r for r in result.records_of("compare")}
    return {"status": result.status, "signature": result.signature,
            "aborted_ranks": [r.rank for r in result.ranks if r.signal == "SIGABRT"],
            "ranks": {k: {"dtype": v["dtype"], "bytes": v["bytes_per_element"],
                          "equal": done[k]["equal"] if k in done else None,
                          "max_abs_diff": done[k]["max_abs_diff"] if k in done else None}
                      for k, v in sorted(start.items())}}


def gloo_report(result) -> dict | None:
    """What bare gloo said: bytes received against bytes expected, and which rank aborted. Also which
    ranks got past the bad gather before torchrun stopped them, with what result: a race (the rank that
    did not abort may or may not reach the comparison first), so shown but never asserted in full."""
    m = re.search(r"op\.preamble\.length <= op\.nbytes\. (\d+) vs (\d+)", result.excerpt or "")
    aborted = [r.rank for r in result.ranks if r.signal == "SIGABRT"]
    got_past = {c["rank"]: {"rows": c["rows"], "equal": c["equal"]}
                for c in sorted(result.records_of("compare"), key=lambda c: c["rank"])}
    return {"received_bytes": int(m.group(1)), "expected_bytes": int(m.group(2)), "aborted_ranks": aborted,
            "got_past_gather": got_past} if m else None


# ----------------------------------------------------------------------------------------------
# Figure and claim check
# ----------------------------------------------------------------------------------------------

def plot(bare, detail, guard_raise, guard_ok):
    """Left: measured seconds from launch until each run gave its answer (whole runs, start-up
    included), and the guard's own detection time inside the ranks. Nothing hung here, so no timeout
    is drawn. Right: the guard's cost per training step against the step itself (medians, slowest rank)."""
    import matplotlib.pyplot as plt

    caught = guard_caught(guard_raise) or {"ms": float("nan")}
    cost = guard_cost(guard_ok)
    rows = [(f"bare gloo: {bare.status}, names bytes only", bare.wall_s),
            (f"DETAIL: {detail.status}, names op + shapes", detail.wall_s),
            (f"guard: {guard_raise.status}, names ranks + shapes", guard_raise.wall_s),
            ("guard's check inside the ranks", caught["ms"] / 1e3)]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 3.4), gridspec_kw={"width_ratios": [2.2, 1]})
    for i, (label, s) in enumerate(rows):
        ax.barh(i, s, color="#0969da")
        ax.text(s, i, f"  {s:.3g} s", va="center")
    ax.set_yticks(range(len(rows)), [r[0] for r in rows])
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlim(right=max(s for _, s in rows) * 8)
    ax.set_xlabel("seconds, measured (log scale; whole runs include start-up: imports, rendezvous)")
    ax.set_title("gather-ragged: seconds until the problem was named (measured)", fontsize=10)
    bx.bar([0, 1], [cost["step_ms"], cost["guard_ms"]], color=["#8c959f", "#0969da"])
    bx.set_xticks([0, 1], ["training step", "shape guard"])
    for x, v in enumerate([cost["step_ms"], cost["guard_ms"]]):
        bx.text(x, v, f"{v:.2f} ms", ha="center", va="bottom")
    bx.set_ylim(top=max(cost["step_ms"], cost["guard_ms"]) * 1.25)
    bx.set_ylabel("ms per step (median, measured)")
    bx.set_title(f"guard cost: {cost['overhead_pct']:.0f}% of a tiny step")
    fig.tight_layout()
    return fig


def uneven_evidence(article: "ddplab.RunResult") -> claims.Evidence:
    """Article 001's 'uneven data distribution ... can cause discrepancies in model updates', from the
    article-example run: its ranks hold 10 and 20 rows, and DDP averages their mean gradients as equals."""
    g = grad_check(article)
    return claims.evidence(
        f"rows per rank {g['rows']}: DDP's averaged gradient differs from the {sum(g['rows'])}-row gradient by "
        f"{100 * g['rel_err_naive']:.1f}% (each rank's mean weighted equally, not by its rows)",
        unequal_shares_skew_the_update=g["rel_err_naive"] > 0.01)


def claim_inputs(runs: Mapping[str, "ddplab.RunResult"]) -> claims.Inputs:
    """What these runs measured for the register's claims (ddplab.course.claim_register); judged there.
    Keys read: "article-example", "gather-ragged", "model-mismatch", "dtype-mismatch", "dtype-same-width",
    "gather-ragged-detail" (gather-ragged with detail=True) and "fixed-guard-raise" (fixed-guard with
    on_mismatch="raise")."""
    article, bare, model = runs["article-example"], runs["gather-ragged"], runs["model-mismatch"]
    dtype, silent = runs["dtype-mismatch"], dtype_report(runs["dtype-same-width"])
    detail, guard_raise = runs["gather-ragged-detail"], runs["fixed-guard-raise"]
    g = grad_check(article)
    d = detail_report(detail)
    rep = gloo_report(bare) or {}
    caught = guard_caught(guard_raise)
    bare_msg = " ".join(filter(None, [bare.excerpt, bare.cause.message if bare.cause else ""]))
    names_shapes = bool(re.search(r"\[\d+, \d+\]|TensorShape|shape", bare_msg))
    return claims.Inputs(LAB, {
        "example3-hang": claims.evidence(
            f"rows per rank {g['rows']}: the DDP run ended {article.status} in {article.wall_s:.1f} s; its averaged gradient "
            f"differs from the {sum(g['rows'])}-row gradient by {100 * g['rel_err_naive']:.1f}% (ranks weighted equally, "
            f"not by rows); weighting the loss by rows: {g['rel_err_weighted']:.1e}. Gradients have the parameters' shapes "
            "whatever the batch size, so the all-reduce itself matches",
            incorrect_results=g["rel_err_naive"] > 0.01, hang=article.status == "hung"),
        "mismatch-errors-hang": claims.evidence(
            f"gather-ragged: {bare.status} [{bare.signature}] after {bare.wall_s:.1f} s, rank(s) {rep.get('aborted_ranks')} "
            f"aborted in gloo; model-mismatch: {model.status} [{model.signature}] at DDP construction; dtype-mismatch: "
            f"{dtype.status} [{dtype.signature}], rank(s) {dtype_report(dtype)['aborted_ranks']} aborted; hung: "
            f"{[r.variant for r in (bare, model, dtype) if r.status == 'hung'] or 'none'}. Beside them, "
            "dtype-same-width "
            f"(dtypes of equal size: {', '.join(sorted({v['dtype'] for v in silent['ranks'].values()}))}) ended "
            f"{silent['status']} with no error and sums equal to the single-process ones on "
            f"{sum(bool(v['equal']) for v in silent['ranks'].values())} of {len(silent['ranks'])} ranks",
            errors=all(r.status == "failed" for r in (bare, model, dtype)),
            hang="hung" in (bare.status, model.status, dtype.status)),
        "uneven-data": uneven_evidence(article),
        "cryptic-errors": claims.evidence(
            f"bare gloo: {_gloo_words(rep)} (names shapes or the collective: {'yes' if names_shapes else 'no'}); "
            f"with TORCH_DISTRIBUTED_DEBUG=DETAIL: "
            f"{d['op'] if d else '?'} shapes {d['shapes'] if d else '?'}; the guard: {(caught or {}).get('message', '?')}",
            cryptic=bare.status == "failed" and not names_shapes),
    })


def _gloo_words(rep: dict) -> str:
    if not rep:
        return "no size message found"
    return f"\"op.preamble.length <= op.nbytes. {rep['received_bytes']} vs {rep['expected_bytes']}\""


# ----------------------------------------------------------------------------------------------
# Exercises
# ----------------------------------------------------------------------------------------------

def run_all(guard_steps: int = 30, **kw) -> dict:
    """The five shape variants as the lab runs them by default (no DETAIL; fixed-guard pads), each once:
    exercise 1's runs, which the notebook then reads one by one."""
    return {v: run_variant(v, **({"steps": guard_steps} if v == "fixed-guard" else {}), **kw) for v in SHAPES}


def _failed(results: dict) -> list[frozenset]:
    return [frozenset(v for v, r in results.items() if r.status == "failed")]


@answers.exercise("failing-variants", answers.Options(SHAPES, "a set of variant names, like {\"fixed-guard\"}",
                                                     marks=r"{o}\W{1,3}failed\b"),
                  accepted=_failed, name="failing")
def check_failing(answer: frozenset, results: dict) -> Check:
    """Exercise 1 (predicted before the runs): which variants end in 'failed' on 2 gloo ranks?
    ``results``: variant -> RunResult from `run_all` (the default runs: no DETAIL, the guard padding)."""
    truth = _failed(results)[0]
    if answer == truth:
        return Check(True, f"measured: {sorted(truth)} failed, the others ended ok")
    return Check(False, f"the runs say otherwise: {len(answer ^ truth)} of your variants classified differently; "
                        "for each, ask: does any collective see different shapes on the ranks, and does anything check?")


@answers.exercise("three-ranks", answers.Choice(answers.STATUSES), runs_answer=True)
def check_three_ranks(answer: str, result=None, **kw) -> Check:
    """Exercise 3 (predicted before the run): with 3 ranks the 45 evaluation rows split 15/15/15. What
    does gather-ragged end with: 'ok', 'failed' or 'hung'? The checker runs it for real (about 8 s),
    or uses ``result``, such a run."""
    r = result if result is not None else run_variant("gather-ragged", nproc=3, **kw)
    rows = [x["rows"] for x in sorted(r.records_of("start"), key=lambda x: x["rank"])]
    if answer == r.status:
        return Check(True, f"ranks had {rows} rows and the run ended {r.status}"
                           + (f" [{r.signature}]" if r.signature else ": every all_gather saw equal shapes"))
    return Check(False, f"not what the run did: ranks had {rows} rows; work out each rank's batch sizes (labs/03_shapes.py: EVAL_ROWS, BATCH) "
                        "and ask whether any all_gather sees different shapes")


def _silently_wrong(results: dict) -> list[frozenset]:
    return [frozenset(v for v, r in results.items() if r.status == "ok"
                      and not all(x["equal"] for x in dtype_report(r)["ranks"].values()))]


@answers.exercise("dtype-silently-wrong", answers.Options(DTYPES, "a set of variant names, like {\"fixed-dtype\"}",
                                                         marks=r"{o}\W{1,3}ok\b", says=r"silent|wrong"),
                  accepted=_silently_wrong, name="silently_wrong")
def check_silently_wrong(answer: frozenset, results: dict) -> Check:
    """Exercise 2 (predicted before the runs): which of the dtype variants end 'ok' with statistics that
    differ from the single-process ones? ``results``: variant -> RunResult of each of DTYPES."""
    truth = _silently_wrong(results)[0]
    if answer == truth:
        return Check(True, f"measured: {sorted(truth) or 'none'} ended ok with wrong sums")
    return Check(False, "the runs say otherwise: for each variant ask how many bytes an element has on each rank, "
                        "and whether gloo, which compares only bytes, can notice")


EXERCISES = answers.exercises(check_failing, check_three_ranks, check_silently_wrong)
