"""``python -m bench [name ...]``: run every benchmark module in ``bench/``, each in its own process within
``--budget`` seconds, and print each one's JSON object (also written to ``var/bench/results.json``)."""

from __future__ import annotations

import argparse
import json
import os
import pkgutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from bench.common import BASE_DIR, BENCH_VAR, machine, portal_environment, stop_process

NOT_BENCHMARKS = {"common", "__main__"}
# Run only when named: they take far longer than the run's budget, or the whole machine.
ON_DEMAND = {"guest_capacity"}
# Run order, cheapest first; modules not named here run afterwards in alphabetical order.
PREFERRED_ORDER = [
    "pages",
    "grading_overhead",
    "start_overhead",
    "api_cost",
    "console_bench",
    "console_churn",
    "warm_start",
]
# Seconds each is expected to need at most (measured on a loaded 2-core machine); modules not listed here run last,
# in what is left of the budget.
EXPECTED_SECONDS = {
    "pages": 80,
    "grading_overhead": 60,
    "start_overhead": 280,
    "api_cost": 120,
    "console_bench": 180,
    "console_churn": 120,
    "warm_start": 600,
}


def discover() -> list[str]:
    names = sorted(
        module.name
        for module in pkgutil.iter_modules([str(Path(__file__).parent)])
        if module.name not in NOT_BENCHMARKS and not module.name.startswith("_")
    )
    return sorted(
        names, key=lambda name: (PREFERRED_ORDER.index(name) if name in PREFERRED_ORDER else len(PREFERRED_ORDER), name)
    )


def stop_process_group(group: int) -> None:
    """End what remains of a benchmark's process group (its own session, so nothing else is in it)."""
    for sig, pause in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 0.0)):
        try:
            os.killpg(group, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + pause
        while time.monotonic() < deadline:
            try:
                os.killpg(group, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)


def last_json_object(text: str) -> dict | None:
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict):
                return value
    return None


def run_one(name: str, *, timeout: float) -> dict:
    started = time.monotonic()
    process = subprocess.Popen(
        # BENCH_SECONDS tells the module its share, so one that can shorten itself does so instead of being stopped.
        [sys.executable, "-m", f"bench.{name}"],
        cwd=BASE_DIR,
        env=portal_environment(BENCH_SECONDS=f"{timeout:.0f}"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        # SIGTERM first: the module unwinds (bench.common turns it into SystemExit) and stops its portal and
        # kubesim, which stops its guests; whatever is left of its process group goes after that.
        stop_process(process, timeout=30)
        stdout, stderr = process.communicate()
        stop_process_group(process.pid)
        return {
            "benchmark": name,
            "error": f"did not finish within its {timeout:.0f} s share of the budget",
            # What a module that prints its figures so far when stopped (start_overhead) had measured.
            "partial": last_json_object(stdout),
            "stderr_tail": stderr[-2000:],
            "seconds": round(time.monotonic() - started, 1),
        }
    stop_process_group(process.pid)  # a server it failed to stop must not serve the next benchmark's database
    result = last_json_object(stdout)
    if process.returncode != 0 or result is None:
        return {
            "benchmark": name,
            "error": f"exited with {process.returncode} without a JSON result"
            if result is None
            else f"exited with {process.returncode}",
            "partial": result,
            "stderr_tail": stderr[-2000:],
            "seconds": round(time.monotonic() - started, 1),
        }
    result.setdefault("benchmark", name)
    result["seconds"] = round(time.monotonic() - started, 1)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="benchmarks to run (default: all of them)")
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    parser.add_argument("--budget", type=float, default=600, help="seconds for the whole run (default 600)")
    args = parser.parse_args(argv)
    available = discover()
    if args.list:
        print("\n".join(available))
        return 0
    unknown = [name for name in args.names if name not in available]
    if unknown:
        parser.error(f"unknown benchmark(s): {', '.join(unknown)}; available: {', '.join(available)}")
    names = args.names or [name for name in available if name not in ON_DEMAND]

    deadline = time.monotonic() + args.budget
    results = []
    for index, name in enumerate(names):
        remaining = deadline - time.monotonic()
        # What the known modules still to come expect to need is kept back for them; others get what is left.
        reserved = sum(EXPECTED_SECONDS.get(later, 0) for later in names[index + 1 :])
        share = min(remaining, max(remaining - reserved, EXPECTED_SECONDS.get(name, 60)))
        if share < 5:
            result = {"benchmark": name, "error": "not run: the time budget was spent"}
        else:
            sys.stderr.write(f"[bench] {name} (up to {share:.0f} s)\n")
            result = run_one(name, timeout=share)
        results.append(result)
        print(json.dumps(result, default=str), flush=True)

    BENCH_VAR.mkdir(parents=True, exist_ok=True)
    (BENCH_VAR / "results.json").write_text(
        json.dumps({"machine": machine(), "results": results}, indent=2, default=str)
    )
    failed = [result["benchmark"] for result in results if "error" in result]
    if failed:
        sys.stderr.write(f"[bench] failed: {', '.join(failed)}\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
