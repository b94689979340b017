"""The server's refusal of one request: a message, the field it names and the HTTP status."""

from __future__ import annotations


class BadRequest(ValueError):
    """A request the server refuses with HTTP `status` (400 unless said otherwise)."""

    def __init__(self, message: str, param: str | None = None, status: int = 400):
        super().__init__(message)
        self.param = param
        self.status = status
