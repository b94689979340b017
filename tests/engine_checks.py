"""Shared checks of an engine's bookkeeping after a run."""

from __future__ import annotations

from engine import Engine


def assert_idle(engine: Engine) -> None:
    """Nothing queued, and every KV block and block-table slot is back in the pool."""
    s = engine.scheduler
    assert not s.has_work() and not engine.has_unfinished()
    assert s.blocks.num_free == s.blocks.capacity, s.describe()
    assert s.num_free_slots == engine.config.max_num_seqs
