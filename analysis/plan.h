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
 * Auxiliary state (scores, page summaries) is zero in the nominal kinds; the measured profile includes it.
 * Prefill transients (the whole prompt resident before a prompt-only policy compresses it) are not counted:
 * the footprint is the resident state at decode steps.
 */
#ifndef KVS_ANALYSIS_PLAN_H
#define KVS_ANALYSIS_PLAN_H

#include <stdint.h>

#include "../common/kvs.h"
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
    int tied_embeddings;    /* the classifier is the token embedding (counted once) */
    int qkv_bias;           /* q/k/v projections carry biases (Qwen2) */
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
 *  max_position_embeddings, tie_word_embeddings (default false; OPT: true), model_type "opt" selecting the OPT
 *  weight count. Any architecture is accepted: only the shape is read (the capture's reader,
 *  gpu_capture/model.c, also checks that the CPU forward pass can run the model, which planning does not need).
 *  KVS_ERR_IO unreadable; KVS_ERR_FORMAT malformed or a field missing or out of range (detail names it). */
kvs_status kvs_plan_model_from_config(const char *path, kvs_plan_model *out);

/*! kvs_plan_model_from_trace() : the shape recorded in a trace header (gated-MLP Llama family, untied: the
 *  header does not say; the weight count is approximate for tied models). `source` names the trace. */
void kvs_plan_model_from_trace(const kvs_model_config *c, const char *source, kvs_plan_model *out);

/*! kvs_plan_params() : parameters counted from the shape (see kvs_plan_arch). */
double kvs_plan_params(const kvs_plan_model *m);

/*! kvs_plan_kv_bytes_per_token() : 2 · n_layers · n_kv_heads · head_dim · elem_bytes. */
double kvs_plan_kv_bytes_per_token(const kvs_plan_model *m, double elem_bytes);

/*! kvs_plan_dtype_bytes() : bytes per element of "fp32" (4), "fp16"/"bf16" (2), "fp8" (1), "int4" (0.5: the
 *  4-bit codes only; per-group scales and zero points of a real int4 cache are not counted); else
 *  KVS_ERR_INVALID_ARG naming the accepted types. */
kvs_status kvs_plan_dtype_bytes(const char *name, double *bytes);

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

/* How measured auxiliary bytes are carried to the planned model (kvs_plan_profile). */
typedef enum {
    KVS_PLAN_AUX_KV = 0,   /* scaled like the KV, by the per-token KV size of one KV head (state proportional to
                            * head_dim: page min/max, sketches, merged K/V) */
    KVS_PLAN_AUX_NONE = 1, /* kept as measured per (layer, KV head) (per-token scalars: scores, counters) */
} kvs_plan_aux_scale;

/* A straight line y = a + b·x fitted by least squares. */
typedef struct {
    double a, b;
} kvs_plan_line;

/* A policy's measured storage profile: the footprints of one replay run, per (layer, KV head) and mean over
 * layers and KV heads, in units of the trace's token size tok = 2 · head_dim · element bytes of the traced
 * model ("token equivalents"), each fitted as a line in x:
 *   x = n - P_trace (tokens generated so far) for a prompt-only run (budget_scope "prompt": its prompt part is
 *       bounded by the budget, so the line carries to a planned prompt of another length), else x = n (the
 *       sequence length at the step: position + 1).
 * The planned footprint per (layer, KV head) at length n and planned prompt P is then, with x as above (x = n - P
 * for prompt-only) and tok_plan = 2 · head_dim · element bytes of the planned model:
 *   device = c·(kv(x)·tok_plan + aux(x)·(aux_scale = kv ? tok_plan : tok)),  host = host(x)·tok_plan,
 *   PCIe per step = transfer(x)·tok_plan
 * i.e. the measured number of token equivalents per KV head carries over, the bytes per token change with the
 * model (lines clamped at 0). c = 1, except for a run whose layout is per_query_head (a set per query head: its
 * storage counts the G_trace copies of a GQA group): c = G_plan / G_trace, the copies the planned model's groups
 * hold. */
