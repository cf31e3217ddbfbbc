"""Lab 09 (the network, for real: two nodes on one machine): everything the notebook calls.

Every number comes from a real two-node run in this execution: ``ddplab.origins.cluster`` makes the nodes
(network namespaces on a bridge, a tbf cap, nftables rules, hosts files) and ``ddplab.run`` runs one
torchrun agent on each. Nothing here imitates the network: the packets cross a real (virtual) link,
a real firewall drops them, TCP really retransmits.
"""
from __future__ import annotations

import re
import statistics
from dataclasses import dataclass
from typing import Mapping

import ddplab
from ddplab.origins import catalog
from ddplab.course import claims
from ddplab.engine import classify
from ddplab.origins import cluster as cluster_mod
from ddplab.errors import DdplabError
from ddplab.course import answers
from ddplab.rank import lab_args
from ddplab.course import contract
from ddplab.course.notebook import GAIN, Check, P_LEVEL, rank_sum_p

LAB = "09"
RATES_MBIT = (None, 300, 100)              # None: no cap (the namespace link's own speed)
KNOBS = contract.declared(LAB)          # the script's knobs, read by ast (no torch)
HOOKS = tuple(KNOBS["hook"]["choices"])
RDZV_PORT = 29400                          # ddplab.origins.job.CLUSTER_RDZV_PORT, the port every variant leaves open


def requirement() -> "cluster_mod.Need | None":
    """None when this machine can make clusters; else what lab 09 needs (``str``: the one line)."""
    return cluster_mod.requirement()


def network(variant: str) -> dict:
    """The network LAB["network"] gives a variant (from the catalog: the lab script is the one place)."""
    lab = catalog.find_lab(LAB)
    spec = lab.extra.get("network", {})
    if variant not in spec:
        raise DdplabError(f"lab 09 has no variant {variant!r}", hint="choose one of: " + ", ".join(spec))
    return dict(spec[variant])


def _check(rate_mbit, drop_percent, steps, hook, compare=()) -> None:
    if rate_mbit is not None and (isinstance(rate_mbit, bool) or not isinstance(rate_mbit, (int, float))
                                  or not 1 <= rate_mbit <= 100_000):
        raise DdplabError(f"rate_mbit must be a number of Mbit/s from 1 to 100000 (or None), not {rate_mbit!r}",
                          hint="for example rate_mbit=100")
    if drop_percent is not None and (isinstance(drop_percent, bool) or not isinstance(drop_percent, int)
                                     or not 0 <= drop_percent <= 50):
        raise DdplabError(f"drop_percent must be a whole number from 0 to 50, not {drop_percent!r}",
                          hint="for example drop_percent=5")
    for name, value in (("steps", steps), ("hook", hook), ("compare", compare)):
        if name == "compare" and isinstance(value, str):
            raise DdplabError(f"compare must be a list of hooks from {', '.join(HOOKS)}, not {value!r}",
                              hint="for example compare=['fp16', 'powersgd']")
        try:
            lab_args.coerce(name, KNOBS[name], value)
        except ValueError as e:
            raise DdplabError(f"lab 09: {e}", hint=KNOBS[name]["help"]) from None


def validate(rate_mbit=None, drop_percent=None, steps: int = 8, hook: str = "fp16", compare=(), **knobs) -> None:
    """Refuse a bad request before any rank starts: an unknown knob, or a link the lab cannot make."""
    contract.validate_knobs(LAB, knobs, run_variant)
    _check(rate_mbit, drop_percent, steps, hook, compare)


def run_variant(variant: str, rate_mbit: float | None | str = "lab", drop_percent: int | None = None,
                steps: int = 8, hook: str = "fp16", compare=(), **kw) -> ddplab.RunResult:
    """One real two-node run of lab 09 on the variant's network (LAB["network"]); ``rate_mbit``
    (None: no cap) and ``drop_percent`` override the variant's link; ``compare``: other hooks timed in
    the same job, their steps in turn with the variant's own. Other keywords go to ddplab.run."""
    spec = network(variant)
    if rate_mbit != "lab":
        spec["rate_mbit"] = rate_mbit
    validate(spec.get("rate_mbit"), drop_percent, steps, hook, compare, **kw)
    if drop_percent is not None:
        spec["firewall"] = {"1": {"drop_percent": drop_percent}} if drop_percent else {}
    cluster_mod.require()
    env = {**spec.get("env", {}), **kw.pop("env", {})}
    with cluster_mod.Cluster.from_spec(spec) as c:
        args = lab_args.argv(KNOBS, {"steps": steps, "hook": hook, "compare": list(compare)})
        return ddplab.run(LAB, variant=variant, args=args, env=env, cluster=c, **kw)


