"""Two builds of the service side by side: POST /v1/detect at 16 connections, wrk, rounds alternating.

    pip install --no-deps --no-build-isolation --target /tmp/before .   # at the old commit
    pip install --no-deps --no-build-isolation --target /tmp/after .    # at the new one
    .venv/bin/python bench/api_versions.py before=/tmp/before after=/tmp/after [--workers 2]

A change to the service's request path moves its speed by less than this machine drifts between
two runs of `bench/api_load.py`, so the builds are measured in one run: every server starts
first (each build's `wmark serve`, through PYTHONPATH, on SQLite and on PostgreSQL), then each
round measures the in-process `Detector.detect()` and every server in turn, the order reversed
every other round. The helpers (texts, wrk, servers, the 200-only and audit checks) are
`bench/api_load.py`'s.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import tempfile
from pathlib import Path

from api_load import _WRK_LUA, PG_ADMIN_URL, Series, _in_process, _load, _settled, _start, _stop, _texts
from sqlalchemy import create_engine, text

from wmark.detector import Detector, TextTokenizer
from wmark.generator.models.embedded import embedded_tokenizer_json
from wmark.keys import KeyRegistry, RegistryConfig

CONNECTIONS = 16


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("builds", nargs="+", help="NAME=DIR: a `pip install --target DIR` of wmark")
    parser.add_argument("--seconds", type=float, default=5.0, help="per server and round")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    builds = dict(b.split("=", 1) for b in args.builds)
    for name, path in builds.items():
        if not (Path(path) / "wmark" / "__init__.py").is_file():
            parser.error(f"{name}: {path} holds no wmark package")
    tokenizer_json = embedded_tokenizer_json()
    tok = TextTokenizer(tokenizer_json, "qwen2.5-coder")
    texts = _texts(tok, 200, 200)
    load = os.getloadavg()[0]
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    databases = {name: f"wmark_versions_{name}_{secrets.token_hex(3)}" for name in builds}
    with tempfile.TemporaryDirectory(prefix="wmark-versions-") as d, admin.connect() as sql:
        tmp = Path(d)
        for database in databases.values():
            sql.execute(text(f'CREATE DATABASE "{database}"'))
        (tmp / "detect.lua").write_text(_WRK_LUA)
        (tmp / "bodies.txt").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
        servers, secret = [], None
        try:
            for name, path in builds.items():
                (tmp / name).mkdir()
                configs = {
                    "SQLite": RegistryConfig(
                        home=tmp / name, database_url=f"sqlite:///{tmp / name / 'wmark.db'}"
                    ),
                    "PostgreSQL": RegistryConfig(
                        home=tmp / name, database_url=PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{databases[name]}"
                    ),
                }
                for label, config in configs.items():
                    with KeyRegistry.open(config) as registry:
                        tokenizer = registry.add_tokenizer(tokenizer_json, "qwen2.5-coder")
                        key = registry.create_key("bench", tokenizer)
                        secret = secret or registry.material(key.key_id)
                    os.environ["PYTHONPATH"] = path  # the server's build
                    servers.append((name, _start(config, f"{name}-{label}", args.workers, tmp)))
            os.environ.pop("PYTHONPATH", None)
            assert secret is not None
            detector = Detector([secret], {tok.sha256: tokenizer_json})
            _in_process(detector, texts, 50)  # warm-up
            baseline = Series("in-process", 0, 1)
            series = [
                (name, server, Series(server.label, args.workers, CONNECTIONS)) for name, server in servers
            ]
            for r in range(args.rounds):
                baseline.add(_in_process(detector, texts, 1000))
                for _, server, row in series if r % 2 == 0 else list(reversed(series)):
                    row.add(_load(server, args.seconds, CONNECTIONS, tmp))
                print(f"round {r + 1}/{args.rounds}", file=sys.stderr)
            for _, server, _row in series:
                _settled(server)  # every answer a 200, by the server's own counter
        finally:
            for _, server in servers:
                _stop(server.proc)
            for database in databases.values():
                sql.execute(text(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)'))
    base = baseline.row()
    print(f"load average {load:.1f} -> {os.getloadavg()[0]:.1f}; in-process {base.rps:.0f} req/s")
    print("| server | workers | req/s (median) | per round | CPU ms / req | p50 ms | p99 ms | ÷ in-process |")
    print("|---|---:|---:|---|---:|---:|---:|---:|")
    for _, _, row in series:
        r = row.row()
        rounds = " ".join(f"{x:.0f}" for x in row.rates)
        print(
            f"| {r.name} | {r.workers} | {r.rps:.0f} | {rounds} | {r.cpu_ms:.2f} | {r.p50_ms:.1f}"
            f" | {r.p99_ms:.1f} | {r.rps / base.rps:.3f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
