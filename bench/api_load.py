"""Load on POST /v1/detect via `wmark serve` (1 and 2 workers, SQLite, PostgreSQL) vs in-process detect().

    .venv/bin/python bench/api_load.py [--seconds 5] [--rounds 3] [--concurrency 16] [--write]

Needs `wrk` (Debian: `apt-get install wrk`), the load generator: a C program, one thread, with
`--concurrency` keep-alive connections and one request in flight on each, so that it takes
little of the cores the server runs on (the asyncio client this script used before cost about
as much CPU per request as the server's HTTP layer). Texts: 200-token prefixes (Qwen2.5
tokenizer, the embedded pair's) of human-written documents found on this machine. The same
texts go through `Detector.detect()` in this process (one call at a time: the pure detection
cost) and through the service, where each request also pays HTTP, JSON, bearer-token
authentication and its audit-log row. Latency is what wrk sees. All servers start (and are
warmed up) first; then `--rounds` rounds each measure every row in turn for `--seconds`; every
answer must be 200 (wrk counts no error and no other status, and the server's own request
counter agrees), and each database's audit log must hold exactly one row per request its
servers answered, with the chain intact. The service's CPU time per request (its processes, all
threads; not the database server's) is the per-core cost. `--write` puts the table into
BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx  # readiness polling and the request counter only
import psutil
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
    workers: int  # 0: in process
    connections: int
    requests: int  # over all rounds
    rps: float  # median over the rounds
    p50_ms: float  # median over the rounds
    p99_ms: float  # the worst round's
    cpu_ms: float  # CPU time per request (the service's processes; in-process: this one)


@dataclass
class Series:
    """One row's measurements, round after round."""

    name: str
    workers: int
    connections: int
    requests: int = 0
    cpu_seconds: float = 0.0
    rates: list[float] = field(default_factory=list)
    p50s: list[float] = field(default_factory=list)
    p99s: list[float] = field(default_factory=list)

    def add(self, run: Run) -> None:
        self.requests += run.requests
        self.cpu_seconds += run.cpu_seconds
        self.rates.append(run.requests / run.seconds)
        self.p50s.append(run.p50_ms)
        self.p99s.append(run.p99_ms)

    def row(self) -> Row:
        return Row(
            self.name,
            self.workers,
            self.connections,
            self.requests,
            statistics.median(self.rates),
            statistics.median(self.p50s),
            max(self.p99s),
            1000 * self.cpu_seconds / self.requests,
        )


@dataclass(frozen=True)
class Run:
    """One round of one row."""

    requests: int
    seconds: float
    p50_ms: float
    p99_ms: float
    cpu_seconds: float


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


def _in_process(detector: Detector, texts: list[str], requests: int) -> Run:
    latencies = []
    cpu = time.process_time()
    start = time.perf_counter()
    for i in range(requests):
        t0 = time.perf_counter()
        detector.detect(texts[i % len(texts)])
        latencies.append(time.perf_counter() - t0)
    seconds = time.perf_counter() - start
    ms = sorted(1000 * x for x in latencies)
    return Run(requests, seconds, statistics.median(ms), _percentile(ms, 0.99), time.process_time() - cpu)


# wrk's script: cycles through the bodies (one JSON request a line), then prints one parsable line.
_WRK_LUA = """
local bodies, i = {}, 0
init = function(args)
  for line in io.lines(args[1]) do bodies[#bodies + 1] = line end
  wrk.method = "POST"
  wrk.headers["Content-Type"] = "application/json"
  wrk.headers["Authorization"] = "Bearer " .. args[2]
end
request = function()
  i = i % #bodies + 1
  return wrk.format(nil, "/v1/detect", nil, bodies[i])
end
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("WMARK requests=%d us=%d status=%d errors=%d p50=%d p99=%d\\n",
    summary.requests, summary.duration, e.status, e.connect + e.read + e.write + e.timeout,
    latency:percentile(50), latency:percentile(99)))
end
"""


