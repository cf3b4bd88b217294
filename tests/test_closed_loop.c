/* test_closed_loop.c — closed-loop decoding (sim/closed_loop.h) on the real stories260K model in
 * ../shared/models (skipped with a message when absent): `full` and a budget >= the context give the plain
 * model bit for bit; the per-step KL and NLL against an independent long-double computation from the logits;
 * a naive reference of the window policy's closed loop written directly as a model attention hook; the leak
 * test (perturbing the full model's attention must not move the policy model, for every registered policy);
 * free-running consistency with teacher forcing; free-running after given tokens read through the policy (the
 * first generated token then depends on the policy, and is what teacher forcing predicts); bad options.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tests/util/testenv.h"

#include "common/kvs_math.h"
#include "gpu_capture/model.h"
#include "sim/closed_loop.h"
#include "sim/codec.h"
#include "sim/policy.h"
#include "policies/registry.h"

#define N_TOK 40
#define PROMPT 16

typedef struct {
    kvs_model *m;
    int32_t tokens[N_TOK];
} fixture;

/* Loads stories260K and makes a natural token sequence: BOS then the plain model's greedy continuation. */
static int setup(void **state) {
    char p[4096];
    snprintf(p, sizeof p, "%s/../shared/models/stories260K.bin", kvs_test_root());
    fixture *f = calloc(1, sizeof *f);
    *state = f;
    if (!kvs_test_exists(p)) return 0;
    if (kvs_model_load(p, &f->m) != KVS_OK) return -1;
    kvs_model_state *s = NULL;
    if (kvs_model_state_create(f->m, N_TOK, NULL, &s) != KVS_OK) return -1;
    const int V = kvs_model_info_get(f->m)->config.vocab_size;
    f->tokens[0] = 1;
    for (int i = 0; i + 1 < N_TOK; i++) {
        const float *lg;
        if (kvs_model_forward(s, f->tokens[i], i, &lg) != KVS_OK) return -1;
        int best = 0;
        for (int k = 1; k < V; k++)
            if (lg[k] > lg[best]) best = k;
        /* keep going past an end-of-story token: any id is a valid input */
        f->tokens[i + 1] = best == 1 || best == 2 ? 3 + i : best;
    }
    kvs_model_state_free(s);
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    kvs_model_free(f->m);
    free(f);
    return 0;
}

#define NEED_MODEL(f)                                                                                  \
    do {                                                                                               \
        if (!(f)->m) {                                                                                 \
            fprintf(stderr, "SKIP: ../shared/models/stories260K.bin absent (shared real models not installed)\n"); \
            skip();                                                                                    \
        }                                                                                              \
    } while (0)

static kvs_closed_loop_opts tf_opts(const fixture *f, const char *spec, int64_t budget) {
    kvs_closed_loop_opts o = {.model = f->m, .budget = budget, .tokens = f->tokens, .n_tokens = N_TOK,
                              .prompt_len = PROMPT};
    assert_int_equal(kvs_policy_parse(spec, &o.policy), KVS_OK);
    return o;
}

/* ---- logits capture ---- */

typedef struct {
    int V;
    int64_t n;
    float *full, *pol; /* [n][V] */
} logit_log;

static void log_step(void *user, int64_t step, const float *full, const float *pol) {
    logit_log *lg = user;
    assert_int_equal(step, lg->n);
    memcpy(lg->full + (size_t)step * (size_t)lg->V, full, (size_t)lg->V * sizeof(float));
    memcpy(lg->pol + (size_t)step * (size_t)lg->V, pol, (size_t)lg->V * sizeof(float));
    lg->n++;
}

static void log_init(logit_log *lg, const fixture *f) {
    lg->V = kvs_model_info_get(f->m)->config.vocab_size;
    lg->n = 0;
    lg->full = calloc((size_t)N_TOK * (size_t)lg->V, sizeof(float));
    lg->pol = calloc((size_t)N_TOK * (size_t)lg->V, sizeof(float));
    assert_non_null(lg->full);
    assert_non_null(lg->pol);
}

static void log_free(logit_log *lg) {
    free(lg->full);
    free(lg->pol);
}

/* ---- tests ---- */

