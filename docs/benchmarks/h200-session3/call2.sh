T0=$(date +%s)
bash .gpu/build_on_gpu.sh && source .gpu/env.sh || exit 1
R=$OUT/r; mkdir -p $R
echo "build done at $(( $(date +%s) - T0 )) s"
timeout 200 python3 .gpu/diag4.py > $R/diag4.txt 2>&1; echo "diag rc=$? at $(( $(date +%s) - T0 )) s"
grep "#####" $R/diag4.txt
M=$(python3 -c "import time;print(round((578-(time.time()-$T0))/60,2))")
echo "bench max-minutes $M"
python3 -m igi_sdk.cli bench --model qwen3_30b_a3b --budgets-mib 2048 3072 4096 6144 8192 --ctx 4096 16384 --prompt-tokens 1024 8192 --reply-tokens 64 32 --threads 16 --profile reference:h200 --max-minutes $M --run-timeout-s 80 --out $R/bench > $R/bench-30b.log 2>&1
echo "bench rc=$?"; tail -n 5 $R/bench-30b.log