def _tree_cpu(pid: int) -> float:
    """CPU seconds (user + system) of a process and all its descendants, so far."""
    root = psutil.Process(pid)
    total = 0.0
    for proc in [root, *root.children(recursive=True)]:
        try:
            times = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def _load(server: Server, seconds: float, connections: int, tmp: Path, *, warm_up: bool = False) -> Run:
    """`connections` keep-alive connections of wrk for `seconds`; all answers must be 200, and
    (unless `warm_up`) there must be some."""
    cpu = _tree_cpu(server.proc.pid)
    cmd = ["wrk", "-t1", f"-c{connections}", f"-d{seconds:g}s", "--timeout", "10s"]
    cmd += ["-s", str(tmp / "detect.lua"), server.url, "--", str(tmp / "bodies.txt"), server.token]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    cpu = _tree_cpu(server.proc.pid) - cpu
    match = re.search(r"WMARK requests=(\d+) us=(\d+) status=(\d+) errors=(\d+) p50=(\d+) p99=(\d+)", out)
    if match is None:
        raise SystemExit(f"wrk printed no summary:\n{out}")
    requests, micros, status, errors, p50, p99 = (int(g) for g in match.groups())
    if status or errors or not (requests or warm_up):
        raise SystemExit(f"{server.label}: {status} answers were not 200 and {errors} failed:\n{out}")
    return Run(requests, micros / 1e6, p50 / 1000, p99 / 1000, cpu)


def detect_statuses(server: Server) -> dict[str, int]:
    """The server's own count of POST /v1/detect answers by status (all workers)."""
    metrics = httpx.get(
        f"{server.url}/metrics", headers={"Authorization": f"Bearer {server.auditor}"}, timeout=10
    ).text
    counts: dict[str, int] = {}
    for line in metrics.splitlines():
        if line.startswith("wmark_http_requests_total{") and 'route="/v1/detect"' in line:
            status = re.search(r'status="(\d+)"', line)
            assert status is not None
            counts[status.group(1)] = counts.get(status.group(1), 0) + int(float(line.rsplit(" ", 1)[1]))
    return counts


def _answered(server: Server) -> int:
    """The server's own count of POST /v1/detect answers (all workers); they must all be 200s."""
    counts = detect_statuses(server)
    if set(counts) - {"200"}:
        raise SystemExit(f"{server.label}: answers other than 200: {counts}")
    return counts.get("200", 0)


def _settled(server: Server) -> int:
    """`_answered` once the requests wrk left in flight when it stopped are done (the count holds)."""
    count = _answered(server)
    while True:
        time.sleep(0.5)
        count, before = _answered(server), count
        if count == before:
            return count


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
    """A running `wmark serve`, the detector token the load uses and an auditor token."""

    label: str
    workers: int
    proc: subprocess.Popen[bytes]
    url: str
    token: str
    auditor: str


def _start(config: RegistryConfig, label: str, workers: int, tmp: Path) -> Server:
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
        auditor = reg.tokens.create("auditor", f"bench-{label}-{workers}-metrics", actor="bench").token
    proc, url = _serve(env, workers, tmp / f"server-{label}-{workers}.log")
    server = Server(label, workers, proc, url, token, auditor)
    # warm-up, until a round is answered: a worker's first detection builds its tokenizer's
    # reading tables, seconds on a loaded machine, longer than a round (wrk then sees no answer)
    for _ in range(30):
        if _load(server, 2.0, 4 * workers, tmp, warm_up=True).requests:
            return server
    raise SystemExit(f"{label}, {workers} workers: no answer in 30 warm-up rounds")


