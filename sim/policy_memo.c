/* policy_memo.c — the replay task's memo of budget-independent scores (sim/policy_memo.h; sim/BENCH.md "Work shared
 * between a task's configurations"). A small table of entries, each the complete description
 * of one kvs_attn_colsum / kvs_snapkv_scores call (row pointers, candidates copied, every option), of one
 * kvs_page_scores_rows call (query rows copied, the layout, and what the summaries are a function of), of the
 * values one top-k selection ranks (the rows copied) and its output, or of the page scores one page selection
 * ranks (copied) and its ranking, or of a policy's own result (kvs_policy_shared: a tag, the view's rows and the
 * caller's key bytes, copied); a lookup compares all of it, so a hit is the same computation and its bits are
 * the ones computing would give (for the top-k and the pages: the ranking's first entries, which the order makes
 * the select's set).
 */
#include "policy_memo.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ref_rank.h"

/* Entries kept per position: the distinct computations of one position are one per policy family, KV head and
 * (expand mode) query head: H2O and SnapKV on Llama-3.1-8B's 8 KV heads x 4 query heads are 32 each. Past either
 * bound a result is simply not kept (replacing entries would thrash when configurations alternate). The byte bound
 * caps the memo's memory per task (per thread): a 32K-token prompt's fp64 column sums are 256 KiB an entry. */
enum { MEMO_ENTRIES = 256 };
#define MEMO_MAX_BYTES ((size_t)32 << 20)

typedef enum {
    MEMO_COLSUM_F32 = 1, MEMO_COLSUM_F64 = 2, MEMO_SNAPKV = 3, MEMO_PAGE_SCORES = 4, MEMO_TOPK = 5,
    MEMO_PAGE_RANK = 6, MEMO_SHARED = 7
} memo_kind;

/* What a kvs_policy_page_scores output depends on: the query rows (their address and, copied in the entry,
 * their values), the layout of the summaries, and what the summaries are a function of (the view's key rows,
 * their count and the page size: the function's contract). */
typedef struct {
    const float *q;
    size_t nq, d, stride, n_pages;
    const float *k;   /* view->k */
    int64_t n;        /* view->n */
    int64_t q_first;  /* view->q_first */
    int64_t page;
} page_key;

/* What a kvs_policy_topk_sorted output depends on besides k: the rows (their address and, copied in the entry,
 * their values) and their shape. */
typedef struct {
    const float *rows;
    size_t n_rows, n;
} topk_key;

/* What a kvs_policy_shared output depends on besides the caller's key bytes (copied at the start of the entry's
 * res): the computation's name and the rows under the view. */
typedef struct {
    const char *tag;
    const float *k, *v, *q;
    int64_t n, q_first, n_q, turn_begin;
    int32_t group, head_dim;
    float scale;
    size_t key_bytes, out_bytes;
} shared_key;

typedef struct {
    memo_kind kind;
    shared_key sk;
    kvs_attn_src src; /* src.idx points at `idx` below (or is NULL) */
    kvs_colsum_opts co;
    kvs_snapkv_opts so;
    page_key pk;
    topk_key tk;
    float *qv;        /* [nq][d] the page-score query values, or [n_rows][n] the top-k rows, copied */
    size_t qv_cap;    /* floats */
    int32_t *idx;     /* [n_cand] the candidates, copied */
    size_t idx_cap;   /* entries */
    void *res;        /* the output span, rows packed: [rows][cols] floats or doubles; MEMO_TOPK: [n] the group
                       * sum (n_rows > 1) then [n] int32 ranks; MEMO_SHARED: the key bytes, then the output */
    size_t res_cap;   /* bytes */
    size_t res_bytes;
    int64_t ret;      /* kvs_snapkv_scores' m; MEMO_TOPK: how many leading positions the ranks order (0: none);
                       * MEMO_PAGE_RANK: how many pages are ranked */
} memo_entry;

struct kvs_policy_memo {
    memo_entry e[MEMO_ENTRIES];
    int n;            /* entries in use */
    size_t bytes;     /* held by every entry's buffers */
    int64_t hits;
    size_t topk_depth;        /* the largest k a top-k lookup asked for: how deep a ranking goes */
    size_t page_depth;        /* the most pages a page selection asked ranked */
    uint32_t *rank_scratch;   /* [4 * rank_scratch_cap]: a ranking's order and kvs_ref_rank_prefix's scratch */
    size_t rank_scratch_cap;  /* positions */
};

