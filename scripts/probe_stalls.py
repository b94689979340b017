"""Throwaway probe: where do serving stalls come from? In-process open loop on the known 4B pair."""

import random, sys, time, json, os
import torch
from engine.bench.arms import parse_arm
from engine.bench.serve_pair import known_engine
from engine.fixture.known.modelled import parse_profile
from engine.config import SamplingParams

out = os.environ.get("OUT", "/tmp")
res = {}
for label in sys.argv[1:]:
    arm = parse_arm(label)
    e = known_engine("4b", parse_profile("code"), arm, torch.device("cuda"), max_num_seqs=64)
    t0 = time.perf_counter()
    rep = e.capture_graphs()
    rep["wall"] = time.perf_counter() - t0
    g = e.runner.graphs
    keys = sorted({k[0] for k in g.captured})
    print(label, "capture", rep, "kinds", keys, flush=True)
    vocab = e.target_cfg.geometry.vocab_size
    rng = random.Random(1)
    for rate, dur in ((64, 1.0), (16, 2.0), (64, 2.0)):
        arrivals, t = [], 0.0
        while t < dur:
            t += rng.expovariate(rate)
            arrivals.append(t)
        steps = []
        start = time.perf_counter()
        i = 0
        while i < len(arrivals) or e.has_unfinished():
            now = time.perf_counter() - start
            while i < len(arrivals) and arrivals[i] <= now:
                e.add_request(
                    [rng.randrange(vocab) for _ in range(16)],
                    SamplingParams(temperature=0, max_tokens=64, ignore_eos=True),
                )
                i += 1
            if not e.has_unfinished():
                time.sleep(0.0005)
                continue
            miss, cap = g.eager_misses, g.captures
            waiting = len(e.scheduler.waiting)
            running = len(e.scheduler.running)
            s = time.perf_counter()
            e.step()
            torch.cuda.synchronize()
            w = time.perf_counter() - s
            steps.append(
                dict(ms=w * 1e3, waiting=waiting, running=running, miss=g.eager_misses - miss, cap=g.captures - cap)
            )
        ms = sorted(x["ms"] for x in steps)
        q = lambda p: ms[min(len(ms) - 1, int(p / 100 * len(ms)))]
        slow = sorted(steps, key=lambda x: -x["ms"])[:8]
        row = dict(
            steps=len(steps),
            p50=q(50),
            p99=q(99),
            max=ms[-1],
            misses=sum(x["miss"] for x in steps),
            caps=sum(x["cap"] for x in steps),
            admit_steps=sum(x["waiting"] > 0 for x in steps),
            admit_p50=sorted(x["ms"] for x in steps if x["waiting"] > 0 or x["miss"])[
                len([1 for x in steps if x["waiting"] > 0 or x["miss"]]) // 2
            ]
            if any(x["waiting"] > 0 or x["miss"] for x in steps)
            else None,
            slow=slow,
        )
        print(label, rate, dur, json.dumps(row), flush=True)
        res[f"{label}@{rate}x{dur}"] = row
    del e
    torch.cuda.empty_cache()
json.dump(res, open(f"{out}/stalls.json", "w"), indent=1)
