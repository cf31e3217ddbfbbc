"""``ddplab run --check``, inside each rank: record what a rank can see from inside torch, with no
collective added and nothing the script computes changed. The launcher compares the ranks' records
after the run (``ddplab.engine.check``).

Installed by the rank hook (sitecustomize.py) when the launcher sets DDPLAB_CHECK=N, right after the
script's ``import torch`` has finished. It wraps, at class level, without changing arguments or
results:
  DistributedDataParallel.__init__  to watch every DDP-wrapped model (its parameter and buffer names,
                                    whether it syncs buffers), with a checksum right after construction
  DistributedDataParallel.forward   to count forwards with grad, and note whether each was inside no_sync()
  the wrapped module's forward pre-hook (every N-th such forward, after DDP's buffer broadcast):
                                    a checksum of every parameter and buffer (their bits, summed as integers)
                                    and of each input tensor the forward was given
  optimizer step (torch's global pre-hook)  steps taken inside no_sync(), forwards per step, parameters
                                    without a gradient, steps on a watched model with no forward through DDP,
                                    steps at which none of the optimizer's parameters had a gradient,
                                    and per optimizer its param groups' hyperparameters (the numbers: lr,
                                    momentum, betas, weight_decay, ...) whenever they change, and the sum of
                                    its state's tensors at its first step and at the first step after a load
  Optimizer.load_state_dict         the optimizer's own step count at each load (a resume)
  DataLoader iterators (_reset, _next_index)  the indices each loader handed out per epoch, mapped through
                                    Subset to the underlying dataset, and the sampler's kind and epoch
  Module.train (a counter: a model's modes are read again at its next forward with grad only when it
                                    moved) and the DDP forward: the wrapped modules' train/eval state, on change
  Module.load_state_dict            a strict=False load's missing parameters, unmatched keys, and a key prefix
                                    that parts them ("module.")
  DataLoader iterators (__next__)   whether each epoch drew a batch with gradients on (an evaluation does not);
                                    for an IterableDataset read by several workers, a checksum of each batch
  init_process_group, destroy_process_group (a final checksum before it)
  FullyShardedDataParallel (FSDP1) __init__ and forward   the outermost wrap: a checksum of the module's
                                    parameters before it is sharded, whether sync_module_states was on,
                                    and at its first forward with grad whether any parameter was written
                                    since the wrap (a checkpoint loaded); its forwards with grad count
                                    as training for the loaders, as DDP's do. fully_shard: only noted.
Everything is kept in this process and written once, at exit, as ``ranks/rankN.check.json``.
A checksum reads tensors only (no random numbers, no in-place change), so training is bit for bit the
same with or without the check.
"""
import atexit
import functools
import hashlib
import os
import sys
import weakref

MAX_INDICES = 2_000_000     # per loader epoch; beyond it the epoch is marked truncated
MAX_STEPS = 100_000         # per-step lists (forwards per step) stop growing here


class _State:
    def __init__(self, every):
        self.every = every
        self.models = []            # _Model, in construction order
        self.loaders = {}           # id(loader) -> record
        self.loader_refs = []       # keep loader ids unique while their records live
        self.process_group = False
        self.fsdp = []
        self.fsdp_wraps = []        # FSDP1's outermost wraps (install's watch_fsdp)
        self.in_fsdp_init = 0
        self.steps = 0              # optimizer steps, every optimizer
        self.unwrapped_steps = 0    # steps on parameters no watched DDP model holds
        self.gradless_steps = 0     # steps at which no parameter of the optimizer had a gradient
        self.train_forwards = 0     # DDP and FSDP forwards with grad, all models
        self.optimizers = []        # _Optimizer, in the order of their first step or load
        self.mode_changes = 0       # Module.train()/eval() calls, all modules (a model's modes are read again
                                    # at its next forward only when this moved)
        self.module_loads = []      # Module.load_state_dict(strict=False) calls: what they matched
        self.in_module_load = 0
        self.errors = []


S = None


