"""One place for the environment ddplab gives its ranks, and for how it starts a process that must
end with it.

The launcher never changes ``os.environ``: it hands torchrun a copy with the changes applied, so
nothing leaks into a notebook kernel or the caller and nothing needs restoring afterwards (the job
accelerate's ``patch_environment`` does for in-process launches).
"""
from __future__ import annotations

import os
import sys
from typing import Mapping


def child_environment(changes: Mapping[str, object], base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default ``os.environ``) with ``changes`` applied; a value of None removes the key."""
    env = dict(os.environ if base is None else base)
    for k, v in changes.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = str(v)
    return env


# Linux: the command gets SIGTERM when the process that started it is gone (PR_SET_PDEATHSIG survives
# exec; checked against a parent that went first), as an agent forked warm does
# (ddplab.origins.warm._end_with, the same three steps in the forked process). A small exec shim
# rather than Popen's preexec_fn, which is unsafe in a process with threads.
_END_WITH_PARENT = ("import ctypes, os, signal, sys\n"
                    "ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))\n"
                    "if os.getppid() != int(sys.argv[1]):\n"
                    "    sys.exit(128 + signal.SIGTERM)\n"
                    "os.execvp(sys.argv[2], sys.argv[2:])\n")


def ending_with_this_process(cmd: list[str]) -> list[str]:
    """``cmd``, started so that it is sent SIGTERM when this process ends, however it ends (a killed
    kernel or CLI): torchrun then ends its ranks. The thread that starts it must outlive it (the
    signal follows the starting thread), as the pipeline's does. Unchanged off Linux."""
    if not sys.platform.startswith("linux"):
        return list(cmd)
    return [sys.executable, "-S", "-c", _END_WITH_PARENT, str(os.getpid()), *cmd]
