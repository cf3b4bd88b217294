/* test_policy_conformance.c — the common contract, run on EVERY policy in the registry (policies/registry.c),
 * as ggml's backend test runs every op on every backend (STYLE.md rule 5):
 *  - parameter validation: unknown key, malformed and out-of-range values -> KVS_ERR_INVALID_ARG naming it;
 *    the canonical string parses back to itself; every named preset parses to its parameters and is listed with
 *    them in examples/PRESETS.md;
 *  - budget respected at every step (|S_t| <= B per list; prompt-only policies: retained prompt positions <= B),
 *    B being each (layer, KV head)'s budget after the allocation pass of the policies that have one (PyramidKV,
 *    Ada-KV, D2O move budget between layers and heads: only they may give a cell other than the run's B);
 *  - determinism: the same selections and numbers with 1 and 2 threads, run twice;
 *  - the same budget and leak checks on every named preset and on the block-wise prompt processing modes;
 *  - NO ORACLE LEAKAGE: perturbing future positions' q/k/v never changes past choices (every policy), and for
 *    non-oracles scrambling, between steps, the K/V rows of every position the policy does not store never
 *    changes its choices.
 * Data: GENERATED Gaussian streams (tests/util/gen_trace.h), two turns, GQA group 2.
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

#include "../sim/codec.h"
#include "../sim/policy.h"
#include "../policies/registry.h"
#include "../sim/replay.h"
#include "../sim/replay_mem.h"
#include "util/replay_fixture.h"
#include "util/testenv.h"

typedef kvs_test_replay_fixture fixture;

static void fixture_make(fixture *f, int n_turns, uint64_t seed) {
    kvs_gen_trace_opts o = kvs_gen_trace_defaults();
    o.n_positions = 72;
    o.n_turns = n_turns;
    o.n_kv_heads = 2;
    o.n_heads = 4;
    o.head_dim = 8;
    o.seed = seed;
    o.q_scale = 2.0f;
    assert_int_equal(kvs_test_replay_fixture_make(&o, 2, 16, f), KVS_OK);
}

static void fixture_free(fixture *f) { kvs_test_replay_fixture_free(f); }

/* Every selection of a run, flattened: (layer, kv head, position, list) -> sorted positions. */
typedef struct {
    const fixture *f;
    int64_t budget;
    int layout_lists;
    int32_t *data;       /* [cells][N] */
    int64_t *n;          /* [cells] */
    char *seen;          /* [cells] */
    int scramble;        /* on_step_end scrambles rows not stored */
    uint64_t rng;
    int64_t budget_violations;
} recorder;

