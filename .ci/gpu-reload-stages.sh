#!/bin/bash
# The GPU machine's job for where a budget change's reload spends its time (docs/engine.md, "Where a reload's time
# goes"), in as many calls as it takes:
#
#   run: bash .ci/gpu-reload-stages.sh        (device tool, kind nvidia-h200, timeout 600, `.gpu` carried)
#
# Steps, each skipped once done on this machine (state in /tmp/igi-rs, kept while the machine stays warm):
#   the patched CUDA build while the synthetic models are written; then, detached, per model in MODELS:
#   `python -m igi_sdk.bench.reload_stages` at the daemon's budgets 4096 -> 2048 -> 6144 MiB, 3 rounds, 4 sessions
#   of 900 tokens, 16 threads, planning on an empty dry-run cache, the first read and load cold. A call that ends with
#   STILL RUNNING is repeated at once (the machine is given back after 30 s idle); the bench goes on meanwhile.
# Results come back as $OUT/rs.tgz (logs, one JSON per model); each finished model's summary is printed.
# Env: LIMIT (s from the call's start, default 540), MODELS (default "llama_8b qwen3_30b_a3b"; a later call may name
#   others: each model runs once per machine), WRITE (models written during the build, default MODELS), COLD (default
#   1: --cold), PROFILE (default reference:h200: the H200's recorded profile, with this build's prefetch ABI), ARGS.
T0=$(date +%s); LIMIT=${LIMIT:-540}; MODELS=${MODELS:-llama_8b qwen3_30b_a3b}; PROFILE=${PROFILE:-reference:h200}
source .ci/gpu-job.sh; gpu_job rs rs.tgz; gpu_build ${WRITE:-$MODELS}
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv > $L/nvidia-smi.txt 2>&1
todo=""
for m in $MODELS; do [ -f $W/started-$m ] || { todo="$todo $m"; touch $W/started-$m; }; done
if [ -n "$todo" ]; then  # one detached runner per call, for the models no call started yet
  COLD_ARG=$([ "${COLD:-1}" = 1 ] && echo --cold)
  gpu_snapshot
  setsid nohup bash -c "cd $SRC; for m in $todo; do
      python3 -m igi_sdk.bench.reload_stages --model \$m --budgets-mib 4096 2048 6144 --cycles 3 --sessions 4 \
        --session-tokens 900 --n-threads 16 --profile $PROFILE --fresh-dry-run-cache $COLD_ARG ${ARGS:-} \
        --json $W/results/\$m.json > $L/bench-\$m.log 2>&1
      echo \"\$m rc=\$?\" >> $W/results/done.txt
    done" < /dev/null > /dev/null 2>&1 &
  echo "bench of$todo started at $(el) s"
fi
shown=""
while :; do
  for m in $MODELS; do
    if grep -q "^$m rc=" $W/results/done.txt 2>/dev/null && [[ " $shown " != *" $m "* ]]; then
      shown="$shown $m"; grep "^$m rc=" $W/results/done.txt
      grep -v "^llama\|^load\|^print_info\|^graph\|^sched\|^init\|^\.\|^warmup\|^alloc" $L/bench-$m.log | tail -n 90
    fi
  done
  all=1; for m in $MODELS; do grep -q "^$m rc=" $W/results/done.txt 2>/dev/null || all=0; done
  [ $all = 1 ] && { echo "DONE at $(el) s"; exit 0; }
  [ "$(left)" -lt 15 ] && { echo "STILL RUNNING at $(el) s:"; for m in $MODELS; do tail -n 3 $L/bench-$m.log 2>/dev/null; done; exit 0; }
  sleep 5
done
