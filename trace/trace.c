/* trace.c — writer, validating reader, block streaming and crash recovery of kvsim trace files.
 *
 * Implements trace/trace.h to the byte-level specification in trace/FORMAT.md (version 1, with the lean record of
 * header flag bit 1 and the byte planes as zstd blocks: FORMAT.md "Lean record", "Byte planes as zstd blocks"). Every size,
 * offset and count read from a file is checked before it is used (overflow-safe arithmetic, allocations
 * bounded by the file size where the format allows it); corrupt input is a KVS_ERR_FORMAT /
 * KVS_ERR_CHECKSUM / KVS_ERR_TRUNCATED / KVS_ERR_VERSION with a detail naming the file and the part.
 */
#include "trace.h"

#include "../common/kvs_math.h"
#include "../common/kvs_out.h"
#include "../common/sha256.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>
#include <zstd_errors.h>

/* ------------------------------------------------------------------------------------------------
 * Format constants and shared helpers
 * ---------------------------------------------------------------------------------------------- */

#define HDR_FIXED 152u        /* header bytes besides the settings text */
#define HDR_SETTINGS_OFF 148u
#define HDR_MAX (HDR_FIXED + KVS_TRACE_SETTINGS_MAX + 4u * KVS_TRACE_MAX_LAYERS) /* with the layer-window table */
#define CHUNK_HDR 56u
#define FOOTER_FIXED 40u
#define INDEX_ENTRY 48u
#define TRAILER 32u
#define KIND_GROUP 1u
#define KIND_TOKENS 2u
#define ZSTD_LEVEL 3
/* The most a zstd frame can expand: an RLE block (3-byte block header + 1 byte) regenerates at most
 * Block_Maximum_Size = 128 KiB, and no other block kind regenerates more per input byte (RFC 8878, 3.1.1.2).
 * A chunk whose raw_size exceeds comp_size times this cannot be what its payload holds, so it is refused before
 * any buffer is sized from it: a hostile header then cannot make a reader allocate more than ~32768 times the
 * file's size (trace/FORMAT.md "What a reader validates"). */
#define ZSTD_MAX_EXPANSION 32768u

static const uint8_t MAGIC_FILE[8] = {'K', 'V', 'S', 'T', 'R', 'A', 'C', 'E'};
static const uint8_t MAGIC_CHUNK[4] = {'K', 'V', 'C', 'K'};
static const uint8_t MAGIC_FOOTER[4] = {'K', 'V', 'F', 'T'};
static const uint8_t MAGIC_END[8] = {'K', 'V', 'S', 'T', 'E', 'N', 'D', 0};

/* One chunk as the footer index describes it (also used by the writer and recovery). */
typedef struct {
    uint16_t kind, flags;
    uint32_t layer, kv_head, n_pos;
    uint64_t block, offset, raw_size, comp_size;
} chunk_entry;

/* Parsed header plus derived sizes. */
typedef struct {
    kvs_model_config model;
    kvs_capture_config cap;
    uint32_t version, header_size;
    uint32_t G, d, B, L, Hkv;
    size_t es; /* bytes per element of the storage dtype */
} trace_hdr;

/* Raw payload bytes of a group chunk of n_pos positions: q, k, v, o, lse; q, k, v alone in a lean trace. */
static uint64_t group_raw_size(const trace_hdr *h, uint64_t n_pos) {
    /* Bounded by the header limits (<= 2^16 * (2050 * 1024 * 4 + 4096)) so no overflow in u64. */
    if (h->cap.flags & KVS_TRACE_FLAG_QKV) return n_pos * (((uint64_t)h->G + 2u) * h->d * h->es);
    return n_pos * ((2u * (uint64_t)h->G + 2u) * h->d * h->es + (uint64_t)h->G * 4u);
}
static uint64_t tokens_raw_size(uint64_t n_pos) { return 9u * n_pos; }

static void chunk_name(char *buf, size_t n, const chunk_entry *e) {
    if (e->kind == KIND_TOKENS)
        snprintf(buf, n, "tokens chunk (block %llu)", (unsigned long long)e->block);
    else
        snprintf(buf, n, "chunk (layer %u, kv head %u, block %llu)", e->layer, e->kv_head,
                 (unsigned long long)e->block);
}

/* Byte shuffle of one array of m elements of s bytes (FORMAT.md "Byte shuffle"). */
static void shuffle_bytes(const uint8_t *in, uint8_t *out, size_t m, size_t s) {
    if (s == 1) {
        memcpy(out, in, m);
        return;
    }
    for (size_t i = 0; i < m; i++)
        for (size_t j = 0; j < s; j++) out[j * m + i] = in[i * s + j];
}
static void unshuffle_bytes(const uint8_t *in, uint8_t *out, size_t m, size_t s) {
    if (s == 1) {
        memcpy(out, in, m);
        return;
    }
    for (size_t j = 0; j < s; j++)
        for (size_t i = 0; i < m; i++) out[i * s + j] = in[j * m + i];
}

static void put_entry(uint8_t *p, const chunk_entry *e) {
    kvs_put_u16(p + 0, e->kind);
    kvs_put_u16(p + 2, e->flags);
    kvs_put_u32(p + 4, e->layer);
    kvs_put_u32(p + 8, e->kv_head);
    kvs_put_u32(p + 12, e->n_pos);
    kvs_put_u64(p + 16, e->block);
    kvs_put_u64(p + 24, e->offset);
    kvs_put_u64(p + 32, e->raw_size);
    kvs_put_u64(p + 40, e->comp_size);
}
static void get_entry(const uint8_t *p, chunk_entry *e) {
    e->kind = kvs_get_u16(p + 0);
    e->flags = kvs_get_u16(p + 2);
    e->layer = kvs_get_u32(p + 4);
    e->kv_head = kvs_get_u32(p + 8);
    e->n_pos = kvs_get_u32(p + 12);
    e->block = kvs_get_u64(p + 16);
    e->offset = kvs_get_u64(p + 24);
    e->raw_size = kvs_get_u64(p + 32);
    e->comp_size = kvs_get_u64(p + 40);
}

static void put_chunk_header(uint8_t *p, const chunk_entry *e, uint32_t payload_crc) {
    memcpy(p, MAGIC_CHUNK, 4);
    kvs_put_u16(p + 4, e->kind);
    kvs_put_u16(p + 6, e->flags);
    kvs_put_u32(p + 8, e->layer);
    kvs_put_u32(p + 12, e->kv_head);
    kvs_put_u64(p + 16, e->block);
    kvs_put_u32(p + 24, e->n_pos);
    kvs_put_u32(p + 28, 0);
    kvs_put_u64(p + 32, e->raw_size);
    kvs_put_u64(p + 40, e->comp_size);
    kvs_put_u32(p + 48, payload_crc);
    kvs_put_u32(p + 52, kvs_crc32(0, p, 52));
}


/* ------------------------------------------------------------------------------------------------
 * Header: validation shared by writer (config check) and reader (file check)
 * ---------------------------------------------------------------------------------------------- */

/* Checks the configs against FORMAT.md's ranges; `st` is the status to report (INVALID_ARG for the
 * writer's caller, FORMAT for a file) and `who` prefixes the message. */
static kvs_status check_configs(const kvs_model_config *m, const kvs_capture_config *c, kvs_status st,
                                const char *who) {
#define RANGE_CHECK(field, val, lo, hi)                                                                       \
    if ((val) < (lo) || (val) > (hi))                                                                         \
        return kvs_fail(st, "%s: %s = %lld is out of range [%lld, %lld]", who, field, (long long)(val),       \
                        (long long)(lo), (long long)(hi));
    RANGE_CHECK("n_layers", m->n_layers, 1, KVS_TRACE_MAX_LAYERS);
    RANGE_CHECK("n_heads", m->n_heads, 1, KVS_TRACE_MAX_HEADS);
    RANGE_CHECK("n_kv_heads", m->n_kv_heads, 1, m->n_heads);
    if (m->n_heads % m->n_kv_heads != 0)
        return kvs_fail(st, "%s: n_heads = %d is not a multiple of n_kv_heads = %d", who, m->n_heads,
                        m->n_kv_heads);
    RANGE_CHECK("head_dim", m->head_dim, 1, KVS_TRACE_MAX_HEAD_DIM);
    RANGE_CHECK("dim", m->dim, 1, INT32_MAX);
    RANGE_CHECK("hidden_dim", m->hidden_dim, 1, INT32_MAX);
    RANGE_CHECK("vocab_size", m->vocab_size, 1, INT32_MAX);
    RANGE_CHECK("max_seq_len", m->max_seq_len, 1, INT32_MAX);
    if (!isfinite(m->attn_scale) || !(m->attn_scale > 0))
        return kvs_fail(st, "%s: attn_scale = %g must be finite and > 0", who, (double)m->attn_scale);
    RANGE_CHECK("rope_layout", m->rope_layout, 0, 1);
    if (!memchr(m->model_name, 0, KVS_TRACE_NAME_MAX))
        return kvs_fail(st, "%s: model_name is not NUL-terminated within %d bytes", who, KVS_TRACE_NAME_MAX);
    RANGE_CHECK("dtype", c->dtype, 0, 2);
    RANGE_CHECK("block_positions", c->block_positions, 1, KVS_TRACE_MAX_BLOCK);
    RANGE_CHECK("max_new_tokens", c->max_new_tokens, 0, INT32_MAX);
    /* bit 2 (layer windows) is the writer's, derived from layer_window; the reader strips it before this check */
    if (c->flags & ~(KVS_TRACE_FLAG_SHUFFLE | KVS_TRACE_FLAG_QKV))
        return kvs_fail(st, "%s: flags = 0x%x has unknown bits (only bit 0, shuffle, and bit 1, lean q/k/v record, are "
                        "defined)", who, c->flags);
    for (int l = 0; l < m->n_layers; l++)
        if (m->layer_window[l] < 0)
            return kvs_fail(st, "%s: layer_window[%d] = %d is negative (0 = full attention)", who, l, m->layer_window[l]);
    if (!memchr(c->settings, 0, KVS_TRACE_SETTINGS_MAX))
        return kvs_fail(st, "%s: settings text is longer than %d bytes", who, KVS_TRACE_SETTINGS_MAX - 1);
#undef RANGE_CHECK
    return KVS_OK;
}

static void derive_sizes(trace_hdr *h) {
    h->L = (uint32_t)h->model.n_layers;
    h->Hkv = (uint32_t)h->model.n_kv_heads;
    h->G = (uint32_t)(h->model.n_heads / h->model.n_kv_heads);
    h->d = (uint32_t)h->model.head_dim;
    h->B = (uint32_t)h->cap.block_positions;
    h->es = kvs_dtype_size((kvs_dtype)h->cap.dtype);
}

/* Serialises the header into buf (at least HDR_MAX bytes); returns its size. The layer-window table and its flag
 * bit are written only when some layer has a window, so a full-attention model's trace is what it always was. */
static uint32_t encode_header(const kvs_model_config *m, const kvs_capture_config *c, uint8_t *buf) {
    uint32_t slen = (uint32_t)strlen(c->settings);
    int windows = kvs_model_config_has_windows(m);
    uint32_t wlen = windows ? 4u * (uint32_t)m->n_layers : 0;
    uint32_t size = HDR_FIXED + slen + wlen;
    memset(buf, 0, size);
    memcpy(buf, MAGIC_FILE, 8);
    kvs_put_u32(buf + 8, 1);
    kvs_put_u32(buf + 12, size);
    kvs_put_u32(buf + 16, (uint32_t)m->n_layers);
    kvs_put_u32(buf + 20, (uint32_t)m->n_heads);
    kvs_put_u32(buf + 24, (uint32_t)m->n_kv_heads);
    kvs_put_u32(buf + 28, (uint32_t)m->head_dim);
    kvs_put_u32(buf + 32, (uint32_t)m->dim);
    kvs_put_u32(buf + 36, (uint32_t)m->hidden_dim);
    kvs_put_u32(buf + 40, (uint32_t)m->vocab_size);
    kvs_put_u32(buf + 44, (uint32_t)m->max_seq_len);
    kvs_put_u32(buf + 48, kvs_f32_bits(m->rope_theta));
    kvs_put_u32(buf + 52, kvs_f32_bits(m->norm_eps));
    kvs_put_u32(buf + 56, kvs_f32_bits(m->attn_scale));
    kvs_put_u32(buf + 60, (uint32_t)m->rope_layout);
    kvs_put_u32(buf + 64, (uint32_t)c->dtype);
    kvs_put_u32(buf + 68, (uint32_t)c->block_positions);
    kvs_put_u32(buf + 72, (uint32_t)c->max_new_tokens);
    kvs_put_u32(buf + 76, (c->flags & ~KVS_TRACE_FLAG_WINDOWS) | (windows ? KVS_TRACE_FLAG_WINDOWS : 0));
    size_t nlen = strnlen(m->model_name, KVS_TRACE_NAME_MAX - 1);
    memcpy(buf + 80, m->model_name, nlen); /* rest stays NUL padding */
    kvs_put_u32(buf + 144, slen);
    memcpy(buf + HDR_SETTINGS_OFF, c->settings, slen);
    for (uint32_t l = 0; l < wlen / 4; l++) kvs_put_u32(buf + HDR_SETTINGS_OFF + slen + 4 * l, (uint32_t)m->layer_window[l]);
    kvs_put_u32(buf + size - 4, kvs_crc32(0, buf, size - 4));
    return size;
}