# ----------------------------------------------------------------------------------------------
# Reading the runs
# ----------------------------------------------------------------------------------------------

def _steps(result, hook: str | None) -> list[dict]:
    """Each rank's "steps" record for ``hook`` (None: the run's own model, the first it timed); a
    DdplabError when a rank has none (the run did not end ok)."""
    recs = result.records_of("steps")
    hook = hook or (recs[0]["hook"] if recs else None)
    steps = [s for s in recs if s["hook"] == hook]
    if len(steps) != result.nproc:
        raise DdplabError(f"this run has no step times ({result.headline()})",
                          hint="pass a run that ended ok (slow-link, fixed-compress, lossy-link, a fixed-* variant)")
    return steps


def step_times(result, hook: str | None = None) -> list[float]:
    """Every timed step of a run, in ms: at each step the slowest rank's time (the job waits for it).
    ``hook``: the model timed with that hook in a run that compared several (None: the run's own)."""
    rows = [s["all_ms"] for s in _steps(result, hook)]
    return [max(col) for col in zip(*rows)]


def step_facts(result, hook: str | None = None) -> dict:
    """The slowest rank's fastest step (``step_ms``: on a shared machine the least disturbed one; the
    median too), its fastest compute-only step (no_sync) and init_process_group's seconds; ``hook`` as
    for step_times."""
    steps = _steps(result, hook)
    joined = result.records_of("joined")
    return {"step_ms": round(max(s["best_ms"] for s in steps), 2),          # the slowest rank's fastest step
            "median_ms": round(max(s["step_ms"] for s in steps), 2),
            "compute_ms": round(max(s["compute_ms"] for s in steps), 2),
            # never below 0: two fastest-of-N timings on a shared machine can cross
            "comm_ms": round(max(0.0, max(s["best_ms"] - s["compute_ms"] for s in steps)), 2),
            "init_s": round(max(j["init_s"] for j in joined), 3) if joined else None,
            "hook": steps[0]["hook"], "grad_mb": round(steps[0]["grad_mb"], 2)}


@dataclass(frozen=True)
class Point:
    rate_mbit: float | None
    hook: str
    status: str
    step_ms: float | None
    compute_ms: float | None
    init_s: float | None
    steps_ms: tuple = ()        # every timed step (the slowest rank's), for tests between hooks of one run

    @property
    def label(self) -> str:
        return "no cap" if self.rate_mbit is None else f"{self.rate_mbit:g} Mbit/s"


def sweep(rates=RATES_MBIT, compress_at=(None, "lowest"), hooks=("fp16", "powersgd"), steps: int = 8,
          **kw) -> list[Point]:
    """Plain DDP at each link rate, and each compression hook at the rates in ``compress_at``
    ("lowest": the lowest cap). One two-node run per rate: the hooks measured at a rate are timed in
    that run beside plain DDP, their steps in turn (``compare``), so each comparison is paired."""
    caps = [r for r in rates if r is not None]
    where = [min(caps) if r == "lowest" else r for r in compress_at]
    out = []
    for rate in rates:
        compare = [h for h in hooks if h != "none"] if rate in where else []
        res = run_variant("slow-link", rate_mbit=rate, steps=steps, compare=compare, **kw)
        for hook in ["none", *compare]:
            f = step_facts(res, hook) if res.status == "ok" else {}
            out.append(Point(rate, hook, res.status, f.get("step_ms"), f.get("compute_ms"), f.get("init_s"),
                             tuple(step_times(res, hook)) if res.status == "ok" else ()))
    return out


def point(points, rate, hook) -> Point | None:
    return next((p for p in points if p.rate_mbit == rate and p.hook == hook and p.step_ms), None)


