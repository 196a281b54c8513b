#!/usr/bin/env python3
"""How a GPU's GEMMs accumulate: adversarial rows and random data, against models.

    usage: accumulation_probe.py [--json FILE] [--ks 1024,4096,16384] [--quick]

Verify's proven bound assumes each addition of an fp32 accumulation errs by at most
one unit in the last place of its result (round to nearest, or a truncating adder),
and its precision-class test models tensor-core adders as blocks of products added
to an fp32 accumulator and truncated. This script measures what the device does, with
PyTorch's GEMMs (cuBLASLt, as logitd's cuda backend calls it):

  chain     rows [1, t, t, ...] and [t, ..., t, 1] with t just below 2^-23 (one
            fp32 ulp of 1): round to nearest keeps every t, a truncating adder that
            takes k products at a time loses about one ulp per block, so the count
            of t kept gives the block size k;
  random    N(0, 1) and all-positive operands at several K: each output's error
            against the fp64 sum, in units of u·Σ|x·w| (u = 2^-24), its RMS, mean
            signed toward zero, and which model (sequential round to nearest, or
            blocks of k truncated) predicts it best, element by element;
  edges     products in fp32's subnormal range (kept or flushed?), and sums whose
            partial sums overflow.

Paths: torch.mm of bf16 with out_dtype=float32 (the fp32-out GEMM), the fp32 GEMM of
the upcast operands with TF32 on and off. Exit 0 unless a path breaks the bound
γ_n(2u)·Σ|x·w| that Verify proves (then 1, with the element).
"""
import argparse
import math
import sys

import torch

import bench_report

U = 2.0 ** -24


def fp32_out(a, b):
    return torch.mm(a, b, out_dtype=torch.float32)


def tf32(a, b, on):
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = on
    try:
        return a.float() @ b.float()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


PATHS = {
    "bf16 mm, fp32 out": fp32_out,
    "fp32 mm, TF32 on": lambda a, b: tf32(a, b, True),
    "fp32 mm, TF32 off": lambda a, b: tf32(a, b, False),
}


def exact(x, w):
    """fp64 sum and sum of |products| of bf16 x [M, K] and w [V, K]."""
    xd, wd = x.double(), w.double()
    return xd @ wd.T, xd.abs() @ wd.abs().T


def round_to_zero32(d):
    """fp64 values to fp32, toward zero."""
    f = d.float()
    over = f.double().abs() > d.abs()
    f[over] = torch.nextafter(f[over], torch.zeros_like(f[over]))
    return f


def model(x, w, block, truncate):
    """Sequential fp32 accumulation, `block` exact products at a time added to it,
    each addition rounded to nearest or truncated."""
    xd, wd = x.double(), w.double()
    m, k = x.shape
    acc = torch.zeros(m, w.shape[0], dtype=torch.float32, device=x.device)
    for k0 in range(0, k, block):
        part = xd[:, k0:k0 + block] @ wd[:, k0:k0 + block].T
        s = acc.double() + part
        acc = round_to_zero32(s) if truncate else s.float()
    return acc


def chain(device):
    t = torch.tensor(2.0 ** -23 - 2.0 ** -31, dtype=torch.bfloat16)
    assert float(t) == 2.0 ** -23 - 2.0 ** -31
    rows = []
    for k in (16, 32, 64, 128, 256, 1024, 4096):
        for where in ("first", "last"):
            x = torch.full((16, k), float(t), dtype=torch.bfloat16, device=device)
            x[:, 0 if where == "first" else k - 1] = 1.0
            w = torch.ones(64, k, dtype=torch.bfloat16, device=device)
            row = {"k": k, "one": where}
            for name, fn in PATHS.items():
                y = fn(x, w.T).double()
                kept = ((y - 1.0) / 2.0 ** -23).round()
                row[name] = [int(kept.min()), int(kept.max())]
            rows.append(row)
    return rows


