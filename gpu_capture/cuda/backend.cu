/* backend.cu — the CUDA capture backend (gpu_capture/cuda_backend.h): weight upload, the batched forward
 * pass on one GPU (cuBLAS GEMMs + kernels.cu), and the asynchronous recording pipeline into the trace
 * writer. The forward pass is gpu_capture/model.c `kvs_model_forward` step for step (which follows
 * llama2.c run.c `forward`), over up to KVS_CUDA_CHUNK positions at once.
 *
 * Record layout (device slots and the pinned host ring alike): per position, per layer, rec_stride floats
 *   [q: n_heads*head_dim][k: kv_dim][v: kv_dim][o: n_heads*head_dim][lse: n_heads]
 * so one position is pos_stride = n_layers * rec_stride floats and the arguments of
 * kvs_trace_writer_put_layer are plain pointers into it. A chunk of n positions is contiguous in its device
 * slot and goes to the host with one cudaMemcpyAsync (two when it wraps around the ring).
 *
 * Ordering (streams and events):
 *   compute stream: [wait rec_free[s]] forward writes slot s ... [record computed[s]]
 *   copy stream:    [wait computed[s]] memcpy slot s -> ring [record rec_free[s]] [record unit event]
 *   writer thread:  cudaEventSynchronize(unit event) -> begin_position / put_layer x L / end_position ->
 *                   release the ring positions (condition variable wakes a producer waiting for space).
 * Slot s is written again two chunks later only after rec_free[s] (its copy finished), so the compute of
 * chunk t+1 overlaps the copy of chunk t; the ring is reused only after the writer has consumed it.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_check.cuh"
#include "kernels.cuh"
#include "../model_weights.h"

extern "C" {
#include "../cuda_backend.h"
}

#define QUEUE_CAP 64                      /* chunks in flight between the decoder and the writer thread */
#define RING_TARGET_BYTES (128u << 20)    /* pinned host ring size aimed at */
#define RING_MAX_POSITIONS 4096

typedef struct {
    float *rms_att, *rms_ffn;   /* [dim] fp32 */
    void *wqkv;                 /* [q_dim + 2 kv_dim][dim] in wdt: wq, wk, wv stacked */
    void *wo;                   /* [dim][q_dim] */
    void *w13;                  /* [2 hidden][dim]: gate (w1) then up (w3) */
    void *w2;                   /* [dim][hidden] */
    float *bq, *bk, *bv, *bo;   /* fp32 or NULL */
} dev_layer;

typedef struct {
    int start, n;               /* ring positions [start, start + n) mod ring_cap */
    int32_t tok[KVS_CUDA_CHUNK];
    kvs_role role;
    int32_t turn;
    cudaEvent_t ev;             /* recorded on the copy stream after the chunk's memcpy */
} unit;

struct kvs_cuda_backend {
    const kvs_model *m;
    kvs_model_config c;
    kvs_dtype wdt;
    size_t wsz;                 /* bytes per weight element */
    int max_pos, dev;
    int qd, kvd, qkvd;
    cudaStream_t comp, copy;
    cublasHandle_t blas;
    /* weights */
    void *embed, *cls;          /* [vocab][dim] in wdt; cls == embed when tied */
    float *rms_final, *inv_freq;
    dev_layer *layers;          /* host array [n_layers] of device pointers */
    /* KV cache [n_layers][max_pos][kv_dim] fp32 */
    float *kc, *vc;
    /* activations for up to KVS_CUDA_CHUNK rows */
    float *x, *qkv, *q, *o, *lse, *tmp, *gu, *logits;
    void *act;                  /* [CHUNK][max(dim, q_dim, hidden)] in wdt */
    float *h_logits;            /* pinned [vocab] */
    /* records */
    int64_t rec_stride, pos_stride; /* floats */
    int32_t off_q, off_k, off_v, off_o, off_lse;
    float *rec[2];              /* device slots [CHUNK][pos_stride] */
    cudaEvent_t rec_free[2], computed[2];
    int slot;
    int last_slot, last_pos0, last_n;
    int next_pos, failed;
    /* recording pipeline (w != NULL) */
    kvs_trace_writer *w;
    float *ring;                /* pinned [ring_cap][pos_stride] */
    int ring_cap, ring_head, ring_used;
    unit queue[QUEUE_CAP];
    int q_head, q_count, n_events;
    pthread_t thread;
    int thread_started, stop;
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_space;
    int sync_ready;
    kvs_status werr;            /* first error of the writer thread */
    char werr_msg[1024];
};

/* ================================================================================================
 * Probe
 * ============================================================================================== */

