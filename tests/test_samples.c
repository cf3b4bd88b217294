/* test_samples.c — tests of sim/samples.h: spilled sample sets and their exact statistics. Every statistic is
 * checked against kvs_results_stat_compute() (results/results.h) on the same samples converted to double:
 * n, p50, p95, min and max with ==, the mean bit for bit (samples.h promises a bit-identical Kahan mean;
 * with +inf samples both sides give the same inf or NaN). Data: seeded xorshift samples of mixed
 * magnitudes, negatives, zeros, -0.0, denormals, duplicates and +inf, spread over 1..5 sets sharing one
 * spill file, at the default stats memory budget (in-memory sort) and at the smallest one (scratch file,
 * many partition groups, buckets too large to sort). Also: NaN refused with a message naming the sample,
 * bad arguments, write errors (RLIMIT_FSIZE) and read errors (a truncated spill file) as KVS_ERR_IO, and
 * a million-sample set whose peak RSS grows far less than the samples' size.
 */
#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/kvs.h"
#include "results/results.h"
#include "sim/samples.h"

static void expect_ok(kvs_status st) {
    if (st != KVS_OK) fprintf(stderr, "unexpected failure: %s (%s)\n", kvs_strerror(st), kvs_last_error());
    assert_int_equal(st, KVS_OK);
}

