"""What a run returns: frozen dataclasses with ``to_dict()``, saved as ``result.json``.

Notebooks and tests assert on these fields, never on printed text.
"""
from __future__ import annotations

import html
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

STATUSES = ("ok", "failed", "hung", "interrupted")


@dataclass(frozen=True)
class RankResult:
    rank: int
    pid: int | None
    state: str                    # "exited" (on its own), "hung" (alive at the deadline, ended by ddplab),
                                  # "not-started" (torchrun never started it)
    exit_code: int | None         # 0, 1, ... ; None if ended by a signal or unknown
    signal: str | None            # "SIGABRT", "SIGTERM" (sent by ddplab or torchrun), ...
    user_frame: str | None        # "labs/01_hang.py:57 in main": innermost frame in the script's own code
    waits_in: str | None          # collective (or other blocking call) it was in at the deadline
    stack: tuple[str, ...] = ()   # innermost first, as "file:line in func"
    stack_source: str | None = None  # "py-spy" or "faulthandler"
    records: tuple[dict, ...] = ()
    log_tail: str = ""

    def to_dict(self) -> dict:
        d = asdict(self)
        d["stack"] = list(self.stack)
        d["records"] = list(self.records)
        return d


@dataclass(frozen=True)
class RunResult:
    target: str
    variant: str | None
    nproc: int
    status: str                   # one of STATUSES
    signature: str | None         # id in ddplab.signatures (None when ok)
    excerpt: str | None           # the text (or stack summary) the signature matched
    diagnosis: str                # one paragraph: what happened, per rank where it matters
    ranks: tuple[RankResult, ...]
    wall_s: float
    deadline_s: float
    run_dir: str
    command: tuple[str, ...]
    port: int | None = None
    returncode: int | None = None  # torchrun's own exit status (None when ddplab ended it)
    leftover: tuple[int, ...] = ()  # pids still alive after cleanup (must be empty)
    notes: tuple[str, ...] = field(default_factory=tuple)
    first_failure: int | None = None  # the rank whose own error started a failed run (torchrun's
                                      # "root cause" is the first exit it saw, which can be a peer)

    # --- conveniences -------------------------------------------------------------------------
    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def records(self) -> list[dict]:
        """Every rank's records, each with its ``rank``."""
        return [r for rank in self.ranks for r in rank.records]

    def records_of(self, event: str) -> list[dict]:
        return [r for r in self.records if r.get("event") == event]

    def rank(self, n: int) -> RankResult:
        return next(r for r in self.ranks if r.rank == n)

    # --- serialisation ------------------------------------------------------------------------
    def to_dict(self) -> dict:
        d = asdict(self)
        d["ranks"] = [r.to_dict() for r in self.ranks]
        d["command"] = list(self.command)
        d["leftover"] = list(self.leftover)
        d["notes"] = list(self.notes)
        return d

    def save(self, path: str | Path | None = None) -> Path:
        path = Path(path or Path(self.run_dir) / "result.json")
        path.write_text(json.dumps(self.to_dict(), indent=2, default=str))
        return path

    @classmethod
    def from_dict(cls, d: dict) -> "RunResult":
        ranks = tuple(RankResult(**{**r, "stack": tuple(r.get("stack", ())), "records": tuple(r.get("records", ()))})
                      for r in d["ranks"])
        return cls(**{**d, "ranks": ranks, "command": tuple(d["command"]), "leftover": tuple(d.get("leftover", ())),
                      "notes": tuple(d.get("notes", ()))})

    @classmethod
    def load(cls, path: str | Path) -> "RunResult":
        p = Path(path)
        if p.is_dir():
            p = p / "result.json"
        return cls.from_dict(json.loads(p.read_text()))

    # --- for people ---------------------------------------------------------------------------
    def headline(self) -> str:
        v = f" --variant {self.variant}" if self.variant else ""
        sig = f" [{self.signature}]" if self.signature else ""
        return f"{self.target}{v}: {self.status}{sig} in {self.wall_s:.1f} s ({self.nproc} ranks)"

    def explain(self) -> str:
        from . import signatures

        lines = [self.headline()]
        if self.signature:
            sig = signatures.get(self.signature)
            lines.append(f"  {sig.title}.")
            lines += [f"  {t}" for t in sig.explanation.splitlines()]
            if sig.lab:
                lines.append(f"  Lab {sig.lab} teaches this failure.")
        if self.diagnosis:
            lines.append(f"  Diagnosis: {self.diagnosis}")
        if self.excerpt and self.status != "hung":
            lines.append(f"  Evidence: {self.excerpt}")
        for r in self.ranks:
            how = (f"exit {r.exit_code}" if r.exit_code is not None else (r.signal or "?"))
            if r.state == "hung":
                how = f"alive at the deadline, ended with {r.signal or 'SIGTERM'}"
            at = f" at {r.user_frame}" if r.user_frame else ""
            waits = f", waiting in {r.waits_in}" if r.waits_in else ""
            lines.append(f"  rank {r.rank}: {how}{waits}{at}")
        for n in self.notes:
            lines.append(f"  note: {n}")
        lines.append(f"  run dir: {self.run_dir}")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        colour = {"ok": "#1a7f37", "failed": "#cf222e", "hung": "#9a6700", "interrupted": "#6e7781"}[self.status]
        e = html.escape
        rows = "".join(
            f"<tr><td>{r.rank}</td><td>{e(r.state)}</td>"
            f"<td>{e(str(r.exit_code) if r.exit_code is not None else (r.signal or ''))}</td>"
            f"<td>{e(r.waits_in or '')}</td><td><code>{e(r.user_frame or '')}</code></td></tr>"
            for r in self.ranks)
        sig = ""
        if self.signature:
            from . import signatures
            s = signatures.get(self.signature)
            sig = (f"<p><b>{e(s.title)}</b> (<code>{e(s.id)}</code>, lab {e(s.lab)})<br>"
                   f"{'<br>'.join(e(t) for t in s.explanation.splitlines())}</p>")
        diag = f"<p><b>Diagnosis:</b> {e(self.diagnosis)}</p>" if self.diagnosis else ""
        ev = (f"<p><b>Evidence:</b> <code>{e(self.excerpt)}</code></p>"
              if self.excerpt and self.status != "hung" else "")
        return (f"<div><p><b style='color:{colour}'>{e(self.status.upper())}</b> "
                f"<code>{e(self.target)}</code> {e(self.variant or '')}: {self.wall_s:.1f} s, {self.nproc} ranks</p>"
                f"{sig}{diag}{ev}<table><tr><th>rank</th><th>state</th><th>exit</th><th>waits in</th>"
                f"<th>its code</th></tr>{rows}</table><p><small>{e(self.run_dir)}</small></p></div>")