static void test_full_policy_is_bit_identical(void **state) {
    fixture *f = *state;
    NEED_MODEL(f);
    const char *specs[] = {"full", "window", "h2o"};
    const int64_t budgets[] = {8, N_TOK, N_TOK};
    for (int i = 0; i < 3; i++) {
        kvs_closed_loop_opts o = tf_opts(f, specs[i], budgets[i]);
        logit_log lg;
        log_init(&lg, f);
        o.on_step = log_step;
        o.on_step_user = &lg;
        kvs_closed_loop_result *r = NULL;
        assert_int_equal(kvs_closed_loop_run(&o, &r), KVS_OK);
        assert_int_equal(r->n_steps, N_TOK - 1 - PROMPT);
        assert_int_equal(lg.n, r->n_steps);
        assert_memory_equal(lg.full, lg.pol, (size_t)lg.n * (size_t)lg.V * sizeof(float));
        for (int64_t s = 0; s < r->n_steps; s++) {
            assert_true(r->steps[s].kl == 0.0);
            assert_int_equal(r->steps[s].full_top1, r->steps[s].policy_top1);
            assert_true(r->steps[s].nll_full == r->steps[s].nll_policy);
            assert_true(r->steps[s].out_err == 0.0);
            assert_int_equal(r->steps[s].ref_token, f->tokens[PROMPT + s + 1]);
        }
        assert_true(r->top1_agree == 1.0);
        assert_true(r->ppl_full == r->ppl_policy);
        kvs_closed_loop_result_free(r);
        log_free(&lg);
    }
}

/* KL(p || q) and -log p(tok) from the logits in long double, softmax written out directly. */
static long double ref_kl(const float *a, const float *b, int V) {
    long double za = 0, zb = 0, kl = 0;
    for (int i = 0; i < V; i++) {
        za += expl((long double)a[i]);
        zb += expl((long double)b[i]);
    }
    for (int i = 0; i < V; i++) {
        long double p = expl((long double)a[i]) / za, q = expl((long double)b[i]) / zb;
        kl += p * logl(p / q);
    }
    return kl;
}

static void test_kl_and_nll_match_an_independent_computation(void **state) {
    fixture *f = *state;
    NEED_MODEL(f);
    kvs_closed_loop_opts o = tf_opts(f, "window", 6);
    logit_log lg;
    log_init(&lg, f);
    o.on_step = log_step;
    o.on_step_user = &lg;
    kvs_closed_loop_result *r = NULL;
    assert_int_equal(kvs_closed_loop_run(&o, &r), KVS_OK);
    int positive = 0;
    double nll_sum = 0;
    for (int64_t s = 0; s < r->n_steps; s++) {
        const float *a = lg.full + (size_t)s * (size_t)lg.V, *b = lg.pol + (size_t)s * (size_t)lg.V;
        long double kl = ref_kl(a, b, lg.V);
        assert_true(fabs((double)kl - r->steps[s].kl) <= 1e-9 + 1e-7 * (double)kl);
        positive += r->steps[s].kl > 1e-6;
        int32_t tok = f->tokens[PROMPT + s + 1];
        long double z = 0;
        for (int i = 0; i < lg.V; i++) z += expl((long double)b[i]);
        long double nll = -logl(expl((long double)b[tok]) / z);
        assert_true(fabs((double)nll - r->steps[s].nll_policy) < 1e-9);
        nll_sum += (double)nll;
        int best = 0;
        for (int i = 1; i < lg.V; i++)
            if (b[i] > b[best]) best = i;
        assert_int_equal(best, r->steps[s].policy_top1);
    }
    assert_true(positive > 0); /* a 6-token window does change the model */
    assert_true(fabs(r->ppl_policy - exp(nll_sum / (double)r->n_steps)) < 1e-9 * r->ppl_policy);
    kvs_closed_loop_result_free(r);
    log_free(&lg);
}

/* ---- naive reference of the window policy's closed loop ---- */

typedef struct {
    int B, H, Hkv, d;
    int active;
} naive_window;

/* Attention of every query head over the last B positions of the layer's cache, written out with fp64
 * accumulation (a different computation from kvs_attention: agreement within rounding, not bits). */
static kvs_status naive_window_attn(void *user, int layer, int pos, const float *q, const float *kc, const float *vc,
                                    size_t stride, float *o, float *lse) {
    naive_window *w = user;
    (void)layer;
    int lo = w->active && pos + 1 > w->B ? pos + 1 - w->B : 0;
    double sc[N_TOK];
    for (int h = 0; h < w->H; h++) {
        int kvh = h / (w->H / w->Hkv);
        const float *qh = q + (size_t)h * (size_t)w->d;
        double mx = -INFINITY, z = 0;
        for (int j = lo; j <= pos; j++) {
            double s = 0;
            for (int i = 0; i < w->d; i++) s += (double)qh[i] * kc[(size_t)j * stride + (size_t)kvh * w->d + i];
            sc[j] = s / sqrt((double)w->d);
            if (sc[j] > mx) mx = sc[j];
        }
        for (int j = lo; j <= pos; j++) z += exp(sc[j] - mx);
        for (int i = 0; i < w->d; i++) {
            double acc = 0;
            for (int j = lo; j <= pos; j++) acc += exp(sc[j] - mx) / z * vc[(size_t)j * stride + (size_t)kvh * w->d + i];
            o[(size_t)h * (size_t)w->d + i] = (float)acc;
        }
        lse[h] = (float)(mx + log(z));
    }
    return KVS_OK;
}

