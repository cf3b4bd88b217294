/* host.h — the policy host: what every driver of a policy shares for one (configuration, layer), so that the fast
 * replay (sim/replay.c), the reference replay (sim/replay_ref.c) and closed-loop decoding (sim/closed_loop.c) cannot
 * diverge on it: the seeds of randomised policies (from the run's identity), the allocation pass, the instances,
 * the selection check, the accounting of a step (default cost, account(), settlement) and the metric formulas.
 *
 * Follows ../shared/DESIGN.md "Architecture" (one host, two drivers; identity by content) and "Replay" / "Metrics";
 * POLICY_SPEC.md §1.2 (call order), §1.5 (budget and cost model), §1.6 (per-step metrics). The drivers own the loop
 * over positions (the call order of policy.h) and where the attention is computed; the host owns every rule that
 * decides a number.
 */
#ifndef KVS_HOST_H
#define KVS_HOST_H

#include <stdint.h>

#include "../common/kvs.h"
#include "../trace/trace.h"
#include "codec.h"
#include "metrics.h"
#include "policy.h"

/* ---- identity and seeds ---------------------------------------------------------------------------- */

/* What identifies a run as far as its numbers go (../shared/DESIGN.md "Identity by content"): never a path, the
 * configuration's place in a sweep, the process or the shard. */
typedef struct {
    const char *content_hash;         /* the input's content hash: a trace's SHA-256 (kvs_trace_content_sha256), for
                                       * closed-loop decoding the model's shape and the tokens'; "" when unknown (tests'
                                       * memory sources) */
    const kvs_policy_config *policy;  /* name and canonical parameters */
    int64_t budget;                   /* the nominal budget, tokens per KV head */
    const char *codec;                /* the representation stage's canonical spec (see below); NULL or "" = K/V as
                                       * captured */
    int64_t page_tokens;              /* page granularity of what is stored (see below); 0 = token granularity */
    int page_score;                   /* the resolved kvs_page_score of a paged run (kvs_host_page_rule); enters the
                                       * hash only for max and sum */
} kvs_host_identity;

/*! kvs_host_run_seed() : the seed of a run: the first 8 bytes of a SHA-256 over its identity and the cache's element
 *  sizes (kv_bytes, aux_bytes of `m`). A codec and a page size enter the hash only when set, so a run without them
 *  keeps its seed when they arrive. The same run draws the same numbers in any invocation. */
uint64_t kvs_host_run_seed(const kvs_host_identity *id, const kvs_policy_model *m);

/*! kvs_host_instance_seed() : kvs_policy_init.seed of the instance of (layer, kv_head) of a run. */
uint64_t kvs_host_instance_seed(uint64_t run_seed, int layer, int kv_head);

/* Where the other axes of compression enter (designed here so that they need no change to the drivers):
 *  - a REPRESENTATION stage (a codec: quantized K/V, pruned key channels) sits between the selection check and the
 *    attention: the drivers attend over the rows the codec gives back for the stored positions (what a real cache
 *    would dequantize), policies observe those probabilities, and the codec says what a stored row costs in bytes;
 *  - PAGE granularity (a paged cache, below) maps each step's selection to whole pages of page_tokens positions:
 *    the attended set, and the counts the cost takes, become whole pages;
 *  - both reach the numbers only through the identity above, the rows a driver attends over, and the bytes per
 *    stored row that kvs_host_cost multiplies the counts by (today kvs_policy_kv_bytes: 2 x d x kv_bytes). */

/* ---- page granularity (a paged cache) ------------------------------------------------------------ */

