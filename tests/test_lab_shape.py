"""Every lab script reads as a learner reads it (issue 31): a short docstring with the torchrun
command, `main(variant, *, knobs)`, argparse only under `__main__`, lines under 100 characters, and
its knobs declared once in LAB["knobs"], from which argparse and the workbook's validate() come."""
from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from ddplab.origins import catalog
from ddplab.rank import lab_args
from ddplab.errors import DdplabError

MAX_LINE = 99          # characters; "under 100"
SCREEN = 50            # a docstring longer than this is not read before the code
TYPES = set(lab_args.LISTS) | set(lab_args.SCALARS) | {"bool"}
ARGPARSE = {"argparse", "ArgumentParser", "add_argument", "parse_args"}


def _is_main_guard(node: ast.stmt) -> bool:
    return (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
            and getattr(node.test.left, "id", None) == "__name__")


def _lab_dict(tree: ast.Module) -> dict | None:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "LAB" for t in node.targets):
            return ast.literal_eval(node.value)
    return None


def problems(path: Path) -> list[str]:
    """What keeps the script at ``path`` from the lab shape; empty when it has it."""
    source = path.read_text()
    tree = ast.parse(source)
    out = []
    doc = ast.get_docstring(tree)
    if not doc:
        out.append("no module docstring")
    else:
        if len(doc.splitlines()) > SCREEN:
            out.append(f"docstring is {len(doc.splitlines())} lines (more than a screen, {SCREEN})")
        if not any("torchrun" in line and f"labs/{path.name}" in line for line in doc.splitlines()):
            out.append(f"docstring has no `torchrun ... labs/{path.name}` command")
    for n, line in enumerate(source.splitlines(), 1):
        if len(line) > MAX_LINE:
            out.append(f"line {n} is {len(line)} characters")

    lab = _lab_dict(tree)
    knobs = (lab or {}).get("knobs")
    if not isinstance(knobs, dict):
        out.append('no literal LAB["knobs"] declaration')
        knobs = {}
    for name, spec in knobs.items():
        if spec.get("type") not in TYPES or "help" not in spec or "default" not in spec:
            out.append(f"knob {name}: needs type (one of {sorted(TYPES)}), default and help")
            continue
        try:
            lab_args.coerce(name, spec, spec["default"])
        except ValueError as e:
            out.append(f"knob {name}: its default is refused by its own declaration ({e})")

    mains = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main"]
    if not mains:
        out.append("no main(variant, *, knobs) at module level")
    else:
        a = mains[0].args
        if [p.arg for p in a.posonlyargs + a.args] != ["variant"] or a.vararg or a.kwarg:
            out.append("main takes `variant` and then only keyword-only knobs")
        kw = [p.arg for p in a.kwonlyargs]
        if kw != list(knobs):
            out.append(f"main's keyword-only knobs {kw} are not LAB['knobs'] {list(knobs)} (in order)")
        if any(d is not None for d in a.kw_defaults):
            out.append("main's knobs have no defaults: LAB['knobs'] holds them, once")

    guards = [n for n in tree.body if _is_main_guard(n)]
    outside = [n for n in tree.body if n not in guards]
    for node in outside:
        for sub in ast.walk(node):
            name = getattr(sub, "id", None) or getattr(sub, "attr", None)
            imports = isinstance(sub, (ast.Import, ast.ImportFrom))
            names = [a.name for a in sub.names] if imports else []
            if name in ARGPARSE or "argparse" in names or "lab_args" in names:
                out.append(f"line {sub.lineno}: argparse outside `if __name__ == '__main__':`")
                break
    if len(guards) != 1 or tree.body[-1] is not guards[0]:
        out.append("the script ends with one `if __name__ == '__main__':`")
    else:
        called = {getattr(c.func, "attr", None) or getattr(c.func, "id", None)
                  for c in ast.walk(guards[0]) if isinstance(c, ast.Call)}
        if not {"parse", "main"} <= called:
            out.append("__main__ must call lab_args.parse(LAB, __doc__) and main(variant, **knobs)")
        if called & ARGPARSE:
            out.append("__main__ builds its own argparse: the options come from LAB['knobs'] (lab_args.parse)")
    return out


LABS = catalog.labs()
IDS = [lab.id for lab in LABS]


@pytest.mark.parametrize("lab", LABS, ids=IDS)
def test_script_shape(lab):
    assert problems(lab.path) == []


@pytest.mark.parametrize("lab", LABS, ids=IDS)
def test_argparse_is_the_declaration(lab):
    knobs = lab.extra.get("knobs", {})
    p = lab_args.parser({"variants": {v.name: {} for v in lab.variants}, "knobs": knobs}, "")
    options = {a.dest: a for a in p._actions if a.dest != "help"}
    assert set(options) == {"variant", *knobs}
    assert options["variant"].default == lab.default_variant
    assert options["variant"].choices == [v.name for v in lab.variants]
    for name, spec in knobs.items():
        assert options[name].option_strings == [lab_args.flag(name, spec)]
        assert options[name].default == spec["default"]
    assert p.parse_args([]).variant == lab.default_variant


