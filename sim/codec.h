/* codec.h — the representation stage of kvsim: how stored K/V rows are represented (quantized) and what they cost in
 * bytes. A policy chooses WHICH positions are stored (sim/policy.h); a codec says HOW each stored row is held. This
 * module is the core: parsing a codec spec, the exact quantize/dequantize arithmetic, the time rule (when a
 * position's representation becomes final), the rows attention sees at a decode step, and exact storage bytes. The
 * host (sim/host.h, "REPRESENTATION stage") plugs it in between the selection check and the attention: the drivers
 * attend over the rows kvs_codec_state_rows() gives back, and kvs_host_cost counts kvs_codec_state_bytes().
 *
 * Follows ../shared/DESIGN.md ("Selection, representation, granularity are separate stages"; identity by content:
 * the canonical spec below is what enters a run's identity, kvs_host_identity.codec); KIVI (Liu et al., ICML 2024,
 * "KIVI: A Tuning-Free Asymmetric 2bit Quantization for KV Cache", Algorithm 1, and its repository jy-yuan/KIVI);
 * Hugging Face transformers' QuantizedCache (QuantizedCacheConfig / QuantoQuantizedCache); vLLM's fp8 KV cache; ThinK
 * (Xu et al. 2024, "ThinK: Thinner Key Cache by Query-Driven Pruning", ICLR 2025, §3.2, and its repository
 * SalesforceAIResearch/ThinK, ThinK_flash/src: kv_pruning_utils.py, llama_model.py, cache_utils.py).
 *
 * ================================================================================================================
 * Specs (one canonical string each, like policies': NAME or NAME:key=value,...; every key filled in, table order)
 * ================================================================================================================
 *   int:bits=4,group=32,k_axis=token,v_axis=channel      uniform asymmetric min-max integer quantization
 *       bits   2|3|4|8
 *       group  1..65536 elements per group
 *       k_axis, v_axis  token | channel: the axis a group runs along, chosen separately for K and V.
 *              token   = one channel over `group` consecutive positions [j*group, (j+1)*group): "per-channel"
 *                        quantization, KIVI's key layout; one scale/zero per (group of positions, channel).
 *              channel = one position over `group` consecutive channels [c*group, min((c+1)*group, d)): "per-token"
 *                        quantization; ceil(d/group) scales/zeros per row (a group wider than the head is clipped
 *                        to the row: one group per row).
 *   kivi:bits=2,group=32,residual=128                     KIVI: keys token-axis, values channel-axis, both with
 *       bits 2|4, groups of `group` (G), the most recent positions held in 16 bits (residual R, a multiple of G,
 *       R >= G). Defaults: KIVI-2 with G = 32 and R = 128, the setting of the paper's experiments (the repository's
 *       example.py uses R = 32; its scripts take G and R as arguments). The residual's rule is Algorithm 1 as the
 *       repository implements it (models/llama_kivi.py), restated in kvsim's terms (p = the query's position):
 *         prefill of a prompt of P positions: keys 0 .. R*floor(P/R)-1 quantized (P mod R kept in 16 bits; all of
 *           them when R divides P), values 0 .. P-R-1 quantized (the last min(P, R) kept in 16 bits); prefill
 *           attention itself in full precision;
 *         decode: the new key joins the 16-bit residual, attention runs, and when the residual holds R keys they
 *           are quantized together (R/G groups per channel) and it empties; the new value joins its residual,
 *           attention runs, and when it holds R+1 values the oldest is quantized (per token).
 *       So at the attention of position p > P-1: keys < R*floor(p/R) are quantized, values < max(0, p-R).
 *   hf:bits=4,group=64,residual=128                       transformers' QuantizedCache defaults (QuantizedCacheConfig:
 *       backend "quanto", nbits 4, axis_key 0, axis_value 0, q_group_size 64, residual_length 128). In kvsim's
 *       terms: quanto groups axis 0 as `group` consecutive elements of the row-major [batch, heads, tokens, d]
 *       tensor, i.e. CHANNEL-axis (per-token) groups of 64 channels for both K and V (axis -1 would be token-axis
 *       groups running across the flattened batch x heads x tokens; not modelled: use int or kivi for token
 *       axes). bits 2|4 (quanto's qint2/qint4), residual >= 2. Its update() rule:
 *         prefill: the whole prompt is quantized (prefill attention in full precision), the residual is empty;
 *         decode: attention sees the dequantized cache + the 16-bit residual + the new token; then, when the
 *           residual held R-1 rows before the new one, everything is re-quantized and the residual empties,
 *           otherwise the new row joins the residual.
 *       So at the attention of position p >= P: positions < P + R*floor((p-P)/R) are quantized.
 *       Where kvsim differs from the library, on purpose: (1) the arithmetic is kvsim's (below: fp16 scale, fp16
 *       min as the zero point), not quanto's MaxOptimizer/affine packing bit for bit; (2) HF re-quantizes the
 *       already dequantized rows at every flush; a per-token group then maps onto itself (its min and max are codes
 *       0 and 2^b-1) except where its range is comparable to the fp16 spacing at its minimum (the fp16 zero point
 *       moves it: rare, about 1 group in 10^4 on random rows), so kvsim quantizes each row once, which also keeps
 *       a stream's cost O(N d) (the fixtures' reference runs update() literally beside it and counts the rows
 *       that differ); (3) heads narrower than 64 (the tiny models' d = 8, 16) would make quanto's 64-element
 *       groups span several tokens; kvsim clips a group to its row; (4) HF with residual_length <= 1 flushes only
 *       every other step (an empty 1-D tensor fails its `dim() == 4` check), hence residual >= 2.
 *   fp8:format=e4m3,scale=1,per=tensor                    an fp8 cache as vLLM's kv_cache_dtype="fp8"
 *       format e4m3 (e4m3fn as torch/vLLM: max 448, no infinities) | e5m2 (max 57344); every element is divided by
 *       the scale, rounded to the nearest fp8 value (ties to even), saturating to +-max, and read back times the
 *       scale. scale: a positive number (vLLM's default without calibration is k_scale = v_scale = 1.0; a number
 *       is one scale for K and V of every head) or `prompt`: calibrated from data a real system has at that
 *       moment, the prompt's K (and V) only, never later positions: scale = amax(|prompt rows|) / max_fp8 (1 when
 *       the prompt is all zero), one for K and one for V, per=head (each KV head its own; vLLM's per-head scales
 *       come from llm-compressor) or per=tensor (one for the layer's K and one for its V over every KV head:
 *       kvs_codec_share_scale). vLLM's own on-the-fly calibration (calculate_kv_scales) divides the first batch's
 *       amax by K_SCALE_CONSTANT = 200 / V_SCALE_CONSTANT = 100 instead. per=head needs scale=prompt.
 *   think:ratio=0.4,window=32,recent=32                   ThinK: query-driven pruning of key channels, no
 *       quantization. ratio = lambda in [0, 1), the share of channels pruned: floor(ratio * d) channels pruned,
 *       kvs_codec_kept_channels() = d - floor(ratio * d) kept (the authors' int(head_dim * ratio)); window >= 1 the
 *       observation window; recent >= 0. Defaults are the authors' (pruning_ratio 0.4 and recent_size 32 in
 *       scripts_longBench/eval.sh; the last 32 queries in key_pruner_query_driven). Per (layer, KV head), from the
 *       prefill only:
 *         score_c = ||Q[:, c]||_2 * ||K[:, c]||_2,   c < d
 *       Q = the queries of the last w = min(window, P) prompt positions of every query head of the KV head's group
 *       (w x group rows), K = the P prompt keys. This is the paper's ||Q[-S_obs:, c] K[:, c]^T||_F (the Frobenius
 *       norm of an outer product is the product of the 2-norms); the authors' code ranks by mean(q_c^2) *
 *       mean(k_c^2), the same order. The floor(ratio * d) channels of lowest score are pruned (a tie prunes the
 *       lower channel index first; torch.topk leaves ties unspecified), the others kept.
 *       Where kvsim differs from the authors' code, on purpose: (1) one channel set per KV HEAD, the group's query
 *       heads stacked into Q: the authors repeat the keys to every query head (repeat_kv) before pruning, so their
 *       GQA cache holds a copy of K per query head, each with its own mask; kvsim's stream is one K per KV head
 *       (NVIDIA kvpress's ThinKPress does the same, averaging q_c^2 over the group); with group = 1 the two agree;
 *       (2) K's norms run over every prompt key: with SnapKV or H2O the authors prune after the selection and take
 *       the norms over the selected keys only; kvsim's codec represents every position as if nothing were evicted
 *       (below), so a policy's choice never changes the channel set.
 *       Which rows are pruned: the prompt's positions 0 .. P - recent - 1 (none when P <= recent). The last
 *       `recent` prompt positions and every position written during decoding are kept whole, as the authors' cache
 *       does (update_thinkv splits the prompt's keys into a pruned part and the last recent_size; update() appends
 *       each new key to the whole part; recover_cache puts zeros in the pruned channels before attention). A
 *       pruned row holds zeros in the pruned channels: q . k over the kept channels equals q . k with the zeros,
 *       so the rows attention sees are the authors' attention inputs; V is never pruned.
 *
 * ================================================================================================================
 * Integer arithmetic (int, kivi, hf), exactly; tools/gen_codec_fixtures.py computes the same in NumPy float32
 * ================================================================================================================
 * For a group x_1..x_m (fp32, finite), L = 2^bits - 1, fp16() = IEEE binary16 round-to-nearest-even
 * (kvs_f32_to_f16), every other operation in IEEE fp32 with its rounding, no fused multiply-add:
 *     mn = min x_i, mx = max x_i
 *     zero  = fp16(mn)                          (stored fp16)
 *     scale = fp16((mx - mn) / L)               (the subtraction and the division in fp32; stored fp16)
 *     q_i   = clamp(round_half_even((x_i - zero) / scale), 0, L)    when scale > 0
 *     q_i   = 0                                                      when scale == 0 (an all-equal group, or a
 *                                                                    range below fp16's smallest subnormal)
 *     xhat_i = q_i * scale + zero               (the product is exact in fp32, then one fp32 rounding)
 * Non-finite input, or a zero or scale that overflows fp16, is KVS_ERR_RANGE naming the group.
 * fp8: y = x / scale (fp32), r = fp8 rounding of y (saturating), xhat = r * scale (fp32).
 *
 * ================================================================================================================
 * The time rule (the design rule every driver of this module follows)
 * ================================================================================================================
 * Positions arrive in order. At decode step n (positions 0..n-1 exist; the query is position n-1) a position's
 * stored representation depends only on positions < n. A token-axis group is quantized when it has filled (or, for
 * kivi and hf, when the residual flushes); until then its positions are held in 16 bits, as captured, and counted
 * as 16 bits. Positions of the prompt are scored in full precision by the prompt's own queries (a real system
 * computes prefill attention before it quantizes); from the first decode step on, attention uses the dequantized
 * K/V. int and fp8 write a decode position's row to the cache before its attention reads the cache (vLLM's order:
 * a channel-axis row, an fp8 row, and a token-axis group completed by the new position are seen dequantized by the
 * new position's own query); kivi and hf keep the new row in the 16-bit residual (their algorithms' order).
 * Formally each codec and tensor (K, V) has a quantized prefix q(n): positions < q(n) are quantized at step n, the
 * others are held as captured; q(n) = 0 for n <= P (prefill), and for n > P:
 *     int channel axis, fp8: n            int token axis: group*floor(n/group)
 *     kivi K: R*floor((n-1)/R)            kivi V: max(0, n-1-R)            hf: P + R*floor((n-1-P)/R)
 *     think K: max(0, P - recent)         think V: 0
 * q(n) never decreases, and every quantized group lies within it, so each group is quantized once.
 * Only the first prompt is a prefill: a later turn's prompt positions follow the decode rule (kvsim replays them one
 * position at a time).
 * think: the channel set is chosen at the prefill from the prompt's queries and keys only, and applied from the
 * first decode step on (a pruned row is one "quantized" for q(n)); it never changes afterwards, and a decode
 * position is kept whole, so a representation at step n depends only on positions < n, and on no query outside
 * the window (the last min(window, P) prompt positions).
 *
 * Evicted positions: the codec represents every position as if nothing were evicted, so that a policy's choice
 * never changes another position's representation: a token-axis group's scale and zero come from all of its
 * positions. Bytes count what is resident: a group's scale/zero stay while any of its positions is resident (a
 * cache frees a group's metadata only with its last position).
 *
 * ================================================================================================================
 * Bytes (kvs_codec_state_bytes), per (layer, KV head), K and V each
 * ================================================================================================================
 *   quantized resident position: d * bits / 8 bytes of codes (packed densely at `bits` per element, no padding:
 *     3 bits count 3/8 byte) + channel axis: ceil(d/group) x (fp16 scale + fp16 zero) = 4 * ceil(d/group) bytes;
 *   token-axis group with >= 1 resident position: d x 4 bytes (a scale and a zero per channel), once;
 *   position held in 16 bits (not yet quantized): 2 * d bytes (2 bytes per element whatever the trace's dtype: the
 *     cache's 16-bit format);
 *   fp8: d bytes per resident position; scale=prompt per=head: 4 + 4 bytes (fp32 K and V scales) per (layer, KV
 *     head); per=tensor: 8 bytes per layer, reported by kvs_codec_layer_bytes() (add once per layer); a numeric
 *     scale is a constant of the deployment: 0 bytes.
 *   think: a pruned resident K row 2 * kept bytes (k_codes: the kept channels at 16 bits); an unpruned K row and
 *     every V row 2 * d (k_full, v_full); the channel mask d bytes once per (layer, KV head) while at least one
 *     pruned row is resident (k_meta): the authors' cache stores it as a torch.bool [heads][d] tensor, one byte per
 *     channel (a packed bit mask would be ceil(d/8) bytes, the kept indices 2 * kept bytes at 16 bits each).
 *
 * Threads: a kvs_codec is immutable after parsing and may be shared; a kvs_codec_state is used by one thread at a
 * time. No function allocates after kvs_codec_state_create().
 */