/* Serving systems (vLLM's blocks of 16, SGLang, TensorRT-LLM) hold the KV cache in pages of N consecutive positions
 * and can only drop whole pages. The rule every driver follows for a run with page size N >= 1
 * (kvs_replay_opts.pages; `kvsim replay --page N`):
 *  - page j holds positions [jN, (j+1)N). At decode position p (step n = p + 1) a list may attend at most C pages:
 *    C = max(1, floor(B / N)) for a budget B bounding S_t every step (the list's budget after the allocation pass);
 *    for a prompt-only budget B the step's allowance is B plus the list's generated (non-prompt) entries of S_t,
 *    C = max(1, floor((B + generated) / N)); a policy without a budget (full) attends every page that holds a
 *    position it selected;
 *  - the policy runs unchanged at token level (its select() gives S_t); the host maps S_t to pages
 *    (kvs_host_page_map): the newest page (holding p, partial or not) is always attended; the other C - 1 slots go
 *    to the pages of S_t ranked by the run's page score (kvs_page_score, `kvsim replay --page-score`): by the
 *    policy's own retention scores where it has them (policy.h scores(), asked after select() and before
 *    observe()): a page's score is the max (or the sum, in S_t's order) of its S_t entries' scores, a position the
 *    policy keeps whatever its score counting INFINITY; ties by the count below, then the newer page; the COUNT
 *    rule (a policy without scores(), or one that has none at this step, or --page-score count) ranks pages by how
 *    many positions of S_t they hold, ties to the newer page. A page holding no position of S_t is never taken.
 *    Only positions <= p count, so the choice at step n depends on nothing later (no look-ahead); the default is
 *    max for a policy with scores(), count otherwise (kvs_host_page_rule);
 *  - the attended set is every position <= p of the chosen pages, whole pages: positions the policy did not select
 *    but that share a page with ones it did are attended, as a paged cache holds them. Its order: the entries of
 *    S_t on chosen pages in S_t's order (a merged slot keeps its policy-owned rows), then the chosen pages' other
 *    positions in ascending order (trace rows). Every metric is computed on that set (recall: its full-attention
 *    mass; top-k overlap: against its size);
 *  - observe() gets the probabilities of the policy's own S_t entries under that attention (the softmax's
 *    normaliser runs over the attended set; an entry on a page not attended gets 0), so its state stays token-level
 *    and sees only what a real system computed;
 *  - bytes (kvs_host_page_cost): a page stays resident while it holds any position the policy keeps, stored() ∪ S_t
 *    (every position seen for a policy without stored()): the KV resident is that many whole pages x N rows per
 *    list (the union of the lists' pages for the dedup count) — a partial newest page counts its N allocated slots,
 *    its padding is real memory — and the KV read is the attended positions (a paged kernel stops at the context
 *    length in the newest page). The policy's account() runs as without pages; the three KV classes (resident,
 *    dedup, read) are then the host's page counts whatever it wrote, every other class (auxiliary state, host
 *    store, transfers, writes) stays the policy's. Memory beyond C x N is what page granularity costs an evicting
 *    policy: a page is freed only when the policy keeps none of its positions;
 *  - the first turn's prompt is prefilled as without pages (full precision, full prompt) and measured prompt
 *    positions (--measure all|prefill, later turns' prompts too) attend as without pages: paging applies from the
 *    first decode step on, like a codec;
 *  - with page size 1 every number is the token-level one: the chosen pages are S_t, attended in its order;
 *  - with a codec (the representation stage below) the attended set's rows are the codec's, as without pages, and
 *    the KV classes count whole pages of the codec's bytes (kvs_host_page_cost);
 *  - the page size enters the run's identity (kvs_host_identity.page_tokens) only when set, so a run without pages
 *    keeps its seed; a score rule (max, sum) enters it beside the page size;
 *  - on a sliding-window layer (window W, kvs_host_page_window; sim/replay.h "Sliding-window layers") pages stay
 *    aligned blocks of absolute positions, and what a paged serving system with a sliding window does is what is
 *    counted: vLLM (the sliding-window KV manager) frees a block only once every position of it has left the
 *    window, and the attention kernel masks the positions of a straddling block that lie before the window. So at
 *    position p (window's first position lo = p - W + 1) the attended set is the chosen pages' positions in
 *    [lo, p] only (never one outside the window), while a resident page counts all its N slots, those behind the
 *    window included, as long as it holds a position the policy keeps (stored() ∪ S_t, in the window after the
 *    host's evictions); a policy without stored() holds every page from lo's to p's. The KV read is the attended
 *    positions, as above. So a full cache of page size N on such a layer holds floor(p/N) - floor(lo/N) + 1 pages:
 *    up to ceil((W - 1)/N) + 1 of them, at most 2 (N - 1) slots more than the window. */
typedef struct kvs_host_page kvs_host_page;
typedef struct kvs_host_rep kvs_host_rep; /* the representation stage (below) */

