"""codec_ref.py — what the NumPy references of sim/codec.c share (tools/gen_codec_fixtures.py for int, KIVI, HF and
fp8; tools/gen_think_fixtures.py for ThinK): where the fixtures go and how a float32 is written in them, as the
8-hex-digit bit pattern tests/test_codec.c and tests/test_codec_think.c read back bit for bit.
"""
import os
import struct

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "tests", "fixtures", "codec")  # the fixture folder the C tests read

f32 = np.float32


def hexw(x):
    """One float32 as its little-endian bit pattern, 8 hex digits."""
    return "%08x" % struct.unpack("<I", struct.pack("<f", float(f32(x))))[0]


def hexs(a):
    """Every element of an array (flattened, as float32) with hexw, space-separated."""
    return " ".join(hexw(v) for v in np.asarray(a, dtype=f32).ravel())
