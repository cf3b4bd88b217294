/* policy.h — the KV-cache policy plugin interface of the kvsim replay engine (sim/replay.c).
 *
 * Follows ../shared/DESIGN.md ("Replay": teacher-forced replay, prefill hand-off, per-step selection S_t,
 * no oracle leakage, GQA layouts, allocation pass) and ../shared/POLICY_SPEC.md §1.2 (driver and call
 * order), §1.3 (slots), §1.5 (budget and cost accounting), §3 (storage/traffic table).
 *
 * ================================================================================================
 * How to add a policy
 * ================================================================================================
 * 1. Create policies/<name>.c. Open it with a comment naming the paper/POLICY_SPEC section it follows
 *    and every ambiguity you resolved. Export exactly one
 *        const struct kvs_policy_ops kvs_policy_<name> = {
 *            .version = KVS_POLICY_INTERFACE_VERSION, .name = "<name>", ... };
 *    with designated initializers; optional callbacks stay NULL. Everything else in the file is static.
 * 2. Parameters: a `static const kvs_policy_param` table (key, type, default, inclusive range, help).
 *    The framework parses "NAME:key=value,key=value", fills defaults, validates (unknown key, bad value,
 *    out of range -> KVS_ERR_INVALID_ARG naming it) and builds the canonical string stored in the results
 *    database. Read values with kvs_policy_param_get(cfg, "key") or by index (cfg->v[i], table order).
 * 3. Add one line `X(<name>)` to KVS_POLICY_REGISTRY in policies/registry.h. The conformance test
 *    (tests/test_policy_conformance.c) then runs the common contract on it: parameter validation, budget respected every step, determinism, and the
 *    leak test (perturbing future positions, and for non-oracles the K/V of positions the policy does not
 *    store, must not change its choices).
 * 4. Lifetime of one instance = one (policy configuration, budget, layer, KV head) stream:
 *       create -> [for each turn: prefill (once, or once per block with prefill_block) [-> layer_sync]
 *                  -> (select -> account -> observe [-> layer_sync]) per decode step]
 *       -> free
 *    account() is called at every decode step after select() and before observe(), so it sees the
 *    attention-time state. Per-(layer, KV head) budgets and any shared prepass structure come from the
 *    optional allocation pass (alloc_*), run once per (configuration, budget) over the first turn's
 *    prompt of every layer and KV head before any instance is created (PyramidKV, Ada-KV, D2O, SyncKV); a
 *    prompt scoring there that does not depend on the budget goes through kvs_policy_shared (sim/policy_memo.h),
 *    so the budgets of a sweep compute it once.
 * 5. Optional capabilities, each NULL / unset by default, each exercised by a test policy in
 *    tests/test_policy_v2.c:
 *    - merged slots: select() may point an entry at policy-owned K/V rows (sel->row_k/row_v) instead of
 *      the trace row of its position (D2O merging; POLICY_SPEC §1.3);
 *    - chunked prefill: prefill_block() asks for the prompt in blocks (KeyDiff block-wise prefill);
 *    - shared prepass data: alloc_shared() hands one structure to every instance (init->shared);
 *    - string and file parameters (KVS_PARAM_STRING, KVS_PARAM_FILE: the file's SHA-256 goes into the
 *      canonical string);
 *    - the cost model (kvs_policy_cost: device KV / aux / host / transient storage, KV and aux reads, writes,
 *      host<->device transfers) and readable() for what a policy may read beyond what is device-resident;
 *    - retention scores (scores()): what the policy ranks by, so that a paged cache maps its choice to pages by
 *      them (sim/host.h "page granularity").
 *
 * Rules the engine enforces or tests (DESIGN.md "Replay" 3 — leaking oracle information is the worst bug):
 *  - A view shows positions 0..n-1 only (n-1 = the current position). Decode views carry only the current
 *    query; prefill views carry the queries of the turn's prompt. Nothing of the future is reachable.
 *  - A non-oracle policy may read K/V rows only of positions it may currently read (readable(), which
 *    defaults to stored(): device-resident plus, for offloading policies, the host store), plus the current
 *    position and, in prefill, the new prompt positions (of the current block for chunked prefill). The
 *    conformance test scrambles every other row between steps and between prefill blocks and checks that
 *    the choices do not change.
 *  - The only feedback a non-oracle gets about attention is observe(): the probabilities the engine
 *    computed over the policy's own S_t. view->full_probs (full attention) is non-NULL only for
 *    policies with is_oracle = 1, which are labelled "oracle" in every output.
 *
 * Budget convention (POLICY_SPEC preamble): budget B bounds |S_t| at attention time, the current token
 * included. "Attend-then-evict" policies therefore hold B-1 entries before the new token arrives.
 * Per-query-head policies bound each query head's S_t by B and store G separate caches (storage G x).
 * Prompt-only policies (budget_scope KVS_BUDGET_PROMPT, e.g. SnapKV) bound the number of retained prompt
 * positions by B and keep every generated token (S_t grows during decode).
 *
 * Threading: one instance is used by one thread at a time; ops tables and parameter tables are const.
 */
