"""vLLM's native watermark: wmark's port against vectors made by vLLM's own code.

tests/vectors/vllm_gumbel.json was made once by tests/vectors/generate_vllm_gumbel.py with
vLLM 0.32.0's vllm.v1.watermarking; nothing here needs vLLM installed.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import integrate, special

from wmark import KeyMaterial, PrfRef, Secret, SpecError, TokenizerRef, WatermarkSpec
from wmark.detector import Detector
from wmark.detector.localize import Localizer
from wmark.prf import KeyedSource
from wmark.scoring import log_gamma_sf, log_gamma_tail
from wmark.vllm_gumbel import (
    VllmGumbelKey,
    VllmWatermarkConfig,
    derive_watermark_key,
    vllm_uniforms,
    vllm_uniforms_reference,
)

VECTORS = json.loads((Path(__file__).parents[2] / "vectors" / "vllm_gumbel.json").read_text())
TOKENIZER = TokenizerRef(name="t", sha256="ab" * 32, vocab_size=2**32 - 1)
DETECTIONS = VECTORS["detections"]


def _key(case: dict, **spec_fields: object) -> KeyMaterial:
    alpha = case["alpha"]
    config = VllmWatermarkConfig(
        key=int(case["key"]),
        algorithm="gumbel" if alpha is None else "dual_key_gumbel",
        alpha=0.1 if alpha is None else alpha,
        context_width=case["context_width"],
    )
    spec = config.spec(TOKENIZER, **spec_fields)  # type: ignore[arg-type]
    return KeyMaterial(key_id="wk_" + case["name"], secret=config.secret(), spec=spec)


def _rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-300)


def test_vectors_come_from_vllm():
    assert VECTORS["vllm_version"].startswith("0.32.0")
    assert len(DETECTIONS) >= 50


@pytest.mark.parametrize("case", range(len(VECTORS["uniforms"])))
def test_uniforms_equal_vllms_philox_prf(case):
    vec = VECTORS["uniforms"][case]
    contexts = np.array(vec["contexts"], dtype=np.int64).astype(np.uint32)  # -1 -> 0xFFFFFFFF as vLLM masks
    for impl in (vllm_uniforms, vllm_uniforms_reference):  # the C path and the numpy definition
        for j, token in enumerate(vec["tokens"]):
            tokens = np.full(len(contexts), token, dtype=np.uint32)
            got = impl(int(vec["key"]), contexts, tokens)
            assert got.tolist() == [row[j] for row in vec["uniforms"]]


def test_derived_keys_equal_vllms():
    for vec in VECTORS["derived_keys"]:
        assert derive_watermark_key(int(vec["key"]), vec["domain"].encode()) == int(vec["derived"])


def test_c_path_equals_reference_on_many_random_rows():
    rng = np.random.default_rng(7)
    for width in (1, 4, 6, 17):
        contexts = rng.integers(0, 2**32, size=(2000, width), dtype=np.uint64).astype(np.uint32)
        tokens = rng.integers(0, 2**32, size=2000, dtype=np.uint64).astype(np.uint32)
        key = int(rng.integers(0, 2**63)) * 2 + 1
        assert np.array_equal(
            vllm_uniforms(key, contexts, tokens), vllm_uniforms_reference(key, contexts, tokens)
        )


@pytest.mark.parametrize(
    "case", range(len(DETECTIONS)), ids=[f"{c['name']}-a{c['alpha']}" for c in DETECTIONS]
)
def test_detector_equals_vllms_detector(case):
    """Same scored contexts and targets, same token scores, p-value equal to 1e-9 relative.

    Where vLLM's p-value comes from torch.special.gammaincc (dual key, alpha not 0, 0.5 or 1),
    torch's own error reaches ~1.2e-9 relative on these vectors (against mpmath): there wmark
    must equal the exact tail at vLLM's score to 1e-12, and vLLM's value to torch's 1e-8.
    """
    vec = DETECTIONS[case]
    key = _key(vec)
    ids = np.array(vec["token_ids"], dtype=np.uint32)
    scored = VllmGumbelKey(key.secret, key.spec).score(ids)
    h = vec["context_width"]
    padded = [-1] * h + vec["token_ids"]
    assert [padded[t : t + h] for t in scored.positions.tolist()] == vec["scored_contexts"]
    assert ids[scored.positions].tolist() == vec["scored_targets"]
    np.testing.assert_allclose(scored.scores, vec["token_scores"], rtol=1e-12, atol=0)

    detection = Detector([key]).detect(token_ids=ids, return_tokens=True)
    assert detection.n_scored == vec["num_scored_tokens"]
    assert _rel(detection.score, vec["score"]) < 1e-12
    p = math.exp(detection.keys[0].log_p)
    if vec["p_value"] == 0.0:  # vLLM's float underflowed; wmark's log p-value stays finite and below it
        assert math.isfinite(detection.log_p) and detection.log_p < math.log(5e-324)
    elif vec["p_value_exact"] is not None:
        assert _rel(p, vec["p_value_exact"]) < 1e-12
        assert _rel(p, vec["p_value"]) < 1e-8
    else:
        assert _rel(p, vec["p_value"]) < 1e-9
    evidence = [t for t in detection.tokens or () if t.score is not None]
    assert [t.score for t in evidence] == scored.scores.tolist()


def test_vllm_watermarked_sequences_are_detected_and_other_keys_are_not():
    for vec in DETECTIONS:
        if not vec["name"].startswith("vllm-watermarked"):
            continue
        detection = Detector([_key(vec)]).detect(token_ids=vec["token_ids"])
        expected = "not_detected" if vec["name"].endswith("otherkey") else "watermarked"
        assert detection.verdict == expected, vec["name"]


def test_prompt_in_front_is_not_a_context():
    """vLLM's contexts start at the generated text: a prompt given with start= is skipped."""
    vec = next(v for v in DETECTIONS if v["name"] == "vllm-watermarked-w4-n200")
    key = _key(vec)
    prompt = [11, 22, 33, 44, 55]
    alone = Detector([key]).detect(token_ids=vec["token_ids"])
    with_prompt = Detector([key]).detect(token_ids=prompt + vec["token_ids"], start=len(prompt))
    assert (with_prompt.n_scored, with_prompt.score) == (alone.n_scored, alone.score)


