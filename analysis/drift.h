/* drift.h — attention drift and temporal locality of a trace's top-k sets (SyncKV §3.1-3.2, Fig. 2a/2b, Eq. 1;
 * ../shared/POLICY_SPEC.md §1.6 item 4, §5.4 claims S1-S3, §6.3; ../shared/DESIGN.md "Analysis").
 *
 * For every layer and every unit — each query head, and each KV group with its query heads' attention MAX-pooled
 * (POLICY_SPEC §2.4 "Units", SyncKV App. B.1) — and every k of a sweep, over the decode steps of the FIRST turn:
 *  - drift (S1, Fig. 2a): overlap_k(prefill set, step set) = |A ∩ B| / min(|A|, |B|) (Eq. 1), where the step set
 *    is the top-k of the step's exact full attention over every position 0..pos (prompt and generated: what the
 *    step needs now), and the prefill set is the top-k of a prefill score (§6.3, both reported):
 *      window: SnapKV's observation-window score, the attention of the last W prompt queries summed, no pooling
 *              (kvs_snapkv_scores, kernel 1), over the prompt positions BEFORE the window (SnapKV keeps the
 *              window itself regardless, so its selection is among those);
 *      last:   the attention of the last prompt query over the whole prompt (SyncKV Eq. 3);
 *  - mass (S2): the full-attention mass on the step's top-k set (for a group: the mean over its query heads of
 *    each head's mass on the group's set, the tokens a shared cache would keep);
 *  - temporal locality (S3, Fig. 2b): overlap_k(step t, step t + δ) for δ = 1..delta_max. Stored as a step x δ
 *    matrix (rows t, columns δ), not step x step: Fig. 2b's information is its diagonal band, the band holds
 *    T x Δ cells instead of T², and a step-x-step picture within the band is a re-plot of it.
 *
 * Chance levels. Beside each measure, what a top-k set of the same size chosen uniformly at random would give,
 * so that an overlap of 0.3 can be read against the 0.2 that no attention at all would also give. Every measure
 * here compares a set A of k positions inside the n = pos + 1 positions a step attends to with the step's set B
 * (or weighs B by the step's attention), and with B a uniformly random k-subset of those n positions:
 *  - overlap: |A ∩ B| is hypergeometric (n positions, k of them in A, k drawn), mean k·k/n, so the expected
 *    overlap coefficient |A ∩ B| / k is k/n, for either prefill set (both lie in positions < prompt length < n,
 *    whatever the score that chose them) and for locality, where A is step t's set (inside step t + δ's context)
 *    and n the context of step t + δ;
 *  - mass: each position is in B with probability k/n and the attention sums to 1 over the n positions, so the
 *    expected mass on B is k/n (a group's mass is a mean over its heads, each k/n).
 * The context grows by one a step, so the chance level falls along a curve: k/(P + s + 1) at decode step s of a
 * prompt of P positions. Each row carries its own (kvs_analysis_drift_chance); an average over steps is the
 * average of the rows' chance levels over the same steps as the measured value.
 *
 * Steps: step s = 0, 1, ... is the generated position prompt_end + s of turn 0 (its query chose token s + 1);
 * the prompt is turn 0's. A later turn is not analysed (its "prefill" is a different question).
 *
 * Streaming: the trace is read once per layer through trace/kv_stream.h (exact full attention, the replay engine's
 * numbers), the KV heads of a layer in lockstep so the per-layer summaries of a step are complete when it is
 * read. Memory on top of the streams' own history: per KV head the window's queries (W x G x d), the prefill
 * sets and a ring of the last delta_max step sets of every unit and k ((G + 1) x Σk x (2 + delta_max) indexes)
 * and O(n_ctx) scratch for one attention row; never a per-step history. Results go to a sink as they are
 * produced (results/results_drift.h stores them).
 */
#ifndef KVS_ANALYSIS_DRIFT_H
#define KVS_ANALYSIS_DRIFT_H

#include <stdint.h>

#include "../common/kvs.h"
#include "../trace/trace.h"

/* The unit whose attention a top-k set is taken from. */
typedef enum {
    KVS_DRIFT_HEAD = 0,  /* one query head; index = query head 0..n_heads-1 */
    KVS_DRIFT_GROUP = 1, /* one KV group, its query heads' probabilities MAX-pooled; index = KV head */
} kvs_drift_unit;
#define KVS_DRIFT_N_UNITS 2

/* The prefill scores (bits of kvs_drift_opts.scores). */
#define KVS_DRIFT_SCORE_WINDOW 1u /* SnapKV window of the last `window` prompt queries, no pooling */
#define KVS_DRIFT_SCORE_LAST 2u   /* the last prompt query's attention */

#define KVS_DRIFT_MAX_KS 64 /* k values of one sweep */

typedef struct {
    const int64_t *k;  /* [n_k] top-k sizes, strictly ascending, each >= 1 (borrowed) */
    int32_t n_k;       /* 1..KVS_DRIFT_MAX_KS */
    unsigned scores;   /* KVS_DRIFT_SCORE_* ored, at least one */
    int32_t window;    /* observation window of the window score (SnapKV/§6.3: 32) */
    int32_t delta_max; /* temporal locality for δ = 1..delta_max (0: none) */
} kvs_drift_opts;

