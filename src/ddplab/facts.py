"""The facts a run's result holds, below every part that makes or shows them.

``ddplab.result`` (RunResult, RankResult) is made of these: a stack frame (``Frame``), where a rank
stood (``Where``), a flight-recorder entry (``Collective``) and where the ranks' ledgers first differ
(``Divergence``), an exception chained to a rank's error (``ChainedError``), and ``ddplab run --check``'s
report (``CheckReport``, its ``Finding`` and ``NotChecked``, the fix for each kind of finding). With them,
the pure functions these types and ``result`` use: how a path is shown (``short_path``) and whether a
file is the user's own (``is_user_file``).

Origins, the engine and views all import this module; it imports only the standard library,
``ddplab.defaults`` and ``ddplab.runfiles`` (an import-linter contract, pyproject.toml). The engine's
modules that made these types (``engine.stacks``, ``engine.ledger``, ``engine.check``, ``engine.reasons``)
still export them under their old names.
"""
from __future__ import annotations

import math
import os
import re
import sysconfig
from dataclasses import asdict, dataclass, field
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent   # src/ddplab: frames there are ddplab's own


# --- paths: how a file is shown, and whose it is (engine.stacks) -------------------------------
def _stdlib_dirs() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    dirs = {paths.get("stdlib", ""), paths.get("platstdlib", ""), paths.get("purelib", ""), paths.get("platlib", "")}
    return tuple(d for d in dirs if d)


_LIBRARY_DIRS = _stdlib_dirs()


def short_path(file: str) -> str:
    """A path as shown: an installed library's from its package (torch/...), anything in or beside the
    working folder relative to it (../labs/01_hang.py from notebooks/), anything else as given. So a
    stored output names no folder of the machine that made it."""
    for marker in ("site-packages/", "dist-packages/"):
        if marker in file:
            return file.split(marker, 1)[1]
    for d in _LIBRARY_DIRS:        # the standard library: json/decoder.py
        if file.startswith(d.rstrip("/") + "/"):
            return file[len(d.rstrip("/")) + 1:]
    if not file.startswith("/"):
        return file
    rel = os.path.relpath(file, Path.cwd())
    return file if rel.startswith("../../") or rel == "../.." else rel


_ABSOLUTE = re.compile(r"(?<![\w.:/<])/(?:[\w.+-]+/)+[\w.+-]*")


def short_paths(text: str) -> str:
    """Every absolute path in ``text`` (a message, a command line, a rendered view) as short_path shows it."""
    return _ABSOLUTE.sub(lambda m: short_path(m.group(0)), text)


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


# --- where a rank stands (engine.stacks) ---------------------------------------------------
@dataclass(frozen=True)
class Frame:
    func: str
    file: str
    line: int
    text: str | None = field(default=None, compare=False)   # the source line, where the record has it

    def short(self) -> str:
        return f"{short_path(self.file)}:{self.line} in {self.func}"

    def to_dict(self) -> dict:
        d = {"func": self.func, "file": self.file, "line": self.line}
        if self.text:
            d["text"] = self.text
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Frame":
        return cls(d["func"], d["file"], int(d["line"] or 0), d.get("text") or None)


@dataclass(frozen=True)
class LibraryFrame:
    """The library frame a user's call leads into (``ddplab.engine.libraries``): the library's id
    ("lightning", "accelerate", "torch", or an undescribed package's name), the frame, and the
    key of what it does in that library's data (its description; None where the library says
    nothing of that frame)."""
    library: str
    frame: Frame
    role: str | None = None

    def to_dict(self) -> dict:
        return {"library": self.library, "frame": self.frame.to_dict(), "role": self.role}

    @classmethod
    def from_dict(cls, d: dict | None) -> "LibraryFrame | None":
        return cls(d["library"], Frame.from_dict(d["frame"]), d.get("role")) if d else None


@dataclass(frozen=True)
class Where:
    """Where one rank stands, as data: what it is blocked in and the line of its own code.

    ``kind`` is one of WHERE_KINDS; ``op`` names the call ("all_reduce", "barrier", "send", "sleep", "accept",
    "store.wait"); ``via`` says who issued a collective the user never called by name
    ("ddp-backward", "ddp-forward-buffers", "ddp-construct", "join", "init_process_group", or the
    object collective that called it: "all_gather_object");
    ``seq`` is the collective's number in the ledger when the ledger knows it."""
    kind: str
    op: str | None = None
    via: str | None = None
    frame: Frame | None = None    # innermost frame of the user's (or the lab's) own code
    call: Frame | None = None     # the innermost library frame that names the call
    seq: int | None = None
    library: LibraryFrame | None = None   # the library frame the user's call leads into (issue 43)

    @property
    def in_collective(self) -> bool:
        return self.kind == "collective"

    def to_dict(self) -> dict:
        return {"kind": self.kind, "op": self.op, "via": self.via, "seq": self.seq,
                "frame": self.frame.to_dict() if self.frame else None,
                "call": self.call.to_dict() if self.call else None,
                **({"library": self.library.to_dict()} if self.library else {})}

    @classmethod
    def from_dict(cls, d: dict | None) -> "Where | None":
        if not d:
            return None
        return cls(kind=d["kind"], op=d.get("op"), via=d.get("via"), seq=d.get("seq"),
                   frame=Frame.from_dict(d["frame"]) if d.get("frame") else None,
                   call=Frame.from_dict(d["call"]) if d.get("call") else None,
                   library=LibraryFrame.from_dict(d.get("library")))


