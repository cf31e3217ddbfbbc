"""Lab 02 - out of memory on one rank, and the OOM that turns into a hang.

Run it by itself (gloo on CPU, NCCL when each rank has a GPU):

    torchrun --nproc-per-node 2 labs/02_oom.py --variant oom --mem-limit-mb 48
    sudo torchrun --nproc-per-node 2 labs/02_oom.py --variant oom-killer   # a writable cgroup
    ddplab run 02 --variant skip-batch     # the same, judged by progress, with each rank's stack

Each rank pads its batch of 16 sequences to the longest one in it, and a per-token MLP runs on the
padded tensor, so activation memory grows with batch x longest length. At step 2 the last rank
draws one long document (384 tokens instead of 8-32): its padded batch is ~12x bigger and does not
fit under the memory cap (--mem-limit-mb: model + optimizer + activations, on top of what torch
itself uses). On CPU the cap is a real rlimit on the rank (Memory.cap), on a GPU the CUDA
allocator's limit: both make the allocation FAIL with a Python exception. The kernel's OOM killer
does something else: it SIGKILLs the process, which leaves no Python message at all. `oom-killer`
runs that for real: the last rank moves itself into a child memory cgroup (v2 memory.max +
memory.swap.max=0, or v1 memory.limit_in_bytes) and the kernel kills it at the long step. That
needs a cgroup the user may write to (root, usually).
Notebook: notebooks/02_oom.ipynb; workbook module: ddplab.course.lab02.

Variants (each one's training step is a function in STEPS):
  oom                     the allocation fails on the last rank; torchrun ends the others.
  oom-killer              no rlimit: the last rank runs under a cgroup memory limit; the kernel
                          SIGKILLs it.
  skip-batch              the usual `except OOM: continue` on the failing rank only -> the others
                          wait in DDP's all-reduce for a batch that never comes: a hang.
  fixed-accumulate        the largest micro-batch that fits (measured), gradient accumulation under
                          no_sync(): the same effective batch, checked against the full batch's
                          gradient.
  fixed-coordinated-skip  every rank learns whether any rank failed (all-reduce of a flag): all
                          skip.
"""
import contextlib
import ctypes
import resource

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from ddplab.rank import lab

LAB = {
    "title": "Out of memory, and the OOM that turns into a hang",
    "article": "000_5eac2459042e419e.txt",
    "nproc": 2,
    "min_nproc": 2,
    "variants": {
        "oom": {
            "expect": "failed", "signature": "cpu-oom",
            "about": "the last rank's padded batch does not fit; the allocation fails and "
                     "torchrun ends the others"},
        "oom-killer": {
            "expect": "failed", "signature": "rank-killed",
            "about": "a cgroup memory limit on the last rank: the kernel's OOM killer SIGKILLs "
                     "it, no Python error (needs a writable memory cgroup)"},
        "skip-batch": {
            "expect": "hung", "signature": "hang-different-collectives",
            "about": "catch the OOM and skip the batch on that rank only: the others wait in "
                     "DDP's all-reduce"},
        "fixed-accumulate": {
            "expect": "ok", "signature": None,
            "about": "largest micro-batch that fits (measured) + gradient accumulation under "
                     "no_sync()"},
        "fixed-coordinated-skip": {
            "expect": "ok", "signature": None,
            "about": "all-reduce an 'I failed' flag first, so every rank skips the same batch"},
    },
    # read by ddplab.course.lab02 to reject a cap too small for the model before any rank starts
    "model": {"features": 32, "hidden": 512, "batch": 16, "long_len": 384, "steps": 4,
              "long_step": 2},
    "knobs": {
        "mem_limit_mb": {
            "type": "float", "default": 48.0, "range": [0, None],
            "help": "per-rank budget for model + optimizer + activations in MiB (0: no cap)"},
        "batch": {"type": "int", "default": 16, "range": [1, None],
                  "help": "sequences per rank per step"},
        "accum": {
            "type": "int", "default": 0, "choices": [0, 1, 2, 4, 8, 16],
            "help": "fixed-accumulate: micro-batches per step (0: find the largest that fits)"},
        "pg_timeout_s": {
            "type": "float", "default": None, "range": [0.1, None],
            "help": "init_process_group(timeout=...) in seconds (None: PyTorch's 30 minutes)"},
    },
}
M = LAB["model"]


