#!/usr/bin/env python3
"""ctest tools/progress: `plan` and `run` show progress on a terminal and nothing elsewhere (issue 30:
a 32-board plan printed nothing for 20 s). PIPEGRID_PROGRESS_AFTER=0 shows the line at once (the
default waits 2 s), so a plan of some milliseconds is long enough.

Usage: progress_test.py PIPEGRID REPO_ROOT"""
import os
import select
import subprocess
import sys


def under_pty(argv, env):
    """Runs argv with a pseudo-terminal as its stdin, stdout and stderr; returns (exit code, output).
    The parent keeps its own copy of the terminal's slave side open, so the master never hangs up
    (EIO) while the child's last writes are still buffered: the output is drained after the child
    has exited, until the master has nothing left (a read after hang-up could lose the tail, which
    made this test fail once in CI under load)."""
    master, slave = os.openpty()
    child = subprocess.Popen(argv, env=env, stdin=slave, stdout=slave, stderr=slave, start_new_session=True)
    out = b""
    while True:
        ready, _, _ = select.select([master], [], [], 0.05)
        if ready:
            out += os.read(master, 65536)
        elif child.poll() is not None:
            break
    os.close(slave)
    os.close(master)
    return child.returncode, out.decode(errors="replace")


def main():
    pipegrid = os.path.abspath(sys.argv[1])
    experiment = os.path.join(os.path.abspath(sys.argv[2]), "experiments", "zoo", "gpt2-xl-dgx1.yaml")
    env = dict(os.environ, PIPEGRID_PROGRESS_AFTER="0")
    failures = []
    rc, out = under_pty([pipegrid, "plan", experiment], env)
    if rc != 0:
        failures.append(f"plan on a terminal: exit {rc}, output {out[-600:]!r}")
    if "pipegrid: planning with luo..." not in out:
        failures.append(f"plan on a terminal: no progress line in {out[:300]!r}")
    if "simulated throughput" not in out:
        failures.append(f"plan on a terminal: the report is missing its throughput line; output ends {out[-600:]!r}")
    if "\r\033[K" not in out:
        failures.append("plan on a terminal: the progress line is not cleared")
    r = subprocess.run([pipegrid, "plan", experiment], env=env, capture_output=True, text=True)
    if r.returncode != 0 or r.stderr != "":
        failures.append(f"plan into a pipe: exit {r.returncode}, stderr {r.stderr!r} (expected nothing)")
    for f in failures:
        print(f)
    print(f"progress: {len(failures)} problem(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
