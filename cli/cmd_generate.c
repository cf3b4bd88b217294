/* cmd_generate.c — `kvsim generate`: closed-loop decoding with a policy active inside the CPU forward pass,
 * beside the full-cache model (sim/closed_loop.h; ../shared/DESIGN.md "Closed-loop decoding"), for a
 * sweep of (policy configuration x budget); every run into the results database (results/results_closed.h).
 * With --task, the sweep answers a task's questions (sim/closed_loop.h "Tasks"): accuracy per (policy, budget)
 * with a percentile bootstrap interval over the items (common/kvs_stats.h), beside the full model's.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../common/kvs_rng.h"
#include "../common/kvs_stats.h"
#include "../gpu_capture/model.h"
#include "../gpu_capture/tokenizer.h"
#include "../sim/closed_loop.h"
#include "../sim/codec.h"
#include "../sim/replay.h"
#include "../results/results_closed.h"
#include "../results/results_sweep.h"
#include "../trace/trace.h"
#include "cli.h"
#include "policies/registry.h"
#include "results/results_heads.h"

#define GEN_VERSION "0.1.0"
#define MAX_POLICIES 64
#define MAX_CODECS 16

static void usage(FILE *f) {
    fprintf(f,
            "usage: kvsim generate --model PATH --policy SPEC [--policy SPEC ...] --budgets LIST --db FILE\n"
            "                      (--trace TRACE | --text FILE [--prompt-tokens K] | --prompt TEXT | --prompt-file F\n"
            "                       | --task FILE [--prompt-tokens K])\n"
            "Closed-loop decoding: a policy model whose every layer attends only to the policy's set S_t (the\n"
            "policy's state evolving on that model's own queries, keys and values) runs beside the full-cache\n"
            "model. One run per (policy, budget) into DB (tables closed_runs, closed_steps; results/SCHEMA.md).\n"
            "Teacher-forced (--trace, --text): both models read the same tokens; per step KL(full || policy) of the\n"
            "next-token distributions, top-1 agreement, NLL of the reference token (perplexity with and without\n"
            "the policy) and the replay's attention metrics on the policy model's own states.\n"
            "Free-running (--prompt, --prompt-file): each model decodes greedily on its own; the first position\n"
            "where they differ, token agreement and both texts.\n"
            "Task (--task): for each item (a context and its answer; format in sim/closed_loop.h \"Tasks\", e.g.\n"
            "examples/tasks/name_recall.txt) both models read the context, the policy model through S_t, and continue\n"
            "greedily; an item is correct when the continuation begins with the answer. Per (policy, budget): accuracy\n"
            "with a 95%% percentile bootstrap interval over the items, the full model's, and the paired difference\n"
            "(tables closed_task_runs, closed_task_items; each item's run in closed_runs).\n"
            "  --model PATH        llama2.c .bin or Hugging Face folder\n"
            "  --policy SPEC       NAME, NAME:key=value,... or NAME@PRESET (repeatable; oracles are refused)\n"
            "  --codec SPEC        the policy model's cache under a KV codec (`kvsim replay --codec`: int, kivi, hf,\n"
            "                      fp8, think specs; none = K/V as computed), repeatable: each (policy, codec,\n"
            "                      budget) is one run. The prompt is read in full precision; from the first decode\n"
            "                      position every layer of the policy model attends over the codec's rows of its own\n"
            "                      history (the replay's rule), so KL, perplexity and the tokens show what the codec\n"
            "                      and the policy together do to decoding\n"
            "  --budgets LIST      16,32,64 or 10%%,20%% (of the prompt), tokens per KV head\n"
            "  --db FILE           results database (created when absent)\n"
            "  --trace TRACE       the trace's tokens; its first prompt is the prompt (pairs with replays of TRACE\n"
            "                      for kvsim calibrate)\n"
            "  --text FILE         held-out text: BOS + its tokens; the first K are the prompt, the rest scored\n"
            "  --prompt-tokens K   prompt length for --text (default 32); for --task the first K tokens of each context\n"
            "                      (BOS included) are the prompt, the rest is read through the policy (default: all\n"
            "                      of the context but its last token)\n"
            "  --task FILE         the task's items (budgets in tokens only: items differ in length)\n"
            "  --prompt TEXT, --prompt-file F   free-running from this prompt\n"
            "  --steps N           free-running: tokens to generate (default 64)\n"
            "  --ignore-eos        free-running: do not stop at EOS\n"
            "  --tokenizer FILE    default: beside the model (tok<vocab>.bin, tokenizer.bin, tokenizer.json)\n"
            "  --threads N         threads of the model's matrix products (default 1)\n"
            "Exit status: 0 every run complete, 1 a run failed (recorded as failed) or a bad file, 2 bad usage.\n");
}

static int file_exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}

/* The tokenizer beside the model, as `kvsim capture` finds it. */
static kvs_status load_tokenizer(const char *model_path, const char *given, const kvs_model_info *info,
                                 kvs_tokenizer **tok) {
    char buf[4096];
    *tok = NULL;
    if (given) {
        snprintf(buf, sizeof buf, "%s", given);
    } else if (info->format == KVS_MODEL_HF) {
        snprintf(buf, sizeof buf, "%s/tokenizer.json", model_path);
    } else {
        const char *slash = strrchr(model_path, '/');
        int dir_len = slash ? (int)(slash - model_path) : 1;
        const char *dir = slash ? model_path : ".";
        snprintf(buf, sizeof buf, "%.*s/tok%d.bin", dir_len, dir, info->config.vocab_size);
        if (!file_exists(buf)) snprintf(buf, sizeof buf, "%.*s/tokenizer.bin", dir_len, dir);
    }
    if (!file_exists(buf))
        return kvs_fail(KVS_ERR_IO, "%s: no tokenizer found (pass --tokenizer FILE)", buf);
    size_t n = strlen(buf);
    if (n >= 5 && !strcmp(buf + n - 5, ".json")) return kvs_tokenizer_load_hf(buf, tok);
    return kvs_tokenizer_load_llama2c(buf, info->config.vocab_size, tok);
}