static size_t cell_of(const recorder *r, int l, int h, int64_t p, int li) {
    return (((size_t)l * (size_t)r->f->Hkv + (size_t)h) * (size_t)r->f->N + (size_t)p) * (size_t)r->f->G + (size_t)li;
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static void rec_init(recorder *r, const fixture *f) {
    memset(r, 0, sizeof *r);
    r->f = f;
    size_t cells = (size_t)f->L * (size_t)f->Hkv * (size_t)f->N * (size_t)f->G;
    r->data = calloc(cells * (size_t)f->N, sizeof(int32_t));
    r->n = calloc(cells, sizeof(int64_t));
    r->seen = calloc(cells, 1);
    r->rng = 0x1234567;
    assert_non_null(r->data);
    assert_non_null(r->n);
    assert_non_null(r->seen);
}

static void rec_free(recorder *r) {
    free(r->data);
    free(r->n);
    free(r->seen);
}

static void on_select(void *user, int config, int layer, int kv_head, int64_t pos, const kvs_policy_sel *sel) {
    (void)config;
    recorder *r = user;
    for (int li = 0; li < sel->n_lists; li++) {
        size_t c = cell_of(r, layer, kv_head, pos, li);
        memcpy(r->data + c * (size_t)r->f->N, sel->idx[li], (size_t)sel->n[li] * sizeof(int32_t));
        qsort(r->data + c * (size_t)r->f->N, (size_t)sel->n[li], sizeof(int32_t), cmp_i32);
        r->n[c] = sel->n[li];
        r->seen[c] = 1;
    }
}

static float next_noise(recorder *r) {
    r->rng = r->rng * 6364136223846793005ull + 1442695040888963407ull;
    return ((float)(r->rng >> 40) / (float)(1u << 24) - 0.5f) * 2000.0f;
}

/* Scrambles the K/V rows of every position 0..n-1 that the policy may not read (readable(), else stored();
 * non-oracles only). Runs after every decode step and every prefill call (each block of a chunked prefill). */
static void on_step_end(void *user, int config, int layer, int kv_head, int64_t pos, void *state,
                        const struct kvs_policy_ops *ops, float *k, float *v, int64_t n) {
    (void)config;
    (void)layer;
    (void)kv_head;
    (void)pos;
    recorder *r = user;
    if (!r->scramble || ops->is_oracle || !(ops->readable || ops->stored)) return;
    char *keep = calloc((size_t)n, 1);
    int32_t *buf = malloc((size_t)r->f->N * sizeof *buf);
    assert_non_null(keep);
    assert_non_null(buf);
    for (int g = 0; g < r->layout_lists; g++) {
        int64_t m = ops->readable ? ops->readable(state, g, buf) : ops->stored(state, g, buf);
        for (int64_t j = 0; j < m; j++) {
            assert_true(buf[j] >= 0 && buf[j] < n);
            keep[buf[j]] = 1;
        }
    }
    for (int64_t j = 0; j < n; j++)
        if (!keep[j])
            for (int i = 0; i < r->f->d; i++) {
                k[(size_t)j * (size_t)r->f->d + (size_t)i] = next_noise(r);
                v[(size_t)j * (size_t)r->f->d + (size_t)i] = next_noise(r);
            }
    free(keep);
    free(buf);
}

/* What run() measures: decode positions, or every position (prompt measurement asks a chunked-prefill policy
 * what it holds before its first block, when it holds nothing yet). */
static kvs_replay_measure run_measure = KVS_MEASURE_DECODE;

/* The codec every run() uses (sim/codec.h; NULL: K/V as captured): the contract tests run again under each codec
 * kind (test_every_policy_under_every_codec). */
static const kvs_codec *run_codec;

static kvs_replay_result *run(const fixture *f, const kvs_policy_config *cfg, int64_t budget, int threads, recorder *rec) {
    kvs_replay_config rc = {.policy = *cfg, .budget = budget, .budget_fraction = -1};
    kvs_replay_source src;
    assert_int_equal(kvs_replay_source_from_memory(&f->mem, &src), KVS_OK);
    kvs_replay_hooks hooks = {.user = rec, .on_select = on_select, .on_step_end = on_step_end};
    kvs_replay_opts o = {.configs = &rc, .n_configs = 1, .threads = threads, .measure = run_measure,
                         .series_every = 3, .hooks = rec ? &hooks : NULL, .codecs = run_codec ? &run_codec : NULL};
    if (rec) {
        rec->budget = budget;
        rec->layout_lists = kvs_policy_layout(cfg) == KVS_SEL_PER_QUERY_HEAD ? f->G : 1;
    }
    kvs_replay_result *r = NULL;
    kvs_status st = kvs_replay_execute(&src, &o, &r);
    if (st != KVS_OK) print_error("policy %s: %s\n", cfg->ops->name, kvs_last_error());
    assert_int_equal(st, KVS_OK);
    if (r->runs[0].status != KVS_OK) print_error("policy %s: %s\n", cfg->ops->name, r->runs[0].error);
    assert_int_equal(r->runs[0].status, KVS_OK);
    return r;
}

/* Number of selections equal in a and b at positions <= upto (all cells recorded by a). */
static void assert_same_until(const recorder *a, const recorder *b, int64_t upto, const char *what, const char *policy) {
    const fixture *f = a->f;
    int64_t compared = 0;
    for (int l = 0; l < f->L; l++)
        for (int h = 0; h < f->Hkv; h++)
            for (int64_t p = 0; p <= upto && p < f->N; p++)
                for (int li = 0; li < f->G; li++) {
                    size_t c = cell_of(a, l, h, p, li);
                    if (a->seen[c] != b->seen[c] || a->n[c] != b->n[c] ||
                        memcmp(a->data + c * (size_t)f->N, b->data + c * (size_t)f->N, (size_t)a->n[c] * sizeof(int32_t))) {
                        print_error("%s: policy %s changed its choice at layer %d kv head %d position %lld list %d\n", what,
                                    policy, l, h, (long long)p, li);
                        fail();
                    }
                    compared += a->seen[c];
                }
    assert_true(compared > 0);
}

/* The configuration the contract runs for a policy: its defaults, except for a policy whose defaults need an external
 * input (a file the trace cannot give: DuoAttention's trained gates, written here for the fixture's shape) or
 * degenerate on the fixture's 72 positions (windows of 32 to 1024 tokens that cover the trace or every budget below,
 * so nothing would be scored or evicted): those run with the parameters of contract_inputs, one line per policy. */
static void write_duo_pattern(const fixture *f, const char *path) {
    FILE *fp = fopen(path, "w");
    assert_non_null(fp);
    for (int l = 0; l < f->L; l++)
        for (int h = 0; h < f->Hkv; h++) fprintf(fp, "%g%c", (double)((l * f->Hkv + h) % 3) / 2.0, h + 1 < f->Hkv ? '\t' : '\n');
    fclose(fp);
}

static const struct {
    const char *policy, *params;                     /* params: "%s" stands for the written file's path */
    void (*write)(const fixture *f, const char *path); /* NULL: no input file */
} contract_inputs[] = {
    {"cake", "window=4", NULL},
    {"simlayerkv", "n_init=2,n_recent=8,delta=0.3", NULL},
    {"duo", "pattern=%s,n_s=2,n_r=8", write_duo_pattern},
    {"duo_heuristic", "n_s=2,n_r=8,probe=16", NULL},
};

static void contract_defaults(const fixture *f, const struct kvs_policy_ops *ops, kvs_policy_config *cfg) {
    kvs_policy_defaults(ops, cfg);
    for (size_t i = 0; i < sizeof contract_inputs / sizeof contract_inputs[0]; i++) {
        if (strcmp(ops->name, contract_inputs[i].policy)) continue;
        char path[128] = "", params[256], spec[512];
        if (contract_inputs[i].write) {
            snprintf(path, sizeof path, "/tmp/kvs_conformance_%s_%d_%d.in", ops->name, f->L, f->Hkv);
            contract_inputs[i].write(f, path);
        }
        const char *at = strstr(contract_inputs[i].params, "%s"); /* the file's path goes there */
        if (at)
            snprintf(params, sizeof params, "%.*s%s%s", (int)(at - contract_inputs[i].params), contract_inputs[i].params,
                     path, at + 2);
        else
            snprintf(params, sizeof params, "%s", contract_inputs[i].params);
        snprintf(spec, sizeof spec, "%s:%s", ops->name, params);
        if (kvs_policy_parse(spec, cfg) != KVS_OK) fail_msg("%s: %s", spec, kvs_last_error());
    }
}

/* Largest budget-checkable budget list per policy: validate() may reject small ones (streaming sinks). */
static const int64_t budgets[] = {1, 3, 6, 11, 24};

static int budget_ok(const fixture *f, const kvs_policy_config *cfg, int64_t b) {
    kvs_status st = kvs_policy_validate(cfg, &f->mem.model, b);
    if (st != KVS_OK) assert_int_equal(st, KVS_ERR_INVALID_ARG);
    return st == KVS_OK;
}

/* ---- parameters ---------------------------------------------------------------------------------- */

static void test_every_policy_validates_parameters(void **state) {
    (void)state;
    assert_true(kvs_policy_count() >= 6);
    kvs_policy_config cfg;
    assert_int_equal(kvs_policy_parse("no_such_policy", &cfg), KVS_ERR_INVALID_ARG);
    assert_non_null(strstr(kvs_last_error(), "unknown policy 'no_such_policy'"));
    for (int i = 0; i < kvs_policy_count(); i++) {
        const struct kvs_policy_ops *ops = kvs_policy_at(i);
        char spec[KVS_POLICY_CANON_MAX + 64];
        assert_non_null(ops->name);
        assert_non_null(ops->summary);
        assert_non_null(ops->create);
        assert_non_null(ops->free);
        assert_non_null(ops->prefill);
        assert_non_null(ops->select);
        assert_ptr_equal(kvs_policy_find(ops->name), ops);
        int alloc_cbs = !!ops->alloc_begin + !!ops->alloc_prefill + !!ops->alloc_end + !!ops->alloc_free;
        assert_true(alloc_cbs == 0 || alloc_cbs == 4);
        snprintf(spec, sizeof spec, "%s:bogus_key=1", ops->name);
        assert_int_equal(kvs_policy_parse(spec, &cfg), KVS_ERR_INVALID_ARG);
        assert_non_null(strstr(kvs_last_error(), "unknown parameter 'bogus_key'"));
        /* defaults: the canonical string parses back to itself */
        assert_int_equal(kvs_policy_parse(ops->name, &cfg), KVS_OK);
        char canon[KVS_POLICY_CANON_MAX];
        snprintf(canon, sizeof canon, "%s", cfg.canonical);
        if (canon[0]) {
            snprintf(spec, sizeof spec, "%s:%s", ops->name, canon);
            assert_int_equal(kvs_policy_parse(spec, &cfg), KVS_OK);
            assert_string_equal(cfg.canonical, canon);
        }
        for (int j = 0; j < ops->n_params; j++) {
            const kvs_policy_param *pp = &ops->params[j];
            snprintf(spec, sizeof spec, "%s:%s=not_a_value", ops->name, pp->key);
            assert_int_equal(kvs_policy_parse(spec, &cfg), KVS_ERR_INVALID_ARG);
            assert_non_null(strstr(kvs_last_error(), pp->key));
            if (pp->type == KVS_PARAM_INT || pp->type == KVS_PARAM_DOUBLE) {
                snprintf(spec, sizeof spec, "%s:%s=%.17g", ops->name, pp->key, pp->hi + 1);
                assert_int_equal(kvs_policy_parse(spec, &cfg), KVS_ERR_INVALID_ARG);
                assert_non_null(strstr(kvs_last_error(), "out of range"));
                snprintf(spec, sizeof spec, "%s:%s=%.17g", ops->name, pp->key, pp->lo - 1);
                assert_int_equal(kvs_policy_parse(spec, &cfg), KVS_ERR_INVALID_ARG);
            }
            snprintf(spec, sizeof spec, "%s:%s=%s,%s=%s", ops->name, pp->key, "1", pp->key, "1");
            assert_int_equal(kvs_policy_parse(spec, &cfg), KVS_ERR_INVALID_ARG);
        }
    }
}

/* Named presets (NAME@PRESET[:overrides]): each parses to the same configuration as its parameter list
 * spelt out, a user's key=value overrides the preset's, and an unknown preset names the known ones. */
static void test_every_preset_parses_to_its_parameters(void **state) {
    (void)state;
    kvs_policy_config a, b;
    assert_int_equal(kvs_policy_parse("window@nope", &a), KVS_ERR_INVALID_ARG);
    assert_non_null(strstr(kvs_last_error(), "policy window: unknown preset 'nope' (it has none)"));
    assert_int_equal(kvs_policy_parse("window@", &a), KVS_ERR_INVALID_ARG);
    for (int i = 0; i < kvs_policy_count(); i++) {
        const struct kvs_policy_ops *ops = kvs_policy_at(i);
        for (int j = 0; j < ops->n_presets; j++) {
            const kvs_policy_preset *pr = &ops->presets[j];
            char spec[KVS_POLICY_CANON_MAX + 128];
            assert_non_null(pr->name);
            assert_non_null(pr->params);
            assert_non_null(pr->help);
            assert_ptr_equal(kvs_policy_find_preset(ops, pr->name), pr);
            snprintf(spec, sizeof spec, "%s@%s", ops->name, pr->name);
            if (kvs_policy_parse(spec, &a) != KVS_OK) fail_msg("%s: %s", spec, kvs_last_error());
            if (pr->params[0]) snprintf(spec, sizeof spec, "%s:%s", ops->name, pr->params);
            else snprintf(spec, sizeof spec, "%s", ops->name);
            assert_int_equal(kvs_policy_parse(spec, &b), KVS_OK);
            assert_string_equal(a.canonical, b.canonical);
            /* an override of the first parameter by its own canonical value parses and changes nothing */
            if (ops->n_params > 0 && a.canonical[0]) {
                char first[KVS_POLICY_CANON_MAX];
                snprintf(first, sizeof first, "%s", a.canonical);
                char *comma = strchr(first, ',');
                if (comma) *comma = '\0';
                snprintf(spec, sizeof spec, "%s@%s:%s", ops->name, pr->name, first);
                assert_int_equal(kvs_policy_parse(spec, &b), KVS_OK);
                assert_string_equal(a.canonical, b.canonical);
            }
            snprintf(spec, sizeof spec, "%s@%s:bogus_key=1", ops->name, pr->name);
            assert_int_equal(kvs_policy_parse(spec, &b), KVS_ERR_INVALID_ARG);
        }
    }
}

/* examples/PRESETS.md lists every preset with its exact parameter string, and nothing else. */
static void test_presets_md_lists_every_preset(void **state) {
    (void)state;
    char path[4096];
    snprintf(path, sizeof path, "%s/examples/PRESETS.md", kvs_test_root());
    FILE *fp = fopen(path, "r");
    if (!fp) fail_msg("cannot open %s", path);
    static char text[1 << 16];
    size_t len = fread(text, 1, sizeof text - 1, fp);
    fclose(fp);
    text[len] = 0;
    int listed = 0, known = 0;
    for (const char *p = text; (p = strstr(p, "\n| `")) != NULL; p++) listed++;
    for (int i = 0; i < kvs_policy_count(); i++) {
        const struct kvs_policy_ops *ops = kvs_policy_at(i);
        for (int j = 0; j < ops->n_presets; j++, known++) {
            char row[512];
            snprintf(row, sizeof row, "\n| `%s@%s` | `%s` |", ops->name, ops->presets[j].name, ops->presets[j].params);
            if (!strstr(text, row)) fail_msg("examples/PRESETS.md lacks the row %s", row + 1);
        }
    }
    assert_int_equal(listed, known);
}

/* ---- budget, determinism --------------------------------------------------------------------------- */

static void test_every_policy_respects_budget_every_step(void **state) {
    (void)state;
    fixture f;
    fixture_make(&f, 2, 5);
    for (int i = 0; i < kvs_policy_count(); i++) {
        const struct kvs_policy_ops *ops = kvs_policy_at(i);
        kvs_policy_config cfg;
        contract_defaults(&f, ops, &cfg);
        for (size_t b = 0; b < sizeof budgets / sizeof budgets[0]; b++) {
            if (!budget_ok(&f, &cfg, budgets[b])) continue;
            recorder rec;
            rec_init(&rec, &f);
            kvs_replay_result *r = run(&f, &cfg, budgets[b], 2, &rec);
            for (int l = 0; l < f.L; l++)
                for (int h = 0; h < f.Hkv; h++) {
                    int64_t hb = r->runs[0].budgets[l * f.Hkv + h];
                    for (int64_t p = 0; p < f.N; p++)
                        for (int li = 0; li < f.G; li++) {
                            size_t c = cell_of(&rec, l, h, p, li);
                            if (!rec.seen[c]) continue;
                            const int32_t *s = rec.data + c * (size_t)f.N;
                            int64_t n_prompt = 0;
                            for (int64_t j = 0; j < rec.n[c]; j++) n_prompt += f.g->roles[s[j]] == KVS_ROLE_PROMPT;
                            if (ops->budget_scope == KVS_BUDGET_EVERY_STEP) assert_true(rec.n[c] <= hb);
                            if (ops->budget_scope == KVS_BUDGET_PROMPT) assert_true(n_prompt <= hb);
                            assert_true(rec.n[c] >= 1);
                        }
                }
            /* the cells' budgets (checked above) are B unless an allocation pass moved budget between them */
            int64_t bmax = 0;
            for (int c = 0; c < f.L * f.Hkv; c++)
                if (r->runs[0].budgets[c] > bmax) bmax = r->runs[0].budgets[c];
            if (!ops->alloc_begin) assert_true(bmax == budgets[b]);
            if (ops->budget_scope == KVS_BUDGET_EVERY_STEP) assert_true(r->runs[0].max_attended <= bmax);
            kvs_replay_result_free(r);
            rec_free(&rec);
        }
    }
    fixture_free(&f);
}

static void test_every_policy_is_deterministic(void **state) {
    (void)state;
    fixture f;
    fixture_make(&f, 2, 6);
    for (int i = 0; i < kvs_policy_count(); i++) {
        kvs_policy_config cfg;
        contract_defaults(&f, kvs_policy_at(i), &cfg);
        int64_t B = 11;
        recorder a, b;
        rec_init(&a, &f);
        rec_init(&b, &f);
        kvs_replay_result *ra = run(&f, &cfg, B, 1, &a);
        kvs_replay_result *rb = run(&f, &cfg, B, 2, &b);
        assert_same_until(&a, &b, f.N, "determinism", cfg.ops->name);
        assert_true(ra->runs[0].run_agg.out_err.mean == rb->runs[0].run_agg.out_err.mean);
        assert_true(ra->runs[0].run_agg.out_err.p95 == rb->runs[0].run_agg.out_err.p95);
        assert_true(ra->runs[0].run_agg.storage_bytes.mean == rb->runs[0].run_agg.storage_bytes.mean);
        assert_int_equal(ra->runs[0].n_steps, rb->runs[0].n_steps);
        assert_true(ra->runs[0].n_steps > 0);
        kvs_replay_result_free(ra);
        kvs_replay_result_free(rb);
        rec_free(&a);
        rec_free(&b);
    }
    fixture_free(&f);
}

/* ---- leaks ---------------------------------------------------------------------------------------- */

static void test_no_policy_sees_the_future(void **state) {
    (void)state;
    fixture f, pert;
    fixture_make(&f, 2, 7);
    fixture_make(&pert, 2, 7);
    const int64_t cuts[] = {40, 57};
    for (int i = 0; i < kvs_policy_count(); i++) {
        kvs_policy_config cfg;
        contract_defaults(&f, kvs_policy_at(i), &cfg);
        for (size_t ci = 0; ci < 2; ci++) {
            int64_t cut = cuts[ci];
            /* Perturb every q/k/v of positions > cut in every layer and head. */
            size_t H = (size_t)f.G * (size_t)f.Hkv, d = (size_t)f.d;
            for (int l = 0; l < f.L; l++)
                for (int64_t p = 0; p < f.N; p++) {
                    size_t qo = ((size_t)l * (size_t)f.N + (size_t)p) * H * d, ko = ((size_t)l * (size_t)f.N + (size_t)p) * (size_t)f.Hkv * d;
                    for (size_t x = 0; x < H * d; x++) pert.g->q[qo + x] = p > cut ? -3.0f * f.g->q[qo + x] + 1.0f : f.g->q[qo + x];
                    for (size_t x = 0; x < (size_t)f.Hkv * d; x++) {
                        pert.g->k[ko + x] = p > cut ? 5.0f * f.g->v[ko + x] : f.g->k[ko + x];
                        pert.g->v[ko + x] = p > cut ? -7.0f * f.g->k[ko + x] : f.g->v[ko + x];
                    }
                }
            recorder a, b;
            rec_init(&a, &f);
            rec_init(&b, &pert);
            kvs_replay_result *ra = run(&f, &cfg, 11, 2, &a);
            kvs_replay_result *rb = run(&pert, &cfg, 11, 2, &b);
            assert_same_until(&a, &b, cut, "future perturbation", cfg.ops->name);
            kvs_replay_result_free(ra);
            kvs_replay_result_free(rb);
            rec_free(&a);
            rec_free(&b);
        }
    }
    fixture_free(&f);
    fixture_free(&pert);
}

static void test_non_oracles_read_only_what_they_store(void **state) {
    (void)state;
    fixture f;
    fixture_make(&f, 2, 8);
    int checked = 0;
    for (int i = 0; i < kvs_policy_count(); i++) {
        const struct kvs_policy_ops *ops = kvs_policy_at(i);
        if (ops->is_oracle) continue; /* labelled oracles may read everything, by definition */
        kvs_policy_config cfg;
        contract_defaults(&f, ops, &cfg);
        for (size_t bi = 2; bi < sizeof budgets / sizeof budgets[0]; bi++) {
            if (!budget_ok(&f, &cfg, budgets[bi])) continue;
            recorder a, b;
            rec_init(&a, &f);
            rec_init(&b, &f);
            b.scramble = 1;
            kvs_replay_result *ra = run(&f, &cfg, budgets[bi], 1, &a);
            kvs_replay_result *rb = run(&f, &cfg, budgets[bi], 1, &b);
            assert_same_until(&a, &b, f.N, "scrambling positions the policy does not store", ops->name);
            kvs_replay_result_free(ra);
            kvs_replay_result_free(rb);
            rec_free(&a);
            rec_free(&b);
            checked++;
        }
    }
    assert_true(checked > 0);
    fixture_free(&f);
}

/* Every named preset, and the block-wise prompt processing (KeyDiff's chunked prefill) at a block size that
 * splits this fixture's prompts: budget respected at every step, and nothing read that the policy does not
 * store, between decode steps and between prefill blocks. */
static void test_presets_and_block_modes_keep_the_contract(void **state) {
    (void)state;
    fixture f;
    fixture_make(&f, 2, 10);
    const char *extra[] = {"h2o:block=5", "h2o:gqa=mean,block=3,prefill=budget,window=2", "tova:block=5",
                           "tova:mode=group,block=4,protect_current=1", "snapkv:window=4,block=6",
                           "snapkv:window=3,gqa=mean,pool=avg,block=5", "chunkkv:window=4,chunk=3",
                           "chunkkv:window=3,chunk=2,select=ref,scope=head", "lagkv:sink=2,lag=4",
                           "lagkv:sink=1,lag=3,ratio=0.34,use_then_compress=0", "cur:local_w=4,sinks=1,proj_r=3",
                           "rkv:window=2,buffer=3", "rkv:window=3,buffer=1,ref_quirks=1"};
    char specs[64][96];
    int n = 0;
    for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++) snprintf(specs[n++], sizeof specs[0], "%s", extra[i]);
    for (int i = 0; i < kvs_policy_count(); i++) {
        const struct kvs_policy_ops *ops = kvs_policy_at(i);
        for (int j = 0; j < ops->n_presets && n < 64; j++)
            snprintf(specs[n++], sizeof specs[0], "%s@%s", ops->name, ops->presets[j].name);
    }
    assert_true(n > (int)(sizeof extra / sizeof extra[0]));
    for (int i = 0; i < n; i++) {
        kvs_policy_config cfg;
        if (kvs_policy_parse(specs[i], &cfg) != KVS_OK) fail_msg("%s: %s", specs[i], kvs_last_error());
        const int64_t bs[] = {6, 11, 24};
        for (size_t b = 0; b < sizeof bs / sizeof bs[0]; b++) {
            if (!budget_ok(&f, &cfg, bs[b])) continue;
            recorder a, sc;
            rec_init(&a, &f);
            rec_init(&sc, &f);
            sc.scramble = 1;
            kvs_replay_result *ra = run(&f, &cfg, bs[b], 1, &a);
            kvs_replay_result *rs = run(&f, &cfg, bs[b], 1, &sc);
            /* per (layer, KV head) budgets: B, unless an allocation pass moved budget between them */
            int64_t bmax = 0;
            for (int c = 0; c < f.L * f.Hkv; c++) {
                if (!cfg.ops->alloc_begin) assert_true(ra->runs[0].budgets[c] == bs[b]);
                if (ra->runs[0].budgets[c] > bmax) bmax = ra->runs[0].budgets[c];
            }
            if (cfg.ops->budget_scope == KVS_BUDGET_EVERY_STEP) assert_true(ra->runs[0].max_attended <= bmax);
            for (size_t c = 0; c < (size_t)f.L * (size_t)f.Hkv * (size_t)f.N * (size_t)f.G; c++) {
                if (!a.seen[c]) continue;
                int64_t hb = ra->runs[0].budgets[c / ((size_t)f.N * (size_t)f.G)], n_prompt = 0;
                for (int64_t j = 0; j < a.n[c]; j++) n_prompt += f.g->roles[a.data[c * (size_t)f.N + (size_t)j]] == KVS_ROLE_PROMPT;
                if (cfg.ops->budget_scope == KVS_BUDGET_EVERY_STEP) assert_true(a.n[c] <= hb);
                if (cfg.ops->budget_scope == KVS_BUDGET_PROMPT) assert_true(n_prompt <= hb);
            }
            assert_same_until(&a, &sc, f.N, "scrambling positions the policy does not store", specs[i]);
            kvs_replay_result_free(ra);
            kvs_replay_result_free(rs);
            /* and with the prompt positions measured too (the sanitizer build checks the empty-cache calls) */
            run_measure = KVS_MEASURE_ALL;
            kvs_replay_result_free(run(&f, &cfg, bs[b], 1, NULL));
            run_measure = KVS_MEASURE_DECODE;
            rec_free(&a);
            rec_free(&sc);
        }
    }
    fixture_free(&f);
}

