"""The evaluation harness behind `wmark eval`: every method side by side on the same prompts.

`session` (one output folder from start to finish: plan, resume, load models, choose the key, run,
write outputs; what the CLI calls), `prompts` (prompt sets), `models` (loading a target and its
drafters), `runner` (the settings grid and generation with per-row figures), `results` (the
resumable results.jsonl), `rows` (a results.jsonl row, typed), `metrics` and `detection` (scores,
TPR, LPPL, ROUGE-L; pivots and the mse-pseudo detector), `aggregate` (rows -> statistics),
`summary` (summary.md) and `plots` (PNG figures).
"""
