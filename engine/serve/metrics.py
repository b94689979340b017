"""/metrics in the Prometheus text exposition format (version 0.0.4)."""

from __future__ import annotations

import dataclasses

from engine.serve.worker import Counters

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
PREFIX = "pegaspec_"

_COUNTER_HELP = {
    "requests": "requests received by the engine (each of n choices counts)",
    "aborted": "requests aborted (client gone)",
    "rejected": "requests the engine refused at admission",
    "errors": "requests finished by an engine failure",
    "prompt_tokens": "prompt tokens of finished requests",
    "completion_tokens": "completion tokens of finished requests",
    "steps": "engine steps run",
}
_OTHER_COUNTERS = {
    "preemptions": "requests preempted (KV recompute)",
    "launched_ahead": "steps and speculative rounds launched before the host read the step before",
    "launched_ahead_used": "steps launched ahead that the next step used (the rest were dropped)",
}
_GAUGE_HELP = {
    "tau": "mean committed tokens per speculating request-round",
    "running": "requests holding KV",
    "waiting": "requests queued for admission",
    "kv_blocks_total": "KV blocks in the pool",
    "kv_blocks_free": "KV blocks free",
}


def render(counters: Counters, snapshot: dict[str, float]) -> str:
    """Server counters, the engine's SpecStats counters (stats_*), preemptions, gauges and the
    current lever values (lever_*)."""
    lines: list[str] = []

    def emit(name: str, kind: str, doc: str, value: float) -> None:
        full = PREFIX + name + ("_total" if kind == "counter" else "")
        lines.extend((f"# HELP {full} {doc}", f"# TYPE {full} {kind}", f"{full} {_number(value)}"))

    for f in dataclasses.fields(counters):
        emit(f.name, "counter", _COUNTER_HELP[f.name], getattr(counters, f.name))
    for key, value in sorted(snapshot.items()):
        if key.startswith("stats_"):
            emit(key[len("stats_") :], "counter", f"engine SpecStats.{key[len('stats_') :]}", value)
        elif key.startswith("lever_"):
            emit(key, "gauge", f"current lever {key[len('lever_') :]} (0 = off)", value)
        elif key in _OTHER_COUNTERS:
            emit(key, "counter", _OTHER_COUNTERS[key], value)
        else:
            emit(key, "gauge", _GAUGE_HELP.get(key, key), value)
    return "\n".join(lines) + "\n"


def _number(value: float) -> str:
    if isinstance(value, bool):
        return str(int(value))
    return str(value) if isinstance(value, int) else repr(float(value))