#ifndef KVS_POLICY_H
#define KVS_POLICY_H

#include <stddef.h>
#include <stdint.h>

#include "../common/kvs.h"

#define KVS_POLICY_MAX_PARAMS 16
#define KVS_POLICY_CANON_MAX 1024   /* bytes of the canonical params string, NUL included */
#define KVS_POLICY_STR_MAX 256      /* bytes of a string/file parameter value, NUL included */
#define KVS_POLICY_NAME_MAX 32

struct kvs_policy_ops;

/* ---- parameters ---------------------------------------------------------------------------------- */

typedef enum {
    KVS_PARAM_INT = 0,    /* whole number in [lo, hi] */
    KVS_PARAM_DOUBLE = 1, /* finite number in [lo, hi] */
    KVS_PARAM_BOOL = 2,   /* 0/1, also accepts true/false/yes/no/on/off */
    KVS_PARAM_ENUM = 3,   /* one of `choices` ("a|b|c"); value stored as the choice index */
    KVS_PARAM_STRING = 4, /* free text without ',' '=' or control characters; default `def_str`; read with
                           * kvs_policy_param_str() */
    KVS_PARAM_FILE = 5,   /* a file path ("" = none, the default); the file's SHA-256 is computed at parse time
                           * and the canonical value is PATH@sha256:HEX. Given as PATH@sha256:HEX (e.g. from a
                           * results database) the hash must still match the file. Optional keywords in
                           * `choices` ("prefill") are taken as they are, not as paths; `def_str` may default
                           * to one. */
} kvs_param_type;

typedef struct {
    const char *key;
    kvs_param_type type;
    double def;           /* default (ENUM: index into choices; BOOL: 0/1) */
    double lo, hi;        /* inclusive range for INT/DOUBLE (ignored otherwise) */
    const char *choices;  /* ENUM: '|'-separated names, e.g. "layer|group"; FILE: keywords accepted instead of a path */
    const char *help;     /* one line for `kvsim replay --help` */
    const char *def_str;  /* STRING (and FILE keyword) default text (NULL = "") */
    const char *resolves; /* FILE: what a results database at this path stands for, which the caller above the engine
                           * loads into kvs_policy_config.resolved (e.g. "head_clusters": the clustering of its latest
                           * `kvsim heads` run, a kvs_head_clusters); NULL = a plain file the policy reads itself */
} kvs_policy_param;

/* A named parameter set from a paper (`--policy h2o@morphkv-longwriter`): the settings a paper used for this
 * policy, so a study can cite them instead of retyping them. `params` uses the NAME:key=value syntax's
 * key=value list; the user's own key=value pairs after the preset override it. The budget is never part of
 * a preset (it is the sweep's --budgets); `help` says which budget the paper used. */
typedef struct {
    const char *name;   /* [a-z0-9-], e.g. "morphkv-longwriter" */
    const char *params; /* "recent=0.5,gqa=expand" (may be "" for the defaults) */
    const char *help;   /* one line: the paper, section and the budget it used */
} kvs_policy_preset;

/* A parsed policy configuration: which policy and its parameter values (defaults filled in). Plain value
 * type; copy freely. */
