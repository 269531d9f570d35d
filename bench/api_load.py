"""Load on POST /v1/detect via `wmark serve` (1 and 4 workers, SQLite, PostgreSQL) vs in-process detect().

    .venv/bin/python bench/api_load.py [--requests 300] [--rounds 3] [--concurrency 16] [--write]

Texts: 200-token prefixes (Qwen2.5 tokenizer, the embedded pair's) of human-written documents
found on this machine. The same texts go through `Detector.detect()` in this process (one call
at a time: the pure detection cost) and through the service, where each request also pays HTTP,
JSON, bearer-token authentication, the key-set check and one locked audit-log write. This script
is the load generator: a separate process from the server, a minimal asyncio HTTP/1.1 client
with `--concurrency` keep-alive connections, one request in flight on each. Latency is what the
client sees. All servers start (and are warmed up) first; then `--rounds` rounds each measure
every row in turn; every answer must be 200 and every request must have left exactly one
audit row. `--write` puts the table
into BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx  # readiness polling only
from sqlalchemy import create_engine, text

from wmark.detector import Detector, TextTokenizer
from wmark.eval.corpus import system_corpus
from wmark.keys import KeyRegistry, RegistryConfig

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("WMARK_MODEL_CACHE", str(ROOT / "build" / "test-models"))
PG_ADMIN_URL = os.environ.get("WMARK_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
SECTION = "## Detection service (bench/api_load.py)"


@dataclass(frozen=True)
class Row:
    name: str
    connections: int
    requests: int  # per round
    rps: float  # median over the rounds
    p50_ms: float  # over every request of every round
    p99_ms: float


@dataclass
class Series:
    """One row's measurements, round after round."""

    name: str
    connections: int
    requests: int
    rates: list[float] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)

    def add(self, seconds: float, latencies: list[float]) -> None:
        self.rates.append(len(latencies) / seconds)
        self.latencies += latencies

    def row(self) -> Row:
        ms = sorted(1000 * x for x in self.latencies)
        return Row(
            self.name,
            self.connections,
            self.requests,
            statistics.median(self.rates),
            statistics.median(ms),
            _percentile(ms, 0.99),
        )


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _texts(tok: TextTokenizer, n: int, length: int) -> list[str]:
    out = []
    for doc in system_corpus(4 * n):
        ids = tok.encode(doc.text)
        if len(ids) >= length:
            out.append(tok.decode(ids[:length].tolist()))
        if len(out) == n:
            return out
    raise SystemExit(f"only {len(out)} documents of {length} tokens found on this machine")


def _in_process(detector: Detector, texts: list[str], requests: int) -> tuple[float, list[float]]:
    latencies = []
    start = time.perf_counter()
    for i in range(requests):
        t0 = time.perf_counter()
        detector.detect(texts[i % len(texts)])
        latencies.append(time.perf_counter() - t0)
    return time.perf_counter() - start, latencies


async def _load(url: str, token: str, texts: list[str], requests: int, concurrency: int) -> list[float]:
    """Send `requests` POST /v1/detect over `concurrency` keep-alive connections; client latencies.

    A minimal HTTP/1.1 client on asyncio streams (requests encoded up front, responses read by
    Content-Length): httpx costs ~3.5 ms of CPU per request, which on 2 shared cores would measure
    the client rather than the server.
    """
    host, port = url.removeprefix("http://").split(":")
    payloads = []
    for t in texts:
        body = json.dumps({"text": t}).encode()
        head = (
            f"POST /v1/detect HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        payloads.append(head.encode() + body)
    latencies: list[float] = []
    counter = iter(range(requests))

    async def connection() -> None:
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            for i in counter:
                t0 = time.perf_counter()
                writer.write(payloads[i % len(payloads)])
                status = await reader.readline()
                length = 0
                while (line := await reader.readline()) not in (b"\r\n", b""):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                body = await reader.readexactly(length)
                latencies.append(time.perf_counter() - t0)
                if b" 200 " not in status:
                    raise SystemExit(f"request {i}: {status.decode().strip()}: {body[:200]!r}")
        finally:
            writer.close()
            await writer.wait_closed()

    await asyncio.gather(*(connection() for _ in range(concurrency)))
    return latencies


def _serve(env: dict[str, str], workers: int, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [sys.executable, "-m", "wmark.cli", "serve", "--port", str(port), "--workers", str(workers)]
    cmd += ["--no-migrate", "--no-access-log", "--log-level", "warning"]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"server exited:\n{log.read_text()}")
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"server not ready:\n{log.read_text()}")
        time.sleep(0.2)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@dataclass
