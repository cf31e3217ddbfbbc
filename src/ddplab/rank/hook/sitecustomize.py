"""Loaded at start-up by every rank that ddplab launches (the launcher puts this folder first on
the ranks' PYTHONPATH), so it works for any script, unchanged. It records evidence; it never
changes what the script does.

In ``$DDPLAB_RUN_DIR/ranks/`` it writes, for rank N (the names are ``ddplab/runfiles.py``'s, loaded
from its file: the package itself is not imported here):
  rankN.json        pid, start time and the rendezvous address torchrun gave the rank
  rankN.error.json  the rank's uncaught exception as data (type, message, frames, time), the way
                    torchrun's own error files (TORCHELASTIC_ERROR_FILE) record it
  rankN.exit.json   at a normal exit (not a kill): the time and the flight recorder's ledger
  rankN.stack.txt   faulthandler's dump of every thread on a fatal signal (SIGSEGV, SIGABRT from
                    gloo) and on SIGUSR1 (the fallback route to a stack before torch is imported)
  rankN.term.txt    faulthandler's dump of every thread on SIGTERM (torchrun ending the rank after
                    another failed), then SIGTERM's default action
  rankN.ended.json  how a rank ended without a traceback: ``os._exit(n)`` and the line that called it
  rankN.threads.json  at interpreter shutdown, the threads that still run and keep the rank alive (not
                    daemon threads), each with its stack, before Python waits to join them
Evidence channels (issue 41), kept in the rank and written with the records above (and answered live
by the ``ddplab_rank`` handler of the worker server):
  calls             every torch.distributed collective the script calls (the module functions, wrapped
                    once after ``import torch.distributed``; calls nested in another, as all_gather inside
                    all_gather_object, are not counted): its number in this rank, the op, the innermost
                    user frames and the innermost library frame that led to it, and the exception being
                    handled or propagating in that thread at the call (type, message, where raised), and its
                    arguments as data (tensors' shape/dtype/device, lists' length, roots, reduce op, group)
  threads           every thread's name, daemon flag and stack (live, and at shutdown)
  polls             the files the script's own code looked for (os.path.exists, os.path.isfile) and did not
                    find: per path, how many looks, the user frames and time of the last (answered live)
  paths             the files an exception is about (an OSError's filename, else the path arguments of the
                    library call that raised), each with whether its folder existed when the rank failed
  nested            an exception torch re-raised from another process (``ExceptionWrapper.reraise``:
                    "Caught X in DataLoader worker process N"): the worker's type, where and traceback
and, once the script imports ``torch.distributed``, it starts torch's own control-plane worker
server (``torch._C._distributed_c10d._WorkerServer``) on the Unix socket named in rankN.json. Its
handlers run on a C++ thread, so the launcher can ask for the flight recorder's collective ledger
(``fr_trace_json``, on because the launcher sets TORCH_FR_BUFFER_SIZE) and every thread's stack
(``dump_traceback``) while the main thread is blocked in a collective, with no ptrace and no signal.
A handler of ddplab's own (``ddplab_rendezvous``) reports the address a rank is connecting to
while it is stuck in the rendezvous.

Outside a ddplab run (no DDPLAB_RUN_DIR, or not a torchrun worker) it does nothing; in a process a
rank starts (a DataLoader worker started with spawn inherits the environment) it does nothing either.
"""
import os
import sys


