/* test_limits.c — regression tests for inputs whose headers claim absurd sizes (fuzz/README.md "Limits"): each is
 * refused, or read, quickly and in bounded memory, never by allocating what the header alone asks for.
 *
 *  (a) a tiny trace with valid checksums, 1 position, 1024 query heads of head_dim 1024 and block_positions 65536:
 *      readers sized their block buffers from the header's block (550 GB per chunk) instead of min(B, N);
 *  (b) the same header alone: `trace recover` allocated those 550 GB before scanning any chunk;
 *  (c) a tokenizer.json whose normalizer (or decoder) is a chain of Replace steps "a" -> "aa": each step doubled
 *      the text, 34 steps 2^34-fold.
 * The traces are written byte by byte here from trace/FORMAT.md (not with the library's writer, which could not
 * even start such a capture), so the tests also check the reader against the specification. The memory bound is
 * enforced by running the reads in a child process under RLIMIT_AS (not under AddressSanitizer, whose shadow
 * memory needs the address space; there the sanitizer itself aborts on an allocation of hundreds of GB).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zstd.h>

#include "../common/kvs.h"
#include "../gpu_capture/tokenizer.h"
#include "../trace/trace.h"
#include "tests/util/cli_run.h"
#include "tests/util/testenv.h"

#if defined(__SANITIZE_ADDRESS__)
#define UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UNDER_ASAN 1
#endif
#endif
#ifndef UNDER_ASAN
#define UNDER_ASAN 0
#endif

/* Address space a child may use for the bounded reads (256 MiB): the honest work on these inputs needs ~25 MB
 * (one decoded block of the 1-position trace: ~5 x 4.2 MB), the header alone asked for 550 GB. */
#define CHILD_AS_LIMIT ((rlim_t)256 << 20)

static char tmpdir[64];

