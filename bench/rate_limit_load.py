"""Per-token rate limits under load, with N workers: per process, and shared through Redis.

    .venv/bin/python bench/rate_limit_load.py [--workers 2] [--rate 40] [--burst 40] [--seconds 8]

One `wmark serve --workers N` on SQLite with `WMARK_API_RATE`/`WMARK_API_BURST` set, once without
`WMARK_REDIS_URL` (each worker keeps its own token bucket) and once with it (one bucket in Redis,
`WMARK_REDIS_URL`, default redis://127.0.0.1:6379/0). wrk sends POST /v1/detect with one detector
token on 16 connections for `--seconds`; the table counts the answers that were 200 and 429. A
token bucket admits at most burst + rate x seconds requests in a window, so with a shared bucket
the 200s must stay within that bound, and without one they may reach N times it (each worker
grants the whole rate). Every 200 is audited: the audit log's new rows must equal the 200s and
its chain must verify. Needs `wrk` (Debian: apt-get install wrk) and Redis.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))
import api_load  # noqa: E402 (the service helpers of the throughput benchmark)

from wmark.detector import TextTokenizer  # noqa: E402
from wmark.keys import KeyRegistry, RegistryConfig  # noqa: E402

# wrk's script: the same body on every request, with the detector token.
_WRK_LUA = """
local body, token = "", ""
init = function(args)
  body = io.open(args[1]):read("*l")
  token = args[2]
  wrk.method = "POST"
  wrk.headers["Content-Type"] = "application/json"
  wrk.headers["Authorization"] = "Bearer " .. token
  wrk.body = body
end
"""


def _run(server: api_load.Server, seconds: float, tmp: Path) -> tuple[int, int, int]:
    """(requests, non-2xx answers, socket errors) of one wrk run."""
    cmd = ["wrk", "-t1", "-c16", f"-d{seconds:g}s", "--timeout", "10s", "-s", str(tmp / "rate.lua")]
    cmd += [server.url + "/v1/detect", "--", str(tmp / "body.txt"), server.token]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    total = re.search(r"(\d+) requests in", out)
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    if total is None:
        raise SystemExit(f"wrk printed no summary:\n{out}")
    failed = sum(int(g) for g in errors.groups()) if errors else 0
    return int(total.group(1)), int(non2xx.group(1)) if non2xx else 0, failed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rate", type=float, default=40.0, help="requests per second per token")
    parser.add_argument("--burst", type=int, default=40)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--redis", default=os.environ.get("WMARK_REDIS_URL", "redis://127.0.0.1:6379/0"))
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("this benchmark's load generator is wrk: install it (Debian: apt-get install wrk)")
    redis.Redis.from_url(args.redis).ping()

    from wmark.generator.models.embedded import embedded_tokenizer_json

    tokenizer_json = embedded_tokenizer_json()
    tok = TextTokenizer(tokenizer_json, "qwen2.5-coder")
    text = api_load._texts(tok, 1, 200)[0]
    bound = args.burst + args.rate * args.seconds
    rows = []
    for shared in (False, True):
        with tempfile.TemporaryDirectory(prefix="wmark-bench-") as tmpdir:
            tmp = Path(tmpdir)
            (tmp / "rate.lua").write_text(_WRK_LUA)
            (tmp / "body.txt").write_text(json.dumps({"text": text}) + "\n")
            config = RegistryConfig(home=tmp, database_url=f"sqlite:///{tmp / 'wmark.db'}")
            with KeyRegistry.open(config) as reg:
                reg.create_key("bench", reg.add_tokenizer(tokenizer_json, "qwen2.5-coder"))
                token = reg.tokens.create("detector", "bench-rate", actor="bench").token
                auditor = reg.tokens.create("auditor", "bench-rate-metrics", actor="bench").token
                audit_before = reg.audit.count()
            env = {
                **os.environ,
                "WMARK_HOME": str(config.home),
                "WMARK_DATABASE_URL": config.database_url,
                "WMARK_API_RATE": str(args.rate),
                "WMARK_API_BURST": str(args.burst),
            }
            env.pop("PROMETHEUS_MULTIPROC_DIR", None)
            env.pop("WMARK_REDIS_URL", None)
            if shared:
                env["WMARK_REDIS_URL"] = args.redis
            proc, url = api_load._serve(env, args.workers, tmp / "server.log")
            server = api_load.Server("SQLite", args.workers, proc, url, token, auditor)
            try:
                requests, refused, failed = _run(server, args.seconds, tmp)
                statuses = api_load.detect_statuses(server)
            finally:
                api_load._stop(proc)
            with KeyRegistry.open(config) as reg:
                written = reg.audit.count() - audit_before
                chain_ok = reg.audit.verify().ok
            ok = statuses.get("200", 0)
            if written != ok or not chain_ok or set(statuses) - {"200", "429"} or failed:
                raise SystemExit(f"shared={shared}: {statuses}, {written} audit rows, chain ok {chain_ok}")
            rows.append((shared, requests, ok, statuses.get("429", 0), written))
    print(
        f"{args.workers} workers, rate {args.rate:g}/s, burst {args.burst}, {args.seconds:g} s of wrk "
        f"(16 connections): a shared bucket admits at most {bound:.0f}\n"
    )
    print("| limits | requests | 200 | 429 | 200 ÷ single-bucket bound | audit rows |")
    print("|---|---:|---:|---:|---:|---:|")
    for shared, requests, ok, limited, written in rows:
        name = "shared (Redis)" if shared else "per process"
        print(f"| {name} | {requests} | {ok} | {limited} | {ok / bound:.2f} | {written} |")


if __name__ == "__main__":
    main()