WHERE_KINDS = ("collective", "p2p", "rendezvous", "store", "sleep", "socket", "dataloader", "lock", "compute", "other",
               "thread",   # thread: the main thread finished; ``op`` names the non-daemon thread keeping the rank alive
               "child")    # child: the main thread finished and, at exit, joins a child process that is not a daemon


# --- the collective ledger (engine.ledger) ---------------------------------------------------
def numel(sizes) -> int:
    """Elements in a collective's input tensors (shapes as the flight recorder lists them)."""
    return sum(math.prod(s) for s in sizes or ())


@dataclass(frozen=True)
class Collective:
    seq: int                      # collective_seq_id: the n-th collective of its process group
    op: str                       # "all_reduce", "barrier", "broadcast", ...
    backend: str                  # "gloo", "nccl"
    sizes: tuple[tuple[int, ...], ...]   # input tensor shapes
    dtypes: tuple[str, ...]
    completed: bool               # retired (finished) on this rank
    pg: str                       # process group name ("0" is the default group)
    created_ns: int               # when the rank issued it (wall clock, ns)
    timeout_ms: int | None        # the process group's timeout for it

    @property
    def numel(self) -> int:
        return numel(self.sizes)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["sizes"] = [list(s) for s in self.sizes]
        d["dtypes"] = list(self.dtypes)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Collective":
        return cls(**{**d, "sizes": tuple(tuple(s) for s in d["sizes"]), "dtypes": tuple(d["dtypes"])})


@dataclass(frozen=True)
class Divergence:
    """Where the ranks' ledgers first disagree."""
    kind: str                     # "different-op", "different-sizes", "shorter-ledger"
    seq: int                      # the collective number (of process group ``pg``)
    pg: str
    ops: dict                     # rank -> op at ``seq`` (None: the rank never issued it)
    sizes: dict                   # rank -> sizes at ``seq``
    last: dict                    # rank -> the rank's last collective number

    def to_dict(self) -> dict:
        return {"kind": self.kind, "seq": self.seq, "pg": self.pg,
                "ops": {str(k): v for k, v in self.ops.items()},
                "sizes": {str(k): [list(s) for s in v] if v is not None else None for k, v in self.sizes.items()},
                "last": {str(k): v for k, v in self.last.items()}}

    @classmethod
    def from_dict(cls, d: dict) -> "Divergence":
        return cls(kind=d["kind"], seq=d["seq"], pg=d["pg"], ops={int(k): v for k, v in d["ops"].items()},
                   sizes={int(k): tuple(tuple(s) for s in v) if v is not None else None for k, v in d["sizes"].items()},
                   last={int(k): v for k, v in d["last"].items()})


# --- an exception chained to a rank's error (engine.reasons) --------------------------------
@dataclass(frozen=True)
class ChainedError:
    """An exception chained to a rank's error: ``relation`` "cause" (``raise ... from e``) or "context"
    (raised while handling it), as Python's traceback prints them."""
    type: str
    message: str
    frames: tuple[Frame, ...]     # innermost first
    relation: str                 # "cause" | "context"
    module: str = ""

    def to_dict(self) -> dict:
        return {"type": self.type, "message": self.message, "frames": [f.to_dict() for f in self.frames],
                "relation": self.relation, "module": self.module}

    @classmethod
    def from_dict(cls, d: dict) -> "ChainedError":
        return cls(d["type"], d.get("message", ""), tuple(Frame.from_dict(f) for f in d.get("frames", ())),
                   d.get("relation", "context"), d.get("module", ""))


# --- a file an exception is about (the rank hook's record, engine.causes) -------------------
@dataclass(frozen=True)
class ErrorPath:
    """A file a rank's exception is about, from the exception's own fields (an OSError's ``filename``) or the
    path argument of the library call that raised (torch.save's ``f``), never from its message: the absolute
    path, whether the folder it is in existed when the rank recorded the error, and whether it exists at the
    verdict (read by ``engine.evidence.read_run``; None: not looked at)."""
    path: str
    folder_then: bool
    folder_now: bool | None = None

    @property
    def folder(self) -> str:
        import os.path
        return os.path.dirname(self.path)

    def to_dict(self) -> dict:
        return {"path": self.path, "folder_then": self.folder_then, "folder_now": self.folder_now}

    @classmethod
    def from_dict(cls, d) -> "ErrorPath":
        if isinstance(d, (list, tuple)):    # the rank hook's record: [path, folder existed then]
            return cls(str(d[0]), bool(d[1]))
        now = d.get("folder_now")
        return cls(str(d["path"]), bool(d.get("folder_then")), None if now is None else bool(now))


