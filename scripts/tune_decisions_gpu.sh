#!/usr/bin/env bash
# Issue #51's GPU done-when on one H100 (or H200; compare within one machine only):
#   1. before: triton vs deepgemm vs triton_or_deepgemm, whole layers, today's constants;
#   2. tune mixtral_8x7b and deepseek_v2_lite fp8_block: the gathered tiles, then every decision
#      (--decisions: row layout, contiguous GEMM kernel and Gluon variant, DeepGEMM's switch-over),
#      guarded by --max-regression; the tuned files stay in OUT/tune_<model>/configs;
#   3. after: the same sweep reading them (MOEBENCH_TRITON_CONFIG_DIR), then the comparisons.
# Nothing is installed into moebench/kernels/configs/: after reading the report, install with
#   moebench tune --install-from OUT/tune_<model>
#
# Usage: scripts/tune_decisions_gpu.sh OUT [--quick]
#   --quick: 256 and 4096 tokens, the small_fp8 tile space, deepseek_v2_lite only (minutes: checks the path)
set -euo pipefail
OUT=${1:?usage: $0 OUT [--quick]}
QUICK=${2:-}
TOKENS='[16,256,1024,2048,4096,16384]'
SPACE=vllm
MODELS=(mixtral_8x7b deepseek_v2_lite)
if [ "$QUICK" = "--quick" ]; then
  TOKENS='[256,4096]'
  SPACE=small_fp8
  MODELS=(deepseek_v2_lite)
fi
MODEL_LIST=$(IFS=,; echo "${MODELS[*]}")
LAYER=(backend=local quant=fp8_block reduction=experts overlap=none runner.timing=graph
       "model=$MODEL_LIST" "workload.tokens_per_rank=$TOKENS")

moebench sweep --out "$OUT/before" experts=triton,deepgemm,triton_or_deepgemm "${LAYER[@]}"

DIRS=()
for m in "${MODELS[@]}"; do
  # exit 1: a size regressed or none ran; the figures are in tune.json either way
  moebench tune experts=triton backend=local quant=fp8_block "model=$m" "workload.tokens_per_rank=$TOKENS" \
    --space "$SPACE" --decisions --max-regression 0.02 --out "$OUT/tune_$m" || echo "tune $m: exit $?"
  DIRS+=("$OUT/tune_$m/configs")
done

MOEBENCH_TRITON_CONFIG_DIR=$(IFS=:; echo "${DIRS[*]}") \
  moebench sweep --out "$OUT/after" experts=triton,deepgemm,triton_or_deepgemm "${LAYER[@]}"

moebench compare "$OUT/before" "$OUT/after" || true            # the tuned layer against today's
moebench compare "$OUT/after" --axis experts=deepgemm:triton || true  # triton / deepgemm after tuning
moebench compare "$OUT/before" --axis experts=deepgemm:triton || true # ... and before
moebench report "$OUT/after"
