"""Answers to the workbook's exercises: one place that parses every kind of answer (and reads the
spellings and types a learner may write: "OK" for "ok", "allreduce" for "all_reduce", a module-qualified
name, numpy integers, 17.0 for 17), says in one wording what is wrong with an answer that is not of the
kind asked for, and names the answers a checker accepts, as data.

A checker is an `Exercise`: the kind of answer it takes (`Whole`, `Rank`, `Ranks`, `Number`,
`Choice`, `Options`, `Pair`), a judge that compares the parsed answer with this execution's runs,
and `accepted(*runs)`, the answers that pass. One answer counts (DESIGN.md, "One answer counts"): the
first well-formed answer to an exercise is recorded in the runs folder and is the one judged from then
on, whatever is given later, re-run or restarted; no verdict shows an accepted answer.
The notebook's output names the exercise only; the accepted answers go to a file beside the runs
(`answers.json`, outside the notebook), which `tests/test_exercises_hidden.py` reads to find that no
cell above a checker shows one of them, using each kind's `needles` (how that answer would read in a
text) and never the checker's prose.
"""
from __future__ import annotations

import json
import math
import numbers
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ddplab.engine import stacks
from ddplab.errors import DdplabError
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


def _is_bool(answer) -> bool:
    return isinstance(answer, bool) or type(answer).__name__ in ("bool_", "bool")


def as_whole(answer) -> int | None:
    """A whole number as a learner may write it (3, numpy's int64(3), 3.0), else None (True is no number)."""
    if _is_bool(answer) or not isinstance(answer, numbers.Real):
        return None
    if isinstance(answer, numbers.Integral):
        return int(answer)
    x = float(answer)
    return int(x) if math.isfinite(x) and x.is_integer() else None


def as_number(answer) -> float | None:
    """A finite number (int, float, numpy's scalars), else None."""
    if _is_bool(answer) or not isinstance(answer, numbers.Real):
        return None
    x = float(answer)
    return x if math.isfinite(x) else None


def fold(text: str) -> str:
    """A name as it is compared: case, spaces, '_' and '-' do not matter, nor a module before it or '()'
    after it ("torch.distributed.DistNetworkError" -> "distnetworkerror", "dist.all_reduce()" and
    "AllReduce" -> "allreduce", "timed out" -> "timedout")."""
    t = text.strip().lower()
    t = re.sub(r"\(\s*\)$", "", t)
    t = re.sub(r"^(?:[a-z_][a-z0-9_]*\.)+(?=[a-z_])", "", t)
    return re.sub(r"[\s_\-]+", "", t)


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

    def hints(self, value) -> list[str]:
        """Other words that give ``value`` away (or point to a wrong option): any one of them in a text
        above the checker is a leak, where the needles must all be in one text."""
        return []

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
        if as_whole(answer) is None:
            raise Rejected(wrong_type(name, self.what, answer))
        answer = as_whole(answer)
        if not self.lo <= answer <= self.hi or (self.only and answer not in self.only):
            allowed = ", ".join(map(str, self.only)) if self.only else f"from {self.lo} to {self.hi}"
            raise Rejected(out_of_range(name, answer, f"it is {allowed}"))
        return answer

    def needles(self, value):
        """The number beside the words that name it ("failed at step 1", "(4 ranks)", "WORLD_SIZE=4")."""
        if not self.label:
            return [_number_token(value)]
        num, label = _number_token(value), rf"\b(?:{self.label})"
        return [rf"(?i){label}[^\n\d]{{0,20}}?{num}|{num}[^\n\d]{{0,3}}{label}"]


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
        if as_whole(answer) is None:
            raise Rejected(wrong_type(name, self.what, answer))
        answer = as_whole(answer)
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
        if as_number(answer) is None:
            raise Rejected(wrong_type(name, self.what, answer))
        answer = as_number(answer)
        if not self.lo <= answer <= self.hi:
            raise Rejected(out_of_range(name, answer, f"it is from {self.lo:g} to {self.hi:g}"))
        return answer

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


def _match(got: str, options: Sequence[str]) -> str | None:
    """The option ``got`` names, read with `fold` (one reading for every checker), or None."""
    return next((o for o in options if fold(o) == fold(got)), None)


def _distinct(options: Sequence[str]) -> None:
    folded = [fold(o) for o in options]
    assert len(set(folded)) == len(folded), f"two options read as one: {options}"


