/* test_windows_measure.c — the replay of sliding-window layers (sim/replay.h "Sliding-window layers") beyond plain
 * decode measurement, and the capacity plan's roofline of such layers (analysis/plan_time.h):
 * - measured prompt positions (--measure all / prefill): on a generated two-turn trace whose first layer attends to a
 *   window of 4, the window policy and the full cache attend, at every measured position, the positions computed here
 *   by hand (the first turn's prompt: the window; a decode step: the last B of the window; the second turn's prompt:
 *   what the policy held of the window plus the block), with the output error and recall of attention computed here
 *   in double against the windowed reference, and as many positions' bytes resident;
 * - page granularity (sim/host.h "page granularity"): pages of 4 on a window of 5: the attended set never leaves the
 *   window (a page straddling its edge attends only its positions inside it; one page for a budget of 2), while a
 *   resident page counts its 4 slots whole (what vLLM's sliding-window manager holds): by hand;
 * - a codec (fp8 e4m3, scale 1) on a windowed layer: the output error of attention over fp8-rounded rows of the
 *   window (the rounding written here) against the full-precision windowed reference, the codec's bytes of the
 *   window's positions (d bytes of K and d of V each), the first prompt in full precision (error 0);
 * - both engines bit for bit (kvs_replay_execute against kvs_replay_reference) for every policy listed with
 *   window_evict, chunked prefill and per-query-head lists, under --measure all and prefill, pages of 2 and 4 (both
 *   score rules), four codecs and a codec with pages; nothing attended outside the window; and a capture of the tiny
 *   Gemma-3 fixture (fp16 K/V: the fast engine's 16-bit history) the same way;
 * - the roofline of a hybrid model (--window 8/2 on a 4-layer shape): the decode step's K/V reads and attention
 *   FLOPs of a windowed layer capped at min(W, n) positions, the prefill's attention pairs at sum min(p + 1, W), each
 *   against numbers computed here by hand.
 * Data is GENERATED (tests/util/gen_trace.h).
 */
#include <fenv.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "analysis/plan.h"
#include "analysis/plan_time.h"
#include "common/kvs.h"
#include "policies/registry.h"
#include "sim/codec.h"
#include "sim/host.h"
#include "sim/replay.h"
#include "sim/replay_mem.h"
#include "tests/util/cli_run.h"
#include "tests/util/gen_trace.h"
#include "tests/util/replay_fixture.h"
#include "tests/util/testenv.h"
#include "trace/trace.h"


/* The relative L2 error of out against ref, and the reference mass on [first, last]. */
static double rel_err(const double *ref, const double *out, size_t d) {
    double e2 = 0, r2 = 0;
    for (size_t e = 0; e < d; e++) e2 += (ref[e] - out[e]) * (ref[e] - out[e]), r2 += ref[e] * ref[e];
    return sqrt(e2 / r2);
}

/* One measured sample against what was computed here: the error (relative tolerance 1e-4), the recall, the attended
 * count and the resident / read KV bytes exactly. */
static void check_sample(const char *what, const kvs_results_step *st, double err, double recall, double n_att,
                         double kv_bytes, double read_bytes) {
    if (fabs(st->v[KVS_M_OUT_ERR] - err) > 1e-4 * err + 1e-6 || fabs(st->v[KVS_M_ATTN_RECALL] - recall) > 1e-5 ||
        st->v[KVS_M_ATTENDED] != n_att || st->v[KVS_M_STORAGE_KV] != kv_bytes || st->v[KVS_M_TRAFFIC_KV] != read_bytes)
        fail_msg("%s, layer %d pos %lld head %d: err %.9g (by hand %.9g) recall %.9g (%.9g) attended %g (%g) "
                 "kv %g (%g) read %g (%g)",
                 what, (int)st->layer, (long long)st->position, (int)st->q_head, st->v[KVS_M_OUT_ERR], err,
                 st->v[KVS_M_ATTN_RECALL], recall, st->v[KVS_M_ATTENDED], n_att, st->v[KVS_M_STORAGE_KV], kv_bytes,
                 st->v[KVS_M_TRAFFIC_KV], read_bytes);
}

static kvs_replay_config config_of(const char *spec, int64_t budget) {
    kvs_replay_config c = {.budget = budget, .budget_fraction = -1};
    assert_int_equal(kvs_policy_parse(spec, &c.policy), KVS_OK);
    return c;
}