typedef struct {
    const struct kvs_policy_ops *ops;
    double v[KVS_POLICY_MAX_PARAMS];       /* in the order of ops->params; ENUM = index, BOOL = 0/1;
                                            * STRING/FILE: 0 (value in str[]) */
    char str[KVS_POLICY_MAX_PARAMS][KVS_POLICY_STR_MAX]; /* STRING/FILE values ("" otherwise); FILE: the path */
    char sha256[KVS_POLICY_MAX_PARAMS][65];              /* FILE: hex SHA-256 of the file's content, "" if none */
    const void *resolved[KVS_POLICY_MAX_PARAMS]; /* FILE with `resolves`: the object its results database stands for,
                                            * loaded by the caller (results/ kvs_results_resolve_policy_inputs),
                                            * borrowed and read-only; NULL = not resolved. Policies never open a
                                            * database themselves. */
    char canonical[KVS_POLICY_CANON_MAX];  /* "key=value,key=value", table order, every default filled in
                                            * ("" for a policy without parameters) */
} kvs_policy_config;

/* ---- what a policy is told about the model and its stream --------------------------------------- */

typedef struct {
    int32_t n_layers, n_heads, n_kv_heads;
    int32_t group;          /* G = n_heads / n_kv_heads: query heads per KV head */
    int32_t head_dim;       /* d */
    float scale;            /* softmax scale (trace attn_scale) */
    int32_t kv_bytes;       /* bytes per cached K/V element (POLICY_SPEC b_kv): the trace dtype's size by default
                             * (2 for fp16/bf16), `kvsim replay --kv-bytes` to model another cache dtype */
    int32_t aux_bytes;      /* bytes per auxiliary element (scores...), POLICY_SPEC b_aux: 4 (fp32) by default,
                             * `--aux-bytes 2` mimics references that keep scores in the model dtype. Policies
                             * use this, never a literal. */
    int64_t n_positions;    /* whole trace (policies must not use it to look ahead: for sizing only) */
    int64_t prompt_len;     /* first turn's prompt length */
    int64_t max_new_tokens; /* capture setting, 0 if unknown */
    int64_t max_seq_len;    /* the model's context length (trace header), 0 if unknown */
    float rope_theta;       /* RoPE base theta_b (trace header), 0 if unknown: policies that invert RoPE refuse then */
    int32_t rope_layout;    /* trace/trace.h kvs_rope_layout: 0 adjacent pairs (llama2.c), 1 halves (HF) */
    char model_name[64];    /* trace header model_name ("" if unknown): Llama-3 RoPE scaling and calibration checks */
} kvs_policy_model;

/* Arguments of create(): borrowed for the duration of the call only (copy what you keep). */
typedef struct {
    const kvs_policy_model *model;
    const kvs_policy_config *cfg;
    int32_t layer, kv_head;
    int64_t budget;          /* tokens for THIS (layer, KV head) (after the allocation pass), >= 1 */
    int64_t budget_nominal;  /* the run's budget B before allocation */
    uint64_t seed;           /* deterministic per (run, layer, KV head): for randomised policies */
    const void *shared;      /* the allocation pass's shared structure (ops->alloc_shared), NULL if none;
                              * borrowed, valid until the instance is freed, read-only (instances of several
                              * threads read it at once) */
} kvs_policy_init;

/* What a policy may see at one call. All pointers borrowed for the duration of the call. */
typedef struct {
    int64_t n;               /* positions 0..n-1 exist; the current position is n-1 (prefill: the last
                              * prompt position of the turn) */
    int32_t group, head_dim;
    float scale;
    const float *k;          /* [n][head_dim]: row j = key of position j (post-RoPE) */
    const float *v;          /* [n][head_dim] */
    const float *q;          /* [n_q][group][head_dim]: queries of positions q_first..n-1 (decode: n_q = 1,
                              * the current query only; prefill: the turn's prompt positions, or the
                              * current block's with chunked prefill) */
    int64_t q_first, n_q;
    int64_t turn_begin;      /* current turn: prompt positions [turn_begin, prompt_end) */
    int64_t prompt_end;      /* chunked prefill: the turn's prompt end (known to a real system: the prompt
                              * arrived); positions >= n are still not readable */
    int32_t turn;            /* turn index, 0 for the first */
    int64_t block_begin;     /* prefill: first position new in this call (turn_begin unless chunked); decode: n-1 */
    int32_t last_block;      /* prefill: 1 when this call ends the turn's prompt (always 1 unless chunked) */
    const float *full_probs; /* ORACLES ONLY, decode only; NULL for everyone else: [group][n] exact
                              * full-attention probabilities of the current queries over 0..n-1 */
    struct kvs_policy_memo *memo; /* may be NULL: the engine's memo of scores computed from this view's own q/k
                              * by another configuration of the same replay task at the same position
                              * (sim/policy_memo.h); policies pass the view to kvs_policy_colsum() and the
                              * like and never touch it otherwise */
} kvs_policy_view;

