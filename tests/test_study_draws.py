"""The modelled drafter's draws as the study stores them (engine/bench/study/draws.py): the file, the
lookup by round window and KV position, and the prompts a sweep can reach."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.bench.arms import parse_arms
from engine.bench.study.draws import DRAWS_FILE, StudyDraws, read_draws, sweep_prompts
from engine.fixture.known.modelled import parse_profile


def test_draws_survive_their_file_and_are_looked_up_by_window_and_position(tmp_path):
    table = np.arange(12, dtype=np.uint8).reshape(3, 4)  # 3 prompts x 4 positions
    draws = StudyDraws({("code", 0): table, ("measured:a|b", 5): table + 1}, {"spec": 0, "spec#2": 5}, 6)
    draws.save(tmp_path)
    got = StudyDraws.load(tmp_path)
    assert got.total == 6 and got.replicas == draws.replicas and set(got.counts) == set(draws.counts)
    assert (got.counts[("measured:a|b", 5)] == table + 1).all()
    spec = got.accepted("code", "spec", first=1)
    assert spec(0, 1) == table[1, 0] and spec(1, 4) == table[2, 3]  # request i: prompt first + i, KV j = out - 1
    assert got.accepted("measured:a|b", "spec#2", first=0)(2, 2) == table[2, 1] + 1
    assert got.accepted("code", "spec+trim=4", first=0)(0, 1) == table[0, 0]  # a primary arm: replica 0
    assert got.accepted("chat", "spec", first=0) is None  # no table for the profile
    with pytest.raises(ValueError, match="outside the table"):
        spec(2, 1)  # prompt 3: past the stored rows (the sweep's list has 6)
    with pytest.raises(ValueError, match="outside the table"):
        spec(0, 5)
    (tmp_path / DRAWS_FILE).unlink()
    assert StudyDraws.load(tmp_path) is None  # a run from before the draws were stored


def test_the_window_wraps_like_the_closed_loop():
    draws = StudyDraws({("code", 0): np.array([[1], [2], [3]], dtype=np.uint8)}, {"spec": 0}, 3)
    assert draws.accepted("code", "spec", first=2)(1, 1) == 1  # prompt (2 + 1) % 3


def test_the_sweep_reaches_rounds_plus_warmup_windows_of_its_widest_concurrency():
    def waves(c):
        return 2 if c <= 16 else 1

    assert sweep_prompts([1, 16, 64], 3, waves, 4096) == 4 * 64
    assert sweep_prompts([8, 16], 3, waves, 4096) == 4 * 32
    assert sweep_prompts([256], 3, waves, 100) == 100


class FakeDrafter:
    """The parts of ModelledDrafter read_draws uses: accepted = (token + num_kv + replica) % 5."""

    device = torch.device("cpu")

    def __init__(self):
        self.profile, self.replica = None, 0

    def set_profile(self, profile):
        self.profile = profile

    def set_replica(self, replica):
        self.replica = replica

    def before_arm(self, arm):
        self.replica = 9 if "#" in arm.label else 0

    def accepted(self, token, num_kv):
        bump = 1 if self.profile.name == "chat" else 0
        return (token + num_kv + self.replica + bump) % 5


def test_draws_are_read_per_profile_and_replica_and_the_drafter_is_put_back():
    drafter = FakeDrafter()
    prompts = [[7, 3], [1, 2, 4], [5]]
    profiles = [parse_profile("code"), parse_profile("chat")]
    got = read_draws(drafter, prompts, profiles, parse_arms(["spec", "spec#2"], noise_arm=True), 3, 2)
    assert got.total == 3 and got.replicas == {"spec": 0, "spec#2": 9}  # plain arms draw nothing
    assert set(got.counts) == {("code", 0), ("code", 9), ("chat", 0), ("chat", 9)}
    # prompt 1: token 4, KV 3, 4, 5
    assert got.counts[("code", 0)][1].tolist() == [(4 + 3) % 5, (4 + 4) % 5, (4 + 5) % 5]
    assert got.counts[("chat", 9)][0].tolist() == [(3 + 2 + 9 + 1) % 5, (3 + 3 + 10) % 5, (3 + 4 + 10) % 5]
    assert got.counts[("code", 0)].shape == (2, 3) and got.counts[("code", 0)].dtype == np.uint8
    assert drafter.profile.name == "code" and drafter.replica == 0
