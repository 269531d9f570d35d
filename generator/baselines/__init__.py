"""The paper's baselines on our backend, clocks and logits processing (docs/algorithms.md §6).

`vsps`, `mws`, `mse` (`reweight`), `mse-pseudo` (`pseudo`) are single-draft chains
(`chain`); `gls` (`gls`) is multi-draft list sampling. `streams` holds the randomness and the
speculative-sampling step they share. They are registered in `wmark.generator.engine.METHODS`.
"""