#ifndef KVS_CODEC_H
#define KVS_CODEC_H

#include <stdint.h>

#include "../common/kvs.h"

#define KVS_CODEC_SPEC_MAX 128     /* bytes of a canonical spec, NUL included */
#define KVS_CODEC_MAX_HEAD_DIM 65536

typedef struct kvs_codec kvs_codec;             /* a parsed spec */
typedef struct kvs_codec_state kvs_codec_state; /* one (layer, KV head) stream's K and V */

typedef enum {
    KVS_CODEC_INT = 0,
    KVS_CODEC_KIVI = 1,
    KVS_CODEC_HF = 2,
    KVS_CODEC_FP8 = 3,
    KVS_CODEC_THINK = 4 /* key channel pruning, no quantization */
} kvs_codec_kind;
typedef enum { KVS_CODEC_K = 0, KVS_CODEC_V = 1 } kvs_codec_tensor;
typedef enum { KVS_CODEC_AXIS_TOKEN = 0, KVS_CODEC_AXIS_CHANNEL = 1 } kvs_codec_axis;
typedef enum { KVS_CODEC_E4M3 = 0, KVS_CODEC_E5M2 = 1 } kvs_codec_fp8_format;

/* ---- specs ----------------------------------------------------------------------------------------------- */

/*! kvs_codec_parse() : parses "NAME" or "NAME:key=value,..." (the specs above; defaults filled in). Caller owns *out,
 *  frees with kvs_codec_free. KVS_ERR_INVALID_ARG naming the codec, key or value for an empty or unknown name, an
 *  unknown, repeated or malformed key, a value out of range or a combination the codec forbids (*out NULL). */
