/* replay.h — the trace-driven replay engine: runs a sweep of (policy configuration x budget) over every
 * (layer, KV head) stream of a trace in one pass and produces the metrics of ../shared/DESIGN.md
 * ("Replay", "Metrics") and POLICY_SPEC.md §1.2 (call order) / §1.6 (per-step metrics).
 *
 * Semantics (what a run measures):
 *  - Work unit = one layer (all its KV heads advance in lockstep, so layer-wide policies such as TOVA's
 *    layer mode can decide together) for a subset of the sweep's configurations; units run in parallel.
 *  - Turn k's prompt positions [begin, prompt_end) are handed to the policy as that turn's prefill, at
 *    once, after they all arrived (the policy keeps what it stored from earlier turns plus the new prompt).
 *    Generated positions are decode steps: select S_t, the engine computes O'_t = softmax(s q K_S^T) V_S
 *    for every query head of the group (kvs_attention) and compares it with the full attention recomputed
 *    from the trace's own Q/K/V (same code path, so `full` has exactly 0 error), then observe().
 *  - Measured positions: generated positions (--measure decode, default) or every position (--measure all).
 *    At a prompt position p of turn k the attended set is what the cache holds after turn k-1 (the
 *    policy's stored(); everything for turn 0) plus the turn's prompt positions up to p: chunked-prefill
 *    attention against the compressed cache. For turn 0 that is full causal attention (error 0).
 *  - Metrics per (run, layer, query head, measured position): relative L2 output error, recall (full-
 *    attention mass on S), top-k overlap |S ∩ TopK_|S|(full)| / |S| (ties by lower position), storage and
 *    traffic bytes of the step for the query head's KV head (a per-query-head policy's G copies summed),
 *    transfer bytes, compression ratio = full-cache bytes (n x 2 x d x kv_bytes) / storage bytes.
 *  - Budget percentages (kvs_replay_parse_budgets) are of the first turn's prompt length, rounded up, min 1.
 *  - Sliding-window layers (layer_window below; Gemma-3's local layers): a layer's full cache IS its window. On a
 *    layer with window W, at position p only positions p-W+1..p exist in the model. The reference ("full cache")
 *    is attention over those min(W, p+1) positions (what the trace's own o/lse record); the probability of every
 *    older position is exactly 0, so recall is the windowed attention's mass on S and the top-k overlap ranks the
 *    windowed attention (an in-window probability that underflows to 0 ties with the out-of-window zeros, which
 *    rank first by the lower position). A policy's cache on that layer never holds a position older than p-W+1:
 *    whenever the policy is about to decide what to keep — before each prefill call of a block [bb, be) and
 *    before observe() at each decode position p — the host evicts what the next position (be, p+1) cannot attend
 *    through the policy's window_evict (policy.h), so every policy respects the window without knowing the
 *    layer's W (and an attend-then-evict policy never spends its own eviction on a position the window drops
 *    anyway), and the selection check fails a run that still selects or stores an older position at p. A budget
 *    >= W then attends exactly the window (zero error: tests/test_windows.c). Resident bytes and traffic of such a layer count at most min(W, p+1)
 *    positions (a policy without stored() holds the window's). A measured prompt position p (--measure all /
 *    prefill) attends what of the held positions and of its prefill block up to p lies in p..p-W+1 (the chunked
 *    prefill's kernel masks the rest), against the windowed reference: windowed causal attention for turn 0
 *    without blocks, error 0. Page granularity keeps pages as aligned blocks of absolute positions: the attended
 *    set never holds a position outside the window, a resident page counts whole while it holds a kept position
 *    (sim/host.h "page granularity": what vLLM's sliding-window manager holds). A codec attends its rows of the
 *    window's positions (sim/host.h "the representation stage"). Refused (kvs_replay_validate, with the layer and
 *    the policy named) rather than measured against the wrong reference: a policy without window_evict on a trace
 *    with a layer whose window is shorter than the trace (every registered policy has it: tests/test_windows.c,
 *    test_windows_retrieval.c and test_windows_measure.c replay each through both engines). A window
 *    at least as long as the trace is full attention and replays as such. Both engines follow these rules; the
 *    fast one computes a sliding-window layer's reference row by row (kvs_attention over the window), without the
 *    blocked kernel or the reuse of its scores.
 * Memory per work unit: the layer's K/V history (n_positions x 2 x head_dim floats per KV head), the
 * longest turn prompt's queries, the policies' state, and the measured samples (7 floats per sample).
 */