/* The scrambling check must be able to fail: a deliberately leaky policy (reads the keys of positions it
 * evicted) is caught. */
typedef struct {
    int64_t seen;
    int64_t budget;
} leaky_state;

static kvs_status leaky_create(const kvs_policy_init *init, void **st) {
    leaky_state *s = calloc(1, sizeof *s);
    s->budget = init->budget;
    *st = s;
    return KVS_OK;
}
static void leaky_free(void *st) { free(st); }
static kvs_status leaky_prefill(void *st, const kvs_policy_view *v) {
    ((leaky_state *)st)->seen = v->n;
    return KVS_OK;
}
/* Window of B-1 recent positions plus position 0 or 1, chosen by the sign of key 0 / key 1 sums: reads
 * positions it does not store. */
static kvs_status leaky_select(void *st, const kvs_policy_view *v, kvs_policy_sel *sel) {
    leaky_state *s = st;
    int64_t m = 0, lo = v->n - (s->budget - 1);
    if (lo < 2) lo = 2;
    float a = 0;
    for (int i = 0; i < v->head_dim; i++) a += v->k[i] - v->k[v->head_dim + i];
    sel->idx[0][m++] = a > 0 ? 0 : 1;
    for (int64_t j = lo; j < v->n; j++) sel->idx[0][m++] = (int32_t)j;
    sel->n[0] = m;
    s->seen = v->n;
    return KVS_OK;
}
static int64_t leaky_stored(void *st, int g, int32_t *out) {
    leaky_state *s = st;
    (void)g;
    int64_t m = 0, lo = s->seen - (s->budget - 2);
    if (lo < 2) lo = 2;
    for (int64_t j = lo; j < s->seen; j++) out[m++] = (int32_t)j;
    return m;
}
static const struct kvs_policy_ops leaky_ops = {
    .version = KVS_POLICY_INTERFACE_VERSION,
    .name = "leaky", .summary = "test-only leaky policy", .granularity = KVS_SEL_PER_KV_HEAD,
    .budget_scope = KVS_BUDGET_EVERY_STEP, .create = leaky_create, .free = leaky_free,
    .prefill = leaky_prefill, .select = leaky_select, .stored = leaky_stored,
};

