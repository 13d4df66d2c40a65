#!/usr/bin/env bash
# One GPU session's measurements for issue 34, in the order they matter, each stage under its own time limit and
# everything packed into OUT/session.tgz after each stage (a call that hits its limit keeps what was done; a
# device call brings back only a few files from OUT). Run from the repository root:
#
#   bash benchmarks/gpu/session.sh OUT DATA NANOGPT
#
# DATA: tinyshakespeare.txt and gpt2.tiktoken; NANOGPT: nanoGPT's files (see vs_nanogpt.sh). Environment: STAGES
# (default "b16 b16log10 pytest profile b32", ~9 minutes; also "plan" and "recipe"), WORK (/tmp/tinylm-gpu-session:
# under /tmp, so nothing lands in the checkout). Stages:
#   b16      vs_nanogpt.sh CASES=gpt2-124m-b16: tinylm fit beside nanoGPT's train.py, micro-batch 16 (~2 min)
#   b16log10 the same with both sides logging every 10 steps (LOG_EVERY=10, 140 steps; nanoGPT's own GPT-2 config
#            logs every 10): what a step's wait for its logged values costs (~2.5 min)
#   pytest   pytest -m gpu tests/gpu (~30 s)
#   profile  tinylm fit of the b16 case with benchmarks/gpu/profile_fit.py recording steps 12-14 (~1 min)
#   b32      vs_nanogpt.sh CASES=gpt2-124m-b32 (~2 min)
#   plan     benchmarks/gpu/plan_memory.py --configs 0,1,4 (~1.5 min)
#   recipe   vs_nanogpt.sh CASES=shakespeare-char (~4 min)
set -uo pipefail
usage="usage: bash benchmarks/gpu/session.sh OUT DATA NANOGPT"
out=${1:?$usage}
data=$(cd "${2:?$usage}" && pwd) || exit 2
nanogpt=$(cd "${3:?$usage}" && pwd) || exit 2
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
work=${WORK:-/tmp/tinylm-gpu-session}
stages=${STAGES:-b16 b16log10 pytest profile b32}
mkdir -p "$out" "$work" && out=$(cd "$out" && pwd)
cd "$repo" || exit 2

pack() {  # everything but caches, checkpoints and nanoGPT's copy: logs, metrics.csv, JSON, the profile's trace
  tar czf "$out/session.tgz" -C "$(dirname "$work")" --exclude=cache --exclude=inductor --exclude=nanogpt \
    --exclude=nanogpt-out --exclude='*.ckpt' "$(basename "$work")"
}
stage() {  # stage NAME SECONDS CMD...: run (a function of this script too), log, record the exit code, pack
  local name=$1 limit=$2
  shift 2
  echo "== $name"
  timeout --kill-after=10 "$limit" bash -c '"$@"' _ "$@" >"$work/$name.log" 2>&1
  echo "$name rc=$?" | tee -a "$work/stages.txt"
  pack
}
vs() {  # vs CASE [LOG_EVERY]: vs_nanogpt.sh for one case, its report and logs under WORK/CASE[-logN]
  local dir=$work/$1${2:+-log$2}
  WORK=$dir CASES=$1 LOG_EVERY=${2:-1} T_SIDE=${T_SIDE:-200} bash benchmarks/gpu/vs_nanogpt.sh "$dir/report" "$data" \
    "$nanogpt"
}
profiled() {  # the b16 command with the profiler recording micro-batches 97-120 (optimizer steps 12-14)
  local runs=$work/profile-runs
  mkdir -p "$runs" && cd "$runs" || return 1
  TINYLM_CACHE_DIR=$work/cache TORCHINDUCTOR_CACHE_DIR=$work/inductor WANDB_MODE=disabled \
    python3 -m tinylm fit --config "$repo/configs/gpt2-124m.yaml" --data.corpus "$data/tinyshakespeare.txt" \
    --data.tokenizer "tiktoken:$data/gpt2.tiktoken" --data.val_fraction 0.1 --data.batch_size 16 \
    --trainer.accumulate_grad_batches 8 --trainer.limit_val_batches 0 --run.wandb_project null \
    --samples.every_n_steps 0 --trainer.max_steps 16 --run.name profile --trainer.profiler \
    "{\"class_path\": \"benchmarks.gpu.profile_fit.StepsProfiler\", \"init_args\": {\"out\": \"$work/profile\", \"wait\": 95, \"active\": 24}}"
}

export work data nanogpt repo
export -f vs profiled
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv \
  >"$work/smi.txt" 2>&1
for s in $stages; do
  case $s in
    b16) stage b16 300 vs gpt2-124m-b16 ;;
    b16log10) stage b16log10 330 vs gpt2-124m-b16 10 ;;
    b32) stage b32 300 vs gpt2-124m-b32 ;;
    recipe) stage recipe 420 vs shakespeare-char ;;
    pytest) stage pytest 150 python3 -m pytest -m gpu tests/gpu -q -p no:cacheprovider ;;
    profile) stage profile 150 profiled ;;
    plan) stage plan 150 python3 benchmarks/gpu/plan_memory.py --configs 0,1,4 --json "$work/plan_memory.json" ;;
    *) echo "session.sh: unknown stage $s (b16, b16log10, b32, recipe, pytest, profile, plan)" >&2 ;;
  esac
done
cat "$work/stages.txt"
