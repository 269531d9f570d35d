"""Receipts' format (wmark.receipts, wmark.jwk): canonical JSON, RFC vectors, every tampering fails."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from wmark.errors import InputError
from wmark.jwk import b64url, b64url_decode, public_jwk, read_jwks, thumbprint
from wmark.receipts import ReceiptSigner, canonical_json, real, text_sha256, verify_receipt

TEXT = "Receipts carry the SHA-256 of the text — never the text. ünïcödé 🙂\n"
CLAIMS = {
    "input": {"kind": "text", "sha256": text_sha256(TEXT)},
    "key": {"id": "wk_000000000001", "fingerprint": "0123456789abcdef", "spec_sha256": "ab" * 32},
    "detection": {"method": "detect", "verdict": "watermarked", "log_p": real(-57.394213488760534)},
}


def _signer(seed: int = 7) -> ReceiptSigner:
    return ReceiptSigner(Ed25519PrivateKey.from_private_bytes(bytes([seed]) * 32), "wmark@test")


def _jwks(signer: ReceiptSigner, **extra: str) -> dict:
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    raw = signer._key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return {"keys": [{**public_jwk(raw), **extra}]}


def _receipt() -> tuple[str, dict]:
    signer = _signer()
    receipt = signer.sign(CLAIMS, audit_seq=41, issued_at=datetime(2026, 12, 1, 9, 30, tzinfo=UTC))
    return receipt, read_jwks(_jwks(signer))


def test_rfc8037_vectors_thumbprint_and_signature():
    """RFC 8037 appendix A: the thumbprint (A.3) and the EdDSA signature (A.4) of its key."""
    x = "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"
    assert thumbprint(x) == "kPrK_qmxVWaYVA9wwBF6Iuo3vVzz7TxHCTwXBygrS4k"
    key = Ed25519PrivateKey.from_private_bytes(b64url_decode("nWGxne_9WmC6hEr0kuwsxERJxWl7MmkZcDusAxyuf2A"))
    assert public_jwk(b64url_decode(x))["kid"] == thumbprint(x)
    signature = key.sign(b"eyJhbGciOiJFZERTQSJ9.RXhhbXBsZSBvZiBFZDI1NTE5IHNpZ25pbmc")
    assert b64url(signature) == (
        "hgyY0il_MGCjP0JzlnLWG1PPOt7-09PGcvMg3AIbQR6dWbhijcNR4ki4iylGjg5BhVsPt9g7sVvpAr_MuM0KAg"
    )


def test_canonical_json_is_sorted_compact_utf8_and_has_no_floats():
    assert (
        canonical_json({"b": [1, "é\n"], "a": None, "c": True})
        == '{"a":null,"b":[1,"é\\n"],"c":true}'.encode()
    )
    for bad in ({"x": 0.5}, {"x": 2**53}, {1: "a"}, {"é": 1}, {"x": b"bytes"}):
        with pytest.raises(TypeError):
            canonical_json(bad)
    assert (
        real(0.1) == "0.1"
        and real(float("-inf")) == "-inf"
        and float(real(-57.394213488760534)) == -57.394213488760534
    )


def test_b64url_decode_accepts_only_the_canonical_encoding():
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    data = bytes(range(250, 256)) * 10 + b"\xff\xfe\xfd\xfb"  # 64 bytes, with "-" and "_" in them
    encoded = b64url(data)  # 86 characters: the last carries 2 bits and 4 unused (zero) ones
    assert b64url_decode(encoded) == data and "_" in encoded
    same_bits = encoded[:-1] + alphabet[alphabet.index(encoded[-1]) + 1]  # an unused bit set
    assert base64.urlsafe_b64decode(same_bits + "==") == data  # a lenient decoder reads the same bytes
    for variant in (encoded + "==", same_bits, encoded.replace("_", "/"), encoded + "!"):
        with pytest.raises(ValueError):
            b64url_decode(variant)


def test_receipt_verifies_and_matches_its_text():
    receipt, keys = _receipt()
    report = verify_receipt(receipt, keys, text=TEXT.encode())
    assert report.ok, report.reason
    assert report.payload["audit_seq"] == 41 and report.payload["issued_at"] == "2026-12-01T09:30:00Z"
    assert verify_receipt(receipt + "\n", keys).ok  # as a file holds it
    assert not verify_receipt(receipt + "\n\n", keys).ok


def test_every_byte_flip_of_the_receipt_fails():
    """The receipt as a file holds it (with its line break): each byte XOR a seeded non-zero
    mask, and every mask at the line break and at a seeded sample of positions (a break turned
    into a space or a tab is the same JSON to a parser): never valid."""
    receipt, keys = _receipt()
    data = (receipt + "\n").encode()
    rng = np.random.default_rng(20261201)
    flips = [(i, int(mask)) for i, mask in enumerate(rng.integers(1, 256, size=len(data)))]
    for i in [len(data) - 1, *rng.choice(len(data) - 1, size=16, replace=False).tolist()]:
        flips += [(i, mask) for mask in range(1, 256)]
    for i, mask in flips:
        flipped = bytearray(data)
        flipped[i] ^= mask
        assert not verify_receipt(bytes(flipped), keys).ok, (i, mask, bytes(flipped[max(0, i - 20) : i + 20]))


def test_every_byte_flip_of_the_text_fails():
    receipt, keys = _receipt()
    text = TEXT.encode()
    for i in range(len(text)):
        for mask in (0x01, 0x80):
            flipped = bytearray(text)
            flipped[i] ^= mask
            report = verify_receipt(receipt, keys, text=bytes(flipped))
            assert not report.ok and "does not match" in report.reason


def _leaves(value, path=()):
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _leaves(v, (*path, k))
    else:
        yield path, value


def test_every_field_changed_and_reserialised_canonically_fails_the_signature():
    """A forger who edits a field and writes canonical JSON again still needs the private key."""
    receipt, keys = _receipt()
    envelope = json.loads(receipt)
    for path, value in _leaves(envelope["payload"]):
        edited = json.loads(receipt)
        target = edited["payload"]
        for k in path[:-1]:
            target = target[k]
        target[path[-1]] = value + 1 if isinstance(value, int) else f"{value}x"
        report = verify_receipt(canonical_json(edited), keys)
        assert not report.ok, path
        if path not in {("kid",), ("type",), ("v",)}:  # those are refused before the signature
            assert report.reason.startswith("the signature does not match"), (path, report.reason)


def test_unknown_and_revoked_keys_are_named():
    receipt, _ = _receipt()
    other = read_jwks(_jwks(_signer(seed=8)))
    assert "unknown key" in verify_receipt(receipt, other).reason
    revoked = read_jwks(_jwks(_signer(), status="revoked", revoked_at="2026-12-02T00:00:00Z"))
    report = verify_receipt(receipt, revoked)
    assert not report.ok and report.key_status == "revoked"
    assert report.reason.startswith("signed by a revoked key") and "2026-12-02T00:00:00Z" in report.reason
    retired = read_jwks(_jwks(_signer(), status="retired"))
    assert verify_receipt(receipt, retired).ok


@pytest.mark.parametrize(
    "jwks,message",
    [
        (b"not json", "not JSON"),
        (b'{"keys": 1}', "not a JWKS"),
        (b'{"keys": [{"kty": "OKP", "crv": "Ed25519", "x": "AA", "kid": "a"}]}', "not 32 bytes"),
    ],
)
def test_malformed_key_sets_are_input_errors(jwks, message):
    with pytest.raises(InputError, match=message):
        read_jwks(jwks)


def test_a_key_set_cannot_name_a_key_falsely():
    jwks = _jwks(_signer())
    jwks["keys"][0]["kid"] = thumbprint(b64url(b"\x01" * 32))
    with pytest.raises(InputError, match="thumbprint"):
        read_jwks(jwks)
    other_types = {"keys": [{"kty": "RSA", "kid": "r", "n": "x", "e": "AQAB"}, *jwks["keys"][:0]]}
    assert read_jwks(other_types) == {}
