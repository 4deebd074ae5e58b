#!/bin/bash
# The GPU machine's job for issue #36 (a crowd of NPCs in the paper's batched shape and a game's), in as many calls as
# it takes:
#
#   run: bash .ci/gpu-crowd.sh        (device tool, kind nvidia-h200, timeout 600, `.gpu` carried)
#
# Steps, each skipped once done on this machine (state in /tmp/igi-crowd, kept while the machine stays warm): the CUDA
# build while the synthetic models are written; then, detached, the JOBS one after another, each one
# `python -m igi_sdk.bench.crowd` (docs/batching.md, "A crowd"): `paper` = B NPCs at once, 889-token prompts, 128 tokens
# generated, one engine per B with the planner's placement for B sessions under the budget (H200 reference profile),
# decode tok/s and its ratio over B = 1 of the same run, TTFT p50/p99, NVML device peak against the budget;
# `game` = 16 NPCs arriving over time (prompts 96-640 tokens, replies 32-64), the speaker's TTFT with the crowd and
# alone. A call that ends with STILL RUNNING is repeated at once (the machine is given back after 30 s idle); the
# jobs go on meanwhile.
# Results come back as $OUT/crowd.tgz (logs, one JSON per job); each finished job's table is printed.
# The default JOBS are what issue 36 still lacks after the H100 runs (docs/benchmarks.md, "A crowd"): the 30B-A3B at
# 4 GiB with the q4_0 cache in the paper's condition (token 0 throughout) and with a prompt each, interleaved; about 3
# minutes after the build and the 30B-A3B's write.
# Env: LIMIT (s from the call's start, default 540), N_THREADS (default 16), JOBS (";"-separated "MODEL BUDGET_MIB
#   WORKLOAD [B,B,..] [off=N] [proc] [kv=TYPE] [same|bb]"; the ratios over B = 1 are within one job: keep 1 in a job's
#   list; off=N runs the job with GGML_OP_OFFLOAD_MIN_BATCH=N, which the bench plans with too, e.g. "llama_8b 2048
#   paper 1,4,16 off=8";
#   proc plans without the placements' own op_offload thresholds (--offload-threshold process), the A/B of patch 0007;
#   kv=q8_0 plans and runs with that KV cache type, --kv-type; same gives every NPC one prompt (--prompts same), bb
#   llama-batched-bench's sequences, token 0 throughout (--prompts batched-bench); a job listed again runs again, its
#   results named -2, ...),
#   WRITE (models written during the build, default "llama_8b qwen3_30b_a3b"), ARGS (more bench flags for every job),
#   PROFILE (the profile every job plans with: reference:h200, the default, or `measured`: `igi profile` run on this
#   machine once after the build, about 12 s, its profile stored and read by each job's `--profile auto`).
T0=$(date +%s); LIMIT=${LIMIT:-540}; N_THREADS=${N_THREADS:-16}
JOBS=${JOBS:-"qwen3_30b_a3b 4096 paper 1,4,16 kv=q4_0 bb;qwen3_30b_a3b 4096 paper 1,4,16 kv=q4_0;\
qwen3_30b_a3b 4096 paper 1,4,16 kv=q4_0 bb;qwen3_30b_a3b 4096 paper 1,4,16 kv=q4_0"}
GPU_WRITE_PY="import sys; from igi_sdk.bench.npc_batch import resolve_model; print(resolve_model('synthetic:' + sys.argv[1]))"
source .ci/gpu-job.sh; gpu_job crowd crowd.tgz; gpu_build ${WRITE:-llama_8b qwen3_30b_a3b}
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv > $L/nvidia-smi.txt 2>&1
PROFILE=${PROFILE:-reference:h200}
if [ "$PROFILE" = measured ]; then  # this machine's own profile, measured once (kept while the machine stays warm)
  if [ ! -f $W/profiled ]; then
    python3 -m igi_sdk.cli profile --json > $W/results/profile.json 2> $L/profile.log; rc=$?
    echo "profile rc=$rc at $(el) s"; [ $rc = 0 ] && touch $W/profiled
  fi
  PROFILE=auto