kvs_status kvs_codec_parse(const char *spec, kvs_codec **out);

/*! kvs_codec_free() : accepts NULL. */
void kvs_codec_free(kvs_codec *c);

/*! kvs_codec_spec() : the canonical spec ("int:bits=4,group=32,k_axis=token,v_axis=channel"); parsing it gives the
 *  same codec. Borrowed from c. */
const char *kvs_codec_spec(const kvs_codec *c);

/*! kvs_codec_kind_of() : which codec. */
kvs_codec_kind kvs_codec_kind_of(const kvs_codec *c);

/*! kvs_codec_position_bytes() : the nominal bytes of one quantized position (K + V) for head dimension d: codes plus
 *  scale/zero amortised over a full token-axis group (4*d/group per position) or a row's channel groups; fp8: 2*d.
 *  Excludes what a stream holds once (the 16-bit residual, fp8 scales): for planning (`kvsim plan`), never for a
 *  run's numbers (kvs_codec_state_bytes). */
double kvs_codec_position_bytes(const kvs_codec *c, int64_t d);

/*! kvs_codec_layer_bytes() : bytes held once per layer whatever the heads: 8 for fp8 scale=prompt per=tensor (fp32
 *  K and V scales), 0 otherwise. */
double kvs_codec_layer_bytes(const kvs_codec *c);