/* Device 0 usable? Fills props. NO_DEVICE / UNSUPPORTED otherwise. */
static kvs_status probe_device(cudaDeviceProp *p) {
    kvs_status st = KVS_OK;
    int n = 0;
    CU_TRY(cudaGetDeviceCount(&n));
    if (n < 1) return kvs_cuda_status(cudaErrorNoDevice, "cudaGetDeviceCount", __FILE__, __LINE__);
    CU_TRY(cudaGetDeviceProperties(p, 0));
    /* the binary holds sm_80 and sm_90 code and compute_90 PTX: 8.x runs the sm_80 code, 9.0 the sm_90 code,
     * later architectures JIT the PTX; anything older than 8.0 has no code it can run */
    if (p->major < 8)
        return kvs_fail(KVS_ERR_UNSUPPORTED, "CUDA device 0 (%s) has compute capability %d.%d; this build needs 8.0 or "
                        "newer (built for sm_80, sm_90)", p->name, p->major, p->minor);
cleanup:
    return st;
}

extern "C" kvs_status kvs_cuda_probe(char *desc, size_t n) {
    cudaDeviceProp p;
    if (desc && n) desc[0] = '\0';
    kvs_status st = probe_device(&p);
    if (st != KVS_OK) return st;
    if (desc && n)
        snprintf(desc, n, "%s, compute capability %d.%d, %d SMs, %.1f GiB", p.name, p.major, p.minor,
                 p.multiProcessorCount, (double)p.totalGlobalMem / (1024.0 * 1024.0 * 1024.0));
    return KVS_OK;
}

/* ================================================================================================
 * Writer thread
 * ============================================================================================== */

static void *writer_main(void *arg) {
    kvs_cuda_backend *b = (kvs_cuda_backend *)arg;
    cudaError_t ce = cudaSetDevice(b->dev);
    pthread_mutex_lock(&b->mu);
    if (ce != cudaSuccess && b->werr == KVS_OK) {
        b->werr = kvs_cuda_status(ce, "cudaSetDevice (writer thread)", __FILE__, __LINE__);
        snprintf(b->werr_msg, sizeof b->werr_msg, "%s", kvs_last_error());
    }
    for (;;) {
        while (b->q_count == 0 && !b->stop) pthread_cond_wait(&b->cv_work, &b->mu);
        if (b->stop) break; /* free() without finish(): pending chunks are abandoned */
        unit *u = &b->queue[b->q_head];
        int have_err = b->werr != KVS_OK;
        pthread_mutex_unlock(&b->mu);

        /* Always wait for the copy, even after an error: the ring positions are released below and must not
         * be overwritten by a later copy while this one is still landing. */
        kvs_status s = KVS_OK;
        ce = cudaEventSynchronize(u->ev);
        if (ce != cudaSuccess) s = kvs_cuda_status(ce, "cudaEventSynchronize (writer thread)", __FILE__, __LINE__);
        for (int i = 0; s == KVS_OK && !have_err && i < u->n; i++) {
            const float *p = b->ring + (size_t)((u->start + i) % b->ring_cap) * (size_t)b->pos_stride;
            s = kvs_trace_writer_begin_position(b->w, u->tok[i], u->role, u->turn);
            for (int l = 0; s == KVS_OK && l < b->c.n_layers; l++) {
                const float *r = p + (size_t)l * (size_t)b->rec_stride;
                s = kvs_trace_writer_put_layer(b->w, l, r + b->off_q, r + b->off_k, r + b->off_v, r + b->off_o,
                                               r + b->off_lse);
            }
            if (s == KVS_OK) s = kvs_trace_writer_end_position(b->w);
        }

        pthread_mutex_lock(&b->mu);
        if (s != KVS_OK && b->werr == KVS_OK) {
            b->werr = s;
            snprintf(b->werr_msg, sizeof b->werr_msg, "%s", kvs_last_error());
        }
        b->ring_used -= u->n;
        b->q_head = (b->q_head + 1) % QUEUE_CAP;
        b->q_count--;
        pthread_cond_broadcast(&b->cv_space);
    }
    pthread_mutex_unlock(&b->mu);
    return NULL;
}

/* The writer thread's first error, re-issued in the calling thread (KVS_OK when none). Caller holds mu. */
static kvs_status writer_error_locked(kvs_cuda_backend *b) {
    if (b->werr == KVS_OK) return KVS_OK;
    return kvs_fail(b->werr, "trace writer thread: %s", b->werr_msg);
}

/* ================================================================================================
 * Create / free
 * ============================================================================================== */

