/* samples.c — per-step metric samples spilled to an unlinked temporary file, and their EXACT statistics in
 * bounded memory. Implements sim/samples.h; the statistics reproduce kvs_results_stat_compute()
 * (results/results.c): nearest-rank p50/p95 on the sorted samples, min, max, and the mean as a Kahan-compensated
 * sum over the samples in ascending order divided by n.
 *
 * File layout. The spill file is a plain concatenation of chunks, written append-only by one thread. A chunk
 * is one full set buffer, column-major: float[n_metrics][KVS_SAMPLE_CHUNK] in host byte order (the file
 * never leaves the process). A set remembers the file offset of each of its chunks; a partial buffer stays
 * in memory. The buffer itself is row-major (a push writes one sample's n_metrics floats side by side; column by
 * column each push would write n_metrics floats 4 KiB apart, a page each: TLB misses that made the push 2% of a
 * sweep's replay), transposed into the spill's scratch when it is written. Reading one metric
 * therefore reads one 4 KiB column per chunk.
 *
 * Order keys. key(f) = bits(f) | 0x80000000 for f >= +0.0 (sign bit clear), ~bits(f) for negative f: an
 * unsigned key order equal to the float order for every non-NaN float, with -0.0 just before +0.0.
 * float -> double is exact and monotonic, so ascending keys are ascending doubles.
 *
 * Why the mean is bit-identical. Kahan summation is a left fold over the sorted sequence; we feed it exactly
 * that sequence. The sorted sequence is unique up to the order of equal doubles, and the only equal doubles
 * with different bits are -0.0 and +0.0, whose order does not change the fold: with sum starting at +0.0 in
 * round-to-nearest, sum is never -0.0 (x + y is -0.0 only if both are -0.0, or in other rounding modes);
 * folding a zero z: y = z - comp is -comp when comp != 0 (either sign of z), and a zero otherwise; then
 * t = sum + y, and comp' = (t - sum) - y: when y is a zero, t = sum (sum nonzero) or t = +0.0 (sum +0.0),
 * so t - sum = +0.0 and comp' = +0.0 - (+-0.0) = +0.0 either way. So sum and comp after a run of zeros do
 * not depend on their signs or order. Rank statistics may differ from qsort's only in the sign of a zero.
 *
 * Algorithm of kvs_sample_stats[_all] over K metrics (n samples each):
 *  - memory mode, n*K <= budget/16: one pass gathers the keys, each metric's keys are LSD radix sorted
 *    (two 16-bit digits; three 11-bit digits below RADIX11_MAX keys) and folded.
 *  - scratch mode: pass 1 counts a 65536-bucket histogram of each metric's key top 16 bits (NaN check).
 *    Planning walks each metric's buckets in ascending order and cuts them into partitions: consecutive
 *    buckets totalling at most cap = budget/16 samples ("sort" partitions), or one bucket holding more than
 *    cap ("huge": its values differ only in the 16 low key bits, so a 65536-entry count array of the low
 *    bits IS its sorted content). The histogram array is reused as the bucket -> partition map.
 *    Partitions are processed in groups: per group one distribution pass reads the sets and sends each key
 *    of a partition of the group to the partition's write buffer (flushed to its region of a scratch
 *    file) or, for up to max_huge huge partitions, straight into a low-bit count array; then each
 *    partition of the group, in ascending order, is read back, radix sorted (or counted) and folded.
 *    A group ends when the write buffers (budget/4) are all taken: at the default budget 512 scratch
 *    partitions of more than cap/2 keys on average (two neighbours exceed cap), so one group, i.e. one
 *    distribution pass, covers at least 0.5G keys (samples x metrics).
 *  Memory: budget (sort buffer + radix scratch + write buffers + low-bit counts) + K * 512 KiB of
 *  histograms + 256 KiB of radix counts + one chunk read buffer + 40 bytes per partition.
 */
#include "samples.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define N_BUCKETS 65536
#define EMPTY_BUCKET UINT64_MAX
#define STATS_MEMORY_MIN ((size_t)4 << 10)
#define STATS_MEMORY_MAX ((size_t)16 << 30)

struct kvs_sample_spill {
    int fd;              /* the unlinked file, O_CLOEXEC */
    uint64_t bytes;      /* bytes appended so far = offset of the next chunk */
    float *tbuf;         /* a full buffer transposed to a chunk's column-major layout, [tbuf_metrics][CHUNK] */
    int tbuf_metrics;
    size_t stats_memory; /* budget of kvs_sample_stats() in bytes */
};

struct kvs_sample_set {
    kvs_sample_spill *spill; /* borrowed */
    int n_metrics;
    int n_buf;         /* samples in buf */
    float *buf;        /* [KVS_SAMPLE_CHUNK][n_metrics], row-major: sample i's metrics at buf + i * n_metrics */
    uint64_t *chunks;  /* [n_chunks] file offsets of the full chunks, in push order */
    int64_t n_chunks, cap_chunks;
};

/* ------------------------------------------------------------------------------------------------
 * Temporary files and I/O
 * ---------------------------------------------------------------------------------------------- */

