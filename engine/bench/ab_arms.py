"""The two arms of the decode A/B (decode_ab.py) from its flags: each arm's dispatch (a context entered
around its runs: the previous dispatch, a tuned table, engine.kernels constants set) and its engine's
EngineConfig fields."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from functools import partial

from engine.bench.kernel_ab import read_tables, setting, unfused_mlp
from engine.config import EngineConfig
from engine.kernels import tuning

ARMS = {"before": unfused_mlp, "after": nullcontext}


def parse_option(text: str) -> tuple[str, object]:
    """(field, value) of `FIELD=VALUE` for an EngineConfig field; ValueError if there is no such field
    or the value is not a Python literal."""
    name, sep, value = text.partition("=")
    name = name.strip()
    if not sep or name not in {f.name for f in dataclasses.fields(EngineConfig)}:
        raise ValueError(f"{text!r}: not FIELD=VALUE for an EngineConfig field")
    try:
        return name, ast.literal_eval(value.strip())
    except (ValueError, SyntaxError) as err:
        raise ValueError(f"{text!r}: {err}") from None


def parse_setting(text: str) -> tuple[object, str, object]:
    """(module, constant, value) of `module.CONSTANT=VALUE`, the module under engine.kernels or else
    under engine (e.g. decode_overlap.GROW_AHEAD); ValueError if the module or the constant does not
    exist or the value is not a Python literal."""
    name, sep, value = text.partition("=")
    module_name, _, attr = name.strip().rpartition(".")
    if not sep or not module_name or not attr:
        raise ValueError(f"{text!r}: not module.CONSTANT=VALUE")
    try:
        parsed = ast.literal_eval(value.strip())
    except (ValueError, SyntaxError) as err:
        raise ValueError(f"{text!r}: {err}") from None
    for package in ("engine.kernels", "engine"):
        try:
            module = importlib.import_module(f"{package}.{module_name}")
        except ModuleNotFoundError as err:
            if err.name != f"{package}.{module_name}":  # the module exists and failed to import
                raise ValueError(f"{text!r}: {err}") from None
            continue
        if not hasattr(module, attr):
            raise ValueError(f"{text!r}: {package}.{module_name} has no {attr}")
        return module, attr, parsed
    raise ValueError(f"{text!r}: no module {module_name} under engine.kernels or engine")


@contextmanager
def arm_context(base: Callable[[], AbstractContextManager], settings: Sequence[tuple]) -> Iterator[None]:
    """base() with each (module, constant, value) set inside, every one restored after."""
    with ExitStack() as stack:
        stack.enter_context(base())
        for module, attr, value in settings:
            stack.enter_context(setting(module, attr, value))
        yield


def arms_from_args(args: argparse.Namespace) -> tuple[dict, dict]:
    """(arm -> dispatch context, arm -> EngineConfig fields) from --{arm}-tables/-set/-engine; SystemExit
    names the flag of a bad value. An arm given any of them runs the current dispatch under them (the
    default before arm is the previous dispatch)."""
    runs, options = dict(ARMS), {}
    for arm in ARMS:
        path, sets, fields = (getattr(args, f"{arm}_{name}") for name in ("tables", "set", "engine"))
        try:
            options[arm] = dict(parse_option(t) for t in fields)
        except ValueError as err:
            raise SystemExit(f"--{arm}-engine: {err}") from None
        try:
            tables = read_tables(path) if path is not None else None
        except ValueError as err:
            raise SystemExit(f"--{arm}-tables: {err}") from None
        try:
            settings = [parse_setting(t) for t in sets]
        except ValueError as err:
            raise SystemExit(f"--{arm}-set: {err}") from None
        if tables is not None:
            runs[arm] = partial(tuning.in_force, tables)
        elif settings or options[arm]:  # the current dispatch, not the default "before" arm
            runs[arm] = nullcontext
        if settings:
            runs[arm] = partial(arm_context, runs[arm], settings)
    return runs, options
