"""Speaking logitd.v1 with the generated stubs only: tensor encoding, request
streams, response streams and their checks.

Everything a client in another language would have to write is here in a few
lines each: bf16 as the upper 16 bits of an IEEE binary32, little-endian
row-major bytes, xxh3-64 with seed 0, a header message followed by
TensorChunk messages, and a response stream of one result message, the
outputs' chunks and (with digest_last) one TensorDigest per output.
"""

import json
import re
import struct
import threading

import grpc
import numpy as np
import xxhash

from stubs import pb, pb_grpc

# The gRPC default receive limit of clients that set no channel options.
DEFAULT_RECEIVE_LIMIT = 4 << 20
# Chunk size the suite uploads tensors with unless a test says otherwise:
# small enough that modest tensors already travel as several chunks.
UPLOAD_CHUNK_BYTES = 64 << 10
# Deadline of every call the suite makes, so that a server that stops
# answering fails a test instead of hanging the run.
CALL_TIMEOUT_S = 300

ELEMENT_SIZE = {pb.DTYPE_BF16: 2, pb.DTYPE_FP32: 4, pb.DTYPE_INT32: 4, pb.DTYPE_INT64: 8}
NUMPY_DTYPE = {pb.DTYPE_BF16: "<u2", pb.DTYPE_FP32: "<f4", pb.DTYPE_INT32: "<i4", pb.DTYPE_INT64: "<i8"}


# --- Tensor encoding -----------------------------------------------------------


def to_bf16_bits(values):
    """bfloat16 bit patterns (uint16) of `values`, rounded to nearest even.

    The values are first made fp32 (exact for the integer-valued data the
    suite uses); NaN stays NaN (quiet).
    """
    values = np.asarray(values)
    if values.ndim == 0:
        values = values.reshape(1)
    flat = values.reshape(-1)
    out = np.empty(flat.size, dtype=np.uint16)
    # A block at a time: the suite streams tensors of gigabytes, and whole-size
    # temporaries would cost more than the arithmetic. The sum wraps only for
    # NaN patterns, which are replaced below.
    block = 1 << 20
    for start in range(0, flat.size, block):
        f32 = np.ascontiguousarray(flat[start : start + block], dtype=np.float32)
        bits = f32.view(np.uint32)
        rounded = bits >> 16
        rounded &= 1
        rounded += 0x7FFF
        rounded += bits
        rounded >>= 16
        nan = np.isnan(f32)
        if nan.any():
            rounded[nan] = (bits[nan] >> 16) | 0x40
        out[start : start + block] = rounded
    return out.reshape(values.shape)


def from_bf16_bits(bits):
    """fp32 values of bfloat16 bit patterns (exact)."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def as_bf16(values):
    """Values rounded to bf16 (nearest even), as fp32."""
    return from_bf16_bits(to_bf16_bits(values))


def raw_bytes(array, dtype):
    """Row-major little-endian bytes of `array` as a tensor of proto dtype `dtype`.

    For DTYPE_BF16 the array holds the values; they are rounded to bf16.
    """
    if dtype == pb.DTYPE_BF16:
        return to_bf16_bits(array).astype("<u2").tobytes()
    return np.ascontiguousarray(array, dtype=NUMPY_DTYPE[dtype]).tobytes()


def decode(spec, data):
    """The numpy array a TensorSpec and its bytes describe (bf16 widened to fp32)."""
    flat = np.frombuffer(data, dtype=NUMPY_DTYPE[spec.dtype])
    if spec.dtype == pb.DTYPE_BF16:
        flat = from_bf16_bits(flat)
    return flat.reshape(tuple(spec.shape))


def xxh3(data):
    """xxh3-64, seed 0: the digest every TensorSpec and TensorDigest carries."""
    return xxhash.xxh3_64_intdigest(data)


class Tensor:
    """One request tensor: its spec and its bytes."""

    def __init__(self, name, dtype, array=None, shape=None, data=None):
        if data is None:
            data = raw_bytes(array, dtype)
            shape = np.shape(array)
        self.name = name
        self.dtype = dtype
        self.shape = tuple(int(d) for d in shape)
        self.data = data

    def spec(self, digest=None):
        """The TensorSpec announcing this tensor; `digest` overrides its xxh3."""
        return pb.TensorSpec(
            name=self.name,
            dtype=self.dtype,
            shape=list(self.shape),
            xxh3=xxh3(self.data) if digest is None else digest,
        )


def chunk(name, offset, data):
    """A TensorChunk of tensor `name` at byte `offset`."""
    return pb.TensorChunk(name=name, offset=offset, data=data)


def chunks_of(tensor, chunk_bytes=UPLOAD_CHUNK_BYTES):
    """A tensor's bytes as TensorChunks of at most chunk_bytes, in order."""
    return [
        chunk(tensor.name, offset, tensor.data[offset : offset + chunk_bytes])
        for offset in range(0, len(tensor.data), chunk_bytes)
    ]


