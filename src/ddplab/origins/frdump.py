"""The origin "torch's own flight-recorder dumps": a folder of ``<prefix><rank>`` files, each the
pickled dump torch writes to ``$TORCH_FR_DUMP_TEMP_FILE<rank>``, for a job that never ran under
ddplab. NCCL writes them itself when its watchdog sees a collective time out
(``TORCH_NCCL_DUMP_ON_TIMEOUT``); gloo records the same ledger (``TORCH_FR_BUFFER_SIZE``) but writes
no file by itself: a script takes it with ``torch._C._distributed_c10d._dump_fr_trace()`` (measured
here on torch 2.13, gloo). The dumps hold ledgers (each entry with the frames that issued it), read without running any code from them
(no pickle globals). Nobody watched the job: its ending is ``Ending.DUMPED`` and it has no stall facts.
"""
from __future__ import annotations

import io
import pickle
import re
from dataclasses import replace
from pathlib import Path

from ddplab.engine import evidence, stacks
from ddplab.engine import ledger as ledger_mod
from ddplab.engine.diagnose import DumpFolder
from ddplab.errors import DdplabError
from ddplab.engine.evidence import Evidence, LiveRank, Watch


def dumps_in(folder: Path) -> dict[int, Path]:
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
    raw = {r: read_fr_dump(p) for r, p in sorted(dumps.items())}
    ledgers = {r: ledger_mod.parse(d) for r, d in raw.items()}
    div = ledger_mod.divergence(ledgers)
    if div is not None:
        # A dump is taken when a collective timed out: gloo retires the entry that failed (its state
        # stays "scheduled"), so a rank's last entry at or past the divergence is where it stood.
        ledgers = {r: lg[:-1] + (replace(lg[-1], completed=False),) if lg and lg[-1].seq >= div.seq else lg
                   for r, lg in ledgers.items()}
    # each entry carries the Python frames that issued it: where the rank stood, in its own code
    live = {r: LiveRank(r, 0, ledger=lg, frames=stacks.fr_frames(raw[r]), source="flight-recorder entry")
            for r, lg in ledgers.items()}
    return evidence.dumped(live, ledgers, max(ledgers) + 1,
                           f"from torch's flight-recorder dumps in {folder}: ledgers, and the frames that issued "
                           "each rank's last collective (no live stacks, no duration)")


class FlightRecorderDumps(DumpFolder):
    """The source for ``ddplab explain DIR`` on a folder of torch's dumps."""

    @staticmethod
    def claims(folders) -> bool:
        return len(folders) == 1 and bool(dumps_in(Path(folders[0])))

    def __init__(self, folders):
        super().__init__(folders)
        self.dumps = dumps_in(self.folder)

    def evidence(self, seen: Watch | None, live: dict) -> Evidence:
        return _fr_evidence(self.folder, self.dumps)
