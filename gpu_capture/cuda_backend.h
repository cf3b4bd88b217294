/* cuda_backend.h — the CUDA capture backend: the same traces as the CPU, at GPU speed (../shared/DESIGN.md
 * "Capture"). It runs the same Llama-family forward pass as the CPU reference
 * (gpu_capture/model.c: RMSNorm, q/k/v (+bias), RoPE in either layout with Llama-3 scaling, GQA causal
 * attention that also emits the log-sum-exp, SwiGLU, residuals, final norm, classifier) on one GPU, and
 * records every position into a kvs_trace_writer through an asynchronous pipeline, so the traces are the
 * ones the CPU would write, within the precision stated below.
 *
 * Precision (what the parity tests hold it to):
 *  - Weights live on the device in the checkpoint's own storage dtype (kvs_model_info.weight_dtype):
 *    fp32 checkpoints (llama2.c, fp32 safetensors) stay fp32, fp16 stay fp16, bf16 stay bf16. The model
 *    hands us its matrices as stored (model_weights.h); one in the device dtype is copied bit for bit, one in
 *    another dtype (mixed checkpoints: the device dtype is then fp32) is widened exactly a row at a time, so
 *    nothing is rounded twice. Memory: 4 bytes/parameter for fp32 checkpoints (they are small in practice), 2
 *    otherwise.
 *  - Every projection and the classifier is a cuBLAS GEMM (cublasGemmEx, CUBLAS_COMPUTE_32F, default math
 *    mode, i.e. no TF32): fp32 accumulation always. With 16-bit weights, cuBLAS needs both operands in the
 *    same type, so the activation fed to a GEMM (normed x, attention output, SwiGLU output) is rounded to
 *    the weight dtype first, as transformers does when it runs a model in fp16/bf16.
 *  - Everything else (residual stream, RMSNorm, RoPE, attention with online softmax, LSE, SwiGLU) is fp32.
 *  So fp32 checkpoints match the CPU to fp32 reordering noise (~1e-6 relative; parity test: 1e-4), and
 *  16-bit checkpoints to the rounding of the GEMM inputs (fp16 u = 2^-11, bf16 u = 2^-8; see
 *  tests/test_cuda.c for the tolerances and why).
 *
 * Recording pipeline: the kernels also write each position's q (post-RoPE), k, v, o and lse into a device
 * record buffer (two slots, so the next step can compute while the previous one is copied); a separate copy
 * stream, ordered after the compute stream by an event, copies the slot with one cudaMemcpyAsync into a
 * ring of pinned host memory; a writer thread (pthread) waits on the copy's event and calls
 * kvs_trace_writer_begin_position / put_layer / end_position, so zstd compression overlaps the next decode
 * steps. When the ring is full the decoding thread waits (back-pressure). The ring holds up to 128 MB of
 * positions (at least 128 positions; the environment variable KVSIM_CUDA_RING_POSITIONS overrides the count,
 * for tests of the wrap-around). The trace writer passed to
 * create() belongs to that thread until kvs_cuda_backend_finish() returns.
 *
 * Limits: head_dim even and <= 256, n_heads <= 1024 (any GQA group), max_positions <= the model context.
 *
 * Builds without CUDA (the default `make`) get gpu_capture/cuda_absent.c: every function below exists and
 * returns KVS_ERR_NO_DEVICE ("no CUDA device (this kvsim was built without CUDA; run `make cuda`)"). In a
 * CUDA build on a machine without a usable GPU (no device, or a driver older than the runtime) they return
 * KVS_ERR_NO_DEVICE with "no CUDA device (...)" naming the CUDA error.
 */
#ifndef KVS_CUDA_BACKEND_H
#define KVS_CUDA_BACKEND_H

#include <stddef.h>
#include <stdint.h>

/* C headers: C linkage also when a .cu file includes this one */
#ifdef __cplusplus
extern "C" {
#endif

#include "../common/kvs.h"
#include "../trace/trace.h"
#include "model.h"

/*! kvs_cuda_probe() : writes a one-line description of device 0 into desc[0..n) (name, compute capability,
 *  SMs, memory; may be NULL with n 0). @return KVS_OK, or KVS_ERR_NO_DEVICE (detail says why). */
kvs_status kvs_cuda_probe(char *desc, size_t n);

typedef struct kvs_cuda_backend kvs_cuda_backend;

/*! kvs_cuda_backend_create() : uploads the weights of `m` (borrowed; must outlive the backend), allocates a
 *  KV cache for `max_positions` positions (1..model context) and, when `w` is not NULL, starts the
 *  recording pipeline into `w` (borrowed; used only by the backend's writer thread until
 *  kvs_cuda_backend_finish returns). @return KVS_OK and *out (free with kvs_cuda_backend_free);
 *  KVS_ERR_INVALID_ARG for a bad max_positions, KVS_ERR_UNSUPPORTED for shapes outside the limits,
 *  KVS_ERR_NO_DEVICE, KVS_ERR_CUDA, KVS_ERR_NOMEM. */
kvs_status kvs_cuda_backend_create(const kvs_model *m, int max_positions, kvs_trace_writer *w,
                                   kvs_cuda_backend **out);

/*! kvs_cuda_backend_prefill() : forwards tokens[0..n) at positions pos0 .. pos0+n-1 (pos0 must be the next
 *  position: 0, or where the previous call stopped) as batched GEMMs and causal attention over the cache
 *  plus the new rows (in chunks of at most 64 rows); records every position with `role` and `turn` when
 *  recording. *last_logits receives the [vocab_size] logits of the last position (host memory borrowed
 *  from the backend, valid until the next call). KVS_ERR_RANGE for a token outside the vocabulary or
 *  positions beyond max_positions, KVS_ERR_STATE for a position out of order or after a failed call. */
kvs_status kvs_cuda_backend_prefill(kvs_cuda_backend *b, const int32_t *tokens, int n, int pos0, kvs_role role,
                                    int32_t turn, const float **last_logits);

/*! kvs_cuda_backend_step() : one decode position (same rules as prefill with n = 1). */
kvs_status kvs_cuda_backend_step(kvs_cuda_backend *b, int32_t token, int pos, kvs_role role, int32_t turn,
                                 const float **logits);

/*! kvs_cuda_backend_finish() : waits until every recorded position has been handed to the trace writer and
 *  returns the first error the writer thread met (its detail re-issued in the caller's thread). After it
 *  returns the caller may close the writer. Without a writer it only synchronises. */
kvs_status kvs_cuda_backend_finish(kvs_cuda_backend *b);

/*! kvs_cuda_backend_layer() : for tests and tools: copies the record of `layer` for position `pos` of the
 *  LAST call (prefill or step; for a prefill longer than 64 positions, of its last chunk of 64) to host arrays of the kvs_layer_record shapes (q, o [n_heads*head_dim],
 *  k, v [n_kv_heads*head_dim], lse [n_heads]; any pointer may be NULL). Synchronous; does not need a
 *  trace writer. KVS_ERR_RANGE when pos was not forwarded by the last call. */
kvs_status kvs_cuda_backend_layer(kvs_cuda_backend *b, int layer, int pos, float *q, float *k, float *v, float *o,
                                  float *lse);

/*! kvs_cuda_backend_free() : stops the writer thread (abandoning positions not yet written: call finish
 *  first to keep them), frees device and pinned memory. Accepts NULL. */
void kvs_cuda_backend_free(kvs_cuda_backend *b);

#ifdef __cplusplus
}
#endif

#endif /* KVS_CUDA_BACKEND_H */
