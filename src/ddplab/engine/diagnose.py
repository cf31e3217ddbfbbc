"""The one pipeline: ``diagnose(source) -> RunResult``, for every origin of a job.

    source.handle()    a live job's processes (None: the evidence is saved already)
      -> watch         the one loop (ddplab.engine.supervise): progress, the stall rule, a limit
      -> end           the live ranks captured, the job ended or left running (Watch: data)
      -> collect       source.evidence(watch, live): what the ranks left behind (Evidence: data)
      -> judge         ddplab.engine.classify.judge: pure, the same for every origin (Verdict)
      -> RunResult     one constructor, here, from the source's identity, the watch and the verdict
      -> save          result.json in the source's folder, then source.keep() (attach --save)

An origin is a ``Source``: a started job (``ddplab.origins.launch``), processes found in the tree
(``ddplab.origins.attach``), saved node folders (``ddplab.origins.nodes``), torch's flight-recorder dumps
(``ddplab.origins.frdump``), torch's debug-server dumps (``ddplab.origins.debugdump``). The loop calls nothing of
the source (it watches the supervisor the source handed over, built from plain process data) and the
judge never asks where the evidence came from: a new origin is one module that supplies facts.
Views (the status line, the ranks' echoed output) are passed in and only shown.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol

from ddplab.engine import check as check_mod
from ddplab.engine import classify
from ddplab.engine import printed as printed_mod
from ddplab.engine import torch_support
from ddplab import runfiles
from ddplab.defaults import GRACE_S, Ending
from ddplab.engine.evidence import Evidence, LiveRank, Watch
from ddplab.result import RunResult, Snapshot
from ddplab.engine.supervise import Supervisor, watch


@dataclass(frozen=True)
class Identity:
    """What a source knows about the job besides the evidence: what it is called and where its
    result goes."""
    target: str                       # "01" / a script path / "pid 1234" / "explain n0 n1"
    run_dir: Path                     # the result's folder (result.json is written there when ``save``)
    variant: str | None = None
    command: tuple[str, ...] = ()
    deadline_s: float | None = None   # a started job's outer limit
    port: int | None = None           # the port asked for (the ranks' own record wins)
    attached_pid: int | None = None   # the pid ddplab attach was given
    check: bool = False               # --check asked for: compare the ranks' records even if there are none
    records_dir: Path | None = None   # where the rank hook's records are (--check compares them when present)
    save: bool = True                 # write result.json into run_dir (not into a saved node's own folder)
    startup_s: float = 0.0            # from the command's start to the job's (ddplab run: Python, imports, the agent)


class Source(Protocol):
    """An origin of evidence. ``handle()`` returns the live job's supervisor (started now, or built
    from the processes found) or None; ``evidence()`` turns what the loop saw (None when nothing was
    watched) into Evidence; ``keep()`` stores anything more the origin keeps (attach --save)."""
    identity: Identity
    limit_s: float | None             # the loop's outer limit (a deadline, attach's watch time)
    limit: Ending                     # how reaching it is called
    stop: bool                        # end the job at the verdict (always for a started job)

    def handle(self) -> Supervisor | None: ...

    def evidence(self, seen: Watch | None, live: dict[int, LiveRank]) -> Evidence: ...

    def keep(self, ev: Evidence, result: RunResult) -> None: ...


class DumpFolder:
    """The part every source of a finished job's dumps shares (torch's flight recorder, its debug
    server): one folder, no live job to watch or stop, nothing more to keep, no result.json written
    into a folder that is not ddplab's. A subclass says which folders it ``claims`` and gives ``evidence``."""
    limit_s, limit, stop = None, Ending.DUMPED, False

    def __init__(self, folders):
        self.folder = Path(folders[0])
        self.identity = Identity(target=f"explain {self.folder.name}", run_dir=self.folder, save=False)

    def handle(self) -> None:
        return None

    def keep(self, ev: Evidence, result: RunResult) -> None:
        pass


def diagnose(source: Source, *, show: Callable[[Snapshot], None] | None = None,
             echo: Callable[[], None] | None = None, grace_s: float = GRACE_S) -> RunResult:
    """Watch (a live source), collect, judge, build the one RunResult and save it. Whatever happens
    while watching (a stall, a limit, Ctrl-C, an error of ddplab's own), every process of a job the
    source asked to stop is ended and the evidence judged before this returns or raises; an
    interrupted job returns a result whose status is INTERRUPTED (the caller raises it again)."""
    sup = source.handle()
    if sup is None:
        return _finish(source, source.evidence(None, {}))
    ended = Ending.FINISHED
    try:
        ended = watch(sup, limit_s=source.limit_s, limit=source.limit, echo=echo, show=show)
    finally:
        seen, live = sup.end(ended, grace_s, stop=source.stop)
        result = _finish(source, source.evidence(seen, live))
    return result


def _finish(source: Source, ev: Evidence) -> RunResult:
    """Judge, build the result (the only place a RunResult is made from evidence), save, keep."""
    v = classify.judge(ev)
    v = classify.refine(v, user_sources(ev), written(classify.missing_paths(v.ranks)))
    who, w = source.identity, ev.watch
    master = next((i for i in ev.run.infos.values() if i.get("master_port")), None)
    check = None
    if who.records_dir is not None and (who.check or check_mod.has_records(who.records_dir)):
        check = check_mod.not_ended(check_mod.compare(who.records_dir, w.world), v.ranks)
    check = printed_mod.qualify(check, v.printed)
    result = RunResult(
        target=who.target, variant=who.variant, nproc=len(w.ranks_here) if w.ranks_here else w.world,
        wall_s=w.wall_s, startup_s=who.startup_s, run_dir=str(who.run_dir), command=tuple(who.command),
        stall_s=w.stall_s if w.stall_s is not None else 0.0, deadline_s=who.deadline_s,
        port=int(master["master_port"]) if master else (who.port or None), returncode=w.returncode,
        leftover=w.leftover, notes=w.notes + torch_support.notes(), attached_pid=who.attached_pid, check=check,
        **v.fields())
    if who.save:
        result.save(Path(who.run_dir) / runfiles.RESULT)
    source.keep(ev, result)
    return result


def user_sources(ev: Evidence, limit: int = 2_000_000) -> dict[str, str]:
    """The text of the user's own files that the ranks' frames name (errors, live stacks, SIGTERM dumps),
    read at the verdict: classify.refine reads a peer's line and the line a cause points at from them."""
    from ddplab.engine.stacks import is_user_file
    files = {f.file for e in ev.run.errors.values() for f in e.frames}
    files |= {f.file for lv in ev.live.values() for f in lv.frames}
    files |= {f.file for fr in list(ev.run.terminated.values()) + list(ev.run.fatal.values()) for f in fr}
    out = {}
    for name in sorted(files):
        if is_user_file(name):
            try:
                p = Path(name)
                if p.is_file() and p.stat().st_size <= limit:
                    out[name] = p.read_text(errors="replace")
            except OSError:
                continue
    return out


def written(paths) -> dict[str, float]:
    """{path: mtime} of those of ``paths`` (files a rank did not find) that exist at the verdict."""
    out = {}
    for name in paths:
        try:
            out[name] = Path(name).stat().st_mtime
        except OSError:
            continue
    return out
