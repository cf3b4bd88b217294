/* shadowkv.c — ShadowKV (Sun et al., ICML 2025, arXiv 2410.21465; authors' code bytedance/ShadowKV, ShadowKVCache and
 * ShadowKVCache_CPU), as specified in ../shared/POLICY_SPEC_2.md §2.10 (with §1.1 inverse RoPE, common/kvs_rope.h).
 *
 * At the end of a prompt (n positions, all of them compressed): the layer's pre-RoPE keys of every KV head,
 * concatenated (n x Hkv d), are factored at rank r (the top-r eigenvectors V_r of the Gram matrix, the SVD's right
 * singular vectors); the prompt is cut into chunks of c positions; the last `local` positions (local_chunks c + n mod
 * c) stay exact on the device; each chunk is summarised by its landmark (mean post-RoPE key); the `outliers` chunks
 * whose keys agree least with their landmark (smallest min cosine) stay exact; every prompt value goes to host memory.
 * At each decode step each query head scores the other chunks' landmarks (softmax with the trace's scale), the group
 * takes the max, and the best chunks up to the sparse budget are rebuilt: keys R(j) V_r V_r^T k̂_j (merged slots: the
 * attention sees the reconstructed keys), values fetched from the host. Attended: local + outliers + selected +
 * every generated token (exact, never compressed).
 *
 * Budget (prompt-only scope: generated tokens are all kept, §0.3): B bounds the prompt positions attended, B = local
 * + outlier tokens + sparse budget, so the sparse budget is B - local - outliers c (§2.10 "Budget mapping"); the
 * paper's sparse 2048 with its 48 outliers and 4 local chunks of 8 is B = 2048 + 384 + 32 + (n mod 8).
 *
 * Decisions where the spec leaves room ([SIM-CHOICE] unless marked):
 *  - rank: `rank` (0 = min(160, Hkv d, n), REF) or `rank_frac` of Hkv d when > 0 (the spec's 0.15625 = 160/1024 for
 *    models whose Hkv d is far below 1024, preset small-model); at full rank (r >= min(Hkv d, n)) the reconstruction
 *    is the key itself and the selected keys are attended as exact, not merged.
 *  - A budget too small for the defaults: local shrinks to B, outliers to floor((B - local)/c) chunks; chunks tile
 *    [0, n - local) and the last one may be partial; chunks are taken in score order (ties: lower chunk) while their
 *    tokens fit the sparse budget, so a budget covering the prompt attends all of it (lossless at full rank).
 *  - outliers = -1 (AUTO) is ShadowKVCache_CPU's floor(sparse / 1024) 24 with sparse taken as B - local.
 *  - Multi-turn: at a later prompt's end everything seen is re-compressed as one prompt; positions whose exact keys
 *    the device no longer holds enter the new factorisation with their reconstructed keys (what a system has).
 *  - RoPE: theta and layout from the trace header, the Llama-3 scaling (not in the header) from rope_scaling; `auto`
 *    refuses a Llama-3 model name (§1.1), as policies/ea.c does.
 *  - Δ-REF 1-6 as the spec: landmarks/outliers/local from post-RoPE keys, SVD on pre-RoPE keys of all KV heads of a
 *    layer (the layer-shared U_r is divided by Hkv per KV head), no minimum prompt length, landmark scale = attn_scale.
 * Accounting per KV head and step (bytes = elements x kv_bytes): device KV = exact (local, outliers, generated) plus
 * the sparse buffer 2d x selected; AUX = landmarks d (C - outliers) + U_r n r / Hkv + SV r d + chunk indices; HOST =
 * prompt values d n; reads: attention (default) + landmarks + U_r rows r x selected + SV; H2D = fetched values d x
 * tokens of chunks missed by the reuse cache (the previous step's chunks); D2H = the prompt values once, at the
 * first decode step after a prompt.
 * Sliding-window layers (sim/replay.h): positions before the host's `first` (window_evict) no longer exist. A prompt's
 * compression covers the window's positions only, [first, n) at its end (`cbase` = that first): the factorisation's
 * input, the chunks (tiling [cbase, local_lo)), landmarks, outliers and local part are all built from them, and a
 * budget B >= W (the compressed positions are at most W - 1) keeps every one of them (lossless at full rank). While
 * decoding the window moves on: a chunk wholly before first is gone (no landmark scored or counted, no value on the
 * host, no U_r row); a chunk straddling the edge keeps its landmark (the mean over all of its keys, as computed at
 * the compression) and the factorisation is not redone [SIM-CHOICE: the paper's factors are per prompt]; it stays a
 * candidate for its in-window positions only, which is what it costs against the sparse budget and what is rebuilt
 * and attended. Exact local and outlier positions, the sparse buffer and the generated tokens before first leave
 * the device (stored()), and readable() starts at first (the host values of the dropped positions are gone). The
 * selection is emitted in ascending position order there (a full layer keeps its order: exact, chunks by score,
 * generated), so a budget covering the window attends it exactly as the full window's reference sums it.
 * Cost: the factorisation is P (Hkv d)^2 MACs for the Gram matrix plus ~10 (Hkv d)^3 for the Jacobi sweeps, and
 * P (Hkv d) r x 2 for the reconstruction, once per prompt and layer; a decode step costs G C d for the landmarks.
 */
