"""Synonyms from WordNet 3.0's database files, read directly (no NLTK, no download at run time).

The files are Princeton's (index.noun, data.noun, ... for noun, verb, adjective, adverb), as
Debian's `wordnet-base` package installs them in /usr/share/wordnet (`make dev` installs it
where apt is available). The format is wndb(5): an index line lists a lemma's synsets by byte
offset into the data file, most frequent sense first; a data line lists the synset's words.
"""

from __future__ import annotations

import functools
from pathlib import Path

from wmark.errors import InputError

__all__ = ["DEFAULT_WORDNET", "WordNet"]

DEFAULT_WORDNET = Path("/usr/share/wordnet")
_POS = ("noun", "verb", "adj", "adv")


class WordNet:
    """Synonym lookup over WordNet's database files.

    Args:
        root: the folder holding index.noun, data.noun and the other parts of speech.

    Raises:
        InputError: the folder does not hold WordNet's database files.
    """

    def __init__(self, root: Path = DEFAULT_WORDNET) -> None:
        missing = [
            f"{kind}.{pos}"
            for pos in _POS
            for kind in ("index", "data")
            if not (root / f"{kind}.{pos}").is_file()
        ]
        if missing:
            raise InputError(
                f"no WordNet database in {root} (missing {', '.join(missing)}): install Debian's "
                "wordnet-base (apt-get install wordnet-base) or give the folder of WordNet 3.0's dict files"
            )
        self.root = root
        self._index = {pos: self._read_index(root / f"index.{pos}") for pos in _POS}

    @staticmethod
    def _read_index(path: Path) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        with path.open(encoding="utf-8") as f:
            for line in f:
                if line.startswith(" "):
                    continue  # licence header
                fields = line.split()
                # lemma pos synset_cnt p_cnt [ptr_symbol x p_cnt] sense_cnt tagsense_cnt offsets...
                n_synsets, n_pointers = int(fields[2]), int(fields[3])
                offsets = fields[6 + n_pointers : 6 + n_pointers + n_synsets]
                out[fields[0]] = [int(o) for o in offsets]
        return out

    @functools.lru_cache(maxsize=65536)  # noqa: B019 (one instance per run; the cache is the point)
    def _synset_words(self, pos: str, offset: int) -> tuple[str, ...]:
        with (self.root / f"data.{pos}").open("rb") as f:
            f.seek(offset)
            fields = f.readline().decode("utf-8").split()
        n_words = int(fields[3], 16)
        return tuple(fields[4 + 2 * i].split("(")[0].replace("_", " ") for i in range(n_words))

    def synonyms(self, word: str) -> list[str]:
        """Synonyms of `word` from its most frequent sense in each part of speech, in file order.

        Empty when WordNet does not know the word (lookup is lower case; multiword synonyms
        come with spaces).
        """
        lemma = word.lower()
        seen = {lemma}
        out = []
        for pos in _POS:
            offsets = self._index[pos].get(lemma)
            if not offsets:
                continue
            for candidate in self._synset_words(pos, offsets[0]):
                if candidate.lower() not in seen:
                    seen.add(candidate.lower())
                    out.append(candidate)
        return out
