"""Detection: tokenise, find scored positions, replay the keyed clocks, exact p-value, verdict.

Pure numpy after tokenisation: no model weights. Several keys are tested at once with Holm's
correction, so a text is flagged only if the family-wise error over all keys stays at alpha.
A key of one of vLLM's native schemes is tested the same way (`KeyScorer`), with vLLM's PRF,
contexts and score (`wmark.vllm_gumbel`).
A text is read as `wmark.detector.readings` decides from the text alone: canonically only when
it carries marks of an edit (invisible characters, look-alike letters, ...), unwrapped and
recased where it was re-wrapped or recased, so those edits cost the watermark nothing and the
p-value stays exact. Where the text cannot tell (doubled spaces), it is read both as submitted
and canonically, and each key's p-value is the smaller times 2 (Bonferroni).

`Detector` runs the steps; the inputs are checked in `wmark.detector.checks`, tokenised per
reading in `wmark.detector.encoding` and tested per key in `wmark.detector.keytest`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import numpy.typing as npt

from wmark.detector.checks import check_alpha, check_text, check_token_ids, check_vocabulary
from wmark.detector.encoding import Encoding, Encodings, distinct, reading_ids
from wmark.detector.keytest import KeyPivots, KeyScore, KeyScorer, choose_verdict
from wmark.detector.normalize import NormalizedText
from wmark.detector.readings import text_variants
from wmark.detector.result import Detection, KeyResult, TokenEvidence
from wmark.detector.tokenize import TextTokenizer
from wmark.errors import InputError, TokenizerError
from wmark.keymaterial import KeyMaterial
from wmark.scoring import ScoreResult

__all__ = ["Detector", "TokenizerLookup", "detect"]

TokenizerLookup = Callable[[str], bytes]


class Detector:
    """Detects texts or token IDs against a fixed set of keys.

    Build it once (tokenizers are parsed and HMAC keys prepared here), then call `detect` for
    each text. Keys with different tokenizers may be mixed: each text is tokenised once per
    distinct tokenizer. `encode` and `score_keys` are the two steps of `detect`, shared with the
    window search (`Localizer`) so both read the same tokens and pivots.

    Args:
        keys: the keys to test (active and retired ones; revoked keys must not be passed).
        tokenizers: tokenizer.json bytes by SHA-256, as a mapping or a lookup function. Only
            needed for text input.
        threads: threads for pivots of long texts.
        normalize: also test the canonical readings of a text (`wmark.detector.normalize`);
            False tests the text exactly as submitted.
    """

    def __init__(
        self,
        keys: Sequence[KeyMaterial],
        tokenizers: Mapping[str, bytes] | TokenizerLookup | None = None,
        *,
        threads: int = 1,
        normalize: bool = True,
    ) -> None:
        if not keys:
            raise InputError("no keys to detect with: create one with `wmark keys create NAME`")
        self.keys = list(keys)
        self.scorers = {k.key_id: KeyScorer(k) for k in self.keys}
        self._shas = sorted({k.spec.tokenizer.sha256 for k in self.keys})
        self._lookup = tokenizers
        self._tokenizers: dict[str, TextTokenizer] = {}
        self.threads = threads
        self.normalize = normalize

    def tokenizer(self, sha256: str) -> TextTokenizer:
        """The tokenizer with this SHA-256 (loaded once)."""
        if sha256 not in self._tokenizers:
            lookup = self._lookup
            try:
                if lookup is None:
                    raise KeyError(sha256)
                data = lookup[sha256] if isinstance(lookup, Mapping) else lookup(sha256)
            except KeyError as exc:
                raise TokenizerError(f"tokenizer {sha256[:12]} is not in the registry") from exc
            names = {k.spec.tokenizer.name for k in self.keys if k.spec.tokenizer.sha256 == sha256}
            tok = TextTokenizer(data, next(iter(names), "tokenizer"))
            if tok.sha256 != sha256:
                raise TokenizerError(f"tokenizer content does not match its hash {sha256[:12]}")
            self._tokenizers[sha256] = tok
        return self._tokenizers[sha256]

    def encode(
        self,
        text: str | None = None,
        *,
        token_ids: Sequence[int] | npt.NDArray[np.integer] | None = None,
        with_offsets: bool = False,
        readings: bool = True,
    ) -> Encodings:
        """Check one input (exactly one of text and token_ids) and tokenise it for every key.

        With `readings` (and the detector's `normalize`), a text's canonical readings are
        tokenised too; pass False when positions must match the submitted text's tokens (a
        prompt in front, `start` > 0).

        Raises:
            InsufficientTextError: empty text or token list.
            InputError: bad token IDs, or both/neither of text and token_ids.
            TokenizerError: a key's tokenizer is missing.
        """
        if (text is None) == (token_ids is None):
            raise InputError("give exactly one of text and token_ids")
        if text is None:
            return Encodings(ids=Encoding(check_token_ids(token_ids)))
        check_text(text)
        normalizing = self.normalize and readings
        by_sha = {}
        for sha in self._shas:
            tok = self.tokenizer(sha)
            encodings: list[Encoding] = []
            if with_offsets:
                variants = text_variants(text, tok.case_forms) if normalizing else None
                for variant in variants or [NormalizedText.identity(text)]:
                    ids, offsets = tok.encode_with_offsets(variant.text)
                    encodings.append(Encoding(ids, variant.map_offsets(offsets)))
            elif normalizing:
                encodings = [Encoding(ids) for ids in reading_ids(tok, [text], [tok.encode(text)])[0]]
            else:
                encodings = [Encoding(tok.encode(text))]
            by_sha[sha] = distinct(encodings)
        return Encodings(by_sha)

    def encode_many(self, texts: Sequence[str]) -> list[Encodings]:
        """Tokenise many texts (and their canonical readings) in one parallel batch per tokenizer.

        No checks: see `check_text`.
        """
        by_sha = {}
        for sha in self._shas:
            tok = self.tokenizer(sha)
            ids = tok.encode_batch(texts)
            by_sha[sha] = reading_ids(tok, texts, ids) if self.normalize else [[x] for x in ids]
        return [
            Encodings({sha: distinct([Encoding(x) for x in by_sha[sha][i]]) for sha in self._shas})
            for i in range(len(texts))
        ]

    def score_keys(self, encodings: Encodings, *, start: int = 0) -> list[KeyScore]:
        """Every key's scored positions, pivots and exact test on one input.

        Raises:
            InsufficientTextError: no tokens.
            TokenizerError: token IDs outside a key's vocabulary.
        """
        out = []
        for key in self.keys:
            readings = encodings.readings(key)
            scorer = self.scorers[key.key_id]
            for encoding in readings:
                check_vocabulary(encoding.ids, key)
            found = scorer.pivots_many([e.ids for e in readings], start=start, threads=self.threads)
            tried = [
                KeyScore(key, kp, scorer.test(kp), encoding, index, len(readings))
                for index, (encoding, kp) in enumerate(zip(readings, found, strict=True))
            ]
            best = min(tried, key=lambda s: s.test.log_p)  # the submitted text wins ties
            if best.n_readings > 1:  # Bonferroni over the readings
                log_p = min(0.0, best.test.log_p + math.log(best.n_readings))
                test = ScoreResult(best.test.score, log_p, best.test.n)
                best = KeyScore(key, best.pivots, test, best.encoding, best.reading, best.n_readings)
            out.append(best)
        return out

    def detect(
        self,
        text: str | None = None,
        *,
        token_ids: Sequence[int] | npt.NDArray[np.integer] | None = None,
        alpha: float = 0.01,
        start: int = 0,
        return_tokens: bool = False,
        source: str | None = None,
    ) -> Detection:
        """Detect one text (or token-ID sequence).

        Args:
            text: the text; tokenised with each key's tokenizer.
            token_ids: token IDs instead of text (all keys read them as their tokenizer's IDs).
            alpha: significance level for the verdict, family-wise over the keys.
            start: first position that may be scored (give the prompt length when the prompt
                is included, so positions whose window reaches into it are scored too).
            return_tokens: include per-token evidence for highlighting.
            source: label carried into the result (file name, document id).

        Raises:
            InsufficientTextError: empty text or token list.
            InputError: bad alpha, bad token IDs, or both/neither of text and token_ids.
            TokenizerError: a key's tokenizer is missing, or token IDs exceed its vocabulary.
        """
        check_alpha(alpha)
        encodings = self.encode(text, token_ids=token_ids, with_offsets=return_tokens, readings=start == 0)
        return self._detection(
            encodings, alpha=alpha, start=start, return_tokens=return_tokens, source=source
        )

    def detect_many(
        self, texts: Sequence[str], *, alpha: float = 0.01, sources: Sequence[str | None] | None = None
    ) -> list[Detection]:
        """Detect many texts, tokenising them in one parallel batch per tokenizer.

        An empty text raises `InsufficientTextError` and one that is not valid Unicode `InputError`;
        callers that must not stop check each text first (`check_text`).
        """
        check_alpha(alpha)
        for text in texts:
            check_text(text)
        labels = list(sources) if sources is not None else [None] * len(texts)
        return [
            self._detection(enc, alpha=alpha, source=label)
            for enc, label in zip(self.encode_many(texts), labels, strict=True)
        ]

    def _detection(
        self,
        encodings: Encodings,
        *,
        alpha: float,
        start: int = 0,
        return_tokens: bool = False,
        source: str | None = None,
    ) -> Detection:
        scored = self.score_keys(encodings, start=start)
        verdict, best, adjusted = choose_verdict(
            [s.test.log_p for s in scored], [s.enough for s in scored], alpha
        )
        results = tuple(
            KeyResult(
                key_id=s.key.key_id,
                n_scored=s.test.n,
                score=s.test.score,
                log_p=s.test.log_p,
                adjusted_log_p=adj,
            )
            for s, adj in zip(scored, adjusted, strict=True)
        )
        chosen = scored[best]
        return Detection(
            verdict=verdict,
            p_value=math.exp(adjusted[best]),
            log_p=adjusted[best],
            score=chosen.test.score,
            n_scored=chosen.test.n,
            n_tokens=len(chosen.encoding.ids),
            key_id=chosen.key.key_id,
            spec_version=chosen.key.spec.spec_version,
            alpha=alpha,
            keys=results,
            tokens=_token_evidence(chosen.encoding, chosen.pivots) if return_tokens else None,
            source=source,
            reading=chosen.reading,
            n_readings=chosen.n_readings,
        )


def _token_evidence(enc: Encoding, kp: KeyPivots) -> tuple[TokenEvidence, ...]:
    pairs = zip(kp.pivots.tolist(), kp.scores.tolist(), strict=True)
    evidence_at = dict(zip(kp.positions.tolist(), pairs, strict=True))
    out = []
    for t, token_id in enumerate(enc.ids.tolist()):
        u, s = evidence_at.get(t, (None, None))
        span = enc.offsets[t] if enc.offsets is not None else (None, None)
        out.append(TokenEvidence(token_id=token_id, start=span[0], end=span[1], pivot=u, score=s))
    return tuple(out)


def detect(
    text: str | None = None,
    *,
    keys: Sequence[KeyMaterial],
    tokenizers: Mapping[str, bytes] | TokenizerLookup | None = None,
    token_ids: Sequence[int] | npt.NDArray[np.integer] | None = None,
    alpha: float = 0.01,
    start: int = 0,
    return_tokens: bool = False,
) -> Detection:
    """One-shot detection; build a `Detector` instead when detecting many texts."""
    return Detector(keys, tokenizers).detect(
        text, token_ids=token_ids, alpha=alpha, start=start, return_tokens=return_tokens
    )
