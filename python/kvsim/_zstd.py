"""_zstd.py — the few libzstd calls the trace format needs (one frame per chunk, with content size and zstd's frame
checksum: trace/FORMAT.md "Chunk"), through ctypes over the system libzstd (libzstd.so.1, the library kvsim itself
links). Python's standard library has no zstd; this keeps the module free of third-party packages.
"""
import ctypes
import ctypes.util

_LEVEL = 3                    # kvsim's writer level (trace/trace.c ZSTD_LEVEL)
_C_COMPRESSION_LEVEL = 100    # ZSTD_c_compressionLevel
_C_CHECKSUM_FLAG = 201        # ZSTD_c_checksumFlag
_C_CONTENT_SIZE_FLAG = 200    # ZSTD_c_contentSizeFlag
_CONTENTSIZE_UNKNOWN = (1 << 64) - 1
_CONTENTSIZE_ERROR = (1 << 64) - 2

_lib = None
_load_error = None


class ZstdUnavailable(RuntimeError):
    """libzstd could not be loaded: traces can be neither read nor written."""


def _load():
    global _lib, _load_error
    if _lib is not None:
        return _lib
    if _load_error is not None:
        raise ZstdUnavailable(_load_error)
    names = ["libzstd.so.1", ctypes.util.find_library("zstd"), "libzstd.dylib", "libzstd.so"]
    tried = []
    for name in names:
        if not name or name in tried:
            continue
        tried.append(name)
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        sz, vp, cp = ctypes.c_size_t, ctypes.c_void_p, ctypes.c_char_p
        lib.ZSTD_compressBound.argtypes, lib.ZSTD_compressBound.restype = [sz], sz
        lib.ZSTD_isError.argtypes, lib.ZSTD_isError.restype = [sz], ctypes.c_uint
        lib.ZSTD_getErrorName.argtypes, lib.ZSTD_getErrorName.restype = [sz], cp
        lib.ZSTD_createCCtx.argtypes, lib.ZSTD_createCCtx.restype = [], vp
        lib.ZSTD_freeCCtx.argtypes, lib.ZSTD_freeCCtx.restype = [vp], sz
        lib.ZSTD_CCtx_setParameter.argtypes, lib.ZSTD_CCtx_setParameter.restype = [vp, ctypes.c_int, ctypes.c_int], sz
        lib.ZSTD_compress2.argtypes, lib.ZSTD_compress2.restype = [vp, vp, sz, vp, sz], sz
        lib.ZSTD_findFrameCompressedSize.argtypes, lib.ZSTD_findFrameCompressedSize.restype = [vp, sz], sz
        lib.ZSTD_getFrameContentSize.argtypes, lib.ZSTD_getFrameContentSize.restype = [vp, sz], ctypes.c_ulonglong
        lib.ZSTD_decompress.argtypes, lib.ZSTD_decompress.restype = [vp, sz, vp, sz], sz
        _lib = lib
        return lib
    _load_error = ("libzstd not found (tried %s): install the zstd library (Debian: libzstd1) to read or write "
                   "kvsim traces" % ", ".join(tried))
    raise ZstdUnavailable(_load_error)


def _err(lib, r):
    return lib.ZSTD_getErrorName(r).decode("ascii", "replace")


def compress_bound(n):
    return int(_load().ZSTD_compressBound(n))


def compress(data):
    """One zstd frame of `data` (bytes) at kvsim's level, with the content size and the frame checksum."""
    lib = _load()
    cctx = lib.ZSTD_createCCtx()
    if not cctx:
        raise MemoryError("ZSTD_createCCtx failed")
    try:
        for p, v in ((_C_COMPRESSION_LEVEL, _LEVEL), (_C_CHECKSUM_FLAG, 1), (_C_CONTENT_SIZE_FLAG, 1)):
            r = lib.ZSTD_CCtx_setParameter(cctx, p, v)
            if lib.ZSTD_isError(r):
                raise RuntimeError("zstd: setting parameter %d: %s" % (p, _err(lib, r)))
        cap = lib.ZSTD_compressBound(len(data))
        out = ctypes.create_string_buffer(cap)
        r = lib.ZSTD_compress2(cctx, out, cap, data, len(data))
        if lib.ZSTD_isError(r):
            raise RuntimeError("zstd: compress: %s" % _err(lib, r))
        return out.raw[:r]
    finally:
        lib.ZSTD_freeCCtx(cctx)


def decompress(frame, raw_size, what):
    """Decodes `frame` (bytes), which must be exactly one zstd frame announcing `raw_size` bytes; zstd checks its
    frame checksum. Raises ValueError naming `what` otherwise."""
    lib = _load()
    n = len(frame)
    fsz = lib.ZSTD_findFrameCompressedSize(frame, n)
    if lib.ZSTD_isError(fsz) or fsz != n:
        raise ValueError("%s: payload is not one zstd frame of %d bytes" % (what, n))
    cs = lib.ZSTD_getFrameContentSize(frame, n)
    if cs in (_CONTENTSIZE_UNKNOWN, _CONTENTSIZE_ERROR) or cs != raw_size:
        raise ValueError("%s: zstd frame content size does not match raw_size %d" % (what, raw_size))
    out = ctypes.create_string_buffer(max(raw_size, 1))
    r = lib.ZSTD_decompress(out, raw_size, frame, n)
    if lib.ZSTD_isError(r):
        raise ValueError("%s: zstd: %s" % (what, _err(lib, r)))
    if r != raw_size:
        raise ValueError("%s: decompressed %d bytes, expected %d" % (what, r, raw_size))
    return out.raw[:raw_size]