/* The attended set S_t chosen by select(). The engine owns the arrays, each with capacity `cap`
 * (>= n of the step). Per-KV-head policies fill list 0 only (shared by the group's query heads);
 * per-query-head policies fill lists 0..G-1. Positions must be distinct, in [0, n), and should include
 * n-1 (the current token). Order: any (the engine does not depend on it); ascending is conventional. */
typedef struct {
    int32_t **idx;      /* [n_lists] arrays of cap positions each */
    int64_t *n;         /* [n_lists] entries used; the policy sets them */
    int32_t n_lists;    /* 1 for per-KV-head policies, group for per-query-head policies */
    int64_t cap;
    /* merged slots (POLICY_SPEC §1.3): [n_lists] arrays of cap row pointers, every entry NULL on entry to
     * select(). A policy sets row_k[li][j] AND row_v[li][j] to K/V rows [head_dim] it owns (valid until its
     * next call) when entry j's K/V are not the trace rows of idx[li][j] (a merged slot; idx keeps the
     * position the slot is attributed to, the conserved token). Recall counts unmerged entries only;
     * recall_merged counts merged ones at their position too. */
    const float ***row_k, ***row_v;
} kvs_policy_sel;

/* Costs of one step for one (layer, KV head), in bytes (POLICY_SPEC §1.5 cost model, §3), by class. Before account()
 * the host (sim/host.h kvs_host_cost) fills every field with the DEFAULT accounting:
 *   kv_bytes       = KV of |stored() ∪ S_t| per list, summed over lists (per-query-head: the G copies);
 *                    with stored() NULL every position seen (0..n-1)
 *   dedup_kv_bytes = KV of the union over lists (= kv_bytes for per-KV-head policies)
 *   aux_bytes = host_bytes = transient_bytes = 0
 *   read_kv_bytes  = KV of the attended entries, summed over lists; read_aux_* = 0
 *   write_bytes    = KV of the new token, once per list
 *   h2d_bytes = d2h_bytes = 0
 * account() corrects the classes its policy knows better. The totals a run reports are the host's sums of the
 * classes: resident storage = kv + aux, traffic = read_kv + read_aux, transfer = h2d + d2h (kvs_host_metrics). */
typedef struct {
    double kv_bytes;              /* device KV resident at attention time (per-query-head: expanded) */
    double dedup_kv_bytes;        /* device KV of the union of a per-query-head policy's sets */
    double aux_bytes;             /* device auxiliary structures (scores, pages, profiles, merge weights) */
    double host_bytes;            /* host-resident (offloaded) KV and state */
    double transient_bytes;       /* within-step temporaries on the device (peak = storage + transient) */
    double read_kv_bytes;         /* K/V read for attention */
    double read_aux_bytes;        /* auxiliary reads, scoring fused with the attention K read */
    double read_aux_unfused_bytes;/* auxiliary reads when scoring re-reads K (>= read_aux_bytes) */
    double write_bytes;           /* device writes: new token, score updates, merged K/V */
    double h2d_bytes, d2h_bytes;  /* host->device and device->host transfers */
} kvs_policy_cost;

typedef enum { KVS_SEL_PER_KV_HEAD = 0, KVS_SEL_PER_QUERY_HEAD = 1 } kvs_policy_granularity;
typedef enum {
    KVS_BUDGET_EVERY_STEP = 0, /* |S_t| <= budget at every step (per query head for per-query-head) */
    KVS_BUDGET_PROMPT = 1,     /* prompt-only compression: retained prompt positions <= budget; generated
                                * tokens all kept (S_t grows during decode: SnapKV, PyramidKV, Ada-KV) */
    KVS_BUDGET_NONE = 2,       /* the budget does not apply (full cache) */
} kvs_policy_budget_scope;

typedef enum { KVS_SYNC_PREFILL = 0, KVS_SYNC_DECODE = 1 } kvs_policy_sync_phase;