#ifndef KVS_REPLAY_H
#define KVS_REPLAY_H

#include <stdint.h>

#include "../common/kvs.h"
#include "../trace/trace.h"
#include "codec.h"
#include "policy.h"
#include "metrics.h"

/* One run of the sweep: a policy configuration at a budget. */
typedef struct {
    kvs_policy_config policy;
    int64_t budget;           /* tokens per KV head, the current token included */
    double budget_fraction;   /* as given by the user (0.2 for "20%"), or -1 for an absolute budget */
} kvs_replay_config;

typedef enum {
    KVS_MEASURE_DECODE = 0,  /* generated positions */
    KVS_MEASURE_ALL = 1,     /* every position */
    KVS_MEASURE_PREFILL = 2, /* prompt positions only */
} kvs_replay_measure;

/* Where the engine reads one (layer, KV head) stream. kvs_replay_source_from_trace() fills one from an
 * open trace; tests fill one from memory. */
typedef struct {
    kvs_policy_model model;
    int64_t n_turns;
    const kvs_turn *turns;      /* [n_turns], borrowed; covers 0..n_positions-1 in order */
    void *user;
    kvs_status (*stream_open)(void *user, int layer, int kv_head, void **stream);
    /* *blk borrowed until the next call; blocks cover the positions in order; KVS_ERR_END after the last */
    kvs_status (*stream_next)(void *stream, const kvs_trace_block **blk);
    void (*stream_free)(void *stream);
    /* kvs_dtype of the K/V values the blocks carry (as their exact fp32 conversion): KVS_DTYPE_F16 or
     * KVS_DTYPE_BF16 lets the engine keep the history in that form for the attention kernels (see
     * kvs_replay_opts.kv16); 0 (KVS_DTYPE_F32, what a zeroed source says) = plain floats. A trace's dtype. */
    int32_t kv_dtype;
    /* The input's content hash (kvs_trace_content_sha256 for a trace), "" when unknown: part of every run's
     * identity, from which randomised policies are seeded (kvs_host_run_seed). */
    char content_hash[65];
    /* [model.n_layers] attention window of each layer (0 = full causal attention), borrowed; NULL = all full.
     * Replayed as "Sliding-window layers" above says. */
    const int32_t *layer_window;
} kvs_replay_source;

/* Hooks for tests and analyses (NULL in a plain replay; analysis/keys.c reads the keys a policy retains
 * through on_step_end). Called from worker threads, serialised per layer. */
typedef struct {
    void *user;
    /* After select() of configuration `config` for (layer, kv_head) at position pos. */
    void (*on_select)(void *user, int config, int layer, int kv_head, int64_t pos, const kvs_policy_sel *sel);
    /* After a prefill (pos = the turn's last prompt position) or a decode step of configuration `config`
     * finished for every KV head of the layer: `k`/`v` are the engine's MUTABLE history rows [n][head_dim] of
     * kv_head, `state` the policy instance. The leak test scrambles rows the policy does not store here;
     * only meaningful with a single configuration (all configurations share the history). */
    void (*on_step_end)(void *user, int config, int layer, int kv_head, int64_t pos, void *state,
                        const struct kvs_policy_ops *ops, float *k, float *v, int64_t n);
} kvs_replay_hooks;

