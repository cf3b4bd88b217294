/* verify.h — checking a trace's recorded attention against an exact recomputation: the library behind
 * `kvsim verify` (trace/FORMAT.md "What verify checks"; the attention it recomputes is ../shared/DESIGN.md
 * "Capture": causal full attention over positions 0..p, softmax scale the trace's attn_scale).
 *
 * Three levels, each usable alone:
 *   - one row (position p, query head): kvs_verify_attention() recomputes it in fp32 from the stored q/k/v,
 *     kvs_verify_row_check() compares the stored o~ and lse~ with that recomputation, against the row's own
 *     rigorous rounding-error bound (derivation in verify.c, "The per-row error bound") or fixed tolerances;
 *   - kvs_trace_verify(): every chunk's checksums, then every (layer, KV head) stream of a trace position by
 *     position, the streams spread over a common/threadpool.h pool; the report is the same whatever the
 *     number of workers. A lean trace (KVS_TRACE_FLAG_QKV, FORMAT.md "Lean record") stores no o or lse, so
 *     for it only the finiteness of every stored q/k/v value is checked;
 *   - kvs_verify_report_layer(): a report's streams summed up per layer (what `kvsim verify` prints).
 * Nothing here prints; the caller turns a report into text and an exit status.
 */
#ifndef KVS_VERIFY_H
#define KVS_VERIFY_H

#include <stddef.h>
#include <stdint.h>

#include "../common/kvs.h"
#include "../common/threadpool.h"
#include "trace.h"

/* ------------------------------------------------------------------------------------------------
 * How a row is judged
 * ---------------------------------------------------------------------------------------------- */

typedef struct {
    int fixed;          /* 1: fixed tolerances (tol, lse_tol); 0: the per-row error bound */
    double tol;         /* fixed: largest relative output error ||o~ - o'|| / ||o~|| that passes */
    double lse_tol;     /* fixed: largest absolute lse error |lse~ - lse'| that passes */
    double u, eta;      /* the storage dtype's rounding, |x - x~| <= u |x~| + eta (kvs_verify_dtype_rounding) */
} kvs_verify_cfg;

/*! kvs_verify_dtype_rounding() : storage rounding of dtype `dt` relative to the stored value: unit roundoff *u
 *  (fp16 2^-11, bf16 2^-8, fp32 2^-24) and the absolute *eta where it underflows (half the smallest subnormal:
 *  fp16 2^-25, bf16 2^-134, fp32 2^-150). An unknown dtype gets fp32's. */
void kvs_verify_dtype_rounding(kvs_dtype dt, double *u, double *eta);

/*! kvs_verify_cfg_init() : the configuration of a trace stored in `dt`: the per-row bound when both
 *  tolerances are negative (not given); fixed tolerances otherwise, where `tolerance` alone sets both and
 *  `lse_tolerance` alone leaves the output tolerance at 128 u of the dtype (fp32: 1e-4).
 *  @return KVS_OK, or KVS_ERR_INVALID_ARG for a NaN tolerance or a NULL cfg. */
kvs_status kvs_verify_cfg_init(kvs_dtype dt, double tolerance, double lse_tolerance, kvs_verify_cfg *cfg);

/* ------------------------------------------------------------------------------------------------
 * One row
 * ---------------------------------------------------------------------------------------------- */

/* A row to check: query head g at position p, over keys first..first+n-1 (first 0 and n = p + 1 for a full-attention
 * layer; a sliding-window layer's window otherwise). Every pointer is borrowed. */
typedef struct {
    size_t n, d;            /* keys, head_dim (both >= 1) */
    size_t first;           /* position of the first key: the ctx's keys first.. are the row's (0 = all from 0) */
    float scale;            /* softmax scale */
    const float *q;         /* [d]: stored query q~ */
    const float *v;         /* [n][d]: stored values v~ of keys first.. */
    const float *o;         /* [d]: stored output o~ */
    float lse;              /* stored lse~ */
    /* the recomputation from q~, k~, v~ (kvs_verify_attention) */
    const float *scores;    /* [n]: scale q~.k~_j before the softmax (read in bound mode only; may be NULL in fixed) */
    const float *probs;     /* [n]: p' = softmax(scores) */
    const float *out;       /* [d]: o' = sum_j p'_j v~_j */
    double attn_lse;        /* lse' */
} kvs_verify_row;

