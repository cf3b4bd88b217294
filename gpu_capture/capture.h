/* capture.h — the decoding loop behind `kvsim capture` (../shared/DESIGN.md "Capture"):
 * loads a model and its tokenizer, feeds the prompt (or several user turns), generates, and records
 * every position through the trace writer (trace/trace.h). The CLI, the tests and the benchmark all
 * call kvs_capture_run, so what is tested is what ships.
 *
 * Semantics:
 *  - BOS: prepended to the first turn per the model/tokenizer configuration unless no_bos. Text prompts
 *    go through kvs_tokenizer_encode(add_bos); prompt ids get the model's BOS id prepended when the
 *    tokenizer (if any) would add one. No prompt at all starts from BOS alone.
 *  - Every generated token is forwarded through the model, so a single-turn trace holds
 *    prompt + generated positions. Generation of a turn stops after `steps` tokens, or when the model
 *    emits an end token (model EOS ids; llama2.c: BOS 1 and EOS 2, as run.c stops) unless ignore_eos; the
 *    end token itself is not forwarded or recorded. Reaching max_positions stops the whole capture (not
 *    an error); a prompt that does not fit is an error (KVS_ERR_RANGE) and nothing is written, unless
 *    `truncate` asks to cut it (single prompts only, not turns): then, when the prompt and `steps`
 *    generated tokens do not fit in max_positions, prompt tokens are dropped from the start (LEFT; a
 *    leading BOS is kept) or the end (RIGHT) until they do, keeping at least one.
 *  - Prompt text the tokenizer maps to its unknown token is counted (r->n_unk) for the caller to warn.
 *  - Turns: turn t's prompt tokens are recorded with role PROMPT and turn index t, then its generated
 *    tokens with role GENERATED. Only turn 0 gets BOS.
 *  - On any failure the trace writer is freed unclosed, which removes OUT.partial: no file is left. An
 *    interruption through opts.stop is the exception: OUT.partial keeps the positions done, recoverable.
 *  - Chat (opts.chat): the model folder's own chat template (gpu_capture/chat_template.h) renders the
 *    conversation: the prompt becomes [system?, user: prompt] with add_generation_prompt, and turn t of
 *    --turns renders [system?, user 0, assistant 0, ..., user t], assistant j being the text the model generated
 *    in turn j (decoded without special tokens, as a serving stack hands a reply back). The text is encoded
 *    without the tokenizer's own BOS (the template writes bos_token; Hugging Face's apply_chat_template encodes
 *    with add_special_tokens=False). Turn t feeds only the ids beyond those already in the cache: the new
 *    rendering's ids past the cached ones when they start with every cached id; else, when the new rendering's
 *    TEXT starts with the text behind the cache (previous rendering + reply) but the reply re-tokenizes
 *    differently from the tokens the model generated, the ids of the text beyond it (the cache keeps the model's
 *    own tokens, as a serving stack that carries token ids from turn to turn does; counted in
 *    r->n_chat_retok); else — a template that rewrites history, such as Qwen3 dropping earlier <think> blocks or
 *    a template trimming a reply — the capture is refused with KVS_ERR_UNSUPPORTED naming the first differing
 *    byte: a serving stack would recompute from there, which an append-only trace cannot record. With --chat and
 *    turns, the prompt count behind max_new_tokens is the conversation rendered with empty replies (later turns
 *    are not known before decoding). A model without a chat template, prompt ids, --truncate and --no-bos are refused with --chat.
 */
#ifndef KVS_CAPTURE_H
#define KVS_CAPTURE_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "../common/kvs.h"

/* What to do with a prompt that does not fit (kvs_capture_opts.truncate). */
typedef enum { KVS_CAPTURE_TRUNCATE_NONE = 0, KVS_CAPTURE_TRUNCATE_LEFT = 1, KVS_CAPTURE_TRUNCATE_RIGHT = 2 } kvs_capture_truncate;

/* Which forward pass decodes: the CPU reference, or the CUDA backend (a CUDA build on a machine with a GPU;
 * otherwise kvs_capture_run fails with KVS_ERR_NO_DEVICE "no CUDA device (...)" before writing anything).
 * On CUDA each turn's prompt is one batched prefill; generated tokens are decode steps. */
typedef enum { KVS_CAPTURE_CPU = 0, KVS_CAPTURE_CUDA = 1 } kvs_capture_device;

