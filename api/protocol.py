"""The HTTP/1.1 protocol of `wmark serve`: uvicorn's h11 protocol, with malformed requests answered
in the service's JSON error shape.

uvicorn answers requests that h11 cannot parse (a NUL in a header, a bad Content-Length) itself,
before the app sees them, with a plain-text 400. Clients of this API parse `{"code", "message"}`
on every error, so this protocol writes that instead.
"""

from __future__ import annotations

import json

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["JsonErrorH11Protocol"]


class JsonErrorH11Protocol(H11Protocol):
    """`H11Protocol` whose protocol-level 400 is `{"code": "bad_request", "message": ...}`."""

    def send_400_response(self, msg: str) -> None:
        body = json.dumps({"code": "bad_request", "message": f"malformed HTTP request: {msg}"}).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode("ascii")),
            (b"connection", b"close"),
        ]
        for event in (
            h11.Response(status_code=400, headers=headers, reason=b"Bad Request"),
            h11.Data(data=body),
            h11.EndOfMessage(),
        ):
            self.transport.write(self.conn.send(event) or b"")
        self.transport.close()
