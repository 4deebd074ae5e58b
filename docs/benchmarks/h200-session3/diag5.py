"""Which modules, imported before llama.cpp, make the tiny profiler model's load crash (not part of the project)."""
import importlib, json, os, subprocess, sys, time

if __name__ == "__main__" and len(sys.argv) > 2:
    for m in sys.argv[2].split(","):
        if m:
            importlib.import_module(m)
    from igi_sdk.engine.llama_engine import LlamaEngine
    from igi_sdk.planner.placement import Placement
    e = LlamaEngine(sys.argv[1], Placement(n_gpu_layers=0, op_offload=False, n_ctx=1024, n_threads=4))
    print("loaded", e.load_report.per_device_mib(), flush=True)
    e.close()
    raise SystemExit(0)

if __name__ == "__main__":
    from igi_sdk.model_store import cache_dir
    tiny = str(cache_dir() / "profiler" / "tiny_h64.gguf")
    pre = "/tmp/segv.so" if subprocess.run("gcc -shared -fPIC -O0 -o /tmp/segv.so .gpu/segv.c", shell=True).returncode == 0 else None
    for mods in ["", "numpy", "pydantic", "numpy,pydantic", "pydantic,numpy", "pydantic_core", "igi_sdk.planner.placement",
                 "igi_sdk.synthetic", "igi_sdk.model_store", "igi_sdk.profiler.machine", "hashlib,uuid,decimal,zoneinfo,platform,zipfile",
                 "igi_sdk.profiler.terms", "llama_cpp,igi_sdk.profiler.terms", "igi_sdk.profiler.terms#bt"]:
        env = dict(os.environ)
        fh = ["-X", "faulthandler"]
        if mods.endswith("#bt"):
            mods = mods[:-3]
            if pre:
                env["LD_PRELOAD"] = pre; env["IGI_VERBOSE"] = "1"; fh = []
        t0 = time.time()
        try:
            p = subprocess.run([sys.executable, *fh, ".gpu/diag5.py", tiny, mods], capture_output=True, text=True,
                               timeout=60, env=env, stdin=subprocess.DEVNULL)
            rc, out, err = p.returncode, p.stdout, p.stderr
        except subprocess.TimeoutExpired:
            rc, out, err = "timeout", "", ""
        print(f"##### before llama.cpp: [{mods}] {'(native bt)' if not fh else ''}: rc={rc} ({time.time()-t0:.1f} s) {out.strip()[-120:]!r}", flush=True)
        if rc != 0 and not fh:
            print(err[-5000:], flush=True)
