"""A learner as the browser is one, without the browser: the hub's REST API (a token, a server), the Jupyter
server's REST API (contents, sessions, kernels) and the kernel's websocket (execute requests, the replies and
outputs of each), through the hub's proxy. Shared by tests/test_hub.py and tests/test_browser.py."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import psutil

# Limits that only end a wait that never ends (a loaded machine is slow, not stuck).
SERVER_S = 300
CELL_S = 600


def call(url: str, token: str, method: str = "GET", body=None, timeout: float = 60):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, method=method, data=data,
                                 headers={"Authorization": f"token {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        raw = r.read()
        return r.status, (json.loads(raw) if raw else None)


def start_hub(learners: int, prefix: str, state: Path, log: Path) -> subprocess.Popen:
    """``ddplab classroom hub`` as make classroom runs it (its own session, as a terminal's foreground job
    would be); returns once its hub.json is written (the hub answers), or fails with its output."""
    out = open(log, "wb")
    proc = subprocess.Popen([sys.executable, "-m", "ddplab.tools.hub", "--learners", str(learners),
                             "--prefix", prefix, "--port", "0", "--state", str(state)],
                            stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    out.close()
    while not (state / "hub.json").exists():
        if proc.poll() is not None:
            raise AssertionError(f"the hub launcher exited {proc.returncode}: {log.read_text()[-2000:]}")
        time.sleep(0.2)
    return proc


def stop_hub(proc: subprocess.Popen) -> int:
    """Ctrl-C, as the instructor's terminal sends it; the launcher's exit status."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    return proc.wait(timeout=300)


def remove_accounts(names: list[str]) -> None:
    for name in names:
        subprocess.run(["userdel", "--remove", name], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def processes_of(uid: int) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["uids", "status", "cmdline"]):
        if p.info["uids"] and p.info["uids"].real == uid and p.info["status"] != psutil.STATUS_ZOMBIE:
            out.append(p)
    return out


@dataclass
class Learner:
    hub_url: str
    name: str
    uid: int
    home: str
    token: str = ""
    server: str = ""            # the server's URL path, /user/NAME/
    kernel: str = ""
    ws: object = None
    session: str = field(default_factory=lambda: uuid.uuid4().hex)

    # ---- the hub: a token (as the instructor, admin), then the learner's own server -------------------
    def log_in(self, admin_token: str) -> None:
        _, tok = call(f"{self.hub_url}/hub/api/users/{self.name}/tokens", admin_token, "POST",
                      {"note": "ddplab test learner", "expires_in": 3600})
        self.token = tok["token"]

    def start_server(self) -> float:
        t0 = time.monotonic()
        try:
            call(f"{self.hub_url}/hub/api/users/{self.name}/server", self.token, "POST", {})
        except urllib.error.HTTPError as e:
            if e.code != 400:          # 400: already running
                raise
        while True:
            _, user = call(f"{self.hub_url}/hub/api/users/{self.name}", self.token)
            s = user["servers"].get("")
            if s and s.get("ready"):
                self.server = s["url"]
                return time.monotonic() - t0
            if time.monotonic() - t0 > SERVER_S:
                raise AssertionError(f"{self.name}'s server was not ready after {SERVER_S} s: {user}")
            time.sleep(0.5)

    def api(self, path: str, method: str = "GET", body=None):
        return call(f"{self.hub_url}{self.server}api/{path}", self.token, method, body)[1]

    # ---- the notebook, a kernel and its websocket, as JupyterLab opens them --------------------------
    def notebook(self, path: str) -> dict:
        return self.api(f"contents/{path}")["content"]

    def open_kernel(self, path: str) -> str:
        import websocket
        s = self.api("sessions", "POST", {"path": path, "type": "notebook", "name": path,
                                          "kernel": {"name": "python3"}})
        self.kernel = s["kernel"]["id"]
        ws_url = self.hub_url.replace("http", "ws", 1) + f"{self.server}api/kernels/{self.kernel}/channels"
        self.ws = websocket.create_connection(f"{ws_url}?session_id={self.session}",
                                              header=[f"Authorization: token {self.token}"], timeout=CELL_S)
        self.execute("1")         # the kernel answers
        return self.kernel

    def send(self, code: str) -> str:
        msg_id = uuid.uuid4().hex
        self.ws.send(json.dumps({
            "header": {"msg_id": msg_id, "username": self.name, "session": self.session,
                       "msg_type": "execute_request", "version": "5.3"},
            "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
            "content": {"code": code, "silent": False, "store_history": True, "user_expressions": {},
                        "allow_stdin": False, "stop_on_error": True}}))
        return msg_id

    def wait(self, msg_id: str) -> dict:
        """The reply to ``msg_id`` and what the cell showed: {"status", "stdout", "outputs", "error"}."""
        out = {"status": None, "stdout": "", "outputs": [], "error": None}
        idle = False
        while out["status"] is None or not idle:
            m = json.loads(self.ws.recv())
            if m.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind, content = m["header"]["msg_type"], m["content"]
            if kind == "stream" and content["name"] == "stdout":
                out["stdout"] += content["text"]
            elif kind in ("execute_result", "display_data"):
                out["outputs"].append(content["data"])
            elif kind == "error":
                out["error"] = content["ename"]
            elif kind == "status" and content["execution_state"] == "idle":
                idle = True
            elif kind == "execute_reply":
                out["status"] = content["status"]
                out["error"] = out["error"] or content.get("ename")
        return out

    def execute(self, code: str) -> dict:
        return self.wait(self.send(code))

    def value(self, expr: str):
        """A JSON value computed in the kernel (facts as data, never a display parsed back)."""
        r = self.execute(f"import json as _j; print('\\x1e' + _j.dumps({expr}))")
        assert r["status"] == "ok", (self.name, expr, r)
        return json.loads(r["stdout"].rsplit("\x1e", 1)[1])

    def interrupt(self) -> None:
        self.api(f"kernels/{self.kernel}/interrupt", "POST", {})

    def restart(self) -> None:
        self.api(f"kernels/{self.kernel}/restart", "POST", {})

    def save(self, path: str, nb: dict) -> None:
        self.api(f"contents/{path}", "PUT", {"type": "notebook", "format": "json", "content": nb})

    def close(self) -> None:
        if self.ws is not None:
            try:
                self.ws.close()
            except Exception:
                pass


def kernel_pid(uid: int) -> int | None:
    for p in processes_of(uid):
        if any("ipykernel" in a for a in (p.info["cmdline"] or [])):
            return p.pid
    return None


def env_of(p: psutil.Process) -> dict:
    try:
        return p.environ()
    except psutil.Error:
        return {}

