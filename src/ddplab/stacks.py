"""Reading a rank's Python stack from outside the job, and saying what it waits in.

Two sources, innermost frame first in both: ``py-spy dump --json`` (attaches to the process, ~40 ms),
and the ``faulthandler`` dump that ddplab's rank hook writes on SIGUSR1 (works where py-spy may not
attach). ``where()`` turns a stack into the two facts a learner needs: the innermost line of *their*
code, and the collective (or other blocking call) the rank is in.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Frame:
    func: str
    file: str
    line: int

    def short(self) -> str:
        return f"{_short_path(self.file)}:{self.line} in {self.func}"

    def to_dict(self) -> dict:
        return {"func": self.func, "file": self.file, "line": self.line}


@dataclass(frozen=True)
class Where:
    """Where one rank stands: its own code's innermost frame and the call it blocks in."""
    user_frame: Frame | None
    waits_in: str | None      # "barrier", "all_reduce (DDP gradients, inside backward)", ...
    kind: str                 # "collective", "rendezvous", "store", "backward", "other"

    def to_dict(self) -> dict:
        return {"user_frame": self.user_frame.to_dict() if self.user_frame else None,
                "waits_in": self.waits_in, "kind": self.kind}


# torch.distributed functions that block until every rank joins. Names as they appear in stacks.
COLLECTIVES = {
    "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "all_to_all",
    "all_to_all_single", "barrier", "monitored_barrier", "broadcast", "broadcast_object_list",
    "reduce", "reduce_scatter", "reduce_scatter_tensor", "gather", "gather_object", "scatter",
    "scatter_object_list", "send", "recv", "isend", "irecv", "batch_isend_irecv", "all_reduce_coalesced",
    "all_gather_coalesced", "_all_gather_base", "_reduce_scatter_base", "wait",
}
# DDP's own collectives, which a learner never calls by name.
DDP_CALLS = {
    "_verify_param_shape_across_processes": "all_gather (DDP checks every rank has the same parameters)",
    "_sync_module_states": "broadcast (DDP copies rank 0's parameters to every rank)",
    "_sync_params_and_buffers": "broadcast (DDP copies rank 0's parameters to every rank)",
    "_sync_buffers": "broadcast (DDP syncs buffers before forward)",
    "_rebuild_buckets": "all_reduce (DDP rebuilds its gradient buckets)",
    "_check_global_requires_backward_grad_sync": "all_reduce (DDP Join: is any rank still training?)",
    "_match_all_reduce_for_bwd_pass": "all_reduce (Join shadows a finished rank's all-reduce)",
}
RENDEZVOUS_CALLS = {"init_process_group", "rendezvous", "_create_c10d_store", "_env_rendezvous_handler",
                    "_tcp_rendezvous_handler", "_store_based_barrier", "new_group"}
STORE_CALLS = {"get", "wait", "set", "add", "compare_set"}


def _stdlib_dirs() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    dirs = {paths.get("stdlib", ""), paths.get("platstdlib", ""), paths.get("purelib", ""), paths.get("platlib", "")}
    return tuple(d for d in dirs if d)


_LIBRARY_DIRS = _stdlib_dirs()


def _short_path(file: str) -> str:
    p = Path(file)
    try:
        return str(p.resolve().relative_to(Path.cwd()))
    except (ValueError, OSError):
        pass
    for marker in ("site-packages/", "dist-packages/"):
        if marker in file:
            return file.split(marker, 1)[1]
    return file


def is_user_file(file: str) -> bool:
    """True for the learner's (or the lab's) code: not the standard library, not an installed
    package, not ddplab itself."""
    if not file or file.startswith("<"):
        return False
    if "site-packages" in file or "dist-packages" in file:
        return False
    try:
        resolved = str(Path(file).resolve())
    except OSError:
        resolved = file
    if resolved.startswith(str(PACKAGE_DIR)):
        return False
    return not any(resolved.startswith(d) for d in _LIBRARY_DIRS)


def _base_name(func: str) -> str:
    # py-spy prints qualified names ("Tensor.backward", "_exception_logger.<locals>.wrapper").
    return func.rsplit(".", 1)[-1]