typedef struct {
    const kvs_replay_config *configs; /* [n_configs], borrowed */
    int n_configs;
    int threads;                /* 0 = every CPU the process may run on; also shares out the runs' statistics after
                                 * the replay (each thread sorting up to KVS_SAMPLE_STATS_MEMORY_DEFAULT at a time) */
    kvs_replay_measure measure;
    int64_t series_every;       /* keep every N-th measured step per (layer, query head) in the series; 0 = none */
    const kvs_replay_hooks *hooks; /* NULL in a plain replay */
    /* Optional progress report, called from worker threads (serialised by the engine) at most every
     * ~0.25 s and once at the end: `done` of `total` (layer, position) steps replayed. */
    void (*progress)(void *user, int64_t done, int64_t total);
    void *progress_user;
    /* Optional cancellation: when *cancel becomes non-zero (e.g. set by a SIGINT handler) the workers stop
     * at the next position; kvs_replay_execute then returns KVS_ERR_INTERRUPTED with every run's status
     * KVS_ERR_INTERRUPTED (nothing is a complete run). */
    const volatile int *cancel;
    /* K/V history of the attention kernels when the source's kv_dtype is 16-bit (sim/BENCH.md "K/V in
     * 16 bits"): 1 = also keep it in that form and run the full reference and the group attention over S_t on
     * the 16-bit kernels (half the bytes read; the numbers are the same bit for bit; policies still see fp32
     * rows, so the history takes 1.5x the memory of an fp32 one); -1 = fp32 only; 0 = the default,
     * kvs_math_kv16_default() (common/kvs_math_simd.h: on unless the environment says KVS_KV16=0). Off whatever
     * is asked when an on_step_end hook is set (it may rewrite the fp32 rows) or head_dim > 1024. */
    int kv16;
    /* Score memo (sim/policy_memo.h): 0 = the default, on: configurations of one task that ask for
     * the same scores at one position (prompt scores with the same rows, candidates and options; Quest's decode
     * page bounds at the same page size; e.g. one policy at several budgets) compute them once, with the same
     * bits; -1 = off (tests compare). Off whatever is asked when an on_step_end hook
     * is set (it may rewrite rows between configurations). */
    int prefill_memo;
    /* Scores of S_t: 0 = the default, on: at a position whose full reference is computed (every
     * measured step, and any step an oracle policy needs), a configuration's attention over its selection takes
     * the query heads' scores at those positions from the reference's (kept before its softmax) instead of
     * computing them again; the softmax and the output over S_t remain. The same bits (a score does not depend
     * on the rows computed with it, common/kvs_math_simd.h), the reference's score memory doubled; -1 = off
     * (tests compare). Off whatever is asked when an on_step_end hook is set (it may rewrite rows the reference
     * read). */
    int ref_scores;
    /* The shared output pass (sim/BENCH.md "The shared output pass"): at a position whose scores the reference
     * has (above), the outputs of all of a task's configurations over a KV head are computed together, a block of
     * value rows at a time, each block read once for all of them; the same bits. 0 = the default, blocks of 256
     * KiB of rows; > 0 = blocks of that many rows; -1 = no blocks, each configuration's output whole in turn (tests
     * compare). */
    int64_t out_block_rows;
    /* The representation stage of each configuration (sim/codec.h), borrowed: codecs[c] for configs[c], NULL = K/V
     * as captured; codecs NULL = none for any. The rule (sim/host.h "the representation stage"): the first prompt
     * scored in full precision, every later step over the codec's rows, the reference full precision; the
     * canonical spec enters the run's identity (kvs_host_identity.codec). */
    const kvs_codec *const *codecs;
    /* Page granularity of each configuration (sim/host.h "page granularity"), borrowed: pages[c] >= 1 positions a
     * page for configs[c], 0 = token granularity; pages NULL = none for any. From the first decode step on, the
     * policy's selection is mapped to whole pages (the attended set, the bytes); the page size enters the run's
     * identity (kvs_host_identity.page_tokens). With a codec the pages hold the codec's rows and bytes. */
    const int64_t *pages;
    /* How each paged configuration ranks its selection into pages, borrowed: page_scores[c] a kvs_page_score
     * (sim/host.h: 0 = AUTO, max where the policy has scores(), count otherwise; 1 count, 2 max, 3 sum); NULL = AUTO
     * for every one. Resolved by kvs_host_page_rule (a policy without scores() always counts); the resolved rule
     * enters the run's identity (kvs_host_identity.page_score). */
    const int *page_scores;
} kvs_replay_opts;