/* ---- measured prompt positions, by hand ---- */

/* Two turns of 20 positions (10 prompt, 10 generated), layer 0 windowed to W = 4, layer 1 full; the window policy
 * at B = 2 and 3 and the full cache, --measure all and --measure prefill, both engines. What each attends at p (lo =
 * the window's first position, 0 on the full layer): the first turn's prompt, prefilled whole: lo..p (nothing held
 * before it, the block masked to the window: error 0); a decode step: max(lo, p-B+1)..p; the second turn's prompt
 * (turn begins at bb): the window policy held bb-B+1..bb-1 of the window, so max(lo, bb-B+1)..p; the full cache
 * lo..p everywhere. Resident and read KV bytes: those positions (the prompt's rest of the block is transient). */
static void test_measure_prompt_by_hand(void **state) {
    (void)state;
    enum { W = 4, TURN = 20, PROMPT = 10 };
    kvs_test_replay_fixture f;
    kvs_gen_trace_opts go = kvs_test_grouped_opts(2, 2, 2 * TURN, -1, 8, 11);
    assert_int_equal(kvs_test_replay_fixture_make(&go, 2, 7, &f), KVS_OK);
    assert_int_equal(f.turns[1].begin, TURN);
    assert_int_equal(f.turns[1].prompt_end, TURN + PROMPT);
    kvs_replay_source src;
    assert_int_equal(kvs_replay_source_from_memory(&f.mem, &src), KVS_OK);
    const int32_t windows[2] = {W, 0};
    src.layer_window = windows;
    kvs_replay_config cfg[3] = {config_of("window", 2), config_of("window", 3), config_of("full", 3)};
    size_t d = (size_t)f.d, row = (size_t)f.H * d, krow = (size_t)f.Hkv * d, N = (size_t)f.N;
    double pos_bytes = 2.0 * (double)d * 2;
    double ref[64], out[64], pr[64], pw[64];
    const kvs_replay_measure modes[2] = {KVS_MEASURE_ALL, KVS_MEASURE_PREFILL};
    for (int mode = 0; mode < 2; mode++)
        for (int engine = 0; engine < 2; engine++) {
            kvs_replay_opts o = {.configs = cfg, .n_configs = 3, .threads = 2, .measure = modes[mode], .series_every = 1};
            kvs_replay_result *r = NULL;
            assert_int_equal(engine ? kvs_replay_reference(&src, &o, &r) : kvs_replay_execute(&src, &o, &r), KVS_OK);
            int prompt_checked = 0, decode_checked = 0;
            for (int c = 0; c < 3; c++) {
                const kvs_replay_run_result *run = &r->runs[c];
                if (run->status != KVS_OK) fail_msg("config %d: %s", c, run->error);
                int64_t B = c == 2 ? -1 : cfg[c].budget;
                for (int64_t s = 0; s < run->n_steps; s++) {
                    const kvs_results_step *st = &run->steps[s];
                    int64_t p = st->position, lo = st->layer == 0 && p - W + 1 > 0 ? p - W + 1 : 0;
                    int64_t bb = p < TURN ? 0 : TURN, pe = bb + PROMPT;
                    int is_prompt = p < pe;
                    if (mode == 1) assert_true(is_prompt);
                    int64_t first = lo;
                    if (B > 0 && !is_prompt && p - B + 1 > first) first = p - B + 1;
                    if (B > 0 && is_prompt && bb > 0 && bb - B + 1 > first) first = bb - B + 1;
                    int hq = st->q_head, h = hq / f.G;
                    const float *q = f.g->q + ((size_t)st->layer * N + (size_t)p) * row + (size_t)hq * d;
                    const float *k = f.g->k + (size_t)st->layer * N * krow + (size_t)h * d;
                    const float *v = f.g->v + (size_t)st->layer * N * krow + (size_t)h * d;
                    kvs_test_attend_rows(q, k, v, krow, lo, p, d, f.scale, ref, pr);
                    kvs_test_attend_rows(q, k, v, krow, first, p, d, f.scale, out, pw);
                    double recall = 0, n_att = (double)(p - first + 1);
                    for (int64_t j = first; j <= p; j++) recall += pr[j];
                    char what[96];
                    snprintf(what, sizeof what, "mode %d engine %d config %d", mode, engine, c);
                    check_sample(what, st, rel_err(ref, out, d), recall, n_att, n_att * pos_bytes, n_att * pos_bytes);
                    if (st->layer == 0 && first == lo) assert_true(st->v[KVS_M_OUT_ERR] == 0);
                    if (st->layer == 0 && p >= W) {
                        prompt_checked += is_prompt;
                        decode_checked += !is_prompt;
                    }
                }
            }
            /* windowed prompt positions past the window: 6 of turn 0 and 10 of turn 1, 4 query heads, 3 configs */
            assert_int_equal(prompt_checked, 3 * 4 * (6 + 10));
            assert_int_equal(decode_checked, mode == 0 ? 3 * 4 * 20 : 0);
            kvs_replay_result_free(r);
        }
    kvs_test_replay_fixture_free(&f);
}

