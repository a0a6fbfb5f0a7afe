#!/usr/bin/env bash
# A lent GPU's whole check, in one call (docs/speed.md): the CUDA tests; the speed switches side by side with a profile,
# the floors and the roofline (speed_variants.py); speed.py's table, the speed goal's figure; the sentiment preset
# end to end, killed and resumed (full_size.py); GPT-2 774M (speed_variants.py --sizes). Each step has its own time
# limit, so that one that hangs leaves time for the rest; every figure lands in OUT (argument 1, else $OUT, else runs/gpu-check):
# card.txt, log.txt (every step's output), variants.md, speed.md, full_size.md, large.md. About 5 minutes on one H200.
#
#   bash benchmarks/gpu_check.sh runs/gpu-check
#   SKIP="tests full_size" bash benchmarks/gpu_check.sh runs/gpu-check-2     # a rerun of the other steps only
set -u
cd "$(dirname "$0")/.."
out=${1:-${OUT:-runs/gpu-check}}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=disabled
{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  nvidia-smi -q | grep -E "Product Name|CUDA Version|Driver Version" | head -3
  python3 -c "import sys, torch, transformers; print('python', sys.version.split()[0], 'torch', torch.__version__, \
'CUDA', torch.version.cuda, 'transformers', transformers.__version__)"
} > "$out/card.txt" 2>&1
cat "$out/card.txt"

step() {  # NAME LIMIT_S COMMAND...: runs unless NAME is in $SKIP, its output appended to log.txt
  local name=$1 limit=$2 start=$SECONDS
  shift 2
  case " ${SKIP:-} " in *" $name "*) echo "== $name: skipped"; return;; esac
  echo "== $name (limit ${limit} s)" | tee -a "$out/log.txt"
  timeout -k 10 "$limit" "$@" >> "$out/log.txt" 2>&1
  echo "== $name: exit $? after $((SECONDS - start)) s" | tee -a "$out/log.txt"
}

step tests 100 python3 -m pytest -q tests/e2e/test_gpu.py -p no:cacheprovider -p no:typeguard \
  -o addopts="--import-mode=importlib"
step variants 150 python3 benchmarks/speed_variants.py --device cuda --large none --out "$out/variants.md"
step speed 100 python3 benchmarks/speed.py --device cuda --sizes 124m --batch-size 512 --repeats 3 --out "$out/speed.md"
fs=$(mktemp -d)/full_size
step full_size 160 python3 benchmarks/full_size.py --out "$fs" --updates 12 --kill-after 8 --exact-updates 0 --rows 200000
[ -f "$fs/report.md" ] && cp "$fs/report.md" "$out/full_size.md"
step large 150 python3 benchmarks/speed_variants.py --device cuda --sizes --repeats 3 --out "$out/large.md"
grep -E "passed|failed|error" "$out/log.txt" | tail -5
echo "gpu_check.sh: done in $SECONDS s; $out holds $(ls "$out" | tr '\n' ' ')"