static void test_window_matches_a_naive_reference(void **state) {
    fixture *f = *state;
    NEED_MODEL(f);
    const kvs_model_config *c = &kvs_model_info_get(f->m)->config;
    const int B = 5;
    kvs_closed_loop_opts o = tf_opts(f, "window", B);
    logit_log lg;
    log_init(&lg, f);
    o.on_step = log_step;
    o.on_step_user = &lg;
    kvs_closed_loop_result *r = NULL;
    assert_int_equal(kvs_closed_loop_run(&o, &r), KVS_OK);
    naive_window w = {.B = B, .H = c->n_heads, .Hkv = c->n_kv_heads, .d = c->head_dim, .active = 0};
    kvs_model_state *s = NULL;
    assert_int_equal(kvs_model_state_create(f->m, N_TOK, NULL, &s), KVS_OK);
    kvs_model_state_set_attn(s, naive_window_attn, &w);
    double max_diff = 0;
    for (int p = 0; p + 1 < N_TOK; p++) {
        w.active = p >= PROMPT; /* the prompt is read with full attention */
        const float *lgt;
        assert_int_equal(kvs_model_forward(s, f->tokens[p], p, &lgt), KVS_OK);
        if (p < PROMPT) continue;
        const float *mine = lg.pol + (size_t)(p - PROMPT) * (size_t)lg.V;
        for (int i = 0; i < lg.V; i++) {
            double dd = fabs((double)lgt[i] - (double)mine[i]);
            if (dd > max_diff) max_diff = dd;
        }
        assert_true(r->steps[p - PROMPT].attended == (double)B);
    }
    assert_true(max_diff < 1e-3);
    /* and the window really differs from the full model here (the comparison is not vacuous) */
    assert_true(r->kl_mean > 1e-6);
    kvs_model_state_free(s);
    kvs_closed_loop_result_free(r);
    log_free(&lg);
}

/* The window's closed loop under a codec, naively: every layer's attention at a decode position hands the layer's
 * cache rows 0..pos of each KV head to a codec stream of its own (kvs_codec_state directly, not the host's stage),
 * prefilled with the prompt's rows at the first decode position, then attends over the stream's rows (dequantized
 * below its q(n)) of the last B positions, in fp64. */
typedef struct {
    naive_window w;
    const kvs_codec *codec;
    kvs_codec_state *st[8][8]; /* [layer][KV head] */
    float k[N_TOK * 64], v[N_TOK * 64];
} naive_codec_window;

static kvs_status naive_codec_window_attn(void *user, int layer, int pos, const float *q, const float *kc,
                                          const float *vc, size_t stride, float *o, float *lse) {
    naive_codec_window *nc = user;
    naive_window *w = &nc->w;
    if (!w->active) return naive_window_attn(w, layer, pos, q, kc, vc, stride, o, lse);
    int lo = pos + 1 > w->B ? pos + 1 - w->B : 0;
    double sc[N_TOK];
    for (int kvh = 0; kvh < w->Hkv; kvh++) {
        for (int j = 0; j <= pos; j++)
            for (int i = 0; i < w->d; i++) {
                nc->k[j * w->d + i] = kc[(size_t)j * stride + (size_t)kvh * w->d + i];
                nc->v[j * w->d + i] = vc[(size_t)j * stride + (size_t)kvh * w->d + i];
            }
        kvs_codec_state **st = &nc->st[layer][kvh];
        if (!*st) {
            assert_int_equal(kvs_codec_state_create(nc->codec, w->d, N_TOK, st), KVS_OK);
            assert_int_equal(kvs_codec_state_prefill(*st, nc->k, nc->v, PROMPT), KVS_OK);
        }
        assert_int_equal(kvs_codec_state_advance(*st, nc->k, nc->v, pos + 1), KVS_OK);
        const float *rk = kvs_codec_state_rows(*st, KVS_CODEC_K), *rv = kvs_codec_state_rows(*st, KVS_CODEC_V);
        for (int g = 0; g < w->H / w->Hkv; g++) {
            int h = kvh * (w->H / w->Hkv) + g;
            const float *qh = q + (size_t)h * (size_t)w->d;
            double mx = -INFINITY, z = 0;
            for (int j = lo; j <= pos; j++) {
                double s = 0;
                for (int i = 0; i < w->d; i++) s += (double)qh[i] * rk[j * w->d + i];
                sc[j] = s / sqrt((double)w->d);
                if (sc[j] > mx) mx = sc[j];
            }
            for (int j = lo; j <= pos; j++) z += exp(sc[j] - mx);
            for (int i = 0; i < w->d; i++) {
                double acc = 0;
                for (int j = lo; j <= pos; j++) acc += exp(sc[j] - mx) / z * rv[j * w->d + i];
                o[(size_t)h * (size_t)w->d + i] = (float)acc;
            }
            lse[h] = (float)(mx + log(z));
        }
    }
    return KVS_OK;
}