#include "shadowkv_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../common/kvs_math.h"
#include "../common/kvs_rope.h"
#include "../trace/trace.h"
#include "registry.h"

enum { P_C, P_LOCAL, P_OUTLIERS, P_RANK, P_RANKF, P_SCALING };
#define SKV_MAX_SIGMA 64
#define INDEX_BYTES 4.0

static const kvs_policy_param skv_params[] = {
    [P_C] = {.key = "c", .type = KVS_PARAM_INT, .def = 8, .lo = 1, .hi = 1 << 20, .help = "chunk size (landmarks)"},
    [P_LOCAL] = {.key = "local_chunks", .type = KVS_PARAM_INT, .def = 4, .lo = 0, .hi = 1 << 20,
                 .help = "chunks at the end of the prompt kept exactly (plus n mod c)"},
    [P_OUTLIERS] = {.key = "outliers", .type = KVS_PARAM_INT, .def = 48, .lo = -1, .hi = 1 << 20,
                    .help = "outlier chunks kept exactly; -1 = floor(sparse/1024)*24 (ShadowKVCache_CPU)"},
    [P_RANK] = {.key = "rank", .type = KVS_PARAM_INT, .def = 0, .lo = 0, .hi = 1 << 20,
                .help = "rank r of the layer's pre-RoPE key factorisation; 0 = min(160, Hkv*d, n)"},
    [P_RANKF] = {.key = "rank_frac", .type = KVS_PARAM_DOUBLE, .def = 0, .lo = 0, .hi = 1,
                 .help = "when > 0: r = round(rank_frac * Hkv*d) (0.15625 = 160/1024 for small models)"},
    [P_SCALING] = {.key = "rope_scaling", .type = KVS_PARAM_ENUM, .def = 0, .choices = KVS_ROPE_SCALING_CHOICES,
                   .help = "RoPE frequency scaling the trace does not record: none; llama31 (factor 8, low 1, high 4, "
                           "orig 8192); llama32 (factor 32); auto = none, refused for a Llama-3 model name"},
};

static const kvs_policy_preset skv_presets[] = {
    {.name = "reference", .params = "c=8,local_chunks=4,outliers=48,rank=160",
     .help = "ShadowKV eval_acc.py: sparse budget 2048, chunk 8, rank 160, 48 outliers, 4 local chunks "
             "(budget 2048 + 384 + 32 + n mod 8)"},
    {.name = "small-model", .params = "rank_frac=0.15625",
     .help = "rank 160/1024 of Hkv*d, the reference's rank ratio for models far smaller than Llama-3-8B"},
};