/* Creates an unlinked temporary file "kvsim-<what>-XXXXXX" in $TMPDIR (or /tmp). */
static kvs_status open_unlinked_tmp(const char *what, int *fd_out) {
    const char *dir = getenv("TMPDIR");
    if (!dir || !dir[0]) dir = "/tmp";
    char path[PATH_MAX];
    int len = snprintf(path, sizeof path, "%s/kvsim-%s-XXXXXX", dir, what);
    if (len < 0 || (size_t)len >= sizeof path)
        return kvs_fail(KVS_ERR_IO, "%s: temporary directory path too long: %s", what, dir);
    int fd = mkostemp(path, O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        return kvs_fail(KVS_ERR_IO, "%s: cannot create a temporary file in %s (set TMPDIR?): %s", what, dir,
                        strerror(e));
    }
    if (unlink(path) != 0) {
        int e = errno;
        close(fd);
        return kvs_fail(KVS_ERR_IO, "%s: cannot unlink temporary file %s: %s", what, path, strerror(e));
    }
    *fd_out = fd;
    return KVS_OK;
}

/* pwrite all n bytes at `off`; KVS_ERR_IO naming `what`, with a hint on ENOSPC. */
static kvs_status write_at(int fd, const void *buf, size_t n, uint64_t off, const char *what) {
    const char *p = buf;
    while (n > 0) {
        ssize_t w = pwrite(fd, p, n, (off_t)off);
        if (w < 0) {
            int e = errno;
            if (e == EINTR) continue;
            return kvs_fail(KVS_ERR_IO, "%s: cannot write %zu bytes at offset %" PRIu64 ": %s%s", what, n, off,
                            strerror(e), e == ENOSPC ? " (temporary directory full: point TMPDIR at a larger one)" : "");
        }
        if (w == 0) return kvs_fail(KVS_ERR_IO, "%s: write at offset %" PRIu64 " made no progress", what, off);
        p += w;
        n -= (size_t)w;
        off += (uint64_t)w;
    }
    return KVS_OK;
}

/* pread exactly n bytes at `off`; KVS_ERR_IO naming `what` for an error or a file that ends early. */
static kvs_status read_at(int fd, void *buf, size_t n, uint64_t off, const char *what) {
    char *p = buf;
    while (n > 0) {
        ssize_t r = pread(fd, p, n, (off_t)off);
        if (r < 0) {
            int e = errno;
            if (e == EINTR) continue;
            return kvs_fail(KVS_ERR_IO, "%s: cannot read %zu bytes at offset %" PRIu64 ": %s", what, n, off,
                            strerror(e));
        }
        if (r == 0)
            return kvs_fail(KVS_ERR_IO, "%s: file ends at offset %" PRIu64 ", %zu bytes before the end of the data "
                                        "(truncated)",
                            what, off, n);
        p += r;
        n -= (size_t)r;
        off += (uint64_t)r;
    }
    return KVS_OK;
}

/* ------------------------------------------------------------------------------------------------
 * Spill and sets
 * ---------------------------------------------------------------------------------------------- */

kvs_status kvs_sample_spill_create(kvs_sample_spill **out) {
    if (!out) return kvs_fail(KVS_ERR_INVALID_ARG, "sample_spill_create: NULL output");
    *out = NULL;
    kvs_sample_spill *s = calloc(1, sizeof *s);
    if (!s) return kvs_fail(KVS_ERR_NOMEM, "sample_spill_create: out of memory");
    kvs_status st = open_unlinked_tmp("samples", &s->fd);
    if (st != KVS_OK) {
        free(s);
        return st;
    }
    s->stats_memory = KVS_SAMPLE_STATS_MEMORY_DEFAULT;
    *out = s;
    return KVS_OK;
}

void kvs_sample_spill_free(kvs_sample_spill *spill) {
    if (!spill) return;
    close(spill->fd);
    free(spill->tbuf);
    free(spill);
}

uint64_t kvs_sample_spill_bytes(const kvs_sample_spill *spill) { return spill ? spill->bytes : 0; }

kvs_status kvs_sample_spill_set_stats_memory(kvs_sample_spill *spill, size_t bytes) {
    if (!spill) return kvs_fail(KVS_ERR_INVALID_ARG, "sample_spill_set_stats_memory: NULL spill");
    if (bytes < STATS_MEMORY_MIN || bytes > STATS_MEMORY_MAX)
        return kvs_fail(KVS_ERR_INVALID_ARG, "sample_spill_set_stats_memory: %zu bytes is outside [%zu, %zu]", bytes,
                        STATS_MEMORY_MIN, STATS_MEMORY_MAX);
    spill->stats_memory = bytes;
    return KVS_OK;
}

kvs_status kvs_sample_set_create(kvs_sample_spill *spill, int n_metrics, kvs_sample_set **out) {
    if (!out) return kvs_fail(KVS_ERR_INVALID_ARG, "sample_set_create: NULL output");
    *out = NULL;
    if (!spill) return kvs_fail(KVS_ERR_INVALID_ARG, "sample_set_create: NULL spill");
    if (n_metrics < 1 || (size_t)n_metrics > SIZE_MAX / 2 / (KVS_SAMPLE_CHUNK * sizeof(float)))
        return kvs_fail(KVS_ERR_INVALID_ARG, "sample_set_create: n_metrics %d is not a positive count", n_metrics);
    kvs_sample_set *s = calloc(1, sizeof *s);
    float *buf = malloc((size_t)n_metrics * KVS_SAMPLE_CHUNK * sizeof(float));
    if (!s || !buf) {
        free(s);
        free(buf);
        return kvs_fail(KVS_ERR_NOMEM, "sample_set_create: out of memory for %d metrics", n_metrics);
    }
    s->spill = spill;
    s->n_metrics = n_metrics;
    s->buf = buf;
    *out = s;
    return KVS_OK;
}

