#!/usr/bin/env bash
# `tinylm fit` beside nanoGPT's own train.py on one GPU, one after the other, same model shape and same token ids:
#   gpt2-124m-b16   GPT-2 124M, micro-batch 16 x 1024, accumulation 8  (131,072 tokens per optimizer step)
#   gpt2-124m-b32   the same at micro-batch 32, accumulation 4           (the same tokens per step)
#   shakespeare-char  nanoGPT's char recipe on each side: config/train_shakespeare_char.py and
#                   configs/shakespeare-char.yaml (wall time of the whole process, best val/loss)
# bf16 and torch.compile on both sides, as each side's recipe says. Writes OUT/vs_nanogpt.json (per case: case, gpu,
# nanogpt_tokens_per_s, tinylm_tokens_per_s, ratio, tinylm_mfu, walls, best vals) and OUT/vs_nanogpt.md.
#
#   bash benchmarks/gpu/vs_nanogpt.sh OUT DATA NANOGPT [--cpu-smoke]
#
# DATA: a folder with tinyshakespeare.txt and gpt2.tiktoken (../shared/data). NANOGPT: a folder with nanoGPT's
# train.py, model.py, configurator.py and config/ (../shared/reference/nanogpt); it is copied, never written.
# Both read tinylm's prepared token ids (`tinylm prepare`, 90/10 split as nanoGPT's prepare.py): GPT-2's BPE from
# gpt2.tiktoken for the 124M cases, characters for the recipe (the same 1,003,854 / 111,540 ids as nanoGPT's own
# prepare.py). tinylm runs as `$PYTHON -m tinylm fit --config configs/...` (the user's command, W&B off, samples
# off in the 124M cases), nanoGPT as `python train.py ...` from its folder.
# --cpu-smoke (or VS_SMOKE=1): both sides on the CPU at a tiny shape for 4 steps, fp32, no compile: checks the
# commands, the parsing and the JSON without a GPU (9 minutes on 2 cores at a load average of 10).
# Environment: PYTHON (python3); WORK (OUT/work); CASES (all three, in the order above); STEPS_124M (30 optimizer
# steps); RECIPE_STEPS (2500 of the recipe's 5000, the learning rate still decaying to 5000 as in the recipe: the
# best val/loss falls near step 2000, and the whole recipe on both sides would take ~5.5 of the 8 minutes; 5000 runs
# it whole); SKIP (steps left out of the rates: 10); T_SIDE (seconds each side may run: 400); LOG_EVERY (steps
# between logged steps in the 124M cases, on both sides: nanoGPT's --log_interval, tinylm's
# --trainer.log_every_n_steps; 1, as gpt2-124m.yaml logs; nanoGPT's own config/train_gpt2.py logs every 10: with
# LOG_EVERY > 1 the 124M cases run SKIP + 13 x LOG_EVERY steps unless STEPS_124M says, so that tinylm's rate window
# of 10 logged intervals starts after SKIP, and nanoGPT's rate comes from the times its lines arrive).
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
usage="usage: bash benchmarks/gpu/vs_nanogpt.sh OUT DATA NANOGPT [--cpu-smoke]"
out=${1:?$usage}
data=${2:?$usage}
nanogpt=${3:?$usage}
smoke=${VS_SMOKE:-0}
[ "${4:-}" = --cpu-smoke ] && smoke=1
py=${PYTHON:-python3}
[ -f "$data/tinyshakespeare.txt" ] && [ -f "$data/gpt2.tiktoken" ] \
  || { echo "vs_nanogpt.sh: DATA $data must hold tinyshakespeare.txt and gpt2.tiktoken" >&2; exit 2; }
[ -f "$nanogpt/train.py" ] && [ -f "$nanogpt/config/train_shakespeare_char.py" ] \
  || { echo "vs_nanogpt.sh: NANOGPT $nanogpt must hold nanoGPT's train.py and config/" >&2; exit 2; }
