/* plan.h — capacity planning: how much KV cache a model needs and how many sequences fit beside its weights,
 * for the full cache, for compression policies at a nominal budget, and for a policy's MEASURED storage
 * profile from a replay database (../shared/DESIGN.md "Analysis: capacity planning"; POLICY_SPEC §7 G3 and the
 * claims it checks: M22, R2, D1, D10).
 *
 * Units. Every size is in bytes (doubles: exact below 2^53, i.e. 8 PiB); printed both as GB = 10^9 bytes and
 * GiB = 2^30 bytes by the command. A "token" of KV is the K and V rows of one position: per (layer, KV head)
 * 2 · head_dim · element bytes; per sequence position (all layers and KV heads) the KV bytes per token
 *   kv_per_token = 2 · n_layers · n_kv_heads · head_dim · element bytes          (POLICY_SPEC G3)
 * (an MHA model such as OPT has n_kv_heads = n_heads and head_dim = hidden / n_heads: 2 · layers · hidden · bytes).
 *
 * Policies, per (layer, KV head), at a sequence of prompt length P when the sequence holds n >= P tokens
 * (budget B in tokens per KV head, the unit of kvsim replay's budgets):
 *   full         device n
 *   constant     device min(n, B)                         (every-step budget: H2O, TOVA, StreamingLLM, ...)
 *   prompt-only  device min(P, B) + (n - P)               (SnapKV, PyramidKV, Ada-KV: generated tokens all kept)
 *   offload      device min(n, B), host n, PCIe per decode step min(n, B) + 1 tokens (the selected tokens
 *                fetched host->device, the new token written back): an upper bound for SyncKV-style offloading,
 *                which fetches only the tokens not already resident
 *   measured     the policy's measured footprint from a replay run (kvs_plan_profile below)
 * A nominal policy whose layout is per query head (kvs_plan_policy.per_query_head: H2O, SnapKV, ... with
 * gqa=expand keep one set per query head) holds G = n_heads / n_kv_heads such sets per KV head: G times the
 * above, as the replay's storage counts them. Auxiliary state (scores, page summaries) is zero in the nominal
 * kinds; the measured profile includes it. Prefill transients (the whole prompt resident before a prompt-only
 * policy compresses it) are not counted: the footprint is the resident state at decode steps.
 *
 * A KV codec (sim/codec.h: int, kivi, hf, fp8; `kvsim plan --codec SPEC`) replaces the element size: a resident
 * position of tensor t (K or V) costs its codec row bytes r_t (kvs_plan_codec_row_bytes: d·bits/8 of codes plus
 * fp16 scale + zero, 4·ceil(d/group) for channel-axis groups, 4·d/group for token-axis groups amortised over the
 * group's positions; fp8: d), except the h_t rows the codec holds in 16 bits at that length (kvs_plan_codec_held:
 * kivi's and hf's residual, an int token-axis group not yet filled), 2·d bytes each, counted exactly at each n.
 * Per (layer, KV head), with m resident positions at length n:
 *   bytes(m, n) = sum over t of [ min(h_t(n), m) · 2d + (m - min(h_t(n), m)) · r_t ]  (+ 8 for fp8 per-head scales)
 * (the 16-bit rows are the most recent positions; a policy is assumed to keep them resident first: an upper bound
 * when it evicts recent positions), plus 8 bytes per layer for fp8 scale=prompt per=tensor. A length n = P (nothing
 * generated yet) counts the cache as the codec leaves it after the prefill (kivi: P mod R keys and min(P, R) values
 * in 16 bits; hf: none; int: the unfilled token-axis group), not the prefill's transient 16-bit prompt. Token-axis
 * metadata is amortised: exact for a cache that keeps every position (the quantized prefix is whole groups); a
 * policy that keeps one position of many groups holds more (a group's scale and zero stay while any of its
 * positions does). The residual saw-tooths (it fills, then is quantized at once), so a sequence's peak over its
 * decode is taken at both ends and at the last step before each flush.
 */
#ifndef KVS_ANALYSIS_PLAN_H
#define KVS_ANALYSIS_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "../common/kvs.h"
#include "../sim/codec.h"
#include "../trace/trace.h"

/* ---- models ---------------------------------------------------------------------------------------- */