static uint64_t xs(uint64_t *s) {
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

static uint64_t double_bits(double d) {
    uint64_t u;
    memcpy(&u, &d, 8);
    return u;
}

static float denormal(uint64_t r) {
    uint32_t b = (uint32_t)(r >> 32) & 0x807FFFFFu;
    if (!(b & 0x007FFFFFu)) b |= 1;
    return kvs_bits_f32(b);
}

/* Any finite float (every magnitude), zeros of both signs, denormals, duplicates, rare +inf. */
static float gen_wide(uint64_t *s) {
    static const float pool[] = {1.5f, -2.25f, 1e-3f, 7.0f, -1e30f};
    uint64_t r = xs(s);
    switch (r % 16) {
    case 0: return 0.0f;
    case 1: return -0.0f;
    case 2: return denormal(r);
    case 3: return pool[(r >> 20) % 5];
    case 4:
        if ((r >> 8) % 256 == 0) return INFINITY;
        return (float)(r >> 40);
    default: {
        uint32_t b = (uint32_t)(r >> 32);
        if ((b & 0x7F800000u) == 0x7F800000u) b &= 0xBFFFFFFFu; /* no inf or NaN here */
        return kvs_bits_f32(b);
    }
    }
}

/* Finite values of magnitude 2^-20..2^21 of both signs, zeros, denormals, duplicates: a mean where the
 * Kahan compensation matters. */
static float gen_moderate(uint64_t *s) {
    static const float pool[] = {0.25f, -0.75f, 3.0f, 1e-6f};
    uint64_t r = xs(s);
    switch (r % 8) {
    case 0: return (r >> 8) & 1 ? -0.0f : 0.0f;
    case 1: return denormal(r);
    case 2: return pool[(r >> 20) % 4];
    default: {
        float mant = 1.0f + (float)((r >> 16) & 0x7FFFFFu) / 8388608.0f;
        float v = ldexpf(mant, (int)((r >> 40) % 41) - 20);
        return (r >> 63) ? -v : v;
    }
    }
}

/* Few distinct values, crowded into few top-16-bit buckets: small multiples of 4096 (byte counts) and
 * 1 + k * 2^-20 (100 values inside ONE bucket). */
static float gen_crowded(uint64_t *s) {
    uint64_t r = xs(s);
    if (r & 1) return (float)((r >> 8) % 16) * 4096.0f;
    return 1.0f + (float)((r >> 8) % 100) * ldexpf(1.0f, -20);
}

static float gen_metric(int m, uint64_t *s) {
    switch (m % 4) {
    case 0: return gen_wide(s);
    case 1: return gen_moderate(s);
    case 2: return gen_crowded(s);
    default: return (float)(m / 4); /* a constant metric (e.g. transfer bytes of a non-offloading policy) */
    }
}

static void expect_same_stat(const kvs_results_stat *got, const kvs_results_stat *want) {
    assert_int_equal(got->n, want->n);
    if (double_bits(got->mean) != double_bits(want->mean))
        fprintf(stderr, "mean %.17g (%016llx) != %.17g (%016llx)\n", got->mean,
                (unsigned long long)double_bits(got->mean), want->mean, (unsigned long long)double_bits(want->mean));
    assert_true(double_bits(got->mean) == double_bits(want->mean));
    assert_true(got->p50 == want->p50);
    assert_true(got->p95 == want->p95);
    assert_true(got->min == want->min);
    assert_true(got->max == want->max);
}

#define N_M 11 /* metrics of the randomized tests: wide, moderate, crowded, constant, and again: kvs_sample_stats_all
                 * folds 8 metrics together (the first eight) and the rest one by one */

/* n samples over n_sets sets of one spill (each sample to a random set, pushes interleaved), then every
 * metric through kvs_sample_stats_all and kvs_sample_stats against kvs_results_stat_compute. */
static void check_against_reference(int64_t n, int n_sets, size_t budget, uint64_t seed) {
    kvs_sample_spill *spill = NULL;
    kvs_sample_set *sets[5] = {NULL};
    expect_ok(kvs_sample_spill_create(&spill));
    if (budget) expect_ok(kvs_sample_spill_set_stats_memory(spill, budget));
    for (int s = 0; s < n_sets; s++) expect_ok(kvs_sample_set_create(spill, N_M, &sets[s]));
    double *ref[N_M];
    for (int m = 0; m < N_M; m++) {
        ref[m] = malloc((size_t)(n + 1) * sizeof(double));
        assert_non_null(ref[m]);
    }
    uint64_t st = seed * 0x9E3779B97F4A7C15ull + 1, pick = seed + 7;
    int64_t per_set[5] = {0};
    for (int64_t i = 0; i < n; i++) {
        float v[N_M];
        for (int m = 0; m < N_M; m++) {
            v[m] = gen_metric(m, &st);
            ref[m][i] = v[m];
        }
        int s = (int)(xs(&pick) % (uint64_t)n_sets);
        expect_ok(kvs_sample_set_push(sets[s], v));
        per_set[s]++;
    }
    uint64_t chunks = 0;
    for (int s = 0; s < n_sets; s++) {
        assert_int_equal(kvs_sample_set_count(sets[s]), per_set[s]);
        chunks += (uint64_t)((per_set[s] - 1 > 0 ? per_set[s] - 1 : 0) / KVS_SAMPLE_CHUNK);
    }
    /* a buffer is appended only when a push finds it full */
    assert_int_equal(kvs_sample_spill_bytes(spill), chunks * KVS_SAMPLE_CHUNK * N_M * sizeof(float));

    kvs_results_stat all[N_M], one, want;
    expect_ok(kvs_sample_stats_all(sets, n_sets, all));
    for (int m = 0; m < N_M; m++) {
        expect_ok(kvs_results_stat_compute(ref[m], n, &want));
        expect_same_stat(&all[m], &want);
        expect_ok(kvs_sample_stats(sets, n_sets, m, &one));
        expect_same_stat(&one, &want);
    }
    /* the sets are unchanged by the statistics: the same again */
    expect_ok(kvs_sample_stats(sets, n_sets, 1, &one));
    expect_same_stat(&one, &all[1]);
    for (int m = 0; m < N_M; m++) free(ref[m]);
    for (int s = 0; s < n_sets; s++) kvs_sample_set_free(sets[s]);
    kvs_sample_spill_free(spill);
}

static const int64_t sizes[] = {0, 1, 2, 19, 20, 21, 1023, 1024, 1025, 100000};

static void test_matches_stat_compute_in_memory(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        for (int n_sets = 1; n_sets <= 5; n_sets++) check_against_reference(sizes[i], n_sets, 0, 100 * i + (size_t)n_sets);
}

/* The smallest budget (4 KiB: 256-key partitions, 16 write buffers, one direct count array) forces the
 * scratch file, many partition groups and huge buckets both counted directly and read back. */
static void test_matches_stat_compute_through_scratch_file(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        for (int n_sets = 1; n_sets <= 5; n_sets++)
            check_against_reference(sizes[i], n_sets, 4096, 1000 + 100 * i + (size_t)n_sets);
    check_against_reference(300000, 3, 65536, 77); /* a middle budget: few groups, big partitions */
}

/* Hand-made cases: all zeros of both signs (mean +0.0), constants, two huge buckets, one sample. */
static void test_special_values(void **state) {
    (void)state;
    kvs_sample_spill *spill = NULL;
    kvs_sample_set *a = NULL, *b = NULL;
    expect_ok(kvs_sample_spill_create(&spill));
    expect_ok(kvs_sample_spill_set_stats_memory(spill, 4096));
    expect_ok(kvs_sample_set_create(spill, 2, &a));
    expect_ok(kvs_sample_set_create(spill, 2, &b));
    enum { N = 5000 };
    double *r0 = malloc(N * sizeof(double)), *r1 = malloc(N * sizeof(double));
    assert_non_null(r0);
    assert_non_null(r1);
    for (int i = 0; i < N; i++) {
        float v[2] = {(i % 3) ? -0.0f : 0.0f, (i % 2) ? 3.0f : -1e-40f};
        r0[i] = v[0];
        r1[i] = v[1];
        expect_ok(kvs_sample_set_push(i % 5 ? a : b, v));
    }
    kvs_sample_set *sets[2] = {a, b};
    kvs_results_stat got[2], want;
    expect_ok(kvs_sample_stats_all(sets, 2, got));
    expect_ok(kvs_results_stat_compute(r0, N, &want));
    expect_same_stat(&got[0], &want);
    assert_true(double_bits(got[0].mean) == 0); /* +0.0 */
    expect_ok(kvs_results_stat_compute(r1, N, &want));
    expect_same_stat(&got[1], &want);
    /* one sample */
    kvs_sample_set *c = NULL;
    expect_ok(kvs_sample_set_create(spill, 2, &c));
    float v[2] = {-5.5f, INFINITY};
    expect_ok(kvs_sample_set_push(c, v));
    expect_ok(kvs_sample_stats_all(&c, 1, got));
    assert_int_equal(got[0].n, 1);
    assert_true(got[0].mean == -5.5 && got[0].p50 == -5.5 && got[0].p95 == -5.5 && got[0].min == -5.5 &&
                got[0].max == -5.5);
    assert_true(isinf(got[1].mean) && got[1].max == INFINITY);
    free(r0);
    free(r1);
    kvs_sample_set_free(a);
    kvs_sample_set_free(b);
    kvs_sample_set_free(c);
    kvs_sample_spill_free(spill);
}

static void test_no_samples_gives_zeros(void **state) {
    (void)state;
    kvs_sample_spill *spill = NULL;
    kvs_sample_set *a = NULL;
    expect_ok(kvs_sample_spill_create(&spill));
    expect_ok(kvs_sample_set_create(spill, 4, &a));
    kvs_results_stat st[4];
    memset(st, 0xAB, sizeof st);
    expect_ok(kvs_sample_stats_all(&a, 1, st));
    for (int m = 0; m < 4; m++)
        assert_true(st[m].n == 0 && st[m].mean == 0 && st[m].p50 == 0 && st[m].p95 == 0 && st[m].max == 0 &&
                    st[m].min == 0);
    memset(st, 0xAB, sizeof st);
    expect_ok(kvs_sample_stats(NULL, 0, 2, &st[0]));
    assert_true(st[0].n == 0 && st[0].mean == 0 && st[0].max == 0);
    assert_int_equal(kvs_sample_spill_bytes(spill), 0);
    kvs_sample_set_free(a);
    kvs_sample_spill_free(spill);
}

/* NaN in a spilled chunk and in a buffer: refused, naming the sample; other metrics still computable. */
static void test_nan_is_refused(void **state) {
    (void)state;
    for (int budget = 0; budget < 2; budget++) {
        kvs_sample_spill *spill = NULL;
        kvs_sample_set *sets[2] = {NULL, NULL};
        expect_ok(kvs_sample_spill_create(&spill));
        if (budget) expect_ok(kvs_sample_spill_set_stats_memory(spill, 4096));
        expect_ok(kvs_sample_set_create(spill, 3, &sets[0]));
        expect_ok(kvs_sample_set_create(spill, 3, &sets[1]));
        for (int i = 0; i < 4000; i++) {
            float v[3] = {(float)i, (float)-i, 0.5f};
            if (i == 500) v[2] = NAN;   /* set 1, sample 500: in a spilled chunk */
            if (i == 3900) v[1] = -NAN; /* set 0, sample 1900: still buffered */
            expect_ok(kvs_sample_set_push(sets[i < 2000 ? 1 : 0], v));
        }
        kvs_results_stat st[3];
        assert_int_equal(kvs_sample_stats(sets, 2, 2, &st[0]), KVS_ERR_INVALID_ARG);
        assert_string_equal(kvs_last_error(), "sample_stats: sample 500 of set 1 (metric 2) is NaN");
        assert_true(st[0].n == 0 && st[0].mean == 0);
        assert_int_equal(kvs_sample_stats(sets, 2, 1, &st[0]), KVS_ERR_INVALID_ARG);
        assert_string_equal(kvs_last_error(), "sample_stats: sample 1900 of set 0 (metric 1) is NaN");
        assert_int_equal(kvs_sample_stats_all(sets, 2, st), KVS_ERR_INVALID_ARG);
        assert_non_null(strstr(kvs_last_error(), "is NaN"));
        for (int m = 0; m < 3; m++) assert_true(st[m].n == 0 && st[m].max == 0);
        expect_ok(kvs_sample_stats(sets, 2, 0, &st[0]));
        assert_int_equal(st[0].n, 4000);
        assert_true(st[0].max == 3999.0 && st[0].min == 0.0 && st[0].mean == 1999.5);
        kvs_sample_set_free(sets[0]);
        kvs_sample_set_free(sets[1]);
        kvs_sample_spill_free(spill);
    }
}

static void test_bad_arguments(void **state) {
    (void)state;
    kvs_sample_spill *spill = NULL;
    kvs_sample_set *a = NULL, *b = NULL;
    kvs_results_stat st[3];
    assert_int_equal(kvs_sample_spill_create(NULL), KVS_ERR_INVALID_ARG);
    expect_ok(kvs_sample_spill_create(&spill));
    assert_int_equal(kvs_sample_set_create(spill, 0, &a), KVS_ERR_INVALID_ARG);
    assert_string_equal(kvs_last_error(), "sample_set_create: n_metrics 0 is not a positive count");
    assert_null(a);
    assert_int_equal(kvs_sample_set_create(NULL, 2, &a), KVS_ERR_INVALID_ARG);
    assert_int_equal(kvs_sample_spill_set_stats_memory(spill, 100), KVS_ERR_INVALID_ARG);
    expect_ok(kvs_sample_set_create(spill, 2, &a));
    expect_ok(kvs_sample_set_create(spill, 3, &b));
    assert_int_equal(kvs_sample_set_push(a, NULL), KVS_ERR_INVALID_ARG);
    assert_int_equal(kvs_sample_set_push(NULL, (const float[2]){1, 2}), KVS_ERR_INVALID_ARG);
    assert_int_equal(kvs_sample_set_count(a), 0);
    kvs_sample_set *both[2] = {a, b};
    assert_int_equal(kvs_sample_stats(both, 2, 2, &st[0]), KVS_ERR_INVALID_ARG);
    assert_string_equal(kvs_last_error(), "sample_stats: metric 2 out of range for set 0 (2 metrics)");
    assert_int_equal(kvs_sample_stats(both, 2, -1, &st[0]), KVS_ERR_INVALID_ARG);
    assert_int_equal(kvs_sample_stats(both, 2, 0, NULL), KVS_ERR_INVALID_ARG);
    assert_int_equal(kvs_sample_stats(NULL, 1, 0, &st[0]), KVS_ERR_INVALID_ARG);
    kvs_sample_set *with_null[2] = {a, NULL};
    assert_int_equal(kvs_sample_stats(with_null, 2, 0, &st[0]), KVS_ERR_INVALID_ARG);
    assert_string_equal(kvs_last_error(), "sample_stats: set 1 is NULL");
    assert_int_equal(kvs_sample_stats_all(both, 2, st), KVS_ERR_INVALID_ARG);
    assert_string_equal(kvs_last_error(), "sample_stats_all: set 1 has 3 metrics, set 0 has 2");
    assert_int_equal(kvs_sample_stats_all(both, 0, st), KVS_ERR_INVALID_ARG);
    assert_int_equal(kvs_sample_set_count(NULL), 0);
    assert_int_equal(kvs_sample_set_n_metrics(b), 3);
    assert_int_equal(kvs_sample_spill_bytes(NULL), 0);
    kvs_sample_set_free(NULL);
    kvs_sample_spill_free(NULL);
    kvs_sample_set_free(a);
    kvs_sample_set_free(b);
    kvs_sample_spill_free(spill);
}

/* The spill goes to $TMPDIR, unlinked; a TMPDIR that does not exist is a clear KVS_ERR_IO. */
static void test_spill_file_in_tmpdir_unlinked(void **state) {
    (void)state;
    char dir[] = "/tmp/kvs_samples_XXXXXX";
    assert_non_null(mkdtemp(dir));
    const char *old = getenv("TMPDIR");
    char *saved = old ? strdup(old) : NULL;
    setenv("TMPDIR", dir, 1);
    kvs_sample_spill *spill = NULL;
    expect_ok(kvs_sample_spill_create(&spill));
    DIR *d = opendir(dir);
    assert_non_null(d);
    int entries = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) entries++;
    closedir(d);
    assert_int_equal(entries, 0); /* unlinked at once */
    kvs_sample_spill_free(spill);
    assert_int_equal(rmdir(dir), 0);
    kvs_sample_spill *none = NULL;
    assert_int_equal(kvs_sample_spill_create(&none), KVS_ERR_IO); /* the directory is gone */
    assert_non_null(strstr(kvs_last_error(), dir));
    assert_null(none);
    if (saved) setenv("TMPDIR", saved, 1);
    else unsetenv("TMPDIR");
    free(saved);
}

