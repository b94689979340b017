"""python -m engine.bench {sweep,profile,decode,steps,preempt} [options]; each subcommand's --help lists its options."""

from __future__ import annotations

import sys

COMMANDS = {
    "sweep": "engine.bench.sweep",
    "profile": "engine.bench.profile",
    "decode": "engine.bench.decode",
    "steps": "engine.bench.steps",
    "preempt": "engine.bench.preempt",
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        names = ", ".join(COMMANDS)
        print(
            f"usage: python -m engine.bench {{{names}}} [options]\n"
            "  sweep    lever arms interleaved under closed-loop load (paired ratios, noise floor)\n"
            "  profile  verify/draft forward cost vs rows (batch x span)\n"
            "  decode   Qwen3-4B-geometry decode vs the HF peer and the measured roofline\n"
            "  steps    torch.profiler over engine steps: device-busy vs wall, top kernels and host ops\n"
            "  preempt  KV under pressure: preemption by recompute vs whole-budget reservation",
            file=sys.stderr,
        )
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    import importlib

    return importlib.import_module(COMMANDS[argv[0]]).main(argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
