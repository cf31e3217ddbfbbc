"""argparse helpers the lab scripts share (used only under their `if __name__ == "__main__":`)."""
from __future__ import annotations

import argparse


def within(lo, hi, cast=int):
    """argparse type: a number in [lo, hi] (clearer than choices=range(...) for ports and seconds)."""
    def parse(text):
        v = cast(text)
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"{text} is not in {lo}..{hi}")
        return v
    return parse


def ints(text: str) -> list[int]:
    """argparse type: comma-separated whole numbers ("256,2048")."""
    return [int(v) for v in text.split(",")]


def one_of(allowed):
    """argparse type: comma-separated names, each one of ``allowed``."""
    def parse(text: str) -> list[str]:
        got = [v for v in text.split(",") if v]
        bad = [v for v in got if v not in allowed]
        if bad:
            raise ValueError(bad)
        return got
    return parse


def seconds_list(text: str) -> list[float]:
    """argparse type: comma-separated seconds, each more than 0 ("0.5,1,2")."""
    try:
        out = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated seconds, e.g. 0.5,1,2 (got {text!r})")
    if not out or min(out) <= 0:
        raise argparse.ArgumentTypeError(f"expected seconds > 0, e.g. 0.5,1,2 (got {text!r})")
    return out