extern "C" void kvs_cuda_backend_free(kvs_cuda_backend *b) {
    if (!b) return;
    if (b->thread_started) {
        pthread_mutex_lock(&b->mu);
        b->stop = 1;
        pthread_cond_broadcast(&b->cv_work);
        pthread_mutex_unlock(&b->mu);
        pthread_join(b->thread, NULL);
    }
    /* no DMA may still target memory freed below; errors are ignored here (the device may be gone) */
    if (b->comp) cudaStreamSynchronize(b->comp);
    if (b->copy) cudaStreamSynchronize(b->copy);
    for (int i = 0; i < b->n_events; i++) cudaEventDestroy(b->queue[i].ev);
    for (int s = 0; s < 2; s++) {
        if (b->rec_free[s]) cudaEventDestroy(b->rec_free[s]);
        if (b->computed[s]) cudaEventDestroy(b->computed[s]);
        cudaFree(b->rec[s]);
    }
    if (b->layers) {
        for (int l = 0; l < b->c.n_layers; l++) {
            dev_layer *d = &b->layers[l];
            cudaFree(d->rms_att);
            cudaFree(d->rms_ffn);
            cudaFree(d->wqkv);
            cudaFree(d->wo);
            cudaFree(d->w13);
            cudaFree(d->w2);
            cudaFree(d->bq);
            cudaFree(d->bk);
            cudaFree(d->bv);
            cudaFree(d->bo);
        }
        free(b->layers);
    }
    if (b->cls != b->embed) cudaFree(b->cls);
    cudaFree(b->embed);
    cudaFree(b->rms_final);
    cudaFree(b->inv_freq);
    cudaFree(b->kc);
    cudaFree(b->vc);
    cudaFree(b->x);
    cudaFree(b->qkv);
    cudaFree(b->q);
    cudaFree(b->o);
    cudaFree(b->lse);
    cudaFree(b->tmp);
    cudaFree(b->gu);
    cudaFree(b->logits);
    cudaFree(b->act);
    cudaFreeHost(b->h_logits);
    cudaFreeHost(b->ring);
    if (b->blas) cublasDestroy(b->blas);
    if (b->comp) cudaStreamDestroy(b->comp);
    if (b->copy) cudaStreamDestroy(b->copy);
    if (b->sync_ready) {
        pthread_mutex_destroy(&b->mu);
        pthread_cond_destroy(&b->cv_work);
        pthread_cond_destroy(&b->cv_space);
    }
    free(b);
}

/* Uploads `count` fp32 values as fp32 (for norms, biases, frequencies) into a new device buffer. */
static kvs_status upload_f32(const float *src, size_t count, float **dst) {
    kvs_status st = KVS_OK;
    *dst = NULL;
    if (!src) return KVS_OK;
    CU_TRY(cudaMalloc((void **)dst, count * sizeof(float)));
    CU_TRY(cudaMemcpy(*dst, src, count * sizeof(float), cudaMemcpyHostToDevice));
cleanup:
    return st;
}

/* Uploads up to three row-major matrices stacked vertically ([rows_i][cols] each) as one [sum rows][cols]
 * matrix in the weight dtype, through the host staging buffer. A matrix stored in the weight dtype is copied as
 * is; one in another dtype (an fp32 lm_head beside bf16 layers: the weight dtype is then fp32) is widened to fp32
 * a row at a time and encoded, so no fp32 copy of a whole matrix is ever made. */
static kvs_status upload_stack(kvs_cuda_backend *b, const kvs_wmat *src, const size_t *rows, int n_src, size_t cols,
                               void *staging, void **dst) {
    kvs_status st = KVS_OK;
    size_t total = 0;
    for (int i = 0; i < n_src; i++) total += rows[i] * cols;
    *dst = NULL;
    CU_TRY(cudaMalloc(dst, total * b->wsz));
    {
        size_t off = 0;
        float *row = NULL;
        for (int i = 0; i < n_src; i++) {
            if (src[i].dtype == b->wdt) {
                memcpy((uint8_t *)staging + off * b->wsz, src[i].data, rows[i] * cols * b->wsz);
            } else {
                if (!row && !(row = (float *)malloc(cols * sizeof(float)))) {
                    st = kvs_fail(KVS_ERR_NOMEM, "cuda backend: out of host memory");
                    goto cleanup;
                }
                for (size_t r = 0; r < rows[i]; r++) {
                    kvs_wmat_row_f32(src[i], cols, r, row);
                    kvs_encode(b->wdt, row, cols, (uint8_t *)staging + (off + r * cols) * b->wsz);
                }
            }
            off += rows[i] * cols;
        }
        free(row);
    }
    CU_TRY(cudaMemcpy(*dst, staging, total * b->wsz, cudaMemcpyHostToDevice));
cleanup:
    return st;
}