def test_vllm_key_sits_with_wmark_keys_under_holm():
    vec = next(v for v in DETECTIONS if v["name"] == "vllm-watermarked-w4-n1500")
    vllm_key = _key(vec)
    wmark_key = KeyMaterial(
        key_id="wk_wmark", secret=Secret(b"k" * 32), spec=WatermarkSpec(tokenizer=TOKENIZER)
    )
    ids = np.array(vec["token_ids"], dtype=np.uint32)
    both = Detector([wmark_key, vllm_key]).detect(token_ids=ids)
    assert both.verdict == "watermarked" and both.key_id == vllm_key.key_id
    alone = Detector([vllm_key]).detect(token_ids=ids)
    assert both.log_p == pytest.approx(min(0.0, alone.log_p + math.log(2)), rel=1e-12)


@pytest.mark.parametrize("name", ["vllm-watermarked-w4-n1500", "vllm-watermarked-w3-n2000"])
def test_localizer_finds_a_vllm_watermarked_passage(name):
    """Gumbel and dual-key (alpha 0.3: the window tails are Gamma(n / v, scale v))."""
    vec = next(v for v in DETECTIONS if v["name"] == name)
    key = _key(vec)
    rng = np.random.default_rng(3)
    human = rng.integers(0, 1000, size=1500).tolist()
    ids = human + vec["token_ids"][:400] + human[:600]
    loc = Localizer(Detector([key])).localize(token_ids=ids)
    assert loc.verdict == "watermarked" and loc.window is not None
    # vLLM's contexts run from the text's start, so the passage's own first contexts differ:
    # the window must overlap the passage, not match it exactly
    assert loc.window.start < 1900 and loc.window.end > 1500
    scorer = Detector([key]).scorers[key.key_id]
    raw = scorer.log_p_many(np.array([loc.window.n_scored]), np.array([loc.window.score]))[0]
    assert raw == pytest.approx(loc.window.log_p_raw, rel=1e-12)
    v = scorer.variance
    assert raw == pytest.approx(
        math.log(special.gammaincc(loc.window.n_scored / v, loc.window.score / v)), rel=1e-9
    )


