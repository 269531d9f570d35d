"""The vLLM plugin's server-side settings and its per-request rule, without vLLM (tested alone).

Configuration is the server's environment, never the request:

- WMARK_VLLM_KEY_ID: the key, loaded from wmark's registry (WMARK_HOME, WMARK_DATABASE_URL,
  WMARK_MASTER_KEY, as for every wmark command); it must be bound to the served tokenizer.
- WMARK_VLLM_DIVERSITY_BITS: the unkeyed diversity prefix, as `wmark generate` (default 16).
- WMARK_VLLM_UNWATERMARKED: comma-separated SHA-256 hex digests of opt-out tokens. A request
  asks for no watermark with `extra_args={"wmark_watermark": false}`, and is served so only if
  `extra_args["wmark_token"]` hashes to one of them; otherwise vLLM answers 400. Greedy requests
  (temperature 0) carry no watermark, so they need a token too. (vLLM's own `watermarking`
  field switches its native watermark; the engine overwrites it when it has none configured,
  so it cannot carry a request's wish here.)

Watermarked requests may not set repetition, frequency or presence penalties or min_p: vLLM
applies those after logits processors, so the race could not see them (400 instead of a silent
difference).
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["PluginSettings", "watermarked"]

DEFAULT_DIVERSITY_BITS = 16.0


@dataclass(frozen=True)
class PluginSettings:
    """The plugin's server-side settings (see the module docstring for the variables)."""

    key_id: str
    diversity_bits: float = DEFAULT_DIVERSITY_BITS
    unwatermarked: frozenset[str] = frozenset()

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> PluginSettings:
        """Read the settings; a missing key is an error, never a silent unwatermarked server."""
        env = os.environ if env is None else env
        key_id = env.get("WMARK_VLLM_KEY_ID", "").strip()
        if not key_id:
            raise ValueError("set WMARK_VLLM_KEY_ID to the wmark key that vLLM should watermark with")
        bits = float(env.get("WMARK_VLLM_DIVERSITY_BITS", DEFAULT_DIVERSITY_BITS))
        if not bits >= 0:
            raise ValueError("WMARK_VLLM_DIVERSITY_BITS must be >= 0")
        digests = {d.strip().lower() for d in env.get("WMARK_VLLM_UNWATERMARKED", "").split(",") if d.strip()}
        return cls(key_id, bits, frozenset(digests))

    def allows_unwatermarked(self, token: object) -> bool:
        """Whether an opt-out token is on the allow-list (compared by SHA-256, in constant time)."""
        if not isinstance(token, str) or not token:
            return False
        digest = hashlib.sha256(token.encode()).hexdigest()
        return any(hmac.compare_digest(digest, allowed) for allowed in self.unwatermarked)


def _extra(params: Any) -> dict[str, Any]:
    extra = getattr(params, "extra_args", None)
    return extra if isinstance(extra, dict) else {}


def watermarked(params: Any, settings: PluginSettings) -> bool:
    """Whether a request gets the race; raises ValueError (vLLM's 400) for a refused request."""
    opt_out = _extra(params).get("wmark_watermark", True) is False or params.temperature == 0
    if opt_out:
        if settings.allows_unwatermarked(_extra(params).get("wmark_token")):
            return False
        raise ValueError(
            "this server watermarks every request: no-watermark and greedy (temperature 0) requests "
            "need an allowed extra_args['wmark_token']"
        )
    unsupported = {
        "repetition_penalty": params.repetition_penalty != 1.0,
        "frequency_penalty": params.frequency_penalty != 0.0,
        "presence_penalty": params.presence_penalty != 0.0,
        "min_p": params.min_p > 0.0,
    }
    refused = [name for name, used in unsupported.items() if used]
    if refused:
        raise ValueError(
            f"watermarked requests cannot use {', '.join(refused)} (vLLM applies it after the watermark)"
        )
    return True
