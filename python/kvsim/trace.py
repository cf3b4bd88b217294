"""trace.py — reader and writer of kvsim trace files in Python + NumPy, to the byte-level specification in
trace/FORMAT.md (version 1, full and lean records). A trace written here from any stack (PyTorch forward hooks,
vLLM, JAX: whatever yields post-RoPE q/k, v, the attention output and its log-sum-exp per position) is what
`kvsim capture` writes: `kvsim verify`, `info`, `replay` and every other command read it.

Reading validates what FORMAT.md "What a reader validates before use" lists (header, trailer, footer, every index
entry, each chunk's checksums when read, the token rows) and raises TraceError (ChecksumError, TruncatedError) with
the part named; it never trusts a size before checking it against the file. Writing goes to PATH.partial, renamed to
PATH when the trace is complete (as kvsim's writer does), and validates shapes, dtypes and the header fields first.
"""
import os
import struct
import zlib

import numpy as np

from . import _zstd

__all__ = ["Trace", "TraceWriter", "TraceError", "ChecksumError", "TruncatedError", "open_trace", "write_trace",
           "attention_outputs", "DTYPES"]

MAGIC_FILE = b"KVSTRACE"
MAGIC_CHUNK = b"KVCK"
MAGIC_FOOTER = b"KVFT"
MAGIC_TRAILER = b"KVSTEND\0"
HDR_FIXED = 152          # header bytes without the settings text (148 fixed + 4 CRC)
CHUNK_HDR = 56
FOOTER_FIXED = 40
ENTRY = 48
TRAILER = 32
KIND_GROUP, KIND_TOKENS = 1, 2
# header flags: byte shuffle, lean record, per-layer attention windows after the settings (FORMAT.md "Layer windows":
# written only when some layer has a window; a trace without it reads as all layers full)
FLAG_SHUFFLE, FLAG_QKV, FLAG_WINDOWS = 1, 2, 4
MAX_LAYERS = MAX_HEADS = MAX_HEAD_DIM = 1024
MAX_BLOCK = 65536
SETTINGS_MAX = 4095
ZSTD_MAX_EXPANSION = 32768
I32_MAX = 2**31 - 1

DTYPES = {0: "fp32", 1: "fp16", 2: "bf16"}
_DTYPE_CODE = {"fp32": 0, "fp16": 1, "bf16": 2, "float32": 0, "float16": 1, "bfloat16": 2, "f32": 0, "f16": 1}
_ES = {0: 4, 1: 2, 2: 2}
# numpy type holding the stored bits: fp16 and fp32 are themselves; bf16 (no numpy type) as its raw uint16 bits
_STORE_NP = {0: np.dtype("<f4"), 1: np.dtype("<f2"), 2: np.dtype("<u2")}

# The fixed header (FORMAT.md "Header"), bytes [0, 148): name, struct code. One table for reader and writer; a field
# added to the format is a line here.
_HEADER_FIELDS = [
    ("magic", "8s"), ("version", "I"), ("header_size", "I"),
    ("n_layers", "i"), ("n_heads", "i"), ("n_kv_heads", "i"), ("head_dim", "i"), ("dim", "i"), ("hidden_dim", "i"),
    ("vocab_size", "i"), ("max_seq_len", "i"), ("rope_theta", "f"), ("norm_eps", "f"), ("attn_scale", "f"),
    ("rope_layout", "i"), ("dtype", "i"), ("block_positions", "i"), ("max_new_tokens", "i"), ("flags", "I"),
    ("model_name", "64s"), ("settings_len", "I"),
]
_HEADER_STRUCT = struct.Struct("<" + "".join(c for _, c in _HEADER_FIELDS))
assert _HEADER_STRUCT.size == 148
_CHUNK_STRUCT = struct.Struct("<4sHHIIQIIQQII")
_FOOTER_STRUCT = struct.Struct("<4sIQQQ")
_ENTRY_STRUCT = struct.Struct("<HHIIIQQQQ")
_TRAILER_STRUCT = struct.Struct("<QQII8s")


class TraceError(ValueError):
    """A trace file (or the data given to a writer) breaks trace/FORMAT.md; the message names the file and part."""


class ChecksumError(TraceError):
    """A CRC-32 or zstd frame checksum does not match: the bytes changed after they were written."""


class TruncatedError(TraceError):
    """The file ends before a part it announces."""


def _crc(b):
    return zlib.crc32(b) & 0xFFFFFFFF


# ---------------------------------------------------------------------------------------------- element coding
def _shuffle(raw, s):
    """Byte shuffle of one array of s-byte elements (FORMAT.md): byte j of element i goes to j*m + i."""
    if s == 1:
        return raw
    return np.frombuffer(raw, np.uint8).reshape(-1, s).T.tobytes()


def _unshuffle(raw, s):
    if s == 1:
        return raw
    return np.frombuffer(raw, np.uint8).reshape(s, -1).T.tobytes()


