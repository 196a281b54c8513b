"""What a BF16 LM head does to the log-probs of an RL trainer, against logitd's FP32 ones.

PPO and GRPO weigh each sampled token by the importance ratio
pi_train(token) / pi_rollout(token). When both sides compute the same policy
but one of them rounds its logits to bf16 before the softmax, the ratio is
no longer 1 and the clipping and the KL terms see noise that is not in the
policy. This example measures that noise for a weight W [V, K] and hidden
states X [M, K] (bf16):

- logitd's side: LogProbs (fp32 logits, fp32 accumulation, computed on the
  server; only per-token numbers travel): the target's log-prob, the
  log-sum-exp, the entropy and the top-k;
- the bf16 head: Logits with out_dtype bf16 (the fp32 accumulator rounded to
  bf16 once), fetched in row chunks, and log_softmax in float64 on the host.

With Delta = log p_bf16(target) - log p_fp32(target) it reports max and mean
|Delta|, the ratio exp(Delta) = p_bf16 / p_fp32 (min, max, percentiles, and
the share of tokens a PPO clip of --clip would cut), the KL divergence
KL(p_fp32 || p_bf16) restricted to logitd's top-k (both renormalised over
those k tokens), and how often the bf16 head's top-1 differs from logitd's.

The targets are read from --targets (one per row, .npy or whitespace-separated
text), or sampled, as a rollout would, from logitd's fp32 distribution
(seeded): a proposal from the bf16 logits is accepted with probability
exp(f - b - D), where f and b are the token's fp32 and bf16 logits and
D >= max(f - b) over the row (|f - b| <= 2^-8 |b| for a round to nearest, and
a margin for the order of the fp32 sums), so the accepted tokens follow
softmax(f) without the fp32 logits travelling.

Inputs are random by default (seeded; W ~ U(-1, 1) * scale / sqrt(K),
X ~ N(0, 1), both rounded to bf16), or read from safetensors files
(--weights FILE[:TENSOR] --hidden-states FILE[:TENSOR]; BF16, F16 or F32
tensors, rounded to bf16). Needs numpy only; --png draws a histogram of Delta
when matplotlib is installed.

    python rl_logprob_check.py 127.0.0.1:50051 [--tokens 256 --hidden 4096 --vocab 32768]
        [--top-k 16] [--targets FILE] [--json PATH] [--png PATH]
"""

import argparse
import json
import math
import struct
import sys
import time

import ml_dtypes
import numpy as np

import logitd

BF16 = np.dtype(ml_dtypes.bfloat16)
# Host work in float64 is done on blocks of rows of at most this many bytes.
_BLOCK_BYTES = 64 << 20
_MAX_TOP_K = 64
_MAX_SAMPLING_ROUNDS = 200


# -- inputs ------------------------------------------------------------------------------


