"""The Open Inference Protocol front door, called with Triton's own client.

tritonclient.grpc speaks inference.GRPCInferenceService (KServe v2); the
weights are registered with logitd's client and called as models by name:
NAME for the logits, NAME/logprobs for the log-probs. Tensors travel in the
messages or through system shared memory (tritonclient.utils.shared_memory,
on a server started with --allow_shm).
"""

import os

import numpy as np
import pytest
from reference import bits, gamma, int_tensor, rne_bf16_bits, to_bf16
from test_auth import running_server

import logitd

grpcclient = pytest.importorskip("tritonclient.grpc")
shm = pytest.importorskip("tritonclient.utils.shared_memory")
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


def _infer(triton, model, inputs, parameters, **kwargs):
    """triton.infer with float parameters as double_param, or as strings
    (which logitd takes as well) where the tritonclient release sends no
    floats: older ones refuse them on the client side, with no status."""
    try:
        return triton.infer(model, inputs, parameters=parameters, **kwargs)
    except InferenceServerException as e:
        if e.status() is not None:
            raise
    as_strings = {k: repr(v) if isinstance(v, float) else v for k, v in parameters.items()}
    return triton.infer(model, inputs, parameters=as_strings, **kwargs)


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


def test_shared_memory_input_and_output(tmp_path):
    """x and the logits in one system shared-memory region, the Triton way."""
    rng = np.random.default_rng(8)
    w = int_tensor(rng, (V, K))
    x = int_tensor(rng, (16, K))
    x_bytes, y_bytes = 16 * K * 2, 16 * V * 4
    key = "/logitd-oip-test-%d" % os.getpid()
    with running_server(tmp_path, "--allow_shm") as (address, _, _):
        with logitd.Client(address, timeout=60) as c:
            c.register_weights(to_bf16(w), name="oip_shm")
        triton = grpcclient.InferenceServerClient(address)
        region = shm.create_shared_memory_region("oip_io", key, x_bytes + y_bytes)
        try:
            assert "system_shared_memory" in triton.get_server_metadata().extensions
            shm.set_shared_memory_region(region, [to_bf16(x).view(np.uint16)])
            triton.unregister_system_shared_memory()
            triton.register_system_shared_memory("oip_io", key, x_bytes + y_bytes)
            status = triton.get_system_shared_memory_status()
            assert status.regions["oip_io"].key == key
            assert status.regions["oip_io"].byte_size == x_bytes + y_bytes

            inp = grpcclient.InferInput("x", [16, K], "BF16")
            inp.set_shared_memory("oip_io", x_bytes)
            out = grpcclient.InferRequestedOutput("logits")
            out.set_shared_memory("oip_io", y_bytes, offset=x_bytes)
            r = triton.infer("oip_shm", [inp], outputs=[out])
            declared = r.get_output("logits")
            assert (declared.datatype, list(declared.shape)) == ("FP32", [16, V])
            assert declared.parameters["shared_memory_region"].string_param == "oip_io"
            y = shm.get_contents_as_numpy(region, np.float32, [16, V], offset=x_bytes)
            np.testing.assert_array_equal(bits(y), bits((x @ w.T).astype(np.float32)))

            # A byte size other than the tensor's, and a region not registered.
            bad = grpcclient.InferInput("x", [16, K], "BF16")
            bad.set_shared_memory("oip_io", x_bytes - 2)
            with pytest.raises(InferenceServerException) as e:
                triton.infer("oip_shm", [bad])
            assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
            triton.unregister_system_shared_memory("oip_io")
            assert len(triton.get_system_shared_memory_status().regions) == 0
            with pytest.raises(InferenceServerException) as e:
                triton.infer("oip_shm", [inp])
            assert e.value.status() == "StatusCode.NOT_FOUND"
        finally:
            shm.destroy_shared_memory_region(region)
            triton.close()


def test_shared_memory_needs_allow_shm(triton):
    with pytest.raises(InferenceServerException) as e:
        triton.register_system_shared_memory("r", "/logitd-oip-none", 64)
    assert e.value.status() == "StatusCode.FAILED_PRECONDITION"
    assert "--allow_shm" in e.value.message()


LOGPROBS_OUTPUTS = ("logprob", "lse", "entropy", "topk_ids", "topk_logprobs", "rank")


@pytest.mark.parametrize("targets_dtype", [np.int32, np.int64])
def test_logprobs_model_equals_the_native_call(triton, client, weights, targets_dtype):
    rng = np.random.default_rng(9)
    w = to_bf16(rng.standard_normal((V, K)))
    x = to_bf16(rng.standard_normal((8, K)))
    t = np.array([0, 89, 17, -100, 45, 3, 60, 7], dtype=targets_dtype)
    info = weights(w, name="oip_lp")
    options = dict(top_k=4, temperature=0.7, logit_softcap=30.0, want_entropy=True, want_lse=True, want_rank=True)
    native = client.logprobs(x, info.handle, targets=t, vocab_size=90, **options)
    targets = grpcclient.InferInput("targets", [8], "INT32" if targets_dtype == np.int32 else "INT64")
    targets.set_data_from_numpy(t)
    r = _infer(triton, "oip_lp/logprobs", [_input(x), targets], dict(vocab_size=90, **options))
    for name in LOGPROBS_OUTPUTS:
        got, want = r.as_numpy(name), getattr(native, name)
        assert got.dtype == want.dtype and got.shape == want.shape, name
        np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8), err_msg=name)


def test_logprobs_metadata_requested_outputs_and_refusals(triton, client, weights):
    rng = np.random.default_rng(10)
    w = to_bf16(rng.standard_normal((V, K)))
    x = to_bf16(rng.standard_normal((3, K)))
    info = weights(w, name="oip_lp_meta")
    assert triton.is_model_ready("oip_lp_meta/logprobs")
    meta = triton.get_model_metadata("oip_lp_meta/logprobs")
    assert [(t.name, t.datatype) for t in meta.inputs] == [("x", "BF16"), ("targets", "INT64")]
    assert [t.name for t in meta.outputs] == list(LOGPROBS_OUTPUTS)
    # A requested output is the one returned, asked for without want_entropy.
    r = triton.infer("oip_lp_meta/logprobs", [_input(x)], outputs=[grpcclient.InferRequestedOutput("entropy")])
    assert [o.name for o in r.get_response().outputs] == ["entropy"]
    native = client.logprobs(x, info.handle, want_entropy=True)
    np.testing.assert_array_equal(bits(r.as_numpy("entropy")), bits(native.entropy))
    for params in ({"top_k": 65}, {"top_k": -1}, {"temperature": 0.0}):
        with pytest.raises(InferenceServerException) as e:
            _infer(triton, "oip_lp_meta/logprobs", [_input(x)], dict(want_lse=True, **params))
        assert e.value.status() == "StatusCode.INVALID_ARGUMENT", params
