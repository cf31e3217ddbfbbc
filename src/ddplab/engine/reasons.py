"""The parts of a failure's explanation beyond its catalog entry, as data: the exceptions chained to a
rank's error, the call from the user's own code into the library that raised it, and the facts a
catalog entry's premise is checked against (``Premise``). Pure: no I/O; ``ddplab.views.render`` makes the
sentences.
"""
from __future__ import annotations

import re
from pathlib import Path
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ddplab.defaults import ALIVE
from ddplab.facts import PACKAGE_DIR, ChainedError, Frame, Nested, is_user_file, nested_in_text  # noqa: F401

if TYPE_CHECKING:  # pragma: no cover
    from ddplab.result import RankError, RankResult


@dataclass(frozen=True)
class UserCall:
    """Where an exception raised inside a library came from in the user's code: the user's frame
    (with its source line), the library function it called, where the library raised it, and the
    values of the names on the user's line."""
    frame: Frame                  # innermost frame of the user's own code
    callee: Frame | None          # the library frame it called (None: raised on the user's own line)
    raised: Frame | None          # the innermost frame, where the exception was raised
    values: dict                  # {name: short repr}


def user_call(frames: tuple[Frame, ...], values: dict | None = None) -> UserCall | None:
    """The user's call into the library that raised, from frames innermost first; None when no
    frame is the user's."""
    for i, f in enumerate(frames):
        if is_user_file(f.file):
            # the library function the user called: --check's wrappers (the rank hook's) are not it
            inner = [g for g in frames[:i] if not _rank_hook_file(g.file)]
            return UserCall(f, inner[-1] if inner else None, frames[0] if inner else None, dict(values or {}))
    return None


_RANK_HOOK_DIR = str(PACKAGE_DIR / "rank" / "hook")


def _rank_hook_file(path: str) -> bool:
    """A frame of the code ddplab runs inside each rank (ddplab/rank/hook: --check's wrappers),
    found as ``stacks.is_user_file`` finds ddplab's own files: by the resolved path."""
    if not path or path.startswith("<"):
        return False
    try:
        return str(Path(path).resolve()).startswith(_RANK_HOOK_DIR)
    except OSError:
        return False


def error_chain(e: "RankError") -> tuple:
    """The rank's own error first, then the exceptions chained to it, as Python links them."""
    return (e,) + tuple(e.chain)


