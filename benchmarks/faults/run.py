"""Run the fault-injection suite through ddplab.run and measure the engine on it.

    python benchmarks/faults/run.py [--ranks 2,4,8] [--only PATTERN] [--sample N] [--no-verify]

Each mutant (operators.py applied by mutate.py) runs first under bare torchrun, to check that it does what
its label says ("failed": a non-zero exit; "hung": still running after --probe-s with no exit; "ok": exit 0):
a mutant that does not is a suite error, reported and not counted. Then it runs through
``ddplab.run(path, nproc=N, args=..., stall_s=..., check=...)`` and is scored on the RunResult's fields only:

- status: result.status equals the label;
- place (failed and hung mutants): the ranks the engine blames (result.culprits; for a failed run with none,
  result.first_failure) are culprit ranks, and each is placed at a line to fix in the mutant: the line it
  stood or failed at (RankResult.frame), or the line the engine says set the failure up (result.fix_at,
  found from the cause's premise in the script). A hang where the engine blames no rank: every culprit rank
  is placed at a line to fix and, unless every rank is a culprit, no other rank's frame is;
- cause named: the engine's signature (or, for --check runs, a finding's kind as "check:KIND") is one of the
  ids causes.json accepts for the mutant's class; wrong cause: a named id (not in causes.json's
  "not_a_cause", nor in its "symptoms" for the mutant's class) outside that list;
- time to verdict for hung mutants: result.stall.idle_s (no progress seen for that long when judged).

Results go to build/faults/results.json (and a copy named by the time) as fields, and a table is printed.
"""
from __future__ import annotations

import argparse
import contextlib
import fnmatch
import hashlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mutate  # noqa: E402

ROOT = mutate.ROOT
OUT = ROOT / "build" / "faults"
PROBE_S = float(os.environ.get("FAULTS_PROBE_S", 25.0))  # bare torchrun: a "hung" mutant must still be
                                                        # running, with no rank exited, after this
LIMIT_S = 240.0       # bare torchrun: a "failed" or "ok" mutant must have ended by this
STALL_S = 5.0         # ddplab's stall window for the suite (a loaded 2-core machine)
DEADLINE_S = 300.0


def _stop(signum, frame):
    """SIGTERM (a stopped benchmark): unwind like Ctrl-C, so that the bare torchrun's process group is ended
    (bare_torchrun's finally) and ddplab.run ends its job (its own interrupt path) before the runner exits."""
    raise KeyboardInterrupt(f"signal {signum}")


def _env() -> dict:
    env = dict(os.environ)
    src = str(ROOT / "src")
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _remove(p: Path) -> None:
    """A file or a folder a mutant left in the temp folder, gone (a link: the link, not what it points at)."""
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        p.unlink(missing_ok=True)


@contextlib.contextmanager
def _temp_cleaned():
    """The files and folders a mutant leaves in the temp folder (its snapshot, the run folders it names:
    ``faults_*``) removed once its run has ended, whatever its outcome: a failed run does not clean up."""
    tmp = Path(tempfile.gettempdir())
    before = set(tmp.glob("faults_*"))
    try:
        yield
    finally:
        for p in set(tmp.glob("faults_*")) - before:
            _remove(p)


def remove_temp_of(port: int | None) -> None:
    """What one mutant's run left in the temp folder, found by its port: every ``faults_*`` name the bases and
    operators build ends with the run's MASTER_PORT (``faults_snapshot_<run id><port>.pt``, ``faults_run_<port>``),
    so runs side by side (the tests' workers) each remove only their own, not what a run beside it still uses."""
    if not port:
        return
    for p in Path(tempfile.gettempdir()).glob(f"faults_*{port}*"):
        if p.name.removesuffix(".pt").endswith(str(port)):
            _remove(p)


def bare_torchrun(m: mutate.Mutant, nproc: int, probe_s: float = PROBE_S, limit_s: float = LIMIT_S) -> dict:
    with _temp_cleaned():
        return _bare_torchrun(m, nproc, probe_s, limit_s)