class TokenMLP(nn.Module):
    def __init__(self, features: int = M["features"], hidden: int = M["hidden"]):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(features, hidden), nn.GELU(), nn.Linear(hidden, hidden),
                                 nn.GELU(), nn.Linear(hidden, 1))

    def forward(self, x, mask):               # x (B, T, F), mask (B, T): 1 for real tokens
        per_token = self.net(x).squeeze(-1)   # activations ~ B x T x hidden: this is what runs out
        return (per_token * mask).sum(1) / mask.sum(1)   # masked mean: padding changes nothing


def batch_for(rank: int, world: int, step: int, size: int):
    """A padded batch of `size` sequences; the last rank draws one long document at the long
    step."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    lens = torch.randint(8, 33, (size,), generator=g)
    if rank == world - 1 and step == M["long_step"]:
        lens[0] = M["long_len"]
    x = torch.randn(size, int(lens.max()), M["features"], generator=g)
    mask = (torch.arange(x.shape[1])[None, :] < lens[:, None]).float()
    y = (x[..., 0] * mask).sum(1) / lens
    return x, mask, y


def seq_loss(model, x, mask, y, total: int):
    """Sum of squared errors / full batch size: micro-batch losses add up to the full-batch
    mean."""
    return ((model(x, mask) - y) ** 2).sum() / total


# ---- the training step of each variant ----------------------------------------------------------
# Each takes the DDP model, the optimizer and one padded batch; it returns True when it skipped it.

def plain_step(model, opt, x, mask, y, step, micro) -> bool:
    # BROKEN: raises (oom) or is SIGKILLed (oom-killer) on the rank whose batch does not fit
    seq_loss(model, x, mask, y, len(y)).backward()  # BROKEN
    return False


def skip_step(model, opt, x, mask, y, step, micro) -> bool:
    try:
        seq_loss(model, x, mask, y, len(y)).backward()
    except RuntimeError as e:
        if not is_oom(e):
            raise
        lab.record("skipped", step=step, why=str(e).split("\n")[0][-90:])
        opt.zero_grad()
        return True  # BROKEN: only this rank skips; the others are already in backward's
        #              all-reduce, which now waits for this rank forever
    return False


def accumulate_step(model, opt, x, mask, y, step, micro) -> bool:
    for i in range(0, len(y), micro):      # FIX (2/2): micro-batches, the same effective batch
        sl = slice(i, i + micro)
        last = i + micro >= len(y)
        # all-reduce once, on the last micro-batch
        with (model.no_sync() if not last else contextlib.nullcontext()):
            seq_loss(model, x[sl], mask[sl], y[sl], len(y)).backward()
    return False


def coordinated_step(model, opt, x, mask, y, step, micro) -> bool:
    failed = torch.zeros(1, device=x.device)
    try:
        out = model(x, mask)               # forward is where this model runs out
    except RuntimeError as e:
        if not is_oom(e):
            raise
        failed += 1
        out = None
    dist.all_reduce(failed)                # FIX: everyone learns if anyone failed ...
    if failed.item() > 0:
        lab.record("skipped", step=step, ranks_failed=int(failed.item()))
        opt.zero_grad()
        return True                        # ... and every rank skips together
    (((out - y) ** 2).mean()).backward()
    return False


STEPS = {"oom": plain_step, "oom-killer": plain_step, "skip-batch": skip_step,
         "fixed-accumulate": accumulate_step, "fixed-coordinated-skip": coordinated_step}


def main(variant: str, *, mem_limit_mb: float, batch: int, accum: int,
         pg_timeout_s: float | None) -> None:
    killer = variant == "oom-killer"
    ctx = lab.setup(timeout_s=pg_timeout_s, device="cpu" if killer else None)  # host memory
    rank, world, device = ctx.rank, ctx.world_size, ctx.device
    torch.manual_seed(0)
    ids = [device.index] if device.type == "cuda" else None
    model = DDP(TokenMLP().to(device), device_ids=ids)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    # params + grads + momentum
    model_mb = sum(p.numel() * p.element_size() for p in model.parameters()) * 3 / 2**20
    # warm-up step: DDP's lazy buffers exist before the cap
    x, mask, y = batch_for(rank, world, 0, 2)
    seq_loss(model, x, mask, y, 2).backward()
    opt.zero_grad(set_to_none=False)
    mem = Memory(device)
    if killer:
        if rank == world - 1 and mem_limit_mb > 0:
            # the kernel, not malloc, enforces this one
            enter_memory_cgroup(mem_limit_mb - model_mb)
    elif mem_limit_mb > 0:
        mem.cap(mem_limit_mb, model_mb)
    micro = batch
    if variant == "fixed-accumulate":
        micro = (max(1, batch // accum) if accum
                 else find_micro_batch(mem, mem_limit_mb, model_mb, device, batch))  # FIX (1/2)
    cap = "cgroup memory limit" if killer else "cuda fraction" if mem.cuda else "RLIMIT_DATA"
    lab.record("start", variant=variant, device=str(device), backend=ctx.backend,
               mem_limit_mb=mem_limit_mb, model_mb=round(model_mb, 2), batch=batch, micro=micro,
               cap=cap)

    for step in range(M["steps"]):
        x, mask, y = (t.to(device) for t in batch_for(rank, world, step, batch))
        mem.reset_peak()
        if STEPS[variant](model, opt, x, mask, y, step, micro):
            continue
        peak = mem.peak_above_base()
        if variant == "fixed-accumulate" and step == M["long_step"]:
            ref = TokenMLP().to(x.device)          # a plain copy: the full batch's gradient
            ref.load_state_dict(model.module.state_dict())
            check_gradient(model, ref, lambda: seq_loss(ref, x, mask, y, len(y)).backward(), mem,
                           mem_limit_mb, model_mb)
        opt.step()
        opt.zero_grad()
        lab.record("step", step=step, tokens=int(x.shape[0] * x.shape[1]), peak_mb=peak)

    lab.record("loop_done")
    dist.barrier()                   # e.g. "wait for everyone before saving the checkpoint"
    lab.record("done")
    lab.teardown()


# ---- measuring and capping one rank's memory ----------------------------------------------------

def is_oom(e: BaseException) -> bool:
    return isinstance(e, torch.OutOfMemoryError) or "can't allocate memory" in str(e)


class Memory:
    """Cap and measure this rank's memory the same way on both devices (MiB above the baseline)."""

    def __init__(self, device: torch.device):
        self.device, self.cuda = device, device.type == "cuda"
        self.rlimit = resource.getrlimit(resource.RLIMIT_DATA)
        if not self.cuda:
            # glibc keeps freed blocks below its (self-raising) mmap threshold in the heap, so peak
            # RSS
            # would stop moving after the first big step. Blocks >= 64 KiB in their own mmap are
            # given
            # back on free: RSS then follows the live tensors (M_MMAP_THRESHOLD is -3 in malloc.h).
            ctypes.CDLL("libc.so.6").mallopt(-3, 64 * 1024)

    def _status(self, key: str) -> float:
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) / 1024 for l in f if l.startswith(key + ":"))

    def reset_peak(self) -> None:
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            # "5" resets VmHWM (peak RSS) to the current RSS
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        self.base = self.now()

    def now(self) -> float:
        if self.cuda:
            return torch.cuda.memory_allocated(self.device) / 2**20
        return self._status("VmRSS")

    def peak_above_base(self) -> float:
        peak = (torch.cuda.max_memory_allocated(self.device) / 2**20 if self.cuda
                else self._status("VmHWM"))
        return round(peak - self.base, 1)

    def cap(self, limit_mb: float, model_mb: float) -> None:
        """Allow `limit_mb` for model + optimizer + activations, on top of what torch itself
        holds."""
        # the caching allocator counts only tensors, so the fraction is the budget itself
        if self.cuda:
            torch.cuda.empty_cache()
            total = torch.cuda.get_device_properties(self.device).total_memory / 2**20
            torch.cuda.set_per_process_memory_fraction(min(1.0, limit_mb / total), self.device)
        else:
            # RLIMIT_DATA, not RLIMIT_AS: measured here, a rank maps ~890 MiB of address space
            # (VmSize)
            # after DDP's first step but only ~290 MiB is private data (VmData); thread stacks and
            # glibc arena reservations count in AS and move with thread counts, so an AS cap is
            # noisy. DATA (Linux >= 4.7) counts heap + private anonymous mmaps: where tensors live.
            # The soft limit moves, the hard limit stays, so the rank can lift the cap again.
            data_mb = self._status("VmData")
            soft = int((data_mb - model_mb + limit_mb) * 2**20)
            resource.setrlimit(resource.RLIMIT_DATA, (soft, self.rlimit[1]))

    def lift(self) -> None:
        if self.cuda:
            torch.cuda.set_per_process_memory_fraction(1.0, self.device)
        else:
            resource.setrlimit(resource.RLIMIT_DATA, self.rlimit)


