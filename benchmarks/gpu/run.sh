#!/usr/bin/env bash
# tinylm's whole GPU check on one CUDA GPU, for anyone with one: the GPU tests (`pytest -m gpu`), then the
# benchmarks, and a report (report.md + report.json, the logs, the shakespeare-char loss curve) in OUT.
#
#   bash benchmarks/gpu/run.sh OUT [DATA]
#
# DATA: a folder holding tinyshakespeare.txt and gpt2.tiktoken (GPT-2's BPE ranks, so nothing is downloaded);
# default ../shared/data beside the checkout. Needs tinylm importable (installed, or the checkout on PYTHONPATH).
# Environment: PYTHON (default python3); WORK, a scratch folder for runs and caches (default OUT/work);
# STAGES, which stages to run (default: all, in this order): tests memory planmemory strategies syncs step124m loss124m
# tinystories tinystories256 shakespeare vsnanogpt. The first four check correctness and run side by side (the GPU has room); the timed ones run alone,
# one after the other. Each stage has a time limit (seconds: T_<stage>), so one that hangs costs only its own.
# vsnanogpt (benchmarks/gpu/vs_nanogpt.sh: `tinylm fit` beside nanoGPT's train.py, ~8 minutes; OUT/vs_nanogpt.json)
# needs NANOGPT, a folder with nanoGPT's files (default ../shared/reference/nanogpt beside the checkout); without
# one, the default leaves it out.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
out=${1:?usage: bash benchmarks/gpu/run.sh OUT [DATA]}
data=${2:-$repo/../shared/data}
py=${PYTHON:-python3}
[ -f "$data/tinyshakespeare.txt" ] && [ -f "$data/gpt2.tiktoken" ] \
  || { echo "run.sh: $data must hold tinyshakespeare.txt and gpt2.tiktoken (pass DATA)" >&2; exit 2; }
mkdir -p "$out" && out=$(cd "$out" && pwd)
data=$(cd "$data" && pwd)
work=${WORK:-$out/work}
mkdir -p "$work" && work=$(cd "$work" && pwd)
: >"$out/logs.txt"
nanogpt=${NANOGPT:-$repo/../shared/reference/nanogpt}
default_stages="tests memory planmemory strategies syncs step124m loss124m tinystories tinystories256 shakespeare"
[ -f "$nanogpt/train.py" ] && default_stages+=" vsnanogpt"
stages=${STAGES:-$default_stages}
T_vsnanogpt=${T_vsnanogpt:-900}  # its own cases have limits too (T_SIDE)
export WANDB_MODE=disabled TINYLM_CACHE_DIR=$work/cache PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
cd "$repo"
want() { [[ " $stages " == *" $1 "* ]]; }

# stage NAME: run the function NAME (below) under its time limit, log to WORK/NAME.log, record rc and seconds in WORK/NAME.rc
stage() {
  local name=$1
  local limit_var="T_$name" t0=$SECONDS rc
  echo "== $name: start $(date +%T), limit ${!limit_var:-600}s"
  timeout --kill-after=10 "${!limit_var:-600}" bash -c "$name" >"$work/$name.log" 2>&1
  rc=$?
  echo "$rc $((SECONDS - t0))" >"$work/$name.rc"
  echo "== $name: rc $rc in $((SECONDS - t0))s"
  tail -n 25 "$work/$name.log"
  { echo "===== $name (rc $rc, $((SECONDS - t0)) s)"; cat "$work/$name.log"; } >>"$out/logs.txt"  # kept if a later stage hangs
  "$py" "$here/report.py" "$work" "$out" >/dev/null 2>&1 || true  # the report so far, should a later stage not end
}

"$py" - <<'EOF' | tee "$work/env.txt"
import platform, subprocess, torch, lightning
print("gpu:", torch.cuda.get_device_name() if torch.cuda.is_available() else "none")
print("torch:", torch.__version__, "cuda:", torch.version.cuda, "lightning:", lightning.__version__,
      "python:", platform.python_version())
try:
    print("driver:", subprocess.run(["nvidia-smi", "--query-gpu=driver_version,memory.total,clocks.max.sm",
                                     "--format=csv,noheader"], capture_output=True, text=True).stdout.strip())
except OSError:
    pass
EOF