typedef struct {
    kvs_policy_model m;
    int d, G, Hkv;
    double freq[KVS_TRACE_MAX_HEAD_DIM / 2];
    int64_t B, c, local_chunks, outl_param, rank_param;
    double rank_frac;
    int64_t cap;
    /* compressed prompt: positions [cbase, ncomp) (cbase > 0 on a sliding-window layer only) */
    int64_t ncomp, local_lo, C, n_pending, n_seen, cbase, pend_lo;
    int64_t first;    /* positions before it were evicted by the host (sliding-window layer); 0 otherwise */
    int64_t st_exact; /* the step just selected: exact positions attended (local, outliers, generated) */
    int64_t st_live;  /* the step just selected: live non-outlier chunks (landmarks scored) */
    float *kpre, *kpost; /* [cap][d] the factorisation's input (pending, filled by prefill) */
    float *krpre, *krec; /* [cap][d] reconstructed pre-RoPE / post-RoPE keys */
    int lowrank, rank;
    double sigma[SKV_MAX_SIGMA];
    int n_sigma;
    float *lm;        /* [C][d] landmarks */
    double *ocos, *pi;/* [C] */
    uint8_t *is_out, *sel_prev, *sel_now; /* [C] */
    int64_t *order;   /* [C] */
    int64_t out_tokens, sparse_tokens, n_out;
    float *vbuf;      /* [cap][d] fetched values of the selected tokens (the sparse buffer's V) */
    int64_t sel_tokens, sel_chunks, misses, miss_tokens;
    int first_decode;
} skv_state;

kvs_shadowkv_debug kvs_shadowkv_inspect(const void *state) {
    const skv_state *s = state;
    return (kvs_shadowkv_debug){.sigma = s->sigma, .n_sigma = s->n_sigma, .rank = s->rank, .n_chunks = s->C,
                                .ocos = s->ocos, .outlier = s->is_out, .pi = s->pi, .local_lo = s->local_lo,
                                .sparse_tokens = s->sparse_tokens, .misses = s->misses};
}

static kvs_status skv_validate(const kvs_policy_config *cfg, const kvs_policy_model *m, int64_t budget) {
    (void)budget;
    if (!(m->rope_theta > 0))
        return kvs_fail(KVS_ERR_INVALID_ARG,
                        "shadowkv: the trace records no RoPE theta: pre-RoPE keys cannot be recovered");
    if (m->head_dim % 2 || m->head_dim > KVS_TRACE_MAX_HEAD_DIM)
        return kvs_fail(KVS_ERR_INVALID_ARG, "shadowkv: head_dim %d is not an even size up to %d", (int)m->head_dim,
                        KVS_TRACE_MAX_HEAD_DIM);
    kvs_rope_scaling sc;
    return kvs_rope_scaling_of((kvs_rope_scaling_choice)cfg->v[P_SCALING], m->model_name, "shadowkv", &sc);
}

static void skv_free(void *state) {
    skv_state *s = state;
    if (!s) return;
    free(s->kpre), free(s->kpost), free(s->krpre), free(s->krec), free(s->lm), free(s->ocos), free(s->pi);
    free(s->is_out), free(s->sel_prev), free(s->sel_now), free(s->order), free(s->vbuf), free(s);
}