def _bare_torchrun(m: mutate.Mutant, nproc: int, probe_s: float, limit_s: float) -> dict:
    """What bare torchrun does with the mutant: {"status": "failed"|"hung"|"ok", "rc", "seconds"}."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
           m.path, *m.args]
    t0 = time.monotonic()
    with open(OUT / "logs" / f"{m.id}-{nproc}.bare.log", "wb") as log:
        p = subprocess.Popen(cmd, cwd=ROOT, env=_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        wait = probe_s if m.status == "hung" else limit_s
        try:
            rc = p.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            rc = None
        finally:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
                try:
                    p.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
    status = "hung" if rc is None else ("ok" if rc == 0 else "failed")
    return {"status": status, "rc": rc, "seconds": round(time.monotonic() - t0, 2)}


def _verify(m: mutate.Mutant, nproc: int, cache: dict) -> dict:
    key = f"{m.id}:{nproc}:" + hashlib.sha1(Path(m.path).read_bytes()).hexdigest()[:12]
    if key not in cache:
        cache[key] = bare_torchrun(m, nproc)
        (OUT / "verify.json").write_text(json.dumps(cache, indent=1))
    return cache[key]


def _frame_line(rank, mutant_path: str) -> int | None:
    f = rank.frame
    return f.line if f is not None and Path(f.file).name == Path(mutant_path).name else None


def score(m: mutate.Mutant, nproc: int, result, causes: dict) -> dict:
    """The engine's answer on one mutant, judged against its label (fields only)."""
    culprits = set(m.culprits(nproc))
    fix = set(m.fix_lines)
    lines = {r.rank: _frame_line(r, m.path) for r in result.ranks}
    # the ranks the engine blames: its culprits, else (a failed run) its first failing rank
    blamed = set(result.culprits) or ({result.first_failure} if result.first_failure is not None else set())
    fa = result.fix_at
    fix_at = fa.line if fa is not None and Path(fa.file).name == Path(m.path).name else None

    def placed(rank) -> bool:
        """The engine put this rank at a line to fix: the line it stood or failed at, or the line the
        engine says set the failure up (given for the ranks it blames, or for all where it blames none)."""
        return lines.get(rank) in fix or (fix_at in fix and (rank in blamed or not blamed))
    place_ok = None
    if m.status == "failed" and result.status == "failed":
        place_ok = bool(blamed) and blamed <= culprits and all(placed(r) for r in blamed)
    elif m.status == "hung" and result.status == "hung":
        if result.culprits:
            place_ok = blamed <= culprits and all(placed(r) for r in blamed)
        else:
            place_ok = all(placed(c) for c in culprits) and (
                culprits == set(lines) or not any(lines[r] in fix for r in set(lines) - culprits))
    elif m.status in ("failed", "hung"):
        place_ok = False
    named = set()
    if result.signature not in causes["not_a_cause"]:
        named.add(result.signature)
    if result.check is not None:
        named |= {f"check:{k}" for k in result.check.kinds()}
    accepted = set(causes["classes"][m.cause])
    symptoms = set(causes.get("symptoms", {}).get(m.cause, ()))   # what the run shows, not why
    stall = result.stall
    return {
        "status": result.status, "status_ok": result.status == m.status,
        "place_ok": place_ok, "first_failure": result.first_failure, "culprits_named": sorted(blamed),
        "fix_at": fix_at,
        "frames": {str(r): ln for r, ln in lines.items()},
        "signature": result.signature, "named": sorted(named),
        "cause_named": bool(named & accepted), "wrong_causes": sorted(named - accepted - symptoms),
        # issue 32 item 4: every rank has a place in the explanation (the line it stood, failed or was ended at),
        # except a rank that had already exited cleanly
        "every_rank_placed": (all(r.frame is not None or r.exit_code == 0 for r in result.ranks)
                              if result.status in ("failed", "hung") else None),
        "idle_s": stall.idle_s if stall else None, "stall_window_s": stall.window_s if stall else None,
        "wall_s": result.wall_s, "run_dir": result.run_dir,
    }


