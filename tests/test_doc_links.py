"""Every relative link in docs/ and README.md points at a file or folder that exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CODE = re.compile(r"```.*?```|`[^`\n]*`", re.S)


def relative_links(text: str) -> list[str]:
    """Link targets outside code spans and fences, without URLs, mail and in-page anchors."""
    targets = (m.group(1) for m in LINK.finditer(CODE.sub("", text)))
    return [t.split("#", 1)[0] for t in targets if not re.match(r"[a-z]+:|#", t)]


def test_relative_links_finds_only_relative_targets():
    text = "[a](x.md#s) [b](https://h) [c](#top) `[d](no.md)` [e](dir/) [f](mailto:m)"
    assert relative_links(text) == ["x.md", "dir/"]


def test_every_relative_doc_link_resolves():
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    dangling = [
        f"{doc.relative_to(ROOT)}: {target}"
        for doc in docs
        for target in relative_links(doc.read_text())
        if not (doc.parent / target).exists()
    ]
    assert dangling == []