static kvs_status skv_create(const kvs_policy_init *init, void **state) {
    skv_state *s = calloc(1, sizeof *s);
    if (!s) return kvs_fail(KVS_ERR_NOMEM, "shadowkv: out of memory");
    const kvs_policy_config *cfg = init->cfg;
    s->m = *init->model;
    s->d = init->model->head_dim, s->G = init->model->group, s->Hkv = init->model->n_kv_heads;
    s->B = init->budget;
    s->c = (int64_t)cfg->v[P_C], s->local_chunks = (int64_t)cfg->v[P_LOCAL], s->outl_param = (int64_t)cfg->v[P_OUTLIERS];
    s->rank_param = (int64_t)cfg->v[P_RANK], s->rank_frac = cfg->v[P_RANKF];
    kvs_rope_scaling sc;
    kvs_status st = kvs_rope_scaling_of((kvs_rope_scaling_choice)cfg->v[P_SCALING], init->model->model_name,
                                        "shadowkv", &sc);
    if (st != KVS_OK) {
        free(s);
        return st;
    }
    kvs_rope_freqs(init->model->rope_theta, s->d, &sc, s->freq);
    s->cap = init->model->n_positions + 1;
    size_t rows = (size_t)s->cap * (size_t)s->d;
    s->kpre = malloc(rows * sizeof *s->kpre);
    s->kpost = malloc(rows * sizeof *s->kpost);
    s->krpre = malloc(rows * sizeof *s->krpre);
    s->krec = malloc(rows * sizeof *s->krec);
    s->lm = malloc(rows * sizeof *s->lm);
    s->vbuf = malloc(rows * sizeof *s->vbuf);
    s->ocos = calloc((size_t)s->cap, sizeof *s->ocos);
    s->pi = calloc((size_t)s->cap, sizeof *s->pi);
    s->is_out = calloc((size_t)s->cap, 1);
    s->sel_prev = calloc((size_t)s->cap, 1);
    s->sel_now = calloc((size_t)s->cap, 1);
    s->order = malloc((size_t)s->cap * sizeof *s->order);
    if (!s->kpre || !s->kpost || !s->krpre || !s->krec || !s->lm || !s->vbuf || !s->ocos || !s->pi || !s->is_out ||
        !s->sel_prev || !s->sel_now || !s->order) {
        skv_free(s);
        return kvs_fail(KVS_ERR_NOMEM, "shadowkv: out of memory");
    }
    *state = s;
    return KVS_OK;
}

/* Is position j (>= cbase) of the compressed prompt held exactly on the device (local or an outlier chunk)? */
static int exact_held(const skv_state *s, int64_t j) {
    if (j >= s->local_lo) return 1;
    return s->is_out[(j - s->cbase) / s->c];
}

/* Chunk m's positions [lo, hi) of the compressed prompt. */
static void chunk_span(const skv_state *s, int64_t m, int64_t *lo, int64_t *hi) {
    *lo = s->cbase + m * s->c;
    *hi = *lo + s->c < s->local_lo ? *lo + s->c : s->local_lo;
}

/* The factorisation's input: every position seen; exact keys where the device holds them (and for the new prompt),
 * the reconstruction elsewhere. The layer's factorisation itself runs in layer_sync. */
static kvs_status skv_prefill(void *state, const kvs_policy_view *v) {
    skv_state *s = state;
    int d = s->d;
    for (int64_t j = s->first; j < v->n; j++) { /* the window's positions (every position on a full layer) */
        float *pre = s->kpre + (size_t)j * d, *post = s->kpost + (size_t)j * d;
        if (j < s->ncomp && !exact_held(s, j)) {
            memcpy(pre, s->krpre + (size_t)j * d, (size_t)d * sizeof *pre);
            memcpy(post, s->krec + (size_t)j * d, (size_t)d * sizeof *post);
        } else {
            memcpy(post, v->k + (size_t)j * d, (size_t)d * sizeof *post);
            kvs_rope_invert(post, pre, d, s->m.rope_layout, j, s->freq);
        }
    }
    s->n_pending = v->n;
    s->pend_lo = s->first;
    s->n_seen = v->n;
    return KVS_OK;
}

static int cmp_ocos(const void *a, const void *b, void *ctx) {
    const double *o = ctx;
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    if (o[x] != o[y]) return o[x] < o[y] ? -1 : 1;
    return x < y ? -1 : x > y;
}

static int cmp_pi(const void *a, const void *b, void *ctx) {
    const double *p = ctx;
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    if (p[x] != p[y]) return p[x] > p[y] ? -1 : 1;
    return x < y ? -1 : x > y;
}