/* How S_t is ranked into pages (the rule above). KVS_PAGE_SCORE_AUTO asks for the default. */
typedef enum {
    KVS_PAGE_SCORE_AUTO = 0,  /* max where the policy has scores(), count otherwise */
    KVS_PAGE_SCORE_COUNT = 1, /* positions of S_t on the page */
    KVS_PAGE_SCORE_MAX = 2,   /* the max of its S_t entries' retention scores */
    KVS_PAGE_SCORE_SUM = 3,   /* their sum */
} kvs_page_score;

/*! kvs_host_page_rule() : the rule a run of policy `ops` follows when `asked` is asked: count for a policy without
 *  scores() whatever is asked, max for AUTO with scores(), else `asked`. Never AUTO. */
static inline kvs_page_score kvs_host_page_rule(const struct kvs_policy_ops *ops, kvs_page_score asked) {
    if (!ops->scores) return KVS_PAGE_SCORE_COUNT;
    return asked == KVS_PAGE_SCORE_AUTO ? KVS_PAGE_SCORE_MAX : asked;
}

/*! kvs_host_page_score_name() : "max", "sum" or "count" (AUTO reads "count": resolve it first). */
const char *kvs_host_page_score_name(kvs_page_score rule);

/*! kvs_host_page_create() : scratch for mapping selections of streams of up to n_positions positions (turns as
 *  kvs_host_check_create) to pages of page_tokens >= 1 positions. Caller frees with kvs_host_page_free (accepts
 *  NULL). KVS_ERR_INVALID_ARG for a bad size, KVS_ERR_NOMEM. */
kvs_status kvs_host_page_create(int64_t n_positions, int64_t page_tokens, const kvs_turn *turns, int64_t n_turns,
                                kvs_host_page **out);
void kvs_host_page_free(kvs_host_page *pg);

/*! kvs_host_page_cap() : C, the pages one list of S_t (idx[0..n), positions <= p) may attend at position p under
 *  a policy of budget scope `scope` with that list's budget `budget` (the rule above). */
/*! kvs_host_page_window() : the attention window of the layer the following maps and costs are of (0 = full causal
 *  attention; the rule above). */
void kvs_host_page_window(kvs_host_page *pg, int64_t window);

int64_t kvs_host_page_cap(const kvs_host_page *pg, kvs_policy_budget_scope scope, int64_t budget, const int32_t *idx,
                          int64_t n, int64_t p);

/*! kvs_host_page_map() : the attended set of one list at position p with at most `cap` pages (the rule above),
 *  ranked by rule `rule` over score[0..n) (the policy's scores of S_t's entries; NULL, or rule COUNT, = the count
 *  rule): att[0..m) its positions, att_k/att_v[0..m) their rows (the merged slot's rows of row_k/row_v, NULL = the
 *  trace's row; row_k/row_v may be NULL for a list without merged slots), place[j] (j < n) the index in att of
 *  S_t's entry j, -1 when its page is not attended. @return m. Arrays of capacity >= p + 1 (place: n). */
int64_t kvs_host_page_map(kvs_host_page *pg, const int32_t *idx, const float *const *row_k, const float *const *row_v,
                          int64_t n, int64_t p, int64_t cap, const double *score, kvs_page_score rule, int32_t *att,
                          const float **att_k, const float **att_v, int32_t *place);

/*! kvs_host_page_cost() : the cost of a decode step at position p of KV head h under pages: the policy's account()
 *  after the default classes, then the KV classes from whole pages (the rule above): resident pages of stored() ∪
 *  S_t of each list of sel, the attended entries att->idx[li][0..att->n[li]) of each list. With an active codec
 *  stage `rep` (NULL or inactive: none) the KV classes are the codec's bytes: a resident page's rows <= p as the
 *  codec holds them (kvs_codec_state_bytes with the layer's share, as kvs_host_rep_cost), each padding slot of a
 *  partial page at kvs_codec_position_bytes (the page is allocated in the codec's format), the attended rows as the
 *  codec holds them. The codec's error otherwise. */
kvs_status kvs_host_page_cost(kvs_host_page *pg, kvs_host_rep *rep, int h, const struct kvs_policy_ops *ops,
                              void *state, const kvs_policy_model *m, const kvs_policy_view *view,
                              const kvs_policy_sel *sel, const kvs_policy_sel *att, int64_t p, kvs_policy_cost *cost);

/* ---- the representation stage (a codec, sim/codec.h) --------------------------------------------------- */

