"""``make classroom`` (``ddplab classroom hub --learners N``): a JupyterHub for N learners on this machine.

As root, in order, each step refusing in one line with the next step when it cannot go on:

1. the head count against what ``ddplab classroom check`` says this machine holds (its ``most_learners``),
   with the environment every learner's server gets (OMP_NUM_THREADS=1, a runs folder each);
2. the tools: root, useradd, setfacl, configurable-http-proxy (npm's, in build/tools), JupyterHub (PyPI);
3. one Unix account per learner (``learner1`` ... ``learnerN``, group ``ddplab-learners``, home 0700, shell
   nologin, a fresh password each start, a copy of notebooks/ in ``~/ddplab`` made once so their work stays);
4. the learners' reach to the workbook installed once for all (the repository's .venv and the Python it was
   made from): the group gets traverse (x, an ACL) on each folder above them that others may not cross, and
   one learner is checked to import ddplab and JupyterHub as themselves;
5. JupyterHub with ``classroom/jupyterhub_config.py`` (the ports and the learners in DDPLAB_HUB_* variables),
   until it answers on its URL; then the URL and the accounts are printed, and written with the instructor's
   API token to ``build/classroom/hub.json`` (0600; facts as data, for the tests and the gradebook).

Ctrl-C (or SIGTERM) stops the hub, which stops every learner's server and the proxy; then every process still
owned by a learner account, and anything the hub started, is ended and counted, so nothing is left running.
"""
from __future__ import annotations

import argparse
import grp
import json
import os
import pwd
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

from ddplab.errors import DdplabError
from ddplab.tools import system

ROOT = Path(__file__).resolve().parents[3]
CONFIG = ROOT / "classroom" / "jupyterhub_config.py"
STATE = ROOT / "build" / "classroom"
NOTEBOOKS = ROOT / "notebooks"
PREFIX = "learner"                 # learner accounts: learner1 ... learnerN
GROUP = "ddplab-learners"          # every learner account's group (the ACLs name it)
PORT = 8000                        # the learners' URL: http://127.0.0.1:8000 unless told
NOTEBOOKS_DIR = "ddplab"           # each learner's copy of notebooks/, in their home
RUNS_DIR = "ddplab-runs"           # each learner's DDPLAB_RUNS_DIR, in their home
STATE_FILE = "hub.json"
MARK = "DDPLAB_HUB_STATE"          # in the hub's environment and its proxy's: how the stop finds them
# waits that only end a start or a stop that never comes (a loaded machine is slow, not stuck)
START_S = 180
STOP_S = 60


@dataclass(frozen=True)
class Account:
    name: str
    password: str
    uid: int
    home: str


@dataclass
class Hub:
    url: str
    api_token: str
    pid: int
    state: str
    learners: list[Account]
    ports: dict = field(default_factory=dict)
    reach: list[str] = field(default_factory=list)      # folders the learners' group got traverse on

    @property
    def api_url(self) -> str:
        return self.url.rstrip("/") + "/hub/api"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["api_url"] = self.api_url
        return d

    @classmethod
    def load(cls, state: Path | str = STATE) -> "Hub":
        d = json.loads((Path(state) / STATE_FILE).read_text())
        d.pop("api_url", None)
        d["learners"] = [Account(**a) for a in d["learners"]]
        return cls(**d)


def server_env(home: str) -> dict:
    """The environment every learner's server gets beyond JupyterHub's own (the config sets it)."""
    return {"OMP_NUM_THREADS": "1", "DDPLAB_RUNS_DIR": f"{home}/{RUNS_DIR}"}


def refuse_too_many(learners: int) -> int:
    """The machine's figure for ``learners`` learners with the classroom's environment: the most it holds,
    or a DdplabError naming that figure when the head count is past it."""
    from ddplab.tools import classroom
    c = classroom.check(learners, env={**os.environ, **server_env("/home/" + PREFIX)})
    most = c.facts["most_learners"]
    if learners > most:
        raise DdplabError(
            f"{learners} learners are more than this machine holds: at most {most} "
            f"(by memory {c.facts['most_by_memory']}, by cores {c.facts['most_by_cores']}; "
            f"ddplab classroom check --learners {learners})",
            hint=f"--learners {most} (LEARNERS={most} for make classroom), or pairs sharing a notebook")
    return most