# --- ddplab run --check's report (engine.check) ---------------------------------------------
CHECK_FIXES = {
    "replicas-differ": "change the model only through steps every rank takes through the DDP wrapper (not "
                       "model.module on one rank, not a step inside no_sync()); load weights before wrapping",
    "buffers-differ": "keep DDP's buffer sync on (forward_sync_buffers=True, formerly broadcast_buffers=True), or "
                      "use SyncBatchNorm",
    "samples-overlap": "give every rank a disjoint share of each epoch: DataLoader(..., sampler=DistributedSampler(dataset)) "
                       "with the same seed and the same set_epoch(epoch) on every rank, not a split or seed made by rank",
    "samples-dropped": "let a DistributedSampler (the same seed and epoch on every rank) share out the data: it covers "
                       "the whole dataset every epoch",
    "same-order": "call sampler.set_epoch(epoch) at the start of every epoch",
    "step-in-no-sync": "take the last micro-batch's forward and backward outside no_sync(), then optimizer.step() "
                       "outside it",
    "unequal-accumulation": "make every rank run the same number of micro-batches per optimizer step",
    "grad-missing": "use every parameter on every rank in forward, or find_unused_parameters=True, so that no "
                    "rank steps a parameter the others left alone",
    "update-outside-ddp": "run the forward of a training step through the DDP wrapper (model(x), not model.module(x)) "
                          "on every rank",
    "steps-without-gradients": "build the optimizer from the parameters backward reaches: after the model is "
                               "wrapped (FSDP replaces the module's parameters with its own, so an optimizer made "
                               "before the wrap holds tensors nothing updates), and call zero_grad() before "
                               "backward, not between backward and step",
    "init-differs": "build the model from the same seed on every rank (torch.manual_seed(seed) before it is "
                    "made), load the same checkpoint into it on every rank, or on GPUs wrap it with "
                    "FSDP(..., sync_module_states=True) to start every rank from rank 0's weights",
    "same-inputs": "give every rank its own data: a DistributedSampler for a DataLoader, or, for batches drawn at "
                   "random, a seed offset by the rank (torch.manual_seed(seed + rank)) after the model is built "
                   "(DDP copies rank 0's weights to every rank at construction)",
    "model-not-wrapped": "wrap the model in DistributedDataParallel on every kind of device, the CPU included "
                         "(DDP(model) with device_ids=None on gloo), so that every step averages the gradients; "
                         "or all-reduce each gradient and divide by the world size before every optimizer step",
    "hyperparameter-differs": "change the optimizer's settings alike on every rank: step the learning-rate "
                              "scheduler (and set any lr, momentum or weight decay by hand) on every rank, outside "
                              "`if rank == 0:` branches; DDP averages the gradients, never the optimizers' settings",
    "optimizer-state-differs": "load the optimizer's state on every rank (each rank reads the checkpoint, "
                               "map_location to its own device, then optimizer.load_state_dict), not on rank 0 "
                               "alone: DDP copies rank 0's weights at construction, never the optimizer's state",
    "mode-differs": "put the model back in train mode (model.train()) after every evaluation or check, on every "
                    "rank, before the next training step; call eval() and train() alike on every rank",
    "load-keys-missing": "load with strict=True (the default) so that keys that match nothing raise, and make the "
                         "names agree: save model.module.state_dict() from a DDP model, or load into the module "
                         "the state dict was taken from",
    "eval-padding-repeats": "score each sample once: a DistributedSampler pads the data with repeated samples to a "
                            "multiple of the world size, so count only len(dataset) samples when gathering the "
                            "results (drop the padding), or give each rank range(rank, len(dataset), world) with "
                            "no padding and reduce sums and counts",
    "eval-one-shard": "evaluate on every rank (each scores its DistributedSampler share, then all_reduce the sums and "
                      "counts), or on one rank with a loader over the whole split (no DistributedSampler)",
    "reduce-op-differs": "pass the same op to the reduction on every rank (op=dist.ReduceOp.SUM everywhere, then "
                         "divide, or MAX everywhere); a rank that wants another reduction of the same values makes "
                         "a collective of its own that every rank calls",
    "worker-duplicates": "shard an IterableDataset by DataLoader worker as well as by rank: in __iter__, "
                         "info = torch.utils.data.get_worker_info() and keep every (world * info.num_workers)-th "
                         "item from rank * info.num_workers + info.id (or use num_workers=1)",
}
CHECK_KINDS = tuple(CHECK_FIXES)
# A finding whose evidence shows why, with the fix for that reason in place of its kind's (the kind's fix
# would repeat what the script already does).
CHECK_CAUSE_FIXES = {
    "split-differs": "make the split the same on every rank: random_split(dataset, lengths, "
                     "generator=torch.Generator().manual_seed(seed)), or split once and load the indices; the "
                     "DistributedSampler is right, but each rank shared out a split of its own",
    "key-prefix-in-checkpoint": "take the prefix off the checkpoint's keys before loading "
                                "(torch.nn.modules.utils.consume_prefix_in_state_dict_if_present(state, 'module.')), "
                                "or save model.module.state_dict() from the DDP model; then load with strict=True",
    "printed-setting-differs": "make that setting the same on every rank (read it from one place, not from the rank, "
                               "its own data or a per-rank clock): DDP averages the gradients, but a rank that "
                               "applies them with its own value parts the replicas however every step goes through "
                               "the wrapper; only if that value never reaches the update, change the model only "
                               "through steps every rank takes through the DDP wrapper",
    "key-prefix-in-model": "load into the module the state dict was taken from (model.module.load_state_dict(state) "
                           "for a DDP model given its module's state), then with strict=True",
}


