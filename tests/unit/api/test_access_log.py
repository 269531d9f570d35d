"""What the access log keeps of a request line: never a credential."""

from __future__ import annotations

import logging

import pytest

from wmark.api.access_log import RedactCredentials, redact

TOKEN = "wmt_0123456789ab_" + "A" * 43


@pytest.mark.parametrize(
    ("logged", "expected"),
    [
        ("/v1/detect", "/v1/detect"),
        ("/v1/audit?limit=5&action=detect", "/v1/audit?limit=5&action=detect"),
        (f"/v1/audit?token={TOKEN}&limit=5", "/v1/audit?token=***&limit=5"),
        ("/v1/audit?access_token=opaque-secret", "/v1/audit?access_token=***"),
        (f"/v1/audit?limit={TOKEN}", "/v1/audit?limit=***"),  # a known name, a token value
        (f"/v1/audit?{TOKEN}", "/v1/audit?***=***"),
        (f"/v1/keys/{TOKEN}", "/v1/keys/wmt_***"),
        ("/v1/audit?%00=%ff", "/v1/audit?***=***"),
    ],
)
def test_credentials_are_masked(logged, expected):
    assert redact(logged) == expected
    assert "AAAA" not in redact(logged)


def test_the_filter_rewrites_uvicorn_access_records():
    record = logging.LogRecord(
        "uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s HTTP/%s" %d', None, None
    )
    record.args = ("127.0.0.1:5", "GET", f"/v1/audit?token={TOKEN}", "1.1", 401)
    assert RedactCredentials().filter(record)
    assert TOKEN not in record.getMessage() and "token=***" in record.getMessage()
