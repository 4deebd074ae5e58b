"""GPU probe of what host memory costs a worker's start and exit (device tool; no build needed, only the CUDA runtime
and nvidia-ml-py): ``python3 .ci/gpu_pin_probe.py [KIND ...]`` (``PIN_GIB``: the size, default 4).

Each KIND runs in a process of its own, which creates a CUDA context, gets ``PIN_GIB`` GiB of host memory one way,
copies it to as much device memory (``h2d_gb_s``), then exits; the parent samples NVML's device memory meanwhile:
- ``none``: the context alone; ``pageable``: anonymous memory, not pinned;
- ``hostalloc``: ``cudaHostAlloc`` (llama.cpp's ``CUDA_Host`` buffers: what the weight cache's pinned host copy uses);
- ``register4k`` / ``registerthp``: anonymous memory, touched, then ``cudaHostRegister`` (``unpin_s`` / ``repin_s``:
  unregistered and registered again), on 4 KiB pages or with transparent huge pages (``MADV_HUGEPAGE``);
- ``hostalloc_freefirst`` / ``_reset`` / ``_freehost``: ``hostalloc``, and before the exit the device buffer freed /
  ``cudaDeviceReset`` / the device buffer and then the host buffer freed;
- ``rel_one`` / ``rel_one4k`` / ``rel_resetonly`` / ``rel_chunks_seq`` / ``rel_chunks_par``: what releasing the devices
  with a registered host copy costs (patches/llama.cpp 0010), the process staying alive: the device buffer freed, the
  copy unregistered (one block on huge pages / on 4 KiB pages / not at all, left to ``cudaDeviceReset`` / in chunks of
  ``CHUNK_GIB`` one after another / on ``THREADS`` threads; the chunks registered the same way), then
  ``cudaDeviceReset``; ``unregister_s``, ``reset_s``, and after the parent's NVML reading the registration again
  (``reacquire_ctx_s``: the new context, ``reacquire_s``). A copy may not cross two registrations (``cudaMemcpy``
  refuses it), so the chunked kinds copy chunk by chunk: whether the driver unpins chunks side by side is what
  ``rel_chunks_par`` against ``rel_chunks_seq`` tells;
- ``rel_overlap``: the host copy registered as one block, then whether its unregistration runs beside a copy of
  ``EXPORT_MIB`` MiB of device memory into pageable memory in ``EXPORT_PIECES`` copies (a detach's export of the
  sessions' KV cache): ``export_alone_s``, ``overlap_wall_s`` (with its ``overlap_export_s`` and
  ``overlap_unregister_s``), ``unregister_alone_s``.
Printed per KIND (one JSON line; ``$OUT/pin_probe.json`` all of them): ``ctx_s``, ``pin_s``, ``touch_s``, ``h2d_s``,
the memory held, and from the exit's start: ``exit_to_half_s`` (NVML shows half of it gone), ``exit_to_within_s``
(within 4 MiB of the reading before the process), ``exit_to_reaped_s``.
"""

import ctypes
import glob
import json
import mmap
import multiprocessing as mp
import os
import sys
import time

GIB = 1 << 30
SIZE = int(float(os.environ.get("PIN_GIB", "4")) * GIB)


def cudart():
    for pat in (
        "/usr/local/cuda/lib64/libcudart.so*",
        "/usr/local/cuda*/lib64/libcudart.so*",
        "/usr/lib/x86_64-linux-gnu/libcudart.so*",
    ):
        for p in sorted(glob.glob(pat)):
            try:
                return ctypes.CDLL(p)
            except OSError:
                pass
    import torch  # noqa: F401

    for p in glob.glob(
        os.path.join(os.path.dirname(torch.__file__), "..", "nvidia", "cuda_runtime", "lib", "libcudart.so*")
    ):
        return ctypes.CDLL(p)
    raise SystemExit("no libcudart")


def ck(rc, what):
    if rc != 0:
        raise RuntimeError(f"{what}: cuda error {rc}")


def anon(size, huge):
    m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if huge:
        m.madvise(mmap.MADV_HUGEPAGE)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
    t = time.perf_counter()
    ctypes.memset(addr, 1, size)
    return m, addr, time.perf_counter() - t


CHUNK = int(float(os.environ.get("CHUNK_GIB", "1")) * GIB)
THREADS = int(os.environ.get("THREADS", "8"))


def each(threads, items, fn):
    """fn on every item, on ``threads`` threads (ctypes calls run without the GIL)."""
    import concurrent.futures

    if threads <= 1:
        for it in items:
            fn(it)
        return
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        list(pool.map(fn, items))


def register_blocks(rt, addr, kind):
    """The host copy registered as one block, or in chunks (``rel_chunks_*``); the blocks as (address, bytes)."""
    if kind.startswith("rel_chunks"):
        blocks = [(addr + o, min(CHUNK, SIZE - o)) for o in range(0, SIZE, CHUNK)]
    else:
        blocks = [(addr, SIZE)]
    threads = THREADS if kind == "rel_chunks_par" else 1
    each(
        threads, blocks, lambda b: ck(rt.cudaHostRegister(ctypes.c_void_p(b[0]), ctypes.c_size_t(b[1]), 0), "register")
    )
    return blocks