def gains(points) -> list[dict]:
    """Each hook's speed-up over plain DDP at the same rate (plain step / hooked step), measured."""
    out = []
    for p in points:
        base = point(points, p.rate_mbit, "none")
        if p.hook != "none" and p.step_ms and base is not None:
            out.append({"rate": p.label, "hook": p.hook, "plain_ms": base.step_ms, "hooked_ms": p.step_ms,
                        "speedup": round(base.step_ms / p.step_ms, 2)})
    return out


def plot_sweep(points):
    """Step time against link rate: plain DDP, its compute-only part, and each hook where measured."""
    import matplotlib.pyplot as plt

    plain = [p for p in points if p.hook == "none" and p.step_ms]
    order = sorted(plain, key=lambda p: -(p.rate_mbit or 1e9))
    xs = list(range(len(order)))
    fig, ax = plt.subplots(figsize=(7.5, 4))
    ax.plot(xs, [p.step_ms for p in order], "o-", color="#cf222e", label="plain DDP (fp32 all-reduce)")
    ax.plot(xs, [p.compute_ms for p in order], "s--", color="#8c959f", label="compute only (no_sync)")
    colours = {"fp16": "#0969da", "bf16": "#8250df", "powersgd": "#1a7f37"}
    for hook in sorted({p.hook for p in points} - {"none"}):
        for i, base in enumerate(order):
            q = point(points, base.rate_mbit, hook)
            if q is not None:
                ax.plot(i, q.step_ms, "D", color=colours.get(hook, "k"), label=f"{hook} hook")
                ax.annotate(f"{base.step_ms / q.step_ms:.1f}x", (i, q.step_ms), textcoords="offset points",
                            xytext=(8, -4), color=colours.get(hook, "k"))
    handles, labels = ax.get_legend_handles_labels()
    seen = dict(zip(labels, handles))
    ax.legend(seen.values(), seen.keys(), loc="upper left")
    ax.set_xticks(xs, [p.label for p in order])
    ax.set_yscale("log")
    ax.set_ylabel("fastest step of the slowest rank (ms, log)")
    ax.set_xlabel("link rate of each node (tbf cap)")
    ax.set_title("Two nodes, 4 MB of gradients a step: when the link is the bottleneck, and what compression buys")
    fig.tight_layout()
    return fig


@dataclass(frozen=True)
class Blocked:
    """What the firewall variant's diagnosis is made of (fields of the run)."""
    status: str
    signature: str | None
    blocked: tuple              # (rank, address it could not reach)
    where: dict                 # rank -> (kind, op)
    master_port: int | None     # the port torchrun gave the workers' store (not the rendezvous port)
    rdzv_port: int = RDZV_PORT


def firewall_facts(result) -> Blocked:
    ranks = [r for r in result.ranks if r.state in ("hung", "running")]
    return Blocked(result.status, result.signature, tuple(classify.blocked_connections(ranks)),
                   {r.rank: (r.where.kind, r.where.op) if r.where else (r.state, None) for r in result.ranks},
                   result.port)


_REMOTE = re.compile(r"remote=\[([^\]]+)\]:(\d+)")


def loopback_facts(result) -> dict:
    """The wrong-interface run: which rank failed, and the address gloo told it to dial (PyTorch's own
    message: ``timed out connecting: ... remote=[127.0.1.1]:PORT``)."""
    first = result.first_failure
    err = result.rank(first).error if first is not None else None
    m = _REMOTE.search(err.message) if err is not None else None
    return {"status": result.status, "signature": result.signature, "rank": first,
            "error_type": err.type if err is not None else None,
            "dialled": m.group(1) if m else None, "port": int(m.group(2)) if m else None}


def expected(result) -> bool:
    """The run ended as LAB says its variant must (status and signature)."""
    v = catalog.find_lab(LAB).variant(result.variant)
    return result.status == v.expect and result.signature == v.signature


