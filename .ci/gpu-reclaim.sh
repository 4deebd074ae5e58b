#!/bin/bash
# One device call (kind nvidia-h200, `.gpu` carried): build the CUDA llama-cpp-python on a fresh machine (~5 min),
# writing the small synthetic model meanwhile, then .ci/gpu_reclaim_probe.py (a reclaim to 0 MiB must leave the
# engine worker with no VRAM: docs/daemon.md). Results: $OUT/reclaim_probe.json and the daemon log.
T0=$(date +%s)
if [ ! -f /tmp/site/.igi-ready ]; then
  bash .gpu/build_on_gpu.sh > $OUT/build.log 2>&1 &
  BPID=$!
  for i in $(seq 60); do [ -d /tmp/site/gguf ] && break; sleep 2; done
  PYTHONPATH=/tmp/site:$(pwd) python3 -c "from igi_sdk.bench.setup import resolve_model; from igi_sdk.model_store import cache_dir; resolve_model('smoke_dense', cache_dir() / 'bench-models', print)" > $OUT/write.log 2>&1
  wait $BPID || { tail -5 $OUT/build.log; bash .gpu/build_on_gpu.sh || exit 1; }
  echo "built at $(( $(date +%s) - T0 )) s"
fi
source .gpu/env.sh
timeout $(( ${LIMIT:-340} - ($(date +%s) - T0) )) python3 .ci/gpu_reclaim_probe.py
echo "rc=$? at $(( $(date +%s) - T0 )) s"
