/* closed_loop.h — closed-loop decoding with a KV-cache policy active inside the CPU forward pass
 * (../shared/DESIGN.md "Closed-loop decoding (calibration of the replay)").
 *
 * Two copies of the model decode side by side:
 *  - the FULL model: plain kvs_model_forward, full causal attention;
 *  - the POLICY model: its own kvs_model_state whose attention (kvs_model_state_set_attn) attends, for every
 *    layer and KV head, only to the set S_t the policy selects. The policy is the same plugin replay runs
 *    (sim/policy.h, policies/), driven through the policy host that the replay drives too (sim/host.h: seeds,
 *    allocation pass, instances, selection check, accounting, metric formulas), in the replay's call order
 *    (POLICY_SPEC §1.2): allocation pass over the first prompt, create, prefill (in blocks when the policy asks),
 *    then per decode position select -> attention over S_t -> account -> observe [-> layer_sync]. Every view the
 *    policy gets is built from the POLICY model's own queries, keys and values: it never sees the full model's
 *    states (a leak test perturbs the full model and checks the policy model does not move).
 *
 * Prompt: positions [0, prompt_len) are forwarded with full attention by both models (prefill attends to the
 * whole prompt; compression starts once the prompt is in the cache, as in replay, where the prompt's q/k/v
 * are those of full-cache decoding). Decode positions p >= prompt_len use S_t.
 *
 * Modes:
 *  - teacher-forced (free_running = 0): both models read tokens[0..n_tokens); each decode position p in
 *    [prompt_len, n_tokens - 1) is one step predicting reference token tokens[p + 1]: KL(full || policy) of the
 *    two next-token distributions, top-1 agreement, NLL of the reference token under each (perplexity), and the
 *    replay's attention metrics (relative output error, attention recall, top-k overlap; sim/metrics.h) of the
 *    policy model's attention against exact full attention over the policy model's OWN history (the states it
 *    actually has), averaged over layers and query heads.
 *  - free-running (free_running = 1): each model feeds back its own greedy (argmax) token for max_new steps
 *    after the tokens given (stopping at EOS when stop_at_eos); records both token sequences, the first step where
 *    they differ and the fraction of steps where they agree. KL and NLL are recorded per step too (each
 *    model's next-token distribution on its own context; the NLL is of the FULL model's token). When the prompt is
 *    shorter than the tokens given (prompt_len < n_tokens), both models first read tokens[prompt_len..n_tokens)
 *    as decode positions (the policy model through S_t; those steps' reference is the next given token), so even
 *    the first generated token depends on the policy: how a task (below) asks a question about the context. With
 *    prompt_len == n_tokens the first generated token comes from the uncompressed prompt (the same in both).
 *
 * Determinism: same model, tokens, policy configuration and budget give the same numbers: policy seeds come from
 * the run's identity (the model's shape, the tokens, the mode, the policy's canonical spec and the budget;
 * kvs_host_run_seed) and the (layer, KV head). Single-threaded policy work; the model's matrix products use `pool`.
 */
#ifndef KVS_CLOSED_LOOP_H
#define KVS_CLOSED_LOOP_H

#include <stdint.h>

#include "../common/kvs.h"
#include "../common/threadpool.h"
#include "../gpu_capture/model.h"
#include "../gpu_capture/tokenizer.h"
#include "codec.h"
#include "policy.h"

/* The most lists a policy selects at once (one per query head of a KV group). */
#define KVS_CLOSED_LOOP_MAX_LISTS 64

typedef struct {
    const kvs_model *model;      /* borrowed */
    kvs_policy_config policy;    /* the policy configuration (kvs_policy_parse) */
    int64_t budget;              /* tokens per KV head, the current token included (>= 1) */
    kvs_threadpool *pool;        /* borrowed; NULL = single-threaded */
    const int32_t *tokens;       /* [n_tokens], borrowed: teacher-forced: the whole text; free-running: the tokens read
                                  * before generating */
    int64_t n_tokens;
    int64_t prompt_len;          /* teacher-forced: 1 <= prompt_len <= n_tokens - 2; free-running: 1 <= prompt_len
                                  * <= n_tokens (== n_tokens: the whole input is the prompt) */
    int free_running;            /* 0 teacher-forced, 1 free-running */
    int64_t max_new;             /* free-running: tokens to generate (>= 2 when prompt_len == n_tokens, else >= 1) */
    int stop_at_eos;             /* free-running: stop when both models emitted an EOS (kvs_model_is_eos) */
    const kvs_codec *codec;      /* borrowed; NULL = none. The policy model's cache under a codec (sim/codec.h; the
                                  * replay's representation rule, sim/host.h): the prompt is read in full precision,
                                  * from the first decode position on every layer attends over the codec's rows of its
                                  * own history (dequantized below the codec's q(n)), the policy observes those
                                  * probabilities and the bytes are the codec's; the attention metrics' reference
                                  * stays the policy model's own history in full precision. Part of the run's
                                  * identity (its seed) when set. */
    /* TEST HOOKS (NULL in normal use). full_attn replaces the FULL model's attention (the leak test perturbs
     * the full model through it); on_step sees both next-token logits [vocab] of every step. */
    kvs_model_attn_fn full_attn;
    void *full_attn_user;
    void (*on_step)(void *user, int64_t step, const float *full_logits, const float *policy_logits);
    void *on_step_user;
} kvs_closed_loop_opts;