def enter_memory_cgroup(limit_mb: float) -> dict:
    """Move this process into a new child memory cgroup of its own cgroup, limited to ``limit_mb``
    MiB of new charges with no swap, so that the KERNEL's OOM killer ends it (SIGKILL) when it goes
    over. The path is recorded (event "cgroup") so the launcher's side can remove the directory
    once the job is over; empty leftovers of earlier runs are removed here first. Raises SystemExit
    (one line) where not permitted."""
    import glob
    import os

    lines = open("/proc/self/cgroup").read().splitlines()
    v1 = next((l.split(":", 2)[2] for l in lines if l.split(":")[1] == "memory"), None)
    if v1 is not None and os.path.isdir("/sys/fs/cgroup/memory"):
        parent = "/sys/fs/cgroup/memory" + v1.rstrip("/")
        files = {"memory.limit_in_bytes": None, "memory.memsw.limit_in_bytes": None}
    else:
        v2 = next((l.split(":", 2)[2] for l in lines if l.startswith("0::")), "/")
        parent = "/sys/fs/cgroup" + v2.rstrip("/")
        ctl = os.path.join(parent, "cgroup.subtree_control")
        if not os.path.exists(ctl) or "memory" not in open(ctl).read().split():
            raise SystemExit(f"[oom-killer] the memory controller is not enabled for children of "
                             f"{parent}: not tested here")
        files = {"memory.max": None, "memory.swap.max": "0"}
    for old in glob.glob(os.path.join(parent, "ddplab-oom-*")):
        try:
            os.rmdir(old)                                  # an empty leftover of an earlier run
        except OSError:
            pass
    path = os.path.join(parent, f"ddplab-oom-{os.getpid()}")
    limit = str(int(limit_mb * 2**20))
    try:
        os.mkdir(path)
        for name, value in files.items():
            if os.path.exists(os.path.join(path, name)):  # memsw exists only with swap accounting
                with open(os.path.join(path, name), "w") as f:
                    f.write(value or limit)
        version = 1 if "memory.limit_in_bytes" in files else 2
        lab.record("cgroup", path=path, limit_mb=limit_mb, version=version)
        with open(os.path.join(path, "cgroup.procs"), "w") as f:
            # from here on, new memory is charged to the limit
            f.write(str(os.getpid()))
    except OSError as e:
        try:
            os.rmdir(path)
        except OSError:
            pass
        raise SystemExit(f"[oom-killer] cannot make a memory cgroup under {parent} "
                         f"({e.strerror}): not tested here") from None
    return {"path": path}