static kvs_status encode(const kvs_tokenizer *tok, const char *text, int32_t **ids, int64_t *n) {
    size_t cap = strlen(text) + 8, got = 0;
    *ids = malloc(cap * sizeof **ids);
    if (!*ids) return kvs_fail(KVS_ERR_NOMEM, "out of memory");
    kvs_status s = kvs_tokenizer_encode(tok, text, 1, *ids, cap, &got);
    if (s == KVS_ERR_RANGE && got > cap) {
        int32_t *b = realloc(*ids, got * sizeof *b);
        if (!b) return kvs_fail(KVS_ERR_NOMEM, "out of memory");
        *ids = b;
        cap = got;
        s = kvs_tokenizer_encode(tok, text, 1, *ids, cap, &got);
    }
    *n = (int64_t)got;
    return s;
}

static const char *value_opts[] = {"--model", "--budgets", "--db", "--trace", "--text", "--prompt-tokens",
                                   "--prompt", "--prompt-file", "--steps", "--tokenizer", "--threads", "--task"};
#define N_VALUE_OPTS (int)(sizeof value_opts / sizeof value_opts[0])

/* ---- --task ---- */

typedef struct {
    const char *model_path, *tok_path, *task_path, *budget_text, *db_path;
    int64_t prompt_tokens; /* 0: each context but its last token is the prompt; K > 0: its first K tokens */
    long threads;
    const kvs_policy_config *cfgs;
    int n_specs;
    kvs_codec *const *codecs; /* [n_codecs]; an entry NULL = none */
    int n_codecs;
} task_args;

/* A configuration's name in the tables: "policy" or "policy [codec spec]", through the one label function of runs
 * (its params left out: the tables print the policy's name alone, as before codecs). */
static void run_name(const kvs_policy_config *cfg, const kvs_codec *codec, char *buf, size_t cap) {
    kvs_results_config_label(cfg->ops->name, NULL, codec ? kvs_codec_spec(codec) : NULL, 0, buf, cap);
}

/* One item's outcome in one (policy, budget). */
typedef struct {
    kvs_closed_loop_result *r; /* NULL when the run failed */
    char *full_text, *policy_text;
    int full_correct, policy_correct;
    double wall_seconds;
    char err[512];
} task_out;


/* The seed of an interval: 64-bit FNV-1a of "task|<task sha256>|<model>|<prompt tokens>|<series>", the series "full"
 * (the full model's accuracy: one interval for every row) or "<policy>|<params>|<budget>" (its accuracy and its paired
 * difference with the full model). What is compared names the seed: the same task, model and row give the same
 * interval, and an edited task file (another hash) another draw. */
static uint64_t task_seed(const char *sha, const char *model, int64_t prompt_tokens, const char *series) {
    char head[160];
    snprintf(head, sizeof head, "|%lld|", (long long)prompt_tokens);
    uint64_t h = kvs_fnv1a64(KVS_FNV1A64_BASIS, "task|");
    h = kvs_fnv1a64(kvs_fnv1a64(kvs_fnv1a64(kvs_fnv1a64(h, sha), "|"), model), head);
    return kvs_fnv1a64(h, series);
}