def _table(rows: list[Row], baseline: Row) -> str:
    lines = [
        "| path | workers | connections | requests | req/s | p50 ms | p99 ms | CPU ms / request"
        " | req/s ÷ in-process |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        ratio = r.rps / baseline.rps
        workers = str(r.workers) if r.workers else "-"
        lines.append(
            f"| {r.name} | {workers} | {r.connections} | {r.requests} | {r.rps:.0f} | {r.p50_ms:.2f}"
            f" | {r.p99_ms:.2f} | {r.cpu_ms:.2f} | {ratio:.3f} |"
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
    parser.add_argument("--seconds", type=float, default=5.0, help="per service row and round")
    parser.add_argument("--requests", type=int, default=1000, help="in-process detections per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--texts", type=int, default=200, help="distinct 200-token texts")
    parser.add_argument("--write", action="store_true", help="write the table into BENCHMARKS.md")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("this benchmark's load generator is wrk: install it (Debian: apt-get install wrk)")

    from wmark.generator.models.embedded import embedded_tokenizer_json

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
            (tmp / "detect.lua").write_text(_WRK_LUA)
            (tmp / "bodies.txt").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
            audit_before, answered_before = {}, {}
            for label, config in configs.items():
                servers += [_start(config, label, workers, tmp) for workers in (1, 2)]
            for server in servers:
                answered_before[server.url] = _settled(server)
            for label, config in configs.items():
                with KeyRegistry.open(config) as reg:
                    audit_before[label] = reg.audit.count()
            baseline = Series("in-process `Detector.detect()`", 0, 1)
            series: list[tuple[Server, Series]] = []
            for server in servers:
                name = f"service, {server.label}"
                if server.workers == 1:
                    series.append((server, Series(name, server.workers, 1)))
                series.append((server, Series(name, server.workers, args.concurrency)))
            for round_no in range(args.rounds):  # rows alternate: drift of the machine hits all alike
                baseline.add(_in_process(detector, texts, args.requests))
                for server, row in series:
                    row.add(_load(server, args.seconds, row.connections, tmp))
                print(f"round {round_no + 1}/{args.rounds} done", file=sys.stderr)
            answered = dict.fromkeys(configs, 0)
            for server in servers:
                answered[server.label] += _settled(server) - answered_before[server.url]
        finally:
            for server in servers:
                _stop(server.proc)
        try:
            for label, config in configs.items():
                with KeyRegistry.open(config) as reg:
                    written = reg.audit.count() - audit_before[label]
                    if written != answered[label] or not reg.audit.verify().ok:
                        raise SystemExit(
                            f"{label}: {written} audit rows for {answered[label]} answers, or a broken chain"
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
({cpu}), shared with the load generator (wrk: one C thread, keep-alive connections, one request
in flight on each) and with other engineers' work (1-minute load average {load_before:.1f} at the
start), so the figures are noisy. {len(texts)} distinct texts of {n_tokens:.0f} Qwen2.5 tokens
(human-written documents found on the machine), one key.

All servers run from the start; each round measures every row in turn ({args.seconds:g} s each), so
drift of the machine hits all rows alike: req/s and p50 are medians over the rounds, p99 is the
worst round's. The in-process row calls `Detector.detect()` one text at a time ({args.requests} a
round). The 1-connection rows send one request at a time (latency without queueing); the
{args.concurrency}-connection rows measure throughput under load. "CPU ms / request" is the CPU
time (user + system, all threads) of the service's processes per answered request: the cost per
core, whatever the machine (the PostgreSQL server's own CPU is not in it). Each service request
pays HTTP + JSON, the bearer-token check (cached per process), its detection and its audit-log
row, group-committed with the rows of concurrent requests of the same worker under the
database write lock (SQLite: BEGIN IMMEDIATE, WAL; PostgreSQL: row lock on the chain head); in
that transaction, once per group, the token's revocation and the key set are re-checked. Every
answer was 200 (wrk saw no error and no other status; the server's request counter agrees),
and at the end each database's audit log held exactly one row per answered request and its chain
verified.

{table}

With {os.cpu_count()} cores, the 2-worker rows use both cores for the service, the 1-worker rows
at most one for Python (the GIL) plus what the database and the kernel do beside it; the
in-process row uses one core. The load generator and (PostgreSQL) the database server run on
the same cores.
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
