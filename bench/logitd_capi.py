"""liblogitd_bench_capi.so (bench/bench_capi.cc) through ctypes, for the Python benchmarks.

torch_baseline.py and ce_bench.py load it the same way; each then types the
entry points it calls. Messages go to stderr and name the calling tool: a
benchmark without the library runs on, leaving logitd out.
"""
import ctypes
import sys


def open_library(path, tool, left_out):
    """The library at `path` with the engine's calls typed; None when there is no path or it cannot be loaded."""
    if not path:
        return None
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        print(f"{tool}: cannot load {path}: {e}; {left_out} left out", file=sys.stderr)
        return None
    lib.logitd_bench_engine_create.restype = ctypes.c_void_p
    lib.logitd_bench_engine_create.argtypes = [ctypes.c_int, ctypes.c_int]
    lib.logitd_bench_last_error.restype = ctypes.c_char_p
    return lib


def create_engine(lib, tool):
    """An engine configured as the cuda backend runs (split_k=fp32, tuned), or None."""
    engine = lib.logitd_bench_engine_create(1, 1)
    if not engine:
        print(f"{tool}: logitd engine: " + lib.logitd_bench_last_error().decode(), file=sys.stderr)
        return None
    return engine