class _Model:
    def __init__(self, ddp, index):
        self.ref = weakref.ref(ddp)
        self.index = index
        mod = ddp.module
        self.names = [n for n, _ in mod.named_parameters()]
        self.buffer_names = [n for n, _ in mod.named_buffers()]
        self.param_ids = {id(p) for p in mod.parameters()}
        self.sync_buffers = bool(getattr(ddp, "forward_sync_buffers", getattr(ddp, "broadcast_buffers", True)))
        self.forwards = 0           # with grad
        self.since_step = 0
        self.last_synced = None
        self.arm = False
        self.steps = 0
        self.checkpoints = []
        self.unsynced_steps = []
        self.bypass_steps = []      # a step on its parameters with no forward through DDP since the last one
        self.accum = []             # forwards with grad per step
        self.no_grad = {}           # name -> [first step, steps]
        self.final = None
        self.mode_seen = -1         # S.mode_changes when the modes were last read
        self.modes = []             # [forwards with grad, step, modes], appended when they change

    def to_dict(self):
        return {"index": self.index, "names": self.names, "buffer_names": self.buffer_names,
                "sync_buffers": self.sync_buffers, "forwards": self.forwards, "steps": self.steps,
                "checkpoints": self.checkpoints, "unsynced_steps": self.unsynced_steps,
                "bypass_steps": self.bypass_steps, "accum": self.accum, "no_grad": self.no_grad, "final": self.final,
                "modes": self.modes}


MAX_MODE_NAMES = 32         # modules named per mode record (all are counted)
MAX_LOADS = 1_000


def _modes(module):
    """The wrapped module's train/eval state: how many of its modules (itself included) are in eval mode,
    out of how many, and the first MAX_MODE_NAMES of them as [name, type] ("" names the module itself)."""
    n, of, names = 0, 0, []
    for name, sub in module.named_modules():
        of += 1
        if not sub.training:
            n += 1
            if len(names) < MAX_MODE_NAMES:
                names.append([name, type(sub).__name__])
    return {"eval": n, "of": of, "names": names}


def _watch_modes(m, module):
    """At a forward with grad through the wrapper: the modules' modes, read again only when some module's
    train() or eval() was called since (or at a checksum forward, for a flag set by hand), recorded only
    when they changed."""
    if m.mode_seen == S.mode_changes and not m.arm:
        return
    m.mode_seen = S.mode_changes
    cur = _modes(module)
    if not m.modes or m.modes[-1][2] != cur:
        if len(m.modes) < MAX_HP_CHANGES:
            m.modes.append([m.forwards, m.steps, cur])


def _key_prefix(longer, shorter):
    """A prefix ("module.") that, taken off the keys in ``longer``, turns at least half of them into keys in
    ``shorter``; or None. Tried at the first key's dots (up to three)."""
    if not longer or not shorter:
        return None
    want = set(shorter)
    first = longer[0]
    for i in [j for j, c in enumerate(first) if c == "."][:3]:
        pre = first[:i + 1]
        hits = sum(1 for k in longer if k.startswith(pre) and k[len(pre):] in want)
        if hits * 2 >= len(longer):
            return pre
    return None


def _record_load(module, state_dict, out):
    """One Module.load_state_dict(..., strict=False): how many of the module's parameters it left
    missing, how many of the given keys matched nothing, and a prefix that parts them, if one does."""
    missing, unexpected = list(out.missing_keys), list(out.unexpected_keys)
    params = [n for n, _ in module.named_parameters()]
    gone = set(missing)
    rec = {"type": type(module).__name__, "keys": len(state_dict), "params": len(params),
           "params_missing": sum(1 for n in params if n in gone), "missing": len(missing),
           "unexpected": len(unexpected), "first_missing": missing[0] if missing else None,
           "first_unexpected": unexpected[0] if unexpected else None, "steps": S.steps,
           "prefix": None, "prefix_on": None}
    pre = _key_prefix(unexpected, missing)
    if pre is not None:
        rec["prefix"], rec["prefix_on"] = pre, "checkpoint"
    else:
        pre = _key_prefix(missing, unexpected)
        if pre is not None:
            rec["prefix"], rec["prefix_on"] = pre, "model"
    if len(S.module_loads) < MAX_LOADS:
        S.module_loads.append(rec)


MAX_HP_CHANGES = 2_000      # per optimizer; beyond it the record is marked truncated


