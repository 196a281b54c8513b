"""examples/rl_logprob_check.py run as a script against the cpu server, its report
checked against log-probs recomputed here from fp32 and bf16 logits."""

import importlib.util
import json
import struct
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

pytestmark = pytest.mark.needs_server

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "rl_logprob_check.py"
M, K, V = 64, 256, 1000
TOP_K = 8


def load_example():
    spec = importlib.util.spec_from_file_location("rl_logprob_check", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_example(server, tmp_path, *args):
    report = tmp_path / "report.json"
    saved = tmp_path / "targets.npy"
    cmd = [sys.executable, str(EXAMPLE), server, "--top-k", str(TOP_K), "--json", str(report)]
    cmd += ["--save-targets", str(saved)] + [str(a) for a in args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout, json.loads(report.read_text()), np.load(saved)


def log_softmax(y):
    y = np.asarray(y).astype(np.float64)
    m = y.max(axis=1, keepdims=True)
    return y - (m + np.log(np.exp(y - m).sum(axis=1, keepdims=True)))


def recompute(client, weights, w, x, targets):
    """The report's figures from Logits in fp32 and in bf16, log_softmax in float64 here."""
    h = weights(w, name="rl_recompute").handle
    y32, y16 = client.logits(x, h), client.logits(x, h, out_dtype="bf16")
    lp, lq = log_softmax(y32), log_softmax(y16)
    rows = np.arange(x.shape[0])
    delta = lq[rows, targets] - lp[rows, targets]
    # logitd's top-k: most likely first, ties to the lower id.
    ids = np.argsort(-np.asarray(y32), axis=1, kind="stable")[:, :TOP_K]
    pk, qk = lp[rows[:, None], ids], lq[rows[:, None], ids]
    pk = pk - np.log(np.exp(pk).sum(axis=1, keepdims=True))
    qk = qk - np.log(np.exp(qk).sum(axis=1, keepdims=True))
    kl = (np.exp(pk) * (pk - qk)).sum(axis=1)
    flips = int((np.asarray(y16).astype(np.float64).argmax(axis=1) != ids[:, 0]).sum())
    return delta, kl, flips, lp[rows, targets]


def check_report(r, delta, kl, flips):
    assert r["tokens"] == M and r["shape"] == {"tokens": M, "hidden": K, "vocab": V}
    # Sane on its own.
    assert r["abs_delta_logp"]["max"] > 0
    assert 0 < r["abs_delta_logp"]["mean"] <= r["abs_delta_logp"]["max"]
    assert r["ratio"]["min"] < 1 < r["ratio"]["max"]
    assert r["ratio"]["min"] <= r["ratio"]["p1"] <= r["ratio"]["p50"] <= r["ratio"]["p99"] <= r["ratio"]["max"]
    assert 0 <= r["kl_topk"]["mean"] <= r["kl_topk"]["max"]
    assert 0 <= r["top1_flips_bf16_tie"] <= r["top1_flips"] <= M
    assert 0 <= r["clipped"] <= M
    # And what the recomputation gives (logitd's fp32 log-probs against float64 log_softmax of
    # the fp32 logits: a few fp32 roundings apart).
    assert r["abs_delta_logp"]["max"] == pytest.approx(np.abs(delta).max(), abs=2e-6)
    assert r["abs_delta_logp"]["mean"] == pytest.approx(np.abs(delta).mean(), abs=2e-6)
    assert r["ratio"]["min"] == pytest.approx(np.exp(delta.min()), abs=2e-6)
    assert r["ratio"]["max"] == pytest.approx(np.exp(delta.max()), abs=2e-6)
    assert r["kl_topk"]["mean"] == pytest.approx(kl.mean(), rel=1e-3, abs=1e-9)
    assert r["kl_topk"]["max"] == pytest.approx(kl.max(), rel=1e-3, abs=1e-9)
    assert r["top1_flips"] == flips


def test_rl_example_random_inputs_sampled_targets(server, client, weights, tmp_path):
    png = tmp_path / "delta.png"
    # A chunk of 50 KiB of bf16 logits holds 26 rows: three Logits and LogProbs calls.
    stdout, r, targets = run_example(
        server, tmp_path, "--tokens", M, "--hidden", K, "--vocab", V, "--seed", 7, "--chunk-mib", 0.05, "--png", png
    )
    assert r["rows_per_chunk"] == 26
    assert "max |dlogp|" in stdout and "top-1 flips" in stdout
    try:
        import matplotlib  # noqa: F401

        assert png.stat().st_size > 0
    except ImportError:
        assert "matplotlib is not installed" in stdout and not png.exists()
    assert targets.shape == (M,) and ((targets >= 0) & (targets < V)).all()

    w, x = load_example().random_inputs(M, K, V, seed=7)
    delta, kl, flips, logp = recompute(client, weights, w, x, targets)
    check_report(r, delta, kl, flips)
    assert r["target_logp_fp32_mean"] == pytest.approx(logp.mean(), abs=1e-5)


def write_safetensors(path, tensors):
    names = {np.dtype(ml_dtypes.bfloat16): "BF16", np.dtype(np.float32): "F32"}
    header, blobs, offset = {}, [], 0
    for name, a in tensors.items():
        data = np.ascontiguousarray(a).tobytes()
        header[name] = {"dtype": names[a.dtype], "shape": list(a.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def test_rl_example_safetensors_inputs_given_targets(server, client, weights, tmp_path):
    rng = np.random.default_rng(11)
    w = ((rng.random((V, K), dtype=np.float32) * 2 - 1) * (3 / np.sqrt(K))).astype(ml_dtypes.bfloat16)
    x32 = rng.standard_normal((M, K), dtype=np.float32)  # F32 in the file: the example rounds it to bf16
    write_safetensors(tmp_path / "head.safetensors", {"lm_head.weight": w, "other": np.zeros((2, 3), np.float32)})
    write_safetensors(tmp_path / "x.safetensors", {"hidden": x32})
    given = rng.integers(0, V, M)
    (tmp_path / "targets.txt").write_text("\n".join(str(t) for t in given) + "\n")

    _, r, targets = run_example(
        server,
        tmp_path,
        "--weights",
        "%s:lm_head.weight" % (tmp_path / "head.safetensors"),
        "--hidden-states",
        tmp_path / "x.safetensors",
        "--targets",
        tmp_path / "targets.txt",
    )
    np.testing.assert_array_equal(targets, given)
    assert r["sampling_rounds"] == 0 and r["rows_per_chunk"] == M
    delta, kl, flips, _ = recompute(client, weights, w, x32.astype(ml_dtypes.bfloat16), given)
    check_report(r, delta, kl, flips)
