/* test_policies_prompt.c — the observation-window policies (policies/snapkv.c, pyramidkv.c, adakv.c) and
 * Scissorhands (policies/scissorhands.c) against NAIVE references written here, independently of the policy
 * code: attention by hand with exp()/sum in double, pooling by explicit loops, every candidate sorted with
 * qsort, the top ones picked; Scissorhands replayed with a full [observation][position] flag matrix.
 * Policies are driven through their ops directly (create/prefill/select/observe, and alloc_* for the budget
 * allocation of PyramidKV and Ada-KV) on small GENERATED streams (a seeded uniform generator here, not a
 * model). Specs: POLICY_SPEC §2.6 B5 (SnapKV, with KeyDiff's block-wise prompt processing), B6 (Scissorhands),
 * the appendix rows PyramidKV and Ada-KV.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../policies/registry.h"

/* ---- generated streams --------------------------------------------------------------------------- */

typedef struct {
    int G, d;
    int64_t N;
    float *q;    /* [N][G][d] */
    float *k, *v; /* [N][d] */
} stream;

static uint64_t rng_next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static float rng_unit(uint64_t *s) { return (float)((double)(rng_next(s) >> 11) / 9007199254740992.0) * 2.0f - 1.0f; }

static void stream_make(stream *s, int64_t N, int G, int d, uint64_t seed) {
    s->N = N;
    s->G = G;
    s->d = d;
    s->q = malloc((size_t)N * (size_t)G * (size_t)d * sizeof(float));
    s->k = malloc((size_t)N * (size_t)d * sizeof(float));
    s->v = malloc((size_t)N * (size_t)d * sizeof(float));
    assert_non_null(s->q);
    assert_non_null(s->k);
    assert_non_null(s->v);
    uint64_t r = seed * 0x9E3779B97F4A7C15ull + 1;
    for (int64_t i = 0; i < N * G * d; i++) s->q[i] = 3.0f * rng_unit(&r); /* sharp attention */
    for (int64_t i = 0; i < N * d; i++) s->k[i] = rng_unit(&r);
    for (int64_t i = 0; i < N * d; i++) s->v[i] = rng_unit(&r);
}

static void stream_free(stream *s) {
    free(s->q);
    free(s->k);
    free(s->v);
}

static kvs_policy_model model_of(const stream *s, int L, int Hkv, int64_t prompt) {
    kvs_policy_model m = {.n_layers = L, .n_heads = Hkv * s->G, .n_kv_heads = Hkv, .group = s->G, .head_dim = s->d,
                          .scale = 1.0f / sqrtf((float)s->d), .kv_bytes = 2, .aux_bytes = 4, .n_positions = s->N,
                          .prompt_len = prompt, .max_new_tokens = s->N - prompt};
    return m;
}

static kvs_policy_view prefill_view(const stream *s, int64_t turn_begin, int64_t prompt_end, int turn) {
    kvs_policy_view v = {.n = prompt_end, .group = s->G, .head_dim = s->d, .scale = 1.0f / sqrtf((float)s->d),
                         .k = s->k, .v = s->v, .q = s->q + (size_t)turn_begin * (size_t)s->G * (size_t)s->d,
                         .q_first = turn_begin, .n_q = prompt_end - turn_begin, .turn_begin = turn_begin,
                         .prompt_end = prompt_end, .turn = turn};
    return v;
}

static kvs_policy_view decode_view(const stream *s, int64_t p, int64_t turn_begin, int64_t prompt_end) {
    kvs_policy_view v = {.n = p + 1, .group = s->G, .head_dim = s->d, .scale = 1.0f / sqrtf((float)s->d),
                         .k = s->k, .v = s->v, .q = s->q + (size_t)p * (size_t)s->G * (size_t)s->d, .q_first = p,
                         .n_q = 1, .turn_begin = turn_begin, .prompt_end = prompt_end};
    return v;
}

/* Attention of query head h at position p over the positions cand[0..n), by hand: probs[j]. */
static void naive_attention(const stream *s, int64_t p, int h, const int32_t *cand, int64_t n, double *probs) {
    const float *q = s->q + ((size_t)p * (size_t)s->G + (size_t)h) * (size_t)s->d;
    double mx = -INFINITY, sum = 0, scale = 1.0 / sqrt((double)s->d);
    for (int64_t j = 0; j < n; j++) {
        double z = 0;
        for (int i = 0; i < s->d; i++) z += (double)q[i] * (double)s->k[(size_t)cand[j] * (size_t)s->d + (size_t)i];
        probs[j] = z * scale;
        if (probs[j] > mx) mx = probs[j];
    }
    for (int64_t j = 0; j < n; j++) sum += probs[j] = exp(probs[j] - mx);
    for (int64_t j = 0; j < n; j++) probs[j] /= sum;
}

/* ---- naive SnapKV ------------------------------------------------------------------------------------ */

enum { GQA_EXPAND, GQA_MEAN, GQA_MAX };

typedef struct {
    int window, kernel, avg, gqa;
} snap_opts;

typedef struct {
    double score;
    int64_t i;
} ranked;

