#!/bin/sh
# Builds kbench for Hopper (sm_90 machine code plus compute_90 PTX) into $1 (default ../../.kbuild).
set -e
here=$(cd "$(dirname "$0")" && pwd)
outdir=${1:-$here/../../.kbuild}
mkdir -p "$outdir"
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
"$NVCC" -O3 -std=c++17 -lineinfo -Xptxas -v \
  -gencode=arch=compute_90,code=sm_90 -gencode=arch=compute_90,code=compute_90 \
  -o "$outdir/kbench" "$here/kbench.cu" -lcublas
