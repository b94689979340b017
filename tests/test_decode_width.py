"""The decode step's block-table width (engine/runner.py): a batch whose keys all fit in SHORT_KEYS runs
on a table cut to that width (so the attention launches no split it cannot use, kernels/attention.py),
a longer one on the whole table; the graph is keyed by the width, and both widths decode alike."""

from __future__ import annotations

import torch

from engine import Engine, EngineConfig, SamplingParams, runner
from engine.kernels import attention
from engine.runner import SHORT_KEYS
from tests.graph_fakes import CPUGraphs

GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


SHORT = 128  # the tiny target's 512 positions hold a short and a long class at this cut


def engine(target) -> Engine:
    e = Engine(EngineConfig(model=str(target), device="cpu", max_num_seqs=2, max_model_len=4 * SHORT))
    e.runner.graphs = CPUGraphs([1, 2])
    return e


def test_short_and_long_batches_decode_on_their_own_table_width(tiny_target, one_thread, monkeypatch):
    monkeypatch.setattr(runner, "SHORT_KEYS", SHORT)
    e = engine(tiny_target)
    short, full = e.runner.decode_widths
    assert short * e.runner.block_size == SHORT and full == e.runner.block_tables.shape[1] > short
    e.generate([[5, 6, 7]], GREEDY)
    assert {k[:2] for k in e.runner.graphs.captured if k[0] == "decode"} == {("decode", short)}
    long_prompt = [(7 * i) % 200 + 3 for i in range(SHORT + 40)]
    out = e.generate([long_prompt, [5, 6, 7]], GREEDY)
    assert ("decode", full, 2) in e.runner.graphs.captured  # one long sequence: the whole table
    wide = engine(tiny_target)
    wide.runner.decode_widths = [full]  # every decode on the whole table
    assert [o.token_ids for o in wide.generate([long_prompt, [5, 6, 7]], GREEDY)] == [o.token_ids for o in out]


def test_extra_splits_only_where_the_table_allows_more_keys_than_the_splits_take():
    cpu = torch.device("cpu")
    short = attention.attention_config(1, 1, 4, 1, SHORT_KEYS, cpu, False)
    assert short[3] == short[4] > 1  # no split past SPLIT_KEYS keys fits: the grid is the splits
    long = attention.attention_config(1, 1, 4, 1, 32 * SHORT_KEYS, cpu, False)
    assert long[3] == min(attention.MAX_SPLITS, attention.LONG_SPLIT_FACTOR * long[4])
