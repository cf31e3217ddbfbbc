"""The origin "torch's debug-server periodic dumps": a folder that torch 2.13's
``torch.distributed.debug.start_debug_server(port=..., dump_dir=DIR, dump_interval=S)`` filled, for
a job that never ran under ddplab.

Rank 0's frontend process (``_frontend.PeriodicDumper``) writes, every S seconds, one text file per
enabled handler, ``<handler>_<YYYYmmdd>_<HHMMSS>.txt`` (the job's local time, to the second). By
default the handlers are ``stacks``, ``fr_trace`` and ``torchcomms_health_check``; measured on torch
2.13, gloo, CPU:

- ``stacks_*.txt``: for every rank, ``=== Rank <i>: <worker url> ===`` and that rank's answer to
  ``dump_traceback``: faulthandler text of all its threads, "Current thread" being the worker
  server's own (no Python frame); a rank that did not answer is ``Error: <HTTP status>``, and a
  ``PARTIAL DATA: k/n workers responded`` header comes first.
- ``fr_trace_*.txt`` is never written for a gloo job: its ``dump()`` fails in the flight recorder's
  analysis (``build_db``: ``KeyError: ('0', 0)``, gloo names its group '' in ``pg_config`` and '0'
  in the entries) and the dumper logs the error and goes on. Where it is written (NCCL) it is
  tabulate's text of the cross-rank analysis tables, not each rank's ledger; it is not read here.
- ``torchcomms_health_check_*.txt``: ``Error: 404`` per rank without torchcomms.

So this origin reads each rank's main-thread stack from the newest ``stacks`` dump (a dump that
lacks a rank's stack is refused: the others alone would be judged as if that rank were elsewhere),
and nothing else: no collective ledger, hence no divergence by collective number (``ddplab.origins.frdump`` reads
torch's ledgers where a job wrote them). Nobody watched the job: its ending is ``Ending.DUMPED``
and it has no stall facts.
"""
from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path

from ddplab.engine import evidence, stacks
from ddplab.engine.diagnose import DumpFolder
from ddplab.errors import DdplabError
from ddplab.engine.evidence import Evidence, LiveRank, Watch

# The handlers of torch 2.13 that implement dump(), by the file name each one writes.
HANDLERS = ("stacks", "pyspy_dump", "fr_trace", "torchcomms_fr_trace", "torchcomms_health_check", "wait_counters",
            "tcpstore")
_DUMP = re.compile(rf"({'|'.join(HANDLERS)})_(\d{{8}}_\d{{6}})\.txt")
_RANK = re.compile(r"^=== Rank (\d+): (.*) ===$", re.M)
_ERROR = re.compile(r"Error: (\d{3})")
_PARTIAL = re.compile(r"^PARTIAL DATA: \d+/(\d+) workers responded$", re.M)
# A main thread's outermost frame: a script's module (torchrun's way) or ``python -m``'s runpy.
_OUTERMOST = ("<module>", "_run_module_as_main")
STACK_SOURCE = "debug-server dump"


def dumps_in(folder: Path) -> dict[str, dict[str, Path]]:
    """torch's debug-server dump files in a folder: handler -> {timestamp: path}."""
    out: dict[str, dict[str, Path]] = {}
    for p in folder.iterdir():
        m = _DUMP.fullmatch(p.name)
        if m and p.is_file():
            out.setdefault(m.group(1), {})[m.group(2)] = p
    return out


def newest_stacks(folder: Path) -> tuple[Path, datetime]:
    """The newest ``stacks`` dump of a folder of debug-server dumps, and when it was taken."""
    found = dumps_in(folder).get("stacks")
    if not found:
        raise DdplabError(f"{folder} holds torch's debug-server dumps but no stacks_*.txt",
                          hint="start the debug server with 'stacks' among enabled_dumps (the default) and "
                               "let it dump once")
    stamp = max(found)
    return found[stamp], datetime.strptime(stamp, "%Y%m%d_%H%M%S")


