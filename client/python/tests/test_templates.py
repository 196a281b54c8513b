"""The files a user copies, run where they are written to run, against the cpu server:
deploy/ci/kernel-check/test_lm_head_precision.py (copied into a suite of its own, as its
header says) and examples/autograd_lm_head.py. Both need torch: where this interpreter has
it they judge their CPU candidates for real; where it has not they must say so (a skip with
its reason, exit status 2 with a message) rather than fail."""

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import logitd

pytestmark = pytest.mark.needs_server

ROOT = Path(__file__).resolve().parents[3]
TEMPLATE = ROOT / "deploy" / "ci" / "kernel-check" / "test_lm_head_precision.py"
AUTOGRAD = ROOT / "client" / "python" / "examples" / "autograd_lm_head.py"
HAS_TORCH = importlib.util.find_spec("torch") is not None


def run_template(tmp_path, **env):
    suite = tmp_path / "suite"
    suite.mkdir(exist_ok=True)
    shutil.copy(TEMPLATE, suite / TEMPLATE.name)
    e = {key: value for key, value in os.environ.items() if not key.startswith("LOGITD_")}
    e.update(LOGITD_CHECK_SHAPES="7,256,1000;16,128,517", **env)
    cmd = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", TEMPLATE.name]
    done = subprocess.run(cmd, cwd=suite, env=e, capture_output=True, text=True, timeout=600)
    return done.returncode, done.stdout + done.stderr


def test_the_kernel_check_judges_its_candidates_or_says_it_needs_torch(server, tmp_path):
    code, out = run_template(tmp_path, LOGITD_ADDR=server)
    assert code == 0, out
    if HAS_TORCH:
        assert "4 passed" in out, out
    else:
        assert "skipped" in out and "the kernel check needs torch" in out, out
        assert "download.pytorch.org/whl/cpu" in out, out


def test_the_kernel_check_without_a_server_skips_and_says_why(tmp_path):
    code, out = run_template(tmp_path)
    assert code == 0, out
    reason = "LOGITD_ADDR is not set" if HAS_TORCH else "the kernel check needs torch"
    assert "skipped" in out and reason in out, out


@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed in this interpreter")
def test_the_kernel_check_fails_on_a_gpu_runner_without_a_gpu(server, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    code, out = run_template(tmp_path, LOGITD_ADDR=server, LOGITD_REQUIRE_GPU="1")
    assert code == 1, out
    assert "LOGITD_REQUIRE_GPU=1, but torch" in out and "sees no CUDA device" in out, out


def test_the_autograd_example_runs_or_says_it_needs_torch(server):
    cmd = [sys.executable, str(AUTOGRAD), server, "--tokens", "5", "--hidden", "128", "--vocab", "300"]
    if HAS_TORCH:
        cmd += ["--device", "cpu"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if HAS_TORCH:
        assert done.returncode == 0, done.stdout + done.stderr
    else:
        assert done.returncode == 2, done.stdout + done.stderr
        assert "autograd_lm_head.py needs torch" in done.stderr
        assert done.stdout == ""


def test_the_kernel_check_keeps_runs_under_the_project_its_ci_names(monkeypatch):
    spec = importlib.util.spec_from_file_location("kernel_check_template", TEMPLATE)
    template = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(template)
    for key in [k for k in os.environ if k.startswith("LOGITD_")]:
        monkeypatch.delenv(key)
    assert template.history("logits-7x256x1000") == {}
    monkeypatch.setenv("LOGITD_PROJECT", "my-kernels")
    monkeypatch.setenv("LOGITD_BRANCH", "pr-12")
    monkeypatch.setenv("LOGITD_REF", "c0ffee")
    h = template.history("logits-7x256x1000")
    assert h["record"] == logitd.RunLabels("my-kernels", "logits-7x256x1000", "pr-12", "c0ffee")
    assert h["compare"] == logitd.Baseline(branch="main", if_present=True)
    assert h["bits_unchanged"] is False
    monkeypatch.setenv("LOGITD_BASELINE_BRANCH", "release")
    monkeypatch.setenv("LOGITD_BITS_UNCHANGED", "1")
    h = template.history("backward-7x256x1000")
    assert h["compare"].branch == "release" and h["bits_unchanged"] is True