def needs() -> list[system.Need]:
    """What this machine lacks for the hub: the classroom part's tools, root, JupyterHub."""
    out = list(system.missing(system.PARTS["classroom"][1]))
    if not (sys.platform == "linux" and os.geteuid() == 0):
        out.insert(0, system.Need("root (one Unix account per learner)", "sudo make classroom"))
    try:
        import jupyterhub  # noqa: F401
    except ImportError:
        out.append(system.Need("jupyterhub", 'pip install -e ".[classroom]" (make classroom does it)'))
    return out


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=False, capture_output=True, text=True, **kw)


def _must(cmd: list[str], what: str, **kw) -> None:
    r = _run(cmd, **kw)
    if r.returncode != 0:
        raise DdplabError(f"{what}: {' '.join(cmd[:3])} exited {r.returncode}: {(r.stderr or r.stdout).strip()[-300:]}",
                          hint="run make classroom as root on Linux")


def make_accounts(learners: int, prefix: str = PREFIX) -> list[Account]:
    """One Unix account per learner (made once, reused after), each with a fresh password, its home 0700
    and its own copy of notebooks/ (made once: a learner's work stays across hub starts)."""
    tool = lambda t: system.where(t) or t   # noqa: E731
    try:
        grp.getgrnam(GROUP)
    except KeyError:
        r = _run([tool("groupadd"), "--system", GROUP])
        try:
            grp.getgrnam(GROUP)      # made now (or by another start at the same moment)
        except KeyError:
            raise DdplabError(f"could not make the group {GROUP}: {r.stderr.strip()[-300:]}",
                              hint="run make classroom as root on Linux") from None
    gid = grp.getgrnam(GROUP).gr_gid
    out = []
    for i in range(1, learners + 1):
        name = f"{prefix}{i}"
        try:
            pw = pwd.getpwnam(name)
            if pw.pw_gid != gid and name not in grp.getgrnam(GROUP).gr_mem:
                raise DdplabError(f"the account {name} exists and is not a ddplab learner (not in {GROUP})",
                                  hint="pass --prefix with another name for the learner accounts")
        except KeyError:
            _must([tool("useradd"), "--create-home", "--shell", "/usr/sbin/nologin", "--gid", GROUP, name],
                  f"could not make the account {name}")
            pw = pwd.getpwnam(name)
        os.chmod(pw.pw_dir, 0o700)
        password = secrets.token_urlsafe(9)
        _must([tool("chpasswd")], f"could not set {name}'s password", input=f"{name}:{password}\n")
        work = Path(pw.pw_dir) / NOTEBOOKS_DIR
        if not work.exists():
            shutil.copytree(NOTEBOOKS, work)
        for path in [work, *work.rglob("*")]:
            os.chown(path, pw.pw_uid, pw.pw_gid)
        out.append(Account(name, password, pw.pw_uid, pw.pw_dir))
    return out


def grant_reach(accounts: list[Account], venv: Path) -> list[str]:
    """Every folder above the workbook's interpreter and the repository that others may not cross gets
    traverse (x) for the learners' group (an ACL: nothing else changes). Then one learner imports ddplab and
    JupyterHub as themselves, or a DdplabError says what they cannot reach."""
    targets = [Path(os.path.realpath(venv / "bin" / "python")).parent, ROOT, venv]
    changed = []
    for target in targets:
        for folder in [*reversed(target.parents), target]:
            mode = folder.stat().st_mode
            if mode & stat.S_IXOTH or str(folder) in changed:
                continue
            _must([system.where("setfacl") or "setfacl", "-m", f"g:{GROUP}:x", str(folder)],
                  f"could not let the learners cross {folder}")
            changed.append(str(folder))
    who = accounts[0].name
    r = _run([system.where("runuser") or "runuser", "-u", who, "--", str(venv / "bin" / "python"), "-c",
              "import ddplab, jupyterhub, jupyterlab"], cwd="/")
    if r.returncode != 0:
        raise DdplabError(f"the learner {who} cannot use the workbook in {venv}: {r.stderr.strip()[-300:]}",
                          hint="clone and `make install` where every account may read (e.g. /srv), "
                               "with umask 022")
    return changed


