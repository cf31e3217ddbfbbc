"""Nodes merged: ``ddplab attach PID --save DIR`` writes what it found on one node to a folder, and
``ddplab explain DIR [DIR...]`` merges every node's folder into one diagnosis through the same
pipeline as ``run`` and ``attach`` (``ddplab.engine.diagnose``), naming the node and rank where the collectives
diverged first.

A node's folder is a run folder (``ddplab.runfiles``' names): ``node.json`` (the node, the job's
identity, the ranks seen here, what the watch loop saw), ``result.json`` (this node's own verdict)
and, per rank, ``rankN.json`` (pid, MASTER_ADDR/PORT), ``rankN.live.json`` (its stack, wait
channel, ledger, sockets at the verdict), ``rankN.log`` (its last output lines) and, for a job
ddplab started, the rank hook's records (``rankN.error.json``, ``rankN.exit.json``, ...).

The other origins ``explain`` reads (torch's own dumps) are in ``ddplab.origins.frdump`` and
``ddplab.origins.debugdump``; ``ddplab.origins.explain`` picks the origin from what the folders hold.
"""
from __future__ import annotations

import json
import shutil
import socket
import time
from dataclasses import asdict, fields
from pathlib import Path
from typing import Sequence

from ddplab.engine import evidence
from ddplab import runfiles
from ddplab.engine import ledger as ledger_mod
from ddplab.errors import DdplabError
from ddplab.defaults import Ending
from ddplab.engine.diagnose import Identity
from ddplab.engine.evidence import Evidence, LiveRank, RunEvidence, Watch
from ddplab.facts import Frame

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
    # an output file several ranks write to (one stdout for the whole job) says nothing of which rank
    # printed a line: it is nobody's own
    files = [f for rank in envs for f in set(_output_files(ev.watch.pids.get(rank)))]
    shared = {f for f in files if files.count(f) > 1}
    for rank in envs:
        _write_json(folder, rank, runfiles.INFO, {**ev.run.infos.get(rank, {}), "rank": rank,
                                                   **{k.lower(): envs[rank].get(k) for k in ("MASTER_ADDR", "MASTER_PORT")}})
        lv = ev.live.get(rank)
        if lv is not None:
            _write_json(folder, rank, runfiles.LIVE, live_to_dict(lv))
        if source is not None:
            for kind in (runfiles.ERROR, runfiles.EXIT, runfiles.STACK, runfiles.TERM, runfiles.RECORDS, runfiles.CHECK):
                src = Path(runfiles.rank_path(source, rank, kind))
                if src.exists():
                    shutil.copyfile(src, runfiles.rank_path(folder, rank, kind))
        lines = last_lines(ev.run.logs.get(rank) or _own_output(ev.watch.pids.get(rank), shared))
        if lines:
            Path(runfiles.rank_path(folder, rank, runfiles.LOG)).write_text(lines)
    (folder / runfiles.NODE).write_text(json.dumps(meta, indent=2, default=str))
    result.save(folder / runfiles.RESULT)
    return folder


def _write_json(folder: Path, rank: int, kind: str, data: dict) -> None:
    Path(runfiles.rank_path(folder, rank, kind)).write_text(json.dumps(data, indent=2, default=str))


def last_lines(text: str, n: int = LOG_LINES) -> str:
    return "\n".join(text.splitlines()[-n:])


def _output_files(pid: int | None) -> list[Path]:
    """The files a process's stdout and stderr are (a job started with its output redirected)."""
    out = []
    for fd in (1, 2) if pid is not None else ():
        try:
            path = Path(f"/proc/{pid}/fd/{fd}").resolve()
            if path.is_file():
                out.append(path)
        except OSError:
            continue
    return out


def _own_output(pid: int | None, shared: set = frozenset()) -> str:
    """A rank's stdout and stderr when they are files of its own (not ``shared`` with another rank)."""
    return "\n".join(evidence.read(p)[-20000:] for p in dict.fromkeys(_output_files(pid)) if p not in shared)


