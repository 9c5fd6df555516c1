#!/bin/bash
# Issue 29's prepared measurements in one command on a device machine (PyTorch there), from the
# repository root: `bash experiments/kernels/run_issue29.sh`. Writes under $OUT: env.txt,
# lstm_adam.json / .log (lstm_adam_torch.py) and bert_layer.json / .log (bert_layer_torch.py). Each
# script has its own time limit, so that one failing leaves the other's result. Run 6 (README.md) ran both, directly.
set -u
OUT=${OUT:-/tmp/issue29-out}
mkdir -p "$OUT"
here=experiments/kernels
{ date -u; uname -a; nvidia-smi; python3 -c "import torch; print('torch', torch.__version__, torch.version.cuda)"; } \
  >"$OUT/env.txt" 2>&1
PYTHONUNBUFFERED=1 timeout 240 python3 $here/lstm_adam_torch.py "$OUT/lstm_adam.json" >"$OUT/lstm_adam.log" 2>&1
echo "lstm_adam_torch rc=$?"
PYTHONUNBUFFERED=1 timeout 240 python3 $here/bert_layer_torch.py "$OUT/bert_layer.json" >"$OUT/bert_layer.log" 2>&1
echo "bert_layer_torch rc=$?"
tail -3 "$OUT/lstm_adam.log" "$OUT/bert_layer.log"
