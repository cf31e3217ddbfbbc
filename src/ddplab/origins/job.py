"""The job and its command: resolve what the user asked for (one clear error for each mistake),
build the torchrun command line and the ranks' environment in one place (``build_command``, a
multi-node job's included; accelerate's ``get_launch_command``), the environment a copy (the
caller's is never touched).
"""
from __future__ import annotations

import datetime as _dt
import os
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import psutil

from ddplab.origins import catalog
from ddplab.rank import ports
from ddplab import runfiles
from ddplab.defaults import DEFAULT_SCRIPT_DEADLINE_S, DEFAULT_STALL_S
from ddplab.origins.envutil import child_environment
from ddplab.errors import DdplabError

HOOK_DIR = Path(__file__).resolve().parents[1] / "rank" / "hook"
# Flight-recorder entries each rank keeps (a ring buffer; each read returns all of it, ~400 bytes an entry).
FR_BUFFER_SIZE = 2000


def runs_root(lab: bool = True) -> Path:
    """$DDPLAB_RUNS_DIR, else: for a lab (and the course's own cells) ``runs/`` in the clone where the
    labs are; for a user's script (``lab=False``) ``./runs`` of the working folder, beside the user,
    however ddplab was installed (an editable clone's runs/ is not the user's)."""
    if os.environ.get("DDPLAB_RUNS_DIR"):
        return Path(os.environ["DDPLAB_RUNS_DIR"])
    if lab and catalog.labs_dir().is_dir():
        return catalog.REPO_DIR / "runs"
    return Path.cwd() / "runs"


def max_nproc() -> int:
    """The most ranks that make sense here: 4 per CPU core (already 4x oversubscribed), at least 4."""
    return max(4, 4 * (os.cpu_count() or 1))


def _loopback_ifname() -> str | None:
    for name, addrs in psutil.net_if_addrs().items():
        if any(getattr(a, "address", None) == "127.0.0.1" for a in addrs):
            return name
    return None


@dataclass(frozen=True)
class Job:
    """A resolved, validated request: everything ``build_launch_command`` needs."""
    target: str                 # "01_hang" or the script path as given
    script: Path
    lab: catalog.Lab | None
    variant: str | None
    nproc: int
    stall_s: float
    deadline_s: float | None     # optional outer limit
    port: int                   # 0: let the rendezvous pick a free one
    host: str
    args: tuple[str, ...]
    run_dir: Path
    env: Mapping[str, str] = field(default_factory=dict)
    check: bool = False         # ddplab run --check: the rank hook records, ddplab.engine.check compares


def resolve(target: str | int | os.PathLike, variant: str | None, nproc: int | None, deadline_s: float | None,
            args: Sequence[str] = (), port: int | None = 0, host: str = "127.0.0.1",
            env: Mapping[str, str] | None = None, run_root: Path | None = None,
            stall_s: float | None = None, check: bool = False) -> Job:
    """Check every input a user can get wrong; raise DdplabError naming the fix."""
    lab = catalog.find_lab(target) if not isinstance(target, os.PathLike) else None
    if lab is not None:
        script = lab.path
        variant = variant or lab.default_variant
        lab.variant(variant)  # raises with the list of variants
        name = lab.id
        script_args = ("--variant", variant, *args)
        nproc = lab.nproc if nproc is None else nproc
        stall_s = lab.stall_s if stall_s is None else stall_s
    else:
        script = Path(target)
        if not script.exists():
            known = ", ".join(l.number for l in catalog.labs())
            if str(target).endswith(".py") or os.sep in str(target):
                raise DdplabError(f"no such script: {target}", hint="check the path (it is relative to the current folder)")
            raise DdplabError(f"unknown lab '{target}'",
                              hint=f"run `ddplab list` to see the labs ({known}), or pass the path of a script")
        if script.is_dir() or script.suffix != ".py":
            raise DdplabError(f"{target} is not a Python script", hint="pass a .py file that torchrun can run")
        if variant is not None:
            raise DdplabError("--variant is for labs", hint=f"pass the script's own flags after `--` instead (ddplab run {target} -- ...)")
        name = script.stem
        script_args = tuple(args)
        nproc = 2 if nproc is None else nproc
        deadline_s = DEFAULT_SCRIPT_DEADLINE_S if deadline_s is None else deadline_s
    stall_s = DEFAULT_STALL_S if stall_s is None else stall_s
    if not isinstance(nproc, int) or isinstance(nproc, bool):
        raise DdplabError(f"--nproc must be a whole number, not {nproc!r}", hint="for example --nproc 2")
    low = lab.min_nproc if lab else 1
    if nproc < low:
        raise DdplabError(f"--nproc {nproc} is too few for {name}", hint=f"use --nproc {max(low, 2)} (it needs at least {low} ranks)")
    if nproc > max_nproc():
        raise DdplabError(f"--nproc {nproc} is more ranks than this machine can run sensibly ({os.cpu_count()} CPU cores)",
                          hint=f"use --nproc {min(2, max_nproc())} (at most {max_nproc()} here)")
    stall_s = seconds(stall_s, "--stall", "for example --stall 3")
    if deadline_s is not None:
        deadline_s = seconds(deadline_s, "--deadline", "for example --deadline 600, or leave it out")
    port = 0 if port is None else int(port)
    if not 0 <= port <= 65535:
        raise DdplabError(f"--port {port} is not a TCP port", hint="use 0 to pick a free one, or 1024-65535")
    if port:
        st = ports.check_port(port, host)
        if not st.free:
            raise DdplabError(st.describe(), hint="pass --port 0 to pick a free one")
    run_dir = new_run_dir(Path(run_root or runs_root(lab=lab is not None)) / name, variant or "run")
    return Job(name, script, lab, variant, nproc, stall_s, deadline_s, port, host, script_args, run_dir, dict(env or {}),
               bool(check))


