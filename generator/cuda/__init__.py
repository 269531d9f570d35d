"""The GPU path: what runs the keyed clocks on the device. Nothing here imports the CPU kernels
(`wmark.generator.cpu`).
"""