/* ---- the ops table ------------------------------------------------------------------------------- */

/* The version of this interface. An ops table states the one it was written for (.version); the framework refuses a
 * table of another version (kvs_policy_parse_spec, kvs_policy_validate), so a policy written against an older
 * interface fails loudly instead of running with fields it does not know. Version 3: cost classes only (the totals
 * are the host's), no layer-wide pre-select hook, FILE parameters that a caller may resolve. */
#define KVS_POLICY_INTERFACE_VERSION 3

struct kvs_policy_ops {
    int version;             /* KVS_POLICY_INTERFACE_VERSION, set explicitly by every table */
    const char *name;        /* registry name, [a-z0-9_], e.g. "h2o" */
    const char *summary;     /* one line */
    int is_oracle;           /* 1: sees full attention (view->full_probs); labelled oracle everywhere */
    kvs_policy_granularity granularity; /* layout of S_t (see layout() for parameter-dependent ones) */
    kvs_policy_budget_scope budget_scope;
    const kvs_policy_param *params; /* static const table, n_params entries (may be NULL if 0) */
    int n_params;
    const kvs_policy_preset *presets; /* optional static const table of named paper settings (NAME@PRESET) */
    int n_presets;

    /* Optional: the layout when a parameter chooses it (h2o gqa=expand|mean); NULL = `granularity`. */
    kvs_policy_granularity (*layout)(const kvs_policy_config *cfg);

    /* Optional: reject a (configuration, budget) pair before anything runs (e.g. streaming needs
     * budget > sinks). KVS_ERR_INVALID_ARG with a detail naming the parameter. */
    kvs_status (*validate)(const kvs_policy_config *cfg, const kvs_policy_model *m, int64_t budget);

    /* Optional: a (configuration, budget) pair that runs but degenerates into something else, e.g. SnapKV
     * with budget <= its observation window scores nothing and is a window of the prompt. Appends one
     * sentence per finding through kvs_policy_note() and returns how many it appended. Used for warnings
     * (kvsim replay's stderr and the runs' `notes` column), never to reject: validate() does that. */
    int (*notes)(const kvs_policy_config *cfg, const kvs_policy_model *m, int64_t budget, char *buf, size_t cap);

    /* Required: allocate one instance; *state owned by the engine, released with free(). */
    kvs_status (*create)(const kvs_policy_init *init, void **state);
    /* Required: accepts NULL. */
    void (*free)(void *state);

    /* Required: prefill of a turn. view->q holds the turn's prompt queries (q_first = turn_begin),
     * view->n = prompt_end. On entry the policy stores what it kept from earlier turns; it must decide
     * what to keep among those plus the new prompt positions [turn_begin, prompt_end). */
    kvs_status (*prefill)(void *state, const kvs_policy_view *view);

    /* Required: decode step at position n-1 (its k/v have arrived): choose S_t into *sel. */
    kvs_status (*select)(void *state, const kvs_policy_view *view, kvs_policy_sel *sel);

    /* Optional: the attention the engine computed over S_t: probs[g] (g < group) = probabilities of query
     * head g over sel->idx[g or 0] (same order, sel->n[..] entries). The policy's only feedback. */
    kvs_status (*observe)(void *state, const kvs_policy_view *view, const kvs_policy_sel *sel,
                          const float *const *probs);

    /* Optional: all instances of one layer (one per KV head, same configuration), called after every KV
     * head finished prefill (phase PREFILL) or observe (phase DECODE) of the same position. For
     * layer-wide decisions such as TOVA's layer-averaged eviction. */
    kvs_status (*layer_sync)(void *const *states, int n_kv_heads, kvs_policy_sync_phase phase);

    /* Optional: positions whose K/V query head g's DEVICE cache holds now (per-KV-head policies: g = 0),
     * written to out (capacity >= positions seen); @return the count. NULL = the policy stores every
     * position it has seen (full cache: full, oracles, selection-only policies). Every position lies in
     * [0, p] at position p (the engine fails the run otherwise). Used by prompt measurement, the default storage
     * accounting and (unless readable() is given) the leak test. */
    int64_t (*stored)(void *state, int g, int32_t *out);

