"""wmark.generator: watermarked speculative decoding (backends, samplers, engine, embedded models)."""