/* How the weights are counted from the shape. */
typedef enum {
    KVS_PLAN_ARCH_GATED = 0, /* Llama, Mistral, Qwen2, Phi-3/4: q,k,v,o; gate/up/down MLP; two RMSNorms per layer */
    KVS_PLAN_ARCH_OPT = 1,   /* OPT: q,k,v,o and fc1/fc2 with biases, two LayerNorms, learned positions */
} kvs_plan_arch;

/* A model's shape: what planning needs from a config.json. */
typedef struct {
    char name[64];
    char source[192];       /* where the shape comes from (a preset's citation, a file path, a trace) */
    kvs_plan_arch arch;
    int32_t n_layers, n_heads, n_kv_heads, head_dim;
    int32_t hidden;         /* residual width (hidden_size) */
    int32_t intermediate;   /* MLP width (intermediate_size; OPT ffn_dim) */
    int32_t vocab;
    int32_t max_positions;  /* max_position_embeddings (the context the model was trained for) */
    int tied_embeddings;    /* 1: the classifier is the token embedding (counted once); 0: untied; -1: not known
                             * (a trace header that does not record it): counted untied, the larger weights */
    int qkv_bias;           /* q/k/v projections carry biases (Qwen2, attention_bias) */
    int o_bias;             /* the output projection carries a bias (Llama attention_bias) */
    /* Sliding-window layers (hybrid KV shapes, Gemma-3's local layers): window_layers of the n_layers attend to the
     * last `window` positions only, so their full cache IS min(n, window) positions and every policy's resident
     * there is at most that (kvs_plan_footprint_windowed). 0 / 0: every layer full. */
    int32_t window, window_layers;
} kvs_plan_model;

/*! kvs_plan_preset_count() / kvs_plan_preset_at() : the built-in presets (published shapes), in listing order. */
int kvs_plan_preset_count(void);
const kvs_plan_model *kvs_plan_preset_at(int i);

/*! kvs_plan_preset_find() : the preset named `name` (case-insensitive) into *out (borrowed, static); else
 *  KVS_ERR_INVALID_ARG "unknown preset 'X' (kvsim plan --list-presets lists them)". */
kvs_status kvs_plan_preset_find(const char *name, const kvs_plan_model **out);

/*! kvs_plan_model_from_config() : the shape from a Hugging Face config.json (`path` the file, or a folder holding
 *  one): num_hidden_layers, num_attention_heads, num_key_value_heads (default: num_attention_heads), head_dim
 *  (default hidden_size / num_attention_heads), hidden_size, intermediate_size (OPT: ffn_dim), vocab_size,
 *  max_position_embeddings, tie_word_embeddings (default false; OPT: true), attention_bias (q/k/v/o biases;
 *  Qwen2: q/k/v always), model_type "opt" selecting the OPT weight count: the count of the capture's loader
 *  (gpu_capture/model.c kvs_model_info.n_params) for the models it loads. Any architecture is accepted: only the shape is read (the capture's reader,
 *  gpu_capture/model.c, also checks that the CPU forward pass can run the model, which planning does not need).
 *  KVS_ERR_IO unreadable; KVS_ERR_FORMAT malformed or a field missing or out of range (detail names it). */
kvs_status kvs_plan_model_from_config(const char *path, kvs_plan_model *out);

/*! kvs_plan_model_from_trace() : the shape recorded in a trace header `c` (gated-MLP Llama family) and what its
 *  capture settings `settings` (kvs_capture_config.settings, may be NULL) say about the weights:
 *  tie_word_embeddings=0|1, qkv_bias=0|1, o_bias=0|1 when recorded, architecture=Qwen2ForCausalLM (q/k/v biases).
 *  A header that does not record the tie leaves tied_embeddings -1 (not known; kvs_plan_params counts it untied):
 *  the caller says so, or sets it from what the user knows. `source` names the trace. */
void kvs_plan_model_from_trace(const kvs_model_config *c, const char *settings, const char *source,
                               kvs_plan_model *out);

/*! kvs_plan_window_parse() : `kvsim plan --window SPEC` into m: "W" every layer attends to the last W positions,
 *  "W/K" every K-th layer is full and the others have window W (Gemma-3: 1024/6 = layers 6, 12, ... full, i.e.
 *  n_layers - floor(n_layers / K) windowed), "0" no window. KVS_ERR_INVALID_ARG naming the form otherwise. */
kvs_status kvs_plan_window_parse(const char *spec, kvs_plan_model *m);

