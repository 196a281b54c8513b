"""The language-model head on a logitd server, inside torch.autograd.

LogitdLMHead is a torch.autograd.Function: its forward asks the server for
fp32 logits Y = X . W^T (bf16 operands, fp32 accumulation), and its backward
sends dY and gets dX = G . W (bf16) and dW = G^T . X (fp32), with
G = bf16(dY) rounded to nearest even once, which is the contract of
Megatron-LM's fp32-logits path. When the weight carries an fp32 ``main_grad``
buffer, dW is added into it (gradient-accumulation fusion); otherwise it is
returned to autograd, which stores it in the weight's dtype.

Run it against a server (any backend) to compare with torch's own result:

    python autograd_lm_head.py 127.0.0.1:50051 [--tokens 16 --hidden 1024 --vocab 8192]

It prints the largest errors of logits, dX and dW against an fp64 reference
and against torch (F.linear with fp32 out, and torch's autograd of the bf16
legacy path for the gradients), checks each against its fp32 accumulation
bound, and exits 0 only when all are inside.
"""

import argparse
import sys

try:
    import torch
    import torch.nn.functional as F
except ModuleNotFoundError as e:
    if e.name != "torch":
        raise
    print("autograd_lm_head.py needs torch: pip install './client/python[torch]'", file=sys.stderr)
    sys.exit(2)

import logitd


class LogitdLMHead(torch.autograd.Function):
    """Y[..., V] = X[..., K] . W[V, K]^T in fp32 on a logitd server, with the matching backward."""

    @staticmethod
    def forward(ctx, x, weight, client, handle):
        if x.dtype != torch.bfloat16 or weight.dtype != torch.bfloat16:
            raise TypeError("LogitdLMHead: x and weight must be torch.bfloat16")
        V, K = weight.shape
        x2d = x.reshape(-1, K)
        y = client.logits(x2d, handle, out_dtype="fp32")
        ctx.save_for_backward(x, weight)
        ctx.client = client
        ctx.handle = handle
        return y.to(x.device).reshape(*x.shape[:-1], V)

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        want_dx, want_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if not (want_dx or want_dw):
            return None, None, None, None
        V, K = weight.shape
        x2d = x.reshape(-1, K)
        dx, dw = ctx.client.backward(
            dy.reshape(-1, V),  # fp32; the server rounds it to bf16 once (G)
            x2d,
            ctx.handle,
            want_dx=want_dx,
            want_dw=want_dw,
            dx_dtype="bf16",
            dw_dtype="fp32",
        )
        grad_x = dx.to(x.device).reshape(x.shape) if want_dx else None
        grad_w = None
        if want_dw:
            dw = dw.to(weight.device)
            main_grad = getattr(weight, "main_grad", None)
            if main_grad is not None:
                main_grad.add_(dw)  # fp32 accumulation, as with Megatron's main_grad
            else:
                grad_w = dw.to(weight.dtype)
        return grad_x, grad_w, None, None


def lm_head(x, weight, client, handle):
    """Logits of x under the registered weight `handle` (the bytes of `weight`)."""
    return LogitdLMHead.apply(x, weight, client, handle)


def _gamma(n):
    u = 2.0**-24
    return n * u / (1 - n * u)


