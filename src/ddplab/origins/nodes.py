"""Nodes merged: ``ddplab attach PID --save DIR`` writes what it found on one node to a folder, and
``ddplab explain DIR [DIR...]`` merges every node's folder into one diagnosis through the same
``classify.judge`` as ``run`` and ``attach``, naming the node and rank where the collectives
diverged first.

A node's folder is a run folder (``ddplab.runfiles``' names): ``node.json`` (the node, the job's
identity, the ranks seen here, what the watch loop saw), ``result.json`` (this node's own verdict)
and, per rank, ``rankN.json`` (pid, MASTER_ADDR/PORT), ``rankN.live.json`` (its stack, wait
channel, ledger, sockets at the verdict), ``rankN.log`` (its last output lines) and, for a job
ddplab started, the rank hook's records (``rankN.error.json``, ``rankN.exit.json``, ...).

``explain`` also reads torch's own flight-recorder dumps, for a job that never ran under ddplab: a
folder of ``<prefix><rank>`` files, each the pickled dump torch writes to
``$TORCH_FR_DUMP_TEMP_FILE<rank>``. NCCL writes them itself when its watchdog sees a collective time
out (``TORCH_NCCL_DUMP_ON_TIMEOUT``); gloo records the same ledger (``TORCH_FR_BUFFER_SIZE``) but
writes no file by itself: a script takes it with
``torch._C._distributed_c10d._dump_fr_trace()`` (measured here on torch 2.13, gloo). The dumps
hold ledgers only (no stacks), read without running any code from them (no pickle globals).
"""
from __future__ import annotations

import io
import json
import pickle
import re
import shutil
import socket
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Sequence

from ddplab.engine import evidence
from ddplab import runfiles
from ddplab.engine import ledger as ledger_mod
from ddplab.errors import DdplabError
from ddplab.engine.evidence import Evidence, LiveRank, RunEvidence, Watch
from ddplab.engine.stacks import Frame

NODE_VERSION = 1
LOG_LINES = 30        # a rank's last output lines kept in its folder
# what identifies a job: every node's ranks were given the same values by torchrun
JOB_KEYS = ("TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE")


# ------------------------------------------------------------------------------------------------
# attach --save
# ------------------------------------------------------------------------------------------------

def check_target(folder: Path, force: bool) -> None:
    """Before watching: a folder that exists is refused unless ``force``."""
    if folder.exists() and not force:
        raise DdplabError(f"{folder} already exists", hint="choose a new folder, or pass --force to replace it")


def job_identity(envs: Sequence[dict]) -> dict:
    """The job's identity as its ranks' environments name it (one value per key, or None)."""
    out = {}
    for k in JOB_KEYS:
        values = {e.get(k) for e in envs}
        out[k] = values.pop() if len(values) == 1 else None
    return out


def save(folder: Path, envs: dict[int, dict], world_size: int | None, ev: Evidence, result, source: Path | None,
         force: bool, node: str | None = None) -> Path:
    """Write one node's evidence (``ev``, ``result``: what ``attach`` judged; ``envs``: each of this
    node's ranks' environment) to ``folder``."""
    check_target(folder, force)
    if folder.exists():
        shutil.rmtree(folder)
    (folder / runfiles.RANKS).mkdir(parents=True)
    group = {e.get("GROUP_RANK") for e in envs.values()}
    meta = {"version": NODE_VERSION, "node": node or socket.gethostname(), "attached_pid": result.attached_pid,
            "group_rank": int(group.pop()) if len(group) == 1 and None not in group else None,
            "job": job_identity(list(envs.values())), "world_size": world_size,
            "ranks": sorted(envs), "watch": watch_to_dict(ev.watch), "saved_at": time.time(),
            "from_ddplab_run": str(source) if source else None}
    for rank in envs:
        _write_json(folder, rank, runfiles.INFO, {**ev.run.infos.get(rank, {}), "rank": rank,
                                                   **{k.lower(): envs[rank].get(k) for k in ("MASTER_ADDR", "MASTER_PORT")}})
        lv = ev.live.get(rank)
        if lv is not None:
            _write_json(folder, rank, runfiles.LIVE, live_to_dict(lv))
        if source is not None:
            for kind in (runfiles.ERROR, runfiles.EXIT, runfiles.STACK, runfiles.RECORDS):
                src = Path(runfiles.rank_path(source, rank, kind))
                if src.exists():
                    shutil.copyfile(src, runfiles.rank_path(folder, rank, kind))
        lines = last_lines(ev.run.logs.get(rank) or _own_output(ev.watch.pids.get(rank)))
        if lines:
            Path(runfiles.rank_path(folder, rank, runfiles.LOG)).write_text(lines)
    (folder / runfiles.NODE).write_text(json.dumps(meta, indent=2, default=str))
    result.save(folder / runfiles.RESULT)
    return folder


