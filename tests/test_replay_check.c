/* test_replay_check.c — the replay engine's per-step check of a selection and its default storage accounting
 * (sim/replay.c check_sel / default_cost, one pass over each list): a selection with a repeated, future or
 * missing position, over its budget, or a merged slot with only one of its rows, and a stored() set naming a
 * position outside [0, p], fails its run with a clear message (with and without stored(): the check's marks
 * differ), and leaves nothing behind for the next configuration of the same task; the default accounting of a
 * per-query-head policy with stored() equals a naive count, on ascending and on descending lists and with stored()
 * the selection itself: KV slots = sum over lists of |stored ∪ S_t|, dedup = |union of those over the lists|
 * (sim/policy.h, kvs_policy_cost); a prompt-scoped budget counts the prompt positions of every turn, on ascending
 * and descending lists. Data: GENERATED (tests/util/gen_trace.h).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "../sim/policy.h"
#include "../sim/replay.h"
#include "../sim/replay_mem.h"
#include "util/replay_fixture.h"

typedef kvs_test_replay_fixture fixture;

enum {
    ACCT_OK,
    ROGUE_TWICE,
    ROGUE_FUTURE,
    ROGUE_EMPTY,
    ROGUE_OVER_BUDGET,
    ROGUE_HALF_MERGED,
    ROGUE_STORED_FUTURE,   /* stored() names position p + 1 */
    ROGUE_STORED_NEGATIVE, /* stored() names position -1 */
};

static int g_rogue_mode;     /* the misbehaviour of the next rogue instance created */
static int g_acct_descending; /* acct_test writes its lists in descending order (check_sel's per-entry pass) */
static int g_acct_stored_is_sel; /* acct_test's stored() gives its selection, same order (what evicting policies do) */

typedef struct {
    int mode, kv_head;
    int64_t cur_p; /* position of the last select(), -1 before */
} acct_state;

/* Deterministic membership, a pure function of (KV head, position, list, candidate) so the test can recount. */
static int member(int kv_head, int64_t p, int g, int64_t x, uint64_t salt) {
    uint64_t z = ((uint64_t)kv_head * 1000003u + (uint64_t)p * 7919u + (uint64_t)g * 104729u + (uint64_t)x) ^ salt;
    z = (z ^ (z >> 31)) * 0x9e3779b97f4a7c15ull;
    z ^= z >> 29;
    return (int)(z % 3u) == 0;
}
static int in_sel(int h, int64_t p, int g, int64_t x) { return x == p || member(h, p, g, x, 0x5e1u); }
static int in_stored(int h, int64_t p, int g, int64_t x) {
    return g_acct_stored_is_sel ? in_sel(h, p, g, x) : member(h, p, g, x, 0x570u);
}

static kvs_status acct_create_mode(const kvs_policy_init *init, void **st, int mode) {
    acct_state *s = calloc(1, sizeof *s);
    if (!s) return kvs_fail(KVS_ERR_NOMEM, "acct_test");
    s->mode = mode;
    s->kv_head = init->kv_head;
    s->cur_p = -1;
    *st = s;
    return KVS_OK;
}
static kvs_status acct_create(const kvs_policy_init *init, void **st) { return acct_create_mode(init, st, ACCT_OK); }
static kvs_status rogue_create(const kvs_policy_init *init, void **st) {
    return acct_create_mode(init, st, g_rogue_mode);
}
static kvs_status acct_prefill(void *st, const kvs_policy_view *v) {
    (void)st;
    (void)v;
    return KVS_OK;
}
static kvs_status acct_select(void *st, const kvs_policy_view *v, kvs_policy_sel *sel) {
    acct_state *s = st;
    int64_t p = v->n - 1;
    s->cur_p = p;
    for (int g = 0; g < sel->n_lists; g++) {
        int64_t m = 0;
        for (int64_t x = 0; x <= p; x++)
            if (in_sel(s->kv_head, p, g, x)) sel->idx[g][m++] = (int32_t)x;
        sel->n[g] = m;
        for (int64_t j = 0; g_acct_descending && j < m / 2; j++) {
            int32_t tmp = sel->idx[g][j];
            sel->idx[g][j] = sel->idx[g][m - 1 - j];
            sel->idx[g][m - 1 - j] = tmp;
        }
    }
    int last = sel->n_lists - 1; /* the rogue's fault goes in the last list: the earlier ones are fine */
    switch (s->mode) {
    case ROGUE_TWICE: sel->idx[last][sel->n[last]++] = sel->idx[last][0]; break;
    case ROGUE_FUTURE: sel->idx[last][0] = (int32_t)(p + 1); break;
    case ROGUE_EMPTY: sel->n[last] = 0; break;
    case ROGUE_OVER_BUDGET:
        for (int64_t x = 0; x <= p; x++) sel->idx[last][x] = (int32_t)x;
        sel->n[last] = p + 1;
        break;
    case ROGUE_HALF_MERGED: sel->row_k[last][0] = v->k; break;
    default: break;
    }
    return KVS_OK;
}
static int64_t acct_stored(void *st, int g, int32_t *out) {
    acct_state *s = st;
    int64_t m = 0;
    for (int64_t x = 0; x <= s->cur_p; x++)
        if (in_stored(s->kv_head, s->cur_p, g, x)) out[m++] = (int32_t)x;
    int bad_list = m > 0 && g == 1; /* the rogue puts its bad entry in list 1's set, after valid ones */
    if (bad_list && s->mode == ROGUE_STORED_FUTURE) out[m++] = (int32_t)(s->cur_p + 1);
    if (bad_list && s->mode == ROGUE_STORED_NEGATIVE) out[m++] = -1;
    return m;
}