extern "C" kvs_status kvs_cuda_backend_create(const kvs_model *m, int max_positions, kvs_trace_writer *w,
                                              kvs_cuda_backend **out) {
    kvs_status st = KVS_OK;
    kvs_cuda_backend *b = NULL;
    void *staging = NULL;
    *out = NULL;
    const kvs_model_info *info = kvs_model_info_get(m);
    const kvs_model_config *c = &info->config;
    if (max_positions < 1 || max_positions > c->max_seq_len)
        return kvs_fail(KVS_ERR_INVALID_ARG, "max positions %d is outside [1, %d] (the model context)", max_positions,
                        c->max_seq_len);
    if (c->head_dim < 2 || c->head_dim % 2 || c->head_dim > KVS_CUDA_MAX_HEAD_DIM || c->n_heads > 1024 ||
        c->n_kv_heads < 1 || c->n_heads % c->n_kv_heads)
        return kvs_fail(KVS_ERR_UNSUPPORTED, "%s: head_dim %d / n_heads %d / n_kv_heads %d: the CUDA backend needs an "
                        "even head_dim <= %d and at most 1024 heads", c->model_name, c->head_dim, c->n_heads,
                        c->n_kv_heads, KVS_CUDA_MAX_HEAD_DIM);
    /* The kernels implement the Llama-family layer only: the Qwen3 / Gemma-3 steps (model.h) run on the CPU. */
    if (info->qk_norm || info->sandwich_norm || info->gelu_tanh || info->embed_scale != 1.0f || info->final_softcap > 0 ||
        info->query_pre_attn_scalar > 0 || info->rope_linear_factor > 1 || info->rope_local_theta > 0 ||
        kvs_model_config_has_windows(c))
        return kvs_fail(KVS_ERR_UNSUPPORTED, "%s (%s): the CUDA backend runs the Llama-family forward pass only (no q/k "
                        "norms, Gemma norms, GeGLU, scaled embedding, soft-capping, linear RoPE scaling or sliding "
                        "windows); capture it with --device cpu", c->model_name, info->architecture);
    cudaDeviceProp props;
    if ((st = probe_device(&props)) != KVS_OK) return st;
    kvs_model_weights mw;
    if ((st = kvs_model_weights_get(m, &mw)) != KVS_OK) return st;

    b = (kvs_cuda_backend *)calloc(1, sizeof *b);
    if (!b) return kvs_fail(KVS_ERR_NOMEM, "cuda backend: out of memory");
    b->m = m;
    b->c = *c;
    b->wdt = info->weight_dtype;
    b->wsz = kvs_dtype_size(b->wdt);
    b->max_pos = max_positions;
    b->dev = 0;
    b->qd = c->n_heads * c->head_dim;
    b->kvd = c->n_kv_heads * c->head_dim;
    b->qkvd = b->qd + 2 * b->kvd;
    b->last_n = 0;
    b->w = w;
    {
        size_t d = (size_t)c->dim, V = (size_t)c->vocab_size, hid = (size_t)c->hidden_dim, L = (size_t)c->n_layers;
        size_t qd = (size_t)b->qd, kvd = (size_t)b->kvd, C = KVS_CUDA_CHUNK;
        CU_TRY(cudaSetDevice(b->dev));
        CU_TRY(cudaStreamCreateWithFlags(&b->comp, cudaStreamNonBlocking));
        CU_TRY(cudaStreamCreateWithFlags(&b->copy, cudaStreamNonBlocking));
        CU_TRY(cublasCreate(&b->blas));
        CU_TRY(cublasSetStream(b->blas, b->comp));

        /* staging for the largest stacked upload */
        size_t stage = V * d;
        if ((qd + 2 * kvd) * d > stage) stage = (qd + 2 * kvd) * d;
        if (2 * hid * d > stage) stage = 2 * hid * d;
        if (d * qd > stage) stage = d * qd;
        if (d * hid > stage) stage = d * hid;
        staging = malloc(stage * b->wsz);
        if (!staging) {
            st = kvs_fail(KVS_ERR_NOMEM, "cuda backend: out of host memory for a %zu MB upload buffer", stage * b->wsz >> 20);
            goto cleanup;
        }

        /* weights */
        size_t vrows[1] = {V};
        KVS_TRY(st = upload_stack(b, &mw.embed, vrows, 1, d, staging, &b->embed));
        if (mw.cls.data == mw.embed.data) b->cls = b->embed;
        else KVS_TRY(st = upload_stack(b, &mw.cls, vrows, 1, d, staging, &b->cls));
        KVS_TRY(st = upload_f32(mw.rms_final, d, &b->rms_final));
        KVS_TRY(st = upload_f32(mw.inv_freq, (size_t)c->head_dim / 2, &b->inv_freq));
        b->layers = (dev_layer *)calloc(L, sizeof *b->layers);
        if (!b->layers) {
            st = kvs_fail(KVS_ERR_NOMEM, "cuda backend: out of memory");
            goto cleanup;
        }
        for (int l = 0; l < c->n_layers; l++) {
            kvs_model_layer_weights lw;
            dev_layer *dl = &b->layers[l];
            KVS_TRY(st = kvs_model_layer_weights_get(m, l, &lw));
            KVS_TRY(st = upload_f32(lw.rms_att, d, &dl->rms_att));
            KVS_TRY(st = upload_f32(lw.rms_ffn, d, &dl->rms_ffn));
            const kvs_wmat qkv_src[3] = {lw.wq, lw.wk, lw.wv};
            size_t qkv_rows[3] = {qd, kvd, kvd};
            KVS_TRY(st = upload_stack(b, qkv_src, qkv_rows, 3, d, staging, &dl->wqkv));
            size_t drows[1] = {d};
            KVS_TRY(st = upload_stack(b, &lw.wo, drows, 1, qd, staging, &dl->wo));
            const kvs_wmat gu_src[2] = {lw.w1, lw.w3};
            size_t gu_rows[2] = {hid, hid};
            KVS_TRY(st = upload_stack(b, gu_src, gu_rows, 2, d, staging, &dl->w13));
            KVS_TRY(st = upload_stack(b, &lw.w2, drows, 1, hid, staging, &dl->w2));
            KVS_TRY(st = upload_f32(lw.bq, qd, &dl->bq));
            KVS_TRY(st = upload_f32(lw.bk, kvd, &dl->bk));
            KVS_TRY(st = upload_f32(lw.bv, kvd, &dl->bv));
            KVS_TRY(st = upload_f32(lw.bo, d, &dl->bo));
        }

        /* KV cache, activations */
        size_t cache = L * (size_t)max_positions * kvd;
        CU_TRY(cudaMalloc((void **)&b->kc, cache * sizeof(float)));
        CU_TRY(cudaMalloc((void **)&b->vc, cache * sizeof(float)));
        CU_TRY(cudaMemset(b->kc, 0, cache * sizeof(float)));
        CU_TRY(cudaMemset(b->vc, 0, cache * sizeof(float)));
        size_t act_w = d;
        if (qd > act_w) act_w = qd;
        if (hid > act_w) act_w = hid;
        CU_TRY(cudaMalloc((void **)&b->x, C * d * sizeof(float)));
        CU_TRY(cudaMalloc((void **)&b->qkv, C * (qd + 2 * kvd) * sizeof(float)));
        CU_TRY(cudaMalloc((void **)&b->q, C * qd * sizeof(float)));
        CU_TRY(cudaMalloc((void **)&b->o, C * qd * sizeof(float)));
        CU_TRY(cudaMalloc((void **)&b->lse, C * (size_t)c->n_heads * sizeof(float)));
        CU_TRY(cudaMalloc((void **)&b->tmp, C * d * sizeof(float)));
        CU_TRY(cudaMalloc((void **)&b->gu, C * 2 * hid * sizeof(float)));
        CU_TRY(cudaMalloc((void **)&b->logits, V * sizeof(float)));
        CU_TRY(cudaMalloc(&b->act, C * act_w * b->wsz));
        CU_TRY(cudaMallocHost((void **)&b->h_logits, V * sizeof(float)));

        /* records */
        b->off_q = 0;
        b->off_k = (int32_t)qd;
        b->off_v = (int32_t)(qd + kvd);
        b->off_o = (int32_t)(qd + 2 * kvd);
        b->off_lse = (int32_t)(2 * qd + 2 * kvd);
        b->rec_stride = (int64_t)(2 * qd + 2 * kvd + (size_t)c->n_heads);
        b->pos_stride = b->rec_stride * (int64_t)L;
        for (int s = 0; s < 2; s++) {
            CU_TRY(cudaMalloc((void **)&b->rec[s], C * (size_t)b->pos_stride * sizeof(float)));
            CU_TRY(cudaEventCreateWithFlags(&b->rec_free[s], cudaEventDisableTiming));
            CU_TRY(cudaEventCreateWithFlags(&b->computed[s], cudaEventDisableTiming));
        }
    }

    /* the cache memsets ran on the legacy stream, which the non-blocking compute stream does not wait for */
    CU_TRY(cudaDeviceSynchronize());

    if (w) {
        size_t pos_bytes = (size_t)b->pos_stride * sizeof(float);
        size_t cap = RING_TARGET_BYTES / pos_bytes;
        if (cap < 2 * KVS_CUDA_CHUNK) cap = 2 * KVS_CUDA_CHUNK; /* a chunk always fits, with room to overlap */
        if (cap > RING_MAX_POSITIONS) cap = RING_MAX_POSITIONS;
        /* test/bench knob: a small ring makes the wrap-around and back-pressure paths run on tiny models */
        const char *env = getenv("KVSIM_CUDA_RING_POSITIONS");
        if (env && atoi(env) > 0) cap = (size_t)atoi(env) < 2 * KVS_CUDA_CHUNK ? 2 * KVS_CUDA_CHUNK : (size_t)atoi(env);
        b->ring_cap = (int)cap;
        CU_TRY(cudaMallocHost((void **)&b->ring, cap * pos_bytes));
        for (int i = 0; i < QUEUE_CAP; i++) {
            /* blocking sync: the writer thread sleeps instead of spinning on a core the decoder needs */
            CU_TRY(cudaEventCreateWithFlags(&b->queue[i].ev, cudaEventDisableTiming | cudaEventBlockingSync));
            b->n_events = i + 1;
        }
        if (pthread_mutex_init(&b->mu, NULL) || pthread_cond_init(&b->cv_work, NULL) ||
            pthread_cond_init(&b->cv_space, NULL)) {
            st = kvs_fail(KVS_ERR_NOMEM, "cuda backend: cannot create the writer thread's mutex");
            goto cleanup;
        }
        b->sync_ready = 1;
        if (pthread_create(&b->thread, NULL, writer_main, b)) {
            st = kvs_fail(KVS_ERR_NOMEM, "cuda backend: cannot start the writer thread");
            goto cleanup;
        }
        b->thread_started = 1;
    }
    *out = b;
    b = NULL;
cleanup:
    free(staging);
    kvs_cuda_backend_free(b);
    return st;
}

