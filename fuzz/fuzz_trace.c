/* fuzz_trace.c — libFuzzer harness of the trace reader (trace/trace.h, trace/FORMAT.md): open and validate,
 * check every chunk, stream and randomly access blocks, and recover (`kvsim trace recover`), on the input as
 * it is and on a copy whose checksums are recomputed wherever the structure lets them be found, so that
 * mutations reach the checks behind the CRCs (header fields, the index, chunk headers, zstd frames, tokens
 * and turns) instead of stopping at the first checksum. Seeds: fuzz/corpus/trace (small real captures).
 */
#include "fuzz.h"

#include "../common/kvs.h"
#include "../trace/trace.h"

#define HDR_FIXED 152u
#define CHUNK_HDR 56u
#define TRAILER 32u

/* Recomputes, in place, the header CRC, each chunk's payload and header CRCs (walking the chunks from the
 * header by their comp_size), the footer CRC and the trailer CRC, wherever the bytes say where they are. */
static void fix_checksums(uint8_t *p, size_t n) {
    if (n < HDR_FIXED) return;
    uint32_t hs = kvs_get_u32(p + 12);
    if (hs < HDR_FIXED || hs > n) return;
    kvs_put_u32(p + hs - 4, kvs_crc32(0, p, hs - 4));
    uint64_t data_end = n, foff = 0, fsize = 0;
    if (n >= (size_t)hs + TRAILER + 40 && memcmp(p + n - 8, "KVSTEND", 8) == 0) {
        foff = kvs_get_u64(p + n - TRAILER);
        fsize = kvs_get_u64(p + n - TRAILER + 8);
        if (foff >= hs && foff <= n - TRAILER && fsize >= 8 && fsize <= n - TRAILER - foff) data_end = foff;
        else foff = fsize = 0;
    }
    for (uint64_t off = hs; data_end - off >= CHUNK_HDR && memcmp(p + off, "KVCK", 4) == 0;) {
        uint64_t comp = kvs_get_u64(p + off + 40);
        int whole = comp <= data_end - off - CHUNK_HDR;
        if (whole) kvs_put_u32(p + off + 48, kvs_crc32(0, p + off + CHUNK_HDR, (size_t)comp));
        kvs_put_u32(p + off + 52, kvs_crc32(0, p + off, 52));
        if (!whole) break;
        off += CHUNK_HDR + comp;
    }
    if (fsize) {
        kvs_put_u32(p + foff + fsize - 4, kvs_crc32(0, p + foff, (size_t)fsize - 4));
        kvs_put_u32(p + n - TRAILER + 16, kvs_crc32(0, p + n - TRAILER, 16));
    }
}

/* Everything a reader does with an open trace, bounded so one input stays fast. */
static void read_everything(const kvs_trace *t) {
    const kvs_trace_info *in = kvs_trace_info_get(t);
    const int32_t *tok = kvs_trace_tokens(t);
    /* touch every value the reader hands out (unsigned: wrapping sums of any ids are defined) */
    volatile uint32_t sink = 0;
    for (int64_t i = 0; i < in->n_positions; i++)
        sink += (uint32_t)tok[i] + kvs_trace_roles(t)[i] + (uint32_t)kvs_trace_turn_of(t)[i];
    for (int64_t i = 0; i < in->n_turns; i++) sink += (uint32_t)in->turns[i].end;
    if (kvs_trace_check_chunks(t) != KVS_OK) return;
    int n_kv = in->model.n_kv_heads, n_layers = in->model.n_layers;
    for (int l = 0; l < n_layers && l < 3; l++)
        for (int h = 0; h < n_kv && h < 2; h++) {
            kvs_trace_stream *s = NULL;
            if (kvs_trace_stream_open(t, l, h, &s) != KVS_OK) continue;
            const kvs_trace_block *b;
            int64_t k = 0;
            while (k++ < 64 && kvs_trace_stream_next(s, &b) == KVS_OK) sink += b->q[0] != 0.0f; /* any float, NaN too */
            kvs_trace_stream_free(s);
        }
    kvs_trace_block *b = NULL;
    if (kvs_trace_block_create(t, &b) == KVS_OK) {
        (void)kvs_trace_read_block(t, n_layers - 1, n_kv - 1, in->n_blocks - 1, b);
        (void)kvs_trace_read_block(t, n_layers, 0, 0, b);    /* out of range: an error, not a read */
        (void)kvs_trace_read_block(t, 0, 0, in->n_blocks, b);
        kvs_trace_block_free(b);
    }
    (void)sink;
}

static void run_one(const char *path, const char *rec_path) {
    kvs_trace *t = NULL;
    if (kvs_trace_open(path, &t) == KVS_OK) read_everything(t);
    kvs_trace_close(t);
    kvs_trace_recovery rep;
    if (kvs_trace_recover_with_report(path, rec_path, &rep) == KVS_OK) {
        /* whatever recovery writes must open as a valid trace of the positions it reported */
        kvs_trace *r = NULL;
        if (kvs_trace_open(rec_path, &r) != KVS_OK ||
            kvs_trace_info_get(r)->n_positions != rep.positions) {
            fprintf(stderr, "recovered trace does not open as reported: %s\n", kvs_last_error());
            abort();
        }
        kvs_trace_close(r);
        unlink(rec_path);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[128], rec[128];
    kvs_fuzz_write("in.kvt", data, size, path, sizeof path);
    snprintf(rec, sizeof rec, "%s/rec.kvt", kvs_fuzz_dir());
    run_one(path, rec);
    uint8_t *fixed = malloc(size ? size : 1);
    if (!fixed) abort();
    memcpy(fixed, data, size);
    fix_checksums(fixed, size);
    if (size == 0 || memcmp(fixed, data, size) != 0) {
        kvs_fuzz_write("in.kvt", fixed, size, path, sizeof path);
        run_one(path, rec);
    }
    free(fixed);
    kvs_clear_error();
    return 0;
}
