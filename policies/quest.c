/* quest.c — Quest (Tang et al., ICML'24), query-aware page selection, as a baseline of RocketKV
 * (../shared/papers/rocketkv.txt §3.4, §4, App. A.3, Table 1, App. B.1.1), specified in ../shared/POLICY_SPEC.md
 * §2.6 B9, §3 (Quest row) and the appendix row "Quest"; reference mit-han-lab/Quest evaluation/quest_attention.py.
 *
 * Every key stays resident, grouped in pages of P_q consecutive positions with an element-wise min and max per
 * page (the new key folds into the last page). Each decode step, query head g scores page pi with the upper
 * bound U_g[pi] = sum_i max(q_i Kmax_pi,i, q_i Kmin_pi,i) over every head dimension (kvs_page_scores_rows: the G
 * heads in one call, each with its query's own signs) and attends exactly to the tokens of the best pages.
 *
 * Ambiguities resolved (paper / reference / what we do):
 *  - GQA: gqa=group (default; RocketKV App. A.3: "select indices of top-k accumulated attention scores per
 *    attention group") ranks pages by sum_g U_g, one set per KV head; gqa=head is the original per-query-head
 *    selection (the reference after repeat_kv).
 *  - Budget: split=even (default; RocketKV App. A.3 "we evenly split the token budget"): kvsim's B is the token
 *    budget t, half of it attended, k = floor(t/2) tokens; split=attend is Quest's own accounting (the budget
 *    counts only attended tokens, k = t; the page reads come on top). Page size: page=16 (Quest's and SyncKV's
 *    baseline default); page=0 derives RocketKV's even-split page size [RECON, POLICY_SPEC B9]: the estimate
 *    reads 2d ceil(n/P_q) elements = t/2 KV pairs, so P_q = ceil(2c), c = S/t (S = prompt + max_new_tokens, at
 *    most the model's context), which is Table 1's storage 1 + 1/c with the K-normalised convention.
 *  - Pages attended: fill=pages (default; Quest's own code and POLICY_SPEC B9 attend whole pages): K_pg =
 *    floor(k/P_q) pages, the current (last, possibly partial) page always one of them as Quest's kernels keep it,
 *    and the K_pg - 1 best of the other pages by score (ties to the lower page), taken whole: at most k tokens,
 *    fewer when k is not a multiple of P_q or the current page is partial. Quest's minimum of 3 pages
 *    (K_pg = max(3, B // 16)) would exceed kvsim's bound on every step's attended set, so it is not modelled;
 *    with a quota below one page (K_pg = 0) the current page alone is attended, its newest k tokens when it holds
 *    more (notes() says so). fill=tokens [SIM-CHOICE]: exactly k tokens — pages by score taken whole, and when k
 *    is not a multiple of P_q the oldest tokens of the next page (kvs_page_select, the rule POLICY_SPEC §2.2
 *    step 8 states for HSA's pages); the current page competes like any other.
 *  - Not modelled: the reference's dense first two layers (kvsim's budget binds every layer) and its dense
 *    prefill is kvsim's prefill anyway. The current token competes through its (last, possibly partial) page,
 *    whose bound covers only its real tokens (the reference pads with -inf).
 *  - Multi-turn: pages run over every position; at each turn's prompt the page size is re-derived (page=0) and
 *    the summaries rebuilt. Ties: pages to the lower index (POLICY_SPEC §1.4).
 *
 * Storage and traffic (POLICY_SPEC §3 "Quest"; page summaries are keys, stored in the KV element size, Table 1's
 * convention): KV = every position; aux = 2d ceil(n/P_q); reads = the attended K/V plus the summaries,
 * 2d ceil(n/P_q) elements once per KV head (both modes: the G queries score the same summaries in one pass),
 * plus the last page's min/max read-modify-write (2d; none when the key opens a page); writes = the new K/V and
 * the page update (2d); no estimate when every token fits the quota. Transient: (G+1) ceil(n/P_q) page scores.
 * Decode reads no key but the current one (tests/test_rocketkv.c checks it); stored() = every position.
 *
 * Sliding-window layers (sim/replay.h): positions before the host's `first` (window_evict) leave the pages. A page
 * wholly before it is gone (no summary read, no bound ranked, no aux byte); the page straddling the edge stays a
 * candidate for its in-window tokens only, and its min/max keep covering the keys folded into it while they were
 * in the window [SIM-CHOICE]: a looser bound that is still an upper bound of every key it holds (Quest's kernels only
 * fold keys into the last page; re-reading the page's remaining keys each time the edge moves is not what they do).
 * A turn's prefill, which rebuilds every summary, folds only the window's keys (the straddling page then covers its
 * in-window keys alone), and so does a key that opens the window's first live page. Selection runs over the live
 * pages, the straddling one counting its live tokens (kvs_page_select_span; fill=pages takes whole pages only, so it
 * may attend fewer than k). Once the window slides, a live set of at most t = B positions is attended whole with no
 * estimate [SIM-CHOICE]: its reads fit the token budget that the even split spends on estimate plus quota, and a
 * budget covering the window then attends exactly the window; a full-attention layer keeps the quota rule above
 * (its results unchanged). The memo of page scores is not used on such a layer (its summaries depend on when the
 * edge passed, not on the keys and the page size alone).
 *
 * Work shared between budgets (sim/BENCH.md "Work shared between a task's configurations"): the summaries are the
 * page min/max of every key so far at the page size, folded in position order whatever the budget, so the page
 * bounds go through kvs_policy_page_scores (sim/policy_memo.h): the configurations of one replay task with the same
 * page size score a position's pages once; and their selections through kvs_policy_page_select, which ranks the
 * same scores once for every budget.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../common/kvs_math.h"
#include "../sim/policy_memo.h"
#include "registry.h"

enum { QUEST_EVEN = 0, QUEST_ATTEND = 1 };
enum { QUEST_GROUP = 0, QUEST_HEAD = 1 };
enum { QUEST_FILL_PAGES = 0, QUEST_FILL_TOKENS = 1 };

static const kvs_policy_param quest_params[] = {
    {.key = "page", .type = KVS_PARAM_INT, .def = 16, .lo = 0, .hi = 1 << 20,
     .help = "page size P_q (Quest: 16); 0 = RocketKV's even split, ceil(2 S/t)"},
    {.key = "split", .type = KVS_PARAM_ENUM, .def = QUEST_EVEN, .choices = "even|attend",
     .help = "even: B = the token budget t, floor(t/2) attended (RocketKV); attend: B tokens attended (Quest)"},
    {.key = "gqa", .type = KVS_PARAM_ENUM, .def = QUEST_GROUP, .choices = "group|head",
     .help = "group: pages ranked by the group's summed bounds, one set per KV head (RocketKV); head: per query head"},
    {.key = "max_new", .type = KVS_PARAM_INT, .def = 0, .lo = 0, .hi = 1 << 30,
     .help = "page=0 only: max_new_tokens in S = prompt + max_new; 0 = the trace's capture setting"},
    {.key = "fill", .type = KVS_PARAM_ENUM, .def = QUEST_FILL_PAGES, .choices = "pages|tokens",
     .help = "pages: floor(k/P_q) whole pages, the current one always (Quest); tokens: exactly k tokens, the oldest "
             "of the next page filling the rest"},
};

static const kvs_policy_preset quest_presets[] = {
    {.name = "reference", .params = "page=16,split=attend,gqa=head",
     .help = "Quest's reference: pages of 16 per query head, the budget counts attended tokens (SyncKV App. C.1: "
             "--budgets 2048; the minimum of 3 pages and dense layers 0-1 are not modelled)"},
};

static kvs_policy_granularity quest_layout(const kvs_policy_config *cfg) {
    return (int)kvs_policy_param_get(cfg, "gqa") == QUEST_HEAD ? KVS_SEL_PER_QUERY_HEAD : KVS_SEL_PER_KV_HEAD;
}

/* Page size for a context of n positions at a prompt's end. */
static int64_t quest_page(const kvs_policy_config *cfg, const kvs_policy_model *m, int64_t t, int64_t n) {
    int64_t page = (int64_t)kvs_policy_param_get(cfg, "page");
    if (page > 0) return page;
    int64_t S = kvs_policy_seq_len(m, n, kvs_policy_max_new(m, (int64_t)kvs_policy_param_get(cfg, "max_new")));
    double c = (double)S / (double)t;
    if (c < 1) c = 1;
    return (int64_t)ceil(2.0 * c);
}

