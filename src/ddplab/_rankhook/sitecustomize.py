"""Loaded at start-up by every rank that ddplab launches (the launcher puts this folder first on
the ranks' PYTHONPATH), so it works for any script, unchanged.

It lets the launcher read a rank's Python stack even where py-spy cannot attach (macOS, or Linux
with Yama ptrace_scope=1 for a non-root user): ``faulthandler`` prints every thread's stack into
``ranks/rank<N>.stack.txt`` on SIGUSR1, and on a fatal signal (SIGSEGV, SIGABRT). It also writes
the rank's pid. Outside a ddplab run (no DDPLAB_RUN_DIR, or not a torchrun worker) it does nothing.
"""
import os
import sys


def _install():
    run_dir = os.environ.get("DDPLAB_RUN_DIR")
    rank = os.environ.get("RANK")
    # torchrun's agent also inherits PYTHONPATH; only its workers have LOCAL_RANK and RANK.
    if not run_dir or rank is None or "LOCAL_RANK" not in os.environ:
        return None
    import faulthandler
    import json
    import signal

    folder = os.path.join(run_dir, "ranks")
    os.makedirs(folder, exist_ok=True)
    stack_file = open(os.path.join(folder, f"rank{rank}.stack.txt"), "a", buffering=1)
    faulthandler.enable(file=stack_file, all_threads=True)
    if hasattr(signal, "SIGUSR1"):
        faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    with open(os.path.join(folder, f"rank{rank}.json"), "w") as f:
        json.dump({"rank": int(rank), "pid": os.getpid(), "master_addr": os.environ.get("MASTER_ADDR"),
                   "master_port": os.environ.get("MASTER_PORT"), "world_size": os.environ.get("WORLD_SIZE")}, f)
    return stack_file  # kept referenced for the life of the process


def _chain():
    """Run the sitecustomize this one shadows, if the environment has one."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


_DDPLAB_STACK_FILE = _install()
_chain()