/*! kvs_plan_params() : parameters counted from the shape (see kvs_plan_arch); one count whatever the model's source
 *  (preset, config.json, trace): a tied classifier once, an unknown tie (-1) as untied. */
double kvs_plan_params(const kvs_plan_model *m);

/*! kvs_plan_kv_bytes_per_token() : 2 · n_layers · n_kv_heads · head_dim · elem_bytes. */
double kvs_plan_kv_bytes_per_token(const kvs_plan_model *m, double elem_bytes);

/*! kvs_plan_dtype_bytes() : bytes per element of "fp32" (4), "fp16"/"bf16" (2), "fp8" (1), "int4" (0.5: the
 *  4-bit codes only, for weights; a KV cache of 4-bit codes carries scales and zero points: a codec, never this
 *  element size); else KVS_ERR_INVALID_ARG naming the accepted types. */
kvs_status kvs_plan_dtype_bytes(const char *name, double *bytes);

/*! kvs_plan_kv_dtype_bytes() : the plain KV element sizes fp32, fp16, bf16, fp8 as kvs_plan_dtype_bytes; "int4" is
 *  KVS_ERR_INVALID_ARG naming the codec that says what a 4-bit cache holds ("--codec int:bits=4"). */
kvs_status kvs_plan_kv_dtype_bytes(const char *name, double *bytes);

/* ---- KV codecs (sim/codec.h), the byte rule in the header above ------------------------------------- */

/*! kvs_plan_codec_row_bytes() : bytes of one quantized row of tensor t for head dimension d: codes plus its share of
 *  fp16 scales and zero points (token-axis groups amortised over `group` positions); fp8: d. K + V sums to
 *  kvs_codec_position_bytes(c, d). */
double kvs_plan_codec_row_bytes(const kvs_codec *c, kvs_codec_tensor t, int64_t d);

/*! kvs_plan_codec_held() : rows of tensor t held in 16 bits per (layer, KV head) when a sequence with prompt P
 *  holds n >= P positions: n - q(n) of codec.h's time rule at decode step n > P (kivi K: n - R·floor((n-1)/R),
 *  kivi V: min(n, R+1), hf: n - P - R·floor((n-1-P)/R), int token axis: n mod group, channel axis and fp8: 0);
 *  at n = P the state after the prefill (kivi K: P mod R, V: min(P, R); hf 0; int token axis P mod group). */
int64_t kvs_plan_codec_held(const kvs_codec *c, kvs_codec_tensor t, int64_t prompt, int64_t n);

/*! kvs_plan_codec_bytes() : bytes(m, n) of the header per (layer, KV head) for m = `resident` positions (token
 *  equivalents, at most n) at length n of a sequence with prompt P, the per-head fp8 scales excluded. */
double kvs_plan_codec_bytes(const kvs_codec *c, int64_t d, int64_t prompt, int64_t n, double resident);

/*! kvs_plan_codec_head_bytes() : bytes a (layer, KV head) of head dimension d holds once per sequence: 8 for fp8
 *  scale=prompt per=head (fp32 K and V scales), d for think (its kept-channel mask, one byte per channel, counted
 *  whenever the codec is think: a prompt no longer than `recent` prunes nothing and a replay would not count it),
 *  0 otherwise. Per layer: kvs_codec_layer_bytes. */
double kvs_plan_codec_head_bytes(const kvs_codec *c, int64_t d);

/*! kvs_plan_codec_bytes_per_token() : n_layers · n_kv_heads · kvs_codec_position_bytes(c, head_dim): the bytes of
 *  one quantized position, residual rows and scales held once per sequence excluded. */
double kvs_plan_codec_bytes_per_token(const kvs_plan_model *m, const kvs_codec *c);

/* ---- policies --------------------------------------------------------------------------------------- */

typedef enum {
    KVS_PLAN_FULL = 0,
    KVS_PLAN_CONSTANT = 1,
    KVS_PLAN_PROMPT_ONLY = 2,
    KVS_PLAN_OFFLOAD = 3,
    KVS_PLAN_MEASURED = 4,
} kvs_plan_kind;

/*! kvs_plan_kind_name() : "full", "constant", "prompt-only", "offload", "measured". */
const char *kvs_plan_kind_name(kvs_plan_kind k);

