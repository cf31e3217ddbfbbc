"""Fix-it exercises: a short broken script of one lab's failure class, repaired by the learner in a
``%%ddplab`` cell and judged for real by ``grade`` (see ``ddplab.course.fixit.grader``).

    %load_ext ddplab
    from ddplab.course import fixit
    print(fixit.get("01").broken)           # what the notebook's %%ddplab cell holds
    fixit.grade("01", attempt)              # attempt: the RunResult of `%%ddplab --name attempt`

The exercises are data (``Exercise``: id, lab, broken source, reference fix, hint, wrong fixes with their
feedback, ranks, tolerance); each lives in its own module ``exNN``. The reference fix and the accepted
results live here, in the package, never in a notebook.
"""
from __future__ import annotations

from ddplab.course.fixit.exercise import Attempt, Edit, Exercise, Mismatch, WrongFix  # noqa: F401
from ddplab.course.fixit.grader import Grade, Level, Outcome, grade, grading_of, limit, reset, settings  # noqa: F401
from ddplab.course.fixit.catalog import MODULES, exercises, get  # noqa: F401