mkdir -p "$out" && out=$(cd "$out" && pwd)
data=$(cd "$data" && pwd)
work=${WORK:-$out/work}
mkdir -p "$work" && work=$(cd "$work" && pwd)
cases=${CASES:-gpt2-124m-b16 gpt2-124m-b32 shakespeare-char}
log_every=${LOG_EVERY:-1}
skip=${SKIP:-10}
steps=${STEPS_124M:-$((log_every > 1 ? skip + 13 * log_every : 30))}
recipe_steps=${RECIPE_STEPS:-2500}
limit=${T_SIDE:-400}
export WANDB_MODE=disabled TINYLM_CACHE_DIR=$work/cache PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export TORCHINDUCTOR_CACHE_DIR=$work/inductor  # shared by both sides, as on a user's machine

# the sides' arguments beyond the shape (nanoGPT's `--key=value`, tinylm's `--section.key value`)
if [ "$smoke" = 1 ]; then
  steps=$((log_every > 1 ? 1 + 3 * log_every : 4)) recipe_steps=4 skip=${SKIP:-1} window=0
  nano_dev=(--device=cpu --compile=False --dtype=float32 --n_layer=2 --n_head=2 --n_embd=64)
  tiny_dev=(--model.n_layer 2 --model.n_head 2 --model.n_embd 64 --model.compile_model false
            --trainer.precision 32-true --data.num_workers 0 --model.warmup_steps 1)
  block=64 b16=4 b32=8 acc16=2 acc32=1
  nano_recipe=(--block_size=64 --batch_size=8 --eval_interval=2 --eval_iters=2 --log_interval=1 --warmup_iters=1)
  tiny_recipe=(--data.block_size 64 --data.batch_size 8 --trainer.val_check_interval 2 --data.val_batches 2
               --trainer.log_every_n_steps 1 --samples.every_n_steps 0)
  decay=4
else
  nano_dev=() tiny_dev=() nano_recipe=() tiny_recipe=()
  block=1024 b16=16 b32=32 acc16=8 acc32=4 decay=5000 window=10
fi

"$py" -c 'import torch; print(torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu")' >"$work/gpu.txt"
echo "$cases" >"$work/cases.txt"
echo "== $(cat "$work/gpu.txt"); cases: $cases; 124M steps $steps (logged every $log_every), recipe steps" \
  "$recipe_steps, skip $skip"

# a copy of nanoGPT whose data/ holds tinylm's prepared ids
rm -rf "$work/nanogpt" && mkdir -p "$work/nanogpt" && cp -r "$nanogpt"/. "$work/nanogpt/" && rm -rf "$work/nanogpt/data"
# prepared DIR: tinylm prepare with a fit config's data section, then give nanoGPT that folder's ids as dataset DIR
prepared() {
  local name=$1 meta=$2 dir
  shift 2
  dir=$(cd "$repo" && "$py" -m tinylm prepare "$@" | awk '$1 == "dataset" {print $2}')
  [ -n "$dir" ] || { echo "vs_nanogpt.sh: tinylm prepare $* made no dataset" >&2; return 1; }
  "$py" "$here/vs_nanogpt.py" link "$dir" "$work/nanogpt/data/$name" $meta
}
gpt2_data=(--data.corpus "$data/tinyshakespeare.txt" --data.tokenizer "tiktoken:$data/gpt2.tiktoken"
           --data.val_fraction 0.1)
char_data=(--data.corpus "$data/tinyshakespeare.txt")
if [[ " $cases " == *" gpt2-124m"* ]]; then
  prepared shakespeare_gpt2 "" --config configs/gpt2-124m.yaml "${gpt2_data[@]}" || exit 1
fi
if [[ " $cases " == *" shakespeare-char"* ]]; then
  prepared shakespeare_char --meta --config configs/shakespeare-char.yaml "${char_data[@]}" || exit 1
fi