def _install():
    run_dir = os.environ.get("DDPLAB_RUN_DIR")
    rank = os.environ.get("RANK")
    # torchrun's agent also inherits PYTHONPATH; only its workers have LOCAL_RANK and RANK. A process
    # started by a rank inherits DDPLAB_RANK_PID from it and is not the rank itself.
    if not run_dir or rank is None or "LOCAL_RANK" not in os.environ:
        return None
    if os.environ.get("DDPLAB_RANK_PID") not in (None, str(os.getpid())):
        return None
    os.environ["DDPLAB_RANK_PID"] = str(os.getpid())
    import faulthandler
    import json
    import signal
    import time

    names = _runfiles()
    folder = os.path.join(run_dir, names.RANKS)
    os.makedirs(folder, exist_ok=True)
    stack_file = open(os.path.join(folder, names.rank_name(rank, names.STACK)), "a", buffering=1)
    faulthandler.enable(file=stack_file, all_threads=True)
    if hasattr(signal, "SIGUSR1"):
        faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    term_file = None
    if hasattr(signal, "SIGTERM") and hasattr(faulthandler, "register"):
        # torchrun SIGTERMs the other workers when one fails: where each one was, written in C (works
        # while the main thread is blocked in a gloo collective), then the default action (chain=True)
        term_file = open(os.path.join(folder, names.rank_name(rank, names.TERM)), "a", buffering=1)
        faulthandler.register(signal.SIGTERM, file=term_file, all_threads=True, chain=True)
    sock_dir = os.environ.get("DDPLAB_SOCKET_DIR")
    sock = os.path.join(sock_dir, names.socket_name(rank)) if sock_dir else None
    info = {"rank": int(rank), "pid": os.getpid(), "started": time.time(),
            "master_addr": os.environ.get("MASTER_ADDR"), "master_port": os.environ.get("MASTER_PORT"),
            "world_size": os.environ.get("WORLD_SIZE"), "local_rank": os.environ.get("LOCAL_RANK"), "socket": sock}
    final = os.path.join(folder, names.rank_name(rank, names.INFO))
    tmp = os.path.join(folder, "." + names.rank_name(rank, names.INFO))
    with open(tmp, "w") as f:
        json.dump(info, f)
    os.replace(tmp, final)

    previous_hook = sys.excepthook

    owner = os.getpid()
    calls = _Calls()
    _STATE["calls"] = calls

    def write(kind, rec):
        # a process forked from the rank (a DataLoader worker) inherits these hooks: its exit or its
        # error is not the rank's, and must not overwrite the rank's records
        if os.getpid() != owner:
            return
        path = os.path.join(folder, names.rank_name(rank, kind))
        with open(path + ".tmp", "w") as f:
            json.dump(rec, f)
        os.replace(path + ".tmp", path)

    def record_error(type_name, module, message, frames, cause=None, **more):
        try:
            env = {k: os.environ.get(k) for k in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE")}
            write(names.ERROR, {"rank": int(rank), "pid": os.getpid(), "time": time.time(), "type": type_name,
                            "module": module, "message": message, "frames": frames, "cause": cause, "env": env,
                            "calls": calls.records(), **more})
        except Exception:  # never let evidence-keeping change how the rank fails
            pass

    def record_exception(etype, value, tb, exited=None):
        try:
            rec = _describe(value, tb)
            cause = getattr(value, "__cause__", None)
            more = {k: rec[k] for k in ("chain", "values", "paths") if rec.get(k)}
            if exited is not None:
                more["exited"] = exited
            asked = _asked_in(tb)
            if asked is not None:
                more["asked"] = asked
            nested = _nested(value)
            if nested is not None:
                more["nested"] = nested
            record_error(rec["type"], rec["module"], rec["message"], rec["frames"],
                         type(cause).__name__ + ": " + str(cause) if cause is not None else None, **more)
        except Exception:
            pass

    def excepthook(etype, value, tb):
        record_exception(etype, value, tb)
        previous_hook(etype, value, tb)

    sys.excepthook = excepthook

    # sys.exit(2) (argparse's usage error, a script's own exit code) never reaches the excepthook.
    real_exit = sys.exit

    def exit_with_record(code=None):
        if code not in (None, 0):
            import traceback
            frames = [{"file": fs.filename, "line": fs.lineno, "func": fs.name, "text": fs.line}
                      for fs in traceback.extract_stack()[:-1]][::-1]
            handling = sys.exc_info()[1]
            if handling is not None and not isinstance(handling, SystemExit):
                # a framework (hydra, click) that caught the script's exception, printed it and exits:
                # the exception it was handling is the rank's error, the exit only how it ended
                record_exception(type(handling), handling, handling.__traceback__,
                                 exited={"code": str(code), "frames": frames[:3]})
            else:
                record_error("SystemExit", "builtins", str(code), frames)
        real_exit(code)

    sys.exit = exit_with_record

    # exit(n) and quit(n) (site's builtins) raise SystemExit without sys.exit: the same record
    import builtins
    for name in ("exit", "quit"):
        builtin = getattr(builtins, name, None)
        if builtin is not None:
            setattr(builtins, name, _Quitter(builtin, exit_with_record))

    # os._exit(n) skips every handler: the only trace of it is this record (code and the calling line)
    real_os_exit = os._exit

    def os_exit_with_record(code):
        try:
            write(names.ENDED, {"rank": int(rank), "pid": os.getpid(), "time": time.time(), "how": "os._exit",
                                "code": code if isinstance(code, int) else str(code),
                                "frames": _stack(sys._getframe(1), 6), "calls": calls.records()})
        except Exception:
            pass
        real_os_exit(code)

    os._exit = os_exit_with_record

    def record_threads():
        """At the start of interpreter shutdown (threading's own atexit, before the non-daemon threads are
        joined): the threads that will keep this rank alive, with their stacks."""
        try:
            keep = [t for t in _threads() if not t["main"] and not t["daemon"]]
            if keep:
                write(names.THREADS, {"rank": int(rank), "pid": os.getpid(), "time": time.time(), "threads": keep})
        except Exception:
            pass

    import threading
    try:
        threading._register_atexit(record_threads)
    except Exception:
        pass
    _watch_thread_starts(threading)
    _watch_file_polls()

    def record_children(children):
        """The non-daemon children started so far (a rank whose exit joins one no longer answers live)."""
        try:
            write(names.CHILDREN, {"rank": int(rank), "pid": os.getpid(), "time": time.time(), "children": children})
        except Exception:
            pass

    if "multiprocessing.process" in sys.modules:
        _watch_process_starts(record_children)
    else:
        _after_import("multiprocessing.process", lambda: _watch_process_starts(record_children))

    def record_exit():
        """At a normal interpreter exit: when, and the flight recorder's whole ledger (a rank that
        exits leaves its collectives behind for the comparison with the ranks that still wait)."""
        rec = {"rank": int(rank), "pid": os.getpid(), "time": time.time(), "ledger": None, "calls": calls.records()}
        c10d = sys.modules.get("torch._C._distributed_c10d")
        if c10d is not None and hasattr(c10d, "_dump_fr_trace_json"):
            try:
                rec["ledger"] = json.loads(c10d._dump_fr_trace_json())
            except Exception:
                pass
        try:
            write(names.EXIT, rec)
        except Exception:
            pass

    import atexit
    atexit.register(record_exit)

    def record_calls():
        """The call records now: a collective called with an exception in flight (rare; gloo may abort the
        rank inside it, and a fatal signal leaves no other record of the exception)."""
        try:
            write(names.CALLS, {"rank": int(rank), "pid": os.getpid(), "time": time.time(),
                                "calls": calls.records()})
        except Exception:
            pass

    def after_distributed():
        # one post-import hook per module name: the first finder to answer ends the search
        _watch_calls(calls, record_calls)
        if sock:
            _start_worker_server(sock, names.probe_lock(sock))

    _after_import("torch.distributed", after_distributed)
    if os.environ.get("DDPLAB_CHECK"):
        # ddplab run --check: record what the rank can see from inside torch (ddplab_rankcheck.py)
        _after_import("torch", lambda: _install_check(write))
    return stack_file, term_file  # kept referenced for the life of the process


_CHAIN_LIMIT = 8       # chained exceptions recorded (a loop of re-raises stops here)
_CALLS_KEPT = 512      # the last collectives called, per rank (each numbered, so ranks align by number)
_USER_FRAMES = 3       # user frames kept per call, innermost first
_STATE = {}            # "calls": this rank's _Calls (read by the live handler)
_FIRST_KEPT = 16       # the first calls are kept as well (init_process_group, new_group: the set-up)
_KIND = {}             # file -> "user", "lib" or "api" (torch.distributed's own entry points), cached
_API_FILES = ("distributed_c10d.py", "c10d_logger.py")
# torch.distributed's functions that talk to other ranks (and set-up), as a script calls them
_WATCHED = ("all_reduce", "broadcast", "barrier", "monitored_barrier", "all_gather", "all_gather_into_tensor",
            "all_gather_object", "reduce", "gather", "gather_object", "scatter", "scatter_object_list",
            "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "broadcast_object_list",
            "send", "recv", "isend", "irecv", "send_object_list", "recv_object_list", "batch_isend_irecv",
            "init_process_group", "destroy_process_group", "new_group")


class _Calls:
    """This rank's call records: the first ``_FIRST_KEPT`` and the last ``_CALLS_KEPT``."""

    def __init__(self):
        import collections
        self.first = []
        self.last = collections.deque(maxlen=_CALLS_KEPT)

    def append(self, rec):
        if len(self.first) < _FIRST_KEPT:
            self.first.append(rec)
        else:
            self.last.append(rec)

    def records(self):
        return self.first + list(self.last)


def _kind(file):
    k = _KIND.get(file)
    if k is None:
        norm = file.replace("\\", "/")
        if norm.endswith(_API_FILES) and "torch/distributed/" in norm:
            k = "api"
        else:
            k = "lib" if _is_library(file) else "user"
        _KIND[file] = k
    return k


def _stack(frame, limit):
    """A frame and its callers as records, innermost first: [file, line, func]."""
    out = []
    while frame is not None and len(out) < limit:
        out.append([frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name])
        frame = frame.f_back
    return out


def _in_flight():
    """The exception this thread is handling or propagating (an except or finally block, a with
    block's exit), as data: type, message, the line it was raised at; None when there is none."""
    value = sys.exc_info()[1]
    if value is None:
        return None
    tb = value.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    at = [tb.tb_frame.f_code.co_filename, tb.tb_lineno, tb.tb_frame.f_code.co_name] if tb is not None else None
    return {"type": type(value).__name__, "message": str(value)[:300], "at": at}


def _user_frames(frame):
    """From ``frame`` outwards: the innermost user frames (up to _USER_FRAMES) and the innermost library
    frame below the first of them, each [file, line, func] (lib None where there is none)."""
    lib, user = None, []
    while frame is not None:
        file = frame.f_code.co_filename
        k = _kind(file)
        if k == "user":
            user.append([file, frame.f_lineno, frame.f_code.co_name])
            if len(user) >= _USER_FRAMES:
                break
        elif k == "lib" and lib is None and not user:
            lib = [file, frame.f_lineno, frame.f_code.co_name]
        frame = frame.f_back
    return user, lib


def _site(op, frame, n):
    """One call record: the op, the innermost library frame below torch.distributed's entry point (a
    library that called it: Lightning, accelerate, DDP, FSDP) and the innermost user frames."""
    user, lib = _user_frames(frame)
    rec = {"n": n, "op": op, "user": user, "lib": lib}
    exc = _in_flight()
    if exc is not None:
        rec["exc"] = exc
    threading = sys.modules["threading"]
    t = threading.current_thread()
    if t is not threading.main_thread():
        rec["thread"] = t.name
    return rec


_PARAMS = {}           # function -> (its parameter names, the defaults of the ones described), cached
_ROOTS = ("src", "dst", "group_src", "group_dst")
_DEFAULTED = ("op", "async_op") + _ROOTS


def _call_args(fn, args, kwargs):
    """The arguments of one watched call as data, bound by the function's signature (cached per function): of each
    tensor its shape, dtype and device (never its data), of a list its length and its first entry's, the roots
    (src, dst, group_src, group_dst), the reduce op's name, the group's global ranks (None: the default group)
    and async_op. Defaults the call left out are described as given (once per function). {} when nothing could be
    described; a failure never reaches the call."""
    try:
        p = _PARAMS.get(fn)
        if p is None:
            import inspect
            sig = inspect.signature(fn).parameters
            names = tuple(sig)
            defaults = []
            for k in _DEFAULTED:
                if k in sig and sig[k].default is not inspect.Parameter.empty:
                    described = {}
                    _arg(described, k, sig[k].default)
                    if described:
                        defaults.append((k, names.index(k), described))
            p = _PARAMS[fn] = (names, tuple(defaults))
        names, defaults = p
        out = {}
        for k, pos, described in defaults:
            if pos >= len(args) and k not in kwargs:
                out.update(described)
        for i, v in enumerate(args[:len(names)]):
            _arg(out, names[i], v)
        for k, v in kwargs.items():
            _arg(out, k, v)
        return out
    except Exception:   # evidence-keeping never changes the call
        return {}


_NAMES = {}            # dtype or device -> its name, cached


def _tensor(v):
    """[shape, dtype, device] of a tensor, None for anything else (no data read)."""
    try:
        shape, dtype, device = v.shape, v.dtype, v.device
    except AttributeError:
        return None
    d = _NAMES.get(dtype)
    if d is None:
        d = _NAMES[dtype] = str(dtype).replace("torch.", "")
    e = _NAMES.get(device)
    if e is None:
        e = _NAMES[device] = str(device)
    return [list(shape), d, e]


def _arg(out, name, v):
    """One argument described into ``out`` (nothing when it cannot be)."""
    try:
        if v is None or isinstance(v, str):
            return
        if name in _ROOTS:
            if isinstance(v, int) and not isinstance(v, bool):
                out[name] = int(v)
        elif name == "op":
            # a ReduceOp member (RedOpType.SUM: .name), or a ReduceOp object holding one (premul_sum)
            o = getattr(v, "op", v)
            n = getattr(o, "name", None)
            if isinstance(n, str):
                out["op"] = n
        elif name == "group":
            dist = sys.modules.get("torch.distributed")
            world = getattr(getattr(dist, "GroupMember", None), "WORLD", None)
            if dist is not None and v is not world:
                out["group"] = [int(r) for r in dist.get_process_group_ranks(v)]
        elif name == "async_op":
            out["async_op"] = bool(v)
        elif isinstance(v, (list, tuple)):
            first = _tensor(v[0]) if v else None
            out[name] = {"len": len(v), **({"first": first} if first else {})}
        else:
            t = _tensor(v)
            if t is not None:
                out[name] = t
    except Exception:
        pass


def _watch_calls(calls, on_in_flight=None):
    """Wrap torch.distributed's collective functions (in distributed_c10d, and the same objects in the
    torch.distributed namespace) so that each call the script makes is numbered and recorded in
    ``calls`` before it runs. Arguments and results pass through untouched; a call made inside another
    watched call (all_gather inside all_gather_object) is not counted. A call made with an exception in
    flight is written at once (``on_in_flight``)."""
    import functools
    import threading
    import torch.distributed as dist
    c10d = getattr(dist, "distributed_c10d", None)
    if c10d is None:
        return
    local = threading.local()
    count = [0]

    def wrap(name, fn):
        @functools.wraps(fn)
        def watched(*args, **kwargs):
            if getattr(local, "busy", False):
                return fn(*args, **kwargs)
            local.busy = True
            try:
                try:
                    count[0] += 1
                    rec = _site(name, sys._getframe(1), count[0])
                    described = _call_args(fn, args, kwargs)
                    if described:
                        rec["args"] = described
                    calls.append(rec)
                    if "exc" in rec and on_in_flight is not None:
                        on_in_flight()
                except Exception:   # evidence-keeping never changes the call
                    pass
                return fn(*args, **kwargs)
            finally:
                local.busy = False
        watched.__ddplab_watched__ = fn
        return watched

    for name in _WATCHED:
        fn = getattr(c10d, name, None)
        if fn is None or hasattr(fn, "__ddplab_watched__"):
            continue
        w = wrap(name, fn)
        setattr(c10d, name, w)
        if getattr(dist, name, None) is fn:
            setattr(dist, name, w)


def _threads():
    """Every Python thread of this process: name, daemon, main, its stack (innermost first) and, for a thread
    started after this hook, the user's line that started it."""
    import threading
    frames = sys._current_frames()
    main = threading.main_thread()
    out = []
    for t in threading.enumerate():
        f = frames.get(t.ident)
        if f is not None:
            rec = {"name": t.name, "daemon": bool(t.daemon), "main": t is main, "frames": _stack(f, 24)}
            started = getattr(t, "_ddplab_started", None)
            if started:
                rec["started"] = started
            out.append(rec)
    return out


_CHILDREN_KEPT = 64    # the last child processes started (a DataLoader starts its workers again each epoch)


def _watch_process_starts(on_non_daemon=None):
    """Wrap multiprocessing's ``BaseProcess.start`` so that each child process the rank starts is kept (its
    name, pid, daemon flag and the user's line that started it) for the live handler, and the non-daemon ones
    are handed to ``on_non_daemon`` (written at once: a rank whose exit waits for a child shows only
    multiprocessing's join, never which child or where it came from, and no longer answers live)."""
    import collections
    mp = sys.modules.get("multiprocessing.process")
    real = getattr(getattr(mp, "BaseProcess", None), "start", None)
    if real is None or getattr(real, "__ddplab_watched__", None):
        return
    kept = _STATE.setdefault("children", collections.deque(maxlen=_CHILDREN_KEPT))

    def start(self, *args, **kwargs):
        out = real(self, *args, **kwargs)
        try:
            frame = sys._getframe(1)
            while frame is not None and _kind(frame.f_code.co_filename) != "user":
                frame = frame.f_back
            kept.append({"name": self.name, "pid": self.pid, "daemon": bool(self.daemon),
                         "started": [frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name]
                         if frame is not None else None})
            if not self.daemon and on_non_daemon is not None:
                on_non_daemon([c for c in kept if not c["daemon"]])
        except Exception:   # evidence-keeping never changes the start
            pass
        return out
    start.__ddplab_watched__ = real
    mp.BaseProcess.start = start


_POLLS_KEPT = 32       # paths a rank looked for and did not find, the most recent kept


def _watch_file_polls():
    """Wrap ``os.path.exists`` and ``os.path.isfile`` so that a look from the user's own code for a file that is
    not there is counted per path, with the user frames of the last look and its time (``_STATE["polls"]``: a
    rank polling for a file another process writes). A look that finds the file, or one made by a library, is
    not recorded; the answer is unchanged."""
    import collections
    import time
    polls = collections.OrderedDict()
    _STATE["polls"] = polls
    for name in ("exists", "isfile"):
        real = getattr(os.path, name)
        if getattr(real, "__ddplab_watched__", None):
            continue

        def watched(path, _real=real):
            found = _real(path)
            if not found:
                try:
                    frame = sys._getframe(1)
                    if _kind(frame.f_code.co_filename) == "user":
                        user, _ = _user_frames(frame)
                        key = os.path.abspath(os.fspath(path))
                        rec = polls.pop(key, None) or {"path": key, "misses": 0, "first": time.time()}
                        rec.update(misses=rec["misses"] + 1, last=time.time(), user=user)
                        polls[key] = rec
                        while len(polls) > _POLLS_KEPT:
                            polls.popitem(last=False)
                except Exception:   # evidence-keeping never changes the answer
                    pass
            return found
        watched.__ddplab_watched__ = real
        watched.__name__, watched.__doc__ = real.__name__, real.__doc__
        setattr(os.path, name, watched)


def _watch_thread_starts(threading):
    """Wrap ``Thread.start`` so that each thread keeps the innermost user frame that started it (a thread's own
    stack shows what it runs, never who started it). The thread starts unchanged."""
    real = threading.Thread.start
    if getattr(real, "__ddplab_watched__", None):
        return

    def start(self, *args, **kwargs):
        try:
            frame = sys._getframe(1)
            while frame is not None and _kind(frame.f_code.co_filename) != "user":
                frame = frame.f_back
            if frame is not None:
                self._ddplab_started = [frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name]
        except Exception:   # evidence-keeping never changes the start
            pass
        return real(self, *args, **kwargs)
    start.__ddplab_watched__ = real
    threading.Thread.start = start


def _rank_handler(req, resp):
    """The worker server's ``ddplab_rank``: this rank's call records and every thread's stack, now."""
    import json
    calls = _STATE.get("calls")
    import time
    found = {"calls": calls.records() if calls is not None else [], "threads": _threads(),
             "children": list(_STATE.get("children") or ()),
             "polls": [dict(p, age_s=time.time() - p["last"]) for p in list((_STATE.get("polls") or {}).values())]}
    resp.set_content(json.dumps(found), "application/json")
    resp.set_status(200)


def _nested(value):
    """An exception torch re-raised from another process (its ``ExceptionWrapper.reraise``: a DataLoader
    worker's), read from the re-raising frame's own wrapper: the worker's exception type, where it was
    ("in DataLoader worker process 0") and its traceback as the worker formatted it; None otherwise."""
    seen = 0
    e = value
    while e is not None and seen < _CHAIN_LIMIT:
        tb = e.__traceback__
        while tb is not None:
            code = tb.tb_frame.f_code
            if code.co_name == "reraise" and code.co_filename.replace("\\", "/").endswith("torch/_utils.py"):
                w = tb.tb_frame.f_locals.get("self")
                if w is not None and hasattr(w, "exc_msg"):
                    return {"type": getattr(getattr(w, "exc_type", None), "__name__", "?"),
                            "where": str(getattr(w, "where", "")), "traceback": str(w.exc_msg)[-8000:]}
            tb = tb.tb_next
        e = e.__cause__ or e.__context__
        seen += 1
    return None


class _Quitter:
    """site's ``exit``/``quit`` builtin, with a non-zero code recorded as sys.exit's is."""

    def __init__(self, builtin, record):
        self._builtin, self._record = builtin, record

    def __repr__(self):
        return repr(self._builtin)

    def __call__(self, code=None):
        try:
            sys.stdin.close()       # what site's Quitter does first
        except Exception:
            pass
        self._record(code)
_VALUE_CHARS = 120     # one value's repr, shortened


def _describe(value, tb):
    """An exception as data: type, module, its whole message, its frames (innermost first, each with
    its source line), the exceptions chained to it (``raise ... from``, or raised while handling),
    and the values of the names on the line of the user's own code that led into the library."""
    import traceback

    def frames_of(t):
        return [{"file": fs.filename, "line": fs.lineno, "func": fs.name, "text": fs.line}
                for fs in traceback.extract_tb(t)][::-1]

    etype = type(value)
    rec = {"type": etype.__name__, "module": getattr(etype, "__module__", ""), "message": str(value),
           "frames": frames_of(tb)}
    chain, seen, e = [], {id(value)}, value
    while len(chain) < _CHAIN_LIMIT:
        if e.__cause__ is not None:
            nxt, relation = e.__cause__, "cause"
        elif e.__context__ is not None and not e.__suppress_context__:
            nxt, relation = e.__context__, "context"
        else:
            break
        if id(nxt) in seen:
            break
        seen.add(id(nxt))
        chain.append({"type": type(nxt).__name__, "module": getattr(type(nxt), "__module__", ""),
                      "message": str(nxt), "frames": frames_of(nxt.__traceback__), "relation": relation})
        e = nxt
    rec["chain"] = chain
    rec["values"] = _user_values(tb)
    paths = _paths(value, tb)
    if paths:
        rec["paths"] = paths
    return rec


_PATHS_KEPT = 4


def _paths(value, tb):
    """The files an exception is about, from its own fields and the call's arguments, never from its
    message: an OSError's ``filename``/``filename2``; else the path arguments (str or os.PathLike holding a
    separator) of the library function the user's innermost line called (torch.save(obj, f): ``f``). Each
    as [absolute path, whether the folder it is in existed when the rank recorded the error]."""
    found = [v for v in (getattr(value, "filename", None), getattr(value, "filename2", None))
             if isinstance(value, OSError) and v is not None]
    if not found:
        callee, t = None, tb
        while t is not None:
            if not _is_library(t.tb_frame.f_code.co_filename):
                callee = t.tb_next.tb_frame if t.tb_next is not None else None
            t = t.tb_next
        if callee is not None:
            code = callee.f_code
            n = code.co_argcount + code.co_kwonlyargcount
            found = [callee.f_locals.get(a) for a in code.co_varnames[:n]]
    out = []
    for v in found:
        try:
            v = os.fspath(v)
        except TypeError:
            continue
        if isinstance(v, bytes):
            v = os.fsdecode(v)
        if not isinstance(v, str) or os.sep not in v:
            continue
        path = os.path.abspath(v)
        out.append([path, os.path.isdir(os.path.dirname(path))])
        if len(out) >= _PATHS_KEPT:
            break
    return out


def _is_library(file):
    """The standard library, an installed package or ddplab itself: not the user's code."""
    import sysconfig
    if not file or file.startswith("<") or "site-packages" in file or "dist-packages" in file:
        return True
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))      # the ddplab package
    paths = sysconfig.get_paths()
    dirs = [here] + [paths.get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib") if paths.get(k)]
    real = os.path.realpath(file)
    return any(real.startswith(os.path.realpath(d) + os.sep) for d in dirs)


def _user_values(tb):
    """{name: short repr} of the local names on the innermost line of the user's own code in the
    traceback: the arguments it passed into the library (or its own expression) that failed."""
    import linecache
    import re

    frame, lineno = None, None
    while tb is not None:
        if not _is_library(tb.tb_frame.f_code.co_filename):
            frame, lineno = tb.tb_frame, tb.tb_lineno
        tb = tb.tb_next
    if frame is None:
        return {}
    text = linecache.getline(frame.f_code.co_filename, lineno)
    text = re.sub(r"#.*", "", text)
    text = re.sub(r"(\"[^\"]*\"|'[^']*')", "", text)
    out = {}
    for chain in dict.fromkeys(re.findall(r"(?<![\w.])([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)", text)):
        parts = chain.split(".")
        if parts[0] not in frame.f_locals or len(out) >= 8:
            continue
        # the longest attribute chain that resolves to a value worth showing (self.gpu_id, model)
        for n in range(len(parts), 0, -1):
            try:
                v = frame.f_locals[parts[0]]
                for a in parts[1:n]:
                    v = getattr(v, a)
            except Exception:
                continue
            short = _short(v)
            if short is not None:
                out[".".join(parts[:n])] = short
                break
    return out


def _short(v):
    """A value in a few words: a tensor by shape, dtype and device, a container by its size."""
    try:
        t = type(v)
        if t.__name__ in ("Tensor", "Parameter") and hasattr(v, "shape"):
            return f"tensor(shape={list(v.shape)}, dtype={str(v.dtype).replace('torch.', '')}, device={v.device})"
        r = repr(v) if not isinstance(v, (dict, list, tuple, set)) or len(v) <= 8 else ""
        if isinstance(v, dict) and (not r or len(r) > _VALUE_CHARS or "\n" in r):
            keys = ", ".join(repr(k) for k in list(v)[:4])
            return f"{t.__name__} of {len(v)} items ({keys}{', ...' if len(v) > 4 else ''})"
        if isinstance(v, (list, tuple, set)) and (not r or len(r) > _VALUE_CHARS or "\n" in r):
            return f"{t.__name__} of {len(v)} items"
        import inspect
        if inspect.ismodule(v) or inspect.isroutine(v) or inspect.isclass(v):
            return None
        if hasattr(v, "state_dict") and hasattr(v, "parameters"):
            return f"{t.__name__} (a module)"
        r = " ".join((r or repr(v)).split())
        if r.startswith("<") and " object at 0x" in r:    # a default repr says nothing
            return None
        return r if len(r) <= _VALUE_CHARS else r[:_VALUE_CHARS - 3] + "..."
    except Exception:
        return None


def _runfiles():
    """``ddplab/runfiles.py`` (the names of a run folder's files), loaded from its file beside this
    folder: it imports only ``os``, and the ddplab package is not imported into the rank here."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "runfiles.py")
    spec = importlib.util.spec_from_file_location("_ddplab_runfiles", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _install_check(write):
    try:
        import ddplab_rankcheck
        ddplab_rankcheck.install(write, _after_import, lambda: _STATE.get("calls"))
    except Exception as e:   # the run goes on unchecked; the launcher says no rank left check records
        print(f"[ddplab] --check is off in this rank ({type(e).__name__}: {e})", file=sys.stderr)


def _start_worker_server(sock, lock_path):
    """torch's control-plane server on ``sock`` (C++ thread), plus ddplab's rendezvous handler."""
    global _DDPLAB_WORKER_SERVER
    try:
        from torch._C import _distributed_c10d as c10d
        try:
            os.unlink(sock)
        except OSError:
            pass
        # the probers' lock exists before the server does: a prober opens it without creating it, so a
        # rank that is gone (its folder removed) is never given a lock file again
        os.close(os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600))
        # torch logs "Server listening ..." (and "shutting down"/"exited") as C++ warnings on fd 2:
        # evidence-keeping must not add lines to the learner's own log, so fd 2 is muted for them.
        with _quiet_stderr():
            _DDPLAB_WORKER_SERVER = c10d._WorkerServer(sock)
        if hasattr(c10d, "_register_handler"):
            c10d._register_handler("ddplab_rendezvous", _rendezvous_handler)
            c10d._register_handler("ddplab_rank", _rank_handler)
        import atexit
        import threading

        server = _DDPLAB_WORKER_SERVER
        owner = os.getpid()

        def stop():
            # A forked child (a DataLoader worker) inherits threading's atexit list and runs it when
            # multiprocessing ends it; its copy of the listening socket is the rank's own, and
            # shutting it down there ended the rank's server with "failed to listen" (SIGABRT).
            if os.getpid() != owner:
                return
            try:
                os.unlink(sock)          # no new requests from here on
            except OSError:
                pass
            # shutdown() keeps the GIL while it waits for a request in flight, whose handler waits
            # for the GIL: shutting down then hung the rank, and a handler left to run during
            # finalization aborts it. Each prober holds this lock shared until its request is
            # answered (ddplab.engine.probe); waiting for it exclusively (without the GIL) lets the
            # handlers finish first. Held until the process ends: no prober asks again.
            try:
                import fcntl
                fd = os.open(lock_path, os.O_RDWR)
                fcntl.flock(fd, fcntl.LOCK_EX)
            except (ImportError, OSError):
                pass
            with _quiet_stderr():
                server.shutdown()

        # first thing at exit: threading's shutdown runs before atexit's handlers
        register = getattr(threading, "_register_atexit", None)
        try:
            register(stop) if register else atexit.register(stop)
        except RuntimeError:
            atexit.register(stop)
    except Exception as e:  # an older torch: the launcher falls back to py-spy and faulthandler
        print(f"[ddplab] no worker server in this rank ({type(e).__name__}: {e})", file=sys.stderr)


class _quiet_stderr:
    """fd 2 to /dev/null for a moment (C++ log lines go there, below Python's sys.stderr)."""

    def __enter__(self):
        try:
            sys.stderr.flush()
            self.saved = os.dup(2)
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, 2)
            os.close(null)
        except OSError:
            self.saved = None

    def __exit__(self, *exc):
        if self.saved is not None:
            os.dup2(self.saved, 2)
            os.close(self.saved)
        return False


def _rendezvous_handler(req, resp):
    """Where this rank's main thread is trying to reach the store, read from the arguments of the
    torch.distributed frames it is in (TCPStore creation, rendezvous handlers, init_process_group):
    host, port and the timeout it waits with, when they are there."""
    import json
    import threading

    found = {}
    frame = sys._current_frames().get(threading.main_thread().ident)
    while frame is not None:
        code = frame.f_code
        if "torch/distributed" in code.co_filename.replace("\\", "/"):
            loc = frame.f_locals
            if code.co_name in _P2P and "p2p" not in found:
                # a blocked point-to-point call: which peer it waits for (dst or src, in group ranks)
                peer = loc.get("dst", loc.get("src", loc.get("group_dst", loc.get("group_src"))))
                if isinstance(peer, int) and not isinstance(peer, bool):
                    found["p2p"] = {"op": code.co_name, "peer": peer, "tag": loc.get("tag")
                                    if isinstance(loc.get("tag"), int) else None}
            if code.co_name == "init_process_group" and "asked" not in found:
                # what this process asked the rendezvous for: its arguments and its environment
                found["asked"] = _asked(loc)
            host = loc.get("hostname", loc.get("host_name", loc.get("master_addr")))
            port = loc.get("port", loc.get("master_port"))
            if "host" not in found and isinstance(host, str) and isinstance(port, int) and not isinstance(port, bool):
                found.update(host=host, port=port, func=code.co_name)
            timeout = loc.get("timeout")
            if "timeout_s" not in found and hasattr(timeout, "total_seconds"):
                found["timeout_s"] = timeout.total_seconds()
        frame = frame.f_back
    resp.set_content(json.dumps(found), "application/json")
    resp.set_status(200)


_P2P = ("send", "recv", "isend", "irecv", "send_object_list", "recv_object_list")


def _asked(loc):
    """What a process asked init_process_group for: its arguments (``loc``, the call's locals) and its
    environment. One reading for the live probe and for an exception raised inside the call."""
    return {"rank": _int(loc.get("rank")), "world_size": _int(loc.get("world_size")),
            "env": {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}}


def _asked_in(tb):
    """_asked of the init_process_group frame an exception passed through, or None."""
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_name == "init_process_group" and "torch/distributed" in code.co_filename.replace("\\", "/"):
            return _asked(tb.tb_frame.f_locals)
        tb = tb.tb_next
    return None


def _int(v):
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _after_import(name, callback):
    """Run ``callback`` in the importing thread right after module ``name`` has finished importing
    (a post-import hook: nothing is imported early, nothing polls)."""
    import importlib.abc
    import importlib.machinery

    class Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname, path, target=None):
            if fullname != name:
                return None
            sys.meta_path.remove(self)
            spec = importlib.machinery.PathFinder.find_spec(fullname, path)
            if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
                return spec
            run = spec.loader.exec_module

            def exec_module(module):
                run(module)
                try:
                    callback()
                except Exception:
                    pass

            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, Finder())


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