static const struct kvs_policy_ops acct_ops = {
    .version = KVS_POLICY_INTERFACE_VERSION,
    .name = "acct_test", .summary = "test: per-query-head selections and stored sets of known sizes",
    .granularity = KVS_SEL_PER_QUERY_HEAD, .budget_scope = KVS_BUDGET_EVERY_STEP, .create = acct_create,
    .free = free, .prefill = acct_prefill, .select = acct_select, .stored = acct_stored,
};
static const struct kvs_policy_ops rogue_ops = {
    .version = KVS_POLICY_INTERFACE_VERSION,
    .name = "rogue_test", .summary = "test: a malformed selection",
    .granularity = KVS_SEL_PER_QUERY_HEAD, .budget_scope = KVS_BUDGET_EVERY_STEP, .create = rogue_create,
    .free = free, .prefill = acct_prefill, .select = acct_select, .stored = acct_stored,
};

/* rogue_test without stored(): the selection check's own duplicate marks (no stored() set to share them with) */
static const struct kvs_policy_ops rogue_stateless_ops = {
    .version = KVS_POLICY_INTERFACE_VERSION,
    .name = "rogue_test", .summary = "test: a malformed selection, every position stored",
    .granularity = KVS_SEL_PER_QUERY_HEAD, .budget_scope = KVS_BUDGET_EVERY_STEP, .create = rogue_create,
    .free = free, .prefill = acct_prefill, .select = acct_select,
};

static void fixture_make(fixture *f) {
    kvs_gen_trace_opts o = kvs_test_grouped_opts(1, 4, 40, 12, 8, 23);
    assert_int_equal(kvs_test_replay_fixture_make(&o, 2, 5, f), KVS_OK);
}

/* Runs the configurations (rogue first when rogue_mode != ACCT_OK, then acct_test) in ONE task (1 thread), so
 * they share the engine's scratch marks. */
static kvs_replay_result *run_with(const fixture *f, const struct kvs_policy_ops *rogue, int rogue_mode,
                                   int64_t rogue_budget) {
    kvs_replay_config rc[2];
    int n = 0;
    g_rogue_mode = rogue_mode;
    if (rogue_mode != ACCT_OK) {
        rc[n] = (kvs_replay_config){.budget = rogue_budget, .budget_fraction = -1};
        kvs_policy_defaults(rogue, &rc[n++].policy);
    }
    rc[n] = (kvs_replay_config){.budget = f->N, .budget_fraction = -1};
    kvs_policy_defaults(&acct_ops, &rc[n++].policy);
    kvs_replay_source src;
    assert_int_equal(kvs_replay_source_from_memory(&f->mem, &src), KVS_OK);
    kvs_replay_opts o = {.configs = rc, .n_configs = n, .threads = 1, .measure = KVS_MEASURE_DECODE,
                         .series_every = 1};
    kvs_replay_result *r = NULL;
    assert_int_equal(kvs_replay_execute(&src, &o, &r), KVS_OK);
    return r;
}
static kvs_replay_result *run(const fixture *f, int rogue_mode, int64_t rogue_budget) {
    return run_with(f, &rogue_ops, rogue_mode, rogue_budget);
}