/* The outcome of one row. NaN errors are reported as +inf, so that they can never look like a pass. */
typedef struct {
    double rel;             /* ||o~ - o'|| / ||o~|| (kvs_rel_l2) */
    double err_o;           /* ||o~ - o'|| (bound mode; fixed mode: = rel) */
    double err_lse;         /* |lse~ - lse'| */
    double bound_o;         /* bound mode: the row's output bound (slack and floor included); fixed: tol */
    double bound_lse;       /* bound mode: the row's lse bound; fixed: lse_tol */
    double use_o, use_lse;  /* err_o / bound_o and err_lse / bound_lse (0/0 = 0): "bound usage" */
    int pass;               /* 1: err_o <= bound_o and err_lse <= bound_lse */
} kvs_verify_row_result;

/*! kvs_verify_attention() : the recomputation verify compares with, in fp32 with common/kvs_math.h (the steps of
 *  kvs_attention(), scores kept): scores[j] = scale q.k_j, probs = softmax(scores), out = sum_j probs_j v_j over
 *  the n rows of k and v ([n][d], row stride d). scores, probs: [n]; out: [d] (caller's). @return the lse. */
double kvs_verify_attention(const float *q, const float *k, const float *v, size_t n, size_t d, float scale,
                            float *scores, float *probs, float *out);

/* Scratch of the bound for the keys of one stream: per key |k~_j| (elementwise), |k~_j|_1 and ||v~_j||_2. */
typedef struct kvs_verify_ctx kvs_verify_ctx;

/*! kvs_verify_ctx_create() : scratch for rows of up to `max_keys` keys of head_dim `d` judged by `cfg` (copied):
 *  (max_keys (d + 3) + d) floats in bound mode, none with fixed tolerances. Caller frees with
 *  kvs_verify_ctx_free. @return KVS_OK, KVS_ERR_INVALID_ARG (NULL argument, max_keys or d of 0),
 *  KVS_ERR_NOMEM. */
kvs_status kvs_verify_ctx_create(const kvs_verify_cfg *cfg, size_t max_keys, size_t d, kvs_verify_ctx **out);

/*! kvs_verify_ctx_free() : accepts NULL. */
void kvs_verify_ctx_free(kvs_verify_ctx *w);

/*! kvs_verify_ctx_add_key() : records key j's stored k~_j and v~_j ([d] each, borrowed for the call) for the
 *  rows that follow; keys are added in order 0, 1, 2, ... (no-op with fixed tolerances). @return KVS_OK,
 *  KVS_ERR_RANGE when j is not the next key or is max_keys, KVS_ERR_INVALID_ARG for NULL arguments. */
kvs_status kvs_verify_ctx_add_key(kvs_verify_ctx *w, size_t j, const float *k, const float *v);

/*! kvs_verify_row_check() : judges one row by the ctx's configuration into *res. In bound mode keys
 *  0..row->n-1 must have been added and row->d must be the ctx's d. @return KVS_OK (whether or not the row
 *  passes: res->pass), KVS_ERR_INVALID_ARG (NULL argument, n of 0, d not the ctx's, a NULL array the mode
 *  reads), KVS_ERR_RANGE (n above the keys added). */
kvs_status kvs_verify_row_check(kvs_verify_ctx *w, const kvs_verify_row *row, kvs_verify_row_result *res);

/* ------------------------------------------------------------------------------------------------
 * A whole trace
 * ---------------------------------------------------------------------------------------------- */

typedef struct {
    double tolerance;       /* >= 0: fixed relative output tolerance; < 0: not given (kvs_verify_cfg_init) */
    double lse_tolerance;   /* >= 0: fixed absolute lse tolerance; < 0: not given */
    int threads;            /* workers when pool is NULL: 1..1024, <= 0 all cores; never more than the streams */
    kvs_threadpool *pool;   /* borrowed; NULL: a pool of `threads` workers lives for the call */
} kvs_verify_options;

