"""docs/receipts.md stays true: its worked example verifies, with wmark and with the page's own
verifier (written from the page alone), and a changed byte fails both."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from cryptography.exceptions import InvalidSignature

from wmark.jwk import read_jwks
from wmark.receipts import verify_receipt

DOC = Path(__file__).resolve().parents[3] / "docs" / "receipts.md"


def _example(name: str) -> str:
    found = re.search(rf"<!-- example:{name} -->\n```[a-z]*\n(.*?)```", DOC.read_text(), re.S)
    assert found, name
    return found.group(1)


def _page_verifier():
    namespace: dict = {}
    exec(_example("verifier"), namespace)  # the page's code, as a reader would run it
    return namespace["verify"]


def test_the_worked_example_verifies_with_wmark_and_with_the_pages_verifier():
    receipt, jwks, text = _example("receipt").encode(), _example("jwks"), _example("text").encode()
    report = verify_receipt(receipt, read_jwks(jwks), text=text)
    assert report.ok, report.reason
    assert _page_verifier()(receipt, json.loads(jwks), text) == report.payload


def test_a_changed_byte_fails_both_verifiers():
    receipt, jwks, text = _example("receipt").encode(), _example("jwks"), _example("text").encode()
    changed = receipt.replace(b'"n_scored":64', b'"n_scored":65')
    assert not verify_receipt(changed, read_jwks(jwks), text=text).ok
    with pytest.raises(InvalidSignature):
        _page_verifier()(changed, json.loads(jwks), text)
    spaced = receipt.replace(b'"v":1', b'"v": 1')
    assert not verify_receipt(spaced, read_jwks(jwks), text=text).ok
    with pytest.raises(AssertionError):
        _page_verifier()(spaced, json.loads(jwks), text)