/* How a measured run's auxiliary bytes carry to the planned model: per component, by what it depends on
 * (the policies' account() hooks, policies/<name>.c, and POLICY_SPEC §3 say what each class holds):
 *   copies    how many of it a KV head holds:
 *               PER_KV_HEAD     one (page summaries shared by the group, SyncKV's index lists)      x 1
 *               PER_LIST        one per set the run keeps: G for a per_query_head run, else one     x copies of the KV
 *               PER_QUERY_HEAD  one per query head whatever the layout (MorphKV's G·R profile rows) x G_plan / G_trace
 *   head_dim  -1: independent of it (scalars: scores, counters, indices); k >= 0: proportional to head_dim + k
 *             (page min/max: 2·d, SparQ's key copy: d, MorphKV's qz rows: d + 1 with Z, d without)
 *   kv_elements 1: stored in the KV element type (x planned KV element bytes / the run's); 0: in the auxiliary
 *             element type, bytes as measured (fp32 scores: the replay's aux_bytes, kept on the planned model). */
typedef enum {
    KVS_PLAN_AUX_PER_KV_HEAD = 0,
    KVS_PLAN_AUX_PER_LIST = 1,
    KVS_PLAN_AUX_PER_QUERY_HEAD = 2,
} kvs_plan_aux_copies;

typedef struct {
    kvs_plan_aux_copies copies;
    int head_dim_offset;  /* -1: independent of head_dim; k >= 0: proportional to head_dim + k */
    int kv_elements;      /* 1: KV element type; 0: auxiliary element type (bytes as measured) */
    char what[96];        /* what the state is, for people ("a score per held slot") */
} kvs_plan_aux_rule;

/* The override of `kvsim plan --aux-scale` (the rule's head_dim and element dependence; its copies stay the
 * policy's, a fact of the layout). AUTO = the policy's own rule (kvs_plan_aux_rule_of). */
typedef enum {
    KVS_PLAN_AUX_AUTO = 0, /* the policy's rule */
    KVS_PLAN_AUX_KV = 1,   /* proportional to head_dim, in KV elements (head_dim_offset 0, kv_elements 1) */
    KVS_PLAN_AUX_NONE = 2, /* bytes as measured per copy (head_dim_offset -1, kv_elements 0) */
} kvs_plan_aux_scale;

/*! kvs_plan_aux_rule_of() : the auxiliary-state rule of registered policy `policy` with canonical parameters
 *  `params` (MorphKV's depends on profile= and fidelity=) into *out. KVS_ERR_INVALID_ARG "no auxiliary scaling
 *  rule for policy 'X' (--aux-scale kv|none says one)" for a name the planner does not know. */
kvs_status kvs_plan_aux_rule_of(const char *policy, const char *params, kvs_plan_aux_rule *out);

/* A straight line y = a + b·x fitted by least squares. */
typedef struct {
    double a, b;
} kvs_plan_line;

/* A policy's measured storage profile: the footprints of one replay run per (layer, KV head), mean over layers
 * and KV heads, in units of the run's token size tok = 2 · head_dim · KV element bytes of the traced model
 * ("token equivalents"), each fitted as a line in x over the run's STEADY STATE:
 *   x = n - P_trace (tokens generated so far) for a prompt-only run (budget_scope "prompt": its prompt part is
 *       bounded by the budget, so the line carries to a planned prompt of another length), else x = n (the
 *       sequence length at the step: position + 1).
 *   The steady state is the decode steps (n > P_trace) at which the policy holds what it will hold for the rest
 *   of a long sequence: for an every-step budget the steps with n > B (the cache is full and the policy has
 *   evicted; before, it is still filling, and a line through the filling steps is steeper than either part);
 *   for a prompt-only budget every decode step, provided P_trace >= B (else the prompt was never compressed:
 *   the run shows no steady state); for no budget (the full cache) every decode step. A run that never reaches
 *   it is refused (kvs_plan_profile_fit).
 * The planned footprint per (layer, KV head) at length n and planned prompt P is then, with x as above (x = n - P
 * for prompt-only), kv'(x) = min(kv(x), lists_trace · n) (below its budget a policy holds at most what was seen:
 * the filling phase, piecewise) and f = kv'(x) / kv(x):
 *   device = c · kv'(x) · tok_plan + f · aux(x) · tok · (the aux rule's factor),  host = host(x) · tok_plan,
 *   PCIe per step = transfer(x) · tok_plan
 * i.e. the measured number of token equivalents per KV head carries over, the bytes per token change with the
 * model (lines clamped at 0). c = 1, except for a run whose layout is per_query_head (a set per query head: its
 * storage counts the G_trace copies of a GQA group): c = G_plan / G_trace, the copies the planned model's groups
 * hold. The aux rule's factor: (PER_LIST: c; PER_QUERY_HEAD: G_plan / G_trace; PER_KV_HEAD: 1) x (head_dim_offset
 * k >= 0: (d_plan + k) / (d_trace + k)) x (kv_elements: planned KV element bytes / the run's). */