kvs_policy_memo *kvs_policy_memo_create(void) { return calloc(1, sizeof(kvs_policy_memo)); }

void kvs_policy_memo_free(kvs_policy_memo *m) {
    if (!m) return;
    for (int i = 0; i < MEMO_ENTRIES; i++) {
        free(m->e[i].idx);
        free(m->e[i].qv);
        free(m->e[i].res);
    }
    free(m->rank_scratch);
    free(m);
}

void kvs_policy_memo_clear(kvs_policy_memo *m) {
    if (!m) return;
    m->n = 0;
}

int64_t kvs_policy_memo_hits(const kvs_policy_memo *m) { return m ? m->hits : 0; }

/* Checked mode (KVS_MEMO_CHECK set and not "0" in the environment; the test suite sets it): every hit of a memo
 * keyed by addresses under a contract (the column sums and window scores: the rows under the view do not change
 * between the engine's clears; the page scores: the summaries are a function of the view's keys and the page size)
 * is computed again and compared bit for bit with what the memo returned; a difference is a broken contract and
 * aborts with the entry's kind. The page ranking and the top-k are keyed by the values they rank, so a hit is the
 * same input by construction. */
static int memo_check_mode = -1; /* -1: not read yet */

static int memo_checked(void) {
    if (memo_check_mode < 0) { /* read once; a benign race writes the same value */
        const char *e = getenv("KVS_MEMO_CHECK");
        memo_check_mode = e && *e && strcmp(e, "0") != 0;
    }
    return memo_check_mode;
}

void kvs_policy_memo_set_checked(int on) { memo_check_mode = on != 0; }

static void memo_broken(const char *what) {
    fprintf(stderr, "kvsim: internal error: a %s memo hit differs from computing it (sim/policy_memo.h contract)\n",
            what);
    abort();
}

static int same_src(const kvs_attn_src *a, const kvs_attn_src *b) {
    if (a->q != b->q || a->q_first != b->q_first || a->n_q != b->n_q || a->group != b->group || a->d != b->d ||
        memcmp(&a->scale, &b->scale, sizeof a->scale) || a->keys != b->keys || a->n_cand != b->n_cand ||
        (a->idx == NULL) != (b->idx == NULL))
        return 0;
    return !a->idx || a->n_cand <= 0 || !memcmp(a->idx, b->idx, (size_t)a->n_cand * sizeof(int32_t));
}

static int same_co(const kvs_colsum_opts *a, const kvs_colsum_opts *b) {
    return a->row_first == b->row_first && a->n_rows == b->n_rows && a->head_first == b->head_first &&
           a->n_heads == b->n_heads && a->reduce == b->reduce && a->n_out == b->n_out && a->head_stride == b->head_stride;
}

static int same_so(const kvs_snapkv_opts *a, const kvs_snapkv_opts *b) {
    return a->window == b->window && a->kernel == b->kernel && a->pool == b->pool && a->head_first == b->head_first &&
           a->n_heads == b->n_heads && a->reduce == b->reduce;
}

static memo_entry *find(kvs_policy_memo *m, memo_kind kind, const kvs_attn_src *src, const kvs_colsum_opts *co,
                        const kvs_snapkv_opts *so) {
    for (int i = 0; i < m->n; i++) {
        memo_entry *x = &m->e[i];
        if (x->kind == kind && same_src(&x->src, src) && (co ? same_co(&x->co, co) : same_so(&x->so, so))) return x;
    }
    return NULL;
}

/* Grows buf to hold `need` elements of `elem` bytes (*out: buf or its reallocation), counting the bytes in
 * m->bytes; 0 when out of memory (buf then still valid and *out untouched). */
static int grow(kvs_policy_memo *m, void *buf, size_t *cap, size_t need, size_t elem, void **out) {
    if (need <= *cap) {
        *out = buf;
        return 1;
    }
    void *p = realloc(buf, need * elem);
    if (!p) return 0;
    m->bytes += (need - *cap) * elem;
    *out = p;
    *cap = need;
    return 1;
}

/* A slot for a new entry with room for n_idx candidates, n_qv query floats and res_bytes of output, or NULL when
 * the memo is full or out of memory (the result is then simply not kept). The caller fills in the key. */
