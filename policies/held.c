/* held.c — the held list of score-based eviction policies (policies/held.h): positions, one fp64 score per entry,
 * evict-the-lowest and keep-the-top-N with POLICY_SPEC §1.4's tie rule (the older position wins). The ranking is
 * kvs_topk_f64's (common/kvs_math.h), the one top-k of the code base (STYLE.md rule 6).
 */
#include <stdlib.h>
#include <math.h>
#include <string.h>

#include "../common/kvs_math.h"
#include "held.h"

struct kvs_held {
    int32_t *pos;   /* [cap] held positions, ascending */
    double *score;  /* [cap] the policy's score of each entry, aligned with pos */
    int64_t n, cap;
    int32_t *top;   /* [cap] kvs_held_mark_top's top-k scratch */
    char *keep;     /* [cap] kvs_held_keep_top's mask */
};

/* Every array to exactly cap entries (>= n). On failure the entries are intact (an array that moved holds them at
 * its new address) and the recorded capacity is the smaller of the old one and cap, which every array has. */
static kvs_status held_realloc(kvs_held *h, int64_t cap) {
    int32_t *pos = realloc(h->pos, (size_t)cap * sizeof *pos);
    if (pos) h->pos = pos;
    double *score = realloc(h->score, (size_t)cap * sizeof *score);
    if (score) h->score = score;
    int32_t *top = realloc(h->top, (size_t)cap * sizeof *top);
    if (top) h->top = top;
    char *keep = realloc(h->keep, (size_t)cap);
    if (keep) h->keep = keep;
    if (!pos || !score || !top || !keep) {
        if (cap < h->cap) h->cap = cap;
        return kvs_fail(KVS_ERR_NOMEM, "held list: out of memory for %lld entries", (long long)cap);
    }
    h->cap = cap;
    return KVS_OK;
}

kvs_held *kvs_held_create(int64_t cap) {
    kvs_held *h = calloc(1, sizeof *h);
    if (!h) return NULL;
    if (held_realloc(h, cap > 0 ? cap : 1) != KVS_OK) {
        kvs_held_free(h);
        return NULL;
    }
    return h;
}

void kvs_held_free(kvs_held *h) {
    if (!h) return;
    free(h->pos);
    free(h->score);
    free(h->top);
    free(h->keep);
    free(h);
}

kvs_status kvs_held_reserve(kvs_held *h, int64_t need) {
    if (need <= h->cap) return KVS_OK;
    int64_t cap = h->cap * 2 > need ? h->cap * 2 : need;
    return held_realloc(h, cap);
}

kvs_status kvs_held_resize(kvs_held *h, int64_t cap) {
    if (cap < h->n) cap = h->n;
    if (cap < 1) cap = 1;
    return cap == h->cap ? KVS_OK : held_realloc(h, cap);
}

int64_t kvs_held_count(const kvs_held *h) { return h->n; }

const int32_t *kvs_held_pos(const kvs_held *h) { return h->pos; }

double *kvs_held_score(kvs_held *h) { return h->score; }

int64_t kvs_held_copy(const kvs_held *h, int32_t *out) {
    if (h->n > 0) memcpy(out, h->pos, (size_t)h->n * sizeof *out);
    return h->n;
}

void kvs_held_push(kvs_held *h, int32_t p) {
    KVS_ASSERT(h->n < h->cap && (h->n == 0 || h->pos[h->n - 1] < p));
    h->pos[h->n] = p;
    h->score[h->n] = 0;
    h->n++;
}

void kvs_held_reset_scores(kvs_held *h) {
    if (h->n > 0) memset(h->score, 0, (size_t)h->n * sizeof *h->score);
}

void kvs_held_add(kvs_held *h, const float *a) {
    for (int64_t j = 0; j < h->n; j++) h->score[j] += a[j];
}

void kvs_held_add_f64(kvs_held *h, const double *t, int64_t n) {
    KVS_ASSERT(n <= h->n);
    for (int64_t j = 0; j < n; j++) h->score[j] += t[j];
}