/* Tokens attended per step (per query head for gqa=head). */
static int64_t quest_quota(const kvs_policy_config *cfg, int64_t t) {
    int64_t k = (int)kvs_policy_param_get(cfg, "split") == QUEST_EVEN ? t / 2 : t;
    return k < 1 ? 1 : k;
}

static int quest_notes(const kvs_policy_config *cfg, const kvs_policy_model *m, int64_t budget, char *buf, size_t cap) {
    int64_t P = m->prompt_len > 0 ? m->prompt_len : 1, page = quest_page(cfg, m, budget, P);
    int64_t k = quest_quota(cfg, budget);
    int n = 0;
    if (kvs_policy_param_get(cfg, "page") == 0)
        n += kvs_policy_note(buf, cap, "page=0: page size %lld from the even split ceil(2 S/t) on the first prompt",
                             (long long)page);
    if (budget == 1 && (int)kvs_policy_param_get(cfg, "split") == QUEST_EVEN)
        n += kvs_policy_note(buf, cap, "budget 1: floor(t/2) = 0 attended tokens raised to 1");
    if (k < page && (int)kvs_policy_param_get(cfg, "fill") == QUEST_FILL_TOKENS)
        n += kvs_policy_note(buf, cap, "the quota of %lld tokens is less than one %lld-token page: only the oldest "
                                       "tokens of the best page are attended",
                             (long long)k, (long long)page);
    else if (k < page)
        n += kvs_policy_note(buf, cap, "the quota of %lld tokens is less than one %lld-token page: only the current "
                                       "page is attended (its newest %lld tokens when it holds more)",
                             (long long)k, (long long)page, (long long)k);
    return n;
}