static memo_entry *slot(kvs_policy_memo *m, memo_kind kind, size_t n_idx, size_t n_qv, size_t res_bytes) {
    if (m->n == MEMO_ENTRIES) return NULL;
    memo_entry *x = &m->e[m->n];
    size_t more = (n_idx > x->idx_cap ? (n_idx - x->idx_cap) * sizeof(int32_t) : 0) +
                  (n_qv > x->qv_cap ? (n_qv - x->qv_cap) * sizeof(float) : 0) +
                  (res_bytes > x->res_cap ? res_bytes - x->res_cap : 0);
    if (m->bytes + more > MEMO_MAX_BYTES) return NULL;
    void *p;
    if (!grow(m, x->idx, &x->idx_cap, n_idx, sizeof(int32_t), &p)) return NULL;
    x->idx = p;
    if (!grow(m, x->qv, &x->qv_cap, n_qv, sizeof(float), &p)) return NULL;
    x->qv = p;
    if (!grow(m, x->res, &x->res_cap, res_bytes, 1, &p)) return NULL;
    x->res = p;
    m->n++;
    x->kind = kind;
    x->res_bytes = res_bytes;
    x->ret = 0;
    return x;
}

/* A slot holding the description of a colsum / snapkv call (the caller copies the output in). */
static memo_entry *store(kvs_policy_memo *m, memo_kind kind, const kvs_attn_src *src, const kvs_colsum_opts *co,
                         const kvs_snapkv_opts *so, size_t res_bytes) {
    size_t n_idx = src->idx && src->n_cand > 0 ? (size_t)src->n_cand : 0;
    memo_entry *x = slot(m, kind, n_idx, 0, res_bytes);
    if (!x) return NULL;
    x->src = *src;
    if (n_idx) memcpy(x->idx, src->idx, n_idx * sizeof(int32_t));
    x->src.idx = src->idx ? x->idx : NULL;
    if (co) x->co = *co;
    if (so) x->so = *so;
    return x;
}

/* The span kvs_attn_colsum writes: rows of n_out elements, `stride` apart. */
static void colsum_span(const kvs_colsum_opts *co, size_t *rows, size_t *stride) {
    size_t n_out = co->n_out > 0 ? (size_t)co->n_out : 0;
    *rows = co->reduce == KVS_GQA_NONE && co->n_heads > 0 ? (size_t)co->n_heads : 1;
    *stride = co->reduce == KVS_GQA_NONE && co->head_stride > 0 ? (size_t)co->head_stride : n_out;
}

static int span_is_zero(const unsigned char *out, size_t rows, size_t stride, size_t row_bytes, size_t elem) {
    for (size_t r = 0; r < rows; r++) {
        const unsigned char *p = out + r * stride * elem;
        for (size_t b = 0; b < row_bytes; b++)
            if (p[b]) return 0;
    }
    return 1;
}

void kvs_policy_colsum(const kvs_policy_view *view, const kvs_attn_src *src, const kvs_colsum_opts *opts,
                       float *out_f32, double *out_f64, void *scratch) {
    kvs_policy_memo *m = view ? view->memo : NULL;
    size_t rows, stride, elem = out_f32 ? sizeof(float) : sizeof(double);
    colsum_span(opts, &rows, &stride);
    size_t row_bytes = (opts->n_out > 0 ? (size_t)opts->n_out : 0) * elem;
    unsigned char *out = out_f32 ? (unsigned char *)out_f32 : (unsigned char *)out_f64;
    if (!m || !out || !span_is_zero(out, rows, stride, row_bytes, elem)) {
        kvs_attn_colsum(src, opts, out_f32, out_f64, scratch);
        return;
    }
    memo_kind kind = out_f32 ? MEMO_COLSUM_F32 : MEMO_COLSUM_F64;
    memo_entry *x = find(m, kind, src, opts, NULL);
    if (x) {
        for (size_t r = 0; r < rows; r++) memcpy(out + r * stride * elem, (unsigned char *)x->res + r * row_bytes, row_bytes);
        m->hits++;
        if (memo_checked() && rows > 0) {
            size_t span = ((rows - 1) * stride) * elem + row_bytes;
            unsigned char *fresh = calloc(span ? span : 1, 1);
            if (!fresh) return;
            kvs_attn_colsum(src, opts, out_f32 ? (float *)(void *)fresh : NULL, out_f32 ? NULL : (double *)(void *)fresh,
                            scratch);
            for (size_t r = 0; r < rows; r++)
                if (memcmp(fresh + r * stride * elem, out + r * stride * elem, row_bytes)) memo_broken("column-sum");
            free(fresh);
        }
        return;
    }
    kvs_attn_colsum(src, opts, out_f32, out_f64, scratch);
    if ((x = store(m, kind, src, opts, NULL, rows * row_bytes)) != NULL)
        for (size_t r = 0; r < rows; r++) memcpy((unsigned char *)x->res + r * row_bytes, out + r * stride * elem, row_bytes);
}

