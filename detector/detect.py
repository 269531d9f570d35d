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
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from wmark.contexts import prefix_positions, scored_positions
from wmark.detector.normalize import NormalizedText
from wmark.detector.readings import edit_marks, reading_texts, restored, text_variants
from wmark.detector.result import Detection, KeyResult, TokenEvidence, Verdict
from wmark.detector.splice import canonical_readings
from wmark.detector.tokenize import TextTokenizer
from wmark.errors import InputError, InsufficientTextError, TokenizerError
from wmark.keymaterial import KeyMaterial
from wmark.prf import KeyedSource
from wmark.scoring import ScoreResult, aaronson_scores, log_gamma_sf_many, log_gamma_tail
from wmark.vllm_gumbel import VllmGumbelKey

__all__ = [
    "Detector",
    "Encoding",
    "Encodings",
    "KeyPivots",
    "KeyScore",
    "KeyScorer",
    "detect",
    "holm_adjust",
    "key_pivots",
]

TokenizerLookup = Callable[[str], bytes]


@dataclass(frozen=True)
class KeyPivots:
    """Scored positions of a sequence under one key, their pivots and scores.

    Attributes:
        positions: (m,) scored positions, ascending.
        pivots: (m,) U(y_t, 1), Unif(0, 1) under H0 (for vLLM's dual-key scheme: the H0 CDF of
            the token's score).
        scores: (m,) each position's share of the test statistic: -ln(1 - pivot), or vLLM's
            weighted dual-key score.
    """

    positions: npt.NDArray[np.int64]
    pivots: npt.NDArray[np.float64]
    scores: npt.NDArray[np.float64]


def key_pivots(
    token_ids: npt.NDArray[np.uint32], source: KeyedSource, *, start: int = 0, threads: int = 1
) -> KeyPivots:
    """Pivots of every scored position of `token_ids` under one key.

    Args:
        token_ids: (n,) token IDs; with the prompt in front when start > 0.
        source: the key's clocks.
        start: first position that may be scored (the prompt length, or 0 for answer-only text).
        threads: threads for the pivot computation (long texts).
    """
    spec = source.spec
    if spec.context_mode == "prefix":
        positions = prefix_positions(len(token_ids), start)
        pivots = source.prefix_pivots(token_ids.tolist(), start)
    else:
        sp = scored_positions(token_ids, spec.context_width, start)
        positions, pivots = (
            sp.positions,
            source.window_pivots(sp.windows, token_ids[sp.positions], threads=threads),
        )
    return KeyPivots(positions, pivots, aaronson_scores(pivots))


class KeyScorer:
    """One key's test, whatever its scheme: scored positions, per-token scores, exact p-value.

    The statistic (the sum of a text's token scores over n scored positions) is
    Gamma(n / v, scale v) under H0: v = 1 for wmark's keys and vLLM's "gumbel" (the Aaronson
    test), and vLLM's moment-matched (1 - alpha)^2 + alpha^2 for its dual-key scheme.
    """

    def __init__(self, key: KeyMaterial) -> None:
        self.key = key
        self._source: KeyedSource | VllmGumbelKey
        if key.spec.is_vllm:
            self._source = VllmGumbelKey(key.secret, key.spec)
            self.variance = self._source.variance
        else:
            self._source = KeyedSource(key.secret, key.spec)
            self.variance = 1.0

    def pivots(self, token_ids: npt.NDArray[np.uint32], *, start: int = 0, threads: int = 1) -> KeyPivots:
        """Scored positions of `token_ids` (prompt in front when start > 0) and their evidence."""
        if isinstance(self._source, KeyedSource):
            return key_pivots(token_ids, self._source, start=start, threads=threads)
        scored = self._source.score(token_ids, start)
        return KeyPivots(scored.positions, scored.pivots, scored.scores)

    def test(self, kp: KeyPivots) -> ScoreResult:
        """The exact test of all of `kp`'s scored positions."""
        n, score = len(kp.scores), float(kp.scores.sum())
        return ScoreResult(score, log_gamma_tail(n / self.variance, score / self.variance), n)

    def log_p_many(
        self, n: npt.NDArray[np.int64], scores: npt.NDArray[np.float64]
    ) -> npt.NDArray[np.float64]:
        """Exact log p-values of many statistics `scores[i]` over `n[i]` positions (windows)."""
        if self.variance == 1.0:
            return log_gamma_sf_many(n, scores)
        v = self.variance
        return np.array(
            [log_gamma_tail(k / v, s / v) for k, s in zip(n.tolist(), scores.tolist(), strict=True)]
        )