void kvs_sample_set_free(kvs_sample_set *set) {
    if (!set) return;
    free(set->buf);
    free(set->chunks);
    free(set);
}

/* Metrics m0 .. m0+k-1 of the first n buffered samples, column by column: dst[(m - m0) * KVS_SAMPLE_CHUNK + i]
 * (a column at a time: the writes run along one column, the reads along the buffer). */
static void set_columns(const kvs_sample_set *set, int n, int m0, int k, float *dst) {
    size_t nm = (size_t)set->n_metrics;
    for (int m = 0; m < k; m++) {
        const float *src = set->buf + (size_t)(m0 + m);
        float *col = dst + (size_t)m * KVS_SAMPLE_CHUNK;
        for (int i = 0; i < n; i++) col[i] = src[(size_t)i * nm];
    }
}

/* Appends the full buffer to the spill file as one chunk. On failure the set and the spill are unchanged (the
 * spill's scratch aside). */
static kvs_status set_flush(kvs_sample_set *set) {
    if (set->n_chunks == set->cap_chunks) {
        int64_t nc = set->cap_chunks ? 2 * set->cap_chunks : 16;
        uint64_t *p = realloc(set->chunks, (size_t)nc * sizeof *p);
        if (!p) return kvs_fail(KVS_ERR_NOMEM, "sample_set_push: out of memory for the chunk index");
        set->chunks = p;
        set->cap_chunks = nc;
    }
    kvs_sample_spill *sp = set->spill;
    size_t bytes = (size_t)set->n_metrics * KVS_SAMPLE_CHUNK * sizeof(float);
    if (sp->tbuf_metrics < set->n_metrics) {
        float *t = realloc(sp->tbuf, bytes);
        if (!t) return kvs_fail(KVS_ERR_NOMEM, "sample_set_push: out of memory for a chunk");
        sp->tbuf = t;
        sp->tbuf_metrics = set->n_metrics;
    }
    set_columns(set, KVS_SAMPLE_CHUNK, 0, set->n_metrics, sp->tbuf);
    kvs_status st = write_at(sp->fd, sp->tbuf, bytes, sp->bytes, "sample spill file");
    if (st != KVS_OK) return st;
    set->chunks[set->n_chunks++] = sp->bytes;
    sp->bytes += bytes;
    set->n_buf = 0;
    return KVS_OK;
}

kvs_status kvs_sample_set_push(kvs_sample_set *set, const float *values) {
    if (!set || !values) return kvs_fail(KVS_ERR_INVALID_ARG, "sample_set_push: NULL %s", set ? "values" : "set");
    if (set->n_buf == KVS_SAMPLE_CHUNK) {
        kvs_status st = set_flush(set);
        if (st != KVS_OK) return st;
    }
    float *row = set->buf + (size_t)set->n_buf * (size_t)set->n_metrics;
    for (int m = 0; m < set->n_metrics; m++) row[m] = values[m]; /* a few dozen floats: no library call */
    set->n_buf++;
    return KVS_OK;
}

int64_t kvs_sample_set_count(const kvs_sample_set *set) {
    return set ? set->n_chunks * KVS_SAMPLE_CHUNK + set->n_buf : 0;
}

int kvs_sample_set_n_metrics(const kvs_sample_set *set) { return set ? set->n_metrics : 0; }

/* ------------------------------------------------------------------------------------------------
 * Keys, radix sort, the sorted-order fold
 * ---------------------------------------------------------------------------------------------- */

static inline uint32_t order_key(uint32_t bits) { /* ~bits when the sign is set, else bits | 0x80000000 */
    return bits ^ ((uint32_t)-(int32_t)(bits >> 31) | 0x80000000u);
}

static inline double key_value(uint32_t key) {
    return (double)kvs_bits_f32((key & 0x80000000u) ? key & 0x7FFFFFFFu : ~key);
}

/* Below this many keys, three 11-bit digits (2048 counts to clear and add up per pass) cost less than two 16-bit
 * ones (65536 each): a replay's (configuration, layer) holds a few thousand samples per metric, where 16-bit
 * passes spend most of their time on the counts. */
#define RADIX11_MAX 100000

/* Sorts a[n] ascending; tmp[n] is scratch, cnt[N_BUCKETS] counts. Returns a or tmp, whichever holds the
 * result. LSD radix on two 16-bit digits, or three 11-bit ones for fewer than RADIX11_MAX keys; a digit shared by
 * every key is skipped. Either way the one ascending order of the keys. */
