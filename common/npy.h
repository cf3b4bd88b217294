/* npy.h — writer for NumPy .npy files, format version 1.0 (numpy.lib.format: magic "\x93NUMPY", version
 * 1.0, u16 little-endian header length, a Python-literal dict header padded with spaces and a final
 * newline so that the data starts on a 64-byte boundary, then the raw C-order data).
 * Used by `kvsim export`; only little-endian float32 ('<f4') and int32 ('<i4') are needed.
 */
#ifndef KVS_NPY_H
#define KVS_NPY_H

#include <stdint.h>

#include "kvs.h"

typedef enum { KVS_NPY_F32 = 0, KVS_NPY_I32 = 1 } kvs_npy_type;

#define KVS_NPY_MAX_DIMS 8

/*! kvs_npy_write() : writes `data` (host floats or int32s, C order, prod(shape) elements; borrowed) with
 *  the given shape (ndim 0..KVS_NPY_MAX_DIMS, each dim >= 0) to `path`, via `path`.partial and a rename so
 *  a failed write never leaves a half-written `path`. @return KVS_OK, KVS_ERR_INVALID_ARG (bad shape/type),
 *  KVS_ERR_IO. */
kvs_status kvs_npy_write(const char *path, kvs_npy_type type, const int64_t *shape, int ndim, const void *data);

/*! kvs_npy_header() : formats the complete .npy header (magic through the newline) for `type` and `shape`
 *  into buf (cap bytes); *len receives its size (a multiple of 64). Exposed for tests and streaming
 *  writers. */
kvs_status kvs_npy_header(kvs_npy_type type, const int64_t *shape, int ndim, uint8_t *buf, size_t cap, size_t *len);

#endif /* KVS_NPY_H */