int64_t kvs_policy_snapkv_scores(const kvs_policy_view *view, const kvs_attn_src *src, const kvs_snapkv_opts *opts,
                                 float *out, void *scratch) {
    kvs_policy_memo *m = view ? view->memo : NULL;
    if (!m) return kvs_snapkv_scores(src, opts, out, scratch);
    size_t rows = opts->reduce == KVS_GQA_NONE && opts->n_heads > 0 ? (size_t)opts->n_heads : 1;
    memo_entry *x = find(m, MEMO_SNAPKV, src, NULL, opts);
    if (x) {
        if (x->res_bytes) memcpy(out, x->res, x->res_bytes);
        m->hits++;
        if (memo_checked()) {
            size_t cap = rows * (size_t)(view->n > src->n_cand ? view->n : src->n_cand) + 1;
            float *fresh = malloc(cap * sizeof *fresh);
            if (!fresh) return x->ret;
            int64_t r = kvs_snapkv_scores(src, opts, fresh, scratch);
            if (r != x->ret || (x->res_bytes && memcmp(fresh, out, x->res_bytes))) memo_broken("window-score");
            free(fresh);
        }
        return x->ret;
    }
    int64_t r = kvs_snapkv_scores(src, opts, out, scratch);
    size_t bytes = r > 0 ? rows * (size_t)r * sizeof(float) : 0;
    if ((x = store(m, MEMO_SNAPKV, src, NULL, opts, bytes)) != NULL) {
        if (bytes) memcpy(x->res, out, bytes);
        x->ret = r;
    }
    return r;
}

static int same_page_key(const memo_entry *x, const page_key *k) {
    return x->pk.q == k->q && x->pk.nq == k->nq && x->pk.d == k->d && x->pk.stride == k->stride &&
           x->pk.n_pages == k->n_pages && x->pk.k == k->k && x->pk.n == k->n && x->pk.q_first == k->q_first &&
           x->pk.page == k->page && !memcmp(x->qv, k->q, k->nq * k->d * sizeof(float));
}

void kvs_policy_page_scores(const kvs_policy_view *view, int64_t page, const float *q, size_t nq, size_t d,
                            const float *kmin, const float *kmax, size_t stride, size_t n_pages, double *out) {
    kvs_policy_memo *m = view ? view->memo : NULL;
    if (!m || page <= 0 || nq == 0 || n_pages == 0) {
        kvs_page_scores_rows(q, nq, d, kmin, kmax, stride, n_pages, out);
        return;
    }
    page_key key = {.q = q, .nq = nq, .d = d, .stride = stride, .n_pages = n_pages, .k = view->k, .n = view->n,
                    .q_first = view->q_first, .page = page};
    size_t bytes = nq * n_pages * sizeof(double);
    for (int i = 0; i < m->n; i++) {
        memo_entry *x = &m->e[i];
        if (x->kind == MEMO_PAGE_SCORES && same_page_key(x, &key)) {
            memcpy(out, x->res, bytes);
            m->hits++;
            if (memo_checked()) {
                double *fresh = malloc(bytes);
                if (!fresh) return;
                kvs_page_scores_rows(q, nq, d, kmin, kmax, stride, n_pages, fresh);
                if (memcmp(fresh, out, bytes)) memo_broken("page-score");
                free(fresh);
            }
            return;
        }
    }
    kvs_page_scores_rows(q, nq, d, kmin, kmax, stride, n_pages, out);
    memo_entry *x = slot(m, MEMO_PAGE_SCORES, 0, nq * d, bytes);
    if (!x) return;
    x->pk = key;
    memcpy(x->qv, q, nq * d * sizeof(float));
    memcpy(x->res, out, bytes);
}

/* ---- Quest's page ranking ---- */

/* The entry's output: [n_pages] the scores (the key), then [n_pages] int32 the ranking, x->ret of it filled. */
static int32_t *page_rank_of(memo_entry *x) { return (int32_t *)(void *)((double *)x->res + x->pk.n_pages); }

