"""Hedged verify and the auto-hedge controller (docs/design/hedging.md)."""

from engine.hedge.auto import AutoHedge
from engine.hedge.chains import Candidate, effective_positions, plan_chains
from engine.hedge.hedger import Hedger
from engine.hedge.scratch import ScratchKV, chain_blocks

__all__ = ["AutoHedge", "Candidate", "Hedger", "ScratchKV", "chain_blocks", "effective_positions", "plan_chains"]