/* A failing write (file size limit: EFBIG, as ENOSPC would be) is KVS_ERR_IO; the set is unchanged and a
 * later push succeeds once the limit is lifted. */
static void test_write_error_is_io_and_set_unchanged(void **state) {
    (void)state;
    kvs_sample_spill *spill = NULL;
    kvs_sample_set *a = NULL;
    expect_ok(kvs_sample_spill_create(&spill));
    expect_ok(kvs_sample_set_create(spill, 2, &a));
    struct rlimit old, lim;
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
    void (*old_sig)(int) = signal(SIGXFSZ, SIG_IGN);
    lim = old;
    lim.rlim_cur = 2 * KVS_SAMPLE_CHUNK * 2 * sizeof(float) + 100; /* two chunks and a bit */
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
    kvs_status st = KVS_OK;
    int64_t pushed = 0;
    for (int i = 0; i < 4 * KVS_SAMPLE_CHUNK && st == KVS_OK; i++) {
        float v[2] = {(float)i, 1.0f};
        st = kvs_sample_set_push(a, v);
        if (st == KVS_OK) pushed++;
    }
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
    signal(SIGXFSZ, old_sig);
    assert_int_equal(st, KVS_ERR_IO);
    assert_non_null(strstr(kvs_last_error(), "sample spill file: cannot write"));
    assert_int_equal(pushed, 3 * KVS_SAMPLE_CHUNK);
    assert_int_equal(kvs_sample_set_count(a), pushed);
    assert_int_equal(kvs_sample_spill_bytes(spill), 2 * KVS_SAMPLE_CHUNK * 2 * sizeof(float));
    float v[2] = {(float)pushed, 1.0f};
    expect_ok(kvs_sample_set_push(a, v)); /* the retry appends the third chunk over the partial write */
    kvs_results_stat s;
    expect_ok(kvs_sample_stats(&a, 1, 0, &s));
    assert_int_equal(s.n, pushed + 1);
    assert_true(s.min == 0.0 && s.max == (double)pushed && s.mean == (double)pushed / 2);
    kvs_sample_set_free(a);
    kvs_sample_spill_free(spill);
}

