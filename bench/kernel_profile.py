"""Where a fused cross-entropy or LogProbs call spends its device time, kernel by kernel.

Runs logitd's walks (liblogitd_bench_capi.so) on random tensors under
torch.profiler, which records every kernel the process launches (cuBLASLt's
included), and prints per call: each kernel's time, how many times it ran and
its share of the call, with GEMMs named by the kernel that ran before them
("GEMM after GradientInPlaceKernel" is the token walk's dX product). The sum
of kernel times against the call's event-timed length shows the gaps.

    python3 bench/kernel_profile.py --logitd-lib BUILD/bench/liblogitd_bench_capi.so \
        --ce 4096x4096x128256 --ce-token-chunks 0,2048 --lp 1024x4096x128256 --lp-chunks 0,16384

A chunk of 0 is the backend's own choice.
"""
import argparse
import collections
import ctypes
import json
import math
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_report  # noqa: E402
import logitd_capi  # noqa: E402

IGNORE = -100
GEMM_MARKS = ("gemm", "nvjet", "xmma", "cutlass", "sm90_")


def parse_shapes(text):
    out = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        m, k, v = (int(n) for n in item.split("x"))
        out.append((m, k, v))
    return out


def short(name):
    base = name.replace("(anonymous namespace)::", "").replace("logitd::kernels::cuda::", "")
    if base.startswith("void "):
        base = base[5:]
    return base.split("(")[0].split("<")[0]


def is_gemm(name):
    low = name.lower()
    return any(mark in low for mark in GEMM_MARKS)


def profile(fn, calls):
    """Kernel events of `calls` calls of fn, and the event-timed ms of each call."""
    start = torch.cuda.Event(enable_timing=True)
    stop = torch.cuda.Event(enable_timing=True)
    times = []
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            start.record()
            fn()
            stop.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(stop))
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    prof.export_chrome_trace(path)
    with open(path) as f:
        trace = json.load(f)
    os.unlink(path)
    kernels = [e for e in trace.get("traceEvents", [])
               if e.get("cat") == "kernel" and "dur" in e]
    kernels.sort(key=lambda e: e["ts"])
    return kernels, times


