"""``ddplab list | run | attach | explain | doctor``: the command line.

User mistakes (DdplabError) become one line on stderr and exit status 2, never a traceback.
Exit status of ``run``: 0 ok, 1 the job failed, 3 it hung (no rank made progress for the stall
window), 4 still making progress at the optional --deadline, 130 Ctrl-C.
``attach``: 3 hung, 0 still making progress or ended while watched. ``explain``: as ``run``'s for
the merged verdict; 2 for folders that hold no evidence, come from two jobs, or a cut-short dump.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
import os
import signal
import sys

from ddplab.origins import catalog
from ddplab.defaults import DEFAULT_SCRIPT_DEADLINE_S, DEFAULT_STALL_S, DEFAULT_WATCH_S, TORCHRUN_PORT, Status
from ddplab.errors import (EXIT_DEADLINE, EXIT_HUNG, EXIT_INTERRUPTED, EXIT_OK, EXIT_RUN_FAILED, EXIT_USAGE,
                     DdplabError)

STATUS_EXIT = {Status.OK: EXIT_OK, Status.FAILED: EXIT_RUN_FAILED, Status.HUNG: EXIT_HUNG,
               Status.DEADLINE: EXIT_DEADLINE, Status.INTERRUPTED: EXIT_INTERRUPTED, Status.RUNNING: EXIT_OK,
               Status.EXITED: EXIT_OK}


class _Parser(argparse.ArgumentParser):
    """argparse that reports bad usage on one line with the fix, exit 2 (as DdplabError does)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"ddplab: {message}: see `{self.prog} --help`\n")


def _cmd_list(a: argparse.Namespace) -> int:
    labs = catalog.labs()
    if not labs and not a.json:
        # an installed wheel carries the engine, not the labs: say where they are
        print(f"No labs here: {catalog.labs_dir()} holds none. An installed ddplab carries the engine, not the "
              f"labs: they are the labs/ folder of a clone of the ddplab repository (make workbook there), or set "
              f"DDPLAB_LABS_DIR to a clone's labs/ folder.\nYour own script needs no lab: "
              f"ddplab run path/to/train.py --nproc 2")
        return EXIT_OK
    if a.json:
        print(json.dumps([l.to_dict() for l in labs], indent=2))
        return EXIT_OK
    print(f"{'lab':<4} {'title':<62} variants")
    for l in labs:
        print(f"{l.number:<4} {l.title[:62]:<62} {', '.join(v.name for v in l.variants)}")
    print("\nRun one: ddplab run 01 --variant broken    Your own script: ddplab run path/to/train.py --nproc 2")
    return EXIT_OK


def _command_started() -> float | None:
    """When this command started (its process's creation, as the user's clock counts it: Python's
    start and ddplab's import included), in seconds since the epoch; None where psutil cannot say."""
    try:
        import psutil
        return psutil.Process().create_time()
    except Exception:   # noqa: BLE001 - the headline then counts from the run's start
        return None


def _cmd_run(a: argparse.Namespace) -> int:
    from ddplab.front import run

    try:
        r = run(a.target, variant=a.variant, nproc=a.nproc, deadline_s=a.deadline, stall_s=a.stall,
                args=a.script_args, port=a.port, stream=not a.json and not a.quiet,
                progress=None if a.json else "auto", check=a.check, started_at=_command_started())
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    return _show(r, a.json)


def _show(r, as_json: bool) -> int:
    if as_json:
        from ddplab.engine import groups
        print(json.dumps(r.to_dict() | {"groups": groups.to_dicts(r)}, indent=2, default=str))
    else:
        print(r.explain())
    return STATUS_EXIT[r.status]


def _cmd_attach(a: argparse.Namespace) -> int:
    from ddplab.origins.attach import attach
    from ddplab.views.progress import TerminalProgress

    show = TerminalProgress() if not a.json and sys.stderr.isatty() else None
    try:
        r = attach(a.pid, stall_s=a.stall, watch_s=a.watch, stop=a.stop, progress=show, save=a.save, force=a.force,
                   node=a.node)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    finally:
        if show is not None:
            show.close()
    return _show(r, a.json)


def _cmd_explain(a: argparse.Namespace) -> int:
    from ddplab.engine import groups
    from ddplab.views import render
    from ddplab.origins.explain import explain

    saved = [Path(f) for f in a.folders if (Path(f) / "result.json").is_file() and not (Path(f) / "node.json").exists()]
    if saved and len(saved) == len(a.folders) == 1:
        # a run folder ddplab run wrote: its saved result, shown again (nothing is judged anew)
        from ddplab.result import RunResult
        r = RunResult.load(saved[0])
    else:
        r = explain(a.folders)
    if a.json:
        print(json.dumps({**r.to_dict(), "first_divergence": groups.first_divergence(r)}, indent=2, default=str))
    else:
        line = render.divergence_line(r)
        print(r.explain() + (f"\n  {line}" if line else ""))
    return STATUS_EXIT[r.status]


