"""The token ids behind a streamed text: the server streams text, the lossless check compares ids.

Found along the target: plain greedy's ids as long as they still spell the text; where the text goes
another way, the most likely of the target's top CANDIDATES tokens that spells it, then plain greedy
again from there (a lossless engine follows the target from any prefix). The ids must spell exactly the
text in exactly `count` tokens, else LosslessError: the server streamed something the target cannot
have chosen. The lossless check then judges every id (gates/lossless.py), a near-tie included.
"""

from __future__ import annotations

from collections.abc import Sequence

from gates.lossless import fail, greedy

CANDIDATES = 8


def served_tokens(plain, prompt: Sequence[int], text: str, count: int, want: Sequence[int]) -> list[int]:
    """The `count` ids after `prompt` whose decoded text is `text`; `want`: plain greedy's ids."""
    prompt = list(prompt)

    def spells(ids: list[int]) -> bool:
        """Whether ids decode to a prefix of text (a trailing partial character may still complete)."""
        return text.startswith(plain.tokenizer.decode(ids, skip_special_tokens=True).rstrip("\ufffd"))

    ids: list[int] = []
    along = list(want)  # the target's greedy ids from the prompt, through ids
    while len(ids) < count:
        nxt = along[len(ids)] if len(ids) < len(along) else None
        if nxt is not None and spells([*ids, nxt]):
            ids.append(nxt)
            continue
        logits = plain.last_logits(prompt + ids)
        ranked = [int(t) for t in logits.topk(CANDIDATES).indices if int(t) != nxt]
        token = next((t for t in ranked if spells([*ids, t])), None)
        if token is None:
            fail(
                f"no token among the target's top {CANDIDATES} after {len(ids)} served tokens spells the streamed text"
            )
        ids.append(token)
        if len(ids) < count:
            (more,) = plain.generate([prompt + ids], greedy(count - len(ids)))
            along = ids + more.token_ids
    if plain.tokenizer.decode(ids, skip_special_tokens=True) != text:
        fail(f"the streamed text is not what {count} tokens along the target spell")
    return ids
