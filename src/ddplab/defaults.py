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

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


STATUSES = tuple(s.value for s in Status)

# A job is hung when every live rank has made no progress for the stall window (ddplab.engine.supervise);
# a lab may set its own (its LAB dict's "stall_s").
DEFAULT_STALL_S = 3.0
# The outer limit, a safety net and not the hang rule: none for labs, half an hour for a script
# (torch's own default collective timeout), whatever it is doing.
DEFAULT_SCRIPT_DEADLINE_S = 1800.0
# `ddplab attach`: give up watching a job that keeps making progress after this long.
DEFAULT_WATCH_S = 20.0
# Ending a job: SIGTERM, this long to go, then SIGKILL.
GRACE_S = 1.5
# Wait for PyTorch's own timeout (a collective's, the rendezvous') when it fires within this of a
# stall verdict, plus TIMEOUT_GRACE_S for the error to be raised and the rank to exit.
TIMEOUT_PATIENCE_S = 30.0
TIMEOUT_GRACE_S = 3.0
