"""The status vocabulary and the defaults every part of ddplab shares, each written once."""
from __future__ import annotations

from enum import Enum


class Status(str, Enum):
    """A run's status. A ``str``: ``Status.HUNG == "hung"``, and it is saved as its value."""
    OK = "ok"
    FAILED = "failed"           # a rank exited with an error
    HUNG = "hung"               # the stall rule: every live rank without progress for the stall window
    DEADLINE = "deadline"       # still making progress at the optional outer limit
    INTERRUPTED = "interrupted"  # Ctrl-C, a Jupyter interrupt, SIGTERM
    RUNNING = "running"         # `ddplab attach` only: kept making progress while watched
    EXITED = "exited"           # `ddplab attach` only: ended while watched

    def __str__(self) -> str:
        return self.value

    def __repr__(self) -> str:           # inside a printed dict or list: its value, as it is saved
        return repr(self.value)

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


STATUSES = tuple(s.value for s in Status)


class RankState(str, Enum):
    """Where a rank was when the job's verdict was given."""
    EXITED = "exited"            # it ended on its own (its exit code and signal say how)
    HUNG = "hung"                # alive when the job stalled; ended by ddplab (or left running by attach)
    RUNNING = "running"          # alive at the outer deadline, an interrupt or the end of attach's watch
    NOT_STARTED = "not-started"  # no process ever had this rank number

    def __str__(self) -> str:
        return self.value

    def __repr__(self) -> str:           # inside a printed dict or list: its value, as it is saved
        return repr(self.value)

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


ALIVE = (RankState.HUNG, RankState.RUNNING)     # a rank still alive at the verdict


class Ending(str, Enum):
    """How the one watch loop ended (``ddplab.engine.supervise.watch``); the judge reads it, never the origin."""
    FINISHED = "finished"        # the job ended on its own (torchrun exited: its exit status is known)
    EXITED = "exited"            # every watched rank ended (a job ddplab did not start: no exit status)
    STALL = "stall"              # the stall rule: every live rank without progress for the stall window
    DEADLINE = "deadline"        # the optional outer limit of a started job
    WATCHED = "watched"          # attach's watch time ran out while the job kept making progress
    INTERRUPT = "interrupt"      # Ctrl-C, a Jupyter interrupt, SIGTERM
    DUMPED = "dumped"            # nobody watched: the ranks' state as torch dumped it (flight recorder)

    def __str__(self) -> str:
        return self.value

    def __repr__(self) -> str:
        return repr(self.value)

    @classmethod
    def of(cls, value) -> "Ending":
        """An ending read back from a saved watch (``None`` was a finished job in older folders)."""
        return cls.FINISHED if value is None else cls(value)

# A job is hung when every live rank has made no progress for the stall window (ddplab.engine.supervise);
# a lab may set its own (its LAB dict's "stall_s").
DEFAULT_STALL_S = 3.0
# The outer limit, a safety net and not the hang rule: none for labs, half an hour for a script
# (torch's own default collective timeout), whatever it is doing.
DEFAULT_SCRIPT_DEADLINE_S = 1800.0
# `ddplab attach`: give up watching a job that keeps making progress after this long.
DEFAULT_WATCH_S = 20.0
# A rank using more CPU than this (cores, over the loop's last second) is making progress: a rank blocked in
# a collective uses about 0.003. The loop's stall rule and the views' "busy or blocked" read the same number.
CPU_PROGRESS_CORES = 0.03
# torchrun's own default rendezvous port (what a port check looks at when none is given)
TORCHRUN_PORT = 29500
# Ending a job: SIGTERM, this long to go, then SIGKILL.
GRACE_S = 1.5
# A multi-node job on one machine (ddplab.origins.cluster): when one node's torchrun agent fails, the
# other nodes' agents get SIGTERM (srun --kill-on-bad-exit), and this long to end their own workers
# (torchrun's own SIGTERM -> SIGKILL of its workers takes up to 5 s) before they are killed.
AGENT_GRACE_S = 10.0
# Wait for PyTorch's own timeout (a collective's, the rendezvous') when it fires within this of a
# stall verdict, plus TIMEOUT_GRACE_S for the error to be raised and the rank to exit.
TIMEOUT_PATIENCE_S = 30.0
TIMEOUT_GRACE_S = 3.0
