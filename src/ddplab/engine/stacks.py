"""Reading a rank's Python stack, and saying as data what the rank is blocked in.

Sources, innermost frame first in all: torch's worker server (``dump_traceback`` over the rank's
socket, see ``ddplab.engine.probe``: no ptrace, works while the main thread is blocked in C++),
``py-spy dump --json`` (attaches from outside, ~40 ms), and the ``faulthandler`` dump that ddplab's
rank hook writes on SIGUSR1 or a fatal signal. ``where()`` turns a stack (and the kernel's wait
channel of the main thread) into a ``Where``: the kind of wait, the call, who issued it, and the
innermost line of the user's own code.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

# Frame, Where and the path helpers live in ddplab.facts (below the engine, with the result types)
from ddplab.facts import (PACKAGE_DIR, WHERE_KINDS, Frame, LibraryFrame, Where,  # noqa: F401  (re-exported)
                          is_user_file, parse_traceback, short_path, short_paths)


KINDS = WHERE_KINDS

# torch.distributed functions that block until every rank joins. Names as they appear in stacks.
COLLECTIVES = {
    "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "all_to_all",
    "all_to_all_single", "barrier", "monitored_barrier", "broadcast", "broadcast_object_list",
    "reduce", "reduce_scatter", "reduce_scatter_tensor", "gather", "gather_object", "scatter",
    "scatter_object_list", "all_reduce_coalesced", "all_gather_coalesced", "_all_gather_base", "_reduce_scatter_base",
}
# Point-to-point calls: they wait for one peer, not for every rank (kind "p2p"). The object variants
# pickle and call send/recv themselves.
P2P = {"send", "recv", "isend", "irecv", "batch_isend_irecv", "send_object_list", "recv_object_list"}
# Collectives of pickled Python objects: they call a tensor collective (all_gather, broadcast) inside.
OBJECT_CALLS = {"all_gather_object", "broadcast_object_list", "gather_object", "scatter_object_list",
                "send_object_list", "recv_object_list"}
# Collectives DDP and Join issue themselves, which a learner never calls by name: (op, via).
DDP_CALLS = {
    "_verify_param_shape_across_processes": ("all_gather", "ddp-construct"),
    "_sync_module_states": ("broadcast", "ddp-construct"),
    "_sync_params_and_buffers": ("broadcast", "ddp-construct"),
    "_sync_buffers": ("broadcast", "ddp-forward-buffers"),
    "_sync_module_buffers": ("broadcast", "ddp-forward-buffers"),
    "_default_broadcast_coalesced": ("broadcast", "ddp-forward-buffers"),
    "_rebuild_buckets": ("broadcast", "ddp-forward-rebuild-buckets"),
    "_check_global_requires_backward_grad_sync": ("all_reduce", "join"),
    "_match_all_reduce_for_bwd_pass": ("all_reduce", "join"),
    "_match_all_reduce_for_opt_step": ("all_reduce", "join"),
    "notify_join_context": ("all_reduce", "join"),
}
RENDEZVOUS_CALLS = {"init_process_group", "rendezvous", "_create_c10d_store", "_env_rendezvous_handler",
                    "_tcp_rendezvous_handler", "_store_based_barrier", "new_group", "init_device_mesh"}
STORE_CALLS = {"get", "wait", "set", "add", "compare_set", "check", "multi_get"}
# The kernel's wait channel of a blocked main thread (/proc/PID/wchan), when no Python frame says more.
WCHAN_KINDS = {"hrtimer_nanosleep": ("sleep", "sleep"), "do_nanosleep": ("sleep", "sleep"),
               "inet_csk_accept": ("socket", "accept"), "__inet_stream_connect": ("socket", "connect"),
               "inet_wait_for_connect": ("socket", "connect"), "sk_wait_data": ("socket", "recv"),
               "wait_woken": ("socket", "recv"), "do_sys_poll": ("socket", "poll"), "do_select": ("socket", "select"),
               "ep_poll": ("socket", "epoll"), "do_epoll_wait": ("socket", "epoll"),
               "pipe_read": ("other", "read from a pipe"), "anon_pipe_read": ("other", "read from a pipe"),
               "unix_stream_read_generic": ("socket", "recv"), "unix_stream_data_wait": ("socket", "recv"),
               "unix_wait_for_peer": ("socket", "send"), "poll_schedule_timeout": ("socket", "poll")}


def _base_name(func: str) -> str:
    # py-spy prints qualified names ("Tensor.backward", "_exception_logger.<locals>.wrapper").
    return func.rsplit(".", 1)[-1]


def where(frames: list[Frame], wchan: str | None = None) -> Where:
    """Classify a stack (innermost first), with the kernel's wait channel of the main thread when
    it is known (``/proc/PID/wchan``: Python shows no frame for a C call such as time.sleep); the
    library frame the user's call leads into is added (``library_frame``)."""
    found = _where(frames, wchan)
    lib = library_frame(frames)
    return replace(found, library=lib) if lib is not None else found