/* Reads and validates the header of an open file. */
static kvs_status read_header(int fd, uint64_t file_size, const char *path, trace_hdr *h) {
    uint8_t buf[HDR_MAX];
    memset(h, 0, sizeof *h);
    if (file_size < HDR_FIXED)
        return kvs_fail(KVS_ERR_TRUNCATED, "%s: file is %llu bytes, shorter than a trace header (%u bytes)", path,
                        (unsigned long long)file_size, HDR_FIXED);
    kvs_status s = kvs_pread_all(fd, buf, HDR_FIXED, 0, path);
    if (s != KVS_OK) return s;
    if (memcmp(buf, MAGIC_FILE, 8) != 0) return kvs_fail(KVS_ERR_FORMAT, "%s: not a kvsim trace (bad magic)", path);
    h->version = kvs_get_u32(buf + 8);
    if (h->version != 1)
        return kvs_fail(KVS_ERR_VERSION, "%s: unsupported trace version %u (this build reads version 1)", path,
                        h->version);
    h->header_size = kvs_get_u32(buf + 12);
    uint32_t slen = kvs_get_u32(buf + 144);
    if (slen > KVS_TRACE_SETTINGS_MAX - 1)
        return kvs_fail(KVS_ERR_FORMAT, "%s: header: settings_len = %u exceeds %d", path, slen,
                        KVS_TRACE_SETTINGS_MAX - 1);
    /* the window table's length comes from n_layers, range-checked here before it sizes anything */
    uint32_t wl = kvs_get_u32(buf + 16);
    int windows = (kvs_get_u32(buf + 76) & KVS_TRACE_FLAG_WINDOWS) != 0;
    if (windows && (wl < 1 || wl > KVS_TRACE_MAX_LAYERS))
        return kvs_fail(KVS_ERR_FORMAT, "%s: header: n_layers = %u is out of range [1, %d]", path, wl, KVS_TRACE_MAX_LAYERS);
    uint32_t wlen = windows ? 4u * wl : 0;
    if (h->header_size != HDR_FIXED + slen + wlen)
        return kvs_fail(KVS_ERR_FORMAT, "%s: header: header_size = %u, expected 152 + settings_len%s = %u", path,
                        h->header_size, windows ? " + 4 x n_layers (layer windows)" : "", HDR_FIXED + slen + wlen);
    if (h->header_size > file_size)
        return kvs_fail(KVS_ERR_TRUNCATED, "%s: file ends inside the header (%u bytes announced, file has %llu)",
                        path, h->header_size, (unsigned long long)file_size);
    if (slen + wlen > 0 && (s = kvs_pread_all(fd, buf + HDR_FIXED, slen + wlen, HDR_FIXED, path)) != KVS_OK) return s;
    if (kvs_crc32(0, buf, h->header_size - 4) != kvs_get_u32(buf + h->header_size - 4))
        return kvs_fail(KVS_ERR_CHECKSUM, "%s: header checksum mismatch", path);
    kvs_model_config *m = &h->model;
    kvs_capture_config *c = &h->cap;
    m->n_layers = (int32_t)kvs_get_u32(buf + 16);
    m->n_heads = (int32_t)kvs_get_u32(buf + 20);
    m->n_kv_heads = (int32_t)kvs_get_u32(buf + 24);
    m->head_dim = (int32_t)kvs_get_u32(buf + 28);
    m->dim = (int32_t)kvs_get_u32(buf + 32);
    m->hidden_dim = (int32_t)kvs_get_u32(buf + 36);
    m->vocab_size = (int32_t)kvs_get_u32(buf + 40);
    m->max_seq_len = (int32_t)kvs_get_u32(buf + 44);
    m->rope_theta = kvs_bits_f32(kvs_get_u32(buf + 48));
    m->norm_eps = kvs_bits_f32(kvs_get_u32(buf + 52));
    m->attn_scale = kvs_bits_f32(kvs_get_u32(buf + 56));
    m->rope_layout = (int32_t)kvs_get_u32(buf + 60);
    c->dtype = (int32_t)kvs_get_u32(buf + 64);
    c->block_positions = (int32_t)kvs_get_u32(buf + 68);
    c->max_new_tokens = (int32_t)kvs_get_u32(buf + 72);
    c->flags = kvs_get_u32(buf + 76) & ~KVS_TRACE_FLAG_WINDOWS; /* a layout bit, re-derived by every writer */
    for (uint32_t l = 0; l < wlen / 4; l++) {
        uint32_t v = kvs_get_u32(buf + HDR_SETTINGS_OFF + slen + 4 * l);
        if (v > INT32_MAX)
            return kvs_fail(KVS_ERR_FORMAT, "%s: header: layer_window[%u] = %u is out of range [0, %d]", path, l, v,
                            INT32_MAX);
        m->layer_window[l] = (int32_t)v;
    }
    memcpy(m->model_name, buf + 80, KVS_TRACE_NAME_MAX);
    if (memchr(buf + HDR_SETTINGS_OFF, 0, slen))
        return kvs_fail(KVS_ERR_FORMAT, "%s: header: settings text contains a NUL byte", path);
    memcpy(c->settings, buf + HDR_SETTINGS_OFF, slen);
    c->settings[slen] = '\0';
    char who[600];
    snprintf(who, sizeof who, "%s: header", path);
    if ((s = check_configs(m, c, KVS_ERR_FORMAT, who)) != KVS_OK) return s;
    derive_sizes(h);
    return KVS_OK;
}

/* Parses a 56-byte chunk header into *e after checking its magic and CRC (fields: check_entry_fields). */
static kvs_status parse_chunk_header(const uint8_t *p, uint64_t offset, const char *path, chunk_entry *e) {
    if (memcmp(p, MAGIC_CHUNK, 4) != 0)
        return kvs_fail(KVS_ERR_FORMAT, "%s: no chunk magic at offset %llu", path, (unsigned long long)offset);
    if (kvs_crc32(0, p, 52) != kvs_get_u32(p + 52))
        return kvs_fail(KVS_ERR_CHECKSUM, "%s: chunk header at offset %llu: checksum mismatch", path,
                        (unsigned long long)offset);
    e->kind = kvs_get_u16(p + 4);
    e->flags = kvs_get_u16(p + 6);
    e->layer = kvs_get_u32(p + 8);
    e->kv_head = kvs_get_u32(p + 12);
    e->block = kvs_get_u64(p + 16);
    e->n_pos = kvs_get_u32(p + 24);
    e->raw_size = kvs_get_u64(p + 32);
    e->comp_size = kvs_get_u64(p + 40);
    e->offset = offset;
    return KVS_OK;
}

/* Field checks common to index entries and chunk headers (not the block count, which needs N). */
static kvs_status check_entry_fields(const chunk_entry *e, const trace_hdr *h, const char *path, const char *part) {
    char nm[96];
    chunk_name(nm, sizeof nm, e);
    if (e->kind != KIND_GROUP && e->kind != KIND_TOKENS)
        return kvs_fail(KVS_ERR_FORMAT, "%s: %s: unknown chunk kind %u", path, part, e->kind);
    if (e->flags & ~1u) return kvs_fail(KVS_ERR_FORMAT, "%s: %s %s: unknown flags 0x%x", path, part, nm, e->flags);
    if (e->kind == KIND_TOKENS && (e->layer != 0 || e->kv_head != 0))
        return kvs_fail(KVS_ERR_FORMAT, "%s: %s %s: layer/kv head must be 0", path, part, nm);
    if (e->layer >= h->L)
        return kvs_fail(KVS_ERR_FORMAT, "%s: %s %s: layer %u >= n_layers %u", path, part, nm, e->layer, h->L);
    if (e->kv_head >= h->Hkv)
        return kvs_fail(KVS_ERR_FORMAT, "%s: %s %s: kv head %u >= n_kv_heads %u", path, part, nm, e->kv_head, h->Hkv);
    if (e->n_pos < 1 || e->n_pos > h->B)
        return kvs_fail(KVS_ERR_FORMAT, "%s: %s %s: n_pos = %u is out of range [1, %u]", path, part, nm, e->n_pos,
                        h->B);
    uint64_t want = e->kind == KIND_TOKENS ? tokens_raw_size(e->n_pos) : group_raw_size(h, e->n_pos);
    if (e->raw_size != want)
        return kvs_fail(KVS_ERR_FORMAT, "%s: %s %s: raw_size = %llu, expected %llu", path, part, nm,
                        (unsigned long long)e->raw_size, (unsigned long long)want);
    if (e->comp_size < 1 || e->comp_size > ZSTD_compressBound((size_t)e->raw_size))
        return kvs_fail(KVS_ERR_FORMAT, "%s: %s %s: comp_size = %llu is out of range [1, %zu]", path, part, nm,
                        (unsigned long long)e->comp_size, ZSTD_compressBound((size_t)e->raw_size));
    /* comp_size <= ZSTD_compressBound(raw_size) < 2^41 here: the product cannot overflow */
    if (e->raw_size > e->comp_size * ZSTD_MAX_EXPANSION)
        return kvs_fail(KVS_ERR_FORMAT, "%s: %s %s: raw_size = %llu is more than a %llu-byte zstd frame can hold "
                        "(at most %u bytes per compressed byte)", path, part, nm, (unsigned long long)e->raw_size,
                        (unsigned long long)e->comp_size, ZSTD_MAX_EXPANSION);
    return KVS_OK;
}

/* Checks a chunk payload (CRC, one zstd frame of exactly comp_size bytes announcing raw_size) and
 * decompresses it into raw (raw_size bytes). */
static kvs_status check_and_decompress(const uint8_t *payload, uint32_t want_crc, const chunk_entry *e,
                                       uint8_t *raw, ZSTD_DCtx *dctx, const char *path) {
    char nm[96];
    chunk_name(nm, sizeof nm, e);
    if (kvs_crc32(0, payload, (size_t)e->comp_size) != want_crc)
        return kvs_fail(KVS_ERR_CHECKSUM, "%s: %s: payload checksum mismatch", path, nm);
    size_t fsz = ZSTD_findFrameCompressedSize(payload, (size_t)e->comp_size);
    if (ZSTD_isError(fsz) || fsz != e->comp_size)
        return kvs_fail(KVS_ERR_FORMAT, "%s: %s: payload is not one zstd frame of %llu bytes", path, nm,
                        (unsigned long long)e->comp_size);
    unsigned long long cs = ZSTD_getFrameContentSize(payload, (size_t)e->comp_size);
    if (cs != e->raw_size)
        return kvs_fail(KVS_ERR_FORMAT, "%s: %s: zstd frame content size does not match raw_size %llu", path, nm,
                        (unsigned long long)e->raw_size);
    size_t r = ZSTD_decompressDCtx(dctx, raw, (size_t)e->raw_size, payload, (size_t)e->comp_size);
    if (ZSTD_isError(r)) {
        kvs_status st = ZSTD_getErrorCode(r) == ZSTD_error_checksum_wrong ? KVS_ERR_CHECKSUM : KVS_ERR_FORMAT;
        return kvs_fail(st, "%s: %s: zstd: %s", path, nm, ZSTD_getErrorName(r));
    }
    if (r != e->raw_size)
        return kvs_fail(KVS_ERR_FORMAT, "%s: %s: decompressed %zu bytes, expected %llu", path, nm, r,
                        (unsigned long long)e->raw_size);
    return KVS_OK;
}

/* ------------------------------------------------------------------------------------------------
 * Writer
 * ---------------------------------------------------------------------------------------------- */

/* One compressing worker's state: raw and shuffled payload scratch and its own zstd context. */
typedef struct {
    uint8_t *payload, *shuf;
    ZSTD_CCtx *cctx;
} chunk_coder;

/* One compressed chunk waiting for its turn to be written: chunk header space + zstd frame. */
typedef struct {
    uint8_t *out;
    chunk_entry e;       /* offset still unset */
    uint32_t crc;        /* CRC-32 of the zstd frame */
    size_t zerr;         /* a zstd error code, 0 if none */
} chunk_slot;

/* Group chunks compressed per pool run, per worker: enough to amortise a wake-up (a chunk takes ~0.1-1 ms)
 * while keeping the wave's output buffers small. */
#define WAVE_PER_WORKER 4

struct kvs_trace_writer {
    char *path, *partial;
    int fd;
    int created, closed, failed; /* created: the .partial exists and is ours to remove */
    int kept;             /* kvs_trace_writer_keep_partial: the .partial is the user's now, the writer done */
    trace_hdr h;
    int shuffle;
    int lean;             /* KVS_TRACE_FLAG_QKV: o and lse are not stored */
    int plane_blocks;     /* kvs_trace_writer_set_plane_blocks */
    int64_t n_positions;  /* completed positions */
    int in_position;
    int32_t blk_n;        /* positions of the current block already ended */
    int64_t blk_index;
    int32_t last_turn;
    int last_role;
    uint8_t *layer_done;  /* [L] for the current position */
    /* Current block, per group gi = layer * Hkv + kv_head, encoded in the storage dtype, position-major so
     * that the first n positions of each array are a prefix (a partial last block needs no compaction). */
    size_t q_bytes, kv_bytes, lse_n; /* per group: B*G*d*es, B*d*es, B*G floats */
    uint8_t *gq, *gk, *gv, *go;
    float *glse;
    int32_t *tok, *turn;
    uint8_t *role;
    size_t payload_cap, out_cap;  /* one chunk's raw payload; chunk header + zstd bound */
    kvs_threadpool *pool;         /* borrowed; NULL = compress on the calling thread */
    chunk_coder *coders;          /* [n_coders], one per pool worker (coders[0] is the calling thread's) */
    int n_coders;
    chunk_slot *slots;            /* [n_slots]: the group chunks of one wave, compressed, awaiting write */
    int n_slots;
    chunk_entry *entries;
    size_t n_entries, cap_entries;
    uint64_t offset, total_raw;
};

static char *str_concat(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    char *s = malloc(la + lb + 1);
    if (!s) return NULL;
    memcpy(s, a, la);
    memcpy(s + la, b, lb + 1);
    return s;
}

static void free_coders(kvs_trace_writer *w) {
    for (int i = 0; i < w->n_coders; i++) {
        free(w->coders[i].payload);
        free(w->coders[i].shuf);
        ZSTD_freeCCtx(w->coders[i].cctx);
    }
    free(w->coders);
    w->coders = NULL;
    w->n_coders = 0;
    for (int i = 0; i < w->n_slots; i++) free(w->slots[i].out);
    free(w->slots);
    w->slots = NULL;
    w->n_slots = 0;
}

/* (Re)allocates one coder per worker and the wave's slots for `n_workers` workers: at create (one) and in
 * kvs_trace_writer_set_threadpool, the only places the pool changes. */