def _bf16_to_f32(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _f32_to_bf16(x):
    """Round to nearest even, NaN kept NaN: kvs_f32_to_bf16 (common/kvs.c) value for value."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32)
    nan = ((u & 0x7F800000) == 0x7F800000) & ((u & 0x7FFFFF) != 0)
    r = ((u + np.uint32(0x7FFF) + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(nan, ((u >> 16) | 0x40).astype(np.uint16), r)


def _to_f32(stored, code):
    if code == 2:
        return _bf16_to_f32(stored)
    return stored.astype(np.float32)


# ---------------------------------------------------------------------------------------------- attention
def _attend(q, k, v, first, scale, window=0):
    """Causal attention in float64 of queries at positions [first, first + n) (q [n, H, d]) over keys and values
    [0, first + n) (k, v [first + n, Hkv, d]): (o [n, H, d], lse [n, H]). window > 0: position p attends to keys
    p - window < j <= p only (FORMAT.md "Layer windows")."""
    n, H, _ = q.shape
    G = H // k.shape[1]
    lo = max(0, first - window + 1) if window > 0 else 0  # keys left of every row's window are never read
    kq = np.repeat(np.asarray(k[lo:first + n], np.float64), G, axis=1)
    vq = np.repeat(np.asarray(v[lo:first + n], np.float64), G, axis=1)
    s = np.einsum("phd,jhd->phj", np.asarray(q, np.float64), kq) * float(scale)      # [n, H, first + n - lo]
    j, p = np.arange(lo, first + n)[None, :], np.arange(first, first + n)[:, None]
    mask = j > p                                                                        # key after the query
    if window > 0:
        mask |= j <= p - window                                                         # key left of the window
    s[np.broadcast_to(mask[:, None, :], s.shape)] = -np.inf
    m = s.max(axis=2, keepdims=True)
    e = np.exp(s - m)
    z = e.sum(axis=2, keepdims=True)
    return np.einsum("phj,jhd->phd", e / z, vq), (m + np.log(z))[:, :, 0]


def attention_outputs(q, k, v, attn_scale, block=256, window=0):
    """Exact causal attention of one layer in float64: q [P, H, d], k and v [P, Hkv, d] (query head h reads KV head
    h // (H / Hkv)) -> (o [P, H, d], lse [P, H]) as FORMAT.md "LSE and output definitions" defines them (natural-log
    LSE of the scaled scores); window > 0: a sliding-window layer's (keys p - window < j <= p). For stacks that
    expose q/k/v but not the output; `block` query positions at a time bound the memory to block * P * H doubles."""
    q = np.asarray(q, np.float64)
    P, H, d = q.shape
    o = np.empty((P, H, d))
    lse = np.empty((P, H))
    for a in range(0, P, block):
        b = min(P, a + block)
        o[a:b], lse[a:b] = _attend(q[a:b], k[:b], v[:b], a, attn_scale, window)
    return o, lse


def _check_turn_rows(roles, turns, prev, first, what):
    """The turn rules of FORMAT.md over rows appended after `prev` ((role, turn) of position first - 1, or None for
    the first rows): turn indices start at 0 and step by 0 or 1, no prompt position after a generated one within a
    turn, roles 0 or 1. TraceError naming the position otherwise."""
    bad = np.nonzero((roles != 0) & (roles != 1))[0]
    if len(bad):
        raise TraceError("%s: position %d: role %d is neither prompt (0) nor generated (1)"
                         % (what, first + bad[0], roles[bad[0]]))
    if prev is None:
        if turns[0] != 0:
            raise TraceError("%s: position %d: turn index %d, expected 0" % (what, first, turns[0]))
        r, t, base = roles, turns, first
    else:
        r, t, base = np.concatenate(([prev[0]], roles)), np.concatenate(([prev[1]], turns)), first - 1
    step = np.diff(t.astype(np.int64))
    bad = np.nonzero((step != 0) & (step != 1))[0]
    if len(bad):
        raise TraceError("%s: position %d: turn index %d after %d (turn indices step by 0 or 1)"
                         % (what, base + bad[0] + 1, t[bad[0] + 1], t[bad[0]]))
    bad = np.nonzero((step == 0) & (r[:-1] == 1) & (r[1:] == 0))[0]
    if len(bad):
        raise TraceError("%s: position %d: prompt token after a generated one within turn %d"
                         % (what, base + bad[0] + 1, t[bad[0] + 1]))


# ---------------------------------------------------------------------------------------------- turns
def _turns_from_roles(roles, turn_of, what):
    """The turn table [(begin, prompt_end, end)] and prompt_len, as kvs_trace_turns_from_roles (trace.h) builds it;
    TraceError naming the position when the rows are not valid turns."""
    n = len(roles)
    if n == 0:
        return [], 0
    _check_turn_rows(roles, turn_of, None, 0, what)
    step = np.diff(turn_of.astype(np.int64))
    starts = np.concatenate(([0], np.nonzero(step)[0] + 1, [n]))
    turns = []
    for t in range(len(starts) - 1):
        a, b = int(starts[t]), int(starts[t + 1])
        gen = np.nonzero(roles[a:b] == 1)[0]
        turns.append((a, a + int(gen[0]) if len(gen) else b, b))
    gen = np.nonzero(roles == 1)[0]
    return turns, int(gen[0]) if len(gen) else n


def _check_header(h, err):
    """FORMAT.md's ranges for the header fields of dict h; err(msg) raises."""
    def rng(name, lo, hi):
        if not (lo <= h[name] <= hi):
            err("%s = %s is out of range [%s, %s]" % (name, h[name], lo, hi))
    rng("n_layers", 1, MAX_LAYERS)
    rng("n_heads", 1, MAX_HEADS)
    rng("n_kv_heads", 1, h["n_heads"])
    if h["n_heads"] % h["n_kv_heads"]:
        err("n_heads = %d is not a multiple of n_kv_heads = %d" % (h["n_heads"], h["n_kv_heads"]))
    rng("head_dim", 1, MAX_HEAD_DIM)
    for f in ("dim", "hidden_dim", "vocab_size", "max_seq_len"):
        rng(f, 1, I32_MAX)
    if not (np.isfinite(h["attn_scale"]) and h["attn_scale"] > 0):
        err("attn_scale = %g must be finite and > 0" % h["attn_scale"])
    rng("rope_layout", 0, 1)
    rng("dtype", 0, 2)
    rng("block_positions", 1, MAX_BLOCK)
    rng("max_new_tokens", 0, I32_MAX)
    if h["flags"] & ~(FLAG_SHUFFLE | FLAG_QKV | FLAG_WINDOWS):
        err("flags = 0x%x has unknown bits (only bit 0, shuffle, bit 1, lean q/k/v record, and bit 2, layer windows, "
            "are defined)" % h["flags"])


def parse_settings(text):
    """The capture settings text ("key=value" separated by spaces/newlines) as a dict; words without '=' map to ''."""
    out = {}
    for w in text.split():
        key, _, val = w.partition("=")
        out[key] = val
    return out


# ---------------------------------------------------------------------------------------------- reader
class Trace:
    """An open, validated trace. Attributes: path, header (dict of every header field, dtype as its name, plus
    'settings' text, 'lean' and 'shuffle'), n_positions, n_layers, n_heads, n_kv_heads, head_dim, group (query
    heads per KV head), block_positions, n_blocks, dtype ('fp32'|'fp16'|'bf16'), lean (bool), layer_window (list: each
    layer's attention window in positions, 0 = full causal attention; all 0 in a trace without the table), tokens (int32
    [N]), roles (uint8 [N]: 0 prompt, 1 generated), turn_of (int32 [N]), turns ([(begin, prompt_end, end)]),
    prompt_len, file_bytes, raw_bytes, compressed_bytes.

    Arrays: layer(l) loads one layer ([P, H, d] q and o, [P, Hkv, d] k and v, [P, H] lse); blocks(l) yields it a
    block of positions at a time (memory of one block); read_group(l, kv_head, b) one chunk as FORMAT.md stores
    it. raw=True returns the stored element type (float16 / float32, bf16 as its uint16 bits) instead of float32.
    A lean trace's o and lse are recomputed from the stored q/k/v (float64 arithmetic, returned as float32;
    FORMAT.md "Lean record"); with raw=True they are None. Nothing is read from the file beyond the header, footer
    and token chunks until an array is asked for."""

    def __init__(self, path):
        self.path = os.fspath(path)
        self._fd = os.open(self.path, os.O_RDONLY)
        try:
            self._open()
        except BaseException:
            os.close(self._fd)
            self._fd = -1
            raise

    # -- plumbing
    def _err(self, msg, cls=TraceError):
        raise cls("%s: %s" % (self.path, msg))

    def _pread(self, n, off, what):
        b = os.pread(self._fd, n, off)
        if len(b) != n:
            self._err("file ends inside %s (offset %d, %d bytes wanted, %d read)" % (what, off, n, len(b)),
                      TruncatedError)
        return b

    def close(self):
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self):
        return "<kvsim.Trace %r: %s, %d positions, %d layers, %d/%d heads, d=%d, %s%s>" % (
            self.path, self.header["model_name"], self.n_positions, self.n_layers, self.n_heads, self.n_kv_heads,
            self.head_dim, self.dtype, ", lean" if self.lean else "")

    # -- open: header, trailer, footer, index, tokens
    def _open(self):
        size = os.fstat(self._fd).st_size
        self.file_bytes = size
        if size < HDR_FIXED:
            self._err("file is %d bytes, shorter than a trace header (%d bytes)" % (size, HDR_FIXED), TruncatedError)
        fixed = self._pread(_HEADER_STRUCT.size, 0, "the header")
        h = dict(zip([n for n, _ in _HEADER_FIELDS], _HEADER_STRUCT.unpack(fixed)))
        if h["magic"] != MAGIC_FILE:
            self._err("not a kvsim trace (bad magic)")
        if h["version"] != 1:
            self._err("unsupported trace version %d (this reader reads version 1)" % h["version"])
        slen = h["settings_len"]
        if slen > SETTINGS_MAX:
            self._err("header: settings_len = %d exceeds %d" % (slen, SETTINGS_MAX))
        windows = bool(h["flags"] & FLAG_WINDOWS)
        # the window table's length comes from n_layers: range-checked before it sizes anything
        if windows and not 1 <= h["n_layers"] <= MAX_LAYERS:
            self._err("header: n_layers = %d is out of range [1, %d]" % (h["n_layers"], MAX_LAYERS))
        wlen = 4 * h["n_layers"] if windows else 0
        if h["header_size"] != HDR_FIXED + slen + wlen:
            self._err("header: header_size = %d, expected 152 + settings_len%s = %d" % (
                h["header_size"], " + 4 x n_layers (layer windows)" if windows else "", HDR_FIXED + slen + wlen))
        if h["header_size"] > size:
            self._err("file ends inside the header (%d bytes announced, file has %d)" % (h["header_size"], size),
                      TruncatedError)
        hb = self._pread(h["header_size"], 0, "the header")
        if _crc(hb[:-4]) != struct.unpack("<I", hb[-4:])[0]:
            self._err("header checksum mismatch", ChecksumError)
        name = h["model_name"]
        if b"\0" not in name:
            self._err("header: model_name is not NUL-terminated within 64 bytes")
        settings = hb[148:148 + slen]
        if b"\0" in settings:
            self._err("header: settings text contains a NUL byte")
        _check_header(h, lambda m: self._err("header: " + m))
        win = [0] * h["n_layers"]
        if windows:
            win = list(struct.unpack_from("<%di" % h["n_layers"], hb, 148 + slen))
            for l, w in enumerate(win):
                if w < 0:
                    self._err("header: layer_window[%d] = %d is out of range [0, %d]" % (l, w & 0xFFFFFFFF, I32_MAX))
        h["layer_window"] = win
        h["flags"] &= ~FLAG_WINDOWS  # a layout bit, re-derived by every writer from layer_window (as kvsim does)
        h["model_name"] = name.split(b"\0", 1)[0].decode("utf-8", "replace")
        h["settings"] = settings.decode("utf-8", "replace")
        h["lean"] = bool(h["flags"] & FLAG_QKV)
        h["shuffle"] = bool(h["flags"] & FLAG_SHUFFLE)
        self._dcode = h["dtype"]
        h["dtype"] = DTYPES[h["dtype"]]
        del h["magic"]
        self.header = h
        self.n_layers, self.n_heads, self.n_kv_heads = h["n_layers"], h["n_heads"], h["n_kv_heads"]
        self.head_dim, self.block_positions = h["head_dim"], h["block_positions"]
        self.group = self.n_heads // self.n_kv_heads
        self.dtype, self.lean = h["dtype"], h["lean"]
        self.layer_window = h["layer_window"]
        self._es = _ES[self._dcode]

        # trailer
        if size < h["header_size"] + FOOTER_FIXED + TRAILER:
            self._err("file is %d bytes: too short for header, footer and trailer (incomplete trace? a killed "
                      "writer's file is recovered with `kvsim trace recover`)" % size, TruncatedError)
        tb = self._pread(TRAILER, size - TRAILER, "the trailer")
        foff, fsize, tcrc, treserved, tmagic = _TRAILER_STRUCT.unpack(tb)
        if tmagic != MAGIC_TRAILER:
            self._err("no trailer magic at the end of the file (incomplete trace? a killed writer's file is "
                      "recovered with `kvsim trace recover`)", TruncatedError)
        if _crc(tb[:16]) != tcrc:
            self._err("trailer checksum mismatch", ChecksumError)
        if treserved != 0:
            self._err("trailer: reserved field is %d, expected 0" % treserved)
        if foff < h["header_size"] or foff > size or fsize > size - foff or size - foff - fsize != TRAILER:
            self._err("trailer: footer at offset %d, %d bytes does not fit a %d-byte file" % (foff, fsize, size))
        if fsize < FOOTER_FIXED:
            self._err("footer: %d bytes, shorter than %d" % (fsize, FOOTER_FIXED))
        # footer
        fb = self._pread(fsize, foff, "the footer")
        fmagic, freserved, n_pos, n_chunks, total_raw = _FOOTER_STRUCT.unpack(fb[:32])
        if fmagic != MAGIC_FOOTER:
            self._err("no footer magic at offset %d" % foff)
        if _crc(fb[:-4]) != struct.unpack("<I", fb[-4:])[0]:
            self._err("footer checksum mismatch", ChecksumError)
        if n_chunks > (fsize - FOOTER_FIXED) // ENTRY or fsize != FOOTER_FIXED + ENTRY * n_chunks:
            self._err("footer: %d bytes for %d chunks, expected 40 + 48 * n_chunks" % (fsize, n_chunks))
        if n_pos < 1:
            self._err("footer: n_positions = 0 (a trace holds at least one position)")
        B = self.block_positions
        nb = -(-n_pos // B)
        L, Hkv = self.n_layers, self.n_kv_heads
        if n_chunks != nb * (L * Hkv + 1):
            self._err("footer: n_chunks = %d, expected %d blocks x (%d layers x %d KV heads + 1) = %d"
                      % (n_chunks, nb, L, Hkv, nb * (L * Hkv + 1)))
        self.n_positions, self.n_blocks = int(n_pos), int(nb)
        self._index = {}
        spans = []
        raw_sum = comp_sum = 0
        for i in range(n_chunks):
            kind, fl, layer, kvh, npos, blk, off, raw, comp = _ENTRY_STRUCT.unpack_from(fb, 32 + ENTRY * i)
            e = (kind, fl, layer, kvh, npos, blk, off, raw, comp)
            self._check_entry(e, "index entry %d" % i, foff)
            key = (kind, layer, kvh, blk)
            if key in self._index:
                self._err("index: %s appears twice" % self._chunk_name(e))
            self._index[key] = e
            spans.append((off, off + CHUNK_HDR + comp, e))
            raw_sum += raw
            comp_sum += comp
        spans.sort()
        for a, b in zip(spans, spans[1:]):
            if b[0] < a[1]:
                self._err("index: %s overlaps %s" % (self._chunk_name(b[2]), self._chunk_name(a[2])))
        if raw_sum != total_raw:
            self._err("footer: total raw bytes %d, the entries sum to %d" % (total_raw, raw_sum))
        self.raw_bytes, self.compressed_bytes = int(raw_sum), int(comp_sum)
        # tokens
        N = self.n_positions
        self.tokens = np.empty(N, np.int32)
        self.roles = np.empty(N, np.uint8)
        self.turn_of = np.empty(N, np.int32)
        for b in range(nb):
            raw = self._read_chunk(self._index[(KIND_TOKENS, 0, 0, b)])
            n = len(raw) // 9
            a = b * B
            self.tokens[a:a + n] = np.frombuffer(raw, "<i4", n, 0)
            self.roles[a:a + n] = np.frombuffer(raw, np.uint8, n, 4 * n)
            self.turn_of[a:a + n] = np.frombuffer(raw, "<i4", n, 5 * n)
        bad = np.nonzero((self.tokens < 0) | (self.tokens >= h["vocab_size"]))[0]
        if len(bad):
            self._err("tokens: position %d: token id %d is outside [0, %d)" % (bad[0], self.tokens[bad[0]],
                                                                               h["vocab_size"]))
        self.turns, self.prompt_len = _turns_from_roles(self.roles, self.turn_of, self.path + ": tokens")

    def _expected_npos(self, blk):
        return min(self.block_positions, self.n_positions - blk * self.block_positions)

    def _raw_size(self, kind, npos):
        if kind == KIND_TOKENS:
            return 9 * npos
        G, d, es = self.group, self.head_dim, self._es
        if self.lean:
            return npos * (G + 2) * d * es
        return npos * (2 * G + 2) * d * es + npos * G * 4

    @staticmethod
    def _chunk_name(e):
        kind, _, layer, kvh, _, blk = e[:6]
        if kind == KIND_TOKENS:
            return "tokens chunk (block %d)" % blk
        return "chunk (layer %d, kv head %d, block %d)" % (layer, kvh, blk)

    def _check_entry(self, e, part, foff):
        kind, fl, layer, kvh, npos, blk, off, raw, comp = e
        nm = self._chunk_name(e)
        if kind not in (KIND_GROUP, KIND_TOKENS):
            self._err("%s: unknown chunk kind %d" % (part, kind))
        if fl & ~1:
            self._err("%s %s: unknown flags 0x%x" % (part, nm, fl))
        if kind == KIND_TOKENS and (layer or kvh):
            self._err("%s %s: layer/kv head must be 0" % (part, nm))
        if layer >= self.n_layers:
            self._err("%s %s: layer %d >= n_layers %d" % (part, nm, layer, self.n_layers))
        if kvh >= self.n_kv_heads:
            self._err("%s %s: kv head %d >= n_kv_heads %d" % (part, nm, kvh, self.n_kv_heads))
        if blk >= self.n_blocks:
            self._err("%s %s: block %d >= %d blocks" % (part, nm, blk, self.n_blocks))
        if npos != self._expected_npos(blk):
            self._err("%s %s: n_pos = %d, expected %d" % (part, nm, npos, self._expected_npos(blk)))
        want = self._raw_size(kind, npos)
        if raw != want:
            self._err("%s %s: raw_size = %d, expected %d" % (part, nm, raw, want))
        cb = _zstd.compress_bound(raw)
        if comp < 1 or comp > cb:
            self._err("%s %s: comp_size = %d is out of range [1, %d]" % (part, nm, comp, cb))
        if raw > comp * ZSTD_MAX_EXPANSION:
            self._err("%s %s: raw_size = %d is more than a %d-byte zstd frame can hold" % (part, nm, raw, comp))
        if foff is not None and (off < self.header["header_size"] or off > foff or CHUNK_HDR + comp > foff - off):
            self._err("%s %s: %d bytes at offset %d are outside the chunk area [%d, %d)"
                      % (part, nm, CHUNK_HDR + comp, off, self.header["header_size"], foff))

    def _read_chunk(self, e):
        """The decompressed, unshuffled payload of index entry e, after every check FORMAT.md lists."""
        kind, fl, layer, kvh, npos, blk, off, raw, comp = e
        nm = self._chunk_name(e)
        hb = self._pread(CHUNK_HDR + comp, off, nm)
        (magic, k2, f2, l2, h2, b2, n2, res, r2, c2, pcrc, hcrc) = _CHUNK_STRUCT.unpack(hb[:CHUNK_HDR])
        if magic != MAGIC_CHUNK:
            self._err("no chunk magic at offset %d" % off)
        if _crc(hb[:52]) != hcrc:
            self._err("chunk header at offset %d: checksum mismatch" % off, ChecksumError)
        if (k2, f2, l2, h2, b2, n2, r2, c2) != (kind, fl, layer, kvh, blk, npos, raw, comp) or res != 0:
            self._err("%s: chunk header at offset %d disagrees with its index entry" % (nm, off))
        payload = hb[CHUNK_HDR:]
        if _crc(payload) != pcrc:
            self._err("%s: payload checksum mismatch" % nm, ChecksumError)
        try:
            data = _zstd.decompress(payload, raw, "%s: %s" % (self.path, nm))
        except ValueError as ex:
            cls = ChecksumError if "checksum" in str(ex).lower() else TraceError
            raise cls(str(ex)) from None
        if not fl & FLAG_SHUFFLE:
            return data
        parts, pos = [], 0
        for nbytes, s in self._arrays(kind, npos):
            parts.append(_unshuffle(data[pos:pos + nbytes], s))
            pos += nbytes
        return b"".join(parts)

    def _arrays(self, kind, n):
        """(bytes, element size) of each array of a chunk payload, in order."""
        if kind == KIND_TOKENS:
            return [(4 * n, 4), (n, 1), (4 * n, 4)]
        G, d, es = self.group, self.head_dim, self._es
        a = [(n * G * d * es, es), (n * d * es, es), (n * d * es, es)]
        if not self.lean:
            a += [(n * G * d * es, es), (n * G * 4, 4)]
        return a

    # -- public reads
    def check(self):
        """Reads and checksums every chunk (what `kvsim verify` does first); raises on the first bad one."""
        for e in sorted(self._index.values(), key=lambda e: e[6]):
            self._read_chunk(e)

    def read_group(self, layer, kv_head, block, raw=False):
        """Block `block` of (layer, kv_head) as stored: dict q [n, G, d], k [n, d], v [n, d], o [n, G, d], lse
        [n, G] (a lean trace: o and lse None), n = the block's positions; float32 unless raw=True."""
        if not (0 <= layer < self.n_layers and 0 <= kv_head < self.n_kv_heads and 0 <= block < self.n_blocks):
            raise IndexError("%s: (layer %d, kv head %d, block %d) is outside the trace (%d layers, %d KV heads, %d "
                             "blocks)" % (self.path, layer, kv_head, block, self.n_layers, self.n_kv_heads,
                                          self.n_blocks))
        e = self._index[(KIND_GROUP, layer, kv_head, block)]
        data = self._read_chunk(e)
        n, G, d = e[4], self.group, self.head_dim
        st = _STORE_NP[self._dcode]
        shapes = [("q", (n, G, d)), ("k", (n, d)), ("v", (n, d))]
        if not self.lean:
            shapes += [("o", (n, G, d))]
        out, pos = {}, 0
        for name, shp in shapes:
            cnt = int(np.prod(shp))
            a = np.frombuffer(data, st, cnt, pos).reshape(shp)
            pos += cnt * self._es
            out[name] = a.copy() if raw else _to_f32(a, self._dcode)
        if self.lean:
            out["o"] = out["lse"] = None
        else:
            out["lse"] = np.frombuffer(data, "<f4", n * G, pos).reshape(n, G).copy()
        return out

    def blocks(self, layer, raw=False):
        """Yields (first_position, arrays) for each block of `layer`: arrays as layer() returns them for that
        block's positions (q [n, H, d], k/v [n, Hkv, d], o [n, H, d], lse [n, H]). Holds one block (and, for a
        lean trace, the keys and values so far, which its recomputation needs)."""
        if not 0 <= layer < self.n_layers:
            raise IndexError("%s: layer %d is outside [0, %d)" % (self.path, layer, self.n_layers))
        Hkv, G, d = self.n_kv_heads, self.group, self.head_dim
        kh = vh = None
        for b in range(self.n_blocks):
            groups = [self.read_group(layer, h, b, raw=raw) for h in range(Hkv)]
            n = groups[0]["q"].shape[0]
            a = {"q": np.stack([g["q"] for g in groups], 1).reshape(n, Hkv * G, d),
                 "k": np.stack([g["k"] for g in groups], 1), "v": np.stack([g["v"] for g in groups], 1)}
            if not self.lean:
                a["o"] = np.stack([g["o"] for g in groups], 1).reshape(n, Hkv * G, d)
                a["lse"] = np.stack([g["lse"] for g in groups], 1).reshape(n, Hkv * G)
            elif raw:
                a["o"] = a["lse"] = None
            else:
                kh = a["k"] if kh is None else np.concatenate([kh, a["k"]])
                vh = a["v"] if vh is None else np.concatenate([vh, a["v"]])
                a["o"], a["lse"] = self._recompute(a["q"], kh, vh, b * self.block_positions, self.layer_window[layer])
            yield b * self.block_positions, a

    def _recompute(self, q, kh, vh, first, window):
        """o and lse of query positions [first, first + n) over keys [0, first + n) (within the layer's window): a
        lean trace's outputs."""
        # rows a pass: the scores of one pass are rows x H x keys doubles, kept to about 64 MB for long traces
        n, H = q.shape[0], q.shape[1]
        rows = max(1, (1 << 23) // (H * (first + n)))
        o = np.empty(q.shape, np.float32)
        lse = np.empty((n, H), np.float32)
        for a in range(0, n, rows):
            b = min(n, a + rows)
            o[a:b], lse[a:b] = _attend(q[a:b], kh[:first + b], vh[:first + b], first + a, self.header["attn_scale"],
                                       window)
        return o, lse

    def layer(self, layer, raw=False):
        """All positions of one layer: dict q [P, H, d], k [P, Hkv, d], v [P, Hkv, d], o [P, H, d], lse [P, H]."""
        parts = [a for _, a in self.blocks(layer, raw=raw)]
        return {k: (None if parts[0][k] is None else np.concatenate([p[k] for p in parts]))
                for k in ("q", "k", "v", "o", "lse")}

    def arrays(self, raw=False):
        """Every layer at once: dict of arrays with a leading layer axis (q [L, P, H, d], ...). Memory: the whole
        trace decoded; prefer layer() or blocks() for big traces."""
        layers = [self.layer(l, raw=raw) for l in range(self.n_layers)]
        return {k: (None if layers[0][k] is None else np.stack([x[k] for x in layers]))
                for k in ("q", "k", "v", "o", "lse")}

    def writer_config(self):
        """The header fields TraceWriter takes, from this trace (to write a modified copy)."""
        h = self.header
        keys = ("n_layers", "n_heads", "n_kv_heads", "head_dim", "dim", "hidden_dim", "vocab_size", "max_seq_len",
                "rope_theta", "norm_eps", "attn_scale", "rope_layout", "model_name", "dtype", "block_positions",
                "max_new_tokens", "settings", "layer_window")
        c = {k: h[k] for k in keys}
        c["record"] = "qkv" if self.lean else "full"
        c["shuffle"] = h["shuffle"]
        return c


def open_trace(path):
    """Trace(path)."""
    return Trace(path)


# ---------------------------------------------------------------------------------------------- writer
class TraceWriter:
    """Writes a trace to PATH.partial, renamed to PATH by close() once complete (a writer abandoned by an
    exception, or garbage-collected unclosed, removes its .partial; used as a context manager it closes on success).

    Header fields (keywords): n_layers, n_heads, n_kv_heads, head_dim, vocab_size, and optionally dim (default
    n_heads * head_dim), hidden_dim (default 4 * dim), max_seq_len (default 2048), rope_theta (10000), norm_eps
    (1e-5), attn_scale (1 / sqrt(head_dim)), rope_layout (0 or 'adjacent': llama2.c pairs; 1 or 'halves': HF
    rotate_half), model_name, dtype ('fp16' default, 'bf16', 'fp32': storage of q/k/v/o; lse is always fp32),
    block_positions (64), max_new_tokens (0 = unknown), record ('full' default, or 'qkv': lean, no o/lse), shuffle
    (True), settings (text "key=value ..." or a dict), layer_window (None, or one window per layer in positions, 0 =
    full causal attention: a sliding-window layer's o and lse are its window's; the table and its flag bit are
    written only when some window is > 0, as kvsim writes them).

    append(tokens, roles, turns, q, k, v, o, lse) adds n positions: tokens [n] ids in [0, vocab_size), roles [n]
    (0 prompt, 1 generated; a scalar is broadcast), turns [n] turn indices (scalar broadcast), q [L, n, H, d], k and
    v [L, n, Hkv, d], o [L, n, H, d], lse [L, n, H] (natural-log LSE of the scaled scores; o and lse omitted in a
    'qkv' record). Values: any real floating type; float64 is rounded to float32 first, then to the storage type, as
    kvsim's own writer rounds its fp32 (so a float64 source gives the values an fp32 capture of it would). Arrays
    already in the storage type (float16 for fp16, float32 for fp32, the uint16 bits for bf16) are stored bit for
    bit."""

    def __init__(self, path, *, n_layers, n_heads, n_kv_heads, head_dim, vocab_size, dim=None, hidden_dim=None,
                 max_seq_len=2048, rope_theta=10000.0, norm_eps=1e-5, attn_scale=None, rope_layout=0, model_name="",
                 dtype="fp16", block_positions=64, max_new_tokens=0, record="full", shuffle=True, settings="",
                 layer_window=None):
        self.path = os.fspath(path)
        self.partial = self.path + ".partial"
        self._f = None
        layouts = {"adjacent": 0, "halves": 1, 0: 0, 1: 1}
        if rope_layout not in layouts:
            raise TraceError("rope_layout = %r: expected 0/'adjacent' or 1/'halves'" % (rope_layout,))
        dcode = _DTYPE_CODE.get(dtype) if isinstance(dtype, str) else (dtype if dtype in DTYPES else None)
        if dcode is None:
            raise TraceError("dtype = %r: expected 'fp16', 'bf16' or 'fp32'" % (dtype,))
        if record not in ("full", "qkv"):
            raise TraceError("record = %r: expected 'full' or 'qkv'" % (record,))
        if isinstance(settings, dict):
            settings = " ".join("%s=%s" % (k, v) for k, v in settings.items())
        sb = str(settings).encode("utf-8")
        if len(sb) > SETTINGS_MAX or b"\0" in sb:
            raise TraceError("settings: %d bytes (at most %d, no NUL)" % (len(sb), SETTINGS_MAX))
        nb = str(model_name).encode("utf-8")
        if len(nb) > 63 or b"\0" in nb:
            raise TraceError("model_name: %d bytes (at most 63, no NUL)" % len(nb))
        ints = dict(n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_kv_heads, head_dim=head_dim,
                    vocab_size=vocab_size, max_seq_len=max_seq_len, block_positions=block_positions,
                    max_new_tokens=max_new_tokens)
        for k_, v_ in ints.items():
            if isinstance(v_, bool) or not isinstance(v_, (int, np.integer)):
                raise TraceError("%s = %r: expected an integer" % (k_, v_))
        dim = n_heads * head_dim if dim is None else dim
        hidden_dim = 4 * dim if hidden_dim is None else hidden_dim
        attn_scale = 1.0 / np.sqrt(head_dim) if attn_scale is None and head_dim > 0 else attn_scale
        h = dict(ints, dim=int(dim), hidden_dim=int(hidden_dim), rope_theta=float(rope_theta),
                 norm_eps=float(norm_eps), attn_scale=float(np.float32(attn_scale)), rope_layout=layouts[rope_layout],
                 dtype=dcode, flags=(FLAG_SHUFFLE if shuffle else 0) | (FLAG_QKV if record == "qkv" else 0))
        h = {k_: (int(v_) if isinstance(v_, (int, np.integer)) else v_) for k_, v_ in h.items()}
        _check_header(h, lambda m: (_ for _ in ()).throw(TraceError("header: " + m)))
        if layer_window is None:
            layer_window = [0] * h["n_layers"]
        layer_window = [int(x) for x in layer_window]
        if len(layer_window) != h["n_layers"] or any(not 0 <= x <= I32_MAX for x in layer_window):
            raise TraceError("layer_window: %d windows, expected %d (one a layer), each in [0, %d]"
                             % (len(layer_window), h["n_layers"], I32_MAX))
        wtab = b"" if not any(layer_window) else struct.pack("<%di" % len(layer_window), *layer_window)
        if wtab:
            h["flags"] |= FLAG_WINDOWS
        self.h = h
        self.L, self.H, self.Hkv, self.d = h["n_layers"], h["n_heads"], h["n_kv_heads"], h["head_dim"]
        self.G, self.B = self.H // self.Hkv, h["block_positions"]
        self.lean = record == "qkv"
        self.shuffle = bool(shuffle)
        self._dcode, self._es = dcode, _ES[dcode]
        hdr = _HEADER_STRUCT.pack(MAGIC_FILE, 1, HDR_FIXED + len(sb) + len(wtab), h["n_layers"], h["n_heads"],
                                  h["n_kv_heads"],
                                  h["head_dim"], h["dim"], h["hidden_dim"], h["vocab_size"], h["max_seq_len"],
                                  h["rope_theta"], h["norm_eps"], h["attn_scale"], h["rope_layout"], dcode,
                                  h["block_positions"], h["max_new_tokens"], h["flags"], nb, len(sb)) + sb + wtab
        hdr += struct.pack("<I", _crc(hdr))
        self._header_size = len(hdr)
        self._n = 0                  # positions appended
        self._last_turn = None       # (turn index, role) of the last position: the turn rules across appends
        self._entries = []
        self._buf = []               # pending positions: list of per-append dicts, sliced at block boundaries
        self._pending = 0
        self._f = open(self.partial, "wb")
        self._f.write(hdr)
        self._off = len(hdr)

    # -- validation and storage coding
    def _store(self, name, a, shape):
        """a as the storage type's numpy array of `shape`, after the shape and value checks."""
        if hasattr(a, "detach"):  # a torch tensor: its float32 view through numpy (bf16 tensors have no numpy type)
            a = a.detach().cpu()
            a = (a.float() if str(a.dtype) == "torch.bfloat16" else a).numpy()  # bf16 -> float32 is exact
        a = np.asarray(a)
        if a.shape != shape:
            raise TraceError("%s: shape %s, expected %s" % (name, a.shape, shape))
        st = _STORE_NP[self._dcode]
        if a.dtype == st.newbyteorder("=") or a.dtype == st:
            if self._dcode == 2:
                return np.ascontiguousarray(a, st)  # bf16 bits as given
            out = np.ascontiguousarray(a, st)
        else:
            if a.dtype.kind != "f":
                raise TraceError("%s: dtype %s, expected a floating type (or %s for %s storage)"
                                 % (name, a.dtype, st, DTYPES[self._dcode]))
            f32 = a.astype(np.float32)
            if not np.all(np.isfinite(f32)):
                bad = np.argwhere(~np.isfinite(f32))[0]
                raise TraceError("%s: non-finite value %r at index %s" % (name, float(f32[tuple(bad)]), tuple(bad)))
            if self._dcode == 2:
                return _f32_to_bf16(f32)
            with np.errstate(over="ignore"):
                out = f32.astype(st)
        if not np.all(np.isfinite(out)):
            bad = np.argwhere(~np.isfinite(out))[0]
            raise TraceError("%s: value at index %s is not finite in %s storage (|x| > 65504 overflows fp16)"
                             % (name, tuple(bad), DTYPES[self._dcode]))
        return out

    def append(self, tokens, roles, turns, q, k, v, o=None, lse=None):
        if self._f is None:
            raise TraceError("%s: writer is closed" % self.path)
        tokens = np.asarray(tokens)
        if tokens.ndim != 1 or tokens.dtype.kind not in "iu":
            raise TraceError("tokens: expected a 1-D integer array, got %s %s" % (tokens.dtype, tokens.shape))
        n = tokens.shape[0]
        if n == 0:
            return
        bad = np.nonzero((tokens < 0) | (tokens >= self.h["vocab_size"]))[0]
        if len(bad):
            raise TraceError("tokens: position %d: token id %d is outside [0, %d)" % (self._n + bad[0],
                                                                                     tokens[bad[0]],
                                                                                     self.h["vocab_size"]))
        roles = np.broadcast_to(np.asarray(roles), (n,)).astype(np.int64)
        turns = np.broadcast_to(np.asarray(turns), (n,)).astype(np.int64)
        if np.any((turns < 0) | (turns > I32_MAX)):
            raise TraceError("turns: turn index out of range")
        _check_turn_rows(roles, turns, self._last_turn, self._n, "%s: append" % self.path)
        L, H, Hkv, d = self.L, self.H, self.Hkv, self.d
        rec = {"tokens": tokens.astype("<i4"), "roles": roles.astype(np.uint8), "turns": turns.astype("<i4"),
               "q": self._store("q", q, (L, n, H, d)), "k": self._store("k", k, (L, n, Hkv, d)),
               "v": self._store("v", v, (L, n, Hkv, d))}
        if self.lean:
            if o is not None or lse is not None:
                raise TraceError("o/lse given to a 'qkv' (lean) record, which does not store them")
        else:
            if o is None or lse is None:
                raise TraceError("o and lse are required in a 'full' record (attention_outputs() computes them "
                                 "from q/k/v; or write record='qkv')")
            rec["o"] = self._store("o", o, (L, n, H, d))
            lse = np.asarray(lse.detach().cpu().double().numpy() if hasattr(lse, "detach") else lse)
            if lse.shape != (L, n, H) or lse.dtype.kind != "f":
                raise TraceError("lse: %s %s, expected a floating array of shape %s" % (lse.dtype, lse.shape,
                                                                                      (L, n, H)))
            lse = lse.astype("<f4")
            if not np.all(np.isfinite(lse)):
                raise TraceError("lse: non-finite value")
            rec["lse"] = lse
        self._last_turn = (int(roles[-1]), int(turns[-1]))
        self._buf.append(rec)
        self._pending += n
        self._n += n
        while self._pending >= self.B:
            self._flush(self.B)

    def _take(self, n):
        """Removes the first n pending positions from the buffer; dict of arrays (position axis 0, or 1 for the
        per-layer arrays)."""
        parts, left = [], n
        while left:
            r = self._buf[0]
            m = r["tokens"].shape[0]
            if m <= left:
                parts.append(r)
                self._buf.pop(0)
                left -= m
            else:
                head = {k_: (a[:left] if k_ in ("tokens", "roles", "turns") else a[:, :left]) for k_, a in r.items()}
                self._buf[0] = {k_: (a[left:] if k_ in ("tokens", "roles", "turns") else a[:, left:])
                                for k_, a in r.items()}
                parts.append(head)
                left = 0
        self._pending -= n
        return {k_: np.concatenate([p[k_] for p in parts], axis=0 if k_ in ("tokens", "roles", "turns") else 1)
                for k_ in parts[0]}

    def _chunk(self, kind, layer, kvh, blk, n, arrays):
        """Appends one chunk of the given arrays (bytes, element size) and records its index entry."""
        raw = b"".join(a for a, _ in arrays)
        payload = b"".join(_shuffle(a, s) for a, s in arrays) if self.shuffle else raw
        comp = _zstd.compress(payload)
        fl = FLAG_SHUFFLE if self.shuffle else 0
        hdr = struct.pack("<4sHHIIQIIQQI", MAGIC_CHUNK, kind, fl, layer, kvh, blk, n, 0, len(raw), len(comp),
                          _crc(comp))
        hdr += struct.pack("<I", _crc(hdr))
        self._f.write(hdr)
        self._f.write(comp)
        self._entries.append((kind, fl, layer, kvh, n, blk, self._off, len(raw), len(comp)))
        self._off += len(hdr) + len(comp)

    def _flush(self, n):
        blk = (self._n - self._pending) // self.B
        r = self._take(n)
        self._chunk(KIND_TOKENS, 0, 0, blk, n, [(r["tokens"].tobytes(), 4), (r["roles"].tobytes(), 1),
                                                (r["turns"].tobytes(), 4)])
        G, es = self.G, self._es
        for l in range(self.L):
            for h in range(self.Hkv):
                arrs = [(np.ascontiguousarray(r["q"][l, :, h * G:(h + 1) * G]).tobytes(), es),
                        (np.ascontiguousarray(r["k"][l, :, h]).tobytes(), es),
                        (np.ascontiguousarray(r["v"][l, :, h]).tobytes(), es)]
                if not self.lean:
                    arrs += [(np.ascontiguousarray(r["o"][l, :, h * G:(h + 1) * G]).tobytes(), es),
                             (np.ascontiguousarray(r["lse"][l, :, h * G:(h + 1) * G]).tobytes(), 4)]
                self._chunk(KIND_GROUP, l, h, blk, n, arrs)

    @property
    def positions(self):
        return self._n

    def close(self):
        """Flushes the last block, writes footer and trailer, fsyncs and renames PATH.partial to PATH."""
        if self._f is None:
            raise TraceError("%s: writer is closed" % self.path)
        if self._n == 0:
            self.abort()
            raise TraceError("%s: no position was appended (a trace holds at least one)" % self.path)
        try:
            if self._pending:
                self._flush(self._pending)
            body = struct.pack("<4sIQQQ", MAGIC_FOOTER, 0, self._n, len(self._entries),
                               sum(e[7] for e in self._entries))
            body += b"".join(_ENTRY_STRUCT.pack(*e) for e in self._entries) + struct.pack("<I", 0)
            footer = body + struct.pack("<I", _crc(body))
            foff = self._off
            self._f.write(footer)
            tr = struct.pack("<QQ", foff, len(footer))
            tr += struct.pack("<II8s", _crc(tr), 0, MAGIC_TRAILER)
            self._f.write(tr)
            self._f.flush()
            os.fsync(self._f.fileno())
            self._f.close()
            self._f = None
            os.replace(self.partial, self.path)
        except BaseException:
            self.abort()
            raise

    def abort(self):
        """Abandons the trace: closes and removes PATH.partial."""
        if self._f is not None:
            self._f.close()
            self._f = None
            try:
                os.unlink(self.partial)
            except FileNotFoundError:
                pass

    def __enter__(self):
        return self

    def __exit__(self, et, ev, tb):
        if et is None:
            self.close()
        else:
            self.abort()

    def __del__(self):
        try:
            self.abort()
        except Exception:
            pass


def write_trace(path, q, k, v, o=None, lse=None, *, tokens, roles=None, turns=None, prompt_len=None, **config):
    """Writes a whole trace at once: q [L, P, H, d], k and v [L, P, Hkv, d], o [L, P, H, d], lse [L, P, H] (lists of
    per-layer arrays are stacked); tokens [P]. Roles and turns as TraceWriter.append takes them, or prompt_len for
    a single turn (positions >= prompt_len generated). Shape fields of the header default from the arrays;
    `config` is TraceWriter's keywords (vocab_size is required). Returns path."""
    q = np.stack(q) if isinstance(q, (list, tuple)) else q
    k = np.stack(k) if isinstance(k, (list, tuple)) else k
    v = np.stack(v) if isinstance(v, (list, tuple)) else v
    if isinstance(o, (list, tuple)):
        o = np.stack(o)
    if isinstance(lse, (list, tuple)):
        lse = np.stack(lse)
    if np.ndim(q) != 4 or np.ndim(k) != 4:
        raise TraceError("q and k must be [L, P, H, d] and [L, P, Hkv, d]; got %s and %s" % (np.shape(q),
                                                                                          np.shape(k)))
    P = np.shape(q)[1]
    if roles is None:
        if prompt_len is None:
            raise TraceError("give roles (and turns) or prompt_len")
        roles = (np.arange(P) >= prompt_len).astype(np.uint8)
    if turns is None:
        turns = 0
    config.setdefault("n_layers", np.shape(q)[0])
    config.setdefault("n_heads", np.shape(q)[2])
    config.setdefault("n_kv_heads", np.shape(k)[2])
    config.setdefault("head_dim", np.shape(q)[3])
    if o is None and lse is None and config.get("record", "full") == "full":
        raise TraceError("o and lse are required in a 'full' record (attention_outputs() computes them)")
    with TraceWriter(path, **config) as w:
        w.append(tokens, roles, turns, q, k, v, o, lse)
    return path