def _cmd_doctor(a: argparse.Namespace) -> int:
    from ddplab.tools.doctor import doctor

    if a.preflight and a.serve:   # on the master node: answer the other nodes' network pre-flights
        from ddplab.tools.preflight import serve_network
        n = serve_network(a.port, clients=a.clients, ready=lambda p: print(f"serving the network pre-flight on "
                                                                          f"port {a.port} (data port {p})", flush=True))
        print(f"{n} of {a.clients} node(s) reached the data port")
        return EXIT_OK if n >= a.clients else EXIT_RUN_FAILED
    if a.preflight and a.network:  # on every other node: hostname, rendezvous port, a random data port
        from ddplab.tools.preflight import network_check
        nc = network_check(a.master_addr, a.port)
        print(json.dumps(nc.to_dict(), indent=2) if a.json else nc.explain())
        return EXIT_OK if nc.ok else EXIT_RUN_FAILED
    report = doctor(port=a.port)
    pf = None
    if a.preflight:   # before a multi-node run: master reachable, port usable, ranks agree (runs --nproc ranks)
        from ddplab.tools.preflight import preflight
        pf = preflight(a.master_addr, a.port, nproc=a.nproc)
    if a.json:
        print(json.dumps(report.to_dict() | ({"preflight": pf.to_dict()} if pf else {}), indent=2, default=str))
    else:
        print(report.text() + (f"\n{pf.explain()}" if pf else ""))
    return EXIT_OK if report.ok and (pf is None or pf.ok) else EXIT_RUN_FAILED


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="ddplab", description="Reproduce, diagnose and fix PyTorch data-parallel failures.")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser)

    pl = sub.add_parser("list", help="the labs and their variants")
    pl.add_argument("--json", action="store_true", help="print the catalog as JSON")
    pl.set_defaults(func=_cmd_list)

    pr = sub.add_parser("run", help="run a lab or your own script under torchrun, judged by progress, with a diagnosis",
                        description="Run LAB (number or name, see `ddplab list`) or SCRIPT (any torchrun-able .py). "
                                    "Arguments after `--` go to the script.",
                        usage="ddplab run LAB|SCRIPT [--variant V] [--nproc N] [--stall S] [--deadline S] [--port P] [--check] [--json] [-- SCRIPT ARGS]")
    pr.add_argument("target", metavar="LAB|SCRIPT", help="lab number/name, or the path of a script")
    pr.add_argument("--variant", help="the lab's variant (see `ddplab list`); labs only")
    pr.add_argument("--nproc", type=int, default=None, help="number of ranks (default: the lab's, 2 for scripts)")
    pr.add_argument("--stall", type=float, default=None, metavar="S",
                    help="the job is hung when no rank makes progress (CPU, collectives, stack) for S seconds "
                         f"(default {DEFAULT_STALL_S:g}, or the lab's)")
    pr.add_argument("--deadline", type=float, default=None, metavar="S",
                    help="optional outer limit in seconds, for a job that keeps making progress "
                         f"(default: none for labs, {DEFAULT_SCRIPT_DEADLINE_S:.0f} for scripts)")
    pr.add_argument("--port", type=int, default=0, help="rendezvous port on 127.0.0.1 (default 0: a free one)")
    pr.add_argument("--json", action="store_true", help="print the RunResult as JSON (for scripts and CI)")
    pr.add_argument("--quiet", action="store_true", help="do not echo the ranks' output while running")
    pr.add_argument("--check", action="store_true",
                    help="after the run, compare the ranks' replicas, gradients and data (adds no collective): "
                         "'ok, but ...' when a job that ended ok trained the wrong model")
    pr.set_defaults(func=_cmd_run)

    pa = sub.add_parser("attach", help="diagnose a running torchrun job that ddplab did not start",
                        description="Find every rank of the job (PID: torchrun's or any rank's) through the process "
                                    "tree, watch its progress, and say where each rank is. The job keeps running "
                                    "unless --stop is given.")
    pa.add_argument("pid", type=int, metavar="PID", help="the pid of torchrun or of one of its ranks")
    pa.add_argument("--stall", type=float, default=None, metavar="S",
                    help=f"hung when no rank makes progress for S seconds while watched (default {DEFAULT_STALL_S:g})")
    pa.add_argument("--watch", type=float, default=DEFAULT_WATCH_S, metavar="S",
                    help=f"stop watching a job that keeps making progress after S seconds (default {DEFAULT_WATCH_S:g})")
    pa.add_argument("--stop", action="store_true", help="end the whole job after the diagnosis")
    pa.add_argument("--json", action="store_true", help="print the result as JSON")
    pa.add_argument("--save", metavar="DIR", default=None,
                    help="write what was found on this node (ranks, ledgers, stacks, errors, last output lines) to "
                         "DIR, for `ddplab explain` with the other nodes' folders")
    pa.add_argument("--force", action="store_true", help="with --save: replace DIR if it exists")
    pa.add_argument("--node", default=None, help="with --save: this node's name (default: the hostname)")
    pa.set_defaults(func=_cmd_attach)

    pe = sub.add_parser("explain", help="one diagnosis from every node's `attach --save` folder, or torch's dumps",
                        description="Merge the folders `ddplab attach PID --save DIR` wrote on each node of one job "
                                    "into one diagnosis that names the node and rank where the collectives diverged "
                                    "first. A folder of torch's flight-recorder dumps ($TORCH_FR_DUMP_TEMP_FILE<rank>) "
                                    "works too, for a job that never ran under ddplab.")
    pe.add_argument("folders", nargs="+", metavar="DIR", help="the nodes' folders (or one folder of dumps)")
    pe.add_argument("--json", action="store_true", help="print the merged result as JSON")
    pe.set_defaults(func=_cmd_explain)

    pd = sub.add_parser("doctor", help="check this machine: torch, backends, GPUs, py-spy, cores, ports")
    pd.add_argument("--port", type=int, default=TORCHRUN_PORT,
                    help=f"the port to check (default {TORCHRUN_PORT}, torchrun's default)")
    pd.add_argument("--json", action="store_true", help="print the report as JSON")
    pd.add_argument("--preflight", action="store_true",
                    help="also the multi-node pre-flight: is --master-addr reachable, is --port open there, do "
                         "--nproc ranks started through the launcher agree on torch version and WORLD_SIZE")
    pd.add_argument("--master-addr", default="127.0.0.1", help="the MASTER_ADDR the pre-flight dials (default 127.0.0.1)")
    pd.add_argument("--nproc", type=int, default=2, help="ranks the pre-flight starts on this machine (default 2)")
    pd.add_argument("--network", action="store_true",
                    help="with --preflight, on each node but the master: does the hostname resolve to loopback, do "
                         "the rendezvous port and a random data port on --master-addr answer (needs --serve there)")
    pd.add_argument("--serve", action="store_true",
                    help="with --preflight, on the master node: answer the other nodes' --network pre-flights on --port")
    pd.add_argument("--clients", type=int, default=1, help="with --serve: how many nodes to wait for (default 1)")
    pd.set_defaults(func=_cmd_doctor)

    pc = sub.add_parser("classroom", help="instructors: does this machine hold N learners at once")
    csub = pc.add_subparsers(dest="classroom_cmd", required=True, parser_class=_Parser)
    pcc = csub.add_parser("check", help="memory and cores per learner, threads, ports, run folders, torch's debug server")
    pcc.add_argument("--learners", type=int, required=True, help="learners sharing this machine at once")
    pcc.add_argument("--json", action="store_true", help="print the facts as JSON")
    pcc.set_defaults(func=_cmd_classroom)
    pch = csub.add_parser("hub", help="as root: one account per learner and a JupyterHub for them (make classroom)")
    from ddplab.tools import hub
    hub.add_arguments(pch)
    pch.set_defaults(func=lambda a: hub.run_args(a))
    pcg = csub.add_parser("grade", help="collect the learners' fix-it notebooks and grade them (otter): a gradebook CSV")
    from ddplab.course import gradebook
    gradebook.add_arguments(pcg)
    pcg.set_defaults(func=lambda a: gradebook.run_args(a))
    return p


