"""Build script of the logitd Python client.

The gRPC stubs (logitd/v1/logitd_pb2.py, logitd_pb2_grpc.py, logitd_pb2.pyi)
are generated from the repository's wire contract, proto/logitd/v1/logitd.proto,
with grpcio-tools while the package is built; they are never committed. The
proto file is looked up, in order:

1. $LOGITD_PROTO_DIR (a directory holding logitd/v1/logitd.proto);
2. ./proto next to this file (where an sdist built from this tree keeps a copy);
3. ../../proto relative to this file (the repository layout: client/python).

The runtime requirements on grpcio and protobuf are taken from the grpcio-tools
that generates the stubs, because generated code checks the versions it runs on.
"""

import os
import re
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = Path(__file__).resolve().parent
PROTO_FILE = Path("logitd") / "v1" / "logitd.proto"
GENERATED = ("logitd_pb2.py", "logitd_pb2_grpc.py", "logitd_pb2.pyi")


def find_proto_root() -> Path:
    candidates = []
    env = os.environ.get("LOGITD_PROTO_DIR")
    if env:
        candidates.append(Path(env))
    candidates.append(HERE / "proto")
    candidates.append(HERE.parent.parent / "proto")
    for root in candidates:
        if (root / PROTO_FILE).is_file():
            return root
    tried = "\n  ".join(str(c / PROTO_FILE) for c in candidates)
    raise SystemExit(
        "logitd: cannot find the wire contract logitd/v1/logitd.proto; tried:\n  "
        + tried
        + "\nBuild from a checkout of the logitd repository (pip install ./client/python), "
        "from an sdist made there, or set LOGITD_PROTO_DIR to the repository's proto/ directory."
    )


def generate_stubs(out_dir: Path) -> None:
    """Runs grpc_tools.protoc on the wire contract, writing into out_dir/logitd/v1."""
    try:
        import grpc_tools
        from grpc_tools import protoc
    except ImportError as e:
        raise SystemExit(
            "logitd: grpcio-tools is needed to generate the gRPC stubs "
            "(it is a build requirement in pyproject.toml): " + str(e)
        )
    proto_root = find_proto_root()
    well_known = Path(grpc_tools.__file__).resolve().parent / "_proto"
    target = out_dir / "logitd" / "v1"
    target.mkdir(parents=True, exist_ok=True)
    args = [
        "grpc_tools.protoc",
        "-I" + str(proto_root),
        "-I" + str(well_known),
        "--python_out=" + str(out_dir),
        "--grpc_python_out=" + str(out_dir),
        "--pyi_out=" + str(out_dir),
        str(proto_root / PROTO_FILE),
    ]
    rc = protoc.main(args)
    if rc != 0:
        raise SystemExit("logitd: grpc_tools.protoc failed (exit %d) on %s" % (rc, proto_root / PROTO_FILE))
    missing = [name for name in GENERATED if not (target / name).is_file()]
    if missing:
        raise SystemExit("logitd: grpc_tools.protoc did not write " + ", ".join(missing))
    init = target / "__init__.py"
    if not init.exists():
        init.write_text('"""Generated gRPC stubs of the wire contract logitd.v1."""\n')


class BuildPyWithStubs(build_py):
    """build_py that also generates the gRPC stubs into the build tree.

    An editable install (pip install -e) imports from src/, so there the stubs
    are written next to the sources (git ignores them).
    """

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            generate_stubs(HERE / "src")
        else:
            generate_stubs(Path(self.build_lib))

    def get_outputs(self, include_bytecode=1):
        outputs = list(super().get_outputs(include_bytecode))
        if not getattr(self, "editable_mode", False):
            base = Path(self.build_lib) / "logitd" / "v1"
            outputs.extend(str(base / name) for name in GENERATED)
        return outputs


class SdistWithProto(sdist):
    """sdist that carries a copy of the wire contract, so the sdist builds on its own."""

    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        root = find_proto_root()
        dest = Path(base_dir) / "proto" / PROTO_FILE
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes((root / PROTO_FILE).read_bytes())


def runtime_requirements():
    # The client does not import safetensors: it is there to write and read the
    # files logitctl takes and gives (the repository's README.md shows how).
    reqs = ["numpy>=1.21", "ml_dtypes>=0.2.0", "xxhash>=3.0", "safetensors>=0.3"]
    try:
        from importlib.metadata import requires, version

        tools_version = version("grpcio-tools")
        protobuf_req = None
        for req in requires("grpcio-tools") or []:
            spec = req.split(";")[0].strip()
            if re.match(r"^protobuf\b", spec):
                protobuf_req = spec
        if protobuf_req is None:
            protobuf_req = "protobuf>=" + version("protobuf")
        reqs += ["grpcio>=" + tools_version, protobuf_req]
    except Exception:  # grpcio-tools absent: metadata-only queries (e.g. setup.py --version)
        reqs += ["grpcio>=1.51", "protobuf>=4.21"]
    return reqs


if sys.version_info < (3, 8):
    raise SystemExit("logitd needs Python 3.8 or newer")

setup(
    install_requires=runtime_requirements(),
    cmdclass={"build_py": BuildPyWithStubs, "sdist": SdistWithProto},
)