static kvs_status size_workers(kvs_trace_writer *w, int n_workers) {
    size_t groups = (size_t)w->h.L * w->h.Hkv;
    size_t n_slots = (size_t)n_workers * WAVE_PER_WORKER;
    if (n_slots > groups) n_slots = groups;
    if (w->n_coders == n_workers && (size_t)w->n_slots == n_slots) return KVS_OK;
    free_coders(w);
    w->coders = calloc((size_t)n_workers, sizeof *w->coders);
    w->slots = calloc(n_slots, sizeof *w->slots);
    if (!w->coders || !w->slots) {
        free(w->coders);
        free(w->slots);
        w->coders = NULL;
        w->slots = NULL;
        return kvs_fail(KVS_ERR_NOMEM, "%s: cannot allocate the writer's compression state", w->path);
    }
    w->n_coders = n_workers;
    w->n_slots = (int)n_slots;
    for (int i = 0; i < n_workers; i++) {
        chunk_coder *c = &w->coders[i];
        c->payload = malloc(w->payload_cap);
        c->shuf = malloc(w->payload_cap);
        c->cctx = ZSTD_createCCtx();
        if (!c->payload || !c->shuf || !c->cctx) {
            free_coders(w);
            return kvs_fail(KVS_ERR_NOMEM, "%s: cannot allocate the writer's compression state", w->path);
        }
        if (ZSTD_isError(ZSTD_CCtx_setParameter(c->cctx, ZSTD_c_compressionLevel, ZSTD_LEVEL)) ||
            ZSTD_isError(ZSTD_CCtx_setParameter(c->cctx, ZSTD_c_checksumFlag, 1)) ||
            ZSTD_isError(ZSTD_CCtx_setParameter(c->cctx, ZSTD_c_contentSizeFlag, 1))) {
            free_coders(w);
            return kvs_fail(KVS_ERR_COMPRESS, "%s: cannot configure zstd", w->path);
        }
    }
    for (size_t i = 0; i < n_slots; i++) {
        if (!(w->slots[i].out = malloc(w->out_cap))) {
            free_coders(w);
            return kvs_fail(KVS_ERR_NOMEM, "%s: cannot allocate the writer's compression state", w->path);
        }
    }
    return KVS_OK;
}

