/* test_codec_leak.c — the replay with a codec (the representation stage, sim/host.h; kvs_replay_opts.codecs) adds no
 * look-ahead: the no-oracle-leakage check of tests/test_policy_conformance.c (future q/k/v perturbed, past choices
 * unchanged) run with every quantizing codec kind (int, kivi, hf, fp8) under two policies, and extended from the
 * choices to every metric of every measured step: with the q, k and v of every position after a cut replaced, each
 * per-step sample (sim/metrics.h, all metrics, bit for bit) and each selection at positions up to the cut must stay
 * the same. The check is shown to bite: perturbing the cut's own position changes the step at the cut.
 * Then a sanity check of the wiring: int:bits=8 stays within a stated tolerance of the same run without a codec
 * (and is not identical to it), and int:bits=4's error is about (2^8 - 1) / (2^4 - 1) = 17 times int8's.
 * Data: GENERATED Gaussian streams (tests/util/gen_trace.h, never a model's), two turns, GQA group 2.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "policies/registry.h"
#include "sim/codec.h"
#include "sim/policy.h"
#include "sim/replay.h"
#include "sim/replay_mem.h"
#include "tests/util/replay_fixture.h"
#include "tests/util/testenv.h"

typedef kvs_test_replay_fixture fixture;

/* 72 positions in two turns of 36 (18 prompt + 18 generated each: turn 0's prompt 0..17, decode 18..35; turn 1's
 * prompt 36..53, decode 54..71), 2 layers, 2 KV heads of 2 query heads, d = 8, sharpened queries (as the
 * conformance test's fixture). */
static void fixture_make(fixture *f, uint64_t seed) {
    kvs_gen_trace_opts o = kvs_gen_trace_defaults();
    o.n_positions = 72;
    o.n_turns = 2;
    o.n_kv_heads = 2;
    o.n_heads = 4;
    o.head_dim = 8;
    o.seed = seed;
    o.q_scale = 2.0f;
    assert_int_equal(kvs_test_replay_fixture_make(&o, 2, 16, f), KVS_OK);
}

/* One spec per codec kind, sized to d = 8 and 72 positions so that groups become final during the run (K
 * token-axis groups of 4 positions, KIVI's residual flushing every 8, HF's every 6, fp8 scaled from the prompt). */
static const char *const SPECS[] = {
    "int:bits=4,group=4,k_axis=token,v_axis=channel",
    "kivi:bits=2,group=4,residual=8",
    "hf:bits=4,group=8,residual=6",
    "fp8:format=e4m3,scale=prompt,per=head",
    "think:ratio=0.5,window=6,recent=4", /* channels from the first prompt's window queries */
};
#define N_SPECS (sizeof SPECS / sizeof SPECS[0])

static const char *const POLICIES[] = {"h2o", "tova"};
#define BUDGET 11

/* ---- one run's selections and per-step samples ------------------------------------------------------------ */

typedef struct {
    const fixture *f;
    int32_t *data; /* [cells][N] sorted selections */
    int64_t *n;    /* [cells] */
    char *seen;    /* [cells] */
} recorder;

