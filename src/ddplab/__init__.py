"""ddplab: reproduce, diagnose and fix PyTorch data-parallel failures with real multi-process runs.

    import ddplab
    r = ddplab.run("01", variant="broken")   # a real 2-rank torchrun job, ended at its deadline
    r.status, r.signature, r.explain()

Importing ddplab does not import torch (ranks do, through ``ddplab.lab``), so the launcher and the
CLI start fast.
"""
from .errors import DdplabError
from .launch import run
from .result import RankResult, RunResult

__all__ = ["run", "RunResult", "RankResult", "DdplabError", "labs"]
__version__ = "0.1.0"


def labs():
    """Every lab (ddplab.catalog.Lab), in number order."""
    from .catalog import labs as _labs

    return _labs()