typedef struct {
    kvs_policy_model model;
    kvs_policy_config cfg;
    int mode, group, d, fill;
    int64_t budget, quota, page;
    float *kmin, *kmax;   /* [pg_cap][d] */
    double *ps, *grp;     /* ps: [group][pg_cap] (page_scores of every head), grp: [pg_cap] */
    int32_t *rank;        /* [pg_cap] */
    int64_t pg_cap;
    int64_t first;        /* positions before it were evicted by the host (sliding-window layer); 0 otherwise */
    /* the step just selected, for account() */
    int64_t st_pages;
    int st_est, st_rmw;
} quest_state;

static void quest_free(void *state) {
    quest_state *s = state;
    if (!s) return;
    free(s->kmin);
    free(s->kmax);
    free(s->ps);
    free(s->grp);
    free(s->rank);
    free(s);
}

static kvs_status pages_reserve(quest_state *s, int64_t n_tokens) {
    int64_t pages = (n_tokens + s->page - 1) / s->page;
    if (pages <= s->pg_cap) return KVS_OK;
    int64_t cap = s->pg_cap ? s->pg_cap : 64;
    while (cap < pages) cap *= 2;
    size_t rows = (size_t)cap * (size_t)s->d;
    float *mn = realloc(s->kmin, rows * sizeof *mn);
    if (mn) s->kmin = mn;
    float *mx = mn ? realloc(s->kmax, rows * sizeof *mx) : NULL;
    if (mx) s->kmax = mx;
    double *ps = mx ? realloc(s->ps, (size_t)cap * (size_t)s->group * sizeof *ps) : NULL;
    if (ps) s->ps = ps;
    double *grp = ps ? realloc(s->grp, (size_t)cap * sizeof *grp) : NULL;
    if (grp) s->grp = grp;
    int32_t *rank = grp ? realloc(s->rank, (size_t)cap * sizeof *rank) : NULL;
    if (!rank) return kvs_fail(KVS_ERR_NOMEM, "quest: out of memory");
    s->rank = rank;
    s->pg_cap = cap;
    return KVS_OK;
}

static kvs_status quest_create(const kvs_policy_init *init, void **state) {
    quest_state *s = calloc(1, sizeof *s);
    if (!s) return kvs_fail(KVS_ERR_NOMEM, "quest: out of memory");
    s->model = *init->model;
    s->cfg = *init->cfg;
    s->mode = (int)kvs_policy_param_get(init->cfg, "gqa");
    s->fill = (int)kvs_policy_param_get(init->cfg, "fill");
    s->group = init->model->group;
    s->d = init->model->head_dim;
    s->budget = init->budget;
    s->quota = quest_quota(init->cfg, init->budget);
    s->page = quest_page(init->cfg, init->model, init->budget, init->model->prompt_len > 0 ? init->model->prompt_len : 1);
    kvs_status st = pages_reserve(s, 64 * s->page);
    if (st != KVS_OK) {
        quest_free(s);
        return st;
    }
    *state = s;
    return KVS_OK;
}