/* ---- page granularity, by hand ---- */

/* One turn of 30 positions (prompt 10), layer 0 windowed to W = 5, layer 1 full, pages of 4. At decode position p
 * (lo = p-4 on layer 0, 0 on layer 1): the full cache and the window policy at B = 8 (2 pages) attend exactly lo..p
 * (its pages: floor(lo/4) .. floor(p/4), at most 2 on layer 0), error 0 on layer 0; a page straddling the window's
 * edge counts all its 4 slots resident: (floor(p/4) - floor(lo/4) + 1) x 4 positions of bytes, the read lo..p.
 * The window policy at B = 2 (1 page: the newest) attends max(lo, 4 floor(p/4))..p, the pages of {p-1, p} resident
 * (both layers; B = 8 is checked on the windowed layer only). */
static void test_pages_by_hand(void **state) {
    (void)state;
    enum { W = 5, P = 4 };
    kvs_test_replay_fixture f;
    kvs_gen_trace_opts go = kvs_test_grouped_opts(1, 2, 30, 10, 8, 5);
    assert_int_equal(kvs_test_replay_fixture_make(&go, 2, 7, &f), KVS_OK);
    kvs_replay_source src;
    assert_int_equal(kvs_replay_source_from_memory(&f.mem, &src), KVS_OK);
    const int32_t windows[2] = {W, 0};
    src.layer_window = windows;
    kvs_replay_config cfg[3] = {config_of("full", 8), config_of("window", 8), config_of("window", 2)};
    const int64_t pages[3] = {P, P, P};
    size_t d = (size_t)f.d, row = (size_t)f.H * d, krow = (size_t)f.Hkv * d, N = (size_t)f.N;
    double pos_bytes = 2.0 * (double)d * 2;
    double ref[64], out[64], pr[64], pw[64];
    for (int engine = 0; engine < 2; engine++) {
        kvs_replay_opts o = {.configs = cfg, .n_configs = 3, .threads = 2, .measure = KVS_MEASURE_DECODE,
                             .series_every = 1, .pages = pages};
        kvs_replay_result *r = NULL;
        assert_int_equal(engine ? kvs_replay_reference(&src, &o, &r) : kvs_replay_execute(&src, &o, &r), KVS_OK);
        int straddling = 0;
        for (int c = 0; c < 3; c++) {
            const kvs_replay_run_result *run = &r->runs[c];
            if (run->status != KVS_OK) fail_msg("config %d: %s", c, run->error);
            for (int64_t s = 0; s < run->n_steps; s++) {
                const kvs_results_step *st = &run->steps[s];
                if (c == 1 && st->layer == 1) continue; /* B = 8 < p + 1: its pages on the full layer are not lo..p */
                int64_t p = st->position, lo = st->layer == 0 && p - W + 1 > 0 ? p - W + 1 : 0;
                int64_t first = lo, resident_pages = p / P - lo / P + 1;
                if (c == 2) {
                    first = P * (p / P) > lo ? P * (p / P) : lo;
                    resident_pages = (p - 1) / P == p / P ? 1 : 2;
                }
                int hq = st->q_head, h = hq / f.G;
                const float *q = f.g->q + ((size_t)st->layer * N + (size_t)p) * row + (size_t)hq * d;
                const float *k = f.g->k + (size_t)st->layer * N * krow + (size_t)h * d;
                const float *v = f.g->v + (size_t)st->layer * N * krow + (size_t)h * d;
                kvs_test_attend_rows(q, k, v, krow, lo, p, d, f.scale, ref, pr);
                kvs_test_attend_rows(q, k, v, krow, first, p, d, f.scale, out, pw);
                double recall = 0, n_att = (double)(p - first + 1);
                for (int64_t j = first; j <= p; j++) recall += pr[j];
                char what[64];
                snprintf(what, sizeof what, "engine %d config %d", engine, c);
                check_sample(what, st, rel_err(ref, out, d), recall, n_att, (double)(resident_pages * P) * pos_bytes,
                             n_att * pos_bytes);
                if (st->layer == 0 && c < 2) assert_true(st->v[KVS_M_OUT_ERR] == 0);
                straddling += st->layer == 0 && c == 0 && lo % P != 0;
            }
        }
        assert_true(straddling >= 4 * 10); /* pages reaching behind the window were counted whole */
        kvs_replay_result_free(r);
    }
    kvs_test_replay_fixture_free(&f);
}

