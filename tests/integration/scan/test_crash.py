"""Crash safety of `wmark scan`, on the real command in a subprocess over 5,200 documents.

SIGKILL at seeded random moments (the whole process group: the driver and its worker
processes, as a power cut or the OOM killer would), `--resume` after each: the final output
holds every document exactly once and is byte-for-byte the output of an uninterrupted scan.
Ctrl-C (SIGINT to the group, as a terminal sends it) stops with exit code 130 and resumes the
same way.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from wmark.cli.main import app
from wmark.keys import KeyRegistry, RegistryConfig

N_FILES, PER_FILE = 10, 520  # 5,200 documents
# Long enough that a scan spans many commits (one per second at most) even on two free cores:
# about 10 s for the uninterrupted scan there, so every kill can land mid-scan.
WORDS = 800
KILLS = 6


@pytest.fixture()
def store(tmp_path: Path, word_tokenizer_json: bytes, planted) -> Path:
    tokenizer = tmp_path / "tokenizer.json"
    tokenizer.write_bytes(word_tokenizer_json)
    created = CliRunner().invoke(app, ["keys", "create", "crash", "--tokenizer", str(tokenizer)])
    assert created.exit_code == 0, created.output
    with KeyRegistry.open(RegistryConfig.from_env()) as registry:
        key = registry.material(created.stdout.strip())
    rng = np.random.default_rng(99)
    root = tmp_path / "store"
    root.mkdir()
    for f in range(N_FILES):
        lines = []
        for i in range(PER_FILE):
            ids = planted(key, WORDS, rng) if i % 97 == 0 else rng.integers(1, 501, size=WORDS)
            lines.append(json.dumps({"text": " ".join(f"w{t - 1}" for t in ids)}))
        (root / f"part{f:02d}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


def _command(root: Path, out: Path, workers: int = 2) -> list[str]:
    return [
        sys.executable, "-m", "wmark.cli", "scan", str(root), "--field", "text", "--out", str(out),
        "--workers", str(workers), "--batch-size", "64", "--resume", "--json",
    ]  # fmt: skip


def _committed(out: Path) -> int:
    manifest = out.with_name(out.name + ".manifest.json")
    return json.loads(manifest.read_text())["committed_rows"] if manifest.exists() else 0


def _start(command: list[str]) -> subprocess.Popen[bytes]:
    # A job started in the background by a non-interactive shell (`nohup ... &`, some CI runners)
    # ignores SIGINT, and its children inherit that; the Ctrl-C of a terminal reaches a program
    # that does not. Exec resets handled signals to their default, so start the scan from here
    # with SIGINT handled.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return subprocess.Popen(
            command, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
    finally:
        signal.signal(signal.SIGINT, previous)


def _wait_for_progress(proc: subprocess.Popen[bytes], out: Path, above: int, deadline: float) -> bool:
    while time.monotonic() < deadline and proc.poll() is None:
        if _committed(out) > above:
            return True
        time.sleep(0.02)
    return False


def _reference(root: Path, out: Path) -> tuple[bytes, float]:
    started = time.monotonic()
    done = subprocess.run(_command(root, out), capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode()
    return out.read_bytes(), time.monotonic() - started


def test_sigkill_at_random_moments_then_resume_gives_the_uninterrupted_output(store, tmp_path):
    expected, wall = _reference(store, tmp_path / "reference.jsonl")
    n = N_FILES * PER_FILE
    assert len(expected.splitlines()) == n
    rng = np.random.default_rng(20261130)
    out = tmp_path / "out.jsonl"
    mid_scan = 0
    for k in range(KILLS):
        before = _committed(out)
        proc = _start(_command(store, out))
        if k % 3 == 0:  # any moment from the start (start-up, listing, scanning, committing) while
            # the run still has at least half of its remaining work ahead of it
            time.sleep(rng.uniform(0.0, min(wall, 5.0) * (n - before) / n / 2))
        elif _wait_for_progress(proc, out, before, time.monotonic() + 120):  # while rows flow
            time.sleep(rng.uniform(0.0, 0.6))
        if proc.poll() is not None:
            _, stderr = proc.communicate()
            assert proc.returncode == 0, stderr.decode()
            break  # it finished before the kill
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        committed = _committed(out)
        assert committed >= before  # a kill never loses committed work
        mid_scan += 0 < committed < n
    assert mid_scan >= 3, f"only {mid_scan} kills landed mid-scan"  # 4 of the 6 wait for rows to flow

    final = subprocess.run(_command(store, out), capture_output=True, timeout=300)
    assert final.returncode == 0, final.stderr.decode()
    summary = json.loads(final.stdout)
    assert summary["documents"] == n and summary["resumed"] + summary["run_documents"] == n
    rows = [json.loads(line) for line in out.read_bytes().splitlines()]
    assert len({(r["source"], r["doc_id"]) for r in rows}) == len(rows) == n  # each exactly once
    assert out.read_bytes() == expected


def test_ctrl_c_leaves_a_resumable_output(store, tmp_path):
    expected, _ = _reference(store, tmp_path / "reference.jsonl")
    out = tmp_path / "out.jsonl"
    proc = _start(_command(store, out, workers=1))
    assert _wait_for_progress(proc, out, 0, time.monotonic() + 120), "the scan committed nothing"
    os.killpg(proc.pid, signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr.decode()
    assert "--resume" in stderr.decode()
    committed = _committed(out)
    assert 0 < committed < N_FILES * PER_FILE
    assert len(out.read_bytes().splitlines()) == committed  # everything written was committed
    final = subprocess.run(_command(store, out), capture_output=True, timeout=300)
    assert final.returncode == 0, final.stderr.decode()
    assert json.loads(final.stdout)["resumed"] == committed
    assert out.read_bytes() == expected


def _children() -> dict[int, list[int]]:
    found: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                # the command name may hold spaces and parentheses: the fields after the last ")"
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue  # gone meanwhile
            found.setdefault(ppid, []).append(int(entry.name))
    return found


def _descendants(pid: int) -> set[int]:
    children, found, todo = _children(), set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def _running(pid: int) -> bool:
    try:  # a zombie has exited: only its exit status waits to be collected
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="lists processes through /proc (Linux)")
def test_sigkill_of_the_driver_alone_ends_its_worker_processes(store, tmp_path):
    # Only the driver is killed (not its process group, which a terminal or systemd would kill
    # whole): the pool's workers, the fork server and the resource tracker must notice and exit.
    out = tmp_path / "out.jsonl"
    proc = _start(_command(store, out))
    left: set[int] = set()
    try:
        assert _wait_for_progress(proc, out, 0, time.monotonic() + 120), "the scan committed nothing"
        helpers = _descendants(proc.pid)
        assert len(helpers) >= 2, helpers  # at least the two workers (their fork server, a tracker)
        proc.kill()
        proc.wait()  # not communicate(): surviving workers would hold its stderr pipe open
        # Bounded by progress: poll until every helper has exited, with a generous bound for a busy
        # machine (they notice within a second or two).
        deadline = time.monotonic() + 60
        left = set(helpers)
        while left and time.monotonic() < deadline:
            left = {pid for pid in left if _running(pid)}
            time.sleep(0.1)
        assert not left, f"still running after the driver was killed: {sorted(left)}"
    finally:
        for pid in left:  # never leave a failed run's processes behind
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        assert proc.stderr is not None
        proc.stderr.close()
