#!/usr/bin/env bash
# The laptop recipe run as a user runs it (`tinylm fit --config configs/shakespeare-char-cpu.yaml`) on a machine that
# other jobs keep busy: tinylm's CPU thread choice vs torch's default (`--run.threads 2` on a 2-core machine, what
# every run did before the choice existed). Runs alternate (choice, default, default, choice, ...) so the other
# jobs' load hits both alike; each line: wall s, user s, sys s (/usr/bin/time), load average before and after.
# The load is whatever the machine runs: start it beside your other jobs (or `yes > /dev/null &` per core).
#
#   bash benchmarks/bench_loaded_run.sh CORPUS [PAIRS] [STEPS]
#   bash benchmarks/bench_loaded_run.sh ../shared/data/tinyshakespeare.txt 1 300
set -euo pipefail
corpus=${1:?usage: bench_loaded_run.sh CORPUS [PAIRS] [STEPS]}
pairs=${2:-1}
steps=${3:-300}
tinylm=${TINYLM:-tinylm}
out=$(mktemp -d)
run() {  # run NAME EXTRA-ARGS...
    local name=$1; shift
    local before; before=$(cut -d' ' -f1 /proc/loadavg)
    /usr/bin/time -f "%e %U %S" -o "$out/$name.time" "$tinylm" fit --config configs/shakespeare-char-cpu.yaml \
        --data.corpus "$corpus" --trainer.max_steps "$steps" --trainer.default_root_dir "$out/$name" \
        --trainer.enable_progress_bar false "$@" > "$out/$name.log" 2>&1
    local loss; loss=$(grep -o 'val/loss final [0-9.]*' "$out/$name.log" | awk '{print $3}')
    echo "$name wall/user/sys $(cat "$out/$name.time") val/loss $loss load $before -> $(cut -d' ' -f1 /proc/loadavg)"
}
for ((i = 1; i <= pairs; i++)); do
    if ((i % 2)); then run "choice-$i"; run "default-$i" --run.threads 2
    else run "default-$i" --run.threads 2; run "choice-$i"; fi
done
echo "logs and runs: $out"