/* One step: the prediction made at position `position`. */
typedef struct {
    int64_t position;
    int32_t ref_token;       /* tokens[position + 1] while the next token is given; else (free-running, generating)
                              * the full model's argmax */
    int32_t full_top1, policy_top1; /* argmax of each model's logits */
    double kl;               /* KL(full || policy) of the softmaxed logits, nats */
    double nll_full, nll_policy; /* -log p(ref_token), nats */
    double out_err, attn_recall, topk_overlap; /* policy model's attention vs exact attention over its own
                                                * history, mean over layers and query heads */
    double attended;         /* mean |S_t| over layers and query heads */
    double storage_bytes, traffic_bytes; /* the step's resident and read bytes per KV head, mean over layers and KV
                                          * heads: the replay's accounting (sim/host.h kvs_host_cost) */
} kvs_closed_loop_step;

typedef struct {
    int64_t n_steps;
    kvs_closed_loop_step *steps; /* [n_steps] */
    int64_t budget_max;      /* largest per-(layer, KV head) budget after the allocation pass */
    /* aggregates over the steps */
    double kl_mean, kl_max, top1_agree;  /* top1_agree: fraction of steps with full_top1 == policy_top1 */
    double nll_full_mean, nll_policy_mean, ppl_full, ppl_policy; /* ppl = exp(mean NLL) */
    double out_err_mean, out_err_p95, attn_recall_mean, topk_overlap_mean, attended_mean;
    double storage_bytes_mean, traffic_bytes_mean;
    /* free-running only (0 / NULL otherwise) */
    int64_t n_generated;         /* steps generated (may stop early at EOS) */
    int32_t *full_tokens, *policy_tokens; /* [n_generated] each model's generated tokens */
    int64_t first_divergence;    /* first generated index where they differ, -1 when they never do */
    double token_agreement;      /* fraction of generated indices where they are equal */
} kvs_closed_loop_result;

/*! kvs_closed_loop_run() : runs one (policy configuration, budget) closed loop as described above.
 *  KVS_ERR_INVALID_ARG for bad options (prompt_len, budget, positions beyond the model context, a policy
 *  that rejects the budget: detail names it), KVS_ERR_STATE for a policy that violates the contract (a
 *  selection out of range, repeated, or over its budget), or the model's error. Caller frees *out with
 *  kvs_closed_loop_result_free. */
kvs_status kvs_closed_loop_run(const kvs_closed_loop_opts *o, kvs_closed_loop_result **out);

/*! kvs_closed_loop_result_free() : accepts NULL. */
void kvs_closed_loop_result_free(kvs_closed_loop_result *r);

/*! kvs_closed_loop_kl() : KL(p || q) in nats of the softmax distributions p = softmax(a), q = softmax(b) over
 *  n logits, in fp64 (log-sum-exp stabilised); exactly 0 when a and b are equal. */
double kvs_closed_loop_kl(const float *a, const float *b, int64_t n);

/*! kvs_closed_loop_nll() : -log softmax(logits)[token] in nats, fp64. */
double kvs_closed_loop_nll(const float *logits, int64_t n, int32_t token);

/* ---------------------------------------------------------------------------------------------------------------
 * Tasks: questions about a context whose answer is known, scored on each model's greedy continuation.
 *
 * Attention error is a proxy; a task measures what a reader sees: does the model still produce the answer (a name
 * introduced early in a story, say) when its cache is the policy's selection? The task file (text, UTF-8):
 *   line 1            "# kvsim task v1" (the format and its version; another version is KVS_ERR_VERSION)
 *   "#..." or blank   comments, skipped
 *   CONTEXT<TAB>ANSWER one item per line: the text read is CONTEXT + " " + ANSWER, one space between; neither part
 *                     empty, no second TAB, no white space at either end of either part ("\r\n" endings accepted).
 * An item is correct when the model's greedy continuation of CONTEXT begins with the answer as whole words
 * (kvs_closed_loop_task_match). The prompt of the closed loop is CONTEXT's tokens but the last (the policy compresses
 * the context, then the context's last token and the answer are decoded through S_t; kvsim generate --prompt-tokens
 * K keeps the first K tokens as the prompt instead, reading the rest of the context through the policy).
 * --------------------------------------------------------------------------------------------------------------- */