def random_inputs(tokens, hidden, vocab, seed=0, scale=3.0):
    """W [V, K] ~ U(-1, 1) * scale / sqrt(K) and X [M, K] ~ N(0, 1), both bf16; W made in row blocks."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((tokens, hidden), dtype=np.float32).astype(BF16)
    w = np.empty((vocab, hidden), dtype=BF16)
    step = max(1, (64 << 20) // (4 * hidden))
    s = np.float32(scale / math.sqrt(hidden))
    for r in range(0, vocab, step):
        block = rng.random((min(step, vocab - r), hidden), dtype=np.float32)
        w[r : r + step] = ((block * 2 - 1) * s).astype(BF16)
    return w, x


_SAFETENSORS_DTYPES = {"BF16": BF16, "F16": np.dtype("<f2"), "F32": np.dtype("<f4")}


def read_safetensors(spec, role):
    """The tensor FILE[:TENSOR] names, as a bf16 [rows, cols] array (the file's only 2-D tensor
    when no name is given). A minimal reader of the format: an 8-byte header length, a JSON
    header, then the raw little-endian bytes."""
    path, _, name = spec.partition(":")
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    if not name:
        matrices = [k for k, v in header.items() if len(v["shape"]) == 2]
        if len(matrices) != 1:
            raise SystemExit(
                "%s: %s holds %d 2-D tensors (%s); name one as FILE:TENSOR"
                % (role, path, len(matrices), ", ".join(sorted(matrices)) or "none")
            )
        name = matrices[0]
    if name not in header:
        raise SystemExit("%s: %s has no tensor %r (it has %s)" % (role, path, name, ", ".join(sorted(header))))
    entry = header[name]
    dtype = _SAFETENSORS_DTYPES.get(entry["dtype"])
    if dtype is None or len(entry["shape"]) != 2:
        raise SystemExit(
            "%s: %s:%s is %s %s; expected a 2-D BF16, F16 or F32 tensor"
            % (role, path, name, entry["dtype"], entry["shape"])
        )
    begin, end = entry["data_offsets"]
    shape = tuple(int(d) for d in entry["shape"])
    if end - begin != dtype.itemsize * shape[0] * shape[1]:
        raise SystemExit("%s: %s:%s: data_offsets do not match its shape" % (role, path, name))
    a = np.memmap(path, dtype=dtype, mode="r", offset=8 + n + begin, shape=shape)
    return np.ascontiguousarray(a if dtype == BF16 else a.astype(np.float32).astype(BF16))


def read_targets(path, tokens, vocab):
    t = np.load(path) if path.endswith(".npy") else np.loadtxt(path, dtype=np.int64, ndmin=1)
    t = np.asarray(t).reshape(-1).astype(np.int64)
    if t.shape[0] != tokens:
        raise SystemExit("--targets: %s holds %d targets for %d tokens" % (path, t.shape[0], tokens))
    bad = (t < 0) | (t >= vocab)
    if bad.any():
        raise SystemExit("--targets: %s: target %d is outside [0, %d)" % (path, int(t[bad][0]), vocab))
    return t


# -- the comparison ----------------------------------------------------------------------


def _lse(b):
    m = b.max(axis=1, keepdims=True)
    return (m + np.log(np.exp(b - m).sum(axis=1, keepdims=True)))[:, 0]


def _propose(b, lse, rng):
    """One token per row of the bf16 logits b (float64), drawn from softmax(b)."""
    cdf = np.cumsum(np.exp(b - lse[:, None]), axis=1)
    u = rng.random(b.shape[0]) * cdf[:, -1]
    return np.minimum((cdf < u[:, None]).sum(axis=1), b.shape[1] - 1)


def chunk_rows(info, tokens, hidden, vocab, chunk_bytes):
    """Rows per call: bf16 logits of at most chunk_bytes, and X plus Y within the server's
    max_request_bytes (its limit on the tensor bytes of one call)."""
    rows = chunk_bytes // (2 * vocab)
    if info.max_request_bytes:
        rows = min(rows, info.max_request_bytes // (2 * vocab + 2 * hidden))
    if rows < 1:
        raise SystemExit(
            "one row of bf16 logits (%d bytes) does not fit a chunk of %d bytes and the server's "
            "max_request_bytes %d" % (2 * vocab + 2 * hidden, chunk_bytes, info.max_request_bytes)
        )
    return min(rows, tokens)


def _bf16_row_figures(y16, m, block, sample, rng):
    """The host's figures of a chunk of bf16 logits y16 [m, V], in blocks of rows in float64:
    each row's log-sum-exp, top-1, whether its maximum is tied, the slack of the sampling's
    acceptance test, and (with sample) a proposed token drawn from softmax(y16)."""
    lse_b = np.empty(m)
    top1 = np.empty(m, np.int64)
    tie = np.empty(m, bool)
    slack = np.empty(m)
    proposal = np.empty(m, np.int64)
    for r in range(0, m, block):
        b = y16[r : r + block].astype(np.float64)
        lse_b[r : r + block] = lse = _lse(b)
        top1[r : r + block] = b.argmax(axis=1)  # ties to the lower id, as LogProbs' top-k
        tie[r : r + block] = (b == b.max(axis=1, keepdims=True)).sum(axis=1) > 1
        # f - b <= 2^-8 |b| for b = bf16(f) rounded to nearest; a little more for the
        # fp32 logits of LogProbs, which may be summed in another order than those of Logits.
        slack[r : r + block] = np.abs(b).max(axis=1) * 2.0**-8 * (1 + 2.0**-6) + 1e-6
        if sample:
            proposal[r : r + block] = _propose(b, lse, rng)
    return lse_b, top1, tie, slack, proposal


def _sample_targets(client, handle, xc, y16, t, lp, logp_f, lse_b, slack, rng):
    """Turns the proposals t of a chunk into samples of logitd's fp32 distribution: rejected
    rows draw a new proposal and ask LogProbs again, until every row is accepted. Updates t and
    logp_f (the fp32 log-probs of t) in place; returns the LogProbs calls it made."""
    # Accept each proposal with probability exp(f - b - slack), f = logprob + lse.
    rounds = 0
    pending = np.arange(lse_b.shape[0])
    lse_f = lp.lse.astype(np.float64)
    for n in range(_MAX_SAMPLING_ROUNDS):
        f_minus_b = logp_f[pending] + lse_f[pending] - y16[pending, t[pending]].astype(np.float64)
        accept = rng.random(pending.size) < np.exp(np.minimum(f_minus_b - slack[pending], 0.0))
        pending = pending[~accept]
        if pending.size == 0:
            break
        b = y16[pending].astype(np.float64)
        t[pending] = _propose(b, lse_b[pending], rng)
        again = client.logprobs(xc[pending], handle, targets=t[pending])
        logp_f[pending] = again.logprob
        rounds += 1
    else:
        raise SystemExit("sampling: %d rows still rejected after %d rounds" % (pending.size, n + 1))
    return rounds


def _store_chunk(out, sl, t, lp, logp_f, y16, lse_b, top1, tie):
    """Writes a chunk's per-token figures into compare's arrays at rows sl."""
    # The bf16 head's log-probs of the targets and of logitd's top-k.
    ids = lp.topk_ids.astype(np.int64)
    rows_idx = np.arange(lse_b.shape[0])
    logq_t = y16[rows_idx, t].astype(np.float64) - lse_b
    logq_k = y16[rows_idx[:, None], ids].astype(np.float64)  # lse cancels in the renormalisation
    logp_k = lp.topk_logprobs.astype(np.float64)
    logp_k = logp_k - _lse(logp_k)[:, None]
    logq_k = logq_k - _lse(logq_k)[:, None]
    out["targets"][sl] = t
    out["logp_fp32"][sl] = logp_f
    out["logp_bf16"][sl] = logq_t
    out["kl_topk"][sl] = (np.exp(logp_k) * (logp_k - logq_k)).sum(axis=1)
    out["top1_fp32"][sl] = ids[:, 0]
    out["top1_bf16"][sl] = top1
    out["bf16_tie"][sl] = tie
    out["entropy_fp32"][sl] = lp.entropy


def compare(client, handle, x, vocab, targets=None, top_k=16, seed=0, chunk_bytes=256 << 20, log=None):
    """Per-token figures of the bf16 head against logitd's LogProbs, computed chunk by chunk.

    Returns a dict of [M] arrays: targets, logp_fp32, logp_bf16, delta, kl_topk, top1_fp32,
    top1_bf16, bf16_tie (the bf16 maximum is shared by several tokens), entropy_fp32; and
    top_k, rows_per_chunk, sampling_rounds (the LogProbs calls of rejected rows the sampling
    needed beyond one per chunk; 0 with given targets).
    """
    M, K = x.shape
    V = vocab
    k = max(1, min(int(top_k), _MAX_TOP_K, V))
    rows = chunk_rows(client.info(), M, K, V, chunk_bytes)
    block = max(1, _BLOCK_BYTES // (8 * V))
    rng = np.random.default_rng(seed + 1)
    out = {
        "targets": np.empty(M, np.int64),
        "logp_fp32": np.empty(M),
        "logp_bf16": np.empty(M),
        "kl_topk": np.empty(M),
        "top1_fp32": np.empty(M, np.int64),
        "top1_bf16": np.empty(M, np.int64),
        "bf16_tie": np.empty(M, bool),
        "entropy_fp32": np.empty(M),
    }
    rounds = 0
    for start in range(0, M, rows):
        stop = min(M, start + rows)
        xc = x[start:stop]
        m = stop - start
        y16 = np.asarray(client.logits(xc, handle, out_dtype="bf16"))
        lse_b, top1, tie, slack, proposal = _bf16_row_figures(y16, m, block, targets is None, rng)
        t = targets[start:stop].copy() if targets is not None else proposal
        lp = client.logprobs(xc, handle, targets=t, top_k=k, want_entropy=True, want_lse=True)
        logp_f = lp.logprob.astype(np.float64)
        rounds += 1
        if targets is None:
            rounds += _sample_targets(client, handle, xc, y16, t, lp, logp_f, lse_b, slack, rng)
        _store_chunk(out, slice(start, stop), t, lp, logp_f, y16, lse_b, top1, tie)
        if log is not None:
            log("rows %d-%d of %d" % (start, stop, M))
    out["delta"] = out["logp_bf16"] - out["logp_fp32"]
    out["sampling_rounds"] = rounds - (M + rows - 1) // rows
    out["top_k"] = k
    out["rows_per_chunk"] = rows
    return out


PERCENTILES = (0.1, 1, 5, 50, 95, 99, 99.9)


def summarize(r, clip=0.2):
    """The report's numbers (plain floats and ints) from compare's arrays."""
    d = r["delta"]
    ratio = np.exp(d)
    flips = r["top1_bf16"] != r["top1_fp32"]
    return {
        "tokens": int(d.size),
        "top_k": int(r["top_k"]),
        "abs_delta_logp": {"max": float(np.abs(d).max()), "mean": float(np.abs(d).mean())},
        "delta_logp": {"min": float(d.min()), "max": float(d.max()), "mean": float(d.mean())},
        "ratio": dict(
            {"min": float(ratio.min()), "max": float(ratio.max())},
            **{"p%g" % q: float(v) for q, v in zip(PERCENTILES, np.percentile(ratio, PERCENTILES))},
        ),
        "clip": clip,
        "clipped": int(((ratio < 1 - clip) | (ratio > 1 + clip)).sum()),
        "kl_topk": {"mean": float(r["kl_topk"].mean()), "max": float(r["kl_topk"].max())},
        "top1_flips": int(flips.sum()),
        "top1_flips_bf16_tie": int((flips & r["bf16_tie"]).sum()),
        "target_logp_fp32_mean": float(r["logp_fp32"].mean()),
        "entropy_fp32_mean": float(r["entropy_fp32"].mean()),
        "sampling_rounds": int(r["sampling_rounds"]),
        "rows_per_chunk": int(r["rows_per_chunk"]),
    }


def print_table(s, out=sys.stdout):
    M = s["tokens"]
    rows = [
        ("max |dlogp|", "%.6e" % s["abs_delta_logp"]["max"]),
        ("mean |dlogp|", "%.6e" % s["abs_delta_logp"]["mean"]),
        ("dlogp min / mean / max", "%.6e / %.6e / %.6e" % tuple(s["delta_logp"][q] for q in ("min", "mean", "max"))),
        ("ratio min", "%.6f" % s["ratio"]["min"]),
    ]
    rows += [("ratio p%g" % q, "%.6f" % s["ratio"]["p%g" % q]) for q in PERCENTILES]
    rows += [
        ("ratio max", "%.6f" % s["ratio"]["max"]),
        ("ratio outside 1 +- %g" % s["clip"], "%d of %d" % (s["clipped"], M)),
        ("KL top-%d mean (nats)" % s["top_k"], "%.6e" % s["kl_topk"]["mean"]),
        ("KL top-%d max (nats)" % s["top_k"], "%.6e" % s["kl_topk"]["max"]),
        ("top-1 flips", "%d of %d (%d at a bf16 tie)" % (s["top1_flips"], M, s["top1_flips_bf16_tie"])),
        ("mean log p_fp32(target)", "%.4f" % s["target_logp_fp32_mean"]),
        ("mean entropy fp32 (nats)", "%.4f" % s["entropy_fp32_mean"]),
    ]
    width = max(len(a) for a, _ in rows)
    print("%-*s  %s" % (width, "bf16 head vs logitd fp32", "value"), file=out)
    print("%s  %s" % ("-" * width, "-" * 24), file=out)
    for a, b in rows:
        print("%-*s  %s" % (width, a, b), file=out)


def write_png(path, delta, title):
    """Histogram of Delta log p; False (and nothing written) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.hist(delta, bins=101, color="tab:blue")
    ax.set_yscale("log")
    ax.set_xlabel("log p_bf16(target) - log p_fp32(target)  (nats)")
    ax.set_ylabel("tokens")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def _parse_args(argv):
    """The command line, checked: --weights with --hidden-states, --top-k within its range."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("address", help="logitd server, e.g. 127.0.0.1:50051")
    p.add_argument("--tokens", type=int, default=256, help="M: rows of X (random inputs)")
    p.add_argument("--hidden", type=int, default=4096, help="K: hidden size (random inputs)")
    p.add_argument("--vocab", type=int, default=32768, help="V: vocabulary size (random inputs)")
    p.add_argument("--scale", type=float, default=3.0, help="random W ~ U(-1, 1) * SCALE / sqrt(K) (default 3)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs and of the sampling")
    p.add_argument("--weights", metavar="FILE[:TENSOR]", help="W [V, K] from a safetensors file")
    p.add_argument("--hidden-states", metavar="FILE[:TENSOR]", help="X [M, K] from a safetensors file")
    p.add_argument("--targets", metavar="FILE", help="targets [M] (.npy or text); default: sampled from logitd's fp32")
    p.add_argument("--save-targets", metavar="PATH", help="write the targets used to PATH (.npy)")
    p.add_argument("--top-k", type=int, default=16, help="logitd's top-k the KL is taken over (1 to 64, default 16)")
    p.add_argument("--clip", type=float, default=0.2, help="PPO clip range eps: counts ratios outside 1 +- eps")
    p.add_argument("--chunk-mib", type=float, default=256, help="bf16 logits per call, in MiB (default 256)")
    p.add_argument("--json", metavar="PATH", help="write the summary as JSON to PATH")
    p.add_argument("--png", metavar="PATH", help="histogram of Delta log p (needs matplotlib)")
    p.add_argument("--token", default=None, help="bearer token of the server, if it wants one")
    args = p.parse_args(argv)
    if (args.weights is None) != (args.hidden_states is None):
        p.error("--weights and --hidden-states go together")
    if not 1 <= args.top_k <= _MAX_TOP_K:
        p.error("--top-k: expected 1 to %d" % _MAX_TOP_K)
    return args


def _load_inputs(args):
    """W and X (read from safetensors files or made at random) and the report's account of
    where they came from."""
    if args.weights is not None:
        w = read_safetensors(args.weights, "--weights")
        x = read_safetensors(args.hidden_states, "--hidden-states")
        if w.shape[1] != x.shape[1]:
            raise SystemExit("W is %s and X is %s: their hidden sizes differ" % (list(w.shape), list(x.shape)))
        source = {"weights": args.weights, "hidden_states": args.hidden_states}
    else:
        w, x = random_inputs(args.tokens, args.hidden, args.vocab, args.seed, args.scale)
        source = {"random": {"seed": args.seed, "scale": args.scale}}
    return w, x, source


def _write_outputs(args, r, summary, M, K, V):
    """The files the command line asked for: the targets used, the JSON summary, the histogram."""
    if args.save_targets:
        np.save(args.save_targets, r["targets"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2)
            f.write("\n")
    if args.png:
        title = "BF16 head vs logitd FP32, M=%d K=%d V=%d" % (M, K, V)
        if write_png(args.png, r["delta"], title):
            print("histogram: %s" % args.png)
        else:
            print("matplotlib is not installed: no histogram written (pip install matplotlib for --png)")


def main(argv=None):
    args = _parse_args(argv)

    def log(msg):
        # What stdout holds first, so that a pipe of both keeps their order.
        sys.stdout.flush()
        print(msg, file=sys.stderr, flush=True)

    t0 = time.monotonic()
    w, x, source = _load_inputs(args)
    (V, K), M = w.shape, x.shape[0]
    targets = read_targets(args.targets, M, V) if args.targets else None
    source["targets"] = args.targets or "sampled from logitd's fp32 distribution (seed %d)" % args.seed

    with logitd.Client(args.address, token=args.token) as client:
        info = client.info()
        print("logitd %s (%s) backend=%s device=%s" % (info.version, info.build_id, info.backend, info.device_name))
        print("M=%d K=%d V=%d, inputs made in %.1f s" % (M, K, V, time.monotonic() - t0))
        weight = client.register_weights(w, name="rl_logprob_check.weight")
        try:
            t1 = time.monotonic()
            chunk_bytes = int(args.chunk_mib * (1 << 20))
            r = compare(client, weight.handle, x, V, targets, args.top_k, args.seed, chunk_bytes, log)
            elapsed = time.monotonic() - t1
        finally:
            client.release_weights(weight.handle)

    s = summarize(r, args.clip)
    print(
        "%d rows per call, %.1f s; targets: %s%s"
        % (
            s["rows_per_chunk"],
            elapsed,
            source["targets"],
            ", %d extra LogProbs calls of rejected rows" % s["sampling_rounds"] if targets is None else "",
        )
    )
    print_table(s)
    summary = {
        "shape": {"tokens": M, "hidden": K, "vocab": V},
        "server": {"version": info.version, "backend": info.backend, "device": info.device_name},
        "inputs": source,
        "seconds": elapsed,
        **s,
    }
    _write_outputs(args, r, summary, M, K, V)
    return 0


if __name__ == "__main__":
    sys.exit(main())