/*! kvs_codec_kept_channels() : think: the key channels kept of a head of d, d - floor(ratio * d); d otherwise. */
int64_t kvs_codec_kept_channels(const kvs_codec *c, int64_t d);

/*! kvs_codec_needs_queries() : 1 when the codec's prefill reads the prompt's queries (think), 0 otherwise. */
int kvs_codec_needs_queries(const kvs_codec *c);

/*! kvs_codec_query_window() : how many of the prompt's last query positions the prefill reads (think: window),
 *  0 for a codec that reads none. */
int64_t kvs_codec_query_window(const kvs_codec *c);

/* ---- the arithmetic, exposed for tests and other modules ---------------------------------------------------- */

/*! kvs_codec_think_channels() : ThinK's channel scores and kept set (the "think" spec above) from exactly the
 *  queries given, all of them: q = [n_q][group][d] (the window's queries), k = [P][d] (the prompt's keys).
 *  score[d] = ||Q_c||_2 * ||K_c||_2 = sqrt(sum q_c^2 * sum k_c^2) (in double, the sums in row order, one
 *  square root), keep[d] = 1 for a kept channel. KVS_ERR_INVALID_ARG for a
 *  codec other than think or bad sizes; KVS_ERR_RANGE for a non-finite input. */
kvs_status kvs_codec_think_channels(const kvs_codec *c, const float *q, int64_t n_q, int group, const float *k,
                                    int64_t P, int64_t d, double *score, uint8_t *keep);