@dataclass(frozen=True)
class Finding:
    kind: str                     # one of CHECK_KINDS
    ranks: tuple[int, ...]        # the ranks it is about (those that differ from rank 0, or that did it)
    object: str                   # a parameter or buffer name, "DataLoader #0 (DistributedSampler over ...)"
    step: int | None = None       # optimizer steps taken before it was seen (0: before the first)
    epoch: int | None = None
    count: int | None = None      # how many (steps, samples, tensors)
    of: int | None = None         # out of how many
    since_equal: int | None = None  # replicas: the last step at which they were still equal
    cause: str | None = None      # a reason the evidence shows (CHECK_CAUSE_FIXES): "split-differs"
    held_out: int | None = None   # samples a split leaves out of the loader's data by design (not counted)
    values: tuple | None = None   # (rank, value) for every rank: an optimizer's setting where they differ
    loaded: tuple[int, ...] | None = None  # the ranks that loaded the optimizer's state (load_state_dict)
    modules: int | None = None    # mode-differs: modules in eval mode on the ranks named
    modules_of: int | None = None  # ... out of the wrapped model's modules
    prefix: str | None = None     # load-keys-missing: the key prefix that parted the checkpoint and the model
    unexpected: int | None = None  # load-keys-missing: the given keys that matched nothing
    label: str | None = None      # printed-setting-differs: the label the ranks printed with ``values`` (engine.printed)

    @property
    def fix(self) -> str:
        return CHECK_CAUSE_FIXES.get(self.cause or "", CHECK_FIXES[self.kind])

    def to_dict(self) -> dict:
        return {**asdict(self), "ranks": list(self.ranks), "fix": self.fix}

    @classmethod
    def from_dict(cls, d: dict) -> "Finding":
        d = {k: v for k, v in d.items() if k != "fix"}
        if d.get("values") is not None:
            d["values"] = tuple((int(r), tuple(v) if isinstance(v, list) else v) for r, v in d["values"])
        if d.get("loaded") is not None:
            d["loaded"] = tuple(d["loaded"])
        return cls(**{**d, "ranks": tuple(d.get("ranks", ()))})


@dataclass(frozen=True)
class NotChecked:
    what: str                     # "replicas", "data"
    why: str                      # "no-ddp-model", "fsdp", "no-training-loader", "iterable-loader"
    ranks: tuple[int, ...] = ()
    detail: str = ""              # the kind of model or loader

    def to_dict(self) -> dict:
        return {**asdict(self), "ranks": list(self.ranks)}


@dataclass(frozen=True)
class CheckReport:
    every: int                            # checksum interval (forwards with grad)
    findings: tuple[Finding, ...] = ()
    not_checked: tuple[NotChecked, ...] = ()
    nothing: str | None = None            # "no-process-group", "no-records": nothing was compared
    ranks: tuple[int, ...] = ()           # the ranks whose records were read
    models: int = 0                       # DDP-wrapped models compared
    checksums: int = 0                    # checkpoints compared (per model, on every rank)
    loader_epochs: int = 0                # training epochs compared
    own_models: int = 0                   # optimizers over parameters no wrapper holds, compared (no DDP model)

    @property
    def clean(self) -> bool:
        return self.nothing is None and not self.findings

    def kinds(self) -> set[str]:
        return {f.kind for f in self.findings}

    def of_kind(self, kind: str) -> list[Finding]:
        return [f for f in self.findings if f.kind == kind]

    def to_dict(self) -> dict:
        return {"every": self.every, "findings": [f.to_dict() for f in self.findings],
                "not_checked": [n.to_dict() for n in self.not_checked], "nothing": self.nothing,
                "ranks": list(self.ranks), "models": self.models, "checksums": self.checksums,
                "loader_epochs": self.loader_epochs, "own_models": self.own_models}

    @classmethod
    def from_dict(cls, d: dict | None) -> "CheckReport | None":
        if not d:
            return None
        return cls(every=d["every"], findings=tuple(Finding.from_dict(f) for f in d.get("findings", ())),
                   not_checked=tuple(NotChecked(**{**n, "ranks": tuple(n.get("ranks", ()))})
                                     for n in d.get("not_checked", ())),
                   nothing=d.get("nothing"), ranks=tuple(d.get("ranks", ())), models=d.get("models", 0),
                   checksums=d.get("checksums", 0), loader_epochs=d.get("loader_epochs", 0),
                   own_models=d.get("own_models", 0))