int64_t kvs_policy_page_select(const kvs_policy_view *view, const double *score, size_t n_pages, size_t page,
                               size_t n_tokens, size_t k, int32_t *out, int32_t *scratch) {
    kvs_policy_memo *m = view ? view->memo : NULL;
    if (k > n_tokens) k = n_tokens;
    if (!m || k == 0 || n_pages == 0) return kvs_page_select(score, n_pages, page, n_tokens, k, out, scratch);
    size_t need = kvs_page_select_depth(n_pages, page, k);
    if (need > m->page_depth) m->page_depth = need;
    size_t depth = m->page_depth < n_pages ? m->page_depth : n_pages;
    memo_entry *x = NULL;
    for (int i = 0; i < m->n && !x; i++)
        if (m->e[i].kind == MEMO_PAGE_RANK && m->e[i].pk.n_pages == n_pages &&
            !memcmp(m->e[i].res, score, n_pages * sizeof *score))
            x = &m->e[i];
    if (!x) {
        /* the first configuration to ask ranks for the deepest one seen (a lone configuration: its own depth) */
        kvs_topk_f64(score, n_pages, depth, scratch);
        if ((x = slot(m, MEMO_PAGE_RANK, 0, 0, n_pages * (sizeof(double) + sizeof(int32_t)))) != NULL) {
            x->pk = (page_key){.n_pages = n_pages};
            memcpy(x->res, score, n_pages * sizeof *score);
            memcpy(page_rank_of(x), scratch, depth * sizeof(int32_t));
            x->ret = (int64_t)depth;
        }
        return kvs_page_take(scratch, depth, page, n_tokens, k, out);
    }
    m->hits++;
    int32_t *ranked = page_rank_of(x);
    if ((size_t)x->ret < need) { /* deeper than any asked before this position */
        kvs_topk_f64(score, n_pages, depth, ranked);
        x->ret = (int64_t)depth;
    }
    return kvs_page_take(ranked, (size_t)x->ret, page, n_tokens, k, out);
}

/* ---- the oracle top-k's selection ---- */

/* The values the selection ranks: the rows' sum from +0 in row order (kvs_policy_topk_sorted's contract), or the
 * row itself when there is one (+0 + x has x's kvs_desc_key for every x: -0 becomes +0, equal to it in the order;
 * a NaN stays a NaN; every other x is unchanged). */
static const float *topk_values(const float *rows, size_t n_rows, size_t n, float *sum) {
    if (n_rows == 1) return rows;
    memset(sum, 0, n * sizeof *sum);
    for (size_t g = 0; g < n_rows; g++) { /* row by row, so the adds run along rows */
        const float *row = rows + g * n;
        for (size_t j = 0; j < n; j++) sum[j] += row[j];
    }
    return sum;
}

/* The positions ranked below k, ascending: exactly k of them when k <= the depth the ranks order. The write lands
 * at out[c] with c < k only (the loop stops at k), so out holds k entries. */
static void topk_take(const int32_t *rank, size_t k, int32_t *out) {
    size_t c = 0;
    for (int32_t j = 0; c < k; j++) {
        out[c] = j;
        c += rank[j] < (int32_t)k;
    }
}

static int same_topk_key(const memo_entry *x, const topk_key *k) {
    return x->tk.rows == k->rows && x->tk.n_rows == k->n_rows && x->tk.n == k->n &&
           !memcmp(x->qv, k->rows, k->n_rows * k->n * sizeof(float));
}