@dataclass(frozen=True)
class Choice(Kind):
    """One of ``options`` (strings), read with `fold` (the one reading of every checker). ``labels`` say how
    an option is written in outputs, where that differs from the option; ``reveals`` (option -> regular
    expression) are the other words that point to an option (a run signature such as "port-in-use" points
    to EADDRINUSE): above its checker no text may hold one, for any option (the right one gives it away,
    a wrong one misleads)."""
    options: tuple[str, ...]
    what: str = ""
    labels: dict = field(default_factory=dict)
    reveals: dict = field(default_factory=dict)

    def __post_init__(self):
        _distinct(self.options)
        if not self.what:
            object.__setattr__(self, "what", "one of " + ", ".join(f'"{o}"' for o in self.options))

    def parse(self, answer, name):
        self._unset(answer, name)
        if not isinstance(answer, str):
            raise Rejected(wrong_type(name, self.what, answer))
        got = _match(answer, self.options)
        if got is None:
            raise Rejected(out_of_range(name, answer, "write " + self.what))
        return got

    def needles(self, value):
        return [r"(?<![\w-])" + re.escape(self.labels.get(value, value)) + r"(?![\w-])"]

    def hints(self, value):
        return [r for o in self.options for r in _as_list(self.reveals.get(o, ()))]


def _as_list(x) -> list:
    return [x] if isinstance(x, str) else list(x)


@dataclass(frozen=True)
class Options(Kind):
    """Some of ``options`` (a set, list or tuple of strings, each read with `fold`), returned as a frozenset."""
    options: tuple[str, ...]
    what: str = "a set of names"
    marks: str = ""    # how a text says an option has the property asked for: r"{o}\W{1,3}failed\b"
    says: str = ""     # a word an option's name must not hold (it would say the answer): "silent"

    def __post_init__(self):
        _distinct(self.options)

    def parse(self, answer, name):
        if isinstance(answer, (set, frozenset, list, tuple)) and len(answer) == 0:
            return frozenset()
        self._unset(answer, name)
        if not isinstance(answer, (set, frozenset, list, tuple)) or not all(isinstance(a, str) for a in answer):
            raise Rejected(wrong_type(name, self.what, answer))
        unknown = sorted(a for a in answer if _match(a, self.options) is None)
        if unknown:
            raise Rejected(out_of_range(name, unknown, "the names are " + ", ".join(self.options)))
        return frozenset(_match(a, self.options) for a in answer)

    def needles(self, value):
        return [r"(?<![\w-])" + re.escape(v) + r"(?![\w-])" for v in sorted(value)]

    def hints(self, value):
        marked = [self.marks.replace("{o}", re.escape(v)) for v in sorted(value)] if self.marks else []
        named = [r"(?<![\w-])" + re.escape(v) + r"(?![\w-])" for v in sorted(value)
                 if self.says and re.search(self.says, v, re.I)]
        return marked + named


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

    def hints(self, value):
        return self.first.hints(value[0]) + self.second.hints(value[1])


COLLECTIVES = tuple(sorted(c for c in stacks.COLLECTIVES if not c.startswith("_")))   # the names stacks show


def collective(what: str = 'a torch.distributed collective\'s name, like "barrier"') -> Choice:
    """A collective's torch.distributed name ("all_reduce"; "dist.all_reduce()" and "allreduce" read the same)."""
    return Choice(COLLECTIVES, what=what)


STATUSES = ("ok", "failed", "hung")


# ---------------------------------------------------------------------------------------------
# Exercises
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, repr=False)
class Checked(Check):
    """A checker's verdict. Its output's metadata names the lab and the exercise, never an answer: what
    is stored in a notebook is there for anyone to copy (the accepted answers go to `ANSWERS_FILE`)."""
    exercise: str = ""
    lab: str = ""

    def _repr_mimebundle_(self, include=None, exclude=None):
        return ({"text/plain": repr(self), "text/html": self._repr_html_()},
                {"ddplab": {"exercise": self.exercise, "lab": self.lab}})


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


def describe(value) -> str:
    """A recorded answer as a verdict quotes it ("you answered ... first")."""
    if isinstance(value, Interval):
        return f"from {value.lo:g} to {value.hi:g}"
    if isinstance(value, (set, frozenset)):
        return "{" + ", ".join(repr(v) for v in sorted(value)) + "}"
    return repr(value)


# ---------------------------------------------------------------------------------------------
# The records beside the runs: the one answer that counts, and the answers each checker accepted
# ---------------------------------------------------------------------------------------------

