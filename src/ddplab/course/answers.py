"""Answers to the workbook's exercises: one place that parses every kind of answer, says in one
wording what is wrong with an answer that is not of the kind asked for, and names the answers a
checker accepts, as data.

A checker is an `Exercise`: the kind of answer it takes (`Whole`, `Rank`, `Ranks`, `Number`,
`Choice`, `Options`, `Pair`), a judge that compares the parsed answer with this execution's runs,
and `accepted(*runs)`, the answers that pass. The notebook calls the exercise; its `Check` carries
the accepted answers in the output's metadata (not shown by Jupyter, nbviewer or GitHub), so
`tests/test_exercises_hidden.py` can find that no output above a checker shows one of them, using
each kind's `needles` (how that answer would read in an output) and never the checker's prose.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ddplab.engine import stacks
from ddplab.course.notebook import Check

# ---------------------------------------------------------------------------------------------
# The hint wording, one place
# ---------------------------------------------------------------------------------------------


class Rejected(ValueError):
    """The answer is not an answer of the kind asked for; the message says what to write."""


def unset(name: str, what: str) -> str:
    return f"set `{name}` to {what}, then run this cell again"


def wrong_type(name: str, what: str, answer) -> str:
    return f"`{name}` must be {what}, not {answer!r}"


def out_of_range(name: str, answer, allowed: str) -> str:
    return f"`{name}` = {answer!r} is not possible here: {allowed}"


def _blank(answer) -> bool:
    if answer is None:
        return True
    if isinstance(answer, str):
        return not answer.strip()
    if isinstance(answer, (list, tuple, set, frozenset, dict)):
        return len(answer) == 0
    return False


def _is_whole(answer) -> bool:
    return isinstance(answer, int) and not isinstance(answer, bool)


def _number_token(v: float) -> str:
    """A number as a regex that finds it standing alone in a text (2 or 2.0; not inside 2.5, 12, a/b or x1)."""
    return r"(?<![\w./])" + re.escape(f"{v:g}") + r"(?:\.0+)?(?![\w/]|\.\d)"


# ---------------------------------------------------------------------------------------------
# Kinds of answer
# ---------------------------------------------------------------------------------------------


class Kind:
    """A kind of answer: ``parse`` returns the answer in its canonical form or raises Rejected;
    ``needles`` are what an output that shows this answer would hold, all of them in one output:
    regular expressions, or an `Interval` (a number inside it)."""

    what = "an answer"

    def parse(self, answer, name: str):
        raise NotImplementedError

    def needles(self, value) -> list[str]:
        raise NotImplementedError

    def _unset(self, answer, name):
        if _blank(answer):
            raise Rejected(unset(name, self.what))


@dataclass(frozen=True)
class Whole(Kind):
    """A whole number from ``lo`` to ``hi``; ``label`` (a regular expression) is the words that name it in
    an output that shows it ("failed at step"): such an output holds both."""
    lo: int
    hi: int
    what: str = "a whole number"
    label: str = ""
    only: tuple[int, ...] = ()   # where only some of lo..hi are possible (1, 2, 4, 8, 16)

    def parse(self, answer, name):
        self._unset(answer, name)
        if not _is_whole(answer):
            raise Rejected(wrong_type(name, self.what, answer))
        if not self.lo <= answer <= self.hi or (self.only and answer not in self.only):
            allowed = ", ".join(map(str, self.only)) if self.only else f"from {self.lo} to {self.hi}"
            raise Rejected(out_of_range(name, answer, f"it is {allowed}"))
        return answer

    def needles(self, value):
        return ([rf"(?i)\b{self.label}"] if self.label else []) + [_number_token(value)]


@dataclass(frozen=True)
class Rank(Kind):
    """A rank of a job of ``nproc`` ranks."""
    nproc: int = 2
    what: str = ""

    def __post_init__(self):
        if not self.what:
            object.__setattr__(self, "what", f"a rank number (0 to {self.nproc - 1})")

    def parse(self, answer, name):
        self._unset(answer, name)
        if not _is_whole(answer):
            raise Rejected(wrong_type(name, self.what, answer))
        if not 0 <= answer < self.nproc:
            raise Rejected(out_of_range(name, answer, f"this job has ranks 0 to {self.nproc - 1}"))
        return answer

    def needles(self, value):
        return [rf"(?i)\brank[ =:]{{1,2}}{value}\b"]


@dataclass(frozen=True)
class Ranks(Kind):
    """Some of the ranks of a job (a list, tuple or set), returned as a sorted tuple."""
    nproc: int = 2
    what: str = "a list of rank numbers, like [1] or [0, 1]"

    def parse(self, answer, name):
        self._unset(answer, name)
        if not isinstance(answer, (list, tuple, set, frozenset)):
            raise Rejected(wrong_type(name, self.what, answer))
        one = Rank(self.nproc)
        return tuple(sorted({one.parse(a, name) for a in answer}))

    def needles(self, value):
        return [n for v in value for n in Rank(self.nproc).needles(v)]


@dataclass(frozen=True)
class Number(Kind):
    """A finite number from ``lo`` to ``hi`` (``unit`` names it: "seconds")."""
    lo: float = -math.inf
    hi: float = math.inf
    what: str = "a number"
    label: str = ""

    def parse(self, answer, name):
        self._unset(answer, name)
        if isinstance(answer, bool) or not isinstance(answer, (int, float)) or not math.isfinite(answer):
            raise Rejected(wrong_type(name, self.what, answer))
        if not self.lo <= answer <= self.hi:
            raise Rejected(out_of_range(name, answer, f"it is from {self.lo:g} to {self.hi:g}"))
        return float(answer)

    def needles(self, value):
        label = [rf"(?i)\b{self.label}"] if self.label else []
        return label + [value if isinstance(value, Interval) else _number_token(value)]


@dataclass(frozen=True)
class Interval:
    """Every number from ``lo`` to ``hi`` passes (a measured value with its tolerance)."""
    lo: float
    hi: float

    def __contains__(self, x) -> bool:
        return self.lo <= x <= self.hi

    def to_json(self):
        return {"interval": [self.lo, self.hi]}


@dataclass(frozen=True)
class Choice(Kind):
    """One of ``options`` (strings). ``labels`` say how an option is written in outputs, where that
    differs from the option; ``normalise`` maps what a learner may type onto an option."""
    options: tuple[str, ...]
    what: str = ""
    labels: dict = field(default_factory=dict)
    normalise: Callable[[str], str] | None = None

    def __post_init__(self):
        if not self.what:
            object.__setattr__(self, "what", "one of " + ", ".join(f'"{o}"' for o in self.options))

    def parse(self, answer, name):
        self._unset(answer, name)
        if not isinstance(answer, str):
            raise Rejected(wrong_type(name, self.what, answer))
        got = answer.strip()
        got = self.normalise(got) if self.normalise else got
        if got not in self.options:
            raise Rejected(out_of_range(name, answer, "write " + self.what))
        return got

    def needles(self, value):
        return [r"(?<![\w-])" + re.escape(self.labels.get(value, value)) + r"(?![\w-])"]


@dataclass(frozen=True)
class Options(Kind):
    """Some of ``options`` (a set, list or tuple of strings), returned as a frozenset."""
    options: tuple[str, ...]
    what: str = "a set of names"

    def parse(self, answer, name):
        if isinstance(answer, (set, frozenset, list, tuple)) and len(answer) == 0:
            return frozenset()
        self._unset(answer, name)
        if not isinstance(answer, (set, frozenset, list, tuple)) or not all(isinstance(a, str) for a in answer):
            raise Rejected(wrong_type(name, self.what, answer))
        got = frozenset(a.strip() for a in answer)
        unknown = sorted(got - set(self.options))
        if unknown:
            raise Rejected(out_of_range(name, unknown, "the names are " + ", ".join(self.options)))
        return got

    def needles(self, value):
        return [r"(?<![\w-])" + re.escape(v) + r"(?![\w-])" for v in sorted(value)]


@dataclass(frozen=True)
class Pair(Kind):
    """Two answers, each of its own kind, given as a tuple (or list) of two."""
    first: Kind
    second: Kind
    what: str = "a pair"
    names: tuple[str, str] | None = None   # the notebook's names for the two parts, if they are two variables

    def parse(self, answer, name):
        if isinstance(answer, (tuple, list)) and len(answer) == 2 and all(_blank(a) for a in answer):
            raise Rejected(unset(name, self.what))
        self._unset(answer, name)
        if not isinstance(answer, (tuple, list)) or len(answer) != 2:
            raise Rejected(wrong_type(name, self.what, answer))
        n1, n2 = self.names or (name, name)
        return (self.first.parse(answer[0], n1), self.second.parse(answer[1], n2))

    def needles(self, value):
        return self.first.needles(value[0]) + self.second.needles(value[1])


COLLECTIVES = tuple(sorted(c for c in stacks.COLLECTIVES if not c.startswith("_")))   # the names stacks show


def _collective_name(text: str) -> str:
    return text.lower().removeprefix("torch.distributed.").removeprefix("dist.").removesuffix("()")


def collective(what: str = 'a torch.distributed collective\'s name, like "barrier"') -> Choice:
    """A collective's torch.distributed name ("all_reduce"; "dist.all_reduce()" is read as the same)."""
    return Choice(COLLECTIVES, what=what, normalise=_collective_name)