/* A codec in the closed loop: the policy model attends over the codec's rows of its own history, checked against the
 * naive codec window above (logits within rounding); 2-bit codes really move the model (KL against the same run
 * without a codec), the run's bytes are the codec's (below the 16-bit run's), its seed depends on the codec, and the
 * full model is untouched by it. */
static void test_window_with_codec_matches_a_naive_reference(void **state) {
    fixture *f = *state;
    NEED_MODEL(f);
    const kvs_model_config *c = &kvs_model_info_get(f->m)->config;
    assert_true(c->n_layers <= 8 && c->n_kv_heads <= 8 && c->head_dim <= 64);
    const int B = 12;
    kvs_codec *codec = NULL;
    assert_int_equal(kvs_codec_parse("int:bits=2,group=8", &codec), KVS_OK);
    kvs_closed_loop_opts o = tf_opts(f, "window", B), plain = o;
    o.codec = codec;
    logit_log lg;
    log_init(&lg, f);
    o.on_step = log_step;
    o.on_step_user = &lg;
    kvs_closed_loop_result *r = NULL, *r0 = NULL;
    assert_int_equal(kvs_closed_loop_run(&o, &r), KVS_OK);
    assert_int_equal(kvs_closed_loop_run(&plain, &r0), KVS_OK);
    naive_codec_window *nc = calloc(1, sizeof *nc);
    assert_non_null(nc);
    nc->w = (naive_window){.B = B, .H = c->n_heads, .Hkv = c->n_kv_heads, .d = c->head_dim, .active = 0};
    nc->codec = codec;
    kvs_model_state *s = NULL;
    assert_int_equal(kvs_model_state_create(f->m, N_TOK, NULL, &s), KVS_OK);
    kvs_model_state_set_attn(s, naive_codec_window_attn, nc);
    double max_diff = 0, moved = 0;
    for (int p = 0; p + 1 < N_TOK; p++) {
        nc->w.active = p >= PROMPT;
        const float *lgt;
        assert_int_equal(kvs_model_forward(s, f->tokens[p], p, &lgt), KVS_OK);
        if (p < PROMPT) continue;
        const float *mine = lg.pol + (size_t)(p - PROMPT) * (size_t)lg.V;
        for (int i = 0; i < lg.V; i++) max_diff = fmax(max_diff, fabs((double)lgt[i] - (double)mine[i]));
        assert_true(r->steps[p - PROMPT].nll_full == r0->steps[p - PROMPT].nll_full); /* the full model as before */
        moved = fmax(moved, fabs(r->steps[p - PROMPT].nll_policy - r0->steps[p - PROMPT].nll_policy));
    }
    assert_true(max_diff < 1e-3);
    assert_true(moved > 1e-4); /* 2-bit codes change what the policy model predicts */
    assert_true(r->kl_mean != r0->kl_mean);
    assert_true(r->storage_bytes_mean < r0->storage_bytes_mean); /* codes and scales, not 16-bit rows */
    assert_true(r->traffic_bytes_mean < r0->traffic_bytes_mean);
    for (int l = 0; l < 8; l++)
        for (int h = 0; h < 8; h++) kvs_codec_state_free(nc->st[l][h]);
    free(nc);
    kvs_model_state_free(s);
    kvs_closed_loop_result_free(r);
    kvs_closed_loop_result_free(r0);
    log_free(&lg);
    kvs_codec_free(codec);
}

/* ---- leak test ---- */

/* The full model's attention, then a large perturbation of its output: the full model's hidden states (and so
 * its keys, values and logits from the next layer on) change; the policy model must not notice. */
static kvs_status perturbed_full_attn(void *user, int layer, int pos, const float *q, const float *kc, const float *vc,
                                      size_t stride, float *o, float *lse) {
    const kvs_model_config *c = user;
    float probs[N_TOK];
    for (int h = 0; h < c->n_heads; h++) {
        int kvh = h / (c->n_heads / c->n_kv_heads);
        lse[h] = (float)kvs_attention(q + (size_t)h * c->head_dim, kc + (size_t)kvh * c->head_dim,
                                      vc + (size_t)kvh * c->head_dim, stride, NULL, (size_t)pos + 1,
                                      (size_t)c->head_dim, c->attn_scale, probs, o + (size_t)h * c->head_dim);
        for (int i = 0; i < c->head_dim; i++) o[(size_t)h * c->head_dim + i] += 0.5f * sinf((float)(layer + 3 * i + 7 * pos));
    }
    return KVS_OK;
}