/* Folds the key of position p (slot p: every position is resident) into its page; the window's first position opens
 * its page (the keys before it are gone). */
static void add_key(quest_state *s, const float *k, int64_t p) {
    size_t d = (size_t)s->d, pg = (size_t)(p / s->page);
    kvs_page_minmax_add(s->kmin + pg * d, s->kmax + pg * d, k + (size_t)p * d, d, p % s->page == 0 || p == s->first);
}

static kvs_status quest_prefill(void *state, const kvs_policy_view *view) {
    quest_state *s = state;
    s->page = quest_page(&s->cfg, &s->model, s->budget, view->n);
    kvs_status st = pages_reserve(s, view->n + 1);
    if (st != KVS_OK) return st;
    for (int64_t p = s->first; p < view->n; p++) add_key(s, view->k, p); /* every live page, at this turn's size */
    return KVS_OK;
}

/* The attended slots for one list from its page scores (score: `pages` doubles), ascending in out; @return the
 * count. fill=tokens: kvs_page_select's k tokens. fill=pages: the current page (the last, m tokens) and the
 * K_pg - 1 best of the others, whole, K_pg = max(1, floor(k/P_q)); the newest k of the current page when m > k. */
static int64_t select_list(quest_state *s, const kvs_policy_view *view, const double *score, int64_t pages, int64_t n,
                           int32_t *out) {
    if (s->fill == QUEST_FILL_TOKENS)
        return kvs_policy_page_select(view, score, (size_t)pages, (size_t)s->page, (size_t)n, (size_t)s->quota, out,
                                      s->rank);
    int64_t first = (pages - 1) * s->page, m = n - first, K = s->quota / s->page;
    if (m > s->quota) first = n - s->quota; /* the quota is below one page */
    int64_t cnt = 0;
    if (K > 1 && m <= s->quota) /* the K - 1 best of the full pages before the current one, whole */
        cnt = kvs_policy_page_select(view, score, (size_t)(pages - 1), (size_t)s->page, (size_t)first,
                                     (size_t)((K - 1) * s->page), out, s->rank);
    for (int64_t j = first; j < n; j++) out[cnt++] = (int32_t)j;
    return cnt;
}

/* A sliding-window layer's step (header "Sliding-window layers"): the live pages fp..pages-1 over [first, n). */
static void select_window(quest_state *s, const kvs_policy_view *view, kvs_policy_sel *sel, int64_t pages) {
    int64_t n = view->n, first = s->first, fp = first / s->page, live = pages - fp;
    size_t d = (size_t)s->d;
    kvs_policy_page_scores(view, 0, view->q, (size_t)s->group, d, s->kmin + (size_t)fp * d, s->kmax + (size_t)fp * d, d,
                           (size_t)live, s->ps);
    if (s->mode == QUEST_GROUP) {
        memset(s->grp, 0, (size_t)live * sizeof *s->grp);
        for (int g = 0; g < s->group; g++)
            for (int64_t i = 0; i < live; i++) s->grp[i] += s->ps[(size_t)g * (size_t)live + (size_t)i];
    }
    for (int li = 0; li < sel->n_lists; li++) {
        const double *score = s->mode == QUEST_GROUP ? s->grp : s->ps + (size_t)li * (size_t)live;
        int32_t *out = sel->idx[li];
        if (s->fill == QUEST_FILL_TOKENS) {
            sel->n[li] = kvs_page_select_span(score, (size_t)s->page, (size_t)first, (size_t)n, (size_t)s->quota, 0,
                                              out, s->rank);
            continue;
        }
        /* fill=pages: the current page's live tokens (its newest quota when it holds more) and the K - 1 best of
         * the live pages before it, whole */
        int64_t cur = (pages - 1) * s->page > first ? (pages - 1) * s->page : first, m = n - cur,
                K = s->quota / s->page, cnt = 0;
        if (m > s->quota) cur = n - s->quota;
        if (K > 1 && m <= s->quota && cur > first)
            cnt = kvs_page_select_span(score, (size_t)s->page, (size_t)first, (size_t)cur, (size_t)((K - 1) * s->page),
                                       1, out, s->rank);
        for (int64_t j = cur; j < n; j++) out[cnt++] = (int32_t)j;
        sel->n[li] = cnt;
    }
}

