"""Your LM head's outputs held to the FP32-logits contract by a shared logitd.

Copy into your test suite and replace `my_logits` / `my_backward` with calls
into your kernel (a framework's FP32-output GEMM, a Triton or CUTLASS kernel,
a torch.compile graph). The server forms an fp64 reference of every element
and its proven bound, and tests whether the errors are those of fp32
accumulation; a test fails (outside_bounds, or outside_precision_class) with
the figures that decided it and the worst elements named.

Environment: LOGITD_ADDR (host:port of the shared logitd), LOGITD_TOKEN (a
bearer token, when the server has --auth_tokens), LOGITD_REQUIRE_GPU=1 (fail,
rather than check a CPU stand-in, where torch sees no CUDA device: set it on
a GPU runner, as the workflows beside this file do), LOGITD_CHECK_SHAPES
("M,K,V;M,K,V": other shapes than SHAPES). With LOGITD_PROJECT each test's run
is also kept in the server's history under that project (the case is the test
and shape; LOGITD_BRANCH and LOGITD_REF, which the workflows beside this file set
from the CI's branch and commit) and compared with LOGITD_BASELINE_BRANCH's
latest run (default main; a branch's first run records without one): a test then
fails too on a rule of the project that the run breaks (logitctl rules), and
with LOGITD_BITS_UNCHANGED=1 on any candidate whose bits differ from the
baseline's. Needs the logitd Python client
(pip install ./client/python from the logitd repository) and torch; where
torch is missing every test is skipped and says so (pytest -rs).

Where there is no GPU the candidates run on the CPU: torch has no CPU kernel
for a bf16 product with an fp32 output, so they multiply the operands
widened to fp32 (exact products, fp32 sums: the same contract).
"""
import os

import pytest

import logitd
from logitd.testing import assert_backward_within_contract, assert_logits_within_contract

try:
    import torch
except ModuleNotFoundError as e:
    if e.name != "torch":
        raise
    torch = None

SHAPES = [(128, 4096, 32000), (7, 2048, 50257)]  # M, K, V: odd sizes too
if os.environ.get("LOGITD_CHECK_SHAPES"):
    SHAPES = [tuple(int(n) for n in s.split(",")) for s in os.environ["LOGITD_CHECK_SHAPES"].split(";")]


def history(case):
    """The history arguments of one test's assertion (none without LOGITD_PROJECT)."""
    project = os.environ.get("LOGITD_PROJECT", "")
    if not project:
        return {}
    env = os.environ.get
    return dict(
        record=logitd.RunLabels(project, case, env("LOGITD_BRANCH", ""), env("LOGITD_REF", "")),
        compare=logitd.Baseline(branch=env("LOGITD_BASELINE_BRANCH") or "main", if_present=True),
        bits_unchanged=env("LOGITD_BITS_UNCHANGED") == "1",
    )


def my_logits(x, w):
    """Your forward: fp32 logits of bf16 X [M, K] and W [V, K]."""
    if x.is_cuda:
        return torch.mm(x, w.t(), out_dtype=torch.float32)
    return torch.mm(x.float(), w.float().t())


def my_backward(dy, x, w):
    """Your backward under the gradient-cast contract: G = bf16(dY) once."""
    g = dy.to(torch.bfloat16)
    if g.is_cuda:
        return torch.mm(g, w, out_dtype=torch.float32), torch.mm(g.t(), x, out_dtype=torch.float32)
    g = g.float()
    return torch.mm(g, w.float()), torch.mm(g.t(), x.float())


@pytest.fixture(scope="module", autouse=True)
def needs_torch():
    if torch is None:
        pytest.skip(
            "the kernel check needs torch (pip install torch; without a GPU, the CPU-only build: "
            "pip install torch --index-url https://download.pytorch.org/whl/cpu)"
        )


@pytest.fixture(scope="module")
def client():
    address = os.environ.get("LOGITD_ADDR")
    if not address:
        pytest.skip("LOGITD_ADDR is not set: no logitd to check against")
    return logitd.Client(address, token=os.environ.get("LOGITD_TOKEN") or None)


@pytest.fixture(scope="module")
def device():
    if torch.cuda.is_available():
        return "cuda"
    if os.environ.get("LOGITD_REQUIRE_GPU") == "1":
        pytest.fail(
            "LOGITD_REQUIRE_GPU=1, but torch %s sees no CUDA device (built for CUDA %s): this "
            "runner cannot run the GPU kernel under test" % (torch.__version__, torch.version.cuda),
            pytrace=False,
        )
    return "cpu"


@pytest.fixture(params=SHAPES, ids=lambda s: "x".join(map(str, s)))
def inputs(request, device):
    m, k, v = request.param
    gen = torch.Generator().manual_seed(m * 31 + k + v)
    x = torch.randn(m, k, generator=gen).to(device, torch.bfloat16)
    w = torch.randn(v, k, generator=gen).to(device, torch.bfloat16)
    dy = (torch.randn(m, v, generator=gen) * 1e-3).to(device)
    return x, w, dy, "x".join(map(str, request.param))


def test_logits_keep_the_fp32_contract(client, inputs):
    x, w, _, shape = inputs
    # W streams with the call; a registered handle (client.register_weights)
    # saves sending it again for every test.
    assert_logits_within_contract(client, x, my_logits(x, w), w, **history("logits-" + shape))


def test_backward_keeps_the_gradient_cast_contract(client, inputs):
    x, w, dy, shape = inputs
    dx, dw = my_backward(dy, x, w)
    assert_backward_within_contract(client, dy, x, w, dx=dx, dw=dw, **history("backward-" + shape))