@dataclass(frozen=True)
class FailureFacts:
    """What a catalog entry's premise is checked against (``Cause.premise``, ``Signature.premise``):
    the first failing rank's frames (innermost first, with their source lines where recorded), its
    collective ledger (None: no ledger was recorded, or only a message's text is at hand), its call records,
    and where the exception was raised: in another process whose exception torch re-raised in the rank
    (``nested``: a DataLoader worker's), or in the rank's own process (None)."""
    frames: tuple[Frame, ...] = ()
    ledger: tuple | None = None
    calls: tuple | None = None    # the rank hook's call records (facts.CallSite; None: none were recorded)
    nested: Nested | None = None  # raised in another process and re-raised in the rank (RankError.nested)
    exit_code: str | None = None  # the rank ended itself with sys.exit(code), code not 0, with no exception in hand
    peers_exited: tuple = ()      # other ranks that also ended themselves with sys.exit(non-zero)
    in_flight: object = None      # the collective the rank failed in, called with an exception in flight (a
                                  # facts.CallSite whose ``exc`` is set: the hook's call records), else None
    paths: tuple = ()             # the files its exception is about (facts.ErrorPath: the exception's own fields
                                  # or the failing call's path arguments, the folder's existence then and now)
    peers_working: tuple = ()     # other ranks that were running the script's own code (not waiting in
                                  # torch.distributed, not failed) when the job was stopped

    rank: int | None = None       # the failing rank
    values: dict | None = None    # {name: short repr} on its failing user line (the hook's record)
    peers_same_error: tuple = ()  # other ranks whose own error has the same type and message
    printed: tuple = ()           # what the ranks printed with different values (facts.PrintedDiff, engine.printed)

    @property
    def empty_argument(self) -> bool:
        """A name on the failing user line held an empty mapping (the hook's repr of it: {} or OrderedDict())."""
        return any(v in _EMPTY_MAPPINGS for v in (self.values or {}).values())

    @property
    def last_call_by_fsdp(self) -> bool:
        """The rank's last recorded torch.distributed call was made by FSDP's own code (its lib frame)."""
        last = (self.calls or (None,))[-1]
        return last is not None and last.lib is not None and "torch/distributed/fsdp/" in last.lib.file.replace("\\", "/")

    @property
    def through_future(self) -> bool:
        """The exception was raised in a concurrent.futures worker thread (its frames pass through the work item's
        run) and re-raised in this thread by Future.result(): the frames of both, as Python chains them."""
        files = [(f.file.replace("\\", "/"), f.func.rsplit(".", 1)[-1]) for f in self.frames]
        return (any(fl.endswith("concurrent/futures/thread.py") and fn == "run" for fl, fn in files)
                and any(fl.endswith("concurrent/futures/_base.py") and fn == "result" for fl, fn in files))

    @property
    def folder_missing_then(self) -> tuple:
        """The files whose folder did not exist when the rank failed (the hook's record)."""
        return tuple(p for p in self.paths if not p.folder_then)

    @property
    def path_printed_apart(self) -> bool:
        """A file the exception is about lies in a path this rank printed (the path itself or a folder above it)
        where another rank printed a different path at the same print: the ranks worked in different places."""
        def under(path: str, top: str) -> bool:
            top = top.rstrip("/")
            return bool(top) and (path == top or path.startswith(top + "/"))
        for d in self.printed:
            mine = d.of(self.rank) if self.rank is not None else None
            if d.kind != "value" or d.numeric or mine is None or not mine.value:
                continue
            others = {v.value for v in d.values if v.rank != self.rank and v.value}
            if others and mine.value not in others and any(under(p.path, mine.value) for p in self.paths):
                return True
        return False

    @property
    def own_process(self) -> bool:
        """The exception was raised in the rank's own process (not re-raised from a worker it started)."""
        return self.nested is None

    @property
    def in_worker(self) -> bool:
        """The exception was raised in a DataLoader worker process of the rank and re-raised in it."""
        return self.nested is not None and self.nested.worker is not None

    @property
    def initialised(self) -> bool:
        """The rank's own records show init_process_group called in this process and not undone by a later
        destroy_process_group (False where nothing was recorded)."""
        setup = [c.op for c in self.calls or () if c.op in ("init_process_group", "destroy_process_group")]
        return bool(setup) and setup[-1] == "init_process_group"

    @property
    def line(self) -> str:
        """The source line of the user's own code where the error was raised or called into a library."""
        f = next((f for f in self.frames if is_user_file(f.file) and f.text), None)
        return f.text if f is not None else ""

    @property
    def reduced_before(self) -> int:
        """Gradient-sized all-reduces (more than one element: DDP's buckets; a metric is one number)
        this rank completed before it failed."""
        return sum(1 for c in self.ledger or () if c.op == "all_reduce" and c.completed and c.numel > 1)


_EMPTY_MAPPINGS = ("{}", "OrderedDict()", "dict()")

# a frame of a printed traceback, with its source line when it has one (a frozen module's, "<frozen os>", has none)
_TB_FRAME = re.compile(r'^(?:\[rank\d+\]: )?\s*File "(.*)", line (\d+), in (.+?)$'
                       r'(?:\n(?:\[rank\d+\]: )?[ \t]+(?!File ")(\S.*)$)?', re.M)


def facts_from_text(text: str) -> FailureFacts:
    """The facts a message's text holds: the frames, with their source lines, of its first traceback
    that passes through the user's own code (torchrun's own traceback follows a rank's in a log); no ledger."""
    marks = [m.start() for m in re.finditer(r"Traceback \(most recent call last\):", text)]
    for i, start in enumerate(marks):
        end = marks[i + 1] if i + 1 < len(marks) else len(text)
        frames = [Frame(m.group(3).strip(), m.group(1), int(m.group(2)), (m.group(4) or "").strip() or None)
                  for m in _TB_FRAME.finditer(text, start, end)]
        if any(is_user_file(f.file) for f in frames):
            return FailureFacts(tuple(frames[::-1]), nested=nested_in_text(text))
    return FailureFacts(nested=nested_in_text(text))