/*! kvs_verify_options_default() : no tolerances (the per-row bound), all cores, no pool. */
kvs_verify_options kvs_verify_options_default(void);

/* One (layer, KV head) stream's rows summed up. */
typedef struct {
    double max_rel, max_lse;   /* largest relative output error and absolute lse error */
    int64_t worst_pos;         /* position and query head of max_rel (-1 before the first row) */
    int worst_head;
    double use_o, use_lse;     /* largest bound usage (error / bound) of output and lse */
    int64_t use_pos;           /* position and query head of the largest of the two (-1 before the first row) */
    int use_head;
    int64_t n_fail;            /* rows over their bound or tolerance */
    kvs_status status;         /* KVS_OK, or why the stream stopped (its rows so far are counted above) */
    char detail[1024];         /* status != KVS_OK: the error's detail */
} kvs_verify_stream_result;

typedef struct {
    int64_t n_chunks;          /* chunks whose checksums were checked (all of the trace's) */
    kvs_dtype dtype;           /* the trace's storage dtype */
    kvs_verify_cfg cfg;        /* how rows were judged */
    int lean;                  /* 1: a lean trace: the fields lean_* below, no streams */
    int n_layers, n_kv_heads;
    kvs_verify_stream_result *streams; /* [n_layers * n_kv_heads], layer-major; NULL for a lean trace */
    int64_t n_fail;            /* rows over their bound or tolerance, all streams */
    int n_errors;              /* streams whose status is not KVS_OK */
    double max_usage;          /* largest bound usage of any row, output or lse */
    /* lean trace */
    int64_t lean_values;       /* stored q/k/v values read */
    int64_t lean_bad;          /* of them not finite */
    int64_t lean_first_pos;    /* the first non-finite one: position, layer, KV head (-1 when none) */
    int lean_first_layer, lean_first_kv;
    kvs_status lean_status;    /* KVS_OK, or the error that stopped the scan (lean_detail) */
    char lean_detail[1024];
} kvs_verify_report;

/*! kvs_trace_verify() : checks `t` (borrowed): first every chunk's checksums (kvs_trace_check_chunks), then
 *  every row of every stream as `opt` says (NULL: kvs_verify_options_default()), or for a lean trace the
 *  stored q/k/v values. A stream that cannot be read or allocated is recorded in its result and the others
 *  go on. @return KVS_OK and *out (caller frees with kvs_verify_report_free) whether or not rows fail: the
 *  report says; otherwise the error of the checksum pass (the chunk named in the detail),
 *  KVS_ERR_INVALID_ARG (NULL t or out, bad options: the detail names the option) or KVS_ERR_NOMEM. */
kvs_status kvs_trace_verify(const kvs_trace *t, const kvs_verify_options *opt, kvs_verify_report **out);

/*! kvs_verify_report_free() : accepts NULL. */
void kvs_verify_report_free(kvs_verify_report *r);

/* One layer of a report: its KV heads' streams summed up. */
typedef struct {
    double max_rel, max_lse;   /* largest relative output error (at worst_pos, worst_head) and lse error */
    int64_t worst_pos;
    int worst_head;
    double use_o, use_lse;     /* largest bound usages (the larger at use_pos, use_head) */
    int64_t use_pos;
    int use_head;
    int64_t n_fail;            /* rows of the layer over their bound or tolerance */
} kvs_verify_layer;

/*! kvs_verify_report_layer() : layer `layer` (0..n_layers-1) of a report of a full trace into *out.
 *  @return KVS_OK, KVS_ERR_RANGE (no such layer, or a lean report), KVS_ERR_INVALID_ARG (NULL). */
kvs_status kvs_verify_report_layer(const kvs_verify_report *r, int layer, kvs_verify_layer *out);

#endif /* KVS_VERIFY_H */