def _free_port(ip: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((ip, 0))
        return s.getsockname()[1]


def _port_taken(ip: str, port: int) -> str | None:
    """None when ``port`` is free on ``ip``, else who holds it, as a phrase."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((ip, port))
            return None
        except OSError:
            pass
    try:
        pids = {c.pid for c in psutil.net_connections("tcp")
                if c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN and c.pid}
    except (psutil.Error, OSError):
        pids = set()
    return f"port {port} is taken" + (f" by pid {', '.join(map(str, sorted(pids)))}" if pids else "")


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


def start(accounts: list[Account], *, ip: str = "127.0.0.1", port: int = PORT, state: Path = STATE,
          venv: Path | None = None, reach: list[str] | None = None) -> tuple[Hub, subprocess.Popen]:
    """JupyterHub with the repository's configuration for ``accounts``, until its URL answers."""
    venv = Path(venv or sys.prefix)
    proxy = system.where("configurable-http-proxy")
    if proxy is None:
        raise DdplabError(str(next(n for n in system.missing(["configurable-http-proxy"]))),
                          hint="make classroom installs it with npm")
    if port:
        taken = _port_taken(ip, port)
        if taken:
            raise DdplabError(f"{taken}: the hub cannot listen on {ip}:{port}",
                              hint="pass --port 0 (PORT=0 for make classroom) for a free one")
    else:
        port = _free_port(ip)
    state = Path(state)
    state.mkdir(parents=True, exist_ok=True)
    os.chmod(state, 0o700)
    ports = {"hub": port, "hub_api": _free_port(), "proxy_api": _free_port()}
    token = secrets.token_hex(32)
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_PORT", "MASTER_ADDR")}
    env.update({MARK: str(state), "DDPLAB_HUB_IP": ip, "DDPLAB_HUB_PORT": str(port),
                "DDPLAB_HUB_API_PORT": str(ports["hub_api"]), "DDPLAB_HUB_PROXY_API_PORT": str(ports["proxy_api"]),
                "DDPLAB_HUB_PROXY": proxy, "DDPLAB_HUB_VENV": str(venv),
                "DDPLAB_HUB_LEARNERS": ",".join(a.name for a in accounts), "DDPLAB_HUB_API_TOKEN": token})
    log = open(state / "jupyterhub.log", "ab")
    proc = subprocess.Popen([str(venv / "bin" / "python"), "-m", "jupyterhub", "-f", str(CONFIG)], cwd=state,
                            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    log.close()
    host = "127.0.0.1" if ip in ("0.0.0.0", "", "::") else ip
    url = f"http://{host}:{port}"
    hub = Hub(url, token, proc.pid, str(state), list(accounts), ports, list(reach or []))
    end = time.monotonic() + START_S
    while not _answers(f"{hub.api_url}/"):
        if proc.poll() is not None or time.monotonic() > end:
            stop(hub, proc)
            tail = (state / "jupyterhub.log").read_text(errors="replace")[-1500:]
            raise DdplabError(f"JupyterHub did not come up (exit {proc.returncode}); its log ends:\n{tail}",
                              hint=f"read {state / 'jupyterhub.log'}")
        time.sleep(0.2)
    path = state / STATE_FILE
    path.touch(mode=0o600)
    path.write_text(json.dumps(hub.to_dict(), indent=2))
    return hub, proc


def _ours(state: str, uids: set[int]) -> list[psutil.Process]:
    """Every live process a learner account owns, and every one the hub started (its environment's mark)."""
    found = []
    for p in psutil.process_iter(["pid", "uids", "status"]):
        if p.pid == os.getpid() or p.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        try:
            if (p.info["uids"] and p.info["uids"].real in uids) or p.environ().get(MARK) == state:
                found.append(p)
        except psutil.Error:
            pass
    return found


def end_processes(procs: list, grace_s: float = 10) -> None:
    """SIGTERM to each of ``procs``, ``grace_s`` for them to go, then SIGKILL to what is left."""
    for p in procs:
        try:
            p.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=10)


def stop(hub: Hub, proc: subprocess.Popen) -> dict:
    """Stop the hub (it stops every learner's server and the proxy), then end whatever a learner account or
    the hub still runs. Returns the facts: the hub's exit code and the processes that had to be ended."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    uids = {a.uid for a in hub.learners}
    left = _ours(hub.state, uids)
    swept = []
    for p in left:
        try:
            swept.append({"pid": p.pid, "name": p.name(), "uid": p.uids().real})
        except psutil.Error:
            pass          # gone by itself meanwhile
    end_processes(left)
    still = [p.pid for p in _ours(hub.state, uids)]
    return {"hub_exit": proc.returncode, "swept": swept, "left": still}


def _print_accounts(hub: Hub) -> None:
    n = len(hub.learners)
    print(f"JupyterHub for {n} learner{'s' if n != 1 else ''}: {hub.url}", flush=True)
    width = max(len(a.name) for a in hub.learners)
    print(f"  {'account':<{width}}  password", flush=True)
    for a in hub.learners:
        print(f"  {a.name:<{width}}  {a.password}", flush=True)
    if hub.reach:
        print(f"the learners' group {GROUP} may cross (traverse only, an ACL): {', '.join(hub.reach)}", flush=True)
    print(f"(also in {Path(hub.state) / STATE_FILE}; Ctrl-C stops the hub, every learner's server and job)",
          flush=True)


def serve(learners: int, *, ip: str = "127.0.0.1", port: int = PORT, prefix: str = PREFIX,
          state: Path = STATE) -> int:
    refuse_too_many(learners)
    missing = needs()
    if missing:
        raise DdplabError(f"the classroom hub {'; '.join(str(n) for n in missing)}")
    venv = Path(sys.prefix)
    print(f"making {learners} learner account{'s' if learners != 1 else ''} ({prefix}1"
          + (f" ... {prefix}{learners})" if learners > 1 else ")"), flush=True)
    accounts = make_accounts(learners, prefix)
    reach = grant_reach(accounts, venv)
    print("starting JupyterHub", flush=True)
    hub, proc = start(accounts, ip=ip, port=port, state=state, venv=venv, reach=reach)
    _print_accounts(hub)
    code = 0
    try:
        proc.wait()
        print(f"JupyterHub exited by itself ({proc.returncode}): see {Path(state) / 'jupyterhub.log'}", flush=True)
        code = 1
    except KeyboardInterrupt:
        print("\nstopping the hub, every learner's server and job", flush=True)
    finally:
        done = stop(hub, proc)
        print(f"stopped: the hub exited {done['hub_exit']}; {len(done['swept'])} process(es) outlived it and were "
              f"ended; {len(done['left'])} left", flush=True)
    return code


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="ddplab classroom hub", description=__doc__.split("\n\n")[0])
    add_arguments(p)
    a = p.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    # Ctrl-C stops the hub even where the launcher was started with SIGINT ignored (a shell's background job,
    # a pytest-xdist worker's child: Python then installs no KeyboardInterrupt handler of its own)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return run_args(a)
    except DdplabError as e:
        print(f"ddplab: {e}", file=sys.stderr)
        return e.exit_code


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--learners", type=int, required=True, help="learner accounts, one server each")
    p.add_argument("--ip", default="127.0.0.1", help="where the hub listens (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=PORT, help=f"the hub's port (default {PORT}; 0: a free one)")
    p.add_argument("--prefix", default=PREFIX, help=f"learner account names: PREFIX1 ... (default {PREFIX})")
    p.add_argument("--state", type=Path, default=STATE, help="the hub's database, log and hub.json")


def run_args(a: argparse.Namespace) -> int:
    return serve(a.learners, ip=a.ip, port=a.port, prefix=a.prefix, state=a.state)


if __name__ == "__main__":
    sys.exit(main())