typedef struct {
    int64_t run_id;
    char policy[64];
    char params[256];
    char budget_scope[16];     /* "every_step", "prompt" or "none" */
    int64_t budget_tokens;
    char trace_model[64];
    int64_t trace_id;
    int32_t trace_head_dim;
    double trace_elem_bytes;   /* KV element bytes the run accounted in (its kv_bytes option, else the trace's) */
    double tok_bytes;          /* 2 · trace_head_dim · trace_elem_bytes */
    int64_t prompt_len;        /* the trace's (first) prompt */
    int x_is_generated;        /* 1: x = n - prompt (prompt-only run) */
    int per_query_head;        /* 1: the run's layout was per_query_head (storage counts trace_group copies) */
    int32_t trace_group;       /* query heads per KV head of the traced model */
    kvs_plan_line kv, aux, host, transfer; /* token equivalents per (layer, KV head) against x */
    double kv_r2;              /* R² of the device (kv + aux) fit; 1 when the footprint is constant */
    int64_t n_points;          /* measured positions given to the fit */
    int64_t n_min, n_max;      /* sequence lengths measured */
    int64_t fit_points;        /* the steady-state positions the lines are fitted on */
    int64_t fit_n_min, fit_n_max; /* their sequence lengths */
    kvs_plan_line read_kv, read_aux; /* device bytes READ per decode step per (layer, KV head), token equivalents
                               * against x (the replay's traffic_kv / traffic_aux series, fitted on the same steady
                               * state by kvs_plan_profile_fit_reads); used by the roofline (plan_time.h) */
    int has_reads;             /* 1: read_kv / read_aux were fitted; 0: reads taken as the resident footprint */
    kvs_plan_aux_scale aux_scale; /* input: AUTO (the policy's rule) or an override */
    kvs_plan_aux_rule aux_rule;   /* the rule in effect (set by kvs_plan_profile_read; kvs_plan_profile_fit keeps it) */
} kvs_plan_profile;

/*! kvs_plan_profile_steady_from() : the first sequence length of the steady state of a run (the rule above):
 *  B + 1 for budget_scope "every_step" (at least P_trace + 1), P_trace + 1 otherwise; -1 for a prompt-only run
 *  whose prompt is shorter than its budget (no steady state). p->budget_scope, budget_tokens, prompt_len must be
 *  set. */
int64_t kvs_plan_profile_steady_from(const kvs_plan_profile *p);

/*! kvs_plan_profile_fit() : fits the profile's lines on the steady-state points among `count` measured ones:
 *  n[i] the sequence length, kv/aux/host/transfer[i] BYTES per (layer, KV head) at it (NaN = not measured: treated
 *  as 0 for aux, host and transfer, an error for kv; aux/host/transfer may be NULL). p->tok_bytes, prompt_len,
 *  budget_scope and budget_tokens must be set; x_is_generated is set from budget_scope. KVS_ERR_INVALID_ARG for
 *  count < 1, and, naming the policy, budget and lengths, for a run that never reaches its steady state (an
 *  every-step run whose longest measured sequence is within its budget; a prompt-only run whose prompt is shorter
 *  than its budget). */
kvs_status kvs_plan_profile_fit(kvs_plan_profile *p, const int64_t *n, const double *kv, const double *aux,
                                const double *host, const double *transfer, int64_t count);

/*! kvs_plan_profile_fit_reads() : fits p->read_kv and p->read_aux on the steady-state points (the same rule and x
 *  as kvs_plan_profile_fit, which must have succeeded on `p`) from rkv/raux[i], BYTES read per decode step per
 *  (layer, KV head) at sequence length n[i] (NaN or NULL = 0); sets has_reads. KVS_ERR_INVALID_ARG for count < 1. */
kvs_status kvs_plan_profile_fit_reads(kvs_plan_profile *p, const int64_t *n, const double *rkv, const double *raux,
                                      int64_t count);