EXPORT = int(float(os.environ.get("EXPORT_MIB", "192")) * (1 << 20))
EXPORT_PIECES = int(os.environ.get("EXPORT_PIECES", "64"))


def overlap(rt, blocks):
    """``rel_overlap``: can the driver unpin the host copy while the context still copies device memory out (a
    detach's export of the sessions' KV cache, one copy per layer and K / V into pageable memory)? The export alone,
    then the export and the unregistration on two threads at once, then (registered again) the unregistration alone."""
    import threading

    kv = ctypes.c_void_p()
    ck(rt.cudaMalloc(ctypes.byref(kv), ctypes.c_size_t(EXPORT)), "malloc kv")
    ck(rt.cudaMemset(kv, 1, ctypes.c_size_t(EXPORT)), "memset kv")
    ck(rt.cudaDeviceSynchronize(), "sync")
    _keep, dst, _ = anon(EXPORT, False)
    piece = EXPORT // EXPORT_PIECES

    def export():
        t = time.perf_counter()
        for i in range(EXPORT_PIECES):
            src = ctypes.c_void_p(kv.value + i * piece)
            ck(rt.cudaMemcpy(ctypes.c_void_p(dst + i * piece), src, ctypes.c_size_t(piece), 2), "d2h")
        return time.perf_counter() - t

    def unregister():
        t = time.perf_counter()
        for b in blocks:
            ck(rt.cudaHostUnregister(ctypes.c_void_p(b[0])), "unregister")
        return time.perf_counter() - t

    r = {"export_mib": EXPORT >> 20, "export_pieces": EXPORT_PIECES, "export_alone_s": export()}
    times = {}
    t = time.perf_counter()
    th = threading.Thread(target=lambda: times.update(unregister_s=unregister()))
    th.start()
    times["export_s"] = export()
    th.join()
    r.update(
        {
            "overlap_wall_s": time.perf_counter() - t,
            "overlap_export_s": times["export_s"],
            "overlap_unregister_s": times["unregister_s"],
        }
    )
    for b in blocks:
        ck(rt.cudaHostRegister(ctypes.c_void_p(b[0]), ctypes.c_size_t(b[1]), 0), "register again")
    r["unregister_alone_s"] = unregister()
    r["export_after_s"] = export()
    return r


