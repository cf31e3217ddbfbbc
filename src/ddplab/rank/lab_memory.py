"""Memory for lab scripts: cap and measure one rank's memory the same way on a CPU (RLIMIT_DATA,
/proc/self/status) and on a GPU (the caching allocator), tell an out-of-memory error, and move a rank
into a memory cgroup of its own so the kernel's OOM killer ends it. Imported by lab scripts only."""
from __future__ import annotations

import ctypes
import resource

import torch
import torch.distributed as dist

from ddplab.rank import lab


def is_oom(e: BaseException) -> bool:
    return isinstance(e, torch.OutOfMemoryError) or "can't allocate memory" in str(e)


class Memory:
    """Cap and measure this rank's memory the same way on both devices (MiB above the baseline)."""

    def __init__(self, device: torch.device):
        self.device, self.cuda = device, device.type == "cuda"
        self.rlimit = resource.getrlimit(resource.RLIMIT_DATA)
        if not self.cuda:
            # glibc keeps freed blocks below its (self-raising) mmap threshold in the heap, so peak RSS
            # would stop moving after the first big step. Blocks >= 64 KiB in their own mmap are given
            # back on free: RSS then follows the live tensors (M_MMAP_THRESHOLD is -3 in malloc.h).
            ctypes.CDLL("libc.so.6").mallopt(-3, 64 * 1024)

    def _status(self, key: str) -> float:
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) / 1024 for l in f if l.startswith(key + ":"))

    def reset_peak(self) -> None:
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            with open("/proc/self/clear_refs", "w") as f:   # "5" resets VmHWM (peak RSS) to the current RSS
                f.write("5")
        self.base = self.now()

    def now(self) -> float:
        return torch.cuda.memory_allocated(self.device) / 2**20 if self.cuda else self._status("VmRSS")

    def peak_above_base(self) -> float:
        peak = torch.cuda.max_memory_allocated(self.device) / 2**20 if self.cuda else self._status("VmHWM")
        return round(peak - self.base, 1)

    def cap(self, limit_mb: float, model_mb: float) -> None:
        """Allow `limit_mb` for model + optimizer + activations, on top of what torch itself holds."""
        if self.cuda:  # the caching allocator counts only tensors, so the fraction is the budget itself
            torch.cuda.empty_cache()
            total = torch.cuda.get_device_properties(self.device).total_memory / 2**20
            torch.cuda.set_per_process_memory_fraction(min(1.0, limit_mb / total), self.device)
        else:
            # RLIMIT_DATA, not RLIMIT_AS: measured here, a rank maps ~890 MiB of address space (VmSize)
            # after DDP's first step but only ~290 MiB is private data (VmData); thread stacks and
            # glibc arena reservations count in AS and move with thread counts, so an AS cap is
            # noisy. DATA (Linux >= 4.7) counts heap + private anonymous mmaps: where tensors live.
            # The soft limit moves, the hard limit stays, so the rank can lift the cap again.
            data_mb = self._status("VmData")
            resource.setrlimit(resource.RLIMIT_DATA, (int((data_mb - model_mb + limit_mb) * 2**20), self.rlimit[1]))

    def lift(self) -> None:
        if self.cuda:
            torch.cuda.set_per_process_memory_fraction(1.0, self.device)
        else:
            resource.setrlimit(resource.RLIMIT_DATA, self.rlimit)


def enter_memory_cgroup(limit_mb: float) -> dict:
    """Move this process into a new child memory cgroup of its own cgroup, limited to ``limit_mb`` MiB of
    new charges with no swap, so that the KERNEL's OOM killer ends it (SIGKILL) when it goes over. The
    path is recorded (event "cgroup") so the launcher's side can remove the directory once the job is over;
    empty leftovers of earlier runs are removed here first. Raises SystemExit (one line) where not permitted."""
    import glob
    import os

    lines = open("/proc/self/cgroup").read().splitlines()
    v1 = next((l.split(":", 2)[2] for l in lines if l.split(":")[1] == "memory"), None)
    if v1 is not None and os.path.isdir("/sys/fs/cgroup/memory"):
        parent, files = "/sys/fs/cgroup/memory" + v1.rstrip("/"), {"memory.limit_in_bytes": None, "memory.memsw.limit_in_bytes": None}
    else:
        v2 = next((l.split(":", 2)[2] for l in lines if l.startswith("0::")), "/")
        parent = "/sys/fs/cgroup" + v2.rstrip("/")
        ctl = os.path.join(parent, "cgroup.subtree_control")
        if not os.path.exists(ctl) or "memory" not in open(ctl).read().split():
            raise SystemExit(f"[oom-killer] the memory controller is not enabled for children of {parent}: not tested here")
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
        lab.record("cgroup", path=path, limit_mb=limit_mb, version=1 if "memory.limit_in_bytes" in files else 2)
        with open(os.path.join(path, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))                      # from here on, new memory is charged to the limit
    except OSError as e:
        try:
            os.rmdir(path)
        except OSError:
            pass
        raise SystemExit(f"[oom-killer] cannot make a memory cgroup under {parent} ({e.strerror}): not tested here") from None
    return {"path": path}


def largest_fitting(mem: Memory, limit_mb: float, model_mb: float, batch: int, step_of, probe, **facts) -> int:
    """The largest power-of-two micro-batch up to ``batch`` whose ``step_of(m)`` (a forward and backward
    of ``probe``) fits under the cap, agreed on by every rank (MIN). Stops trying once a size fails; the
    sizes that do not fit are measured with the cap lifted, for the plot. Records each probe."""
    best, m = 0, 1

    def peak_of(m: int) -> float:
        mem.reset_peak()
        try:
            step_of(m)
            return mem.peak_above_base()
        finally:
            probe.zero_grad(set_to_none=True)

    while m <= batch:                                               # powers of two up to the batch
        fits = best == m // 2                                       # stop trying once one size failed
        if fits:
            try:
                peak = peak_of(m)
                best = m
            except RuntimeError as e:
                if not is_oom(e):
                    raise
                fits = False
        if not fits and limit_mb > 0:                               # for the plot: what it would need, cap lifted
            mem.lift()
            peak = peak_of(m)
            mem.cap(limit_mb, model_mb)
        lab.record("probe", micro=m, length=facts["length"], peak_mb=peak, fits=fits)
        m *= 2
    agreed = torch.tensor([max(best, 1)], device=mem.device)
    dist.all_reduce(agreed, op=dist.ReduceOp.MIN)                   # the same micro-batch on every rank
    return int(agreed)


def check_gradient(model, ref, full_backward, mem: Memory, limit_mb: float, model_mb: float) -> None:
    """The accumulated, all-reduced gradient of DDP ``model`` against the full batch's, computed without
    the cap on ``ref`` (a plain copy, no DDP hooks: ``full_backward()`` runs its backward), averaged over
    ranks by hand. Also measures the full batch's peak."""
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
    lab.record("grad_check", max_abs_diff=float((acc - full).abs().max()), full_batch_peak_mb=full_peak)
