#!/usr/bin/env python3
"""`pipegrid sweep` end to end, against an uninterrupted run of the same sweep as the oracle:

1. a sweep killed with SIGKILL (its whole process group) while points run, then started again,
   ends with exactly one row per point, equal to the uninterrupted run's rows;
2. shards 0/3, 1/3, 2/3 merged with `pipegrid sweep merge` equal the uninterrupted run;
3. `sweep export --csv` and `--jsonl` print one line per point with the axis values;
4. a bad point is a recorded error (with the sweep file's position), not a stop.

Usage: sweep_runs.py PIPEGRID
"""
import csv
import io
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time

EXPERIMENT = """workload: {kind: chain, layers: 8, forward: 1ms, backward: 2ms, activation: 4MiB, parameters: 1MiB}
cluster:
  kind: switch
  count: 4
  device: {name: gpu, memory: 16GiB}
  bandwidth: 25GBps
  latency: 1us
strategy: {micro_batches: 8}
"""

SWEEP = """base: experiment.yaml
grid:
  strategy.micro_batches: {from: 2, to: 16, step: 2}
  cluster.count: [2, 4]
zip:
  cluster.bandwidth: [5GBps, 25GBps]
  cluster.latency: [1us, 2us]
skip: ["cluster.count == 2 and strategy.micro_batches > 12"]
"""
# 8 x 2 x 2 = 32 grid points; the skip drops micro_batches 14 and 16 with 2 devices: 2 x 2 = 4.
EXPECTED_POINTS = 32 - 4

# Fields of a run's result that are not a function of the inputs.
VOLATILE = {"planning_seconds", "wall_s"}


def rows(db):
    con = sqlite3.connect(db)
    out = {}
    for point, axes, status, message, it, tp, bubble, peak, result in con.execute(
            "SELECT point, axes, status, message, iteration_time_s, throughput_samples_per_s, bubble_ratio, "
            "peak_memory_bytes, result FROM points"):
        r = json.loads(result) if result else None
        if r:
            for k in VOLATILE:
                r.pop(k, None)
        assert point not in out, f"{db}: point {point} twice"
        out[point] = (json.loads(axes), status, message, it, tp, bubble, peak, r)
    count = con.execute("SELECT COUNT(*) FROM points").fetchone()[0]
    con.close()
    assert count == len(out), f"{db}: {count} rows for {len(out)} points"
    return out


def check(cond, what):
    if not cond:
        print(f"FAIL: {what}", file=sys.stderr)
        sys.exit(1)