/* ---- a codec, by hand ---- */

/* x rounded to the nearest fp8 e4m3 value (ties to even; 3 mantissa bits, exponents -6..8, subnormals in steps of
 * 2^-9, saturating at 448), as a value. */
static double fp8_e4m3(double x) {
    double a = fabs(x);
    if (a == 0) return x;
    int e;
    frexp(a, &e); /* a = m 2^e, m in [0.5, 1): the leading bit is 2^(e-1) */
    int lead = e - 1 < -6 ? -6 : e - 1;
    double step = ldexp(1.0, lead - 3);
    double r = nearbyint(a / step) * step; /* the default rounding mode: to nearest, ties to even */
    if (r > 448) r = 448;
    return x < 0 ? -r : r;
}

/* One turn of 30 positions (prompt 10), layer 0 windowed to W = 5, layer 1 full, codec fp8:scale=1 (every position
 * in e4m3 from the first decode step on; the first prompt in full precision), --measure all: at a prompt position
 * every policy attends lo..p in full precision (error 0 on layer 0, 2 bytes an element); at decode position p the
 * full cache attends lo..p and the window policy at B = 3 max(lo, p-2)..p over the fp8-rounded rows (rounded here),
 * against the full-precision windowed reference; resident and read: d bytes of K and d of V per attended position
 * (the full cache holds the window's positions only). */
