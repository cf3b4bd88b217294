/* capture.c — the capture loop (see capture.h): model + tokenizer loading, prompt/turn tokenisation,
 * decoding with the CPU reference forward pass, and recording through the trace writer
 * (trace/FORMAT.md). Settings recorded in the trace header say how the trace was made (backend,
 * sampling, seed, steps, prompt source) so a trace is self-describing.
 */
#include "capture.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../trace/trace.h"
#include "capture_progress.h"
#include "chat_template.h"
#include "cuda_backend.h"
#include "model.h"
#include "sampler.h"
#include "../common/threadpool.h"
#include "tokenizer.h"

void kvs_capture_result_free(kvs_capture_result *r) {
    if (!r) return;
    free(r->tokens);
    free(r->text);
    free(r->turns_text);
    r->tokens = NULL;
    r->text = NULL;
    r->turns_text = NULL;
}

/* Cuts the single prompt ids[0..*n) (opts.truncate) so that it and `steps` generated tokens fit in max_pos
 * positions, keeping at least one token and, from the left, a leading BOS. */
static void truncate_prompt(int32_t *ids, size_t *n, kvs_capture_truncate how, int steps, int max_pos, int32_t bos,
                            kvs_capture_result *r) {
    size_t limit = max_pos > steps ? (size_t)(max_pos - steps) : 1;
    r->n_prompt_given = (int64_t)*n;
    if (how == KVS_CAPTURE_TRUNCATE_NONE || *n <= limit) return;
    size_t drop = *n - limit;
    if (how == KVS_CAPTURE_TRUNCATE_LEFT) {
        size_t keep_head = bos >= 0 && ids[0] == bos ? 1 : 0; /* the model was trained with BOS first */
        if (keep_head && limit < 2) { /* room for BOS alone */
            drop = *n - 1;
        }
        memmove(ids + keep_head, ids + keep_head + drop, (*n - keep_head - drop) * sizeof *ids);
    }
    *n -= drop;
    r->n_prompt_dropped = (int64_t)drop;
}

/* The multi-turn text: "--- turn T (positions A..B) ---" then the decoded text of each fed turn. */
static kvs_status turns_text(const kvs_tokenizer *tok, const int32_t *ids, const int64_t *turn_begin, size_t n_turns,
                             char **out) {
    size_t cap = 256, len = 0;
    char *buf = malloc(cap);
    if (!buf) return kvs_fail(KVS_ERR_NOMEM, "capture: out of memory");
    buf[0] = '\0';
    for (size_t t = 0; t < n_turns; t++) {
        int64_t a = turn_begin[t], b = turn_begin[t + 1];
        if (b <= a) continue; /* a turn never fed (max positions reached before it) */
        char *text = NULL, head[96];
        kvs_status s = kvs_tokenizer_decode(tok, ids + a, (size_t)(b - a), &text);
        if (s != KVS_OK) {
            free(buf);
            return s;
        }
        int hl = snprintf(head, sizeof head, "%s--- turn %zu (positions %lld..%lld) ---\n", len ? "\n" : "", t,
                          (long long)a, (long long)(b - 1));
        size_t tl = strlen(text);
        if (len + (size_t)hl + tl + 1 > cap) {
            while (len + (size_t)hl + tl + 1 > cap) cap *= 2;
            char *nb = realloc(buf, cap);
            if (!nb) {
                free(text);
                free(buf);
                return kvs_fail(KVS_ERR_NOMEM, "capture: out of memory");
            }
            buf = nb;
        }
        memcpy(buf + len, head, (size_t)hl);
        memcpy(buf + len + (size_t)hl, text, tl + 1);
        len += (size_t)hl + tl;
        free(text);
    }
    *out = buf;
    return KVS_OK;
}

static int file_exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

/* Default tokenizer: HF folder -> tokenizer.json inside; llama2.c file -> tok<vocab>.bin, then
 * tokenizer.bin, in the same folder. *found = 0 when none exists. */
static void default_tokenizer(const char *model_path, const kvs_model_info *info, char *buf, size_t cap, int *found) {
    *found = 0;
    if (info->format == KVS_MODEL_HF) {
        snprintf(buf, cap, "%s/tokenizer.json", model_path);
        *found = file_exists(buf);
        return;
    }
    const char *slash = strrchr(model_path, '/');
    int dir_len = slash ? (int)(slash - model_path) : 1;
    const char *dir = slash ? model_path : ".";
    snprintf(buf, cap, "%.*s/tok%d.bin", dir_len, dir, info->config.vocab_size);
    if ((*found = file_exists(buf))) return;
    snprintf(buf, cap, "%.*s/tokenizer.bin", dir_len, dir);
    *found = file_exists(buf);
}

