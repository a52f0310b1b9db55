#!/usr/bin/env bash
# Issue #51's GPU done-when on one H100 (or H200; tune, verify and compare on one machine kind):
#   before        today's constants: triton vs deepgemm, whole layers, mixtral_8x7b and
#                 deepseek_v2_lite fp8_block at the issue's sizes (the default timing; both
#                 reductions, so that each side's fastest is read)
#   tune MODEL    the gathered tiles, then every decision (--decisions: row layout, contiguous
#                 GEMM kernel and Gluon variant, DeepGEMM's switch-over) for one model, guarded by
#                 --max-regression; the tuned files stay in OUT/tune_MODEL/configs. A rerun with the
#                 same OUT resumes: tiles and decisions timed before are reused
#   after         in one call: the same sweep reading the tuned files (MOEBENCH_TRITON_CONFIG_DIR),
#                 then qwen3_30b_a3b and DeepSeek-V3's EP-8 share with and without them (the
#                 tuned files must leave them no slower), then the comparisons and the report
#   all           every stage in turn (a machine without a 10-minute limit per call)
# Each stage is sized for one 10-minute device call on one H100 (a stage cut by the limit resumes
# where it stopped when run again with the same OUT). Nothing is installed into
# moebench/kernels/configs/: after reading the report, `moebench tune --install-from OUT/tune_MODEL`.
#
# Usage: [I51_MODELS="m1 m2 ..."] scripts/tune_decisions_gpu.sh OUT before|tune MODEL|after|all [--quick]
#   --quick: 256 and 4096 tokens, the small_fp8 tile space, deepseek_v2_lite only (checks the path)
set -euo pipefail
OUT=${1:?usage: $0 OUT before|tune MODEL|after|all [--quick]}
STAGE=${2:?usage: $0 OUT before|tune MODEL|after|all [--quick]}
shift 2
MODEL=
if [ "$STAGE" = "tune" ]; then
  MODEL=${1:?usage: $0 OUT tune MODEL [--quick]}
  shift
fi
QUICK=${1:-}
TOKENS='[16,256,1024,2048,4096,16384]'
SPACE=vllm
# I51_MODELS="mixtral_8x7b deepseek_v2_lite hf:tests/fixtures/hf_configs/glm4_moe": the models
# tuned and swept (a model from its Hugging Face config too; the issue asks for one)
read -r -a MODELS <<< "${I51_MODELS:-mixtral_8x7b deepseek_v2_lite}"
if [ "$QUICK" = "--quick" ]; then
  TOKENS='[256,4096]'
  SPACE=small_fp8
  MODELS=(deepseek_v2_lite)
fi
MODEL_LIST=$(IFS=,; echo "${MODELS[*]}")
# backend.simulate_ep=1: the whole layer, the shape `moebench tune` tunes (the default sweep's
# cuda section sets simulate_ep=8, DeepSeek-V3's EP-8 share: another layer shape, whose tuned
# file these tunes do not write)
LAYER=(backend=local backend.simulate_ep=1 quant=fp8_block reduction=experts,finalize overlap=none
       "workload.tokens_per_rank=$TOKENS")
# the models the tuned files must not slow down: every size, triton experts only (each names its
# simulate_ep below)
OTHERS=(backend=local quant=fp8_block experts=triton reduction=experts overlap=none
        "workload.tokens_per_rank=$TOKENS")

tune_dir() {
  # OUT/tune_<model>, the model's ':' and '/' as '_' (hf:path/to/config)
  local m=${1//[:\/]/_}
  echo "$OUT/tune_$m"
}

tuned_dirs() {
  local dirs=() m d
  for m in "${MODELS[@]}"; do
    d=$(tune_dir "$m")
    [ -d "$d/configs" ] && dirs+=("$d/configs")
  done
  (IFS=:; echo "${dirs[*]}")
}

before() {
  moebench sweep --out "$OUT/before" experts=triton,deepgemm,triton_or_deepgemm "model=$MODEL_LIST" "${LAYER[@]}"
}

tune() {
  # exit 1: a size regressed or none ran; the figures are in tune.json either way
  moebench tune experts=triton backend=local quant=fp8_block "model=$1" "workload.tokens_per_rank=$TOKENS" \
    --space "$SPACE" --decisions --max-regression 0.02 --out "$(tune_dir "$1")" || echo "tune $1: exit $?"
}

tuned_rows() {
  # what each triton row ran and which tuned files it read: a tune that did not apply shows here
  python3 - "$1" <<'PY'
import sys
from moebench.results.store import RunStore
df = RunStore(sys.argv[1]).load()
ok = df[(df.status == "ok") & df.experts.isin(["triton", "triton_or_deepgemm", "triton_batched"])]
cols = [c for c in ("model", "experts", "reduction", "tokens_per_rank", "simulate_ep", "row_layout_used",
                    "contiguous_gemm_used", "tuned_files", "latency_us_median") if c in ok.columns]
print(ok[cols].to_string(index=False))
if "tuned_files" in ok.columns and not ok.tuned_files.fillna("").str.len().all():
    print("after: some triton rows read no tuned file (their layer's shape has none): see tuned_files", file=sys.stderr)
PY
}

after() {
  local dirs
  dirs=$(tuned_dirs)
  [ -n "$dirs" ] || { echo "after: no OUT/tune_*/configs (run the tune stage first)" >&2; exit 2; }
  MOEBENCH_TRITON_CONFIG_DIR=$dirs \
    moebench sweep --out "$OUT/after" experts=triton,deepgemm,triton_or_deepgemm "model=$MODEL_LIST" "${LAYER[@]}"
  local other
  for other in "model=qwen3_30b_a3b backend.simulate_ep=1" "model=deepseek_v3 backend.simulate_ep=8"; do
    local name=${other%% *}; name=${name#model=}
    # shellcheck disable=SC2086 (the overrides of one model, split on spaces)
    moebench sweep --out "$OUT/${name}_today" $other "${OTHERS[@]}"
    # shellcheck disable=SC2086
    MOEBENCH_TRITON_CONFIG_DIR=$dirs moebench sweep --out "$OUT/${name}_tuned" $other "${OTHERS[@]}"
  done
  tuned_rows "$OUT/after" || echo "after: could not read $OUT/after's rows" >&2
  moebench compare "$OUT/after" --axis experts=deepgemm:triton || true         # triton / deepgemm after tuning
  if [ -d "$OUT/before" ]; then
    moebench compare "$OUT/before" "$OUT/after" || true                        # the tuned layer against today's
    moebench compare "$OUT/before" --axis experts=deepgemm:triton || true      # ... and triton / deepgemm before
  else
    echo "after: no $OUT/before (the before stage did not run in this OUT): its comparisons left out" >&2
  fi
  moebench compare "$OUT/qwen3_30b_a3b_today" "$OUT/qwen3_30b_a3b_tuned" || true  # no slower elsewhere
  moebench compare "$OUT/deepseek_v3_today" "$OUT/deepseek_v3_tuned" || true
  moebench report "$OUT/after"
}

case "$STAGE" in
  before) before ;;
  tune) tune "$MODEL" ;;
  after) after ;;
  all)
    before
    for m in "${MODELS[@]}"; do tune "$m"; done
    after
    ;;
  *) echo "unknown stage '$STAGE': before, tune MODEL, after or all" >&2; exit 2 ;;
esac
