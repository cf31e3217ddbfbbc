"""``ddplab explain DIR...``: the origin is chosen from what the folders hold, then the one pipeline
(``ddplab.engine.diagnose``) judges it. Each origin says whether it claims the folders (``claims``); a new
folder origin is one module and one line in ``ORIGINS``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from ddplab.origins import debugdump, frdump, nodes
from ddplab import runfiles
from ddplab.engine.diagnose import diagnose
from ddplab.errors import DdplabError
from ddplab.result import RunResult

ORIGINS = (nodes.SavedNodes, frdump.FlightRecorderDumps, debugdump.DebugServerDumps)


def source_for(folders: Sequence[Path]):
    folders = [Path(f) for f in folders]
    if not folders:
        raise DdplabError("no folder given", hint="pass the folders ddplab attach --save wrote")
    for f in folders:
        if not f.is_dir():
            raise DdplabError(f"no such folder: {f}", hint="pass the folders ddplab attach --save wrote")
    for origin in ORIGINS:
        if origin.claims(folders):
            return origin(folders)
    if len(folders) > 1 and not all(nodes.is_node_folder(f) for f in folders):
        raise DdplabError("pass either the folders ddplab attach --save wrote or one folder of torch's dumps",
                          hint="explain one job's evidence at a time")
    f = next(f for f in folders if not nodes.is_node_folder(f))
    raise DdplabError(f"{f} holds no evidence (no {runfiles.NODE} from ddplab attach --save, no dump of torch's flight recorder or debug server)",
                      hint="pass the folder ddplab attach PID --save DIR wrote, the folder of torch's "
                           "$TORCH_FR_DUMP_TEMP_FILE dumps, or the dump_dir of torch's debug server")


def explain(folders: Sequence[Path]) -> RunResult:
    """The diagnosis of a job from the evidence saved in folders: a RunResult whose ranks name their node."""
    return diagnose(source_for(folders))
