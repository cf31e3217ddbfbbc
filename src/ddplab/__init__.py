"""ddplab: reproduce, diagnose and fix PyTorch data-parallel failures with real multi-process runs.

    import ddplab
    r = ddplab.run("01", variant="broken")   # a real 2-rank torchrun job, ended at its deadline
    r.status, r.signature, r.explain()

Importing ddplab does not import torch (ranks do, through ``ddplab.rank.lab``), so the launcher and the
CLI start fast; ``run`` and the result classes are imported when first used, since every rank
(``ddplab.rank.lab``) and every torchrun agent (``ddplab.origins._torchrun``) imports this package and needs
neither the launcher nor the engine.
"""
from ddplab.errors import DdplabError

__all__ = ["run", "attach", "explain", "diagnose", "RunResult", "RankResult", "DdplabError", "labs"]
__version__ = "0.1.0"


def labs():
    """Every lab (ddplab.origins.catalog.Lab), in number order."""
    from ddplab.origins.catalog import labs as _labs

    return _labs()


def __getattr__(name: str):
    if name == "run":
        from ddplab.front import run
        return run
    if name == "attach":
        from ddplab.origins.attach import attach
        return attach
    if name == "explain":
        from ddplab.origins.explain import explain
        return explain
    if name == "diagnose":
        from ddplab.engine.diagnose import diagnose
        return diagnose
    if name in ("RunResult", "RankResult"):
        from ddplab import result
        return getattr(result, name)
    raise AttributeError(f"module 'ddplab' has no attribute {name!r}")


def load_ipython_extension(ipython):
    """``%load_ext ddplab``: the ``%%ddplab`` cell magic (ddplab.course.magic)."""
    from ddplab.course.magic import load_ipython_extension as _load
    _load(ipython)
