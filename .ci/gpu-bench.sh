#!/bin/bash
# The GPU machine's whole job for issue #7, in as many calls as it takes (each call: this script, `.gpu` carried).
#
#   run: bash .ci/gpu-bench.sh            (device tool, kind nvidia-h200, timeout 600; `.gpu` from ../shared/gpu/prepare.sh)
#
# Steps, each skipped once done on this machine (state in /tmp/igi-state, kept while the machine stays warm):
#   cold machine: CUDA build of llama-cpp-python (~5 min) while both synthetic models are written;
#   `igi profile` once; the daemon GPU test once (tests/gpu/test_gpu_daemon.py); then per model the side-by-side
#   suite with the time left in the call (LIMIT s from the call's start), continued in the next call with --resume.
# Issue the next call as soon as one returns: an idle machine is given back after 30 s and a fresh one costs the
# build again (its state is then lost: the suites start over). Only a few files come back per call, so everything
# is returned as two tarballs: $OUT/all.tgz (this call's logs and results) and $OUT/state.tgz (the state so far).
# Env: LIMIT (default 555; keep it under the call's timeout, or nothing comes back), CONFIRM_LOADS (default 1: close calls
# get one more load of the planner's placement and its challenger, docs/benchmarks.md), REPEATS (default 1; 3 adds about 12 min for the 8B and 10 min for the 30B-A3B: more than one
# session of device time for both), MODELS (default "llama_8b qwen3_30b_a3b"), GPU_DAEMON_TEST (default 1; 0 skips
# the daemon GPU test, e.g. when re-measuring one model), SCOPE (the
# budgets and contexts, default the issue's grid; e.g. SCOPE="--budgets-mib 2048 3072 --ctx 4096 --prompt-tokens
# 1024 --reply-tokens 64" with REPEATS=3 re-measures a few groups with three rounds each).
T0=$(date +%s); LIMIT=${LIMIT:-555}; REPEATS=${REPEATS:-1}; CONFIRM_LOADS=${CONFIRM_LOADS:-1}; MODELS=${MODELS:-llama_8b qwen3_30b_a3b}
SCOPE=${SCOPE:---budgets-mib 2048 3072 4096 6144 8192 --ctx 4096 16384 --prompt-tokens 1024 8192 --reply-tokens 64 32}
GPU_DAEMON_TEST=${GPU_DAEMON_TEST:-1}
# a call is killed at 600 s, before the EXIT trap can pack the results: nothing would come back
if [ "$LIMIT" -gt 580 ]; then echo "LIMIT=$LIMIT: over the call's 600 s, the results would not come back (max 580)"; exit 2; fi
REAL_OUT=$OUT; export OUT=/tmp/igi-out; rm -rf $OUT; mkdir -p $OUT/r; R=$OUT/r
S=/tmp/igi-state; mkdir -p $S
el() { echo $(( $(date +%s) - T0 )); }
finish() { tar czf $REAL_OUT/all.tgz -C $OUT . 2>/dev/null; tar czf $REAL_OUT/state.tgz -C /tmp igi-state 2>/dev/null; }
trap finish EXIT
if [ ! -f /tmp/site/.igi-ready ]; then
  echo "cold machine: building"
  bash .gpu/build_on_gpu.sh > $R/build.log 2>&1 &
  BPID=$!
  for i in $(seq 60); do [ -d /tmp/site/gguf ] && break; sleep 2; done
  for mdl in $MODELS; do
    PYTHONPATH=/tmp/site:$(pwd) python3 -c "import sys; from igi_sdk.bench.setup import resolve_model; from igi_sdk.model_store import cache_dir; resolve_model(sys.argv[1], cache_dir() / 'bench-models', print)" $mdl > $R/write-$mdl.log 2>&1 &
  done
  wait $BPID; brc=$?
  wait
  tail -3 $R/build.log; echo "build rc=$brc at $(el) s"; cat $R/write-*.log
  if [ $brc != 0 ]; then bash .gpu/build_on_gpu.sh || exit 1; fi
fi
source .gpu/env.sh
SEQ=$(( $(cat $S/seq 2>/dev/null || echo 0) + 1 )); echo $SEQ > $S/seq
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv > $R/nvidia-smi.txt 2>&1
# the host's NUMA layout: one decode of the same placement moved by up to 23 % between loads (pinned host memory
# may land on either node); recorded to tell placement effects from where the memory went
{ lscpu; cat /sys/devices/system/node/node*/meminfo 2>/dev/null | grep -E "MemTotal|MemFree"; nvidia-smi topo -m; } > $R/host.txt 2>&1
if [ ! -f $S/profile.json ]; then
  t=$(date +%s); timeout 150 python3 -m igi_sdk.cli profile --json > $R/profile.json 2> $R/profile.err
  echo "profile rc=$? in $(( $(date +%s) - t )) s"
  python3 -c "import json,sys; p=json.load(open(sys.argv[1])); print('source', p.get('source'), 'missing', p.get('missing'))" $R/profile.json && cp $R/profile.json $S/profile.json
fi
PROF=$S/profile.json; [ -f $PROF ] || PROF=reference:h200
if [ "$GPU_DAEMON_TEST" != 0 ] && [ ! -f $S/daemon.done ]; then
  t=$(date +%s); timeout 240 python3 -m pytest -o addopts='' -m gpu tests/gpu/test_gpu_daemon.py -s -q -p no:cacheprovider > $S/gpu_daemon.log 2>&1
  echo "gpu daemon test rc=$? in $(( $(date +%s) - t )) s"; tail -n 25 $S/gpu_daemon.log
  [ -f $OUT/gpu_daemon.json ] && cp $OUT/gpu_daemon.json $S/
  [ -f $OUT/gpu_daemon-daemon.log ] && cp $OUT/gpu_daemon-daemon.log $S/
  touch $S/daemon.done
fi
for mdl in $MODELS; do
  [ -f $S/$mdl.done ] && continue
  M=$(python3 -c "print(round(($LIMIT - $(el)) / 60, 2))")
  python3 -c "import sys; sys.exit(0 if float('$M') > 0.7 else 1)" || { echo "no time left for $mdl"; break; }
  RES=""; [ -f $S/bench-$mdl.json ] && RES="--resume $S/bench-$mdl.json"
  echo "bench $mdl max-minutes $M $RES (at $(el) s)"
  python3 -m igi_sdk.cli bench --model $mdl $SCOPE --threads 16 --profile $PROF --extra-profile reference:h200 --max-minutes $M --run-timeout-s 90 --repeats $REPEATS --confirm-loads $CONFIRM_LOADS $RES --out $R/b-$mdl > $R/bench-$mdl-$SEQ.log 2>&1
  echo "bench rc=$? at $(el) s"; grep -c "OVER BUDGET" $R/bench-$mdl-$SEQ.log; tail -n 4 $R/bench-$mdl-$SEQ.log
  cp $R/b-$mdl/bench-$mdl.json $S/bench-$mdl.json; cp $R/bench-$mdl-$SEQ.log $S/
  python3 - $S/bench-$mdl.json <<'PY' && touch $S/$mdl.done
import json, sys
d = json.load(open(sys.argv[1])); runs = d["runs"]
st = {}
for r in runs:
    st[r["status"]] = st.get(r["status"], 0) + 1
unplanned = [n for n in d["meta"]["notes"] if n.startswith("oracle sweep not planned")]
print("statuses", st, "unplanned", unplanned)
sys.exit(1 if st.get("skipped") or unplanned else 0)
PY
done
echo "done at $(el) s"; ls $S