/* ================================================================================================
 * Forward
 * ============================================================================================== */

/* Waits (host) for room for n positions in the ring and a queue entry. Caller holds mu. */
static kvs_status wait_space_locked(kvs_cuda_backend *b, int n) {
    while ((b->ring_cap - b->ring_used < n || b->q_count == QUEUE_CAP) && b->werr == KVS_OK)
        pthread_cond_wait(&b->cv_space, &b->mu);
    return writer_error_locked(b);
}

/* Hands the chunk in device slot s (positions pos0..pos0+n-1) to the copy stream and the writer thread. */
static kvs_status enqueue_record(kvs_cuda_backend *b, int s, const int32_t *tokens, int n, kvs_role role, int32_t turn) {
    kvs_status st = KVS_OK;
    pthread_mutex_lock(&b->mu);
    st = wait_space_locked(b, n);
    if (st != KVS_OK) {
        pthread_mutex_unlock(&b->mu);
        return st;
    }
    int start = b->ring_head;
    int qi = (b->q_head + b->q_count) % QUEUE_CAP;
    pthread_mutex_unlock(&b->mu);
    /* only this thread advances ring_head and fills queue[qi]: both are ours until published below */
    unit *u = &b->queue[qi];
    {
        size_t pos_bytes = (size_t)b->pos_stride * sizeof(float);
        int first = n < b->ring_cap - start ? n : b->ring_cap - start; /* positions before the wrap */
        CU_TRY(cudaEventRecord(b->computed[s], b->comp));
        CU_TRY(cudaStreamWaitEvent(b->copy, b->computed[s], 0));
        CU_TRY(cudaMemcpyAsync((uint8_t *)b->ring + (size_t)start * pos_bytes, b->rec[s], (size_t)first * pos_bytes,
                               cudaMemcpyDeviceToHost, b->copy));
        if (first < n)
            CU_TRY(cudaMemcpyAsync(b->ring, (uint8_t *)b->rec[s] + (size_t)first * pos_bytes,
                                   (size_t)(n - first) * pos_bytes, cudaMemcpyDeviceToHost, b->copy));
        CU_TRY(cudaEventRecord(b->rec_free[s], b->copy));
        CU_TRY(cudaEventRecord(u->ev, b->copy));
        u->start = start;
        u->n = n;
        memcpy(u->tok, tokens, (size_t)n * sizeof *tokens);
        u->role = role;
        u->turn = turn;
    }
    pthread_mutex_lock(&b->mu);
    b->ring_head = (start + n) % b->ring_cap;
    b->ring_used += n;
    b->q_count++;
    pthread_cond_signal(&b->cv_work);
    pthread_mutex_unlock(&b->mu);
cleanup:
    return st;
}