/* Chunks, landmarks, outliers and the budget split of one KV head over the compressed prompt [lo0, n). */
static void build_chunks(skv_state *s, int64_t lo0, int64_t n) {
    int d = s->d;
    int64_t c = s->c, len = n - lo0;
    s->ncomp = n;
    s->cbase = lo0;
    int64_t local_n = s->local_chunks * c + len % c;
    if (local_n > s->B) local_n = s->B;
    if (local_n > len) local_n = len;
    s->local_lo = n - local_n;
    s->C = (s->local_lo - lo0 + c - 1) / c;
    int64_t R = s->B - local_n;
    for (int64_t m = 0; m < s->C; m++) {
        int64_t lo, hi;
        chunk_span(s, m, &lo, &hi);
        double acc[KVS_TRACE_MAX_HEAD_DIM] = {0};
        for (int64_t j = lo; j < hi; j++)
            for (int a = 0; a < d; a++) acc[a] += s->kpost[(size_t)j * d + a];
        double nl = 0;
        for (int a = 0; a < d; a++) {
            s->lm[(size_t)m * d + a] = (float)(acc[a] / (double)(hi - lo));
            nl += (double)s->lm[(size_t)m * d + a] * s->lm[(size_t)m * d + a];
        }
        double omin = INFINITY;
        for (int64_t j = lo; j < hi; j++) {
            double dot = 0, nk = 0;
            for (int a = 0; a < d; a++) {
                double k = s->kpost[(size_t)j * d + a];
                dot += k * s->lm[(size_t)m * d + a];
                nk += k * k;
            }
            double cs = nl > 0 && nk > 0 ? dot / sqrt(nl * nk) : 0;
            if (cs < omin) omin = cs;
        }
        s->ocos[m] = omin;
        s->is_out[m] = 0;
        s->sel_prev[m] = 0;
        s->pi[m] = 0;
        s->order[m] = m;
    }
    int64_t want = s->outl_param >= 0 ? s->outl_param : (R / 1024) * 24;
    if (want > R / c) want = R / c;
    if (want > s->C) want = s->C;
    if (want < 0) want = 0;
    qsort_r(s->order, (size_t)s->C, sizeof *s->order, cmp_ocos, s->ocos);
    s->out_tokens = 0;
    for (int64_t i = 0; i < want; i++) {
        int64_t m = s->order[i];
        s->is_out[m] = 1;
        int64_t lo, hi;
        chunk_span(s, m, &lo, &hi);
        s->out_tokens += hi - lo;
    }
    s->n_out = want;
    s->sparse_tokens = R - s->out_tokens;
    if (s->sparse_tokens < 0) s->sparse_tokens = 0;
    s->first_decode = 1;
    s->sel_tokens = s->sel_chunks = s->misses = s->miss_tokens = 0;
    s->n_pending = 0;
}