def check(client, tokens=16, hidden=1024, vocab=8192, seed=0, device=None):
    """Runs forward and backward through logitd and through torch; returns the figures."""
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    torch.backends.cuda.matmul.allow_tf32 = False  # torch's fp32 reference must be real fp32
    gen = torch.Generator().manual_seed(seed)
    M, K, V = tokens, hidden, vocab
    x = torch.randn(M, K, generator=gen).to(torch.bfloat16).to(device).requires_grad_()
    w = (torch.randn(V, K, generator=gen) * K**-0.5).to(torch.bfloat16).to(device).requires_grad_()
    targets = torch.randint(0, V, (M,), generator=gen).to(device)

    info = client.register_weights(w.detach(), name="autograd_lm_head.weight")
    try:
        w.main_grad = torch.zeros(V, K, dtype=torch.float32, device=device)
        seen_dy = []
        y = lm_head(x, w, client, info.handle)
        y.register_hook(lambda g: seen_dy.append(g.detach()))
        loss = F.cross_entropy(y, targets)
        loss.backward()
    finally:
        client.release_weights(info.handle)
    dx, dw = x.grad, w.main_grad
    G = seen_dy[0].to(torch.bfloat16)  # the gradient the server rounded, computed here the same way

    # torch's own results: fp32-out logits, and autograd's gradients of the bf16 legacy path given G.
    xr = x.detach().clone().requires_grad_()
    wr = w.detach().clone().requires_grad_()
    with torch.no_grad():
        y_torch = F.linear(xr.float(), wr.float())
        loss_torch = F.cross_entropy(y_torch, targets)
        dw_torch = G.float().t() @ xr.float()  # fp32 accumulation of G^T . X
    F.linear(xr, wr).backward(G)
    dx_torch = xr.grad  # bf16, as autograd computes it on the legacy path

    # fp64 references and the fp32 accumulation bounds, element by element.
    x64, w64, G64 = x.detach().double(), w.detach().double(), G.double()
    y64 = x64 @ w64.t()
    y_bound = _gamma(K) * (x64.abs() @ w64.abs().t())
    dx64 = G64 @ w64
    dx_acc = _gamma(V) * (G64.abs() @ w64.abs())
    dx_bound = dx_acc + 2.0**-8 * (dx64.abs() + dx_acc)  # plus bf16 rounding of the output
    dw64 = G64.t() @ x64
    dw_bound = _gamma(M) * (G64.abs().t() @ x64.abs())

    def err(a, ref):
        return (a.double() - ref).abs()

    rows = {
        "logits fp32": (err(y.detach(), y64), y_bound, err(y.detach(), y_torch.double())),
        "dX bf16": (err(dx, dx64), dx_bound, err(dx, dx_torch.double())),
        "dW fp32": (err(dw, dw64), dw_bound, err(dw, dw_torch.double())),
    }
    figures = {}
    ok = True
    for name, (e, bound, vs_torch) in rows.items():
        inside = bool(torch.all(e <= bound + 1e-30))
        ok = ok and inside
        figures[name] = {
            "max_err_vs_fp64": e.max().item(),
            "max_bound": bound.max().item(),
            "max_err_over_bound": (e / (bound + 1e-30)).max().item(),
            "max_diff_vs_torch": vs_torch.max().item(),
            "inside_bound": inside,
        }
    figures["loss"] = {"logitd": loss.item(), "torch": loss_torch.item()}
    figures["ok"] = ok
    figures["shape"] = {"tokens": M, "hidden": K, "vocab": V, "device": str(device)}
    return figures


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("address", help="logitd server, e.g. 127.0.0.1:50051")
    p.add_argument("--tokens", type=int, default=16, help="M: rows of X")
    p.add_argument("--hidden", type=int, default=1024, help="K: hidden size")
    p.add_argument("--vocab", type=int, default=8192, help="V: vocabulary size")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default=None, help="where torch's tensors live (default: cuda if available)")
    p.add_argument("--token", default=None, help="bearer token of the server, if it wants one")
    args = p.parse_args(argv)

    with logitd.Client(args.address, token=args.token) as client:
        info = client.info()
        print(
            "logitd %s (%s) backend=%s device=%s cublaslt=%s blas=%s"
            % (info.version, info.build_id, info.backend, info.device_name, info.cublaslt_version, info.blas_version)
        )
        print("torch %s" % torch.__version__)
        f = check(client, args.tokens, args.hidden, args.vocab, args.seed, args.device)

    s = f["shape"]
    print("M=%d K=%d V=%d, torch tensors on %s" % (s["tokens"], s["hidden"], s["vocab"], s["device"]))
    print("%-12s %16s %16s %12s %18s  %s" % ("tensor", "max|err| fp64", "max bound", "err/bound", "max|diff| torch", "check"))
    for name in ("logits fp32", "dX bf16", "dW fp32"):
        r = f[name]
        print(
            "%-12s %16.6e %16.6e %12.4f %18.6e  %s"
            % (
                name,
                r["max_err_vs_fp64"],
                r["max_bound"],
                r["max_err_over_bound"],
                r["max_diff_vs_torch"],
                "ok" if r["inside_bound"] else "OUTSIDE BOUND",
            )
        )
    print("loss: logitd %.9f  torch %.9f" % (f["loss"]["logitd"], f["loss"]["torch"]))
    print("PASS" if f["ok"] else "FAIL")
    return 0 if f["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