# --- Safetensors files (LoadWeight) -------------------------------------------------


def write_safetensors(path, tensors):
    """Writes a safetensors file: {name: (dtype string, shape, bytes)}."""
    header = {}
    offset = 0
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for _, _, data in tensors.values():
            f.write(data)


# --- Responses ----------------------------------------------------------------------


class Streamed:
    """What one response stream carried.

    order: the stream's parts in order: "result", "chunk:NAME" once per run of
    a tensor's chunks, "digest:NAME". result: the result message. tensors:
    each output's bytes. digests: each trailing TensorDigest. chunk_sizes:
    each output's chunk sizes. trailer: the trailing metadata.
    """

    def __init__(self):
        self.order = []
        self.result = None
        self.tensors = {}
        self.digests = {}
        self.chunk_sizes = {}
        self.trailer = {}


def read_stream(call, on_chunk=None):
    """Reads a tensor call's whole response stream into a Streamed.

    Checks what every response stream must satisfy: one result first, chunks
    of one tensor at a time starting at offset 0 and contiguous. `on_chunk`,
    when given, receives each TensorChunk instead of its bytes being kept.
    """
    got = Streamed()
    for message in call:
        part = message.WhichOneof("part")
        if part == "result":
            assert got.result is None, "a second result message in the response stream"
            assert not got.order, "the result message is not the first of the response stream"
            got.order.append("result")
            got.result = message.result
        elif part == "chunk":
            c = message.chunk
            assert got.result is not None, "chunk of '%s' before the result message" % c.name
            if not got.order or got.order[-1] != "chunk:" + c.name:
                assert "chunk:" + c.name not in got.order, "chunks of '%s' interleaved with another tensor's" % c.name
                got.order.append("chunk:" + c.name)
                got.tensors[c.name] = bytearray()
                got.chunk_sizes[c.name] = []
            received = sum(got.chunk_sizes[c.name])
            assert c.offset == received, "chunk of '%s' at offset %d, expected %d" % (c.name, c.offset, received)
            got.chunk_sizes[c.name].append(len(c.data))
            if on_chunk is None:
                got.tensors[c.name] += c.data
            else:
                on_chunk(c)
        elif part == "digest":
            got.order.append("digest:" + message.digest.name)
            got.digests[message.digest.name] = message.digest.xxh3
        else:
            raise AssertionError("a response message with no part set")
    got.trailer = dict(call.trailing_metadata() or ())
    return got


def check_output(got, spec, digest_last):
    """Checks one streamed output against its spec and returns it decoded.

    Without digest_last the spec carries the xxh3 of the bytes and no digest
    message follows; with it the spec carries 0 and a TensorDigest after the
    last chunk of all carries the xxh3.
    """
    data = bytes(got.tensors.get(spec.name, b""))
    expected = 1
    for d in spec.shape:
        expected *= d
    expected *= ELEMENT_SIZE[spec.dtype]
    assert len(data) == expected, "'%s': %d bytes received, its spec %s says %d" % (
        spec.name,
        len(data),
        list(spec.shape),
        expected,
    )
    if digest_last:
        assert spec.xxh3 == 0, "'%s': digest_last asked, yet the result's spec carries xxh3 %#x" % (
            spec.name,
            spec.xxh3,
        )
        assert spec.name in got.digests, "'%s': digest_last asked, but no TensorDigest followed its chunks" % spec.name
        assert got.digests[spec.name] == xxh3(data), "'%s': trailing digest does not match the bytes" % spec.name
    else:
        assert spec.name not in got.digests, "'%s': a TensorDigest came although digest_last was not asked" % spec.name
        assert spec.xxh3 == xxh3(data), "'%s': spec xxh3 %#x does not match the bytes (%#x)" % (
            spec.name,
            spec.xxh3,
            xxh3(data),
        )
    return decode(spec, data)


