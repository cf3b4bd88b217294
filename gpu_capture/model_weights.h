/* model_weights.h — read access to a loaded model's weight tensors, for backends other than the CPU forward
 * pass (the CUDA backend uploads them once). They are what gpu_capture/model.c computes with, borrowed from the
 * model (valid until kvs_model_free), row-major PyTorch layout [out][in]: matrices as stored in the checkpoint
 * (kvs_wmat: fp32, fp16 or bf16, in place in the mapping; a backend that wants another dtype converts a tensor at
 * a time, kvs_wmat_row_f32 / kvs_decode), vectors in fp32. Once a CPU state exists (kvs_model_state_create), a
 * 16-bit matrix's .packed also holds the CPU path's panel copy and its mapped pages have been dropped (reading
 * .data faults them back from the file).
 *
 * Implemented in gpu_capture/model.c (it reads the private struct kvs_model).
 */
#ifndef KVS_MODEL_WEIGHTS_H
#define KVS_MODEL_WEIGHTS_H

/* C headers: C linkage also when a .cu file includes this one */
#ifdef __cplusplus
extern "C" {
#endif

#include "../common/kvs.h"
#include "model.h"
#include "matmul.h"


/* Whole-model tensors. */
typedef struct {
    kvs_wmat embed;         /* [vocab_size][dim] token embedding */
    const float *rms_final; /* [dim] */
    kvs_wmat cls;           /* [vocab_size][dim] classifier; .data == embed.data when tied */
    const float *inv_freq;  /* [head_dim/2] RoPE inverse frequencies after any Llama-3 scaling */
} kvs_model_weights;

/* One layer's tensors (q_dim = n_heads*head_dim, kv_dim = n_kv_heads*head_dim). */
typedef struct {
    const float *rms_att, *rms_ffn; /* [dim] */
    kvs_wmat wq;                    /* [q_dim][dim] */
    kvs_wmat wk, wv;                /* [kv_dim][dim] */
    kvs_wmat wo;                    /* [dim][q_dim] */
    const float *bq, *bk, *bv;      /* [q_dim], [kv_dim], [kv_dim] or NULL (no q/k/v bias) */
    const float *bo;                /* [dim] or NULL */
    kvs_wmat w1;                    /* gate [hidden_dim][dim] */
    kvs_wmat w2;                    /* down [dim][hidden_dim] */
    kvs_wmat w3;                    /* up   [hidden_dim][dim] */
} kvs_model_layer_weights;

/*! kvs_model_weights_get() : fills *out with the whole-model tensors of `m`. */
kvs_status kvs_model_weights_get(const kvs_model *m, kvs_model_weights *out);

/*! kvs_model_layer_weights_get() : fills *out with layer `layer`'s tensors; KVS_ERR_RANGE outside
 *  [0, n_layers). */
kvs_status kvs_model_layer_weights_get(const kvs_model *m, int layer, kvs_model_layer_weights *out);

#ifdef __cplusplus
}
#endif

#endif /* KVS_MODEL_WEIGHTS_H */