static void task_out_clear(task_out *o) {
    kvs_closed_loop_result_free(o->r);
    free(o->full_text);
    free(o->policy_text);
    memset(o, 0, sizeof *o);
}

/* The item's closed loop and how each model's continuation scores. A failed run leaves o->r NULL and o->err set. */
static kvs_status task_item_run(const kvs_model *model, const kvs_tokenizer *tok, kvs_threadpool *pool,
                                const kvs_policy_config *cfg, const kvs_codec *codec, int64_t budget,
                                const kvs_closed_loop_task_input *in, int64_t prompt_len, task_out *o) {
    /* the answer's own tokens and two more: the byte after the answer (its word boundary) is then generated even
     * when the model spells the answer in one more piece than the text's tokenization */
    kvs_closed_loop_opts opts = {.model = model, .policy = *cfg, .budget = budget, .pool = pool, .tokens = in->tokens,
                                 .n_tokens = in->n_context, .prompt_len = prompt_len, .free_running = 1,
                                 .max_new = in->n_tokens - in->n_context + 2, .stop_at_eos = 1, .codec = codec};
    double t0 = kvs_now_s();
    kvs_status rs = kvs_closed_loop_run(&opts, &o->r);
    o->wall_seconds = kvs_now_s() - t0;
    if (rs != KVS_OK) {
        snprintf(o->err, sizeof o->err, "%s", kvs_last_error()[0] ? kvs_last_error() : kvs_strerror(rs));
        return KVS_OK;
    }
    kvs_status st = kvs_closed_loop_task_continuation(tok, in, o->r->full_tokens, o->r->n_generated, &o->full_text);
    if (st == KVS_OK)
        st = kvs_closed_loop_task_continuation(tok, in, o->r->policy_tokens, o->r->n_generated, &o->policy_text);
    if (st != KVS_OK) return st;
    o->full_correct = kvs_closed_loop_task_match(o->full_text, in->expected);
    o->policy_correct = kvs_closed_loop_task_match(o->policy_text, in->expected);
    return KVS_OK;
}

static void print_interval(const kvs_interval *iv, int sign) {
    printf(sign ? "%+7.3f [%+.3f, %+.3f]" : "%6.3f [%.3f, %.3f]", iv->mean, iv->lo, iv->hi);
}