def expected_order(outputs, digest_last):
    """The response stream of `outputs`: result, each one's chunks, then the digests."""
    order = ["result"] + ["chunk:" + n for n in outputs]
    if digest_last:
        order += ["digest:" + n for n in outputs]
    return order


def parse_timing(value):
    """The logitd-timing trailer as {key: microseconds}."""
    out = {}
    for item in value.split(","):
        key, _, number = item.partition("=")
        out[key] = int(number)
    return out


# --- The connection -------------------------------------------------------------------


class Connection:
    """A channel to the server under test and the calls the suite makes on it.

    The channel is grpc.insecure_channel(address) without options, as a
    client in any language gets by default: 4 MiB receive limit.
    """

    def __init__(self, address, token=None):
        self.address = address
        self.channel = grpc.insecure_channel(address)
        self.stub = pb_grpc.LogitdStub(self.channel)
        self.metadata = (("authorization", "Bearer " + token),) if token else ()

    def close(self):
        self.channel.close()

    def kw(self):
        return {"metadata": self.metadata, "timeout": CALL_TIMEOUT_S}

    # Unary calls.

    def info(self):
        return self.stub.GetServerInfo(pb.GetServerInfoRequest(), **self.kw())

    def list_weights(self):
        return list(self.stub.ListWeights(pb.ListWeightsRequest(), **self.kw()).weights)

    def release(self, handle, force=False):
        return self.stub.ReleaseWeight(pb.ReleaseWeightRequest(handle=handle, force=force), **self.kw())

    def load_weight(self, path, tensor, name=""):
        return self.stub.LoadWeight(pb.LoadWeightRequest(path=path, tensor=tensor, name=name), **self.kw())

    def zero_gradient(self, handle):
        return self.stub.ZeroGradient(pb.ZeroGradientRequest(weight_handle=handle), **self.kw())

    # Raw streams: the messages exactly as given.

    def register_stream(self, messages):
        return self.stub.RegisterWeight(iter(messages), **self.kw())

    def logits_stream(self, messages):
        return self.stub.Logits(iter(messages), **self.kw())

    def backward_stream(self, messages):
        return self.stub.Backward(iter(messages), **self.kw())

    def cast_stream(self, messages):
        return self.stub.Cast(iter(messages), **self.kw())

    def cross_entropy_stream(self, messages):
        return self.stub.CrossEntropy(iter(messages), **self.kw())

    def logprobs_stream(self, messages):
        return self.stub.LogProbs(iter(messages), **self.kw())

    # Well-formed calls.

    def register_weight(self, w, name="conformance", chunk_bytes=UPLOAD_CHUNK_BYTES):
        """Uploads weight values w [V, K] as bf16; returns the WeightInfo."""
        weight = Tensor("weight", pb.DTYPE_BF16, w)
        header = pb.RegisterWeightHeader(name=name, weight=weight.spec())
        messages = [pb.RegisterWeightRequest(header=header)]
        messages += [pb.RegisterWeightRequest(chunk=c) for c in chunks_of(weight, chunk_bytes)]
        return self.register_stream(messages)

    def logits(self, handle, x, chunk_bytes=UPLOAD_CHUNK_BYTES, **header):
        """Logits of activation values x [M, K]; returns the Streamed response."""
        xt = Tensor("x", pb.DTYPE_BF16, x)
        first = pb.LogitsRequest(header=pb.LogitsHeader(weight_handle=handle, x=xt.spec(), **header))
        return read_stream(
            self.logits_stream([first] + [pb.LogitsRequest(chunk=c) for c in chunks_of(xt, chunk_bytes)])
        )

    def backward(self, handle, dy, x, dy_dtype=pb.DTYPE_FP32, **header):
        dyt = Tensor("dy", dy_dtype, dy)
        xt = Tensor("x", pb.DTYPE_BF16, x)
        first = pb.BackwardRequest(header=pb.BackwardHeader(weight_handle=handle, dy=dyt.spec(), x=xt.spec(), **header))
        body = [pb.BackwardRequest(chunk=c) for c in chunks_of(dyt) + chunks_of(xt)]
        return read_stream(self.backward_stream([first] + body))

    def cast(self, values, **header):
        t = Tensor("input", pb.DTYPE_FP32, values)
        first = pb.CastRequest(header=pb.CastHeader(input=t.spec(), **header))
        return read_stream(self.cast_stream([first] + [pb.CastRequest(chunk=c) for c in chunks_of(t)]))

    def cross_entropy(self, handle, x, targets, targets_dtype=pb.DTYPE_INT64, **header):
        xt = Tensor("x", pb.DTYPE_BF16, x)
        tt = Tensor("targets", targets_dtype, targets)
        first = pb.CrossEntropyRequest(
            header=pb.CrossEntropyHeader(weight_handle=handle, x=xt.spec(), targets=tt.spec(), **header)
        )
        body = [pb.CrossEntropyRequest(chunk=c) for c in chunks_of(xt) + chunks_of(tt)]
        return read_stream(self.cross_entropy_stream([first] + body))

    def fetch_gradient(self, handle, zero_after_fetch=False, digest_last=False):
        request = pb.FetchGradientRequest(
            weight_handle=handle, zero_after_fetch=zero_after_fetch, digest_last=digest_last
        )
        return read_stream(self.stub.FetchGradient(request, **self.kw()))

    def probe(self, request_bytes, response_bytes, chunk_bytes=0, pieces=None):
        """A Probe call; returns the sizes of the ProbeChunks received."""
        header = pb.ProbeHeader(request_bytes=request_bytes, response_bytes=response_bytes, chunk_bytes=chunk_bytes)
        if pieces is None:
            pieces = [request_bytes] if request_bytes else []
        messages = [pb.ProbeRequest(header=header)] + [pb.ProbeRequest(data=b"\x5a" * n) for n in pieces]
        return [len(m.data) for m in self.stub.Probe(iter(messages), **self.kw())]


