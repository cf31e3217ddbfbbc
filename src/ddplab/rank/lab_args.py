"""A lab's knobs, declared once: the script's argparse, the workbook's validate() and its argv all
come from the literal ``LAB["knobs"]`` of the lab script.

A knob is ``{"type": ..., "default": ..., "help": ...}`` plus, where it has one, ``"range": [lo,
hi]`` (either end None: open) or ``"choices": [...]``, and ``"flag"`` where the option is not the
name. Types: ``int``, ``float``, ``str``, ``bool`` (a flag, default False), and ``ints``,
``floats``, ``strs`` (comma-separated on the command line; range and choices then hold for each
item). A default of None means "the script decides" (often: PyTorch's own); a value None given by
the workbook means "not given". The knob ``pg_timeout_s`` is the script's ``--pg-timeout-s`` and
``main(variant, *, pg_timeout_s)``.

The declaration is a literal, so the catalog reads it with ``ast``
(``catalog.find_lab(n).extra["knobs"]``) and the workbook checks a request without importing torch.
This module imports only argparse: it runs in a rank (the course reads a lab's declaration through
``ddplab.course.contract.declared``, from the catalog).
"""
from __future__ import annotations

import argparse
from typing import Any, Mapping

LISTS = {"ints": int, "floats": float, "strs": str}
SCALARS = {"int": int, "float": float, "str": str}


def flag(name: str, spec: Mapping | None = None) -> str:
    """The command-line option of knob ``name``: pg_timeout_s -> --pg-timeout-s, unless its
    declaration names another (``"flag": "--master-port"`` for the knob ``port``)."""
    return (spec or {}).get("flag") or "--" + name.replace("_", "-")


def _one(spec: Mapping, cast, value: Any, name: str):
    if isinstance(value, bool) or (cast is not str and isinstance(value, str)):
        try:
            value = cast(value) if not isinstance(value, bool) else None
        except ValueError:
            value = None
        if value is None:
            raise ValueError(f"{name} must be a number")
    if cast is int and isinstance(value, float) and value.is_integer():
        value = int(value)
    if cast is float and isinstance(value, int):
        value = float(value)
    if not isinstance(value, cast):
        raise ValueError(f"{name} must be {'a whole number' if cast is int else cast.__name__}, "
                         f"not {value!r}")
    choices = spec.get("choices")
    if choices is not None and value not in choices:
        shown = [repr(c) for c in choices]
        listed = shown[0] if len(shown) == 1 else ", ".join(shown[:-1]) + " or " + shown[-1]
        raise ValueError(f"{name} must be {listed}, not {value!r}")
    lo, hi = spec.get("range", (None, None))
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        bounds = (f"from {lo} to {hi}" if lo is not None and hi is not None
                  else f"at least {lo}" if lo is not None else f"at most {hi}")
        what = "a whole number" if cast is int else "a number" if cast is float else "one"
        raise ValueError(f"{name} must be {what} {bounds}, not {value!r}")
    return value


def coerce(name: str, spec: Mapping, value: Any) -> Any:
    """``value`` as knob ``name`` takes it (a list for the list types), or ValueError saying why not.
    The one check of a value: argparse's type and the workbook's validate() both call it."""
    kind = spec["type"]
    if value is None and kind != "bool":
        return None                      # not given: the script's default
    if kind == "bool":
        if not isinstance(value, bool):
            raise ValueError(f"{name} must be True or False, not {value!r}")
        return value
    if kind in LISTS:
        if isinstance(value, str):
            items = [v for v in value.split(",") if v.strip()]
        else:
            items = list(value) if isinstance(value, (list, tuple)) else [value]
        if not items and spec.get("default") != []:
            raise ValueError(f"{name} needs at least one value")
        return [_one(spec, LISTS[kind], v.strip() if isinstance(v, str) else v, name) for v in items]
    return _one(spec, SCALARS[kind], value, name)


def _argtype(name: str, spec: Mapping):
    def parse(text: str):
        try:
            return coerce(name, spec, text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    parse.__name__ = spec["type"]
    return parse


def parser(lab: Mapping, doc: str | None) -> argparse.ArgumentParser:
    """The script's argparse: ``--variant`` (choices: LAB's variants, default: the first) and one
    option per declared knob."""
    p = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    variants = list(lab["variants"])
    p.add_argument("--variant", choices=variants, default=variants[0], help="which variant to run")
    for name, spec in lab.get("knobs", {}).items():
        if spec["type"] == "bool":
            p.add_argument(flag(name, spec), dest=name, action="store_true", help=spec.get("help"))
            continue
        default = spec.get("default")
        shown = ",".join(map(str, default)) if isinstance(default, list) else default
        lo, hi = spec.get("range", (None, None))
        if spec.get("choices") is not None:
            metavar = "{" + ",".join(map(str, spec["choices"])) + "}"
        elif lo is not None or hi is not None:
            metavar = f"{'' if lo is None else lo}..{'' if hi is None else hi}"
        else:
            metavar = name.upper()
        if spec["type"] in LISTS:
            metavar += ",..."
        p.add_argument(flag(name, spec), dest=name, type=_argtype(name, spec), default=default,
                       metavar=metavar, help=f"{spec.get('help', '')} (default: {shown})")
    return p


def parse(lab: Mapping, doc: str | None, argv=None, check=None) -> tuple[str, dict]:
    """(variant, knobs) from the command line; ``check(variant, knobs)`` may return a sentence that
    refuses the combination (argparse prints it with the usage and exits 2)."""
    p = parser(lab, doc)
    a = vars(p.parse_args(argv))
    variant = a.pop("variant")
    problem = check(variant, a) if check else None
    if problem:
        p.error(problem)
    return variant, a


def argv(knobs: Mapping[str, Mapping], values: Mapping[str, Any]) -> list[str]:
    """The command line that gives the script these knob values (None: left to the script's default)."""
    out: list[str] = []
    for name, value in values.items():
        spec = knobs[name]
        value = coerce(name, spec, value)
        if value is None or value is False or value == []:
            continue
        if value is True:
            out.append(flag(name, spec))
        elif isinstance(value, list):
            out += [flag(name, spec), ",".join(map(str, value))]
        else:
            out += [flag(name, spec), str(value)]
    return out