def preflight(variant: str, timeout_s: float = 3.0) -> dict[int, dict]:
    """``ddplab doctor --preflight`` on each node of the variant's network, before any job: node 0
    serves (``--serve``: the rendezvous port and a random data port), every node checks
    (``--network``: its hostname, the rendezvous port, the data port). Returns each node's check as
    the command's JSON (NetworkCheck.to_dict)."""
    import json
    import subprocess
    import sys

    spec = network(variant)
    cluster_mod.require()
    env = dict(__import__("os").environ, **spec.get("env", {}))
    cli = [sys.executable, "-m", "ddplab.cli", "doctor", "--preflight"]
    out = {}
    with cluster_mod.Cluster.from_spec(spec) as c:
        port = str(RDZV_PORT)
        server = subprocess.Popen(c.master.exec_prefix() + cli + ["--serve", "--port", port, "--clients",
                                                                  str(len(c.members))],
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
        try:
            server.stdout.readline()                      # "serving ..." once it listens
            for node in c.members:
                p = subprocess.run(node.exec_prefix() + cli + ["--network", "--json", "--master-addr",
                                                               c.master.address, "--port", port],
                                   capture_output=True, text=True, env=env, timeout=60)
                out[node.index] = json.loads(p.stdout)
        finally:
            server.kill()
            server.wait()
    return out


# ----------------------------------------------------------------------------------------------
# Nodes that disagree: the rank-side pre-flight on the same nodes, with the same launch
# ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LaunchCheck:
    """``ddplab.tools.preflight``'s rank side run on a variant's nodes with the variant's launch (each node's
    --nproc-per-node and environment), before any job: what the ranks recorded and compared."""
    variant: str
    status: str                  # the pre-flight run's own ending ("ok": every rank recorded and left)
    seconds: float               # the pre-flight run, torchrun's start included (RunResult.wall_s)
    agreement: "agreement_mod.Agreement"
    run_dir: str

    @property
    def problems(self) -> list[str]:
        return self.agreement.problems()

    def world_sizes(self) -> dict[int, tuple[int, ...]]:
        """{node: the WORLD_SIZE values its ranks were given}."""
        out: dict[int, set] = {}
        for r in self.agreement.ranks:
            out.setdefault(r.node, set()).add(r.world_size)
        return {n: tuple(sorted(v)) for n, v in sorted(out.items())}


def launch_check(variant: str, wait_s: float = 10.0, **kw) -> LaunchCheck:
    """The rank-side pre-flight (``python -m ddplab.tools.preflight`` under each node's torchrun) on the
    variant's network and launch: every rank records what it was given, then compares through
    torchrun's store, waiting at most ``wait_s`` for the others, with no init_process_group. Other
    keywords go to ddplab.run."""
    from ddplab.rank import agreement as agreement_mod
    from ddplab.tools import preflight as preflight_mod

    spec = network(variant)
    cluster_mod.require()
    env = {**spec.get("env", {}), **kw.pop("env", {})}
    with cluster_mod.Cluster.from_spec(spec) as c:
        r = preflight_mod.run_rank_side(wait_s, nproc=catalog.find_lab(LAB).nproc, env=env, cluster=c,
                                        deadline_s=wait_s + 60, **kw)
    return LaunchCheck(variant, r.status, r.wall_s, agreement_mod.from_run(r), r.run_dir)


def disagree_facts(job, check: LaunchCheck) -> dict:
    """The nodes-disagree job beside its pre-flight: how the job ended and where its ranks waited,
    which rank numbers no process had, what each node's ranks were given, and the two times."""
    return {"status": job.status, "signature": job.signature,
            "waiting_in": sorted({r.where.kind for r in job.ranks if r.where is not None}),
            "not_started": [r.rank for r in job.ranks if r.state == "not-started"],
            "world_sizes": check.world_sizes(), "job_s": job.wall_s, "preflight_s": check.seconds,
            "found": [d.field for d in check.agreement.disagreements]}


# ----------------------------------------------------------------------------------------------
# Claims
# ----------------------------------------------------------------------------------------------



def compression_test(points, rate) -> tuple[str, float]:
    """At link ``rate``: each hook's steps against plain DDP's of the same run (a one-sided rank-sum
    test that plain DDP's steps are more than GAIN x the hook's), and the best hook's p doubled for
    each further hook it was chosen from."""
    base = point(points, rate, "none")
    hooked = [p for p in points if p.rate_mbit == rate and p.hook != "none" and p.steps_ms]
    tests = {p.hook: rank_sum_p(list(base.steps_ms), [GAIN * x for x in p.steps_ms]) for p in hooked} if base else {}
    text = ", ".join(f"{h} {base.step_ms / point(points, rate, h).step_ms:.2f}x (p = {q:.3f})" for h, q in tests.items())
    return text or "no hook timed", min(1.0, min(tests.values(), default=1.0) * max(1, len(tests)))


def claim_inputs(runs: Mapping[str, "ddplab.RunResult"]) -> claims.Inputs:
    """What these runs measured for the register's claims (ddplab.course.claim_register); judged there. Keys
    read: "sweep" (sweep()'s points), "lossy-link", "lossless" (the lossy-link variant with
    drop_percent=0, run just before "lossy-link"), "firewall", "fixed-firewall", "nodes-disagree",
    "fixed-world-size" and "launch-check" (launch_check("nodes-disagree"))."""
    points, lossy, lossless = runs["sweep"], runs["lossy-link"], runs["lossless"]
    firewall, fixed_firewall = runs["firewall"], runs["fixed-firewall"]
    caps = [p.rate_mbit for p in points if p.rate_mbit is not None]
    free, low = point(points, None, "none"), point(points, min(caps), "none") if caps else None
    if free is None or low is None:
        raise DdplabError("the sweep has no uncapped or no capped plain-DDP point",
                          hint="run sweep() with rates that include None and at least one cap")
    lossy_ok = lossy.status == "ok"
    base_steps = step_times(lossless)
    if lossy_ok:
        lossy_steps = step_times(lossy)
        p_slower = rank_sum_p(lossy_steps, base_steps)
    drop = _drop_percent(lossy)
    fw = firewall_facts(firewall)
    hooks_text, hooks_p = compression_test(points, low.rate_mbit)
    return claims.Inputs(LAB, {
        "env-inconsistent": env_evidence(runs["nodes-disagree"], runs["launch-check"], runs["fixed-world-size"]),
        "bandwidth-impedes": claims.evidence(
            f"plain DDP step {free.step_ms:.0f} ms uncapped, {low.step_ms:.0f} ms at {low.label} "
            f"({low.step_ms / free.step_ms:.1f}x); compute-only step {free.compute_ms:.0f} -> {low.compute_ms:.0f} ms",
            step_2x_slower=low.step_ms >= 2 * free.step_ms,
            communication_dominates=low.step_ms - low.compute_ms >= 0.5 * low.step_ms),
        "stall-indefinitely": claims.evidence(
            f"{drop}% of node 1's incoming packets dropped: job {lossy.status}"
            + (f", median step {statistics.median(lossy_steps):.0f} ms (slowest {max(lossy_steps):.0f}) against "
               f"{statistics.median(base_steps):.0f} ms (slowest {max(base_steps):.0f}) without loss over "
               f"{len(lossy_steps)} and {len(base_steps)} steps, rank-sum p = {p_slower:.3f}" if lossy_ok else "")
            + ("; judged hung: no rank made progress for the stall window" if lossy.status == "hung" else
               "; every rank kept making progress: TCP retransmitted what was dropped"),
            slower=claims.test(p_slower) if lossy_ok else lossy.status == "hung",
            stalls=lossy.status == "hung"),
        "firewall": claims.evidence(
            f"node 0 accepts port {fw.rdzv_port} only: job {fw.status} [{fw.signature}]; unanswered connections: "
            + (", ".join(f"rank {r} -> {a}" for r, a in fw.blocked) or "none")
            + f" (the workers' store port torchrun picked: {fw.master_port}); ranks in "
            + ", ".join(f"{r}: {k}/{op}" for r, (k, op) in sorted(fw.where.items()))
            + f"; subnet opened: job {fixed_firewall.status}",
            blocked_hangs_in_init=fw.status == "hung" and bool(fw.blocked)
            and all(k in ("rendezvous", "store") for k, _ in fw.where.values()),
            opening_fixes=fixed_firewall.status == "ok"),
        "gloo-congested": claims.evidence(
            f"plain DDP step {free.step_ms:.0f} ms uncapped, {low.step_ms:.0f} ms at {low.label}; with {drop}% of node 1's "
            f"packets dropped the job ended {lossy.status}",
            delayed_on_a_slow_link=low.step_ms >= 2 * free.step_ms, looks_hung_on_a_lossy_link=lossy.status == "hung"),
        "frequent-allreduce": claims.evidence(
            f"at {low.label}, each hook's steps against plain DDP's in the same run: {hooks_text}",
            fewer_bytes_faster_on_a_link=claims.test(hooks_p)),
        "bandwidth-init": claims.evidence(
            f"init_process_group {free.init_s:.2f} s uncapped, {low.init_s:.2f} s at {low.label}",
            init_slower_at_low_bandwidth=low.init_s >= 2 * free.init_s and low.init_s - free.init_s >= 1.0),
    })


def env_evidence(job, launch: LaunchCheck, fixed) -> claims.Evidence:
    """Lab 09's share of "env-inconsistent": the nodes-disagree job, its pre-flight (what each node's
    ranks were given) and the fixed-world-size job (the same uneven nodes without the fast path)."""
    nd = disagree_facts(job, launch)
    return claims.evidence(
        "node 0 started 1 rank and node 1 2, with TORCH_ELASTIC_WORKER_IDENTICAL=1: WORLD_SIZE given "
        + "; ".join(f"node {n}: {', '.join(map(str, ws))}" for n, ws in nd["world_sizes"].items())
        + f" (the pre-flight's records); job {nd['status']} [{nd['signature']}], ranks waiting in "
        + (", ".join(nd["waiting_in"]) or "nothing") + f", no process was rank {nd['not_started']}; "
        + f"the same nodes without it: job {fixed.status} on {fixed.nproc} ranks",
        world_size_disagreement_stops_init="world_size" in nd["found"] and nd["status"] in ("hung", "failed")
        and bool(nd["waiting_in"]) and set(nd["waiting_in"]) <= {"rendezvous", "store"},
        consistent_launch_forms_it=fixed.status == "ok")


def _drop_percent(result) -> int | None:
    import json
    from pathlib import Path
    try:
        spec = json.loads((Path(result.run_dir) / "cluster.json").read_text())
        text = "".join(n["firewall"] or "" for n in spec["cluster"]["nodes"])
    except (OSError, ValueError, KeyError):
        return None
    m = re.search(r"numgen random mod 100 < (\d+)", text)
    return int(m.group(1)) if m else 0


# ----------------------------------------------------------------------------------------------
# Exercises
# ----------------------------------------------------------------------------------------------

BLOCKED_KINDS = ("rendezvous", "store", "gloo")


def _blocked_kind(firewall) -> list[str]:
    """Which of node 0's listeners the unanswered connections went to: torchrun's rendezvous port, the
    workers' store torchrun started (MASTER_PORT), or another port (gloo's data connections)."""
    fw = firewall_facts(firewall)
    ports = {int(a.rsplit(":", 1)[1]) for _, a in fw.blocked}
    return sorted({"rendezvous" if p == fw.rdzv_port else "store" if p == fw.master_port else "gloo" for p in ports})


# a signature or note that names the blocked listener (the right one or not): none above the checker
BLOCKED_WORDS = {"gloo": r"data[- ]port", "store": r"store[- ](port[- ])?(blocked|unreachable)",
                 "rendezvous": r"(rendezvous|rdzv)[- ](port[- ])?blocked"}


@answers.exercise("blocked-listener", answers.Choice(BLOCKED_KINDS, reveals=BLOCKED_WORDS), accepted=_blocked_kind,
                  name="predicted_blocked")
def check_blocked_listener(answer: str, firewall) -> Check:
    """Exercise "blocked-listener" (predicted before the run): node 0 accepts the rendezvous port only.
    Which of node 0's listeners does a rank on node 1 fail to reach: "rendezvous" (torchrun's agents,
    port 29400), "store" (the workers' store torchrun starts, MASTER_PORT) or "gloo" (gloo's data
    connections)? Checked against the connections the hung ranks left unanswered."""
    fw = firewall_facts(firewall)
    truth = _blocked_kind(firewall)
    if not truth:
        raise DdplabError("this run has no unanswered connection", hint="pass the firewall variant's result")
    if answer in truth:
        return Check(True, f"{answer}: rank(s) {sorted({r for r, _ in fw.blocked})} sent SYN to "
                           f"{', '.join(a for _, a in fw.blocked)} and got no answer; the agents had met on "
                           f"{fw.rdzv_port}, which the firewall lets through")
    if answer == "rendezvous":
        return Check(False, "the agents met: torchrun's rendezvous got through. What does torchrun start next, on a "
                            "port it does not choose in advance?")
    return Check(False, f"not {answer}: which connection comes first after the rendezvous, before any collective?")


LOOPBACK_ENDINGS = ("refused", "timed out")


def _how_it_ended(wrong_interface) -> list[str]:
    f = loopback_facts(wrong_interface)
    err = wrong_interface.rank(f["rank"]).error if f["rank"] is not None else None
    if err is None:
        return []
    # gloo's own message: "... timed out connecting: SO_ERROR: Connection refused, remote=[...]"
    return ["refused"] if "Connection refused" in err.message else ["timed out"]


@answers.exercise("loopback-dial", answers.Choice(LOOPBACK_ENDINGS), accepted=_how_it_ended, name="predicted_dial")
def check_loopback_dial(answer: str, wrong_interface) -> Check:
    """Exercise "loopback-dial" (predicted before the run): gloo tells the peer to dial the address its
    hostname resolves to (127.0.1.1). Is the peer's connection "refused" or does it go unanswered until it
    "timed out"? Checked against the failing rank's error (gloo's own words)."""
    f = loopback_facts(wrong_interface)
    if f["dialled"] is None:
        raise DdplabError("this run has no gloo connect error", hint="pass the wrong-interface variant's result")
    if answer in _how_it_ended(wrong_interface):
        return Check(True, f"{answer}: rank {f['rank']} dialled {f['dialled']}, which on its own node is its own "
                           "loopback: the kernel answers at once that nobody listens there")
    return Check(False, f"not {answer}: on the dialling node, whose machine is {f['dialled']}? A firewall drops "
                        "packets silently; what does a kernel say when a port has no listener?")


def _node1_world_size(launch: LaunchCheck) -> list[int]:
    return list(launch.world_sizes().get(1, ()))


@answers.exercise("node-world-size", answers.Whole(1, 64, label=r"(WORLD_SIZE|world size|ranks\b)"),
                  accepted=_node1_world_size,
                  name="predicted_world_size")
def check_world_size(answer: int, launch: LaunchCheck) -> Check:
    """Exercise "node-world-size" (predicted before the pre-flight, once): node 0's torchrun starts 1 rank,
    node 1's starts 2, both with TORCH_ELASTIC_WORKER_IDENTICAL=1 (torchrun's fast path for nodes that are
    all alike). What WORLD_SIZE does node 1's torchrun give its ranks? Checked against what node 1's ranks
    recorded in ``launch_check("nodes-disagree")``."""
    truth = _node1_world_size(launch)
    if not truth:
        raise DdplabError("this pre-flight has no record from node 1", hint="pass launch_check('nodes-disagree')")
    others = {n: ws for n, ws in launch.world_sizes().items() if n != 1}
    if answer in truth:
        return Check(True, f"{answer}: node 1's torchrun computed it from its own command line alone (--nnodes x its "
                           f"own --nproc-per-node), and node 0's did the same: "
                           + ", ".join(f"node {n}: {', '.join(map(str, ws))}" for n, ws in others.items())
                           + ". Nobody counted the other node's ranks")
    if answer == len(launch.agreement.ranks):
        return Check(False, f"not {answer}: that is how many ranks the nodes start together, which torchrun adds up in "
                            "its store when nodes may differ. With the fast path, whom does node 1's torchrun ask?")
    return Check(False, f"not {answer}: with the fast path each node's torchrun asks no one. What can it compute "
                        "from its own command line alone?")


EXERCISES = answers.exercises(check_blocked_listener, check_loopback_dial, check_world_size)
