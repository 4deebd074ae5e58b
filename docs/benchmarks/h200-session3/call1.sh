# call 1: build, igi profile (measured), then the 8B side-by-side bench with the time left
T0=$(date +%s)
bash .gpu/build_on_gpu.sh && source .gpu/env.sh || exit 1
R=$OUT/r; mkdir -p $R
echo "build done at $(( $(date +%s) - T0 )) s"
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv > $R/nvidia-smi.txt 2>&1
T1=$(date +%s)
timeout 240 python3 -m igi_sdk.cli profile --json > $R/profile.json 2> $R/profile.err; echo "profile rc=$? in $(( $(date +%s) - T1 )) s"
python3 - <<'PY'
import json, os
p = json.load(open(os.environ["OUT"] + "/r/profile.json"))
print("source", p.get("source")); print("gpu", json.dumps(p.get("gpu"))[:600])
print("cpu", json.dumps(p.get("cpu"))[:900]); print("missing", json.dumps(p.get("missing"), indent=1)[:3000])
PY
tail -c 1500 $R/profile.err
M=$(python3 -c "import time;print(round((575-(time.time()-$T0))/60,2))")
echo "bench max-minutes $M"
python3 -m igi_sdk.cli bench --model llama_8b --budgets-mib 2048 3072 4096 6144 8192 --ctx 4096 16384 --prompt-tokens 1024 8192 --reply-tokens 64 32 --threads 16 --profile auto --extra-profile reference:h200 --max-minutes $M --run-timeout-s 90 --out $R/bench > $R/bench-8b.log 2>&1
echo "bench rc=$?"; tail -n 30 $R/bench-8b.log