def parse_stacks(path: Path) -> dict[int, tuple[list, int | None]]:
    """One ``stacks`` dump: rank -> (its main-thread frames, innermost first; the HTTP status the
    debug server got instead of that rank's answer, None when it answered).

    A whole dump names ranks 0..n-1 in order (n as its ``PARTIAL DATA`` header says, when there is
    one), each answer a faulthandler dump or ``Error: <status>``; the last answer ends in a newline
    and, when it is a stack, with its main thread's outermost frame (or faulthandler's own "..." of
    a stack too deep to print). Anything else is a file cut short or not torch's. A file cut exactly
    between two ranks' answers reads as a smaller job: nothing in it says how many ranks followed."""
    text = path.read_text(errors="replace")
    heads = list(_RANK.finditer(text))
    ranks = [int(m.group(1)) for m in heads]
    partial = _PARTIAL.search(text[:heads[0].start()] if heads else text)
    if not heads or ranks != list(range(len(ranks))) or (partial and int(partial.group(1)) != len(ranks)):
        raise DdplabError(f"{path} is not a whole debug-server stacks dump (no '=== Rank 0 ...' blocks in order)",
                          hint="delete it to read the dump before it, or take the dump again")
    out = {}
    for i, m in enumerate(heads):
        body = text[m.end() + 1:heads[i + 1].start() if i + 1 < len(heads) else len(text)]
        err = _ERROR.fullmatch(body.strip())
        if err:
            out[ranks[i]] = ([], int(err.group(1)))
            continue
        frames = stacks.parse_faulthandler_main(body)
        last = i + 1 == len(heads)
        whole = not last or (body.endswith("\n") and bool(frames)
                             and (frames[-1].func in _OUTERMOST or "\n  ...\n" in body))
        if not frames or not whole:
            raise DdplabError(f"{path} is cut short or damaged (rank {ranks[i]}'s stack is incomplete)",
                              hint="delete it to read the dump before it, or take the dump again")
        out[ranks[i]] = (frames, None)
    return out


def every_stack(path: Path, per_rank: dict[int, tuple[list, int | None]]) -> dict[int, list]:
    """Each rank's frames, when the dump holds every rank's. A rank that did not answer (stopped,
    gone, its worker server busy) is not known to be anywhere: judging the others alone would name a
    cause (another rank elsewhere, all in one collective) whose premise the dump does not hold."""
    silent = {r: status for r, (_, status) in per_rank.items() if status is not None}
    if silent:
        who = ", ".join(f"rank {r} (HTTP {s})" for r, s in sorted(silent.items()))
        raise DdplabError(f"{path} holds no stack of {who}: it did not answer torch's debug server",
                          hint="explain a dump in which every rank answered (delete this one to read the one "
                               "before it), and look at what that rank is doing: stopped, gone or busy")
    return {r: frames for r, (frames, _) in per_rank.items()}


def _evidence(folder: Path, path: Path, taken: datetime, frames: dict[int, list]) -> Evidence:
    """A job known only from its debug server's dump: each rank as its stack stood when dumped."""
    live = {r: LiveRank(r, 0, frames=fr, source=STACK_SOURCE) for r, fr in sorted(frames.items())}
    return evidence.dumped(live, {}, len(live),
                           f"from torch's debug-server dumps in {folder}: {path.name}, taken "
                           f"{taken:%Y-%m-%d %H:%M:%S}; stacks only, no collective ledger")


class DebugServerDumps(DumpFolder):
    """The source for ``ddplab explain DIR`` on the dump_dir of torch's debug server."""

    @staticmethod
    def claims(folders) -> bool:
        return len(folders) == 1 and bool(dumps_in(Path(folders[0])))

    def __init__(self, folders):
        super().__init__(folders)
        self.path, self.taken = newest_stacks(self.folder)
        self.frames = every_stack(self.path, parse_stacks(self.path))

    def evidence(self, seen: Watch | None, live: dict) -> Evidence:
        return _evidence(self.folder, self.path, self.taken, self.frames)