/*! kvs_codec_quant_group() : the integer arithmetic above on m elements x[i * stride] (i < m), written to
 *  out[i * stride] (may alias x). *scale and *zero (may be NULL) receive the stored fp16 values as floats.
 *  KVS_ERR_INVALID_ARG for bits outside {2,3,4,8} or m < 1; KVS_ERR_RANGE for non-finite input or fp16 overflow. */
kvs_status kvs_codec_quant_group(const float *x, int64_t stride, int64_t m, int bits, float *out, float *scale,
                                 float *zero);

/*! kvs_codec_fp8_round() : x rounded to the nearest value of `format` (ties to even), saturating to +-max (448 for
 *  e4m3fn, 57344 for e5m2; infinities too), sign of zero kept, NaN returned as NaN. */
float kvs_codec_fp8_round(float x, kvs_codec_fp8_format format);

/*! kvs_codec_fp8_max() : 448 or 57344. */
float kvs_codec_fp8_max(kvs_codec_fp8_format format);

/* ---- one stream: state per (layer, KV head) ---------------------------------------------------------------- */

/*! kvs_codec_state_create() : the state of one (layer, KV head) stream of up to max_positions positions with head
 *  dimension d (1..KVS_CODEC_MAX_HEAD_DIM): the buffers of the rows attention sees, for K and V (2 x max_positions
 *  x d floats), allocated here once. Caller owns *out, frees with kvs_codec_state_free. Borrows `c`, which must
 *  outlive it. KVS_ERR_INVALID_ARG on bad sizes, KVS_ERR_NOMEM. */
kvs_status kvs_codec_state_create(const kvs_codec *c, int64_t d, int64_t max_positions, kvs_codec_state **out);

/*! kvs_codec_state_free() : accepts NULL. */
void kvs_codec_state_free(kvs_codec_state *st);

/*! kvs_codec_state_prefill_queries() : think only (kvs_codec_needs_queries): the prompt's queries of this stream's
 *  KV head, before kvs_codec_state_prefill. q = [n_q][group][d] (borrowed, read now): the queries of the prompt's
 *  LAST n_q positions P - n_q .. P - 1 (the last row is position P - 1, whose query ends the prompt), for each of
 *  the `group` query heads that share this KV head (kvs_policy_view's layout of view->q at the prefill). Only the
 *  last min(window, n_q) positions are read. How a driver calls it: for each (layer, KV head) state, before its
 *  prefill, pass the first prompt's queries (all P of them, or at least the last min(window, P)); n_q must not
 *  exceed P (checked at the prefill). A prompt of P = 0 needs no call. KVS_ERR_INVALID_ARG for another codec or bad
 *  sizes; KVS_ERR_STATE after the prefill or when called twice; KVS_ERR_RANGE for a non-finite window query. */
kvs_status kvs_codec_state_prefill_queries(kvs_codec_state *st, const float *q, int64_t n_q, int group);

