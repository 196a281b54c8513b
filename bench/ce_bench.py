#!/usr/bin/env python3
"""Fused LM-head cross-entropy: logitd against PyTorch, loss + dX + dW.

One process, the same tensors, the same stream. Variants:
  logitd        the cuda backend's fused walk (bench/bench_capi.cc ->
                kernels::cuda::RunCrossEntropy): fp32 logits chunk by chunk,
                per-token loss, G = bf16(dL/dz * scale), dX bf16, dW fp32
                (the walk it picks: by tokens when a chunk of tokens fits)
  logitd_vocab_walk the same by vocabulary chunks, recomputing each chunk's
                logits for the gradients (the other walk, for comparison)
  logitd_tokens_N (--token-chunks N,...) the token walk at N tokens per chunk
  logitd_loss_only  its first pass alone: per-token loss, no gradients
  torch_eager   y = torch.mm(x, w.t(), out_dtype=float32); F.cross_entropy
                (mean over counted tokens) and autograd to dL/dy; G = bf16(dL/dy);
                dX = G.W (bf16); dW = torch.mm(G.t(), x, out_dtype=float32)
  torch_compile (--compile) the same arithmetic written out (logsumexp,
                softmax - onehot) under torch.compile; compiling takes minutes
  liger_bf16, liger_fp32  Liger-Kernel's LigerFusedLinearCrossEntropyLoss
                (accumulating in bf16 and in fp32), when liger_kernel is installed
  cce, cce_exact  cut_cross_entropy.linear_cross_entropy with its default
                gradient filter and without it, when cut_cross_entropy is installed
                (--no-peers leaves both out)

Time per call is the median of event-timed single calls after warm-up, the
variants interleaved. Peak device memory counts what a call adds beyond its
inputs (x, w, targets), outputs included: torch.cuda.max_memory_allocated for
PyTorch; for logitd the outputs (allocated by PyTorch) plus the device bytes
its engine holds (cuBLASLt workspace and cross-entropy scratch). TFLOP/s are
counted on 6*M*K*V. A cross-check compares logitd's per-token loss, dX and
dW with the eager results, and every variant's per-token loss is compared with
an fp64 reference on a sample of rows (loss err: the largest absolute
difference; bf16_logits is F.cross_entropy of the logits rounded to bf16, for
scale). Writes JSON and prints a table last.
"""
import argparse
import ctypes
import math
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import bench_report
import logitd_capi

IGNORE = -100


def parse_shapes(text):
    out = []
    for item in text.split(","):
        m, k, v = (int(p) for p in item.lower().split("x"))
        out.append((m, k, v))
    return out


def load_logitd(path):
    lib = logitd_capi.open_library(path, "ce_bench", "logitd")
    if lib is None:
        return None
    try:
        ce = lib.logitd_bench_cross_entropy
    except AttributeError:
        print(f"ce_bench: {path} has no cross-entropy entry point; logitd left out",
              file=sys.stderr)
        return None
    ce.restype = ctypes.c_int
    ce.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                   ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                   ctypes.c_float, ctypes.c_float, ctypes.c_float, ctypes.c_void_p,
                   ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                   ctypes.c_float, ctypes.c_int64, ctypes.c_int, ctypes.c_void_p]
    lib.logitd_bench_ce_chunk.restype = ctypes.c_int64
    lib.logitd_bench_engine_destroy.argtypes = [ctypes.c_void_p]
    lib.logitd_bench_ce_walk.restype = ctypes.c_int
    lib.logitd_bench_ce_walk.argtypes = [ctypes.c_void_p]
    lib.logitd_bench_ce_chunk.argtypes = [ctypes.c_void_p]
    lib.logitd_bench_device_bytes.restype = ctypes.c_uint64
    lib.logitd_bench_device_bytes.argtypes = [ctypes.c_void_p]
    engine = logitd_capi.create_engine(lib, "ce_bench")
    if engine is None:
        return None
    return lib, engine