/* Forwards n <= KVS_CUDA_CHUNK positions pos0.. through every layer; want_logits: also the classifier on
 * the last row, copied to h_logits (synchronously). */
static kvs_status forward_chunk(kvs_cuda_backend *b, const int32_t *tokens, int n, int pos0, kvs_role role, int32_t turn,
                                int want_logits) {
    kvs_status st = KVS_OK;
    const kvs_model_config *c = &b->c;
    int d = c->dim, hid = c->hidden_dim, H = c->n_heads, Hkv = c->n_kv_heads, hd = c->head_dim;
    int s = b->slot;
    kvs_cuda_tokens tok;
    memset(&tok, 0, sizeof tok);
    memcpy(tok.ids, tokens, (size_t)n * sizeof *tokens);
    b->slot ^= 1;
    /* slot s may still be being copied out for the chunk two calls ago */
    if (b->w) CU_TRY(cudaStreamWaitEvent(b->comp, b->rec_free[s], 0));
    KVS_TRY(st = kvs_cuda_embed(b->comp, b->wdt, b->embed, d, &tok, n, b->x));
    for (int l = 0; l < c->n_layers; l++) {
        const dev_layer *L = &b->layers[l];
        size_t cache_off = (size_t)l * (size_t)b->max_pos * (size_t)b->kvd;
        kvs_cuda_rec rec = {b->rec[s] + (size_t)l * (size_t)b->rec_stride, b->pos_stride, b->off_q, b->off_k,
                            b->off_v, b->off_o, b->off_lse};
        KVS_TRY(st = kvs_cuda_rmsnorm(b->comp, b->wdt, b->x, L->rms_att, n, d, c->norm_eps, b->act));
        KVS_TRY(st = kvs_cuda_gemm(b->blas, b->wdt, L->wqkv, b->act, b->qkv, n, b->qkvd, d, 0.0f));
        KVS_TRY(st = kvs_cuda_qkv_rope(b->comp, b->qkv, L->bq, L->bk, L->bv, b->inv_freq, c->rope_layout, n, pos0, H, Hkv,
                                       hd, b->q, b->kc + cache_off, b->vc + cache_off, rec));
        KVS_TRY(st = kvs_cuda_attention(b->comp, b->q, b->kc + cache_off, b->vc + cache_off, n, pos0, H, Hkv, hd,
                                        c->attn_scale, 0, b->o, b->lse, rec));
        const void *o_in = b->o;
        if (b->wdt != KVS_DTYPE_F32) {
            KVS_TRY(st = kvs_cuda_convert(b->comp, b->wdt, b->o, (int64_t)n * b->qd, b->act));
            o_in = b->act;
        }
        KVS_TRY(st = kvs_cuda_gemm(b->blas, b->wdt, L->wo, o_in, b->tmp, n, d, b->qd, 0.0f));
        KVS_TRY(st = kvs_cuda_residual_add(b->comp, b->x, b->tmp, L->bo, n, d));
        KVS_TRY(st = kvs_cuda_rmsnorm(b->comp, b->wdt, b->x, L->rms_ffn, n, d, c->norm_eps, b->act));
        KVS_TRY(st = kvs_cuda_gemm(b->blas, b->wdt, L->w13, b->act, b->gu, n, 2 * hid, d, 0.0f));
        KVS_TRY(st = kvs_cuda_swiglu(b->comp, b->wdt, b->gu, n, hid, b->act));
        KVS_TRY(st = kvs_cuda_gemm(b->blas, b->wdt, L->w2, b->act, b->tmp, n, d, hid, 0.0f));
        KVS_TRY(st = kvs_cuda_residual_add(b->comp, b->x, b->tmp, NULL, n, d));
    }
    b->last_slot = s;
    b->last_pos0 = pos0;
    b->last_n = n;
    if (b->w) KVS_TRY(st = enqueue_record(b, s, tokens, n, role, turn));
    if (want_logits) {
        KVS_TRY(st = kvs_cuda_rmsnorm(b->comp, b->wdt, b->x + (size_t)(n - 1) * d, b->rms_final, 1, d, c->norm_eps, b->act));
        KVS_TRY(st = kvs_cuda_gemm(b->blas, b->wdt, b->cls, b->act, b->logits, 1, c->vocab_size, d, 0.0f));
        CU_TRY(cudaMemcpyAsync(b->h_logits, b->logits, (size_t)c->vocab_size * sizeof(float), cudaMemcpyDeviceToHost,
                               b->comp));
        CU_TRY(cudaStreamSynchronize(b->comp));
    }
cleanup:
    return st;
}

