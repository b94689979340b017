"""A sweep.csv row (engine/bench/sweep.py round_row's columns) for the summary and report tests."""

from __future__ import annotations


def sweep_row(c: int, rnd: int, arm: str, tok_s: float, choices: str = "") -> dict:
    return {
        "concurrency": c,
        "round": rnd,
        "arm": arm,
        "tok_s": tok_s,
        "request_rounds": 10,
        "gated_rounds": 0,
        "committed_tokens": 30,
        "accept_hist": "",
        "span_choices": choices,
        "draft_ms": 1.0,
        "target_ms": 1.0,
        "other_ms": 1.0,
        "steps_ms": 3.0,
        "peak_mem_gib": None,
    }