def largest_fitting(mem: Memory, limit_mb: float, model_mb: float, batch: int, step_of, probe,
                    **facts) -> int:
    """The largest power-of-two micro-batch up to ``batch`` whose ``step_of(m)`` (a forward and
    backward of ``probe``) fits under the cap, agreed on by every rank (MIN). Stops trying once a
    size fails; the sizes that do not fit are measured with the cap lifted, for the plot. Records
    each probe."""
    best, m = 0, 1

    def peak_of(m: int) -> float:
        mem.reset_peak()
        try:
            step_of(m)
            return mem.peak_above_base()
        finally:
            probe.zero_grad(set_to_none=True)

    while m <= batch:                                               # powers of two up to the batch
        # stop trying once one size failed
        fits = best == m // 2
        if fits:
            try:
                peak = peak_of(m)
                best = m
            except RuntimeError as e:
                if not is_oom(e):
                    raise
                fits = False
        # for the plot: what it would need, cap lifted
        if not fits and limit_mb > 0:
            mem.lift()
            peak = peak_of(m)
            mem.cap(limit_mb, model_mb)
        lab.record("probe", micro=m, length=facts["length"], peak_mb=peak, fits=fits)
        m *= 2
    agreed = torch.tensor([max(best, 1)], device=mem.device)
    # the same micro-batch on every rank
    dist.all_reduce(agreed, op=dist.ReduceOp.MIN)
    return int(agreed)