# --- a Python traceback as text (a rank's log, a worker's re-raised traceback) -> frames ------
_TB_FRAME = re.compile(r'^(?:\[rank\d+\]: )?\s*File "(.*)", line (\d+), in (.+)$', re.M)


def parse_traceback(text: str) -> list[Frame]:
    """Frames of the last Python traceback in a rank's log, innermost first."""
    starts = [m.end() for m in re.finditer(r"Traceback \(most recent call last\):", text)]
    if not starts:
        return []
    frames = [Frame(m.group(3).strip(), m.group(1), int(m.group(2))) for m in _TB_FRAME.finditer(text, starts[-1])]
    return frames[::-1]


# evidence channels (issue 41)
# What the rank hook records at every collective a script calls, how a rank ended without a traceback,
# the threads it had, an exception re-raised from another process; and what the engine derives from the
# ranks' call records (where their call sites diverged). Records are lists as the hook writes them
# ([file, line, func]); these types read them.

def _frame(x) -> Frame | None:
    """A hook record's frame ([file, line, func] or {"file", "line", "func"}) as a Frame."""
    if not x:
        return None
    if isinstance(x, dict):
        return Frame.from_dict(x)
    return Frame(str(x[2]), str(x[0]), int(x[1] or 0))


def _frames(xs) -> tuple[Frame, ...]:
    return tuple(f for f in (_frame(x) for x in xs or ()) if f is not None)


@dataclass(frozen=True)
class InFlight:
    """An exception being handled or propagating in the thread that called a collective."""
    type: str
    message: str
    at: Frame | None              # where it was raised (its traceback's innermost frame)

    def to_dict(self) -> dict:
        return {"type": self.type, "message": self.message, "at": self.at.to_dict() if self.at else None}

    @classmethod
    def from_dict(cls, d: dict | None) -> "InFlight | None":
        if not d:
            return None
        return cls(str(d.get("type", "?")), str(d.get("message", "")), _frame(d.get("at")))


@dataclass(frozen=True)
class TensorArg:
    """A tensor argument of a recorded call, or a list of them: shape, dtype and device (a list's first entry's),
    and a list's length. No data."""
    shape: tuple[int, ...] | None = None
    dtype: str | None = None
    device: str | None = None
    length: int | None = None      # a list: how many entries (None: a single tensor)

    def to_dict(self) -> dict:
        return {"shape": list(self.shape) if self.shape is not None else None, "dtype": self.dtype,
                "device": self.device, "length": self.length}

    @classmethod
    def from_record(cls, d) -> "TensorArg | None":
        """The hook's record ([shape, dtype, device], or {"len": n, "first": [...]}) or to_dict's."""
        if isinstance(d, (list, tuple)) and len(d) == 3:
            return cls(tuple(int(x) for x in d[0]), str(d[1]), str(d[2]))
        if not isinstance(d, dict):
            return None
        if "len" in d:
            first = cls.from_record(d.get("first"))
            return cls(first.shape if first else None, first.dtype if first else None, first.device if first else None,
                       int(d["len"]))
        shape = d.get("shape")
        return cls(tuple(int(x) for x in shape) if shape is not None else None, d.get("dtype"), d.get("device"),
                   d.get("length"))


