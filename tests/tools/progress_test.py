#!/usr/bin/env python3
"""ctest tools/progress: `plan` and `run` show progress on a terminal and nothing elsewhere (issue 30:
a 32-board plan printed nothing for 20 s). PIPEGRID_PROGRESS_AFTER=0 shows the line at once (the
default waits 2 s), so a plan of some milliseconds is long enough.

Usage: progress_test.py PIPEGRID REPO_ROOT"""
import os
import pty
import subprocess
import sys


def under_pty(argv, env):
    pid, fd = pty.fork()
    if pid == 0:
        os.execve(argv[0], argv, env)
    out = b""
    while True:
        try:
            chunk = os.read(fd, 4096)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), out.decode(errors="replace")


def main():
    pipegrid = os.path.abspath(sys.argv[1])
    experiment = os.path.join(os.path.abspath(sys.argv[2]), "experiments", "zoo", "gpt2-xl-dgx1.yaml")
    env = dict(os.environ, PIPEGRID_PROGRESS_AFTER="0")
    failures = []
    rc, out = under_pty([pipegrid, "plan", experiment], env)
    if rc != 0 or "pipegrid: planning with luo..." not in out or "simulated throughput" not in out:
        failures.append(f"plan on a terminal: exit {rc}, no progress line in {out[:300]!r}")
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