kvs_status kvs_trace_writer_create(const char *path, const kvs_model_config *model, const kvs_capture_config *cap,
                                   kvs_trace_writer **out) {
    *out = NULL;
    if (!path || !model || !cap) return kvs_fail(KVS_ERR_INVALID_ARG, "trace writer: NULL argument");
    kvs_status s = check_configs(model, cap, KVS_ERR_INVALID_ARG, "trace writer");
    if (s != KVS_OK) return s;
    kvs_trace_writer *w = calloc(1, sizeof *w);
    if (!w) return kvs_fail(KVS_ERR_NOMEM, "trace writer: out of memory");
    w->fd = -1;
    w->h.model = *model;
    w->h.cap = *cap;
    derive_sizes(&w->h);
    /* Normalise the name/settings so the header has exactly the NUL padding the format wants. */
    memset(w->h.model.model_name, 0, KVS_TRACE_NAME_MAX);
    memcpy(w->h.model.model_name, model->model_name, strnlen(model->model_name, KVS_TRACE_NAME_MAX - 1));
    w->shuffle = (cap->flags & KVS_TRACE_FLAG_SHUFFLE) != 0;
    w->lean = (cap->flags & KVS_TRACE_FLAG_QKV) != 0;
    w->plane_blocks = 1;
    w->last_turn = -1;
    const trace_hdr *h = &w->h;
    size_t groups = (size_t)h->L * h->Hkv;
    w->q_bytes = (size_t)h->B * h->G * h->d * h->es;
    w->kv_bytes = (size_t)h->B * h->d * h->es;
    w->lse_n = (size_t)h->B * h->G;
    w->payload_cap = (size_t)group_raw_size(h, h->B);
    w->out_cap = CHUNK_HDR + ZSTD_compressBound(w->payload_cap);
    w->path = strdup(path);
    w->partial = str_concat(path, ".partial");
    w->layer_done = calloc(h->L, 1);
    w->gq = malloc(groups * w->q_bytes);
    w->go = w->lean ? NULL : malloc(groups * w->q_bytes);
    w->gk = malloc(groups * w->kv_bytes);
    w->gv = malloc(groups * w->kv_bytes);
    w->glse = w->lean ? NULL : malloc(groups * w->lse_n * sizeof(float));
    w->tok = malloc((size_t)h->B * sizeof(int32_t));
    w->turn = malloc((size_t)h->B * sizeof(int32_t));
    w->role = malloc(h->B);
    if (!w->path || !w->partial || !w->layer_done || !w->gq || (!w->lean && (!w->go || !w->glse)) || !w->gk ||
        !w->gv || !w->tok || !w->turn || !w->role) {
        kvs_trace_writer_free(w);
        return kvs_fail(KVS_ERR_NOMEM, "%s: cannot allocate the writer's block buffers", path);
    }
    if ((s = size_workers(w, 1)) != KVS_OK) {
        kvs_trace_writer_free(w);
        return s;
    }
    w->fd = open(w->partial, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (w->fd < 0) {
        s = kvs_fail(KVS_ERR_IO, "%s: cannot create: %s", w->partial, strerror(errno));
        kvs_trace_writer_free(w);
        return s;
    }
    w->created = 1;
    uint8_t hbuf[HDR_MAX];
    uint32_t hsize = encode_header(&w->h.model, &w->h.cap, hbuf);
    w->h.header_size = hsize;
    w->h.version = 1;
    if ((s = kvs_write_all(w->fd, hbuf, hsize, w->partial)) != KVS_OK) {
        kvs_trace_writer_free(w);
        return s;
    }
    w->offset = hsize;
    *out = w;
    return KVS_OK;
}

static kvs_status writer_usable(const kvs_trace_writer *w, const char *fn) {
    if (!w) return kvs_fail(KVS_ERR_INVALID_ARG, "%s: NULL writer", fn);
    if (w->closed) return kvs_fail(KVS_ERR_STATE, "%s: %s: writer already closed", w->path, fn);
    if (w->failed) return kvs_fail(KVS_ERR_STATE, "%s: %s: writer failed earlier (I/O or compression)", w->path, fn);
    if (w->kept) return kvs_fail(KVS_ERR_STATE, "%s: %s: writer stopped, its .partial kept", w->path, fn);
    return KVS_OK;
}

kvs_status kvs_trace_writer_begin_position(kvs_trace_writer *w, int32_t token_id, kvs_role role, int32_t turn) {
    kvs_status s = writer_usable(w, "begin_position");
    if (s != KVS_OK) return s;
    if (w->in_position)
        return kvs_fail(KVS_ERR_STATE, "%s: begin_position: position %lld was begun and not ended", w->path,
                        (long long)w->n_positions);
    if (token_id < 0 || token_id >= w->h.model.vocab_size)
        return kvs_fail(KVS_ERR_RANGE, "%s: position %lld: token id %d outside [0, vocab_size = %d)", w->path,
                        (long long)w->n_positions, token_id, w->h.model.vocab_size);
    if (role != KVS_ROLE_PROMPT && role != KVS_ROLE_GENERATED)
        return kvs_fail(KVS_ERR_INVALID_ARG, "%s: position %lld: role = %d is neither prompt (0) nor generated (1)",
                        w->path, (long long)w->n_positions, (int)role);
    if (w->n_positions == 0 ? turn != 0 : (turn != w->last_turn && turn != w->last_turn + 1))
        return kvs_fail(KVS_ERR_INVALID_ARG,
                        "%s: position %lld: turn = %d (turn indices start at 0 and step by 0 or 1; previous %d)",
                        w->path, (long long)w->n_positions, turn, w->last_turn);
    if (turn == w->last_turn && role == KVS_ROLE_PROMPT && w->last_role == KVS_ROLE_GENERATED)
        return kvs_fail(KVS_ERR_INVALID_ARG,
                        "%s: position %lld: prompt position after a generated one within turn %d (role/turn)",
                        w->path, (long long)w->n_positions, turn);
    w->tok[w->blk_n] = token_id;
    w->role[w->blk_n] = (uint8_t)role;
    w->turn[w->blk_n] = turn;
    memset(w->layer_done, 0, w->h.L);
    w->in_position = 1;
    return KVS_OK;
}

kvs_status kvs_trace_writer_put_layer(kvs_trace_writer *w, int layer, const float *q, const float *k,
                                      const float *v, const float *o, const float *lse) {
    kvs_status s = writer_usable(w, "put_layer");
    if (s != KVS_OK) return s;
    if (!w->in_position) return kvs_fail(KVS_ERR_STATE, "%s: put_layer before begin_position", w->path);
    if (layer < 0 || (uint32_t)layer >= w->h.L)
        return kvs_fail(KVS_ERR_RANGE, "%s: put_layer: layer %d outside [0, %u)", w->path, layer, w->h.L);
    if (!q || !k || !v || (!w->lean && (!o || !lse)))
        return kvs_fail(KVS_ERR_INVALID_ARG, "%s: put_layer: NULL array", w->path);
    if (w->layer_done[layer])
        return kvs_fail(KVS_ERR_STATE, "%s: position %lld: layer %d recorded twice", w->path,
                        (long long)w->n_positions, layer);
    const trace_hdr *h = &w->h;
    kvs_dtype dt = (kvs_dtype)h->cap.dtype;
    size_t gd = (size_t)h->G * h->d, pb = (size_t)w->blk_n;
    for (uint32_t kh = 0; kh < h->Hkv; kh++) {
        size_t gi = (size_t)layer * h->Hkv + kh;
        kvs_encode(dt, q + kh * gd, gd, w->gq + gi * w->q_bytes + pb * gd * h->es);
        kvs_encode(dt, k + (size_t)kh * h->d, h->d, w->gk + gi * w->kv_bytes + pb * h->d * h->es);
        kvs_encode(dt, v + (size_t)kh * h->d, h->d, w->gv + gi * w->kv_bytes + pb * h->d * h->es);
        if (w->lean) continue;
        kvs_encode(dt, o + kh * gd, gd, w->go + gi * w->q_bytes + pb * gd * h->es);
        memcpy(w->glse + gi * w->lse_n + pb * h->G, lse + (size_t)kh * h->G, h->G * sizeof(float));
    }
    w->layer_done[layer] = 1;
    return KVS_OK;
}

/* Compresses the shuffled payload src (raw_size bytes) as one zstd frame whose blocks end at every byte plane's
 * end (FORMAT.md "Byte planes as zstd blocks"): zstd keeps one literal entropy table per block, so a plane of
 * sign/exponent bytes (about 6 bits of entropy in fp16 activations) no longer shares its table with a plane of
 * mantissa bytes (8 bits: incompressible). A flush ends the current block without ending the frame, so the
 * result is an ordinary frame that any reader decodes. Returns the frame size, 0 when it would not fit in
 * out_cap (the caller falls back to one-shot compression), or a zstd error code. */
static size_t compress_planes(ZSTD_CCtx *cctx, const uint8_t *src, uint64_t raw_size, const size_t (*arrays)[2],
                              int n_arrays, uint8_t *out, size_t out_cap) {
    size_t r = ZSTD_CCtx_reset(cctx, ZSTD_reset_session_only);
    if (ZSTD_isError(r)) return r;
    if (ZSTD_isError(r = ZSTD_CCtx_setPledgedSrcSize(cctx, raw_size))) return r; /* the frame's content size */
    ZSTD_outBuffer ob = {out, out_cap, 0};
    size_t off = 0, n_planes = 0, plane = 0;
    for (int a = 0; a < n_arrays; a++) n_planes += arrays[a][1];
    for (int a = 0; a < n_arrays; a++)
        for (size_t j = 0; j < arrays[a][1]; j++, plane++) {
            ZSTD_inBuffer ib = {src + off, arrays[a][0], 0};
            off += arrays[a][0];
            ZSTD_EndDirective how = plane + 1 == n_planes ? ZSTD_e_end : ZSTD_e_flush;
            do {
                r = ZSTD_compressStream2(cctx, &ob, &ib, how);
                if (ZSTD_isError(r)) return r;
                if (r != 0 && ob.pos == ob.size) { /* full: abandon this frame, the caller compresses in one go */
                    ZSTD_CCtx_reset(cctx, ZSTD_reset_session_only);
                    return 0;
                }
            } while (r != 0 || ib.pos < ib.size);
        }
    KVS_ASSERT(off == raw_size);
    return ob.pos;
}

/* Compresses one chunk whose raw_size-byte payload is in c->payload (unshuffled) into out + CHUNK_HDR.
 * `arrays` lists the (element count, element size) of the payload's arrays for the shuffle; with
 * `planes` (and the shuffle) each byte plane becomes zstd blocks of its own (compress_planes). Returns the
 * frame size, or a zstd error code (test with ZSTD_isError); sets e->flags and *crc. Touches only c,
 * out and e, so workers run it side by side. */
static size_t compress_chunk(chunk_coder *c, int shuffle, int planes, chunk_entry *e, const size_t (*arrays)[2],
                             int n_arrays, uint8_t *out, size_t out_cap, uint32_t *crc) {
    const uint8_t *src = c->payload;
    e->flags = 0;
    size_t n = 0;
    if (shuffle) {
        size_t off = 0;
        for (int a = 0; a < n_arrays; a++) {
            shuffle_bytes(c->payload + off, c->shuf + off, arrays[a][0], arrays[a][1]);
            off += arrays[a][0] * arrays[a][1];
        }
        KVS_ASSERT(off == e->raw_size);
        src = c->shuf;
        e->flags = 1;
        /* capped at ZSTD_compressBound(raw_size), the most a reader accepts (check_entry_fields) */
        if (planes) n = compress_planes(c->cctx, src, e->raw_size, arrays, n_arrays, out + CHUNK_HDR,
                                        ZSTD_compressBound((size_t)e->raw_size));
        if (ZSTD_isError(n)) return n;
    }
    if (n == 0) n = ZSTD_compress2(c->cctx, out + CHUNK_HDR, out_cap - CHUNK_HDR, src, (size_t)e->raw_size);
    if (!ZSTD_isError(n)) *crc = kvs_crc32(0, out + CHUNK_HDR, n);
    return n;
}

/* Appends a compressed chunk (header space + `comp` frame bytes in out) at the end of the file and to the
 * index. One write per chunk: a kill leaves at most the last chunk torn, which recovery discards. */
static kvs_status append_chunk(kvs_trace_writer *w, chunk_entry *e, uint8_t *out, size_t comp, uint32_t crc) {
    e->comp_size = comp;
    e->offset = w->offset;
    put_chunk_header(out, e, crc);
    kvs_status s = kvs_write_all(w->fd, out, CHUNK_HDR + comp, w->partial);
    if (s != KVS_OK) {
        w->failed = 1;
        return s;
    }
    if (w->n_entries == w->cap_entries) {
        size_t nc = w->cap_entries ? 2 * w->cap_entries : 64;
        chunk_entry *ne = realloc(w->entries, nc * sizeof *ne);
        if (!ne) {
            w->failed = 1;
            return kvs_fail(KVS_ERR_NOMEM, "%s: cannot grow the chunk index", w->path);
        }
        w->entries = ne;
        w->cap_entries = nc;
    }
    w->entries[w->n_entries++] = *e;
    __atomic_store_n(&w->offset, w->offset + CHUNK_HDR + comp, __ATOMIC_RELAXED); /* see kvs_trace_writer_bytes */
    w->total_raw += e->raw_size;
    return KVS_OK;
}

/* One pool run over a wave of group chunks: worker k compresses groups g0 + k, g0 + k + n_workers, ...
 * into slots[g - g0]. */
typedef struct {
    kvs_trace_writer *w;
    size_t g0, n_groups, n_pos;
} wave_job;

static void compress_wave(void *ctx, int worker, int n_workers) {
    const wave_job *j = ctx;
    kvs_trace_writer *w = j->w;
    const trace_hdr *h = &w->h;
    chunk_coder *c = &w->coders[worker];
    size_t n = j->n_pos, gd = (size_t)h->G * h->d;
    size_t qb = n * gd * h->es, kb = n * h->d * h->es;
    const size_t arrays[5][2] = {{n * gd, h->es}, {n * h->d, h->es}, {n * h->d, h->es}, {n * gd, h->es}, {n * h->G, 4}};
    int n_arrays = w->lean ? 3 : 5; /* a lean chunk: q, k, v */
    for (size_t i = (size_t)worker; i < j->n_groups; i += (size_t)n_workers) {
        size_t gi = j->g0 + i;
        uint8_t *p = c->payload;
        memcpy(p, w->gq + gi * w->q_bytes, qb);
        p += qb;
        memcpy(p, w->gk + gi * w->kv_bytes, kb);
        p += kb;
        memcpy(p, w->gv + gi * w->kv_bytes, kb);
        p += kb;
        if (!w->lean) {
            memcpy(p, w->go + gi * w->q_bytes, qb);
            p += qb;
            const float *lse = w->glse + gi * w->lse_n;
            for (size_t r = 0; r < n * h->G; r++) kvs_put_u32(p + 4 * r, kvs_f32_bits(lse[r]));
        }
        chunk_slot *sl = &w->slots[i];
        sl->e = (chunk_entry){.kind = KIND_GROUP, .layer = (uint32_t)(gi / h->Hkv), .kv_head = (uint32_t)(gi % h->Hkv),
                              .n_pos = (uint32_t)n, .block = (uint64_t)w->blk_index, .raw_size = group_raw_size(h, n)};
        size_t z = compress_chunk(c, w->shuffle, w->plane_blocks, &sl->e, arrays, n_arrays, sl->out, w->out_cap, &sl->crc);
        sl->zerr = ZSTD_isError(z) ? z : 0;
        if (!sl->zerr) sl->e.comp_size = z;
    }
}

static kvs_status flush_block(kvs_trace_writer *w) {
    const trace_hdr *h = &w->h;
    size_t n = (size_t)w->blk_n;
    kvs_status s;
    /* tokens chunk first (FORMAT.md chunk order), on the calling thread */
    chunk_coder *c0 = &w->coders[0];
    chunk_entry e = {.kind = KIND_TOKENS, .n_pos = (uint32_t)n, .block = (uint64_t)w->blk_index,
                     .raw_size = tokens_raw_size(n)};
    for (size_t i = 0; i < n; i++) {
        kvs_put_u32(c0->payload + 4 * i, (uint32_t)w->tok[i]);
        c0->payload[4 * n + i] = w->role[i];
        kvs_put_u32(c0->payload + 5 * n + 4 * i, (uint32_t)w->turn[i]);
    }
    const size_t tok_arrays[3][2] = {{n, 4}, {n, 1}, {n, 4}};
    uint32_t crc = 0;
    size_t z = compress_chunk(c0, w->shuffle, w->plane_blocks, &e, tok_arrays, 3, w->slots[0].out, w->out_cap, &crc);
    if (ZSTD_isError(z)) {
        w->failed = 1;
        return kvs_fail(KVS_ERR_COMPRESS, "%s: zstd: %s", w->partial, ZSTD_getErrorName(z));
    }
    if ((s = append_chunk(w, &e, w->slots[0].out, z, crc)) != KVS_OK) return s;
    /* group chunks, layer-major as FORMAT.md orders them, a wave of slots at a time */
    size_t groups = (size_t)h->L * h->Hkv;
    for (size_t g0 = 0; g0 < groups; g0 += (size_t)w->n_slots) {
        wave_job j = {.w = w, .g0 = g0, .n_groups = groups - g0, .n_pos = n};
        if (j.n_groups > (size_t)w->n_slots) j.n_groups = (size_t)w->n_slots;
        kvs_threadpool_run(w->pool, compress_wave, &j);
        for (size_t i = 0; i < j.n_groups; i++) {
            chunk_slot *sl = &w->slots[i];
            if (sl->zerr) {
                w->failed = 1;
                return kvs_fail(KVS_ERR_COMPRESS, "%s: zstd: %s", w->partial, ZSTD_getErrorName(sl->zerr));
            }
            if ((s = append_chunk(w, &sl->e, sl->out, (size_t)sl->e.comp_size, sl->crc)) != KVS_OK) return s;
        }
    }
    w->blk_index++;
    w->blk_n = 0;
    return KVS_OK;
}

kvs_status kvs_trace_writer_set_threadpool(kvs_trace_writer *w, kvs_threadpool *pool) {
    kvs_status s = writer_usable(w, "set_threadpool");
    if (s != KVS_OK) return s;
    if ((s = size_workers(w, kvs_threadpool_size(pool))) != KVS_OK) return s;
    w->pool = pool;
    return KVS_OK;
}

kvs_status kvs_trace_writer_set_plane_blocks(kvs_trace_writer *w, int on) {
    kvs_status s = writer_usable(w, "set_plane_blocks");
    if (s != KVS_OK) return s;
    if (w->n_positions > 0 || w->in_position)
        return kvs_fail(KVS_ERR_STATE, "%s: set_plane_blocks after the first position", w->path);
    w->plane_blocks = on != 0;
    return KVS_OK;
}

kvs_status kvs_trace_writer_end_position(kvs_trace_writer *w) {
    kvs_status s = writer_usable(w, "end_position");
    if (s != KVS_OK) return s;
    if (!w->in_position) return kvs_fail(KVS_ERR_STATE, "%s: end_position without begin_position", w->path);
    for (uint32_t l = 0; l < w->h.L; l++)
        if (!w->layer_done[l])
            return kvs_fail(KVS_ERR_STATE, "%s: position %lld: layer %u was not recorded", w->path,
                            (long long)w->n_positions, l);
    w->in_position = 0;
    w->last_turn = w->turn[w->blk_n];
    w->last_role = w->role[w->blk_n];
    w->n_positions++;
    w->blk_n++;
    if ((uint32_t)w->blk_n == w->h.B) return flush_block(w);
    return KVS_OK;
}

/* fsync the directory holding `path` so the rename survives a crash (best effort: some filesystems
 * refuse fsync on directories, which is not an error for us). */
static void fsync_parent_dir(const char *path) {
    char *dir = strdup(path);
    if (!dir) return;
    char *slash = strrchr(dir, '/');
    const char *d = ".";
    if (slash) {
        if (slash == dir) slash[1] = '\0';
        else *slash = '\0';
        d = dir;
    }
    int fd = open(d, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        (void)fsync(fd);
        close(fd);
    }
    free(dir);
}

/* Writes footer + trailer for `entries` after `footer_offset`, to fd. */
static kvs_status write_footer(int fd, const char *what, const chunk_entry *entries, size_t n_entries,
                               uint64_t n_positions, uint64_t total_raw, uint64_t footer_offset) {
    size_t fsize = FOOTER_FIXED + INDEX_ENTRY * n_entries;
    uint8_t *f = calloc(1, fsize + TRAILER);
    if (!f) return kvs_fail(KVS_ERR_NOMEM, "%s: cannot allocate the footer", what);
    memcpy(f, MAGIC_FOOTER, 4);
    kvs_put_u64(f + 8, n_positions);
    kvs_put_u64(f + 16, n_entries);
    kvs_put_u64(f + 24, total_raw);
    for (size_t i = 0; i < n_entries; i++) put_entry(f + 32 + INDEX_ENTRY * i, &entries[i]);
    kvs_put_u32(f + fsize - 4, kvs_crc32(0, f, fsize - 4));
    uint8_t *t = f + fsize;
    kvs_put_u64(t, footer_offset);
    kvs_put_u64(t + 8, fsize);
    kvs_put_u32(t + 16, kvs_crc32(0, t, 16));
    memcpy(t + 24, MAGIC_END, 8);
    kvs_status s = kvs_write_all(fd, f, fsize + TRAILER, what);
    free(f);
    return s;
}

kvs_status kvs_trace_writer_close(kvs_trace_writer *w) {
    kvs_status s = writer_usable(w, "close");
    if (s != KVS_OK) return s;
    if (w->in_position)
        return kvs_fail(KVS_ERR_STATE, "%s: close: position %lld was begun and not ended", w->path,
                        (long long)w->n_positions);
    if (w->n_positions == 0) return kvs_fail(KVS_ERR_STATE, "%s: close: no positions were recorded", w->path);
    if (w->blk_n > 0 && (s = flush_block(w)) != KVS_OK) return s;
    s = write_footer(w->fd, w->partial, w->entries, w->n_entries, (uint64_t)w->n_positions, w->total_raw, w->offset);
    if (s != KVS_OK) {
        w->failed = 1;
        return s;
    }
    __atomic_store_n(&w->offset, w->offset + FOOTER_FIXED + INDEX_ENTRY * w->n_entries + TRAILER, __ATOMIC_RELAXED);
    if (fsync(w->fd) != 0) {
        w->failed = 1;
        return kvs_fail(KVS_ERR_IO, "%s: fsync failed: %s", w->partial, strerror(errno));
    }
    int rc = close(w->fd);
    w->fd = -1;
    if (rc != 0) {
        w->failed = 1;
        return kvs_fail(KVS_ERR_IO, "%s: close failed: %s", w->partial, strerror(errno));
    }
    if (rename(w->partial, w->path) != 0) {
        w->failed = 1;
        return kvs_fail(KVS_ERR_IO, "%s: cannot rename to %s: %s", w->partial, w->path, strerror(errno));
    }
    fsync_parent_dir(w->path);
    w->closed = 1;
    return KVS_OK;
}

void kvs_trace_writer_free(kvs_trace_writer *w) {
    if (!w) return;
    if (w->fd >= 0) close(w->fd);
    if (w->created && !w->closed && !w->kept) unlink(w->partial); /* abandoned or failed capture leaves nothing */
    free(w->path);
    free(w->partial);
    free(w->layer_done);
    free(w->gq);
    free(w->go);
    free(w->gk);
    free(w->gv);
    free(w->glse);
    free(w->tok);
    free(w->turn);
    free(w->role);
    free_coders(w);
    free(w->entries);
    free(w);
}

/* A capture stopped on request keeps what it recorded as the .partial a killed writer would leave, but with
 * the unfinished block written too (as the shorter last block recovery accepts) and synced, so that
 * `kvsim trace recover` restores every position recorded, not only the full blocks. No footer: a trace
 * under its final name always holds the whole capture that was asked for. */
kvs_status kvs_trace_writer_keep_partial(kvs_trace_writer *w) {
    kvs_status s = writer_usable(w, "keep_partial");
    if (s != KVS_OK) return s;
    if (w->in_position)
        return kvs_fail(KVS_ERR_STATE, "%s: keep_partial: position %lld was begun and not ended", w->path,
                        (long long)w->n_positions);
    if (w->n_positions == 0) return kvs_fail(KVS_ERR_STATE, "%s: keep_partial: no positions were recorded", w->path);
    if (w->blk_n > 0 && (s = flush_block(w)) != KVS_OK) return s;
    if (fsync(w->fd) != 0) {
        w->failed = 1;
        return kvs_fail(KVS_ERR_IO, "%s: fsync failed: %s", w->partial, strerror(errno));
    }
    int rc = close(w->fd);
    w->fd = -1;
    if (rc != 0) {
        w->failed = 1;
        return kvs_fail(KVS_ERR_IO, "%s: close failed: %s", w->partial, strerror(errno));
    }
    w->kept = 1;
    return KVS_OK;
}

int64_t kvs_trace_writer_positions(const kvs_trace_writer *w) { return w ? w->n_positions : 0; }
/* Atomic: progress lines read it from the decoding thread while the CUDA backend's writer thread writes. */
uint64_t kvs_trace_writer_bytes(const kvs_trace_writer *w) { return w ? __atomic_load_n(&w->offset, __ATOMIC_RELAXED) : 0; }

/* ------------------------------------------------------------------------------------------------
 * Reader
 * ---------------------------------------------------------------------------------------------- */

struct kvs_trace {
    char *path;
    int fd;
    uint64_t file_size, footer_offset;
    trace_hdr h;
    kvs_trace_info info;
    chunk_entry *entries; /* [n_chunks], footer order */
    uint64_t n_chunks, nb;
    int64_t *slot_tok;    /* [nb] -> entry index */
    int64_t *slot_grp;    /* [nb][L][Hkv] -> entry index */
    uint32_t blk_cap;     /* positions of the largest block present: min(B, N). Block buffers are sized from it,
                             never from the header's B alone (a 1-position trace may claim B = 65536) */
    int32_t *tokens, *turn_of;
    uint8_t *roles;
    kvs_turn *turns;
};

/* A block as handed out: the public struct first, then the scratch it decodes with (so several threads
 * each with their own block read one kvs_trace concurrently). */
typedef struct {
    kvs_trace_block pub;
    const kvs_trace *owner;
    uint8_t *comp;   /* chunk header + compressed payload */
    uint8_t *raw;    /* decompressed payload */
    uint8_t *tmp;    /* unshuffled array */
    size_t comp_cap, raw_cap;
    ZSTD_DCtx *dctx;
    /* Lean traces (KVS_TRACE_FLAG_QKV): the keys and values of positions [0, hist_n) of (hist_layer, hist_kv)
     * in fp32, to recompute o and lse (recompute_outputs); probs is kvs_attention_group's scratch. */
    int qkv_only;             /* kvs_trace_block_qkv_only: do not recompute */
    int hist_layer, hist_kv;
    int64_t hist_n, hist_cap; /* positions held / allocated */
    float *hist_k, *hist_v;   /* [hist_cap][d] */
    float *probs;             /* [G][hist_cap] */
} block_impl;

static int cmp_entry_offset(const void *a, const void *b) {
    const chunk_entry *x = *(const chunk_entry *const *)a, *y = *(const chunk_entry *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* Expected n_pos of block b. */
static uint32_t block_npos(const kvs_trace *t, uint64_t b) {
    uint64_t first = b * t->h.B, n = (uint64_t)t->info.n_positions - first;
    return (uint32_t)(n < t->h.B ? n : t->h.B);
}

/* Reads chunk `e` (already validated against the index rules) into impl->raw, checking everything. */
static kvs_status read_chunk(const kvs_trace *t, const chunk_entry *e, block_impl *bi) {
    char nm[96];
    chunk_name(nm, sizeof nm, e);
    size_t total = CHUNK_HDR + (size_t)e->comp_size;
    KVS_ASSERT(total <= bi->comp_cap && e->raw_size <= bi->raw_cap);
    kvs_status s = kvs_pread_all(t->fd, bi->comp, total, e->offset, t->path);
    if (s != KVS_OK) return s;
    chunk_entry c;
    if (memcmp(bi->comp, MAGIC_CHUNK, 4) != 0)
        return kvs_fail(KVS_ERR_FORMAT, "%s: %s: no chunk magic at offset %llu", t->path, nm,
                        (unsigned long long)e->offset);
    if ((s = parse_chunk_header(bi->comp, e->offset, t->path, &c)) != KVS_OK) {
        if (s == KVS_ERR_CHECKSUM) return kvs_fail(s, "%s: %s: chunk header checksum mismatch", t->path, nm);
        return s;
    }
    if (c.kind != e->kind || c.flags != e->flags || c.layer != e->layer || c.kv_head != e->kv_head ||
        c.block != e->block || c.n_pos != e->n_pos || c.raw_size != e->raw_size || c.comp_size != e->comp_size)
        return kvs_fail(KVS_ERR_FORMAT, "%s: %s: chunk header disagrees with the footer index", t->path, nm);
    if (kvs_get_u32(bi->comp + 28) != 0)
        return kvs_fail(KVS_ERR_FORMAT, "%s: %s: reserved field is not 0", t->path, nm);
    return check_and_decompress(bi->comp + CHUNK_HDR, kvs_get_u32(bi->comp + 48), e, bi->raw, bi->dctx, t->path);
}

/* Allocates a block_impl with scratch for chunks of up to raw_cap raw bytes. */
static kvs_status block_impl_create(const kvs_trace *t, size_t raw_cap, int with_arrays, block_impl **out) {
    *out = NULL;
    block_impl *bi = calloc(1, sizeof *bi);
    if (!bi) return kvs_fail(KVS_ERR_NOMEM, "%s: cannot allocate a block", t->path);
    const trace_hdr *h = &t->h;
    bi->owner = t;
    bi->raw_cap = raw_cap;
    bi->hist_layer = -1;
    bi->comp_cap = CHUNK_HDR + ZSTD_compressBound(raw_cap);
    bi->comp = malloc(bi->comp_cap);
    bi->raw = malloc(raw_cap);
    bi->tmp = malloc(raw_cap);
    bi->dctx = ZSTD_createDCtx();
    int ok = bi->comp && bi->raw && bi->tmp && bi->dctx;
    if (ok && with_arrays) {
        size_t gd = (size_t)t->blk_cap * h->G * h->d, kd = (size_t)t->blk_cap * h->d;
        bi->pub.group = (int32_t)h->G;
        bi->pub.head_dim = (int32_t)h->d;
        bi->pub.q = malloc(gd * sizeof(float));
        bi->pub.o = malloc(gd * sizeof(float));
        bi->pub.k = malloc(kd * sizeof(float));
        bi->pub.v = malloc(kd * sizeof(float));
        bi->pub.lse = malloc((size_t)t->blk_cap * h->G * sizeof(float));
        ok = bi->pub.q && bi->pub.o && bi->pub.k && bi->pub.v && bi->pub.lse;
    }
    if (!ok) {
        kvs_trace_block_free(&bi->pub);
        return kvs_fail(KVS_ERR_NOMEM, "%s: cannot allocate block buffers (%zu bytes per chunk)", t->path, raw_cap);
    }
    *out = bi;
    return KVS_OK;
}

kvs_status kvs_trace_block_create(const kvs_trace *t, kvs_trace_block **out) {
    *out = NULL;
    if (!t) return kvs_fail(KVS_ERR_INVALID_ARG, "trace block: NULL trace");
    block_impl *bi;
    kvs_status s = block_impl_create(t, (size_t)group_raw_size(&t->h, t->blk_cap), 1, &bi);
    if (s != KVS_OK) return s;
    *out = &bi->pub;
    return KVS_OK;
}

void kvs_trace_block_free(kvs_trace_block *b) {
    if (!b) return;
    block_impl *bi = (block_impl *)b;
    free(bi->comp);
    free(bi->raw);
    free(bi->tmp);
    ZSTD_freeDCtx(bi->dctx);
    free(bi->hist_k);
    free(bi->hist_v);
    free(bi->probs);
    free(b->q);
    free(b->k);
    free(b->v);
    free(b->o);
    free(b->lse);
    free(bi);
}

/* Decodes array bytes `src` (m elements of s bytes, shuffled or not) into `dst` floats. */
static void decode_array(block_impl *bi, const uint8_t *src, size_t m, kvs_dtype dt, int shuffled, float *dst) {
    size_t s = kvs_dtype_size(dt);
    if (shuffled) {
        unshuffle_bytes(src, bi->tmp, m, s);
        src = bi->tmp;
    }
    kvs_decode(dt, src, m, dst);
}

/* Grows a lean-trace block's history to hold n positions (n <= the trace's positions, so the allocation is
 * bounded by data the reader has decoded and checked). */
static kvs_status history_reserve(block_impl *bi, int64_t n) {
    if (n <= bi->hist_cap) return KVS_OK;
    const trace_hdr *h = &bi->owner->h;
    int64_t cap = bi->hist_cap ? bi->hist_cap : 64;
    while (cap < n) cap *= 2;
    if (cap > bi->owner->info.n_positions) cap = bi->owner->info.n_positions;
    size_t kv = (size_t)cap * h->d, pr = (size_t)cap * h->G;
    float *nk = realloc(bi->hist_k, kv * sizeof(float));
    if (nk) bi->hist_k = nk;
    float *nv = nk ? realloc(bi->hist_v, kv * sizeof(float)) : NULL;
    if (nv) bi->hist_v = nv;
    float *np = nv ? realloc(bi->probs, pr * sizeof(float)) : NULL;
    if (!np)
        return kvs_fail(KVS_ERR_NOMEM, "%s: cannot allocate the key/value history of %lld positions to recompute o "
                        "and lse", bi->owner->path, (long long)cap);
    bi->probs = np;
    bi->hist_cap = cap;
    return KVS_OK;
}

/* Reads group chunk (layer, kv_head, block) into bi->raw; *e receives its index entry. */
static kvs_status read_group_chunk(const kvs_trace *t, int layer, int kv_head, int64_t block, block_impl *bi,
                                   const chunk_entry **e) {
    const trace_hdr *h = &t->h;
    *e = &t->entries[t->slot_grp[((uint64_t)block * h->L + (uint64_t)layer) * h->Hkv + (uint64_t)kv_head]];
    return read_chunk(t, *e, bi);
}

/* Lean trace: o and lse of the block in `out` (q, k, v decoded, its k/v rows already in the history, which holds
 * every earlier position) recomputed as FORMAT.md defines them, exact causal attention in fp32 over positions
 * 0..p, or the layer's window p - window < j <= p (kvs_attention_group: one pass over the keys for the G query
 * heads). */
static void recompute_outputs(block_impl *bi, kvs_trace_block *out) {
    const trace_hdr *h = &bi->owner->h;
    size_t G = h->G, d = h->d, win = (size_t)kvs_model_config_window(&h->model, out->layer);
    float *rows[KVS_TRACE_MAX_HEADS];
    double lse[KVS_TRACE_MAX_HEADS];
    for (int32_t i = 0; i < out->n_pos; i++) {
        size_t n = (size_t)out->first_pos + (size_t)i + 1, f = win > 0 && n > win ? n - win : 0;
        n -= f;
        for (size_t g = 0; g < G; g++) rows[g] = bi->probs + g * n;
        kvs_attention_group(out->q + (size_t)i * G * d, G, bi->hist_k + f * d, bi->hist_v + f * d, d, NULL, n, d,
                            bi->owner->h.model.attn_scale, rows, out->o + (size_t)i * G * d, lse);
        for (size_t g = 0; g < G; g++) out->lse[(size_t)i * G + g] = (float)lse[g];
    }
}

kvs_status kvs_trace_read_block(const kvs_trace *t, int layer, int kv_head, int64_t block, kvs_trace_block *out) {
    if (!t || !out) return kvs_fail(KVS_ERR_INVALID_ARG, "read_block: NULL argument");
    block_impl *bi = (block_impl *)out;
    if (bi->owner != t || !out->q)
        return kvs_fail(KVS_ERR_INVALID_ARG, "%s: read_block: block was not created for this trace", t->path);
    if (layer < 0 || (uint32_t)layer >= t->h.L || kv_head < 0 || (uint32_t)kv_head >= t->h.Hkv || block < 0 ||
        (uint64_t)block >= t->nb)
        return kvs_fail(KVS_ERR_RANGE, "%s: read_block: (layer %d, kv head %d, block %lld) outside the trace "
                        "(%u layers, %u kv heads, %llu blocks)", t->path, layer, kv_head, (long long)block, t->h.L,
                        t->h.Hkv, (unsigned long long)t->nb);
    const trace_hdr *h = &t->h;
    size_t gd = (size_t)h->G * h->d;
    kvs_dtype dt = (kvs_dtype)h->cap.dtype;
    int lean = (h->cap.flags & KVS_TRACE_FLAG_QKV) != 0, recompute = lean && !bi->qkv_only;
    int64_t first = block * (int64_t)h->B;
    const chunk_entry *e;
    kvs_status s;
    if (recompute) { /* the keys and values of every earlier position: kept from the last read, else decoded here */
        if (bi->hist_layer != layer || bi->hist_kv != kv_head) {
            bi->hist_layer = layer;
            bi->hist_kv = kv_head;
            bi->hist_n = 0;
        }
        for (int64_t b = bi->hist_n / (int64_t)h->B; b < block; b++) {
            if ((s = read_group_chunk(t, layer, kv_head, b, bi, &e)) != KVS_OK) return s;
            int64_t f = b * (int64_t)h->B;
            if ((s = history_reserve(bi, f + (int64_t)e->n_pos)) != KVS_OK) return s;
            size_t n = e->n_pos;
            const uint8_t *p = bi->raw + n * gd * h->es;
            decode_array(bi, p, n * h->d, dt, e->flags & 1, bi->hist_k + (size_t)f * h->d);
            decode_array(bi, p + n * h->d * h->es, n * h->d, dt, e->flags & 1, bi->hist_v + (size_t)f * h->d);
            bi->hist_n = f + (int64_t)n;
        }
    }
    if ((s = read_group_chunk(t, layer, kv_head, block, bi, &e)) != KVS_OK) return s;
    size_t n = e->n_pos;
    int sh = e->flags & 1;
    const uint8_t *p = bi->raw;
    decode_array(bi, p, n * gd, dt, sh, out->q);
    p += n * gd * h->es;
    decode_array(bi, p, n * h->d, dt, sh, out->k);
    p += n * h->d * h->es;
    decode_array(bi, p, n * h->d, dt, sh, out->v);
    p += n * h->d * h->es;
    out->layer = layer;
    out->kv_head = kv_head;
    out->block = block;
    out->first_pos = first;
    out->n_pos = (int32_t)n;
    out->group = (int32_t)h->G;
    out->head_dim = (int32_t)h->d;
    out->recomputed = lean ? (recompute ? 1 : -1) : 0;
    if (!lean) {
        decode_array(bi, p, n * gd, dt, sh, out->o);
        p += n * gd * h->es;
        decode_array(bi, p, n * h->G, KVS_DTYPE_F32, sh, out->lse);
        return KVS_OK;
    }
    if (!recompute) {
        for (size_t i = 0; i < n * gd; i++) out->o[i] = NAN;
        for (size_t i = 0; i < n * h->G; i++) out->lse[i] = NAN;
        return KVS_OK;
    }
    if ((s = history_reserve(bi, first + (int64_t)n)) != KVS_OK) {
        bi->hist_layer = -1;
        return s;
    }
    memcpy(bi->hist_k + (size_t)first * h->d, out->k, n * h->d * sizeof(float));
    memcpy(bi->hist_v + (size_t)first * h->d, out->v, n * h->d * sizeof(float));
    if (first + (int64_t)n > bi->hist_n) bi->hist_n = first + (int64_t)n;
    recompute_outputs(bi, out);
    return KVS_OK;
}

/* Decodes the n rows of a decompressed tokens chunk (raw: tokens u32[n], roles u8[n], turns u32[n]; byte-shuffled
 * when `shuffled`, unshuffled through tmp, 9n bytes) into tok/role/turn. */
static void decode_token_rows(const uint8_t *raw, int shuffled, size_t n, uint8_t *tmp, int32_t *tok, uint8_t *role,
                              int32_t *turn) {
    const uint8_t *p = raw;
    if (shuffled) { /* unshuffle the three arrays into tmp */
        unshuffle_bytes(p, tmp, n, 4);
        memcpy(tmp + 4 * n, p + 4 * n, n);
        unshuffle_bytes(p + 5 * n, tmp + 5 * n, n, 4);
        p = tmp;
    }
    for (size_t i = 0; i < n; i++) {
        tok[i] = (int32_t)kvs_get_u32(p + 4 * i);
        role[i] = p[4 * n + i];
        turn[i] = (int32_t)kvs_get_u32(p + 5 * n + 4 * i);
    }
}

/* The checks of one position's token row that do not depend on its neighbours: a token id of the vocabulary and a
 * known role. KVS_ERR_FORMAT naming `path` and the position. */
static kvs_status check_token_row(const char *path, uint64_t pos, int32_t tok, uint8_t role, int32_t vocab_size) {
    if (tok < 0 || tok >= vocab_size)
        return kvs_fail(KVS_ERR_FORMAT, "%s: position %llu: token id %d outside [0, vocab_size = %d)", path,
                        (unsigned long long)pos, tok, vocab_size);
    if (role > 1)
        return kvs_fail(KVS_ERR_FORMAT, "%s: position %llu: role %u is neither prompt (0) nor generated (1)", path,
                        (unsigned long long)pos, role);
    return KVS_OK;
}

/* Reads every tokens chunk, validates tokens/roles/turns and derives the turns table. */
static kvs_status load_tokens(kvs_trace *t) {
    uint64_t N = (uint64_t)t->info.n_positions;
    block_impl *bi = NULL;
    kvs_status s = block_impl_create(t, (size_t)tokens_raw_size(t->blk_cap), 0, &bi);
    if (s != KVS_OK) return s;
    t->tokens = malloc(N * sizeof(int32_t));
    t->turn_of = malloc(N * sizeof(int32_t));
    t->roles = malloc(N);
    if (!t->tokens || !t->turn_of || !t->roles) {
        s = kvs_fail(KVS_ERR_NOMEM, "%s: cannot allocate %llu token entries", t->path, (unsigned long long)N);
        goto cleanup;
    }
    for (uint64_t b = 0; b < t->nb; b++) {
        const chunk_entry *e = &t->entries[t->slot_tok[b]];
        KVS_TRY(s = read_chunk(t, e, bi));
        size_t n = e->n_pos;
        uint64_t first = b * t->h.B;
        decode_token_rows(bi->raw, e->flags & 1, n, bi->tmp, t->tokens + first, t->roles + first, t->turn_of + first);
    }
    for (uint64_t i = 0; i < N; i++)
        KVS_TRY(s = check_token_row(t->path, i, t->tokens[i], t->roles[i], t->h.model.vocab_size));
    int64_t n_turns = 0, prompt_len = 0;
    if ((s = kvs_trace_turns_from_roles(t->roles, t->turn_of, (int64_t)N, &t->turns, &n_turns, &prompt_len)) != KVS_OK) {
        s = kvs_fail(s, "%s: %s", t->path, kvs_last_error());
        goto cleanup;
    }
    t->info.n_turns = n_turns;
    t->info.turns = t->turns;
    t->info.prompt_len = prompt_len;
    s = KVS_OK;
cleanup:
    kvs_trace_block_free(&bi->pub);
    return s;
}

/* The turn rules between position i and the one before it (prev_turn -1 and prev_role unused for i = 0): turns
 * start at 0 and step by 0 or 1, and within a turn no prompt position follows a generated one. KVS_ERR_FORMAT. */
static kvs_status turn_step_check(int64_t i, int32_t tu, uint8_t role, int32_t prev_turn, uint8_t prev_role) {
    if (i == 0 ? tu != 0 : (tu != prev_turn && tu != prev_turn + 1))
        return kvs_fail(KVS_ERR_FORMAT, "position %lld: turn index %d does not follow %d (must start at 0 and "
                        "step by 0 or 1)", (long long)i, tu, prev_turn);
    if (i > 0 && tu == prev_turn && role == KVS_ROLE_PROMPT && prev_role == KVS_ROLE_GENERATED)
        return kvs_fail(KVS_ERR_FORMAT, "position %lld: prompt position after a generated one within turn %d",
                        (long long)i, tu);
    return KVS_OK;
}

kvs_status kvs_trace_turns_from_roles(const uint8_t *roles, const int32_t *turn_of, int64_t n, kvs_turn **turns,
                                      int64_t *n_turns, int64_t *prompt_len) {
    *turns = NULL;
    *n_turns = 0;
    if (n < 1) return kvs_fail(KVS_ERR_FORMAT, "turns: no positions");
    int64_t first_generated = n;
    for (int64_t i = 0; i < n; i++) {
        kvs_status st = turn_step_check(i, turn_of[i], roles[i], i ? turn_of[i - 1] : -1, i ? roles[i - 1] : 0);
        if (st != KVS_OK) return st;
        if (roles[i] == KVS_ROLE_GENERATED && first_generated == n) first_generated = i;
    }
    int64_t nt = (int64_t)turn_of[n - 1] + 1; /* <= n: indices step by at most 1 from 0 */
    kvs_turn *t = calloc((size_t)nt, sizeof *t);
    if (!t) return kvs_fail(KVS_ERR_NOMEM, "turns: cannot allocate %lld turns", (long long)nt);
    for (int64_t k = 0; k < nt; k++) t[k].begin = -1;
    for (int64_t i = 0; i < n; i++) {
        kvs_turn *tu = &t[turn_of[i]];
        if (tu->begin < 0) tu->begin = tu->prompt_end = i;
        if (roles[i] == KVS_ROLE_PROMPT) tu->prompt_end = i + 1;
        tu->end = i + 1;
    }
    *turns = t;
    *n_turns = nt;
    if (prompt_len) *prompt_len = first_generated;
    return KVS_OK;
}

kvs_status kvs_trace_open(const char *path, kvs_trace **out) {
    *out = NULL;
    if (!path) return kvs_fail(KVS_ERR_INVALID_ARG, "trace open: NULL path");
    kvs_status s;
    uint8_t *footer = NULL;
    const chunk_entry **sorted = NULL;
    kvs_trace *t = calloc(1, sizeof *t);
    if (!t || !(t->path = strdup(path))) {
        free(t);
        return kvs_fail(KVS_ERR_NOMEM, "%s: out of memory", path);
    }
    /* O_NONBLOCK: opening a FIFO for reading would wait for a writer; it is refused below as not a regular file */
    t->fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (t->fd < 0) {
        if (!strcmp(path, "-") && errno == ENOENT)
            s = kvs_fail(KVS_ERR_IO, "-: no such file (a trace is read from a file: standard input cannot be read "
                                     "twice and out of order)");
        else s = kvs_fail(KVS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        goto cleanup;
    }
    struct stat st;
    if (fstat(t->fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        s = kvs_fail(KVS_ERR_IO, "%s: not a regular file (a trace is read with random access)", path);
        goto cleanup;
    }
    fcntl(t->fd, F_SETFL, fcntl(t->fd, F_GETFL) & ~O_NONBLOCK);
    t->file_size = (uint64_t)st.st_size;
    KVS_TRY(s = read_header(t->fd, t->file_size, path, &t->h));
    const trace_hdr *h = &t->h;

    /* trailer */
    if (t->file_size < (uint64_t)h->header_size + FOOTER_FIXED + TRAILER) {
        s = kvs_fail(KVS_ERR_TRUNCATED, "%s: file (%llu bytes) too short for header + footer + trailer; an "
                     "unfinished capture can be restored with `kvsim trace recover`", path,
                     (unsigned long long)t->file_size);
        goto cleanup;
    }
    uint8_t tr[TRAILER];
    KVS_TRY(s = kvs_pread_all(t->fd, tr, TRAILER, t->file_size - TRAILER, path));
    if (memcmp(tr + 24, MAGIC_END, 8) != 0) {
        s = kvs_fail(KVS_ERR_TRUNCATED, "%s: no trailer at the end of the file (truncated, or an unfinished "
                     "capture: try `kvsim trace recover`)", path);
        goto cleanup;
    }
    if (kvs_crc32(0, tr, 16) != kvs_get_u32(tr + 16)) {
        s = kvs_fail(KVS_ERR_CHECKSUM, "%s: trailer checksum mismatch", path);
        goto cleanup;
    }
    if (kvs_get_u32(tr + 20) != 0) {
        s = kvs_fail(KVS_ERR_FORMAT, "%s: trailer reserved field is not 0", path);
        goto cleanup;
    }
    uint64_t foff = kvs_get_u64(tr), fsize = kvs_get_u64(tr + 8);
    if (foff < h->header_size || foff > t->file_size || fsize > t->file_size - foff ||
        t->file_size - foff - fsize != TRAILER) {
        s = kvs_fail(KVS_ERR_FORMAT, "%s: trailer: footer offset %llu / size %llu do not end 32 bytes before the "
                     "end of the %llu-byte file", path, (unsigned long long)foff, (unsigned long long)fsize,
                     (unsigned long long)t->file_size);
        goto cleanup;
    }
    if (fsize < FOOTER_FIXED || (fsize - FOOTER_FIXED) % INDEX_ENTRY != 0) {
        s = kvs_fail(KVS_ERR_FORMAT, "%s: trailer: footer size %llu is not 40 + 48 * n_chunks", path,
                     (unsigned long long)fsize);
        goto cleanup;
    }
    t->footer_offset = foff;

    /* footer (its size is bounded by the file size, checked above) */
    footer = malloc((size_t)fsize);
    if (!footer) {
        s = kvs_fail(KVS_ERR_NOMEM, "%s: cannot allocate the %llu-byte footer", path, (unsigned long long)fsize);
        goto cleanup;
    }
    KVS_TRY(s = kvs_pread_all(t->fd, footer, (size_t)fsize, foff, path));
    if (memcmp(footer, MAGIC_FOOTER, 4) != 0) {
        s = kvs_fail(KVS_ERR_FORMAT, "%s: footer: bad magic at offset %llu", path, (unsigned long long)foff);
        goto cleanup;
    }
    if (kvs_crc32(0, footer, (size_t)fsize - 4) != kvs_get_u32(footer + fsize - 4)) {
        s = kvs_fail(KVS_ERR_CHECKSUM, "%s: footer checksum mismatch", path);
        goto cleanup;
    }
    if (kvs_get_u32(footer + 4) != 0 || kvs_get_u32(footer + fsize - 8) != 0) {
        s = kvs_fail(KVS_ERR_FORMAT, "%s: footer reserved fields are not 0", path);
        goto cleanup;
    }
    uint64_t N = kvs_get_u64(footer + 8), n_chunks = kvs_get_u64(footer + 16), total_raw = kvs_get_u64(footer + 24);
    if (n_chunks != (fsize - FOOTER_FIXED) / INDEX_ENTRY) {
        s = kvs_fail(KVS_ERR_FORMAT, "%s: footer: n_chunks = %llu but footer size %llu holds %llu entries", path,
                     (unsigned long long)n_chunks, (unsigned long long)fsize,
                     (unsigned long long)((fsize - FOOTER_FIXED) / INDEX_ENTRY));
        goto cleanup;
    }
    uint64_t per_block = (uint64_t)h->L * h->Hkv + 1; /* <= 2^20 + 1 */
    /* N < 2^62 keeps nb * per_block and positions arithmetic far from overflow. */
    uint64_t nb = N >= 1 && N < ((uint64_t)1 << 62) ? (N + h->B - 1) / h->B : 0;
    if (nb == 0 || nb > n_chunks / per_block || nb * per_block != n_chunks) {
        s = kvs_fail(KVS_ERR_FORMAT, "%s: footer: n_positions = %llu and n_chunks = %llu do not agree "
                     "(expected ceil(N / %u) * %llu chunks, N >= 1)", path, (unsigned long long)N,
                     (unsigned long long)n_chunks, h->B, (unsigned long long)per_block);
        goto cleanup;
    }
    t->nb = nb;
    t->n_chunks = n_chunks;
    t->info.n_positions = (int64_t)N;
    t->blk_cap = N < h->B ? (uint32_t)N : h->B;

    /* index entries */
    t->entries = malloc((size_t)n_chunks * sizeof *t->entries);
    t->slot_tok = malloc((size_t)nb * sizeof *t->slot_tok);
    t->slot_grp = malloc((size_t)(nb * (per_block - 1)) * sizeof *t->slot_grp);
    sorted = malloc((size_t)n_chunks * sizeof *sorted);
    if (!t->entries || !t->slot_tok || !t->slot_grp || !sorted) {
        s = kvs_fail(KVS_ERR_NOMEM, "%s: cannot allocate the index of %llu chunks", path, (unsigned long long)n_chunks);
        goto cleanup;
    }
    for (uint64_t b = 0; b < nb; b++) t->slot_tok[b] = -1;
    for (uint64_t i = 0; i < nb * (per_block - 1); i++) t->slot_grp[i] = -1;
    uint64_t sum_raw = 0, sum_comp = 0;
    for (uint64_t i = 0; i < n_chunks; i++) {
        chunk_entry *e = &t->entries[i];
        get_entry(footer + 32 + INDEX_ENTRY * i, e);
        char part[48];
        snprintf(part, sizeof part, "index entry %llu", (unsigned long long)i);
        KVS_TRY(s = check_entry_fields(e, h, path, part));
        char nm[96];
        chunk_name(nm, sizeof nm, e);
        if (e->block >= nb) {
            s = kvs_fail(KVS_ERR_FORMAT, "%s: %s %s: block >= %llu blocks", path, part, nm, (unsigned long long)nb);
            goto cleanup;
        }
        if (e->n_pos != block_npos(t, e->block)) {
            s = kvs_fail(KVS_ERR_FORMAT, "%s: %s %s: n_pos = %u, expected %u", path, part, nm, e->n_pos,
                         block_npos(t, e->block));
            goto cleanup;
        }
        if (e->offset < h->header_size || e->offset > foff || CHUNK_HDR + e->comp_size > foff - e->offset) {
            s = kvs_fail(KVS_ERR_FORMAT, "%s: %s %s: offset %llu + %llu bytes is outside [header end %u, footer "
                         "offset %llu)", path, part, nm, (unsigned long long)e->offset,
                         (unsigned long long)(CHUNK_HDR + e->comp_size), h->header_size, (unsigned long long)foff);
            goto cleanup;
        }
        int64_t *slot = e->kind == KIND_TOKENS ? &t->slot_tok[e->block]
                                               : &t->slot_grp[(e->block * h->L + e->layer) * h->Hkv + e->kv_head];
        if (*slot >= 0) {
            s = kvs_fail(KVS_ERR_FORMAT, "%s: %s %s appears twice in the index", path, part, nm);
            goto cleanup;
        }
        *slot = (int64_t)i;
        sorted[i] = e;
        sum_raw += e->raw_size; /* each < 2^40, n_chunks < 2^58: no overflow in practice; checked below */
        sum_comp += e->comp_size;
    }
    /* Every slot is filled: n_chunks equals the slot count and no slot was filled twice. */
    if (sum_raw != total_raw) {
        s = kvs_fail(KVS_ERR_FORMAT, "%s: footer: total raw bytes %llu, but the index sums to %llu", path,
                     (unsigned long long)total_raw, (unsigned long long)sum_raw);
        goto cleanup;
    }
    /* Chunks may not overlap (a writer never produces that; it also bounds the total by the file size). */
    qsort(sorted, (size_t)n_chunks, sizeof *sorted, cmp_entry_offset);
    for (uint64_t i = 1; i < n_chunks; i++) {
        if (sorted[i - 1]->offset + CHUNK_HDR + sorted[i - 1]->comp_size > sorted[i]->offset) {
            char a[96], b[96];
            chunk_name(a, sizeof a, sorted[i - 1]);
            chunk_name(b, sizeof b, sorted[i]);
            s = kvs_fail(KVS_ERR_FORMAT, "%s: index: %s overlaps %s", path, a, b);
            goto cleanup;
        }
    }
    t->info.model = h->model;
    t->info.capture = h->cap;
    t->info.version = h->version;
    t->info.n_blocks = (int64_t)nb;
    t->info.n_chunks = (int64_t)n_chunks;
    t->info.raw_bytes = sum_raw;
    t->info.compressed_bytes = sum_comp;
    t->info.file_bytes = t->file_size;
    KVS_TRY(s = load_tokens(t));
    s = KVS_OK;
cleanup:
    free(footer);
    free(sorted);
    if (s != KVS_OK) {
        kvs_trace_close(t);
        return s;
    }
    *out = t;
    return KVS_OK;
}

void kvs_trace_close(kvs_trace *t) {
    if (!t) return;
    if (t->fd >= 0) close(t->fd);
    free(t->path);
    free(t->entries);
    free(t->slot_tok);
    free(t->slot_grp);
    free(t->tokens);
    free(t->turn_of);
    free(t->roles);
    free(t->turns);
    free(t);
}

const kvs_trace_info *kvs_trace_info_get(const kvs_trace *t) { return &t->info; }
const int32_t *kvs_trace_tokens(const kvs_trace *t) { return t->tokens; }
const uint8_t *kvs_trace_roles(const kvs_trace *t) { return t->roles; }
const int32_t *kvs_trace_turn_of(const kvs_trace *t) { return t->turn_of; }

kvs_status kvs_trace_check_chunks(const kvs_trace *t) {
    if (!t) return kvs_fail(KVS_ERR_INVALID_ARG, "check_chunks: NULL trace");
    block_impl *bi;
    kvs_status s = block_impl_create(t, (size_t)group_raw_size(&t->h, t->blk_cap), 0, &bi);
    if (s != KVS_OK) return s;
    for (uint64_t i = 0; i < t->n_chunks && s == KVS_OK; i++) s = read_chunk(t, &t->entries[i], bi);
    kvs_trace_block_free(&bi->pub);
    return s;
}

/* ---- streaming ---- */

struct kvs_trace_stream {
    const kvs_trace *t;
    int layer, kv_head;
    int64_t next;
    kvs_trace_block *blk;
};

kvs_status kvs_trace_stream_open(const kvs_trace *t, int layer, int kv_head, kvs_trace_stream **out) {
    *out = NULL;
    if (!t) return kvs_fail(KVS_ERR_INVALID_ARG, "stream_open: NULL trace");
    if (layer < 0 || (uint32_t)layer >= t->h.L || kv_head < 0 || (uint32_t)kv_head >= t->h.Hkv)
        return kvs_fail(KVS_ERR_RANGE, "%s: stream_open: (layer %d, kv head %d) outside the trace (%u layers, %u kv "
                        "heads)", t->path, layer, kv_head, t->h.L, t->h.Hkv);
    kvs_trace_stream *s = calloc(1, sizeof *s);
    if (!s) return kvs_fail(KVS_ERR_NOMEM, "%s: cannot allocate a stream", t->path);
    kvs_status st = kvs_trace_block_create(t, &s->blk);
    if (st != KVS_OK) {
        free(s);
        return st;
    }
    s->t = t;
    s->layer = layer;
    s->kv_head = kv_head;
    *out = s;
    return KVS_OK;
}

kvs_status kvs_trace_stream_next(kvs_trace_stream *s, const kvs_trace_block **blk) {
    *blk = NULL;
    if ((uint64_t)s->next >= s->t->nb) return KVS_ERR_END;
    kvs_status st = kvs_trace_read_block(s->t, s->layer, s->kv_head, s->next, s->blk);
    if (st != KVS_OK) return st;
    s->next++;
    *blk = s->blk;
    return KVS_OK;
}

void kvs_trace_block_qkv_only(kvs_trace_block *b) {
    if (b) ((block_impl *)b)->qkv_only = 1;
}
void kvs_trace_stream_qkv_only(kvs_trace_stream *s) {
    if (s) kvs_trace_block_qkv_only(s->blk);
}

void kvs_trace_stream_free(kvs_trace_stream *s) {
    if (!s) return;
    kvs_trace_block_free(s->blk);
    free(s);
}

/* ------------------------------------------------------------------------------------------------
 * Recovery (FORMAT.md "Writing, killing and recovering")
 * ---------------------------------------------------------------------------------------------- */

/* Reads the trailer and footer of a complete trace, trusting only what its checksums confirm: *footer_off
 * the footer's offset (0 when the trailer is not intact), *footer_n the footer's position count (-1 when the
 * footer is not intact). Never fails: recovery uses whatever checks out. */
/* What recovery carries from one tokens chunk to the next to check positions as the reader will: the position the
 * next chunk starts at, the last position's turn and role, and scratch for a chunk's rows. */
typedef struct {
    uint64_t next_pos;
    int32_t last_turn;
    uint8_t last_role;
    size_t cap;
    int32_t *tok, *turn;
    uint8_t *role, *tmp;
} token_rows;

static void token_rows_free(token_rows *r) {
    free(r->tok);
    free(r->turn);
    free(r->role);
    free(r->tmp);
}

/* The rows of a decompressed tokens chunk, checked with the reader's own rules (check_token_row, turn_step_check),
 * continuing from the previous tokens chunk: the rows kvs_trace_open() would refuse make the chunk bad. */
static kvs_status recover_check_tokens(const chunk_entry *e, const uint8_t *raw, const trace_hdr *h, const char *path,
                                       token_rows *r) {
    size_t n = e->n_pos;
    if (n > r->cap) {
        free(r->tok), free(r->turn), free(r->role), free(r->tmp);
        r->tok = malloc(n * sizeof *r->tok);
        r->turn = malloc(n * sizeof *r->turn);
        r->role = malloc(n);
        r->tmp = malloc((size_t)tokens_raw_size(n));
        r->cap = r->tok && r->turn && r->role && r->tmp ? n : 0;
        if (!r->cap) return kvs_fail(KVS_ERR_NOMEM, "%s: out of memory", path);
    }
    decode_token_rows(raw, e->flags & 1, n, r->tmp, r->tok, r->role, r->turn);
    for (size_t i = 0; i < n; i++) {
        uint64_t pos = r->next_pos + i;
        kvs_status st = check_token_row(path, pos, r->tok[i], r->role[i], h->model.vocab_size);
        if (st == KVS_OK) st = turn_step_check((int64_t)pos, r->turn[i], r->role[i], r->last_turn, r->last_role);
        if (st != KVS_OK) return st;
        r->last_turn = r->turn[i];
        r->last_role = r->role[i];
    }
    r->next_pos += n;
    return KVS_OK;
}

static void recover_read_footer(int fd, uint64_t size, const trace_hdr *h, const char *path, uint64_t *footer_off,
                                int64_t *footer_n) {
    *footer_off = 0;
    *footer_n = -1;
    uint8_t tr[TRAILER];
    if (size < (uint64_t)h->header_size + FOOTER_FIXED + TRAILER) return;
    if (kvs_pread_all(fd, tr, TRAILER, size - TRAILER, path) != KVS_OK) return;
    if (memcmp(tr + 24, MAGIC_END, 8) != 0 || kvs_crc32(0, tr, 16) != kvs_get_u32(tr + 16)) return;
    uint64_t foff = kvs_get_u64(tr), fsize = kvs_get_u64(tr + 8);
    if (foff < h->header_size || foff > size || fsize > size - foff || size - foff - fsize != TRAILER ||
        fsize < FOOTER_FIXED)
        return;
    *footer_off = foff;
    uint8_t *f = malloc((size_t)fsize); /* bounded by the file size, checked above */
    if (!f) return;
    if (kvs_pread_all(fd, f, (size_t)fsize, foff, path) == KVS_OK && memcmp(f, MAGIC_FOOTER, 4) == 0 &&
        kvs_crc32(0, f, (size_t)fsize - 4) == kvs_get_u32(f + fsize - 4) && kvs_get_u64(f + 8) <= (uint64_t)INT64_MAX)
        *footer_n = (int64_t)kvs_get_u64(f + 8);
    free(f);
}

/* End position (b·B + n_pos) of a chunk, 0 for a block number too large to be real. */
static uint64_t chunk_end_pos(const chunk_entry *e, const trace_hdr *h) {
    if (e->block > ((uint64_t)INT64_MAX / 2) / h->B) return 0;
    return e->block * h->B + e->n_pos;
}

/* Past a bad chunk: the largest end position of any readable chunk header in [from, end) (a "KVCK" magic
 * whose header checksum and fields check out; a false match needs a 32-bit CRC collision), found by a
 * sliding search: chunk lengths past a bad chunk cannot be trusted. */
static uint64_t recover_scan_rest(int fd, uint64_t from, uint64_t end, const trace_hdr *h, const char *path) {
    enum { WIN = 1 << 20 };
    uint8_t *buf = malloc(WIN);
    uint64_t max_end = 0;
    if (!buf) return 0;
    for (uint64_t off = from; off < end && end - off >= CHUNK_HDR;) {
        size_t want = end - off < WIN ? (size_t)(end - off) : (size_t)WIN;
        if (kvs_pread_all(fd, buf, want, off, path) != KVS_OK) break;
        size_t last = want - CHUNK_HDR; /* headers may start at [0, last] in this window */
        for (size_t j = 0; j <= last;) {
            const uint8_t *p = memmem(buf + j, want - j, MAGIC_CHUNK, 4);
            if (!p || (size_t)(p - buf) > last) break;
            j = (size_t)(p - buf);
            chunk_entry e;
            if (parse_chunk_header(buf + j, off + j, path, &e) == KVS_OK &&
                check_entry_fields(&e, h, path, "recovery") == KVS_OK && chunk_end_pos(&e, h) > max_end)
                max_end = chunk_end_pos(&e, h);
            j++;
        }
        if (want < (size_t)WIN) break;
        off += last + 1; /* the next window re-reads the last 55 bytes: a header may straddle the boundary */
    }
    free(buf);
    kvs_clear_error();
    return max_end;
}

/* Name of the j-th chunk of block b in file order (0: the tokens chunk, then layer-major group chunks). */
static void expected_chunk_name(char *buf, size_t n, const trace_hdr *h, uint64_t b, size_t j) {
    chunk_entry e = {.kind = j == 0 ? KIND_TOKENS : KIND_GROUP, .block = b};
    if (j > 0) e.layer = (uint32_t)((j - 1) / h->Hkv), e.kv_head = (uint32_t)((j - 1) % h->Hkv);
    chunk_name(buf, n, &e);
}

/* Whether e is the j-th chunk of block b; n_pos: the block's position count (its tokens chunk's), 0 for j = 0. */
static int is_expected_chunk(const chunk_entry *e, const trace_hdr *h, uint64_t b, size_t j, uint32_t n_pos) {
    if (e->block != b) return 0;
    if (j == 0) return e->kind == KIND_TOKENS;
    return e->kind == KIND_GROUP && e->n_pos == n_pos && e->layer == (j - 1) / h->Hkv && e->kv_head == (j - 1) % h->Hkv;
}

kvs_status kvs_trace_recover(const char *in_path, const char *out_path, int64_t *recovered_positions) {
    kvs_trace_recovery rep;
    kvs_status s = kvs_trace_recover_with_report(in_path, out_path, &rep);
    if (recovered_positions) *recovered_positions = s == KVS_OK ? rep.positions : 0;
    return s;
}

kvs_status kvs_trace_recover_with_report(const char *in_path, const char *out_path, kvs_trace_recovery *rep) {
    kvs_trace_recovery local;
    kvs_trace_recovery *r = rep ? rep : &local;
    memset(r, 0, sizeof *r);
    r->bad_offset = -1;
    if (!in_path || !out_path) return kvs_fail(KVS_ERR_INVALID_ARG, "recover: NULL path");
    kvs_status s = KVS_OK;
    chunk_entry *found = NULL;
    size_t n_found = 0, cap_found = 0;
    uint8_t *hbuf = NULL, *cbuf = NULL, *raw = NULL;
    size_t cbuf_cap = 0, raw_cap = 0;
    token_rows rows = {0}; /* the tokens chunks' rows, checked as the reader will */
    kvs_out *out = NULL;
    ZSTD_DCtx *dctx = NULL;
    int fd = open(in_path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return kvs_fail(KVS_ERR_IO, "%s: cannot open: %s", in_path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        s = kvs_fail(KVS_ERR_IO, "%s: not a regular file", in_path);
        goto cleanup;
    }
    uint64_t size = (uint64_t)st.st_size;
    trace_hdr h;
    s = read_header(fd, size, in_path, &h);
    if (s == KVS_ERR_IO) goto cleanup;
    if (s != KVS_OK) { /* the contract: no valid header is a format error, whatever the cause */
        char detail[1024];
        snprintf(detail, sizeof detail, "%s", kvs_last_error());
        s = kvs_fail(KVS_ERR_FORMAT, "%s (no valid trace header: nothing can be recovered)", detail);
        goto cleanup;
    }
    /* The decompression scratch grows with the chunks actually found, each bounded by its payload's size
     * (check_entry_fields): sized from the header's block alone, a header-only file claiming 65536 positions
     * per block of 1024 heads of 1024 dims asked for 550 GB before reading any chunk. */
    hbuf = malloc(h.header_size);
    dctx = ZSTD_createDCtx();
    if (!hbuf || !dctx) {
        s = kvs_fail(KVS_ERR_NOMEM, "%s: out of memory", in_path);
        goto cleanup;
    }
    KVS_TRY(s = kvs_pread_all(fd, hbuf, h.header_size, 0, in_path));
    uint64_t footer_off;
    int64_t footer_n;
    recover_read_footer(fd, size, &h, in_path, &footer_off, &footer_n);
    uint64_t data_end = footer_off ? footer_off : size; /* where the chunks end */

    /* Scan chunks until the end of the chunk data, a footer, a chunk cut off by the end of the file (torn:
     * what a killed writer leaves) or the first chunk that fails a check (bad: corruption). */
    int bad = 0, at_footer = footer_off != 0;
    char torn[240] = "";
    uint64_t off = h.header_size;
    while (off < data_end) {
        uint8_t ch[CHUNK_HDR];
        uint64_t remain = data_end - off;
        size_t got = remain < CHUNK_HDR ? (size_t)remain : CHUNK_HDR;
        chunk_entry e;
        int have_entry = 0;
        if (kvs_pread_all(fd, ch, got, off, in_path) != KVS_OK) {
            bad = 1;
        } else if (got >= 4 && memcmp(ch, MAGIC_FOOTER, 4) == 0) {
            at_footer = 1; /* the footer of a complete trace (its trailer is damaged): the chunks end here */
            break;
        } else if (got < CHUNK_HDR) {
            snprintf(torn, sizeof torn, "a chunk header cut off by the end of the file at offset %llu (%zu of %u bytes)",
                     (unsigned long long)off, got, CHUNK_HDR);
            break;
        } else if (parse_chunk_header(ch, off, in_path, &e) != KVS_OK) {
            bad = 1;
        } else if (check_entry_fields(&e, &h, in_path, "recovery") != KVS_OK) {
            have_entry = 1;
            bad = 1;
        } else if ((have_entry = 1) && kvs_get_u32(ch + 28) != 0) {
            char nm[96];
            chunk_name(nm, sizeof nm, &e);
            kvs_fail(KVS_ERR_FORMAT, "%s: %s: reserved field is not 0", in_path, nm);
            bad = 1;
        } else if (e.comp_size > remain - CHUNK_HDR) {
            char nm[96];
            chunk_name(nm, sizeof nm, &e);
            if (footer_off) { /* a complete trace: the chunk overlaps its footer, so it is damaged, not torn */
                kvs_fail(KVS_ERR_FORMAT, "%s: %s: its %llu payload bytes run into the footer at offset %llu", in_path,
                         nm, (unsigned long long)e.comp_size, (unsigned long long)footer_off);
                bad = 1;
            } else {
                snprintf(torn, sizeof torn, "%s at offset %llu, cut off by the end of the file (%llu of %llu payload "
                         "bytes)", nm, (unsigned long long)off, (unsigned long long)(remain - CHUNK_HDR),
                         (unsigned long long)e.comp_size);
                break;
            }
        } else {
            if (e.comp_size > cbuf_cap) {
                uint8_t *nb = realloc(cbuf, (size_t)e.comp_size);
                if (!nb) {
                    s = kvs_fail(KVS_ERR_NOMEM, "%s: out of memory", in_path);
                    goto cleanup;
                }
                cbuf = nb;
                cbuf_cap = (size_t)e.comp_size;
            }
            if (e.raw_size > raw_cap) {
                uint8_t *nr = realloc(raw, (size_t)e.raw_size);
                if (!nr) {
                    s = kvs_fail(KVS_ERR_NOMEM, "%s: cannot allocate %llu bytes for a chunk", in_path,
                                 (unsigned long long)e.raw_size);
                    goto cleanup;
                }
                raw = nr;
                raw_cap = (size_t)e.raw_size;
            }
            if (kvs_pread_all(fd, cbuf, (size_t)e.comp_size, off + CHUNK_HDR, in_path) != KVS_OK ||
                check_and_decompress(cbuf, kvs_get_u32(ch + 48), &e, raw, dctx, in_path) != KVS_OK)
                bad = 1;
            else if (e.kind == KIND_TOKENS && recover_check_tokens(&e, raw, &h, in_path, &rows) != KVS_OK)
                bad = 1; /* rows the reader would refuse: the recovered trace must open, so it ends before them */
        }
        if (bad) { /* the check's message without the "IN: " and "<chunk>: " prefixes the report prints apart */
            r->bad_offset = (int64_t)off;
            if (have_entry) chunk_name(r->bad_chunk, sizeof r->bad_chunk, &e);
            const char *why = kvs_last_error();
            size_t pl = strlen(in_path), cl = strlen(r->bad_chunk);
            if (!strncmp(why, in_path, pl) && !strncmp(why + pl, ": ", 2)) why += pl + 2;
            if (cl && !strncmp(why, r->bad_chunk, cl) && !strncmp(why + cl, ": ", 2)) why += cl + 2;
            snprintf(r->bad_error, sizeof r->bad_error, "%s", why);
            break;
        }
        if (n_found == cap_found) {
            size_t nc = cap_found ? 2 * cap_found : 256;
            chunk_entry *nf = realloc(found, nc * sizeof *nf);
            if (!nf) {
                s = kvs_fail(KVS_ERR_NOMEM, "%s: out of memory", in_path);
                goto cleanup;
            }
            found = nf;
            cap_found = nc;
        }
        found[n_found++] = e;
        off += CHUNK_HDR + e.comp_size;
    }
    kvs_clear_error();

    /* Keep the longest prefix of complete blocks: block b needs its tokens chunk and all L*Hkv group chunks,
     * all with the same n_pos; only the last kept block may be partial. Chunks are appended block by block,
     * so block b's chunks are the next per_block found chunks in canonical order. What stops the prefix
     * short of the found chunks is an unfinished last block (a killed writer: clean) or a break in that
     * order (partial). */
    size_t per_block = (size_t)h.L * h.Hkv + 1;
    size_t n_kept = 0;
    uint64_t N = 0, total_raw = 0, b = 0;
    int broken = 0;
    char tail[240] = "";
    for (;; b++) {
        size_t base = (size_t)b * per_block;
        if (base >= n_found) break;
        const chunk_entry *blk = &found[base];
        size_t have = n_found - base < per_block ? n_found - base : per_block, j = 0;
        for (; j < have; j++)
            if (!is_expected_chunk(&blk[j], &h, b, j, blk[0].n_pos)) break;
        if (j < have) { /* out of order, a wrong block number or position count */
            char want[96], saw[96];
            expected_chunk_name(want, sizeof want, &h, b, j);
            chunk_name(saw, sizeof saw, &blk[j]);
            broken = 1;
            r->bad_offset = (int64_t)blk[j].offset;
            snprintf(r->bad_chunk, sizeof r->bad_chunk, "%s", saw);
            if (j > 0 && blk[j].kind == KIND_GROUP && blk[j].block == b && blk[j].n_pos != blk[0].n_pos)
                snprintf(r->bad_error, sizeof r->bad_error, "it holds %u positions, its block's tokens chunk %u",
                         blk[j].n_pos, blk[0].n_pos);
            else
                snprintf(r->bad_error, sizeof r->bad_error, "chunks out of order: expected the %s here", want);
            break;
        }
        if (have < per_block) { /* the chunks of an unfinished last block: what a writer killed mid-block leaves */
            if (at_footer || bad) { /* not an unfinished tail: a complete trace lacks chunks, or a bad one follows */
                char want[96];
                expected_chunk_name(want, sizeof want, &h, b, have);
                broken = !bad;
                if (broken) {
                    r->bad_offset = (int64_t)(blk[have - 1].offset + CHUNK_HDR + blk[have - 1].comp_size);
                    snprintf(r->bad_error, sizeof r->bad_error, "block %llu lacks its %s (the file's footer follows)",
                             (unsigned long long)b, want);
                }
            } else {
                snprintf(tail, sizeof tail, "the unfinished block %llu (positions %llu..%llu: %zu of %zu chunks written)",
                         (unsigned long long)b, (unsigned long long)(b * h.B),
                         (unsigned long long)(b * h.B + blk[0].n_pos - 1), have, per_block);
            }
            break;
        }
        n_kept += per_block;
        N += blk[0].n_pos;
        for (size_t k = 0; k < per_block; k++) total_raw += blk[k].raw_size;
        if (blk[0].n_pos < h.B) { /* a partial block ends the trace */
            b++;
            if (base + per_block < n_found) {
                char saw[96];
                chunk_name(saw, sizeof saw, &found[base + per_block]);
                broken = 1;
                r->bad_offset = (int64_t)found[base + per_block].offset;
                snprintf(r->bad_chunk, sizeof r->bad_chunk, "%s", saw);
                snprintf(r->bad_error, sizeof r->bad_error, "block %llu holds only %u of %u positions, so it must be "
                         "the last, but this chunk follows it", (unsigned long long)(b - 1), blk[0].n_pos, h.B);
            }
            break;
        }
    }

    /* What IN holds beyond the recovered positions. */
    uint64_t max_end = N;
    for (size_t i = 0; i < n_found; i++)
        if (chunk_end_pos(&found[i], &h) > max_end) max_end = chunk_end_pos(&found[i], &h);
    if (bad) {
        uint64_t rest = recover_scan_rest(fd, (uint64_t)r->bad_offset, data_end, &h, in_path);
        if (rest > max_end) max_end = rest;
    }
    if (footer_n > 0 && (uint64_t)footer_n > max_end) max_end = (uint64_t)footer_n;
    r->positions = (int64_t)N;
    r->blocks = (int64_t)(n_kept / per_block);
    r->input_positions = (int64_t)max_end;
    r->lost_positions = (int64_t)(max_end - N);
    r->lost_blocks = (int64_t)((max_end + h.B - 1) / h.B) - r->blocks;
    r->partial = bad || broken;
    if (r->partial) {
        r->dropped_bytes = data_end > (uint64_t)r->bad_offset ? data_end - (uint64_t)r->bad_offset : 0;
    } else {
        r->bad_offset = -1;
        snprintf(r->tail, sizeof r->tail, "%s%s%s", tail, tail[0] && torn[0] ? ", then " : "", torn);
    }
    if (N == 0) {
        if (r->partial)
            s = kvs_fail(KVS_ERR_TRUNCATED, "%s: no complete block of positions to recover (%zu valid chunks found; "
                         "the first bad chunk%s%s at offset %lld: %s)", in_path, n_found, r->bad_chunk[0] ? ", " : "",
                         r->bad_chunk, (long long)r->bad_offset, r->bad_error);
        else
            s = kvs_fail(KVS_ERR_TRUNCATED, "%s: no complete block of positions to recover (%zu valid chunks found)",
                         in_path, n_found);
        goto cleanup;
    }

    /* Write header + kept chunks (byte for byte) + a new footer/trailer to OUT (common/kvs_out.h: via a
     * temporary file beside the target, renamed when complete). */
    KVS_TRY(s = kvs_out_open(out_path, &out));
    KVS_TRY(s = kvs_out_write(out, hbuf, h.header_size));
    uint64_t woff = h.header_size;
    for (size_t i = 0; i < n_kept; i++) {
        chunk_entry *e = &found[i];
        size_t len = CHUNK_HDR + (size_t)e->comp_size;
        if (len > cbuf_cap) {
            uint8_t *nb = realloc(cbuf, len);
            if (!nb) {
                s = kvs_fail(KVS_ERR_NOMEM, "out of memory");
                goto cleanup;
            }
            cbuf = nb;
            cbuf_cap = len;
        }
        KVS_TRY(s = kvs_pread_all(fd, cbuf, len, e->offset, in_path));
        KVS_TRY(s = kvs_out_write(out, cbuf, len));
        e->offset = woff;
        woff += len;
    }
    KVS_TRY(s = write_footer(kvs_out_fd(out), kvs_out_name(out), found, n_kept, N, total_raw, woff));
    s = kvs_out_commit(out);
    out = NULL;
cleanup:
    kvs_out_abort(out);
    close(fd);
    free(found);
    free(hbuf);
    free(cbuf);
    free(raw);
    token_rows_free(&rows);
    ZSTD_freeDCtx(dctx);
    return s;
}

/* ---- content hash --------------------------------------------------------------------------------- */

/* The file the handle opened, read through its own descriptor (a path renamed or replaced since the open does not
 * change the answer). */
kvs_status kvs_trace_content_sha256(const kvs_trace *t, char out[65]) {
    kvs_sha256_ctx c;
    uint8_t buf[1 << 16];
    kvs_sha256_init(&c);
    for (uint64_t off = 0; off < t->file_size;) {
        size_t want = t->file_size - off < sizeof buf ? (size_t)(t->file_size - off) : sizeof buf;
        ssize_t got = pread(t->fd, buf, want, (off_t)off);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0)
            return kvs_fail(KVS_ERR_IO, "%s: cannot read for its content hash: %s", t->path,
                            got < 0 ? strerror(errno) : "unexpected end of file");
        kvs_sha256_update(&c, buf, (size_t)got);
        off += (uint64_t)got;
    }
    kvs_sha256_final_hex(&c, out);
    return KVS_OK;
}