def table(title, kernels, times, calls):
    rows = collections.OrderedDict()
    prev = "start"
    for e in kernels:
        name = e["name"]
        if is_gemm(name):
            label = f"GEMM after {prev}"
            prev = f"GEMM({prev})" if not prev.startswith("GEMM(") else prev
        else:
            label = short(name)
            prev = label
        r = rows.setdefault(label, {"us": 0.0, "n": 0, "names": set()})
        r["us"] += e["dur"]
        r["n"] += 1
        if is_gemm(name):
            r["names"].add(short(name)[:60])
    total = sum(r["us"] for r in rows.values()) / calls
    wall = sorted(times)[len(times) // 2] * 1000.0
    print(f"\n{title}: median call {wall / 1000:.3f} ms, kernels {total / 1000:.3f} ms "
          f"({100 * total / wall:.1f}% of the call)")
    print(f"  {'kernel':<58} {'per call':>8} {'ms/call':>9} {'share':>7}")
    for label, r in sorted(rows.items(), key=lambda kv: -kv[1]["us"]):
        us = r["us"] / calls
        print(f"  {label[:58]:<58} {r['n'] / calls:>8.1f} {us / 1000:>9.3f} {100 * us / total:>6.1f}%")
        for n in sorted(r["names"]):
            print(f"      {n}")
    return {"wall_ms": wall / 1000, "kernel_ms": total / 1000,
            "kernels": {k: {"ms_per_call": r["us"] / calls / 1000, "per_call": r["n"] / calls}
                        for k, r in rows.items()}}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--logitd-lib", required=True)
    ap.add_argument("--ce", default="", help="MxKxV[,...] fused cross-entropy shapes")
    ap.add_argument("--ce-token-chunks", default="0", help="token-walk chunks (0: default plan)")
    ap.add_argument("--lp", default="", help="MxKxV[,...] LogProbs shapes")
    ap.add_argument("--lp-chunks", default="0", help="vocabulary chunks (0: the backend's)")
    ap.add_argument("--top-k", type=int, default=5)
    ap.add_argument("--no-entropy", action="store_true", help="LogProbs without the entropy")
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--json", help="write the tables here")
    args = ap.parse_args()

    lib = logitd_capi.open_library(args.logitd_lib, "kernel_profile", "everything")
    if lib is None:
        return 2
    lib.logitd_bench_logprobs.argtypes = [
        ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
        ctypes.c_void_p, ctypes.c_void_p, ctypes.c_float, ctypes.c_float, ctypes.c_int,
        ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
        ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
    lib.logitd_bench_cross_entropy.argtypes = [
        ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
        ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_float,
        ctypes.c_float, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
        ctypes.c_void_p, ctypes.c_float, ctypes.c_int64, ctypes.c_int, ctypes.c_void_p]
    lib.logitd_bench_ce_chunk.restype = ctypes.c_int64
    stream = torch.cuda.current_stream().cuda_stream
    report = {}

    def tensors(m, k, v):
        gen = torch.Generator(device="cuda")
        gen.manual_seed(1234)
        x = (torch.rand((m, k), device="cuda", generator=gen) * 2 - 1).to(torch.bfloat16)
        w = ((torch.rand((v, k), device="cuda", generator=gen) * 2 - 1)
             * (3.0 / math.sqrt(k))).to(torch.bfloat16)
        t = torch.randint(0, v, (m,), device="cuda", generator=gen, dtype=torch.int64)
        return x, w, t

    for (m, k, v) in parse_shapes(args.ce):
        x, w, t = tensors(m, k, v)
        loss = torch.empty(m, device="cuda")
        dx = torch.empty((m, k), device="cuda", dtype=torch.bfloat16)
        dw = torch.empty((v, k), device="cuda")
        for chunk in (int(c) for c in args.ce_token_chunks.split(",") if c.strip()):
            engine = logitd_capi.create_engine(lib, "kernel_profile")
            walk = 0 if chunk == 0 else 2

            def call():
                if lib.logitd_bench_cross_entropy(
                        engine, m, v, k, x.data_ptr(), w.data_ptr(), t.data_ptr(), IGNORE, 0.0,
                        0.0, 1.0 / m, loss.data_ptr(), None, dx.data_ptr(), 1, dw.data_ptr(),
                        0.0, chunk, walk, stream) != 0:
                    raise RuntimeError(lib.logitd_bench_last_error().decode())

            for _ in range(3):
                call()
            torch.cuda.synchronize()
            used = lib.logitd_bench_ce_chunk(engine)
            flops = 6.0 * m * k * v
            kernels, times = profile(call, args.calls)
            title = f"cross_entropy {m}x{k}x{v}, token chunk {used}"
            entry = table(title, kernels, times, args.calls)
            print(f"  {flops / entry['wall_ms'] / 1e9:.0f} TFLOP/s (6MKV) over the call")
            report[title] = entry
            lib.logitd_bench_engine_destroy(ctypes.c_void_p(engine))

    for (m, k, v) in parse_shapes(args.lp):
        x, w, t = tensors(m, k, v)
        kk = args.top_k
        outs = [torch.empty(m, device="cuda") for _ in range(3)]
        ids = torch.empty((m, max(kk, 1)), device="cuda", dtype=torch.int32)
        tops = torch.empty((m, max(kk, 1)), device="cuda")
        for chunk in (int(c) for c in args.lp_chunks.split(",") if c.strip()):
            engine = logitd_capi.create_engine(lib, "kernel_profile")

            def call():
                if lib.logitd_bench_logprobs(
                        engine, m, v, k, x.data_ptr(), w.data_ptr(), t.data_ptr(), 1.0, 0.0, kk,
                        outs[0].data_ptr(), outs[1].data_ptr(),
                        None if args.no_entropy else outs[2].data_ptr(), None,
                        ids.data_ptr(), tops.data_ptr(), chunk, stream) != 0:
                    raise RuntimeError(lib.logitd_bench_last_error().decode())

            for _ in range(3):
                call()
            torch.cuda.synchronize()
            used = lib.logitd_bench_ce_chunk(engine)
            kernels, times = profile(call, args.calls)
            title = (f"logprobs {m}x{k}x{v} top_k={kk}{' no entropy' if args.no_entropy else ''}, "
                     f"vocabulary chunk {used}")
            entry = table(title, kernels, times, args.calls)
            print(f"  {2.0 * m * k * v / entry['wall_ms'] / 1e9:.0f} TFLOP/s (2MKV) over the call")
            report[title] = entry
            lib.logitd_bench_engine_destroy(ctypes.c_void_p(engine))

    bench_report.write_json_report(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
