"""The names of a run folder's files, in one place.

Used by the rank hook (``_rankhook/sitecustomize.py``, inside every rank: this module imports only
``os`` and must stay that light), by the launcher, the readers (``ddplab.engine.evidence``), ``ddplab.rank.lab``,
``ddplab.origins.attach`` and ``ddplab.origins.cluster``.

    RUN/command.json        the torchrun command, the agent's pid (ddplab.origins.launch)
    RUN/torchrun.json       torchrun's outcome as data (ddplab.origins._torchrun; merged by ddplab.origins.cluster)
    RUN/torchrun.log        torchrun's own output
    RUN/torchrun/           torchrun's --log-dir: each rank's stdout.log and stderr.log
    RUN/cluster.json        a multi-node job's spec (ddplab.origins.cluster)
    RUN/machine.go          created once a measured run may start (ddplab.origins.turns)
    RUN/result.json         the RunResult
    RUN/node.json           ``ddplab attach --save``: which node, which job, which ranks it saw
    RUN/ranks/rankN.json          the rank hook's start record (pid, socket, MASTER_ADDR/PORT)
    RUN/ranks/rankN.error.json    its uncaught exception (or sys.exit(n)) as data
    RUN/ranks/rankN.exit.json     a normal exit: time and the flight recorder's final ledger
    RUN/ranks/rankN.stack.txt     faulthandler's dumps (fatal signals, SIGUSR1)
    RUN/ranks/rankN.records.jsonl ddplab.rank.lab.record's events
    RUN/ranks/rankN.live.json     ``attach --save``: what was read from the live rank (stack, ledger)
    RUN/ranks/rankN.log           ``attach --save``: the rank's last output lines
    RUN/ranks/rankN.check.json    ``run --check``: the rank's own checksums, sampler indices, steps
"""
import os

RANKS = "ranks"
COMMAND = "command.json"
TORCHRUN = "torchrun.json"
TORCHRUN_LOG = "torchrun.log"
TORCHRUN_LOGS = "torchrun"
CLUSTER = "cluster.json"
MACHINE_GO = "machine.go"
RESULT = "result.json"
NODE = "node.json"

# one rank's files: rank{N}.{kind}
INFO = "json"
ERROR = "error.json"
EXIT = "exit.json"
STACK = "stack.txt"
RECORDS = "records.jsonl"
LIVE = "live.json"
LOG = "log"
CHECK = "check.json"      # ddplab run --check: what the rank saw of its replicas, gradients and data
KINDS = (INFO, ERROR, EXIT, STACK, RECORDS, LIVE, LOG, CHECK)


def rank_name(rank, kind):
    """``rank3.error.json`` for ``rank_name(3, ERROR)``."""
    return f"rank{rank}.{kind}"


def rank_path(run_dir, rank, kind):
    return os.path.join(str(run_dir), RANKS, rank_name(rank, kind))


def rank_of(name, kind):
    """The rank in a file name of that kind (``rank3.error.json`` -> 3), else None."""
    head, suffix = "rank", "." + kind
    if not (name.startswith(head) and name.endswith(suffix)):
        return None
    digits = name[len(head):-len(suffix)]
    return int(digits) if digits.isdigit() else None


def socket_name(rank):
    """A rank's worker-server socket, in the run's socket folder."""
    return f"r{rank}.sock"


def node_torchrun(index):
    """One node's torchrun outcome (a multi-node job; merged into torchrun.json)."""
    return f"torchrun.node{index}.json"


def node_log(index):
    return f"torchrun.node{index}.log"
