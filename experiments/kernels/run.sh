#!/bin/bash
# What the device machine ran, from the repository root, with .kbuild (built by build.sh) carried:
#   bash experiments/kernels/run.sh
# Writes under $OUT: env.txt (nvidia-smi -q, versions; clocks/power after the run appended),
# clocks.csv (clock/power samples every 250 ms during the run), kbench.log, results.json,
# attn_torch.log, attn_torch.json, sustain.log, sustain.json.
# (run1/ and run2/ on the H200 were made by the version before --sustain was added: they have
# env_after.txt instead of the appended block, 500 ms clock samples, and no sustain files.)
set -u
OUT=${OUT:-/tmp/kbench-out}
mkdir -p "$OUT"
here=experiments/kernels
BIN=.kbuild/kbench
{
  date -u; uname -a; nvidia-smi; nvidia-smi -q
  echo "--- nvcc"; (nvcc --version || /usr/local/cuda/bin/nvcc --version) 2>&1
} >"$OUT/env.txt" 2>&1

# The binary links libcublas.so.13 dynamically: find it there if the loader does not.
if ldd "$BIN" | grep -q "not found"; then
  lib=$(find /usr/local /opt /usr/lib -name 'libcublas.so.13' 2>/dev/null | head -1)
  [ -n "$lib" ] && export LD_LIBRARY_PATH=$(dirname "$lib"):${LD_LIBRARY_PATH:-}
  echo "libcublas: ${lib:-none found}" | tee -a "$OUT/env.txt"
fi
if ! "$BIN" --help >/dev/null 2>&1; then
  echo "carried binary does not start; building here" | tee -a "$OUT/env.txt"
  NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc) sh $here/build.sh /tmp/kb >/dev/null && BIN=/tmp/kb/kbench
fi

R=clocks_event_reasons.active
nvidia-smi --query-gpu=$R --format=csv >/dev/null 2>&1 || R=clocks_throttle_reasons.active
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu,$R \
  --format=csv -lms 250 >"$OUT/clocks.csv" 2>&1 &
mon=$!

set -o pipefail
"$BIN" --out "$OUT/results.json" 2>&1 | tee "$OUT/kbench.log"
echo "kbench rc=$?"
PYTHONUNBUFFERED=1 timeout 200 python3 $here/attn_torch.py "$OUT/attn_torch.json" 2>&1 | tee "$OUT/attn_torch.log"
echo "attn_torch rc=$?"
# burst vs power-capped rate: 3 s idle, then 8 s of back-to-back 8192^3 GEMMs
"$BIN" --sustain 8 --out "$OUT/sustain.json" 2>&1 | tee "$OUT/sustain.log"
echo "sustain rc=$?"
kill $mon
{ echo "=== after the run"; nvidia-smi -q -d CLOCK,POWER,PERFORMANCE,TEMPERATURE; } >>"$OUT/env.txt" 2>&1
grep -E "TFLOP|GB/s|check|device|driver" "$OUT/kbench.log" | grep -E "square|fp32|warm|attn|HBM|FAIL|device|driver" | tail -30
sed -n "1,3p;\$p" "$OUT/sustain.log"