def _write_json(folder: Path, rank: int, kind: str, data: dict) -> None:
    Path(runfiles.rank_path(folder, rank, kind)).write_text(json.dumps(data, indent=2, default=str))


def last_lines(text: str, n: int = LOG_LINES) -> str:
    return "\n".join(text.splitlines()[-n:])


def _own_output(pid: int | None) -> str:
    """A rank's stdout and stderr when they are files (a job started with its output redirected)."""
    out = []
    if pid is None:
        return ""
    for fd in (1, 2):
        path = Path(f"/proc/{pid}/fd/{fd}")
        try:
            if path.resolve().is_file():
                out.append(evidence.read(path.resolve())[-20000:])
        except OSError:
            continue
    return "\n".join(out)


def watch_to_dict(w: Watch) -> dict:
    d = asdict(w)
    d["ledgers"] = {r: [c.to_dict() for c in lg] for r, lg in w.ledgers.items()}
    return d


def watch_from_dict(d: dict) -> Watch:
    """The watch a node saved (JSON: rank keys as text), this node's ranks only."""
    def by_rank(m):
        return {int(r): v for r, v in (m or {}).items()}
    return Watch(**{**d, "cpu": by_rank(d.get("cpu")), "pids": by_rank(d.get("pids")), "ranks_here": None,
                    "ledgers": {r: tuple(ledger_mod.Collective.from_dict(c) for c in lg)
                                for r, lg in by_rank(d.get("ledgers")).items()},
                    "leftover": tuple(d.get("leftover") or ()), "notes": tuple(d.get("notes") or ())})


def live_to_dict(lv: LiveRank) -> dict:
    return {"rank": lv.rank, "pid": lv.pid, "frames": [f.to_dict() for f in lv.frames], "source": lv.source,
            "wchan": lv.wchan, "ledger": [c.to_dict() for c in lv.ledger], "connections": list(lv.connections),
            "dialling": lv.dialling, "note": lv.note}


def live_from_dict(d: dict) -> LiveRank:
    return LiveRank(int(d["rank"]), d.get("pid"), frames=[Frame.from_dict(f) for f in d.get("frames", ())],
                    source=d.get("source"), wchan=d.get("wchan"),
                    ledger=tuple(ledger_mod.Collective.from_dict(c) for c in d.get("ledger", ())),
                    connections=tuple(d.get("connections", ())), dialling=d.get("dialling"), note=d.get("note"))


# ------------------------------------------------------------------------------------------------
# explain: read the folders
# ------------------------------------------------------------------------------------------------

class NodeFolder:
    """One node's saved evidence."""

    def __init__(self, folder: Path):
        self.folder = folder
        try:
            self.meta = json.loads((folder / runfiles.NODE).read_text())
        except ValueError:
            raise DdplabError(f"{folder}/{runfiles.NODE} is not readable JSON (cut short?)",
                              hint="save the node again with ddplab attach PID --save DIR --force") from None
        self.run = evidence.read_run(folder)
        ranks = self.meta.get("ranks") or []
        self.live = {}
        for rank in ranks:
            p = Path(runfiles.rank_path(folder, rank, runfiles.LIVE))
            if p.exists():
                try:
                    self.live[rank] = live_from_dict(json.loads(p.read_text()))
                except (ValueError, KeyError):
                    raise DdplabError(f"{p} is not readable (cut short?)",
                                      hint="save the node again with ddplab attach PID --save DIR --force") from None
            log = evidence.read(Path(runfiles.rank_path(folder, rank, runfiles.LOG)))
            if log:
                self.run.logs[rank] = log
        self.watch = watch_from_dict(self.meta["watch"])

    @property
    def name(self) -> str:
        g = self.meta.get("group_rank")
        return self.meta["node"] + (f" (node rank {g})" if g is not None else "")

    @property
    def job(self) -> dict:
        return self.meta.get("job") or {}


