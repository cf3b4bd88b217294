/* host.c — the policy host shared by every driver (host.h): seeds from the run's identity, the allocation pass,
 * instances, the selection check, the accounting of a step and the metric formulas (../shared/DESIGN.md
 * "Architecture", "Replay", "Metrics"; POLICY_SPEC.md §1.2, §1.5, §1.6).
 */
#include "host.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/kvs_math.h"
#include "../common/kvs_math_simd.h"
#include "../common/sha256.h"

/* ------------------------------------------------------------------------------------------------
 * Identity and seeds
 * ---------------------------------------------------------------------------------------------- */

uint64_t kvs_host_run_seed(const kvs_host_identity *id, const kvs_policy_model *m) {
    kvs_sha256_ctx c;
    uint8_t dig[32];
    char num[160];
    const kvs_policy_config *cfg = id->policy;
    const char *hash = id->content_hash ? id->content_hash : "";
    kvs_sha256_init(&c);
    /* fields separated by a byte no field contains (the canonical string has no control characters) */
    static const char sep = '\x1f';
    kvs_sha256_update(&c, "kvsim-run-seed", 14);
    kvs_sha256_update(&c, &sep, 1);
    kvs_sha256_update(&c, hash, strlen(hash));
    kvs_sha256_update(&c, &sep, 1);
    kvs_sha256_update(&c, cfg->ops->name, strlen(cfg->ops->name));
    kvs_sha256_update(&c, &sep, 1);
    kvs_sha256_update(&c, cfg->canonical, strlen(cfg->canonical));
    kvs_sha256_update(&c, &sep, 1);
    int len = snprintf(num, sizeof num, "budget=%lld,kv_bytes=%d,aux_bytes=%d", (long long)id->budget,
                       (int)m->kv_bytes, (int)m->aux_bytes);
    kvs_sha256_update(&c, num, (size_t)len);
    if (id->codec && id->codec[0]) {
        kvs_sha256_update(&c, &sep, 1);
        kvs_sha256_update(&c, "codec=", 6);
        kvs_sha256_update(&c, id->codec, strlen(id->codec));
    }
    if (id->page_tokens > 0) {
        len = snprintf(num, sizeof num, "%cpage=%lld", sep, (long long)id->page_tokens);
        kvs_sha256_update(&c, num, (size_t)len);
        /* a score rule only when it is not the count rule (paged runs of the count rule keep their seeds) */
        if (id->page_score == KVS_PAGE_SCORE_MAX || id->page_score == KVS_PAGE_SCORE_SUM) {
            len = snprintf(num, sizeof num, ",page_score=%s", kvs_host_page_score_name(id->page_score));
            kvs_sha256_update(&c, num, (size_t)len);
        }
    }
    kvs_sha256_final(&c, dig);
    uint64_t seed = 0;
    for (int i = 0; i < 8; i++) seed = seed << 8 | dig[i];
    return seed;
}

/* splitmix64's finaliser over a pair: distinct (layer, kv_head) give unrelated streams */
static uint64_t mix_seed(uint64_t a, uint64_t b) {
    uint64_t x = a * 0x9E3779B97F4A7C15ull ^ (b + 0x632BE59BD9B4E019ull);
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    return x;
}

uint64_t kvs_host_instance_seed(uint64_t run_seed, int layer, int kv_head) {
    return mix_seed(mix_seed(run_seed, (uint64_t)layer), (uint64_t)kv_head);
}

/* ------------------------------------------------------------------------------------------------
 * Allocation pass and instances
 * ---------------------------------------------------------------------------------------------- */

kvs_status kvs_host_alloc_begin(const kvs_policy_config *cfg, const kvs_policy_model *m, int64_t budget,
                                int64_t *budgets, void **alloc) {
    size_t per = (size_t)m->n_layers * (size_t)m->n_kv_heads;
    for (size_t i = 0; i < per; i++) budgets[i] = budget;
    *alloc = NULL;
    if (!cfg->ops->alloc_begin) return KVS_OK;
    kvs_status st = cfg->ops->alloc_begin(cfg, m, budget, alloc);
    if (st != KVS_OK) *alloc = NULL;
    return st;
}

kvs_status kvs_host_alloc_end(const kvs_policy_config *cfg, const kvs_policy_model *m, void *alloc, int64_t *budgets,
                              const void **shared) {
    const struct kvs_policy_ops *ops = cfg->ops;
    size_t per = (size_t)m->n_layers * (size_t)m->n_kv_heads;
    *shared = NULL;
    if (!alloc) return KVS_OK;
    kvs_status st = ops->alloc_end(alloc, budgets);
    if (st != KVS_OK) return st;
    for (size_t i = 0; i < per; i++)
        if (budgets[i] < 1)
            return kvs_fail(KVS_ERR_STATE, "policy %s allocated budget %lld to (layer %zu, kv head %zu)", ops->name,
                            (long long)budgets[i], i / (size_t)m->n_kv_heads, i % (size_t)m->n_kv_heads);
    if (ops->alloc_shared) *shared = ops->alloc_shared(alloc);
    return KVS_OK;
}

kvs_status kvs_host_alloc_pass(const kvs_policy_config *cfg, const kvs_policy_model *m, int64_t budget,
                               kvs_host_prompt_view_fn prompt_view, void *user, int64_t *budgets, void **alloc,
                               const void **shared) {
    *shared = NULL;
    kvs_status st = kvs_host_alloc_begin(cfg, m, budget, budgets, alloc);
    if (st != KVS_OK || !*alloc) return st;
    if (m->prompt_len > 0)
        for (int l = 0; l < m->n_layers; l++)
            for (int h = 0; h < m->n_kv_heads; h++) {
                kvs_policy_view view;
                if ((st = prompt_view(user, l, h, &view)) != KVS_OK) return st;
                if ((st = cfg->ops->alloc_prefill(*alloc, l, h, &view)) != KVS_OK) return st;
            }
    return kvs_host_alloc_end(cfg, m, *alloc, budgets, shared);
}

