"""The four articles the labs test, as citations (title, date, id). Their text is not part of ddplab:
a claim quotes one sentence (or a contiguous part of one) and cites the article by these fields.

Where the articles themselves are at hand (``$DDPLAB_ARTICLES_DIR``, or a ``seeds/`` folder beside
the checkout, as in the project's CI), ``text(key)`` returns one so tests can check every quotation
word for word; elsewhere it returns None and those tests skip.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Article:
    key: str      # "000": the number the labs and the lab table use
    file: str     # the seed file name, e.g. "000_5eac2459042e419e.txt"
    id: str       # the article's own id (its front matter)
    title: str
    date: str

    def cite(self) -> str:
        return f"“{self.title}” ({self.date}, id {self.id})"


ARTICLES: dict[str, Article] = {a.key: a for a in (
    Article("000", "000_5eac2459042e419e.txt",
            "why-do-pytorchs-dataparallel-and-distributeddataparallel-implementations-hang",
            "Why do PyTorch's DataParallel and DistributedDataParallel implementations hang indefinitely?",
            "2025-01-30"),
    Article("001", "001_159326f62e29f2b3.txt", "how-can-i-resolve-pytorch-distributeddataparallel-issues",
            "How can I resolve PyTorch DistributedDataParallel issues?", "2025-01-30"),
    Article("002", "002_3b7eff0f44992b59.txt", "why-is-training-not-starting-with-nndataparallel",
            "Why is training not starting with nn.DataParallel?", "2025-01-30"),
    Article("003", "003_da49d0a504e50001.txt", "why-is-distributeddataparallel-timing-out-during-initialization",
            "Why is DistributedDataParallel timing out during initialization?", "2025-01-30"),
)}


def article(key: str) -> Article:
    """``key`` is "000".."003" or a seed file name (the catalog's ``article`` field)."""
    return ARTICLES[key[:3]]


def articles_dir() -> Path | None:
    env = os.environ.get("DDPLAB_ARTICLES_DIR")
    candidates = [Path(env)] if env else []
    repo = Path(__file__).resolve().parents[3]
    candidates += [repo.parent / "shared" / "seeds", repo.parent / "seeds"]
    return next((p for p in candidates if (p / ARTICLES["000"].file).is_file()), None)


def text(key: str) -> str | None:
    d = articles_dir()
    return (d / article(key).file).read_text(encoding="utf-8") if d else None


def normalise(s: str) -> str:
    """What "word for word" compares: the same words in the same order. Markdown emphasis and code
    marks (``*``, `````) and line breaks are layout, not words."""
    return re.sub(r"\s+", " ", s.replace("`", "").replace("*", "")).strip()


def quoted_in(quote: str, key: str) -> bool | None:
    """True when ``quote`` occurs word for word in article ``key``; None when the text is not here."""
    t = text(key)
    return None if t is None else normalise(quote) in normalise(t)
