"""Localized detection: find a watermarked passage inside a long document, family-wise error at alpha.

Per key, the scored positions and pivots of the whole document are computed once
(`key_pivots`). A *window* is a run of consecutive scored positions; the family tested is fixed
by the number m of scored positions alone: lengths w, 2w, 4w, ... below m, each with 50 %
overlap (starts every half length). Prefix sums of the token scores (s_t = -ln(1 - u_t), or
vLLM's weighted dual-key score) score any window in O(1); its exact p-value is the key's Gamma
tail (`KeyScorer`: Gamma(n, 1) but for vLLM's dual-key scheme).

Coverage: a passage of P >= 1.5 w scored positions contains a whole window of more than P / 3
of them (take the largest length L with 1.5 L <= P; the first start at or after the passage
ends inside it). There are about 4 m / w windows.

Error control per document (weighted Bonferroni, then Holm): for each key the whole-document
test gets alpha / 2 and the W windows share the other alpha / 2, so the key's combined p-value
min(1, 2 p_whole, 2 W p_best_window) is a valid p-value; Holm over the keys keeps the family-wise
error over keys, windows and the whole document at alpha. A document too short for any window
(m <= w) gives the whole document all of alpha: the same test as `Detector`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from wmark.detector.checks import check_alpha, check_text
from wmark.detector.detect import Detector
from wmark.detector.encoding import Encodings
from wmark.detector.keytest import KeyScore, choose_verdict, holm_adjust
from wmark.detector.result import Verdict
from wmark.errors import InputError, WmarkError

__all__ = ["KeyLocalization", "Localization", "Localizer", "Window", "window_family"]

DEFAULT_MIN_WINDOW = 32


def _family(m: int, min_len: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    starts: list[npt.NDArray[np.int64]] = []
    length = min_len
    while length < m:
        starts.append(np.arange(0, m - length + 1, length // 2, dtype=np.int64))
        length *= 2
    if not starts:
        empty = np.empty(0, dtype=np.int64)
        return empty, empty
    lengths = [np.full(len(s), min_len << k, dtype=np.int64) for k, s in enumerate(starts)]
    first = np.concatenate(starts)
    return first, first + np.concatenate(lengths)


def window_family(m: int, min_len: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """The windows tested over m scored positions.

    Args:
        m: number of scored positions of the document under one key.
        min_len: the shortest window, an even number >= 2.

    Returns:
        (starts, ends): (W,) int64 each, indices into the scored positions, end exclusive;
        lengths min_len * 2^k < m with starts every half length. Empty when m <= min_len.
    """
    if min_len < 2 or min_len % 2:
        raise InputError(f"the shortest window must be an even number >= 2, got {min_len}")
    return _family(int(m), int(min_len))


@dataclass(frozen=True, kw_only=True)
class Window:
    """The best window of a document under one key.

    Attributes:
        start, end: its tokens, [start, end) in the document's token sequence.
        start_char, end_char: its characters [start_char, end_char) in the text, when known.
        n_scored: scored positions inside it.
        score: their Aaronson score.
        log_p_raw: exact log p-value of this window alone.
        log_p: corrected for the number of windows (and the half of alpha they share).
        n_windows: windows tested under this key.
    """

    start: int
    end: int
    start_char: int | None
    end_char: int | None
    n_scored: int
    score: float
    log_p_raw: float
    log_p: float
    n_windows: int

    @property
    def p_value(self) -> float:
        """Corrected p-value."""
        return math.exp(self.log_p)

    @property
    def p_raw(self) -> float:
        """Uncorrected p-value of this window alone."""
        return math.exp(self.log_p_raw)


@dataclass(frozen=True, kw_only=True)
class KeyLocalization:
    """The tests against one key.

    Attributes:
        key_id: the key.
        n_scored: scored positions in the whole document.
        score: Aaronson score of the whole document.
        whole_log_p: exact log p-value of the whole document under this key.
        window: the best window, None when the document is too short for windows.
        log_p: the key's combined log p-value (whole document and windows).
        adjusted_log_p: `log_p` after Holm's correction over the keys.
    """

    key_id: str
    n_scored: int
    score: float
    whole_log_p: float
    window: Window | None
    log_p: float
    adjusted_log_p: float


@dataclass(frozen=True, kw_only=True)
class Localization:
    """Verdict on one document from the whole-document test and the window search.

    Attributes:
        verdict: "watermarked" when the reported key's adjusted p-value is <= alpha with enough
            scored tokens, "insufficient_evidence" when no key has min_scored_tokens, else
            "not_detected".
        p_value, log_p: the decision p-value: per document, family-wise over keys, the whole
            document and its windows.
        whole_p_value, whole_log_p: the whole-document test alone, Holm over keys: what
            `Detector.detect` reports for the same key.
        key_id: the matched key, else the key with the smallest p-value.
        n_tokens: tokens of the document under that key's tokenizer.
        n_scored: scored positions of the whole document under that key.
        window: that key's best window, None for documents too short for windows.
        alpha: the significance level used.
        keys: the tests against every key.
        source: where the document came from, when known.
    """

    verdict: Verdict
    p_value: float
    log_p: float
    whole_p_value: float
    whole_log_p: float
    key_id: str
    n_tokens: int
    n_scored: int
    window: Window | None
    alpha: float
    keys: tuple[KeyLocalization, ...]
    source: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return asdict(self)


@dataclass(frozen=True)
class _Scored:
    """A key's whole-document test (from the detector) and its best window."""

    whole: KeyScore
    window: Window | None
    log_p: float


