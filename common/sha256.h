/* sha256.h — SHA-256 (FIPS 180-4), for content hashes that identify inputs in results (a policy's file
 * parameter is recorded as PATH@sha256:HEX so a run stays reproducible and a changed file is detected).
 * Not used for security.
 */
#ifndef KVS_SHA256_H
#define KVS_SHA256_H

#include <stddef.h>
#include <stdint.h>

#include "kvs.h"

typedef struct {
    uint32_t h[8];
    uint64_t n_bytes;   /* message bytes so far */
    uint8_t buf[64];    /* pending partial block */
    size_t n_buf;
} kvs_sha256_ctx;

void kvs_sha256_init(kvs_sha256_ctx *c);
void kvs_sha256_update(kvs_sha256_ctx *c, const void *data, size_t n);
/*! kvs_sha256_final() : the 32-byte digest; the context must be re-initialised before reuse. */
void kvs_sha256_final(kvs_sha256_ctx *c, uint8_t out[32]);

/*! kvs_sha256_final_hex() : kvs_sha256_final as the 64 lowercase hex digits (+ NUL). */
void kvs_sha256_final_hex(kvs_sha256_ctx *c, char out[65]);

/*! kvs_sha256_hex() : the 64 lowercase hex digits (+ NUL) of the digest of data[0..n). */
void kvs_sha256_hex(const void *data, size_t n, char out[65]);

/*! kvs_sha256_file_hex() : the digest of the whole file at `path` as 64 hex digits. KVS_ERR_IO (detail names
 *  the path and the system error) when it cannot be read; a directory is KVS_ERR_IO too. */
kvs_status kvs_sha256_file_hex(const char *path, char out[65]);

#endif /* KVS_SHA256_H */