def holm_adjust(log_ps: Sequence[float]) -> list[float]:
    """Holm step-down adjusted log p-values, in the input order."""
    m = len(log_ps)
    order = sorted(range(m), key=lambda i: log_ps[i])
    adjusted = [0.0] * m
    running = -math.inf
    for rank, i in enumerate(order):
        running = max(running, min(0.0, math.log(m - rank) + log_ps[i]))
        adjusted[i] = running
    return adjusted


def choose_verdict(
    log_ps: Sequence[float], enough: Sequence[bool], alpha: float
) -> tuple[Verdict, int, list[float]]:
    """The verdict over several keys and the key it reports, from each key's log p-value.

    The p-values are Holm-adjusted over the keys. The key reported is the most significant one
    that both passes alpha and has enough scored tokens; failing that, the most significant one.

    Returns:
        (verdict, index of the reported key, the adjusted log p-values in input order).
    """
    adjusted = holm_adjust(log_ps)
    order = sorted(range(len(adjusted)), key=adjusted.__getitem__)
    detected = [i for i in order if enough[i] and adjusted[i] <= math.log(alpha)]
    if detected:
        return "watermarked", detected[0], adjusted
    return ("not_detected" if any(enough) else "insufficient_evidence"), order[0], adjusted


def check_vocabulary(ids: npt.NDArray[np.uint32], key: KeyMaterial) -> None:
    """Token IDs to score under `key`: not empty, and inside its tokenizer's vocabulary."""
    if len(ids) == 0:
        raise InsufficientTextError("the text has no tokens")
    if int(ids.max()) >= key.spec.tokenizer.vocab_size:
        raise TokenizerError(
            f"token ID {int(ids.max())} is outside key {key.key_id}'s vocabulary "
            f"({key.spec.tokenizer.vocab_size}): the IDs come from another tokenizer"
        )


@dataclass(frozen=True)
class Encoding:
    """A text's token IDs under one tokenizer, with each token's character span when asked for.

    Offsets are spans of the submitted text, also for a canonical reading of it.
    """

    ids: npt.NDArray[np.uint32]
    offsets: list[tuple[int, int]] | None = None


class Encodings:
    """One input as every key reads it: tokenised once per distinct tokenizer, or raw token IDs.

    Per tokenizer, the encodings of the text's readings (`wmark.detector.readings`), each with
    token IDs different from all before it; the first is the submitted text's own unless the
    text carries marks of an edit, was re-wrapped or recased.
    """

    def __init__(
        self, by_tokenizer: Mapping[str, Sequence[Encoding]] | None = None, ids: Encoding | None = None
    ):
        self._by_tokenizer = {sha: tuple(encs) for sha, encs in (by_tokenizer or {}).items()}
        self._ids = ids

    def readings(self, key: KeyMaterial) -> tuple[Encoding, ...]:
        """Every reading `key` scores."""
        found = self._by_tokenizer.get(key.spec.tokenizer.sha256)
        if found is not None:
            return found
        if self._ids is None:
            raise TokenizerError(f"the input was not tokenised with key {key.key_id}'s tokenizer")
        return (self._ids,)


@dataclass(frozen=True)
class KeyScore:
    """One key's evidence on one input: its scored positions, pivots and exact Aaronson test.

    Attributes:
        key: the key.
        pivots: scored positions and pivots of the reading the test reports.
        test: that reading's exact test; its log p-value is corrected for the readings tried.
        encoding: that reading's tokens (offsets into the submitted text).
        reading: its index among the readings.
        n_readings: the readings tried, the Bonferroni factor in `test.log_p`.
    """

    key: KeyMaterial
    pivots: KeyPivots
    test: ScoreResult
    encoding: Encoding
    reading: int = 0
    n_readings: int = 1

    @property
    def enough(self) -> bool:
        """Whether the key scored at least its spec's `min_scored_tokens` positions."""
        return self.test.n >= self.key.spec.min_scored_tokens


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
            by_sha[sha] = _distinct(encodings)
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
            Encodings({sha: _distinct([Encoding(x) for x in by_sha[sha][i]]) for sha in self._shas})
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
            tried = []
            for index, encoding in enumerate(readings):
                check_vocabulary(encoding.ids, key)
                kp = scorer.pivots(encoding.ids, start=start, threads=self.threads)
                tried.append(KeyScore(key, kp, scorer.test(kp), encoding, index, len(readings)))
            best = min(tried, key=lambda s: s.test.log_p)  # the submitted text wins ties
            if best.n_readings > 1:  # Bonferroni over the readings
                log_p = min(0.0, best.test.log_p + math.log(best.n_readings))
                best = dataclasses.replace(best, test=dataclasses.replace(best.test, log_p=log_p))
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
        )