class Localizer:
    """Whole-document test plus window search over a `Detector`'s keys and tokenizers.

    Build it once per process, like the `Detector` it wraps. The input checks, tokenisation,
    pivots and whole-document test are the detector's own (`Detector.encode`, `score_keys`), so
    `whole_p_value` is exactly what `Detector.detect` reports.

    Args:
        detector: supplies the keys and (cached) tokenizers.
        min_window: shortest window in scored positions (raised to each key's
            min_scored_tokens, rounded up to even); 0 tests whole documents only.
    """

    def __init__(self, detector: Detector, *, min_window: int = DEFAULT_MIN_WINDOW) -> None:
        if min_window < 0:
            raise InputError(f"the window length must be >= 0, got {min_window}")
        self.detector = detector
        self.min_window = min_window

    def localize(
        self,
        text: str | None = None,
        *,
        token_ids: Sequence[int] | npt.NDArray[np.integer] | None = None,
        alpha: float = 0.01,
        source: str | None = None,
    ) -> Localization:
        """Test one document (text, or token IDs read by every key as its tokenizer's IDs).

        Raises:
            InsufficientTextError: empty text or token list.
            InputError: bad alpha or token IDs, or both/neither of text and token_ids.
            TokenizerError: token IDs outside a key's vocabulary, or a tokenizer missing.
        """
        check_alpha(alpha)
        encodings = self.detector.encode(text, token_ids=token_ids)
        return self._localize(encodings, text, alpha=alpha, source=source)

    def localize_many(
        self, texts: Sequence[str], *, alpha: float = 0.01, sources: Sequence[str | None] | None = None
    ) -> list[Localization | WmarkError]:
        """Test many texts, tokenising them in one batch per tokenizer.

        A text that cannot be tested (empty, no tokens, IDs outside a key's vocabulary) gives
        its error in its place instead of stopping the others. Character offsets of the best
        window are computed for watermarked texts only (a second, offset-tracking tokenisation).
        """
        check_alpha(alpha)
        labels = list(sources) if sources is not None else [None] * len(texts)
        checked: list[WmarkError | None] = []
        for text in texts:
            try:
                check_text(text)
                checked.append(None)
            except WmarkError as exc:
                checked.append(exc)
        readable = [t for t, err in zip(texts, checked, strict=True) if err is None]
        encoded = iter(self.detector.encode_many(readable))
        out: list[Localization | WmarkError] = []
        for text, err, label in zip(texts, checked, labels, strict=True):
            if err is not None:
                out.append(err)
                continue
            try:
                out.append(self._localize(next(encoded), text, alpha=alpha, source=label))
            except WmarkError as exc:
                out.append(exc)
        return out

    def _localize(
        self, encodings: Encodings, text: str | None, *, alpha: float, source: str | None
    ) -> Localization:
        scored = [self._with_window(whole) for whole in self.detector.score_keys(encodings)]
        verdict, best, adjusted = choose_verdict(
            [s.log_p for s in scored], [s.whole.enough for s in scored], alpha
        )
        whole_adjusted = holm_adjust([s.whole.test.log_p for s in scored])
        chosen = scored[best]
        window = chosen.window
        if window is not None and text is not None and verdict == "watermarked":
            window = self._with_chars(window, text, chosen.whole)
        keys = tuple(
            KeyLocalization(
                key_id=s.whole.key.key_id,
                n_scored=s.whole.test.n,
                score=s.whole.test.score,
                whole_log_p=s.whole.test.log_p,
                window=window if i == best else s.window,
                log_p=s.log_p,
                adjusted_log_p=adjusted[i],
            )
            for i, s in enumerate(scored)
        )
        return Localization(
            verdict=verdict,
            p_value=math.exp(adjusted[best]),
            log_p=adjusted[best],
            whole_p_value=math.exp(whole_adjusted[best]),
            whole_log_p=whole_adjusted[best],
            key_id=chosen.whole.key.key_id,
            n_tokens=len(chosen.whole.encoding.ids),
            n_scored=chosen.whole.test.n,
            window=window,
            alpha=alpha,
            keys=keys,
            source=source,
        )

    def _with_window(self, whole: KeyScore) -> _Scored:
        window = self._best_window(whole) if self.min_window else None
        if window is None:
            return _Scored(whole, None, whole.test.log_p)
        combined = min(0.0, math.log(2.0) + whole.test.log_p, window.log_p)
        return _Scored(whole, window, combined)

    def _best_window(self, whole: KeyScore) -> Window | None:
        kp = whole.pivots
        w = max(self.min_window, whole.key.spec.min_scored_tokens)
        starts, ends = _family(len(kp.pivots), w + (w % 2))
        if len(starts) == 0:
            return None
        prefix = np.concatenate(([0.0], np.cumsum(kp.scores)))
        lengths = ends - starts
        scores = prefix[ends] - prefix[starts]
        log_q = self.detector.scorers[whole.key.key_id].log_p_many(lengths, scores)
        best = int(np.argmin(log_q))
        n_windows = len(starts)
        # this key's windows share alpha / 2: Bonferroni factor 2 W, times the readings tried
        # (`whole.test.log_p` already carries that factor)
        corrected = min(0.0, math.log(2.0 * n_windows * whole.n_readings) + float(log_q[best]))
        first, last = int(starts[best]), int(ends[best]) - 1
        return Window(
            start=int(kp.positions[first]),
            end=int(kp.positions[last]) + 1,
            start_char=None,
            end_char=None,
            n_scored=int(lengths[best]),
            score=float(scores[best]),
            log_p_raw=float(log_q[best]),
            log_p=corrected,
            n_windows=n_windows,
        )

    def _with_chars(self, window: Window, text: str, whole: KeyScore) -> Window:
        # the window's tokens are those of the reading the key's test reports
        encoding = self.detector.encode(text, with_offsets=True).readings(whole.key)[whole.reading]
        offsets = encoding.offsets or []
        return Window(
            **{
                **asdict(window),
                "start_char": offsets[window.start][0],
                "end_char": offsets[window.end - 1][1],
            }
        )