/* Opens this process's unlinked spill file again through /proc/self/fd and truncates it. */
static void truncate_spill(off_t size) {
    DIR *d = opendir("/proc/self/fd");
    assert_non_null(d);
    int done = 0;
    for (struct dirent *e; (e = readdir(d));) {
        char link[300], target[512];
        snprintf(link, sizeof link, "/proc/self/fd/%s", e->d_name);
        ssize_t len = readlink(link, target, sizeof target - 1);
        if (len <= 0) continue;
        target[len] = 0;
        if (!strstr(target, "/kvsim-samples-") || !strstr(target, "(deleted)")) continue;
        int fd = open(link, O_RDWR | O_CLOEXEC);
        assert_true(fd >= 0);
        assert_int_equal(ftruncate(fd, size), 0);
        close(fd);
        done++;
    }
    closedir(d);
    assert_int_equal(done, 1);
}

static void test_read_error_is_io(void **state) {
    (void)state;
    kvs_sample_spill *spill = NULL;
    kvs_sample_set *a = NULL;
    expect_ok(kvs_sample_spill_create(&spill));
    expect_ok(kvs_sample_set_create(spill, 2, &a));
    for (int i = 0; i < 5000; i++) expect_ok(kvs_sample_set_push(a, (const float[2]){(float)i, 2.0f}));
    truncate_spill(3 * KVS_SAMPLE_CHUNK * 2 * sizeof(float) + 12);
    kvs_results_stat s[2];
    assert_int_equal(kvs_sample_stats(&a, 1, 0, &s[0]), KVS_ERR_IO);
    assert_string_equal(kvs_last_error(),
                        "sample_stats: chunk 3 of set 0: sample spill file: file ends at offset 24588, 4084 bytes "
                        "before the end of the data (truncated)");
    assert_true(s[0].n == 0);
    assert_int_equal(kvs_sample_stats_all(&a, 1, s), KVS_ERR_IO);
    assert_non_null(strstr(kvs_last_error(), "(truncated)"));
    kvs_sample_set_free(a);
    kvs_sample_spill_free(spill);
}