/* The rule every driver follows for a run with a codec (kvs_replay_config.codec; `kvsim replay --codec`):
 *  - the first turn's prompt (positions < P = its length) is scored in full precision: the policy's prefill calls,
 *    its allocation pass and any measured prompt position of turn 0 see the rows as captured, as a real system
 *    computes prefill attention before it quantizes;
 *  - from the first decode step on (and at every position of a later turn, whose prompt follows the decode rule),
 *    at step n (the query is position n-1) the rows a policy's view carries, the attention over what it selected,
 *    the probabilities it observes and therefore every metric use kvs_codec_state_rows() at n: dequantized below
 *    the codec's q(n), as captured above it. The codec state reads only rows < n at step n (its contract), so the
 *    codec adds no look-ahead;
 *  - the reference the error is measured against, and the full attention behind recall and the top-k overlap,
 *    stay the full-precision full-cache attention (an oracle policy's full_probs too);
 *  - bytes: storage counts kvs_codec_state_bytes() of each list's resident set (stored() ∪ S_t; every position
 *    seen for a policy without stored()), its union for the dedup count, the attended entries for the K/V read,
 *    plus kvs_codec_layer_bytes() shared equally by the layer's KV heads; the new token's write and every
 *    auxiliary count are the policy's as without a codec (kvs_host_rep_cost).
 *  - on a sliding-window layer (kvs_host_rep_window) nothing changes but what exists: the codec still represents every
 *    position (its state does not depend on the window, as it does not on the policy), a policy attends over the
 *    codec's rows of positions inside the window only (the host's evictions and the selection check see to it), the
 *    reference is the full-precision windowed attention, and a policy without stored() holds the codec's bytes of the
 *    window's positions rather than of every position seen.
 * One kvs_host_rep holds the codec state of every KV head of one layer for one codec; configurations with the same
 * codec may share one (its rows do not depend on the policy: the codec represents every position as if nothing
 * were evicted). */

/*! kvs_host_rep_create() : the representation stage of one layer of model `m` (n_kv_heads states of up to
 *  n_positions rows of head_dim; first prompt length m->prompt_len) under codec `c` (borrowed, must outlive it).
 *  Caller frees with kvs_host_rep_free (accepts NULL). KVS_ERR_NOMEM, or the codec's KVS_ERR_INVALID_ARG. */
kvs_status kvs_host_rep_create(const kvs_codec *c, const kvs_policy_model *m, kvs_host_rep **out);
void kvs_host_rep_free(kvs_host_rep *r);

/*! kvs_host_rep_prompt_queries() : a codec that scores with the prompt's queries (kvs_codec_needs_queries: think)
 *  takes KV head h's queries of the first prompt here, q = [n_q][group][head_dim] for positions 0..n_q-1 (the
 *  view->q layout of the prefill; n_q = P), before the first kvs_host_rep_sync past the prompt: the drivers call it
 *  from the first prompt's last prefill block. A no-op for any other codec, once the stage is active, or when head h
 *  already has them (configurations sharing the stage call it alike). The codec's errors otherwise. */
kvs_status kvs_host_rep_prompt_queries(kvs_host_rep *r, int h, const float *q, int64_t n_q, int group);

/*! kvs_host_rep_sync() : brings the stage to step n: nothing while n <= P (the prompt is full precision);
 *  otherwise, the first time, every KV head's prefill from rows 0..P-1 (and kvs_codec_share_scale), then every
 *  head advanced to n. k[h], v[h] = KV head h's history rows (at least n of them; only rows < n are read). n never
 *  goes back. The codec's error (a non-finite row: KVS_ERR_RANGE) otherwise. */
kvs_status kvs_host_rep_sync(kvs_host_rep *r, const float *const *k, const float *const *v, int64_t n);

/*! kvs_host_rep_window() : the attention window of the stage's layer (0 = full causal attention; the rule above). */
void kvs_host_rep_window(kvs_host_rep *r, int64_t window);

/*! kvs_host_rep_active() : 1 once the stage is past the first prompt (its rows are the codec's). */
int kvs_host_rep_active(const kvs_host_rep *r);

/*! kvs_host_rep_rows() : KV head h's rows [n][d] of K or V at the current step: the codec's when active, else
 *  `captured` (the driver's own history). Valid until the next sync. */
const float *kvs_host_rep_rows(const kvs_host_rep *r, int h, kvs_codec_tensor t, const float *captured);

