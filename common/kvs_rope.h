/* kvs_rope.h — rotary position embedding (RoPE) as kvsim's capture applies it, its exact inverse, the
 * position-averaged rotation, and a small symmetric eigen-solver: what a policy needs to recover pre-RoPE queries
 * and keys from a trace's post-RoPE ones (../shared/POLICY_SPEC_2.md §1.1 inverse RoPE, §1.2 R̄; Expected
 * Attention §2.1 and ShadowKV §2.10 use them).
 *
 * Frequencies follow gpu_capture/model.c exactly: theta_i = theta_b^(-2i/d) in fp64, optionally rescaled by the
 * Llama-3 rule, then rounded to fp32 (the capture stores them as floats); the angle p*theta_i is taken in fp64 and
 * its cos/sin rounded to fp32 before use, as capture does, so that the inverse undoes capture's rotation to within
 * an ulp of each coordinate. Pairs: layout 0 (adjacent, llama2.c) (2i, 2i+1); layout 1 (halves, HF rotate_half)
 * (i, i+d/2) (trace/trace.h kvs_rope_layout).
 */
#ifndef KVS_ROPE_H
#define KVS_ROPE_H

#include <stdint.h>

#include "kvs.h"

/* Llama-3 frequency scaling (POLICY_SPEC_2 §1.1; transformers' llama3 rope_type). factor <= 0 = none. */
typedef struct {
    double factor;   /* F (8 for Llama-3.1); <= 0: no scaling */
    double low, high;/* f_lo, f_hi (1 and 4 for Llama-3.1) */
    double orig;     /* L_orig, the pre-scaling context (8192 for Llama-3.1) */
} kvs_rope_scaling;

/* The RoPE scalings a trace cannot record (POLICY_SPEC_2 §1.1 "Trace-format gap"), as a policy's enum parameter
 * "auto|none|llama31|llama32" (KVS_ROPE_SCALING_CHOICES) takes them. */
typedef enum { KVS_ROPE_SCALING_AUTO = 0, KVS_ROPE_SCALING_NONE, KVS_ROPE_SCALING_LLAMA31, KVS_ROPE_SCALING_LLAMA32 } kvs_rope_scaling_choice;
#define KVS_ROPE_SCALING_CHOICES "auto|none|llama31|llama32"

/*! kvs_rope_scaling_of() : the scaling of `choice` (llama31: factor 8, low 1, high 4, orig 8192; llama32: factor 32;
 *  none and auto: none). AUTO on a model whose name says Llama-3 is KVS_ERR_INVALID_ARG (its scaling is not in the
 *  trace), the detail starting with `who`. */
kvs_status kvs_rope_scaling_of(kvs_rope_scaling_choice choice, const char *model_name, const char *who,
                               kvs_rope_scaling *sc);

/*! kvs_rope_freqs() : freq[i] (i < d/2) = theta_i as capture computes it (fp64 formula, Llama-3 rescaling when
 *  sc != NULL and sc->factor > 0, rounded to fp32), for an even d >= 2 and theta_b > 0. */
void kvs_rope_freqs(double theta_b, int d, const kvs_rope_scaling *sc, double *freq);

/*! kvs_rope_apply() : v <- R(pos) v in place (what the model did at position pos), in fp32 as capture does. */
void kvs_rope_apply(float *v, int d, int layout, int64_t pos, const double *freq);

/*! kvs_rope_invert() : out <- R(pos)^T in (the pre-RoPE vector), computed in fp64 with capture's fp32 cos/sin
 *  and rounded once to fp32. in and out may alias. */
void kvs_rope_invert(const float *in, float *out, int d, int layout, int64_t pos, const double *freq);

/*! kvs_rope_invert_f64() : kvs_rope_invert() into doubles, with the exact fp64 cos/sin (for the golden tests and
 *  for callers that keep fp64). */
void kvs_rope_invert_f64(const double *in, double *out, int d, int layout, int64_t pos, const double *freq);

/*! kvs_rope_apply_f64() : v <- R(pos) v in fp64 with exact cos/sin. */
void kvs_rope_apply_f64(double *v, int d, int layout, int64_t pos, const double *freq);

/*! kvs_rope_avg() : the position-averaged rotation R̄(a, T) = (1/T) sum_{t=a}^{a+T-1} R(t) as its per-pair
 *  coefficients cbar[i], sbar[i] (closed form of §1.2; T >= 1). */
void kvs_rope_avg(int d, int64_t a, int64_t T, const double *freq, double *cbar, double *sbar);

/*! kvs_rope_avg_apply() : out <- R̄ x for the coefficients of kvs_rope_avg (fp64, out may alias x). */
void kvs_rope_avg_apply(const double *x, double *out, int d, int layout, const double *cbar, const double *sbar);

/*! kvs_rope_pair() : the two coordinates (*a, *b) pair i rotates in `layout`. */
void kvs_rope_pair(int d, int layout, int i, int *a, int *b);

/*! kvs_sym_eig() : eigen-decomposition of the symmetric n x n matrix A (row-major, fp64, destroyed) by cyclic
 *  Jacobi rotations: eigenvalues to w[0..n-1] in descending order, the matching unit eigenvectors to the COLUMNS
 *  of V (row-major n x n: V[r*n + c] is coordinate r of eigenvector c). Each eigenvector's sign is fixed so that
 *  its largest-magnitude coordinate (the first such) is positive. KVS_ERR_NOMEM. */
kvs_status kvs_sym_eig(double *A, int n, double *w, double *V);

#endif /* KVS_ROPE_H */
