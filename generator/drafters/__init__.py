"""Who proposes the draft tokens: prompt lookup, the hybrid of lookup and a model, model drafters,
and the surgery that makes a draft model cheap (a truncated output layer, 4-bit weights).

A drafter only decides how many tokens a target forward emits; the keyed race picks every token
from the target's distribution, so nothing here can change the text of `pfr` / `mpfr`.
"""
