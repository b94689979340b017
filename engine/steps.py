"""One scheduled step, run with its failure semantics: the scheduler's plan to the prefill or a round.

A RequestFailure finishes exactly its requests as `error` (a prefill's others are requeued and prefill
again); any other exception finishes every running request and the runner forgets the step
(docs/architecture.md, Failures). Finished requests give back their KV at once.
"""

from __future__ import annotations

import logging
import time

from engine.logprobs import record_logprobs
from engine.request import Finish, Request, RequestFailure
from engine.round import Rounds
from engine.runner import ModelRunner
from engine.sampler import sample_requests
from engine.scheduler import Plan, Scheduler, Step

log = logging.getLogger(__name__)


class Steps:
    def __init__(self, scheduler: Scheduler, runner: ModelRunner, rounds: Rounds):
        self.scheduler, self.runner, self.rounds = scheduler, runner, rounds

    def advance(self, no_more_requests: bool) -> list[Request]:
        """One scheduled step; the requests it touched. no_more_requests: none will come until the
        running ones finish (a draining wave, when none waits either)."""
        start, captures = time.perf_counter(), self.runner.graphs.captures
        step = self.scheduler.schedule(admit=not self.rounds.overlap.holds())
        if step is None:
            if self.scheduler.has_work():  # an invariant broke: fail loudly rather than spin
                raise RuntimeError(f"no step can run with requests waiting: {self.scheduler.describe()}")
            return []
        try:
            self.run(step, no_more_requests)
        except RequestFailure as err:
            log.warning("%s step: %s", step.plan.value, err)
            for r, why in err.failed.items():
                r.finish(Finish.ERROR, why)
            if step.plan is Plan.PREFILL:  # the others' prefills are dropped: they prefill again
                for r in step.reqs:
                    if not r.finished:
                        self.scheduler.requeue(r)
        except Exception as err:
            log.exception("%s step of %d request(s) failed", step.plan.value, len(step.reqs))
            return self.fail_running(f"{step.plan.value} step failed: {type(err).__name__}: {err}")
        else:
            if step.plan is not Plan.PREFILL:  # a step that captured a graph timed the capture, not the round
                wall = None if self.runner.graphs.captures != captures else 1e3 * (time.perf_counter() - start)
                self.rounds.step_wall(len(step.reqs), wall)
        for r in step.reqs:
            if r.finished:
                self.scheduler.release(r)
        return step.reqs

    def run(self, step: Step, no_more_requests: bool) -> None:
        timer = self.rounds.timer
        if step.grown:
            self.runner.assign_blocks(step.grown)
        if timer:
            timer.start()
        if step.plan is Plan.PREFILL:
            self.prefill(step.reqs)
        elif step.plan is Plan.SPECULATIVE:
            draining = no_more_requests and not self.scheduler.waiting
            self.rounds.speculate(step.reqs, draining=draining, admitting=self.scheduler.may_admit)
        else:
            self.rounds.one_token(step.reqs, gated=step.plan is Plan.GATED, admitting=self.scheduler.may_admit)
        if timer:
            timer.finish(step.plan.value, len(step.reqs))

    def prefill(self, reqs: list[Request]) -> None:
        """Prompts, and preempted requests' prompt + output (they keep their current token: no sample)."""
        logits, greedy = self.runner.prefill(reqs)
        fresh = [i for i, r in enumerate(reqs) if not r.output_ids]
        if len(fresh) < len(reqs):
            logits, greedy = logits[fresh], greedy[fresh]
        sampled = iter(sample_requests(logits, greedy, [reqs[i] for i in fresh], 1).tolist() if fresh else [])
        stored = self.runner.drafter is not None  # the prefill stored every prompt row as drafter context
        for r in reqs:
            r.prefilled(None if r.output_ids else next(sampled), context_stored=stored and r.params.speculate)
        record_logprobs([reqs[i] for i in fresh], logits, 1, [1] * len(fresh))
        self.rounds.pause()

    def fail_running(self, message: str) -> list[Request]:
        """Finish every running request as `error` and free its KV; the runner forgets the step."""
        failed = list(self.scheduler.running)
        for r in failed:
            r.finish(Finish.ERROR, message)
            self.scheduler.release(r)
        self.runner.reset()
        self.rounds.overlap.drop()
        self.rounds.pause()
        return failed