static uint32_t *radix_sort(uint32_t *a, uint32_t *tmp, size_t n, uint32_t *cnt) {
    if (n <= 64) {
        for (size_t i = 1; i < n; i++) {
            uint32_t v = a[i];
            size_t j = i;
            for (; j > 0 && a[j - 1] > v; j--) a[j] = a[j - 1];
            a[j] = v;
        }
        return a;
    }
    /* Keys already in order (a constant metric, or one that only grows with the position: many of a replay's
     * byte counts) are their own sorted order: one compare a key instead of the passes. */
    size_t run = 1;
    while (run < n && a[run - 1] <= a[run]) run++;
    if (run == n) return a;
    int bits = n < RADIX11_MAX ? 11 : 16;
    uint32_t n_digits = 1u << bits, digit_mask = n_digits - 1u;
    /* 11-bit digits: the three digits' counts in one read of the keys (3 x 2048 of cnt's 65536); a pass moves
     * keys, not digits, so the later digits' counts stay right */
    int counted = bits == 11;
    if (counted) {
        memset(cnt, 0, 3 * n_digits * sizeof *cnt);
        for (size_t i = 0; i < n; i++) {
            uint32_t x = a[i];
            cnt[x & digit_mask]++;
            cnt[n_digits + ((x >> 11) & digit_mask)]++;
            cnt[2 * n_digits + (x >> 22)]++;
        }
    }
    for (int shift = 0, digit = 0; shift < 32; shift += bits, digit++) {
        uint32_t *dc = counted ? cnt + (size_t)digit * n_digits : cnt; /* this digit's counts */
        if (!counted) {
            memset(dc, 0, n_digits * sizeof *dc);
            for (size_t i = 0; i < n; i++) dc[(a[i] >> shift) & digit_mask]++;
        }
        if (dc[(a[0] >> shift) & digit_mask] == n) continue;
        uint32_t sum = 0;
        for (size_t d = 0; d < n_digits; d++) {
            uint32_t c = dc[d];
            dc[d] = sum;
            sum += c;
        }
        for (size_t i = 0; i < n; i++) tmp[dc[(a[i] >> shift) & digit_mask]++] = a[i];
        uint32_t *t = a;
        a = tmp;
        tmp = t;
    }
    return a;
}

/* The state of one metric's fold over its samples in ascending order: the Kahan sum of
 * kvs_results_stat_compute(), term for term, and the order statistics picked at their ranks. */
typedef struct {
    int64_t n, done, r50, r95;
    double sum, comp;
    kvs_results_stat *out;
} fold;

static inline void fold_value(fold *f, double x) {
    if (f->done == 0) f->out->min = x;
    if (f->done == f->r50) f->out->p50 = x;
    if (f->done == f->r95) f->out->p95 = x;
    if (f->done == f->n - 1) f->out->max = x;
    double y = x - f->comp, t = f->sum + y;
    f->comp = (t - f->sum) - y;
    f->sum = t;
    f->done++;
}

static void fold_keys(fold *f, const uint32_t *keys, size_t n) {
    for (size_t i = 0; i < n; i++) fold_value(f, key_value(keys[i]));
}

/* FOLD_LANES metrics' folds over n sorted keys each, at the same ranks (every fold at the same `done`): their
 * order statistics read at their ranks, and their Kahan sums as FOLD_LANES independent chains stepped together.
 * Each chain is fold_value's, term for term, so the same bits; one chain alone is bound by the latency of its 4
 * dependent adds per sample, which made the fold a third of the replay's statistics time; 8 chains
 * measured faster than 4. */
enum { FOLD_LANES = 8 };
static void fold_keys_lanes(fold *const f[FOLD_LANES], const uint32_t *const keys[FOLD_LANES], size_t n) {
    int64_t done = f[0]->done;
    double sum[FOLD_LANES], comp[FOLD_LANES];
    for (int k = 0; k < FOLD_LANES; k++) {
        fold *g = f[k];
        const int64_t rank[4] = {0, g->r50, g->r95, g->n - 1};
        double *at[4] = {&g->out->min, &g->out->p50, &g->out->p95, &g->out->max};
        for (int r = 0; r < 4; r++)
            if (rank[r] >= done && rank[r] < done + (int64_t)n) *at[r] = key_value(keys[k][rank[r] - done]);
        sum[k] = g->sum;
        comp[k] = g->comp;
    }
    for (size_t i = 0; i < n; i++) {
        _Pragma("GCC unroll 8")
        for (int k = 0; k < FOLD_LANES; k++) {
            double y = key_value(keys[k][i]) - comp[k], t = sum[k] + y;
            comp[k] = (t - sum[k]) - y;
            sum[k] = t;
        }
    }
    for (int k = 0; k < FOLD_LANES; k++) {
        f[k]->sum = sum[k];
        f[k]->comp = comp[k];
        f[k]->done += (int64_t)n;
    }
}

/* Folds a bucket given as counts of its low 16 key bits (each index one exact value, ascending). */
static void fold_counts(fold *f, uint32_t bucket, const uint64_t *low) {
    for (uint32_t lo = 0; lo < N_BUCKETS; lo++) {
        uint64_t c = low[lo];
        if (!c) continue;
        double x = key_value(bucket << 16 | lo);
        for (uint64_t j = 0; j < c; j++) fold_value(f, x);
    }
}

/* ------------------------------------------------------------------------------------------------
 * kvs_sample_stats: passes over the sets
 * ---------------------------------------------------------------------------------------------- */

typedef struct {
    size_t cap;      /* most keys of one sorted partition (and the memory-mode limit on n * K) */
    size_t wb_keys;  /* keys per write buffer */
    size_t max_open; /* write buffers (scratch partitions) per group */
    size_t max_huge; /* direct low-bit count arrays per group */
} limits;

static limits limits_of(size_t bytes) {
    limits l;
    l.cap = bytes / 16; /* keys + radix scratch = budget / 2 */
    l.wb_keys = l.cap / 64;
    if (l.wb_keys < 16) l.wb_keys = 16;
    if (l.wb_keys > 4096) l.wb_keys = 4096;
    l.max_open = bytes / 4 / (l.wb_keys * sizeof(uint32_t));
    if (l.max_open < 1) l.max_open = 1;
    l.max_huge = bytes / 4 / (N_BUCKETS * sizeof(uint64_t));
    if (l.max_huge < 1) l.max_huge = 1;
    return l;
}