/* ---- memory bound ---- */

static long status_kb(const char *field) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    long v = -1;
    size_t len = strlen(field);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, field, len) && line[len] == ':') v = strtol(line + len + 1, NULL, 10);
    fclose(f);
    return v;
}

/* Resets the peak RSS (VmHWM) to the current RSS where the kernel allows it (Linux >= 4.0). */
static void reset_peak_rss(void) {
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (!f) return;
    fputs("5", f);
    fclose(f);
}

#define BIG_N 1000000
#define BIG_M 16

/* A million samples of 16 metrics (64 MB of floats, 128 MB as doubles): pushing them grows the peak RSS
 * by under 4 MB and the statistics (4 MiB budget + 16 histograms of 512 KiB) by under a third of it; every statistic still exact. */
static void test_million_samples_memory_is_bounded(void **state) {
    (void)state;
    if (status_kb("VmHWM") < 0) skip();
    kvs_sample_spill *spill = NULL;
    kvs_sample_set *a = NULL;
    expect_ok(kvs_sample_spill_create(&spill));
    expect_ok(kvs_sample_spill_set_stats_memory(spill, (size_t)4 << 20));
    expect_ok(kvs_sample_set_create(spill, BIG_M, &a));
    uint64_t seeds[BIG_M], st[BIG_M];
    for (int m = 0; m < BIG_M; m++) seeds[m] = st[m] = 0x12345678ull * (uint64_t)(m + 1) + 99;
    kvs_results_stat got[BIG_M];
    memset(got, 0, sizeof got);

    reset_peak_rss();
    long base = status_kb("VmHWM");
    for (int64_t i = 0; i < BIG_N; i++) {
        float v[BIG_M];
        for (int m = 0; m < BIG_M; m++) v[m] = gen_metric(m, &st[m]);
        expect_ok(kvs_sample_set_push(a, v));
    }
    long after_push = status_kb("VmHWM");
    expect_ok(kvs_sample_stats_all(&a, 1, got));
    long after_stats = status_kb("VmHWM");
    long samples_kb = (long)BIG_N * BIG_M * (long)sizeof(float) / 1024;
    fprintf(stderr, "peak RSS growth: push %ld kB, stats %ld kB (samples %ld kB, spill %llu kB)\n", after_push - base,
            after_stats - base, samples_kb, (unsigned long long)(kvs_sample_spill_bytes(spill) / 1024));
    assert_true(after_push - base < 4096);
    assert_true(after_stats - base < samples_kb / 3);
    assert_int_equal(kvs_sample_set_count(a), BIG_N);

    double *ref = malloc(BIG_N * sizeof(double));
    assert_non_null(ref);
    for (int m = 0; m < BIG_M; m++) {
        uint64_t s = seeds[m];
        for (int64_t i = 0; i < BIG_N; i++) ref[i] = gen_metric(m, &s);
        kvs_results_stat want;
        expect_ok(kvs_results_stat_compute(ref, BIG_N, &want));
        expect_same_stat(&got[m], &want);
    }
    free(ref);
    kvs_sample_set_free(a);
    kvs_sample_spill_free(spill);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_million_samples_memory_is_bounded), /* first: a low peak RSS to start from */
        cmocka_unit_test(test_matches_stat_compute_in_memory),
        cmocka_unit_test(test_matches_stat_compute_through_scratch_file),
        cmocka_unit_test(test_special_values),
        cmocka_unit_test(test_no_samples_gives_zeros),
        cmocka_unit_test(test_nan_is_refused),
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_spill_file_in_tmpdir_unlinked),
        cmocka_unit_test(test_write_error_is_io_and_set_unchanged),
        cmocka_unit_test(test_read_error_is_io),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