/* Every registered table states the interface version it was written for; a table of another version is refused
 * where a configuration is made (parse) and where a run starts (validate), with KVS_ERR_VERSION naming both. */
/* A parameter error names the policy once: "policy h2o: parameter 'recent': ..." for every kind of bad value, a
 * preset's parameters included. */
/* Every policy under every codec kind (the representation stage composes with every selection policy): the budget
 * at every step, determinism across thread counts and no look-ahead hold as they do without one. Not run under a
 * codec: "reads only what it stores", since a token-axis group's scale and zero point come from every position of
 * the group, evicted or not (sim/codec.h: a policy's choice never changes another position's representation). */
static void test_every_policy_under_every_codec(void **state) {
    static const char *const specs[] = {"int:bits=4,group=4,k_axis=token,v_axis=channel",
                                        "kivi:bits=2,group=4,residual=8", "hf:bits=2,group=8,residual=6",
                                        "fp8:scale=prompt,per=tensor", "think:ratio=0.5,window=4,recent=4"};
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        kvs_codec *c = NULL;
        assert_int_equal(kvs_codec_parse(specs[i], &c), KVS_OK);
        run_codec = c;
        test_every_policy_respects_budget_every_step(state);
        test_every_policy_is_deterministic(state);
        test_no_policy_sees_the_future(state);
        run_codec = NULL;
        kvs_codec_free(c);
    }
}

