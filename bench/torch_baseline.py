#!/usr/bin/env python3
"""PyTorch baseline for logitd_kernel_bench, measured the same way.

torch.mm(x, w.t()) (bf16 out), torch.mm(x, w.t(), out_dtype=torch.float32),
and the backward products dX = G.W (bf16) and dW = G^T.X (fp32 out, a
"main_grad"; bf16 too for reference) on the benchmark's shapes. Random
non-zero bf16 data, operand sets rotated until they span 4x L2, warm-up,
then the median of per-call times over event-timed samples (each after a
read of 2x L2, each at least 1 ms long) with the variants interleaved. Writes JSON for bench/compare.py.
"""
import argparse
import ctypes
import math
import statistics
import sys

import torch

import bench_report
import logitd_capi


def problems(which):
    out = []
    if which in ("seed", "all"):
        for m in (16, 128, 1024):
            for k in (1024, 2048, 4096, 8192, 16384):
                out.append((m, k, 32768, "seed"))
    if which in ("train", "all"):
        out += [(8192, 4096, 128256, "train"), (8192, 2304, 256000, "train"),
                (4096, 4096, 262144, "train")]
    return out


def random_bf16(shape, gen):
    t = torch.rand(shape, device="cuda", generator=gen, dtype=torch.float32)
    t.mul_(2).sub_(1)
    t = t.to(torch.bfloat16)
    t[t == 0] = 2.0 ** -8  # never zero
    return t


_OUT_DTYPE_TAKES_OUT = None


def mm_out_dtype(a, b, out):
    """torch.mm with fp32 output from bf16 operands, into `out` when supported."""
    global _OUT_DTYPE_TAKES_OUT
    if _OUT_DTYPE_TAKES_OUT is None:
        try:
            torch.mm(a, b, out_dtype=torch.float32, out=out)
            _OUT_DTYPE_TAKES_OUT = True
            return out
        except (TypeError, RuntimeError):
            _OUT_DTYPE_TAKES_OUT = False
    if _OUT_DTYPE_TAKES_OUT:
        return torch.mm(a, b, out_dtype=torch.float32, out=out)
    return torch.mm(a, b, out_dtype=torch.float32)