static int tmp_setup(void **state) {
    (void)state;
    strcpy(tmpdir, "/tmp/kvs_limits_XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int tmp_teardown(void **state) {
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

static void path_in(const char *name, char *out, size_t n) { snprintf(out, n, "%s/%s", tmpdir, name); }


/* ------------------------------------------------------------------ a trace written from FORMAT.md */

/* The hostile configuration of (a) and (b): L 1, H 1024, Hkv 1, d 1024, fp16, B 65536. */
enum { H_LAYERS = 1, H_HEADS = 1024, H_KV = 1, H_DIM = 1024, H_BLOCK = 65536, HDR_SIZE = 152 };

static size_t put_header(uint8_t *p) {
    memset(p, 0, HDR_SIZE);
    memcpy(p, "KVSTRACE", 8);
    kvs_put_u32(p + 8, 1);
    kvs_put_u32(p + 12, HDR_SIZE);
    kvs_put_u32(p + 16, H_LAYERS);
    kvs_put_u32(p + 20, H_HEADS);
    kvs_put_u32(p + 24, H_KV);
    kvs_put_u32(p + 28, H_DIM);
    kvs_put_u32(p + 32, H_HEADS * H_DIM); /* dim */
    kvs_put_u32(p + 36, 1);               /* hidden_dim */
    kvs_put_u32(p + 40, 32);              /* vocab_size */
    kvs_put_u32(p + 44, 8);               /* max_seq_len */
    float theta = 10000.0f, eps = 1e-5f, scale = 1.0f / 32.0f;
    memcpy(p + 48, &theta, 4);
    memcpy(p + 52, &eps, 4);
    memcpy(p + 56, &scale, 4);
    kvs_put_u32(p + 64, KVS_DTYPE_F16);
    kvs_put_u32(p + 68, H_BLOCK);
    memcpy(p + 80, "hostile-header", 14);
    kvs_put_u32(p + 148, kvs_crc32(0, p, 148));
    return HDR_SIZE;
}

typedef struct {
    uint16_t kind;
    uint64_t offset, raw_size, comp_size;
} test_chunk;

/* Appends chunk (kind, n_pos 1, block 0) with payload `comp` to p; returns its size. */
static size_t put_chunk(uint8_t *p, uint16_t kind, uint64_t raw_size, const uint8_t *comp, size_t comp_size) {
    memset(p, 0, 56);
    memcpy(p, "KVCK", 4);
    kvs_put_u16(p + 4, kind);
    kvs_put_u32(p + 24, 1);
    kvs_put_u64(p + 32, raw_size);
    kvs_put_u64(p + 40, comp_size);
    kvs_put_u32(p + 48, kvs_crc32(0, comp, comp_size));
    kvs_put_u32(p + 52, kvs_crc32(0, p, 52));
    memcpy(p + 56, comp, comp_size);
    return 56 + comp_size;
}

/* Appends footer + trailer for the two chunks of a 1-position trace; returns their size. */
static size_t put_footer(uint8_t *p, uint64_t footer_off, const test_chunk *c, int n) {
    size_t fsize = 40 + 48 * (size_t)n;
    memset(p, 0, fsize + 32);
    memcpy(p, "KVFT", 4);
    kvs_put_u64(p + 8, 1);
    kvs_put_u64(p + 16, (uint64_t)n);
    uint64_t total = 0;
    for (int i = 0; i < n; i++) {
        uint8_t *e = p + 32 + 48 * i;
        kvs_put_u16(e, c[i].kind);
        kvs_put_u32(e + 12, 1); /* n_pos */
        kvs_put_u64(e + 24, c[i].offset);
        kvs_put_u64(e + 32, c[i].raw_size);
        kvs_put_u64(e + 40, c[i].comp_size);
        total += c[i].raw_size;
    }
    kvs_put_u64(p + 24, total);
    kvs_put_u32(p + fsize - 4, kvs_crc32(0, p, fsize - 4));
    uint8_t *t = p + fsize;
    kvs_put_u64(t, footer_off);
    kvs_put_u64(t + 8, fsize);
    kvs_put_u32(t + 16, kvs_crc32(0, t, 16));
    memcpy(t + 24, "KVSTEND", 8); /* with its NUL */
    return fsize + 32;
}

/* Raw size of the group chunk of one position: (2G + 2)·d fp16 values and G fp32 LSEs (FORMAT.md). */
static uint64_t group_raw_one(void) { return (2u * H_HEADS + 2u) * H_DIM * 2u + H_HEADS * 4u; }

/* Writes the 1-position trace of (a): token 5 at position 0 (a prompt), all q/k/v/o 0 and the LSE 0 -- which
 * IS exact attention (one key, score 0: o = v_0 = 0, lse = log 1 = 0), so the trace verifies. With
 * `token` the position's token id (5 above; the vocabulary has 32). With
 * `group_comp_size` > 0 the group chunk instead claims that many payload bytes of junk (for the expansion check).
 * Returns the file size. */
static size_t write_hostile_trace(const char *path, size_t group_comp_size, uint8_t token) {
    uint64_t graw = group_raw_one();
    uint8_t *zeros = calloc(1, graw);
    uint8_t *gcomp = malloc(ZSTD_compressBound(graw));
    assert_non_null(zeros);
    assert_non_null(gcomp);
    size_t gsize;
    if (group_comp_size == 0) {
        gsize = ZSTD_compress(gcomp, ZSTD_compressBound(graw), zeros, graw, 3);
        assert_false(ZSTD_isError(gsize));
    } else {
        gsize = group_comp_size;
        memset(gcomp, 0x5a, gsize);
    }
    uint8_t tok_raw[9] = {token, 0, 0, 0, 0, 0, 0, 0, 0}; /* the token id, role prompt, turn 0 */
    uint8_t tcomp[64];
    size_t tsize = ZSTD_compress(tcomp, sizeof tcomp, tok_raw, sizeof tok_raw, 3);
    assert_false(ZSTD_isError(tsize));

    uint8_t *file = calloc(1, HDR_SIZE + 2 * 56 + tsize + gsize + 40 + 96 + 32);
    assert_non_null(file);
    size_t off = put_header(file);
    test_chunk c[2] = {{.kind = 2, .offset = off, .raw_size = 9, .comp_size = tsize}, {0}};
    off += put_chunk(file + off, 2, 9, tcomp, tsize);
    c[1] = (test_chunk){.kind = 1, .offset = off, .raw_size = graw, .comp_size = gsize};
    off += put_chunk(file + off, 1, graw, gcomp, gsize);
    off += put_footer(file + off, off, c, 2);
    assert_int_equal(kvs_test_spit(path, file, off), 0);
    free(file);
    free(gcomp);
    free(zeros);
    return off;
}

/* ------------------------------------------------------------------ bounded child */

/* Runs fn(arg) in a child process limited to CHILD_AS_LIMIT of address space (outside ASan) and returns what it
 * returned (0 = success), or 100 + the signal that killed it. fn must not use cmocka's asserts. */
static int run_bounded(int (*fn)(const char *), const char *arg) {
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        if (!UNDER_ASAN) {
            struct rlimit rl = {CHILD_AS_LIMIT, CHILD_AS_LIMIT};
            if (setrlimit(RLIMIT_AS, &rl) != 0) _exit(99);
        }
        _exit(fn(arg));
    }
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 100 + WTERMSIG(st);
}

/* Opens the 1-position trace, checks every chunk, reads its one block by random access and by streaming, and
 * compares the data with what was written (all zeros, token 5). */
static int read_hostile_trace(const char *path) {
    kvs_trace *t = NULL;
    kvs_trace_block *b = NULL;
    kvs_trace_stream *s = NULL;
    int rc = 1;
    if (kvs_trace_open(path, &t) != KVS_OK) goto out;
    const kvs_trace_info *in = kvs_trace_info_get(t);
    if (in->n_positions != 1 || in->capture.block_positions != H_BLOCK || kvs_trace_tokens(t)[0] != 5) goto out;
    if (kvs_trace_check_chunks(t) != KVS_OK) goto out;
    if (kvs_trace_block_create(t, &b) != KVS_OK || kvs_trace_read_block(t, 0, 0, 0, b) != KVS_OK) goto out;
    if (b->n_pos != 1 || b->group != H_HEADS || b->head_dim != H_DIM) goto out;
    for (size_t i = 0; i < (size_t)H_HEADS * H_DIM; i++)
        if (b->q[i] != 0.0f || b->o[i] != 0.0f) goto out;
    for (size_t i = 0; i < H_DIM; i++)
        if (b->k[i] != 0.0f || b->v[i] != 0.0f) goto out;
    const kvs_trace_block *sb;
    if (kvs_trace_stream_open(t, 0, 0, &s) != KVS_OK || kvs_trace_stream_next(s, &sb) != KVS_OK || sb->n_pos != 1 ||
        kvs_trace_stream_next(s, &sb) != KVS_ERR_END)
        goto out;
    rc = 0;
out:
    if (rc) fprintf(stderr, "read_hostile_trace: %s\n", kvs_last_error());
    kvs_trace_stream_free(s);
    kvs_trace_block_free(b);
    kvs_trace_close(t);
    return rc;
}

/* Recovers the trace into path.rec: every chunk is complete, so the one position comes back. */
static int recover_hostile_trace(const char *path) {
    char out[512];
    snprintf(out, sizeof out, "%s.rec", path);
    int64_t n = -1;
    kvs_status s = kvs_trace_recover(path, out, &n);
    if (s != KVS_OK || n != 1) {
        fprintf(stderr, "recover_hostile_trace: %s (n = %lld)\n", kvs_last_error(), (long long)n);
        return 1;
    }
    return read_hostile_trace(out);
}

/* Recovery of a header-only file: no chunk, so nothing to recover (KVS_ERR_TRUNCATED), found without
 * allocating for the claimed block. */
static int recover_header_only(const char *path) {
    char out[512];
    snprintf(out, sizeof out, "%s.rec", path);
    kvs_status s = kvs_trace_recover(path, out, NULL);
    if (s != KVS_ERR_TRUNCATED || !strstr(kvs_last_error(), "no complete block")) {
        fprintf(stderr, "recover_header_only: %s (%s)\n", kvs_strerror(s), kvs_last_error());
        return 1;
    }
    return access(out, F_OK) == 0 ? 2 : 0;
}

/* ------------------------------------------------------------------ tests */

/* (a): the reader sizes its buffers from min(B, N) = 1 position (4.2 MB of raw chunk), not 65536 (550 GB). */
static void test_huge_block_one_position_trace_reads_in_bounded_memory(void **state) {
    (void)state;
    char p[256];
    path_in("a.kvt", p, sizeof p);
    size_t size = write_hostile_trace(p, 0, 5);
    assert_true(size < 1024); /* the file was 737 bytes; this one is of the same kind */
    assert_int_equal(run_bounded(read_hostile_trace, p), 0);
    assert_int_equal(run_bounded(recover_hostile_trace, p), 0);
    if (!kvs_test_kvsim_bin()) return;
    char out[256], err[256];
    path_in("verify.out", out, sizeof out);
    path_in("verify.err", err, sizeof err);
    const char *args[] = {"verify", p, NULL};
    assert_int_equal(kvs_test_cli(out, err, args), 0); /* the zeros are exact attention: it verifies */
}

/* A chunk whose raw_size is more than its payload could ever decompress to is refused at open, by name. */
static void test_chunk_claiming_more_than_zstd_can_expand_is_refused(void **state) {
    (void)state;
    char p[256];
    path_in("ratio.kvt", p, sizeof p);
    write_hostile_trace(p, 16, 5); /* 16 bytes can hold at most 16 * 32768 = 524288 < 4198400 + 4096 */
    kvs_trace *t = NULL;
    assert_int_equal(kvs_trace_open(p, &t), KVS_ERR_FORMAT);
    assert_null(t);
    assert_non_null(strstr(kvs_last_error(), "raw_size = 4202496 is more than a 16-byte zstd frame can hold"));
    assert_non_null(strstr(kvs_last_error(), "chunk (layer 0, kv head 0, block 0)"));
    /* recovery finds the same chunk bad and keeps nothing */
    char out[256];
    path_in("ratio.rec", out, sizeof out);
    kvs_trace_recovery rep;
    assert_int_equal(kvs_trace_recover_with_report(p, out, &rep), KVS_ERR_TRUNCATED);
    assert_true(rep.partial);
    assert_non_null(strstr(rep.bad_error, "more than a 16-byte zstd frame can hold"));
    struct stat st;
    assert_int_equal(stat(out, &st), -1);
}

/* A tokens chunk with valid checksums whose token id is outside the vocabulary: the reader refuses the trace, and
 * recovery (found by fuzz_trace: it used to copy the chunk, writing a trace that does not open) treats the chunk as
 * bad, as the reader would, and keeps nothing. */
static void test_recovery_drops_token_rows_the_reader_refuses(void **state) {
    (void)state;
    char p[256], out[256];
    path_in("badtok.kvt", p, sizeof p);
    path_in("badtok.rec", out, sizeof out);
    write_hostile_trace(p, 0, 200);
    kvs_trace *t = NULL;
    assert_int_equal(kvs_trace_open(p, &t), KVS_ERR_FORMAT);
    assert_non_null(strstr(kvs_last_error(), "position 0: token id 200 outside [0, vocab_size = 32)"));
    kvs_trace_recovery rep;
    assert_int_equal(kvs_trace_recover_with_report(p, out, &rep), KVS_ERR_TRUNCATED);
    assert_true(rep.partial);
    assert_non_null(strstr(rep.bad_error, "token id 200 outside [0, vocab_size = 32)"));
    struct stat st;
    assert_int_equal(stat(out, &st), -1);
}

/* (b): a 152-byte header-only trace makes `trace recover` say there is nothing to recover, in bounded memory. */
static void test_header_only_huge_block_recover_is_bounded(void **state) {
    (void)state;
    uint8_t hdr[HDR_SIZE];
    assert_int_equal(put_header(hdr), 152);
    char p[256];
    path_in("b.kvt.partial", p, sizeof p);
    assert_int_equal(kvs_test_spit(p, hdr, sizeof hdr), 0);
    assert_int_equal(run_bounded(recover_header_only, p), 0);
    if (!kvs_test_kvsim_bin()) return;
    char out[256], err[256], rec[256];
    path_in("recover.out", out, sizeof out);
    path_in("recover.err", err, sizeof err);
    path_in("b.kvt", rec, sizeof rec);
    const char *args[] = {"trace", "recover", p, rec, NULL};
    assert_int_equal(kvs_test_cli(out, err, args), 1);
    assert_int_equal(access(rec, F_OK), -1);
}

/* ---- (c): tokenizer.json Replace chains */

/* A tokenizer.json with vocabulary {a, aa}, `n_norm` normalizer Replace steps "a" -> "aa" and `n_dec` decoder
 * Replace steps "a" -> "aa". */
static void write_replace_chain(const char *path, int n_norm, int n_dec) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f, "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"aa\": 1}, \"merges\": [\"a a\"]}");
    const char *step = "{\"type\": \"Replace\", \"pattern\": {\"String\": \"a\"}, \"content\": \"aa\"}";
    if (n_norm > 0) {
        fprintf(f, ", \"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [");
        for (int i = 0; i < n_norm; i++) fprintf(f, "%s%s", i ? ", " : "", step);
        fprintf(f, "]}");
    }
    if (n_dec > 0) {
        fprintf(f, ", \"decoder\": {\"type\": \"Sequence\", \"decoders\": [");
        for (int i = 0; i < n_dec; i++) fprintf(f, "%s%s", i ? ", " : "", step);
        fprintf(f, "]}");
    }
    fprintf(f, "}\n");
    assert_int_equal(fclose(f), 0);
}

