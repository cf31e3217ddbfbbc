"""What a run returns: frozen dataclasses of facts, with ``to_dict()``, saved as ``result.json``.

Facts are fields (op, seq, frame, exception type); statuses, rank states and endings are enums
(``ddplab.defaults``), also after ``load()``. A result loads, prints (its ``repr`` is its fields)
and compares with no view imported. Sentences are made from the fields only when shown, by
``ddplab.views.render``: ``explain()``, ``headline()``, ``diagnosis``, ``waits_in`` and ``_repr_html_``
are conveniences that import that view when called (``result.json`` holds no rendered text, and
nothing shown is ever read back). Notebooks and tests assert on the fields.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from ddplab import runfiles
from ddplab.defaults import ALIVE, DEFAULT_STALL_S, STATUSES, RankState, Status  # noqa: F401  (re-exported)
from ddplab.facts import (ChainedError, CheckReport, Collective, Divergence, Frame, Where, is_user_file,  # noqa: F401
                          short_path, short_paths)   # (the types re-exported: a result's parts, from one import)
from ddplab.facts import (ArgsDiffer, CallDivergence, CallSite, Ended, ErrorPath, Nested, Poll, PrintedDiff,
                          ThreadStack, parse_traceback)


def _render():
    """The text and HTML views, imported when a result is shown (the data never needs them)."""
    from ddplab.views import render
    return render


@dataclass(frozen=True)
class RankError:
    """A rank's uncaught exception, as its rank hook recorded it (torchrun error-file style)."""
    type: str                     # "ValueError", "DistNetworkError"
    message: str
    frames: tuple[Frame, ...]     # innermost first
    time: float                   # time.time() when it was raised
    module: str = ""
    cause: str | None = None      # "raise ... from e": the cause's "Type: message"
    env: dict | None = None       # MASTER_ADDR, MASTER_PORT, WORLD_SIZE as the rank had them when it failed
    # ddplab.facts.ChainedError: the exceptions chained to it, the values on the user's failing line, a framework's exit
    chain: tuple["ChainedError", ...] = ()
    values: dict | None = None    # {name: short repr} on the innermost line of the user's own code
    exited: dict | None = None    # {"code", "frames"}: sys.exit called while handling it (hydra, click)
    asked: dict | None = None     # raised inside init_process_group: the rank and world size it asked for, its env
    nested: Nested | None = None  # re-raised from another process (a DataLoader worker): its own exception
    paths: tuple[ErrorPath, ...] = ()  # the files it is about (its own fields, the failing call's path arguments)

    @property
    def frame(self) -> Frame | None:
        """The innermost frame of the user's own code."""
        return next((f for f in self.frames if is_user_file(f.file)), None)

    def to_dict(self) -> dict:
        return {"type": self.type, "message": self.message, "frames": [f.to_dict() for f in self.frames],
                "time": self.time, "module": self.module, "cause": self.cause, "env": self.env,
                "chain": [c.to_dict() for c in self.chain], "values": self.values, "exited": self.exited,
                "asked": self.asked, "nested": self.nested.to_dict() if self.nested else None,
                "paths": [p.to_dict() for p in self.paths]}

    @classmethod
    def from_dict(cls, d: dict | None) -> "RankError | None":
        if not d:
            return None
        return cls(type=d["type"], message=d.get("message", ""),
                   frames=tuple(Frame.from_dict(f) for f in d.get("frames", ())), time=float(d.get("time", 0)),
                   module=d.get("module", ""), cause=d.get("cause"), env=d.get("env"),
                   chain=tuple(ChainedError.from_dict(c) for c in d.get("chain") or ()),
                   values=d.get("values") or None, exited=d.get("exited"), asked=d.get("asked"),
                   nested=_nested(d.get("nested")),
                   paths=tuple(ErrorPath.from_dict(p) for p in d.get("paths") or ()))


