"""Models behind the backend protocol: loading (an HF id or directory, the embedded GGUF pair),
conversion to wmark's int8 layout and its cache on disk, the per-generation sessions with their
KV cache, and the forward each session runs (`wmark.generator.models.forward_plan`).

The samplers (`wmark.generator`) never import this package: they see only `Session`.
"""