def run_one(m: mutate.Mutant, nproc: int, causes: dict, stall_s: float = STALL_S) -> dict:
    import ddplab
    with _temp_cleaned():
        result = ddplab.run(Path(m.path), nproc=nproc, args=list(m.args), stall_s=stall_s, check=m.check,
                            deadline_s=DEADLINE_S, progress=None)
    return score(m, nproc, result, causes)


# the classes of the init family (the process group, the launch): the rest by their label
INIT = {"nccl-without-gpu", "world-size-mismatch", "duplicate-rank", "store-address-override",
        "process-group-initialized-twice", "process-group-not-initialized", "launch-local-rank-arg"}


def family(row: dict) -> str:
    """init, crash, hang, oom or silent: the families of the suite's table."""
    if row["cause"] in INIT:
        return "init"
    if row["cause"] == "out-of-memory":
        return "oom"
    return {"hung": "hang", "ok": "silent"}.get(row["expected"], "crash")


def tables(rows: list[dict]) -> str:
    for r in rows:
        r["family"] = family(r)
        r.setdefault("round", "")   # results saved before the round field: the operators before issue 41's
    keys = ("cause", "family", "nproc") + (("round",) if any(r.get("round") for r in rows) else ())
    return "\n\n".join(table(summarize(rows, k), k) for k in keys)


def select(ops: list[dict], only: str | None, sample: int | None, round: str | None = None) -> list[dict]:
    if round is not None:   # "h41": issue 41's first-time operators; "": the operators before them
        ops = [o for o in ops if o.get("round", "") == round]
    if only:
        pats = only.split(",")
        ops = [o for o in ops if any(fnmatch.fnmatch(o["id"], p) or fnmatch.fnmatch(o["cause"], p) for p in pats)]
    if sample:
        per: dict[str, int] = {}
        keep = []
        for o in ops:
            if per.get(o["cause"], 0) < sample:
                keep.append(o)
                per[o["cause"]] = per.get(o["cause"], 0) + 1
        ops = keep
    return ops


def summarize(rows: list[dict], key: str) -> list[dict]:
    out = []
    for k in sorted({r[key] for r in rows}, key=str):
        group = [r for r in rows if r[key] == k and not r.get("suite_error")]
        placed = [r for r in group if r["place_ok"] is not None]
        idle = [r["idle_s"] for r in group if r["expected"] == "hung" and r["idle_s"] is not None]
        out.append({key: k, "n": len(group),
                    "suite_errors": sum(1 for r in rows if r[key] == k and r.get("suite_error")),
                    "status_ok": sum(r["status_ok"] for r in group),
                    "place_n": len(placed), "place_ok": sum(bool(r["place_ok"]) for r in placed),
                    "cause_named": sum(r["cause_named"] for r in group),
                    "wrong_cause": sum(bool(r["wrong_causes"]) for r in group),
                    "placed_n": sum(r.get("every_rank_placed") is not None for r in group),
                    "every_rank_placed": sum(bool(r.get("every_rank_placed")) for r in group),
                    "idle_s_median": round(statistics.median(idle), 2) if idle else None})
    return out


