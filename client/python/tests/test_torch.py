"""torch tensors in and out, and the autograd example; skipped where torch is not installed."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from reference import int_tensor, rne_bf16_bits

import logitd

torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch to run these tests)")

pytestmark = pytest.mark.needs_server

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "autograd_lm_head.py"


def bf16_bits(t):
    return t.view(torch.int16).numpy().view(np.uint16)


def as_torch_bf16(a):
    return torch.from_numpy(np.asarray(a, dtype=np.float32)).to(torch.bfloat16)


def test_torch_logits_and_backward_are_exact_on_integers(client, weights):
    rng = np.random.default_rng(21)
    M, V, K = 8, 80, 512
    xi, wi, dyi = int_tensor(rng, (M, K)), int_tensor(rng, (V, K)), int_tensor(rng, (M, V))
    h = weights(as_torch_bf16(wi)).handle
    x = as_torch_bf16(xi).requires_grad_()  # a tensor in a graph is read, not modified

    y = client.logits(x, h)
    assert isinstance(y, torch.Tensor) and y.dtype == torch.float32 and tuple(y.shape) == (M, V)
    assert torch.equal(y, torch.from_numpy((xi @ wi.T).astype(np.float32)))

    y16 = client.logits(x, h, out_dtype=torch.bfloat16)
    assert y16.dtype == torch.bfloat16
    np.testing.assert_array_equal(bf16_bits(y16), rne_bf16_bits((xi @ wi.T).astype(np.float32)))
    assert torch.equal(y16, y.to(torch.bfloat16))  # torch's own RNE cast agrees

    dx, dw = client.backward(torch.from_numpy(dyi.astype(np.float32)), x, h)
    assert dx.dtype == torch.bfloat16 and dw.dtype == torch.float32
    np.testing.assert_array_equal(bf16_bits(dx), rne_bf16_bits((dyi @ wi).astype(np.float32)))
    assert torch.equal(dw, torch.from_numpy((dyi.T @ xi).astype(np.float32)))


def test_torch_non_contiguous_and_fetch(client, weights):
    rng = np.random.default_rng(22)
    wi, xi, dyi = int_tensor(rng, (32, 64)), int_tensor(rng, (64, 6)), int_tensor(rng, (6, 32))
    h = weights(as_torch_bf16(wi)).handle
    x = as_torch_bf16(xi).t()  # [6, 64], a transposed view
    assert not x.is_contiguous()
    assert torch.equal(client.logits(x, h), torch.from_numpy((xi.T @ wi.T).astype(np.float32)))
    client.backward(torch.from_numpy(dyi.astype(np.float32)), x, h, want_dx=False, accumulate_dw=True)
    g = client.fetch_gradient(h, as_torch=True)
    assert isinstance(g.dw, torch.Tensor) and g.accumulated_calls == 1
    assert torch.equal(g.dw, torch.from_numpy((dyi.T @ xi.T).astype(np.float32)))


def test_torch_cast_matches_torch(client):
    v = torch.tensor([1.00390625, 1.01171875, -1.00390625, 3.4e38, -3.4e38, float("inf"), 1e-40, 0.0, -0.0])
    v = torch.cat([v, torch.randn(4096) * 1e3])
    out = client.cast_to_bf16(v)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out.view(torch.int16), v.to(torch.bfloat16).view(torch.int16))
    nan = client.cast_to_bf16(torch.tensor([float("nan")]))
    assert torch.isnan(nan).all()


def test_torch_wrong_dtype_is_invalid_argument(client, weights):
    h = weights(torch.ones(4, 8, dtype=torch.bfloat16)).handle
    with pytest.raises(logitd.InvalidArgumentError):
        client.logits(torch.ones(1, 8, dtype=torch.float16), h)
    with pytest.raises(logitd.InvalidArgumentError):
        client.logits(torch.ones(1, 8, dtype=torch.float32), h)


def test_autograd_example_matches_torch(client):
    spec = importlib.util.spec_from_file_location("autograd_lm_head", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    figures = example.check(client, tokens=8, hidden=256, vocab=1024, seed=3, device="cpu")
    for name in ("logits fp32", "dX bf16", "dW fp32"):
        assert figures[name]["inside_bound"], (name, figures[name])
    assert figures["ok"]
    assert abs(figures["loss"]["logitd"] - figures["loss"]["torch"]) < 1e-4