typedef struct {
    int k;           /* metric slot (0..K-1) */
    int huge;        /* one bucket of more than cap keys, folded from low-bit counts */
    int direct;      /* in the current group: counted straight into direct[slot] (huge only) */
    uint32_t bucket; /* the bucket of a huge partition */
    size_t slot;     /* in the current group: write buffer or direct count array */
    int64_t count;   /* keys, from the histogram */
    int64_t written; /* keys received in the current distribution pass */
    size_t wlen;     /* keys waiting in the write buffer */
    uint64_t off;    /* byte offset of the partition's region in the scratch file */
} part;

typedef struct stats_ctx stats_ctx;
typedef kvs_status (*visit_fn)(stats_ctx *c, int set_index, int64_t first, int count, const float *const *cols);

struct stats_ctx {
    kvs_sample_set *const *sets;
    int n_sets;
    int metric; /* >= 0: only that metric (K == 1); -1: every metric (K == n_metrics) */
    int K;
    int64_t n; /* samples per metric */
    limits lim;
    float *rbuf;        /* one chunk (or one column) */
    const float **cols; /* [K] */
    fold *folds;        /* [K] */
    /* memory mode */
    uint32_t *keys, *aux, *rcnt;
    int64_t filled;
    /* scratch mode */
    uint64_t *hist; /* [K][N_BUCKETS] top-16-bit counts, then the bucket -> partition map */
    part *parts;
    size_t n_parts, cap_parts, g0, g1;
    uint32_t *wbuf;   /* [max_open][wb_keys] */
    uint64_t *direct; /* [max_huge][N_BUCKETS] */
    uint64_t *low;    /* [N_BUCKETS], for huge partitions read back from scratch */
    int scratch_fd;
};

static int metric_of(const stats_ctx *c, int k) { return c->metric >= 0 ? c->metric : k; }

static kvs_status changed_fail(void) {
    return kvs_fail(KVS_ERR_IO, "sample_stats: the sample data changed between passes (corrupt spill or scratch "
                                "file, or sets written during kvs_sample_stats)");
}

static kvs_status nan_fail(const stats_ctx *c, int set_index, int64_t sample, int k) {
    return kvs_fail(KVS_ERR_INVALID_ARG, "sample_stats: sample %" PRId64 " of set %d (metric %d) is NaN", sample,
                    set_index, metric_of(c, k));
}

/* Calls fn on every sample of every set, a chunk (or the buffer) at a time, with the K columns. */
static kvs_status scan(stats_ctx *c, visit_fn fn) {
    for (int s = 0; s < c->n_sets; s++) {
        const kvs_sample_set *set = c->sets[s];
        int fd = set->spill->fd;
        for (int64_t ch = 0; ch < set->n_chunks; ch++) {
            kvs_status st;
            if (c->metric >= 0) {
                st = read_at(fd, c->rbuf, KVS_SAMPLE_CHUNK * sizeof(float),
                             set->chunks[ch] + (uint64_t)c->metric * KVS_SAMPLE_CHUNK * sizeof(float),
                             "sample spill file");
                c->cols[0] = c->rbuf;
            } else {
                st = read_at(fd, c->rbuf, (size_t)set->n_metrics * KVS_SAMPLE_CHUNK * sizeof(float), set->chunks[ch],
                             "sample spill file");
                for (int k = 0; k < c->K; k++) c->cols[k] = c->rbuf + (size_t)k * KVS_SAMPLE_CHUNK;
            }
            if (st != KVS_OK)
                return kvs_fail(st, "sample_stats: chunk %" PRId64 " of set %d: %s", ch, s, kvs_last_error());
            if ((st = fn(c, s, ch * KVS_SAMPLE_CHUNK, KVS_SAMPLE_CHUNK, c->cols)) != KVS_OK) return st;
        }
        if (set->n_buf > 0) { /* the buffered samples' columns, as a chunk's */
            if (c->metric >= 0) set_columns(set, set->n_buf, c->metric, 1, c->rbuf);
            else set_columns(set, set->n_buf, 0, c->K, c->rbuf);
            for (int k = 0; k < c->K; k++) c->cols[k] = c->rbuf + (size_t)k * KVS_SAMPLE_CHUNK;
            kvs_status st = fn(c, s, set->n_chunks * KVS_SAMPLE_CHUNK, set->n_buf, c->cols);
            if (st != KVS_OK) return st;
        }
    }
    return KVS_OK;
}

/* Memory mode: keys of metric k go to keys[k * n + position]. */
static kvs_status gather_visit(stats_ctx *c, int s, int64_t first, int count, const float *const *cols) {
    for (int k = 0; k < c->K; k++) {
        uint32_t *dst = c->keys + (size_t)k * (size_t)c->n + (size_t)c->filled;
        const float *x = cols[k];
        uint32_t nan = 0; /* no exit inside: the loop vectorizes; a NaN is found again below for the message */
        for (int i = 0; i < count; i++) {
            uint32_t b = kvs_f32_bits(x[i]);
            nan |= (b & 0x7FFFFFFFu) > 0x7F800000u;
            dst[i] = order_key(b);
        }
        for (int i = 0; nan && i < count; i++)
            if ((kvs_f32_bits(x[i]) & 0x7FFFFFFFu) > 0x7F800000u) return nan_fail(c, s, first + i, k);
    }
    c->filled += count;
    return KVS_OK;
}

