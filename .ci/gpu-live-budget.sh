#!/bin/bash
# The GPU machine's job for live budget changes through the real daemon (docs/daemon.md, "Release first", "igi
# prepare"; docs/benchmarks.md, "Daemon: live budget changes on the GPU"), in as many calls as it takes:
#
#   run: bash .ci/gpu-live-budget.sh        (device tool, kind nvidia-h200, timeout 600, `.gpu` carried)
#
# Steps, each skipped once done on this machine (state in /tmp/igi-lb, kept while the machine stays warm): the patched
# CUDA build while the synthetic 8B is written; then, detached: `igi prepare` with the daemon flags of
# tests/gpu/test_gpu_daemon.py (timed: the profile, then the start budget and the ladder with their dry runs), then
# that test (the daemon's start timed to its connection file; budgets IGI_GPU_BUDGETS_MIB, default 4096 2048 6144
# 3000 1500 4096); then the reload stages of the 8B with the pinned host pool off, then on
# (`--pinned-pool`: patches/llama.cpp 0003); then the weight cache on the 8B (tests/gpu/test_gpu_weight_cache.py:
# patches/llama.cpp 0006); then the acceptance run of issue 35 (`igi_sdk.bench.live_budget`: 24
# budget changes while 3 NPCs stream, NVML per change) on the 8B, then on the 30B-A3B (LIVE_MODELS), then on the 8B
# again with the weights as a cache of their host copy (`--weight-cache-device CUDA0`: patches/llama.cpp 0006). A call that ends with STILL RUNNING is repeated at once (the machine is given back after 30 s idle).
# Results come back as $OUT/lb.tgz (logs, gpu_daemon.json, the daemon's log); the summaries are printed.
# Env: LIMIT (s from the call's start, default 540), PREPARE (default 1; 0: the daemon plans on its own), LIVE_MODELS
# (default "llama_8b qwen3_30b_a3b"; each prepared first, like the daemon test's).
T0=$(date +%s); LIMIT=${LIMIT:-540}; MODEL=llama_8b; LIVE_MODELS=${LIVE_MODELS:-"llama_8b qwen3_30b_a3b"}
source .ci/gpu-job.sh; gpu_job lb lb.tgz; gpu_build $(echo $MODEL $LIVE_MODELS | tr " " "\n" | sort -u)
if [ ! -f $W/started ]; then
  touch $W/started
  M=$(model_path $MODEL)
  FLAGS="--model $M --vram-budget-mib 4096 --n-threads 16 --grow-stable-s 0 --min-grow-interval-s 0"
  setsid nohup bash -c "
    if [ '${PREPARE:-1}' = 1 ]; then
      s=\$SECONDS; python3 -m igi_sdk.cli prepare $FLAGS > $L/prepare.log 2>&1; rc=\$?
      echo \"prepare rc=\$rc in \$((SECONDS - s)) s\" >> $L/prepare.log
    fi
    OUT=$W/results python3 -m pytest -o addopts='' -m gpu tests/gpu/test_gpu_daemon.py -q -s > $L/daemon.log 2>&1
    echo \"daemon rc=\$?\" >> $W/results/done.txt
    for pool in 0 on; do
      POOL_ARG=\$([ \$pool = on ] && echo --pinned-pool)
      python3 -m igi_sdk.bench.reload_stages \$POOL_ARG --model $MODEL --budgets-mib 4096 2048 6144 --cycles 2 --sessions 4 \
        --session-tokens 900 --n-threads 16 --profile reference:h200 --json $W/results/stages-pool-\$pool-\$SECONDS.json \
        > $L/stages-pool-\$pool-\$SECONDS.log 2>&1
    done
    echo \"stages done\" >> $W/results/done.txt
    OUT=$W/results python3 -m pytest -o addopts='' -m gpu tests/gpu/test_gpu_weight_cache.py -q -s > $L/weight-cache.log 2>&1
    echo \"weight cache rc=\$?\" >> $W/results/done.txt
    for live in $LIVE_MODELS; do
      LM=\$(python3 -c \"$GPU_WRITE_PY\" \$live 2>/dev/null | tail -1)
      LFLAGS=\"--model \$LM --vram-budget-mib 4096 --n-threads 16 --grow-stable-s 0 --min-grow-interval-s 0\"
      python3 -m igi_sdk.cli prepare \$LFLAGS --levels-mib 6144 2048 0 > $L/live-prepare-\$live.log 2>&1
      python3 -m igi_sdk.bench.live_budget --model \$LM --vram-budget-mib 4096 --top-mib 6144 --changes 24 --npcs 3 \
        --n-threads 16 --log-file $W/results/live-\$live-daemon.log --json $W/results/live-\$live.json \
        > $L/live-\$live.log 2>&1
      echo \"live \$live rc=\$?\" >> $W/results/done.txt
    done
    LM=\$(python3 -c \"$GPU_WRITE_PY\" $MODEL 2>/dev/null | tail -1)
    python3 -m igi_sdk.bench.live_budget --model \$LM --vram-budget-mib 4096 --top-mib 6144 --changes 24 --npcs 3 \
      --n-threads 16 --daemon-arg=--weight-cache-device --daemon-arg=CUDA0 \
      --log-file $W/results/live-$MODEL-cache-daemon.log --json $W/results/live-$MODEL-cache.json \
      > $L/live-$MODEL-cache.log 2>&1
    echo \"live $MODEL cache rc=\$?\" >> $W/results/done.txt
    echo \"live done\" >> $W/results/done.txt" < /dev/null > /dev/null 2>&1 &
  echo "prepare + daemon scenario started at $(el) s"
fi
while :; do
  if grep -q "^daemon rc=" $W/results/done.txt 2>/dev/null && [ ! -f $W/shown ]; then
    touch $W/shown; cat $W/results/done.txt; tail -n 15 $L/prepare.log 2>/dev/null
    grep -v "^llama\|^load\|^print_info\|^graph\|^sched\|^init\|^\.\|^warmup\|^alloc" $L/daemon.log | tail -n 40
  fi
  if grep -q "^stages done" $W/results/done.txt 2>/dev/null && [ ! -f $W/stages-shown ]; then
    touch $W/stages-shown
    for f in $L/stages-pool-*.log; do echo "== $f"; grep -A4 "4096->2048\|^pinning\|^export" $f | grep -v "^llama" | head -30; done
  fi
  if grep -q "^weight cache rc=" $W/results/done.txt 2>/dev/null && [ ! -f $W/cache-shown ]; then
    touch $W/cache-shown; grep -v "^llama\|^load\|^print_info" $L/weight-cache.log | tail -n 40
  fi
  if grep -q "^live done" $W/results/done.txt 2>/dev/null; then
    for f in $L/live-*.log; do echo "== $f"; grep -v "^llama\|^load\|^print_info" $f | tail -n 45; done
    echo "DONE at $(el) s"; exit 0
  fi
  [ "$(left)" -lt 15 ] && { echo "STILL RUNNING at $(el) s:"; tail -n 5 $L/prepare.log 2>/dev/null; tail -n 5 $L/daemon.log 2>/dev/null; exit 0; }
  sleep 5
done