void kvs_host_alloc_free(const kvs_policy_config *cfg, void *alloc) {
    if (alloc && cfg->ops->alloc_free) cfg->ops->alloc_free(alloc);
}

kvs_status kvs_host_create_layer(const kvs_policy_config *cfg, const kvs_policy_model *m, int64_t budget_nominal,
                                 const int64_t *budgets_layer, uint64_t run_seed, int layer, const void *shared,
                                 void **states, int64_t *prefill_block) {
    const struct kvs_policy_ops *ops = cfg->ops;
    kvs_status st = KVS_OK;
    *prefill_block = 0;
    for (int h = 0; h < m->n_kv_heads; h++) states[h] = NULL;
    for (int h = 0; h < m->n_kv_heads && st == KVS_OK; h++) {
        kvs_policy_init init = {
            .model = m, .cfg = cfg, .layer = layer, .kv_head = h, .budget = budgets_layer[h],
            .budget_nominal = budget_nominal, .seed = kvs_host_instance_seed(run_seed, layer, h), .shared = shared,
        };
        st = ops->create(&init, &states[h]);
        if (st != KVS_OK) states[h] = NULL;
    }
    if (st == KVS_OK && ops->prefill_block) {
        int64_t b = ops->prefill_block(states[0]);
        if (b < 0) st = kvs_fail(KVS_ERR_STATE, "policy %s asked for prefill blocks of %lld positions", ops->name,
                                 (long long)b);
        else *prefill_block = b;
    }
    if (st != KVS_OK) kvs_host_free_layer(cfg, states, m->n_kv_heads);
    return st;
}

void kvs_host_free_layer(const kvs_policy_config *cfg, void **states, int n_kv_heads) {
    for (int h = 0; h < n_kv_heads; h++) {
        cfg->ops->free(states[h]);
        states[h] = NULL;
    }
}

/* ------------------------------------------------------------------------------------------------
 * Selection check
 * ---------------------------------------------------------------------------------------------- */

struct kvs_host_check {
    int64_t n_positions;
    const kvs_turn *turns;   /* borrowed */
    int64_t n_turns;
    uint8_t *is_prompt;      /* [n_positions] */
    int32_t *stored;         /* [n_positions] stored()'s answer */
    uint32_t *in_list;       /* [n_positions] == list_stamp: in the current list's resident set */
    uint32_t *in_union;      /* [n_positions] == union_stamp: counted in the union across lists */
    uint32_t list_stamp, union_stamp;
    int64_t window;          /* the layer's attention window (kvs_host_check_window), 0 = full causal attention */
};

kvs_status kvs_host_check_create(int64_t n_positions, const kvs_turn *turns, int64_t n_turns, kvs_host_check **out) {
    *out = NULL;
    if (n_positions < 1 || n_positions > INT32_MAX) return kvs_fail(KVS_ERR_INVALID_ARG, "host: bad position count");
    kvs_host_check *hc = calloc(1, sizeof *hc);
    if (!hc) return kvs_fail(KVS_ERR_NOMEM, "host: out of memory");
    size_t n = (size_t)n_positions;
    hc->n_positions = n_positions;
    hc->turns = turns;
    hc->n_turns = n_turns;
    hc->is_prompt = calloc(n, 1);
    hc->stored = malloc(n * sizeof *hc->stored);
    hc->in_list = calloc(n, sizeof *hc->in_list);
    hc->in_union = calloc(n, sizeof *hc->in_union);
    if (!hc->is_prompt || !hc->stored || !hc->in_list || !hc->in_union) {
        kvs_host_check_free(hc);
        return kvs_fail(KVS_ERR_NOMEM, "host: out of memory for the selection check");
    }
    for (int64_t tk = 0; tk < n_turns; tk++)
        for (int64_t p = turns[tk].begin; p < turns[tk].prompt_end && p < n_positions; p++)
            if (p >= 0) hc->is_prompt[p] = 1;
    *out = hc;
    return KVS_OK;
}

void kvs_host_check_free(kvs_host_check *hc) {
    if (!hc) return;
    free(hc->is_prompt);
    free(hc->stored);
    free(hc->in_list);
    free(hc->in_union);
    free(hc);
}

void kvs_host_check_window(kvs_host_check *hc, int64_t window) { hc->window = window > 0 ? window : 0; }

/* The first position of the window at p: 0 on a full-attention layer or before the window has filled. */
int64_t kvs_host_window_first(int64_t window, int64_t p) { return window > 0 && p - window + 1 > 0 ? p - window + 1 : 0; }

/* The window part of the check: no list entry and no stored() position older than the window's first position
 * `lo` (the host evicted them before select(), kvs_host_window_evict, so a policy that still holds one broke its
 * window_evict contract). A plain list is ascending, so its first entry decides. */
static kvs_status check_window(kvs_host_check *hc, const struct kvs_policy_ops *ops, void *state,
                               const kvs_policy_sel *sel, int64_t p, int64_t lo, const uint8_t *plain) {
    for (int li = 0; li < sel->n_lists; li++) {
        int64_t n = sel->n[li];
        for (int64_t j = 0; j < n && (j == 0 || !plain[li]); j++)
            if (sel->idx[li][j] < lo)
                return kvs_fail(KVS_ERR_STATE, "policy %s selected position %d at position %lld, outside the layer's "
                                "sliding window (first position %lld)", ops->name, (int)sel->idx[li][j], (long long)p,
                                (long long)lo);
        if (!ops->stored) continue;
        int64_t ms = ops->stored(state, li, hc->stored);
        for (int64_t k = 0; k < ms; k++)
            if (hc->stored[k] < lo)
                return kvs_fail(KVS_ERR_STATE, "policy %s still stores position %d at position %lld, outside the "
                                "layer's sliding window (first position %lld)", ops->name, (int)hc->stored[k],
                                (long long)p, (long long)lo);
    }
    return KVS_OK;
}