/*! kvs_host_rep_list_bytes() : *bytes = the codec's bytes of the positions idx[0..n) (distinct, < the current
 *  step) of KV head h, plus its share of kvs_codec_layer_bytes. KVS_ERR_STATE when the stage is not active. */
kvs_status kvs_host_rep_list_bytes(kvs_host_rep *r, int h, const int32_t *idx, int64_t n, double *bytes);

/*! kvs_host_rep_cost() : kvs_host_cost of a decode step at position p of KV head h with the codec's bytes (the
 *  rule above) in place of kv_slots x the row size; then the policy's account() and the settlement as there.
 *  The stage must be active at step p + 1. */
kvs_status kvs_host_rep_cost(kvs_host_rep *r, int h, const struct kvs_policy_ops *ops, void *state,
                             const kvs_policy_model *m, const kvs_policy_view *view, const kvs_policy_sel *sel,
                             int64_t p, kvs_policy_cost *cost);

/* ---- allocation pass and instances --------------------------------------------------------------- */

/* The first turn's prompt view of (layer, kv_head) (as prefill() would get it: n = q count = the prompt length),
 * valid until the next call. What the allocation pass reads. */
typedef kvs_status (*kvs_host_prompt_view_fn)(void *user, int layer, int kv_head, kvs_policy_view *view);

/*! kvs_host_alloc_pass() : the allocation pass of one (configuration, budget) (policy.h alloc_*): budgets[L * Hkv]
 *  receive the per-(layer, KV head) budgets (every entry `budget` for a policy without the pass, without calling
 *  `prompt_view`); *alloc (free with kvs_host_alloc_free after every instance is freed) and *shared (NULL for
 *  none) the pass's state. KVS_ERR_STATE for a budget below 1; the policy's or the view's error otherwise. */
kvs_status kvs_host_alloc_pass(const kvs_policy_config *cfg, const kvs_policy_model *m, int64_t budget,
                               kvs_host_prompt_view_fn prompt_view, void *user, int64_t *budgets, void **alloc,
                               const void **shared);

/*! kvs_host_alloc_begin() / kvs_host_alloc_end() : the same pass in steps, for a driver that reads every (layer,
 *  KV head) prompt once for several configurations: begin fills budgets[] with `budget` and starts the policy's pass
 *  (*alloc NULL: the policy has none, nothing else to call); the driver calls ops->alloc_prefill(*alloc, l, h, view)
 *  for every (layer, KV head); end finishes it (budgets checked, *shared set). */
kvs_status kvs_host_alloc_begin(const kvs_policy_config *cfg, const kvs_policy_model *m, int64_t budget,
                                int64_t *budgets, void **alloc);
kvs_status kvs_host_alloc_end(const kvs_policy_config *cfg, const kvs_policy_model *m, void *alloc, int64_t *budgets,
                              const void **shared);

/*! kvs_host_alloc_free() : releases what kvs_host_alloc_pass left. Accepts NULL. */
void kvs_host_alloc_free(const kvs_policy_config *cfg, void *alloc);

/*! kvs_host_create_layer() : creates the instances of one layer, states[h] for every KV head (budgets_layer[h]
 *  each, seeds from run_seed), and *prefill_block the block size the policy asks for its prefill (0 = the whole
 *  prompt). On failure every instance created is freed and states[] is all NULL. */
kvs_status kvs_host_create_layer(const kvs_policy_config *cfg, const kvs_policy_model *m, int64_t budget_nominal,
                                 const int64_t *budgets_layer, uint64_t run_seed, int layer, const void *shared,
                                 void **states, int64_t *prefill_block);

/*! kvs_host_free_layer() : frees states[0..n_kv_heads) (NULL entries allowed) and sets them NULL. */
void kvs_host_free_layer(const kvs_policy_config *cfg, void **states, int n_kv_heads);

/* ---- selection check --------------------------------------------------------------------------- */

typedef struct kvs_host_check kvs_host_check;

/*! kvs_host_check_create() : scratch for checking selections of streams of up to n_positions positions whose
 *  turns are turns[0..n_turns) (prompt positions are those a prompt-only budget bounds). Caller frees with
 *  kvs_host_check_free (accepts NULL). */
kvs_status kvs_host_check_create(int64_t n_positions, const kvs_turn *turns, int64_t n_turns, kvs_host_check **out);
void kvs_host_check_free(kvs_host_check *hc);

