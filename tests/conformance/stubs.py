"""The Python stubs of proto/logitd/v1/logitd.proto, generated on first import.

grpcio-tools compiles the proto into a temporary directory that is removed
when the process exits; nothing else of the project is imported. The modules
are top-level (`logitd_pb2`, `logitd_pb2_grpc`) so that they cannot collide
with the project's own `logitd` Python package if it happens to be installed.

LOGITD_CONFORMANCE_PROTO names another copy of logitd.proto to test against.
"""

import atexit
import os
import shutil
import subprocess
import sys
import tempfile

_DEFAULT_PROTO = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "proto", "logitd", "v1", "logitd.proto"
)


def _generate():
    proto = os.path.abspath(os.environ.get("LOGITD_CONFORMANCE_PROTO") or _DEFAULT_PROTO)
    if not os.path.isfile(proto):
        raise RuntimeError("logitd.proto not found at %s (set LOGITD_CONFORMANCE_PROTO)" % proto)
    out = tempfile.mkdtemp(prefix="logitd-conformance-stubs-")
    atexit.register(shutil.rmtree, out, ignore_errors=True)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            "-I" + os.path.dirname(proto),
            "--python_out=" + out,
            "--grpc_python_out=" + out,
            proto,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    if done.returncode != 0:
        raise RuntimeError("grpc_tools.protoc failed (exit %d) on %s:\n%s" % (done.returncode, proto, done.stdout))
    sys.path.insert(0, out)
    return proto


PROTO_PATH = _generate()

import logitd_pb2 as pb  # noqa: E402
import logitd_pb2_grpc as pb_grpc  # noqa: E402

__all__ = ["PROTO_PATH", "pb", "pb_grpc"]