fi
# the machine's copy of .git may be older than the working tree sent with it: say how many files differ from HEAD
echo "$(git rev-parse --short HEAD 2>/dev/null) + $(git status --porcelain 2>/dev/null | wc -l) changed files" \
  > $W/results/commit.txt
# one name per job: MODEL-BUDGET-WORKLOAD[-Bs]
names=(); IFS=';' read -ra jobs <<< "$JOBS"
job_name() {  # MODEL-BUDGET-WORKLOAD[-Bs][-offN]
  local n="$1-$2-$3" t; shift 3
  for t in "$@"; do
    case $t in off=*) n="$n-off${t#off=}";; kv=*) n="$n-kv${t#kv=}";; proc) n="$n-proc";; same) n="$n-same";;
      bb) n="$n-bb";; *) n="$n-${t//,/_}";; esac
  done
  echo "$n"
}
for j in "${jobs[@]}"; do  # a job listed again (an interleaved A/B) gets -2, -3, ...: its results are kept apart
  n=$(job_name $j); k=1; while [[ " ${names[*]} " == *" $n "* ]]; do k=$((k + 1)); n="$(job_name $j)-$k"; done
  names+=("$n")
done
if [ ! -f $W/started ]; then  # one detached runner for every job, started by the first call
  touch $W/started
  for i in "${!jobs[@]}"; do echo "${names[$i]} ${jobs[$i]}"; done > $W/jobs.txt
  gpu_snapshot
  setsid nohup bash -c "cd $SRC; while read -r name model budget workload rest; do
      batch=''; off=''; thr=''; kv=''; prompts=''
      for t in \$rest; do
        case \$t in off=*) off=\${t#off=};; kv=*) kv=\"--kv-type \${t#kv=}\";; proc) thr='--offload-threshold process';;
          same) prompts='--prompts same';; bb) prompts='--prompts batched-bench';; *) batch=\"--batch \$t\";; esac
      done
      env \${off:+GGML_OP_OFFLOAD_MIN_BATCH=\$off} python3 -m igi_sdk.bench.crowd \$workload --model synthetic:\$model \
        --vram-budget-mib \$budget --profile $PROFILE --n-threads $N_THREADS \$batch \$thr \$kv \$prompts ${ARGS:-} \
        --json $W/results/\$name.json > $L/\$name.log 2>&1
      echo \"\$name rc=\$?\" >> $W/results/done.txt
    done < $W/jobs.txt" < /dev/null > /dev/null 2>&1 &
  echo "jobs started at $(el) s: ${names[*]}"
fi
shown=""
while :; do
  for n in "${names[@]}"; do
    if grep -q "^$n rc=" $W/results/done.txt 2>/dev/null && [[ " $shown " != *" $n "* ]]; then
      shown="$shown $n"; grep "^$n rc=" $W/results/done.txt
      grep -v "^llama\|^load\|^print_info\|^graph\|^sched\|^init\|^\.\|^warmup\|^alloc\|^common\|^set_\|^ggml" \
        $L/$n.log | tail -n 30
    fi
  done
  all=1; for n in "${names[@]}"; do grep -q "^$n rc=" $W/results/done.txt 2>/dev/null || all=0; done
  [ $all = 1 ] && { echo "DONE at $(el) s"; exit 0; }
  [ "$(left)" -lt 15 ] && { echo "STILL RUNNING at $(el) s:"; for n in "${names[@]}"; do
      grep -q "^$n rc=" $W/results/done.txt 2>/dev/null || { echo "$n:"; grep "^B=\|NPCs:" $L/$n.log 2>/dev/null | tail -n 4; }
    done; exit 0; }
  sleep 5
done