STATUSES = ("ok", "failed", "hung")


# ---------------------------------------------------------------------------------------------
# Exercises
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, repr=False)
class Checked(Check):
    """A checker's verdict; the output's metadata names the exercise and the answers it accepts."""
    exercise: str = ""
    accepted: tuple = ()

    def _repr_mimebundle_(self, include=None, exclude=None):
        return ({"text/plain": repr(self), "text/html": self._repr_html_()},
                {"ddplab": {"exercise": self.exercise, "accepted": [to_json(a) for a in self.accepted]}})


def to_json(value):
    if isinstance(value, Interval):
        return value.to_json()
    if isinstance(value, (tuple, list)):
        return [to_json(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return {"set": sorted(value)}
    return value


def from_json(value):
    if isinstance(value, dict) and "interval" in value:
        return Interval(*value["interval"])
    if isinstance(value, dict) and "set" in value:
        return frozenset(value["set"])
    if isinstance(value, list):
        return tuple(from_json(v) for v in value)
    return value


@dataclass(frozen=True)
class Exercise:
    """One exercise's checker. ``judge(value, *runs, **kw) -> Check`` sees the parsed answer;
    ``accepted(*runs, **kw)`` lists the answers that pass (an `Interval` for a tolerance), or none
    where the checker runs the learner's answer itself (nothing above it could show that run).
    ``once``: a prediction counts once per run: a later, different answer is judged as the first.
    ``runs_answer``: the checker runs the learner's answer itself (no run above it can show the answer)."""
    key: str
    kind: Kind
    judge: Callable[..., Check]
    accepted: Callable[..., Sequence] = lambda *runs, **kw: ()
    name: str = "answer"
    once: bool = False
    runs_answer: bool = False
    _first: dict = field(default_factory=dict, compare=False)

    @property
    def __name__(self) -> str:
        return self.judge.__name__

    def check(self, answer, *runs, **kw) -> Check:
        """The verdict on ``answer`` (stateless: the tests call this)."""
        try:
            value = self.kind.parse(answer, self.name)
        except Rejected as e:
            return Check(False, str(e))
        return self.judge(value, *runs, **kw)

    def __call__(self, answer, *runs, **kw) -> Checked:
        try:
            accepted = tuple(self.accepted(*runs, **kw))
        except Exception:  # a run that lacks what the answer is read from: the checker says so
            accepted = ()
        c = self._committed(answer, runs, kw) if self.once else self.check(answer, *runs, **kw)
        return Checked(c.passed, c.message, self.key, accepted)

    def _committed(self, answer, runs, kw) -> Check:
        """The first well-formed answer given for these runs is the one judged, whatever comes later."""
        try:
            value = self.kind.parse(answer, self.name)
        except Rejected as e:
            return Check(False, str(e))
        first = self._first.setdefault(tuple(id(r) for r in runs), value)
        c = self.judge(first, *runs, **kw)
        if first == value:
            return c
        return Check(c.passed, f"you predicted {first!r} first, and a prediction counts once (change it and "
                               f"you are no longer predicting): {c.message}")


def exercise(key: str, kind: Kind, *, accepted: Callable[..., Sequence] | None = None, name: str = "answer",
             once: bool = False, runs_answer: bool = False) -> Callable[[Callable[..., Check]], Exercise]:
    """Decorate a judge (``judge(value, *runs)``) into an `Exercise`."""
    def wrap(judge: Callable[..., Check]) -> Exercise:
        return Exercise(key, kind, judge, accepted or (lambda *runs, **kw: ()), name, once, runs_answer)
    return wrap


def exercises(*items: Exercise) -> dict[str, Exercise]:
    """A workbook module's EXERCISES: {key: exercise}."""
    return {e.key: e for e in items}


# ---------------------------------------------------------------------------------------------
# Finding an answer in a text (for the test over the stored notebooks)
# ---------------------------------------------------------------------------------------------

_NUMBER = re.compile(r"(?<![\w./])(\d+(?:\.\d+)?)(%?)(?![\w/]|\.\d)")


def shows(kind: Kind, value, text: str) -> bool:
    """Whether ``text`` (one output) shows ``value``: every needle of the answer is found in it."""
    for needle in kind.needles(value):
        if isinstance(needle, Interval):
            if not _in_interval(needle, text):
                return False
        elif not re.search(needle, text):
            return False
    return True


def _in_interval(iv: Interval, text: str) -> bool:
    for m in _NUMBER.finditer(text):
        x = float(m.group(1)) / (100 if m.group(2) else 1)
        if x in iv:
            return True
    return False
