"""Prompt lookup's match lengths: the index's minimum, and the stricter one lookup lookahead asks for."""

from __future__ import annotations

from collections import Counter

from wmark.generator.drafters.prompt_lookup import DEEP_MATCH, SuffixIndex


def test_a_query_can_ask_for_a_longer_match_than_the_index():
    # "5 6 7 8" is followed by 9 earlier; the text now ends in a 3-token match "6 7 8" of it
    # (the token before, 1, differs from 5), then with the tail [9] a 4-token match "6 7 8 9".
    index = SuffixIndex([5, 6, 7, 8, 9, 10, 1, 6, 7, 8], min_match=2)
    assert index.continuations([]) == Counter({9: 1})  # 3 tokens: enough for the index's 2
    assert index.continuations([], min_match=DEEP_MATCH) is None  # not for 4
    assert index.continuations([9], min_match=DEEP_MATCH) == Counter({10: 1})  # 4 tokens with the tail
    assert index.continuations([], min_match=1) == Counter({9: 1})  # never looser than the index's own
    assert SuffixIndex([5, 6, 1, 6], min_match=2).continuations([], min_match=1) is None