/* Checks shared by prefill and step; KVS_OK when the call may proceed. */
static kvs_status check_call(kvs_cuda_backend *b, const int32_t *tokens, int n, int pos0) {
    if (!b) return kvs_fail(KVS_ERR_INVALID_ARG, "cuda backend: NULL backend");
    if (b->failed) return kvs_fail(KVS_ERR_STATE, "cuda backend: an earlier call failed; the decoding state is lost");
    if (n < 1 || !tokens) return kvs_fail(KVS_ERR_INVALID_ARG, "cuda backend: %d tokens to forward", n);
    if (pos0 != b->next_pos)
        return kvs_fail(KVS_ERR_STATE, "cuda backend: position %d fed, expected %d (positions go 0, 1, 2, ...)", pos0,
                        b->next_pos);
    if (pos0 < 0 || (int64_t)pos0 + n > b->max_pos)
        return kvs_fail(KVS_ERR_RANGE, "cuda backend: positions %d..%lld are outside [0, %d)", pos0,
                        (long long)pos0 + n - 1, b->max_pos);
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= b->c.vocab_size)
            return kvs_fail(KVS_ERR_RANGE, "token id %d is outside the vocabulary [0, %d)", tokens[i], b->c.vocab_size);
    if (b->w) {
        pthread_mutex_lock(&b->mu);
        kvs_status s = writer_error_locked(b);
        pthread_mutex_unlock(&b->mu);
        if (s != KVS_OK) return s;
    }
    return KVS_OK;
}

