"""The HTTP/1.1 protocol of `wmark serve`: uvicorn's httptools protocol, with malformed requests
answered in the service's JSON error shape.

uvicorn answers requests that its parser rejects (a NUL in a header, a bad Content-Length) itself,
before the app sees them, with a plain-text 400. Clients of this API parse `{"code", "message"}`
on every error, so this protocol writes that instead. httptools (llhttp, in C) rather than h11
(pure Python): the h11 parser cost ~0.3 ms of CPU per detection request, a tenth of the
service's overhead over the detection itself.
"""

from __future__ import annotations

import json

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

__all__ = ["JsonErrorHttpToolsProtocol"]


class JsonErrorHttpToolsProtocol(HttpToolsProtocol):
    """`HttpToolsProtocol` whose protocol-level 400 is `{"code": "bad_request", "message": ...}`."""

    def send_400_response(self, msg: str) -> None:
        body = json.dumps({"code": "bad_request", "message": f"malformed HTTP request: {msg}"}).encode()
        self.transport.write(
            b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\n"
            + b"content-length: "
            + str(len(body)).encode("ascii")
            + b"\r\nconnection: close\r\n\r\n"
            + body
        )
        self.transport.close()