@pytest.mark.parametrize("alpha", [0.1, 0.3, 0.5, 0.0, 1.0])
def test_dual_key_pivots_are_uniform_under_h0(alpha):
    """The dual-key pivot is the H0 CDF of the weighted score: check it against quadrature."""
    key = KeyMaterial(
        key_id="wk_x",
        secret=VllmWatermarkConfig(key=5, algorithm="dual_key_gumbel", alpha=alpha).secret(),
        spec=VllmWatermarkConfig(key=5, algorithm="dual_key_gumbel", alpha=alpha).spec(TOKENIZER),
    )
    scorer = VllmGumbelKey(key.secret, key.spec)
    for s in (0.05, 0.7, 2.5):
        b = 1.0 - alpha
        if alpha in (0.0, 1.0):
            expected = 1.0 - math.exp(-s)
        else:  # P((1-a) E1 + a E2 <= s) by integrating over E1
            density = lambda e, s=s, b=b: math.exp(-e) * -math.expm1(-(s - b * e) / alpha)  # noqa: E731
            expected = integrate.quad(density, 0, s / b, epsabs=0, epsrel=1e-12)[0]
        assert scorer._weighted_cdf(np.array([s]), alpha)[0] == pytest.approx(expected, rel=1e-9)


def test_log_gamma_tail_matches_gammaincc_and_continues_below_underflow():
    for shape, s in ((3.7, 2.0), (120.5, 140.0), (1000.25, 1100.0)):
        assert log_gamma_tail(shape, s) == pytest.approx(math.log(special.gammaincc(shape, s)), rel=1e-10)
    # far below float underflow: the continued fraction against the integer series at nearby shapes
    low, mid, high = log_gamma_sf(40, 2000.0), log_gamma_tail(40.5, 2000.0), log_gamma_sf(41, 2000.0)
    assert low < mid < high and math.isfinite(mid)
    # ratio Q(a + 1, s) / Q(a, s) -> s / a when s >> a: checks the fraction's absolute level
    assert log_gamma_tail(41.5, 2000.0) - mid == pytest.approx(math.log(2000.0 / 40.5), abs=0.05)


def test_config_is_checked_as_vllm_checks_it():
    with pytest.raises(SpecError, match="0..2"):
        VllmWatermarkConfig(key=2**64)
    with pytest.raises(SpecError, match="algorithm"):
        VllmWatermarkConfig(key=1, algorithm="kgw")
    with pytest.raises(SpecError, match="alpha"):
        VllmWatermarkConfig(key=1, alpha=1.5)
    with pytest.raises(SpecError, match="unknown"):
        VllmWatermarkConfig.from_dict({"key": 1, "seed": 2})
    with pytest.raises(SpecError, match="needs its secret"):
        VllmWatermarkConfig.from_dict({"algorithm": "gumbel"})
    with pytest.raises(SpecError, match="context_width"):
        VllmWatermarkConfig(key=1, context_width=0).spec(TOKENIZER)


def test_secret_never_in_repr_and_spec_round_trips():
    config = VllmWatermarkConfig(key=123456789, algorithm="dual_key_gumbel", alpha=0.25)
    assert "123456789" not in repr(config)
    spec = config.spec(TOKENIZER)
    assert WatermarkSpec.from_json(spec.to_json()) == spec
    assert "123456789" not in spec.to_json()
    key = VllmGumbelKey(config.secret(), spec)
    assert "123456789" not in repr(key)


def test_wmark_specs_keep_their_bytes_and_refuse_vllm_fields():
    spec = WatermarkSpec(tokenizer=TOKENIZER)
    assert "scheme" not in spec.to_json()
    with pytest.raises(SpecError, match="PRF"):
        WatermarkSpec(tokenizer=TOKENIZER, scheme="vllm-gumbel")
    with pytest.raises(SpecError, match="dual_key_alpha"):
        WatermarkSpec(
            tokenizer=TOKENIZER,
            scheme="vllm-gumbel",
            prf=PrfRef(name="vllm-philox4x32-10"),
            dual_key_alpha=0.1,
        )
    vllm_spec = VllmWatermarkConfig(key=1).spec(TOKENIZER)
    with pytest.raises(SpecError, match="vLLM"):
        KeyedSource(VllmWatermarkConfig(key=1).secret(), vllm_spec)