@dataclass(frozen=True)
class CallArgs:
    """The arguments of one recorded call, as the rank hook described them (bound by the function's signature)."""
    tensors: tuple[tuple[str, TensorArg], ...] = ()  # (parameter name, tensor or list), in the call's order
    src: int | None = None          # global ranks, as given
    dst: int | None = None
    group_src: int | None = None    # group-local ranks, as given
    group_dst: int | None = None
    reduce_op: str | None = None    # "SUM", "MAX", ... (the ReduceOp's name)
    group: tuple[int, ...] | None = None  # the global ranks of a group other than the default one (None: the default)
    async_op: bool | None = None

    @property
    def root(self) -> int | None:
        """The call's root (broadcast's source, reduce's destination) as a global rank: src or dst as given, else
        group_src or group_dst mapped through the group's members."""
        if self.src is not None or self.dst is not None:
            return self.src if self.src is not None else self.dst
        local = self.group_src if self.group_src is not None else self.group_dst
        if local is None:
            return None
        if self.group is None:
            return local
        return self.group[local] if 0 <= local < len(self.group) else None

    @property
    def group_root(self) -> int | None:
        """The root as a rank of the call's group."""
        local = self.group_src if self.group_src is not None else self.group_dst
        if local is not None:
            return local
        g = self.src if self.src is not None else self.dst
        if g is None or self.group is None:
            return g
        return self.group.index(g) if g in self.group else None

    def to_dict(self) -> dict:
        return {"tensors": [[k, t.to_dict()] for k, t in self.tensors], "src": self.src, "dst": self.dst,
                "group_src": self.group_src, "group_dst": self.group_dst, "reduce_op": self.reduce_op,
                "group": list(self.group) if self.group is not None else None, "async_op": self.async_op}

    @classmethod
    def from_dict(cls, d) -> "CallArgs | None":
        """The hook's record ({param: value}) or to_dict's."""
        if not isinstance(d, dict) or not d:
            return None
        if "tensors" in d and "reduce_op" in d:     # to_dict's
            return cls(tuple((str(k), TensorArg.from_record(t)) for k, t in d.get("tensors") or ()),
                       d.get("src"), d.get("dst"), d.get("group_src"), d.get("group_dst"), d.get("reduce_op"),
                       tuple(d["group"]) if d.get("group") is not None else None, d.get("async_op"))
        tensors = tuple((k, t) for k, v in d.items() if k not in _SCALAR_ARGS
                        for t in [TensorArg.from_record(v)] if t is not None)
        return cls(tensors, d.get("src"), d.get("dst"), d.get("group_src"), d.get("group_dst"), d.get("op"),
                   tuple(int(r) for r in d["group"]) if d.get("group") is not None else None, d.get("async_op"))


_SCALAR_ARGS = frozenset({"src", "dst", "group_src", "group_dst", "op", "group", "async_op"})


@dataclass(frozen=True)
class CallSite:
    """One collective (or set-up call) a rank's script called, numbered in that rank's order of calls."""
    n: int                        # the rank's n-th watched call (ranks align on it)
    op: str                       # "all_reduce", "barrier", "init_process_group", ...
    user: tuple[Frame, ...]       # the innermost user frames that led to it, innermost first
    lib: Frame | None             # the innermost library frame that called torch.distributed (Lightning's, DDP's)
    exc: InFlight | None = None   # the exception in flight in that thread at the call
    thread: str | None = None     # the calling thread's name, when not the main thread
    args: CallArgs | None = None  # its arguments as data (the hook's description; None: none recorded)

    @property
    def frame(self) -> Frame | None:
        """The user's line of the call."""
        return self.user[0] if self.user else None

    @property
    def place(self) -> tuple:
        """What two ranks compare: the op and the user's lines that led to it."""
        return (self.op,) + tuple((f.file, f.line) for f in self.user)

    def to_dict(self) -> dict:
        return {"n": self.n, "op": self.op, "user": [f.to_dict() for f in self.user],
                "lib": self.lib.to_dict() if self.lib else None,
                "exc": self.exc.to_dict() if self.exc else None, "thread": self.thread,
                **({"args": self.args.to_dict()} if self.args is not None else {})}

    @classmethod
    def from_dict(cls, d: dict) -> "CallSite":
        return cls(int(d.get("n", 0)), str(d.get("op", "?")), _frames(d.get("user")), _frame(d.get("lib")),
                   InFlight.from_dict(d.get("exc")), d.get("thread"), CallArgs.from_dict(d.get("args")))


@dataclass(frozen=True)
class ThreadStack:
    """One Python thread of a rank, with its stack (innermost first)."""
    name: str
    daemon: bool
    main: bool
    frames: tuple[Frame, ...]
    started: Frame | None = None  # the user's line that started it (the hook's wrapper of Thread.start)

    def to_dict(self) -> dict:
        return {"name": self.name, "daemon": self.daemon, "main": self.main,
                "frames": [f.to_dict() for f in self.frames],
                **({"started": self.started.to_dict()} if self.started else {})}

    @classmethod
    def from_dict(cls, d: dict) -> "ThreadStack":
        return cls(str(d.get("name", "?")), bool(d.get("daemon")), bool(d.get("main")), _frames(d.get("frames")),
                   _frame(d.get("started")))


