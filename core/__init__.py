"""wmark: watermarked speculative decoding via Poisson processes, and exact detection.

Glossary (the same words in code, CLI flags, API fields and database columns):

- *secret*: the key's random bytes (`Secret`; never printed, encrypted at rest).
- *key* / *key_id*: a registry entry (id, name, status, fingerprint, spec, encrypted secret).
- *spec*: the `WatermarkSpec` stored with a key; detection replays exactly what generation did.
- *context_width* (h): how many previous token IDs label a position (its *window*).
- *clock*: token v's unit-rate Poisson process at a context, with uniforms U(v, j) (`wmark.prf`).
- *race*: the exponential race argmin_v -ln U(v, 1) / P(v) that picks each token (`wmark.race`).
- *pivot*: U(y_t, 1) of the emitted token at a scored position; Unif(0, 1) under H0.
- *scored* / *masked*: positions whose window is new / repeated (`wmark.contexts`).
- *score*, *p_value*, *log_p*: test statistic and its exact tail (`wmark.scoring`).
- *verdict*: "watermarked", "not_detected" or "insufficient_evidence".

The core is pure (numpy, scipy); the generator, detector, key registry, service and CLI are the
subpackages `wmark.generator`, `wmark.detector`, `wmark.keys`, `wmark.api`, `wmark.cli`.
"""

from __future__ import annotations

from wmark.errors import (
    AuthError,
    BackendError,
    InputError,
    InsufficientTextError,
    KeyNotFoundError,
    KeyRegistryError,
    KeyRevokedError,
    MasterKeyError,
    SpecError,
    TokenizerError,
    WmarkError,
)
from wmark.keymaterial import KeyMaterial
from wmark.secret import Secret
from wmark.spec import PrfRef, TokenizerRef, WatermarkSpec

__version__ = "0.1.0"

__all__ = [
    "AuthError",
    "BackendError",
    "InputError",
    "InsufficientTextError",
    "KeyMaterial",
    "KeyNotFoundError",
    "KeyRegistryError",
    "KeyRevokedError",
    "MasterKeyError",
    "PrfRef",
    "Secret",
    "SpecError",
    "TokenizerError",
    "TokenizerRef",
    "WatermarkSpec",
    "WmarkError",
    "__version__",
]
