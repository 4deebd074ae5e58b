#!/bin/bash
# The GPU machine's job for live budget changes through the real daemon (docs/daemon.md, "Release first", "igi
# prepare"; docs/benchmarks.md, "Daemon: live budget changes on the GPU"), in as many calls as it takes:
#
#   run: bash .ci/gpu-live-budget.sh        (device tool, kind nvidia-h200, timeout 600, `.gpu` carried)
#
# The patched CUDA build while the synthetic models are written, then the steps of STEPS in order, detached (state in
# /tmp/igi-lb, kept while the machine stays warm; a call that ends with STILL RUNNING is repeated at once, the machine
# is given back after 30 s idle):
#   live:MODEL   `igi prepare` with the game's levels (6144 2048 0), then the acceptance run of issue 35
#                (`igi_sdk.bench.live_budget`: 24 budget changes while 3 NPCs stream, NVML and the NPCs' longest
#                stall per change), through the reload path (`--weight-cache-device off`)
#   default:MODEL the same with the daemon's defaults (the cache mode on the worker's first GPU: `auto`)
#   cache:MODEL  the same with the weights as a cache of their host copy (`--weight-cache-device CUDA0`: patch 0006)
#   nostandby:MODEL the cache mode without the standby worker (`--standby-worker false`; a worker that detaches in place
#                has none behind it either way)
#   mapped:MODEL the same with that host copy mapped from the model file (`--weight-cache-host mapped`)
#   allocated:MODEL the cache mode with the host copy pinned by cudaMallocHost (`--host-pinning allocated`: the A/B of
#                the default's registered host memory, patch 0008)
#   pinning      tests/gpu/test_gpu_host_pinning.py (registered host memory against cudaMallocHost's, host weights
#                read on 8 threads against one: patches 0008, 0009)
#   standby:MODEL the cache mode with the standby worker named (`--standby-worker`, the default)
#   release:MODEL `igi_sdk.bench.device_release`: the engine in the cache mode moved attention-first -> parked ->
#                detached (its CUDA devices given back, patch 0010) -> attention-first, then straight to detached and
#                back, RELEASE_CYCLES cycles (3; RELEASE_ARGS: more flags, e.g. `--unregister-first ab`)
#   bounce:MODEL `igi_sdk.bench.pageable_uploads`: a mapped host copy's prompt streaming and growth through patch 0012's
#                bounce slots against the driver's path, BOUNCE_ROUNDS interleaved pairs (3)
#   export:MODEL `igi_sdk.bench.state_export --gpu`: 4 sessions of 900 tokens on the GPU exported into memory faulted
#                in first and as the copy faults it in, 7 rounds interleaved (engine.prefault)
#   threshold    tests/gpu/test_gpu_offload_threshold.py (a context's own op_offload threshold: patch 0007)
#   cache_test   tests/gpu/test_gpu_weight_cache.py (patches/llama.cpp 0006)
#   mapped_plans `igi_sdk.bench.weight_cache` with the mapped host copy: step 7 (each budget's plan in the cache mode
#                against the reload path's) at 1024-6144 MiB on the 8B
#   daemon       `igi prepare` with the daemon flags of tests/gpu/test_gpu_daemon.py (timed), then that test (the
#                daemon's start timed to its connection file; budgets IGI_GPU_BUDGETS_MIB)
#   stages       the reload stages of the 8B with the pinned host pool off, then on (`--pinned-pool`: patch 0003)
# Results come back as $OUT/lb.tgz (logs, JSON, the daemons' logs; a live step run again in the same job writes
# live-TAG-2.json and so on beside the first); each step's summary is printed as it ends.
# The script builds by itself (run it alone, not after `.gpu/build_on_gpu.sh`: LIMIT counts from its start, and a
# call must end before the device tool's limit for its results to come back).
# Env: LIMIT (s from the call's start, default 540), STEPS (default: pinning cache:llama_8b cache:qwen3_30b_a3b
# allocated:llama_8b: registered host memory and threaded reads against cudaMallocHost and serial reads in the engine,
# then both models' cache mode (a reclaim to 0 detaching the worker in place and the growth out of 0 MiB moving it
# back; the NPCs' stalls; the moves' stages in the daemon's log: worker_moved), then the 8B with cudaMallocHost, whose
# worker cannot detach and is replaced).
T0=$(date +%s); LIMIT=${LIMIT:-540}; MODEL=llama_8b
STEPS=${STEPS:-"pinning cache:llama_8b cache:qwen3_30b_a3b allocated:llama_8b"}
source .ci/gpu-job.sh; gpu_job lb lb.tgz; gpu_build $( (echo $MODEL; printf '%s\n' $STEPS | sed -n 's/^[a-z]*://p') | sort -u)
if [ ! -f $W/started ]; then
  touch $W/started
  M=$(model_path $MODEL)
  FLAGS="--model $M --vram-budget-mib 4096 --n-threads 16 --grow-stable-s 0 --min-grow-interval-s 0"
  gpu_snapshot
  setsid nohup bash -c "cd $SRC; 
    live() {  # live MODEL TAG [daemon flags]: prepare MODEL with the game's levels, then the acceptance sequence
      LM=\$(python3 -c \"$GPU_WRITE_PY\" \$1 2>/dev/null | tail -1); tag=\$2; shift 2
      n=1; while [ -e $W/results/live-\$tag\$([ \$n -gt 1 ] && echo -\$n).json ]; do n=\$((n + 1)); done
      [ \$n -gt 1 ] && tag=\$tag-\$n  # a step run again in the same job keeps the results before it
      LFLAGS=\"--model \$LM --vram-budget-mib 4096 --n-threads 16 --grow-stable-s 0 --min-grow-interval-s 0\"
      python3 -m igi_sdk.cli prepare \$LFLAGS \$@ --levels-mib 6144 2048 0 > $L/live-prepare-\$tag.log 2>&1
      python3 -m igi_sdk.bench.live_budget --model \$LM --vram-budget-mib 4096 --top-mib 6144 --changes 24 --npcs 3 \
        --n-threads 16 \$(for f in \$@; do echo --daemon-arg=\$f; done) --log-file $W/results/live-\$tag-daemon.log \
        --json $W/results/live-\$tag.json > $L/live-\$tag.log 2>&1
      echo \"live \$tag rc=\$?\" >> $W/results/done.txt
    }
    for step in $STEPS; do
      case \$step in
        live:*) live \${step#live:} \${step#live:} --weight-cache-device off ;;
        default:*) live \${step#default:} \${step#default:}-default ;;
        cache:*) live \${step#cache:} \${step#cache:}-cache --weight-cache-device CUDA0 ;;
        mapped:*) live \${step#mapped:} \${step#mapped:}-mapped --weight-cache-device CUDA0 --weight-cache-host mapped ;;
        standby:*) live \${step#standby:} \${step#standby:}-standby --weight-cache-device CUDA0 --standby-worker ;;
        nostandby:*) live \${step#nostandby:} \${step#nostandby:}-nostandby --weight-cache-device CUDA0 \
          --standby-worker false ;;
        allocated:*) live \${step#allocated:} \${step#allocated:}-allocated --weight-cache-device CUDA0 \
          --host-pinning allocated ;;
        release:*)
          python3 -m igi_sdk.bench.device_release --model \$(python3 -c \"$GPU_WRITE_PY\" \${step#release:} 2>/dev/null | tail -1) \
            --n-threads 16 --cycles \${RELEASE_CYCLES:-3} \${RELEASE_ARGS:-} --json $W/results/device_release-\${step#release:}.json \
            > $L/device-release-\${step#release:}.log 2>&1
          echo \"device release rc=\$?\" >> $W/results/done.txt ;;
        bounce:*)
          python3 -m igi_sdk.bench.pageable_uploads --model \$(python3 -c \"$GPU_WRITE_PY\" \${step#bounce:} 2>/dev/null | tail -1) \
            --n-threads 16 --rounds \${BOUNCE_ROUNDS:-3} --json $W/results/pageable_uploads-\${step#bounce:}.json \
            > $L/pageable-uploads-\${step#bounce:}.log 2>&1
          echo \"pageable uploads rc=\$?\" >> $W/results/done.txt ;;
        export:*)
          python3 -m igi_sdk.bench.state_export --gpu --model \$(python3 -c \"$GPU_WRITE_PY\" \${step#export:} 2>/dev/null | tail -1) \
            --threads 16 --sessions 4 --prompt-tokens 900 --rounds 7 --json $W/results/state_export-\${step#export:}.json \
            > $L/state-export-\${step#export:}.log 2>&1
          echo \"state export rc=\$?\" >> $W/results/done.txt ;;
        pinning)
          OUT=$W/results python3 -m pytest -o addopts='' -m gpu tests/gpu/test_gpu_host_pinning.py -q -s > $L/pinning.log 2>&1
          echo \"host pinning rc=\$?\" >> $W/results/done.txt ;;
        threshold)
          python3 -m pytest -o addopts='' -m gpu tests/gpu/test_gpu_offload_threshold.py -q -s > $L/threshold.log 2>&1
          echo \"threshold rc=\$?\" >> $W/results/done.txt ;;
        cache_test)
          OUT=$W/results python3 -m pytest -o addopts='' -m gpu tests/gpu/test_gpu_weight_cache.py -q -s > $L/weight-cache.log 2>&1
          echo \"weight cache rc=\$?\" >> $W/results/done.txt ;;
        mapped_plans)
          python3 -m igi_sdk.bench.weight_cache --model \$(python3 -c \"$GPU_WRITE_PY\" $MODEL 2>/dev/null | tail -1) \
            --n-threads 16 --plan-budgets-mib 2048 3072 4096 6144 1024 --profile reference:h200 \
            --weight-cache-host mapped --json $W/results/weight_cache-mapped.json > $L/weight-cache-mapped.log 2>&1
          echo \"weight cache mapped rc=\$?\" >> $W/results/done.txt ;;
        daemon)
          s=\$SECONDS; python3 -m igi_sdk.cli prepare $FLAGS > $L/prepare.log 2>&1; rc=\$?
          echo \"prepare rc=\$rc in \$((SECONDS - s)) s\" >> $L/prepare.log
          OUT=$W/results python3 -m pytest -o addopts='' -m gpu tests/gpu/test_gpu_daemon.py -q -s > $L/daemon.log 2>&1
          echo \"daemon rc=\$?\" >> $W/results/done.txt ;;
        stages)
          for pool in 0 on; do
            POOL_ARG=\$([ \$pool = on ] && echo --pinned-pool)
            python3 -m igi_sdk.bench.reload_stages \$POOL_ARG --model $MODEL --budgets-mib 4096 2048 6144 --cycles 2 \
              --sessions 4 --session-tokens 900 --n-threads 16 --profile reference:h200 \
              --json $W/results/stages-pool-\$pool.json > $L/stages-pool-\$pool.log 2>&1
          done
          echo \"stages done\" >> $W/results/done.txt ;;
      esac
      echo \"step \$step done at \$SECONDS s\" >> $W/results/done.txt
    done
    echo \"all done\" >> $W/results/done.txt" < /dev/null > /dev/null 2>&1 &
  echo "steps started at $(el) s: $STEPS"
