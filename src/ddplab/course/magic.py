"""``%%ddplab``: run a notebook cell as a torchrun script on N ranks, judged by ``ddplab.run``.

    %load_ext ddplab
    %%ddplab --nproc 2 --check --stall 3 --name attempt
    import torch.distributed as dist
    ...

The cell is compiled first (a syntax error is shown with its line and nothing starts), written to a
file, run through ``ddplab.run`` (its live status line in Jupyter, the stall rule, every process ended
and checked gone, also on a kernel interrupt), and shown as ddplab shows a result: the verdict and its
explanation. The ``RunResult`` is bound to ``_ddplab`` and to ``--name VAR``; the script is saved in the
run folder as ``script.py`` (``SCRIPT``), so a result read back later still says what ran.
A bad option or value is one line (``DdplabError``) and starts nothing; a refused cell also unbinds
``VAR`` (``None``), so a later grading cell never judges the previous cell's result as this one's.
"""
from __future__ import annotations

import datetime as _dt
import keyword
import shlex
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from ddplab.errors import DdplabError

# The cell's source as saved in its run folder.
SCRIPT = "script.py"
# Where cells are written before they run: a folder per cell run under the runs root.
CELLS = "cells"
DEFAULT_VAR = "_ddplab"
# how often a loopback multi-node run is started again when its rendezvous port was taken first
PORT_TRIES = 3
USAGE = "%%ddplab [--nproc N] [--check] [--stall S] [--name VAR] [--limit COLLECTIVES]"


@dataclass(frozen=True)
class Options:
    nproc: int = 2
    check: bool = False
    stall_s: float | None = None
    name: str | None = None
    # end the job once a rank has issued more collectives than this (a fix-it's limit: in a notebook,
    # `--limit {fixit.limit("01")}`, which IPython expands, so the number comes from the reference run)
    limit: int | None = None


def parse(line: str) -> Options:
    """The magic's options, or one DdplabError naming the mistake and the usage."""
    try:
        words = shlex.split(line)
    except ValueError as e:
        raise DdplabError(f"cannot read the options ({e})", hint=USAGE) from None
    opts: dict = {}
    i = 0
    while i < len(words):
        w = words[i]
        flag, _, inline = w.partition("=") if w.startswith("--") else (w, "", "")
        if flag == "--check":
            if inline:
                raise DdplabError("--check takes no value", hint=USAGE)
            opts["check"] = True
            i += 1
            continue
        if flag not in ("--nproc", "--stall", "--name", "--limit"):
            raise DdplabError(f"unknown option {w!r}", hint=USAGE)
        if inline:
            value = inline
            i += 1
        else:
            if i + 1 >= len(words) or words[i + 1].startswith("--"):
                raise DdplabError(f"{flag} needs a value", hint=USAGE)
            value = words[i + 1]
            i += 2
        if flag == "--nproc":
            try:
                opts["nproc"] = int(value)
            except ValueError:
                raise DdplabError(f"--nproc must be a whole number, not {value!r}",
                                  hint="for example --nproc 2") from None
        elif flag == "--stall":
            try:
                opts["stall_s"] = float(value)
            except ValueError:
                raise DdplabError(f"--stall must be a number of seconds, not {value!r}",
                                  hint="for example --stall 3") from None
        elif flag == "--limit":
            try:
                opts["limit"] = int(value)
            except ValueError:
                opts["limit"] = 0
            if opts["limit"] < 1:
                raise DdplabError(f"--limit must be a whole number of collectives above 0, not {value!r}",
                                  hint='for example --limit 100, or --limit {fixit.limit("01")} for a fix-it')
        else:
            if not value.isidentifier() or keyword.iskeyword(value):
                raise DdplabError(f"--name {value!r} is not a Python variable name", hint="for example --name attempt")
            opts["name"] = value
    return Options(**opts)


def syntax_problem(source: str, filename: str = "<cell>") -> str | None:
    """The cell's syntax error as one line with its line number, or None. Nothing is run."""
    try:
        compile(source, filename, "exec")
    except SyntaxError as e:
        where = f"line {e.lineno}" if e.lineno else "the cell"
        text = (e.text or "").strip()
        return f"SyntaxError: {e.msg} ({where}{': ' + text if text else ''}); nothing was started"
    return None