static int run_task(const task_args *a) {
    kvs_model *model = NULL;
    kvs_tokenizer *tok = NULL;
    kvs_closed_loop_task *task = NULL;
    kvs_closed_loop_task_input *in = NULL;
    kvs_threadpool *pool = NULL;
    kvs_results_db *db = NULL;
    int64_t *budgets = NULL, *prompt_len = NULL, n_in = 0;
    double *fractions = NULL, *pol = NULL, *full = NULL;
    task_out *outs = NULL;
    kvs_results_closed_run *runs = NULL;
    kvs_results_closed_task_item *items = NULL;
    int n_budgets = 0, failed = 0, full_printed = 0;
    kvs_status st = kvs_model_load(a->model_path, &model);
    if (st != KVS_OK) goto cleanup;
    const kvs_model_info *info = kvs_model_info_get(model);
    const kvs_model_config *mc = &info->config;
    KVS_TRY(st = load_tokenizer(a->model_path, a->tok_path, info, &tok));
    KVS_TRY(st = kvs_closed_loop_task_load(a->task_path, &task));
    size_t n = (size_t)task->n_items;
    in = calloc(n, sizeof *in);
    prompt_len = calloc(n, sizeof *prompt_len);
    outs = calloc(n, sizeof *outs);
    runs = calloc(n, sizeof *runs);
    items = calloc(n, sizeof *items);
    pol = calloc(n, sizeof *pol);
    full = calloc(n, sizeof *full);
    if (!in || !prompt_len || !outs || !runs || !items || !pol || !full) {
        st = kvs_fail(KVS_ERR_NOMEM, "out of memory");
        goto cleanup;
    }
    /* every item is read and checked before any run: a bad item is a bad file, not a failed run */
    for (size_t k = 0; k < n; k++, n_in++) {
        const kvs_closed_loop_task_item *it = &task->items[k];
        KVS_TRY(st = kvs_closed_loop_task_tokenize(tok, it, &in[k]));
        prompt_len[k] = a->prompt_tokens > 0 ? a->prompt_tokens : in[k].n_context - 1;
        if (prompt_len[k] >= in[k].n_context) {
            st = kvs_fail(KVS_ERR_INVALID_ARG, "%s:%lld: the context has %lld tokens: --prompt-tokens %lld leaves none "
                          "to read through the policy", a->task_path, (long long)it->line,
                          (long long)in[k].n_context, (long long)a->prompt_tokens);
            goto cleanup;
        }
        int64_t positions = in[k].n_tokens + 1; /* context + the answer's tokens + 2 generated, less the last one */
        if (positions > mc->max_seq_len) {
            st = kvs_fail(KVS_ERR_FORMAT, "%s:%lld: the item needs %lld positions, more than the model's context "
                          "%d", a->task_path, (long long)it->line, (long long)positions, mc->max_seq_len);
            goto cleanup;
        }
    }
    KVS_TRY(st = kvs_replay_parse_budgets(a->budget_text, 1, mc->max_seq_len, &budgets, &fractions, &n_budgets));
    KVS_TRY(st = kvs_threadpool_create((int)a->threads, &pool));
    KVS_TRY(st = kvs_results_open(a->db_path, &db));
    const uint64_t full_seed = task_seed(task->sha256, mc->model_name, a->prompt_tokens, "full");
    printf("task %s: %lld items (sha256 %.8s), model %s, prompt: %s", a->task_path, (long long)task->n_items,
           task->sha256, mc->model_name, a->prompt_tokens > 0 ? "the first " : "each context but its last token\n");
    if (a->prompt_tokens > 0) printf("%lld tokens of each context\n", (long long)a->prompt_tokens);
    printf("%-14s %6s %7s  %-22s  %-28s\n", "policy", "budget", "correct", "accuracy [95% interval]",
           "policy - full [95% interval]");
    for (int pi = 0; pi < a->n_specs; pi++)
        for (int ci = 0; ci < a->n_codecs; ci++)
        for (int bi = 0; bi < n_budgets; bi++) {
            const kvs_policy_config *cfg = &a->cfgs[pi];
            const kvs_codec *codec = a->codecs[ci];
            const char *codec_spec = codec ? kvs_codec_spec(codec) : NULL;
            char name[KVS_POLICY_NAME_MAX + KVS_CODEC_SPEC_MAX + 4];
            run_name(cfg, codec, name, sizeof name);
            double t0 = kvs_now_s();
            size_t n_run = 0;
            const char *err = NULL;
            for (size_t k = 0; k < n && !err; k++) {
                KVS_TRY(st = task_item_run(model, tok, pool, cfg, codec, budgets[bi], &in[k], prompt_len[k], &outs[k]));
                n_run = k + 1;
                if (!outs[k].r) {
                    err = outs[k].err;
                    fprintf(stderr, "kvsim generate: %s budget %lld failed on %s:%lld: %s\n", name,
                            (long long)budgets[bi], a->task_path, (long long)task->items[k].line, err);
                    failed = 1;
                }
            }
            kvs_policy_granularity lay = kvs_policy_layout(cfg);
            static const char *const scopes[] = {"every_step", "prompt", "none"};
            for (size_t k = 0; k < n_run; k++) {
                runs[k] = (kvs_results_closed_run){
                    .model = mc->model_name, .mode = "free", .source = a->task_path, .trace = NULL,
                    .tokens = in[k].tokens, .n_tokens = in[k].n_context, .prompt_len = prompt_len[k],
                    .policy = cfg->ops->name, .params = cfg->canonical, .codec = codec_spec,
                    .budget_tokens = budgets[bi], .layout = lay == KVS_SEL_PER_QUERY_HEAD ? "per_query_head" : "per_kv_head",
                    .budget_scope = scopes[cfg->ops->budget_scope], .status = outs[k].r ? "complete" : "failed",
                    .error = outs[k].r ? NULL : outs[k].err, .result = outs[k].r, .full_text = outs[k].full_text,
                    .policy_text = outs[k].policy_text, .wall_seconds = outs[k].wall_seconds,
                    .kvsim_version = GEN_VERSION,
                };
                items[k] = (kvs_results_closed_task_item){
                    .run = &runs[k], .line = task->items[k].line, .answer = task->items[k].answer,
                    .expected = in[k].expected, .n_context = in[k].n_context, .full_text = outs[k].full_text,
                    .policy_text = outs[k].policy_text, .full_correct = outs[k].full_correct,
                    .policy_correct = outs[k].policy_correct,
                };
                pol[k] = outs[k].policy_correct;
                full[k] = outs[k].full_correct;
            }
            char series[1200];
            /* a codec names the series only when set: the intervals of runs without one keep their seeds */
            snprintf(series, sizeof series, "%s|%s|%lld%s%s", cfg->ops->name, cfg->canonical, (long long)budgets[bi],
                     codec_spec ? "|codec=" : "", codec_spec ? codec_spec : "");
            kvs_results_closed_task_run tr = {
                .model = mc->model_name, .task = a->task_path, .task_sha256 = task->sha256,
                .prompt_tokens = a->prompt_tokens, .policy = cfg->ops->name, .params = cfg->canonical,
                .codec = codec_spec, .budget_tokens = budgets[bi], .status = err ? "failed" : "complete", .error = err,
                .items = items,
                .n_items = (int64_t)n_run, .seed = task_seed(task->sha256, mc->model_name, a->prompt_tokens, series),
                .kvsim_version = GEN_VERSION,
            };
            if (!err) {
                KVS_TRY(st = kvs_bootstrap_mean(pol, n, KVS_BOOTSTRAP_REPS, 0.95, tr.seed, &tr.accuracy));
                KVS_TRY(st = kvs_bootstrap_mean(full, n, KVS_BOOTSTRAP_REPS, 0.95, full_seed, &tr.full_accuracy));
                KVS_TRY(st = kvs_bootstrap_mean_diff(pol, full, n, KVS_BOOTSTRAP_REPS, 0.95, tr.seed, &tr.diff));
            }
            tr.wall_seconds = kvs_now_s() - t0;
            st = kvs_results_closed_task_write(db, &tr, NULL);
            for (size_t k = 0; k < n_run; k++) task_out_clear(&outs[k]);
            if (st != KVS_OK) goto cleanup;
            if (err) continue;
            if (!full_printed) {
                printf("%-14s %6s %3.0f/%-3zu  ", "(full cache)", "-", tr.full_accuracy.mean * (double)n, n);
                print_interval(&tr.full_accuracy, 0);
                printf("\n");
                full_printed = 1;
            }
            printf("%-14s %6lld %3.0f/%-3zu  ", name, (long long)budgets[bi], tr.accuracy.mean * (double)n, n);
            print_interval(&tr.accuracy, 0);
            printf("  ");
            print_interval(&tr.diff, 1);
            int res = kvs_interval_resolved(&tr.diff);
            printf("%s\n", res < 0 ? "  below full" : res > 0 ? "  above full" : "");
        }
    st = KVS_OK;
cleanup:
    for (size_t k = 0; outs && task && k < (size_t)task->n_items; k++) task_out_clear(&outs[k]);
    for (int64_t k = 0; in && k < n_in; k++) kvs_closed_loop_task_input_clear(&in[k]);
    free(in);
    free(outs);
    free(runs);
    free(items);
    free(pol);
    free(full);
    free(prompt_len);
    free(budgets);
    free(fractions);
    kvs_results_close(db);
    kvs_threadpool_free(pool);
    kvs_closed_loop_task_free(task);
    kvs_tokenizer_free(tok);
    kvs_model_free(model);
    if (st != KVS_OK) return kvs_cli_fail("generate", st);
    int rc = kvs_cli_finish_stdout("generate");
    return rc != KVS_EXIT_OK ? rc : failed ? KVS_EXIT_FAIL : KVS_EXIT_OK;
}