/* One (layer, unit, k, step): what the per-step curves hold. */
typedef struct {
    int32_t layer;
    kvs_drift_unit unit;
    int32_t index;         /* query head (HEAD) or KV head (GROUP) */
    int64_t k;
    int64_t step, pos;     /* decode step (0-based) and its position; the step attends to pos + 1 positions */
    double overlap_window; /* overlap_k(window prefill set, step set); NaN when the window score is not asked */
    double overlap_last;   /* overlap_k(last-query prefill set, step set); NaN when not asked */
    double mass;           /* attention mass on the step's top-k set, in [0, 1] */
    double chance;         /* k / (pos + 1): the expected overlap_window, overlap_last and mass of a uniformly
                            * random k-subset of the pos + 1 positions (see "Chance levels") */
} kvs_drift_step;

/* Temporal locality of one (layer, unit kind, k, step t, δ) over the layer's units of that kind. */
typedef struct {
    int32_t layer;
    kvs_drift_unit unit;
    int64_t k;
    int64_t step;          /* t: overlap of step t with step t + delta */
    int32_t delta;
    int32_t n_units;
    double mean, min, max; /* of overlap_k(set_t, set_{t+δ}) over the units */
    double chance;         /* k / (positions step t + δ attends to): the expected overlap with a random set there */
} kvs_drift_locality;

/* Temporal locality of one unit at one δ, averaged over every pair (t, t + δ) of the turn. */
typedef struct {
    int32_t layer;
    kvs_drift_unit unit;
    int32_t index;
    int64_t k;
    int32_t delta;
    int64_t n_pairs;
    double mean;
    double chance; /* the mean of the pairs' chance levels (kvs_analysis_drift_locality_chance) */
} kvs_drift_locality_unit;

/* Where results go, in this order per layer: the step rows and locality rows of each step as it is read
 * (locality rows of pair (t, t+δ) when step t + δ is read), then the layer's per-unit locality rows. A callback
 * that returns an error stops the analysis with that error. Any callback may be NULL (rows dropped). */
typedef struct {
    void *ctx;
    kvs_status (*step)(void *ctx, const kvs_drift_step *row);
    kvs_status (*locality)(void *ctx, const kvs_drift_locality *row);
    kvs_status (*locality_unit)(void *ctx, const kvs_drift_locality_unit *row);
} kvs_drift_sink;

/* The default sweep: of {4, 8, 16, 32} (the tiny models) and POLICY_SPEC S1's {64, 128, 256, 1024}, every k with
 * 2k <= m, m = the prefill candidates (prompt_end - window with the window score, else prompt_end). Two k-sets of
 * m candidates share at least 2k - m members whatever the attention does, so above m/2 the overlap has a floor
 * that is arithmetic, not drift. */
#define KVS_DRIFT_DEFAULT_KS {4, 8, 16, 32, 64, 128, 256, 1024}

/*! kvs_analysis_drift_candidates() : m, the number of prompt positions the prefill sets are chosen among for
 *  `scores` and `window` (the smaller of the asked scores'): prompt_end - window (window score), prompt_end (last). */
int64_t kvs_analysis_drift_candidates(const kvs_trace_info *info, unsigned scores, int32_t window);

/*! kvs_analysis_drift_default_ks() : the default sweep for `info` (see KVS_DRIFT_DEFAULT_KS) into out (capacity
 *  cap); @return how many (0 when even k = 4 does not fit: the caller then reports the prompt too short). */
int32_t kvs_analysis_drift_default_ks(const kvs_trace_info *info, unsigned scores, int32_t window, int64_t *out,
                                      int32_t cap);

/*! kvs_analysis_drift_check() : validates `o` against the trace before anything runs: KVS_ERR_INVALID_ARG with a
 *  detail for no k, k not ascending or < 1, no score, window < 1, delta_max < 0, a first turn without a generated
 *  position ("no decode steps"), a window that leaves no prompt position before it, or a k larger than the
 *  prefill candidates ("k larger than the context"). */
kvs_status kvs_analysis_drift_check(const kvs_trace *t, const kvs_drift_opts *o);

/*! kvs_analysis_drift_run() : the analysis of every layer of `t` (borrowed), rows to `sink`. Errors: those of
 *  kvs_analysis_drift_check, KVS_ERR_NOMEM, the trace reader's (a corrupt chunk), or a sink callback's. */
kvs_status kvs_analysis_drift_run(const kvs_trace *t, const kvs_drift_opts *o, const kvs_drift_sink *sink);

/*! kvs_analysis_drift_chance() : k / n, the chance level of a top-k measure over n positions (see "Chance
 *  levels"): the expected overlap coefficient of a fixed k-set inside the n positions with a uniformly random
 *  k-subset of them, and the expected attention mass on that random subset. NaN unless 1 <= k <= n. */
double kvs_analysis_drift_chance(int64_t k, int64_t n);

/*! kvs_analysis_drift_locality_chance() : the chance level of a per-unit locality row: the mean over the pairs
 *  (t, t + delta), t = 0..n_steps - 1 - delta, of kvs_analysis_drift_chance(k, prompt_len + t + delta + 1) (step
 *  t + delta attends to that many positions). NaN when there is no pair. */
double kvs_analysis_drift_locality_chance(int64_t k, int64_t prompt_len, int64_t n_steps, int32_t delta);

/*! kvs_drift_unit_name() : "head" or "group" ("?" otherwise). */
const char *kvs_drift_unit_name(kvs_drift_unit u);

#endif /* KVS_ANALYSIS_DRIFT_H */
