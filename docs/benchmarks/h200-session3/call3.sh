T0=$(date +%s)
bash .gpu/build_on_gpu.sh && source .gpu/env.sh || exit 1
R=$OUT/r; mkdir -p $R
echo "build done at $(( $(date +%s) - T0 )) s"
T1=$(date +%s)
timeout 200 python3 -m igi_sdk.cli profile --json > $R/profile.json 2> $R/profile.err; echo "profile rc=$? in $(( $(date +%s) - T1 )) s"
python3 - <<'PY'
import json, os
try:
    p = json.load(open(os.environ["OUT"] + "/r/profile.json"))
    print("source", p.get("source")); print("gpu", json.dumps(p.get("gpu"))[:700])
    print("cpu", json.dumps(p.get("cpu"))[:1200]); print("missing", json.dumps(p.get("missing"), indent=1)[:2500])
except Exception as e:
    print("no profile json:", e)
PY
tail -c 1200 $R/profile.err
timeout $(( 520 - ($(date +%s) - T0) )) python3 .gpu/diag5.py > $R/diag5.txt 2>&1; echo "diag5 rc=$?"
grep "#####" $R/diag5.txt