def watch_to_dict(w: Watch) -> dict:
    d = asdict(w)
    d["ledgers"] = {r: [c.to_dict() for c in lg] for r, lg in w.ledgers.items()}
    return d


def watch_from_dict(d: dict) -> Watch:
    """The watch a node saved (JSON: rank keys as text), this node's ranks only."""
    def by_rank(m):
        return {int(r): v for r, v in (m or {}).items()}
    d = {k: v for k, v in d.items() if k in {f.name for f in fields(Watch)}}   # older folders: "attached"
    return Watch(**{**d, "ended_by": Ending.of(d.get("ended_by")), "cpu": by_rank(d.get("cpu")),
                    "pids": by_rank(d.get("pids")), "ranks_here": None,
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


# ------------------------------------------------------------------------------------------------
# explain: merge
# ------------------------------------------------------------------------------------------------

# a merged job's ending: the first of these any node saw
ENDINGS = (Ending.STALL, Ending.INTERRUPT, Ending.WATCHED, Ending.EXITED)


def is_node_folder(folder: Path) -> bool:
    return (Path(folder) / runfiles.NODE).exists()


def merge(folders: Sequence[Path]) -> Evidence:
    """One Evidence from every node's folder."""
    nodes = [NodeFolder(Path(f)) for f in folders]
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
        own = evidence.raised_before(n.run, n.watch.stopped_at)   # each node's ending, on its own clock
        for part in ("infos", "errors", "exits", "logs", "fatal", "clean_exit", "final_ledgers"):
            getattr(run, part).update(getattr(own, part))
        live.update(n.live)
        for r in n.meta.get("ranks") or []:
            records[r] = evidence.records(n.folder, r)
            where[r] = n.name
    watches = [n.watch for n in nodes]
    ended = next((e for e in ENDINGS if any(w.ended_by == e for w in watches)), Ending.FINISHED)
    world = int(first.job.get("WORLD_SIZE") or 0) or max(seen) + 1
    stalled = [w for w in watches if w.ended_by == Ending.STALL] or watches
    w = Watch(ended_by=ended, returncode=None, world=world, stall_s=max(x.stall_s for x in watches),
              wall_s=max(x.wall_s for x in watches), idle_s=min(x.idle_s for x in stalled),
              since_s=max(x.since_s for x in stalled), cpu={r: c for x in watches for r, c in x.cpu.items()},
              pids={r: p for x in watches for r, p in x.pids.items()},
              stopped=all(x.stopped for x in watches),
              notes=tuple(f"{n.name}: {note}" for n in nodes for note in n.watch.notes))
    ledgers = {r: lg for x in watches for r, lg in x.ledgers.items()}
    ledgers.update(run.final_ledgers)
    ledgers.update({r: lv.ledger for r, lv in live.items() if lv.ledger})
    return Evidence(w, run, live, ledgers, records, where)


class SavedNodes:
    """The origin "folders that ``attach --save`` wrote, one per node": nothing to watch; the
    evidence is every node's folder merged. The result is not saved over a node's own."""
    limit_s, limit, stop = None, Ending.DUMPED, False

    @staticmethod
    def claims(folders: Sequence[Path]) -> bool:
        return all(is_node_folder(f) for f in folders)

    def __init__(self, folders: Sequence[Path]):
        self.folders = [Path(f) for f in folders]
        one = self.folders[0] if len(self.folders) == 1 else None
        self.identity = Identity(target="explain " + " ".join(f.name for f in self.folders), run_dir=self.folders[0],
                                 attached_pid=_first_pid(self.folders), records_dir=one, save=False)

    def handle(self) -> None:
        return None

    def evidence(self, seen: Watch | None, live: dict) -> Evidence:
        return merge(self.folders)

    def keep(self, ev: Evidence, result) -> None:
        pass


def _first_pid(folders: Sequence[Path]) -> int | None:
    """The pid ``attach`` was given on the first node."""
    try:
        return json.loads((folders[0] / runfiles.NODE).read_text()).get("attached_pid")
    except (OSError, ValueError):
        return None