static void test_parameter_errors_name_the_policy_once(void **state) {
    (void)state;
    const char *bad[] = {"h2o:recent=2", "h2o:recent=x", "h2o@keydiff:recent=2", "streaming:sinks=-1", "h2o:gqa=zz",
                         "h2o:recent="};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        kvs_policy_config cfg;
        assert_int_equal(kvs_policy_parse(bad[i], &cfg), KVS_ERR_INVALID_ARG);
        const char *e = kvs_last_error();
        if (strstr(e, "policy policy") || strncmp(e, "policy ", 7) != 0) fail_msg("%s: '%s'", bad[i], e);
    }
}

static void test_interface_version_is_checked(void **state) {
    (void)state;
    for (int i = 0; i < kvs_policy_count(); i++) assert_int_equal(kvs_policy_at(i)->version, KVS_POLICY_INTERFACE_VERSION);
    struct kvs_policy_ops old = leaky_ops;
    old.version = KVS_POLICY_INTERFACE_VERSION - 1;
    kvs_policy_config cfg;
    assert_int_equal(kvs_policy_parse_ops(&old, NULL, &cfg), KVS_ERR_VERSION);
    assert_non_null(strstr(kvs_last_error(), "interface version"));
    assert_int_equal(kvs_policy_parse_ops(&leaky_ops, NULL, &cfg), KVS_OK);
    cfg.ops = &old;
    kvs_policy_model m = {.n_layers = 1, .n_heads = 1, .n_kv_heads = 1, .group = 1, .head_dim = 4, .n_positions = 8};
    assert_int_equal(kvs_policy_validate(&cfg, &m, 4), KVS_ERR_VERSION);
    cfg.ops = &leaky_ops;
    assert_int_equal(kvs_policy_validate(&cfg, &m, 4), KVS_OK);
}