static void test_codec_by_hand(void **state) {
    (void)state;
    enum { W = 5, PROMPT = 10 };
    kvs_test_replay_fixture f;
    kvs_gen_trace_opts go = kvs_test_grouped_opts(1, 2, 30, PROMPT, 8, 9);
    assert_int_equal(kvs_test_replay_fixture_make(&go, 2, 7, &f), KVS_OK);
    kvs_replay_source src;
    assert_int_equal(kvs_replay_source_from_memory(&f.mem, &src), KVS_OK);
    const int32_t windows[2] = {W, 0};
    src.layer_window = windows;
    kvs_codec *codec = NULL;
    assert_int_equal(kvs_codec_parse("fp8:scale=1", &codec), KVS_OK);
    kvs_replay_config cfg[2] = {config_of("full", 8), config_of("window", 3)};
    const kvs_codec *codecs[2] = {codec, codec};
    size_t d = (size_t)f.d, row = (size_t)f.H * d, krow = (size_t)f.Hkv * d, N = (size_t)f.N;
    size_t L = (size_t)f.L;
    float *k8 = malloc(L * N * krow * sizeof(float)), *v8 = malloc(L * N * krow * sizeof(float));
    assert_non_null(k8);
    assert_non_null(v8);
    assert_int_equal(fegetround(), FE_TONEAREST);
    for (size_t i = 0; i < L * N * krow; i++) k8[i] = (float)fp8_e4m3(f.g->k[i]), v8[i] = (float)fp8_e4m3(f.g->v[i]);
    assert_true(fp8_e4m3(0.3) == 0.3125 && fp8_e4m3(-1000) == -448 && fp8_e4m3(0.001) == ldexp(1.0, -9));
    double ref[64], out[64], pr[64], pw[64];
    for (int engine = 0; engine < 2; engine++) {
        kvs_replay_opts o = {.configs = cfg, .n_configs = 2, .threads = 2, .measure = KVS_MEASURE_ALL,
                             .series_every = 1, .codecs = codecs};
        kvs_replay_result *r = NULL;
        assert_int_equal(engine ? kvs_replay_reference(&src, &o, &r) : kvs_replay_execute(&src, &o, &r), KVS_OK);
        int coded = 0;
        for (int c = 0; c < 2; c++) {
            const kvs_replay_run_result *run = &r->runs[c];
            if (run->status != KVS_OK) fail_msg("config %d: %s", c, run->error);
            for (int64_t s = 0; s < run->n_steps; s++) {
                const kvs_results_step *st = &run->steps[s];
                int64_t p = st->position, lo = st->layer == 0 && p - W + 1 > 0 ? p - W + 1 : 0;
                int is_prompt = p < PROMPT;
                int64_t first = !is_prompt && c == 1 && p - 2 > lo ? p - 2 : lo;
                int hq = st->q_head, h = hq / f.G;
                size_t koff = (size_t)st->layer * N * krow + (size_t)h * d;
                const float *q = f.g->q + ((size_t)st->layer * N + (size_t)p) * row + (size_t)hq * d;
                kvs_test_attend_rows(q, f.g->k + koff, f.g->v + koff, krow, lo, p, d, f.scale, ref, pr);
                if (is_prompt) kvs_test_attend_rows(q, f.g->k + koff, f.g->v + koff, krow, first, p, d, f.scale, out, pw);
                else kvs_test_attend_rows(q, k8 + koff, v8 + koff, krow, first, p, d, f.scale, out, pw);
                double recall = 0, n_att = (double)(p - first + 1), per_pos = is_prompt ? 4.0 * (double)d : 2.0 * (double)d;
                for (int64_t j = first; j <= p; j++) recall += pr[j];
                char what[64];
                snprintf(what, sizeof what, "engine %d config %d", engine, c);
                check_sample(what, st, rel_err(ref, out, d), recall, n_att, n_att * per_pos, n_att * per_pos);
                if (is_prompt && st->layer == 0) assert_true(st->v[KVS_M_OUT_ERR] == 0);
                coded += !is_prompt && st->layer == 0 && st->v[KVS_M_OUT_ERR] > 1e-3;
            }
        }
        assert_true(coded >= 2 * 4 * 15); /* the fp8 rows moved the output at most decode steps */
        kvs_replay_result_free(r);
    }
    free(k8);
    free(v8);
    kvs_codec_free(codec);
    kvs_test_replay_fixture_free(&f);
}

/* ---- both engines, bit for bit ---- */

/* Besides every registered policy (each has window_evict), variants taking other paths (chunked prefill, one list per
 * query head). */
static const char *const engine_variants[] = {"h2o:block=4", "h2o:gqa=mean", "streaming:sinks=2"};
enum { N_VARIANTS = (int)(sizeof engine_variants / sizeof engine_variants[0]) };

static const char *const engine_codecs[] = {"int:bits=4,group=4,k_axis=token,v_axis=channel",
                                            "kivi:bits=2,group=4,residual=4", "fp8:scale=1",
                                            "think:ratio=0.5,window=4,recent=2"};

/* A generated two-turn trace (layer 0 windowed to 5 positions, layer 1 full) through both engines under six
 * variants: --measure all, --measure prefill, pages of 4 (the default score rule), pages of 2 counted, a codec each
 * (four codecs in turn), a codec with pages of 4; every listed policy at budgets 3, 5 and 9: every statistic, the
 * series and the largest attended set bit for bit, and nothing on layer 0 attended beyond the window's W
 * positions. */