void kvs_policy_topk_sorted(const kvs_policy_view *view, const float *rows, size_t n_rows, size_t n, size_t k,
                            float *sum, int32_t *out) {
    kvs_policy_memo *m = view ? view->memo : NULL;
    if (k > n) k = n;
    if (k == 0 || n_rows == 0) return;
    if (!m || k == n) { /* k == n: every position, nothing to rank */
        kvs_topk_sorted(topk_values(rows, n_rows, n, sum), n, k, out);
        return;
    }
    if (k > m->topk_depth) m->topk_depth = k;
    topk_key key = {.rows = rows, .n_rows = n_rows, .n = n};
    memo_entry *x = NULL;
    for (int i = 0; i < m->n && !x; i++)
        if (m->e[i].kind == MEMO_TOPK && same_topk_key(&m->e[i], &key)) x = &m->e[i];
    if (!x) {
        /* The first configuration to ask: its select, as without a memo (a lone configuration pays no ranking);
         * the values are kept for the ones that follow. */
        const float *v = topk_values(rows, n_rows, n, sum);
        kvs_topk_sorted(v, n, k, out);
        size_t sum_bytes = n_rows > 1 ? n * sizeof(float) : 0;
        if ((x = slot(m, MEMO_TOPK, 0, n_rows * n, sum_bytes + n * sizeof(int32_t))) == NULL) return;
        x->tk = key;
        memcpy(x->qv, rows, n_rows * n * sizeof(float));
        if (sum_bytes) memcpy(x->res, v, sum_bytes); /* slot() left x->ret 0: nothing ranked yet */
        return;
    }
    m->hits++;
    const float *v = n_rows > 1 ? (const float *)x->res : x->qv;
    int32_t *rank = (int32_t *)((unsigned char *)x->res + (n_rows > 1 ? n * sizeof(float) : 0));
    if ((size_t)x->ret < k) {
        /* Rank as deep as any configuration has asked (the top-k set is a prefix of the ranking, for every k up
         * to its depth), so a sweep's budgets, smallest first, rank once a position after the first one. */
        if (n > m->rank_scratch_cap) {
            uint32_t *p = realloc(m->rank_scratch, 4 * n * sizeof *p);
            if (!p) { /* no memory to rank: the select, as without a memo */
                kvs_topk_sorted(v, n, k, out);
                return;
            }
            m->rank_scratch = p;
            m->rank_scratch_cap = n;
        }
        int32_t *order = (int32_t *)m->rank_scratch; /* same width */
        size_t depth = m->topk_depth < n ? m->topk_depth : n;
        size_t ranked = kvs_ref_rank_prefix(v, n, depth, order, m->rank_scratch + n);
        kvs_ref_rank_positions(order, ranked, n, rank);
        x->ret = (int64_t)ranked;
    }
    topk_take(rank, k, out);
}

/* ---- a policy's own shared result ------------------------------------------------------------------------------ */

static int same_shared_key(const memo_entry *x, const shared_key *k, const void *key) {
    const shared_key *a = &x->sk;
    return a->k == k->k && a->v == k->v && a->q == k->q && a->n == k->n && a->q_first == k->q_first &&
           a->n_q == k->n_q && a->turn_begin == k->turn_begin && a->group == k->group && a->head_dim == k->head_dim &&
           !memcmp(&a->scale, &k->scale, sizeof a->scale) && a->key_bytes == k->key_bytes &&
           a->out_bytes == k->out_bytes && !strcmp(a->tag, k->tag) && !memcmp(x->res, key, k->key_bytes);
}

kvs_status kvs_policy_shared(const kvs_policy_view *view, const char *tag, const void *key, size_t key_bytes,
                             void *out, size_t out_bytes, kvs_policy_shared_fn compute, void *ctx) {
    kvs_policy_memo *m = view ? view->memo : NULL;
    if (!m) return compute(ctx, out);
    shared_key sk = {.tag = tag, .k = view->k, .v = view->v, .q = view->q, .n = view->n, .q_first = view->q_first,
                     .n_q = view->n_q, .turn_begin = view->turn_begin, .group = view->group,
                     .head_dim = view->head_dim, .scale = view->scale, .key_bytes = key_bytes, .out_bytes = out_bytes};
    for (int i = 0; i < m->n; i++) {
        memo_entry *x = &m->e[i];
        if (x->kind != MEMO_SHARED || !same_shared_key(x, &sk, key)) continue;
        if (out_bytes) memcpy(out, (unsigned char *)x->res + key_bytes, out_bytes);
        m->hits++;
        if (memo_checked()) {
            unsigned char *fresh = malloc(out_bytes ? out_bytes : 1);
            if (!fresh) return KVS_OK;
            kvs_status st = compute(ctx, fresh);
            if (st != KVS_OK || memcmp(fresh, out, out_bytes)) memo_broken(tag);
            free(fresh);
        }
        return KVS_OK;
    }
    kvs_status st = compute(ctx, out);
    if (st != KVS_OK) return st;
    memo_entry *x = slot(m, MEMO_SHARED, 0, 0, key_bytes + out_bytes);
    if (!x) return KVS_OK; /* full: simply not kept */
    x->sk = sk;
    if (key_bytes) memcpy(x->res, key, key_bytes);
    if (out_bytes) memcpy((unsigned char *)x->res + key_bytes, out, out_bytes);
    return KVS_OK;
}