typedef struct {
    int32_t *ids;
    size_t n, cap;
} id_vec;

static kvs_status vec_push(id_vec *v, int32_t id) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? 2 * v->cap : 256;
        int32_t *n = realloc(v->ids, cap * sizeof *n);
        if (!n) return kvs_fail(KVS_ERR_NOMEM, "capture: out of memory");
        v->ids = n;
        v->cap = cap;
    }
    v->ids[v->n++] = id;
    return KVS_OK;
}

static kvs_status encode_text(const kvs_tokenizer *tok, const char *text, int add_bos, id_vec *out) {
    size_t need = strlen(text) + 8, n = 0;
    int32_t *ids = malloc(need * sizeof *ids);
    if (!ids) return kvs_fail(KVS_ERR_NOMEM, "capture: out of memory");
    kvs_status s = kvs_tokenizer_encode(tok, text, add_bos, ids, need, &n);
    if (s == KVS_ERR_RANGE && n > need) { /* more ids than bytes: retry with the size asked for */
        int32_t *bigger = realloc(ids, n * sizeof *ids);
        if (!bigger) {
            free(ids);
            return kvs_fail(KVS_ERR_NOMEM, "capture: out of memory");
        }
        ids = bigger;
        need = n;
        s = kvs_tokenizer_encode(tok, text, add_bos, ids, need, &n);
    }
    for (size_t i = 0; s == KVS_OK && i < n; i++) s = vec_push(out, ids[i]);
    free(ids);
    return s;
}

/* --chat: the text of the conversation through user turn `upto` ([system], user 0, assistant 0 = replies[0], ...,
 * user upto) rendered by the model's template with the generation prompt (*text malloc'd). */
static kvs_status chat_render(const kvs_capture_opts *o, const kvs_chat_template *ct, size_t upto, char *const *replies,
                              char **text) {
    kvs_chat_message *m = malloc((2 * upto + 2) * sizeof *m);
    if (!m) return kvs_fail(KVS_ERR_NOMEM, "capture: out of memory");
    size_t nm = 0;
    if (o->chat_system) m[nm++] = (kvs_chat_message){"system", o->chat_system};
    for (size_t j = 0; j <= upto; j++) {
        m[nm++] = (kvs_chat_message){"user", o->turns ? o->turns[j] : o->prompt_text};
        if (j < upto) m[nm++] = (kvs_chat_message){"assistant", replies && replies[j] ? replies[j] : ""};
    }
    kvs_chat_render_opts ro = {.add_generation_prompt = 1, .date = o->chat_date};
    kvs_status s = kvs_chat_render(ct, m, nm, &ro, text, NULL);
    free(m);
    if (s != KVS_OK) return kvs_fail(s, "--chat: %s", kvs_last_error());
    return KVS_OK;
}

/* --chat: the ids of chat_render's text, encoded without the tokenizer's BOS (the template writes bos_token). */
static kvs_status chat_encode(const kvs_capture_opts *o, const kvs_chat_template *ct, const kvs_tokenizer *tok,
                              size_t upto, char *const *replies, id_vec *out, char **text_out) {
    char *text = NULL;
    kvs_status s = chat_render(o, ct, upto, replies, &text);
    if (s != KVS_OK) return s;
    out->n = 0;
    s = encode_text(tok, text, 0, out);
    if (s == KVS_OK && text_out) *text_out = text;
    else free(text);
    return s;
}

/* --chat, turn t > 0: the ids the turn feeds. `cached` is the text behind the cache seq[0..n_seq): the previous
 * turn's rendering and the reply. The new rendering's ids beyond the cache when they start with every cached id;
 * else, when only the text extends (the reply re-tokenizes differently from the tokens the model generated), the
 * ids of the text beyond `cached` (*retok = 1): the cache keeps the model's own tokens, as a serving stack that
 * carries token ids from turn to turn does; else (the template rewrote earlier turns) the refusal. On success
 * *cached becomes the new rendering. */
