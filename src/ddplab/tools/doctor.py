"""``ddplab doctor``: what this machine can run, checked rather than assumed."""
from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from ddplab.rank import ports
from ddplab.engine import stacks
from ddplab.defaults import TORCHRUN_PORT


@dataclass(frozen=True)
class Item:
    name: str
    ok: bool
    detail: str
    fix: str = ""

    def to_dict(self) -> dict:
        return {"name": self.name, "ok": self.ok, "detail": self.detail, "fix": self.fix}


@dataclass(frozen=True)
class Report:
    items: tuple[Item, ...]
    facts: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(i.ok for i in self.items)

    def item(self, name: str) -> Item:
        return next(i for i in self.items if i.name == name)

    def to_dict(self) -> dict:
        return {"ok": self.ok, "items": [i.to_dict() for i in self.items], "facts": self.facts}

    def text(self) -> str:
        lines = []
        for i in self.items:
            lines.append(f"{'ok  ' if i.ok else 'FIX '} {i.name:<14} {i.detail}" + (f"\n      -> {i.fix}" if i.fix and not i.ok else ""))
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        import html
        rows = "".join(f"<tr><td>{'✅' if i.ok else '❌'}</td><td>{html.escape(i.name)}</td><td>{html.escape(i.detail)}"
                       f"{'<br><i>' + html.escape(i.fix) + '</i>' if i.fix and not i.ok else ''}</td></tr>" for i in self.items)
        return f"<table>{rows}</table>"


def _torch_facts() -> dict:
    import torch
    import torch.distributed as dist

    return {
        "torch": torch.__version__,
        "gloo": dist.is_available() and dist.is_gloo_available(),
        "nccl": dist.is_available() and dist.is_nccl_available(),
        "gpus": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        "gpu_names": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else [],
    }


def pyspy_permitted(timeout_s: float = 10.0) -> tuple[bool, str]:
    """Can py-spy read a process it did not start? It is tried on a sibling process, exactly the
    situation of the launcher's py-spy and a rank (both children of different parents)."""
    if stacks.pyspy_path() is None:
        return False, "py-spy is not installed"
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        time.sleep(0.3)
        frames, why = stacks.pyspy_dump(child.pid, timeout_s)
        return (frames is not None), (why or "py-spy read a sibling process's stack")
    finally:
        child.kill()
        child.wait()


def ptrace_scope() -> str | None:
    p = Path("/proc/sys/kernel/yama/ptrace_scope")
    return p.read_text().strip() if p.exists() else None


def doctor(port: int = TORCHRUN_PORT) -> Report:
    items = []
    facts = {"python": sys.version.split()[0], "platform": platform.platform(), "cores": os.cpu_count()}
    try:
        facts.update(_torch_facts())
        items.append(Item("torch", True, f"torch {facts['torch']}"))
        items.append(Item("gloo", bool(facts["gloo"]), "available" if facts["gloo"] else "missing",
                          "reinstall torch: the CPU labs need the gloo backend"))
        gpu = f"{facts['gpus']} GPU(s){': ' + ', '.join(facts['gpu_names']) if facts['gpu_names'] else ''}"
        items.append(Item("nccl / GPUs", True, f"NCCL {'available' if facts['nccl'] else 'not available'}; {gpu}"
                          + ("" if facts["gpus"] else " (labs run on CPU with gloo)")))
    except ImportError as e:
        items.append(Item("torch", False, f"cannot import torch: {e}", "make workbook (or: pip install -c constraints.txt -e .)"))
    ok, why = pyspy_permitted()
    scope = ptrace_scope()
    facts.update({"pyspy": ok, "ptrace_scope": scope})
    items.append(Item("py-spy", ok, why + (f" (ptrace_scope={scope})" if scope is not None else ""),
                      "hang stacks will come from the faulthandler fallback; for py-spy run as root, "
                      "or `sudo sysctl kernel.yama.ptrace_scope=0`"))
    cores = os.cpu_count() or 1
    gpus = facts.get("gpus", 0)
    sensible = gpus if gpus else min(cores, 4)
    facts["sensible_nproc"] = max(2, sensible)
    items.append(Item("cores", cores >= 2, f"{cores} CPU core(s): run labs with --nproc {max(2, sensible)}"
                      + (" (more ranks than cores share them: timings get noisy)" if cores < 2 else ""),
                      "the labs still run on 1 core, slowly"))
    st = ports.check_port(port)
    facts["port"] = st.to_dict()
    items.append(Item(f"port {port}", st.free, st.describe(),
                      "ddplab picks a free port itself (--port 0); for torchrun pass --rdzv-endpoint 127.0.0.1:0 "
                      "or --master-port with another number"))
    return Report(tuple(items), facts)
