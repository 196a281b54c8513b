"""Check your own LM-head kernel against logitd's contract.

"My kernel" here is numpy: the logits Y = X . W^T as a float32 matmul of the
bf16 values of X [M, K] and W [V, K]. Put your own in its place (a framework's
GEMM, a Triton kernel, a library upgrade): anything that returns fp32 or bf16
[M, V] from the same bf16 inputs. The server computes, per element, an fp64
reference of the exact products and the proven bound on any fp32 accumulation
of them, tests whether the errors are those of fp32 accumulation (the precision
class), compares with logitd's own output, and answers with a verdict; this
script prints it in words and exits 0 when the kernel passes (within bounds, or
bitwise logitd's own, on every row or the rows sampled), 1 when it does not
(outside_bounds, outside_precision_class) or the call fails.

--round-to-bf16 shows a failing kernel: the same logits rounded to bf16 and
passed off as fp32 (outside_bounds at the default hidden size; at 4096 and up,
where the proven bound holds bf16 rounding, outside_precision_class).

    python verify_my_kernel.py --server 127.0.0.1:50051 [--tokens 16 --hidden 1024 --vocab 4096]
"""

import argparse
import sys

import ml_dtypes
import numpy as np

import logitd

BF16 = np.dtype(ml_dtypes.bfloat16)


def my_kernel(x: np.ndarray, w: np.ndarray, round_to_bf16: bool = False) -> np.ndarray:
    """The logits X . W^T of bf16 X [M, K] and W [V, K]: a float32 matmul (fp32 accumulation)."""
    y = x.astype(np.float32) @ w.astype(np.float32).T
    if round_to_bf16:
        # A kernel that keeps bf16 logits but hands them out as fp32.
        y = y.astype(BF16).astype(np.float32)
    return y


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", default="127.0.0.1:50051", help="logitd's address (default %(default)s)")
    parser.add_argument("--token", default=None, help="bearer token, for a server started with --auth_tokens")
    parser.add_argument("--tokens", type=int, default=16, help="M, rows of X (default %(default)s)")
    parser.add_argument("--hidden", type=int, default=1024, help="K (default %(default)s)")
    parser.add_argument("--vocab", type=int, default=4096, help="V, rows of W (default %(default)s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sample-rows", type=int, default=0, help="check this many rows (default: all)")
    parser.add_argument(
        "--sample-seed", type=int, default=0, help="with --sample-rows: draw the rows by this seed (default: evenly spaced)"
    )
    parser.add_argument("--round-to-bf16", action="store_true", help="round my kernel's logits to bf16 (fails)")
    args = parser.parse_args(argv)

    rng = np.random.default_rng(args.seed)
    w = rng.standard_normal((args.vocab, args.hidden), dtype=np.float32).astype(BF16)
    x = rng.standard_normal((args.tokens, args.hidden), dtype=np.float32).astype(BF16)
    y = my_kernel(x, w, args.round_to_bf16)

    try:
        with logitd.Client(args.server, token=args.token) as client:
            weight = client.register_weights(w, name="verify_my_kernel")
            try:
                verdict = client.verify_logits(
                    x, y, weight, sample_rows=args.sample_rows, sample_seed=args.sample_seed
                )
            finally:
                client.release_weights(weight)
    except logitd.LogitdError as e:
        print("verify_my_kernel: %s" % e, file=sys.stderr)
        return 1
    print(verdict.describe())
    return 0 if verdict.passed else 1


if __name__ == "__main__":
    sys.exit(main())
