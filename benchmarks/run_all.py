"""Run every benchmarks/bench_*.py in sequence (`make bench`); `--quick` is forwarded to each."""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="forward --quick (small sizes) to every benchmark")
    parser.add_argument("only", nargs="*", help="run only benchmarks whose file name contains one of these")
    args = parser.parse_args(argv)
    here = Path(__file__).resolve().parent
    scripts = sorted(here.glob("bench_*.py"))
    if args.only:
        scripts = [s for s in scripts if any(word in s.name for word in args.only)]
    if not scripts:
        print("no benchmarks matched", file=sys.stderr)
        return 2
    failed: list[str] = []
    for script in scripts:
        cmd = [sys.executable, str(script)] + (["--quick"] if args.quick else [])
        print(f"=== {script.name} {'--quick' if args.quick else ''}".rstrip(), flush=True)
        t0 = time.perf_counter()
        rc = subprocess.run(cmd, cwd=here.parent).returncode
        print(f"=== {script.name}: exit {rc} after {time.perf_counter() - t0:.1f} s\n", flush=True)
        if rc != 0:
            failed.append(script.name)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