def child(kind, q, go):
    r = {"kind": kind}
    rt = cudart()
    t = time.perf_counter()
    ck(rt.cudaFree(ctypes.c_void_p(0)), "ctx")
    r["ctx_s"] = time.perf_counter() - t
    dev = ctypes.c_void_p()
    host = ctypes.c_void_p()
    keep = None
    if kind in ("hostalloc", "hostalloc_freefirst", "hostalloc_reset", "hostalloc_freehost"):
        t = time.perf_counter()
        ck(rt.cudaHostAlloc(ctypes.byref(host), ctypes.c_size_t(SIZE), 0), "hostalloc")
        r["pin_s"] = time.perf_counter() - t
        t = time.perf_counter()
        ctypes.memset(host.value, 1, SIZE)
        r["touch_s"] = time.perf_counter() - t
    elif kind in ("register4k", "registerthp"):
        keep, addr, r["touch_s"] = anon(SIZE, kind == "registerthp")
        host.value = addr
        t = time.perf_counter()
        ck(rt.cudaHostRegister(ctypes.c_void_p(addr), ctypes.c_size_t(SIZE), 0), "register")
        r["pin_s"] = time.perf_counter() - t
    elif kind.startswith("rel_"):
        keep, addr, r["touch_s"] = anon(SIZE, kind != "rel_one4k")
        host.value = addr
        t = time.perf_counter()
        blocks = register_blocks(rt, addr, kind)
        r["pin_s"] = time.perf_counter() - t
        r["blocks"] = len(blocks)
    elif kind == "pageable":
        keep, addr, r["touch_s"] = anon(SIZE, False)
        host.value = addr
    if kind != "none":
        ck(rt.cudaMalloc(ctypes.byref(dev), ctypes.c_size_t(SIZE)), "malloc")
        t = time.perf_counter()
        if kind.startswith("rel_chunks"):  # a copy may not cross two registrations (cudaErrorInvalidValue): one each
            for addr_c, size_c in blocks:
                dst = ctypes.c_void_p(dev.value + (addr_c - host.value))
                ck(rt.cudaMemcpy(dst, ctypes.c_void_p(addr_c), ctypes.c_size_t(size_c), 1), "h2d")
        else:
            ck(rt.cudaMemcpy(dev, host, ctypes.c_size_t(SIZE), 1), "h2d")
        ck(rt.cudaDeviceSynchronize(), "sync")
        r["h2d_s"] = time.perf_counter() - t
        r["h2d_gb_s"] = SIZE / r["h2d_s"] / 1e9
    if kind in ("register4k", "registerthp"):
        # unpin cost measured in a copy: register a second time is not allowed; time unregister then register again
        t = time.perf_counter()
        ck(rt.cudaHostUnregister(host), "unregister")
        r["unpin_s"] = time.perf_counter() - t
        t = time.perf_counter()
        ck(rt.cudaHostRegister(host, ctypes.c_size_t(SIZE), 0), "register again")
        r["repin_s"] = time.perf_counter() - t
    q.put(r)
    go.wait()
    t0 = time.perf_counter()
    if kind == "hostalloc_freefirst":
        ck(rt.cudaFree(dev), "free dev")
        r2 = time.perf_counter() - t0
        q.put({"free_dev_s": r2})
    elif kind == "hostalloc_reset":
        ck(rt.cudaDeviceReset(), "reset")
        q.put({"reset_s": time.perf_counter() - t0})
    elif kind == "rel_overlap":
        ck(rt.cudaFree(dev), "free dev")
        q.put(overlap(rt, blocks))
        t1 = time.perf_counter()
        ck(rt.cudaDeviceReset(), "reset")
        q.put({"reset_s": time.perf_counter() - t1})
    elif kind.startswith("rel_"):
        ck(rt.cudaFree(dev), "free dev")
        t1 = time.perf_counter()
        if kind != "rel_resetonly":
            threads = THREADS if kind == "rel_chunks_par" else 1
            each(threads, blocks, lambda b: ck(rt.cudaHostUnregister(ctypes.c_void_p(b[0])), "unregister"))
        t2 = time.perf_counter()
        ck(rt.cudaDeviceReset(), "reset")
        t3 = time.perf_counter()
        rel = {"free_dev_s": t1 - t0, "unregister_s": t2 - t1, "reset_s": t3 - t2}
        q.put(rel)
        time.sleep(2.0)  # the parent reads NVML meanwhile; the process holds no context now
        t = time.perf_counter()
        try:
            ck(rt.cudaFree(ctypes.c_void_p(0)), "ctx again")
            t1 = time.perf_counter()
            register_blocks(rt, addr, kind)
            q.put({"reacquire_ctx_s": t1 - t, "reacquire_s": time.perf_counter() - t1})
        except RuntimeError as exc:
            q.put({"reacquire_error": str(exc)})
    elif kind == "hostalloc_freehost":
        ck(rt.cudaFree(dev), "free dev")
        t1 = time.perf_counter()
        ck(rt.cudaFreeHost(host), "freehost")
        q.put({"free_dev_s": t1 - t0, "freehost_s": time.perf_counter() - t1})
    else:
        q.put({})
    q.close()
    q.join_thread()
    os._exit(0)


def nvml_used(h):
    import pynvml

    return pynvml.nvmlDeviceGetMemoryInfo(h).used / (1 << 20)


def main():
    import pynvml

    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    print("gpu", pynvml.nvmlDeviceGetName(h), "size GiB", SIZE / GIB, flush=True)
    try:
        print("thp", open("/sys/kernel/mm/transparent_hugepage/enabled").read().strip())
    except OSError:
        pass
    ctx = mp.get_context("spawn")
    kinds = sys.argv[1:] or [
        "none",
        "pageable",
        "hostalloc",
        "register4k",
        "registerthp",
        "hostalloc_freefirst",
        "hostalloc_reset",
        "hostalloc_freehost",
    ]
    out = []
    for kind in kinds:
        base = nvml_used(h)
        q, go = ctx.Queue(), ctx.Event()
        p = ctx.Process(target=child, args=(kind, q, go))
        t_start = time.perf_counter()
        p.start()
        r = q.get(timeout=300)
        r["start_to_ready_s"] = time.perf_counter() - t_start
        r["held_mib"] = nvml_used(h) - base
        samples = []
        t0 = time.perf_counter()
        go.set()
        within = None
        exited = None
        while time.perf_counter() - t0 < 20:
            u = nvml_used(h) - base
            now = time.perf_counter() - t0
            samples.append((round(now, 4), round(u, 1)))
            if within is None and u <= 4:
                within = now
            if exited is None and p.exitcode is not None:
                exited = now
            if within is not None and (exited is not None or kind.startswith("rel_")):
                break
            time.sleep(0.002)
        r.update(q.get(timeout=30))
        if kind.startswith("rel_"):
            r.update(q.get(timeout=60))
        p.join()
        r["exit_to_within_s"] = within
        r["exit_to_reaped_s"] = exited
        # first sample at which device memory had dropped by half
        half = next((s for s, u in samples if u <= r["held_mib"] / 2), None)
        r["exit_to_half_s"] = half
        r = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()}
        print(json.dumps(r), flush=True)
        out.append(r)
        time.sleep(0.5)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "pin_probe.json"), "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
