"""Rank numbers written as ranges ("0-6", "7", "0,2,4-6") and named ("rank 7", "ranks 0-6").

Below every part: the engine's groups (``ddplab.engine.groups``, which re-exports them), the views and
the code inside a rank (``ddplab.rank.agreement``) write ranks the same way; it imports nothing.
"""
from __future__ import annotations

from typing import Iterable, Sequence


def span(ranks: Iterable[int]) -> str:
    """Rank numbers as ranges: [0, 1, 2, 4, 6, 7] -> "0-2,4,6-7"."""
    out: list[str] = []
    nums = sorted(set(ranks))
    i = 0
    while i < len(nums):
        j = i
        while j + 1 < len(nums) and nums[j + 1] == nums[j] + 1:
            j += 1
        out.append(str(nums[i]) if i == j else f"{nums[i]}-{nums[j]}")
        i = j + 1
    return ",".join(out)


def label(ranks: Sequence[int]) -> str:
    """ "rank 7" or "ranks 0-6"."""
    return f"rank {span(ranks)}" if len(set(ranks)) == 1 else f"ranks {span(ranks)}"