_DDPLAB_WORKER_SERVER = None
_DDPLAB_STACK_FILE = _install()
_chain()


# --- parity with bare torchrun (issue 43; ddplab.origins.parity lists every difference) -------------

class _HookModules:
    """Finds the hook folder's own modules (ddplab_rankcheck, ...) once the folder is off sys.path."""

    @staticmethod
    def find_spec(fullname, path=None, target=None):
        import importlib.util
        here = os.path.dirname(os.path.abspath(__file__))
        file = os.path.join(here, fullname + ".py")
        if "." in fullname or fullname == "sitecustomize" or not os.path.isfile(file):
            return None
        return importlib.util.spec_from_file_location(fullname, file)


def _as_torchrun_left_it():
    """In a rank (not in torchrun's agent, whose workers need it): the hook's folder leaves sys.path
    and PYTHONPATH (as the caller had it: unset stays unset), and stdout is line-buffered as on the
    terminal bare torchrun's ranks write to. Labs keep PYTHONUNBUFFERED (ddplab.origins.parity)."""
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if not (p and os.path.abspath(p) == here)]
    sys.meta_path.append(_HookModules)
    value = os.environ.get("PYTHONPATH")
    if value is not None and value.split(os.pathsep)[0] and os.path.abspath(value.split(os.pathsep)[0]) == here:
        rest = value[len(value.split(os.pathsep)[0]):]
        if rest:
            os.environ["PYTHONPATH"] = rest[len(os.pathsep):]
        else:
            del os.environ["PYTHONPATH"]
    if not os.environ.get("PYTHONUNBUFFERED"):
        try:
            sys.stdout.reconfigure(line_buffering=True)
        except Exception:
            pass


if _DDPLAB_STACK_FILE is not None:
    _as_torchrun_left_it()