/* Higher score first, then the lower index (older position / lower head). */
static int ranked_cmp(const void *a, const void *b) {
    const ranked *x = a, *y = b;
    if (x->score != y->score) return x->score > y->score ? -1 : 1;
    return x->i < y->i ? -1 : x->i > y->i;
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Pooled window scores of the prefix cand[0..m), m = nc − w, for list g (query head g, or the group). */
static void naive_pooled(const stream *s, const int32_t *cand, int64_t nc, int64_t prompt_end, int64_t w,
                         const snap_opts *o, int g, double *pooled) {
    int64_t m = nc - w;
    double *score = calloc((size_t)m + 1, sizeof(double)), *col = calloc((size_t)m + 1, sizeof(double));
    double *probs = malloc((size_t)nc * sizeof(double));
    assert_true(score && col && probs);
    int h_lo = o->gqa == GQA_EXPAND ? g : 0, h_hi = o->gqa == GQA_EXPAND ? g + 1 : s->G;
    for (int h = h_lo; h < h_hi; h++) {
        for (int64_t j = 0; j < m; j++) col[j] = 0;
        for (int64_t i = 0; i < w; i++) {
            int64_t p = prompt_end - w + i;
            int64_t vis = 0;
            while (vis < nc && cand[vis] <= p) vis++;
            naive_attention(s, p, h, cand, vis, probs);
            for (int64_t j = 0; j < m; j++) col[j] += probs[j];
        }
        for (int64_t j = 0; j < m; j++) {
            if (o->gqa == GQA_EXPAND) score[j] = col[j];
            else if (o->gqa == GQA_MEAN) score[j] += col[j] / s->G;
            else if (h == h_lo || col[j] > score[j]) score[j] = col[j];
        }
    }
    for (int64_t i = 0; i < m; i++) {
        double mx = -INFINITY, sum = 0;
        for (int64_t j = i - o->kernel / 2; j <= i + o->kernel / 2; j++) {
            if (j < 0 || j >= m) continue; /* padding: -inf for max, 0 for the average */
            if (score[j] > mx) mx = score[j];
            sum += score[j];
        }
        pooled[i] = o->avg ? sum / o->kernel : mx;
    }
    free(score);
    free(col);
    free(probs);
}

/* Naive SnapKV prefill of one list: candidates cand[0..nc) (sorted; the turn's prompt ends at prompt_end and
 * its n_new positions are the last candidates). Writes the kept positions sorted; @return their count. */
static int64_t naive_snapkv(const stream *s, const int32_t *cand, int64_t nc, int64_t n_new, int64_t prompt_end,
                            int64_t B, const snap_opts *o, int g, int32_t *out) {
    if (nc <= B) {
        memcpy(out, cand, (size_t)nc * sizeof(int32_t));
        return nc;
    }
    int64_t w = o->window < n_new ? o->window : n_new;
    if (B <= w) {
        memcpy(out, cand + nc - B, (size_t)B * sizeof(int32_t));
        return B;
    }
    int64_t m = nc - w, n = 0;
    double *pooled = malloc((size_t)m * sizeof(double));
    ranked *r = malloc((size_t)m * sizeof *r);
    assert_true(pooled && r);
    naive_pooled(s, cand, nc, prompt_end, w, o, g, pooled);
    for (int64_t j = 0; j < m; j++) r[j] = (ranked){pooled[j], j};
    qsort(r, (size_t)m, sizeof *r, ranked_cmp);
    for (int64_t j = 0; j < B - w; j++) out[n++] = cand[r[j].i];
    for (int64_t j = m; j < nc; j++) out[n++] = cand[j];
    qsort(out, (size_t)n, sizeof *out, cmp_i32);
    free(pooled);
    free(r);
    return n;
}

/* Asserts that list g of the policy stores exactly want[0..n). */
static void assert_stored(const struct kvs_policy_ops *ops, void *st, int g, const int32_t *want, int64_t n,
                          const char *what, int64_t B) {
    int32_t got[1024];
    int64_t m = ops->stored(st, g, got);
    qsort(got, (size_t)m, sizeof *got, cmp_i32);
    int same = m == n && !memcmp(got, want, (size_t)n * sizeof(int32_t));
    if (!same) {
        print_error("%s: budget %lld list %d: policy keeps %lld positions, reference %lld\n", what, (long long)B, g,
                    (long long)m, (long long)n);
        for (int64_t j = 0; j < (m > n ? m : n); j++)
            print_error("  [%lld] policy %d reference %d\n", (long long)j, j < m ? got[j] : -1, j < n ? want[j] : -1);
    }
    assert_true(same);
}

static snap_opts snap_opts_of(const kvs_policy_config *cfg) {
    snap_opts o = {.window = (int)kvs_policy_param_get(cfg, "window"),
                   .kernel = (int)kvs_policy_param_get(cfg, "kernel"),
                   .avg = (int)kvs_policy_param_get(cfg, "pool") == 1};
    const char *mode = strstr(cfg->canonical, "gqa=");
    o.gqa = !mode || !strncmp(mode + 4, "mean", 4) ? GQA_MEAN : !strncmp(mode + 4, "max", 3) ? GQA_MAX : GQA_EXPAND;
    return o;
}

static void *create_or_fail(const kvs_policy_config *cfg, const kvs_policy_model *m, int64_t B) {
    kvs_policy_init init = {.model = m, .cfg = cfg, .budget = B, .budget_nominal = B, .seed = 1};
    void *st = NULL;
    assert_int_equal(kvs_policy_validate(cfg, m, B), KVS_OK);
    assert_int_equal(cfg->ops->create(&init, &st), KVS_OK);
    assert_non_null(st);
    return st;
}

/* Decode `steps` tokens after prompt_end: S_t must be the kept prompt plus every generated token. */
static void check_decode_keeps_generated(const stream *s, const struct kvs_policy_ops *ops, void *st, int n_lists,
                                         int32_t *const *kept, const int64_t *n_kept, int64_t turn_begin,
                                         int64_t prompt_end, int64_t steps) {
    int32_t buf[8][512];
    int32_t *idx[8];
    int64_t cnt[8];
    assert_true(n_lists <= 8);
    for (int i = 0; i < n_lists; i++) idx[i] = buf[i];
    for (int64_t p = prompt_end; p < prompt_end + steps && p < s->N; p++) {
        kvs_policy_sel sel = {.idx = idx, .n = cnt, .n_lists = n_lists, .cap = 512};
        kvs_policy_view v = decode_view(s, p, turn_begin, prompt_end);
        assert_int_equal(ops->select(st, &v, &sel), KVS_OK);
        for (int li = 0; li < n_lists; li++) {
            assert_int_equal(sel.n[li], n_kept[li] + (p - prompt_end + 1));
            qsort(sel.idx[li], (size_t)sel.n[li], sizeof(int32_t), cmp_i32);
            assert_memory_equal(sel.idx[li], kept[li], (size_t)n_kept[li] * sizeof(int32_t));
            for (int64_t j = 0; j <= p - prompt_end; j++) assert_int_equal(sel.idx[li][n_kept[li] + j], prompt_end + j);
        }
    }
}

/* ---- SnapKV --------------------------------------------------------------------------------------------- */

static void run_snapkv_case(const stream *s, const char *spec, int64_t P, const int64_t *budgets, size_t nb) {
    kvs_policy_config cfg;
    assert_int_equal(kvs_policy_parse(spec, &cfg), KVS_OK);
    snap_opts o = snap_opts_of(&cfg);
    kvs_policy_model m = model_of(s, 1, 1, P);
    int n_lists = kvs_policy_layout(&cfg) == KVS_SEL_PER_QUERY_HEAD ? s->G : 1;
    assert_int_equal(n_lists, o.gqa == GQA_EXPAND ? s->G : 1);
    int32_t cand[512];
    for (int64_t j = 0; j < P; j++) cand[j] = (int32_t)j;
    for (size_t b = 0; b < nb; b++) {
        void *st = create_or_fail(&cfg, &m, budgets[b]);
        kvs_policy_view v = prefill_view(s, 0, P, 0);
        assert_int_equal(cfg.ops->prefill(st, &v), KVS_OK);
        int32_t kept_buf[8][512];
        int32_t *kept[8];
        int64_t n_kept[8];
        for (int g = 0; g < n_lists; g++) {
            kept[g] = kept_buf[g];
            n_kept[g] = naive_snapkv(s, cand, P, P, P, budgets[b], &o, g, kept[g]);
            assert_int_equal(n_kept[g], budgets[b] < P ? budgets[b] : P);
            assert_stored(cfg.ops, st, g, kept[g], n_kept[g], spec, budgets[b]);
        }
        check_decode_keeps_generated(s, cfg.ops, st, n_lists, kept, n_kept, 0, P, 6);
        cfg.ops->free(st);
    }
}

static void test_snapkv_matches_naive_reference(void **state) {
    (void)state;
    stream s;
    stream_make(&s, 80, 2, 8, 11);
    /* budgets: below the window, at it, just above, middle, prompt-1, prompt, above the prompt */
    const int64_t budgets[] = {1, 3, 8, 9, 13, 21, 40, 47, 48, 70};
    const size_t nb = sizeof budgets / sizeof budgets[0];
    run_snapkv_case(&s, "snapkv:window=8", 48, budgets, nb);
    run_snapkv_case(&s, "snapkv:window=8,gqa=mean", 48, budgets, nb);
    run_snapkv_case(&s, "snapkv:window=8,gqa=max,pool=avg,kernel=5", 48, budgets, nb);
    run_snapkv_case(&s, "snapkv:window=6,kernel=1", 48, budgets, nb);
    run_snapkv_case(&s, "snapkv", 48, budgets, nb); /* paper defaults: window 32, kernel 7, max */
    stream_free(&s);
}

static void test_snapkv_prompt_shorter_than_window_keeps_its_last_positions(void **state) {
    (void)state;
    stream s;
    stream_make(&s, 40, 2, 8, 12);
    kvs_policy_config cfg;
    assert_int_equal(kvs_policy_parse("snapkv", &cfg), KVS_OK); /* window 32 > prompt 20 */
    kvs_policy_model m = model_of(&s, 1, 1, 20);
    const int64_t budgets[] = {1, 5, 19, 20, 25};
    for (size_t b = 0; b < sizeof budgets / sizeof budgets[0]; b++) {
        void *st = create_or_fail(&cfg, &m, budgets[b]);
        kvs_policy_view v = prefill_view(&s, 0, 20, 0);
        assert_int_equal(cfg.ops->prefill(st, &v), KVS_OK);
        int64_t keep = budgets[b] < 20 ? budgets[b] : 20;
        int32_t want[20];
        for (int64_t j = 0; j < keep; j++) want[j] = (int32_t)(20 - keep + j);
        for (int g = 0; g < s.G; g++) assert_stored(cfg.ops, st, g, want, keep, "short prompt", budgets[b]);
        cfg.ops->free(st);
    }
    stream_free(&s);
}

static void test_snapkv_second_turn_matches_naive_reference(void **state) {
    (void)state;
    stream s;
    stream_make(&s, 90, 2, 8, 13);
    const char *specs[] = {"snapkv:window=6", "snapkv:window=6,gqa=mean,pool=avg"};
    const int64_t budgets[] = {4, 10, 17, 30};
    for (size_t si = 0; si < 2; si++)
        for (size_t b = 0; b < sizeof budgets / sizeof budgets[0]; b++) {
            kvs_policy_config cfg;
            assert_int_equal(kvs_policy_parse(specs[si], &cfg), KVS_OK);
            snap_opts o = snap_opts_of(&cfg);
            int n_lists = o.gqa == GQA_EXPAND ? s.G : 1;
            kvs_policy_model m = model_of(&s, 1, 1, 36);
            void *st = create_or_fail(&cfg, &m, budgets[b]);
            kvs_policy_view v = prefill_view(&s, 0, 36, 0);
            assert_int_equal(cfg.ops->prefill(st, &v), KVS_OK);
            /* turn 0 decodes 36..49 */
            int32_t buf[8][512];
            int32_t *idx[8] = {buf[0], buf[1], buf[2], buf[3], buf[4], buf[5], buf[6], buf[7]};
            int64_t cnt[8];
            for (int64_t p = 36; p < 50; p++) {
                kvs_policy_sel sel = {.idx = idx, .n = cnt, .n_lists = n_lists, .cap = 512};
                kvs_policy_view dv = decode_view(&s, p, 0, 36);
                assert_int_equal(cfg.ops->select(st, &dv, &sel), KVS_OK);
            }
            /* turn 1: prompt 50..71; candidates = what each list stores + the new prompt */
            int32_t cand[8][512], want[512];
            int64_t nc[8];
            for (int g = 0; g < n_lists; g++) {
                nc[g] = cfg.ops->stored(st, g, cand[g]);
                qsort(cand[g], (size_t)nc[g], sizeof(int32_t), cmp_i32);
                for (int64_t j = 50; j < 72; j++) cand[g][nc[g]++] = (int32_t)j;
            }
            kvs_policy_view v2 = prefill_view(&s, 50, 72, 1);
            assert_int_equal(cfg.ops->prefill(st, &v2), KVS_OK);
            for (int g = 0; g < n_lists; g++) {
                int64_t n = naive_snapkv(&s, cand[g], nc[g], 22, 72, budgets[b], &o, g, want);
                assert_true(n <= budgets[b]);
                assert_stored(cfg.ops, st, g, want, n, specs[si], budgets[b]);
            }
            cfg.ops->free(st);
        }
    stream_free(&s);
}

/* Block-wise prompt processing (KeyDiff, block=M): the policy gets the prompt as the engine hands it over, block
 * by block (view->n = the block's end, its queries only, block_begin), and after every block must hold exactly
 * what the naive reference keeps when it compresses (kept so far + the block) with the block as the prompt. */
static void test_snapkv_block_mode_matches_naive_blockwise_reference(void **state) {
    (void)state;
    stream s;
    stream_make(&s, 96, 2, 8, 14);
    const struct {
        const char *spec;
        int64_t block;
    } cases[] = {
        {"snapkv:window=4,block=10", 10},
        {"snapkv:window=4,gqa=mean,pool=avg,kernel=5,block=7", 7},
        {"snapkv:window=6,gqa=max,block=3", 3}, /* blocks shorter than the window: the block is the window */
        {"snapkv:window=8,kernel=7,pool=avg,gqa=mean,block=16", 16},
        {"snapkv@keydiff", 128}, /* one block longer than the prompt: the one-shot result */
    };
    const int64_t budgets[] = {2, 5, 9, 17, 30};
    const int64_t P = 60;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (size_t b = 0; b < sizeof budgets / sizeof budgets[0]; b++) {
            kvs_policy_config cfg;
            assert_int_equal(kvs_policy_parse(cases[c].spec, &cfg), KVS_OK);
            snap_opts o = snap_opts_of(&cfg);
            int n_lists = o.gqa == GQA_EXPAND ? s.G : 1;
            kvs_policy_model m = model_of(&s, 1, 1, P);
            void *st = create_or_fail(&cfg, &m, budgets[b]);
            assert_int_equal(cfg.ops->prefill_block(st), cases[c].block);
            int32_t kept[8][512], cand[512], want[512];
            int64_t n_kept[8] = {0};
            for (int64_t bb = 0; bb < P; bb += cases[c].block) {
                int64_t be = bb + cases[c].block < P ? bb + cases[c].block : P;
                kvs_policy_view v = prefill_view(&s, 0, be, 0);
                v.q = s.q + (size_t)bb * (size_t)s.G * (size_t)s.d;
                v.q_first = bb;
                v.n_q = be - bb;
                v.prompt_end = P;
                v.block_begin = bb;
                v.last_block = be == P;
                assert_int_equal(cfg.ops->prefill(st, &v), KVS_OK);
                for (int g = 0; g < n_lists; g++) {
                    int64_t nc = 0;
                    for (int64_t j = 0; j < n_kept[g]; j++) cand[nc++] = kept[g][j];
                    for (int64_t j = bb; j < be; j++) cand[nc++] = (int32_t)j;
                    n_kept[g] = naive_snapkv(&s, cand, nc, be - bb, be, budgets[b], &o, g, want);
                    memcpy(kept[g], want, (size_t)n_kept[g] * sizeof(int32_t));
                    assert_true(n_kept[g] <= budgets[b]);
                    assert_stored(cfg.ops, st, g, kept[g], n_kept[g], cases[c].spec, budgets[b]);
                }
            }
            int32_t *kp[8] = {kept[0], kept[1], kept[2], kept[3], kept[4], kept[5], kept[6], kept[7]};
            check_decode_keeps_generated(&s, cfg.ops, st, n_lists, kp, n_kept, 0, P, 5);
            cfg.ops->free(st);
        }
    /* the default (block=0) asks for the whole prompt; PyramidKV and Ada-KV have no block parameter */
    kvs_policy_config cfg;
    assert_int_equal(kvs_policy_parse("snapkv", &cfg), KVS_OK);
    kvs_policy_model m = model_of(&s, 1, 1, P);
    void *st = create_or_fail(&cfg, &m, 8);
    assert_int_equal(cfg.ops->prefill_block(st), 0);
    cfg.ops->free(st);
    assert_null(kvs_policy_find("pyramidkv")->prefill_block);
    assert_null(kvs_policy_find("adakv")->prefill_block);
    stream_free(&s);
}

static void test_snapkv_rejects_an_even_kernel(void **state) {
    (void)state;
    stream s;
    stream_make(&s, 8, 2, 4, 1);
    kvs_policy_model m = model_of(&s, 1, 1, 4);
    const char *specs[] = {"snapkv:kernel=6", "pyramidkv:kernel=4", "adakv:kernel=2"};
    for (int i = 0; i < 3; i++) {
        kvs_policy_config cfg;
        assert_int_equal(kvs_policy_parse(specs[i], &cfg), KVS_OK);
        assert_int_equal(kvs_policy_validate(&cfg, &m, 16), KVS_ERR_INVALID_ARG);
        assert_non_null(strstr(kvs_last_error(), "'kernel' must be odd"));
    }
    kvs_policy_config cfg;
    assert_int_equal(kvs_policy_parse("snapkv:window=0", &cfg), KVS_ERR_INVALID_ARG);
    assert_non_null(strstr(kvs_last_error(), "window"));
    assert_int_equal(kvs_policy_parse("adakv:alpha=1.5", &cfg), KVS_ERR_INVALID_ARG);
    assert_non_null(strstr(kvs_last_error(), "out of range"));
    stream_free(&s);
}

/* ---- PyramidKV -------------------------------------------------------------------------------------------- */

/* Runs the allocation pass of `spec` for L layers x Hkv heads on a prompt of P positions of s. */
static void run_alloc(const stream *s, const char *spec, int L, int Hkv, int64_t P, int64_t B, int64_t *budgets) {
    kvs_policy_config cfg;
    assert_int_equal(kvs_policy_parse(spec, &cfg), KVS_OK);
    kvs_policy_model m = model_of(s, L, Hkv, P);
    void *a = NULL;
    assert_int_equal(cfg.ops->alloc_begin(&cfg, &m, B, &a), KVS_OK);
    kvs_policy_view v = prefill_view(s, 0, P, 0);
    for (int l = 0; l < L; l++)
        for (int h = 0; h < Hkv; h++) assert_int_equal(cfg.ops->alloc_prefill(a, l, h, &v), KVS_OK);
    assert_int_equal(cfg.ops->alloc_end(a, budgets), KVS_OK);
    cfg.ops->alloc_free(a);
}

static void test_pyramidkv_layer_budgets_worked_example(void **state) {
    (void)state;
    stream s;
    stream_make(&s, 220, 1, 4, 2);
    int64_t b[5 * 2];
    /* B 59, W 8: base 51, min 51//20 = 2, max 100. Line: 100, 75.5, 51, 26.5, 2 (sum 255 = 5 x 51). */
    run_alloc(&s, "pyramidkv:window=8", 5, 2, 200, 59, b);
    const int64_t paper[] = {108, 84, 59, 34, 10}; /* remainder 1 to the lower of the two .5 layers */
    for (int l = 0; l < 5; l++)
        for (int h = 0; h < 2; h++) assert_int_equal(b[l * 2 + h], paper[l]);
    /* reference: step (100-2)//4 = 24: 100, 76, 52, 28, 4 (+8): total 5 more than 5 x 51 */
    run_alloc(&s, "pyramidkv:window=8,fidelity=ref", 5, 2, 200, 59, b);
    const int64_t ref[] = {108, 84, 60, 36, 12};
    for (int l = 0; l < 5; l++) assert_int_equal(b[l * 2], ref[l]);
    /* clamp: P 60 -> max = P − W = 52, min = 2·32 − 52 = 12 (B 40) */
    run_alloc(&s, "pyramidkv:window=8", 5, 1, 60, 40, b);
    const int64_t clamp[] = {60, 50, 40, 30, 20};
    for (int l = 0; l < 5; l++) assert_int_equal(b[l], clamp[l]);
    /* reference falls back to uniform when P < 2(B−W) */
    run_alloc(&s, "pyramidkv:window=8,fidelity=ref", 5, 1, 60, 40, b);
    for (int l = 0; l < 5; l++) assert_int_equal(b[l], 40);
    /* nothing to compress (P <= B) and budget within the window: uniform B */
    run_alloc(&s, "pyramidkv:window=8", 5, 1, 30, 30, b);
    for (int l = 0; l < 5; l++) assert_int_equal(b[l], 30);
    run_alloc(&s, "pyramidkv:window=8", 5, 1, 100, 6, b);
    for (int l = 0; l < 5; l++) assert_int_equal(b[l], 6);
    stream_free(&s);
}

static void test_pyramidkv_layer_budgets_sum_monotonic_floor(void **state) {
    (void)state;
    stream s;
    stream_make(&s, 320, 1, 4, 3);
    const int64_t prompts[] = {10, 33, 57, 120, 300};
    int64_t b[12];
    int checked = 0;
    for (int L = 1; L <= 12; L++)
        for (size_t pi = 0; pi < sizeof prompts / sizeof prompts[0]; pi++)
            for (int64_t B = 1; B <= 130; B += 3)
                for (int beta = 1; beta <= 41; beta += 20) {
                    char spec[64];
                    snprintf(spec, sizeof spec, "pyramidkv:window=8,beta=%d", beta);
                    int64_t P = prompts[pi], W = P < 8 ? P : 8, base = B - W;
                    run_alloc(&s, spec, L, 1, P, B, b);
                    int64_t sum = 0;
                    for (int l = 0; l < L; l++) {
                        sum += b[l];
                        assert_true(b[l] >= 1);
                        if (l) assert_true(b[l] <= b[l - 1]); /* pyramid: never grows with depth */
                    }
                    assert_int_equal(sum, (int64_t)L * B); /* total L·B */
                    if (P > B && base > 0 && L > 1) {
                        int64_t lo = base / beta, hi = 2 * base - lo;
                        if (hi >= P - W) {
                            hi = P - W;
                            lo = 2 * base - hi;
                        }
                        assert_int_equal(b[0], hi + W);     /* first layer: max (exact) */
                        assert_true(b[L - 1] >= lo + W);    /* floor: min, plus the window */
                        assert_true(b[0] <= P);
                        checked++;
                    }
                }
    assert_true(checked > 100);
    stream_free(&s);
}

static void test_pyramidkv_selects_like_snapkv_within_a_layer(void **state) {
    (void)state;
    stream s;
    stream_make(&s, 120, 2, 8, 4);
    int64_t b[4 * 2];
    const char *specs[] = {"pyramidkv:window=8", "pyramidkv:window=8,gqa=mean,pool=avg"};
    for (int si = 0; si < 2; si++) {
        run_alloc(&s, specs[si], 4, 2, 90, 30, b);
        kvs_policy_config cfg;
        assert_int_equal(kvs_policy_parse(specs[si], &cfg), KVS_OK);
        snap_opts o = snap_opts_of(&cfg);
        kvs_policy_model m = model_of(&s, 4, 2, 90);
        int32_t cand[90], want[128];
        for (int j = 0; j < 90; j++) cand[j] = j;
        for (int l = 0; l < 4; l++) {
            void *st = create_or_fail(&cfg, &m, b[l * 2]);
            kvs_policy_view v = prefill_view(&s, 0, 90, 0);
            assert_int_equal(cfg.ops->prefill(st, &v), KVS_OK);
            for (int g = 0; g < (o.gqa == GQA_EXPAND ? s.G : 1); g++) {
                int64_t n = naive_snapkv(&s, cand, 90, 90, 90, b[l * 2], &o, g, want);
                assert_int_equal(n, b[l * 2]);
                assert_stored(cfg.ops, st, g, want, n, specs[si], b[l * 2]);
            }
            cfg.ops->free(st);
        }
    }
    stream_free(&s);
}

/* ---- Ada-KV ---------------------------------------------------------------------------------------------- */

static void test_adakv_head_budgets_match_naive_allocation(void **state) {
    (void)state;
    enum { L = 2, HKV = 3, P = 60 };
    stream s[L * HKV];
    for (int i = 0; i < L * HKV; i++) stream_make(&s[i], 70, 2, 8, 100 + (uint64_t)i);
    const char *specs[] = {"adakv:window=8", "adakv:window=8,alpha=0", "adakv:window=8,alpha=1",
                           "adakv:window=5,gqa=max,pool=avg,kernel=3,alpha=0.35"};
    const int64_t budgets[] = {3, 8, 9, 12, 20, 31, 59, 61};
    int32_t cand[P];
    for (int j = 0; j < P; j++) cand[j] = j;
    for (size_t si = 0; si < sizeof specs / sizeof specs[0]; si++)
        for (size_t bi = 0; bi < sizeof budgets / sizeof budgets[0]; bi++) {
            int64_t B = budgets[bi];
            kvs_policy_config cfg;
            assert_int_equal(kvs_policy_parse(specs[si], &cfg), KVS_OK);
            snap_opts o = snap_opts_of(&cfg);
            double alpha = kvs_policy_param_get(&cfg, "alpha");
            kvs_policy_model m = model_of(&s[0], L, HKV, P);
            /* the allocation pass over every (layer, KV head), each with its own stream */
            void *a = NULL;
            int64_t got[L * HKV];
            assert_int_equal(cfg.ops->alloc_begin(&cfg, &m, B, &a), KVS_OK);
            for (int l = 0; l < L; l++)
                for (int h = 0; h < HKV; h++) {
                    kvs_policy_view v = prefill_view(&s[l * HKV + h], 0, P, 0);
                    assert_int_equal(cfg.ops->alloc_prefill(a, l, h, &v), KVS_OK);
                }
            assert_int_equal(cfg.ops->alloc_end(a, got), KVS_OK);
            cfg.ops->alloc_free(a);
            int64_t W = o.window < P ? o.window : P, base = B - W, len = P - W;
            for (int l = 0; l < L; l++) {
                int64_t want[HKV], sum = 0;
                if (P <= B || base <= 0) {
                    for (int h = 0; h < HKV; h++) want[h] = B;
                } else {
                    /* naive: every pooled score of the layer, sorted; the top HKV·base decide the counts */
                    ranked r[HKV * P];
                    double pooled[P];
                    for (int h = 0; h < HKV; h++) {
                        naive_pooled(&s[l * HKV + h], cand, P, P, W, &o, 0, pooled);
                        for (int64_t j = 0; j < len; j++) r[h * len + j] = (ranked){pooled[j], h * len + j};
                    }
                    qsort(r, (size_t)(HKV * len), sizeof *r, ranked_cmp);
                    int64_t c[HKV] = {0}, total = 0;
                    for (int64_t i = 0; i < HKV * base; i++) c[r[i].i / len]++;
                    double ideal[HKV], frac[HKV];
                    for (int h = 0; h < HKV; h++) {
                        ideal[h] = (1 - alpha) * (double)c[h] + alpha * (double)base;
                        want[h] = (int64_t)floor(ideal[h] + 1e-9);
                        frac[h] = ideal[h] - (double)want[h];
                        total += want[h];
                    }
                    for (; total < HKV * base; total++) { /* largest remainder, ties to the lower head */
                        int best = 0;
                        for (int h = 1; h < HKV; h++)
                            if (frac[h] > frac[best]) best = h;
                        want[best]++;
                        frac[best] = -1;
                    }
                    for (int h = 0; h < HKV; h++) {
                        assert_true(want[h] >= (int64_t)floor(alpha * (double)base + 1e-9)); /* the floor */
                        want[h] += W;
                    }
                }
                for (int h = 0; h < HKV; h++) {
                    assert_int_equal(got[l * HKV + h], want[h]);
                    sum += got[l * HKV + h];
                    assert_true(got[l * HKV + h] <= (P > B ? P : B));
                }
                assert_int_equal(sum, (int64_t)HKV * B); /* the layer total */
                /* each head's instance keeps the naive top (budget − W) of its scores plus the window */
                for (int h = 0; h < HKV; h++) {
                    int32_t keep[P];
                    void *st = create_or_fail(&cfg, &m, got[l * HKV + h]);
                    kvs_policy_view v = prefill_view(&s[l * HKV + h], 0, P, 0);
                    assert_int_equal(cfg.ops->prefill(st, &v), KVS_OK);
                    int64_t n = naive_snapkv(&s[l * HKV + h], cand, P, P, P, got[l * HKV + h], &o, 0, keep);
                    assert_stored(cfg.ops, st, 0, keep, n, specs[si], got[l * HKV + h]);
                    cfg.ops->free(st);
                }
            }
        }
    for (int i = 0; i < L * HKV; i++) stream_free(&s[i]);
}

static void test_adakv_allocation_is_not_uniform_on_skewed_heads(void **state) {
    (void)state;
    /* head 0 attends almost uniformly (q = 0: dispersed), head 1 sharply (large q): Ada-KV gives the dispersed
     * head more of the layer's budget (the paper's Fig. 1 motivation). */
    stream s[2];
    stream_make(&s[0], 64, 1, 8, 7);
    stream_make(&s[1], 64, 1, 8, 8);
    for (int64_t i = 0; i < 64 * 8; i++) {
        s[0].q[i] = 0.0f;
        s[1].q[i] *= 6.0f;
    }
    kvs_policy_config cfg;
    assert_int_equal(kvs_policy_parse("adakv:window=8,kernel=1", &cfg), KVS_OK);
    kvs_policy_model m = model_of(&s[0], 1, 2, 60);
    void *a = NULL;
    int64_t got[2];
    assert_int_equal(cfg.ops->alloc_begin(&cfg, &m, 24, &a), KVS_OK);
    for (int h = 0; h < 2; h++) {
        kvs_policy_view v = prefill_view(&s[h], 0, 60, 0);
        assert_int_equal(cfg.ops->alloc_prefill(a, 0, h, &v), KVS_OK);
    }
    assert_int_equal(cfg.ops->alloc_end(a, got), KVS_OK);
    cfg.ops->alloc_free(a);
    assert_int_equal(got[0] + got[1], 48);
    assert_true(got[0] > got[1]);
    assert_true(got[1] >= 8 + 3); /* W + floor(0.2 x 16) */
    stream_free(&s[0]);
    stream_free(&s[1]);
}

/* ---- Scissorhands ------------------------------------------------------------------------------------------ */

typedef struct {
    int64_t history, recent, drop;
    double threshold;
    int mean;
} sh_opts;

/* Naive Scissorhands for one list: flags[o][pos] for every observation o; count = flags over the last
 * `history` observations. */
typedef struct {
    int32_t set[512];
    int64_t n;
    uint8_t flags[256][128];
    int64_t obs;
} sh_naive;

static int64_t sh_count(const sh_naive *r, const sh_opts *o, int32_t pos) {
    int64_t c = 0;
    for (int64_t k = r->obs - o->history; k < r->obs; k++)
        if (k >= 0) c += r->flags[k][pos];
    return c;
}

static void sh_compress(sh_naive *r, const sh_opts *o, int64_t B) {
    int64_t drop = o->drop < B ? o->drop : B, target = B - drop, rec = o->recent < target ? o->recent : target;
    if (r->n <= target) return;
    int64_t old = r->n - rec;
    ranked rk[512];
    for (int64_t j = 0; j < old; j++) rk[j] = (ranked){-(double)sh_count(r, o, r->set[j]), r->set[j]};
    qsort(rk, (size_t)old, sizeof *rk, ranked_cmp); /* lowest count first, then the older position */
    int32_t keep[512];
    int64_t n = 0;
    for (int64_t j = 0; j < target - rec; j++) keep[n++] = (int32_t)rk[j].i;
    for (int64_t j = old; j < r->n; j++) keep[n++] = r->set[j];
    qsort(keep, (size_t)n, sizeof *keep, cmp_i32);
    memcpy(r->set, keep, (size_t)n * sizeof *keep);
    r->n = n;
}

static void test_scissorhands_matches_naive_reference(void **state) {
    (void)state;
    stream s;
    stream_make(&s, 90, 2, 8, 21);
    const char *specs[] = {"scissorhands:history=6,recent=2", "scissorhands:history=4,recent=3,drop=3,gqa=mean",
                           "scissorhands:history=9,recent=0,threshold=0.5", "scissorhands"};
    const int64_t budgets[] = {1, 2, 5, 9, 16, 31, 40};
    const int64_t P = 30;
    for (size_t si = 0; si < sizeof specs / sizeof specs[0]; si++)
        for (size_t bi = 0; bi < sizeof budgets / sizeof budgets[0]; bi++) {
            int64_t B = budgets[bi];
            kvs_policy_config cfg;
            assert_int_equal(kvs_policy_parse(specs[si], &cfg), KVS_OK);
            sh_opts o = {.history = (int64_t)kvs_policy_param_get(&cfg, "history"),
                         .recent = (int64_t)kvs_policy_param_get(&cfg, "recent"),
                         .drop = (int64_t)kvs_policy_param_get(&cfg, "drop"),
                         .threshold = kvs_policy_param_get(&cfg, "threshold"),
                         .mean = (int)kvs_policy_param_get(&cfg, "gqa") == 1};
            int n_lists = o.mean ? 1 : s.G;
            assert_int_equal(kvs_policy_layout(&cfg) == KVS_SEL_PER_QUERY_HEAD ? s.G : 1, n_lists);
            kvs_policy_model m = model_of(&s, 1, 1, P);
            void *st = create_or_fail(&cfg, &m, B);
            static sh_naive ref[2];
            double probs[2][512];
            memset(ref, 0, sizeof ref);
            /* naive prefill: the last min(history, P) prompt rows are observations */
            for (int li = 0; li < n_lists; li++) {
                for (int64_t j = 0; j < P; j++) ref[li].set[ref[li].n++] = (int32_t)j;
                for (int64_t p = P - (o.history < P ? o.history : P); p < P; p++) {
                    int64_t vis = p + 1;
                    double a[512] = {0};
                    for (int h = 0; h < s.G; h++) {
                        if (!o.mean && h != li) continue;
                        naive_attention(&s, p, h, ref[li].set, vis, probs[0]);
                        for (int64_t j = 0; j < vis; j++) a[j] += probs[0][j] / (o.mean ? s.G : 1);
                    }
                    for (int64_t j = 0; j < vis; j++) ref[li].flags[ref[li].obs][ref[li].set[j]] = a[j] < o.threshold / (double)vis;
                    ref[li].obs++;
                }
                if (ref[li].n > B - 1) sh_compress(&ref[li], &o, B);
            }
            kvs_policy_view v = prefill_view(&s, 0, P, 0);
            assert_int_equal(cfg.ops->prefill(st, &v), KVS_OK);
            for (int li = 0; li < n_lists; li++) assert_stored(cfg.ops, st, li, ref[li].set, ref[li].n, specs[si], B);
            /* decode: the test computes the attention over S_t (float, as the engine would) and feeds it back */
            int32_t buf[2][512];
            int32_t *idx[2] = {buf[0], buf[1]};
            int64_t cnt[2];
            float pf[2][512];
            const float *pp[2] = {pf[0], pf[1]};
            for (int64_t p = P; p < s.N; p++) {
                kvs_policy_sel sel = {.idx = idx, .n = cnt, .n_lists = n_lists, .cap = 512};
                kvs_policy_view dv = decode_view(&s, p, 0, P);
                assert_int_equal(cfg.ops->select(st, &dv, &sel), KVS_OK);
                for (int li = 0; li < n_lists; li++) {
                    ref[li].set[ref[li].n++] = (int32_t)p;
                    assert_true(sel.n[li] <= B);
                    assert_int_equal(sel.n[li], ref[li].n);
                    assert_memory_equal(sel.idx[li], ref[li].set, (size_t)ref[li].n * sizeof(int32_t));
                }
                for (int g = 0; g < s.G; g++) {
                    int li = n_lists == 1 ? 0 : g;
                    naive_attention(&s, p, g, sel.idx[li], sel.n[li], probs[g]);
                    for (int64_t j = 0; j < sel.n[li]; j++) pf[g][j] = (float)probs[g][j];
                }
                assert_int_equal(cfg.ops->observe(st, &dv, &sel, pp), KVS_OK);
                for (int li = 0; li < n_lists; li++) {
                    sh_naive *r = &ref[li];
                    for (int64_t j = 0; j < r->n; j++) {
                        double a = 0;
                        for (int g = 0; g < s.G; g++)
                            if (o.mean || g == li) a += (double)pf[g][j] / (o.mean ? s.G : 1);
                        r->flags[r->obs][r->set[j]] = a < o.threshold / (double)r->n;
                    }
                    r->obs++;
                    if (r->n >= B) sh_compress(r, &o, B);
                    assert_stored(cfg.ops, st, li, r->set, r->n, specs[si], B);
                }
            }
            double slots = 0;
            for (int li = 0; li < n_lists; li++) slots += (double)cnt[li];
            /* the engine's default KV (resident = read = the attended slots), then the policy's auxiliary classes */
            kvs_policy_cost cost = {.kv_bytes = slots * 2.0 * s.d * 2, .read_kv_bytes = slots * 2.0 * s.d * 2};
            kvs_policy_sel sel = {.idx = idx, .n = cnt, .n_lists = n_lists, .cap = 512};
            cfg.ops->account(st, NULL, &sel, &cost);
            /* K/V (2 x d x 2 bytes) + an fp32 counter + history/8 bytes of flags per slot; traffic without flags */
            assert_true(cost.kv_bytes + cost.aux_bytes == slots * (2.0 * s.d * 2 + 4 + (double)((o.history + 7) / 8)));
            assert_true(cost.read_kv_bytes + cost.read_aux_bytes == slots * (2.0 * s.d * 2 + 4));
            cfg.ops->free(st);
        }
    stream_free(&s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_snapkv_matches_naive_reference),
        cmocka_unit_test(test_snapkv_prompt_shorter_than_window_keeps_its_last_positions),
        cmocka_unit_test(test_snapkv_second_turn_matches_naive_reference),
        cmocka_unit_test(test_snapkv_block_mode_matches_naive_blockwise_reference),
        cmocka_unit_test(test_snapkv_rejects_an_even_kernel),
        cmocka_unit_test(test_pyramidkv_layer_budgets_worked_example),
        cmocka_unit_test(test_pyramidkv_layer_budgets_sum_monotonic_floor),
        cmocka_unit_test(test_pyramidkv_selects_like_snapkv_within_a_layer),
        cmocka_unit_test(test_adakv_head_budgets_match_naive_allocation),
        cmocka_unit_test(test_adakv_allocation_is_not_uniform_on_skewed_heads),
        cmocka_unit_test(test_scissorhands_matches_naive_reference),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