kvs_status kvs_host_window_evict(const struct kvs_policy_ops *ops, void *state, int64_t first) {
    if (first <= 0) return KVS_OK;
    if (!ops->window_evict)
        return kvs_fail(KVS_ERR_UNSUPPORTED, "policy %s cannot replay a sliding-window layer (no window_evict)", ops->name);
    return ops->window_evict(state, first);
}

/* The next stamp of a mark array: after 2^32 - 1 stamps the array is cleared and they start again. */
static inline uint32_t next_stamp(uint32_t *stamp, uint32_t *marks, size_t n) {
    if (++*stamp == 0) {
        memset(marks, 0, n * sizeof *marks);
        *stamp = 1;
    }
    return *stamp;
}

/* The first j with idx[j] >= x in the ascending idx[0..n), or n. */
static int64_t lower_bound_pos(const int32_t *idx, int64_t n, int64_t x) {
    int64_t lo = 0, hi = n;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (idx[mid] < x) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* The prompt positions among an ascending list: per turn, two binary searches (a per-entry count was a sixth of
 * the check's time for prompt-only policies), or the per-entry count when there are more turns than entries. */
static int64_t prompt_entries(const kvs_host_check *hc, const int32_t *idx, int64_t n) {
    int64_t count = 0;
    if (hc->n_turns > n) {
        for (int64_t j = 0; j < n; j++) count += hc->is_prompt[idx[j]];
        return count;
    }
    for (int64_t tk = 0; tk < hc->n_turns; tk++) {
        const kvs_turn *turn = &hc->turns[tk];
        if (turn->prompt_end <= turn->begin) continue;
        count += lower_bound_pos(idx, n, turn->prompt_end) - lower_bound_pos(idx, n, turn->begin);
    }
    return count;
}

/* One pass over each list checks it, finds its merged slots and counts what the default accounting needs. Marks
 * are stamps (in_list: in the current list's resident set, so a repeat within S_t is a duplicate; in_union: counted
 * in the union), so none is ever cleared and an error leaves nothing behind. What cannot change a result is skipped:
 * a plain list (list_plain: ascending, in range, no merged slot) needs no per-entry check and, without stored(), no
 * mark at all; nor does a plain list whose stored() set is the same entries in the same order; the union marks are
 * kept only with stored() and more than one list (one list's union is its own count; without stored() both counts
 * are p + 1). The counts are integers, exact in fp64 whatever the order. */
kvs_status kvs_host_check_sel(kvs_host_check *hc, const struct kvs_policy_ops *ops, void *state,
                              const kvs_policy_sel *sel, int64_t p, int64_t budget, int *has_merged, uint8_t *plain,
                              double *kv_slots, double *dedup) {
    uint32_t *in_list = hc->in_list, *in_union = hc->in_union;
    size_t N = (size_t)hc->n_positions;
    int need_union = ops->stored && sel->n_lists > 1;
    uint32_t us = need_union ? next_stamp(&hc->union_stamp, in_union, N) : 0;
    int count_prompt = ops->budget_scope == KVS_BUDGET_PROMPT;
    int64_t n_union = 0;
    double slots = 0;
    kvs_status st = KVS_OK;
    if (p < 0 || p >= hc->n_positions) return kvs_fail(KVS_ERR_STATE, "host: position %lld out of range", (long long)p);
    for (int li = 0; li < sel->n_lists && st == KVS_OK; li++) {
        int64_t n = sel->n[li], n_prompt = 0, j = 0;
        const int32_t *idx = sel->idx[li];
        const float *const *row_k = sel->row_k[li], *const *row_v = sel->row_v[li];
        int merged = 0, stored_asked = 0, stored_is_list = 0;
        int64_t ms = 0; /* stored()'s count */
        uint32_t ls = ops->stored ? next_stamp(&hc->list_stamp, in_list, N) : 0;
        plain[li] = 0;
        if (n < 1 || n > p + 1)
            st = kvs_fail(KVS_ERR_STATE, "policy %s selected %lld positions at position %lld", ops->name, (long long)n,
                          (long long)p);
        else if (kvs_math_kernels_active()->list_plain(idx, (const void *const *)row_k, (const void *const *)row_v,
                                                       (size_t)n, p)) {
            plain[li] = 1;
            if (ops->stored) { /* evicting policies attend what they keep: the same entries add nothing */
                ms = ops->stored(state, li, hc->stored);
                stored_asked = 1;
                stored_is_list = ms == n && !memcmp(hc->stored, idx, (size_t)n * sizeof *idx);
                for (j = 0; !stored_is_list && j < n; j++) in_list[idx[j]] = ls;
            }
            if (need_union)
                for (j = 0; j < n; j++) {
                    n_union += in_union[idx[j]] != us;
                    in_union[idx[j]] = us;
                }
            if (count_prompt) n_prompt = prompt_entries(hc, idx, n);
            j = n; /* the per-entry pass below has nothing to do */
        } else if (!ops->stored)
            ls = next_stamp(&hc->list_stamp, in_list, N); /* the duplicate check's marks */
        for (; st == KVS_OK && j < n; j++) {
            int32_t x = idx[j];
            int has_k = row_k[j] != NULL;
            if (x < 0 || x > p)
                st = kvs_fail(KVS_ERR_STATE, "policy %s selected position %d at position %lld (future or invalid)",
                              ops->name, (int)x, (long long)p);
            else if (in_list[x] == ls)
                st = kvs_fail(KVS_ERR_STATE, "policy %s selected position %d twice", ops->name, (int)x);
            else if (has_k != (row_v[j] != NULL))
                st = kvs_fail(KVS_ERR_STATE, "policy %s gave a merged slot at position %d with only one of its K/V rows",
                              ops->name, (int)x);
            else {
                if (need_union) {
                    n_union += in_union[x] != us;
                    in_union[x] = us;
                }
                in_list[x] = ls;
                if (count_prompt) n_prompt += hc->is_prompt[x];
                merged |= has_k;
            }
        }
        has_merged[li] = merged;
        if (st == KVS_OK && ops->stored) {
            int64_t extra = 0;
            if (!stored_asked) ms = ops->stored(state, li, hc->stored);
            for (int64_t k = 0; !stored_is_list && k < ms && st == KVS_OK; k++) {
                int32_t x = hc->stored[k];
                if (x < 0 || x > p)
                    st = kvs_fail(KVS_ERR_STATE, "policy %s stored position %d at position %lld (future or invalid)",
                                  ops->name, (int)x, (long long)p);
                else if (in_list[x] != ls) {
                    extra++;
                    in_list[x] = ls;
                    if (need_union) {
                        n_union += in_union[x] != us;
                        in_union[x] = us;
                    }
                }
            }
            slots += (double)(n + extra);
        }
        if (st != KVS_OK) break;
        if (ops->budget_scope == KVS_BUDGET_EVERY_STEP && n > budget)
            st = kvs_fail(KVS_ERR_STATE, "policy %s attended %lld positions over its budget %lld at position %lld",
                          ops->name, (long long)n, (long long)budget, (long long)p);
        else if (ops->budget_scope == KVS_BUDGET_PROMPT && n_prompt > budget)
            st = kvs_fail(KVS_ERR_STATE, "policy %s kept %lld prompt positions over its budget %lld", ops->name,
                          (long long)n_prompt, (long long)budget);
    }
    int64_t lo = kvs_host_window_first(hc->window, p);
    if (st == KVS_OK && lo > 0) st = check_window(hc, ops, state, sel, p, lo, plain);
    if (!ops->stored) {
        *kv_slots = *dedup = (double)(p + 1 - lo); /* every position of the window seen, stored once */
    } else {
        *kv_slots = slots;
        *dedup = need_union ? (double)n_union : slots; /* one list: its union is its own count */
    }
    return st;
}

/* ------------------------------------------------------------------------------------------------
 * Accounting
 * ---------------------------------------------------------------------------------------------- */

/* What holds whatever account() did: the union of the lists' sets is no larger than their sum, and scoring that
 * re-reads K reads at least what fused scoring reads. */
static void settle_cost(kvs_policy_cost *c) {
    if (c->dedup_kv_bytes > c->kv_bytes) c->dedup_kv_bytes = c->kv_bytes;
    if (c->read_aux_unfused_bytes < c->read_aux_bytes) c->read_aux_unfused_bytes = c->read_aux_bytes;
}

void kvs_host_cost(const struct kvs_policy_ops *ops, void *state, const kvs_policy_model *m,
                   const kvs_policy_view *view, const kvs_policy_sel *sel, double kv_slots, double dedup,
                   kvs_policy_cost *c) {
    double attended = 0;
    for (int li = 0; li < sel->n_lists; li++) attended += (double)sel->n[li];
    memset(c, 0, sizeof *c);
    c->kv_bytes = kvs_policy_kv_bytes(m, kv_slots);
    c->dedup_kv_bytes = kvs_policy_kv_bytes(m, dedup);
    c->read_kv_bytes = kvs_policy_kv_bytes(m, attended);
    c->write_bytes = kvs_policy_kv_bytes(m, (double)sel->n_lists);
    if (ops->account) ops->account(state, view, sel, c);
    settle_cost(c);
}

/* ------------------------------------------------------------------------------------------------
 * Metrics
 * ---------------------------------------------------------------------------------------------- */

void kvs_host_out_sums(const float *ref, const float *out, int64_t d, kvs_host_sums *s) {
    double err2 = 0, ref2 = 0, out2 = 0, dot = 0;
    for (int64_t i = 0; i < d; i++) {
        double r = ref[i], o = out[i], e = r - o;
        err2 += e * e;
        ref2 += r * r;
        out2 += o * o;
        dot += r * o;
    }
    s->err2 = err2, s->ref2 = ref2, s->out2 = out2, s->dot = dot;
}

void kvs_host_metrics(const kvs_policy_model *m, int64_t p, int64_t n, const kvs_host_sums *s,
                      const kvs_policy_cost *cost, double v[KVS_N_METRICS]) {
    double err2 = s->err2, ref2 = s->ref2, out2 = s->out2, dot = s->dot;
    double full_bytes = kvs_policy_kv_bytes(m, (double)(p + 1));
    v[KVS_M_OUT_ERR] = ref2 == 0 ? (err2 == 0 ? 0 : INFINITY) : sqrt(err2 / ref2); /* kvs_rel_l2 */
    v[KVS_M_OUT_ERR_ABS] = sqrt(err2);
    v[KVS_M_OUT_COS] = ref2 == 0 || out2 == 0 ? 0.0f : (float)(dot / (sqrt(ref2) * sqrt(out2))); /* kvs_cosine */
    v[KVS_M_ATTN_RECALL] = s->recall;
    v[KVS_M_ATTN_RECALL_MERGED] = s->recall_merged;
    v[KVS_M_TOPK_OVERLAP] = n > 0 ? (double)s->hit / (double)n : 0.0;
    v[KVS_M_ATTENDED] = (double)n;
    double storage = kvs_host_storage_bytes(cost);
    v[KVS_M_STORAGE] = storage;
    v[KVS_M_STORAGE_KV] = cost->kv_bytes;
    v[KVS_M_STORAGE_AUX] = cost->aux_bytes;
    v[KVS_M_STORAGE_DEDUP] = cost->dedup_kv_bytes;
    v[KVS_M_STORAGE_HOST] = cost->host_bytes;
    v[KVS_M_STORAGE_PEAK] = storage + cost->transient_bytes;
    v[KVS_M_TRAFFIC] = kvs_host_traffic_bytes(cost);
    v[KVS_M_TRAFFIC_KV] = cost->read_kv_bytes;
    v[KVS_M_TRAFFIC_AUX] = cost->read_aux_bytes;
    v[KVS_M_TRAFFIC_AUX_UNFUSED] = cost->read_aux_unfused_bytes;
    v[KVS_M_WRITE] = cost->write_bytes;
    v[KVS_M_TRANSFER] = cost->h2d_bytes + cost->d2h_bytes;
    v[KVS_M_H2D] = cost->h2d_bytes;
    v[KVS_M_D2H] = cost->d2h_bytes;
    v[KVS_M_COMPRESSION] = storage > 0 ? full_bytes / storage : 0.0;
}

/* ------------------------------------------------------------------------------------------------
 * The representation stage
 * ---------------------------------------------------------------------------------------------- */

struct kvs_host_rep {
    const kvs_codec *c;
    int H;
    int64_t N, P, d;
    int active;               /* past the first prompt: the states hold the rows */
    kvs_codec_state **st;     /* [H] */
    int32_t *stored;          /* [N + 1] a policy's stored() answer */
    int64_t *pos;             /* [N] a resident set for kvs_codec_state_bytes */
    uint32_t *mark;           /* [N] == stamp: in the set being built */
    uint32_t stamp;
    uint8_t *has_queries;     /* [H] think: the head's prompt queries were given */
    int64_t window;           /* the layer's attention window (kvs_host_rep_window), 0 = full causal attention */
};

kvs_status kvs_host_rep_create(const kvs_codec *c, const kvs_policy_model *m, kvs_host_rep **out) {
    *out = NULL;
    if (!c || m->n_kv_heads < 1 || m->n_positions < 1)
        return kvs_fail(KVS_ERR_INVALID_ARG, "host: bad representation stage");
    kvs_host_rep *r = calloc(1, sizeof *r);
    if (!r) return kvs_fail(KVS_ERR_NOMEM, "host: out of memory");
    r->c = c, r->H = m->n_kv_heads, r->N = m->n_positions, r->d = m->head_dim;
    r->P = m->prompt_len < 0 ? 0 : m->prompt_len > m->n_positions ? m->n_positions : m->prompt_len;
    size_t N = (size_t)r->N;
    r->st = calloc((size_t)r->H, sizeof *r->st);
    r->stored = malloc((N + 1) * sizeof *r->stored);
    r->pos = malloc(N * sizeof *r->pos);
    r->mark = calloc(N, sizeof *r->mark);
    r->has_queries = calloc((size_t)r->H, 1);
    if (!r->st || !r->stored || !r->pos || !r->mark || !r->has_queries) {
        kvs_host_rep_free(r);
        return kvs_fail(KVS_ERR_NOMEM, "host: out of memory for the codec's scratch");
    }
    for (int h = 0; h < r->H; h++) {
        kvs_status st = kvs_codec_state_create(c, m->head_dim, m->n_positions, &r->st[h]);
        if (st != KVS_OK) {
            kvs_host_rep_free(r);
            return st;
        }
    }
    *out = r;
    return KVS_OK;
}

void kvs_host_rep_free(kvs_host_rep *r) {
    if (!r) return;
    if (r->st)
        for (int h = 0; h < r->H; h++) kvs_codec_state_free(r->st[h]);
    free(r->st);
    free(r->stored);
    free(r->pos);
    free(r->mark);
    free(r->has_queries);
    free(r);
}

kvs_status kvs_host_rep_prompt_queries(kvs_host_rep *r, int h, const float *q, int64_t n_q, int group) {
    if (!r || !kvs_codec_needs_queries(r->c) || r->active || r->has_queries[h]) return KVS_OK;
    kvs_status st = kvs_codec_state_prefill_queries(r->st[h], q, n_q, group);
    if (st == KVS_OK) r->has_queries[h] = 1;
    return st;
}

kvs_status kvs_host_rep_sync(kvs_host_rep *r, const float *const *k, const float *const *v, int64_t n) {
    kvs_status st;
    if (n <= r->P) return KVS_OK;
    if (!r->active) {
        for (int h = 0; h < r->H; h++)
            if ((st = kvs_codec_state_prefill(r->st[h], k[h], v[h], r->P)) != KVS_OK) return st;
        if ((st = kvs_codec_share_scale(r->st, r->H)) != KVS_OK) return st;
        r->active = 1;
    }
    for (int h = 0; h < r->H; h++)
        if ((st = kvs_codec_state_advance(r->st[h], k[h], v[h], n)) != KVS_OK) return st;
    return KVS_OK;
}

int kvs_host_rep_active(const kvs_host_rep *r) { return r && r->active; }

void kvs_host_rep_window(kvs_host_rep *r, int64_t window) { r->window = window > 0 ? window : 0; }

const float *kvs_host_rep_rows(const kvs_host_rep *r, int h, kvs_codec_tensor t, const float *captured) {
    return r && r->active ? kvs_codec_state_rows(r->st[h], t) : captured;
}

/* The bytes of the positions pos[0..m) of head h, plus the head's share of what the codec holds once a layer. */
static kvs_status rep_bytes(kvs_host_rep *r, int h, int64_t m, double *bytes) {
    kvs_codec_bytes b;
    kvs_status st = kvs_codec_state_bytes(r->st[h], r->pos, m, &b);
    if (st != KVS_OK) return st;
    *bytes = b.total + kvs_codec_layer_bytes(r->c) / r->H;
    return KVS_OK;
}

kvs_status kvs_host_rep_list_bytes(kvs_host_rep *r, int h, const int32_t *idx, int64_t n, double *bytes) {
    if (!r->active) return kvs_fail(KVS_ERR_STATE, "host: codec bytes before the first decode step");
    for (int64_t j = 0; j < n; j++) r->pos[j] = idx[j];
    return rep_bytes(r, h, n, bytes);
}

kvs_status kvs_host_rep_cost(kvs_host_rep *r, int h, const struct kvs_policy_ops *ops, void *state,
                             const kvs_policy_model *m, const kvs_policy_view *view, const kvs_policy_sel *sel,
                             int64_t p, kvs_policy_cost *c) {
    size_t N = (size_t)r->N;
    double kv = 0, read = 0, x;
    int64_t n_union = 0;
    kvs_status st;
    if (!r->active) return kvs_fail(KVS_ERR_STATE, "host: codec bytes before the first decode step");
    memset(c, 0, sizeof *c);
    uint32_t us = next_stamp(&r->stamp, r->mark, N);
    /* the union first (one stamp), then each list's own resident set (a stamp each) */
    for (int li = 0; li < sel->n_lists; li++) {
        if (!ops->stored) break;
        int64_t ms = ops->stored(state, li, r->stored);
        for (int64_t j = 0; j < ms; j++)
            if (r->mark[r->stored[j]] != us) r->mark[r->stored[j]] = us, r->pos[n_union++] = r->stored[j];
        for (int64_t j = 0; j < sel->n[li]; j++)
            if (r->mark[sel->idx[li][j]] != us) r->mark[sel->idx[li][j]] = us, r->pos[n_union++] = sel->idx[li][j];
    }
    if (!ops->stored) { /* every position seen, stored once: on a sliding-window layer the window's */
        for (int64_t j = kvs_host_window_first(r->window, p); j <= p; j++) r->pos[n_union++] = j;
    }
    if ((st = rep_bytes(r, h, n_union, &x)) != KVS_OK) return st;
    c->dedup_kv_bytes = x;
    for (int li = 0; li < sel->n_lists; li++) {
        int64_t m_li = 0;
        if (ops->stored) {
            uint32_t ls = next_stamp(&r->stamp, r->mark, N);
            int64_t ms = ops->stored(state, li, r->stored);
            for (int64_t j = 0; j < ms; j++)
                if (r->mark[r->stored[j]] != ls) r->mark[r->stored[j]] = ls, r->pos[m_li++] = r->stored[j];
            for (int64_t j = 0; j < sel->n[li]; j++)
                if (r->mark[sel->idx[li][j]] != ls) r->mark[sel->idx[li][j]] = ls, r->pos[m_li++] = sel->idx[li][j];
            if ((st = rep_bytes(r, h, m_li, &x)) != KVS_OK) return st;
        } else {
            x = c->dedup_kv_bytes; /* each list holds every position seen */
        }
        kv += x;
        if ((st = kvs_host_rep_list_bytes(r, h, sel->idx[li], sel->n[li], &x)) != KVS_OK) return st;
        read += x;
    }
    c->kv_bytes = kv;
    c->read_kv_bytes = read;
    c->write_bytes = kvs_policy_kv_bytes(m, (double)sel->n_lists);
    if (ops->account) ops->account(state, view, sel, c);
    settle_cost(c);
    return KVS_OK;
}

/* ------------------------------------------------------------------------------------------------
 * Page granularity
 * ---------------------------------------------------------------------------------------------- */

/* A candidate page under a score rule: ranked by score, then count, then the newer page. */
struct page_key {
    double score;
    int64_t count, page;
};

struct kvs_host_page {
    int64_t n_positions, page, n_pages;
    uint8_t *is_prompt;   /* [n_positions] */
    int64_t *count;       /* [n_pages] S_t's positions on the page, valid where cmark == count_stamp */
    uint32_t *cmark, *chosen, *umark; /* [n_pages] stamps: counted / chosen / in the union across lists */
    uint32_t *xmark;      /* [n_positions] stamp: an entry of S_t on a chosen page */
    uint32_t count_stamp, chosen_stamp, union_stamp, x_stamp;
    int64_t *cand;        /* [n_pages] candidate pages, as sort keys */
    double *pscore;       /* [n_pages] a candidate page's score (max or sum of its entries'), valid where counted */
    struct page_key *keys;/* [n_pages] candidates ranked by score (the score rules) */
    int64_t *plist, *ulist; /* [n_pages] one list's resident pages, the union's (kvs_host_page_cost) */
    int32_t *stored;      /* [n_positions + 1] a policy's stored() answer */
    int64_t window;       /* the layer's attention window (kvs_host_page_window), 0 = full causal attention */
};

kvs_status kvs_host_page_create(int64_t n_positions, int64_t page_tokens, const kvs_turn *turns, int64_t n_turns,
                                kvs_host_page **out) {
    *out = NULL;
    if (n_positions < 1 || n_positions > INT32_MAX || page_tokens < 1)
        return kvs_fail(KVS_ERR_INVALID_ARG, "host: bad page size %lld", (long long)page_tokens);
    kvs_host_page *pg = calloc(1, sizeof *pg);
    if (!pg) return kvs_fail(KVS_ERR_NOMEM, "host: out of memory");
    size_t N = (size_t)n_positions;
    pg->n_positions = n_positions;
    pg->page = page_tokens;
    pg->n_pages = (n_positions + page_tokens - 1) / page_tokens;
    size_t NP = (size_t)pg->n_pages;
    pg->is_prompt = calloc(N, 1);
    pg->count = calloc(NP, sizeof *pg->count);
    pg->cmark = calloc(NP, sizeof *pg->cmark);
    pg->chosen = calloc(NP, sizeof *pg->chosen);
    pg->umark = calloc(NP, sizeof *pg->umark);
    pg->xmark = calloc(N, sizeof *pg->xmark);
    pg->cand = malloc(NP * sizeof *pg->cand);
    pg->stored = malloc((N + 1) * sizeof *pg->stored);
    pg->pscore = malloc(NP * sizeof *pg->pscore);
    pg->keys = malloc(NP * sizeof *pg->keys);
    pg->plist = malloc(NP * sizeof *pg->plist);
    pg->ulist = malloc(NP * sizeof *pg->ulist);
    if (!pg->is_prompt || !pg->count || !pg->cmark || !pg->chosen || !pg->umark || !pg->xmark || !pg->cand ||
        !pg->stored || !pg->pscore || !pg->keys || !pg->plist || !pg->ulist) {
        kvs_host_page_free(pg);
        return kvs_fail(KVS_ERR_NOMEM, "host: out of memory for the page map");
    }
    for (int64_t tk = 0; tk < n_turns; tk++)
        for (int64_t p = turns[tk].begin; p < turns[tk].prompt_end && p < n_positions; p++)
            if (p >= 0) pg->is_prompt[p] = 1;
    *out = pg;
    return KVS_OK;
}

void kvs_host_page_free(kvs_host_page *pg) {
    if (!pg) return;
    free(pg->is_prompt);
    free(pg->count);
    free(pg->cmark);
    free(pg->chosen);
    free(pg->umark);
    free(pg->xmark);
    free(pg->cand);
    free(pg->stored);
    free(pg->pscore);
    free(pg->keys);
    free(pg->plist);
    free(pg->ulist);
    free(pg);
}

void kvs_host_page_window(kvs_host_page *pg, int64_t window) { pg->window = window > 0 ? window : 0; }

int64_t kvs_host_page_cap(const kvs_host_page *pg, kvs_policy_budget_scope scope, int64_t budget, const int32_t *idx,
                          int64_t n, int64_t p) {
    if (scope == KVS_BUDGET_NONE) return p / pg->page + 1; /* every page: nothing bounds it */
    int64_t allow = budget;
    if (scope == KVS_BUDGET_PROMPT)
        for (int64_t j = 0; j < n; j++) allow += !pg->is_prompt[idx[j]];
    int64_t c = allow / pg->page;
    return c < 1 ? 1 : c;
}

static int cmp_desc_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* Descending score (a NaN below every number), then count, then the newer page. */
static int cmp_page_key(const void *a, const void *b) {
    const struct page_key *x = a, *y = b;
    int xn = isnan(x->score), yn = isnan(y->score);
    if (xn != yn) return xn ? 1 : -1;
    if (!xn && x->score != y->score) return x->score < y->score ? 1 : -1;
    if (x->count != y->count) return x->count < y->count ? 1 : -1;
    return x->page < y->page ? 1 : x->page > y->page ? -1 : 0;
}

const char *kvs_host_page_score_name(kvs_page_score rule) {
    return rule == KVS_PAGE_SCORE_MAX ? "max" : rule == KVS_PAGE_SCORE_SUM ? "sum" : "count";
}

int64_t kvs_host_page_map(kvs_host_page *pg, const int32_t *idx, const float *const *row_k, const float *const *row_v,
                          int64_t n, int64_t p, int64_t cap, const double *score, kvs_page_score rule, int32_t *att,
                          const float **att_k, const float **att_v, int32_t *place) {
    int64_t P = pg->page, NP = pg->n_pages, newest = p / P, n_cand = 0, m = 0;
    size_t nps = (size_t)NP;
    int by_score = score && rule != KVS_PAGE_SCORE_COUNT;
    uint32_t cs = next_stamp(&pg->count_stamp, pg->cmark, nps);
    for (int64_t j = 0; j < n; j++) {
        int64_t q = idx[j] / P;
        if (pg->cmark[q] != cs) {
            pg->cmark[q] = cs;
            pg->count[q] = 0;
            if (by_score) pg->pscore[q] = score[j];
            if (q != newest) pg->cand[n_cand++] = q;
        } else if (by_score) { /* S_t's order: the sum's order is the selection's */
            if (rule == KVS_PAGE_SCORE_SUM) pg->pscore[q] += score[j];
            else if (score[j] > pg->pscore[q] || isnan(pg->pscore[q])) pg->pscore[q] = score[j];
        }
        pg->count[q]++;
    }
    int64_t take = cap - 1 < n_cand ? cap - 1 : n_cand;
    if (take < 0) take = 0;
    if (by_score) {
        /* the highest page score first, then the most positions, then the newer page */
        for (int64_t k = 0; k < n_cand; k++)
            pg->keys[k] = (struct page_key){.score = pg->pscore[pg->cand[k]], .count = pg->count[pg->cand[k]],
                                            .page = pg->cand[k]};
        qsort(pg->keys, (size_t)n_cand, sizeof *pg->keys, cmp_page_key);
        for (int64_t k = 0; k < take; k++) pg->cand[k] = pg->keys[k].page;
    } else {
        /* the most positions first, the newer page among equals: one key, count major, page minor */
        for (int64_t k = 0; k < n_cand; k++) pg->cand[k] = pg->count[pg->cand[k]] * (NP + 1) + pg->cand[k];
        qsort(pg->cand, (size_t)n_cand, sizeof *pg->cand, cmp_desc_i64);
        for (int64_t k = 0; k < take; k++) pg->cand[k] %= NP + 1;
    }
    uint32_t ch = next_stamp(&pg->chosen_stamp, pg->chosen, nps);
    for (int64_t k = 0; k < take; k++) pg->chosen[pg->cand[k]] = ch;
    pg->chosen[newest] = ch;
    pg->cand[take] = newest;
    /* S_t's entries on chosen pages, in S_t's order, then the chosen pages' other positions <= p, ascending; on a
     * sliding-window layer only those inside the window (a page straddling its edge is masked there, as a
     * sliding-window kernel does) */
    int64_t first = kvs_host_window_first(pg->window, p);
    uint32_t xs = next_stamp(&pg->x_stamp, pg->xmark, (size_t)pg->n_positions);
    for (int64_t j = 0; j < n; j++) {
        if (pg->chosen[idx[j] / P] != ch) {
            place[j] = -1;
            continue;
        }
        att[m] = idx[j];
        att_k[m] = row_k ? row_k[j] : NULL;
        att_v[m] = row_v ? row_v[j] : NULL;
        pg->xmark[idx[j]] = xs;
        place[j] = (int32_t)m++;
    }
    qsort(pg->cand, (size_t)take + 1, sizeof *pg->cand, cmp_desc_i64);
    for (int64_t k = take; k >= 0; k--) { /* ascending pages */
        int64_t lo = pg->cand[k] * P, hi = lo + P <= p + 1 ? lo + P : p + 1;
        if (lo < first) lo = first;
        for (int64_t x = lo; x < hi; x++)
            if (pg->xmark[x] != xs) att[m] = (int32_t)x, att_k[m] = att_v[m] = NULL, m++;
    }
    return m;
}

/* The codec's bytes of the whole pages pl[0..np) at position p: the rows of their positions <= p as the codec holds
 * them (kvs_codec_state_bytes, with the layer's share), plus each allocated slot past p (the newest page's padding)
 * at the codec's nominal bytes of one position (kvs_codec_position_bytes: a page is allocated in the codec's
 * format). */
static kvs_status rep_page_bytes(kvs_host_rep *r, int h, const int64_t *pl, int64_t np, int64_t P, int64_t p,
                                 double *bytes) {
    int64_t m = 0, pad = 0;
    for (int64_t k = 0; k < np; k++) {
        int64_t lo = pl[k] * P, hi = lo + P;
        for (int64_t x = lo; x < hi && x <= p; x++) r->pos[m++] = x;
        if (hi > p + 1) pad += hi - (p + 1);
    }
    kvs_status st = rep_bytes(r, h, m, bytes);
    if (st == KVS_OK) *bytes += (double)pad * kvs_codec_position_bytes(r->c, r->d);
    return st;
}

kvs_status kvs_host_page_cost(kvs_host_page *pg, kvs_host_rep *rep, int h, const struct kvs_policy_ops *ops,
                              void *state, const kvs_policy_model *m, const kvs_policy_view *view,
                              const kvs_policy_sel *sel, const kvs_policy_sel *att, int64_t p, kvs_policy_cost *c) {
    int64_t P = pg->page;
    size_t nps = (size_t)pg->n_pages;
    int coded = kvs_host_rep_active(rep);
    double pages = 0, uni = 0, read = 0, kv_codec = 0, uni_codec = 0, x;
    int64_t n_uni = 0;
    kvs_status st;
    if (!ops->stored) { /* every position seen, stored once: every page so far holding one of the window's */
        for (int64_t q = kvs_host_window_first(pg->window, p) / P; q <= p / P; q++) pg->ulist[n_uni++] = q;
        pages = uni = (double)n_uni;
    } else {
        uint32_t us = next_stamp(&pg->union_stamp, pg->umark, nps);
        for (int li = 0; li < sel->n_lists; li++) {
            uint32_t ls = next_stamp(&pg->count_stamp, pg->cmark, nps);
            int64_t ms = ops->stored(state, li, pg->stored), n_list = 0;
            for (int64_t k = 0; k < ms + sel->n[li]; k++) {
                int64_t q = (k < ms ? pg->stored[k] : sel->idx[li][k - ms]) / P;
                if (pg->cmark[q] == ls) continue;
                pg->cmark[q] = ls;
                pg->plist[n_list++] = q;
                pages++;
                if (pg->umark[q] != us) pg->umark[q] = us, uni++, pg->ulist[n_uni++] = q;
            }
            if (coded) {
                if ((st = rep_page_bytes(rep, h, pg->plist, n_list, P, p, &x)) != KVS_OK) return st;
                kv_codec += x;
            }
        }
    }
    if (coded && (st = rep_page_bytes(rep, h, pg->ulist, n_uni, P, p, &uni_codec)) != KVS_OK) return st;
    if (!ops->stored) kv_codec = uni_codec;
    double read_codec = 0;
    for (int li = 0; li < sel->n_lists; li++) {
        read += (double)att->n[li];
        if (coded) { /* the attended rows as the codec holds them (a merged slot's position stands for its row) */
            if ((st = kvs_host_rep_list_bytes(rep, h, att->idx[li], att->n[li], &x)) != KVS_OK) return st;
            read_codec += x;
        }
    }
    kvs_host_cost(ops, state, m, view, sel, pages * (double)P, uni * (double)P, c);
    c->kv_bytes = coded ? kv_codec : kvs_policy_kv_bytes(m, pages * (double)P);
    c->dedup_kv_bytes = coded ? uni_codec : kvs_policy_kv_bytes(m, uni * (double)P);
    c->read_kv_bytes = coded ? read_codec : kvs_policy_kv_bytes(m, read);
    settle_cost(c);
    return KVS_OK;
}