static void test_policy_model_never_sees_the_full_model(void **state) {
    fixture *f = *state;
    NEED_MODEL(f);
    const kvs_model_config *c = &kvs_model_info_get(f->m)->config;
    int checked = 0;
    for (int i = 0; i < kvs_policy_count(); i++) {
        const struct kvs_policy_ops *ops = kvs_policy_at(i);
        if (ops->is_oracle) continue;
        kvs_closed_loop_opts o = tf_opts(f, ops->name, 8);
        kvs_closed_loop_result *a = NULL, *b = NULL;
        kvs_status st = kvs_closed_loop_run(&o, &a);
        if (st == KVS_ERR_INVALID_ARG) { /* a default configuration this short text cannot run (says why) */
            fprintf(stderr, "note: %s skipped at budget 8: %s\n", ops->name, kvs_last_error());
            continue;
        }
        assert_int_equal(st, KVS_OK);
        o.full_attn = perturbed_full_attn;
        o.full_attn_user = (void *)c;
        assert_int_equal(kvs_closed_loop_run(&o, &b), KVS_OK);
        assert_int_equal(a->n_steps, b->n_steps);
        int full_moved = 0;
        for (int64_t s = 0; s < a->n_steps; s++) {
            assert_true(a->steps[s].nll_policy == b->steps[s].nll_policy);
            assert_int_equal(a->steps[s].policy_top1, b->steps[s].policy_top1);
            assert_true(a->steps[s].out_err == b->steps[s].out_err);
            assert_true(a->steps[s].attn_recall == b->steps[s].attn_recall);
            assert_true(a->steps[s].attended == b->steps[s].attended);
            full_moved |= a->steps[s].nll_full != b->steps[s].nll_full;
        }
        assert_true(full_moved); /* the perturbation did reach the full model */
        checked++;
        kvs_closed_loop_result_free(a);
        kvs_closed_loop_result_free(b);
    }
    assert_true(checked >= 10);
}

/* The same with a codec in the policy model's cache: the codec's stage reads the policy model's own rows (and, for
 * think, its own prompt queries), never the full model's. */
static void test_policy_model_with_codec_never_sees_the_full_model(void **state) {
    fixture *f = *state;
    NEED_MODEL(f);
    const kvs_model_config *c = &kvs_model_info_get(f->m)->config;
    const char *const codecs[] = {"int:bits=2,group=8", "think:ratio=0.5,window=8", "fp8"};
    const char *const policies[] = {"h2o", "snapkv", "tova", "window"};
    for (size_t k = 0; k < sizeof codecs / sizeof *codecs; k++) {
        kvs_codec *codec = NULL;
        assert_int_equal(kvs_codec_parse(codecs[k], &codec), KVS_OK);
        for (size_t i = 0; i < sizeof policies / sizeof *policies; i++) {
            kvs_closed_loop_opts o = tf_opts(f, policies[i], 8);
            o.codec = codec;
            kvs_closed_loop_result *a = NULL, *b = NULL;
            assert_int_equal(kvs_closed_loop_run(&o, &a), KVS_OK);
            o.full_attn = perturbed_full_attn;
            o.full_attn_user = (void *)c;
            assert_int_equal(kvs_closed_loop_run(&o, &b), KVS_OK);
            int full_moved = 0;
            for (int64_t s = 0; s < a->n_steps; s++) {
                assert_true(a->steps[s].nll_policy == b->steps[s].nll_policy);
                assert_true(a->steps[s].out_err == b->steps[s].out_err);
                assert_true(a->steps[s].storage_bytes == b->steps[s].storage_bytes);
                full_moved |= a->steps[s].nll_full != b->steps[s].nll_full;
            }
            assert_true(full_moved);
            kvs_closed_loop_result_free(a);
            kvs_closed_loop_result_free(b);
        }
        kvs_codec_free(codec);
    }
}

/* ---- free-running ---- */

static void test_free_running_agrees_with_teacher_forcing_on_its_own_tokens(void **state) {
    fixture *f = *state;
    NEED_MODEL(f);
    kvs_closed_loop_opts o = tf_opts(f, "full", 4);
    o.free_running = 1;
    o.n_tokens = o.prompt_len = PROMPT;
    o.max_new = 20;
    kvs_closed_loop_result *r = NULL;
    assert_int_equal(kvs_closed_loop_run(&o, &r), KVS_OK);
    assert_int_equal(r->n_generated, 20);
    assert_int_equal(r->first_divergence, -1);
    assert_true(r->token_agreement == 1.0);
    kvs_closed_loop_result_free(r);

    o = tf_opts(f, "window", 3);
    o.free_running = 1;
    o.n_tokens = o.prompt_len = PROMPT;
    o.max_new = 20;
    assert_int_equal(kvs_closed_loop_run(&o, &r), KVS_OK);
    int64_t first = -1, same = 0;
    for (int64_t i = 0; i < r->n_generated; i++) {
        if (r->full_tokens[i] == r->policy_tokens[i]) same++;
        else if (first < 0) first = i;
    }
    assert_int_equal(first, r->first_divergence);
    assert_true(first > 0); /* a 3-token window diverges, and never at the first (uncompressed) token */
    assert_true(fabs(r->token_agreement - (double)same / 20.0) < 1e-12);
    /* Teacher forcing the policy model on its own generation must predict that same generation. */
    int32_t text[PROMPT + 20];
    memcpy(text, f->tokens, PROMPT * sizeof(int32_t));
    memcpy(text + PROMPT, r->policy_tokens, 20 * sizeof(int32_t));
    kvs_closed_loop_opts t = tf_opts(f, "window", 3);
    t.tokens = text;
    t.n_tokens = PROMPT + 20;
    kvs_closed_loop_result *tr = NULL;
    assert_int_equal(kvs_closed_loop_run(&t, &tr), KVS_OK);
    for (int64_t s = 0; s < tr->n_steps; s++) assert_int_equal(tr->steps[s].policy_top1, r->policy_tokens[s + 1]);
    kvs_closed_loop_result_free(tr);
    kvs_closed_loop_result_free(r);
}