class _Optimizer:
    """One optimizer's settings as the ranks could disagree on them: its param groups' numbers when they
    change (a learning-rate scheduler, a value set by hand, a loaded state), the steps at which its state was
    loaded, and a checksum of its state where it may have come from elsewhere (the first step, the first
    step after a load)."""
    def __init__(self, opt, index):
        self.index = index
        self.type = type(opt).__name__
        # what it optimizes, to match it across ranks: the parameters per group, and the watched DDP models
        # that hold them (a throwaway optimizer one rank made to write a checkpoint matches nothing)
        ids = {id(p) for g in opt.param_groups for p in g["params"]}
        self.sizes = [len(g["params"]) for g in opt.param_groups]
        self.models = sorted(m.index for m in S.models if m.param_ids & ids)
        shapes = repr([tuple(p.shape) for g in opt.param_groups for p in g["params"]])
        self.shapes = hashlib.sha1(shapes.encode()).hexdigest()[:16]
        self.ref = weakref.ref(opt)
        # an optimizer over parameters no DDP model holds: their checksum at its first step and at the end,
        # so ranks that each train a model of their own are seen (no wrapper to compare). The end is the job's
        # end, or the optimizer's own where it is freed before (a model built in a function that returns, as
        # imagenet main.py's main_worker): the finalizer holds its param groups, which the optimizer held anyway
        weakref.finalize(opt, _last_params_sum, self, opt.param_groups).atexit = False
        self.param_sums = []        # [step, checksum]
        self.steps = 0
        self.hp = []                # [step, [{name: value} per param group]], appended when they change
        self.loads = []             # this optimizer's step count at each load_state_dict
        self.state_sums = []        # [step, checksum of the state's tensors]
        self.truncated = False
        self.sum_due = True

    def to_dict(self):
        return {"index": self.index, "type": self.type, "sizes": self.sizes, "models": self.models,
                "shapes": self.shapes, "param_sums": self.param_sums, "steps": self.steps, "hp": self.hp, "loads": self.loads,
                "state_sums": self.state_sums, "truncated": self.truncated}