_MM_OUT_DTYPE = None


def mm_fp32(a, b):
    """bf16 x bf16 -> fp32 with fp32 accumulation (the contract's product).

    Falls back to an fp32 product of the widened operands (same values, slower)
    where this PyTorch has no out_dtype; the report then says so."""
    global _MM_OUT_DTYPE
    if _MM_OUT_DTYPE is None:
        try:
            out = torch.mm(a, b, out_dtype=torch.float32)
            _MM_OUT_DTYPE = True
            return out
        except (TypeError, RuntimeError) as e:
            print(f"ce_bench: torch.mm(out_dtype=float32) unavailable ({e}); using fp32 "
                  "operands", file=sys.stderr)
            _MM_OUT_DTYPE = False
    if _MM_OUT_DTYPE:
        return torch.mm(a, b, out_dtype=torch.float32)
    return torch.mm(a.float(), b.float())


def eager(x, w, t):
    y = mm_fp32(x, w.t())
    y.requires_grad_(True)
    loss = F.cross_entropy(y, t, ignore_index=IGNORE)
    (gy,) = torch.autograd.grad(loss, y)
    del y
    g = gy.to(torch.bfloat16)
    del gy
    dx = torch.mm(g, w)
    dw = mm_fp32(g.t(), x)
    return loss.detach(), dx, dw


def written_out(x, w, t):
    """The same loss and gradients without autograd, for torch.compile."""
    y = mm_fp32(x, w.t())
    valid = t != IGNORE
    tt = torch.where(valid, t, torch.zeros_like(t))
    lse = torch.logsumexp(y, dim=1)
    zt = y.gather(1, tt[:, None]).squeeze(1)
    count = valid.sum().clamp(min=1).to(torch.float32)
    loss = torch.where(valid, lse - zt, torch.zeros_like(lse)).sum() / count
    cols = torch.arange(y.shape[1], device=y.device)
    onehot = (cols[None, :] == tt[:, None]).to(torch.float32)
    scale = valid.to(torch.float32)[:, None] / count
    g = ((torch.exp(y - lse[:, None]) - onehot) * scale).to(torch.bfloat16)
    dx = torch.mm(g, w)
    dw = mm_fp32(g.t(), x)
    return loss, dx, dw


def rel_frobenius(a, b):
    a = a.float()
    b = b.float()
    den = torch.linalg.vector_norm(b).item()
    num = torch.linalg.vector_norm(a - b).item()
    return num / den if den > 0 else num


def peer_variants(x, w, t):
    """Liger's and CCE's fused linear cross-entropy, loss + dX + dW through
    autograd, each as (run, per_token_loss); the ones installed."""
    out = {}
    xg = x.detach().clone().requires_grad_(True)
    wg = w.detach().clone().requires_grad_(True)

    def autograd_run(loss_fn):
        def run():
            xg.grad = None
            wg.grad = None
            loss_fn("mean").backward()
        return run

    try:
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss
        for name, accum in (("liger_bf16", None), ("liger_fp32", torch.float32)):
            def fn(reduction, accum=accum):
                kw = {"accum_dtype": accum} if accum is not None else {}
                return LigerFusedLinearCrossEntropyLoss(
                    ignore_index=IGNORE, reduction=reduction, **kw)(wg, xg, t)
            out[name] = (autograd_run(fn), fn)
    except Exception as e:  # absent or incompatible: reported, not fatal
        print(f"ce_bench: Liger-Kernel left out: {type(e).__name__}: {e}", file=sys.stderr)
    try:
        from cut_cross_entropy import linear_cross_entropy
        for name, kw in (("cce", {}), ("cce_exact", {"filter_eps": None})):
            def fn(reduction, kw=kw):
                return linear_cross_entropy(xg, wg, t, ignore_index=IGNORE,
                                            reduction=reduction, **kw)
            out[name] = (autograd_run(fn), fn)
    except Exception as e:
        print(f"ce_bench: cut_cross_entropy left out: {type(e).__name__}: {e}", file=sys.stderr)
    return out