/* Scratch mode, pass 1: histograms of the keys' top 16 bits. */
static kvs_status hist_visit(stats_ctx *c, int s, int64_t first, int count, const float *const *cols) {
    for (int k = 0; k < c->K; k++) {
        uint64_t *h = c->hist + (size_t)k * N_BUCKETS;
        const float *x = cols[k];
        for (int i = 0; i < count; i++) {
            uint32_t b = kvs_f32_bits(x[i]);
            if ((b & 0x7FFFFFFFu) > 0x7F800000u) return nan_fail(c, s, first + i, k);
            h[order_key(b) >> 16]++;
        }
    }
    return KVS_OK;
}

static kvs_status part_flush(stats_ctx *c, part *q) {
    if (q->written + (int64_t)q->wlen > q->count) return changed_fail();
    kvs_status st = write_at(c->scratch_fd, c->wbuf + q->slot * c->lim.wb_keys, q->wlen * sizeof(uint32_t),
                             q->off + (uint64_t)q->written * sizeof(uint32_t), "sample_stats scratch file");
    if (st != KVS_OK) return st;
    q->written += (int64_t)q->wlen;
    q->wlen = 0;
    return KVS_OK;
}

/* Scratch mode, distribution pass: keys of the group's partitions to their write buffer or count array. */
static kvs_status dist_visit(stats_ctx *c, int s, int64_t first, int count, const float *const *cols) {
    (void)s;
    (void)first;
    for (int k = 0; k < c->K; k++) {
        const uint64_t *map = c->hist + (size_t)k * N_BUCKETS;
        const float *x = cols[k];
        for (int i = 0; i < count; i++) {
            uint32_t key = order_key(kvs_f32_bits(x[i]));
            uint64_t p = map[key >> 16];
            if (p == EMPTY_BUCKET) return changed_fail();
            if (p < c->g0 || p >= c->g1) continue;
            part *q = &c->parts[p];
            if (q->direct) {
                c->direct[q->slot * N_BUCKETS + (key & 0xFFFFu)]++;
                if (++q->written > q->count) return changed_fail();
                continue;
            }
            c->wbuf[q->slot * c->lim.wb_keys + q->wlen++] = key;
            if (q->wlen == c->lim.wb_keys) {
                kvs_status st = part_flush(c, q);
                if (st != KVS_OK) return st;
            }
        }
    }
    return KVS_OK;
}

static kvs_status run_memory(stats_ctx *c) {
    size_t n = (size_t)c->n;
    c->keys = malloc(n * (size_t)c->K * sizeof(uint32_t));
    c->aux = malloc(n * sizeof(uint32_t));
    c->rcnt = n > 64 ? malloc(N_BUCKETS * sizeof(uint32_t)) : NULL;
    if (!c->keys || !c->aux || (n > 64 && !c->rcnt))
        return kvs_fail(KVS_ERR_NOMEM, "sample_stats: out of memory for %zu samples", n);
    kvs_status st = scan(c, gather_visit);
    if (st != KVS_OK) return st;
    if (c->filled != c->n) return changed_fail();
    /* every metric sorted in its own place (a sort that ends in aux is copied back), then folded FOLD_LANES at a
     * time (every fold starts at rank 0 here); a last group of fewer fills its lanes with copies of its last
     * metric folded into scratch folds that are dropped */
    for (int k = 0; k < c->K; k++) {
        uint32_t *a = c->keys + (size_t)k * n;
        const uint32_t *sorted = radix_sort(a, c->aux, n, c->rcnt);
        if (sorted != a) memcpy(a, sorted, n * sizeof *a);
    }
    for (int k = 0; k < c->K; k += FOLD_LANES) {
        fold *f[FOLD_LANES], spare[FOLD_LANES];
        kvs_results_stat spare_out[FOLD_LANES];
        const uint32_t *keys[FOLD_LANES];
        for (int l = 0; l < FOLD_LANES; l++) {
            int m = k + l < c->K ? k + l : c->K - 1;
            keys[l] = c->keys + (size_t)m * n;
            if (k + l < c->K) {
                f[l] = &c->folds[m];
            } else {
                spare[l] = c->folds[m];
                spare[l].out = &spare_out[l];
                f[l] = &spare[l];
            }
        }
        fold_keys_lanes(f, keys, n);
    }
    return KVS_OK;
}

static kvs_status add_part(stats_ctx *c, int k, int huge, uint32_t bucket, int64_t count) {
    if (c->n_parts == c->cap_parts) {
        size_t nc = c->cap_parts ? 2 * c->cap_parts : 64;
        part *p = realloc(c->parts, nc * sizeof *p);
        if (!p) return kvs_fail(KVS_ERR_NOMEM, "sample_stats: out of memory for the partition table");
        c->parts = p;
        c->cap_parts = nc;
    }
    part *q = &c->parts[c->n_parts++];
    memset(q, 0, sizeof *q);
    q->k = k;
    q->huge = huge;
    q->bucket = bucket;
    q->count = count;
    return KVS_OK;
}