static void test_engines_bit_for_bit(void **state) {
    (void)state;
    enum { W = 5, MAX_CONFIGS = 256 };
    kvs_test_replay_fixture f;
    kvs_gen_trace_opts go = kvs_test_grouped_opts(2, 2, 60, -1, 8, 3);
    assert_int_equal(kvs_test_replay_fixture_make(&go, 2, 7, &f), KVS_OK);
    kvs_replay_source src;
    assert_int_equal(kvs_replay_source_from_memory(&f.mem, &src), KVS_OK);
    const int32_t windows[2] = {W, 0};
    src.layer_window = windows;
    kvs_codec *codecs[4];
    for (int k = 0; k < 4; k++) assert_int_equal(kvs_codec_parse(engine_codecs[k], &codecs[k]), KVS_OK);
    static kvs_replay_config cfg[MAX_CONFIGS];
    static char names[MAX_CONFIGS][128];
    const int64_t budgets[] = {3, 5, 9, 24};
    int n = 0;
    for (int i = 0; i < kvs_policy_count() + N_VARIANTS; i++) {
        const char *spec = i < kvs_policy_count() ? kvs_policy_at(i)->name : engine_variants[i - kvs_policy_count()];
        if (!strcmp(spec, "duo")) continue; /* validates only with its gate file (tests/test_windows_retrieval.c) */
        int replayed = 0;
        for (int b = 0; b < 4; b++) {
            kvs_replay_config c = config_of(spec, budgets[b]);
            assert_non_null(c.policy.ops->window_evict);
            if (kvs_policy_validate(&c.policy, &src.model, c.budget) != KVS_OK) continue;
            assert_true(n < MAX_CONFIGS);
            snprintf(names[n], sizeof names[n], "%.96s at budget %lld", spec, (long long)c.budget);
            cfg[n++] = c;
            replayed++;
        }
        if (!replayed) fail_msg("%s: no budget of 3, 5, 9, 24 replayed", spec);
    }
    assert_true(n >= 3 * 30);
    static int64_t pages[MAX_CONFIGS];
    static int page_scores[MAX_CONFIGS];
    static const kvs_codec *cc[MAX_CONFIGS];
    for (int variant = 0; variant < 6; variant++) {
        kvs_replay_opts o = {.configs = cfg, .n_configs = n, .threads = 2, .series_every = 2,
                             .measure = variant == 1 ? KVS_MEASURE_PREFILL : KVS_MEASURE_ALL};
        for (int i = 0; i < n; i++) {
            pages[i] = variant == 2 || variant == 5 ? 4 : variant == 3 ? 2 : 0;
            page_scores[i] = variant == 3 ? KVS_PAGE_SCORE_COUNT : KVS_PAGE_SCORE_AUTO;
            cc[i] = variant >= 4 ? codecs[i % 4] : NULL;
        }
        if (variant >= 2 && variant != 4) o.pages = pages, o.page_scores = page_scores;
        if (variant >= 4) o.codecs = cc;
        kvs_replay_result *fast = NULL, *ref = NULL;
        assert_int_equal(kvs_replay_execute(&src, &o, &fast), KVS_OK);
        assert_int_equal(kvs_replay_reference(&src, &o, &ref), KVS_OK);
        for (int i = 0; i < n; i++) {
            const kvs_replay_run_result *x = &fast->runs[i], *y = &ref->runs[i];
            char why[512];
            if (kvs_test_runs_differ(x, y, why, sizeof why)) fail_msg("variant %d, %s: %s", variant, names[i], why);
            for (int64_t k = 0; k < x->n_steps; k++) {
                const kvs_results_step *a = &x->steps[k];
                if (a->layer == 0 && a->v[KVS_M_ATTENDED] > W)
                    fail_msg("variant %d, %s: %g attended at position %lld of the windowed layer", variant, names[i],
                             a->v[KVS_M_ATTENDED], (long long)a->position);
            }
        }
        kvs_replay_result_free(fast);
        kvs_replay_result_free(ref);
    }
    for (int k = 0; k < 4; k++) kvs_codec_free(codecs[k]);
    kvs_test_replay_fixture_free(&f);
}

/* A capture of the tiny Gemma-3 fixture (tests/fixtures/gemma3_tiny: windows 6,0,6,6 over 33 positions, fp16) through
 * both engines, --measure all, a codec and pages of 4 in turn, and the full cache with both: bit for bit, the full
 * cache's error 0 without a codec (its pages attend exactly the window), at most the window attended on the windowed
 * layers. */
