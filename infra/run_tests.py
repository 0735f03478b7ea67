"""Runs the workspace's test binaries in two lanes at once, as `cargo test` would run them one
after the other: the binaries that run in memory (CPU-bound: the crates' unit tests, the
property tests, the chaos and bench crates) in one lane, those that drive the emulators (the
black-box suites, which mostly wait on moto) in the other; a suite that times a behaviour
against a bound runs alone, after both. Each binary runs as cargo runs it:
from its package's folder, with CARGO_MANIFEST_DIR and CARGO_PKG_NAME set.

Usage: cargo test --workspace --no-run --message-format=json-render-diagnostics \\
         | python3 infra/run_tests.py [TEST ARGS...]
TEST ARGS go to every binary (e.g. `--skip NAME`). Each binary's output is printed whole when
it ends, then a table of every binary's time; the exit status is 1 if any binary failed.
"""

import json
import os
import subprocess
import sys
import threading
import time

# The black-box suites run in memory too; which of them drive no emulator.
IN_MEMORY_SUITES = {"fuzz"}
# Suites that time a behaviour against a bound (tests/limits.rs: a quick task beside a slow
# service ends before the slow call would have): they run alone, after the lanes.
ALONE = {"limits"}
BLACK_BOX = "sas-blackbox"


def binaries(lines):
    """(lane, package name, target name, executable, package folder) of each test binary."""
    found = []
    for line in lines:
        line = line.strip()
        if not line.startswith("{"):
            continue
        msg = json.loads(line)
        if msg.get("reason") != "compiler-artifact" or not msg.get("executable"):
            continue
        if not msg.get("profile", {}).get("test"):
            continue
        target = msg["target"]
        package = os.path.dirname(msg["manifest_path"])
        # package_id: "path+file:///.../tests#sas-blackbox@0.1.0", or "...#0.1.0" when the
        # package is named as its folder.
        fragment = msg["package_id"].rsplit("#", 1)[-1]
        pkg_name = fragment.split("@")[0] if "@" in fragment else os.path.basename(package)
        emulator = pkg_name == BLACK_BOX and target["name"] not in IN_MEMORY_SUITES \
            and "test" in target["kind"]
        lane = "emulator" if emulator else "memory"
        if pkg_name == BLACK_BOX and target["name"] in ALONE:
            lane = "alone"
        found.append((lane, pkg_name, target["name"], msg["executable"], package))
    return found


def main():
    args = sys.argv[1:]
    found = binaries(sys.stdin)
    if not found:
        sys.exit("no test binaries on standard input (cargo test --no-run --message-format=json)")
    lanes = {"memory": [], "emulator": [], "alone": []}
    for b in found:
        lanes[b[0]].append(b)
    lock = threading.Lock()
    times = []
    failed = []

    def run_lane(queue):
        for _lane, pkg, target, exe, folder in queue:
            env = dict(os.environ, CARGO_MANIFEST_DIR=folder, CARGO_PKG_NAME=pkg)
            start = time.monotonic()
            proc = subprocess.run([exe, *args], cwd=folder, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT)
            took = time.monotonic() - start
            with lock:
                print(f"     Running {target} ({pkg}: {os.path.relpath(exe)}) in {took:.1f}s",
                      flush=True)
                sys.stdout.buffer.write(proc.stdout)
                sys.stdout.flush()
                times.append((took, pkg, target, proc.returncode))
                if proc.returncode != 0:
                    failed.append(f"{pkg} {target}")

    threads = [threading.Thread(target=run_lane, args=(lanes[k],)) for k in ("memory", "emulator")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    run_lane(lanes["alone"])
    print("==> test binaries by time (two lanes: in memory, on the emulators; then alone)")
    for took, pkg, target, code in sorted(times, reverse=True):
        print(f"    {took:7.1f}s  {pkg:<14} {target:<28} {'ok' if code == 0 else 'FAILED'}")
    if failed:
        print("failed: " + ", ".join(failed), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