/*! kvs_plan_aux_describe() : the auxiliary rule in effect for `p` (its aux_rule under its aux_scale) as people read
 *  it, e.g. "auto: per list, independent of head_dim, in auxiliary elements as measured (a score per held slot,
 *  per list)", into buf (cap bytes, always NUL-terminated). */
void kvs_plan_aux_describe(const kvs_plan_profile *p, char *buf, size_t cap);

/* A policy to plan with. */
typedef struct {
    kvs_plan_kind kind;
    int64_t budget;                  /* tokens per KV head: constant, prompt-only, offload */
    const kvs_plan_profile *profile; /* measured only (borrowed) */
    int per_query_head;              /* nominal kinds: one set per query head, G per KV head (the policy's layout) */
} kvs_plan_policy;

/* Footprint per (layer, KV head), in bytes of the planned model. */
typedef struct {
    double device, host, transfer; /* resident on the GPU; resident on the host; host<->device per decode step */
} kvs_plan_footprint;

/* ---- the plan --------------------------------------------------------------------------------------- */

/* Everything a plan depends on. */
typedef struct {
    kvs_plan_model model;
    double kv_elem_bytes;     /* KV element bytes (kvs_plan_dtype_bytes); with a codec 2, its 16-bit rows' */
    const kvs_codec *codec;   /* NULL: every element kv_elem_bytes; else the codec's bytes (borrowed) */
    double weight_elem_bytes; /* weight element bytes; 0 = weights not resident on the GPUs */
    double gpu_bytes;         /* memory per GPU; 0 = not given (no max batch / max context) */
    int32_t n_gpus;           /* the weights are sharded over them (tensor parallel): resident once in total */
    double reserve_bytes;     /* per GPU, held back for activations and the runtime */
} kvs_plan_setup;

/*! kvs_plan_footprint_at() : the footprint of `pol` per (layer, KV head) of s->model at s->kv_elem_bytes for a
 *  sequence with prompt P that holds n >= P tokens (formulas above). With s->codec the device's positions cost
 *  kvs_plan_codec_bytes (sets x of them, + the per-head fp8 scales) and host and PCIe tokens the codec's nominal
 *  bytes per position (kvs_codec_position_bytes: the 16-bit residual stays on the device). */
kvs_plan_footprint kvs_plan_footprint_at(const kvs_plan_policy *pol, const kvs_plan_setup *s, int64_t prompt,
                                         int64_t n);

/*! kvs_plan_footprint_windowed() : the footprint per (layer, KV head) of a sliding-window layer of s->model: the
 *  policy's own (kvs_plan_footprint_at) with its device bytes capped by the full cache of min(n, window) positions
 *  (a position that left the window is dropped by every policy: an upper bound for a policy whose kept positions
 *  straddle the window's edge); host and transfer as the policy's. */
kvs_plan_footprint kvs_plan_footprint_windowed(const kvs_plan_policy *pol, const kvs_plan_setup *s, int64_t prompt,
                                               int64_t n);

/* What one decode step reads per (layer, KV head), in bytes of the planned model, and how many positions each query
 * head attends (the attention FLOPs). */
typedef struct {
    double kv, aux;      /* K/V bytes read for attention; auxiliary bytes read (scores, page summaries, key copies) */
    double attended;     /* positions one query head attends */
} kvs_plan_reads;

/*! kvs_plan_reads_at() : the reads of one decode step of `pol` at length n >= P (prompt P) per (layer, KV head):
 *  nominal kinds read what they hold on the device (kv = footprint device, aux 0; a per-query-head layout's G sets,
 *  each query head attending one); a measured profile its fitted read lines when it has them (has_reads), scaled
 *  as its storage (KV: copies x the planned token size, or the codec's bytes of that many positions; aux: the aux
 *  rule's factor), at most the tokens seen, else its device footprint. */
kvs_plan_reads kvs_plan_reads_at(const kvs_plan_policy *pol, const kvs_plan_setup *s, int64_t prompt, int64_t n);

/*! kvs_plan_reads_windowed() : the reads of one decode step of a sliding-window layer of s->model per (layer, KV
 *  head): the policy's own (kvs_plan_reads_at) with the K/V read capped by the full cache's read of min(n, window)
 *  positions and the positions attended capped at min(n, window) (a position that left the window is neither held
 *  nor attended); the auxiliary reads as the policy's. kvs_plan_reads_at when the model has no window or n <= it. */