def _cmd_classroom(a: argparse.Namespace) -> int:
    from ddplab.tools.classroom import check

    c = check(a.learners)
    print(json.dumps(c.to_dict(), indent=2) if a.json else c.text())
    return EXIT_OK if c.holds else EXIT_RUN_FAILED


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # Everything after the first `--` belongs to the script, untouched by ddplab's own options.
    script_args: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, script_args = argv[:cut], argv[cut + 1:]
    args = build_parser().parse_args(argv)
    args.script_args = script_args
    # SIGTERM (a CI timeout, `kill`) ends the job the same way Ctrl-C does, so nothing is left.
    signal.signal(signal.SIGTERM, _raise_interrupt)
    # SIGINT too, even where it was inherited as ignored: a command started with `&` from a script
    # (or under a CI runner that does so) gets SIGINT set to SIG_IGN, and a ddplab run that ignores
    # Ctrl-C would leave its ranks running until the deadline. Seen in CI: SIGINT did nothing.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if script_args and args.cmd != "run":
        print(f"ddplab: arguments after -- are only for `ddplab run`: {' '.join(script_args)}", file=sys.stderr)
        return EXIT_USAGE
    try:
        return args.func(args)
    except DdplabError as e:
        print(f"ddplab: {e}", file=sys.stderr)
        return e.exit_code
    except BrokenPipeError:
        # `ddplab ... | head`: the reader left. Anything the command started has already ended (every
        # run ends its job in a finally); say nothing more, and keep Python from a second error at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
