"""What the generation worker's revocation check costs: one `wmark.api.revocation.check`.

    .venv/bin/python bench/revocation_check.py [--database-url URL] [--checks 2000]

The worker runs it when a job starts and before every block (the token's row and the key's
status, in one read transaction). Default database: SQLite in a temporary WMARK_HOME; give
`--database-url postgresql+psycopg://...` for a server. Prints the median and the 99th
percentile in microseconds, to set against a block's time (BENCHMARKS.md, "Generation speed").
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

from wmark.api import revocation
from wmark.keys import KeyRegistry, RegistryConfig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--checks", type=int, default=2000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as home:
        os.environ["WMARK_HOME"] = home
        if args.database_url:
            os.environ["WMARK_DATABASE_URL"] = args.database_url
        registry = KeyRegistry.open(RegistryConfig.from_env())
        try:
            ref = registry.add_tokenizer(_tokenizer_json(), "bench")
            key = registry.create_key("bench-revocation", ref)
            token = registry.tokens.create("generator", "bench-revocation", actor="bench")
            for _ in range(50):  # warm the pool and the statement cache
                revocation.check(registry, token.info.token_id, key.key_id)
            times = []
            for _ in range(args.checks):
                start = time.perf_counter()
                revocation.check(registry, token.info.token_id, key.key_id)
                times.append(time.perf_counter() - start)
            registry.tokens.revoke(token.info.token_id, actor="bench")
            registry.revoke(key.key_id, actor="bench")
        finally:
            registry.close()
    times.sort()
    median, p99 = statistics.median(times), times[int(0.99 * (len(times) - 1))]
    print(f"{registry!r}: {len(times)} checks, median {median * 1e6:.0f} us, p99 {p99 * 1e6:.0f} us")


def _tokenizer_json() -> bytes:
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel(vocab={"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return str(tok.to_str()).encode()


if __name__ == "__main__":
    main()
