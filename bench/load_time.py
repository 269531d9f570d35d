"""Load time of the converted embedded pair, with and without transparent huge pages, side by side.

    WMARK_HOME=... .venv/bin/python bench/load_time.py [--rounds 3] [--threads 2]

Each round loads the pair (`load_pair("embedded", "embedded")`, what every `wmark generate`
does after the first run) in a fresh interpreter twice: once with `THP_MEM_ALLOC_ENABLE=1`
(what the CLI sets, `wmark.generator.cpu.huge_pages`) and once with it 0, alternating so that drift
of a shared machine hits both alike. Reported per setting: the median wall time of the load
itself (import excluded), of `import` of the generator, and the user and system CPU seconds of
the whole child. The models must be converted already (run `wmark demo` once).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys

_CHILD = """
import json, sys, time
start = time.perf_counter()
from wmark.generator.models.loading import load_pair
imported = time.perf_counter()
load_pair("embedded", "embedded", threads=int(sys.argv[1]))
print(json.dumps({"import_s": imported - start, "load_s": time.perf_counter() - imported}))
"""


def _run(huge_pages: bool, threads: int) -> dict[str, float]:
    env = dict(os.environ, THP_MEM_ALLOC_ENABLE="1" if huge_pages else "0")
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the CLI runs it
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(threads)], env=env, capture_output=True, text=True, check=True
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    row: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    row["user_s"] = after.ru_utime - before.ru_utime
    row["sys_s"] = after.ru_stime - before.ru_stime
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    runs: dict[bool, list[dict[str, float]]] = {True: [], False: []}
    for i in range(args.rounds):
        for huge in (False, True) if i % 2 == 0 else (True, False):
            runs[huge].append(_run(huge, args.threads))
            print(f"  round {i + 1}, huge pages {'on' if huge else 'off'}: {runs[huge][-1]}", flush=True)
    print()
    print(f"{args.rounds} alternating rounds, {args.threads} threads, medians")
    print()
    print("| huge pages | load s | import s | user CPU s | system CPU s |")
    print("|---|---:|---:|---:|---:|")
    for huge in (False, True):
        med = {k: statistics.median(r[k] for r in runs[huge]) for k in runs[huge][0]}
        print(
            f"| {'on' if huge else 'off'} | {med['load_s']:.1f} | {med['import_s']:.1f} | "
            f"{med['user_s']:.1f} | {med['sys_s']:.1f} |"
        )


if __name__ == "__main__":
    main()
