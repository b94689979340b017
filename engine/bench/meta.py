"""What every bench writes beside its numbers: command line, device, commit, date, versions."""

from __future__ import annotations

import datetime
import os
import platform
import shlex
import sys

import torch

from engine.provenance import git_commit


def _version(module: str) -> str | None:
    try:
        return __import__(module).__version__
    except Exception:  # not installed, or broken: the record says so instead of failing the bench
        return None


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"


def run_meta(bench: str, device: torch.device, argv: list[str] | None = None) -> dict:
    """The record every bench writes: `bench` is its subcommand (python -m engine.bench BENCH ARGV)."""
    argv = sys.argv[1:] if argv is None else argv
    meta = dict(bench=bench, command=f"python -m engine.bench {bench} " + " ".join(shlex.quote(a) for a in argv))
    meta.update(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), commit=git_commit())
    meta.update(device=device_name(device), host=platform.node(), python=platform.python_version())
    meta.update(torch=torch.__version__, cuda=torch.version.cuda, triton=_version("triton"))
    return meta | dict(transformers=_version("transformers"))


def meta_lines(meta: dict) -> str:
    """A Markdown preamble naming the command, device, commit and date (the docs' rule for figures)."""
    return (
        f"- command: `{meta['command']}`\n"
        f"- device: {meta['device']}; torch {meta['torch']}, triton {meta['triton']}, "
        f"transformers {meta['transformers']}\n"
        f"- commit: {meta['commit']}; date: {meta['date']}\n"
    )
