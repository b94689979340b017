"""Drafter ablation on one frozen target: which drafter recipe lifts τ on the `small` pair.

`prepare` builds the small recipe's corpus, tokenizer and target once, its greedy pool (drafter
split) and a held-out greedy pool; `variant` trains one drafter with recipe overrides against that
target and measures τ with the reference loop at 64 and 128 new tokens, plus teacher-forced
accuracy on the held-out greedy pool (separates over-fitting from in-loop effects). Several
variants can run side by side on one GPU (scripts/h200_stage9.sh).

    PYTHONPATH=. python scripts/drafter_ablation.py prepare --dir /tmp/abl --pool 98304
    PYTHONPATH=. python scripts/drafter_ablation.py variant --dir /tmp/abl --name wide --out $OUT \
        --set drafter_batch=256 --set anchors_per_seq=32
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from transformers import Qwen3ForCausalLM

from engine.fixture.build import _tokenizer_texts
from engine.fixture.corpus import heldout_prompts, load_corpus
from engine.fixture.optim import seed_all
from engine.fixture.recipes import get_recipe
from engine.fixture.reference import measure_acceptance
from engine.fixture.tokenizer import encode_stream, save_tokenizer, special_ids, train_tokenizer
from engine.fixture.train_drafter import (
    DrafterData,
    drafter_loss,
    greedy_extend,
    make_drafter,
    make_greedy_pool,
    target_features,
    train_drafter,
)
from engine.fixture.train_target import eval_loss, make_target, random_windows, train_target

HELD_POOL = 512


def _say(msg: str) -> None:
    print(f"[ablation] {msg}", file=sys.stderr, flush=True)


def prepare(d: Path, recipe: str, pool: int, seed: int, dev: torch.device) -> None:
    r = get_recipe(recipe).with_overrides([f"greedy_sequences={pool}", "greedy_batch=8192"])
    torch.backends.cuda.matmul.allow_tf32 = True
    seed_all(seed)
    t0 = time.perf_counter()
    corpus = load_corpus(r.heldout_percent, r.corpus_max_bytes, r.site_bytes, r.drafter_prompt_percent)
    tok = train_tokenizer(_tokenizer_texts(corpus, r.tokenizer_train_bytes), r.vocab_size)
    eos_id, mask_id = special_ids(tok)
    stream = encode_stream(tok, [f.text for f in corpus.train]).to(dev)
    held = encode_stream(tok, [f.text for f in corpus.heldout])
    dstream = encode_stream(tok, [f.text for f in corpus.drafter]).to(dev) if corpus.drafter else stream
    target = make_target(r, eos_id, seed)
    train_target(target, stream, r, dev, seed, heldout=held)
    loss = eval_loss(target, held, r.seq_len)
    target.to(torch.bfloat16)
    target.save_pretrained(str(d / "target"))
    save_tokenizer(tok, d / "target", r.max_position_embeddings)
    if dev.type == "cpu":
        target.float()
    t_target = time.perf_counter() - t0
    gen = torch.Generator(device=dev).manual_seed(seed + 2)
    greedy = make_greedy_pool(target, dstream, r, gen)
    hgen = torch.Generator(device=dev).manual_seed(seed + 5)
    hprompts = random_windows(held.to(dev), HELD_POOL, r.greedy_prompt_len, hgen)
    held_pool = greedy_extend(target, hprompts, r.greedy_new_tokens, r.greedy_batch)
    torch.save({"pool": greedy.int().cpu(), "held_pool": held_pool.int().cpu(), "mask_id": mask_id}, d / "pool.pt")
    prompts = heldout_prompts(corpus.heldout, lambda s: len(tok.encode(s).ids), n=r.eval_prompts)
    (d / "prompts.jsonl").write_text("".join(json.dumps(p) + "\n" for p in prompts))
    info = {
        "target_heldout_loss": round(loss, 4),
        "target_seconds": round(t_target, 1),
        "pool_seconds": round(time.perf_counter() - t0 - t_target, 1),
        "pool": list(greedy.shape),
    }
    (d / "prepare.json").write_text(json.dumps(info, indent=1))
    _say(f"prepared {info}")


@torch.no_grad()
def heldout_tf_acc(drafter, target, held: torch.Tensor, r, batches: int = 4) -> list[float]:
    """Teacher-forced accuracy per block row on greedy continuations of held-out text."""
    gen = torch.Generator(device=held.device).manual_seed(7)
    lo = torch.full((r.drafter_batch,), r.greedy_prompt_len, device=held.device)
    accs = []
    for chunk in held.split(r.drafter_batch)[:batches]:
        _, acc = drafter_loss(drafter, target, chunk, lo[: chunk.shape[0]], r.anchors_per_seq, r.loss_gamma, gen)
        accs.append(acc)
    return [round(float(a), 4) for a in torch.stack(accs).mean(0)]


def variant(d: Path, recipe: str, name: str, sets: list[str], out: Path, seed: int, dev: torch.device) -> None:
    r = get_recipe(recipe).with_overrides(sets)
    torch.backends.cuda.matmul.allow_tf32 = True
    data = torch.load(d / "pool.pt")
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    target = Qwen3ForCausalLM.from_pretrained(str(d / "target"), dtype=dtype).to(dev).eval()
    pool = data["pool"][: r.greedy_sequences].long().to(dev)
    feats = target_features(target, pool, tuple(r.target_layer_ids), 2048) if r.precompute_features else None
    t0 = time.perf_counter()
    drafter = make_drafter(r, data["mask_id"], target, seed + 1)
    stats = train_drafter(
        drafter, target, DrafterData(pool, r.greedy_prompt_len, pool, r, features=feats), r, dev, seed + 3
    )
    train_s = time.perf_counter() - t0
    del feats
    held_acc = heldout_tf_acc(drafter, target, data["held_pool"].long().to(dev), r)
    ddir = d / f"drafter-{name}"
    drafter.to(torch.bfloat16).save_pretrained(ddir)
    torch.backends.cuda.matmul.allow_tf32 = False
    prompts = [json.loads(line)["text"] for line in (d / "prompts.jsonl").read_text().splitlines()]
    result = {
        "name": name,
        "sets": sets,
        "train_seconds": round(train_s, 1),
        "tf_acc_train_last_batch": stats["teacher_forced_acc_last_batch"],
        "tf_acc_heldout": held_acc,
        "loss_curve": stats["loss_curve"],
    }
    for new in (64, 128):
        acc = measure_acceptance(d / "target", ddir, prompts, new, device=dev)
        result[f"eval{new}"] = acc.to_dict()
        _say(
            f"{name} @{new}: tau {acc.tau:.3f} n-gram {acc.ngram_tau:.3f} "
            f"by position {[round(a, 2) for a in acc.acceptance_by_position[:8]]}"
        )
    _say(f"{name}: train {train_s:.0f}s, tf acc held-out {held_acc[:6]} train {result['tf_acc_train_last_batch'][:6]}")
    out.mkdir(parents=True, exist_ok=True)
    (out / f"ablation-{name}.json").write_text(json.dumps(result, indent=1) + "\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("prepare")
    a.add_argument("--dir", type=Path, required=True)
    a.add_argument("--pool", type=int, default=98304)
    b = sub.add_parser("variant")
    b.add_argument("--dir", type=Path, required=True)
    b.add_argument("--name", required=True)
    b.add_argument("--out", type=Path, required=True)
    b.add_argument("--set", action="append", default=[])
    for q in (a, b):
        q.add_argument("--seed", type=int, default=0)
        q.add_argument("--recipe", default="small")
        q.add_argument("--device", default="cuda")
    args = p.parse_args()
    if args.cmd == "prepare":
        args.dir.mkdir(parents=True, exist_ok=True)
        prepare(args.dir, args.recipe, args.pool, args.seed, torch.device(args.device))
    else:
        variant(args.dir, args.recipe, args.name, args.set, args.out, args.seed, torch.device(args.device))


if __name__ == "__main__":
    main()