def _fr_dumps(folder: Path) -> dict[int, Path]:
    """torch's flight-recorder dump files in a folder: ``<prefix><rank>``, one common prefix."""
    by_prefix: dict[str, dict[int, Path]] = {}
    for p in folder.iterdir():
        m = re.fullmatch(r"(.*?)(\d+)", p.name)
        if p.is_file() and m:
            by_prefix.setdefault(m.group(1), {})[int(m.group(2))] = p
    found = {pre: files for pre, files in by_prefix.items() if _looks_like_dump(next(iter(files.values())))}
    if len(found) > 1:
        raise DdplabError(f"{folder} holds flight-recorder dumps with {len(found)} prefixes ({', '.join(sorted(found))})",
                          hint="put each job's dumps in a folder of its own")
    return next(iter(found.values()), {})


def _looks_like_dump(p: Path) -> bool:
    with open(p, "rb") as f:
        return f.read(1) == b"\x80"          # a pickle (protocol 2 or later)


class _NoGlobals(pickle.Unpickler):
    """A flight-recorder dump holds dicts, lists and scalars only: nothing in it may name code."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"a global ({module}.{name}) in a flight-recorder dump")


def read_fr_dump(path: Path) -> dict:
    try:
        d = _NoGlobals(io.BytesIO(path.read_bytes())).load()
    except (EOFError, pickle.UnpicklingError, ValueError) as e:
        raise DdplabError(f"{path} is not a whole flight-recorder dump ({type(e).__name__}: truncated or damaged)",
                          hint="take the dump again, or leave that file out") from None
    if not isinstance(d, dict) or "entries" not in d:
        raise DdplabError(f"{path} is not a flight-recorder dump (no 'entries')",
                          hint="pass the files torch wrote to $TORCH_FR_DUMP_TEMP_FILE<rank>")
    return d


def _fr_evidence(folder: Path, dumps: dict[int, Path]) -> Evidence:
    """A job known only from torch's dumps: each rank as it stood when its dump was taken."""
    ledgers = {r: ledger_mod.parse(read_fr_dump(p)) for r, p in sorted(dumps.items())}
    div = ledger_mod.divergence(ledgers)
    if div is not None:
        # A dump is taken when a collective timed out: gloo retires the entry that failed (its state
        # stays "scheduled"), so a rank's last entry at or past the divergence is where it stood.
        ledgers = {r: lg[:-1] + (replace(lg[-1], completed=False),) if lg and lg[-1].seq >= div.seq else lg
                   for r, lg in ledgers.items()}
    live = {r: LiveRank(r, 0, ledger=lg) for r, lg in ledgers.items()}
    w = Watch(ended_by="stall", returncode=None, world=max(ledgers) + 1, stall_s=None, wall_s=0.0, idle_s=0.0,
              since_s=0.0, attached=True, stopped=False,
              notes=(f"from torch's flight-recorder dumps in {folder}: ledgers only, no stacks",))
    return Evidence(w, evidence.empty_run({}), live, dict(ledgers), {})


# ------------------------------------------------------------------------------------------------
# explain: merge
# ------------------------------------------------------------------------------------------------

ENDINGS = ("stall", "interrupt", "watched", "exited")   # a merged job's ending: the first any node saw