# side CASE nanogpt|tinylm CMD...: run CMD in the case's folder under the time limit, log, record "rc seconds"
side() {
  local case=$1 name=$2 t0 rc
  shift 2
  t0=$EPOCHREALTIME
  echo "-- $case / $name: $*"
  timeout --kill-after=10 "$limit" "$@" >"$work/$case/$name.log" 2>&1
  rc=$?
  awk -v rc=$rc -v t0="$t0" -v t1="$EPOCHREALTIME" 'BEGIN {printf "%d %.1f\n", rc, t1 - t0}' >"$work/$case/$name.rc"
  echo "   rc $rc in $(cut -d' ' -f2 "$work/$case/$name.rc") s"
  [ $rc = 0 ] || tail -n 15 "$work/$case/$name.log"
}
gpt2() {  # gpt2 CASE MICRO_BATCH ACCUMULATION
  local case=$1 mb=$2 acc=$3
  # (each line of nanoGPT's output stamped with the time it arrived: its rate when it logs every N > 1 iterations)
  side "$case" nanogpt bash -c 'cd "$0" && set -o pipefail && "$1" -u train.py "${@:3}" 2>&1 | "$1" "$2" stamp' \
    "$work/nanogpt" "$py" "$here/vs_nanogpt.py" \
    --dataset=shakespeare_gpt2 --batch_size="$mb" --block_size="$block" --gradient_accumulation_steps="$acc" \
    --bias=True --compile=True --dtype=bfloat16 --max_iters="$steps" --eval_interval=100000 --eval_iters=1 \
    --log_interval="$log_every" --out_dir="$work/$case/nanogpt-out" "${nano_dev[@]}"
  side "$case" tinylm "$py" -m tinylm fit --config "$repo/configs/gpt2-124m.yaml" "${gpt2_data[@]}" \
    --data.block_size "$block" --data.batch_size "$mb" --trainer.accumulate_grad_batches "$acc" \
    --trainer.max_steps "$steps" --trainer.limit_val_batches 0 --run.wandb_project null --samples.every_n_steps 0 \
    --trainer.log_every_n_steps "$log_every" --run.name "$case" "${tiny_dev[@]}"
}
recipe() {  # recipe CASE: nanoGPT's shakespeare-char recipe on each side, RECIPE_STEPS of its 5000
  local case=$1
  side "$case" nanogpt bash -c 'cd "$0" && exec "$1" train.py config/train_shakespeare_char.py "${@:2}"' \
    "$work/nanogpt" "$py" --max_iters="$recipe_steps" --lr_decay_iters="$decay" \
    --out_dir="$work/$case/nanogpt-out" "${nano_dev[@]}" "${nano_recipe[@]}"
  side "$case" tinylm "$py" -m tinylm fit --config "$repo/configs/shakespeare-char.yaml" "${char_data[@]}" \
    --run.wandb_project null --trainer.max_steps "$recipe_steps" --model.decay_steps "$decay" --run.name "$case" \
    "${tiny_dev[@]}" "${tiny_recipe[@]}"
}

for case in $cases; do
  rm -rf "${work:?}/$case" && mkdir -p "$work/$case"
  cd "$work/$case" || exit 1
  case $case in
    gpt2-124m-b16) gpt2 "$case" "$b16" "$acc16" ;;
    gpt2-124m-b32) gpt2 "$case" "$b32" "$acc32" ;;
    shakespeare-char) recipe "$case" ;;
    *) echo "vs_nanogpt.sh: unknown case $case (gpt2-124m-b16, gpt2-124m-b32, shakespeare-char)" >&2; exit 2 ;;
  esac
  "$py" "$here/vs_nanogpt.py" report "$work" "$out" --skip "$skip" --window "$window" --log-every "$log_every" \
    >/dev/null  # the report so far
done
cd "$repo" && "$py" "$here/vs_nanogpt.py" report "$work" "$out" --skip "$skip" --window "$window" \
  --log-every "$log_every"
