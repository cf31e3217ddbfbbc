"""Every way ``ddplab run script.py`` differs from ``torchrun --nproc-per-node N script.py`` for a
user's script, as data: the ranks' environment, their interpreter's start-up, torchrun's arguments.
Each one stays because the diagnosis needs it (``why``); anything not listed here is as torchrun
leaves it. README's list ("What differs from bare torchrun") is this one, and
tests/test_parity.py starts the same script both ways and compares the ranks' environments and
``sys.path`` entry by entry against it.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass


class Kind(str, enum.Enum):
    ENV = "environment"          # a variable the ranks see
    ARGUMENT = "torchrun argument"
    STARTUP = "start-up"         # what runs in the rank's interpreter before the script


class When(str, enum.Enum):
    ALWAYS = "always"
    UNSET = "unless you set it"  # the caller's own value is kept
    CHECK = "with --check"
    LABS = "lab scripts only"    # the settings the labs were measured with, not a user's script


@dataclass(frozen=True)
class Difference:
    name: str
    kind: Kind
    when: When
    why: str
    env: tuple[str, ...] = ()    # the ranks' variables it adds or changes (what the parity test sees)


DIFFERENCES: tuple[Difference, ...] = (
    # --- torchrun's arguments -------------------------------------------------------------------
    Difference("--rdzv-backend c10d --rdzv-endpoint 127.0.0.1:0 --rdzv-id RUN", Kind.ARGUMENT, When.ALWAYS,
               "a free rendezvous port picked by the store itself, as `torchrun --standalone` does: bare torchrun's "
               "default (static, port 29500) lets two jobs on one machine meet or collide (lab 05)",
               env=("MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE")),
    Difference("--local-addr 127.0.0.1", Kind.ARGUMENT, When.ALWAYS,
               "MASTER_ADDR stays 127.0.0.1, as bare torchrun gives it (c10d rendezvous alone would give the hostname)"),
    Difference("--log-dir RUN/torchrun --redirects 3", Kind.ARGUMENT, When.ALWAYS,
               "each rank's stdout and stderr in its own file: the tracebacks and last printed lines the diagnosis "
               "reads (ddplab shows them with a [rank N] prefix); the ranks' output is a file, not the terminal",
               env=("TORCHELASTIC_ERROR_FILE",)),
    Difference("python -m ddplab.origins._torchrun RESULT", Kind.ARGUMENT, When.ALWAYS,
               "torchrun's own main (torch.distributed.run), which also writes its outcome as data; on Linux the "
               "agent is forked from a process that imported torch already (DDPLAB_WARM_AGENT=0: a fresh one)"),
    # --- the ranks' environment -----------------------------------------------------------------
    Difference("TORCH_FR_BUFFER_SIZE", Kind.ENV, When.UNSET,
               "torch's flight recorder: the collectives each rank issued, read while it is blocked",
               env=("TORCH_FR_BUFFER_SIZE",)),
    Difference("DDPLAB_RUN_DIR, DDPLAB_SOCKET_DIR", Kind.ENV, When.ALWAYS,
               "where the rank hook writes the rank's records and opens torch's worker server",
               env=("DDPLAB_RUN_DIR", "DDPLAB_SOCKET_DIR")),
    Difference("DDPLAB_RANK_PID", Kind.ENV, When.ALWAYS,
               "set by the hook in each rank: a process the rank starts is not taken for the rank",
               env=("DDPLAB_RANK_PID",)),
    Difference("DDPLAB_CHECK", Kind.ENV, When.CHECK, "the checksum interval of --check's records",
               env=("DDPLAB_CHECK",)),
    Difference("PYTHONUNBUFFERED, OMP_NUM_THREADS, GLOO_SOCKET_IFNAME", Kind.ENV, When.UNSET,
               "the settings the labs and the course's graders were measured with: output as it is printed, "
               "each rank's share of the cores (torchrun gives 1 with more than one rank), gloo on loopback "
               "(faulthandler goes to the run folder, so PYTHONFAULTHANDLER is taken out); the course's "
               "graders run cells as scripts, so a user's script gets them too until those are measured without",
               env=("PYTHONUNBUFFERED", "OMP_NUM_THREADS", "GLOO_SOCKET_IFNAME", "PYTHONFAULTHANDLER")),
    # --- the interpreter's start-up ----------------------------------------------------------------
    Difference("sitecustomize (the rank hook)", Kind.STARTUP, When.ALWAYS,
               "ddplab's hook runs first (PYTHONPATH), then your own sitecustomize.py; in each rank it takes its "
               "folder off sys.path and PYTHONPATH again, so the script sees both as bare torchrun gives them "
               "(`import sitecustomize` gives ddplab's)"),
    Difference("faulthandler, sys.excepthook, sys.exit, atexit", Kind.STARTUP, When.ALWAYS,
               "each rank's stacks on SIGUSR1, SIGTERM and fatal signals go to the run folder (faulthandler on); "
               "an uncaught exception or sys.exit(n) is recorded, then handled as before; the ledger is kept at exit"),
    Difference("torch's worker server", Kind.STARTUP, When.ALWAYS,
               "once the script imports torch.distributed: a C++ thread answering on a Unix socket in the temp "
               "folder, so a blocked rank's stacks and ledger are read with no ptrace and no signal"),
    Difference("stdout line-buffered", Kind.STARTUP, When.ALWAYS,
               "the ranks write to files (--redirects), where Python would buffer whole blocks; line by line "
               "is what a terminal gives bare torchrun's ranks"),
    Difference("--check's wrappers", Kind.STARTUP, When.CHECK,
               "DistributedDataParallel's __init__ and forward, optimizer-step hooks and DataLoader iteration "
               "are wrapped to record checksums and sample indices (nothing they compute changes)"),
)


def env_names(*, lab: bool = False, check: bool = False) -> frozenset[str]:
    """The ranks' variables ddplab may add or change for a job of that kind."""
    on = {When.ALWAYS, When.UNSET} | ({When.CHECK} if check else set()) | ({When.LABS} if lab else set())
    return frozenset(v for d in DIFFERENCES if d.when in on for v in d.env)
