"""Reference arithmetic of the tests: RNE in integer arithmetic, exact sums, bounds."""

import numpy as np

import logitd


def rne_bf16_bits(values):
    """fp32 -> bf16 bits, round to nearest even, in integer arithmetic.

    NaN stays NaN (quieted, sign and top payload kept); values past the largest
    finite bf16 become +-Inf.
    """
    u = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    lsb = (u >> 16) & 1
    rounded = ((u + 0x7FFF + lsb) >> 16) & 0xFFFF
    quieted = ((u >> 16) | 0x0040) & 0xFFFF
    return np.where(nan, quieted, rounded).astype(np.uint16)


def bits(a):
    """The raw bits of a bf16 or fp32 array, for bitwise comparison."""
    a = np.ascontiguousarray(a)
    if a.dtype == logitd.BF16:
        return a.view(np.uint16)
    if a.dtype == np.float32:
        return a.view(np.uint32)
    raise TypeError(a.dtype)


def int_tensor(rng, shape, lo=-8, hi=8):
    """Integer values in [lo, hi] as int64 (for exact references)."""
    return rng.integers(lo, hi + 1, size=shape, dtype=np.int64)


def to_bf16(a):
    return np.asarray(a).astype(np.float32).astype(logitd.BF16)


def gamma(n):
    """The fp32 accumulation bound factor gamma_n = n u / (1 - n u), u = 2^-24."""
    u = 2.0**-24
    return n * u / (1 - n * u)
