"""The CPU path's kernels and thread planning: the batch-invariant int8 GEMM and tree attention
(C extensions), the top-k scan of the logits, the int8 linear layers built on them, and how many
threads each forward runs on. Nothing here imports the GPU path (`wmark.generator.cuda`).
"""