extern "C" kvs_status kvs_cuda_backend_prefill(kvs_cuda_backend *b, const int32_t *tokens, int n, int pos0,
                                               kvs_role role, int32_t turn, const float **last_logits) {
    if (last_logits) *last_logits = NULL;
    kvs_status st = check_call(b, tokens, n, pos0);
    if (st != KVS_OK) return st;
    for (int done = 0; done < n;) {
        int k = n - done < KVS_CUDA_CHUNK ? n - done : KVS_CUDA_CHUNK;
        st = forward_chunk(b, tokens + done, k, pos0 + done, role, turn, done + k == n);
        if (st != KVS_OK) {
            b->failed = 1;
            return st;
        }
        done += k;
        b->next_pos = pos0 + done;
    }
    if (last_logits) *last_logits = b->h_logits;
    return KVS_OK;
}

extern "C" kvs_status kvs_cuda_backend_step(kvs_cuda_backend *b, int32_t token, int pos, kvs_role role, int32_t turn,
                                            const float **logits) {
    return kvs_cuda_backend_prefill(b, &token, 1, pos, role, turn, logits);
}

extern "C" kvs_status kvs_cuda_backend_finish(kvs_cuda_backend *b) {
    kvs_status st = KVS_OK;
    if (!b) return kvs_fail(KVS_ERR_INVALID_ARG, "cuda backend: NULL backend");
    CU_TRY(cudaStreamSynchronize(b->comp));
    if (b->w) {
        pthread_mutex_lock(&b->mu);
        while (b->q_count > 0) pthread_cond_wait(&b->cv_space, &b->mu);
        st = writer_error_locked(b);
        pthread_mutex_unlock(&b->mu);
    }
cleanup:
    return st;
}

extern "C" kvs_status kvs_cuda_backend_layer(kvs_cuda_backend *b, int layer, int pos, float *q, float *k, float *v,
                                             float *o, float *lse) {
    kvs_status st = KVS_OK;
    if (!b) return kvs_fail(KVS_ERR_INVALID_ARG, "cuda backend: NULL backend");
    if (layer < 0 || layer >= b->c.n_layers)
        return kvs_fail(KVS_ERR_RANGE, "layer %d is outside [0, %d)", layer, b->c.n_layers);
    if (b->last_n == 0 || pos < b->last_pos0 || pos >= b->last_pos0 + b->last_n)
        return kvs_fail(KVS_ERR_RANGE, "position %d was not forwarded by the last call (positions %d..%d)", pos,
                        b->last_pos0, b->last_pos0 + b->last_n - 1);
    {
        const float *r = b->rec[b->last_slot] + (size_t)(pos - b->last_pos0) * (size_t)b->pos_stride +
                         (size_t)layer * (size_t)b->rec_stride;
        struct {
            float *dst;
            int32_t off;
            int count;
        } parts[5] = {{q, b->off_q, b->qd}, {k, b->off_k, b->kvd}, {v, b->off_v, b->kvd}, {o, b->off_o, b->qd},
                      {lse, b->off_lse, b->c.n_heads}};
        CU_TRY(cudaStreamSynchronize(b->comp));
        for (int i = 0; i < 5; i++)
            if (parts[i].dst)
                CU_TRY(cudaMemcpy(parts[i].dst, r + parts[i].off, (size_t)parts[i].count * sizeof(float),
                                  cudaMemcpyDeviceToHost));
    }
cleanup:
    return st;
}
