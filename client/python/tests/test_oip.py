"""The Open Inference Protocol front door, called with Triton's own client.

tritonclient.grpc speaks inference.GRPCInferenceService (KServe v2); the
weights are registered with logitd's client and called as models by name.
"""

import numpy as np
import pytest
from reference import bits, gamma, int_tensor, rne_bf16_bits, to_bf16

grpcclient = pytest.importorskip("tritonclient.grpc")
from tritonclient.utils import InferenceServerException  # noqa: E402

pytestmark = pytest.mark.needs_server

V, K = 96, 64


@pytest.fixture
def triton(server):
    c = grpcclient.InferenceServerClient(server)
    yield c
    c.close()


def _input(x):
    # tritonclient takes BF16 data as ml_dtypes.bfloat16 (r26.06 on) or as
    # float32 values whose top 16 bits it sends (before): exact for bf16 values.
    inp = grpcclient.InferInput("x", list(x.shape), "BF16")
    try:
        inp.set_data_from_numpy(to_bf16(x))
    except InferenceServerException:
        inp.set_data_from_numpy(to_bf16(x).astype(np.float32))
    return inp


def test_server_live_ready_metadata(triton):
    assert triton.is_server_live()
    assert triton.is_server_ready()
    meta = triton.get_server_metadata()
    assert meta.name == "logitd"
    assert meta.version


def test_model_metadata_and_ready(triton, weights):
    rng = np.random.default_rng(1)
    info = weights(to_bf16(int_tensor(rng, (V, K))), name="oip_meta")
    for model in ("oip_meta", info.handle):
        assert triton.is_model_ready(model)
        meta = triton.get_model_metadata(model)
        assert list(meta.versions) == ["1"]
        assert (meta.inputs[0].name, meta.inputs[0].datatype, list(meta.inputs[0].shape)) == ("x", "BF16", [-1, K])
        assert (meta.outputs[0].name, meta.outputs[0].datatype, list(meta.outputs[0].shape)) == (
            "logits",
            "FP32",
            [-1, V],
        )
    assert not triton.is_model_ready("no_such_model")


def test_exact_integer_logits(triton, weights):
    rng = np.random.default_rng(2)
    w = int_tensor(rng, (V, K))
    x = int_tensor(rng, (16, K))
    weights(to_bf16(w), name="oip_exact")
    r = triton.infer("oip_exact", [_input(x)], outputs=[grpcclient.InferRequestedOutput("logits")])
    y = r.as_numpy("logits")
    assert y.dtype == np.float32 and y.shape == (16, V)
    np.testing.assert_array_equal(bits(y), bits((x @ w.T).astype(np.float32)))


def test_bf16_out_and_alpha(triton, weights):
    rng = np.random.default_rng(3)
    w = int_tensor(rng, (V, K))
    x = int_tensor(rng, (4, K))
    weights(to_bf16(w), name="oip_bf16")
    r = triton.infer("oip_bf16", [_input(x)], parameters={"out_dtype": "bf16", "alpha": "2"})
    assert r.get_output("logits").datatype == "BF16"
    got = np.frombuffer(r.get_response().raw_output_contents[0], dtype=np.uint16).reshape(4, V)
    np.testing.assert_array_equal(got, rne_bf16_bits((2 * x @ w.T).astype(np.float32)))


def test_fp32_within_gamma_bound(triton, weights):
    rng = np.random.default_rng(4)
    w = to_bf16(rng.standard_normal((V, K)))
    x = to_bf16(rng.standard_normal((8, K)))
    weights(w, name="oip_normal")
    y = triton.infer("oip_normal", [_input(x)]).as_numpy("logits")
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    bound = gamma(K) * (np.abs(x64) @ np.abs(w64).T)
    assert np.all(np.abs(y.astype(np.float64) - x64 @ w64.T) <= bound)


def test_missing_model_is_not_found(triton):
    with pytest.raises(InferenceServerException) as e:
        triton.infer("no_such_model", [_input(np.zeros((1, K)))])
    assert e.value.status() == "StatusCode.NOT_FOUND"
    assert "no_such_model" in e.value.message()


def test_oversize_response_names_the_limit(triton, weights):
    rng = np.random.default_rng(5)
    weights(to_bf16(int_tensor(rng, (V, K))), name="oip_big")
    # 11,000 x 96 fp32 logits: over the 4 MiB message limit.
    with pytest.raises(InferenceServerException) as e:
        triton.infer("oip_big", [_input(np.zeros((11000, K)))])
    assert e.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
    assert "max message size" in e.value.message() and "Logits" in e.value.message()


def test_bad_input_is_invalid_argument(triton, weights):
    rng = np.random.default_rng(6)
    weights(to_bf16(int_tensor(rng, (V, K))), name="oip_bad")
    inp = grpcclient.InferInput("x", [2, K], "FP32")
    inp.set_data_from_numpy(np.zeros((2, K), dtype=np.float32))
    with pytest.raises(InferenceServerException) as e:
        triton.infer("oip_bad", [inp])
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "BF16" in e.value.message()


def test_logitd_client_still_works_beside(client, weights):
    rng = np.random.default_rng(7)
    w = int_tensor(rng, (V, K))
    info = weights(to_bf16(w), name="oip_beside")
    x = int_tensor(rng, (2, K))
    y = client.logits(to_bf16(x), info.handle)
    np.testing.assert_array_equal(bits(y), bits((x @ w.T).astype(np.float32)))