def _nested(d) -> Nested | None:
    """The hook's record of an exception re-raised from another process ({"type", "where", "traceback"}:
    the traceback as that process formatted it), or a saved Nested."""
    if not d:
        return None
    if "traceback" in d:
        text = str(d.get("traceback") or "")
        last = next((ln.strip() for ln in reversed(text.splitlines()) if ln.strip()), "")
        return Nested(str(d.get("type", "?")), str(d.get("where", "")), last, tuple(parse_traceback(text)))
    return Nested.from_dict(d)


@dataclass(frozen=True)
class Stall:
    """Why a job was judged hung: every live rank made no progress for ``window_s``."""
    window_s: float               # the stall window
    idle_s: float                 # how long no rank had made progress when the verdict was given
    since_s: float                # seconds after launch of the last progress seen
    last_seq: int | None          # the highest collective number every rank had completed
    waited_for_timeout_s: float | None = None   # extra wait for a collective's own timeout to fire

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class RankResult:
    rank: int
    pid: int | None
    state: RankState              # exited, hung, running or not-started (defaults.RankState)
    exit_code: int | None         # 0, 1, ... ; None if ended by a signal or unknown
    signal: str | None            # "SIGABRT", "SIGTERM" (sent by ddplab or torchrun), ...
    where: Where | None = None    # what a live rank was blocked in when the verdict was given
    error: RankError | None = None   # its uncaught exception, if it raised one
    ledger: tuple[Collective, ...] = ()   # its flight recorder ledger (last snapshot)
    stack: tuple[Frame, ...] = ()  # innermost first
    stack_source: str | None = None  # "worker-server", "py-spy", "faulthandler", "traceback"
    cpu_s: float | None = None     # CPU seconds it used (with its child processes)
    cpu_busy: float | None = None  # cores it used over its last second watched (supervise.recent_cores)
    connections: tuple[dict, ...] = ()   # TCP sockets at the verdict: laddr, raddr, status
    dialling: dict | None = None   # {"host", "port"} of the store it was connecting to, if stuck there
    given: dict | None = None      # {"host", "port"} torchrun gave it (MASTER_ADDR/PORT)
    peer: dict | None = None       # {"op", "peer", "tag"}: the rank a blocked send/recv waits for (group rank)
    asked: dict | None = None      # {"rank", "world_size", "env"}: what it asked init_process_group for
    records: tuple[dict, ...] = ()
    log_tail: str = ""
    consequence: bool = False      # its error only says that a peer went away (not a cause)
    node: str | None = None        # the node it ran on (``ddplab explain`` of several nodes' folders)
    # evidence channels (issue 41): the rank hook's records
    calls: tuple[CallSite, ...] = ()      # the last collectives its script called, numbered, with their call sites
    threads: tuple[ThreadStack, ...] = ()  # its threads: live at the verdict, or those still running at its shutdown
    ended: Ended | None = None            # how it ended without a traceback (os._exit and its line)
    polls: tuple[Poll, ...] = ()          # files its own code looked for and did not find (live at the verdict)

    # --- views (made from the fields above, for people; never parsed) ---------------------------
    @property
    def frame(self) -> Frame | None:
        """The line of the user's code where it stood (blocked) or failed."""
        if self.where is not None and self.where.frame is not None:
            return self.where.frame
        return self.error.frame if self.error is not None else None

    @property
    def user_frame(self) -> str | None:
        return self.frame.short() if self.frame else None

    @property
    def waits_in(self) -> str | None:
        return _render().wait_phrase(self.where) if self.where is not None and self.state in ALIVE else None

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["where"] = self.where.to_dict() if self.where else None
        d["error"] = self.error.to_dict() if self.error else None
        d["ledger"] = [c.to_dict() for c in self.ledger]
        d["stack"] = [f.to_dict() for f in self.stack]
        d["connections"] = list(self.connections)
        d["records"] = list(self.records)
        d["calls"] = [c.to_dict() for c in self.calls]
        d["threads"] = [t.to_dict() for t in self.threads]
        d["ended"] = self.ended.to_dict() if self.ended else None
        d["polls"] = [p.to_dict() for p in self.polls]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "RankResult":
        return cls(**{**d, "state": RankState(d["state"]), "where": Where.from_dict(d.get("where")), "error": RankError.from_dict(d.get("error")),
                      "ledger": tuple(Collective.from_dict(c) for c in d.get("ledger", ())),
                      "stack": tuple(Frame.from_dict(f) for f in d.get("stack", ())),
                      "connections": tuple(d.get("connections", ())), "records": tuple(d.get("records", ())),
                      "calls": tuple(CallSite.from_dict(c) for c in d.get("calls") or ()),
                      "threads": tuple(ThreadStack.from_dict(t) for t in d.get("threads") or ()),
                      "ended": Ended.from_dict(d.get("ended")),
                      "polls": tuple(Poll.from_dict(p) for p in d.get("polls") or ())})