ATTEMPTS_FILE = "attempts.json"   # {"01/timeout-seconds": the first well-formed answer, as JSON}
ANSWERS_FILE = "answers.json"     # {"01/timeout-seconds": [accepted answers, as JSON]}: the last call's


def records_dir() -> Path:
    """Where the records go: the runs folder ($DDPLAB_RUNS_DIR, else runs/), never the notebook."""
    from ddplab.origins.job import runs_root
    return runs_root()


def _read(name: str) -> dict:
    path = records_dir() / name
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _write(name: str, data: dict) -> None:
    path = records_dir() / name
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    tmp.replace(path)


def reset(lab: str, exercise: str | None = None) -> list[str]:
    """Forget the first answer recorded for ``exercise`` of lab ``lab`` (every exercise of the lab when
    None) in this runs folder (``records_dir``), so that the next well-formed answer is the one that
    counts; returns the exercises forgotten. For a teacher who resets a learner's try, or a learner in
    self-study who mistyped: ``from ddplab.course import answers; answers.reset("01", "timeout-seconds")``.
    One answer still counts in a notebook: nothing in a checker's cell calls this."""
    lab = str(lab).zfill(2)
    attempts = _read(ATTEMPTS_FILE)
    gone = sorted(k for k in attempts if k.split("/", 1)[0] == lab and (exercise is None or k.split("/", 1)[1] == exercise))
    if exercise is not None and not gone:
        known = sorted(k.split("/", 1)[1] for k in attempts if k.split("/", 1)[0] == lab)
        raise DdplabError(f"no answer to lab {lab}'s {exercise!r} is recorded in {records_dir() / ATTEMPTS_FILE}",
                          hint=f"recorded for lab {lab}: {', '.join(known) or 'none'}")
    for k in gone:
        del attempts[k]
    if gone:
        _write(ATTEMPTS_FILE, attempts)
    return [k.split("/", 1)[1] for k in gone]