/* Cuts each metric's buckets, ascending, into partitions; turns the histogram into the partition map. */
static kvs_status plan_parts(stats_ctx *c) {
    for (int k = 0; k < c->K; k++) {
        uint64_t *h = c->hist + (size_t)k * N_BUCKETS;
        size_t cur = SIZE_MAX; /* open sort partition */
        for (uint32_t b = 0; b < N_BUCKETS; b++) {
            uint64_t cnt = h[b];
            kvs_status st = KVS_OK;
            if (cnt == 0) {
                h[b] = EMPTY_BUCKET;
                continue;
            }
            if (cnt > c->lim.cap) {
                cur = SIZE_MAX;
                st = add_part(c, k, 1, b, (int64_t)cnt);
            } else if (cur != SIZE_MAX && (uint64_t)c->parts[cur].count + cnt <= c->lim.cap) {
                c->parts[cur].count += (int64_t)cnt;
                h[b] = cur;
                continue;
            } else {
                st = add_part(c, k, 0, b, (int64_t)cnt);
                cur = c->n_parts - 1;
            }
            if (st != KVS_OK) return st;
            h[b] = c->n_parts - 1;
        }
    }
    return KVS_OK;
}

/* Folds partition q of the current group, its keys now in the scratch file or its count array. */
static kvs_status fold_part(stats_ctx *c, part *q) {
    fold *f = &c->folds[q->k];
    if (q->direct) {
        fold_counts(f, q->bucket, c->direct + q->slot * N_BUCKETS);
        return KVS_OK;
    }
    if (q->huge) {
        if (!c->low && !(c->low = malloc(N_BUCKETS * sizeof *c->low)))
            return kvs_fail(KVS_ERR_NOMEM, "sample_stats: out of memory for a bucket's counts");
        memset(c->low, 0, N_BUCKETS * sizeof *c->low);
        for (int64_t pos = 0; pos < q->count;) {
            size_t m = (size_t)(q->count - pos) < c->lim.cap ? (size_t)(q->count - pos) : c->lim.cap;
            kvs_status st = read_at(c->scratch_fd, c->keys, m * sizeof(uint32_t),
                                    q->off + (uint64_t)pos * sizeof(uint32_t), "sample_stats scratch file");
            if (st != KVS_OK) return st;
            for (size_t i = 0; i < m; i++) {
                if (c->keys[i] >> 16 != q->bucket) return changed_fail();
                c->low[c->keys[i] & 0xFFFFu]++;
            }
            pos += (int64_t)m;
        }
        fold_counts(f, q->bucket, c->low);
        return KVS_OK;
    }
    size_t m = (size_t)q->count;
    kvs_status st = read_at(c->scratch_fd, c->keys, m * sizeof(uint32_t), q->off, "sample_stats scratch file");
    if (st != KVS_OK) return st;
    fold_keys(f, radix_sort(c->keys, c->aux, m, c->rcnt), m);
    return KVS_OK;
}

static kvs_status run_scratch(stats_ctx *c) {
    c->hist = calloc((size_t)c->K * N_BUCKETS, sizeof *c->hist);
    if (!c->hist) return kvs_fail(KVS_ERR_NOMEM, "sample_stats: out of memory for %d histograms", c->K);
    kvs_status st = scan(c, hist_visit);
    if (st != KVS_OK) return st;
    if ((st = plan_parts(c)) != KVS_OK) return st;

    size_t max_sort = 0, n_huge = 0;
    for (size_t p = 0; p < c->n_parts; p++) {
        if (c->parts[p].huge) n_huge++;
        else if ((size_t)c->parts[p].count > max_sort) max_sort = (size_t)c->parts[p].count;
    }
    size_t n_wbuf = c->n_parts < c->lim.max_open ? c->n_parts : c->lim.max_open;
    size_t n_direct = n_huge < c->lim.max_huge ? n_huge : c->lim.max_huge;
    size_t n_keys = n_huge > n_direct ? c->lim.cap : max_sort;
    c->keys = malloc((n_keys ? n_keys : 1) * sizeof(uint32_t));
    c->aux = malloc((max_sort ? max_sort : 1) * sizeof(uint32_t));
    c->rcnt = malloc(N_BUCKETS * sizeof(uint32_t));
    c->wbuf = malloc((n_wbuf ? n_wbuf : 1) * c->lim.wb_keys * sizeof(uint32_t));
    c->direct = n_direct ? malloc(n_direct * N_BUCKETS * sizeof(uint64_t)) : NULL;
    if (!c->keys || !c->aux || !c->rcnt || !c->wbuf || (n_direct && !c->direct))
        return kvs_fail(KVS_ERR_NOMEM, "sample_stats: out of memory for the sort and write buffers");

    for (size_t g0 = 0; g0 < c->n_parts;) {
        size_t g1 = g0, used_open = 0, used_direct = 0;
        uint64_t off = 0;
        for (; g1 < c->n_parts; g1++) {
            part *q = &c->parts[g1];
            if (q->huge && used_direct < c->lim.max_huge) {
                q->direct = 1;
                q->slot = used_direct++;
            } else {
                if (used_open == c->lim.max_open) break;
                q->direct = 0;
                q->slot = used_open++;
                q->off = off;
                off += (uint64_t)q->count * sizeof(uint32_t);
            }
            q->written = 0;
            q->wlen = 0;
        }
        if (used_direct) memset(c->direct, 0, used_direct * N_BUCKETS * sizeof(uint64_t));
        if (used_open && c->scratch_fd < 0 && (st = open_unlinked_tmp("samples-scratch", &c->scratch_fd)) != KVS_OK)
            return kvs_fail(st, "sample_stats: %s", kvs_last_error());
        c->g0 = g0;
        c->g1 = g1;
        if ((st = scan(c, dist_visit)) != KVS_OK) return st;
        for (size_t p = g0; p < g1; p++) {
            part *q = &c->parts[p];
            if (q->wlen && (st = part_flush(c, q)) != KVS_OK) return st;
            if (q->written != q->count) return changed_fail();
        }
        for (size_t p = g0; p < g1; p++)
            if ((st = fold_part(c, &c->parts[p])) != KVS_OK) return st;
        g0 = g1;
    }
    return KVS_OK;
}

