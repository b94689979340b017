"""Engine: the one start path, add_request / step / generate / abort."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from functools import partial

import torch
from tqdm import tqdm

from engine.config import EngineConfig, SamplingParams, as_sampling_params
from engine.hedge import Hedger
from engine.kernels import get_ops
from engine.knobs import read_knobs
from engine.levers import Levers
from engine.policy.calibration import calibrated_table
from engine.policy.choice import round_drafts
from engine.policy.costs import CostTable
from engine.policy.span import resolve_table
from engine.policy.warmup import capture_policy_graphs, capture_serving_graphs
from engine.prompts import batch, completions, conversations, merged
from engine.request import Finish, Request, RequestOutput
from engine.round import Rounds
from engine.scheduler import Scheduler
from engine.spec_stats import SpecStats
from engine.startup import build_runner, load_models, max_model_len, resolve_device
from engine.steps import Steps
from engine.stopping import StopStrings
from engine.timing import PhaseTimer
from engine.tokenizing import encode_prompt, prompt_parts, render_chat
from engine.trace import enable_trace

__all__ = ["Engine", "Levers", "RequestOutput", "SpecStats"]

log = logging.getLogger(__name__)


class Engine:
    def __init__(self, config: EngineConfig, kv_from: Engine | None = None):
        """kv_from: an engine whose target KV pool this one uses instead of its own (benches: a plain and a
        speculative engine on one pool); the two must never hold requests at once."""
        # Knobs first: a malformed variable refuses to start before any weight is read.
        knobs = read_knobs()
        self.levers = knobs.levers.replace(config.levers)
        trace = knobs.test_log if config.trace is None else config.trace
        cost_table = resolve_table(config.cost_table or knobs.cost_table)
        self.config = config
        self.device, self.dtype, backend = resolve_device(config)
        self.ops = get_ops(backend, config.batch_invariant)
        models = load_models(config, self.device, self.dtype, self.ops)
        self.target_cfg, self.draft_cfg = models.target_cfg, models.draft_cfg
        self.target, self.drafter = models.target, models.drafter
        self.tokenizer, self.eos_ids = models.tokenizer, models.eos_ids
        if self.draft_cfg and self.levers.max_drafts > (per_round := self.draft_cfg.drafts_per_round):
            log.info(
                "max_drafts=%d exceeds the drafter's %d drafts per round: no trim", self.levers.max_drafts, per_round
            )
        self.max_model_len = max_model_len(config, models)

        use_graphs = config.cuda_graphs and self.device.type == "cuda" and backend == "triton"
        self._pool = kv_from._pool if kv_from else []  # the engines on one KV pool: one holds requests at a time
        self._pool.append(self)
        shared = kv_from.runner.kv if kv_from else None
        self.runner, self.blocks, scratch = build_runner(
            config, models, self.levers, self.max_model_len, use_graphs, shared
        )
        hedger = Hedger(self.runner, scratch, self.drafts_per_round)
        # No request comes until the running ones finish (generate(), a bench's last wave): a draining wave
        self.no_more_requests = False
        block = self.draft_cfg.block_size if self.draft_cfg else 0
        rows = max(block, 1 + self.drafts_per_round) if self.draft_cfg else 1  # past num_kv a round writes
        vocab = self.target_cfg.geometry.vocab_size
        self.scheduler = Scheduler(
            self.blocks, config.max_num_seqs, config.max_num_batched_tokens, block, self.drafter is not None,
            self.levers, self.max_model_len, vocab, round_rows=rows,
        )  # fmt: skip
        take = self.scheduler.take_ahead
        self.rounds = Rounds(self.runner, self.drafts_per_round, hedger, trace, cost_table, config.decode_overlap, take)
        self.steps = Steps(self.scheduler, self.runner, self.rounds)
        self.set_levers()  # adaptive without a cost table calibrates one here, on the idle engine
        self._next_index = 0
        # each completion's id -> its request's completions (unfinished, or finished and not yet reported)
        self._requests: dict[str, list[Request]] = {}
        self._unreported: dict[str, list[Request]] = {}  # request id -> completions touched since step() last ran
        if trace:
            enable_trace()
        pool, bs = self.blocks.num_blocks, config.kv_block_size
        scratch_blocks = self.runner.kv[0][0].shape[0] - pool
        graphs = "on" if use_graphs else "off"
        log.info(
            "engine ready: %s on %s/%s (%s backend, graphs %s), %d KV blocks of %d (%d scratch), max_model_len %d",
            *(models.names, self.device, self.dtype, backend, graphs, pool, bs, scratch_blocks, self.max_model_len),
        )

    # -- public API --------------------------------------------------------------------------------
    @property
    def drafts_per_round(self) -> int:
        return self.draft_cfg.drafts_per_round if self.draft_cfg else 0

    @property
    def stats(self) -> SpecStats:
        return self.rounds.stats

    @property
    def preemptions(self) -> int:
        """Requests preempted (blocks freed, re-prefilled later) because the KV pool ran dry."""
        return self.scheduler.preemptions

    @property
    def timer(self) -> PhaseTimer | None:
        """Benchmarks set one to get per-step phase times."""
        return self.rounds.timer

    @timer.setter
    def timer(self, timer: PhaseTimer | None) -> None:
        self.rounds.timer = timer

    def add_request(self, prompt: str | Sequence[int] | Mapping, params: SamplingParams | Mapping | None = None) -> str:
        """Queue a request: text, token ids, or vLLM's {"prompt": text} / {"prompt_token_ids": ids}; params
        a SamplingParams, a dict of its fields or None (the defaults; a bad one raises ValueError); n > 1
        runs n completions, reported together. A request the engine cannot serve (bad text or ids, too
        long, ...) finishes at once as `rejected`. Returns its id (RequestOutput.request_id)."""
        return self._add(prompt, as_sampling_params(params), "prompt")

    def _add(self, prompt: object, params: SamplingParams, label: str) -> str:
        if any(e.scheduler.has_work() for e in self._pool if e is not self):
            raise RuntimeError("kv_from: an engine on this KV pool still holds requests (one at a time)")
        ids, error = encode_prompt(self.tokenizer, prompt, label)
        if params.stop and self.tokenizer is None:
            error = error or "stop strings need a tokenizer; this model has none (use stop_token_ids)"
        stop = frozenset(params.stop_token_ids) | (frozenset() if params.ignore_eos else frozenset(self.eos_ids))
        skip = params.skip_special_tokens
        decode = partial(self.tokenizer.decode, skip_special_tokens=skip) if self.tokenizer else None
        text = prompt_parts(prompt)[0]
        text = text if isinstance(text, str) else None  # RequestOutput.prompt, as vLLM's
        group = []  # the request's completions; the first one's id is the request's
        for sp in completions(params):
            stops = StopStrings(sp.stop, decode) if sp.stop and decode is not None else None
            req = Request(self._next_index, ids, sp, stop, stop_strings=stops, prompt=text)
            self._next_index += 1
            group.append(req)
            self._requests[req.id] = group
            why = error or self.scheduler.admission_error(req)
            if why:
                log.warning("%s rejected: %s", req.id, why)
                req.finish(Finish.REJECTED, why)
                self._unreported[group[0].id] = group
                continue
            if not sp.greedy:
                seed = sp.seed if sp.seed is not None else self.config.seed * 1_000_003 + req.index
                req.generator = torch.Generator(device=self.device).manual_seed(seed)
            self.scheduler.add(req)
        return group[0].id

    def abort(self, request_id: str) -> None:
        """Finish a waiting or running request (each of its completions) as `abort` and free its KV;
        unknown or finished ids are ignored. Its last output comes with the next step()."""
        group = self._requests.get(request_id)
        if group is None or group[0].id != request_id or all(r.finished for r in group):
            return
        for req in group:
            if not req.finished:
                req.finish(Finish.ABORT)
                self.scheduler.release(req)
        self._unreported[request_id] = group

    def set_levers(self, **changes: object) -> None:
        """Change the levers between steps (None keeps a value) and push them to the scheduler and the
        rounds. Hedge scratch KV is sized at start: an engine started with the hedge off cannot hedge
        later. policy=adaptive or budget without a cost table measures one first (idle engine only)."""
        levers = self.levers.replace(changes)
        adaptive = levers.policy != "static" and self.drafter is not None
        if adaptive and self.rounds.cost_table is None:
            self.set_cost_table(calibrated_table(self, self.rounds.accept))
        self.rounds.configure(levers)  # refuses before anything changes
        self.levers = self.scheduler.levers = levers
        if adaptive:
            capture_policy_graphs(self, self.rounds.accept)  # once, on an idle engine: the graphs its rounds replay

    def capture_graphs(self) -> dict:
        """Before serving (idle engine, graphs on): every graph a round at the current levers replays, then
        none captured while serving (a step without one runs eagerly). Returns {graphs, seconds, bytes}."""
        ks = [round_drafts(self.drafts_per_round, self.levers.max_drafts)] if self.drafter is not None else []
        return capture_serving_graphs(self, self.rounds.accept, ks)

    def set_cost_table(self, table: CostTable) -> None:
        """A cost table measured on this device (a bench's): the policy learns the host time it misses."""
        self.rounds.set_cost_table(table)

    def has_unfinished(self) -> bool:
        return bool(self._unreported) or self.scheduler.has_work()

    def step(self) -> list[RequestOutput]:
        """Run one scheduled step; returns an output for every request touched since the last call."""
        self._touched(self.steps.advance(self.no_more_requests))
        touched, self._unreported = list(self._unreported), {}
        return [self._report(g) for g in touched]

    def generate(
        self,
        prompts: str | Sequence[int] | Sequence[str | Sequence[int]],
        params: SamplingParams | Mapping | Sequence[SamplingParams | Mapping] | None = None,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        """Run these prompts to completion; a single string, token-id list or dict prompt is one prompt.
        params: one for all or one per prompt (SamplingParams or dicts of its fields); n > 1 runs n
        completions of that prompt, one RequestOutput with n `outputs`. A bad prompt is rejected alone
        (finish_reason "rejected", its error naming "prompt i"). Returns only these requests' outputs:
        other requests advance too, and their outputs stay with step().
        use_tqdm: a progress bar of finished requests on stderr."""
        prompts, params = batch(prompts, params)  # a bad params raises here, before any prompt is admitted
        mine: list[str] = []
        try:  # a bad prompt is rejected alone; an unexpected failure takes back what it had admitted
            for i, (p, sp) in enumerate(zip(prompts, params, strict=True)):
                mine.append(self._add(p, sp, f"prompt {i}"))
        except BaseException:
            self._discard(mine)
            raise
        reqs = [r for g in mine for r in self._requests[g]]
        bar = tqdm(total=len(reqs), desc="generate", unit="req", disable=not use_tqdm)
        before, self.no_more_requests = self.no_more_requests, True
        try:
            while not all(r.finished for r in reqs):
                touched = self.steps.advance(self.no_more_requests)
                if not touched:
                    raise RuntimeError(f"generate(): requests unfinished but no step ran: {self.scheduler.describe()}")
                self._touched(touched)
                bar.update(sum(r.finished for r in reqs) - bar.n)
        finally:
            self.no_more_requests = before
        bar.close()
        for g in mine:
            self._unreported.pop(g, None)
        return [self._report(g) for g in mine]

    def chat(
        self, messages: Sequence, params: SamplingParams | Mapping | None = None, use_tqdm: bool = False
    ) -> list[RequestOutput]:
        """vLLM's LLM.chat: one conversation ([{"role", "content"}, ...]) or a list of them, each rendered
        through the tokenizer's chat template with the generation prompt, then generate(); a
        ValueError where the tokenizer has no template."""
        prompts = [render_chat(self.tokenizer, c) for c in conversations(messages)]
        return self.generate(prompts, params, use_tqdm)

    def _touched(self, reqs: list[Request]) -> None:
        for r in reqs:
            group = self._requests[r.id]
            self._unreported[group[0].id] = group

    def _discard(self, ids: list[str]) -> None:
        """Forget these requests entirely: aborted (KV freed) and never reported."""
        for request_id in ids:
            self.abort(request_id)
            self._unreported.pop(request_id, None)
            for r in self._requests[request_id]:
                self._requests.pop(r.id)

    def _report(self, request_id: str) -> RequestOutput:
        group = self._requests[request_id]
        if all(r.finished for r in group):
            for r in group:
                self._requests.pop(r.id)
        return merged([r.output(self.tokenizer) for r in group])

    def last_logits(self, prompt_ids: Sequence[int]) -> torch.Tensor:
        """fp32 logits after a prefill of prompt_ids on an idle engine (used by the regret oracle)."""
        if self.scheduler.has_work():
            raise RuntimeError("last_logits needs an idle engine")
        req = Request(
            self._next_index, [int(t) for t in prompt_ids], SamplingParams(temperature=0, max_tokens=1), frozenset()
        )
        error = self.scheduler.admission_error(req)
        if error:
            raise ValueError(error)
        self.scheduler.add(req)
        self.scheduler.schedule()
        try:
            self.runner.assign_blocks([req])
            logits, _ = self.runner.prefill([req])
        finally:
            req.finish(Finish.LENGTH)
            self.scheduler.release(req)
        return logits[0].float()
