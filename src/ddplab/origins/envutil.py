"""One place for the environment ddplab gives its ranks.

The launcher never changes ``os.environ``: it hands torchrun a copy with the changes applied, so
nothing leaks into a notebook kernel or the caller and nothing needs restoring afterwards (the job
accelerate's ``patch_environment`` does for in-process launches).
"""
from __future__ import annotations

import os
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