/*! kvs_replay_page_of() : configuration c's page size, 0 for token granularity. */
static inline int64_t kvs_replay_page_of(const kvs_replay_opts *o, int c) { return o->pages ? o->pages[c] : 0; }

/*! kvs_replay_page_score_of() : configuration c's page score rule as asked (a kvs_page_score; 0 = AUTO). */
static inline int kvs_replay_page_score_of(const kvs_replay_opts *o, int c) {
    return o->page_scores ? o->page_scores[c] : 0;
}

/*! kvs_replay_codec_of() : configuration c's codec, NULL for none. */
static inline const kvs_codec *kvs_replay_codec_of(const kvs_replay_opts *o, int c) {
    return o->codecs ? o->codecs[c] : NULL;
}

/* The outcome of one configuration. */
typedef struct {
    kvs_status status;          /* KVS_OK, or the policy's failure (the run is then stored as 'failed') */
    char error[512];            /* failure detail, "" when ok */
    int32_t n_layers;
    kvs_results_agg *layer_aggs;/* [n_layers] */
    kvs_results_agg run_agg;    /* layer = -1 */
    kvs_results_step *steps;    /* [n_steps] series samples */
    int64_t n_steps;
    int64_t *budgets;           /* [n_layers * n_kv_heads] per-head budgets used (after allocation) */
    int64_t max_attended;       /* largest |S_t| of any query head and step */
    double wall_seconds;        /* summed thread time spent on this configuration */
} kvs_replay_run_result;

typedef struct {
    int n_runs;                  /* = n_configs */
    kvs_replay_run_result *runs; /* [n_runs], same order as the configs */
} kvs_replay_result;

/*! kvs_replay_source_from_trace() : a source reading `t` (borrowed; must outlive the source's use). */
kvs_status kvs_replay_source_from_trace(const kvs_trace *t, kvs_replay_source *out);

/*! kvs_replay_validate() : checks every configuration against the source (budget in [1, n_positions],
 *  the policy's own validate) without running anything. KVS_ERR_INVALID_ARG naming the run. */
kvs_status kvs_replay_validate(const kvs_replay_source *src, const kvs_replay_opts *o);

/*! kvs_replay_execute() : runs the sweep. Returns an error (and *out NULL) for input/read failures; a
 *  policy failure only fails its own run (runs[i].status). Caller frees *out with kvs_replay_result_free. */
kvs_status kvs_replay_execute(const kvs_replay_source *src, const kvs_replay_opts *o, kvs_replay_result **out);

/*! kvs_replay_reference() : the same sweep through the reference replay (sim/replay_ref.c): plain loops, one
 *  configuration and one layer at a time, one thread, no memo, no blocking, no 16-bit history; the executable
 *  specification the fast replay is tested against (tests/test_replay_ref.c). The same result layout and failure
 *  semantics as kvs_replay_execute; hooks, progress, threads, kv16, prefill_memo, ref_scores and out_block_rows
 *  are ignored. Memory: a layer's whole stream (n_positions x (2 + group) x head_dim floats per KV head). */
kvs_status kvs_replay_reference(const kvs_replay_source *src, const kvs_replay_opts *o, kvs_replay_result **out);

/*! kvs_replay_result_free() : accepts NULL. */
void kvs_replay_result_free(kvs_replay_result *r);

/*! kvs_replay_parse_budgets() : parses "16,32,64" or "10%,20%" (mixing allowed). A percentage is of the
 *  FIRST TURN'S PROMPT LENGTH `prompt_len` (known before decoding, so it never depends on how long the
 *  trace's generation ran), rounded up, minimum 1 token. Budget 0, a percentage of 0 or above 100%, an
 *  absolute budget larger than n_positions or malformed text -> KVS_ERR_INVALID_ARG. *budgets and
 *  *fractions (-1 for an absolute entry) are malloc'd [*n] arrays the caller frees. */
kvs_status kvs_replay_parse_budgets(const char *text, int64_t prompt_len, int64_t n_positions, int64_t **budgets,
                                    double **fractions, int *n);

#endif /* KVS_REPLAY_H */