def _outside(spec: dict):
    """A value the declaration refuses, or None when it has no bound."""
    lo, hi = spec.get("range", (None, None))
    one = lab_args.LISTS.get(spec["type"]) or lab_args.SCALARS.get(spec["type"])
    if spec.get("choices") is not None:
        bad = "no-such-choice" if one is str else max(spec["choices"]) + 1
    elif hi is not None:
        bad = hi + 1
    elif lo is not None:
        bad = lo - 1
    else:
        return None
    return [bad] if spec["type"] in lab_args.LISTS else bad


@pytest.mark.parametrize("lab", LABS, ids=IDS)
def test_workbook_validate_is_the_declaration(lab):
    module = importlib.import_module(f"ddplab.course.lab{lab.number}")
    knobs = lab.extra.get("knobs", {})
    module.validate(**{name: spec["default"] for name, spec in knobs.items()})
    with pytest.raises(DdplabError, match="no_such_knob"):
        module.validate(no_such_knob=1)
    for name, spec in knobs.items():
        bad = _outside(spec)
        if bad is not None:
            with pytest.raises(DdplabError, match=name):
                module.validate(**{name: bad})
            text = ",".join(map(str, bad)) if isinstance(bad, list) else str(bad)
            with pytest.raises(SystemExit):      # argparse refuses it too, from the same declaration
                lab_args.parse({"variants": {"v": {}}, "knobs": knobs}, "", [lab_args.flag(name, spec), text])
    # every run_variant validates the same way: it calls validate(), which calls contract.validate_knobs
    tree = ast.parse(Path(module.__file__).read_text())
    fns = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    calls = {name: {getattr(c.func, "attr", None) or getattr(c.func, "id", None)
                    for c in ast.walk(fn) if isinstance(c, ast.Call)} for name, fn in fns.items()}
    assert "validate_knobs" in calls["validate"]
    assert "validate" in calls["run_variant"] or any(
        "validate" in calls.get(c, ()) for c in calls["run_variant"]), "run_variant does not call validate"


def _inside(spec: dict):
    """A value the declaration allows, other than the default where it can be."""
    kind, lo, hi = spec["type"], *spec.get("range", (None, None))
    if kind == "bool":
        return True
    if spec.get("choices") is not None:
        one = spec["choices"][-1]
    elif kind in ("str", "strs"):
        one = "127.0.0.2"
    else:
        one = hi if hi is not None else (lo if lo is not None else 0) + 1
    return [one] if kind in lab_args.LISTS else one


@pytest.mark.parametrize("lab", LABS, ids=IDS)
def test_workbook_argv_is_the_declaration(lab):
    """What the workbook passes (contract.script_args) is what the script's argparse reads back."""
    from ddplab.course import contract

    knobs = lab.extra.get("knobs", {})
    values = {name: _inside(spec) for name, spec in knobs.items()}
    argv, rest = contract.script_args(lab.number, {**values, "nproc": 2, "args": ["--extra"]})
    assert rest == {"nproc": 2} and argv[-1] == "--extra"
    variant, parsed = lab_args.parse({"variants": {v.name: {} for v in lab.variants}, "knobs": knobs},
                                     "", argv[:-1])
    assert variant == lab.default_variant
    assert parsed == {name: lab_args.coerce(name, knobs[name], v) for name, v in values.items()}


BAD = '''"""A lab without the shape."""
import argparse

LAB = {"title": "bad", "variants": {"broken": {}}, "knobs": {"steps": {"type": "int", "default": 0,
       "range": [1, 10], "help": "steps"}}}
p = argparse.ArgumentParser()


def main(variant, steps=3, width=4):
    print(variant, steps, width, "this line goes on and on and on well past the hundred characters a reader sees")


if __name__ == "__main__":
    a = p.parse_args()
    main(a.variant)
'''


def test_a_bad_script_is_refused(tmp_path):
    path = tmp_path / "99_bad.py"
    path.write_text(BAD)
    found = "\n".join(problems(path))
    assert "torchrun" in found
    assert "line 10 is" in found
    assert "its default is refused" in found
    assert "keyword-only" in found
    assert "argparse outside" in found
    assert "lab_args.parse" in found
    good = tmp_path / "98_good.py"
    good.write_text(
        '"""Good.\n\n    torchrun --nproc-per-node 2 labs/98_good.py --variant broken\n"""\n'
        'LAB = {"title": "good", "variants": {"broken": {}}, "knobs": {"steps": {"type": "int",\n'
        '       "default": 3, "range": [1, 10], "help": "steps"}}}\n\n\n'
        'def main(variant, *, steps):\n    print(variant, steps)\n\n\n'
        'if __name__ == "__main__":\n    from ddplab.rank import lab_args\n\n'
        '    variant, knobs = lab_args.parse(LAB, __doc__)\n    main(variant, **knobs)\n')
    assert problems(good) == []