/* Free-running after given tokens: tokens[PROMPT..N_TOK) are read by both models (the policy model through S_t), then
 * each generates. Those steps' reference is the next given token; the first generated token is the prediction at the
 * last given position, so a policy moves it; teacher forcing the policy model on the given tokens and its own
 * generation predicts that generation token for token. */
static void test_free_running_after_given_tokens_reads_them_through_the_policy(void **state) {
    fixture *f = *state;
    NEED_MODEL(f);
    const int64_t gen = 6, given = N_TOK - PROMPT;
    /* the full policy reads the given tokens as the plain model does: every step agrees, nothing diverges */
    kvs_closed_loop_opts o = tf_opts(f, "full", 4);
    o.free_running = 1;
    o.max_new = gen;
    kvs_closed_loop_result *r = NULL;
    assert_int_equal(kvs_closed_loop_run(&o, &r), KVS_OK);
    assert_int_equal(r->n_generated, gen);
    assert_int_equal(r->n_steps, given + gen - 1);
    assert_int_equal(r->first_divergence, -1);
    for (int64_t s = 0; s < r->n_steps; s++) {
        assert_int_equal(r->steps[s].position, PROMPT + s);
        if (s < given - 1) assert_int_equal(r->steps[s].ref_token, f->tokens[PROMPT + s + 1]);
        else assert_int_equal(r->steps[s].ref_token, r->full_tokens[s - (given - 1)]);
        assert_true(r->steps[s].kl == 0.0);
    }
    /* the full model's generation is the plain model's greedy continuation of all N_TOK tokens */
    kvs_model_state *ms = NULL;
    assert_int_equal(kvs_model_state_create(f->m, N_TOK + (int)gen, NULL, &ms), KVS_OK);
    const float *lg = NULL;
    const int V = kvs_model_info_get(f->m)->config.vocab_size;
    for (int i = 0; i < N_TOK; i++) assert_int_equal(kvs_model_forward(ms, f->tokens[i], i, &lg), KVS_OK);
    for (int64_t j = 0; j < gen; j++) {
        int best = 0;
        for (int k = 1; k < V; k++)
            if (lg[k] > lg[best]) best = k;
        assert_int_equal(r->full_tokens[j], best);
        if (j + 1 < gen) assert_int_equal(kvs_model_forward(ms, best, N_TOK + (int)j, &lg), KVS_OK);
    }
    kvs_model_state_free(ms);
    kvs_closed_loop_result_free(r);

    /* a 2-token window: the policy model's generation, token 0 included, is teacher forcing's prediction */
    o = tf_opts(f, "window", 2);
    o.free_running = 1;
    o.max_new = gen;
    assert_int_equal(kvs_closed_loop_run(&o, &r), KVS_OK);
    int32_t text[N_TOK + 6];
    memcpy(text, f->tokens, N_TOK * sizeof(int32_t));
    memcpy(text + N_TOK, r->policy_tokens, (size_t)gen * sizeof(int32_t));
    kvs_closed_loop_opts t = tf_opts(f, "window", 2);
    t.tokens = text;
    t.n_tokens = N_TOK + gen;
    kvs_closed_loop_result *tr = NULL;
    assert_int_equal(kvs_closed_loop_run(&t, &tr), KVS_OK);
    assert_int_equal(tr->n_steps, given + gen - 1);
    for (int64_t s = 0; s < tr->n_steps; s++) {
        assert_int_equal(tr->steps[s].policy_top1, r->steps[s].policy_top1);
        if (s >= given - 1) assert_int_equal(tr->steps[s].policy_top1, r->policy_tokens[s - (given - 1)]);
    }
    /* the window reaches the first generated token: its distribution there (the step at the last given position)
     * differs from the full model's, which a prompt of all N_TOK tokens (that token from the uncompressed prompt, the
     * same in both) can never do */
    assert_true(r->steps[given - 1].kl > 1e-6);
    kvs_closed_loop_result_free(tr);
    kvs_closed_loop_result_free(r);
}