    /* Optional: positions whose K/V the policy may read now: device cache plus a host store (SyncKV's
     * full cache on the host, RocketKV-MT's evictions kept for later turns). Same contract as stored().
     * NULL = stored(). The leak test scrambles every row not readable. */
    int64_t (*readable)(void *state, int g, int32_t *out);

    /* Optional: chunked prefill. @return the block size in positions (>= 1) in which this instance
     * wants each turn's prompt, 0 = the whole prompt at once. Asked once after create(). With blocks, the
     * engine calls prefill() at the end of every block (view->n = block end, view->q = the block's
     * queries, view->block_begin, view->last_block), runs the leak check between blocks, and measures
     * prompt positions of a block against what the policy held after the previous block plus the block
     * (storage peak counts the whole block as transient). */
    int64_t (*prefill_block)(void *state);


    /* Optional: costs of the step just selected (called before observe). NULL = default: KV of the distinct stored positions
     * (storage) and KV of the attended positions (traffic, summed over query heads for per-query-head). */
    void (*account)(void *state, const kvs_policy_view *view, const kvs_policy_sel *sel, kvs_policy_cost *out);

    /* Optional allocation pass (all four or none): once per (configuration, budget), over the FIRST
     * turn's prompt of every (layer, KV head), before any instance exists. alloc_prefill gets a prefill
     * view (as prefill() would). alloc_end writes budgets[layer * n_kv_heads + kv_head] (each >= 1),
     * which become kvs_policy_init.budget. */
    kvs_status (*alloc_begin)(const kvs_policy_config *cfg, const kvs_policy_model *m, int64_t budget,
                              void **alloc);
    kvs_status (*alloc_prefill)(void *alloc, int layer, int kv_head, const kvs_policy_view *prefill);
    kvs_status (*alloc_end)(void *alloc, int64_t *budgets);
    void (*alloc_free)(void *alloc);
    /* Optional (only with the four above): the structure every instance of this (configuration,
     * budget) receives as init->shared (D2O layer splits, SyncKV head clusters). Called after alloc_end;
     * owned by `alloc`, which the engine frees only after every instance of the run is freed. */
    const void *(*alloc_shared)(void *alloc);
    /* Optional (only with the four above): 1 when alloc_prefill of different (layer, KV head) pairs may run at
     * once on different threads, in any order (each writes only what belongs to its pair); the engine then reads
     * the heads in parallel. 0 (the default): called in (layer, KV head) order on one thread. */
    int alloc_concurrent;

    /* Optional: the policy's current retention scores, what it ranks by (H2O's accumulated attention, TOVA's last
     * attention, SnapKV's pooled observation scores ...), of the positions idx[0..n) of list g (per-KV-head
     * policies: g = 0), which are S_t's list g just selected, into out[0..n): larger = the policy would rather
     * keep it; INFINITY for a position it keeps whatever its score (a recent window, sinks, the current token, a
     * prompt-only policy's generated tokens). Called after select() and before observe(), from the state the
     * policy already has (no oracle information). @return 1 when written, 0 when the policy has no scores now
     * (the caller then uses a count rule). Used by page granularity (sim/host.h kvs_host_page_map); NULL = no
     * scores. */
    int (*scores)(void *state, int g, const int32_t *idx, int64_t n, double *out);
    /* Optional: sliding-window layers (sim/replay.h "Sliding-window layers"). The host evicted every position
     * before `first` (the layer's window moved past them): the instance forgets them, so that stored() and every
     * later select() hold none of them, and keeps its own bookkeeping consistent (a budget that covers the window
     * then holds exactly the window). Called when the policy is about to decide what to keep, with the window
     * of the next position: before prefill() of a block ending at be with first = be-W+1 (a prefill keeps no
     * candidate before first), and at decode position p after the step's attention and accounting, before
     * observe(), with first = p+2-W (observe() still gets this step's selection and probabilities, aligned with
     * the entries the policy held at select(); it drops the evicted ones, then decides its own evictions).
     * Only when first > 0; `first` never decreases. NULL = the policy cannot replay a layer whose window is shorter
     * than the trace; the replay refuses that combination (kvs_replay_validate). */
    kvs_status (*window_evict)(void *state, int64_t first);
};

/* ---- framework functions (sim/policy.c) ---------------------------------------------------------- */