def table(summary: list[dict], key: str) -> str:
    head = (f"{key:<34} {'n':>3} {'err':>3} {'status':>7} {'place':>7} {'cause':>6} {'wrong':>5} {'idle_s':>6} "
            f"{'all_ranks':>9}")
    lines = [head, "-" * len(head)]
    for s in summary:
        lines.append(f"{str(s[key]):<34} {s['n']:>3} {s['suite_errors']:>3} {s['status_ok']:>3}/{s['n']:<3} "
                     f"{s['place_ok']:>3}/{s['place_n']:<3} {s['cause_named']:>6} {s['wrong_cause']:>5} "
                     f"{'' if s['idle_s_median'] is None else s['idle_s_median']:>6} "
                     f"{s['every_rank_placed']:>4}/{s['placed_n']:<4}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", default="2,4,8", help="world sizes, comma-separated (default 2,4,8)")
    p.add_argument("--only", default=None,
                   help="run the operators whose id or cause class matches one of these comma-separated patterns")
    p.add_argument("--sample", type=int, default=None, help="at most N operators per cause class")
    p.add_argument("--round", default=None,
                   help="only the operators of this round (h41: issue 41's first-time operators; '' for the rest)")
    p.add_argument("--no-verify", action="store_true", help="skip the bare-torchrun check of each label")
    p.add_argument("--stall-s", type=float, default=STALL_S)
    p.add_argument("--report", nargs="+", metavar="RESULTS_JSON",
                   help="run nothing: print the tables of saved results files (a later row for the same mutant "
                        "and world size replaces an earlier one)")
    a = p.parse_args(argv)
    if a.report:
        merged = {}
        for f in a.report:
            for r in json.loads(Path(f).read_text())["rows"]:
                merged[(r["id"], r["nproc"])] = r
        ranks_of = {o["id"]: set(o["ranks"]) for o in mutate.operators()}
        # rows of a world size an operator no longer runs at (its fault does not hold there) are left out
        rows = [r for r in merged.values() if r["nproc"] in ranks_of.get(r["id"], {r["nproc"]})]
        for r in rows:   # results saved before every_rank_placed was scored: read it from the run's result
            if "every_rank_placed" not in r and r.get("run_dir") and Path(r["run_dir"]).exists():
                from ddplab.result import RunResult
                res = RunResult.load(r["run_dir"])
                r["every_rank_placed"] = (all(k.frame is not None or k.exit_code == 0 for k in res.ranks)
                                          if res.status in ("failed", "hung") else None)
        print(tables(rows))
        return 0
    counts = [int(x) for x in a.ranks.split(",")]
    (OUT / "logs").mkdir(parents=True, exist_ok=True)
    causes = mutate.load_causes()
    cache = json.loads((OUT / "verify.json").read_text()) if (OUT / "verify.json").exists() else {}
    rows = []
    signal.signal(signal.SIGTERM, _stop)
    try:
        _run_all(a, counts, causes, cache, rows)
    except KeyboardInterrupt:
        (OUT / "partial.json").write_text(json.dumps(rows, indent=1, default=str))
        print(f"stopped after {len(rows)} runs: nothing left running; partial results in {OUT / 'partial.json'}",
              flush=True)
        return 130
    report = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "ranks": counts,
              "stall_s": a.stall_s, "rows": rows,
              "by_class": summarize(rows, "cause"), "by_ranks": summarize(rows, "nproc")}
    text = json.dumps(report, indent=1, default=str)
    (OUT / "results.json").write_text(text)
    (OUT / f"results-{report['time'].replace(':', '')}.json").write_text(text)
    print()
    print(tables(rows))
    return 0


def _run_all(a, counts: list[int], causes: dict, cache: dict, rows: list) -> None:
    for op in select(mutate.operators(), a.only, a.sample, a.round):
        m = mutate.build(op, OUT / "mutants")
        for n in counts:
            if n not in m.ranks:
                continue
            row = {"id": m.id, "base": op["base"], "cause": m.cause, "nproc": n, "expected": m.status,
                   "culprits": list(m.culprits(n)), "fix_lines": list(m.fix_lines), "source": op["source"],
                   "round": op.get("round", "")}
            if not a.no_verify:
                v = _verify(m, n, cache)
                row["bare"] = v
                if v["status"] != m.status:
                    row.update(suite_error=True, status_ok=False, place_ok=None, cause_named=False,
                               wrong_causes=[], idle_s=None)
                    rows.append(row)
                    (OUT / "partial.json").write_text(json.dumps(rows, indent=1, default=str))
                    print(f"SUITE ERROR {m.id} @{n}: bare torchrun {v['status']} (rc {v['rc']}), labelled {m.status}",
                          flush=True)
                    continue
            row.update(run_one(m, n, causes, a.stall_s))
            rows.append(row)
            (OUT / "partial.json").write_text(json.dumps(rows, indent=1, default=str))
            print(f"{m.id:<28} @{n} expected {m.status:<6} got {row['status']:<6} place {row['place_ok']!s:<5} "
                  f"named {row['named']} wrong {row['wrong_causes']}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
