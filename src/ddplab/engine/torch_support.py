"""The torch versions ddplab was measured with, and what it reads from torch's internals, as data.
On a version not in ``MEASURED`` the result gets one note per internal it could not find (the run
is judged all the same, from what remains: stacks through py-spy or faulthandler, exit records),
instead of failing. README's table of torch versions comes from ``make test-torch VERSION=x``."""
from __future__ import annotations

# major.minor versions whose engine tests and lab variants passed with make test-torch (README's table
# "torch versions" names the release of each that was measured, and how)
MEASURED = ("2.13", "2.14")
# what the rank hook and the engine read from torch: (module, attribute, what is lost without it)
INTERNALS = (
    ("torch._C._distributed_c10d", "_dump_fr_trace_json",
     "no flight recorder ledger: collective numbers and sizes come from the stacks only"),
    ("torch._C._distributed_c10d", "_WorkerServer",
     "no worker server: a blocked rank's stack is read with py-spy or faulthandler instead"),
)


def version() -> str | None:
    """The installed torch's version, read without importing torch."""
    try:
        from importlib.metadata import version as _v
        return _v("torch")
    except Exception:   # noqa: BLE001
        return None


def notes() -> tuple[str, ...]:
    """One line per internal missing from a torch that is not a measured version; () on a measured one."""
    v = version()
    if v is None or any(v == m or v.startswith(m + ".") for m in MEASURED):
        return ()
    import importlib
    out = []
    for module, attr, lost in INTERNALS:
        try:
            ok = hasattr(importlib.import_module(module), attr)
        except Exception:   # noqa: BLE001
            ok = False
        if not ok:
            out.append(f"torch {v} is not a version ddplab was measured with ({', '.join(MEASURED)}): "
                       f"{module}.{attr} is missing, so {lost}")
    return tuple(out)