def recorded_answers(folder: Path) -> dict[str, list]:
    """The accepted answers the checkers of one execution wrote into ``folder`` (its runs folder)."""
    try:
        data = json.loads((Path(folder) / ANSWERS_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return {k: [from_json(a) for a in v] for k, v in data.items()}


@dataclass(frozen=True)
class Exercise:
    """One exercise's checker. ``judge(value, *runs, **kw) -> Check`` sees the parsed answer;
    ``accepted(*runs, **kw)`` lists the answers that pass (an `Interval` for a tolerance), or none
    where the checker runs the learner's answer itself (``runs_answer``: no run above it can show it).
    Calling it (or `.check`) judges the one answer that counts: the first well-formed one recorded."""
    key: str
    kind: Kind
    judge: Callable[..., Check]
    accepted: Callable[..., Sequence] = lambda *runs, **kw: ()
    name: str = "answer"
    runs_answer: bool = False

    @property
    def __name__(self) -> str:
        return self.judge.__name__

    @property
    def lab(self) -> str:
        """The lab number of the workbook module that defines the judge ("01" for ddplab.course.lab01)."""
        m = re.search(r"lab(\d\d)$", getattr(self.judge, "__module__", "") or "")
        return m.group(1) if m else ""

    @property
    def record_key(self) -> str:
        return f"{self.lab}/{self.key}"

    def _verdict(self, answer, *runs, **kw) -> Check:
        """The verdict on ``answer``, recorded nowhere: the tests' way to try many answers. The notebooks
        call the exercise itself, which judges only the first answer."""
        try:
            value = self.kind.parse(answer, self.name)
        except Rejected as e:
            return Check(False, str(e))
        return self.judge(value, *runs, **kw)

    def _accepted(self, runs, kw) -> tuple:
        try:
            return tuple(self.accepted(*runs, **kw))
        except Exception:  # a run that lacks what the answer is read from: the judge says so
            return ()

    def __call__(self, answer, *runs, **kw) -> Checked:
        accepted = self._accepted(runs, kw)
        answers = _read(ANSWERS_FILE)
        answers[self.record_key] = [to_json(a) for a in accepted]
        _write(ANSWERS_FILE, answers)
        c = self._committed(answer, runs, kw)
        return Checked(c.passed, c.message, self.key, self.lab)

    check = __call__

    def _committed(self, answer, runs, kw) -> Check:
        """The first well-formed answer recorded for this exercise is the one judged, whatever comes
        later. The verdict never shows an accepted answer (a notebook's outputs are there to copy):
        after the one answer, the instructor's solutions/NN_topic.md has it."""
        try:
            value = self.kind.parse(answer, self.name)
        except Rejected as e:
            return Check(False, str(e))
        attempts = _read(ATTEMPTS_FILE)
        if self.record_key not in attempts:
            attempts[self.record_key] = to_json(value)
            _write(ATTEMPTS_FILE, attempts)
        first = from_json(attempts[self.record_key])
        try:
            first = self.kind.parse(first, self.name)
        except Rejected:
            first = value
        c = self.judge(first, *runs, **kw)
        message = c.message
        if first != value:
            message = f"you answered {describe(first)} first, and one answer counts: {message}"
        return Check(c.passed, message)


def exercise(key: str, kind: Kind, *, accepted: Callable[..., Sequence] | None = None, name: str = "answer",
             runs_answer: bool = False) -> Callable[[Callable[..., Check]], Exercise]:
    """Decorate a judge (``judge(value, *runs)``) into an `Exercise`."""
    def wrap(judge: Callable[..., Check]) -> Exercise:
        return Exercise(key, kind, judge, accepted or (lambda *runs, **kw: ()), name, runs_answer)
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


def hinted(kind: Kind, value, text: str) -> bool:
    """Whether ``text`` holds a word that gives ``value`` away, or that points to one of the options."""
    return any(re.search(h, text, re.I) for h in kind.hints(value))


@dataclass(frozen=True)
class Leak:
    """An accepted answer (or a word that points to an option) found in a cell above its checker."""
    cell: int
    where: str      # "output", "markdown", "source", "own output" (the checker's cell, before its verdict)
    answer: object
    text: str       # the line it was found in

    def __str__(self) -> str:
        return f"cell {self.cell} ({self.where}): {self.answer!r} in {self.text.strip()[:100]!r}"


def texts_above(cells: list[dict], index: int, output: int) -> list[tuple[int, str, str]]:
    """(cell, where, text) for what a reader sees above output ``output`` of cell ``index``: every
    markdown cell and every output before it (the checker cell's own earlier outputs included), and the
    code (where variant names are typed)."""
    out = []
    for i, c in enumerate(cells[:index + 1]):
        if c["cell_type"] == "markdown":
            out.append((i, "markdown", _joined(c["source"])))
            continue
        if c["cell_type"] != "code":
            continue
        out.append((i, "source", _joined(c["source"])))
        outputs = c.get("outputs", [])
        outputs = outputs[:output] if i == index else outputs
        out += [(i, "own output" if i == index else "output", t) for t in output_texts(outputs)]
    return out


def _joined(v) -> str:
    return "".join(v) if isinstance(v, list) else (v or "")


def output_texts(outputs: list[dict]) -> list[str]:
    """Each output as the text a reader sees: streams, tracebacks, and a rich output's HTML where it has
    one (what Jupyter, nbviewer and GitHub show), else its plain text."""
    import html as _html
    texts = []
    for o in outputs:
        if o["output_type"] == "stream":
            texts.append(_joined(o["text"]))
        elif o["output_type"] == "error":
            texts.append("\n".join(o.get("traceback", [])))
        elif "text/html" in o.get("data", {}):
            texts.append(_html.unescape(re.sub(r"<[^>]+>", " ", _joined(o["data"]["text/html"]))))
        else:
            texts.append(_joined(o.get("data", {}).get("text/plain", "")))
    return texts


def leaks(cells: list[dict], index: int, output: int, kind: Kind, accepted: Sequence) -> list[Leak]:
    """Every place above output ``output`` of cell ``index`` (a checker's verdict) that shows one of
    ``accepted``: all of a kind's needles in one output; in markdown, the needles of a name (not of a
    number, which the question itself may hold) in a line that is no list of the choices; or a word that
    gives an option away (its hints) in any text, code included."""
    numeric = isinstance(kind, (Whole, Number, Rank, Ranks)) or (
        isinstance(kind, Pair) and isinstance(kind.first, (Whole, Number, Rank)))
    found = []
    for i, where, text in texts_above(cells, index, output):
        for a in accepted:
            if where in ("output", "own output"):
                units = [text] if shows(kind, a, text) else []
            elif where == "markdown" and not numeric:
                units = [p for p in _paragraphs(text) if shows(kind, a, p) and not _lists_choices(kind, a, p)]
            else:
                units = []
            units += [ln for ln in text.splitlines() if hinted(kind, a, ln)]
            if units:
                found.append(Leak(i, where, a, units[0]))
    return found


def _lists_choices(kind: Kind, value, line: str) -> bool:
    """A line that names two or more options besides ``value`` lists the choices: it is the question."""
    if isinstance(kind, Pair):
        kind, value = (kind.second, value[1]) if isinstance(kind.second, (Choice, Options)) else (kind.first, value[0])
    if not isinstance(kind, (Choice, Options)):
        return False
    mine = set(value) if isinstance(value, (set, frozenset)) else {value}
    others = [o for o in kind.options if o not in mine
              and re.search(r"(?<![\w-])" + re.escape(o) + r"(?![\w-])", line)]
    return len(others) >= min(2, len(kind.options) - len(mine))


def _paragraphs(text: str) -> list[str]:
    """Markdown's paragraphs and list items (a question's options may be wrapped over lines)."""
    return [p for p in re.split(r"\n\s*\n|\n(?=\s*(?:\d+\.|[-*]) )", text) if p.strip()]


# --- what a learner's stored notebook shows before any answer (issue 42) -------------------------
# Issue 34's rule (nothing above a checker shows its answer) left the reveals below a checker, and a
# notebook stored with its outputs opens with all of them on screen: the run that answers exercise 1 just
# below its checker, the measured seconds exercise 2 asks for, the grade of a stored fix-it attempt that
# names the fix. A learner's notebook therefore holds no output at all (ddplab.course.build.learner_copy),
# and `on_screen` reads EVERY output of a notebook for what answers an exercise, wherever it stands.

def fix_needles(broken: str, reference: str) -> list[str]:
    """How a fix-it's reference fix reads in a text: each call, subscript or attribute of the reference
    fix's code that the broken script does not have (``ast.unparse``: one spelling, single quotes), e.g.
    ``sampler.set_epoch(epoch)``, ``os.environ['RANK']``."""
    import ast

    def parts(src: str) -> set[str]:
        try:
            tree = ast.parse(src)
        except SyntaxError:
            return set()
        return {ast.unparse(n) for n in ast.walk(tree) if isinstance(n, (ast.Call, ast.Subscript, ast.Attribute))}
    return sorted(parts(reference) - parts(broken), key=len)


def _spelled_once(text: str) -> str:
    """``text`` with its string quotes as ``ast.unparse`` writes them (double quotes become single)."""
    return text.replace('"', "'")


def _calls(source: str, module: str, name: str) -> bool:
    """Whether code ``source`` calls ``module.name(...)`` (read with ``ast``; a cell magic's body is not Python)."""
    import ast
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return False
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == name
               and isinstance(n.func.value, ast.Name) and n.func.value.id == module for n in ast.walk(tree))


def on_screen(cells: list[dict], accepted: Mapping[str, tuple[Kind, Sequence]] | None = None,
              fixes: Sequence[str] = ()) -> list[Leak]:
    """Everything in the stored outputs of ``cells`` that answers an exercise before the learner answers,
    wherever it stands (above or below its checker): a checker's stored verdict (an output that carries
    its exercise, "verdict"), a stored fix-it grade (the output of a cell that calls ``fixit.grade``,
    "fix-it feedback"), a fix-it's reference fix (``fixes``: `fix_needles`, "reference fix"), and each
    exercise's accepted answers (``accepted``: {exercise: (kind, answers)}; its needles, or a word that
    points to an option, in any output)."""
    found = []
    for i, c in enumerate(cells):
        if c.get("cell_type") != "code":
            continue
        outputs = c.get("outputs", [])
        for o in outputs:
            exercise = ((o.get("metadata") or {}).get("ddplab") or {}).get("exercise")
            if exercise:
                found.append(Leak(i, "verdict", exercise, _joined((o.get("data") or {}).get("text/plain", ""))))
        texts = output_texts(outputs)
        if outputs and _calls(_joined(c.get("source", "")), "fixit", "grade"):
            found.append(Leak(i, "fix-it feedback", "grade", texts[0] if texts else ""))
        for text in texts:
            plain = _spelled_once(text)
            found += [Leak(i, "reference fix", f, next(ln for ln in plain.splitlines() if f in ln))
                      for f in fixes if f in plain]
            for _, (kind, answers) in (accepted or {}).items():
                for a in answers:
                    units = ([text] if shows(kind, a, text) else []) + \
                            [ln for ln in text.splitlines() if hinted(kind, a, ln)]
                    if units:
                        found.append(Leak(i, "output", a, units[0]))
    return found