/*! kvs_policy_parse_spec() : parses "NAME", "NAME:key=value,...", "NAME@PRESET" or "NAME@PRESET:key=value,..." for
 *  the policy `ops` whose name the spec must start with (the registry, policies/registry.h kvs_policy_parse, finds
 *  `ops` by name): defaults filled in, then the preset's parameters, then the given ones (which may override the
 *  preset's), and the canonical string built (every parameter: a preset leaves no trace but its values).
 *  KVS_ERR_INVALID_ARG (detail names the policy, preset, key or value) for an unknown preset, unknown or repeated
 *  key, malformed or out-of-range value. */
kvs_status kvs_policy_parse_spec(const struct kvs_policy_ops *ops, const char *spec, kvs_policy_config *cfg);

/*! kvs_policy_parse_ops() : parses the parameter part "key=value,..." (NULL = all defaults) of policy `ops`,
 *  which need not be in the registry (test-only policies); same rules and errors as kvs_policy_parse(). */
kvs_status kvs_policy_parse_ops(const struct kvs_policy_ops *ops, const char *params, kvs_policy_config *cfg);

/*! kvs_policy_find_preset() : the preset `name` of `ops`, or NULL. */
const kvs_policy_preset *kvs_policy_find_preset(const struct kvs_policy_ops *ops, const char *name);

/*! kvs_policy_defaults() : cfg with every parameter at its default (canonical string built). */
void kvs_policy_defaults(const struct kvs_policy_ops *ops, kvs_policy_config *cfg);

/*! kvs_policy_param_get() : value of parameter `key` (must exist: internal invariant). */
double kvs_policy_param_get(const kvs_policy_config *cfg, const char *key);

/*! kvs_policy_param_str() : text of STRING/FILE parameter `key` (FILE: the path; "" when unset); borrowed
 *  from cfg. `key` must exist and be a STRING/FILE parameter (internal invariant). */
const char *kvs_policy_param_str(const kvs_policy_config *cfg, const char *key);

/*! kvs_policy_param_sha256() : hex SHA-256 of FILE parameter `key`'s content, "" when unset. */
const char *kvs_policy_param_sha256(const kvs_policy_config *cfg, const char *key);

/*! kvs_policy_validate() : ops->validate when present, plus budget >= 1. */
kvs_status kvs_policy_validate(const kvs_policy_config *cfg, const kvs_policy_model *m, int64_t budget);

/*! kvs_policy_notes() : the warnings of a (configuration, budget) pair on a trace described by m: the
 *  policy's own (ops->notes) and the engine's (a budget that evicts nothing: the run equals the full cache;
 *  a budget a policy without one ignores), as "; "-separated sentences in buf (always NUL-terminated, "" when
 *  none); @return their number. */
int kvs_policy_notes(const kvs_policy_config *cfg, const kvs_policy_model *m, int64_t budget, char *buf, size_t cap);

/*! kvs_policy_note() : appends one printf-formatted sentence to the notes in buf (a "; " separator first
 *  when buf is not empty; truncated to cap, always NUL-terminated); @return 1, to count it. */
int kvs_policy_note(char *buf, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/*! kvs_policy_layout() : ops->layout(cfg) when present, else ops->granularity. */
kvs_policy_granularity kvs_policy_layout(const kvs_policy_config *cfg);

/*! kvs_policy_max_new() : the generation length a policy may plan for (RocketKV's, Quest's and SparQ's sequence
 *  length S): `given` when > 0 (the policy's own max_new parameter), else the trace's max_new_tokens (a capture
 *  setting, known before decoding starts), else 0. */
int64_t kvs_policy_max_new(const kvs_policy_model *m, int64_t given);

/*! kvs_policy_seq_len() : S = n positions so far + max_new, at most the model's context when it is known, and
 *  at least 1. */
int64_t kvs_policy_seq_len(const kvs_policy_model *m, int64_t n, int64_t max_new);

/*! kvs_policy_kv_bytes() : bytes of `slots` resident K/V entries of one KV head: slots x 2 x d x kv_bytes. */
double kvs_policy_kv_bytes(const kvs_policy_model *m, double slots);

/*! kvs_policy_print_ops_help() : writes one policy's name, summary, presets and parameter table to f (a FILE *, void *
 *  to keep stdio out of this header). */
void kvs_policy_print_ops_help(const struct kvs_policy_ops *ops, void *f);

#endif /* KVS_POLICY_H */