def load_logitd(path):
    """The GEMM engine of the cuda backend (bench/bench_capi.cc), or None."""
    lib = logitd_capi.open_library(path, "torch_baseline", "logitd columns")
    if lib is None:
        return None
    lib.logitd_bench_run.restype = ctypes.c_int
    lib.logitd_bench_run.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_int64,
                                     ctypes.c_int64, ctypes.c_int, ctypes.c_void_p,
                                     ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    lib.logitd_bench_choice.restype = ctypes.c_char_p
    lib.logitd_bench_choice.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int64,
                                        ctypes.c_int64, ctypes.c_int64, ctypes.c_int,
                                        ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    engine = logitd_capi.create_engine(lib, "torch_baseline")
    if engine is None:
        return None
    return lib, engine


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the report here")
    ap.add_argument("--shapes", default="all", choices=["seed", "train", "all"])
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--min-sample-us", type=float, default=1000.0)
    ap.add_argument("--logitd-lib", help="liblogitd_bench_capi.so: time logitd's GEMMs in this "
                    "process too, interleaved with PyTorch's on the same tensors")
    args = ap.parse_args()

    if not torch.cuda.is_available():
        print("torch_baseline: no CUDA device visible to PyTorch", file=sys.stderr)
        return 1
    torch.cuda.init()
    logitd = load_logitd(args.logitd_lib)
    props = torch.cuda.get_device_properties(0)
    l2 = getattr(props, "L2_cache_size", 50 << 20)
    start = torch.cuda.Event(enable_timing=True)
    stop = torch.cuda.Event(enable_timing=True)

    # Read before every sample (as the C++ benchmark does), so that no variant
    # pays for writing back another's output from L2.
    scrub = torch.zeros(2 * l2 // 4, device="cuda", dtype=torch.float32)

    def sample(fn, inner):
        scrub.sum()
        start.record()
        for _ in range(inner):
            fn()
        stop.record()
        stop.synchronize()
        return start.elapsed_time(stop) * 1000.0 / inner  # us per call

    report = {
        "mm_out_dtype_into_out": None,
        "date": "2026-12-02",
        "device": {"name": props.name, "sms": props.multi_processor_count, "l2_bytes": l2},
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "method": {"reps": args.reps, "warmup": args.warmup, "min_sample_us": args.min_sample_us,
                   "statistic": "median of per-call times; a sample = inner calls between "
                                "two CUDA events"},
        "logitd_in_process": logitd is not None,
        "gemm": [],
    }
    print(f"device: {props.name}, torch {torch.__version__}, CUDA {torch.version.cuda}")
    for (m, k, n, group) in problems(args.shapes):
        set_bytes = (m * k + n * k + m * n) * 2
        sets = max(1, min(8, math.ceil(4 * l2 / set_bytes)))
        gen = torch.Generator(device="cuda")
        operand_sets = []
        for s in range(sets):
            gen.manual_seed(1000 + s)
            operand_sets.append((random_bf16((m, k), gen), random_bf16((n, k), gen),
                                 random_bf16((m, n), gen)))
        y16 = torch.empty((m, n), device="cuda", dtype=torch.bfloat16)
        y32 = torch.empty((m, n), device="cuda", dtype=torch.float32)
        dx16 = torch.empty((m, k), device="cuda", dtype=torch.bfloat16)
        dw32 = torch.empty((n, k), device="cuda", dtype=torch.float32)
        dw16 = torch.empty((n, k), device="cuda", dtype=torch.bfloat16)
        counter = [0]

        def nxt():
            s = operand_sets[counter[0] % sets]
            counter[0] += 1
            return s

        def v_bf16():
            x, w, _ = nxt()
            torch.mm(x, w.t(), out=y16)

        def v_fp32():
            x, w, _ = nxt()
            mm_out_dtype(x, w.t(), y32)

        def v_dx():
            _, w, g = nxt()
            torch.mm(g, w, out=dx16)

        def v_dw():
            x, _, g = nxt()
            mm_out_dtype(g.t(), x, dw32)

        def v_dw_bf16():
            x, _, g = nxt()
            torch.mm(g.t(), x, out=dw16)

        variants = {"torch_bf16": v_bf16, "torch_fp32": v_fp32, "torch_dx": v_dx,
                    "torch_dw": v_dw, "torch_dw_bf16": v_dw_bf16}
        if logitd is not None:
            lib, engine = logitd
            ly32 = torch.empty_like(y32)
            ly16 = torch.empty_like(y16)
            ldx16 = torch.empty_like(dx16)
            ldw32 = torch.empty_like(dw32)

            # Everything a call needs is looked up once, so that the Python side
            # adds as little as possible per call (ctypes converts ten integers).
            stream = torch.cuda.current_stream().cuda_stream
            ptrs = [(x.data_ptr(), w.data_ptr(), g.data_ptr()) for (x, w, g) in operand_sets]
            run_c = lib.logitd_bench_run
            y32_p, y16_p = ly32.data_ptr(), ly16.data_ptr()
            dx_p, dw_p = ldx16.data_ptr(), ldw32.data_ptr()

            def call(op, out_bf16, p, q, c):
                if run_c(engine, op, m, n, k, out_bf16, p, q, c, stream) != 0:
                    raise RuntimeError(lib.logitd_bench_last_error().decode())

            def run(op, out_bf16, p, q, c):
                call(op, out_bf16, p.data_ptr(), q.data_ptr(), c.data_ptr())

            def nxt_ptrs():
                s = ptrs[counter[0] % sets]
                counter[0] += 1
                return s

            def l_fp32():
                x, w, _ = nxt_ptrs()
                call(0, 0, x, w, y32_p)

            def l_bf16():
                x, w, _ = nxt_ptrs()
                call(0, 1, x, w, y16_p)

            def l_dx():
                _, w, g = nxt_ptrs()
                call(1, 1, g, w, dx_p)

            def l_dw():
                x, _, g = nxt_ptrs()
                call(2, 0, g, x, dw_p)

            variants.update({"logitd_fp32": l_fp32, "logitd_bf16": l_bf16, "logitd_dx": l_dx,
                             "logitd_dw": l_dw})
        inner = {}
        for name, fn in variants.items():
            for _ in range(args.warmup):
                fn()
            est = sample(fn, 3)
            inner[name] = int(min(64, max(1, math.ceil(args.min_sample_us / max(est, 1e-3)))))
        samples = {name: [] for name in variants}
        names = list(variants)
        for r in range(args.reps):
            # Interleaved, starting one further on each time, as in C++.
            for name in names[r % len(names):] + names[:r % len(names)]:
                samples[name].append(sample(variants[name], inner[name]))
        flops = 2.0 * m * n * k
        entry = {"m": m, "k": k, "n": n, "group": group, "sets": sets, "variants": {}}
        for name in variants:
            med = statistics.median(samples[name])
            entry["variants"][name] = {"median_us": med, "tflops": flops / (med * 1e-6) / 1e12,
                                       "inner": inner[name], "samples": len(samples[name]),
                                       "min_us": min(samples[name])}
        if logitd is not None:
            # Both libraries on operand set 0: how far apart are the results?
            x, w, g = operand_sets[0]
            pairs = [("fp32", lambda: mm_out_dtype(x, w.t(), y32), lambda: run(0, 0, x, w, ly32),
                      ly32),
                     ("dx", lambda: torch.mm(g, w, out=dx16), lambda: run(1, 1, g, w, ldx16),
                      ldx16),
                     ("dw", lambda: mm_out_dtype(g.t(), x, dw32), lambda: run(2, 0, g, x, ldw32),
                      ldw32)]
            agree = {}
            for name, ft, fl, yl in pairs:
                yt = ft()
                fl()
                torch.cuda.synchronize()
                scale = yt.float().abs().max().item() or 1.0
                agree[name] = {"max_abs_diff_rel": (yt.float() - yl.float()).abs().max().item()
                               / scale,
                               "bitwise_equal": bool(torch.equal(yt, yl))}
            entry["logitd_vs_torch"] = agree
            entry["logitd_algos"] = {
                "fp32": lib.logitd_bench_choice(engine, 0, m, n, k, 0, x.data_ptr(), w.data_ptr(),
                                                ly32.data_ptr()).decode(),
                "dx": lib.logitd_bench_choice(engine, 1, m, n, k, 1, g.data_ptr(), w.data_ptr(),
                                              ldx16.data_ptr()).decode(),
                "dw": lib.logitd_bench_choice(engine, 2, m, n, k, 0, g.data_ptr(), x.data_ptr(),
                                              ldw32.data_ptr()).decode()}
        tf = {name: entry["variants"][name]["tflops"] for name in variants}
        print(f"M={m:5d} K={k:5d} N={n:6d} | bf16 {tf['torch_bf16']:6.1f} "
              f"fp32-out {tf['torch_fp32']:6.1f} | dX {tf['torch_dx']:6.1f} "
              f"dW fp32 {tf['torch_dw']:6.1f} dW bf16 {tf['torch_dw_bf16']:6.1f}" +
              (f" | logitd fp32 {tf['logitd_fp32']:6.1f} dX {tf['logitd_dx']:6.1f} "
               f"dW {tf['logitd_dw']:6.1f}" if logitd is not None else ""), flush=True)
        report["gemm"].append(entry)
        del operand_sets, y16, y32, dx16, dw32, dw16, variants
        if logitd is not None:
            del ly32, ly16, ldx16, ldw32
        torch.cuda.empty_cache()

    report["mm_out_dtype_into_out"] = _OUT_DTYPE_TAKES_OUT
    bench_report.write_json_report(args.json, report, indent=2)
    if args.json:
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
