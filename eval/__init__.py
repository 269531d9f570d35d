"""The evaluation harness behind `wmark eval`: every method side by side on the same prompts.

`prompts` (prompt sets), `models` (loading a target and its drafters), `runner` (generation and
per-row figures, resumable results.jsonl), `metrics` and `detection` (scores, TPR, LPPL,
ROUGE-L; pivots and the mse-pseudo detector), `aggregate` (rows -> statistics), `summary`
(summary.md) and `plots` (PNG figures).
"""