/* The layer's factorisation (all KV heads of one layer; §2.10 prefill 1-2) and every head's chunks. */
static kvs_status skv_layer_sync(void *const *states, int n_kv_heads, kvs_policy_sync_phase phase) {
    if (phase != KVS_SYNC_PREFILL) return KVS_OK;
    skv_state *s0 = states[0];
    int d = s0->d, H = n_kv_heads, N = H * d;
    int64_t n = s0->n_pending, lo = s0->pend_lo; /* the compressed positions [lo, n): the window's on such a layer */
    if (n <= 0) return KVS_OK;
    for (int h = 1; h < H; h++)
        if (((const skv_state *)states[h])->pend_lo != lo)
            return kvs_fail(KVS_ERR_STATE, "shadowkv: the KV heads of a layer disagree on the window's first position");
    double *A = calloc((size_t)N * (size_t)N, sizeof *A), *V = malloc((size_t)N * (size_t)N * sizeof *V),
           *w = malloc((size_t)N * sizeof *w), *row = malloc((size_t)N * sizeof *row), *coef = NULL;
    kvs_status st = KVS_OK;
    if (!A || !V || !w || !row) {
        st = kvs_fail(KVS_ERR_NOMEM, "shadowkv: out of memory (Gram matrix %d x %d)", N, N);
        goto done;
    }
    for (int64_t j = lo; j < n; j++) { /* K̂^T K̂ over the concatenated heads */
        for (int h = 0; h < H; h++) {
            const skv_state *sh = states[h];
            for (int a = 0; a < d; a++) row[h * d + a] = sh->kpre[(size_t)j * d + a];
        }
        for (int x = 0; x < N; x++) {
            if (row[x] == 0) continue;
            for (int y = x; y < N; y++) A[(size_t)x * N + y] += row[x] * row[y];
        }
    }
    for (int x = 0; x < N; x++) /* the upper triangle mirrored */
        for (int y = x + 1; y < N; y++) A[(size_t)y * N + x] = A[(size_t)x * N + y];
    if ((st = kvs_sym_eig(A, N, w, V)) != KVS_OK) goto done;
    int full = N < n - lo ? N : (int)(n - lo);
    int r = s0->rank_frac > 0 ? (int)lround(s0->rank_frac * N) : s0->rank_param > 0 ? (int)s0->rank_param : 160;
    if (r < 1) r = 1;
    if (r > full) r = full;
    int lowrank = r < full;
    coef = malloc((size_t)r * sizeof *coef);
    if (!coef) {
        st = kvs_fail(KVS_ERR_NOMEM, "shadowkv: out of memory");
        goto done;
    }
    for (int64_t j = lo; j < n; j++) {
        for (int h = 0; h < H; h++) {
            const skv_state *sh = states[h];
            for (int a = 0; a < d; a++) row[h * d + a] = sh->kpre[(size_t)j * d + a];
        }
        for (int i = 0; i < r; i++) {
            double acc = 0;
            for (int x = 0; x < N; x++) acc += V[(size_t)x * N + i] * row[x];
            coef[i] = acc;
        }
        for (int h = 0; h < H; h++) {
            skv_state *sh = states[h];
            float *pre = sh->krpre + (size_t)j * d, *post = sh->krec + (size_t)j * d;
            for (int b = 0; b < d; b++) {
                double acc = 0;
                if (!lowrank) {
                    acc = row[h * d + b]; /* full rank: the key itself */
                } else {
                    for (int i = 0; i < r; i++) acc += coef[i] * V[(size_t)(h * d + b) * N + i];
                }
                pre[b] = (float)acc;
            }
            memcpy(post, pre, (size_t)d * sizeof *post);
            kvs_rope_apply(post, d, sh->m.rope_layout, j, sh->freq);
        }
    }
    for (int h = 0; h < H; h++) {
        skv_state *sh = states[h];
        sh->rank = r;
        sh->lowrank = lowrank;
        sh->n_sigma = N < SKV_MAX_SIGMA ? N : SKV_MAX_SIGMA;
        for (int i = 0; i < sh->n_sigma; i++) sh->sigma[i] = sqrt(w[i] > 0 ? w[i] : 0);
        build_chunks(sh, lo, n);
    }
done:
    free(A), free(V), free(w), free(row), free(coef);
    return st;
}