def check_gradient(model, ref, full_backward, mem: Memory, limit_mb: float,
                   model_mb: float) -> None:
    """The accumulated, all-reduced gradient of DDP ``model`` against the full batch's, computed
    without the cap on ``ref`` (a plain copy, no DDP hooks: ``full_backward()`` runs its backward),
    averaged over ranks by hand. Also measures the full batch's peak."""
    acc = torch.cat([p.grad.flatten() for p in model.parameters()])
    mem.lift()
    mem.reset_peak()
    full_backward()
    full_peak = mem.peak_above_base()
    if limit_mb > 0:
        mem.cap(limit_mb, model_mb)
    full = torch.cat([p.grad.flatten() for p in ref.parameters()])
    dist.all_reduce(full)
    full /= dist.get_world_size()
    lab.record("grad_check", max_abs_diff=float((acc - full).abs().max()),
               full_batch_peak_mb=full_peak)


def find_micro_batch(mem: Memory, limit_mb: float, model_mb: float, device, batch: int) -> int:
    """FIX (1/2): measure the largest micro-batch that fits the worst-case length, like
    accelerate's find_executable_batch_size. Local only (no collectives inside), so catching OOM
    here is safe."""
    rank, world = dist.get_rank(), dist.get_world_size()
    worst = max(batch_for(rank, world, s, batch)[0].shape[1] for s in range(M["steps"]))
    longest = torch.tensor([worst], device=device)
    dist.all_reduce(longest, op=dist.ReduceOp.MAX)          # every rank probes the same shape
    probe, T = TokenMLP().to(device), int(longest)

    # one forward and backward of m sequences
    def step_of(m: int) -> None:
        seq_loss(probe, torch.randn(m, T, M["features"], device=device),
                 torch.ones(m, T, device=device), torch.zeros(m, device=device), m).backward()
    return largest_fitting(mem, limit_mb, model_mb, batch, step_of, probe, length=T)


def _too_small(variant: str, knobs: dict) -> str | None:
    model_mb = sum(q.numel() * 4 for q in TokenMLP().parameters()) * 3 / 2**20
    if 0 < knobs["mem_limit_mb"] <= model_mb:
        return (f"--mem-limit-mb {knobs['mem_limit_mb']:g} cannot hold the model itself "
                f"({model_mb:.1f} MiB); use 0 (no cap) or more")
    return None


if __name__ == "__main__":
    from ddplab.rank import lab_args

    variant, knobs = lab_args.parse(LAB, __doc__, check=_too_small)
    main(variant, **knobs)