static kvs_status chat_turn(const kvs_capture_opts *o, const kvs_chat_template *ct, const kvs_tokenizer *tok, size_t t,
                            char *const *replies, const int32_t *seq, size_t n_seq, char **cached, id_vec *turn,
                            int *retok) {
    id_vec full = {0};
    char *text = NULL;
    kvs_status s = chat_encode(o, ct, tok, t, replies, &full, &text);
    size_t k = 0;
    *retok = 0;
    while (s == KVS_OK && k < n_seq && k < full.n && full.ids[k] == seq[k]) k++;
    turn->n = 0;
    if (s == KVS_OK && k == n_seq) {
        for (size_t i = n_seq; s == KVS_OK && i < full.n; i++) s = vec_push(turn, full.ids[i]);
    } else if (s == KVS_OK) {
        size_t cl = strlen(*cached);
        if (!strncmp(text, *cached, cl)) {
            *retok = 1;
            s = encode_text(tok, text + cl, 0, turn);
        } else {
            size_t d = 0;
            while ((*cached)[d] && (*cached)[d] == text[d]) d++;
            s = kvs_fail(KVS_ERR_UNSUPPORTED,
                         "--chat: turn %zu: the chat template's rendering of the conversation does not extend the "
                         "text already in the cache (first difference at byte %zu of %zu: \"%.24s\" rendered where "
                         "the cache has \"%.24s\"): the template rewrites earlier turns (Qwen3 drops earlier "
                         "<think> blocks; a template may trim or reformat replies); a serving stack would recompute "
                         "from there, which an append-only trace cannot record",
                         t, d, cl, text + d, *cached + d);
        }
    }
    free(full.ids);
    if (s == KVS_OK) {
        free(*cached);
        *cached = text;
    } else {
        free(text);
    }
    return s;
}

/* Does this model/tokenizer pair want BOS at the start? */
static int wants_bos(const kvs_model_info *info, const kvs_tokenizer *tok) {
    if (info->bos_id < 0) return 0;
    if (!tok) return 1;
    int32_t ids[4];
    size_t n = 0;
    if (kvs_tokenizer_encode(tok, "", 1, ids, 4, &n) != KVS_OK) return 1;
    return n >= 1 && ids[0] == info->bos_id;
}

/* Books n positions of `phase` just done and, with opts.progress, prints the line (capture_progress.h) at most
 * every 0.5 s on a terminal (rewritten in place) and every 2 s elsewhere (one line each, for logs); `final`
 * prints the last state, ending the line, when an earlier line was printed (short captures print none). */
static void progress_line(const kvs_capture_opts *o, kvs_capture_progress *p, kvs_capture_phase phase, int64_t n,
                          const kvs_trace_writer *w, double *last, int final) {
    double now = kvs_now_s();
    if (n > 0) kvs_capture_progress_add(p, phase, n, now);
    if (!o->progress) return;
    int tty = isatty(STDERR_FILENO);
    if (!final && now - *last < (tty ? 0.5 : 2.0)) return;
    if (final && *last == p->t0) return;
    *last = now;
    char line[320];
    kvs_capture_progress_format(p, now, kvs_trace_writer_bytes(w), line, sizeof line);
    fprintf(stderr, "%s%s%s", tty ? "\r" : "", line, tty && !final ? "\033[K" : "\n");
    fflush(stderr);
}

/* Whether opts.stop asks the capture to stop (a signal handler sets it). */
static int stop_requested(const kvs_capture_opts *o) { return o->stop && *o->stop; }

/* A capture stopped on request at a position boundary: every position done is handed to the writer, which
 * keeps them in OUT.partial for `kvsim trace recover` (kvs_trace_writer_keep_partial); with none done, the
 * writer's free removes the file as after any failure. @return KVS_ERR_INTERRUPTED, or the error that
 * stopped the keeping. */
static kvs_status stop_on_request(kvs_cuda_backend *gb, kvs_trace_writer *w, int64_t pos, kvs_capture_result *r) {
    kvs_status s = KVS_OK;
    if (gb && (s = kvs_cuda_backend_finish(gb)) != KVS_OK) return s;
    r->interrupted = 1;
    r->n_positions = pos;
    if (w && pos > 0) {
        if ((s = kvs_trace_writer_keep_partial(w)) != KVS_OK) return s;
        r->partial_kept = 1;
    }
    return kvs_fail(KVS_ERR_INTERRUPTED, "capture: interrupted after %lld positions", (long long)pos);
}