static void test_leak_check_catches_a_leaky_policy(void **state) {
    (void)state;
    fixture f;
    fixture_make(&f, 1, 9);
    kvs_policy_config cfg;
    kvs_policy_defaults(&leaky_ops, &cfg);
    recorder a, b;
    rec_init(&a, &f);
    rec_init(&b, &f);
    b.scramble = 1;
    kvs_replay_result *ra = run(&f, &cfg, 8, 1, &a);
    kvs_replay_result *rb = run(&f, &cfg, 8, 1, &b);
    int differ = 0;
    for (size_t c = 0; c < (size_t)f.L * (size_t)f.Hkv * (size_t)f.N * (size_t)f.G; c++)
        if (a.seen[c] && memcmp(a.data + c * (size_t)f.N, b.data + c * (size_t)f.N, (size_t)a.n[c] * sizeof(int32_t))) differ = 1;
    assert_true(differ);
    kvs_replay_result_free(ra);
    kvs_replay_result_free(rb);
    rec_free(&a);
    rec_free(&b);
    fixture_free(&f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_policy_validates_parameters),
        cmocka_unit_test(test_every_preset_parses_to_its_parameters),
        cmocka_unit_test(test_presets_md_lists_every_preset),
        cmocka_unit_test(test_every_policy_respects_budget_every_step),
        cmocka_unit_test(test_every_policy_is_deterministic),
        cmocka_unit_test(test_no_policy_sees_the_future),
        cmocka_unit_test(test_non_oracles_read_only_what_they_store),
        cmocka_unit_test(test_presets_and_block_modes_keep_the_contract),
        cmocka_unit_test(test_leak_check_catches_a_leaky_policy),
        cmocka_unit_test(test_every_policy_under_every_codec),
        cmocka_unit_test(test_interface_version_is_checked),
        cmocka_unit_test(test_parameter_errors_name_the_policy_once),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