typedef struct {
    char *context, *answer; /* owned by the task */
    int64_t line;           /* 1-based line of the file */
} kvs_closed_loop_task_item;

typedef struct {
    kvs_closed_loop_task_item *items; /* [n_items] in file order */
    int64_t n_items;
    char sha256[65];                  /* of the file's bytes: the task's identity */
} kvs_closed_loop_task;

/*! kvs_closed_loop_task_parse() : parses text[0..len) (a task file's bytes; `name` names it in messages) into *out
 *  (caller frees with kvs_closed_loop_task_free). KVS_ERR_FORMAT for a missing first line, a malformed item or no
 *  item at all, KVS_ERR_VERSION for another version (detail: file and line); KVS_ERR_NOMEM. */
kvs_status kvs_closed_loop_task_parse(const char *text, size_t len, const char *name, kvs_closed_loop_task **out);

/*! kvs_closed_loop_task_load() : kvs_closed_loop_task_parse of the file at path (KVS_ERR_IO when unreadable). */
kvs_status kvs_closed_loop_task_load(const char *path, kvs_closed_loop_task **out);

/*! kvs_closed_loop_task_free() : accepts NULL. */
void kvs_closed_loop_task_free(kvs_closed_loop_task *t);

/* One item as the models read it. The tokenizer splits the whole text CONTEXT + " " + ANSWER (so the answer's
 * tokens are those the model would produce in running text); the models read the longest run of whole tokens that
 * lies inside CONTEXT + " ", and the rest of the text is expected. Usually `expected` is " ANSWER" (SentencePiece:
 * the space starts the next word) or "ANSWER" (a tokenizer whose pieces end in the space); where a tokenizer has one
 * piece across the boundary (tinystories-656K: ",\u2581Tim") the piece is expected too: ", Tim". */
typedef struct {
    int32_t *tokens;  /* [n_tokens] owned: BOS + the whole text */
    int64_t n_tokens;
    int64_t n_context; /* tokens[0..n_context) are read; tokens[n_context..n_tokens) are the answer's (n_context >= 2) */
    char *expected;   /* owned: the text of tokens[n_context..n_tokens) as it stands in the item's text */
} kvs_closed_loop_task_input;

/*! kvs_closed_loop_task_tokenize() : *out for item `it` (caller frees with kvs_closed_loop_task_input_clear).
 *  KVS_ERR_FORMAT (detail names the item's line) when the tokenizer does not give the item's text back, or leaves no
 *  context token after BOS (the item cannot be asked of this model); the tokenizer's errors; KVS_ERR_NOMEM. */
kvs_status kvs_closed_loop_task_tokenize(const kvs_tokenizer *tok, const kvs_closed_loop_task_item *it,
                                         kvs_closed_loop_task_input *out);

/*! kvs_closed_loop_task_input_clear() : frees what *in owns and zeroes it; accepts a zeroed input. */
void kvs_closed_loop_task_input_clear(kvs_closed_loop_task_input *in);

/*! kvs_closed_loop_task_continuation() : the text that gen[0..n_gen) adds after the item's context: the decoding of
 *  context + gen past the decoding of the context (so the tokenizer's rules for the start of a text do not apply
 *  to it). *text is malloc'd (caller frees). Tokenizer errors; KVS_ERR_NOMEM. */
kvs_status kvs_closed_loop_task_continuation(const kvs_tokenizer *tok, const kvs_closed_loop_task_input *in,
                                             const int32_t *gen, int64_t n_gen, char **text);

/*! kvs_closed_loop_task_match() : 1 when `generated` begins with `expected` as whole words, else 0. White space at the
 *  start of either is skipped; the rest of `expected` must follow byte for byte; when expected ends in a letter or
 *  digit (or a non-ASCII byte), the next byte of `generated` must not be one ("Tim" does not match "Timmy"), the end of
 *  `generated` is a boundary. An empty expected (after the white space) never matches. */
int kvs_closed_loop_task_match(const char *generated, const char *expected);

#endif /* KVS_CLOSED_LOOP_H */