class HeldStream:
    """A request stream that sends `messages` and then waits until released.

    For cancelling a call mid-upload: the server has received the messages
    and waits for more, while the test cancels the call; release() then
    lets gRPC's sending thread finish.
    """

    def __init__(self, messages):
        self._messages = list(messages)
        self.sent = threading.Event()
        self._release = threading.Event()

    def __iter__(self):
        for m in self._messages:
            yield m
        self.sent.set()
        self._release.wait()

    def release(self):
        self._release.set()


# --- Statuses --------------------------------------------------------------------------


def expect_error(code, fn, *args, **kwargs):
    """Runs fn, which must fail with status `code`; returns the status message.

    For a streaming call fn reads the response stream to its end (read_stream),
    so that the status checked is the call's final one.
    """
    try:
        fn(*args, **kwargs)
    except grpc.RpcError as e:
        assert e.code() == code, "expected %s, got %s: %s" % (code.name, e.code().name, e.details())
        assert e.details(), "%s came without a message" % code.name
        return e.details()
    raise AssertionError("expected %s, but the call succeeded" % code.name)


def names(message, tensor):
    """True when the status message names `tensor` as a word of its own."""
    return re.search(r"(?<![A-Za-z0-9_])%s(?![A-Za-z0-9_])" % re.escape(tensor), message) is not None


# --- One small call of each tensor-carrying RPC -------------------------------------