class Server:
    """A running `wmark serve` and the detector token the load uses."""

    label: str
    workers: int
    proc: subprocess.Popen[bytes]
    url: str
    token: str


def _start(config: RegistryConfig, label: str, workers: int, texts: list[str], tmp: Path) -> Server:
    env = {
        **os.environ,
        "WMARK_HOME": str(config.home),
        "WMARK_DATABASE_URL": config.database_url,
        "WMARK_API_RATE": "1000000",
        "WMARK_API_BURST": "1000000",
    }
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    with KeyRegistry.open(config) as reg:
        token = reg.tokens.create("detector", f"bench-{label}-{workers}", actor="bench").token
    proc, url = _serve(env, workers, tmp / f"server-{label}-{workers}.log")
    asyncio.run(_load(url, token, texts, 16 * workers, 4 * workers))  # warm-up: every worker answers
    return Server(label, workers, proc, url, token)


def _table(rows: list[Row], baseline: Row) -> str:
    lines = [
        "| path | connections | requests | req/s | p50 ms | p99 ms | req/s ÷ in-process |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        ratio = r.rps / baseline.rps
        lines.append(
            f"| {r.name} | {r.connections} | {r.requests} | {r.rps:.0f} | {r.p50_ms:.2f} | {r.p99_ms:.2f}"
            f" | {ratio:.3f} |"
        )
    return "\n".join(lines)


def _write(markdown: str) -> None:
    path = ROOT / "BENCHMARKS.md"
    current = path.read_text() if path.exists() else "# Benchmarks\n"
    if SECTION in current:
        head, rest = current.split(SECTION, 1)
        tail = rest[rest.find("\n## ") :] if "\n## " in rest else "\n"
        current = head + markdown + tail
    else:
        current = current.rstrip("\n") + "\n\n" + markdown
    path.write_text(current.rstrip("\n") + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300, help="per row and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--texts", type=int, default=200, help="distinct 200-token texts")
    parser.add_argument("--write", action="store_true", help="write the table into BENCHMARKS.md")
    args = parser.parse_args()

    from wmark.generator.embedded import embedded_tokenizer_json

    load_before = os.getloadavg()[0]
    tokenizer_json = embedded_tokenizer_json()
    tok = TextTokenizer(tokenizer_json, "qwen2.5-coder")
    texts = _texts(tok, args.texts, 200)
    n_tokens = statistics.mean(len(tok.encode(t)) for t in texts)

    with tempfile.TemporaryDirectory(prefix="wmark-bench-") as tmpdir:
        tmp = Path(tmpdir)
        pg_name = f"wmark_bench_{secrets.token_hex(4)}"
        admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{pg_name}"'))
        configs = {
            "SQLite": RegistryConfig(home=tmp, database_url=f"sqlite:///{tmp / 'wmark.db'}"),
            "PostgreSQL": RegistryConfig(
                home=tmp, database_url=PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{pg_name}"
            ),
        }
        servers: list[Server] = []
        try:
            secret_keys = []
            for config in configs.values():
                with KeyRegistry.open(config) as reg:  # migrates
                    key = reg.create_key("bench", reg.add_tokenizer(tokenizer_json, "qwen2.5-coder"))
                    secret_keys.append(reg.material(key.key_id))
            detector = Detector(secret_keys[:1], {tok.sha256: tokenizer_json})
            _in_process(detector, texts, 50)  # warm-up
            audit_before = {}
            for label, config in configs.items():
                servers += [_start(config, label, workers, texts, tmp) for workers in (1, 4)]
                with KeyRegistry.open(config) as reg:
                    audit_before[label] = reg.audit.count()
            baseline = Series("in-process `Detector.detect()`", 1, args.requests)
            series: list[tuple[Server, Series]] = []
            for server in servers:
                plural = "s" if server.workers > 1 else ""
                name = f"service, {server.label}, {server.workers} worker{plural}"
                if server.workers == 1:
                    series.append((server, Series(name, 1, args.requests // 3)))
                series.append((server, Series(name, args.concurrency, args.requests)))
            sent = dict.fromkeys(configs, 0)
            for round_no in range(args.rounds):  # rows alternate: drift of the machine hits all alike
                baseline.add(*_in_process(detector, texts, args.requests))
                for server, row in series:
                    start = time.perf_counter()
                    latencies = asyncio.run(
                        _load(server.url, server.token, texts, row.requests, row.connections)
                    )
                    row.add(time.perf_counter() - start, latencies)
                    sent[server.label] += row.requests
                print(f"round {round_no + 1}/{args.rounds} done", file=sys.stderr)
        finally:
            for server in servers:
                _stop(server.proc)
        try:
            for label, config in configs.items():
                with KeyRegistry.open(config) as reg:
                    written = reg.audit.count() - audit_before[label]
                    if written != sent[label] or not reg.audit.verify().ok:
                        raise SystemExit(
                            f"{label}: {written} audit rows for {sent[label]} requests, or a broken chain"
                        )
        finally:
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{pg_name}" WITH (FORCE)'))
            admin.dispose()

    base = baseline.row()
    rows = [base] + [row.row() for _, row in series]
    table = _table(rows, base)
    cpu = platform.processor() or platform.machine()
    command = " ".join(["python", "bench/api_load.py", *sys.argv[1:]])
    markdown = f"""{SECTION}

`{command}`, one run of {args.rounds} rounds, loopback. This machine: {os.cpu_count()} cores
({cpu}), shared with the load generator (this script: one process, a minimal asyncio HTTP/1.1
client over keep-alive connections, one request in flight on each) and with other engineers' work
(1-minute load average {load_before:.1f} at the start), so the figures are noisy. {len(texts)}
distinct texts of {n_tokens:.0f} Qwen2.5 tokens (human-written documents found on the machine), one key.

All servers run from the start; each round measures every row in turn, so drift of the machine
hits all rows alike: req/s is the median over the rounds, p50/p99 are over every request. The
in-process row calls `Detector.detect()` one text at a time. The 1-connection rows send one
request at a time (latency without queueing); the {args.concurrency}-connection rows measure throughput
under load. Each service request also pays HTTP + JSON, the bearer-token check (cached per
process; the token's revocation is re-checked inside the audit transaction), the key-set check
(one SELECT) and its audit-log row, written under the database write lock (SQLite: BEGIN
IMMEDIATE, WAL; PostgreSQL: row lock on the chain head) and group-committed with the rows of
concurrent requests of the same worker. Every response was 200, and at the end each database's
audit log held exactly one row per request sent to it and its chain verified.

{table}

With {os.cpu_count()} cores, 4 workers cannot run 4 detections at once, and they share the cores with the
load generator and (PostgreSQL) the database server: more workers than cores adds contention here.
On a machine with more cores the worker count is what scales throughput.
"""
    print(markdown)
    if args.write:
        _write(markdown)
        (ROOT / "bench" / "out").mkdir(parents=True, exist_ok=True)
        (ROOT / "bench" / "out" / "api_load.json").write_text(
            json.dumps([r.__dict__ for r in rows], indent=2)
        )


if __name__ == "__main__":
    main()
