/* cuda_absent.c — the CUDA backend API (gpu_capture/cuda_backend.h) in builds without CUDA (the default
 * `make`): every entry point exists, so callers need no #ifdef, and reports KVS_ERR_NO_DEVICE saying how
 * to get a build that has the backend. `make cuda` compiles with -DKVS_WITH_CUDA, which drops this file's
 * contents in favour of gpu_capture/cuda/backend.cu.
 */
#include "cuda_backend.h"

#ifndef KVS_WITH_CUDA

#define KVS_CUDA_ABSENT_MSG "no CUDA device (this kvsim was built without CUDA; run `make cuda`)"

kvs_status kvs_cuda_probe(char *desc, size_t n) {
    if (desc && n) desc[0] = '\0';
    return kvs_fail(KVS_ERR_NO_DEVICE, KVS_CUDA_ABSENT_MSG);
}

kvs_status kvs_cuda_backend_create(const kvs_model *m, int max_positions, kvs_trace_writer *w,
                                   kvs_cuda_backend **out) {
    (void)m;
    (void)max_positions;
    (void)w;
    if (out) *out = NULL;
    return kvs_fail(KVS_ERR_NO_DEVICE, KVS_CUDA_ABSENT_MSG);
}

kvs_status kvs_cuda_backend_prefill(kvs_cuda_backend *b, const int32_t *tokens, int n, int pos0, kvs_role role,
                                    int32_t turn, const float **last_logits) {
    (void)b;
    (void)tokens;
    (void)n;
    (void)pos0;
    (void)role;
    (void)turn;
    if (last_logits) *last_logits = NULL;
    return kvs_fail(KVS_ERR_NO_DEVICE, KVS_CUDA_ABSENT_MSG);
}

kvs_status kvs_cuda_backend_step(kvs_cuda_backend *b, int32_t token, int pos, kvs_role role, int32_t turn,
                                 const float **logits) {
    (void)b;
    (void)token;
    (void)pos;
    (void)role;
    (void)turn;
    if (logits) *logits = NULL;
    return kvs_fail(KVS_ERR_NO_DEVICE, KVS_CUDA_ABSENT_MSG);
}

kvs_status kvs_cuda_backend_finish(kvs_cuda_backend *b) {
    (void)b;
    return kvs_fail(KVS_ERR_NO_DEVICE, KVS_CUDA_ABSENT_MSG);
}

kvs_status kvs_cuda_backend_layer(kvs_cuda_backend *b, int layer, int pos, float *q, float *k, float *v, float *o,
                                  float *lse) {
    (void)b;
    (void)layer;
    (void)pos;
    (void)q;
    (void)k;
    (void)v;
    (void)o;
    (void)lse;
    return kvs_fail(KVS_ERR_NO_DEVICE, KVS_CUDA_ABSENT_MSG);
}

/* No backend can exist in this build, so there is nothing to free. */
void kvs_cuda_backend_free(kvs_cuda_backend *b) { (void)b; }

#else
/* ISO C forbids an empty translation unit. */
typedef int kvs_cuda_absent_unused;
#endif
