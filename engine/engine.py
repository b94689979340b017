"""Engine: the one start path, add_request / step / generate."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence

import torch

from engine.config import EngineConfig, SamplingParams
from engine.hedge import effective_positions
from engine.kernels import get_ops
from engine.knobs import read_knobs
from engine.kv_cache import BlockManager
from engine.levers import Levers, check_lever_values, resolve_levers
from engine.loader import open_checkpoint
from engine.memory import plan_kv_blocks
from engine.models.config import DFlashConfig, Qwen3Config
from engine.models.dflash import DFlashDrafter
from engine.models.qwen3 import Qwen3ForCausalLM
from engine.request import Finish, Request, RequestOutput
from engine.runner import ModelRunner
from engine.sampler import sample_rows
from engine.scheduler import Plan, Scheduler
from engine.scratch import ScratchKV, chain_blocks
from engine.timing import PhaseTimer
from engine.tokenizing import encode_prompt, eos_ids, load_tokenizer
from engine.trace import enable_trace
from engine.verify import SpecStats, Speculator

__all__ = ["Engine", "Levers", "RequestOutput", "SpecStats", "resolve_levers"]

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
DEFAULT_MAX_MODEL_LEN = 4096


def _device(config: EngineConfig) -> torch.device:
    if config.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if config.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("EngineConfig.device='cuda' but no CUDA device is available")
    return torch.device(config.device)


class Engine:
    def __init__(self, config: EngineConfig):
        # Knobs first: a malformed variable refuses to start before any weight is read.
        self.levers = resolve_levers(config, read_knobs())
        self.config = config
        self.device = _device(config)
        self.dtype = (
            _DTYPES[config.dtype]
            if config.dtype != "auto"
            else (torch.bfloat16 if self.device.type == "cuda" else torch.float32)
        )
        backend = config.backend if config.backend != "auto" else ("triton" if self.device.type == "cuda" else "torch")
        if backend == "triton" and self.device.type != "cuda":
            raise ValueError("the triton backend needs a CUDA device; use backend='torch' on CPU")
        self.ops = get_ops(backend, config.batch_invariant)

        target = open_checkpoint(config.model)
        self.target_cfg = Qwen3Config.from_dict(target.config, where=target.name)
        self.draft_cfg: DFlashConfig | None = None
        if config.draft_model:
            draft = open_checkpoint(config.draft_model)
            self.draft_cfg = DFlashConfig.from_dict(draft.config, where=draft.name)
            self.draft_cfg.check_fits(self.target_cfg)

        self.target = Qwen3ForCausalLM(
            self.target_cfg,
            target.load_tensors(),
            where=target.name,
            device=self.device,
            dtype=self.dtype,
            ops=self.ops,
        )
        self.drafter: DFlashDrafter | None = None
        if self.draft_cfg is not None:
            self.drafter = DFlashDrafter(
                self.draft_cfg,
                draft.load_tensors(),
                where=draft.name,
                target=self.target,
                device=self.device,
                dtype=self.dtype,
                ops=self.ops,
            )
            if self.levers.max_drafts > self.draft_cfg.drafts_per_round:
                log.info(
                    "max_drafts=%d exceeds the drafter's %d drafts per round: no trim",
                    self.levers.max_drafts,
                    self.draft_cfg.drafts_per_round,
                )
        self.tokenizer = load_tokenizer(target.directory)
        self.eos_ids = eos_ids(self.target_cfg, target.directory, self.tokenizer)

        self.headroom = self.draft_cfg.block_size if self.draft_cfg else 0
        limits = [self.target_cfg.geometry.max_position_embeddings]
        if self.draft_cfg:
            limits.append(self.draft_cfg.geometry.max_position_embeddings)
        self.max_model_len = min(limits) if config.max_model_len is None else config.max_model_len
        if config.max_model_len is None:
            self.max_model_len = min(self.max_model_len, DEFAULT_MAX_MODEL_LEN)
        elif config.max_model_len > min(limits):
            raise ValueError(
                f"EngineConfig.max_model_len={config.max_model_len} exceeds the models' limit {min(limits)}"
            )
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
        self.speculator = Speculator(self.runner, self.drafts_per_round, self._sample, self._mark, scratch)
        self.speculator.configure(self.levers)
        self.scheduler = Scheduler(
            self.blocks,
            config.max_num_seqs,
            config.max_num_batched_tokens,
            self.headroom,
            has_drafter=self.drafter is not None,
            max_batch=self.levers.max_batch,
        )
        self.timer: PhaseTimer | None = None  # benchmarks set one to get per-step phase times
        self._next_index = 0
        self._rejected: list[Request] = []
        if self.levers.trace:
            enable_trace()
        log.info(
            "engine ready: %s%s on %s/%s (%s backend, graphs %s), %d KV blocks of %d (%d hedge scratch), "
            "max_model_len %d",
            target.name,
            f" + drafter {draft.name}" if self.drafter else "",
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
        return self.speculator.stats

    def add_request(self, prompt: str | Sequence[int], params: SamplingParams | None = None) -> str:
        """Queue a request; a request the engine cannot serve finishes at once as `rejected`."""
        params = params or SamplingParams()
        ids, error = encode_prompt(self.tokenizer, prompt)
        stop = set(params.stop_token_ids) | (set() if params.ignore_eos else set(self.eos_ids))
        req = Request(self._next_index, ids, params, frozenset(stop))
        self._next_index += 1
        error = error or self._admission_error(req)
        if error:
            log.warning("%s rejected: %s", req.id, error)
            req.finish(Finish.REJECTED, error)
            self._rejected.append(req)
            return req.id
        if not params.greedy:
            seed = params.seed if params.seed is not None else self.config.seed * 1_000_003 + req.index
            req.generator = torch.Generator(device=self.device).manual_seed(seed)
        self.scheduler.add(req)
        return req.id

    def set_levers(
        self,
        max_batch: int | None = None,
        max_drafts: int | None = None,
        hedge: int | None = None,
        hedge_positions: Sequence[int] | None = None,
        hedge_auto: bool | None = None,
        hedge_knee: int | None = None,
    ) -> None:
        """Change the levers between steps (benchmarks interleave lever arms on one set of weights);
        None keeps the current value. Hedge scratch KV is sized at start: an engine started with the
        hedge off cannot hedge later, and chains beyond the reserved scratch are not verified."""
        given = dict(
            max_batch=max_batch,
            max_drafts=max_drafts,
            hedge=hedge,
            hedge_positions=hedge_positions,
            hedge_auto=hedge_auto,
            hedge_knee=hedge_knee,
        )
        check_lever_values(**given)
        if hedge_positions is not None:
            given["hedge_positions"] = tuple(hedge_positions)
        self.levers = dataclasses.replace(self.levers, **{k: v for k, v in given.items() if v is not None})
        self.scheduler.max_batch = self.levers.max_batch
        self.speculator.configure(self.levers)

    def abort(self, request_id: str) -> None:
        """Finish a waiting or running request with finish_reason "abort" and free its blocks and slot;
        the next step() reports it. An unknown or already finished id is a no-op."""
        for req in [*self.scheduler.waiting, *self.scheduler.running]:
            if req.id == request_id:
                if req in self.scheduler.waiting:
                    self.scheduler.waiting.remove(req)
                req.finish(Finish.ABORT)
                self.scheduler.release(req)
                self._rejected.append(req)  # reported (and released again, a no-op) by the next step
                return

    def has_unfinished(self) -> bool:
        return bool(self._rejected) or self.scheduler.has_work()

    def step(self) -> list[RequestOutput]:
        """Run one scheduled step; returns an output for every request it touched."""
        touched, self._rejected = self._rejected, []
        scheduled = self.scheduler.schedule()
        if scheduled is not None:
            reqs, plan = scheduled.requests, scheduled.decision.plan
            if self.timer:
                self.timer.start()
            if plan is Plan.PREFILL:
                self._prefill(reqs)
                self.speculator.pause()
            elif plan is Plan.DECODE:
                self._decode(reqs)
                self.speculator.pause()
            elif plan is Plan.GATED:
                self.speculator.gated_round(reqs, self.levers)
            else:
                self.speculator.round(reqs, self.levers)
            if self.timer:
                self.timer.finish(plan.value, len(reqs))
            touched += reqs
        outputs = [r.output(self.tokenizer) for r in touched]
        for r in touched:
            if r.finished:
                self.scheduler.release(r)
        return outputs

    def generate(
        self,
        prompts: Sequence[str | Sequence[int]],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        if isinstance(params, SamplingParams) or params is None:
            params = [params or SamplingParams()] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(params)} SamplingParams")
        ids = [self.add_request(p, sp) for p, sp in zip(prompts, params, strict=True)]
        wanted, done = set(ids), {}
        while wanted - done.keys():
            for out in self.step():
                if out.finished and out.request_id in wanted:
                    done[out.request_id] = out
        return [done[i] for i in ids]

    def last_logits(self, prompt_ids: Sequence[int]) -> torch.Tensor:
        """fp32 logits after a prefill of prompt_ids on an idle engine (used by the regret oracle)."""
        if self.scheduler.has_work():
            raise RuntimeError("last_logits needs an idle engine")
        req = Request(self._next_index, [int(t) for t in prompt_ids], SamplingParams(max_tokens=1), frozenset())
        error = self._admission_error(req)
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
        self._mark("target")
        tokens = self._sample(logits, greedy, [(r, 1) for r in reqs]).tolist()
        for r, token in zip(reqs, tokens, strict=True):
            n = len(r.prompt_ids)
            r.num_kv = n
            if self.drafter is not None and r.params.speculate:  # the prefill stored the prompt's context
                r.ctx_pending, r.draft_kv_len, r.draft_ready = [], n, True
            r.commit([token])

    def _decode(self, reqs: list[Request]) -> None:
        self.runner.stage(reqs)
        res = self.runner.decode(reqs)
        self._mark("target")
        tokens = self._sample(res.logits, res.greedy, [(r, 1) for r in reqs]).tolist()
        for r, token in zip(reqs, tokens, strict=True):
            r.num_kv += 1
            r.drop_draft_state()  # a plain decode advances outside the speculative path
            r.commit([token])

    def _mark(self, phase: str) -> None:
        if self.timer:
            self.timer.mark(phase)

    def _sample(self, logits: torch.Tensor, greedy: torch.Tensor, rows: list[tuple[Request, int]]) -> torch.Tensor:
        params = [r.params for r, count in rows for _ in range(count)]
        gens = [r.generator for r, count in rows for _ in range(count)]
        return sample_rows(logits, greedy, params, gens)

    # -- admission -----------------------------------------------------------------------------------
    def _admission_error(self, req: Request) -> str | None:
        n, budget, vocab = len(req.prompt_ids), req.params.max_tokens, self.target_cfg.geometry.vocab_size
        if n == 0:
            return "empty prompt"
        bad = [t for t in req.prompt_ids if not 0 <= t < vocab]
        if bad:
            return f"prompt token id {bad[0]} outside the vocabulary [0, {vocab})"
        limit = self.max_model_len - self.headroom
        why = f"the context limit {limit}" + (
            f" (max_model_len {self.max_model_len} minus the drafter's block headroom {self.headroom})"
            if self.headroom
            else ""
        )
        if n >= limit:
            return f"prompt of {n} tokens is longer than {why}"
        if n + budget > limit:
            return f"prompt ({n} tokens) + max_tokens ({budget}) = {n + budget} exceeds {why}"
        need = self.scheduler.blocks_needed(req)
        if need > self.blocks.capacity:
            return f"needs {need} KV blocks but the cache holds {self.blocks.capacity}"
        return None

    def _hedge_chain_slots(self) -> int:
        """Chains one round can verify: min(hedge, max_num_seqs) requests x branch positions; 0 when
        the hedge is off or the drafter has no Markov head."""
        lv = self.levers
        if not lv.hedge or self.drafter is None or self.drafter.markov is None:
            return 0
        return min(lv.hedge, self.config.max_num_seqs) * len(
            effective_positions(lv.hedge_positions, self.drafts_per_round)
        )
