#!/bin/bash
# The GPU machine's job for the pipelined weight prefetch (patches/llama.cpp), in as many calls as it takes:
#
#   run: bash .ci/gpu-overlap.sh        (device tool, kind nvidia-h200, timeout 600, `.gpu` carried)
#
# Steps, each skipped once done on this machine (state in /tmp/igi-ov, kept while the machine stays warm):
#   the patched CUDA build (build dir kept in /tmp/lcp-cmake) while the synthetic models are written;
#   tests/gpu/test_gpu_layout_agrees.py (the planner's layouts are what llama.cpp loads);
#   tests/gpu/test_gpu_prefetch.py (greedy tokens with the prefetch on = off, slots allocated); `igi profile`;
#   `igi bench` per shape (methods planner, planner_serial, all_gpu; budgets 2/4/8 GiB; ctx 4K/1K and 16K/8K),
#   continued with --resume in the next call. Issue the next call as soon as one returns (the machine is given
#   back after 30 s idle). Results come back as $OUT/ov.tgz (logs, profile, bench JSON and bench.md).
# Env: LIMIT (s from the call's start, default 540),
#   BENCH_ARGS (extra `igi bench` arguments of every JOBS entry, e.g. "--objective ttft"), SHAPES (default "llama_8b qwen3_30b_a3b"), JOBS (below),
#   STOP_AFTER_PROFILE=1 (the first call of a session: build, GPU test, profile),
#   REBUILD=1: re-apply patches/llama.cpp to pristine sources and rebuild ggml incrementally (C++ iteration).
T0=$(date +%s); LIMIT=${LIMIT:-540}; SHAPES=${SHAPES:-llama_8b qwen3_30b_a3b}
source .ci/gpu-job.sh; gpu_job ov ov.tgz; gpu_build $SHAPES
if [ "${REBUILD:-0}" = 1 ]; then
  src=$(ls -d /tmp/gpu-build/llama_cpp_python-*/)
  rm -rf /tmp/pristine && mkdir -p /tmp/pristine && tar xzf .gpu/lcp.tar.gz -C /tmp/pristine
  p=$(ls -d /tmp/pristine/llama_cpp_python-*/)
  for f in ggml/include/ggml-backend.h ggml/src/ggml-backend.cpp ggml/src/ggml-cuda/ggml-cuda.cu; do
    cp "$p/vendor/llama.cpp/$f" "$src/vendor/llama.cpp/$f"
  done
  .ci/patch_llama_cpp.sh "$src" || exit 1
  t=$(date +%s); cmake --build /tmp/lcp-cmake -j"$(nproc)" > $L/rebuild.log 2>&1; echo "rebuild rc=$? in $(( $(date +%s) - t )) s"
  tail -3 $L/rebuild.log
  for lib in $(find /tmp/lcp-cmake -name "libggml*.so*" -type f); do
    dst=$(find /tmp/site -name "$(basename "$lib")" -type f | head -1); [ -n "$dst" ] && cp "$lib" "$dst" && echo "updated $dst"
  done
  rm -f $W/test.done
fi
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv > $L/nvidia-smi.txt 2>&1
if [ ! -f $W/test.done ]; then
  t=$(date +%s); timeout $(left) python3 -m pytest -o addopts='' -m gpu tests/gpu/test_gpu_layout_agrees.py tests/gpu/test_gpu_prefetch.py -s -q -x \
    -p no:cacheprovider > $L/test_gpu_prefetch.log 2>&1; rc=$?
  echo "test_gpu_prefetch rc=$rc in $(( $(date +%s) - t )) s"; tail -n 12 $L/test_gpu_prefetch.log
  [ $rc = 0 ] && touch $W/test.done || exit 1
fi
if [ ! -f $W/results/profile.json ]; then
  t=$(date +%s); timeout 200 python3 -m igi_sdk.cli profile --json > $L/profile.json 2> $L/profile.err
  echo "profile rc=$? in $(( $(date +%s) - t )) s"
  python3 -c "import json,sys; p=json.load(open(sys.argv[1])); g=p['gpu']; print('source', p['source'], 'missing', p['missing']); print({k: g.get(k) for k in ('h2d_pinned_gbps','h2d_pageable_gbps','h2d_prefetch_gbps','weight_prefetch_abi','gflops')})" $L/profile.json && cp $L/profile.json $W/results/profile.json
fi
PROF=$W/results/profile.json; [ -f $PROF ] || { echo "no profile"; exit 1; }
[ "${STOP_AFTER_PROFILE:-0}" = 1 ] && { echo "DONE at $(el) s"; exit 0; }
# JOBS: "model:budget_mib:n_ctx:prompt:reply:slots:methods+..." entries (e.g. a slot-count A/B of one group);
# each job is one igi bench run into results/job-N; without JOBS, the SHAPES grid below
n=0
for job in ${JOBS:-}; do
  n=$((n + 1)); [ -f $W/results/job-$n.done ] && continue
  [ "$(left)" -lt 45 ] && { echo "time left $(left) s: next call"; exit 0; }
  IFS=: read -r mdl budget ctx prompt reply slots methods <<< "$job"
  out=$W/results/job-$n; mkdir -p $out; t=$(date +%s)
  timeout $(( $(left) + 5 )) python3 -m igi_sdk.cli bench --model $mdl --budgets-mib $budget --ctx $ctx \
    --prompt-tokens $prompt --reply-tokens $reply --methods ${methods//+/ } --prefetch-slots $slots --profile $PROF ${BENCH_ARGS:-} \
    --out $out --run-timeout-s 150 > $L/job-$n.log 2>&1
  echo "job $n ($job) rc=$? in $(( $(date +%s) - t )) s"; grep -E "^\[" $L/job-$n.log | tail -n 3
  touch $W/results/job-$n.done
done
[ -n "${JOBS:-}" ] && { echo "DONE at $(el) s"; exit 0; }
for mdl in $SHAPES; do
  [ -f $W/results/$mdl.done ] && continue
  [ "$(left)" -lt 60 ] && { echo "time left $(left) s: next call"; exit 0; }
  out=$W/results/$mdl; mkdir -p $out
  resume=(); [ -f $out/bench-$mdl.json ] && resume=(--resume $out/bench-$mdl.json)
  t=$(date +%s)
  timeout $(( $(left) + 10 )) python3 -m igi_sdk.cli bench --model $mdl --budgets-mib 2048 4096 8192 --ctx 4096 16384 \
    --prompt-tokens 1024 8192 --reply-tokens 64 32 --methods planner planner_serial all_gpu --profile $PROF \
    --out $out --max-minutes $(( ($(left) - 20) / 60 )) --run-timeout-s 150 "${resume[@]}" > $L/bench-$mdl.log 2>&1
  echo "bench $mdl rc=$? in $(( $(date +%s) - t )) s"; tail -n 4 $L/bench-$mdl.log
  python3 - $out/bench-$mdl.json <<'PY' && touch $W/results/$mdl.done
import json, sys
runs = json.load(open(sys.argv[1]))["runs"]
for r in runs:
    print(r["budget_mib"], r["n_ctx"], r["method"], r["status"], r.get("ttft_s"), r.get("tps"), r.get("e2e_s"),
          r.get("peak_vram_mib"), r.get("overlap"), r.get("prefill_upload_bytes"))
sys.exit(0 if all(r["status"] not in ("pending", "skipped") for r in runs) else 1)
PY
done
ls $W/results/*.done 2>/dev/null | wc -l | xargs echo "shapes done:"
echo "DONE at $(el) s"