/* Every step sample of acct_test against the naive count of its sets. */
static void check_accounting(const fixture *f, const kvs_replay_run_result *run) {
    if (run->status != KVS_OK) print_error("%s\n", run->error);
    assert_int_equal(run->status, KVS_OK);
    double kvb = 2.0 * f->d * 2; /* K + V, 2-byte elements */
    int64_t prompt = f->turns[0].prompt_end, checked = 0;
    assert_true(run->n_steps == (int64_t)f->L * f->H * (f->N - prompt));
    for (int64_t i = 0; i < run->n_steps; i++) {
        const kvs_results_step *s = &run->steps[i];
        int h = s->q_head / f->G;
        int64_t p = s->position, slots = 0, uni = 0, attended = 0;
        for (int64_t x = 0; x <= p; x++) {
            int any = 0;
            for (int g = 0; g < f->G; g++) {
                int in = in_sel(h, p, g, x) || in_stored(h, p, g, x);
                slots += in;
                any |= in;
            }
            uni += any;
            attended += in_sel(h, p, s->q_head % f->G, x);
        }
        assert_true(s->attended_tokens == (double)attended);
        assert_true(s->storage_kv_bytes == kvb * (double)slots);
        assert_true(s->storage_dedup_bytes == kvb * (double)uni);
        assert_true(uni < slots); /* the sets overlap across lists: dedup is exercised */
        checked++;
    }
    assert_true(checked > 0);
}

static void test_default_accounting_matches_naive_count(void **state) {
    (void)state;
    fixture f;
    fixture_make(&f);
    kvs_replay_result *r = run(&f, ACCT_OK, 0);
    check_accounting(&f, &r->runs[0]);
    kvs_replay_result_free(r);
    kvs_test_replay_fixture_free(&f);
}

/* The same counts when the lists are not ascending (the check's per-entry pass rather than its plain-list path). */
static void test_default_accounting_of_descending_lists(void **state) {
    (void)state;
    fixture f;
    fixture_make(&f);
    g_acct_descending = 1;
    kvs_replay_result *r = run(&f, ACCT_OK, 0);
    g_acct_descending = 0;
    check_accounting(&f, &r->runs[0]);
    kvs_replay_result_free(r);
    kvs_test_replay_fixture_free(&f);
}

/* stored() = the selection, entry for entry (check_sel's shortcut: nothing to add): the same naive counts. */
static void test_default_accounting_when_stored_is_the_selection(void **state) {
    (void)state;
    fixture f;
    fixture_make(&f);
    g_acct_stored_is_sel = 1;
    kvs_replay_result *r = run(&f, ACCT_OK, 0);
    check_accounting(&f, &r->runs[0]);
    g_acct_stored_is_sel = 0;
    kvs_replay_result_free(r);
    kvs_test_replay_fixture_free(&f);
}