static void test_bad_options_are_rejected(void **state) {
    fixture *f = *state;
    NEED_MODEL(f);
    kvs_closed_loop_result *r = NULL;
    kvs_closed_loop_opts o = tf_opts(f, "window", 4);
    o.prompt_len = N_TOK - 1;
    assert_int_equal(kvs_closed_loop_run(&o, &r), KVS_ERR_INVALID_ARG);
    assert_non_null(strstr(kvs_last_error(), "prompt length"));
    assert_null(r);
    o = tf_opts(f, "topk", 4);
    assert_int_equal(kvs_closed_loop_run(&o, &r), KVS_ERR_INVALID_ARG);
    assert_non_null(strstr(kvs_last_error(), "oracle"));
    o = tf_opts(f, "window", 4);
    o.budget = 0;
    assert_int_equal(kvs_closed_loop_run(&o, &r), KVS_ERR_INVALID_ARG);
    int32_t bad[3] = {1, 99999, 2};
    o = tf_opts(f, "window", 4);
    o.tokens = bad;
    o.n_tokens = 3;
    o.prompt_len = 1;
    assert_int_equal(kvs_closed_loop_run(&o, &r), KVS_ERR_RANGE);
    /* free-running: the prompt is at most the tokens given; a whole-input prompt needs 2 tokens generated (the first
     * is the uncompressed prompt's), a shorter one 1 */
    o = tf_opts(f, "window", 4);
    o.free_running = 1;
    o.prompt_len = N_TOK + 1;
    o.max_new = 4;
    assert_int_equal(kvs_closed_loop_run(&o, &r), KVS_ERR_INVALID_ARG);
    assert_non_null(strstr(kvs_last_error(), "free-running: prompt length 41 must be in [1, 40]"));
    o.prompt_len = N_TOK;
    o.max_new = 1;
    assert_int_equal(kvs_closed_loop_run(&o, &r), KVS_ERR_INVALID_ARG);
    assert_non_null(strstr(kvs_last_error(), "--steps 1 must be >= 2"));
    o.prompt_len = N_TOK - 1;
    o.max_new = 0;
    assert_int_equal(kvs_closed_loop_run(&o, &r), KVS_ERR_INVALID_ARG);
    assert_non_null(strstr(kvs_last_error(), "0 tokens to generate"));
    o.max_new = 1;
    assert_int_equal(kvs_closed_loop_run(&o, &r), KVS_OK);
    assert_int_equal(r->n_generated, 1);
    assert_int_equal(r->n_steps, 1);
    kvs_closed_loop_result_free(r);
}

/* ---- one host for both drivers ---- */

/* A test policy that keeps every position it has seen (stored(): 0..p, a selection-only policy's host store on the
 * device) but attends only the last `window` of them; account() records what the host pre-filled. With `bad_store`
 * its stored() also names the next, future position: a contract violation the host must catch in both drivers. */
typedef struct {
    int64_t n;         /* positions seen */
    int64_t budget;
    int bad_store;
} keepall_state;

static double g_seen_kv_bytes, g_expected_kv_bytes;
static int64_t g_account_calls, g_account_mismatch;
static int g_bad_store;

static kvs_status ka_create(const kvs_policy_init *init, void **out) {
    keepall_state *s = calloc(1, sizeof *s);
    if (!s) return KVS_ERR_NOMEM;
    s->budget = init->budget;
    s->bad_store = g_bad_store;
    *out = s;
    return KVS_OK;
}
static void ka_free(void *st) { free(st); }
static kvs_status ka_prefill(void *st, const kvs_policy_view *v) {
    ((keepall_state *)st)->n = v->n;
    return KVS_OK;
}
static kvs_status ka_select(void *st, const kvs_policy_view *v, kvs_policy_sel *sel) {
    keepall_state *s = st;
    s->n = v->n;
    int64_t w = v->n < s->budget ? v->n : s->budget;
    for (int64_t j = 0; j < w; j++) sel->idx[0][j] = (int32_t)(v->n - w + j);
    sel->n[0] = w;
    return KVS_OK;
}
static int64_t ka_stored(void *st, int g, int32_t *out) {
    (void)g;
    keepall_state *s = st;
    for (int64_t j = 0; j < s->n; j++) out[j] = (int32_t)j;
    if (s->bad_store) {
        out[s->n] = (int32_t)s->n; /* the position after the current one */
        return s->n + 1;
    }
    return s->n;
}
static void ka_account(void *st, const kvs_policy_view *v, const kvs_policy_sel *sel, kvs_policy_cost *c) {
    (void)st, (void)sel;
    g_account_calls++;
    /* the default accounting counts the stored positions with the attended ones: all n of them, 2 x d x 2 bytes */
    g_expected_kv_bytes = (double)v->n * 2.0 * v->head_dim * 2.0;
    g_seen_kv_bytes = c->kv_bytes;
    if (c->kv_bytes != g_expected_kv_bytes) g_account_mismatch++;
}
static const struct kvs_policy_ops keepall_ops = {
    .version = KVS_POLICY_INTERFACE_VERSION,
    .name = "keepall_window", .summary = "test: stores everything, attends a window",
    .budget_scope = KVS_BUDGET_EVERY_STEP, .create = ka_create, .free = ka_free, .prefill = ka_prefill,
    .select = ka_select, .stored = ka_stored, .account = ka_account,
};