_ISSUED: set[Path] = set()        # run folders this process has named (two jobs may start in one millisecond)
_ISSUED_LOCK = threading.Lock()


def new_run_dir(folder: Path, suffix: str) -> Path:
    """A run's own folder under ``folder``, named by the time it started (to the millisecond); a second
    run named in the same millisecond (two jobs started together: lab 05's pair) gets "-2", and so on,
    never the first one's folder."""
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S-%f")[:-3]
    with _ISSUED_LOCK:
        path, n = folder / f"{stamp}-{suffix}", 1
        while path in _ISSUED or path.exists():
            n += 1
            path = folder / f"{stamp}-{suffix}-{n}"
        _ISSUED.add(path)
    return path


def seconds(value: object, flag: str, hint: str) -> float:
    """A user's number of seconds, more than 0, or a DdplabError naming the flag and an example."""
    try:
        out = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise DdplabError(f"{flag} must be a number of seconds, not {value!r}", hint=hint) from None
    if not out > 0:
        raise DdplabError(f"{flag} must be more than 0 seconds (got {out:g})", hint=hint)
    return out


def build_command(job: Job, cluster=None) -> tuple[list[str], dict[str, str], dict | None]:
    """The job's parent command, its environment and, for a multi-node job on ``cluster``, the
    spec its parent reads (``runfiles.CLUSTER``; None for a single-node job)."""
    if cluster is None:
        return build_launch_command(job), launch_environment(job), None
    cmd, spec = build_cluster_command(job, cluster)
    return cmd, launch_environment(job, nodes=len(cluster.members)), spec


def build_launch_command(job: Job) -> list[str]:
    """The torchrun command line, built in one place (accelerate's ``get_launch_command``)."""
    return torchrun_command(job, job.run_dir / runfiles.TORCHRUN, nnodes=1, endpoint=f"{job.host}:{job.port}",
                            local_addr=job.host)


def torchrun_command(job: Job, result: Path, nnodes: int, endpoint: str, local_addr: str,
                     rdzv_conf: str | None = None, nproc: int | None = None) -> list[str]:
    """One torchrun agent's command line (all of a single-node job; one node's share of a
    multi-node job, ``build_cluster_command``)."""
    return [
        # torchrun itself (torch.distributed.run), with its outcome also written as data.
        sys.executable, "-m", "ddplab.origins._torchrun", str(result),
        # torchrun's defaults (one node, no restarts) are left to torchrun (ddplab.origins.parity)
        *(["--nnodes", str(nnodes)] if nnodes != 1 else []),
        "--nproc-per-node", str(job.nproc if nproc is None else nproc),
        # c10d rendezvous on loopback (or node 0's address); port 0 lets the store bind a free port
        # itself (no race).
        "--rdzv-backend", "c10d",
        "--rdzv-endpoint", endpoint,
        *(["--rdzv-conf", rdzv_conf] if rdzv_conf else []),
        "--rdzv-id", job.run_dir.name,
        # The address this agent gives its workers as MASTER_ADDR when it hosts the store.
        "--local-addr", local_addr,
        # Each rank's stdout and stderr in its own file under the run directory.
        "--log-dir", str(job.run_dir / runfiles.TORCHRUN_LOGS),
        "--redirects", "3",
        str(job.script), *job.args,
    ]


# The rendezvous port of a multi-node job: fixed, since node 0's agent must be told it before it
# binds (the other nodes dial it), and each cluster has its own addresses so nothing else holds it.
CLUSTER_RDZV_PORT = 29400