def merge(folders: Sequence[Path]) -> Evidence:
    """One Evidence from every node's folder (or one folder of torch's dumps)."""
    nodes, dumps = [], []
    for f in folders:
        f = Path(f)
        if not f.is_dir():
            raise DdplabError(f"no such folder: {f}", hint="pass the folders ddplab attach --save wrote")
        if (f / runfiles.NODE).exists():
            nodes.append(NodeFolder(f))
        elif (fr := _fr_dumps(f)):
            dumps.append((f, fr))
        else:
            raise DdplabError(f"{f} holds no evidence (no {runfiles.NODE} from ddplab attach --save, no flight-recorder dump)",
                              hint="pass the folder ddplab attach PID --save DIR wrote, or the folder of torch's "
                                   "$TORCH_FR_DUMP_TEMP_FILE dumps")
    if dumps and nodes or len(dumps) > 1:
        raise DdplabError("pass either the folders ddplab attach --save wrote or one folder of flight-recorder dumps",
                          hint="explain one job's evidence at a time")
    if dumps:
        return _fr_evidence(*dumps[0])
    first = nodes[0]
    for n in nodes[1:]:
        differ = [k for k in JOB_KEYS if n.job.get(k) != first.job.get(k)]
        if differ:
            k = differ[0]
            raise DdplabError(f"{first.folder} and {n.folder} are from different jobs ({k} {first.job.get(k)} and "
                              f"{n.job.get(k)})", hint="pass the folders of one job's nodes")
    seen: dict[int, str] = {}
    for n in nodes:
        for r in n.meta.get("ranks") or []:
            if r in seen:
                raise DdplabError(f"rank {r} is in two folders ({seen[r]} and {n.folder})",
                                  hint="pass each node's folder once")
            seen[r] = str(n.folder)
    run = RunEvidence(infos={}, errors={}, exits={}, torchrun=None, logs={}, fatal={}, console="")
    live, records, where = {}, {}, {}
    for n in nodes:
        for part in ("infos", "errors", "exits", "logs", "fatal", "clean_exit", "final_ledgers"):
            getattr(run, part).update(getattr(n.run, part))
        live.update(n.live)
        for r in n.meta.get("ranks") or []:
            records[r] = evidence.records(n.folder, r)
            where[r] = n.name
    watches = [n.watch for n in nodes]
    ended = next(e for e in ENDINGS + (None,) if e is None or any(w.ended_by == e for w in watches))
    world = int(first.job.get("WORLD_SIZE") or 0) or max(seen) + 1
    stalled = [w for w in watches if w.ended_by == "stall"] or watches
    w = Watch(ended_by=ended, returncode=None, world=world, stall_s=max(x.stall_s for x in watches),
              wall_s=max(x.wall_s for x in watches), idle_s=min(x.idle_s for x in stalled),
              since_s=max(x.since_s for x in stalled), cpu={r: c for x in watches for r, c in x.cpu.items()},
              pids={r: p for x in watches for r, p in x.pids.items()}, attached=True,
              stopped=all(x.stopped for x in watches),
              notes=tuple(f"{n.name}: {note}" for n in nodes for note in n.watch.notes))
    ledgers = {r: lg for x in watches for r, lg in x.ledgers.items()}
    ledgers.update(run.final_ledgers)
    ledgers.update({r: lv.ledger for r, lv in live.items() if lv.ledger})
    return Evidence(w, run, live, ledgers, records, where)


def explain(folders: Sequence[Path]):
    """The merged diagnosis of a job from its nodes' folders: a RunResult whose ranks name their node."""
    from ddplab.engine import classify
    from ddplab.result import RunResult
    folders = [Path(f) for f in folders]
    ev = merge(folders)
    v = classify.judge(ev)
    return RunResult(target="explain " + " ".join(f.name for f in folders), variant=None, nproc=ev.watch.world,
                     wall_s=ev.watch.wall_s, run_dir=str(folders[0]), command=(), stall_s=ev.watch.stall_s or 0.0,
                     notes=ev.watch.notes, attached_pid=_first_pid(folders), **v.fields())


def _first_pid(folders: Sequence[Path]) -> int | None:
    """The pid ``attach`` was given on the first node (None for torch's dumps)."""
    try:
        return json.loads((folders[0] / runfiles.NODE).read_text()).get("attached_pid")
    except (OSError, ValueError):
        return None


def first_divergence(result) -> dict | None:
    """Where the collectives diverged first, as facts: the collective number, and the smallest group
    of ranks that issued something else there (another op, other sizes, or nothing: a rank that
    never issued it comes first on a tie), each with its node; the other groups by op."""
    d = result.divergence
    if d is None:
        return None
    groups: dict = {}
    for rank, op in sorted(d.ops.items()):
        groups.setdefault((op, json.dumps(d.sizes.get(rank))), []).append(rank)
    odd = min(groups, key=lambda k: (len(groups[k]), k[0] is not None, groups[k][0]))
    node = {r.rank: r.node for r in result.ranks}
    return {"seq": d.seq, "kind": d.kind, "op": odd[0],
            "ranks": [{"rank": r, "node": node.get(r)} for r in groups[odd]],
            "others": [{"op": k[0], "ranks": rs} for k, rs in groups.items() if k != odd]}


def divergence_line(result) -> str | None:
    """A view: "Collective #4 diverged first at node n1 (node rank 1), rank 1: barrier (the others: all_reduce)"."""
    f = first_divergence(result)
    if f is None or not f["ranks"]:
        return None
    who = "; ".join(f"node {x['node']}, rank {x['rank']}" if x["node"] else f"rank {x['rank']}" for x in f["ranks"])
    what = f["op"] or "never issued it"
    others = "; ".join(f"{o['op'] or 'none'} on rank{'s' if len(o['ranks']) > 1 else ''} {', '.join(map(str, o['ranks']))}"
                       for o in f["others"])
    return f"Collective #{f['seq']} diverged first at {who}: {what} (the others: {others})."
