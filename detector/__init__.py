"""wmark.detector: replay the keyed clocks from token IDs and test them, exactly.

from wmark.detector import Detector
detection = Detector(keys, tokenizers).detect("some text")
detection.verdict, detection.p_value
"""

from __future__ import annotations

from wmark.detector.detect import Detector, detect
from wmark.detector.keytest import KeyPivots, holm_adjust, key_pivots
from wmark.detector.result import Detection, KeyResult, TokenEvidence, Verdict
from wmark.detector.tokenize import TextTokenizer, read_tokenizer_source

__all__ = [
    "Detection",
    "Detector",
    "KeyPivots",
    "KeyResult",
    "TextTokenizer",
    "TokenEvidence",
    "Verdict",
    "detect",
    "holm_adjust",
    "key_pivots",
    "read_tokenizer_source",
]
