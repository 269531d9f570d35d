"""Settings of the generation endpoints, read from `WMARK_GENERATE_*` (set by `wmark serve --generate`).

Generation is off unless `WMARK_GENERATE_TARGET` names a model: the detection service then has
no generation routes and loads no model. The watermark key is the server's choice
(`WMARK_GENERATE_KEY`, else the only active key), never the request's.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from wmark.api.settings import env_number
from wmark.errors import InputError

__all__ = ["MIN_TEMPERATURE", "MIN_TOP_P", "GenerationSettings"]

MIN_TEMPERATURE = 0.7  # the default floors: see `GenerationSettings`
MIN_TOP_P = 0.9


@dataclass(frozen=True, kw_only=True)
class GenerationSettings:
    """How the service generates.

    Attributes:
        target: "embedded", a local model directory or a cached HF model id (`WMARK_GENERATE_TARGET`).
        drafter: the drafter, or None to generate without one (`WMARK_GENERATE_DRAFTER`).
        method: the sampler (`WMARK_GENERATE_METHOD`; default mpfr with a drafter, else basic-uwm).
        key_id: the watermark key, or None for the only active key (`WMARK_GENERATE_KEY`); looked
            up for each request, so a rotation takes effect without a restart.
        model_name: the `model` clients must send (`WMARK_GENERATE_MODEL_NAME`; default the
            target's directory name, or "embedded").
        device, precision: where and how the models run (`WMARK_GENERATE_DEVICE`, `..._PRECISION`).
        max_tokens: most tokens one request may ask for, and the default (`WMARK_GENERATE_MAX_TOKENS`).
        max_prompt_tokens: longest prompt after the chat template (`WMARK_GENERATE_MAX_PROMPT_TOKENS`).
        max_queue: requests that may wait for the model while one generates; more get 429
            (`WMARK_GENERATE_QUEUE`; 0: none wait, one request generates at a time).
        top_k: top-k of both models (`WMARK_GENERATE_TOP_K`; 0: off). OpenAI's API has no top_k.
        queue_per_token: the most generations one token may have running or waiting, so that one
            client cannot hold every place (`WMARK_GENERATE_QUEUE_PER_TOKEN`; default: half the
            places, rounded up).
        min_temperature, min_top_p: the lowest `temperature` and `top_p` a request may ask for
            (`WMARK_GENERATE_MIN_TEMPERATURE`, `..._MIN_TOP_P`). The keyed race can only carry
            the randomness sampling leaves: on the embedded target, 96-token answers sampled at
            temperature 1 were detected at p 1e-14 to 4e-5 where the answer had any entropy,
            at 0.7 at p 2e-6 to 0.09, and at 0.5 or below, or top-p 0.5 or below, not at all
            (BENCHMARKS.md, "Watermark strength against temperature and top-p"); without a
            floor a client could ask for text that carries no watermark.
    """

    target: str
    drafter: str | None = None
    method: str | None = None
    key_id: str | None = None
    model_name: str | None = None
    device: str = "cpu"
    precision: str = "auto"
    max_tokens: int = 512
    max_prompt_tokens: int = 4096
    max_queue: int = 8
    top_k: int = 50
    queue_per_token: int | None = None
    min_temperature: float = MIN_TEMPERATURE
    min_top_p: float = MIN_TOP_P

    def __post_init__(self) -> None:
        if self.queue_per_token is None:
            object.__setattr__(self, "queue_per_token", (self.max_queue + 2) // 2)
        if not 0.01 <= self.min_temperature <= 2.0 or not 0.0 <= self.min_top_p <= 1.0:
            raise InputError("the temperature floor must be in [0.01, 2] and the top-p floor in [0, 1]")
        if self.method is None:
            object.__setattr__(self, "method", "mpfr" if self.drafter else "basic-uwm")
        if self.model_name is None:
            name = "embedded" if self.target == "embedded" else Path(self.target).name or self.target
            object.__setattr__(self, "model_name", name)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> GenerationSettings | None:
        """The settings, or None when `WMARK_GENERATE_TARGET` is unset (generation off)."""
        env = os.environ if env is None else env
        target = env.get("WMARK_GENERATE_TARGET", "").strip()
        if not target:
            return None

        def text(name: str) -> str | None:
            return env.get(name, "").strip() or None

        def count(name: str, default: int, minimum: int) -> int:
            value = env_number(env, name, default, minimum=minimum)
            if value != int(value):
                raise InputError(f"{name} must be a whole number, got {env[name]!r}")
            return int(value)

        return cls(
            target=target,
            drafter=text("WMARK_GENERATE_DRAFTER"),
            method=text("WMARK_GENERATE_METHOD"),
            key_id=text("WMARK_GENERATE_KEY"),
            model_name=text("WMARK_GENERATE_MODEL_NAME"),
            device=text("WMARK_GENERATE_DEVICE") or "cpu",
            precision=text("WMARK_GENERATE_PRECISION") or "auto",
            max_tokens=count("WMARK_GENERATE_MAX_TOKENS", 512, 1),
            max_prompt_tokens=count("WMARK_GENERATE_MAX_PROMPT_TOKENS", 4096, 1),
            max_queue=count("WMARK_GENERATE_QUEUE", 8, 0),
            top_k=count("WMARK_GENERATE_TOP_K", 50, 0),
            queue_per_token=count("WMARK_GENERATE_QUEUE_PER_TOKEN", 0, 0) or None,
            min_temperature=env_number(env, "WMARK_GENERATE_MIN_TEMPERATURE", MIN_TEMPERATURE, minimum=0.01),
            min_top_p=env_number(env, "WMARK_GENERATE_MIN_TOP_P", MIN_TOP_P, minimum=0.0),
        )