static void test_gemma3_engines_all_pages_codec(void **state) {
    kvs_test_cli_fx *f = *state;
    if (!kvs_test_kvsim_bin()) skip();
    char path[256], fixture[4096];
    snprintf(path, sizeof path, "%s/g.kvt", f->dir);
    snprintf(fixture, sizeof fixture, "%s/tests/fixtures/gemma3_tiny", kvs_test_root());
    const char *args[] = {"capture", "--model", fixture, "--prompt-ids", "17,42,5,9,11,30,31,32", "--steps", "24",
                          "--ignore-eos", "--out", path, NULL};
    assert_int_equal(kvs_test_cli_run(f, args), 0);
    kvs_trace *t = NULL;
    assert_int_equal(kvs_trace_open(path, &t), KVS_OK);
    kvs_replay_source src;
    assert_int_equal(kvs_replay_source_from_trace(t, &src), KVS_OK);
    assert_non_null(src.layer_window);
    static const char *const specs[] = {"window", "h2o", "snapkv", "tova", "keydiff", "full"};
    enum { NS = 6, NB = 2 };
    const int64_t budgets[NB] = {3, 8};
    kvs_replay_config cfg[NS * NB];
    int n = 0;
    for (int i = 0; i < NS; i++)
        for (int b = 0; b < NB; b++) {
            kvs_replay_config c = config_of(specs[i], budgets[b]);
            if (kvs_policy_validate(&c.policy, &src.model, c.budget) == KVS_OK) cfg[n++] = c;
        }
    assert_true(n >= 10);
    kvs_codec *codec = NULL;
    assert_int_equal(kvs_codec_parse("kivi:bits=2,group=4,residual=4", &codec), KVS_OK);
    int64_t pages[NS * NB];
    const kvs_codec *cc[NS * NB];
    for (int i = 0; i < n; i++) pages[i] = 4, cc[i] = codec;
    for (int variant = 0; variant < 3; variant++) {
        kvs_replay_opts o = {.configs = cfg, .n_configs = n, .threads = 2, .series_every = 1,
                             .measure = KVS_MEASURE_ALL};
        if (variant != 1) o.pages = pages;
        if (variant != 0) o.codecs = cc;
        kvs_replay_result *fast = NULL, *ref = NULL;
        assert_int_equal(kvs_replay_execute(&src, &o, &fast), KVS_OK);
        assert_int_equal(kvs_replay_reference(&src, &o, &ref), KVS_OK);
        for (int i = 0; i < n; i++) {
            const kvs_replay_run_result *x = &fast->runs[i], *y = &ref->runs[i];
            char what[96], why[512];
            snprintf(what, sizeof what, "variant %d, %s at budget %lld", variant, cfg[i].policy.ops->name,
                     (long long)cfg[i].budget);
            if (kvs_test_runs_differ(x, y, why, sizeof why)) fail_msg("%s: %s", what, why);
            for (int64_t k = 0; k < x->n_steps; k++) {
                const kvs_results_step *a = &x->steps[k];
                int32_t w = src.layer_window[a->layer];
                if (w > 0 && a->v[KVS_M_ATTENDED] > w) fail_msg("%s: %g attended", what, a->v[KVS_M_ATTENDED]);
                if (variant == 0 && !strcmp(cfg[i].policy.ops->name, "full") && a->v[KVS_M_OUT_ERR] != 0)
                    fail_msg("%s: layer %d pos %lld error %g", what, (int)a->layer, (long long)a->position,
                             a->v[KVS_M_OUT_ERR]);
            }
        }
        kvs_replay_result_free(fast);
        kvs_replay_result_free(ref);
    }
    kvs_codec_free(codec);
    kvs_trace_close(t);
}

/* ---- the roofline of sliding-window layers ---- */

static int near(double a, double b) { return fabs(a - b) <= 1e-12 * fabs(b) + 1e-300; }

/* A 4-layer shape (hidden 64, 4 query heads and 2 KV heads of head_dim 16, fp16 K/V: 64 bytes a token per (layer, KV
 * head)) with --window 8/2 (layers 2 and 4 full, 1 and 3 windowed to 8) on a GPU of 1 TB/s and 100 TFLOPS, batch 1:
 * the decode step at n = 20 reads 2 full layers x 20 + 2 windowed x 8 = 56 positions a KV head (x 2 KV heads x 64
 * bytes), attends 56 positions per query head over the layers (4 heads x 4 d FLOPs each); the full cache without
 * windows reads 80; window B = 5 reads 5 a layer everywhere (below the window). The prefill of P = 12: the attention
 * pairs per head are 12 x 13 / 2 = 78 on a full layer and 8 x 9 / 2 + 4 x 8 = 68 on a windowed one; at P = 6 (inside
 * the window) both 21. */