def where(frames: list[Frame]) -> Where:
    """Classify a stack (innermost first)."""
    user = next((f for f in frames if is_user_file(f.file)), None)
    for f in frames:
        name = _base_name(f.func)
        in_torch_dist = "torch/distributed" in f.file.replace("\\", "/")
        if name in DDP_CALLS and in_torch_dist:
            return Where(user, DDP_CALLS[name], "collective")
        if name in COLLECTIVES and in_torch_dist and name != "wait":
            return Where(user, name, "collective")
        if name in RENDEZVOUS_CALLS and in_torch_dist:
            return Where(user, f"{name} (rendezvous: waiting for the other ranks to join)", "rendezvous")
    for f in frames:
        name = _base_name(f.func)
        if name in ("_engine_run_backward", "run_backward") or (name == "backward" and "torch/" in f.file):
            return Where(user, "all_reduce (DDP gradients, inside backward)", "backward")
    for f in frames:
        if _base_name(f.func) in STORE_CALLS and "torch/distributed" in f.file:
            return Where(user, f"store.{_base_name(f.func)} (waiting on the TCPStore)", "store")
    return Where(user, None, "other")


def parse_pyspy_json(text: str) -> list[Frame]:
    """Main-thread frames from ``py-spy dump --json --full-filenames`` output."""
    threads = json.loads(text)
    if not threads:
        return []
    main = next((t for t in threads if t.get("thread_name") == "MainThread"), threads[0])
    return [Frame(fr["name"], fr["filename"], int(fr["line"] or 0)) for fr in main["frames"]]


_FH_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-f]+)", re.M)
_FH_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.+)$')


def _fh_threads(text: str) -> list[tuple[str, list[Frame]]]:
    """Every thread block of faulthandler-format text, in order: ("Current thread" or "Thread",
    its frames innermost first)."""
    headers = list(_FH_THREAD.finditer(text))
    threads = []
    for i, m in enumerate(headers):
        end = headers[i + 1].start() if i + 1 < len(headers) else len(text)
        frames = [Frame(f.group(3).strip(), f.group(1), int(f.group(2)))
                  for f in map(_FH_FRAME.match, text[m.start():end].splitlines()[1:]) if f]
        threads.append((m.group(1), frames))
    return threads


def parse_faulthandler(text: str) -> list[Frame]:
    """Main-thread frames of the last dump in a faulthandler file.

    faulthandler lists the current thread first with "Current thread", others as "Thread"; on a
    SIGUSR1 dump the main thread is the one the signal landed in, so the current thread is main.
    """
    threads = _fh_threads(text)
    # The last dump's current thread (or the last block of any kind).
    current = [frames for kind, frames in threads if kind == "Current thread"] or [f for _, f in threads]
    return current[-1] if current else []


def parse_faulthandler_main(text: str) -> list[Frame]:
    """Main-thread frames from one faulthandler-format dump of *all* threads taken from another
    thread (torch's debug server answers /stacks this way: "Current thread" is its own server
    thread, with no Python frame). The main thread is the one whose outermost frame is ``<module>``."""
    threads = [frames for _, frames in _fh_threads(text)]
    return next((t for t in threads if t and t[-1].func == "<module>"), max(threads, key=len, default=[]))


_TB_FRAME = re.compile(r'^(?:\[rank\d+\]: )?\s*File "(.*)", line (\d+), in (.+)$', re.M)


def parse_traceback(text: str) -> list[Frame]:
    """Frames of the last Python traceback in a rank's log, innermost first."""
    starts = [m.end() for m in re.finditer(r"Traceback \(most recent call last\):", text)]
    if not starts:
        return []
    frames = [Frame(m.group(3).strip(), m.group(1), int(m.group(2))) for m in _TB_FRAME.finditer(text, starts[-1])]
    return frames[::-1]


def pyspy_path() -> str | None:
    """py-spy next to this interpreter (a venv's bin/), else on PATH."""
    here = Path(sys.executable).parent / "py-spy"
    return str(here) if here.exists() else shutil.which("py-spy")


def pyspy_dump(pid: int, timeout_s: float = 5.0) -> tuple[list[Frame] | None, str]:
    """(frames, "") on success; (None, why) when py-spy is missing, not permitted or fails."""
    exe = pyspy_path()
    if exe is None:
        return None, "py-spy is not installed"
    try:
        out = subprocess.run([exe, "dump", "--pid", str(pid), "--json", "--full-filenames"],
                             capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return None, f"py-spy did not answer in {timeout_s:.0f} s"
    if out.returncode != 0:
        msg = (out.stderr or out.stdout).strip().splitlines()
        return None, f"py-spy failed: {msg[-1] if msg else out.returncode}"
    try:
        return parse_pyspy_json(out.stdout), ""
    except (ValueError, KeyError) as e:
        return None, f"py-spy output not understood: {e}"


def describe(rank: int, w: Where) -> str:
    at = f" at {w.user_frame.short()}" if w.user_frame else ""
    if w.waits_in:
        return f"rank {rank} waits in {w.waits_in}{at}"
    return f"rank {rank} is running outside any collective{at}"