static kvs_status skv_select(void *state, const kvs_policy_view *v, kvs_policy_sel *sel) {
    skv_state *s = state;
    int d = s->d;
    s->n_seen = v->n;
    int64_t m_ = 0;
    int32_t *idx = sel->idx[0];
    /* chunk probabilities: softmax per query head over the non-outlier landmarks, max over the group */
    int64_t nc = 0;
    for (int64_t m = 0; m < s->C; m++) {
        int64_t lo, hi;
        chunk_span(s, m, &lo, &hi);
        s->pi[m] = 0;
        s->sel_now[m] = 0;
        if (!s->is_out[m] && hi > s->first) s->order[nc++] = m; /* chunks the window dropped are no candidates */
    }
    s->st_live = nc;
    if (nc > 0 && s->sparse_tokens > 0) {
        for (int g = 0; g < v->group; g++) {
            const float *q = v->q + (size_t)g * d;
            double mx = -INFINITY, sum = 0;
            float *zz = s->vbuf; /* scratch for the logits, overwritten by the fetched values afterwards */
            for (int64_t i = 0; i < nc; i++) {
                double dot = 0;
                const float *l = s->lm + (size_t)s->order[i] * d;
                for (int a = 0; a < d; a++) dot += (double)q[a] * l[a];
                zz[i] = (float)(v->scale * dot);
                if (zz[i] > mx) mx = zz[i];
            }
            for (int64_t i = 0; i < nc; i++) sum += exp((double)zz[i] - mx);
            for (int64_t i = 0; i < nc; i++) {
                double p = exp((double)zz[i] - mx) / sum;
                if (p > s->pi[s->order[i]]) s->pi[s->order[i]] = p;
            }
        }
        qsort_r(s->order, (size_t)nc, sizeof *s->order, cmp_pi, s->pi);
    }
    /* local and outlier tokens: exact (those still in the window) */
    int64_t live_lo = s->cbase > s->first ? s->cbase : s->first;
    for (int64_t j = live_lo; j < s->ncomp; j++)
        if (exact_held(s, j)) idx[m_++] = (int32_t)j;
    /* selected chunks, in score order while their tokens fit the sparse budget */
    int64_t used = 0, chunks = 0, misses = 0, miss_tokens = 0;
    if (s->sparse_tokens > 0)
        for (int64_t i = 0; i < nc; i++) {
            int64_t m = s->order[i], lo, hi;
            chunk_span(s, m, &lo, &hi);
            if (lo < s->first) lo = s->first; /* a chunk across the window's edge: its in-window positions */
            if (used + (hi - lo) > s->sparse_tokens) continue;
            s->sel_now[m] = 1;
            chunks++;
            misses += !s->sel_prev[m];
            miss_tokens += s->sel_prev[m] ? 0 : hi - lo;
            for (int64_t j = lo; j < hi; j++) {
                if (s->lowrank) {
                    float *vb = s->vbuf + (size_t)used * d;
                    memcpy(vb, v->v + (size_t)j * d, (size_t)d * sizeof *vb);
                    sel->row_k[0][m_] = s->krec + (size_t)j * d;
                    sel->row_v[0][m_] = vb;
                }
                idx[m_++] = (int32_t)j;
                used++;
            }
        }
    for (int64_t j = s->ncomp > s->first ? s->ncomp : s->first; j < v->n; j++)
        idx[m_++] = (int32_t)j; /* generated (and later prompts): exact */
    sel->n[0] = m_;
    s->st_exact = m_ - used;
    if (s->first > 0) /* ascending on a sliding-window layer (header): a budget covering the window then attends it in
                       * the reference's order, bit for bit; the merged rows move with their entries */
        for (int64_t i = 1; i < m_; i++)
            for (int64_t j = i; j > 0 && idx[j - 1] > idx[j]; j--) {
                int32_t t = idx[j];
                idx[j] = idx[j - 1], idx[j - 1] = t;
                const float *rk = sel->row_k[0][j], *rv = sel->row_v[0][j];
                sel->row_k[0][j] = sel->row_k[0][j - 1], sel->row_v[0][j] = sel->row_v[0][j - 1];
                sel->row_k[0][j - 1] = rk, sel->row_v[0][j - 1] = rv;
            }
    memcpy(s->sel_prev, s->sel_now, (size_t)s->C);
    s->sel_tokens = used, s->sel_chunks = chunks, s->misses = misses, s->miss_tokens = miss_tokens;
    return KVS_OK;
}

/* Device-resident positions: exact local and outliers, the sparse buffer's chunks, every generated token. */
static int64_t skv_stored(void *state, int g, int32_t *out) {
    skv_state *s = state;
    (void)g;
    int64_t m = 0, live_lo = s->cbase > s->first ? s->cbase : s->first;
    for (int64_t j = live_lo; j < s->ncomp; j++)
        if (exact_held(s, j) || s->sel_prev[(j - s->cbase) / s->c]) out[m++] = (int32_t)j;
    for (int64_t j = s->ncomp > s->first ? s->ncomp : s->first; j < s->n_seen; j++) out[m++] = (int32_t)j;
    return m;
}

/* What the policy may read: the device plus the host, which holds every prompt value (a selected chunk's keys are
 * rebuilt from the policy's own factors, never read from the trace). */
static int64_t skv_readable(void *state, int g, int32_t *out) {
    skv_state *s = state;
    (void)g;
    int64_t m = 0;
    for (int64_t j = s->first; j < s->n_seen; j++) out[m++] = (int32_t)j;
    return m;
}

/* The host's eviction (header "Sliding-window layers"): every part of the state reads `first`. */
static kvs_status skv_window_evict(void *state, int64_t first) {
    skv_state *s = state;
    if (first > s->first) s->first = first;
    return KVS_OK;
}

