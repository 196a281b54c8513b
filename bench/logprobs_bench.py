#!/usr/bin/env python3
"""Per-token log-probabilities of an LM head: logitd's LogProbs against PyTorch.

One process, the same tensors, the same stream. Each variant returns, per
token, the target's log-probability, the log-sum-exp, the entropy and the
top-k ids and log-probabilities of the fp32 logits X.W^T:
  logitd          the cuda backend's LogProbs walk (bench/bench_capi.cc ->
                  kernels::cuda::RunLogProbs): fp32 logits chunk by chunk,
                  never [M, V] at once
  logitd_rank     the same plus each target's rank (the logits twice)
  torch_eager     y = torch.mm(x, w.t(), out_dtype=float32); logsumexp,
                  gather, softmax entropy, torch.topk: [M, V] fp32 in memory
  torch_compile   (--compile) the same under torch.compile
  torch_bf16      (--bf16) the same from logits rounded to bf16, which is what
                  a bf16 LM head gives: its error is reported, for contrast

Time per call is the median of event-timed single calls after warm-up, the
variants interleaved. Peak device memory counts what a call adds beyond x and
w. Errors are against an fp64 reference of sampled rows. Writes JSON and
prints a table (times and ratios against the fastest PyTorch variant).
"""
import argparse
import ctypes
import math
import statistics
import sys

import torch

import bench_report
import logitd_capi


def parse_shapes(text):
    return [tuple(int(p) for p in item.lower().split("x")) for item in text.split(",")]


def load_logitd(path):
    lib = logitd_capi.open_library(path, "logprobs_bench", "logitd")
    if lib is None:
        return None
    try:
        fn = lib.logitd_bench_logprobs
    except AttributeError:
        print(f"logprobs_bench: {path} has no LogProbs entry point; logitd left out",
              file=sys.stderr)
        return None
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                   ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_float,
                   ctypes.c_float, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                   ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                   ctypes.c_int64, ctypes.c_void_p]
    lib.logitd_bench_device_bytes.restype = ctypes.c_uint64
    lib.logitd_bench_device_bytes.argtypes = [ctypes.c_void_p]
    engine = logitd_capi.create_engine(lib, "logprobs_bench")
    if engine is None:
        return None
    return lib, engine