/*! kvs_codec_state_prefill() : the prompt of P positions (0 <= P <= max_positions): k, v = its rows [P][d] (borrowed,
 *  read now). Calibrates fp8 scale=prompt per=head from them; the state is then at step n = P (every row as
 *  captured: prefill attention is full precision). Called once, before any kvs_codec_state_advance.
 *  think: scores the channels and fixes the kept set (kvs_codec_state_kept); KVS_ERR_STATE when P > 0 and
 *  kvs_codec_state_prefill_queries was not called, KVS_ERR_INVALID_ARG when it was given more than P positions or
 *  fewer than min(window, P), KVS_ERR_RANGE for a non-finite prompt K row.
 *  KVS_ERR_STATE when called twice; KVS_ERR_INVALID_ARG on a bad P; KVS_ERR_RANGE for a non-finite prompt row
 *  under fp8 scale=prompt. */
kvs_status kvs_codec_state_prefill(kvs_codec_state *st, const float *k, const float *v, int64_t P);

/*! kvs_codec_share_scale() : fp8 scale=prompt per=tensor: after every KV head of a layer had its prefill, sets each
 *  one's K scale to max over heads of amax(|prompt K|) / max_fp8 (V likewise). A no-op for any other codec.
 *  KVS_ERR_STATE when a state has had no prefill or has advanced already; KVS_ERR_INVALID_ARG when the states do
 *  not share one codec. */
kvs_status kvs_codec_share_scale(kvs_codec_state *const *states, int n_states);

/*! kvs_codec_state_advance() : moves the stream to decode step n (positions 0..n-1 exist; the query is position n-1):
 *  k, v = the rows [n][d] of positions 0..n-1 (borrowed, read now; only the rows the state has not seen yet are
 *  read, never a row >= n: rows of earlier steps come from the state's own copies). Each group is quantized once,
 *  from those copies, when it becomes final (the time rule), so a stream of N steps costs O(N * d) in all.
 *  n may equal the current step (nothing to do). KVS_ERR_STATE before the prefill or when n goes back, or under
 *  per=tensor before kvs_codec_share_scale; KVS_ERR_INVALID_ARG for n > max_positions; the arithmetic's
 *  KVS_ERR_RANGE. On error the state is unchanged. */
kvs_status kvs_codec_state_advance(kvs_codec_state *st, const float *k, const float *v, int64_t n);

/*! kvs_codec_state_rows() : the rows [n][d] of positions 0..n-1 of K or V as attention sees them at the current step
 *  n: dequantized below q(n), as captured from q(n) on. Borrowed from st, valid until the next advance. */
const float *kvs_codec_state_rows(const kvs_codec_state *st, kvs_codec_tensor t);

/*! kvs_codec_state_step() : the current step n (P after the prefill; -1 before it). */
int64_t kvs_codec_state_step(const kvs_codec_state *st);

/*! kvs_codec_state_quantized() : q(n) of K or V at the current step: positions below it are quantized. */
int64_t kvs_codec_state_quantized(const kvs_codec_state *st, kvs_codec_tensor t);

/*! kvs_codec_state_scale() : fp8 scale of K or V in use (1 before calibration, or for the integer codecs). */
float kvs_codec_state_scale(const kvs_codec_state *st, kvs_codec_tensor t);

/*! kvs_codec_state_channel_scores() : think: the d channel scores of the prefill (borrowed from st); NULL before
 *  the prefill or for another codec. */
const double *kvs_codec_state_channel_scores(const kvs_codec_state *st);

/*! kvs_codec_state_kept() : think: keep[d], 1 for a kept key channel (borrowed from st); NULL before the prefill
 *  or for another codec. */
const uint8_t *kvs_codec_state_kept(const kvs_codec_state *st);

/* Storage of a resident set, in bytes, split as the header's "Bytes" section counts it. */
typedef struct {
    double k_codes, k_meta, k_full; /* K: quantized codes, fp16 scales/zeros, rows held in 16 bits */
    double v_codes, v_meta, v_full; /* V: the same */
    double scale;                   /* fp8 per-head scales */
                                    /* think: k_codes = pruned K rows, k_meta = the channel mask */
    double total;                   /* the sum of the above */
} kvs_codec_bytes;

/*! kvs_codec_state_bytes() : the bytes the stream holds at the current step n for the resident positions pos[0..m)
 *  (distinct, in [0, n), any order; borrowed). KVS_ERR_STATE before the prefill; KVS_ERR_INVALID_ARG for a position
 *  out of range or repeated. */
kvs_status kvs_codec_state_bytes(kvs_codec_state *st, const int64_t *pos, int64_t m, kvs_codec_bytes *out);

#endif /* KVS_CODEC_H */
