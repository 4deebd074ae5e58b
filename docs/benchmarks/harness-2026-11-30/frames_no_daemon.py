import os, sys, time
os.environ["OPENBLAS_NUM_THREADS"]="1"
sys.path.insert(0, "samples")
from igi_harness.workload import RenderWorkload
sys.setswitchinterval(0.001)
w = RenderWorkload.calibrate(16.667, 0.5, "cpu", 2)
def run(sec):
    iv=[]; wk=[]; nxt=time.perf_counter(); prev=None
    end=time.perf_counter()+sec
    while time.perf_counter()<end:
        s=time.perf_counter()
        if prev: iv.append((s-prev)*1000)
        w.run(); wk.append((time.perf_counter()-s)*1000); prev=s
        nxt+=1/60; d=nxt-time.perf_counter()
        if d>0: time.sleep(d)
        else: nxt=time.perf_counter()
    iv.sort(); wk.sort()
    return "interval p50 %.1f p99 %.1f | work p50 %.1f p99 %.1f | >19.2ms %.1f%%" % (iv[len(iv)//2], iv[int(.99*len(iv))], wk[len(wk)//2], wk[int(.99*len(wk))], 100*sum(x>19.17 for x in iv)/len(iv))
print(sys.argv[1], run(15), flush=True)