fi
while :; do
  if [ -f $W/results/done.txt ]; then
    all=$(grep -c "^all done" $W/results/done.txt); n=$(grep -c "^step " $W/results/done.txt)
    while [ "$(cat $W/shown 2>/dev/null || echo 0)" -lt "$n" ]; do
      i=$(( $(cat $W/shown 2>/dev/null || echo 0) + 1 )); echo $i > $W/shown
      step=$(echo $STEPS | cut -d" " -f$i); echo "===== $step"
      awk -v i=$i '/^step /{k++; if (k == i) {print prev; exit}} {prev = $0}' $W/results/done.txt
      case $step in
        live:*|default:*|cache:*|mapped:*|standby:*|nostandby:*|allocated:*)  # the newest log of the step's tag
          kind=${step%%:*}; tag=${step#*:}$([ $kind = live ] || echo -$kind)
          tail -n 40 $(ls -t $L/live-$tag.log $L/live-$tag-[0-9]*.log 2>/dev/null | head -1) \
            | grep -v "^llama\|^load\|^print_info" ;;
        pinning) grep -v "^llama\|^load\|^print_info" $L/pinning.log | tail -n 15 ;;
        export:*) tail -n 5 $L/state-export-${step#export:}.log ;;
        bounce:*) grep -v "^llama\|^load\|^print_info" $L/pageable-uploads-${step#bounce:}.log | tail -n 8 ;;
        release:*) grep -v "^llama\|^load\|^print_info\|^graph\|^sched\|^init\|^\.\|^alloc" $L/device-release-${step#release:}.log | tail -n 12 ;;
        threshold) grep -v "^llama\\|^load\\|^print_info" $L/threshold.log | tail -n 15 ;;
        cache_test) grep -v "^llama\|^load\|^print_info" $L/weight-cache.log | tail -n 30 ;;
        mapped_plans) grep -v "^llama\|^load\|^print_info" $L/weight-cache-mapped.log | tail -n 60 ;;
        daemon) tail -n 5 $L/prepare.log; grep -v "^llama\|^load\|^print_info\|^graph\|^sched\|^init\|^\.\|^warmup\|^alloc" $L/daemon.log | tail -n 30 ;;
        stages) for f in $L/stages-pool-*.log; do echo "== $f"; grep -A4 "4096->2048\|^pinning\|^export" $f | grep -v "^llama" | head -30; done ;;
      esac
    done
    [ "$all" = 1 ] && { echo "DONE at $(el) s"; exit 0; }
  fi
  [ "$(left)" -lt 15 ] && { echo "STILL RUNNING at $(el) s:"; tail -n 3 $W/results/done.txt 2>/dev/null; ls -t $L | head -1 | xargs -I{} tail -n 4 $L/{}; exit 0; }
  sleep 5
done