static void test_malformed_selections_fail_their_run_only(void **state) {
    (void)state;
    fixture f;
    fixture_make(&f);
    struct {
        const struct kvs_policy_ops *ops;
        int mode;
        int64_t budget;
        const char *msg;
    } cases[] = {
        {&rogue_ops, ROGUE_TWICE, 40, "twice"},
        {&rogue_ops, ROGUE_FUTURE, 40, "future or invalid"},
        {&rogue_ops, ROGUE_EMPTY, 40, "selected 0 positions"},
        {&rogue_ops, ROGUE_OVER_BUDGET, 14, "over its budget 14"},
        {&rogue_ops, ROGUE_HALF_MERGED, 40, "only one of its K/V rows"},
        {&rogue_ops, ROGUE_STORED_FUTURE, 40, "stored position"},
        {&rogue_ops, ROGUE_STORED_NEGATIVE, 40, "stored position -1 at position"},
        {&rogue_stateless_ops, ROGUE_TWICE, 40, "twice"},
        {&rogue_stateless_ops, ROGUE_FUTURE, 40, "future or invalid"},
        {&rogue_stateless_ops, ROGUE_HALF_MERGED, 40, "only one of its K/V rows"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        kvs_replay_result *r = run_with(&f, cases[c].ops, cases[c].mode, cases[c].budget);
        assert_int_equal(r->runs[0].status, KVS_ERR_STATE);
        if (!strstr(r->runs[0].error, cases[c].msg) || !strstr(r->runs[0].error, "rogue_test")) {
            print_error("case %zu: \"%s\" lacks \"%s\"\n", c, r->runs[0].error, cases[c].msg);
            fail();
        }
        /* the next configuration of the same task sees clean marks: its numbers are the naive ones */
        check_accounting(&f, &r->runs[1]);
        kvs_replay_result_free(r);
    }
    kvs_test_replay_fixture_free(&f);
}

/* A prompt-scoped policy (budget_scope KVS_BUDGET_PROMPT: the budget bounds the kept prompt positions, as SnapKV's)
 * that attends to every position: over 3 turns (7 prompt positions each) its last steps hold all 21 prompt
 * positions, so budget 21 passes and budget 20 fails naming 21, whether the lists are ascending (check_sel counts
 * them by turn, two binary searches each) or descending (counted entry by entry). */
static kvs_status all_select(void *st, const kvs_policy_view *v, kvs_policy_sel *sel) {
    (void)st;
    int64_t p = v->n - 1;
    for (int g = 0; g < sel->n_lists; g++) {
        for (int64_t x = 0; x <= p; x++) sel->idx[g][x] = (int32_t)(g_acct_descending ? p - x : x);
        sel->n[g] = p + 1;
    }
    return KVS_OK;
}

static const struct kvs_policy_ops prompt_scoped_ops = {
    .version = KVS_POLICY_INTERFACE_VERSION,
    .name = "prompt_scoped_test", .summary = "test: every position attended, the budget bounding the prompt only",
    .granularity = KVS_SEL_PER_QUERY_HEAD, .budget_scope = KVS_BUDGET_PROMPT, .create = acct_create,
    .free = free, .prefill = acct_prefill, .select = all_select,
};

static void test_prompt_budget_counts_prompt_positions_of_every_turn(void **state) {
    (void)state;
    fixture f;
    kvs_gen_trace_opts o = kvs_test_grouped_opts(3, 2, 42, -1, 8, 29);
    assert_int_equal(kvs_test_replay_fixture_make(&o, 2, 5, &f), KVS_OK);
    int64_t prompt = 0;
    for (int64_t t = 0; t < f.n_turns; t++) prompt += f.turns[t].prompt_end - f.turns[t].begin;
    assert_int_equal(prompt, 21);
    for (int descending = 0; descending < 2; descending++)
        for (int64_t budget = prompt - 1; budget <= prompt; budget++) {
            g_acct_descending = descending;
            kvs_replay_config rc = {.budget = budget, .budget_fraction = -1};
            kvs_policy_defaults(&prompt_scoped_ops, &rc.policy);
            kvs_replay_source src;
            assert_int_equal(kvs_replay_source_from_memory(&f.mem, &src), KVS_OK);
            kvs_replay_opts ro = {.configs = &rc, .n_configs = 1, .threads = 1, .measure = KVS_MEASURE_DECODE};
            kvs_replay_result *r = NULL;
            assert_int_equal(kvs_replay_execute(&src, &ro, &r), KVS_OK);
            g_acct_descending = 0;
            if (budget == prompt) {
                assert_int_equal(r->runs[0].status, KVS_OK);
            } else {
                assert_int_equal(r->runs[0].status, KVS_ERR_STATE);
                if (!strstr(r->runs[0].error, "kept 21 prompt positions over its budget 20")) {
                    print_error("descending %d: \"%s\"\n", descending, r->runs[0].error);
                    fail();
                }
            }
            kvs_replay_result_free(r);
        }
    kvs_test_replay_fixture_free(&f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_default_accounting_matches_naive_count),
        cmocka_unit_test(test_default_accounting_of_descending_lists),
        cmocka_unit_test(test_default_accounting_when_stored_is_the_selection),
        cmocka_unit_test(test_malformed_selections_fail_their_run_only),
        cmocka_unit_test(test_prompt_budget_counts_prompt_positions_of_every_turn),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