static kvs_status quest_select(void *state, const kvs_policy_view *view, kvs_policy_sel *sel) {
    quest_state *s = state;
    int64_t n = view->n, p = n - 1;
    kvs_status st = pages_reserve(s, n);
    if (st != KVS_OK) return st;
    add_key(s, view->k, p);
    int64_t pages = (n + s->page - 1) / s->page;
    size_t d = (size_t)s->d;
    s->st_pages = pages - s->first / s->page;
    s->st_rmw = p % s->page != 0 && p != s->first;
    s->st_est = s->first > 0 ? n - s->first > s->budget : n > s->quota;
    if (!s->st_est) {
        for (int li = 0; li < sel->n_lists; li++) {
            for (int64_t j = s->first; j < n; j++) sel->idx[li][j - s->first] = (int32_t)j;
            sel->n[li] = n - s->first;
        }
        return KVS_OK;
    }
    if (s->first > 0) {
        select_window(s, view, sel, pages);
        return KVS_OK;
    }
    if (s->mode == QUEST_GROUP) {
        memset(s->grp, 0, (size_t)pages * sizeof *s->grp);
        kvs_policy_page_scores(view, s->page, view->q, (size_t)s->group, d, s->kmin, s->kmax, d, (size_t)pages,
                               s->ps);
        for (int g = 0; g < s->group; g++) /* summed over the heads in head order, as one head at a time did */
            for (int64_t pi = 0; pi < pages; pi++) s->grp[pi] += s->ps[(size_t)g * (size_t)pages + (size_t)pi];
        sel->n[0] = select_list(s, view, s->grp, pages, n, sel->idx[0]);
    } else {
        kvs_policy_page_scores(view, s->page, view->q, (size_t)s->group, d, s->kmin, s->kmax, d, (size_t)pages,
                               s->ps);
        for (int g = 0; g < s->group; g++) {
            sel->n[g] = select_list(s, view, s->ps + (size_t)g * (size_t)pages, pages, n, sel->idx[g]);
        }
    }
    return KVS_OK;
}

static kvs_status quest_window_evict(void *state, int64_t first) {
    quest_state *s = state;
    if (first > s->first) s->first = first;
    return KVS_OK;
}

/* Cost model v2 (header "Storage and traffic"); KV storage and attended reads stay the engine's default. */
static void quest_account(void *state, const kvs_policy_view *view, const kvs_policy_sel *sel, kvs_policy_cost *out) {
    quest_state *s = state;
    (void)view;
    (void)sel;
    double kb = s->model.kv_bytes, d = s->d, pages = (double)s->st_pages;
    out->aux_bytes = 2.0 * d * pages * kb;
    out->read_aux_bytes = (s->st_est ? 2.0 * d * pages : 0) * kb + (s->st_rmw ? 2.0 * d * kb : 0);
    out->read_aux_unfused_bytes = out->read_aux_bytes;
    out->write_bytes = kvs_policy_kv_bytes(&s->model, 1) + 2.0 * d * kb; /* one shared store, not one per list */
    out->transient_bytes = s->st_est ? (double)(s->group + 1) * pages * s->model.aux_bytes : 0;
}

const struct kvs_policy_ops kvs_policy_quest = {
    .version = KVS_POLICY_INTERFACE_VERSION,
    .name = "quest",
    .summary = "Quest: page min/max upper bounds pick the pages to attend (whole pages of 16, per group; B/2 attended)",
    .is_oracle = 0,
    .granularity = KVS_SEL_PER_KV_HEAD,
    .budget_scope = KVS_BUDGET_EVERY_STEP,
    .params = quest_params,
    .n_params = (int)(sizeof quest_params / sizeof quest_params[0]),
    .presets = quest_presets,
    .n_presets = (int)(sizeof quest_presets / sizeof quest_presets[0]),
    .layout = quest_layout,
    .notes = quest_notes,
    .create = quest_create,
    .free = quest_free,
    .prefill = quest_prefill,
    .select = quest_select,
    .account = quest_account,
    .window_evict = quest_window_evict,
};