def random_case(device, k, positive, m=128, v=1024, seed=7):
    g = torch.Generator(device=device).manual_seed(seed + k + (1 if positive else 0))
    x = torch.randn(m, k, generator=g, device=device).to(torch.bfloat16)
    w = torch.randn(v, k, generator=g, device=device).to(torch.bfloat16)
    if positive:
        x, w = x.abs(), w.abs()
    ref, mag = exact(x, w)
    scale = U * mag
    out = {"k": k, "operands": "all positive" if positive else "N(0,1)", "paths": {}}
    models = {"seq RN": model(x, w, 1, False)}
    for blk in (4, 8, 16, 32, 64):
        models[f"blocks of {blk}, truncated"] = model(x, w, blk, True)
    model_err = {n: (y.double() - ref) / scale for n, y in models.items()}
    out["models"] = {n: {"rms_z": float(e.pow(2).mean().sqrt()),
                         "mean_z_toward_zero": float((-e * ref.sign()).mean())}
                     for n, e in model_err.items()}
    bound = (2 * k * U / (1 - 2 * k * U)) * mag
    for name, fn in PATHS.items():
        y = fn(x, w.T).double()
        err = y - ref
        z = err / scale
        best, best_corr, same = None, -2.0, {}
        for n, e in model_err.items():
            c = float(torch.corrcoef(torch.stack([z.flatten(), e.flatten()]))[0, 1])
            same[n] = float((y == models[n].double()).double().mean())
            if c > best_corr:
                best, best_corr = n, c
        out["paths"][name] = {
            "rms_z": float(z.pow(2).mean().sqrt()),
            "max_abs_z": float(z.abs().max()),
            "mean_z_toward_zero": float((-z * ref.sign()).mean()),
            "worst_over_bound_2u": float((err.abs() / bound).max()),
            "closest_model": best, "correlation": best_corr,
            "bitwise_equal_to_model": same,
        }
    return out


def edges(device):
    res = {}
    # Products 2^-70 · 2^-70 = 2^-140: subnormal in fp32 (normal below 2^-126).
    k = 64
    x = torch.full((4, k), 2.0 ** -70, dtype=torch.bfloat16, device=device)
    x[:, ::2] *= 1.5
    w = torch.full((8, k), 2.0 ** -70, dtype=torch.bfloat16, device=device)
    ref, _ = exact(x, w)
    for name, fn in PATHS.items():
        y = fn(x, w.T).double()
        res[f"subnormal products, {name}"] = {
            "exact": float(ref[0, 0]), "got": float(y[0, 0]),
            "flushed": bool((y == 0).all())}
    # Partial sums that overflow: three products of 2^127·1.5, then two of -2^127·1.5.
    big = torch.tensor([1.5, 1.5, 1.5, -1.5, -1.5], dtype=torch.float64) * 2.0 ** 64
    x = big.to(torch.bfloat16).reshape(1, 5).to(device)
    w = torch.full((1, 5), 2.0 ** 63, dtype=torch.bfloat16, device=device)
    ref, mag = exact(x, w)
    for name, fn in PATHS.items():
        y = fn(x, w.T).double()
        res[f"overflowing partial sums, {name}"] = {
            "exact": float(ref[0, 0]), "sum_of_magnitudes": float(mag[0, 0]), "got": float(y[0, 0])}
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json")
    ap.add_argument("--ks", default="1024,4096,16384")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    device = "cuda"
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    report["chain"] = chain(device)
    print("\nchain [1, t, ...] · ones, t = 2^-23 - 2^-31: t's kept (min, max over outputs)")
    for r in report["chain"]:
        print(f"  K={r['k']:5d} 1 {r['one']:5s} " +
              "  ".join(f"{n}: {r[n]}" for n in PATHS), flush=True)
    report["random"] = []
    ks = [int(s) for s in args.ks.split(",")]
    failed = False
    for k in ks:
        for positive in (False, True):
            c = random_case(device, k, positive, m=32 if args.quick else 128)
            report["random"].append(c)
            print(f"\nK={k} {c['operands']}: error in units of u·Σ|x·w|")
            for n, m in c["models"].items():
                print(f"  model {n:26s} rms {m['rms_z']:9.3f}  toward zero {m['mean_z_toward_zero']:9.3f}")
            for n, p in c["paths"].items():
                print(f"  {n:32s} rms {p['rms_z']:9.3f}  max {p['max_abs_z']:9.3f}  toward zero "
                      f"{p['mean_z_toward_zero']:9.3f}  worst/bound(2u) {p['worst_over_bound_2u']:.2e}"
                      f"  closest: {p['closest_model']} (r={p['correlation']:.3f})", flush=True)
                failed |= p["worst_over_bound_2u"] > 1
    report["edges"] = edges(device)
    print("\nedges")
    for n, e in report["edges"].items():
        print(f"  {n}: {e}")
    bench_report.write_json_report(args.json, report)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
