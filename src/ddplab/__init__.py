"""ddplab: reproduce, diagnose and fix PyTorch data-parallel failures with real multi-process runs.

    import ddplab
    r = ddplab.run("01", variant="broken")   # a real 2-rank torchrun job, ended at its deadline
    r.status, r.signature, r.explain()

Importing ddplab does not import torch (ranks do, through ``ddplab.lab``), so the launcher and the
CLI start fast; ``run`` and the result classes are imported when first used, since every rank
(``ddplab.lab``) and every torchrun agent (``ddplab._torchrun``) imports this package and needs
neither the launcher nor the engine.
"""
from .errors import DdplabError

__all__ = ["run", "attach", "explain", "diagnose", "RunResult", "RankResult", "DdplabError", "labs"]
__version__ = "0.1.0"


def labs():
    """Every lab (ddplab.catalog.Lab), in number order."""
    from .catalog import labs as _labs

    return _labs()


def __getattr__(name: str):
    if name == "run":
        from .launch import run
        return run
    if name == "attach":
        from .attach import attach
        return attach
    if name == "explain":
        from .explain import explain
        return explain
    if name == "diagnose":
        from .diagnose import diagnose
        return diagnose
    if name in ("RunResult", "RankResult"):
        from . import result
        return getattr(result, name)
    raise AttributeError(f"module 'ddplab' has no attribute {name!r}")