static void test_plan_time_windows_by_hand(void **state) {
    (void)state;
    kvs_plan_setup s;
    memset(&s, 0, sizeof s);
    kvs_plan_model *m = &s.model;
    snprintf(m->name, sizeof m->name, "hand");
    m->n_layers = 4, m->hidden = 64, m->n_heads = 4, m->n_kv_heads = 2, m->head_dim = 16, m->intermediate = 128;
    m->vocab = 100, m->tied_embeddings = 1, m->max_positions = 1024;
    s.kv_elem_bytes = 2, s.weight_elem_bytes = 2, s.n_gpus = 1;
    kvs_plan_time_setup t = {.mbu = 1, .mfu = 1};
    snprintf(t.hw.name, sizeof t.hw.name, "hand");
    t.hw.hbm_bw = 1e12, t.hw.flops16 = 1e14, t.hw.host_bw = 1e10, t.hw.link_bw = 1e10;
    const kvs_plan_policy full = {.kind = KVS_PLAN_FULL}, win = {.kind = KVS_PLAN_CONSTANT, .budget = 5};
    const double W_bytes = kvs_plan_weight_bytes(&s), Pm = kvs_plan_matmul_params(m), tok = 2.0 * 16 * 2;
    /* no windows: the reference numbers */
    kvs_plan_phase d0 = kvs_plan_decode_step(&s, &t, &full, 10, 20, 1);
    assert_true(near(d0.bytes, W_bytes + 4 * 2 * 20 * tok));
    assert_true(near(d0.flops, 2 * Pm + 4 * 4 * 4.0 * 16 * 20));
    assert_int_equal(kvs_plan_window_parse("8/2", m), KVS_OK);
    assert_int_equal(m->window, 8);
    assert_int_equal(m->window_layers, 2);
    kvs_plan_phase d1 = kvs_plan_decode_step(&s, &t, &full, 10, 20, 1);
    assert_true(near(d1.bytes, W_bytes + 2 * (2 * 20 + 2 * 8) * tok));
    assert_true(near(d1.flops, 2 * Pm + 4 * 4.0 * 16 * (2 * 20 + 2 * 8)));
    assert_true(near(d1.t_memory, d1.bytes / 1e12));
    /* the per-layer figures: the mean layer's attention and reads */
    const double Lp = kvs_plan_layer_params(m);
    assert_true(near(d1.layer_bytes, Lp * 2 + 2 * (2 * 20 + 2 * 8) * tok / 4));
    assert_true(near(d1.layer_flops, 2 * Lp + 4 * 4.0 * 16 * (2 * 20 + 2 * 8) / 4));
    /* below the window nothing changes: n = 8 */
    kvs_plan_phase d2 = kvs_plan_decode_step(&s, &t, &full, 4, 8, 1);
    assert_true(near(d2.bytes, W_bytes + 4 * 2 * 8 * tok));
    /* a budget below the window reads its budget on every layer */
    kvs_plan_phase d3 = kvs_plan_decode_step(&s, &t, &win, 10, 20, 1);
    assert_true(near(d3.bytes, W_bytes + 4 * 2 * 5 * tok));
    assert_true(near(d3.flops, 2 * Pm + 4 * 4 * 4.0 * 16 * 5));
    /* the prefill's attention pairs */
    kvs_plan_phase p1 = kvs_plan_prefill(&s, &t, 12, 1);
    assert_true(near(p1.flops, 2 * Pm * 12 + 4 * 4.0 * 16 * (2 * 78 + 2 * 68)));
    assert_true(near(p1.layer_flops, 2 * Lp * 12 + 4 * 4.0 * 16 * (2 * 78 + 2 * 68) / 4));
    kvs_plan_phase p2 = kvs_plan_prefill(&s, &t, 6, 1);
    assert_true(near(p2.flops, 2 * Pm * 6 + 4 * 4 * 4.0 * 16 * 21));
    /* the timing's last step and TPOT follow the step: R = 1 step at n = 21 */
    kvs_plan_timing tm;
    assert_int_equal(kvs_plan_time(&s, &t, &full, 20, 1, 1, &tm), KVS_OK);
    assert_true(near(tm.last_step.bytes, W_bytes + 2 * (2 * 21 + 2 * 8) * tok));
    assert_true(near(tm.tpot, tm.last_step.seconds));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_measure_prompt_by_hand),
        cmocka_unit_test(test_pages_by_hand),
        cmocka_unit_test(test_codec_by_hand),
        cmocka_unit_test(test_engines_bit_for_bit),
        cmocka_unit_test_setup_teardown(test_gemma3_engines_all_pages_codec, kvs_test_cli_setup, kvs_test_cli_teardown),
        cmocka_unit_test(test_plan_time_windows_by_hand),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