def library_frame(frames: list[Frame]) -> LibraryFrame | None:
    """The library frame the innermost user frame leads into, as ``ddplab.engine.libraries`` names
    it (Lightning's self.log, accelerate's gather_for_metrics, any package's frame by its name)."""
    from ddplab.engine import libraries
    index = next((i for i, f in enumerate(frames) if is_user_file(f.file)), None)
    found = libraries.entry(frames, index)
    return LibraryFrame(found.library, frames[found.index], found.role) if found is not None else None


def _where(frames: list[Frame], wchan: str | None = None) -> Where:
    user = next((f for f in frames if is_user_file(f.file)), None)
    for f in frames:
        name = _base_name(f.func)
        path = f.file.replace("\\", "/")
        if name in DDP_CALLS and ("torch/distributed" in path or "torch/nn/parallel" in path):
            op, via = DDP_CALLS[name]
            return Where("collective", op, via, user, f)
        if (name in COLLECTIVES or name in P2P) and "torch/distributed" in path:
            kind = "p2p" if name in P2P else "collective"
            outer = next((g for g in frames[frames.index(f) + 1:] if _base_name(g.func) in OBJECT_CALLS
                          and "torch/distributed" in g.file.replace("\\", "/")), None)
            # all_gather_object's all_gather: the user called the object collective
            return Where(kind, name, _base_name(outer.func) if outer is not None else None, user, outer or f)
        if name in RENDEZVOUS_CALLS and "torch/distributed" in path:
            return Where("rendezvous", name, "init_process_group", user, f)
    for f in frames:
        name = _base_name(f.func)
        if name in ("_engine_run_backward", "run_backward") or (name == "backward" and "torch/" in f.file):
            # DDP's reducer all-reduces gradient buckets from autograd hooks: C++, no Python frame.
            return Where("collective", "all_reduce", "ddp-backward", user, f)
        if name in ("forward", "_pre_forward", "_run_ddp_forward") and "torch/nn/parallel/distributed" in f.file:
            return Where("collective", "broadcast", "ddp-forward-buffers", user, f)
    for f in frames:
        path = f.file.replace("\\", "/")
        if _base_name(f.func) in STORE_CALLS and "torch/distributed" in path:
            return Where("store", f"store.{_base_name(f.func)}", None, user, f)
        if "torch/utils/data" in path:
            return Where("dataloader", "next batch", None, user, f)
    inner = frames[0] if frames else None
    if inner is not None:
        path = inner.file.replace("\\", "/")
        name = _base_name(inner.func)
        if path.endswith(("/socket.py", "/selectors.py", "/ssl.py")):
            return Where("socket", name, None, user, inner)
        if path.endswith("/threading.py"):
            return Where("lock", name, None, user, inner)
    wchan = wchan.split(".", 1)[0] if wchan else wchan    # "poll_schedule_timeout.constprop.0"
    if wchan in WCHAN_KINDS:
        kind, op = WCHAN_KINDS[wchan]
        return Where(kind, op, None, user, None)
    if wchan and wchan.startswith("futex"):
        return Where("lock", "a lock or condition", None, user, None)
    return Where("other", None, None, user, None)


def read_wchan(pid: int) -> str | None:
    """The kernel function the process's main thread sleeps in (Linux), else None."""
    try:
        with open(f"/proc/{pid}/wchan") as f:
            w = f.read().strip()
        return w if w and w != "0" else None
    except OSError:
        return None


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


def fr_frames(dump: dict | None) -> list[Frame]:
    """The Python frames (innermost first) that issued a rank's last collective, from torch's
    flight-recorder dump (each entry records its ``frames``: name, filename, line)."""
    entries = (dump or {}).get("entries") or []
    if not entries:
        return []
    pending = [e for e in entries if e.get("state") != "completed"]
    e = (pending or entries)[-1]
    return [Frame(str(f.get("name", "")), str(f.get("filename", "")), int(f.get("line") or 0))
            for f in e.get("frames") or () if isinstance(f, dict)]


def parse_faulthandler_last_main(text: str) -> list[Frame]:
    """The main thread's frames in the last dump of a faulthandler file written on a signal that
    any thread may receive (SIGTERM: "Current thread" may be one of gloo's): the last thread block
    whose outermost frame is ``<module>``."""
    threads = [frames for _, frames in _fh_threads(text)]
    return next((t for t in reversed(threads) if t and t[-1].func == "<module>"), [])


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