typedef struct {
    const char *model_path;     /* llama2.c .bin or HF folder */
    const char *tokenizer_path; /* NULL = default beside the model (tok<vocab>.bin / tokenizer.bin / tokenizer.json) */
    const char *prompt_text;    /* UTF-8 prompt, or NULL */
    const int32_t *prompt_ids;  /* [n_prompt_ids] token ids (BOS added per the rules above), or NULL */
    size_t n_prompt_ids;
    const char *const *turns;   /* [n_turns] user turn texts (multi-turn), or NULL */
    size_t n_turns;
    const char *prompt_source;  /* recorded in the settings text, e.g. "text", "file:p.txt"; NULL = derived */
    int no_bos;
    int ignore_eos;
    int steps;                  /* tokens generated per turn, >= 0 */
    int max_positions;          /* 0 = the model context */
    kvs_capture_truncate truncate; /* NONE: a prompt longer than max_positions is an error; LEFT/RIGHT: cut it */
    float temperature;          /* 0 = greedy */
    float top_p;                /* (0, 1]; 1 = off */
    uint64_t seed;
    kvs_dtype dtype;            /* trace storage dtype of q/k/v/o */
    int record_qkv;             /* 1: lean record (KVS_TRACE_FLAG_QKV): store q/k/v, not o/lse */
    int block;                  /* positions per trace block; 0 = KVS_TRACE_DEFAULT_BLOCK */
    int threads;                /* 0 = every CPU the process may run on (CPU backend) */
    kvs_capture_device device;  /* KVS_CAPTURE_CPU (reference) or KVS_CAPTURE_CUDA (gpu_capture/cuda_backend.h) */
    const char *out_path;       /* trace destination, NULL = decode without recording */
    int progress;               /* print progress lines to stderr (tty: every 0.5 s, else every 2 s;
                                   capture_progress.h) */
    const volatile sig_atomic_t *stop; /* NULL, or a flag a signal handler sets: once *stop != 0 the capture
                                   stops at the next position boundary and returns KVS_ERR_INTERRUPTED with
                                   r->interrupted set; the positions done stay in OUT.partial
                                   (r->partial_kept) for `kvsim trace recover`, unless there are none */
    int chat;                   /* 1: render prompt / turns with the model's chat template (see "Chat" above) */
    const char *chat_system;    /* --chat: a system message first, or NULL */
    const char *chat_date;      /* --chat: "YYYY-MM-DD" for a template's strftime_now(), or NULL (then refused) */
} kvs_capture_opts;

typedef struct {
    int32_t *tokens;            /* [n_positions] every forwarded token (malloc'd) */
    int64_t n_positions;
    int64_t n_prompt;           /* prompt positions over all turns */
    int64_t n_generated;        /* generated positions over all turns */
    char *text;                 /* decoded text of all positions (malloc'd), NULL without a tokenizer */
    double seconds;             /* wall time of the decoding loop (model loading excluded) */
    uint64_t trace_bytes;       /* size of the written trace, 0 without one */
    int stopped_eos;            /* the last turn ended on an end token */
    int stopped_max;            /* max_positions cut generation short */
    int64_t max_new_tokens;     /* the generation length the trace records (policies plan with it): --steps, at most
                                   the positions the context (or max_positions) leaves after the prompts */
    int64_t n_prompt_dropped;   /* prompt tokens dropped by opts.truncate (0: none) */
    int64_t n_prompt_given;     /* prompt tokens before truncation, BOS included */
    int64_t n_unk;              /* prompt tokens the tokenizer made its unknown token (set before decoding, so
                                   also after a failure) */
    int32_t unk_id;             /* that token's id (kvs_tokenizer_unk), -1 when none */
    char *turns_text;           /* multi-turn captures with a tokenizer: the text of each turn that was fed,
                                   each after a line "--- turn T (positions A..B) ---" (T the trace's turn
                                   index, as `kvsim info` numbers turns; malloc'd); NULL otherwise */
    int interrupted;            /* opts.stop ended the capture (KVS_ERR_INTERRUPTED); n_positions = positions done */
    int partial_kept;           /* interrupted: OUT.partial holds those positions (none done: no file is left) */
    int64_t n_chat_retok;       /* --chat turns whose earlier reply re-tokenized differently (see "Chat") */
    char model_name[64];
} kvs_capture_result;

/*! kvs_capture_run() : runs a capture per `o`. On success *r is filled (free with
 *  kvs_capture_result_free) and the trace, if requested, is complete at o->out_path. */
kvs_status kvs_capture_run(const kvs_capture_opts *o, kvs_capture_result *r);

/*! kvs_capture_result_free() : frees the result's buffers (not r itself). Accepts NULL. */
void kvs_capture_result_free(kvs_capture_result *r);

/*! kvs_capture_split_turns() : the user turns of a `--turns` file: each non-empty line of `text` (NUL-terminated,
 *  split IN PLACE; a trailing '\r' dropped) is one turn, and the two characters "\n" inside a line become a
 *  newline. *turns is a malloc'd array of *n pointers into `text` (caller frees the array, not the strings).
 *  @return KVS_OK (*n may be 0: no turns) or KVS_ERR_NOMEM. */
kvs_status kvs_capture_split_turns(char *text, char ***turns, size_t *n);

#endif /* KVS_CAPTURE_H */