@dataclass(frozen=True)
class RunResult:
    target: str
    variant: str | None
    nproc: int
    status: Status
    signature: str | None         # id in ddplab.engine.signatures (None when ok)
    excerpt: str | None           # PyTorch's own message line that the signature matched
    ranks: tuple[RankResult, ...]
    wall_s: float
    run_dir: str
    command: tuple[str, ...]
    stall_s: float = DEFAULT_STALL_S          # the stall window the run was judged with
    deadline_s: float | None = None   # the optional outer limit
    port: int | None = None
    returncode: int | None = None  # torchrun's own exit status (None when ddplab ended it)
    leftover: tuple[int, ...] = ()  # pids still alive after cleanup (must be empty)
    notes: tuple[str, ...] = field(default_factory=tuple)
    first_failure: int | None = None  # the rank whose own error started a failed run (torchrun's
                                      # "root cause" is the first exit it saw, which can be a peer)
    stall: Stall | None = None        # why it was judged hung
    # an interrupted job, or one ended at a limit: its progress at that moment (the same facts as a
    # stall's; idle_s below window_s: it was still making progress, not hung)
    stopped: Stall | None = None
    divergence: Divergence | None = None   # where the ranks' ledgers first differ
    attached_pid: int | None = None   # `ddplab attach`: the pid it was given (the job was not started by ddplab)
    check: CheckReport | None = None  # `ddplab run --check`: what the ranks' own records show (ddplab.engine.check)
    culprits: tuple[int, ...] = ()   # the ranks the evidence blames (classify.refine; () where it blames none)
    fix_at: Frame | None = None      # the one line of the culprit's script that set the failure up, where its
                                     # cause points at one (a --local_rank argument, a timeout, MASTER_PORT set)
    calls_diverged: CallDivergence | None = None   # where the ranks' recorded call sites part (engine.callsites)
    args_differ: ArgsDiffer | None = None   # the first call at which the ranks passed the same collective arguments
                                            # that must agree and do not (engine.callsites.args_differ)
    startup_s: float = 0.0           # from the command's start to the job's: the headline counts wall_s after it
    # what the ranks printed, compared across ranks: labelled quantities with different values, most specific
    # first (ddplab.engine.printed; evidence, never a cause)
    printed: tuple[PrintedDiff, ...] = ()

    # --- conveniences -------------------------------------------------------------------------
    @property
    def ok(self) -> bool:
        return self.status == Status.OK

    @property
    def records(self) -> list[dict]:
        """Every rank's records, each with its ``rank``."""
        return [r for rank in self.ranks for r in rank.records]

    def records_of(self, event: str) -> list[dict]:
        return [r for r in self.records if r.get("event") == event]

    def rank(self, n: int) -> RankResult:
        return next(r for r in self.ranks if r.rank == n)

    @property
    def cause(self) -> RankError | None:
        """The exception of the rank that failed first, if it raised one."""
        return self.rank(self.first_failure).error if self.first_failure is not None else None

    # --- serialisation ------------------------------------------------------------------------
    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["ranks"] = [r.to_dict() for r in self.ranks]
        d["command"] = list(self.command)
        d["leftover"] = list(self.leftover)
        d["notes"] = list(self.notes)
        d["stall"] = self.stall.to_dict() if self.stall else None
        d["stopped"] = self.stopped.to_dict() if self.stopped else None
        d["divergence"] = self.divergence.to_dict() if self.divergence else None
        d["check"] = self.check.to_dict() if self.check else None
        d["culprits"] = list(self.culprits)
        d["fix_at"] = self.fix_at.to_dict() if self.fix_at else None
        d["calls_diverged"] = self.calls_diverged.to_dict() if self.calls_diverged else None
        d["args_differ"] = self.args_differ.to_dict() if self.args_differ else None
        d["printed"] = [p.to_dict() for p in self.printed]
        return d

    def save(self, path: str | Path | None = None) -> Path:
        path = Path(path or Path(self.run_dir) / runfiles.RESULT)
        path.write_text(json.dumps(self.to_dict(), indent=2, default=str))
        return path

    @classmethod
    def from_dict(cls, d: dict) -> "RunResult":
        known = {f.name for f in fields(cls)}
        d = {k: v for k, v in d.items() if k in known}
        return cls(**{**d, "status": Status(d["status"]), "ranks": tuple(RankResult.from_dict(r) for r in d["ranks"]),
                      "command": tuple(d["command"]), "leftover": tuple(d.get("leftover", ())),
                      "notes": tuple(d.get("notes", ())),
                      "stall": Stall(**d["stall"]) if d.get("stall") else None,
                      "stopped": Stall(**d["stopped"]) if d.get("stopped") else None,
                      "divergence": Divergence.from_dict(d["divergence"]) if d.get("divergence") else None,
                      "check": CheckReport.from_dict(d.get("check")), "culprits": tuple(d.get("culprits") or ()),
                      "fix_at": Frame.from_dict(d["fix_at"]) if d.get("fix_at") else None,
                      "calls_diverged": CallDivergence.from_dict(d.get("calls_diverged")),
                      "args_differ": ArgsDiffer.from_dict(d.get("args_differ")),
                      "printed": tuple(PrintedDiff.from_dict(p) for p in d.get("printed") or ())})

    @classmethod
    def load(cls, path: str | Path) -> "RunResult":
        p = Path(path)
        if p.is_dir():
            p = p / runfiles.RESULT
        return cls.from_dict(json.loads(p.read_text()))

    # --- for people: views made when shown (ddplab.views.render) ---------------------------------------
    @property
    def diagnosis(self) -> str:
        return short_paths(_render().diagnosis(self))

    def headline(self) -> str:
        return _render().headline(self)

    def explain(self) -> str:
        return short_paths(_render().explain(self))

    def _repr_html_(self) -> str:
        return short_paths(_render().html(self))

    def __repr__(self) -> str:   # the facts that identify it (run_dir shown short); explain() says what happened
        return (f"RunResult(target={self.target!r}, variant={self.variant!r}, nproc={self.nproc}, "
                f"status={self.status.value!r}, signature={self.signature!r}, first_failure={self.first_failure!r}, "
                f"wall_s={self.wall_s}, run_dir={short_path(self.run_dir)!r})")


@dataclass(frozen=True)
class Snapshot:
    """The job at one moment, as the watch loop sees it (``Supervisor.snapshot``): what the live status
    line shows (``ddplab.views.render.status_line``)."""
    elapsed_s: float
    nproc: int
    ranks: tuple[dict, ...]      # rank, state ("starting", "running", "waiting", "exited"), op, seq, idle_s
    idle_s: float                # time since any rank last made progress (0 while progressing)
    stall_s: float
