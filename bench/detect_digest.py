"""Every detection's numbers over fixed corpora: proof that a speed change changed no result.

    .venv/bin/python bench/detect_digest.py --write BEFORE.json     (on the code before)
    .venv/bin/python bench/detect_digest.py --compare BEFORE.json   (on the code after)

The texts: the Python files of `bench/detect_throughput.py` (`python_files`), the human corpus
(`system_corpus`), every character-level attack of `wmark.eval.attacks` on the first
`--attacked` documents of each, and watermarked token sequences planted by the keyed race
(no model) decoded to text, as generated and with trailing spaces and doubled spaces added
(two readings), so p-values far below alpha are compared too. Keys: one default key, and a
detector with two (h = 4 and h = 2) for Holm's correction.

Per text it records what `Detector.detect` (one text at a time), `Detector.detect_many`,
`Localizer.localize_many` and, on a subset, `detect(..., return_tokens=True)` return: verdict,
log p-values (exact `repr` of the float), scores, scored and total token counts, per key, the
window and per-token evidence. `--write` stores the texts with the records, and `--compare` detects
those texts again (so a corpus that changed since does not matter); it exits 1 on the first
record that differs (not close: equal), naming the text.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from detect_throughput import python_files

from wmark import KeyMaterial, Secret, WatermarkSpec
from wmark.contexts import ContextTracker
from wmark.detector import Detector, TextTokenizer
from wmark.detector.localize import Localizer
from wmark.detector.readings import warm_tables
from wmark.eval.attacks import ATTACKS
from wmark.eval.corpus import system_corpus
from wmark.generator.models.embedded import embedded_tokenizer_json
from wmark.prf import FreeSource, KeyedSource, seed_uniforms
from wmark.race import race_winner


def _key(name: str, spec: WatermarkSpec) -> KeyMaterial:
    return KeyMaterial(key_id=f"wk_{name}", secret=Secret(hashlib.sha256(name.encode()).digest()), spec=spec)


def _planted(key: KeyMaterial, n_tokens: int, rng: np.random.Generator) -> list[int]:
    """Tokens drawn by the keyed race from random distributions (as tests/conftest.py plants)."""
    vocab = 150_000  # Qwen2.5's ordinary tokens: no special token in the planted text
    keyed = KeyedSource(key.secret, key.spec)
    free = FreeSource(rng.bytes(32), key.spec.spec_version)
    ids = [int(x) for x in rng.integers(1, vocab, size=key.spec.context_width)]
    tracker = ContextTracker(key.spec.context_width, start=len(ids))
    while len(ids) < n_tokens + key.spec.context_width:
        cand = rng.choice(np.arange(1, vocab), size=40, replace=False)
        probs = rng.dirichlet(np.full(40, 0.5))
        label = tracker.label(ids)
        seed = keyed.seed(label) if label is not None else free.seed(len(ids), tracker.window(ids))
        tracker.commit(ids)
        ids.append(int(cand[race_winner(probs, seed_uniforms(seed, cand))]))
    return ids[key.spec.context_width :]


def _texts(tok: TextTokenizer, key: KeyMaterial, args: argparse.Namespace) -> list[tuple[str, str]]:
    python = [(f"py:{name}", text) for name, text in python_files(args.docs)]
    human = [(f"human:{d.source}", d.text) for d in system_corpus(args.docs)]
    out = python + human
    rng = np.random.default_rng(0)
    for attack in (a for a in ATTACKS.values() if a.level == "char"):
        for label, text in python[: args.attacked] + human[: args.attacked]:
            out.append((f"{attack.name}:{label}", attack.apply(text, rng)))
    for i in range(args.planted):
        text = tok.decode(_planted(key, int(rng.integers(20, 400)), rng))
        lines = text.split("\n")
        spaced = "\n".join(line + "  " if j % 3 == 0 else line for j, line in enumerate(lines))
        out += [(f"planted:{i}", text), (f"planted-spaced:{i}", spaced.replace(" ", "  ", 3))]
    return [(label, text) for label, text in out if text.strip()]


def _detection(found: Any) -> dict[str, Any]:
    data = found.to_dict() if hasattr(found, "to_dict") else dict(vars(found))
    return json.loads(json.dumps(data, default=repr, sort_keys=True), parse_float=str)


def _records(
    tokenizers: dict[str, bytes], keys: list[KeyMaterial], texts: list[tuple[str, str]], every: int
) -> Iterator[tuple[str, str, Any]]:
    single, several = Detector(keys[:1], tokenizers), Detector(keys, tokenizers)
    warm_tables()
    for name, detector in (("1 key", single), ("2 keys", several)):
        many = detector.detect_many([t for _, t in texts])
        for (label, text), batch in zip(texts, many, strict=True):
            yield label, f"{name} detect", _detection(detector.detect(text))
            yield label, f"{name} detect_many", _detection(batch)
        localized = Localizer(detector).localize_many([t for _, t in texts])
        for (label, _), found in zip(texts, localized, strict=True):
            yield label, f"{name} localize", _detection(found)
        for label, text in texts[::every]:
            yield label, f"{name} tokens", _detection(detector.detect(text, return_tokens=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=2000)
    parser.add_argument("--attacked", type=int, default=200)
    parser.add_argument("--planted", type=int, default=100)
    parser.add_argument("--every", type=int, default=20, help="per-token evidence for every N-th text")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", type=Path)
    mode.add_argument("--compare", type=Path)
    args = parser.parse_args()

    data = embedded_tokenizer_json()
    tok = TextTokenizer(data, "qwen2.5-coder")
    keys = [
        _key("digest0", WatermarkSpec(tokenizer=tok.ref)),
        _key("digest1", WatermarkSpec(tokenizer=tok.ref, context_width=2)),
    ]
    if args.write:
        texts = _texts(tok, keys[0], args)
        count = 0
        with args.write.open("w", encoding="utf-8") as out:
            out.write(json.dumps({"texts": texts, "every": args.every}) + "\n")
            for label, what, record in _records({tok.sha256: data}, keys, texts, args.every):
                out.write(json.dumps([label, what, record], sort_keys=True) + "\n")
                count += 1
        print(f"{len(texts)} texts, {count} records written to {args.write}")
        return
    count = 0
    with args.compare.open(encoding="utf-8") as before:
        head = json.loads(next(before))
        texts = [(label, text) for label, text in head["texts"]]
        records = _records({tok.sha256: data}, keys, texts, head["every"])
        for (label, what, record), line in zip(records, before, strict=True):
            if [label, what, record] != json.loads(line):
                sys.exit(f"differs: {what} of {label}")
            count += 1
    print(f"{len(texts)} texts, {count} records identical")


if __name__ == "__main__":
    main()