static void test_tokenizer_replace_chain_that_explodes_is_refused(void **state) {
    (void)state;
    char p[256];
    path_in("tokenizer.json", p, sizeof p);
    kvs_tokenizer *t = NULL;

    /* the file: 34 doubling steps (2^34-fold) */
    write_replace_chain(p, 34, 0);
    struct stat st;
    assert_int_equal(stat(p, &st), 0);
    assert_true(st.st_size < 4096);
    assert_int_equal(kvs_tokenizer_load_hf(p, &t), KVS_ERR_FORMAT);
    assert_null(t);
    assert_non_null(strstr(kvs_last_error(), "normalizer Replace steps can grow a text more than 1024-fold"));
    assert_non_null(strstr(kvs_last_error(), "at step 11"));
    write_replace_chain(p, 0, 34);
    assert_int_equal(kvs_tokenizer_load_hf(p, &t), KVS_ERR_FORMAT);
    assert_non_null(strstr(kvs_last_error(), "decoder Replace steps can grow a text more than 1024-fold"));

    /* the limit: 10 doublings (1024-fold) load, 11 do not */
    write_replace_chain(p, 11, 0);
    assert_int_equal(kvs_tokenizer_load_hf(p, &t), KVS_ERR_FORMAT);
    write_replace_chain(p, 10, 10);
    assert_int_equal(kvs_tokenizer_load_hf(p, &t), KVS_OK);
    /* and do what they say: "a" becomes 1024 a's, which BPE merges into 512 "aa" tokens */
    int32_t ids[600];
    size_t n = 0;
    assert_int_equal(kvs_tokenizer_encode(t, "a", 0, ids, sizeof ids / sizeof ids[0], &n), KVS_OK);
    assert_int_equal(n, 512);
    for (size_t i = 0; i < n; i++) assert_int_equal(ids[i], 1);
    char *text = NULL;
    int32_t one = 0;
    assert_int_equal(kvs_tokenizer_decode(t, &one, 1, &text), KVS_OK);
    assert_int_equal(strlen(text), 1024);
    assert_int_equal(strspn(text, "a"), 1024);
    free(text);
    kvs_tokenizer_free(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_huge_block_one_position_trace_reads_in_bounded_memory, tmp_setup,
                                        tmp_teardown),
        cmocka_unit_test_setup_teardown(test_chunk_claiming_more_than_zstd_can_expand_is_refused, tmp_setup,
                                        tmp_teardown),
        cmocka_unit_test_setup_teardown(test_header_only_huge_block_recover_is_bounded, tmp_setup, tmp_teardown),
        cmocka_unit_test_setup_teardown(test_recovery_drops_token_rows_the_reader_refuses, tmp_setup, tmp_teardown),
        cmocka_unit_test_setup_teardown(test_tokenizer_replace_chain_that_explodes_is_refused, tmp_setup,
                                        tmp_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
