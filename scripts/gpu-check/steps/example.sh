# shellcheck shell=bash
# --- the Python client's examples against the cuda backend ------------------
# torch.autograd.Function over Logits/Backward (client/python/examples),
# checked against torch's own result; then rl_logprob_check.py's report of
# what a BF16 head does to RL log-probs against LogProbs' FP32. The client's
# stubs are generated from proto/ with grpcio-tools; without it (or grpcio)
# the step is skipped.

# The stubs come from grpcio-tools when the python has it, else from the
# dependency prefix's protoc 3.21 and grpc_python_plugin (their generated code
# loads in newer protobuf and grpcio runtimes).
gen_stubs() {  # gen_stubs DIR
  if "$python" -c "import grpc_tools" 2>/dev/null; then
    "$python" -m grpc_tools.protoc -Iproto --python_out="$1" --grpc_python_out="$1" \
      logitd/v1/logitd.proto
  elif [ -x /tmp/dep/sysroot/usr/bin/grpc_python_plugin ]; then
    /tmp/dep/sysroot/usr/bin/protoc-wrap -Iproto --python_out="$1" --grpc_python_out="$1" \
      --plugin=protoc-gen-grpc_python=/tmp/dep/sysroot/usr/bin/grpc_python_plugin \
      logitd/v1/logitd.proto
  else
    echo "neither grpcio-tools nor the prefix's grpc_python_plugin"; return 1
  fi
}

step_example() {
  find_python
  if skipped example; then note example skip "GPU_CHECK_SKIP"; return; fi
  if [ -z "$python" ]; then note example skip "no python3 with torch"; return; fi
  pydir=$(mktemp -d)
  # Wheels brought along for what the image lacks (GPU_CHECK_WHEELS: a
  # directory of wheels; the machine has no registry).
  if [ -n "${GPU_CHECK_WHEELS:-}" ]; then
    for pair in xxhash:xxhash ml_dtypes:ml_dtypes grpc_tools:grpcio-tools; do
      "$python" -c "import ${pair%%:*}" 2>/dev/null && continue
      "$python" -m pip install -q --no-index --no-deps --find-links "$GPU_CHECK_WHEELS" \
        --target "$pydir" "${pair#*:}" >>"$out/example.log" 2>&1 || true
    done
  fi
  cp -r client/python/src/logitd "$pydir/"
  export PYTHONPATH="$pydir${PYTHONPATH:+:$PYTHONPATH}"
  if ! "$python" -c "import sys, grpc, google.protobuf as pb, numpy, ml_dtypes, xxhash; print('python', sys.version.split()[0], 'grpcio', grpc.__version__, 'protobuf', pb.__version__)" \
    >>"$out/example.log" 2>&1; then
    note example skip "$python lacks one of grpcio, protobuf, numpy, ml_dtypes, xxhash"
    return
  fi
  if ! gen_stubs "$pydir" \
    >>"$out/example.log" 2>&1; then
    note example FAIL "stub generation failed (see example.log)"
  else
    if start_server "$out/example.log"; then
      example_runs
    else
      note example FAIL "logitd --backend=cuda did not start (see example.log)"
    fi
    stop_server
  fi
  rm -rf "$pydir"
}

example_runs() {
  example_rc=0
  for shape in "--tokens 16 --hidden 1024 --vocab 8192" "--tokens 512 --hidden 4096 --vocab 32768"; do
    echo "=== autograd_lm_head.py 127.0.0.1:$port $shape" >>"$out/example.log"
    # shellcheck disable=SC2086
    timeout 300 "$python" client/python/examples/autograd_lm_head.py \
      "127.0.0.1:$port" $shape >>"$out/example.log" 2>&1 || example_rc=$?
  done
  # The RL example: the log-prob mismatch of a BF16 head against LogProbs at a
  # Llama-3-size head (table in rl_logprob.txt, summary in rl_logprob.json).
  echo "=== rl_logprob_check.py 127.0.0.1:$port --tokens 8192 --hidden 4096 --vocab 128256" >>"$out/example.log"
  timeout 300 "$python" client/python/examples/rl_logprob_check.py "127.0.0.1:$port" \
    --tokens 8192 --hidden 4096 --vocab 128256 --json "$out/rl_logprob.json" \
    --png "$out/rl_logprob.png" >"$out/rl_logprob.txt" 2>>"$out/example.log" || example_rc=$?
  if [ $example_rc -eq 0 ]; then
    note example ok "autograd example inside its bounds (example.log); RL log-prob check in rl_logprob.txt"
  else note example FAIL "exit $example_rc (see example.log)"; fi
}