static size_t cell_of(const fixture *f, int l, int h, int64_t p, int li) {
    return (((size_t)l * (size_t)f->Hkv + (size_t)h) * (size_t)f->N + (size_t)p) * (size_t)f->G + (size_t)li;
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static void on_select(void *user, int config, int layer, int kv_head, int64_t pos, const kvs_policy_sel *sel) {
    (void)config;
    recorder *r = user;
    for (int li = 0; li < sel->n_lists; li++) {
        size_t c = cell_of(r->f, layer, kv_head, pos, li);
        int32_t *row = r->data + c * (size_t)r->f->N;
        memcpy(row, sel->idx[li], (size_t)sel->n[li] * sizeof(int32_t));
        qsort(row, (size_t)sel->n[li], sizeof(int32_t), cmp_i32);
        r->n[c] = sel->n[li];
        r->seen[c] = 1;
    }
}

static void rec_init(recorder *r, const fixture *f) {
    size_t cells = (size_t)f->L * (size_t)f->Hkv * (size_t)f->N * (size_t)f->G;
    r->f = f;
    r->data = calloc(cells * (size_t)f->N, sizeof(int32_t));
    r->n = calloc(cells, sizeof(int64_t));
    r->seen = calloc(cells, 1);
    assert_true(r->data && r->n && r->seen);
}

static void rec_free(recorder *r) {
    free(r->data);
    free(r->n);
    free(r->seen);
}

/* The run of policy `pol` at BUDGET under codec c (NULL: none) on f, every measured step in its series. */
static kvs_replay_result *run(const fixture *f, const char *pol, const kvs_codec *c, kvs_replay_measure measure,
                              recorder *rec) {
    kvs_replay_config rc = {.budget = BUDGET, .budget_fraction = -1};
    assert_int_equal(kvs_policy_parse(pol, &rc.policy), KVS_OK);
    kvs_replay_source src;
    assert_int_equal(kvs_replay_source_from_memory(&f->mem, &src), KVS_OK);
    const kvs_codec *codecs[1] = {c};
    kvs_replay_hooks hooks = {.user = rec, .on_select = on_select};
    kvs_replay_opts o = {.configs = &rc, .n_configs = 1, .threads = 2, .measure = measure, .series_every = 1,
                         .hooks = rec ? &hooks : NULL, .codecs = codecs};
    kvs_replay_result *r = NULL;
    kvs_status st = kvs_replay_execute(&src, &o, &r);
    if (st != KVS_OK) fail_msg("%s with %s: %s", pol, c ? kvs_codec_spec(c) : "no codec", kvs_last_error());
    if (r->runs[0].status != KVS_OK) fail_msg("%s with %s: %s", pol, c ? kvs_codec_spec(c) : "-", r->runs[0].error);
    return r;
}

/* The sample of (layer, query head, position) in a run's series; NULL when that step was not measured. */
static const kvs_results_step *step_at(const kvs_replay_run_result *x, int layer, int q_head, int64_t p) {
    for (int64_t i = 0; i < x->n_steps; i++)
        if (x->steps[i].layer == layer && x->steps[i].q_head == q_head && x->steps[i].position == p)
            return &x->steps[i];
    return NULL;
}

/* 1 when every metric of two samples is the same value (NaN = NaN: both not available). */
static int same_sample(const kvs_results_step *a, const kvs_results_step *b, int *metric) {
    for (int m = 0; m < KVS_N_METRICS; m++) {
        double x = a->v[m], y = b->v[m];
        if (!(x == y || (isnan(x) && isnan(y)))) {
            *metric = m;
            return 0;
        }
    }
    return 1;
}

/* Counts the steps at positions <= upto where a and b differ in some metric (printing the first of each when
 * `show`), and the selections that differ; *compared = the samples compared. */
static int64_t differences_until(const fixture *f, const kvs_replay_run_result *a, const kvs_replay_run_result *b,
                                 const recorder *ra, const recorder *rb, int64_t upto, int show, const char *what,
                                 int64_t *compared) {
    int64_t diff = 0;
    *compared = 0;
    for (int64_t i = 0; i < a->n_steps; i++) {
        const kvs_results_step *s = &a->steps[i];
        if (s->position > upto) continue;
        const kvs_results_step *t = step_at(b, s->layer, s->q_head, s->position);
        int m = -1;
        if (!t || !same_sample(s, t, &m)) {
            if (show && diff == 0)
                print_error("%s: layer %d head %d position %lld: %s %.17g vs %.17g\n", what, s->layer, s->q_head,
                            (long long)s->position, m >= 0 ? kvs_metric_table[m].name : "(missing)",
                            m >= 0 ? s->v[m] : NAN, m >= 0 && t ? t->v[m] : NAN);
            diff++;
        }
        (*compared)++;
    }
    for (int l = 0; l < f->L; l++)
        for (int h = 0; h < f->Hkv; h++)
            for (int64_t p = 0; p <= upto && p < f->N; p++)
                for (int li = 0; li < f->G; li++) {
                    size_t c = cell_of(f, l, h, p, li);
                    if (ra->seen[c] != rb->seen[c] || ra->n[c] != rb->n[c] ||
                        memcmp(ra->data + c * (size_t)f->N, rb->data + c * (size_t)f->N,
                               (size_t)ra->n[c] * sizeof(int32_t))) {
                        if (show && diff == 0)
                            print_error("%s: the choice changed at layer %d kv head %d position %lld\n", what, l, h,
                                        (long long)p);
                        diff++;
                    }
                }
    return diff;
}

/* pert = f with the q, k and v of every position > cut replaced (as the conformance test: q -> -3q + 1, k -> 5v,
 * v -> -7k, so a read of any of them shows), every position <= cut as in f. */
static void perturb_after(const fixture *f, fixture *pert, int64_t cut) {
    size_t H = (size_t)f->H, Hkv = (size_t)f->Hkv, d = (size_t)f->d;
    for (int l = 0; l < f->L; l++)
        for (int64_t p = 0; p < f->N; p++) {
            size_t qo = ((size_t)l * (size_t)f->N + (size_t)p) * H * d, ko = ((size_t)l * (size_t)f->N + (size_t)p) * Hkv * d;
            for (size_t x = 0; x < H * d; x++) pert->g->q[qo + x] = p > cut ? -3.0f * f->g->q[qo + x] + 1.0f : f->g->q[qo + x];
            for (size_t x = 0; x < Hkv * d; x++) {
                pert->g->k[ko + x] = p > cut ? 5.0f * f->g->v[ko + x] : f->g->k[ko + x];
                pert->g->v[ko + x] = p > cut ? -7.0f * f->g->k[ko + x] : f->g->v[ko + x];
            }
        }
}

/* ---- the leak check ---------------------------------------------------------------------------------------- */

/* Every codec kind x two policies x cuts in turn 0's decode, turn 1's prompt and turn 1's decode, every position
 * measured: no sample and no choice at a position <= cut changes when the positions after it are replaced. */
static void test_codec_adds_no_look_ahead(void **state) {
    (void)state;
    fixture f, pert;
    fixture_make(&f, 7);
    fixture_make(&pert, 7);
    const int64_t cuts[] = {20, 27, 35, 44, 57, 66};
    for (size_t s = 0; s < N_SPECS; s++) {
        kvs_codec *c = NULL;
        assert_int_equal(kvs_codec_parse(SPECS[s], &c), KVS_OK);
        for (size_t pi = 0; pi < sizeof POLICIES / sizeof POLICIES[0]; pi++) {
            recorder ra;
            rec_init(&ra, &f);
            kvs_replay_result *a = run(&f, POLICIES[pi], c, KVS_MEASURE_ALL, &ra);
            /* the codec acts on these runs: some sample differs from the same run without it */
            recorder rn;
            rec_init(&rn, &f);
            kvs_replay_result *none = run(&f, POLICIES[pi], NULL, KVS_MEASURE_ALL, &rn);
            int64_t compared = 0;
            if (differences_until(&f, &a->runs[0], &none->runs[0], &ra, &rn, f.N, 0, "", &compared) == 0)
                fail_msg("%s with %s: the same numbers as without the codec", POLICIES[pi], SPECS[s]);
            kvs_replay_result_free(none);
            rec_free(&rn);
            for (size_t ci = 0; ci < sizeof cuts / sizeof cuts[0]; ci++) {
                char what[192];
                snprintf(what, sizeof what, "%s with %s, positions > %lld replaced", POLICIES[pi], SPECS[s],
                         (long long)cuts[ci]);
                perturb_after(&f, &pert, cuts[ci]);
                recorder rb;
                rec_init(&rb, &pert);
                kvs_replay_result *b = run(&pert, POLICIES[pi], c, KVS_MEASURE_ALL, &rb);
                int64_t n_cmp = 0;
                assert_int_equal(differences_until(&f, &a->runs[0], &b->runs[0], &ra, &rb, cuts[ci], 1, what, &n_cmp),
                                 0);
                /* every measured (layer, query head) at every position 0..cut was compared */
                assert_int_equal(n_cmp, (int64_t)f.L * f.H * (cuts[ci] + 1));
                /* and the comparison bites: replacing the cut's own position too changes the step at the cut */
                perturb_after(&f, &pert, cuts[ci] - 1);
                recorder rd;
                rec_init(&rd, &pert);
                kvs_replay_result *dd = run(&pert, POLICIES[pi], c, KVS_MEASURE_ALL, &rd);
                if (differences_until(&f, &a->runs[0], &dd->runs[0], &ra, &rd, cuts[ci], 0, "", &n_cmp) == 0)
                    fail_msg("%s: replacing position %lld itself changed nothing (the check cannot fail)", what,
                             (long long)cuts[ci]);
                kvs_replay_result_free(b);
                kvs_replay_result_free(dd);
                rec_free(&rb);
                rec_free(&rd);
            }
            kvs_replay_result_free(a);
            rec_free(&ra);
        }
        kvs_codec_free(c);
    }
    kvs_test_replay_fixture_free(&f);
    kvs_test_replay_fixture_free(&pert);
}

/* ---- int8 against no codec ---------------------------------------------------------------------------------- */

/* The tolerances of 8-bit codes. A min-max group of 2^8 - 1 steps puts each element within half a step (its
 * range / 510) of its value, so the output of an attention over dequantized rows moves by a fraction of a percent of
 * the rows' spread; relative to the reference output's norm (which averaging shrinks) that is: a step's error moved
 * by at most INT8_STEP_TOL, the mean over steps by at most INT8_MEAN_TOL (measured on this fixture: full's int8 error
 * 0.005 mean, 0.028 at worst; window's moved by 0.024 at worst). int4's steps are (2^8 - 1) / (2^4 - 1) = 17 times
 * wider, so its error on full is about 17 times int8's: the ratio must lie within a factor of 2 of that. */
#define INT8_STEP_TOL 5e-2
#define INT8_MEAN_TOL 1e-2

/* window and full at BUDGET, int:bits=8 (the default groups: K token-axis groups of 32, V per row) against the
 * same runs without a codec, every decode step: |err_int8 - err_none| within the tolerances above at each step and
 * on the mean (full: err_none is exactly 0, so that is int8's own error), not all equal (the codec acts), and
 * int4's error on full about 17 times int8's. */
static void test_int8_is_close_to_no_codec(void **state) {
    (void)state;
    fixture f;
    fixture_make(&f, 11);
    kvs_codec *c8 = NULL, *c4 = NULL;
    assert_int_equal(kvs_codec_parse("int:bits=8", &c8), KVS_OK);
    assert_int_equal(kvs_codec_parse("int:bits=4", &c4), KVS_OK);
    const char *const pols[] = {"window", "full"};
    for (size_t pi = 0; pi < 2; pi++) {
        int full = !strcmp(pols[pi], "full");
        kvs_replay_result *r8 = run(&f, pols[pi], c8, KVS_MEASURE_DECODE, NULL);
        kvs_replay_result *r4 = run(&f, pols[pi], c4, KVS_MEASURE_DECODE, NULL);
        kvs_replay_result *r0 = run(&f, pols[pi], NULL, KVS_MEASURE_DECODE, NULL);
        const kvs_replay_run_result *x8 = &r8->runs[0], *x4 = &r4->runs[0], *x0 = &r0->runs[0];
        assert_int_equal(x8->n_steps, x0->n_steps);
        assert_true(x8->n_steps == (int64_t)f.L * f.H * 36); /* 18 decode positions per turn, two turns */
        double worst = 0, sum = 0;
        int64_t moved = 0;
        for (int64_t i = 0; i < x8->n_steps; i++) {
            const kvs_results_step *s = &x8->steps[i], *t = step_at(x0, s->layer, s->q_head, s->position);
            assert_non_null(t);
            double d = fabs(s->v[KVS_M_OUT_ERR] - t->v[KVS_M_OUT_ERR]);
            if (d > worst) worst = d;
            sum += d;
            moved += d > 0;
            if (full) assert_true(t->v[KVS_M_OUT_ERR] == 0);
        }
        double mean = sum / (double)x8->n_steps, e8 = x8->run_agg.m[KVS_M_OUT_ERR].mean,
               e4 = x4->run_agg.m[KVS_M_OUT_ERR].mean;
        print_message("%s: int8 vs no codec: step |d out_err| mean %.3g, worst %.3g over %lld steps (%lld moved); mean "
                      "out_err none %.4g int8 %.4g int4 %.4g\n",
                      pols[pi], mean, worst, (long long)x8->n_steps, (long long)moved, x0->run_agg.m[KVS_M_OUT_ERR].mean,
                      e8, e4);
        assert_true(worst <= INT8_STEP_TOL);
        assert_true(mean <= INT8_MEAN_TOL);
        assert_true(moved > 0);
        if (full) {
            assert_true(fabs(e8 - mean) <= 1e-6 * mean); /* the same numbers read two ways */
            assert_true(e4 >= 17.0 / 2 * e8 && e4 <= 17.0 * 2 * e8);
        }
        kvs_replay_result_free(r8);
        kvs_replay_result_free(r4);
        kvs_replay_result_free(r0);
    }
    kvs_codec_free(c8);
    kvs_codec_free(c4);
    kvs_test_replay_fixture_free(&f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_codec_adds_no_look_ahead),
        cmocka_unit_test(test_int8_is_close_to_no_codec),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
