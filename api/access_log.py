"""Keeps credentials out of uvicorn's access log.

uvicorn logs each request line with its query string verbatim, so a token a client put in the URL
(`?token=wmt_...`, `?access_token=...`) would be written to every log it reaches. This filter
rewrites the logged path: values of query parameters other than the API's own (limit, before,
action, status) are replaced by `***`, and anything shaped like an API token, anywhere in the path
or the query, is masked too.
"""

from __future__ import annotations

import logging
import re
from urllib.parse import parse_qsl, quote

__all__ = ["RedactCredentials", "install", "redact"]

_KEPT = frozenset({"limit", "before", "action", "status"})  # the API's query parameters: no secrets
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_TOKEN_LIKE = re.compile(r"wmt_[0-9A-Za-z_-]*", re.IGNORECASE)
_MASK = "***"


def redact(path_with_query: str) -> str:
    """The path and query as logged: unknown parameter values and token-like strings masked."""
    path, sep, query = path_with_query.partition("?")
    path = _TOKEN_LIKE.sub("wmt_" + _MASK, path)
    if not sep:
        return path
    parts = []
    for name, value in parse_qsl(query, keep_blank_values=True):
        shown_name = name if _NAME.match(name) and not _TOKEN_LIKE.search(name) else _MASK
        shown_value = value if name in _KEPT and not _TOKEN_LIKE.search(value) else _MASK
        parts.append(f"{shown_name}={quote(shown_value, safe='*')}")
    return f"{path}?{'&'.join(parts) or _MASK}"


class RedactCredentials(logging.Filter):
    """Rewrites the path argument of uvicorn's access-log records (client, method, path, version, status)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str):
            record.args = (*args[:2], redact(args[2]), *args[3:])
        return True


def install() -> None:
    """Add the filter to uvicorn's access logger (once per process)."""
    logger = logging.getLogger("uvicorn.access")
    if not any(isinstance(f, RedactCredentials) for f in logger.filters):
        logger.addFilter(RedactCredentials())