/* The closed loop's accounting is the replay's (sim/host.h): account() is handed KV of stored() ∪ S_t, not of S_t
 * alone, and the step's storage is what the policy holds. */
static void test_closed_loop_accounts_as_the_replay(void **state) {
    fixture *f = *state;
    NEED_MODEL(f);
    kvs_closed_loop_opts o = tf_opts(f, "window", 4);
    assert_int_equal(kvs_policy_parse_ops(&keepall_ops, NULL, &o.policy), KVS_OK);
    g_bad_store = 0;
    g_account_calls = g_account_mismatch = 0;
    kvs_closed_loop_result *r = NULL;
    assert_int_equal(kvs_closed_loop_run(&o, &r), KVS_OK);
    assert_true(g_account_calls > 0);
    if (g_account_mismatch)
        fail_msg("account() saw kv_bytes %.0f where stored() ∪ S_t holds %.0f", g_seen_kv_bytes, g_expected_kv_bytes);
    /* resident storage: every position seen at each step, averaged over the steps */
    const kvs_model_config *mc = &kvs_model_info_get(f->m)->config;
    double row = 2.0 * mc->head_dim * 2.0, expect = 0;
    for (int64_t i = 0; i < r->n_steps; i++) expect += (double)(r->steps[i].position + 1) * row;
    expect /= (double)r->n_steps;
    assert_true(fabs(r->storage_bytes_mean - expect) <= 1e-9 * expect);
    assert_true(r->steps[0].traffic_bytes == 4 * row); /* the window of 4 read */
    kvs_closed_loop_result_free(r);
}

/* The selection check is the replay's: a stored() position in the future fails the run in closed loop too. */
static void test_closed_loop_checks_stored_positions(void **state) {
    fixture *f = *state;
    NEED_MODEL(f);
    kvs_closed_loop_opts o = tf_opts(f, "window", 4);
    assert_int_equal(kvs_policy_parse_ops(&keepall_ops, NULL, &o.policy), KVS_OK);
    g_bad_store = 1;
    kvs_closed_loop_result *r = NULL;
    assert_int_equal(kvs_closed_loop_run(&o, &r), KVS_ERR_STATE);
    assert_non_null(strstr(kvs_last_error(), "future or invalid"));
    assert_null(r);
    g_bad_store = 0;
}

/* A randomised policy's closed loop is seeded from the run's identity: the same run gives the same numbers; another
 * budget is another run. */
static void test_closed_loop_seeds_from_identity(void **state) {
    fixture *f = *state;
    NEED_MODEL(f);
    kvs_closed_loop_opts o = tf_opts(f, "keyformer", 8);
    kvs_closed_loop_result *a = NULL, *b = NULL;
    assert_int_equal(kvs_closed_loop_run(&o, &a), KVS_OK);
    assert_int_equal(kvs_closed_loop_run(&o, &b), KVS_OK);
    assert_int_equal(a->n_steps, b->n_steps);
    for (int64_t i = 0; i < a->n_steps; i++) {
        assert_true(a->steps[i].kl == b->steps[i].kl);
        assert_true(a->steps[i].out_err == b->steps[i].out_err);
    }
    kvs_closed_loop_result_free(a);
    kvs_closed_loop_result_free(b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_full_policy_is_bit_identical),
        cmocka_unit_test(test_kl_and_nll_match_an_independent_computation),
        cmocka_unit_test(test_window_matches_a_naive_reference),
        cmocka_unit_test(test_window_with_codec_matches_a_naive_reference),
        cmocka_unit_test(test_policy_model_never_sees_the_full_model),
        cmocka_unit_test(test_policy_model_with_codec_never_sees_the_full_model),
        cmocka_unit_test(test_free_running_agrees_with_teacher_forcing_on_its_own_tokens),
        cmocka_unit_test(test_free_running_after_given_tokens_reads_them_through_the_policy),
        cmocka_unit_test(test_bad_options_are_rejected),
        cmocka_unit_test(test_closed_loop_accounts_as_the_replay),
        cmocka_unit_test(test_closed_loop_checks_stored_positions),
        cmocka_unit_test(test_closed_loop_seeds_from_identity),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