typedef struct {
    int64_t run_id;
    char policy[64];
    char params[256];
    char budget_scope[16];     /* "every_step", "prompt" or "none" */
    int64_t budget_tokens;
    char trace_model[64];
    int64_t trace_id;
    int32_t trace_head_dim;
    double trace_elem_bytes;   /* element bytes of the trace's K/V (the replay accounts in them) */
    double tok_bytes;          /* 2 · trace_head_dim · trace_elem_bytes */
    int64_t prompt_len;        /* the trace's (first) prompt */
    int x_is_generated;        /* 1: x = n - prompt (prompt-only run) */
    int per_query_head;        /* 1: the run's layout was per_query_head (storage counts trace_group copies) */
    int32_t trace_group;       /* query heads per KV head of the traced model */
    kvs_plan_line kv, aux, host, transfer; /* token equivalents per (layer, KV head) against x */
    double kv_r2;              /* R² of the device (kv + aux) fit; 1 when the footprint is constant */
    int64_t n_points;          /* measured positions */
    int64_t n_min, n_max;      /* sequence lengths measured */
    kvs_plan_aux_scale aux_scale;
} kvs_plan_profile;

/*! kvs_plan_profile_fit() : fits the profile's lines from `count` measured points: n[i] the sequence length,
 *  kv/aux/host/transfer[i] BYTES per (layer, KV head) at it (NaN = not measured: treated as 0 for host and
 *  transfer, an error for kv). p->tok_bytes, p->prompt_len and p->x_is_generated must be set. KVS_ERR_INVALID_ARG
 *  for count < 1. */
kvs_status kvs_plan_profile_fit(kvs_plan_profile *p, const int64_t *n, const double *kv, const double *aux,
                                const double *host, const double *transfer, int64_t count);

/* A policy to plan with. */
typedef struct {
    kvs_plan_kind kind;
    int64_t budget;                  /* tokens per KV head: constant, prompt-only, offload */
    const kvs_plan_profile *profile; /* measured only (borrowed) */
} kvs_plan_policy;

/* Footprint per (layer, KV head), in bytes of the planned model. */
typedef struct {
    double device, host, transfer; /* resident on the GPU; resident on the host; host<->device per decode step */
} kvs_plan_footprint;

/*! kvs_plan_footprint_at() : the footprint of `pol` per (layer, KV head) for a sequence with prompt P that holds
 *  n >= P tokens, at `tok_bytes` = 2 · head_dim · element bytes of the planned model whose GQA groups have `group`
 *  query heads per KV head (formulas above). */
kvs_plan_footprint kvs_plan_footprint_at(const kvs_plan_policy *pol, int64_t prompt, int64_t n, double tok_bytes,
                                         int32_t group);

/* ---- the plan --------------------------------------------------------------------------------------- */

/* Everything a plan depends on. */
typedef struct {
    kvs_plan_model model;
    double kv_elem_bytes;     /* KV element bytes (kvs_plan_dtype_bytes) */
    double weight_elem_bytes; /* weight element bytes; 0 = weights not resident on the GPUs */
    double gpu_bytes;         /* memory per GPU; 0 = not given (no max batch / max context) */
    int32_t n_gpus;           /* the weights are sharded over them (tensor parallel): resident once in total */
    double reserve_bytes;     /* per GPU, held back for activations and the runtime */
} kvs_plan_setup;

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
    double seq_device_bytes;   /* per sequence: the device peak over its decode (n from context to context+response) */
    double total_bytes;        /* batch · seq_device_bytes */
    double host_bytes;         /* batch · host bytes at the end */
    double pcie_bytes_per_step;/* batch · host<->device bytes of the last decode step */
    int64_t max_batch;         /* sequences of (context, response) that fit; -1 without GPU memory */
    int64_t max_context;       /* the largest context with `response` more tokens at `batch` that fits;
                                * KVS_PLAN_UNBOUNDED when every context up to KVS_PLAN_MAX_CONTEXT does; 0 when
                                * none; -1 without GPU memory */
} kvs_plan_point;

/*! kvs_plan_eval() : the point of `pol` at (context >= 1, response >= 0, batch >= 1); the capacity fields when
 *  s->gpu_bytes > 0, where an impossible memory is the error of kvs_plan_kv_pool. */
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