def build_cluster_command(job: Job, cluster) -> tuple[list[str], dict]:
    """A multi-node job on a ``ddplab.origins.cluster.Cluster``: the parent command (``python -m
    ddplab.origins.cluster agents SPEC``) and its spec, one torchrun agent per node (``--nnodes N``, c10d
    rendezvous at node 0's address), each started in its node's namespace with its hostname."""
    endpoint = f"{cluster.master.address}:{job.port or CLUSTER_RDZV_PORT}"
    nodes = []
    for node in cluster.members:
        result = job.run_dir / runfiles.node_torchrun(node.index)
        # is_host: node 0 hosts the rendezvous store because we say so, not because its hostname
        # resolves to the endpoint's address (with Debian's "127.0.1.1 <hostname>" line it would not,
        # and every agent would wait for a store nobody serves).
        nproc = cluster.nproc_of(node.index, job.nproc)       # a node launched unlike the others (lab 09)
        cmd = node.exec_prefix() + torchrun_command(job, result, len(cluster.members), endpoint, node.address,
                                                    rdzv_conf=f"is_host={int(node.index == 0)}", nproc=nproc)
        nodes.append({"index": node.index, "command": cmd, "result": str(result), "nproc": nproc,
                      "log": str(job.run_dir / runfiles.node_log(node.index))})
    spec = {"result": str(job.run_dir / runfiles.TORCHRUN), "nodes": nodes, "cluster": cluster.describe(),
            "ranks_dir": str(job.run_dir / runfiles.RANKS), "nproc_per_node": job.nproc}
    return [sys.executable, "-m", "ddplab.origins.cluster", "agents", str(job.run_dir / runfiles.CLUSTER)], spec


def launch_environment(job: Job, nodes: int = 1) -> dict[str, str]:
    """The ranks' environment (a copy): the caller's, plus what ``ddplab.origins.parity`` lists for
    this job and nothing else (a user's script gets torchrun's environment with ddplab's evidence
    channels; a lab keeps the settings it was measured with). On a multi-node job (``nodes`` > 1,
    every node on this machine) each rank's share of the cores counts every node's ranks, and the
    host's interface names mean nothing on a node: gloo's interface is the job's own choice, or gloo's."""
    cores = os.cpu_count() or 1
    changes: dict[str, object] = {
        "DDPLAB_RUN_DIR": str(job.run_dir),
        # The rank hook (faulthandler on SIGUSR1, pid file) goes first on the ranks' path; in each
        # rank it takes itself off sys.path and PYTHONPATH again before the script starts.
        "PYTHONPATH": os.pathsep.join([str(HOOK_DIR), *filter(None, [os.environ.get("PYTHONPATH")])]),
        # The rank hook starts torch's worker server on a socket here (a short path: AF_UNIX paths
        # are limited to about 100 bytes, and run directories can be deep).
        "DDPLAB_SOCKET_DIR": str(socket_dir(job.run_dir)),
        "DDPLAB_RANK_PID": None,
    }
    if "TORCH_FR_BUFFER_SIZE" not in os.environ:
        changes["TORCH_FR_BUFFER_SIZE"] = FR_BUFFER_SIZE   # torch's flight recorder: the collective ledger
    if True:
        # the settings the labs and the course's graders (%%ddplab cells: scripts to the launcher) were
        # measured with (ddplab.origins.parity); a user's script gets them too until every grader has
        # been measured without them (issue 43)
        changes["PYTHONUNBUFFERED"] = "1"
        changes["PYTHONFAULTHANDLER"] = None  # the hook enables faulthandler into the rank's stack file
        if "OMP_NUM_THREADS" not in os.environ:
            # torchrun would set 1 with a warning banner; give each rank its share of the cores instead.
            changes["OMP_NUM_THREADS"] = max(1, cores // (job.nproc * nodes))
        if nodes == 1 and job.host.startswith("127.") and "GLOO_SOCKET_IFNAME" not in os.environ:
            ifname = _loopback_ifname()
            if ifname:
                changes["GLOO_SOCKET_IFNAME"] = ifname  # gloo would otherwise pick the hostname's interface
    if nodes > 1:
        changes["GLOO_SOCKET_IFNAME"] = None
    if job.check:
        from ddplab.engine.check import ENV, EVERY
        changes[ENV] = EVERY          # the checksum interval, read by the rank hook
    changes.update(job.env)
    return child_environment(changes)




def socket_dir(run_dir: Path | str) -> Path:
    """Where a run's ranks put their worker-server sockets: a short folder of its own under the temp
    dir, named after the run directory. The launcher removes it when the run's processes are gone."""
    import hashlib
    import tempfile
    digest = hashlib.sha1(str(run_dir).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"ddplab-{digest}"