def raised_in(func: str, *files: str):
    """A premise: the exception was raised in the rank's own process, inside ``func`` of one of ``files`` (path
    endings: "torch/serialization.py", "os.py"; "<frozen os>" as a frozen module names itself), its innermost
    recorded frame."""
    def holds(f) -> bool:
        inner = f.frames[0] if f.frames else None
        return (f.own_process and inner is not None and inner.func.rsplit(".", 1)[-1] == func
                and inner.file.replace("\\", "/").endswith(files))
    return holds


def line_calls(*names: str):
    """A premise: the user's failing line calls one of ``names`` (``current_accelerator(``)."""
    return lambda f: any(n + "(" in f.line for n in names)


@dataclass(frozen=True)
class Asks:
    """What each process asked init_process_group for, at a rendezvous hang: torchrun's rank of the
    process -> (the rank it asked for, the world size it asked for), from its arguments or, where it
    passed none, the RANK and WORLD_SIZE it was given; ``job`` the number of processes started."""
    by_process: dict
    job: int

    @property
    def duplicates(self) -> dict:
        """{asked rank: processes that asked for it}, for ranks more than one process asked for."""
        seen: dict = {}
        for p, (rank, _) in sorted(self.by_process.items()):
            if rank is not None:
                seen.setdefault(rank, []).append(p)
        return {k: tuple(v) for k, v in seen.items() if len(v) > 1}

    @property
    def world_sizes(self) -> frozenset:
        return frozenset(ws for _, ws in self.by_process.values() if ws is not None)

    @property
    def missing(self) -> tuple:
        """Ranks of the asked world that no waiting process asked for."""
        ws = max(self.world_sizes, default=0)
        asked = {rank for rank, _ in self.by_process.values()}
        return tuple(r for r in range(ws) if r not in asked)

    @property
    def conflict(self) -> bool:
        """The asks cannot fit together whatever else happens: a rank asked for twice, or every process
        of the job asking for one world other than the processes it started. (World sizes that differ
        between processes are shown, and stay under hang-rendezvous's general reading: nodes launched
        unlike each other, lab 09's nodes-disagree.)"""
        return bool(self.duplicates) or (
            len(self.world_sizes) == 1 and len(self.by_process) == self.job and self.world_sizes != {self.job})


def asks(asked: dict, job: int) -> Asks:
    """``asked``: {torchrun rank: the rank hook's answer (rank, world_size, env)} of the processes
    waiting in init_process_group."""
    def num(v, env_key, a):
        if isinstance(v, int) and v >= 0:
            return v
        try:
            return int((a.get("env") or {}).get(env_key))
        except (TypeError, ValueError):
            return None
    return Asks({p: (num(a.get("rank"), "RANK", a), num(a.get("world_size"), "WORLD_SIZE", a))
                 for p, a in asked.items() if a}, job)


def rendezvous_asks(ranks: tuple[RankResult, ...]) -> Asks | None:
    """What the live ranks waiting at the rendezvous asked init_process_group for (None: none said)."""
    asked = {r.rank: r.asked for r in ranks if r.state in ALIVE and r.asked
             and r.where is not None and r.where.kind in ("rendezvous", "store")}
    return asks(asked, len(ranks)) if asked else None


def init_asks(ranks: tuple[RankResult, ...]) -> Asks | None:
    """What every process that called init_process_group asked for, whatever became of it (a failed
    rendezvous: the ranks exited on their timeout), or None where none recorded it."""
    asked = {r.rank: r.asked for r in ranks if r.asked}
    return asks(asked, len(ranks)) if asked else None


def spawns(r: RankResult) -> bool:
    """A rank waiting for the processes it started with torch.multiprocessing's spawn (mp.spawn)."""
    return any("torch/multiprocessing/spawn" in f.file.replace("\\", "/") for f in r.stack)