def main():
    pipegrid = os.path.abspath(sys.argv[1])
    with tempfile.TemporaryDirectory(prefix="pipegrid-sweep-") as d:
        with open(os.path.join(d, "experiment.yaml"), "w") as f:
            f.write(EXPERIMENT)
        sweep = os.path.join(d, "sweep.yaml")
        with open(sweep, "w") as f:
            f.write(SWEEP)

        # The oracle: one uninterrupted run.
        full_db = os.path.join(d, "full.sqlite")
        r = subprocess.run([pipegrid, "sweep", sweep, "-j", "2", "--db", full_db], capture_output=True, text=True)
        check(r.returncode == 0, f"uninterrupted sweep: {r.returncode} {r.stderr}")
        full = rows(full_db)
        check(len(full) == EXPECTED_POINTS, f"{len(full)} points, expected {EXPECTED_POINTS}")
        check(all(v[1] in ("ok", "infeasible") for v in full.values()), "every point runs")
        # Independent check of one row: 2 devices (2 stages of 4 layers), 4 micro-batches, links of
        # 25 GB/s: the iteration is at least (m + p - 1)(T_F + T_B) = 5 x 4 x 3 ms = 60 ms.
        some = [v for v in full.values() if v[0]["cluster.count"] == 2 and v[0]["strategy.micro_batches"] == 4]
        check(len(some) == 2 and all(v[3] >= 0.060 for v in some), f"(m + p - 1)(T_F + T_B) bound: {some}")

        # A file the user had at DB.lock before the sweep is left as it was (only a lock the sweep
        # made is removed at its end; until 2026-12-05 it was deleted).
        kept_db = os.path.join(d, "kept.sqlite")
        with open(kept_db + ".lock", "w") as f:
            f.write("keep")
        r = subprocess.run([pipegrid, "sweep", sweep, "-j", "2", "--db", kept_db, "-q"], capture_output=True,
                           text=True)
        check(r.returncode == 0, f"sweep beside an existing lock file: {r.returncode} {r.stderr}")
        with open(kept_db + ".lock") as f:
            check(f.read() == "keep", "the existing DB.lock file is kept, unchanged")
        check(not os.path.exists(full_db + ".lock"), "the lock a sweep made is removed at its end")
        # A lock a killed sweep left (its words, "pipegrid sweep lock") goes at the next sweep's end (it
        # stayed for good until 2026-12-05).
        left_db = os.path.join(d, "left.sqlite")
        with open(left_db + ".lock", "w") as f:
            f.write("pipegrid sweep lock\n")
        r = subprocess.run([pipegrid, "sweep", sweep, "-j", "2", "--db", left_db, "-q"], capture_output=True,
                           text=True)
        check(r.returncode == 0 and not os.path.exists(left_db + ".lock"),
              f"a killed sweep's lock is removed by the next: {r.returncode} {r.stderr}")

        # One sweep process per database: a second one is refused while the first runs.
        slow_db = os.path.join(d, "locked.sqlite")
        first = subprocess.Popen([pipegrid, "sweep", sweep, "-j", "1", "--db", slow_db, "-q"])
        time.sleep(0.3)
        second = subprocess.run([pipegrid, "sweep", sweep, "--db", slow_db], capture_output=True, text=True)
        running = first.poll() is None
        first.kill()
        first.wait()
        if running:
            check(second.returncode == 2 and "another pipegrid sweep is running" in second.stderr, second.stderr)

        # 1. Killed with SIGKILL mid-run, then resumed.
        killed_db = os.path.join(d, "killed.sqlite")
        killed_rows = 0
        for attempt in range(5):
            if os.path.exists(killed_db):
                os.remove(killed_db)
            p = subprocess.Popen([pipegrid, "sweep", sweep, "-j", "2", "--db", killed_db, "-q"],
                                 start_new_session=True)
            deadline = time.time() + 60
            while time.time() < deadline and p.poll() is None:
                try:
                    con = sqlite3.connect(killed_db, timeout=1)
                    killed_rows = con.execute("SELECT COUNT(*) FROM points").fetchone()[0]
                    con.close()
                except sqlite3.Error:
                    killed_rows = 0
                if killed_rows >= 3:
                    os.killpg(p.pid, signal.SIGKILL)
                    break
                time.sleep(0.005)
            p.wait()
            if 0 < killed_rows < EXPECTED_POINTS and p.returncode == -signal.SIGKILL:
                break
        check(p.returncode == -signal.SIGKILL, "the sweep was killed")
        partial = rows(killed_db)
        check(0 < len(partial) < EXPECTED_POINTS, f"killed mid-run: {len(partial)} rows")
        # No point process outlives the sweep (they die with it).
        time.sleep(0.3)
        ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
        check(f"sweep point {sweep}" not in ps, "point processes died with the sweep")
        r = subprocess.run([pipegrid, "sweep", sweep, "-j", "2", "--db", killed_db], capture_output=True, text=True)
        check(r.returncode == 0, f"resumed sweep: {r.stderr}")
        check(f"{len(partial)} already in" in r.stderr, f"resume reports the finished points: {r.stderr}")
        resumed = rows(killed_db)
        check(set(resumed) == set(full), "the resumed sweep has every point once")
        for point, row in partial.items():
            check(resumed[point] == row, f"point {point} finished before the kill is unchanged")
        for point in full:
            check(resumed[point] == full[point], f"point {point}: resumed {resumed[point]} != {full[point]}")
        # Run again: nothing left to do, nothing added.
        r = subprocess.run([pipegrid, "sweep", sweep, "--db", killed_db], capture_output=True, text=True)
        check(r.returncode == 0 and "0 to run" in r.stderr, f"a finished sweep runs nothing: {r.stderr}")
        check(rows(killed_db) == resumed, "a finished sweep is unchanged by a rerun")

        # 2. Shards merged equal the single run.
        shard_dbs = []
        for i in range(3):
            r = subprocess.run([pipegrid, "sweep", sweep, "--shard", f"{i}/3", "-j", "2", "-q"],
                               capture_output=True, text=True)
            check(r.returncode == 0, f"shard {i}: {r.stderr}")
            shard_dbs.append(os.path.join(d, f"sweep.shard-{i}-of-3.sqlite"))
        sizes = [len(rows(s)) for s in shard_dbs]
        check(sum(sizes) == EXPECTED_POINTS and max(sizes) - min(sizes) <= 1, f"disjoint even shards: {sizes}")
        merged_db = os.path.join(d, "merged.sqlite")
        r = subprocess.run([pipegrid, "sweep", "merge", merged_db] + shard_dbs, capture_output=True, text=True)
        check(r.returncode == 0, f"merge: {r.stderr}")
        check(rows(merged_db) == full, "merged shards equal the single run")
        r = subprocess.run([pipegrid, "sweep", "merge", merged_db, full_db], capture_output=True, text=True)
        check(r.returncode == 0 and rows(merged_db) == full, "merging again adds nothing")

        # 3. Export.
        r = subprocess.run([pipegrid, "sweep", "export", full_db, "--csv"], capture_output=True, text=True)
        check(r.returncode == 0, r.stderr)
        table = list(csv.DictReader(io.StringIO(r.stdout)))
        check(len(table) == EXPECTED_POINTS, "one CSV row per point")
        check(set(table[0]) >= {"point", "strategy.micro_batches", "cluster.count", "cluster.bandwidth", "status",
                                "throughput_samples_per_s"}, f"CSV columns: {list(table[0])}")
        for row in table:
            check(float(row["iteration_time_s"]) == full[int(row["point"])][3], "CSV times are the database's")
            # The chosen plan: uniform, one stage per device (cluster.count of them), 1F1B.
            n = int(row["cluster.count"])
            check(row["planner"] == "partitioner" and row["partitioner"] == "uniform" and row["schedule"] == "1f1b",
                  f"CSV plan names: {row}")
            check(row["stages"] == str(n) and row["devices_per_stage"] == " ".join(["1"] * n) and
                  row["devices_used"] == str(n) and row["micro_batches"] == row["strategy.micro_batches"] and
                  row["micro_batch_size"] == "1" and row["chunks"] == "1", f"CSV plan figures: {row}")
        r = subprocess.run([pipegrid, "sweep", "export", full_db, "--jsonl"], capture_output=True, text=True)
        lines = [json.loads(line) for line in r.stdout.splitlines()]
        check(len(lines) == EXPECTED_POINTS and all(line["result"]["schema_version"] >= 1 for line in lines),
              "one JSON line per point, each with its run's result")

        # Plots (where python3 has matplotlib): a line plot, a heat map, a Pareto front; a bad axis is refused.
        probe = subprocess.run([pipegrid, "sweep", "plot", full_db, "-o", os.path.join(d, "probe.png"), "--kind", "pareto"],
                               capture_output=True, text=True)
        if "needs python3 with matplotlib" in probe.stderr:
            print("note: no python3 with matplotlib, sweep plot not checked")
        else:
            for kind, extra in (("line", ["--x", "strategy.micro_batches", "--lines", "cluster.count"]),
                                ("line", ["--x", "strategy.micro_batches", "--lines", "cluster.count,cluster.bandwidth",
                                          "--baseline", "strategy.micro_batches=2,cluster.count=2", "--title", "T",
                                          "--xlabel", "m", "--size", "6x4"]),
                                ("heatmap", ["--x", "strategy.micro_batches", "--y", "cluster.count"]),
                                ("pareto", [])):
                out = os.path.join(d, f"{kind}.png")
                r = subprocess.run([pipegrid, "sweep", "plot", full_db, "-o", out, "--kind", kind] + extra,
                                   capture_output=True, text=True)
                check(r.returncode == 0 and os.path.getsize(out) > 1000, f"sweep plot --kind {kind}: {r.stderr}")
            r = subprocess.run([pipegrid, "sweep", "plot", full_db, "-o", os.path.join(d, "x.png"), "--x", "nope"],
                               capture_output=True, text=True)
            check(r.returncode == 2 and r.stderr.startswith("pipegrid: sweep plot: --x nope is not an axis") and
                  r.stderr.rstrip().endswith("see `pipegrid sweep plot --help`"), f"a bad plot axis: {r.stderr}")

        # 4. A bad point is a recorded error located in the sweep file.
        bad = os.path.join(d, "bad.yaml")
        with open(bad, "w") as f:
            f.write("base: experiment.yaml\ngrid:\n  cluster.count: [2, lots]\n")
        r = subprocess.run([pipegrid, "sweep", bad, "-j", "2"], capture_output=True, text=True)
        # Every point runs and is recorded, but a sweep with failed points is no success (exit 2), and
        # says so even under -q; a re-run that runs nothing counts the errors in the database.
        check(r.returncode == 2 and "1 of 2 points failed" in r.stderr, f"a bad point: {r.returncode} {r.stderr}")
        b = rows(os.path.join(d, "bad.sqlite"))
        check(b[0][1] == "ok" and b[1][1] == "error", f"statuses {b}")
        check(b[1][2] == f"{bad}:3:22: cluster.count: expected a positive integer, got \"lots\"", b[1][2])
        r = subprocess.run([pipegrid, "sweep", bad, "-q"], capture_output=True, text=True)
        check(r.returncode == 2 and "1 of 2 points failed" in r.stderr, f"a re-run under -q: {r.returncode} {r.stderr}")
        r = subprocess.run([pipegrid, "sweep", bad], capture_output=True, text=True)
        check("0 to run" in r.stderr and "1 error," in r.stderr, f"a re-run counts the recorded error: {r.stderr}")
        check(not os.path.exists(os.path.join(d, "bad.sqlite.lock")), "the sweep left its .lock file behind")

        # A database of another sweep is refused.
        r = subprocess.run([pipegrid, "sweep", bad, "--db", full_db], capture_output=True, text=True)
        check(r.returncode == 2 and "holds another sweep" in r.stderr, r.stderr)

        # A database that is not a sweep's (an application's own `points` table) is refused before
        # anything is written to it: no table added, its journal mode unchanged; a file that is no
        # database at all likewise.
        other = os.path.join(d, "other.sqlite")
        c = sqlite3.connect(other)
        c.execute("CREATE TABLE points(x)")
        c.commit()
        c.close()
        for argv in ([pipegrid, "sweep", bad, "--db", other], [pipegrid, "sweep", "export", other]):
            r = subprocess.run(argv, capture_output=True, text=True)
            check(r.returncode == 2 and r.stderr == f'pipegrid: the results database "{other}" is not a pipegrid '
                  "sweep's: its table points has no column point (give another --db)\n", r.stderr)
        # merge takes no --db: its advice names its first argument instead.
        r = subprocess.run([pipegrid, "sweep", "merge", other, full_db], capture_output=True, text=True)
        check(r.returncode == 2 and "--db" not in r.stderr and "merge's first argument" in r.stderr, r.stderr)
        c = sqlite3.connect(other)
        tables = [t for (t,) in c.execute("SELECT name FROM sqlite_master")]
        mode = c.execute("PRAGMA journal_mode").fetchone()[0]
        c.close()
        check(tables == ["points"] and mode == "delete", f"the foreign database was changed: {tables}, {mode}")
        # A database of other tables only (an application's) gained the sweep's tables beside them
        # until 2026-12-05; refused now, untouched.
        mine = os.path.join(d, "mine.sqlite")
        c = sqlite3.connect(mine)
        c.execute("CREATE TABLE mine(x)")
        c.commit()
        c.close()
        r = subprocess.run([pipegrid, "sweep", bad, "--db", mine], capture_output=True, text=True)
        check(r.returncode == 2 and r.stderr == f'pipegrid: the results database "{mine}" is not a pipegrid '
              "sweep's: it holds the table mine and no meta or points table (give another --db; nothing was "
              "written)\n", r.stderr)
        c = sqlite3.connect(mine)
        tables = [t for (t,) in c.execute("SELECT name FROM sqlite_master")]
        c.close()
        check(tables == ["mine"], f"the database of other tables was changed: {tables}")

        # --slurm: never replaces a file that is not an earlier --slurm's script (it did until
        # 2026-12-05), writes its own again, and refuses more array tasks than points.
        user_script = os.path.join(d, "bad.slurm.sh")
        with open(user_script, "w") as f:
            f.write("my own script\n")
        r = subprocess.run([pipegrid, "sweep", bad, "--slurm", "2"], capture_output=True, text=True)
        with open(user_script) as f:
            kept = f.read()
        check(r.returncode == 2 and "is not a script of an earlier `pipegrid sweep --slurm`" in r.stderr and
              kept == "my own script\n" and not os.path.exists(os.path.join(d, "bad.slurm-merge.sh")),
              f"--slurm beside the user's script: {r.returncode} {r.stderr}")
        os.remove(user_script)
        for n in ("2", "1"):  # written, then written again over its own scripts
            r = subprocess.run([pipegrid, "sweep", bad, "--slurm", n], capture_output=True, text=True)
            with open(user_script) as f:
                check(r.returncode == 0 and f"#SBATCH --array=0-{int(n) - 1}\n" in f.read(),
                      f"--slurm {n} writes (again): {r.returncode} {r.stderr}")
        r = subprocess.run([pipegrid, "sweep", bad, "--slurm", "3"], capture_output=True, text=True)
        check(r.returncode == 2 and r.stderr == "pipegrid: --slurm 3: the sweep selects 2 points, so 1 of the "
              "array's tasks would run nothing; expected at most 2 (nothing was written)\n", r.stderr)
        junk = os.path.join(d, "junk.sqlite")
        with open(junk, "wb") as f:
            f.write(b"not a database" * 300)
        r = subprocess.run([pipegrid, "sweep", "export", junk], capture_output=True, text=True)
        check(r.returncode == 2 and "file is not a database" in r.stderr, r.stderr)
    print("ok")


if __name__ == "__main__":
    main()