kvs_status kvs_capture_run(const kvs_capture_opts *o, kvs_capture_result *r) {
    kvs_status s = KVS_OK;
    kvs_model *model = NULL;
    kvs_tokenizer *tok = NULL;
    kvs_threadpool *pool = NULL;
    kvs_model_state *st = NULL;
    kvs_sampler *smp = NULL;
    kvs_trace_writer *w = NULL;
    kvs_cuda_backend *gb = NULL;
    kvs_chat_template *chat = NULL;
    char **replies = NULL; /* --chat with turns: the decoded reply of each turn */
    char *chat_text = NULL; /* --chat: the text behind the cache (renderings and replies so far) */
    int gpu = o->device == KVS_CAPTURE_CUDA;
    id_vec seq = {0};
    size_t n_turn_prompts = o->turns ? o->n_turns : 1;
    id_vec *turn_ids = NULL;
    int64_t *turn_begin = NULL; /* [n_turn_prompts + 1]: first position of each turn, then the end */
    int64_t *prompt_len = NULL; /* [n_turn_prompts]: each turn's prompt positions, for the progress plan */
    memset(r, 0, sizeof *r);
    r->unk_id = -1;

    if (o->steps < 0) return kvs_fail(KVS_ERR_INVALID_ARG, "--steps: %d must be >= 0", o->steps);
    if ((o->prompt_text != NULL) + (o->prompt_ids != NULL) + (o->turns != NULL) > 1)
        return kvs_fail(KVS_ERR_INVALID_ARG, "give at most one of a prompt text, prompt ids or turns");
    if (o->turns && o->n_turns == 0) return kvs_fail(KVS_ERR_INVALID_ARG, "turns: no turns given");
    if (o->turns && o->truncate != KVS_CAPTURE_TRUNCATE_NONE)
        return kvs_fail(KVS_ERR_INVALID_ARG, "--truncate cuts a single prompt, not --turns");
    if (o->block < 0 || o->block > KVS_TRACE_MAX_BLOCK)
        return kvs_fail(KVS_ERR_INVALID_ARG, "--block: %d is outside [1, %d]", o->block, KVS_TRACE_MAX_BLOCK);

    KVS_TRY(s = kvs_model_load(o->model_path, &model));
    const kvs_model_info *info = kvs_model_info_get(model);
    const kvs_model_config *cfg = &info->config;
    snprintf(r->model_name, sizeof r->model_name, "%s", cfg->model_name);
    int max_pos = o->max_positions > 0 ? o->max_positions : cfg->max_seq_len;
    if (max_pos > cfg->max_seq_len) {
        s = kvs_fail(KVS_ERR_INVALID_ARG, "--max-positions: %d exceeds the model context (%d)", max_pos, cfg->max_seq_len);
        goto cleanup;
    }

    /* tokenizer: required for text prompts, optional otherwise (then no text is printed) */
    char tok_path[4096];
    int have_tok = 0;
    if (o->tokenizer_path) {
        snprintf(tok_path, sizeof tok_path, "%s", o->tokenizer_path);
        have_tok = 1;
    } else {
        default_tokenizer(o->model_path, info, tok_path, sizeof tok_path, &have_tok);
    }
    if (have_tok) {
        size_t tl = strlen(tok_path);
        int is_json = tl >= 5 && !strcmp(tok_path + tl - 5, ".json");
        s = is_json ? kvs_tokenizer_load_hf(tok_path, &tok) : kvs_tokenizer_load_llama2c(tok_path, cfg->vocab_size, &tok);
        if (s != KVS_OK) goto cleanup;
    } else if (o->prompt_text || o->turns) {
        s = kvs_fail(KVS_ERR_IO, "%s: no tokenizer found beside the model (tok%d.bin, tokenizer.bin or tokenizer.json); "
                     "pass --tokenizer FILE or --prompt-ids", o->model_path, cfg->vocab_size);
        goto cleanup;
    }

    if (o->chat) {
        if (!o->prompt_text && !o->turns) {
            s = kvs_fail(KVS_ERR_INVALID_ARG, "--chat renders text messages: give --prompt, --prompt-file or --turns");
            goto cleanup;
        }
        if (o->truncate != KVS_CAPTURE_TRUNCATE_NONE || o->no_bos) {
            s = kvs_fail(KVS_ERR_INVALID_ARG, "--chat: the chat template decides the tokens; %s would change its "
                         "rendering", o->no_bos ? "--no-bos" : "--truncate");
            goto cleanup;
        }
        if (info->format != KVS_MODEL_HF || !tok) {
            s = kvs_fail(KVS_ERR_UNSUPPORTED, "--chat: %s is not a Hugging Face model folder; the chat template comes "
                         "from its tokenizer_config.json", o->model_path);
            goto cleanup;
        }
        KVS_TRY(s = kvs_chat_template_load(o->model_path, &chat));
        replies = calloc(n_turn_prompts, sizeof *replies);
        if (!replies) { s = kvs_fail(KVS_ERR_NOMEM, "capture: out of memory"); goto cleanup; }
    }

    /* prompt tokens per turn */
    turn_ids = calloc(n_turn_prompts, sizeof *turn_ids);
    turn_begin = calloc(n_turn_prompts + 1, sizeof *turn_begin);
    if (!turn_ids || !turn_begin) { s = kvs_fail(KVS_ERR_NOMEM, "capture: out of memory"); goto cleanup; }
    r->unk_id = tok ? kvs_tokenizer_unk(tok) : -1;
    int add_bos = !o->no_bos;
    size_t total_prompt = 0;
    for (size_t t = 0; t < n_turn_prompts; t++) {
        const char *text = o->turns ? o->turns[t] : o->prompt_text;
        if (chat) {
            /* turn 0 as it is fed; later turns only counted here (see capture.h "Chat"): the rendering with empty
               replies, beyond the previous turns' */
            if (t == 0 || t + 1 == n_turn_prompts) {
                KVS_TRY(s = chat_encode(o, chat, tok, t, NULL, &turn_ids[t], t == 0 ? &chat_text : NULL));
                for (size_t i = 0; t == 0 && r->unk_id >= 0 && i < turn_ids[t].n; i++)
                    r->n_unk += turn_ids[t].ids[i] == r->unk_id; /* later turns count when fed */
            }
            if (t + 1 == n_turn_prompts && t > 0) {
                total_prompt = turn_ids[t].n; /* the whole conversation */
                turn_ids[t].n = 0;
            } else {
                total_prompt += turn_ids[t].n;
            }
            continue;
        }
        if (text) {
            KVS_TRY(s = encode_text(tok, text, add_bos && t == 0, &turn_ids[t]));
            for (size_t i = 0; r->unk_id >= 0 && i < turn_ids[t].n; i++) r->n_unk += turn_ids[t].ids[i] == r->unk_id;
        } else {
            /* ids that already start with BOS (copied from a tokenizer's output, say) get no second one */
            int starts_with_bos = o->n_prompt_ids > 0 && o->prompt_ids[0] == info->bos_id;
            if (add_bos && !starts_with_bos && wants_bos(info, tok))
                KVS_TRY(s = vec_push(&turn_ids[t], info->bos_id));
            for (size_t i = 0; i < o->n_prompt_ids; i++) {
                if (o->prompt_ids[i] < 0 || o->prompt_ids[i] >= cfg->vocab_size) {
                    s = kvs_fail(KVS_ERR_RANGE, "--prompt-ids: token id %d is outside the vocabulary [0, %d)",
                                 o->prompt_ids[i], cfg->vocab_size);
                    goto cleanup;
                }
                KVS_TRY(s = vec_push(&turn_ids[t], o->prompt_ids[i]));
            }
        }
        total_prompt += turn_ids[t].n;
    }
    if (turn_ids[0].n == 0) {
        if (o->no_bos) {
            s = kvs_fail(KVS_ERR_INVALID_ARG, "nothing to decode: the prompt is empty and --no-bos drops BOS");
            goto cleanup;
        }
        if (info->bos_id < 0) {
            s = kvs_fail(KVS_ERR_INVALID_ARG, "%s: empty prompt and the model has no BOS token to start from", o->model_path);
            goto cleanup;
        }
        /* no prompt and a tokenizer that adds no BOS by itself (Qwen2): start from the model's BOS */
        KVS_TRY(s = vec_push(&turn_ids[0], info->bos_id));
        total_prompt++;
    }
    for (size_t t = 0; t < n_turn_prompts; t++)
        for (size_t i = 0; i < turn_ids[t].n; i++)
            if (turn_ids[t].ids[i] < 0 || turn_ids[t].ids[i] >= cfg->vocab_size) {
                s = kvs_fail(KVS_ERR_RANGE, "tokenizer produced id %d outside the model vocabulary [0, %d)",
                             turn_ids[t].ids[i], cfg->vocab_size);
                goto cleanup;
            }
    if (!o->turns) {
        truncate_prompt(turn_ids[0].ids, &turn_ids[0].n, o->truncate, o->steps, max_pos, info->bos_id, r);
        total_prompt = turn_ids[0].n;
    }
    if (total_prompt > (size_t)max_pos) {
        s = kvs_fail(KVS_ERR_RANGE, "prompt is %zu tokens, longer than the %d positions allowed (%s)", total_prompt,
                     max_pos, o->max_positions > 0 ? "--max-positions" : "model context");
        goto cleanup;
    }

    if (o->device == KVS_CAPTURE_CUDA) {
        KVS_TRY(s = kvs_cuda_probe(NULL, 0)); /* no device: fail before any trace file exists */
    } else {
        KVS_TRY(s = kvs_threadpool_create(o->threads, &pool));
        KVS_TRY(s = kvs_model_state_create(model, max_pos, pool, &st));
    }
    KVS_TRY(s = kvs_sampler_create(cfg->vocab_size, o->temperature, o->top_p, o->seed, &smp));

    if (o->out_path) {
        kvs_capture_config cc;
        memset(&cc, 0, sizeof cc);
        cc.dtype = (int32_t)o->dtype;
        cc.block_positions = o->block > 0 ? o->block : KVS_TRACE_DEFAULT_BLOCK;
        /* What a policy may plan with (RocketKV's sequence length): never more than the context leaves */
        int64_t room = (int64_t)max_pos - (int64_t)total_prompt;
        cc.max_new_tokens = (int32_t)(o->steps < room ? o->steps : room > 0 ? room : 0);
        r->max_new_tokens = cc.max_new_tokens;
        cc.flags = KVS_TRACE_FLAG_SHUFFLE | (o->record_qkv ? KVS_TRACE_FLAG_QKV : 0u);
        const char *src = o->prompt_source ? o->prompt_source
                          : o->turns       ? "turns"
                          : o->prompt_text ? "text"
                          : o->prompt_ids  ? "ids"
                                           : "bos";
        int sl = snprintf(cc.settings, sizeof cc.settings,
                 "backend=%s sampling=%s temperature=%g top_p=%g seed=%llu steps=%d max_new_tokens=%d "
                 "ignore_eos=%d bos=%d prompt_source=%.900s prompt_tokens=%zu turns=%zu max_positions=%d "
                 "model_format=%s architecture=%.63s weights=%s tokenizer=%.900s record=%s "
                 "tie_word_embeddings=%d qkv_bias=%d o_bias=%d",
                 gpu ? "cuda" : "cpu", o->temperature == 0 ? "greedy" : (o->top_p < 1 ? "top-p" : "temperature"),
                 o->temperature, o->top_p, (unsigned long long)o->seed, o->steps, (int)cc.max_new_tokens, o->ignore_eos, !o->no_bos,
                 src, total_prompt, n_turn_prompts, max_pos, info->format == KVS_MODEL_HF ? "hf" : "llama2c",
                 info->architecture, kvs_dtype_name(info->weight_dtype), have_tok ? kvs_path_base(tok_path) : "none",
                 o->record_qkv ? "qkv" : "full", info->tied_embeddings, info->qkv_bias, info->o_bias);
        if (chat && sl > 0 && (size_t)sl < sizeof cc.settings)
            snprintf(cc.settings + sl, sizeof cc.settings - (size_t)sl, " chat=1 chat_template=sha256:%s chat_system=%d",
                     kvs_chat_template_hash(chat), o->chat_system != NULL);
        KVS_TRY(s = kvs_trace_writer_create(o->out_path, cfg, &cc, &w));
        /* Block compression runs on a pool. CPU: the forward pass's own pool, idle while the writer
         * flushes. CUDA: a pool of its own, driven by the backend's writer thread while the GPU decodes;
         * one core is left to the decoding thread. */
        if (gpu) {
            int n = o->threads > 0 ? o->threads : kvs_n_cpus() - 1;
            KVS_TRY(s = kvs_threadpool_create(n > 0 ? n : 1, &pool));
        }
        KVS_TRY(s = kvs_trace_writer_set_threadpool(w, pool));
    }
    /* The CUDA backend records through its own writer thread; the CPU path writes below. */
    if (gpu) KVS_TRY(s = kvs_cuda_backend_create(model, max_pos, w, &gb));

    /* decode */
    kvs_capture_progress prog;
    if (!(prompt_len = malloc(n_turn_prompts * sizeof *prompt_len))) {
        s = kvs_fail(KVS_ERR_NOMEM, "capture: out of memory");
        goto cleanup;
    }
    for (size_t t = 0; t < n_turn_prompts; t++) prompt_len[t] = (int64_t)turn_ids[t].n;
    double t0 = kvs_now_s(), last = t0;
    kvs_capture_progress_start(&prog, t0, prompt_len, (int)n_turn_prompts, o->steps, max_pos);
    int64_t pos = 0;
    const float *logits = NULL;
    int stop_all = 0;
    size_t n_started = 0;
    for (size_t t = 0; t < n_turn_prompts && !stop_all; t++) {
        turn_begin[t] = pos;
        n_started = t + 1;
        if (chat && t > 0) {
            /* the reply of the previous turn, as text, then this turn's rendering beyond the cache */
            size_t g0 = (size_t)turn_begin[t - 1] + turn_ids[t - 1].n;
            KVS_TRY(s = kvs_tokenizer_decode(tok, seq.ids + (g0 < seq.n ? g0 : seq.n), g0 < seq.n ? seq.n - g0 : 0,
                                             &replies[t - 1]));
            size_t cl = strlen(chat_text), rl = strlen(replies[t - 1]);
            char *c2 = realloc(chat_text, cl + rl + 1);
            if (!c2) { s = kvs_fail(KVS_ERR_NOMEM, "capture: out of memory"); goto cleanup; }
            memcpy(c2 + cl, replies[t - 1], rl + 1);
            chat_text = c2;
            int retok = 0;
            KVS_TRY(s = chat_turn(o, chat, tok, t, replies, seq.ids, seq.n, &chat_text, &turn_ids[t], &retok));
            r->n_chat_retok += retok;
            for (size_t i = 0; i < turn_ids[t].n; i++) {
                if (turn_ids[t].ids[i] < 0 || turn_ids[t].ids[i] >= cfg->vocab_size) {
                    s = kvs_fail(KVS_ERR_RANGE, "tokenizer produced id %d outside the model vocabulary [0, %d)",
                                 turn_ids[t].ids[i], cfg->vocab_size);
                    goto cleanup;
                }
                r->n_unk += r->unk_id >= 0 && turn_ids[t].ids[i] == r->unk_id;
            }
        }
        kvs_capture_progress_turn(&prog, (int)t, (int64_t)turn_ids[t].n);
        int64_t n_items = (int64_t)turn_ids[t].n + o->steps;
        int32_t next = -1;
        int64_t i = 0;
        if (gb && turn_ids[t].n > 0) {
            /* The turn's prompt as one batched prefill, cut at max_positions as the CPU path would stop. */
            int64_t np = (int64_t)turn_ids[t].n;
            if (np > max_pos - pos) {
                np = max_pos - pos;
                r->stopped_max = 1;
                stop_all = 1;
            }
            if (stop_requested(o)) {
                progress_line(o, &prog, KVS_CAPTURE_PREFILL, 0, w, &last, 1);
                s = stop_on_request(gb, w, pos, r);
                goto cleanup;
            }
            if (np > 0)
                KVS_TRY(s = kvs_cuda_backend_prefill(gb, turn_ids[t].ids, (int)np, (int)pos, KVS_ROLE_PROMPT,
                                                     (int32_t)t, &logits));
            for (int64_t k = 0; k < np; k++) KVS_TRY(s = vec_push(&seq, turn_ids[t].ids[k]));
            r->n_prompt += np;
            pos += np;
            i = np;
            r->stopped_eos = 0;
            progress_line(o, &prog, KVS_CAPTURE_PREFILL, np, w, &last, 0);
            if (stop_all) break;
        }
        /* The CPU path runs the turn's prompt in blocks (kvs_model_forward_block: each weight read once per block,
         * every position's record what kvs_model_forward would give); the loop below takes over at the first
         * generated token, or stops at max positions where the prompt does not fit. */
        while (!gb && i < (int64_t)turn_ids[t].n && pos < max_pos) {
            if (stop_requested(o)) { /* at a block boundary: every position before it is in the trace */
                progress_line(o, &prog, KVS_CAPTURE_PREFILL, 0, w, &last, 1);
                s = stop_on_request(gb, w, pos, r);
                goto cleanup;
            }
            int64_t nb = (int64_t)turn_ids[t].n - i;
            if (nb > KVS_MODEL_BLOCK) nb = KVS_MODEL_BLOCK;
            if (nb > max_pos - pos) nb = max_pos - pos;
            KVS_TRY(s = kvs_model_forward_block(st, turn_ids[t].ids + i, (int)nb, (int)pos, &logits));
            for (int64_t k = 0; k < nb; k++) {
                int32_t token = turn_ids[t].ids[i + k];
                if (w) {
                    KVS_TRY(s = kvs_trace_writer_begin_position(w, token, KVS_ROLE_PROMPT, (int32_t)t));
                    for (int l = 0; l < cfg->n_layers; l++) {
                        kvs_layer_record rec;
                        KVS_TRY(s = kvs_model_state_layer_at(st, l, (int)(pos + k), &rec));
                        KVS_TRY(s = kvs_trace_writer_put_layer(w, l, rec.q, rec.k, rec.v, rec.o, rec.lse));
                    }
                    KVS_TRY(s = kvs_trace_writer_end_position(w));
                }
                KVS_TRY(s = vec_push(&seq, token));
                r->n_prompt++;
            }
            r->stopped_eos = 0;
            pos += nb;
            i += nb;
            progress_line(o, &prog, KVS_CAPTURE_PREFILL, nb, w, &last, 0);
        }
        for (; i < n_items; i++) {
            if (stop_requested(o)) {
                progress_line(o, &prog, KVS_CAPTURE_PREFILL, 0, w, &last, 1);
                s = stop_on_request(gb, w, pos, r);
                goto cleanup;
            }
            int prompt = i < (int64_t)turn_ids[t].n;
            int32_t token;
            if (prompt) {
                token = turn_ids[t].ids[i];
            } else {
                if (!logits) break; /* cannot happen: a turn's prompt or an earlier turn fed something */
                next = kvs_sampler_sample(smp, logits);
                if (kvs_model_is_eos(model, next) && !o->ignore_eos) {
                    r->stopped_eos = 1;
                    break;
                }
                token = next;
            }
            if (pos >= max_pos) {
                r->stopped_max = 1;
                stop_all = 1;
                break;
            }
            r->stopped_eos = 0;
            kvs_role role = prompt ? KVS_ROLE_PROMPT : KVS_ROLE_GENERATED;
            if (gb) {
                KVS_TRY(s = kvs_cuda_backend_step(gb, token, (int)pos, role, (int32_t)t, &logits));
            } else {
                if (w) KVS_TRY(s = kvs_trace_writer_begin_position(w, token, role, (int32_t)t));
                KVS_TRY(s = kvs_model_forward(st, token, (int)pos, &logits));
            }
            if (w && !gb) {
                for (int l = 0; l < cfg->n_layers; l++) {
                    kvs_layer_record rec;
                    KVS_TRY(s = kvs_model_state_layer(st, l, &rec));
                    KVS_TRY(s = kvs_trace_writer_put_layer(w, l, rec.q, rec.k, rec.v, rec.o, rec.lse));
                }
                KVS_TRY(s = kvs_trace_writer_end_position(w));
            }
            KVS_TRY(s = vec_push(&seq, token));
            if (prompt) r->n_prompt++;
            else r->n_generated++;
            pos++;
            progress_line(o, &prog, prompt ? KVS_CAPTURE_PREFILL : KVS_CAPTURE_DECODE, 1, w, &last, 0);
        }
    }
    for (size_t t = n_started; t <= n_turn_prompts; t++) turn_begin[t] = pos; /* the end; turns never started
                                                                                 (max positions) are empty */
    if (gb) KVS_TRY(s = kvs_cuda_backend_finish(gb)); /* every position handed to the writer */
    progress_line(o, &prog, KVS_CAPTURE_PREFILL, 0, w, &last, 1);
    r->seconds = kvs_now_s() - t0;
    if (w) {
        KVS_TRY(s = kvs_trace_writer_close(w));
        r->trace_bytes = kvs_trace_writer_bytes(w);
    }
    if (tok) KVS_TRY(s = kvs_tokenizer_decode(tok, seq.ids, seq.n, &r->text));
    if (tok && o->turns) KVS_TRY(s = turns_text(tok, seq.ids, turn_begin, n_turn_prompts, &r->turns_text));
    r->tokens = seq.ids;
    r->n_positions = (int64_t)seq.n;
    seq.ids = NULL;

cleanup:
    if (s != KVS_OK) kvs_capture_result_free(r);
    kvs_cuda_backend_free(gb); /* before the writer: its writer thread uses it */
    kvs_trace_writer_free(w);  /* removes OUT.partial unless closed */
    free(seq.ids);
    if (turn_ids)
        for (size_t t = 0; t < n_turn_prompts; t++) free(turn_ids[t].ids);
    free(turn_ids);
    free(turn_begin);
    free(prompt_len);
    for (size_t t = 0; replies && t < n_turn_prompts; t++) free(replies[t]);
    free(replies);
    free(chat_text);
    kvs_chat_template_free(chat);
    kvs_sampler_free(smp);
    kvs_model_state_free(st);
    kvs_threadpool_free(pool);
    kvs_tokenizer_free(tok);
    kvs_model_free(model);
    return s;
}

kvs_status kvs_capture_split_turns(char *text, char ***turns, size_t *n) {
    size_t cap = 8, k = 0;
    char **t = malloc(cap * sizeof *t);
    if (!t) return kvs_fail(KVS_ERR_NOMEM, "out of memory");
    char *line = text;
    while (line && *line) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = '\0';
        size_t len = strlen(line);
        if (len && line[len - 1] == '\r') line[--len] = '\0';
        char *o = line;
        for (char *i = line; *i; i++) {
            if (i[0] == '\\' && i[1] == 'n') {
                *o++ = '\n';
                i++;
            } else {
                *o++ = *i;
            }
        }
        *o = '\0';
        if (line[0]) {
            if (k == cap) {
                char **m = realloc(t, 2 * cap * sizeof *t);
                if (!m) {
                    free(t);
                    return kvs_fail(KVS_ERR_NOMEM, "out of memory");
                }
                t = m;
                cap *= 2;
            }
            t[k++] = line;
        }
        line = nl ? nl + 1 : NULL;
    }
    *turns = t;
    *n = k;
    return KVS_OK;
}
