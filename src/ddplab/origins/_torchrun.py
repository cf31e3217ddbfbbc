"""torchrun, with its outcome saved as data: ``python -m ddplab.origins._torchrun RESULT.json <torchrun args>``.

It is ``torch.distributed.run`` itself (the same argument parser, agent, rendezvous and console
output); the only addition is that the ``ChildFailedError`` torchrun raises when a worker fails is
written to RESULT.json as fields (each failed rank's exit code, signal, pid, time and error file)
before it propagates as usual. ddplab reads that file instead of parsing torchrun's printed summary.

``python -m ddplab.origins._torchrun --warm FD`` is the warm process of ``ddplab.origins.warm``: it imports torch once
and forks one agent per run, each of which runs ``main`` as above.
"""
from __future__ import annotations

import json
import os
import sys


def _write(path: str, data: dict) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(data, f, indent=2)
    os.replace(path + ".tmp", path)


def main(argv: list[str]) -> None:
    out, args = argv[0], argv[1:]
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    try:
        run(parse_args(args))
    except ChildFailedError as e:
        failures = {}
        for rank, f in e.failures.items():
            failures[str(rank)] = {
                "local_rank": f.local_rank, "pid": f.pid, "exitcode": f.exitcode,
                "signal": f.signal_name() if f.exitcode < 0 else None,
                "timestamp": f.timestamp, "error_file": f.error_file or None}
        first = e.get_first_failure()[0] if e.failures else None
        _write(out, {"returncode": 1, "failures": failures, "torchrun_root_cause": first})
        raise
    _write(out, {"returncode": 0, "failures": {}, "torchrun_root_cause": None})


if __name__ == "__main__":
    if sys.argv[1:2] == ["--warm"]:
        # the warm process that forks each run's agent (ddplab.origins.warm)
        from ddplab.origins.warm import serve
        serve(int(sys.argv[2]), main)
    else:
        main(sys.argv[1:])