void kvs_held_add_heads(kvs_held *h, const float *const *probs, int n_heads, int mean) {
    kvs_heads_add(probs, (size_t)n_heads, (size_t)h->n, mean, h->score);
}

int64_t kvs_held_lowest(const kvs_held *h, int64_t lo, int64_t hi) {
    KVS_ASSERT(lo >= 0 && lo < h->n && hi <= h->n);
    int64_t v = lo;
    for (int64_t j = lo + 1; j < hi; j++)
        if (h->score[j] <= h->score[v]) v = j; /* `<=`: the later of equal scores is the victim */
    return v;
}

void kvs_held_scores_of(const kvs_held *h, int64_t lo, int64_t hi, const int32_t *idx, int64_t n, double *out) {
    if (lo < 0) lo = 0;
    if (hi > h->n) hi = h->n;
    for (int64_t j = 0; j < n; j++) {
        /* binary search: the entries are in ascending position order */
        int64_t a = 0, b = h->n;
        while (a < b) {
            int64_t mid = a + (b - a) / 2;
            if (h->pos[mid] < idx[j]) a = mid + 1;
            else b = mid;
        }
        int held = a < h->n && h->pos[a] == idx[j];
        out[j] = held && a >= lo && a < hi ? h->score[a] : INFINITY;
    }
}

void kvs_held_remove(kvs_held *h, int64_t j) {
    KVS_ASSERT(j >= 0 && j < h->n);
    memmove(h->pos + j, h->pos + j + 1, (size_t)(h->n - j - 1) * sizeof *h->pos);
    memmove(h->score + j, h->score + j + 1, (size_t)(h->n - j - 1) * sizeof *h->score);
    h->n--;
}

int64_t kvs_held_drop_before(kvs_held *h, int32_t first) {
    int64_t j = 0;
    while (j < h->n && h->pos[j] < first) j++;
    if (j == 0) return 0;
    memmove(h->pos, h->pos + j, (size_t)(h->n - j) * sizeof *h->pos);
    memmove(h->score, h->score + j, (size_t)(h->n - j) * sizeof *h->score);
    h->n -= j;
    return j;
}

int64_t kvs_positions_drop_before(int32_t *pos, int64_t n, int64_t first) {
    int64_t j = 0;
    while (j < n && pos[j] < first) j++;
    if (j > 0) memmove(pos, pos + j, (size_t)(n - j) * sizeof *pos);
    return n - j;
}

void kvs_held_top_mask(const double *score, int64_t n, int64_t k, char *keep, int32_t *scratch) {
    if (n <= 0) return;
    if (k >= n) {
        memset(keep, 1, (size_t)n);
        return;
    }
    memset(keep, 0, (size_t)n);
    if (k <= 0) return;
    /* the kept SET is all that matters (the list keeps its position order): the heap without its final sort */
    kvs_topk_f64_set(score, (size_t)n, (size_t)k, scratch);
    for (int64_t j = 0; j < k; j++) keep[scratch[j]] = 1;
}

void kvs_held_mark_top(kvs_held *h, int64_t lo, int64_t hi, int64_t k, char *keep) {
    KVS_ASSERT(lo >= 0 && lo <= hi && hi <= h->n);
    if (lo > 0) memset(keep, 1, (size_t)lo);
    kvs_held_top_mask(h->score + lo, hi - lo, k, keep + lo, h->top);
    if (hi < h->n) memset(keep + hi, 1, (size_t)(h->n - hi));
}

void kvs_held_compact(kvs_held *h, const char *keep) {
    int64_t w = 0;
    for (int64_t j = 0; j < h->n; j++) {
        if (!keep[j]) continue;
        h->pos[w] = h->pos[j];
        h->score[w++] = h->score[j];
    }
    h->n = w;
}

void kvs_held_keep_top(kvs_held *h, int64_t lo, int64_t hi, int64_t k) {
    kvs_held_mark_top(h, lo, hi, k, h->keep);
    kvs_held_compact(h, h->keep);
}