int kvs_cmd_generate(int argc, char **argv) {
    const char *val[N_VALUE_OPTS] = {0};
    const char *specs[MAX_POLICIES], *codec_specs[MAX_CODECS];
    int n_specs = 0, n_codec_specs = 0, ignore_eos = 0;
    for (int i = 1; i < argc; i++) {
        int m = 0, hit = 0;
        const char *v;
        if (kvs_cli_is_help(argv[i])) {
            usage(stdout);
            return KVS_EXIT_OK;
        }
        if ((v = kvs_cli_opt_value("--policy", argc, argv, &i, &m)) || m) {
            if (!v) return kvs_cli_usage_error("generate", "--policy needs a SPEC");
            if (n_specs == MAX_POLICIES) return kvs_cli_usage_error("generate", "at most %d --policy options", MAX_POLICIES);
            specs[n_specs++] = v;
            continue;
        }
        if ((v = kvs_cli_opt_value("--codec", argc, argv, &i, &m)) || m) {
            if (!v) return kvs_cli_usage_error("generate", "--codec needs a SPEC");
            if (n_codec_specs == MAX_CODECS) return kvs_cli_usage_error("generate", "at most %d --codec options", MAX_CODECS);
            codec_specs[n_codec_specs++] = v;
            continue;
        }
        for (int k = 0; k < N_VALUE_OPTS && !hit; k++) {
            int r = kvs_cli_single_value("generate", value_opts[k], argc, argv, &i, &m, &val[k]);
            if (r < 0) return KVS_EXIT_USAGE;
            if (m) return kvs_cli_usage_error("generate", "option %s needs a value", value_opts[k]);
            hit = r;
        }
        if (hit) continue;
        if (!strcmp(argv[i], "--ignore-eos")) {
            if (kvs_cli_once("generate", "--ignore-eos", &ignore_eos)) return KVS_EXIT_USAGE;
        } else if (argv[i][0] == '-') {
            return kvs_cli_usage_error("generate", "unknown option '%s'", argv[i]);
        } else {
            return kvs_cli_usage_error("generate", "unexpected argument '%s'", argv[i]);
        }
    }
    const char *model_path = val[0], *budget_text = val[1], *db_path = val[2], *trace_path = val[3],
               *text_path = val[4], *prompt = val[6], *prompt_file = val[7], *tok_path = val[9];
    if (!model_path) return kvs_cli_usage_error("generate", "missing --model PATH");
    if (!n_specs) return kvs_cli_usage_error("generate", "missing --policy SPEC");
    if (!budget_text) return kvs_cli_usage_error("generate", "missing --budgets LIST");
    if (!db_path) return kvs_cli_usage_error("generate", "missing --db FILE");
    const char *task_path = val[11];
    int n_src = !!trace_path + !!text_path + !!prompt + !!prompt_file + !!task_path;
    if (n_src != 1)
        return kvs_cli_usage_error("generate", "give exactly one of --trace, --text, --prompt, --prompt-file, --task");
    int free_running = prompt || prompt_file;
    long prompt_tokens = 32, steps = 64, threads = 1;
    if (val[5] && ((!text_path && !task_path) ||
                   kvs_cli_parse_long("--prompt-tokens", val[5], 1, 1L << 24, &prompt_tokens) != KVS_OK))
        return val[5] && !text_path && !task_path
                   ? kvs_cli_usage_error("generate", "--prompt-tokens goes with --text or --task")
                   : kvs_cli_fail("generate", KVS_ERR_INVALID_ARG);
    if (val[8] && (!free_running || kvs_cli_parse_long("--steps", val[8], 2, 1L << 24, &steps) != KVS_OK))
        return val[8] && !free_running ? kvs_cli_usage_error("generate", "--steps goes with --prompt / --prompt-file")
                                       : kvs_cli_fail("generate", KVS_ERR_INVALID_ARG);
    if (ignore_eos && !free_running) return kvs_cli_usage_error("generate", "--ignore-eos goes with --prompt / --prompt-file");
    if (val[10] && kvs_cli_parse_long("--threads", val[10], 1, KVS_CLI_MAX_THREADS, &threads) != KVS_OK)
        return kvs_cli_fail("generate", KVS_ERR_INVALID_ARG);
    kvs_policy_config cfgs[MAX_POLICIES];
    for (int i = 0; i < n_specs; i++) {
        if (kvs_policy_parse(specs[i], &cfgs[i]) != KVS_OK) return kvs_cli_fail("generate", KVS_ERR_INVALID_ARG);
        if (cfgs[i].ops->is_oracle)
            return kvs_cli_usage_error("generate", "policy %s is an oracle: a model decoding with a compressed cache "
                                       "has no full attention to give it", cfgs[i].ops->name);
    }
    if (task_path && strchr(budget_text, '%'))
        return kvs_cli_usage_error("generate", "--task takes budgets in tokens: items differ in length, so a "
                                   "percentage names no one budget");
    /* the codecs: none given = one entry NULL, the policy model's K/V as computed */
    kvs_codec *codecs[MAX_CODECS];
    int n_codecs = 0;
    if (kvs_cli_parse_codecs("generate", codec_specs, n_codec_specs, codecs, &n_codecs) != KVS_OK) {
        kvs_cli_fail("generate", KVS_ERR_INVALID_ARG); /* the codec's message; a bad value, exit 1 (as replay) */
        return KVS_EXIT_FAIL;
    }
    /* parameters naming a results database (SyncKV's clusters) are loaded here: policies never open one */
    void *inputs = NULL;
    kvs_status rst = kvs_results_resolve_policy_inputs(cfgs, n_specs, &inputs);
    if (rst != KVS_OK) {
        for (int k = 0; k < n_codecs; k++) kvs_codec_free(codecs[k]);
        return kvs_cli_fail("generate", rst);
    }
    if (task_path) {
        task_args ta = {.model_path = model_path, .tok_path = tok_path, .task_path = task_path,
                        .prompt_tokens = val[5] ? prompt_tokens : 0, .budget_text = budget_text, .db_path = db_path,
                        .threads = threads, .cfgs = cfgs, .n_specs = n_specs, .codecs = codecs, .n_codecs = n_codecs};
        int rc = run_task(&ta);
        kvs_results_policy_inputs_free(inputs);
        for (int k = 0; k < n_codecs; k++) kvs_codec_free(codecs[k]);
        return rc;
    }

    kvs_model *model = NULL;
    kvs_tokenizer *tok = NULL;
    kvs_trace *trace = NULL;
    kvs_threadpool *pool = NULL;
    kvs_results_db *db = NULL;
    int32_t *ids = NULL;
    int64_t *budgets = NULL;
    double *fractions = NULL;
    char *text = NULL;
    int n_budgets = 0, failed = 0;
    int64_t n_ids = 0, prompt_len = 0;
    kvs_results_trace trow;
    char trace_sha[65] = "";
    kvs_status st = kvs_model_load(model_path, &model);
    if (st != KVS_OK) goto cleanup;
    const kvs_model_info *info = kvs_model_info_get(model);
    const kvs_model_config *mc = &info->config;
    if (!trace_path || free_running) {
        if (trace_path == NULL) KVS_TRY(st = load_tokenizer(model_path, tok_path, info, &tok));
    }
    if (trace_path) {
        KVS_TRY(st = kvs_trace_open(trace_path, &trace));
        const kvs_trace_info *ti = kvs_trace_info_get(trace);
        if (ti->model.n_layers != mc->n_layers || ti->model.n_heads != mc->n_heads ||
            ti->model.n_kv_heads != mc->n_kv_heads || ti->model.head_dim != mc->head_dim ||
            ti->model.vocab_size != mc->vocab_size) {
            st = kvs_fail(KVS_ERR_INVALID_ARG, "%s was captured from another model (%s) than %s", trace_path,
                          ti->model.model_name, model_path);
            goto cleanup;
        }
        n_ids = ti->n_positions;
        prompt_len = ti->turns[0].prompt_end;
        ids = malloc((size_t)n_ids * sizeof *ids);
        if (!ids) {
            st = kvs_fail(KVS_ERR_NOMEM, "out of memory");
            goto cleanup;
        }
        memcpy(ids, kvs_trace_tokens(trace), (size_t)n_ids * sizeof *ids);
        trow = kvs_results_trace_of(trace_path, ti);
        /* the trace's identity is its content, not the path it was named by: calibrate pairs these runs with replays
         * of the same file through any spelling (and merge keeps them one trace) */
        KVS_TRY(st = kvs_trace_content_sha256(trace, trace_sha));
    } else {
        const char *src = text_path ? text_path : prompt_file;
        if (src) {
            size_t len;
            if (!strcmp(src, "-")) {
                st = kvs_fail(KVS_ERR_INVALID_ARG, "--text/--prompt-file -: standard input is not supported here");
                goto cleanup;
            }
            KVS_TRY(st = kvs_read_file(src, &text, &len));
        }
        KVS_TRY(st = encode(tok, text ? text : prompt, &ids, &n_ids));
        if (n_ids > mc->max_seq_len) {
            fprintf(stderr, "kvsim generate: warning: %lld tokens truncated to the model context %d\n",
                    (long long)n_ids, mc->max_seq_len);
            n_ids = mc->max_seq_len;
        }
        prompt_len = free_running ? n_ids : prompt_tokens;
    }
    int64_t total = free_running ? n_ids + steps - 1 : n_ids - 1;
    st = kvs_replay_parse_budgets(budget_text, prompt_len, total > 0 ? total : 1, &budgets, &fractions, &n_budgets);
    if (st != KVS_OK) goto cleanup;
    KVS_TRY(st = kvs_threadpool_create((int)threads, &pool));
    KVS_TRY(st = kvs_results_open(db_path, &db));
    if (trace_path) {
        int64_t trace_row = 0; /* the row closed-loop runs reference: kvs_results_closed_write finds it again */
        KVS_TRY(st = kvs_results_sweep_trace(db, &trow, trace_sha, &trace_row));
    }

    printf("%-14s %6s %9s %9s %8s %10s %10s %9s %8s", "policy", "budget", "kl_mean", "top1", "ppl_full", "ppl_policy",
           "dppl", "out_err", "recall");
    if (free_running) printf(" %8s %7s", "diverge", "agree");
    printf("\n");
    for (int pi = 0; pi < n_specs; pi++)
        for (int ci = 0; ci < n_codecs; ci++)
        for (int bi = 0; bi < n_budgets; bi++) {
            const kvs_codec *codec = codecs[ci];
            char name[KVS_POLICY_NAME_MAX + KVS_CODEC_SPEC_MAX + 4];
            run_name(&cfgs[pi], codec, name, sizeof name);
            kvs_closed_loop_opts o = {.model = model, .policy = cfgs[pi], .budget = budgets[bi], .pool = pool,
                                      .tokens = ids, .n_tokens = n_ids, .prompt_len = prompt_len,
                                      .free_running = free_running, .max_new = steps, .stop_at_eos = !ignore_eos,
                                      .codec = codec};
            kvs_closed_loop_result *r = NULL;
            double t0 = kvs_now_s();
            kvs_status rs = kvs_closed_loop_run(&o, &r);
            char err[512] = "";
            if (rs != KVS_OK) {
                snprintf(err, sizeof err, "%s", kvs_last_error()[0] ? kvs_last_error() : kvs_strerror(rs));
                fprintf(stderr, "kvsim generate: %s budget %lld failed: %s\n", name, (long long)budgets[bi], err);
                failed = 1;
            }
            char *full_text = NULL, *pol_text = NULL;
            if (r && free_running && tok) {
                KVS_TRY(st = kvs_tokenizer_decode(tok, r->full_tokens, (size_t)r->n_generated, &full_text));
                st = kvs_tokenizer_decode(tok, r->policy_tokens, (size_t)r->n_generated, &pol_text);
                if (st != KVS_OK) {
                    free(full_text);
                    goto cleanup;
                }
            }
            kvs_policy_granularity lay = kvs_policy_layout(&cfgs[pi]);
            static const char *const scopes[] = {"every_step", "prompt", "none"};
            kvs_results_closed_run row = {
                .model = mc->model_name, .mode = free_running ? "free" : "teacher",
                .source = trace_path ? trace_path : text_path ? text_path : prompt_file ? prompt_file : "prompt",
                .trace = trace_path ? &trow : NULL, .tokens = ids, .n_tokens = n_ids, .prompt_len = prompt_len,
                .policy = cfgs[pi].ops->name, .params = cfgs[pi].canonical,
                .codec = codec ? kvs_codec_spec(codec) : NULL, .budget_tokens = budgets[bi],
                .layout = lay == KVS_SEL_PER_QUERY_HEAD ? "per_query_head" : "per_kv_head",
                .budget_scope = scopes[cfgs[pi].ops->budget_scope], .status = r ? "complete" : "failed",
                .error = r ? NULL : err, .result = r, .full_text = full_text, .policy_text = pol_text,
                .wall_seconds = kvs_now_s() - t0, .kvsim_version = GEN_VERSION,
            };
            st = kvs_results_closed_write(db, &row, NULL);
            free(full_text);
            free(pol_text);
            if (st != KVS_OK) {
                kvs_closed_loop_result_free(r);
                goto cleanup;
            }
            if (r) {
                printf("%-14s %6lld %9.4g %9.4f %8.3f %10.3f %10.4g %9.4g %8.4f", name,
                       (long long)budgets[bi], r->kl_mean, r->top1_agree, r->ppl_full, r->ppl_policy,
                       r->ppl_policy - r->ppl_full, r->out_err_mean, r->attn_recall_mean);
                if (free_running) printf(" %8lld %7.3f", (long long)r->first_divergence, r->token_agreement);
                printf("\n");
            }
            kvs_closed_loop_result_free(r);
        }
    st = KVS_OK;
cleanup:
    for (int k = 0; k < n_codecs; k++) kvs_codec_free(codecs[k]);
    kvs_results_policy_inputs_free(inputs);
    kvs_results_close(db);
    kvs_threadpool_free(pool);
    kvs_trace_close(trace);
    kvs_tokenizer_free(tok);
    kvs_model_free(model);
    free(ids);
    free(budgets);
    free(fractions);
    free(text);
    if (st != KVS_OK) return kvs_cli_fail("generate", st);
    int rc = kvs_cli_finish_stdout("generate");
    return rc != KVS_EXIT_OK ? rc : failed ? KVS_EXIT_FAIL : KVS_EXIT_OK;
}