@dataclass(frozen=True)
class Poll:
    """A file the rank's own code looked for (os.path.exists, os.path.isfile) and did not find, as the live rank
    answered (the hook's wrapper): the absolute path, how many looks missed, the user frames of the last look
    (innermost first) and how long before the answer it was."""
    path: str
    misses: int
    user: tuple[Frame, ...]
    age_s: float | None = None

    def to_dict(self) -> dict:
        return {"path": self.path, "misses": self.misses, "user": [f.to_dict() for f in self.user], "age_s": self.age_s}

    @classmethod
    def from_dict(cls, d: dict) -> "Poll":
        age = d.get("age_s")
        return cls(str(d.get("path", "")), int(d.get("misses") or 0), _frames(d.get("user")),
                   None if age is None else float(age))


@dataclass(frozen=True)
class ChildProcess:
    """A child process a rank started with multiprocessing (the hook's wrapper of ``BaseProcess.start``), as
    the live rank answered: its name, pid, daemon flag, the user's line that started it, and whether it was
    still running when the rank was read (the engine's look at the pid)."""
    name: str
    pid: int | None
    daemon: bool
    started: Frame | None
    alive: bool = False

    def to_dict(self) -> dict:
        return {"name": self.name, "pid": self.pid, "daemon": self.daemon,
                "started": self.started.to_dict() if self.started else None, "alive": self.alive}

    @classmethod
    def from_dict(cls, d: dict) -> "ChildProcess":
        return cls(str(d.get("name", "?")), d.get("pid"), bool(d.get("daemon")), _frame(d.get("started")),
                   bool(d.get("alive")))


@dataclass(frozen=True)
class Ended:
    """How a rank ended when it left no traceback: ``how`` "os._exit" (the hook's record), with its code
    and the frames that called it (innermost first)."""
    how: str
    code: int | str | None
    frames: tuple[Frame, ...]

    def to_dict(self) -> dict:
        return {"how": self.how, "code": self.code, "frames": [f.to_dict() for f in self.frames]}

    @classmethod
    def from_dict(cls, d: dict | None) -> "Ended | None":
        if not d:
            return None
        return cls(str(d.get("how", "?")), d.get("code"), _frames(d.get("frames")))


@dataclass(frozen=True)
class Nested:
    """An exception torch re-raised in this rank from another process ("Caught KeyError in DataLoader worker
    process 0"): the other process's exception type, where it was, and its own frames (innermost first),
    read from the traceback that process formatted."""
    type: str
    where: str                    # torch's words for the other process: "in DataLoader worker process 0"
    message: str                  # the other process's last traceback line (its exception's message)
    frames: tuple[Frame, ...]

    def to_dict(self) -> dict:
        return {"type": self.type, "where": self.where, "message": self.message,
                "frames": [f.to_dict() for f in self.frames]}

    @property
    def worker(self) -> int | None:
        """The DataLoader worker the exception was raised in (its number in torch's words), None for
        another kind of process."""
        m = re.fullmatch(r"in DataLoader worker process (\d+)", self.where.strip())
        return int(m.group(1)) if m else None

    @classmethod
    def from_dict(cls, d: dict | None) -> "Nested | None":
        if not d:
            return None
        return cls(str(d.get("type", "?")), str(d.get("where", "")), str(d.get("message", "")),
                   _frames(d.get("frames")))


# torch's words where it re-raises another process's exception (ExceptionWrapper.reraise): "Caught KeyError in
# DataLoader worker process 0." (a message alone, with no hook record, says this much)
_CAUGHT = re.compile(r"Caught (\w+) (in DataLoader worker process \d+)\.")


def nested_in_text(text: str) -> Nested | None:
    """The other process an exception was re-raised from, as a message's own words say it (no frames)."""
    m = _CAUGHT.search(text or "")
    return Nested(m.group(1), m.group(2), "", ()) if m else None


@dataclass(frozen=True)
class CallDivergence:
    """Where the ranks' own call records part: the last call every rank made from the same place, the first
    number at which they called from different places (or some rank made no call), and the user's branch
    between them (the condition whose block holds the odd ranks' call and not the others')."""
    n: int                                  # the first call number at which the ranks differ
    last_same: CallSite | None              # the call before it, the same on every rank (rank 0's record)
    first: dict                             # rank -> its CallSite at ``n`` (None: it made no such call)
    odd: tuple[int, ...]                    # the ranks whose call stands under ``branch`` (the others' does not)
    branch: Frame | None                    # the user's condition between the two places

    def to_dict(self) -> dict:
        return {"n": self.n, "last_same": self.last_same.to_dict() if self.last_same else None,
                "first": {str(k): v.to_dict() if v else None for k, v in self.first.items()},
                "odd": list(self.odd), "branch": self.branch.to_dict() if self.branch else None}

    @classmethod
    def from_dict(cls, d: dict | None) -> "CallDivergence | None":
        if not d:
            return None
        return cls(int(d["n"]), CallSite.from_dict(d["last_same"]) if d.get("last_same") else None,
                   {int(k): CallSite.from_dict(v) if v else None for k, v in (d.get("first") or {}).items()},
                   tuple(d.get("odd") or ()), Frame.from_dict(d["branch"]) if d.get("branch") else None)


