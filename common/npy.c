/* npy.c — NumPy .npy v1.0 writer (see npy.h; format from numpy.lib.format / NEP 1). Data is written
 * little-endian element by element, so the file is correct on any host byte order.
 */
#include "npy.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

kvs_status kvs_npy_header(kvs_npy_type type, const int64_t *shape, int ndim, uint8_t *buf, size_t cap, size_t *len) {
    if (type != KVS_NPY_F32 && type != KVS_NPY_I32)
        return kvs_fail(KVS_ERR_INVALID_ARG, "npy: unknown element type %d", (int)type);
    if (ndim < 0 || ndim > KVS_NPY_MAX_DIMS)
        return kvs_fail(KVS_ERR_INVALID_ARG, "npy: ndim = %d is out of range [0, %d]", ndim, KVS_NPY_MAX_DIMS);
    char dict[512];
    int n = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (",
                     type == KVS_NPY_F32 ? "<f4" : "<i4");
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) return kvs_fail(KVS_ERR_INVALID_ARG, "npy: shape[%d] = %lld is negative", i, (long long)shape[i]);
        n += snprintf(dict + n, sizeof dict - (size_t)n, ndim == 1 ? "%lld," : (i ? ", %lld" : "%lld"),
                      (long long)shape[i]);
    }
    n += snprintf(dict + n, sizeof dict - (size_t)n, "), }");
    /* magic(6) + version(2) + hlen(2) + dict + padding spaces + '\n', total a multiple of 64 */
    size_t total = 10 + (size_t)n + 1;
    total = (total + 63) / 64 * 64;
    if (total > cap) return kvs_fail(KVS_ERR_INVALID_ARG, "npy: header buffer too small (%zu < %zu)", cap, total);
    memcpy(buf, "\x93NUMPY\x01\x00", 8);
    kvs_put_u16(buf + 8, (uint16_t)(total - 10));
    memcpy(buf + 10, dict, (size_t)n);
    memset(buf + 10 + n, ' ', total - 10 - (size_t)n - 1);
    buf[total - 1] = '\n';
    *len = total;
    return KVS_OK;
}

kvs_status kvs_npy_write(const char *path, kvs_npy_type type, const int64_t *shape, int ndim, const void *data) {
    uint8_t hdr[640];
    size_t hlen;
    kvs_status s = kvs_npy_header(type, shape, ndim, hdr, sizeof hdr, &hlen);
    if (s != KVS_OK) return s;
    uint64_t count = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] != 0 && count > UINT64_MAX / 4 / (uint64_t)shape[i])
            return kvs_fail(KVS_ERR_INVALID_ARG, "npy: shape too large");
        count *= (uint64_t)shape[i];
    }
    size_t plen = strlen(path);
    char *partial = malloc(plen + 9);
    if (!partial) return kvs_fail(KVS_ERR_NOMEM, "npy: out of memory");
    memcpy(partial, path, plen);
    memcpy(partial + plen, ".partial", 9);
    uint8_t chunk[1 << 16];
    int fd = open(partial, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        s = kvs_fail(KVS_ERR_IO, "%s: cannot create: %s", partial, strerror(errno));
        free(partial);
        return s;
    }
    s = kvs_write_all(fd, hdr, hlen, partial);
    const uint32_t *src = data; /* float and int32 are both written as their 4 bytes, little-endian */
    for (uint64_t i = 0; s == KVS_OK && i < count;) {
        size_t m = 0;
        for (; m < sizeof chunk / 4 && i < count; m++, i++) {
            uint32_t u;
            memcpy(&u, src + i, 4);
            kvs_put_u32(chunk + 4 * m, u);
        }
        s = kvs_write_all(fd, chunk, 4 * m, partial);
    }
    if (s == KVS_OK && fsync(fd) != 0) s = kvs_fail(KVS_ERR_IO, "%s: fsync failed: %s", partial, strerror(errno));
    if (close(fd) != 0 && s == KVS_OK) s = kvs_fail(KVS_ERR_IO, "%s: close failed: %s", partial, strerror(errno));
    if (s == KVS_OK && rename(partial, path) != 0)
        s = kvs_fail(KVS_ERR_IO, "%s: cannot rename to %s: %s", partial, path, strerror(errno));
    if (s != KVS_OK) unlink(partial);
    free(partial);
    return s;
}
