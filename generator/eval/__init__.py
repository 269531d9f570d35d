"""The evaluation harness behind `wmark eval`: every method side by side on the same prompts.

`prompts` (prompt sets), `runner` (generation + per-row figures, resumable results.jsonl),
`metrics` and `pseudo` (scores, TPR, LPPL, ROUGE-L; the mse-pseudo detector), `summary`
(summary.md) and `plots` (PNG figures).
"""