/* Sliding-window layers (replay.h "Sliding-window layers"): on a layer with window W only positions p-W+1..p exist
 * at position p. kvs_host_check_window() sets the window the following checks hold selections to (0 = full causal
 * attention): kvs_host_check_sel then also refuses a list entry or a stored() position older than the window, and
 * counts a policy without stored() as holding the window's min(W, p + 1) positions. kvs_host_window_first() is the
 * window's first position at p (0 without a window). kvs_host_window_evict() tells an instance that the positions
 * before first are gone (ops->window_evict; nothing when first <= 0; KVS_ERR_UNSUPPORTED for a policy without
 * it), before its prefill of a block ending at be (first = the window's at be) and before its observe() at p
 * (first = the window's at p + 1). */
void kvs_host_check_window(kvs_host_check *hc, int64_t window);
int64_t kvs_host_window_first(int64_t window, int64_t p);
kvs_status kvs_host_window_evict(const struct kvs_policy_ops *ops, void *state, int64_t first);

/*! kvs_host_check_sel() : the selection contract of policy.h at decode position p: every list holds 1..p+1
 *  distinct positions in [0, p], a merged slot gives both its K and V rows, stored() lies in [0, p], and the budget
 *  holds (|S_t| <= budget every step, or the prompt positions of S_t <= budget for prompt-only policies). Fills
 *  has_merged[li] (the list holds merged slots), plain[li] (strictly ascending in [0, p], no merged slot: the fast
 *  kernels' precondition), *kv_slots = sum over lists of |stored() ∪ S_t| (every position seen, p + 1, without
 *  stored()) and *dedup = the union of those across lists. KVS_ERR_STATE naming the policy for a violation. */
kvs_status kvs_host_check_sel(kvs_host_check *hc, const struct kvs_policy_ops *ops, void *state,
                              const kvs_policy_sel *sel, int64_t p, int64_t budget, int *has_merged, uint8_t *plain,
                              double *kv_slots, double *dedup);

/* ---- accounting -------------------------------------------------------------------------------- */

/*! kvs_host_cost() : the cost of a decode step: the default accounting of policy.h (KV of stored() ∪ S_t per list
 *  and their union, attended reads, the new token's write, from kvs_host_check_sel's counts), then the policy's
 *  account() when it has one, then what must hold whatever it did (dedup <= kv; unfused aux reads >= fused). */
void kvs_host_cost(const struct kvs_policy_ops *ops, void *state, const kvs_policy_model *m,
                   const kvs_policy_view *view, const kvs_policy_sel *sel, double kv_slots, double dedup,
                   kvs_policy_cost *cost);

/*! kvs_host_storage_bytes() / kvs_host_traffic_bytes() : the totals a run reports: resident device bytes (KV +
 *  auxiliary) and bytes read (KV + auxiliary, fused) of a step's cost. */
static inline double kvs_host_storage_bytes(const kvs_policy_cost *c) { return c->kv_bytes + c->aux_bytes; }
static inline double kvs_host_traffic_bytes(const kvs_policy_cost *c) { return c->read_kv_bytes + c->read_aux_bytes; }

/* ---- metrics ----------------------------------------------------------------------------------- */

/* The sums behind one query head's quality metrics at one step: recall = full-attention mass on the unmerged
 * entries of S_t, recall_merged = on every entry, hit = entries among the first |S_t| of the full attention's
 * descending order (ties by lower position); the four fp64 sums of the outputs, each in ascending dimension
 * order: err2 = sum (ref - out)^2, ref2 = sum ref^2, out2 = sum out^2, dot = sum ref * out. */
typedef struct {
    double recall, recall_merged, err2, ref2, out2, dot;
    int64_t hit;
} kvs_host_sums;

/*! kvs_host_out_sums() : err2, ref2, out2 and dot of s from the full output ref[d] and the policy's out[d]. */
void kvs_host_out_sums(const float *ref, const float *out, int64_t d, kvs_host_sums *s);

/*! kvs_host_metrics() : every metric of sim/metrics.h of one query head at position p that attended n entries,
 *  from its sums and its KV head's cost of the step: v[KVS_M_...]. */
void kvs_host_metrics(const kvs_policy_model *m, int64_t p, int64_t n, const kvs_host_sums *s,
                      const kvs_policy_cost *cost, double v[KVS_N_METRICS]);

#endif /* KVS_HOST_H */