class Call:
    """A well-formed call of one request-streaming RPC, to send as is or to break.

    tensors: the request's tensors by name. header(digests) is the header
    message, each spec carrying the xxh3 of its bytes unless `digests` names
    another; chunk(c) wraps a TensorChunk in the RPC's request message;
    run(conn, messages) sends messages and returns the WeightInfo or the
    Streamed response.
    """

    def __init__(self, rpc, request_type, tensors, make_header):
        self.rpc = rpc
        self.request_type = request_type
        self.tensors = {t.name: t for t in tensors}
        self._make_header = make_header

    def header(self, digests=None):
        digests = digests or {}
        specs = {name: t.spec(digests.get(name)) for name, t in self.tensors.items()}
        return self.request_type(header=self._make_header(specs))

    def chunk(self, c):
        return self.request_type(chunk=c)

    def messages(self, digests=None, chunk_bytes=UPLOAD_CHUNK_BYTES, after=None):
        """The header (each tensor's spec with its digest, or the one `digests`
        gives), then each tensor's chunks; after them, for each name in
        `after`, a TensorDigest of the xxh3 it maps to."""
        out = [self.header(digests)]
        for t in self.tensors.values():
            out += [self.chunk(c) for c in chunks_of(t, chunk_bytes)]
            if after and t.name in after:
                out.append(self.request_type(digest=pb.TensorDigest(name=t.name, xxh3=after[t.name])))
        return out

    def run(self, conn, messages):
        if self.rpc == "RegisterWeight":
            return conn.register_stream(messages)
        stream = {
            "Logits": conn.logits_stream,
            "Backward": conn.backward_stream,
            "Cast": conn.cast_stream,
            "CrossEntropy": conn.cross_entropy_stream,
            "LogProbs": conn.logprobs_stream,
        }[self.rpc]
        return read_stream(stream(messages))


# Shape of the weight small_calls() expects: [SMALL_V, SMALL_K].
SMALL_V, SMALL_K = 16, 8

# Every tensor the requests of small_calls() stream, as (RPC, tensor) pairs,
# and their test ids.
REQUEST_TENSORS = [
    ("RegisterWeight", "weight"),
    ("Logits", "x"),
    ("Backward", "dy"),
    ("Backward", "x"),
    ("Cast", "input"),
    ("CrossEntropy", "x"),
    ("CrossEntropy", "targets"),
    ("LogProbs", "x"),
    ("LogProbs", "targets"),
]
REQUEST_TENSOR_IDS = ["%s-%s" % p for p in REQUEST_TENSORS]


def small_calls(handle):
    """One small call of each request-streaming RPC, by RPC name.

    `handle` names a registered weight of shape [SMALL_V, SMALL_K]. The
    RegisterWeight call uploads a weight of its own.
    """
    rng = np.random.default_rng(7)
    m = 3
    weight = Tensor("weight", pb.DTYPE_BF16, rng.integers(-8, 9, size=(SMALL_V, 2 * SMALL_K)))
    x = Tensor("x", pb.DTYPE_BF16, rng.integers(-8, 9, size=(m, SMALL_K)))
    dy = Tensor("dy", pb.DTYPE_FP32, rng.integers(-8, 9, size=(m, SMALL_V)))
    targets = Tensor("targets", pb.DTYPE_INT64, rng.integers(0, SMALL_V, size=m))
    cast_input = Tensor("input", pb.DTYPE_FP32, rng.integers(-8, 9, size=(4, 5)))
    return {
        "RegisterWeight": Call(
            "RegisterWeight",
            pb.RegisterWeightRequest,
            [weight],
            lambda s: pb.RegisterWeightHeader(name="conformance", weight=s["weight"]),
        ),
        "Logits": Call("Logits", pb.LogitsRequest, [x], lambda s: pb.LogitsHeader(weight_handle=handle, x=s["x"])),
        "Backward": Call(
            "Backward",
            pb.BackwardRequest,
            [dy, x],
            lambda s: pb.BackwardHeader(weight_handle=handle, dy=s["dy"], x=s["x"], want_dx=True, want_dw=True),
        ),
        "Cast": Call("Cast", pb.CastRequest, [cast_input], lambda s: pb.CastHeader(input=s["input"])),
        "CrossEntropy": Call(
            "CrossEntropy",
            pb.CrossEntropyRequest,
            [x, targets],
            lambda s: pb.CrossEntropyHeader(weight_handle=handle, x=s["x"], targets=s["targets"]),
        ),
        "LogProbs": Call(
            "LogProbs",
            pb.LogProbsRequest,
            [x, targets],
            lambda s: pb.LogProbsHeader(weight_handle=handle, x=s["x"], targets=s["targets"], top_k=2),
        ),
    }
