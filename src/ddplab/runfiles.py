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
    RUN/ranks/rankN.term.txt      faulthandler's dump at SIGTERM: where the rank was when it was ended
    RUN/ranks/rankN.records.jsonl ddplab.rank.lab.record's events
    RUN/ranks/rankN.live.json     ``attach --save``: what was read from the live rank (stack, ledger)
    RUN/ranks/rankN.log           ``attach --save``: the rank's last output lines
    RUN/ranks/rankN.check.json    ``run --check``: the rank's own checksums, sampler indices, steps
    RUN/ranks/rankN.ended.json    ``os._exit(n)``: the code and the line that called it
    RUN/ranks/rankN.threads.json  the threads still running at shutdown, with their stacks
"""
import glob
import os

RANKS = "ranks"
COMMAND = "command.json"
TORCHRUN = "torchrun.json"
TORCHRUN_LOG = "torchrun.log"
TORCHRUN_LOGS = "torchrun"
CLUSTER = "cluster.json"
MACHINE_GO = "machine.go"
# set on a job's ranks when they must wait for their turn (ddplab.origins.turns): "<go file> <launcher pid>"
GO_ENV = "DDPLAB_MACHINE_GO"
RESULT = "result.json"
NODE = "node.json"

# one rank's files: rank{N}.{kind}
INFO = "json"
ERROR = "error.json"
EXIT = "exit.json"
STACK = "stack.txt"
TERM = "term.txt"        # faulthandler's dump when the rank is sent SIGTERM (torchrun ending it)
RECORDS = "records.jsonl"
LIVE = "live.json"
LOG = "log"
CHECK = "check.json"      # ddplab run --check: what the rank saw of its replicas, gradients and data
ENDED = "ended.json"      # how a rank ended without a traceback (os._exit and its line)
THREADS = "threads.json"  # the threads still running at interpreter shutdown (they keep the rank alive)
CALLS = "calls.json"      # the rank's call records, written when it calls a collective with an exception in flight
                          # (gloo may then abort it: SIGABRT leaves no error record)
CHILDREN = "children.json"  # the non-daemon child processes the rank started (a rank at exit joins them; its
                            # worker server no longer answers then)
KINDS = (INFO, ERROR, EXIT, STACK, TERM, RECORDS, LIVE, LOG, CHECK, ENDED, THREADS, CALLS, CHILDREN)


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


def probe_lock(sock_path):
    """The lock file beside a rank's worker-server socket: a prober holds it shared until its request
    is answered; the rank takes it exclusively as it exits, before it shuts the server down
    (ddplab.engine.probe, the rank hook)."""
    return f"{sock_path}.lock"


def node_torchrun(index):
    """One node's torchrun outcome (a multi-node job; merged into torchrun.json)."""
    return f"torchrun.node{index}.json"


def node_log(index):
    return f"torchrun.node{index}.log"


def rank_logs(run_dir):
    """(rank, path) for every rank's stdout.log and stderr.log that torchrun wrote (its --log-dir),
    the last attempt only."""
    found = {}
    for p in sorted(glob.glob(os.path.join(str(run_dir), TORCHRUN_LOGS, "*", "attempt_*", "*", "std*.log"))):
        rank = os.path.basename(os.path.dirname(p))
        if rank.isdigit():
            found[(int(rank), os.path.basename(p))] = p
    return sorted((rank, p) for (rank, _), p in found.items())