def new_folder(name: str, run_root: str | Path | None = None) -> Path:
    """A folder of its own for one cell run (its script and its run folder), under the runs root."""
    from ddplab.origins.job import runs_root
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S-%f")
    folder = Path(run_root or runs_root()) / CELLS / f"{stamp}-{name}"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def run_source(source: str, name: str = "cell", *, nproc: int = 2, stall_s: float | None = None,
               check: bool = False, progress="auto", folder: Path | None = None, nodes: int = 1,
               max_collectives: int | None = None):
    """Run ``source`` as a torchrun script on ``nproc`` ranks (``ddplab.run``) and save it in the run
    folder. ``nodes`` > 1: that many torchrun agents on this machine's loopback, ``nproc`` ranks each
    (``ddplab.origins.cluster.LoopbackNodes``: RANK != LOCAL_RANK, no root needed). ``max_collectives``:
    ``ddplab.run``'s limit in collectives. A KeyboardInterrupt propagates after ddplab.run has ended
    the job; the interrupted run's result is then ``interrupted_result(folder)``."""
    from ddplab.front import run
    folder = folder or new_folder(name)
    script = folder / f"{name}.py"
    script.write_text(source)
    try:
        for tries in range(1, PORT_TRIES + 1):
            multi = {}
            if nodes > 1:
                from ddplab.origins.cluster import LoopbackNodes
                from ddplab.origins.ports import free_port
                multi = {"cluster": LoopbackNodes(nodes), "port": free_port()}
            result = run(script, nproc=nproc, stall_s=stall_s, check=check, progress=progress, run_root=folder,
                         max_collectives=max_collectives, **multi)
            # No rank started in a loopback multi-node run: the agents failed before any script ran. The
            # rendezvous port is chosen free, then bound by node 0's agent, and on a shared machine another
            # job can take it in between (seen: EADDRINUSE); or the agents, importing torch on a loaded
            # machine, met at the rendezvous after the stall window. ddplab's launch failing, not the
            # script: start it again.
            if not multi or result.status not in ("failed", "hung") or \
                    any(r.state != "not-started" for r in result.ranks):
                break
    except DdplabError:
        shutil.rmtree(folder, ignore_errors=True)   # refused before anything started: leave nothing
        raise
    except KeyboardInterrupt:
        for found in folder.glob("*/*/result.json"):
            shutil.copyfile(script, found.parent / SCRIPT)
        raise
    shutil.copyfile(script, Path(result.run_dir) / SCRIPT)
    return result


def interrupted_result(folder: Path):
    """The result ``ddplab.run`` saved for a run under ``folder`` before it re-raised KeyboardInterrupt."""
    from ddplab.result import RunResult
    found = sorted(folder.glob("*/*/result.json"))
    return RunResult.load(found[-1]) if found else None


def source_of(result) -> str | None:
    """The script a result ran, as this magic (or the fix-it grader) saved it in its run folder."""
    path = Path(result.run_dir) / SCRIPT
    return path.read_text() if path.exists() else None


def ddplab_cell(line: str, cell: str, shell=None) -> None:
    """The cell magic: see the module docstring."""
    from IPython import get_ipython
    from IPython.display import display
    shell = shell or get_ipython()
    ns = shell.user_ns if shell is not None else {}
    try:
        opts = parse(line)
    except DdplabError as e:
        _refused(ns, None, str(e))
        return
    problem = syntax_problem(cell)
    if problem:
        _refused(ns, opts.name, problem)
        return
    name = opts.name or "cell"
    folder = new_folder(name)
    try:
        result = run_source(cell, name, nproc=opts.nproc, stall_s=opts.stall_s, check=opts.check, folder=folder,
                            max_collectives=opts.limit)
    except DdplabError as e:
        _refused(ns, opts.name, str(e))
        return
    except KeyboardInterrupt:
        # ddplab.run ended the job and saved its result before re-raising: bind it and show it (where
        # each rank was), then let the interrupt stop the cell (and a "run all") as any interrupt
        # does, without the launcher's frames in the learner's view (a new interrupt, not re-raised)
        result = interrupted_result(folder)
        _bind(ns, opts.name, result)
        if result is not None:
            display(result)
        raise KeyboardInterrupt(f"the job was ended, nothing is left running; its result is "
                                f"{opts.name or DEFAULT_VAR}") from None
    _bind(ns, opts.name, result)
    display(result)


def _bind(ns: dict, name: str | None, value) -> None:
    ns[DEFAULT_VAR] = value
    if name:
        ns[name] = value


def _refused(ns: dict, name: str | None, message: str) -> None:
    _bind(ns, name, None)
    print(f"ddplab: {message}", file=sys.stderr)


def load_ipython_extension(ipython) -> None:
    """``%load_ext ddplab``: register ``%%ddplab``."""
    ipython.register_magic_function(lambda line, cell: ddplab_cell(line, cell, ipython), "cell", "ddplab")