static void skv_account(void *state, const kvs_policy_view *v, const kvs_policy_sel *sel, kvs_policy_cost *out) {
    skv_state *s = state;
    (void)sel;
    const kvs_policy_model *m = &s->m;
    double d = s->d, eb = m->kv_bytes, r = s->lowrank ? s->rank : 0;
    int64_t live_lo = s->cbase > s->first ? s->cbase : s->first;
    double exact = s->first > 0 ? (double)s->st_exact
                                : (double)(s->ncomp - s->local_lo) + (double)s->out_tokens + (double)(v->n - s->ncomp);
    out->kv_bytes = out->dedup_kv_bytes = kvs_policy_kv_bytes(m, exact + (double)s->sel_tokens);
    double landmarks = d * (double)(s->first > 0 ? s->st_live : s->C - s->n_out);
    double live = (double)(s->ncomp > live_lo ? s->ncomp - live_lo : 0); /* compressed positions still existing */
    double U = live * r / (double)s->Hkv, SV = r * d;
    out->aux_bytes = eb * (landmarks + U + SV) + INDEX_BYTES * (double)s->sel_chunks;
    out->host_bytes = eb * d * live;
    out->read_aux_bytes = out->read_aux_unfused_bytes = eb * (landmarks + r * (double)s->sel_tokens + SV);
    double miss_tokens = (double)s->miss_tokens;
    out->h2d_bytes = eb * d * miss_tokens;
    out->d2h_bytes = s->first_decode ? eb * d * (double)(s->ncomp - s->cbase) : 0;
    out->write_bytes += eb * d * ((s->lowrank ? (double)s->sel_tokens : 0) + miss_tokens);
    out->transient_bytes = INDEX_BYTES * (double)s->C; /* the chunk scores */
    s->first_decode = 0;
}

static int skv_notes(const kvs_policy_config *cfg, const kvs_policy_model *m, int64_t budget, char *buf, size_t cap) {
    int n = 0;
    int64_t c = (int64_t)cfg->v[P_C], local = (int64_t)cfg->v[P_LOCAL] * c + (m->prompt_len > 0 ? m->prompt_len % c : 0);
    int64_t outl = (int64_t)cfg->v[P_OUTLIERS];
    if (outl >= 0 && budget < local + outl * c && budget < m->prompt_len)
        n += kvs_policy_note(buf, cap,
                             "shadowkv budget %lld < local %lld + outliers %lld x %lld: outliers (then local) shrink "
                             "to fit and the sparse budget is what is left",
                             (long long)budget, (long long)local, (long long)outl, (long long)c);
    if (cfg->v[P_RANK] == 0 && cfg->v[P_RANKF] == 0 && m->n_kv_heads * m->head_dim <= 160)
        n += kvs_policy_note(buf, cap,
                             "shadowkv rank min(160, Hkv*d = %d): full rank, the keys are not compressed "
                             "(rank_frac=0.15625 scales the reference's ratio)",
                             (int)(m->n_kv_heads * m->head_dim));
    return n;
}

const struct kvs_policy_ops kvs_policy_shadowkv = {
    .version = KVS_POLICY_INTERFACE_VERSION,
    .name = "shadowkv",
    .summary = "ShadowKV: low-rank pre-RoPE keys and host-offloaded values; per step the chunks whose landmarks score "
               "best are rebuilt and fetched, plus exact local and outlier chunks and every generated token",
    .is_oracle = 0,
    .granularity = KVS_SEL_PER_KV_HEAD,
    .budget_scope = KVS_BUDGET_PROMPT,
    .params = skv_params,
    .n_params = (int)(sizeof skv_params / sizeof skv_params[0]),
    .presets = skv_presets,
    .n_presets = (int)(sizeof skv_presets / sizeof skv_presets[0]),
    .validate = skv_validate,
    .notes = skv_notes,
    .create = skv_create,
    .free = skv_free,
    .prefill = skv_prefill,
    .select = skv_select,
    .layer_sync = skv_layer_sync,
    .stored = skv_stored,
    .readable = skv_readable,
    .account = skv_account,
    .window_evict = skv_window_evict,
};