def torch_logprobs(y, t, top_k):
    lse = torch.logsumexp(y, dim=1)
    logprob = y.gather(1, t[:, None]).squeeze(1) - lse
    p = torch.softmax(y, dim=1)
    entropy = lse - (p * y).sum(dim=1)
    vals, ids = torch.topk(y, top_k, dim=1)
    return logprob, lse, entropy, ids, vals - lse[:, None]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the report here")
    ap.add_argument("--shapes", default="16x4096x128256,1024x4096x128256,4096x4096x128256")
    ap.add_argument("--top-k", type=int, default=5)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--check-rows", type=int, default=8)
    ap.add_argument("--compile", action="store_true", help="also time torch.compile")
    ap.add_argument("--bf16", action="store_true", help="also time the bf16-logits variant")
    ap.add_argument("--logitd-lib", help="liblogitd_bench_capi.so")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("logprobs_bench: no CUDA device visible to PyTorch", file=sys.stderr)
        return 1
    props = torch.cuda.get_device_properties(0)
    logitd = load_logitd(args.logitd_lib)
    stream = torch.cuda.current_stream().cuda_stream
    start = torch.cuda.Event(enable_timing=True)
    stop = torch.cuda.Event(enable_timing=True)
    report = {"device": props.name, "torch": torch.__version__, "top_k": args.top_k,
              "method": "median of event-timed single calls, variants interleaved",
              "shapes": []}
    print(f"device: {props.name}, torch {torch.__version__}", flush=True)
    compiled = torch.compile(torch_logprobs) if args.compile else None

    for (m, k, v) in parse_shapes(args.shapes):
        gen = torch.Generator(device="cuda")
        gen.manual_seed(4321)
        x = (torch.rand((m, k), device="cuda", generator=gen) * 2 - 1).to(torch.bfloat16)
        w = ((torch.rand((v, k), device="cuda", generator=gen) * 2 - 1)
             * (3.0 / math.sqrt(k))).to(torch.bfloat16)
        t = torch.randint(0, v, (m,), device="cuda", generator=gen, dtype=torch.int64)
        kk = args.top_k
        variants = {}

        def logitd_call(rank):
            lib, engine = logitd
            out = {"logprob": torch.empty(m, device="cuda"), "lse": torch.empty(m, device="cuda"),
                   "entropy": torch.empty(m, device="cuda"),
                   "ids": torch.empty((m, kk), device="cuda", dtype=torch.int32),
                   "topk": torch.empty((m, kk), device="cuda")}
            rk = torch.empty(m, device="cuda", dtype=torch.int64) if rank else None

            def call():
                rc = lib.logitd_bench_logprobs(
                    engine, m, v, k, x.data_ptr(), w.data_ptr(), t.data_ptr(), 1.0, 0.0, kk,
                    out["logprob"].data_ptr(), out["lse"].data_ptr(), out["entropy"].data_ptr(),
                    rk.data_ptr() if rk is not None else None, out["ids"].data_ptr(),
                    out["topk"].data_ptr(), 0, stream)
                if rc != 0:
                    raise RuntimeError(lib.logitd_bench_last_error().decode())
                return (out["logprob"], out["lse"], out["entropy"], out["ids"], out["topk"])
            return call

        if logitd is not None:
            variants["logitd"] = logitd_call(False)
            variants["logitd_rank"] = logitd_call(True)
        variants["torch_eager"] = lambda: torch_logprobs(
            torch.mm(x, w.t(), out_dtype=torch.float32), t, kk)
        if compiled is not None:
            variants["torch_compile"] = lambda: compiled(
                torch.mm(x, w.t(), out_dtype=torch.float32), t, kk)
        if args.bf16:
            variants["torch_bf16"] = lambda: torch_logprobs(torch.mm(x, w.t()).float(), t, kk)

        # fp64 reference of sampled rows.
        rows = torch.linspace(0, m - 1, min(m, args.check_rows), device="cuda").long()
        y64 = x[rows].double() @ w.double().t()
        ref_lse = torch.logsumexp(y64, dim=1)
        ref_lp = y64.gather(1, t[rows][:, None]).squeeze(1) - ref_lse
        ref_h = ref_lse - (torch.softmax(y64, dim=1) * y64).sum(dim=1)
        ref_ids = torch.topk(y64, kk, dim=1).indices

        times = {name: [] for name in variants}
        peaks = {}
        results = {}
        for name, fn in variants.items():
            for _ in range(args.warmup):
                fn()
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            results[name] = fn()
            torch.cuda.synchronize()
            extra = logitd[0].logitd_bench_device_bytes(logitd[1]) if name.startswith("logitd") else 0
            peaks[name] = torch.cuda.max_memory_allocated() - base + extra
        for _ in range(args.reps):
            for name, fn in variants.items():
                start.record()
                fn()
                stop.record()
                stop.synchronize()
                times[name].append(start.elapsed_time(stop))
        entry = {"m": m, "k": k, "v": v, "variants": {}}
        print(f"\n{m}x{k}x{v} (MxKxV), top-{kk}")
        print(f"{'variant':<15}{'ms':>9}{'ratio':>8}{'peak MiB':>10}{'logprob err':>13}"
              f"{'entropy err':>13}{'top-k ids':>10}")
        torch_best = min((statistics.median(v_) for n, v_ in times.items()
                          if n.startswith("torch") and n != "torch_bf16"), default=None)
        for name in variants:
            ms = statistics.median(times[name])
            lp, lse, h, ids, _ = results[name]
            lp_err = (lp[rows].double() - ref_lp).abs().max().item()
            h_err = (h[rows].double() - ref_h).abs().max().item()
            ids_ok = bool((ids[rows].long() == ref_ids).all().item())
            ratio = torch_best / ms if torch_best else float("nan")
            entry["variants"][name] = {"ms": ms, "speedup_vs_best_torch": ratio,
                                       "peak_bytes": peaks[name], "max_logprob_err": lp_err,
                                       "max_entropy_err": h_err, "topk_ids_match": ids_ok}
            print(f"{name:<15}{ms:9.3f}{ratio:8.2f}{peaks[name] / 2**20:10.0f}{lp_err:13.2e}"
                  f"{h_err:13.2e}{str(ids_ok):>10}", flush=True)
        report["shapes"].append(entry)
        del x, w, t, results
        torch.cuda.empty_cache()
    bench_report.write_json_report(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