@dataclass(frozen=True)
class ArgsDiffer:
    """The first call number every rank holds at which the ranks called the same op with arguments that must agree
    across ranks and do not (engine.callsites.args_differ): which argument, and each rank's value."""
    n: int                                  # the call number (the hook's numbering, the same on every rank)
    op: str                                 # the op every rank called there
    arg: str                                # one of ARG_KINDS: "root", "group", "reduce_op", "length", "shape", "dtype"
    param: str | None                       # the parameter it is read from ("tensor", "tensor_list"; None: the call's)
    values: tuple[tuple[int, object], ...]  # (rank, value) for every rank: a rank, a list of ranks, a name, a shape
    frames: tuple[tuple[int, Frame | None], ...] = ()  # (rank, the user's line of its call)

    @property
    def ranks_by_value(self) -> list[tuple[object, tuple[int, ...]]]:
        """(value, the ranks that passed it), the most common value first."""
        by: dict = {}
        for r, v in self.values:
            by.setdefault(repr(v), (v, []))[1].append(r)
        return sorted(((v, tuple(rs)) for v, rs in by.values()), key=lambda x: (-len(x[1]), x[1][0]))

    @property
    def minority(self) -> tuple[int, ...]:
        """The ranks that passed another value than the one most ranks passed; () when no value is passed by more
        ranks than every other (each rank its own, or a tie): then no rank is the odd one."""
        groups = self.ranks_by_value
        if len(groups) < 2 or len(groups[0][1]) == len(groups[1][1]):
            return ()
        return tuple(sorted(r for _, rs in groups[1:] for r in rs))

    def to_dict(self) -> dict:
        return {"n": self.n, "op": self.op, "arg": self.arg, "param": self.param,
                "values": [[r, list(v) if isinstance(v, tuple) else v] for r, v in self.values],
                "frames": [[r, f.to_dict() if f else None] for r, f in self.frames]}

    @classmethod
    def from_dict(cls, d: dict | None) -> "ArgsDiffer | None":
        if not d:
            return None
        return cls(int(d["n"]), str(d["op"]), str(d["arg"]), d.get("param"),
                   tuple((int(r), tuple(v) if isinstance(v, list) else v) for r, v in d.get("values") or ()),
                   tuple((int(r), Frame.from_dict(f) if f else None) for r, f in d.get("frames") or ()))


ARG_KINDS = ("root", "group", "reduce_op", "length", "shape", "dtype")


@dataclass(frozen=True)
class PrintedAt:
    """One rank's side of a printed disagreement (``PrintedDiff``): what it printed at that occurrence."""
    rank: int
    value: str | None       # the value as printed (None: it printed that line fewer times and never this one)
    line: int | None        # its line number in ``stream``, 1-based
    text: str = ""          # that line as printed, shortened
    count: int = 0          # how many times the rank printed that line
    stream: str = ""        # "stdout" or "stderr" ("" where the output was one text)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "PrintedAt":
        return cls(int(d["rank"]), d.get("value"), d.get("line"), d.get("text", ""), int(d.get("count", 0)),
                   d.get("stream", ""))


@dataclass(frozen=True)
class PrintedDiff:
    """A labelled quantity the ranks printed with different values (``ddplab.engine.printed``): the label, the
    occurrence where they first differ (the k-th time each rank printed that line, 0-based), each rank's value
    there, and how it reads as shared: ``held`` (some rank printed one value at every aligned occurrence: a
    setting), ``agreed`` (how many occurrences before it every rank printed the same). ``kind``: "value"
    (different values at one occurrence) or "count" (the same values, printed more times on some ranks, where a
    rank that printed fewer ended on its own)."""
    label: str
    kind: str                               # "value" | "count"
    occurrence: int
    values: tuple[PrintedAt, ...]           # every rank that printed the line, in rank order
    first: int                              # the rank whose line is the first disagreement (not the lowest rank's value)
    agreed: int = 0
    held: bool = False
    numeric: bool = True                    # the values are numbers (else paths)
    by_rank: bool = False                   # each value is the lowest rank's plus the rank number (a seed offset)

    def of(self, rank: int) -> PrintedAt | None:
        return next((v for v in self.values if v.rank == rank), None)

    def to_dict(self) -> dict:
        return {**asdict(self), "values": [v.to_dict() for v in self.values]}

    @classmethod
    def from_dict(cls, d: dict) -> "PrintedDiff":
        return cls(d["label"], d["kind"], int(d["occurrence"]), tuple(PrintedAt.from_dict(v) for v in d["values"]),
                   int(d["first"]), int(d.get("agreed", 0)), bool(d.get("held", False)), bool(d.get("numeric", True)),
                   bool(d.get("by_rank", False)))