kvs_plan_reads kvs_plan_reads_windowed(const kvs_plan_policy *pol, const kvs_plan_setup *s, int64_t prompt, int64_t n);

/*! kvs_plan_aux_factor() : what the measured auxiliary bytes of `p` are multiplied by on the planned setup `s` (the
 *  rule's copies x head_dim x element factors, plan.h), in the steady state. */
double kvs_plan_aux_factor(const kvs_plan_profile *p, const kvs_plan_setup *s);

/*! kvs_plan_weight_bytes() : kvs_plan_params · weight element bytes (0 when not resident). */
double kvs_plan_weight_bytes(const kvs_plan_setup *s);

/*! kvs_plan_kv_pool() : GPU memory left for the KV cache: n_gpus · (gpu_bytes - reserve_bytes) - weight bytes.
 *  KVS_ERR_INVALID_ARG "impossible memory: ..." when that is not positive (the weights alone do not fit), or
 *  when gpu_bytes is 0 ("no GPU memory given"). */
kvs_status kvs_plan_kv_pool(const kvs_plan_setup *s, double *pool);

/* The context that "max context" reports when any context fits (a constant-size footprint). */
#define KVS_PLAN_UNBOUNDED INT64_MAX
/* The largest context searched. */
#define KVS_PLAN_MAX_CONTEXT (INT64_C(1) << 40)

/* One planned point: a policy at (context, response, batch). */
typedef struct {
    int64_t context, response, batch;
    double seq_device_bytes;   /* per sequence: the device peak over its decode (n from context to context+response;
                                * with a codec its per-layer scales included) */
    double total_bytes;        /* batch · seq_device_bytes */
    double host_bytes;         /* batch · host bytes at the end */
    double pcie_bytes_per_step;/* batch · host<->device bytes of the last decode step */
    int64_t max_batch;         /* sequences of (context, response) that fit; -1 without GPU memory */
    int64_t max_context;       /* the largest context with `response` more tokens at `batch` that fits in memory AND
                                * in the model's context (context + response <= max_positions, when known), found by
                                * bisection: with a codec, whose 16-bit rows saw-tooth, a context that fits whose
                                * next does not (a longer one within one residual or group may fit too);
                                * KVS_PLAN_UNBOUNDED when every context up to KVS_PLAN_MAX_CONTEXT does and the
                                * model's context is not known; 0 when none; -1 without GPU memory */
    int64_t max_context_memory;/* the same bound from memory alone, the model's context not applied */
    int context_clamped;       /* 1: the model's context, not memory, bounds max_context */
} kvs_plan_point;

/*! kvs_plan_eval() : the point of `pol` at (context >= 1, response >= 0, batch >= 1); the capacity fields when
 *  s->gpu_bytes > 0, where an impossible memory is the error of kvs_plan_kv_pool. max_context is clamped to
 *  s->model.max_positions - response (0 when the response alone fills the context) when max_positions > 0. */
kvs_status kvs_plan_eval(const kvs_plan_setup *s, const kvs_plan_policy *pol, int64_t context, int64_t response,
                         int64_t batch, kvs_plan_point *out);

/* ---- option lists (`kvsim plan --responses`, `--settings`) -------------------------------------------- */

/* The most entries of one list. */
#define KVS_PLAN_MAX_LIST 64

/*! kvs_plan_parse_list() : a comma list "R,R,..." of at most KVS_PLAN_MAX_LIST whole numbers in [lo, 2^40] into
 *  out[0..*n) (out holds KVS_PLAN_MAX_LIST); `opt` names the option in messages. KVS_ERR_INVALID_ARG with a detail
 *  echoing the text for an empty list, an empty or over-long item, too many items or a bad number. */
kvs_status kvs_plan_parse_list(const char *opt, const char *v, int64_t lo, int64_t *out, int *n);

/*! kvs_plan_parse_settings() : a comma list "C+R,C+R,..." of (context in [1, 2^40], response in [0, 2^40]) into
 *  ctx[0..*n), resp[0..*n) (each holds KVS_PLAN_MAX_LIST). Errors as kvs_plan_parse_list. */
kvs_status kvs_plan_parse_settings(const char *v, int64_t *ctx, int64_t *resp, int *n);

#endif /* KVS_ANALYSIS_PLAN_H */
