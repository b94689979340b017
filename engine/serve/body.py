"""The request body: bytes -> one JSON object, or a BadRequest saying why not (never a 500):
UTF-8 checked with the offset of the first bad byte, nesting bounded before the parser recurses,
NaN / Infinity refused (not JSON)."""

from __future__ import annotations

import json
import re

from engine.serve.errors import BadRequest

MAX_DEPTH = 32  # the deepest body the API needs is 3 (a chat message's content parts)
_STRUCTURE = re.compile(r'[\[\]{}"\\]')


def json_depth(text: str, limit: int) -> int:
    """How deep `text` nests arrays and objects (brackets inside strings not counted), counted up to
    limit + 1; linear in the number of brackets, quotes and backslashes."""
    depth = deepest = 0
    in_string, escaped_at = False, -1
    for m in _STRUCTURE.finditer(text):
        at, c = m.start(), m.group()
        if at == escaped_at:
            continue
        if in_string:
            if c == "\\":
                escaped_at = at + 1
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c in "[{":
            depth += 1
            deepest = max(deepest, depth)
            if deepest > limit:
                break
        elif c in "]}":
            depth -= 1
    return deepest


def _constant(name: str) -> float:
    raise BadRequest(f"the request body is not valid JSON: {name} is not a JSON number")


def decode_body(raw: bytes) -> dict:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise BadRequest(
            f"the request body is not valid UTF-8: byte 0x{raw[err.start]:02x} at offset {err.start}"
        ) from None
    if json_depth(text, MAX_DEPTH) > MAX_DEPTH:
        raise BadRequest(f"the request body nests arrays or objects deeper than {MAX_DEPTH} levels")
    try:
        body = json.loads(text, parse_constant=_constant)
    except BadRequest:
        raise
    except json.JSONDecodeError as err:
        raise BadRequest(f"the request body is not valid JSON: {err}") from None
    except (ValueError, RecursionError) as err:  # e.g. an integer of more digits than int() takes
        raise BadRequest(f"the request body is not valid JSON: {str(err)[:200]}") from None
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    return body
