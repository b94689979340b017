"""Engine: the one start path, add_request / step / generate / abort."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch
from tqdm import tqdm

from engine.config import EngineConfig, SamplingParams
from engine.hedge import Hedger, ScratchKV, chain_blocks, effective_positions
from engine.kernels import get_ops
from engine.knobs import read_knobs
from engine.kv_cache import BlockManager
from engine.levers import Levers
from engine.logprobs import record_logprobs
from engine.memory import plan_kv_blocks
from engine.policy import resolve_table
from engine.request import Finish, Request, RequestOutput
from engine.round import Rounds, SpecStats
from engine.runner import ModelRunner
from engine.sampler import sample_requests
from engine.scheduler import Plan, Scheduler
from engine.startup import load_models, max_model_len, resolve_device
from engine.stopping import StopStrings
from engine.timing import PhaseTimer
from engine.tokenizing import encode_prompt
from engine.trace import enable_trace

__all__ = ["Engine", "Levers", "RequestOutput", "SpecStats"]

log = logging.getLogger(__name__)


class Engine:
    def __init__(self, config: EngineConfig):
        # Knobs first: a malformed variable refuses to start before any weight is read.
        knobs = read_knobs()
        self.levers = knobs.levers.replace(config.levers)
        trace = knobs.test_log if config.trace is None else config.trace
        cost_table = resolve_table(self.levers, config.cost_table or knobs.cost_table)
        self.config = config
        self.device, self.dtype, backend = resolve_device(config)
        self.ops = get_ops(backend, config.batch_invariant)
        models = load_models(config, self.device, self.dtype, self.ops)
        self.target_cfg, self.draft_cfg = models.target_cfg, models.draft_cfg
        self.target, self.drafter = models.target, models.drafter
        self.tokenizer, self.eos_ids = models.tokenizer, models.eos_ids
        if self.draft_cfg and self.levers.max_drafts > self.draft_cfg.drafts_per_round:
            log.info(
                "max_drafts=%d exceeds the drafter's %d drafts per round: no trim",
                self.levers.max_drafts,
                self.draft_cfg.drafts_per_round,
            )
        self.max_model_len = max_model_len(config, models)

        bs = config.kv_block_size
        max_blocks_per_seq = -(-self.max_model_len // bs)
        # Hedge chains verify into scratch blocks reserved here, outside the pool, so a round never
        # runs out of KV: one set per chain a round can verify.
        chains = self._hedge_chain_slots()
        per_chain = chain_blocks(1 + self.drafts_per_round, bs)
        geometries = [self.target_cfg.geometry] + ([self.draft_cfg.geometry] if self.draft_cfg else [])
        num_blocks = plan_kv_blocks(config, geometries, self.dtype, self.device, max_blocks_per_seq, chains * per_chain)
        pool = num_blocks - chains * per_chain
        self.blocks = BlockManager(pool, bs)
        use_graphs = config.cuda_graphs and self.device.type == "cuda" and backend == "triton"
        self.runner = ModelRunner(
            self.target,
            self.drafter,
            num_blocks=num_blocks,
            block_size=bs,
            max_num_seqs=config.max_num_seqs,
            max_blocks_per_seq=max_blocks_per_seq,
            use_graphs=use_graphs,
            chain_rows=chains,
        )
        scratch = ScratchKV(self.runner, pool, chains, per_chain) if chains else None
        hedger = Hedger(self.runner, scratch, self.drafts_per_round)
        self.rounds = Rounds(self.runner, self.drafts_per_round, hedger, self.levers, trace, cost_table)
        self.scheduler = Scheduler(
            self.blocks,
            config.max_num_seqs,
            config.max_num_batched_tokens,
            self.draft_cfg.block_size if self.draft_cfg else 0,
            has_drafter=self.drafter is not None,
            max_batch=self.levers.max_batch,
            max_model_len=self.max_model_len,
            vocab_size=self.target_cfg.geometry.vocab_size,
        )
        self._next_index = 0
        self._requests: dict[str, Request] = {}  # unfinished, or finished but not yet reported
        self._unreported: dict[str, Request] = {}  # touched since the last step() output: reported next
        if trace:
            enable_trace()
        log.info(
            "engine ready: %s on %s/%s (%s backend, graphs %s), %d KV blocks of %d (%d hedge scratch), "
            "max_model_len %d",
            models.names,
            self.device,
            self.dtype,
            backend,
            "on" if use_graphs else "off",
            pool,
            bs,
            num_blocks - pool,
            self.max_model_len,
        )

    # -- public API --------------------------------------------------------------------------------
    @property
    def drafts_per_round(self) -> int:
        return self.draft_cfg.drafts_per_round if self.draft_cfg else 0

    @property
    def stats(self) -> SpecStats:
        return self.rounds.stats

    @property
    def timer(self) -> PhaseTimer | None:
        """Benchmarks set one to get per-step phase times."""
        return self.rounds.timer

    @timer.setter
    def timer(self, timer: PhaseTimer | None) -> None:
        self.rounds.timer = timer

    def add_request(self, prompt: str | Sequence[int], params: SamplingParams | None = None) -> str:
        """Queue a request; a request the engine cannot serve finishes at once as `rejected`."""
        params = params or SamplingParams()
        ids, error = encode_prompt(self.tokenizer, prompt)
        stop = set(params.stop_token_ids) | (set() if params.ignore_eos else set(self.eos_ids))
        stops = StopStrings(params.stop, self._decode) if params.stop and self.tokenizer is not None else None
        req = Request(self._next_index, ids, params, frozenset(stop), stop_strings=stops)
        self._next_index += 1
        self._requests[req.id] = req
        if params.stop and self.tokenizer is None:
            error = error or "stop strings need a tokenizer; this model has none (use stop_token_ids)"
        error = error or self.scheduler.admission_error(req)
        if error:
            log.warning("%s rejected: %s", req.id, error)
            req.finish(Finish.REJECTED, error)
            self._unreported[req.id] = req
            return req.id
        if not params.greedy:
            seed = params.seed if params.seed is not None else self.config.seed * 1_000_003 + req.index
            req.generator = torch.Generator(device=self.device).manual_seed(seed)
        self.scheduler.add(req)
        return req.id

    def abort(self, request_id: str) -> None:
        """Finish a waiting or running request as `abort` and free its KV; unknown or finished ids
        are ignored. Its last output comes with the next step()."""
        req = self._requests.get(request_id)
        if req is None or req.finished:
            return
        req.finish(Finish.ABORT)
        self.scheduler.release(req)
        self._unreported[req.id] = req

    def set_levers(self, **changes: object) -> None:
        """Change the levers between steps (benchmarks interleave lever arms on one set of weights);
        a value of None keeps the current one. Hedge scratch KV is sized at start: an engine started
        with the hedge off cannot hedge later, and chains beyond the reserved scratch are not verified."""
        self.levers = self.levers.replace(changes)
        self.scheduler.max_batch = self.levers.max_batch
        self.rounds.configure(self.levers)

    def has_unfinished(self) -> bool:
        return bool(self._unreported) or self.scheduler.has_work()

    def step(self) -> list[RequestOutput]:
        """Run one scheduled step; returns an output for every request touched since the last call."""
        for r in self._advance():
            self._unreported[r.id] = r
        touched, self._unreported = list(self._unreported.values()), {}
        return [self._report(r) for r in touched]

    def generate(
        self,
        prompts: str | Sequence[int] | Sequence[str | Sequence[int]],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        """Run these prompts to completion; a single string or token-id list is one prompt. Returns
        only these requests' outputs: other requests advance too, and their outputs stay with step().
        use_tqdm: a progress bar of finished requests on stderr."""
        if isinstance(prompts, str) or (len(prompts) and isinstance(prompts[0], int)):
            prompts = [prompts]
        if isinstance(params, SamplingParams) or params is None:
            params = [params or SamplingParams()] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(params)} SamplingParams")
        mine = [self._requests[self.add_request(p, sp)] for p, sp in zip(prompts, params, strict=True)]
        bar = tqdm(total=len(mine), desc="generate", unit="req", disable=not use_tqdm)
        while not all(r.finished for r in mine):
            touched = self._advance()
            if not touched:
                bar.close()
                raise RuntimeError("generate(): its requests are unfinished but no step made progress")
            for r in touched:
                self._unreported[r.id] = r
            done = sum(r.finished for r in mine)
            if done > bar.n:
                bar.update(done - bar.n)
        bar.close()
        for r in mine:
            self._unreported.pop(r.id, None)
        return [self._report(r) for r in mine]

    def _advance(self) -> list[Request]:
        """One scheduled step; finished requests give back their KV at once. Returns the touched ones."""
        scheduled = self.scheduler.schedule()
        if scheduled is None:
            return []
        plan, reqs = scheduled
        if self.timer:
            self.timer.start()
        if plan is Plan.PREFILL:
            self._prefill(reqs)
        elif plan is Plan.SPECULATIVE:
            self.rounds.speculate(reqs)
        else:
            self.rounds.one_token(reqs, gated=plan is Plan.GATED)
        if self.timer:
            self.timer.finish(plan.value, len(reqs))
        for r in reqs:
            if r.finished:
                self.scheduler.release(r)
        return reqs

    def _report(self, req: Request) -> RequestOutput:
        if req.finished:
            self._requests.pop(req.id, None)
        return req.output(self.tokenizer)

    def last_logits(self, prompt_ids: Sequence[int]) -> torch.Tensor:
        """fp32 logits after a prefill of prompt_ids on an idle engine (used by the regret oracle)."""
        if self.scheduler.has_work():
            raise RuntimeError("last_logits needs an idle engine")
        req = Request(self._next_index, [int(t) for t in prompt_ids], SamplingParams(max_tokens=1), frozenset())
        error = self.scheduler.admission_error(req)
        if error:
            raise ValueError(error)
        self.scheduler.add(req)
        self.scheduler.schedule()
        try:
            self.runner.assign_blocks(req)
            logits, _, _ = self.runner.prefill([req])
        finally:
            req.finish(Finish.LENGTH)
            self.scheduler.release(req)
        return logits[0].float()

    # -- steps -------------------------------------------------------------------------------------
    def _prefill(self, reqs: list[Request]) -> None:
        for r in reqs:
            self.runner.assign_blocks(r)
        logits, greedy, _ = self.runner.prefill(reqs)
        tokens = sample_requests(logits, greedy, reqs, 1).tolist()
        stored = self.drafter is not None  # the prefill stored every prompt row as drafter context
        for r, token in zip(reqs, tokens, strict=True):
            r.prefilled(token, context_stored=stored and r.params.speculate)
        record_logprobs(reqs, logits, 1, [1] * len(reqs))
        self.rounds.pause()

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _hedge_chain_slots(self) -> int:
        """Chains one round can verify: min(hedge, max_num_seqs) requests x branch positions; 0 when
        the hedge is off or the drafter has no Markov head."""
        lv = self.levers
        if not lv.hedge or self.drafter is None or self.drafter.markov is None:
            return 0
        return min(lv.hedge, self.config.max_num_seqs) * len(
            effective_positions(lv.hedge_positions, self.drafts_per_round)
        )
