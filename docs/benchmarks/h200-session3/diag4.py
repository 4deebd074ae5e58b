"""Which setups crash loading the profiler's synthetic models on the GPU host (not part of the project)."""
import json, os, subprocess, sys, time

def _placement(kind):
    from igi_sdk.planner.placement import Placement
    if kind == "cpu4":
        return Placement(n_gpu_layers=0, op_offload=False, n_ctx=1024, n_threads=4)
    if kind == "base8":
        return Placement(n_gpu_layers=0, op_offload=False, n_ctx=4096, n_ubatch=512, n_batch=512, n_threads=8, n_threads_batch=8)
    if kind == "base16":
        return Placement(n_gpu_layers=0, op_offload=False, n_ctx=4096, n_ubatch=512, n_batch=512, n_threads=16, n_threads_batch=16)
    raise ValueError(kind)

def variant(name, model, kind, verbose):
    if name == "terms_first":
        import igi_sdk.profiler.terms  # noqa
    if name == "raw":
        import llama_cpp
        mp = llama_cpp.llama_model_default_params()
        mp.n_gpu_layers = 0
        m = llama_cpp.llama_model_load_from_file(model.encode(), mp)
        print("raw loaded", bool(m), flush=True)
        return
    if name == "cpu_rate":
        from igi_sdk.profiler.terms import cpu_rate
        print(cpu_rate(MODELS["tiny"], MODELS["small"], int(kind), False), flush=True)
        return
    from igi_sdk.engine import _log
    _log.set_verbose(verbose)
    from igi_sdk.engine.llama_engine import LlamaEngine
    e = LlamaEngine(model, _placement(kind))
    e.decode([(0, [1, 300, 301], 0, True)])
    print("loaded", e.load_report.per_device_mib(), flush=True)
    e.close()

MODELS = json.loads(os.environ.get("DIAG_MODELS", "{}"))

if __name__ == "__main__":
    if len(sys.argv) > 1:
        variant(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1")
        raise SystemExit(0)
    from igi_sdk.profiler.build import _models
    from igi_sdk.synthetic import PRESETS, write_synthetic_gguf
    models = {k: str(v) for k, v in _models(False).items()}
    write_synthetic_gguf("/tmp/diag_tiny_dense.gguf", PRESETS["tiny_dense"]); models["tiny_dense"] = "/tmp/diag_tiny_dense.gguf"
    env = dict(os.environ, DIAG_MODELS=json.dumps(models))
    pre = None
    if subprocess.run("gcc -shared -fPIC -O0 -o /tmp/segv.so .gpu/segv.c", shell=True).returncode == 0:
        pre = "/tmp/segv.so"
    print("ulimit:", subprocess.run("ulimit -a", shell=True, capture_output=True, text=True).stdout.replace("\n", " | "))
    runs = [
        ("engine", "tiny", "cpu4", "script"), ("engine", "tiny", "cpu4", "c"), ("engine", "tiny", "base8", "script"),
        ("engine", "tiny", "base8", "c"), ("engine", "tiny_dense", "cpu4", "c"), ("engine", "small", "cpu4", "c"),
        ("terms_first", "tiny", "cpu4", "script"), ("terms_first", "tiny", "cpu4", "c"),
        ("raw", "tiny", "-", "c"), ("raw", "tiny_dense", "-", "c"), ("cpu_rate", "-", "8", "script"),
        ("engine", "tiny", "cpu4", "c-verbose"), ("engine", "tiny", "cpu4", "c-preload"), ("engine", "tiny", "cpu4", "c-verbose-preload"),
        ("engine", "tiny", "cpu4", "c-nomalloccheck"), ("engine", "tiny", "cpu4", "c-LC_ALL=C"),
    ]
    for name, mkey, kind, how in runs:
        model = models.get(mkey, "-")
        verbose = "1" if "verbose" in how else "0"
        e = dict(env)
        if "preload" in how and pre:
            e["LD_PRELOAD"] = pre
        if "LC_ALL" in how:
            e["LC_ALL"] = "C"; e.pop("LANG", None)
        if "nomalloccheck" in how:
            e["MALLOC_PERTURB_"] = "0"; e["GLIBC_TUNABLES"] = "glibc.malloc.tcache_count=0"
        fh = [] if "preload" in how else ["-X", "faulthandler"]
        if how.startswith("c"):
            cmd = [sys.executable, *fh, "-c", f"import sys; sys.argv=['x','{name}','{model}','{kind}','{verbose}']; exec(open('.gpu/diag4.py').read())"]
        else:
            cmd = [sys.executable, *fh, ".gpu/diag4.py", name, model, kind, verbose]
        t0 = time.time()
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=90, env=e, stdin=subprocess.DEVNULL)
            rc, out, err = p.returncode, p.stdout, p.stderr
        except subprocess.TimeoutExpired:
            rc, out, err = "timeout", "", ""
        print(f"\n##### {name} {mkey} {kind} {how}: rc={rc} ({time.time()-t0:.1f} s) out={out.strip()[-300:]!r}", flush=True)
        if rc != 0:
            print(err[-2500:], flush=True)