def fp64_loss(x, w, t, rows):
    """Per-token loss of `rows` in float64: the reference for every variant."""
    with torch.no_grad():
        y = x[rows].double() @ w.double().t()
        tt = t[rows].clamp(min=0)
        loss = torch.logsumexp(y, dim=1) - y.gather(1, tt[:, None]).squeeze(1)
        bf16 = F.cross_entropy(y.float().to(torch.bfloat16).float(), tt, reduction="none")
        return loss, bf16


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the report here")
    ap.add_argument("--markdown", help="also write the table here")
    ap.add_argument("--shapes", default="4096x4096x128256,8192x2304x256000",
                    help="MxKxV[,MxKxV...]")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--ignore-fraction", type=float, default=0.05)
    ap.add_argument("--chunk", type=int, default=0, help="logitd chunk (0: automatic)")
    ap.add_argument("--token-chunks", default="",
                    help="also time the token walk at these tokens per chunk (N[,N...])")
    ap.add_argument("--no-vocab-walk", action="store_true",
                    help="leave out the vocabulary-walk variant")
    ap.add_argument("--compile", action="store_true", help="also time torch.compile (slow)")
    ap.add_argument("--logitd-lib", help="liblogitd_bench_capi.so")
    ap.add_argument("--no-peers", action="store_true",
                    help="leave out Liger-Kernel and cut_cross_entropy even when installed")
    ap.add_argument("--error-rows", type=int, default=512,
                    help="rows of the fp64 per-token loss reference (default 512)")
    args = ap.parse_args()

    if not torch.cuda.is_available():
        print("ce_bench: no CUDA device visible to PyTorch", file=sys.stderr)
        return 1
    torch.cuda.init()
    # Decides mm_fp32's path before anything is traced by torch.compile.
    probe = torch.ones((16, 16), device="cuda", dtype=torch.bfloat16)
    mm_fp32(probe, probe)
    props = torch.cuda.get_device_properties(0)
    logitd = load_logitd(args.logitd_lib)
    start = torch.cuda.Event(enable_timing=True)
    stop = torch.cuda.Event(enable_timing=True)
    stream = torch.cuda.current_stream().cuda_stream

    report = {"device": {"name": props.name, "sms": props.multi_processor_count,
                         "memory_bytes": props.total_memory},
              "torch": torch.__version__, "cuda": torch.version.cuda,
              "method": {"reps": args.reps, "warmup": args.warmup,
                         "statistic": "median of event-timed single calls, variants "
                                      "interleaved",
                         "flops": "6*M*K*V",
                         "peak": "bytes a call adds beyond x, w, targets, outputs included"},
              "logitd_in_process": logitd is not None, "compile": args.compile, "shapes": []}
    print(f"device: {props.name}, torch {torch.__version__}, CUDA {torch.version.cuda}", flush=True)

    for (m, k, v) in parse_shapes(args.shapes):
        t0 = time.time()
        gen = torch.Generator(device="cuda")
        gen.manual_seed(1234)
        x = (torch.rand((m, k), device="cuda", generator=gen) * 2 - 1).to(torch.bfloat16)
        # Logits of standard deviation about 1.
        w = ((torch.rand((v, k), device="cuda", generator=gen) * 2 - 1)
             * (3.0 / math.sqrt(k))).to(torch.bfloat16)
        t = torch.randint(0, v, (m,), device="cuda", generator=gen, dtype=torch.int64)
        drop = torch.rand((m,), device="cuda", generator=gen) < args.ignore_fraction
        t = torch.where(drop, torch.full_like(t, IGNORE), t)
        count = int((t != IGNORE).sum().item())
        flops = 6.0 * m * k * v
        out_bytes = m * 4 + m * k * 2 + v * k * 4  # loss, dX bf16, dW fp32
        entry = {"m": m, "k": k, "v": v, "counted_tokens": count, "variants": {},
                 "output_gradient_bytes": m * k * 2 + v * k * 4}
        torch.cuda.synchronize()

        variants = {}
        outputs = {}

        def run_eager():
            outputs["eager"] = eager(x, w, t)

        variants["torch_eager"] = run_eager

        if logitd is not None:
            # Fresh engines per shape, each variant its own, so that the device
            # bytes a variant reports are its own for this shape.
            lib = logitd[0]
            engine = lib.logitd_bench_engine_create(1, 1)
            loss_l = torch.empty((m,), device="cuda", dtype=torch.float32)
            dx_l = torch.empty((m, k), device="cuda", dtype=torch.bfloat16)
            dw_l = torch.empty((v, k), device="cuda", dtype=torch.float32)
            ptrs = (x.data_ptr(), w.data_ptr(), t.data_ptr(), loss_l.data_ptr(),
                    dx_l.data_ptr(), dw_l.data_ptr())
            scale = 1.0 / max(count, 1)
            ce = lib.logitd_bench_cross_entropy
            # Each variant has its own engine, so that its device bytes are its own.
            engines = {"logitd": engine}

            def logitd_variant(eng, walk, chunk, grads=True):
                def run():
                    xp, wp, tp, lp, dxp, dwp = ptrs
                    if ce(eng, m, v, k, xp, wp, tp, IGNORE, 0.0, 0.0, scale, lp, None,
                          dxp if grads else None, 1, dwp if grads else None, 0.0, chunk, walk,
                          stream) != 0:
                        raise RuntimeError(lib.logitd_bench_last_error().decode())
                return run

            run_logitd = logitd_variant(engine, 0, args.chunk)
            variants["logitd"] = run_logitd
            extra = [] if args.no_vocab_walk else [("logitd_vocab_walk", 1, 0)]
            extra += [(f"logitd_tokens_{int(c)}", 2, int(c))
                      for c in args.token_chunks.split(",") if c.strip()]
            for name, walk, chunk in extra:
                engines[name] = lib.logitd_bench_engine_create(1, 1)
                if not engines[name]:
                    raise RuntimeError(lib.logitd_bench_last_error().decode())
                variants[name] = logitd_variant(engines[name], walk, chunk)
            # Pass 1 alone (2*M*K*V): how the time splits between the passes.
            engines["logitd_loss_only"] = lib.logitd_bench_engine_create(1, 1)
            variants["logitd_loss_only"] = logitd_variant(engines["logitd_loss_only"], 1, 0,
                                                          grads=False)

        if args.compile:
            try:
                compiled = torch.compile(written_out)
                tc = time.time()
                outputs["compile"] = compiled(x, w, t)
                torch.cuda.synchronize()
                entry["compile_seconds"] = time.time() - tc

                def run_compile():
                    outputs["compile"] = compiled(x, w, t)

                variants["torch_compile"] = run_compile
            except Exception as e:  # a failed compile is reported, not fatal
                entry["compile_error"] = f"{type(e).__name__}: {e}"[:500]
                print(f"ce_bench: torch.compile failed: {entry['compile_error']}",
                      file=sys.stderr)
            outputs.pop("compile", None)
            torch.cuda.empty_cache()

        peers = {} if args.no_peers else peer_variants(x, w, t)
        for name, (run, _) in peers.items():
            variants[name] = run

        # Peak memory, one call each from a clean state.
        peaks = {}
        for name, fn in variants.items():
            outputs.clear()
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            fn()
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated() - base
            if name == "logitd_loss_only":
                peak += 4 * m + lib.logitd_bench_device_bytes(engines[name])
            elif name.startswith("logitd"):
                # The outputs are PyTorch's (allocated above, before `base`).
                peak += out_bytes + lib.logitd_bench_device_bytes(engines[name])
            peaks[name] = peak
        outputs.clear()

        for name, fn in variants.items():
            for _ in range(args.warmup):
                fn()
        torch.cuda.synchronize()
        samples = {name: [] for name in variants}
        names = list(variants)
        for r in range(args.reps):
            for name in names[r % len(names):] + names[:r % len(names)]:
                start.record()
                variants[name]()
                stop.record()
                stop.synchronize()
                samples[name].append(start.elapsed_time(stop) * 1000.0)
            outputs.clear()
        for name in variants:
            med = statistics.median(samples[name])
            f = flops / 3 if name == "logitd_loss_only" else flops
            entry["variants"][name] = {"median_us": med, "min_us": min(samples[name]),
                                       "tflops": f / (med * 1e-6) / 1e12,
                                       "peak_bytes": peaks[name], "samples": len(samples[name])}

        if logitd is not None:
            # Cross-check against eager on the same data.
            run_logitd()
            torch.cuda.synchronize()
            entry["logitd_chunk"] = lib.logitd_bench_ce_chunk(engine)
            entry["logitd_walk"] = {1: "vocabulary", 2: "tokens"}.get(
                lib.logitd_bench_ce_walk(engine), "?")
            entry["logitd_device_bytes"] = lib.logitd_bench_device_bytes(engine)
            loss_e, dx_e, dw_e = eager(x, w, t)
            with torch.no_grad():
                y = mm_fp32(x, w.t())
                per_token = F.cross_entropy(y, t, ignore_index=IGNORE, reduction="none")
                del y
            torch.cuda.synchronize()
            diff = (loss_l - per_token).abs() / per_token.abs().clamp(min=1.0)
            entry["check"] = {
                "loss_max_rel_diff": diff.max().item(),
                "mean_loss_logitd": (loss_l.sum() / max(count, 1)).item(),
                "mean_loss_torch": loss_e.item(),
                "dx_rel_frobenius_diff": rel_frobenius(dx_l, dx_e),
                "dw_rel_frobenius_diff": rel_frobenius(dw_l, dw_e),
                "ignored_loss_max_abs": loss_l[t == IGNORE].abs().max().item()
                if count < m else 0.0}
            del loss_e, dx_e, dw_e, per_token, diff
        # Per-token loss against fp64 on counted rows, every variant.
        counted = torch.nonzero(t != IGNORE).squeeze(1)[:args.error_rows]
        ref, bf16_loss = fp64_loss(x, w, t, counted)
        errors = {"bf16_logits": (bf16_loss.double() - ref).abs().max().item()}
        with torch.no_grad():
            y = mm_fp32(x[counted], w.t())
            errors["torch_eager"] = (F.cross_entropy(y, t[counted], reduction="none").double()
                                     - ref).abs().max().item()
            del y
        if logitd is not None:
            errors["logitd"] = (loss_l[counted].double() - ref).abs().max().item()
        for name, (_, fn) in peers.items():
            with torch.no_grad():
                errors[name] = (fn("none").detach()[counted].double() - ref).abs().max().item()
        entry["loss_error_vs_fp64"] = errors
        entry["error_rows"] = int(counted.numel())
        print("  per-token loss max abs error vs fp64: " + ", ".join(
            f"{n} {e:.2e}" for n, e in errors.items()), flush=True)
        del ref, bf16_loss, peers
        report["shapes"].append(entry)
        vs = entry["variants"]
        line = f"M={m} K={k} V={v}: " + ", ".join(
            f"{n} {vs[n]['median_us'] / 1000:.2f} ms {vs[n]['tflops']:.0f} TFLOP/s "
            f"peak {vs[n]['peak_bytes'] / 2**30:.2f} GiB" for n in vs)
        print(line + f" ({time.time() - t0:.0f} s)", flush=True)
        if "check" in entry:
            print("  check vs eager: " + ", ".join(f"{a} {b:.3g}" for a, b in
                                                   entry["check"].items()), flush=True)
        del x, w, t, variants, outputs
        if logitd is not None:
            del loss_l, dx_l, dw_l, run_logitd
            for eng in set(engines.values()):
                lib.logitd_bench_engine_destroy(eng)
        torch.cuda.empty_cache()

    report["mm_out_dtype"] = _MM_OUT_DTYPE
    table = render(report)
    bench_report.write_json_report(args.json, report, indent=2)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(table + "\n")
    print()
    print(table)
    return 0