def reading_ids(
    tok: TextTokenizer, texts: Sequence[str], ids: Sequence[npt.NDArray[np.uint32]]
) -> list[list[npt.NDArray[np.uint32]]]:
    """The token IDs of every reading of each text (`reading_texts`), given the texts' own.

    The canonical reading is spliced from the text's tokens where the tokenizer allows it
    (`wmark.detector.splice`: only its changed lines are tokenised), else tokenised in full;
    an unwrapped or recased reading (rare) is tokenised in full. One batch call per kind of
    reading.
    """
    tables = tok.splice_tables
    if tables is None:
        variants = [reading_texts(t, tok.case_forms) for t in texts]
        todo = [(i, j, v) for i, vs in enumerate(variants) for j, v in enumerate(vs) if v != texts[i]]
        flat = tok.encode_batch([v for _, _, v in todo])
        out = [[ids[i]] * len(vs) for i, vs in enumerate(variants)]
        for (i, j, _), new in zip(todo, flat, strict=True):
            out[i][j] = new
        return out
    canonical = canonical_readings(tables, texts, ids, tok.encode_batch)
    bases: list[list[tuple[str, npt.NDArray[np.uint32]]]] = []
    for text, own, c in zip(texts, ids, canonical, strict=True):
        if c is None:
            bases.append([(text, own)])
        else:
            bases.append([c] if edit_marks(text) else [(text, own), c])
    out, redo = [], []
    for i, readings in enumerate(bases):
        row = []
        for j, (text, own) in enumerate(readings):
            row.append(own)
            reading = restored(text, tok.case_forms)
            if reading != text:
                redo.append((i, j, reading))
        out.append(row)
    for (i, j, _), new in zip(redo, tok.encode_batch([r for _, _, r in redo]), strict=True):
        out[i][j] = new
    return out


def _distinct(encodings: Sequence[Encoding]) -> tuple[Encoding, ...]:
    """The encodings whose token IDs differ from every earlier one (the first always kept)."""
    out: list[Encoding] = []
    for enc in encodings:
        if all(not np.array_equal(enc.ids, seen.ids) for seen in out):
            out.append(enc)
    return tuple(out)


def _token_evidence(enc: Encoding, kp: KeyPivots) -> tuple[TokenEvidence, ...]:
    pairs = zip(kp.pivots.tolist(), kp.scores.tolist(), strict=True)
    evidence_at = dict(zip(kp.positions.tolist(), pairs, strict=True))
    out = []
    for t, token_id in enumerate(enc.ids.tolist()):
        u, s = evidence_at.get(t, (None, None))
        span = enc.offsets[t] if enc.offsets is not None else (None, None)
        out.append(TokenEvidence(token_id=token_id, start=span[0], end=span[1], pivot=u, score=s))
    return tuple(out)


def check_unicode(text: str) -> None:
    """Text a tokenizer can read: no unpaired surrogate.

    A JSON "\\ud800" escape (or a database driver) can give a `str` that is not valid Unicode;
    the tokenizers refuse it with a TypeError, so it is refused here as bad input.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InputError(f"not valid Unicode text (an unpaired surrogate at character {exc.start})") from None


def check_text(text: str) -> None:
    """Text to detect: not blank, and valid Unicode."""
    if not text.strip():
        raise InsufficientTextError("the text is empty")
    check_unicode(text)


def check_alpha(alpha: float) -> None:
    """The significance level of a verdict: a number strictly between 0 and 1."""
    if not (isinstance(alpha, float | int) and 0.0 < alpha < 1.0):
        raise InputError(f"alpha must be in (0, 1), got {alpha!r}")


def check_token_ids(token_ids: Sequence[int] | npt.NDArray[np.integer] | None) -> npt.NDArray[np.uint32]:
    """Token IDs given instead of text, as uint32; a clear error for anything else."""
    arr = np.asarray(token_ids)
    if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
        raise InputError("token_ids must be a flat list of integers")
    if arr.size == 0:
        raise InsufficientTextError("token_ids is empty")
    if arr.min() < 0 or arr.max() > 0xFFFFFFFF:
        raise InputError("token IDs must be between 0 and 2^32 - 1")
    return arr.astype(np.uint32)


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