tests() { "$py" -m pytest -m gpu tests/gpu/test_gpu.py -q -rA -s -p no:cacheprovider --junitxml="$work/tests.xml"; }
memory() { "$py" benchmarks/gpu/memory.py --json "$work/memory.json"; }
planmemory() { "$py" benchmarks/gpu/plan_memory.py --json "$work/plan_memory.json"; }  # what plan misses on CUDA
strategies() {
  local s rc=0
  mkdir -p "$work/strategies" && cd "$work/strategies" || return 1
  cat >tiny.yaml <<EOF
seed_everything: 7
run: {name: tiny, wandb_project: null, checkpoint_every: 10}
samples: {every_n_steps: 0}
trainer: {max_steps: 20, val_check_interval: 10, log_every_n_steps: 5, enable_progress_bar: false, enable_model_summary: false}
model: {n_layer: 2, n_head: 2, n_embd: 64, warmup_steps: 2, decay_steps: 20}
data: {corpus: $data/tinyshakespeare.txt, tokenizer: char, block_size: 64, batch_size: 8, val_batches: 2}
EOF
  for s in ddp fsdp; do
    echo "-- $s: 10 steps, then resumed from last.ckpt to 20"
    "$py" -m tinylm fit --config tiny.yaml --run.name "$s" --trainer.strategy "$s" --trainer.devices 1 \
      --trainer.max_steps 10 && "$py" -m tinylm fit --config tiny.yaml --run.name "$s" --trainer.strategy "$s" \
      --trainer.devices 1 --ckpt_path last
    echo "$s rc $?" | tee -a status.txt
    [ -f "runs/$s/csv/metrics.csv" ] && tail -n 2 "runs/$s/csv/metrics.csv"
  done
}
syncs() {
  mkdir -p "$work/syncs" && cd "$work/syncs" || return 1
  SYNCS_JSON=$work/syncs.json PYTHONPATH="$here:${PYTHONPATH:-}" "$py" -m tinylm fit \
    --config "$repo/configs/shakespeare-char.yaml" --data.corpus "$data/tinyshakespeare.txt" \
    --run.wandb_project null --model.compile_model false --model.warmup_steps 10 --trainer.max_steps 80 \
    --trainer.val_check_interval 1000 \
    --samples.every_n_steps 0 --trainer.callbacks+=syncs.SyncCount
}
step124m() {
  "$py" benchmarks/bench_train_step.py --device cuda --compile --config configs/gpt2-124m.yaml \
    --corpus "$data/tinyshakespeare.txt" --tokenizer "tiktoken:$data/gpt2.tiktoken" --steps 30 --warmup 10 \
    --block 10 --passes bare --profile --json "$work/step124m.json"
}
loss124m() {  # the gain of the one-graph loss: the plain side runs the loss eagerly on the compiled logits, as tinylm did
  "$py" benchmarks/bench_train_step.py --device cuda --compile --plain-eager-loss --config configs/gpt2-124m.yaml \
    --corpus "$data/tinyshakespeare.txt" --tokenizer "tiktoken:$data/gpt2.tiktoken" --steps 30 --warmup 10 \
    --block 10 --passes bare --json "$work/loss124m.json"
}
tinystories() {
  "$py" benchmarks/bench_train_step.py --device cuda --compile --config configs/tinystories.yaml \
    --corpus "$data/tinyshakespeare.txt" --steps 120 --warmup 20 --block 20 --passes bare,full \
    --json "$work/tinystories.json"
}
tinystories256() {  # the same tokens per optimizer step in one micro-batch of 256: a quarter of the per-step Python
  "$py" benchmarks/bench_train_step.py --device cuda --compile --config configs/tinystories.yaml --batch-size 256 \
    --corpus "$data/tinyshakespeare.txt" --steps 40 --warmup 10 --block 10 --passes bare,full \
    --json "$work/tinystories256.json"
}
shakespeare() {
  mkdir -p "$work/shakespeare" && cd "$work/shakespeare" || return 1
  "$py" -m tinylm fit --config "$repo/configs/shakespeare-char.yaml" --data.corpus "$data/tinyshakespeare.txt" \
    --run.wandb_project null
  cp runs/shakespeare-char/csv/metrics.csv "$out/shakespeare-char-metrics.csv"
  "$py" -m tinylm plot runs/shakespeare-char --out "$out/shakespeare-char.png" --reference 1.4697
}
vsnanogpt() {  # writes OUT/vs_nanogpt.json and OUT/vs_nanogpt.md; its sides' limits: T_SIDE (vs_nanogpt.sh)
  WORK=$work/vsnanogpt bash "$here/vs_nanogpt.sh" "$out" "$data" "$nanogpt"
}

export py repo here data work out nanogpt
export -f tests memory planmemory strategies syncs step124m loss124m tinystories tinystories256 shakespeare vsnanogpt
# correctness first, side by side; then the timed stages alone
pids=()
for s in tests memory planmemory strategies syncs; do
  if want "$s"; then (stage "$s") & pids+=($!); fi
  [ "$s" = tests ] && sleep 2  # let pytest start first
done
[ ${#pids[@]} -gt 0 ] && wait "${pids[@]}"
for s in step124m loss124m tinystories tinystories256 shakespeare vsnanogpt; do
  want "$s" && (stage "$s")
done

"$py" benchmarks/gpu/report.py "$work" "$out"
