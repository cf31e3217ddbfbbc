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
