/* policy_memo.c — the replay task's memo of budget-independent scores (issue 17; sim/policy_memo.h,
 * sim/BENCH.md "Third pass" and "Eighth pass (a)"). A small table of entries, each the complete description of one
 * kvs_attn_colsum / kvs_snapkv_scores call (row pointers, candidates copied, every option) or of one
 * kvs_page_scores_rows call (query rows copied, the layout, and what the summaries are a function of) and its
 * output; a lookup compares all of it, so a hit is the same computation and its bits are the ones computing
 * would give.
 */
#include "policy_memo.h"

#include <stdlib.h>
#include <string.h>

/* Entries kept per position: the distinct computations of one position are one per policy family, KV head and
 * (expand mode) query head: H2O and SnapKV on Llama-3.1-8B's 8 KV heads x 4 query heads are 32 each. Past either
 * bound a result is simply not kept (replacing entries would thrash when configurations alternate). The byte bound
 * caps the memo's memory per task (per thread): a 32K-token prompt's fp64 column sums are 256 KiB an entry. */
enum { MEMO_ENTRIES = 256 };
#define MEMO_MAX_BYTES ((size_t)32 << 20)

typedef enum { MEMO_COLSUM_F32 = 1, MEMO_COLSUM_F64 = 2, MEMO_SNAPKV = 3, MEMO_PAGE_SCORES = 4 } memo_kind;

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

typedef struct {
    memo_kind kind;
    kvs_attn_src src; /* src.idx points at `idx` below (or is NULL) */
    kvs_colsum_opts co;
    kvs_snapkv_opts so;
    page_key pk;
    float *qv;        /* [nq][d] the page-score query values, copied */
    size_t qv_cap;    /* floats */
    int32_t *idx;     /* [n_cand] the candidates, copied */
    size_t idx_cap;   /* entries */
    void *res;        /* the output span, rows packed: [rows][cols] floats or doubles */
    size_t res_cap;   /* bytes */
    size_t res_bytes;
    int64_t ret;      /* kvs_snapkv_scores' m */
} memo_entry;

struct kvs_policy_memo {
    memo_entry e[MEMO_ENTRIES];
    int n;            /* entries in use */
    size_t bytes;     /* held by every entry's buffers */
    int64_t hits;
};

kvs_policy_memo *kvs_policy_memo_create(void) { return calloc(1, sizeof(kvs_policy_memo)); }

void kvs_policy_memo_free(kvs_policy_memo *m) {
    if (!m) return;
    for (int i = 0; i < MEMO_ENTRIES; i++) {
        free(m->e[i].idx);
        free(m->e[i].qv);
        free(m->e[i].res);
    }
    free(m);
}

void kvs_policy_memo_clear(kvs_policy_memo *m) {
    if (!m) return;
    m->n = 0;
}

int64_t kvs_policy_memo_hits(const kvs_policy_memo *m) { return m ? m->hits : 0; }

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
