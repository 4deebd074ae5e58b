#!/bin/bash
# Session 4 driver: one script for every call; steps already done (in /tmp/igi-state on a warm machine, or in
# the carried .gpu/state) are skipped. Usage: PREV=<seq of the last call whose state is in .gpu/state> bash .gpu/s4/go.sh
T0=$(date +%s); LIMIT=${LIMIT:-555}
R=$OUT/r; mkdir -p $R
S=/tmp/igi-state
el() { echo $(( $(date +%s) - T0 )); }
if [ ! -f /tmp/site/.igi-ready ]; then
  echo "cold machine: building"
  bash .gpu/build_on_gpu.sh > $R/build.log 2>&1 &
  BPID=$!
  for i in $(seq 60); do [ -d /tmp/site/gguf ] && break; sleep 2; done
  for mdl in llama_8b qwen3_30b_a3b; do
    PYTHONPATH=/tmp/site:$(pwd) python3 -c "import sys; from igi_sdk.bench.setup import resolve_model; from igi_sdk.model_store import cache_dir; resolve_model(sys.argv[1], cache_dir() / 'bench-models', print)" $mdl > $R/write-$mdl.log 2>&1 &
  done
  wait $BPID; brc=$?
  wait
  tail -3 $R/build.log; echo "build rc=$brc at $(el) s"; cat $R/write-*.log
  if [ $brc != 0 ]; then bash .gpu/build_on_gpu.sh || exit 1; fi
fi
source .gpu/env.sh
if [ ! -d $S ]; then
  mkdir -p $S
  if [ -d .gpu/state ]; then cp -r .gpu/state/. $S/; fi
  if [ "$(cat $S/seq 2>/dev/null || echo 0)" != "${PREV:-0}" ]; then
    echo "STALE carried state (seq $(cat $S/seq 2>/dev/null) != PREV $PREV): built only; copy the state and call again"
    rm -rf $S; exit 5
  fi
fi
echo $(( $(cat $S/seq 2>/dev/null || echo 0) + 1 )) > $S/seq
save() { cp -r $S $OUT/state; }
trap save EXIT
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv > $R/nvidia-smi.txt 2>&1
if [ ! -f $S/profile.json ]; then
  t=$(date +%s); timeout 150 python3 -m igi_sdk.cli profile --json > $R/profile.json 2> $R/profile.err
  echo "profile rc=$? in $(( $(date +%s) - t )) s"
  python3 -c "import json,sys; p=json.load(open(sys.argv[1])); print('source', p.get('source'), 'missing', p.get('missing'))" $R/profile.json && cp $R/profile.json $S/profile.json
fi
PROF=$S/profile.json; [ -f $PROF ] || PROF=reference:h200
if [ ! -f $S/daemon.done ]; then
  t=$(date +%s); timeout 240 python3 -m pytest -o addopts='' -m gpu tests/gpu/test_gpu_daemon.py -x -s -q -p no:cacheprovider > $S/gpu_daemon.log 2>&1
  echo "gpu daemon test rc=$? in $(( $(date +%s) - t )) s"; tail -n 25 $S/gpu_daemon.log
  [ -f $OUT/gpu_daemon.json ] && cp $OUT/gpu_daemon.json $S/
  touch $S/daemon.done
fi
for mdl in llama_8b qwen3_30b_a3b; do
  [ -f $S/$mdl.done ] && continue
  M=$(python3 -c "print(round(($LIMIT - $(el)) / 60, 2))")
  if python3 -c "import sys; sys.exit(0 if float('$M') > 0.7 else 1)"; then :; else echo "no time left for $mdl"; break; fi
  RES=""; [ -f $S/bench-$mdl.json ] && RES="--resume $S/bench-$mdl.json"
  echo "bench $mdl max-minutes $M $RES (at $(el) s)"
  python3 -m igi_sdk.cli bench --model $mdl --budgets-mib 2048 3072 4096 6144 8192 --ctx 4096 16384 --prompt-tokens 1024 8192 --reply-tokens 64 32 --threads 16 --profile $PROF --extra-profile reference:h200 --max-minutes $M --run-timeout-s 90 $RES --out $R/b-$mdl > $R/bench-$mdl-$(cat $S/seq).log 2>&1
  echo "bench rc=$? at $(el) s"; grep -c "OVER BUDGET" $R/bench-$mdl-$(cat $S/seq).log; tail -n 4 $R/bench-$mdl-$(cat $S/seq).log
  cp $R/b-$mdl/bench-$mdl.json $S/bench-$mdl.json
  cp $R/bench-$mdl-$(cat $S/seq).log $S/
  python3 - $S/bench-$mdl.json <<'PY' && touch $S/$mdl.done
import json, sys
d = json.load(open(sys.argv[1])); runs = d["runs"]
skipped = [r for r in runs if r["status"] == "skipped"]
unplanned = [n for n in d["meta"]["notes"] if n.startswith("oracle sweep not planned")]
st = {}
for r in runs: st[r["status"]] = st.get(r["status"], 0) + 1
print("statuses", st, "unplanned", unplanned)
sys.exit(1 if skipped or unplanned else 0)
PY
done
echo "done at $(el) s"; ls $S
