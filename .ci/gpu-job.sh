# Sourced by the .ci/gpu-*.sh jobs of the GPU machine (device tool, `.gpu` carried; ../shared/gpu/README.md):
#
#   gpu_job NAME TGZ      state in /tmp/igi-NAME (W; its logs/ are L, its results/ beside), kept while the machine
#                         stays warm; on exit, logs/ and results/ are tarred to $OUT/TGZ. el: seconds since T0 (set by
#                         the job before sourcing), left: seconds to LIMIT.
#   gpu_build MODEL...    the patched CUDA build, skipped once done on this machine, while each synthetic MODEL is
#                         written (GPU_WRITE_PY: the Python that writes the model named by sys.argv[1] and prints its
#                         path; default: the bench's models in the cache's bench-models/); then .gpu/env.sh.
#   model_path MODEL      the path of a synthetic model GPU_WRITE_PY wrote (writing it if absent).
#   gpu_snapshot          a copy of the working tree in $W/src-N (SRC) for a detached runner, which starts with
#                         `cd $SRC` and SRC on PYTHONPATH: each device call copies the working tree anew over the
#                         repository root, and a job importing from it while that copy lands fails (a missing module).
GPU_WRITE_PY=${GPU_WRITE_PY:-"import sys; from igi_sdk.bench.setup import resolve_model; \
from igi_sdk.model_store import cache_dir; print(resolve_model(sys.argv[1], cache_dir() / 'bench-models', print)[0])"}

gpu_job() {
  W=/tmp/igi-$1; L=$W/logs; mkdir -p $L $W/results
  REAL_OUT=${OUT:-/tmp/igi-$1-out}; mkdir -p "$REAL_OUT"
  GPU_JOB_TGZ=$2
  trap 'tar czf "$REAL_OUT/$GPU_JOB_TGZ" -C $W logs results 2>/dev/null' EXIT
}
el() { echo $(( $(date +%s) - T0 )); }
left() { echo $(( LIMIT - $(el) )); }

gpu_build() {
  export SKBUILD_BUILD_DIR=/tmp/lcp-cmake
  if [ ! -f /tmp/site/.igi-ready ]; then
    bash .gpu/build_on_gpu.sh > $L/build.log 2>&1 &
    local bpid=$! brc mdl i
    for i in $(seq 90); do [ -d /tmp/site/gguf ] && break; sleep 2; done
    for mdl in "$@"; do
      PYTHONPATH=/tmp/site:$(pwd) python3 -c "$GPU_WRITE_PY" $mdl > $L/write-$mdl.log 2>&1 &
    done
    wait $bpid; brc=$?; wait
    tail -5 $L/build.log; cat $L/write-*.log 2>/dev/null; echo "build rc=$brc at $(el) s"
    [ $brc = 0 ] || exit 1
  fi
  source .gpu/env.sh
}

model_path() { python3 -c "$GPU_WRITE_PY" "$1" 2>/dev/null | tail -1; }

gpu_snapshot() {
  SRC=$W/src-$(date +%s%N); mkdir -p $SRC
  tar cf - --exclude=./.git --exclude=./.gpu . | tar xf - -C $SRC
  export PYTHONPATH=/tmp/site:$SRC
}
