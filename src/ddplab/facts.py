"""Facts every part shares, below the engine, the origins and the views: frozen dataclasses with
``to_dict``/``from_dict`` that a ``RunResult`` holds. Imports only the standard library and
``ddplab.defaults`` (issue 41, item 7: h41-arch moves Frame, Where, Collective, Divergence, CheckReport and
ChainedError here).
"""
from __future__ import annotations

from dataclasses import dataclass

# h41-arch defines Frame in this module; until that lands, the engine's is used (drop this at merge)
from ddplab.engine.stacks import Frame


# evidence channels (issue 41)
# What the rank hook records at every collective a script calls, how a rank ended without a traceback,
# the threads it had, an exception re-raised from another process; and what the engine derives from the
# ranks' call records (where their call sites diverged). Records are lists as the hook writes them
# ([file, line, func]); these types read them.

def _frame(x) -> Frame | None:
    """A hook record's frame ([file, line, func] or {"file", "line", "func"}) as a Frame."""
    if not x:
        return None
    if isinstance(x, dict):
        return Frame.from_dict(x)
    return Frame(str(x[2]), str(x[0]), int(x[1] or 0))


def _frames(xs) -> tuple[Frame, ...]:
    return tuple(f for f in (_frame(x) for x in xs or ()) if f is not None)


@dataclass(frozen=True)
class InFlight:
    """An exception being handled or propagating in the thread that called a collective."""
    type: str
    message: str
    at: Frame | None              # where it was raised (its traceback's innermost frame)

    def to_dict(self) -> dict:
        return {"type": self.type, "message": self.message, "at": self.at.to_dict() if self.at else None}

    @classmethod
    def from_dict(cls, d: dict | None) -> "InFlight | None":
        if not d:
            return None
        return cls(str(d.get("type", "?")), str(d.get("message", "")), _frame(d.get("at")))


@dataclass(frozen=True)
class CallSite:
    """One collective (or set-up call) a rank's script called, numbered in that rank's order of calls."""
    n: int                        # the rank's n-th watched call (ranks align on it)
    op: str                       # "all_reduce", "barrier", "init_process_group", ...
    user: tuple[Frame, ...]       # the innermost user frames that led to it, innermost first
    lib: Frame | None             # the innermost library frame that called torch.distributed (Lightning's, DDP's)
    exc: InFlight | None = None   # the exception in flight in that thread at the call
    thread: str | None = None     # the calling thread's name, when not the main thread

    @property
    def frame(self) -> Frame | None:
        """The user's line of the call."""
        return self.user[0] if self.user else None

    @property
    def place(self) -> tuple:
        """What two ranks compare: the op and the user's lines that led to it."""
        return (self.op,) + tuple((f.file, f.line) for f in self.user)

    def to_dict(self) -> dict:
        return {"n": self.n, "op": self.op, "user": [f.to_dict() for f in self.user],
                "lib": self.lib.to_dict() if self.lib else None,
                "exc": self.exc.to_dict() if self.exc else None, "thread": self.thread}

    @classmethod
    def from_dict(cls, d: dict) -> "CallSite":
        return cls(int(d.get("n", 0)), str(d.get("op", "?")), _frames(d.get("user")), _frame(d.get("lib")),
                   InFlight.from_dict(d.get("exc")), d.get("thread"))


@dataclass(frozen=True)
class ThreadStack:
    """One Python thread of a rank, with its stack (innermost first)."""
    name: str
    daemon: bool
    main: bool
    frames: tuple[Frame, ...]

    def to_dict(self) -> dict:
        return {"name": self.name, "daemon": self.daemon, "main": self.main,
                "frames": [f.to_dict() for f in self.frames]}

    @classmethod
    def from_dict(cls, d: dict) -> "ThreadStack":
        return cls(str(d.get("name", "?")), bool(d.get("daemon")), bool(d.get("main")), _frames(d.get("frames")))


@dataclass(frozen=True)
class Ended:
    """How a rank ended when it left no traceback: ``how`` "os._exit" (the hook's record), with its code
    and the frames that called it (innermost first)."""
    how: str
    code: int | str | None
    frames: tuple[Frame, ...]

    def to_dict(self) -> dict:
        return {"how": self.how, "code": self.code, "frames": [f.to_dict() for f in self.frames]}

    @classmethod
    def from_dict(cls, d: dict | None) -> "Ended | None":
        if not d:
            return None
        return cls(str(d.get("how", "?")), d.get("code"), _frames(d.get("frames")))


@dataclass(frozen=True)
class Nested:
    """An exception torch re-raised in this rank from another process ("Caught KeyError in DataLoader worker
    process 0"): the other process's exception type, where it was, and its own frames (innermost first),
    read from the traceback that process formatted."""
    type: str
    where: str                    # torch's words for the other process: "in DataLoader worker process 0"
    message: str                  # the other process's last traceback line (its exception's message)
    frames: tuple[Frame, ...]

    def to_dict(self) -> dict:
        return {"type": self.type, "where": self.where, "message": self.message,
                "frames": [f.to_dict() for f in self.frames]}

    @classmethod
    def from_dict(cls, d: dict | None) -> "Nested | None":
        if not d:
            return None
        return cls(str(d.get("type", "?")), str(d.get("where", "")), str(d.get("message", "")),
                   _frames(d.get("frames")))


@dataclass(frozen=True)
class CallDivergence:
    """Where the ranks' own call records part: the last call every rank made from the same place, the first
    number at which they called from different places (or some rank made no call), and the user's branch
    between them (the condition whose block holds the odd ranks' call and not the others')."""
    n: int                                  # the first call number at which the ranks differ
    last_same: CallSite | None              # the call before it, the same on every rank (rank 0's record)
    first: dict                             # rank -> its CallSite at ``n`` (None: it made no such call)
    odd: tuple[int, ...]                    # the ranks whose call stands under ``branch`` (the others' does not)
    branch: Frame | None                    # the user's condition between the two places

    def to_dict(self) -> dict:
        return {"n": self.n, "last_same": self.last_same.to_dict() if self.last_same else None,
                "first": {str(k): v.to_dict() if v else None for k, v in self.first.items()},
                "odd": list(self.odd), "branch": self.branch.to_dict() if self.branch else None}

    @classmethod
    def from_dict(cls, d: dict | None) -> "CallDivergence | None":
        if not d:
            return None
        return cls(int(d["n"]), CallSite.from_dict(d["last_same"]) if d.get("last_same") else None,
                   {int(k): CallSite.from_dict(v) if v else None for k, v in (d.get("first") or {}).items()},
                   tuple(d.get("odd") or ()), Frame.from_dict(d["branch"]) if d.get("branch") else None)