def _numbers(group):
    """A param group's hyperparameters: its numbers (and tuples of numbers: betas), not its tensors or flags."""
    out = {}
    for k, v in group.items():
        if k == "params" or isinstance(v, bool):
            continue
        if isinstance(v, (int, float)):
            out[k] = v
        elif isinstance(v, (tuple, list)) and v and len(v) <= 8 and all(
                isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
            out[k] = list(v)
        elif getattr(getattr(v, "device", None), "type", None) == "cpu" and v.numel() == 1:
            out[k] = float(v.item())        # a tensor learning rate on the CPU (no device synchronisation)
    return out


def _optimizer(opt):
    rec = opt.__dict__.get("_ddplab_opt")
    if rec is None:
        rec = _Optimizer(opt, len(S.optimizers))
        opt.__dict__["_ddplab_opt"] = rec
        S.optimizers.append(rec)
    return rec


def _watch_optimizer(torch, opt):
    """At each step of ``opt`` (before it): its hyperparameters where they changed, its state's checksum
    where it is due."""
    rec = _optimizer(opt)
    groups = [_numbers(g) for g in opt.param_groups]
    if not rec.hp or rec.hp[-1][1] != groups:
        if len(rec.hp) < MAX_HP_CHANGES:
            rec.hp.append([rec.steps, groups])
        else:
            rec.truncated = True
    if rec.sum_due:
        rec.sum_due = False
        tensors = [t for st in opt.state.values() for t in st.values()
                   if isinstance(t, torch.Tensor) and t.numel() > 0]
        rec.state_sums.append([rec.steps, sum(_sums(torch, tensors)) % (1 << 64) if tensors else None])
    if rec.steps == 0 and not rec.models:
        rec.param_sums.append([0, _params_sum(torch, opt)])
    rec.steps += 1


def _params_sum(torch, opt):
    return _groups_sum(torch, opt.param_groups)


def _groups_sum(torch, groups):
    ps = [p for g in groups for p in g["params"]]
    return sum(_sums(torch, ps)) % (1 << 64) if ps else None


def _last_params_sum(rec, groups):
    """The checksum of an optimizer's parameters after its last step, once (at the job's end, or as the
    optimizer is freed): only for one no DDP model holds."""
    torch = sys.modules.get("torch")
    if torch is None or rec.models or not rec.steps or (rec.param_sums and rec.param_sums[-1][0] == rec.steps):
        return
    try:
        rec.param_sums.append([rec.steps, _groups_sum(torch, groups)])
    except Exception as e:
        S.errors.append(f"optimizer checksum: {type(e).__name__}: {e}")


def _sums(torch, tensors):
    """Each tensor's bits summed as integers (floats viewed as same-width integers), wrapping around:
    equal tensors give equal sums, one flipped bit changes it, and the order of the additions cannot
    matter (addition modulo 2**32 or 2**64), whatever the threads. A float32 tensor is summed in int32
    (19x faster than widening to int64 first: 5.6 ms for lab 07's 16.8 M parameters on one core).
    One list back, so one device synchronisation."""
    out = []
    ints = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    with torch.no_grad():
        for t in tensors:
            t = t.detach()
            if t.is_complex():
                t = torch.view_as_real(t)
            if t.is_floating_point():
                t = t.view(ints[t.element_size()])
            acc = torch.int64 if t.element_size() == 8 else torch.int32
            out.append(t.sum(dtype=acc).to(torch.int64))
        return torch.stack(out).tolist() if out else []


def _checkpoint(torch, m, ddp, kind, buffers=True):
    mod = ddp.module
    rec = {"kind": kind, "fwd": m.forwards, "step": m.steps,
           "params": _sums(torch, list(mod.parameters()))}
    if buffers:
        rec["buffers"] = _sums(torch, list(mod.buffers()))
    return rec


def _module_sum(torch, module):
    """One checksum of all a module's parameters (``_sums``, added up modulo 2**64), or None."""
    try:
        sums = _sums(torch, list(module.parameters()))
        return sum(sums) % (1 << 64) if sums else None
    except Exception:
        return None


def _versions(module):
    """Each parameter's version counter: it moves on every in-place write (a checkpoint loaded into
    the parameters, by load_state_dict or torch.distributed.checkpoint)."""
    return tuple(p._version for p in module.parameters())


def _input_tensors(torch, args, kwargs):
    """The tensors a forward was given: its arguments, and the items of a list, tuple or dict among them
    (a batch passed as one), in order; nothing deeper."""
    out = []
    for v in list(args) + list(kwargs.values()):
        items = v.values() if isinstance(v, dict) else v if isinstance(v, (list, tuple)) else (v,)
        out += [t for t in items if isinstance(t, torch.Tensor)]
    return out


def _final(torch):
    for m in S.models:
        ddp = m.ref()
        if ddp is not None and (m.final is None or m.final["step"] != m.steps):
            try:
                # buffers only where DDP never syncs them: with the sync on, the last forward leaves them
                # rank-local by design; with it off they are each rank's own all along
                m.final = _checkpoint(torch, m, ddp, "final", buffers=not m.sync_buffers)
            except Exception as e:
                S.errors.append(f"final checksum: {type(e).__name__}: {e}")
    for rec in S.optimizers:
        opt = rec.ref()
        if opt is not None:
            _last_params_sum(rec, opt.param_groups)


_P2P = ("send", "recv", "isend", "irecv", "send_object_list", "recv_object_list", "batch_isend_irecv")


def _p2p(calls):
    """Whether the rank's kept call records hold a point-to-point call (a pipeline's stages: parameters that
    differ across ranks by design); None where no records were at hand."""
    try:
        recs = calls() if calls is not None else None
        return None if recs is None else any(c.get("op") in _P2P for c in recs.records())
    except Exception:
        return None


def _calls(calls):
    """The rank hook's call records that hold arguments (the collectives, compared across ranks by the launcher);
    None where no records were at hand."""
    try:
        recs = calls() if calls is not None else None
        return None if recs is None else [c for c in recs.records() if c.get("args")]
    except Exception:
        return None


def install(write, after_import, calls=None):
    """Called once, after ``import torch`` finished in a rank; ``write(name, dict)`` is the rank
    hook's record writer (rankN.<name>.json, only from the rank's own process); ``calls()`` the rank
    hook's records of the torch.distributed calls the script made (whether it sent point to point)."""
    global S
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import Subset, dataloader as dl

    S = _State(max(1, int(os.environ.get("DDPLAB_CHECK") or 1)))

    # --- DDP models -------------------------------------------------------------------------------
    ddp_init, ddp_forward = DDP.__init__, DDP.forward

    @functools.wraps(ddp_init)
    def init(self, *a, **k):
        ddp_init(self, *a, **k)
        try:
            m = _Model(self, len(S.models))
            self.__dict__["_ddplab_check"] = m
            S.models.append(m)
            m.checkpoints.append(_checkpoint(torch, m, self, "construct"))

            def pre_hook(module, args, kwargs):
                if m.arm:
                    m.arm = False
                    try:
                        rec = _checkpoint(torch, m, self, "forward")
                        rec["inputs"] = _sums(torch, _input_tensors(torch, args, kwargs))
                        m.checkpoints.append(rec)
                    except Exception as e:
                        S.errors.append(f"checksum: {type(e).__name__}: {e}")

            self.module.register_forward_pre_hook(pre_hook, with_kwargs=True)
        except Exception as e:
            S.errors.append(f"watch DDP: {type(e).__name__}: {e}")

    @functools.wraps(ddp_forward)
    def forward(self, *a, **k):
        m = self.__dict__.get("_ddplab_check")
        if m is not None and torch.is_grad_enabled():
            m.forwards += 1
            m.since_step += 1
            S.train_forwards += 1
            m.last_synced = bool(self.require_backward_grad_sync)
            # every N-th forward with grad, when DDP would sync buffers before it (not right after a
            # no_sync forward, which skips that sync): checksums after the sync, before the forward
            m.arm = (m.forwards - 1) % S.every == 0 and bool(self.require_forward_param_sync)
            try:
                _watch_modes(m, self.module)
            except Exception as e:
                S.errors.append(f"modes: {type(e).__name__}: {e}")
        return ddp_forward(self, *a, **k)

    DDP.__init__, DDP.forward = init, forward

    # --- modules' train/eval calls, and their state-dict loads -------------------------------------
    mod_train, mod_load = torch.nn.Module.train, torch.nn.Module.load_state_dict

    @functools.wraps(mod_train)
    def train(self, *a, **k):
        S.mode_changes += 1
        return mod_train(self, *a, **k)

    @functools.wraps(mod_load)
    def module_load(self, state_dict, *a, **k):
        S.in_module_load += 1
        try:
            out = mod_load(self, state_dict, *a, **k)
        finally:
            S.in_module_load -= 1
        strict = a[0] if a else k.get("strict", True)
        if S.in_module_load == 0 and not strict:
            try:
                _record_load(self, state_dict, out)
            except Exception as e:
                S.errors.append(f"module load: {type(e).__name__}: {e}")
        return out
    torch.nn.Module.train, torch.nn.Module.load_state_dict = train, module_load

    # --- optimizer steps --------------------------------------------------------------------------
    def _closure(args, kwargs):
        # optimizer.step(closure): the forward and backward run inside the step (Lightning's automatic
        # optimization, LBFGS), so the step is counted when it returns, after them
        return kwargs.get("closure") is not None or bool(args and callable(args[0]))

    def pre_step(opt, args, kwargs):
        if not _closure(args, kwargs):
            account(opt)

    def post_step(opt, args, kwargs):
        if _closure(args, kwargs):
            account(opt)

    def account(opt):
        try:
            S.steps += 1
            _watch_optimizer(torch, opt)
            n = sum(len(g["params"]) for g in opt.param_groups)
            cached = opt.__dict__.get("_ddplab_ids")
            if cached is None or cached[0] != n:
                cached = (n, {id(p) for g in opt.param_groups for p in g["params"]})
                opt.__dict__["_ddplab_ids"] = cached
            ids = cached[1]
            if n and all(p.grad is None for g in opt.param_groups for p in g["params"]):
                S.gradless_steps += 1
            hit = False
            for m in S.models:
                if not (m.param_ids & ids):
                    continue
                ddp = m.ref()
                if ddp is None:
                    continue
                hit = True
                if m.since_step == 0:
                    m.bypass_steps.append(m.steps)
                else:
                    if len(m.accum) < MAX_STEPS:
                        m.accum.append(m.since_step)
                    if not m.last_synced or not ddp.require_backward_grad_sync:
                        m.unsynced_steps.append(m.steps)
                for name, p in zip(m.names, ddp.module.parameters()):
                    if p.requires_grad and p.grad is None and id(p) in ids:
                        rec = m.no_grad.setdefault(name, [m.steps, 0])
                        rec[1] += 1
                m.since_step = 0
                m.steps += 1
            if not hit:
                S.unwrapped_steps += 1
        except Exception as e:
            S.errors.append(f"optimizer step: {type(e).__name__}: {e}")

    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
    register_optimizer_step_pre_hook(pre_step)
    register_optimizer_step_post_hook(post_step)

    load_opt = torch.optim.Optimizer.load_state_dict

    @functools.wraps(load_opt)
    def load_state_dict(self, *a, **k):
        out = load_opt(self, *a, **k)
        try:
            rec = _optimizer(self)
            rec.loads.append(rec.steps)
            rec.sum_due = True
        except Exception as e:
            S.errors.append(f"optimizer load: {type(e).__name__}: {e}")
        return out
    torch.optim.Optimizer.load_state_dict = load_state_dict

    # --- data loaders -----------------------------------------------------------------------------
    it_init, it_reset, it_next = dl._BaseDataLoaderIter.__init__, dl._BaseDataLoaderIter._reset, \
        dl._BaseDataLoaderIter._next_index
    it_batch = dl._BaseDataLoaderIter.__next__

    def loader_record(loader):
        rec = S.loaders.get(id(loader))
        if rec is not None:
            return rec
        ds, maps = loader.dataset, []
        while isinstance(ds, Subset):
            ind = ds.indices
            maps.append(ind.tolist() if hasattr(ind, "tolist") else list(ind))
            ds = ds.dataset
        sampler = loader.sampler
        try:
            size = len(ds)
        except TypeError:
            size = None
        try:
            length = len(loader.dataset)
        except TypeError:
            length = None
        import hashlib
        digest = hashlib.sha1(repr(maps).encode()).hexdigest()[:16] if maps else None
        rec = {"index": len(S.loader_refs), "dataset": type(ds).__name__, "size": size, "length": length,
               "subset": bool(maps), "subset_digest": digest, "sampler": type(sampler).__name__,
               "distributed": isinstance(sampler, torch.utils.data.DistributedSampler),
               "shuffle": bool(getattr(sampler, "shuffle", isinstance(sampler, torch.utils.data.RandomSampler))),
               "drop_last": bool(getattr(sampler, "drop_last", False)),
               "num_replicas": getattr(sampler, "num_replicas", None),
               "batch_size": loader.batch_size, "loader_drop_last": bool(loader.drop_last), "epochs": [], "_maps": maps,
               "iterable": isinstance(ds, torch.utils.data.IterableDataset), "num_workers": loader.num_workers}
        S.loaders[id(loader)] = rec
        S.loader_refs.append(loader)     # an id must not be reused by a later loader
        return rec

    def start_epoch(self, loader):
        try:
            rec = loader_record(loader)
            ep = {"sampler_epoch": getattr(loader.sampler, "epoch", None), "indices": [], "complete": False,
                  "truncated": False, "forwards_start": S.train_forwards, "forwards_end": S.train_forwards,
                  "grad": False}
            rec["epochs"].append(ep)
            self.__dict__["_ddplab_epoch"] = (ep, rec["_maps"])
            if rec["iterable"] and rec["num_workers"] > 1:
                # an IterableDataset read by several workers: no indices to see, so each batch's checksum
                # (only for these loaders), to see workers that each yielded the same batches
                ep["batch_sums"] = []
                self.__dict__["_ddplab_batches"] = ep
        except Exception as e:
            S.errors.append(f"loader: {type(e).__name__}: {e}")

    @functools.wraps(it_init)
    def i_init(self, loader):
        it_init(self, loader)
        start_epoch(self, loader)

    @functools.wraps(it_reset)
    def i_reset(self, loader, first_iter=False):
        it_reset(self, loader, first_iter)
        if not first_iter:          # the first epoch was started by __init__
            start_epoch(self, loader)

    @functools.wraps(it_next)
    def i_next(self):
        got = self.__dict__.get("_ddplab_epoch")
        try:
            idx = it_next(self)
        except StopIteration:
            if got is not None:
                got[0]["complete"] = True
                got[0]["forwards_end"] = S.train_forwards
            raise
        if got is not None:
            ep, maps = got
            ep["forwards_end"] = S.train_forwards
            if not ep["grad"] and torch.is_grad_enabled():
                ep["grad"] = True       # a batch drawn with gradients on: not an evaluation's
            if len(ep["indices"]) < MAX_INDICES:
                try:
                    for j in (idx if isinstance(idx, (list, tuple)) else [idx]):
                        j = int(j)
                        for mp in maps:
                            j = int(mp[j])
                        ep["indices"].append(j)
                except (TypeError, ValueError, IndexError):
                    ep["truncated"] = True
            else:
                ep["truncated"] = True
        return idx

    @functools.wraps(it_batch)
    def i_batch(self):
        ep = self.__dict__.get("_ddplab_batches")
        if ep is None:
            return it_batch(self)
        try:
            data = it_batch(self)
        except StopIteration:
            ep["complete"] = True
            raise
        try:
            if len(ep["batch_sums"]) < MAX_STEPS:
                ep["batch_sums"].append(sum(_sums(torch, _input_tensors(torch, (data,), {}))) % (1 << 64))
            else:
                ep["sums_truncated"] = True     # the epoch's checksums stop here: its counts are not whole
        except Exception as e:
            S.errors.append(f"batch checksum: {type(e).__name__}: {e}")
        return data

    dl._BaseDataLoaderIter.__init__, dl._BaseDataLoaderIter._reset, dl._BaseDataLoaderIter._next_index = \
        i_init, i_reset, i_next
    dl._BaseDataLoaderIter.__next__ = i_batch

    # --- the process group, FSDP ------------------------------------------------------------------
    pg_init, pg_destroy = dist.init_process_group, dist.destroy_process_group

    @functools.wraps(pg_init)
    def init_process_group(*a, **k):
        out = pg_init(*a, **k)
        S.process_group = True
        return out

    @functools.wraps(pg_destroy)
    def destroy_process_group(*a, **k):
        _final(torch)
        return pg_destroy(*a, **k)

    for mod in (dist, sys.modules.get("torch.distributed.distributed_c10d")):
        if mod is not None:
            mod.init_process_group, mod.destroy_process_group = init_process_group, destroy_process_group

    def watch_fsdp():
        fsdp = sys.modules["torch.distributed.fsdp"]
        cls = getattr(fsdp, "FullyShardedDataParallel", None)
        if cls is not None:
            f_init, f_forward = cls.__init__, cls.forward

            @functools.wraps(f_init)
            def f(self, *a, **k):
                outer = S.in_fsdp_init == 0
                before = _module_sum(torch, a[0] if a else k.get("module")) if outer else None
                S.in_fsdp_init += 1
                try:
                    f_init(self, *a, **k)
                finally:
                    S.in_fsdp_init -= 1
                if "FullyShardedDataParallel" not in S.fsdp:
                    S.fsdp.append("FullyShardedDataParallel")
                if outer:
                    try:
                        rec = {"index": len(S.fsdp_wraps), "sum": before,
                               "sync_module_states": bool(k.get("sync_module_states", False)),
                               "written_before_training": None}
                        self.__dict__["_ddplab_wrap"] = (rec, _versions(self))
                        S.fsdp_wraps.append(rec)
                    except Exception as e:
                        S.errors.append(f"watch FSDP: {type(e).__name__}: {e}")

            @functools.wraps(f_forward)
            def forward(self, *a, **k):
                if torch.is_grad_enabled():
                    S.train_forwards += 1
                    wrap = self.__dict__.get("_ddplab_wrap")
                    if wrap is not None and wrap[0]["written_before_training"] is None:
                        wrap[0]["written_before_training"] = _versions(self) != wrap[1]
                return f_forward(self, *a, **k)
            cls.__init__, cls.forward = f, forward
        shard = getattr(fsdp, "fully_shard", None)
        if shard is not None:
            @functools.wraps(shard)
            def fully_shard(*a, **k):
                if "fully_shard" not in S.fsdp:
                    S.fsdp.append("fully_shard")
                return shard(*a, **k)
            fsdp.fully_shard = fully_shard

    if "torch.distributed.fsdp" in sys.modules:
        watch_fsdp()
    else:
        after_import("torch.distributed.fsdp", watch_fsdp)

    def at_exit():
        try:
            if not S.process_group and dist.is_available() and dist.is_initialized():
                S.process_group = True
            _final(torch)
            loaders = []
            for rec in sorted(S.loaders.values(), key=lambda r: r["index"]):
                loaders.append({k: v for k, v in rec.items() if not k.startswith("_")})
            write("check.json", {"every": S.every, "process_group": S.process_group, "fsdp": S.fsdp,
                            "fsdp_wraps": S.fsdp_wraps,
                            "steps": S.steps, "unwrapped_steps": S.unwrapped_steps,
                            "train_forwards": S.train_forwards, "module_loads": S.module_loads,
                            "gradless_steps": S.gradless_steps,
                            "optimizers": [o.to_dict() for o in S.optimizers],
                            "p2p": _p2p(calls), "calls": _calls(calls),
                            "models": [m.to_dict() for m in S.models], "loaders": loaders, "errors": S.errors})
        except Exception as e:
            sys.stderr.write(f"[ddplab] --check could not write its records: {type(e).__name__}: {e}\n")

    atexit.register(at_exit)
