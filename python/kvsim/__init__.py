"""kvsim — Python access to kvsim's files (standard library + NumPy): traces (trace/FORMAT.md) read into and written
from NumPy arrays, so that any framework's attention (PyTorch hooks, vLLM, JAX) becomes a trace `kvsim replay`
reads; and the SQLite results database `kvsim replay --db` writes (results/SCHEMA.md). API: python/README.md.
"""
from .trace import (DTYPES, ChecksumError, Trace, TraceError, TraceWriter, TruncatedError, attention_outputs,
                    open_trace, write_trace)
from . import results

__all__ = ["Trace", "TraceWriter", "TraceError", "ChecksumError", "TruncatedError", "open_trace", "write_trace",
           "attention_outputs", "DTYPES", "results"]