def render(report):
    """The Markdown table, with the issue's targets as verdicts."""
    lines = [f"### Fused cross-entropy, loss + dX + dW ({report['device']['name']}, "
             f"PyTorch {report['torch']})", "",
             "logitd_loss_only is pass 1 alone (loss and lse, no gradients; TFLOP/s on 2MKV).",
             "",
             "| M | K | V | variant | time ms | TFLOP/s (6MKV) | speed-up vs eager | peak GiB "
             "| peak ÷ gradient outputs | working GiB (peak − outputs) | loss err vs fp64 |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    notes = []
    for e in report["shapes"]:
        vs = e["variants"]
        errs = e.get("loss_error_vs_fp64", {})
        eager_us = vs.get("torch_eager", {}).get("median_us")
        grads = e["output_gradient_bytes"]
        outs = grads + 4 * e["m"]
        for name, r in vs.items():
            speed = (f"{eager_us / r['median_us']:.2f}x"
                     if eager_us and name != "logitd_loss_only" else "-")
            mine = 4 * e["m"] if name == "logitd_loss_only" else outs
            ratio = "-" if name == "logitd_loss_only" else f"{r['peak_bytes'] / grads:.2f}"
            lines.append(f"| {e['m']} | {e['k']} | {e['v']} | {name} | "
                         f"{r['median_us'] / 1000:.2f} | {r['tflops']:.0f} | {speed} | "
                         f"{r['peak_bytes'] / 2**30:.2f} | {ratio} | "
                         f"{max(r['peak_bytes'] - mine, 0) / 2**30:.2f} | "
                         f"{f'{errs[name]:.1e}' if name in errs else '-'} |")
        if "bf16_logits" in errs:
            lines.append(f"| {e['m']} | {e['k']} | {e['v']} | (bf16 logits, for scale) | - | - "
                         f"| - | - | - | - | {errs['bf16_logits']:.1e} |")
        where = f"M={e['m']},K={e['k']},V={e['v']}"
        if "logitd" in vs and "torch_eager" in vs:
            lo, ea = vs["logitd"], vs["torch_eager"]
            vs_compile = (f"{vs['torch_compile']['median_us'] / lo['median_us']:.2f}x "
                          "torch.compile (target >= 1.15), " if "torch_compile" in vs else "")
            notes.append(f"{where}: logitd {vs_compile}{ea['median_us'] / lo['median_us']:.2f}x "
                         f"eager, {lo['tflops']:.0f} TFLOP/s (target >= 700 at "
                         f"4096x4096x128256), peak {lo['peak_bytes'] / grads:.2f}x the gradient "
                         f"outputs (target <= 1.5); {e.get('logitd_walk')} walk, chunk "
                         f"{e.get('logitd_chunk')}")
        if "check" in e:
            c = e["check"]
            notes.append(f"{where}: vs eager, per-token loss max rel diff "
                         f"{c['loss_max_rel_diff']:.2e}, dX {c['dx_rel_frobenius_diff']:.2e}, "
                         f"dW {c['dw_rel_frobenius_diff']:.2e} (relative Frobenius), mean loss "
                         f"{c['mean_loss_logitd']:.6f} vs {c['mean_loss_torch']:.6f}")
        if "compile_seconds" in e:
            notes.append(f"{where}: torch.compile took {e['compile_seconds']:.0f} s to compile")
        if "compile_error" in e:
            notes.append(f"{where}: torch.compile failed: {e['compile_error']}")
    return "\n".join(lines + [""] + [f"- {n}" for n in notes])


if __name__ == "__main__":
    sys.exit(main())