/* Validates, then runs memory or scratch mode for metric `metric` (K == 1) or every metric (metric -1). */
static kvs_status stats_run(kvs_sample_set *const *sets, int n_sets, int metric, int K, kvs_results_stat *out) {
    stats_ctx c;
    memset(&c, 0, sizeof c);
    c.scratch_fd = -1;
    c.sets = sets;
    c.n_sets = n_sets;
    c.metric = metric;
    c.K = K;
    memset(out, 0, (size_t)K * sizeof *out);

    size_t budget = SIZE_MAX;
    int max_metrics = 1;
    for (int s = 0; s < n_sets; s++) {
        c.n += kvs_sample_set_count(sets[s]);
        if (sets[s]->spill->stats_memory < budget) budget = sets[s]->spill->stats_memory;
        if (sets[s]->n_metrics > max_metrics) max_metrics = sets[s]->n_metrics;
    }
    if (c.n == 0) return KVS_OK;
    if (c.n > INT64_MAX / 100)
        return kvs_fail(KVS_ERR_INVALID_ARG, "sample_stats: %" PRId64 " samples are too many", c.n);
    c.lim = limits_of(budget);

    kvs_status st = KVS_OK;
    c.rbuf = malloc((size_t)(metric >= 0 ? 1 : max_metrics) * KVS_SAMPLE_CHUNK * sizeof(float));
    c.cols = malloc((size_t)K * sizeof *c.cols);
    c.folds = calloc((size_t)K, sizeof *c.folds);
    if (!c.rbuf || !c.cols || !c.folds) {
        st = kvs_fail(KVS_ERR_NOMEM, "sample_stats: out of memory for %d metrics", K);
        goto cleanup;
    }
    for (int k = 0; k < K; k++) {
        c.folds[k].n = c.n;
        c.folds[k].r50 = (c.n + 1) / 2 - 1;
        c.folds[k].r95 = (95 * c.n + 99) / 100 - 1;
        c.folds[k].out = &out[k];
    }
    if ((uint64_t)c.n <= c.lim.cap / (size_t)K) st = run_memory(&c);
    else st = run_scratch(&c);
    if (st != KVS_OK) goto cleanup;
    for (int k = 0; k < K; k++) {
        if (c.folds[k].done != c.n) {
            st = changed_fail();
            goto cleanup;
        }
        out[k].n = c.n;
        out[k].mean = c.folds[k].sum / (double)c.n;
    }

cleanup:
    if (st != KVS_OK) memset(out, 0, (size_t)K * sizeof *out);
    if (c.scratch_fd >= 0) close(c.scratch_fd);
    free(c.rbuf);
    free(c.cols);
    free(c.folds);
    free(c.keys);
    free(c.aux);
    free(c.rcnt);
    free(c.hist);
    free(c.parts);
    free(c.wbuf);
    free(c.direct);
    free(c.low);
    return st;
}

kvs_status kvs_sample_stats(kvs_sample_set *const *sets, int n_sets, int metric, kvs_results_stat *out) {
    if (!out) return kvs_fail(KVS_ERR_INVALID_ARG, "sample_stats: NULL output");
    memset(out, 0, sizeof *out);
    if (n_sets < 0 || (n_sets > 0 && !sets))
        return kvs_fail(KVS_ERR_INVALID_ARG, "sample_stats: bad set list (n_sets = %d)", n_sets);
    if (metric < 0) return kvs_fail(KVS_ERR_INVALID_ARG, "sample_stats: negative metric %d", metric);
    for (int s = 0; s < n_sets; s++) {
        if (!sets[s]) return kvs_fail(KVS_ERR_INVALID_ARG, "sample_stats: set %d is NULL", s);
        if (metric >= sets[s]->n_metrics)
            return kvs_fail(KVS_ERR_INVALID_ARG, "sample_stats: metric %d out of range for set %d (%d metrics)", metric,
                            s, sets[s]->n_metrics);
    }
    return stats_run(sets, n_sets, metric, 1, out);
}

kvs_status kvs_sample_stats_all(kvs_sample_set *const *sets, int n_sets, kvs_results_stat *out_per_metric) {
    if (!out_per_metric) return kvs_fail(KVS_ERR_INVALID_ARG, "sample_stats_all: NULL output");
    if (n_sets < 1 || !sets)
        return kvs_fail(KVS_ERR_INVALID_ARG, "sample_stats_all: needs at least one set (n_sets = %d)", n_sets);
    for (int s = 0; s < n_sets; s++)
        if (!sets[s]) return kvs_fail(KVS_ERR_INVALID_ARG, "sample_stats_all: set %d is NULL", s);
    int M = sets[0]->n_metrics;
    for (int s = 1; s < n_sets; s++)
        if (sets[s]->n_metrics != M)
            return kvs_fail(KVS_ERR_INVALID_ARG, "sample_stats_all: set %d has %d metrics, set 0 has %d", s,
                            sets[s]->n_metrics, M);
    return stats_run(sets, n_sets, -1, M, out_per_metric);
}
