/* cmd_replay.c — `kvsim replay`: replays a trace under a sweep of policy configurations and budgets and
 * stores one run per (policy configuration, budget) in the results database (results/results.h, results/SCHEMA.md).
 * Replay semantics and metrics: sim/replay.h and ../shared/DESIGN.md ("Replay", "Metrics").
 *
 * Everything is validated before the database is opened (unknown policy or parameter, budget 0 or larger
 * than the trace, bad option): such errors exit 2 and leave the database untouched.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../sim/codec.h"
#include "../sim/host.h"
#include "../sim/policy.h"
#include "../policies/registry.h"
#include "../sim/replay.h"
#include "../results/results.h"
#include "../results/results_heads.h"
#include "../results/results_sweep.h"
#include "../trace/trace.h"
#include "cli.h"

#ifndef KVSIM_VERSION_STRING
#define KVSIM_VERSION_STRING "0.1.0"
#endif

#define MAX_POLICIES 64
#define MAX_CODECS 16
#define MAX_PAGES 16

static void usage(FILE *f) {
    fprintf(f,
            "usage: kvsim replay TRACE --db FILE --policy SPEC [--policy SPEC ...] --budgets LIST\n"
            "                    [--codec SPEC ...] [--threads N] [--measure decode|prefill|all] [--series-every N]\n"
            "                    [--kv-bytes N] [--aux-bytes N] [--progress|--no-progress] [--reference]\n\n"
            "Replays TRACE under every (policy, budget) pair in one pass and writes one run per pair to the\n"
            "results database FILE (created if missing).\n\n"
            "  --policy SPEC     NAME, NAME:key=value,key=value or NAME@PRESET[:key=value,...] (a paper's\n"
            "                    settings, listed below with @); repeatable; policies and parameters below\n"
            "  --budgets LIST    tokens per KV head, the current token included: 16,32,64; or percentages of\n"
            "                    the first turn's PROMPT length: 10%%,20%% (rounded up, at least 1; never of\n"
            "                    the generated length, which a real system does not know in advance)\n"
            "  --codec SPEC      how stored K/V rows are represented (quantized): int[:bits=,group=,k_axis=,\n"
            "                    v_axis=], kivi[:bits=,group=,residual=], hf[:bits=,group=,residual=],\n"
            "                    fp8[:format=,scale=,per=] (sim/codec.h), or none (K/V as captured); repeatable:\n"
            "                    every (policy, codec, budget) is one run. The first prompt is scored in full\n"
            "                    precision; from the first decode step on policies and the metrics see the\n"
            "                    dequantized rows and storage counts the codec's bytes; the error is against the\n"
            "                    full-precision full cache. Without --codec: K/V as captured\n"
            "  --page LIST       a paged cache: pages of N positions, e.g. 16 (vLLM's default block) or 16,32\n"
            "                    (every (policy, page, budget) one run); 0 or none = token granularity. From the\n"
            "                    first decode step the policy's selection is mapped to at most floor(B/N) whole\n"
            "                    pages (the newest, then the best by --page-score), attention and the metrics\n"
            "                    cover every position of them, storage counts whole pages of what the policy\n"
            "                    keeps, padding included (sim/host.h); with --codec, whole pages of the codec's\n"
            "                    rows and bytes\n"
            "  --page-score R    how a paged run ranks pages of its selection: max (a page's score is the max of\n"
            "                    its selected positions' retention scores, the policy's own: H2O's accumulated\n"
            "                    attention, TOVA's last attention, SnapKV/PyramidKV/Ada-KV's pooled window\n"
            "                    scores, Scissorhands' counters, Keyformer's scores, KNorm's -|k|), sum (their\n"
            "                    sum), or count (how many selected positions it holds). Default: max for a\n"
            "                    policy with scores, count otherwise; a policy without scores always counts.\n"
            "                    Recorded in the run's options (page=N,page_score=R) and its label\n"
            "                    (\"[page 16 max]\"; the count rule \"[page 16]\")\n"
            "  --threads N       worker threads (default: every CPU kvsim may run on)\n"
            "  --measure M       decode (default): metrics at generated positions; prefill: at prompt\n"
            "                    positions (against what the policy holds, chunk by chunk); all: both\n"
            "  --series-every N  store every N-th measured step per (layer, query head) (default 0: none)\n"
            "  --kv-bytes N      bytes per cached K/V element (default: the trace dtype's size)\n"
            "  --aux-bytes N     bytes per auxiliary element, scores etc. (default 4: fp32)\n"
            "  --progress        a progress line on stderr (default: only when stderr is a terminal);\n"
            "                    --no-progress never\n"
            "  --reference       run the reference replay instead (sim/replay_ref.c: plain loops, one thread, the\n"
            "                    executable specification of the metrics; much slower, the same numbers)\n\n"
            "Identical (policy, budget) pairs run once. A pair the policy rejects (e.g. streaming with sinks >=\n"
            "budget) is recorded as a failed run with its reason while the others run, even when it rejects them\n"
            "all; the exit status is then 1.\n"
            "SIGINT/SIGTERM stop the replay: during the replay every run is recorded as failed (interrupted); while\n"
            "the results are being stored, the runs stored so far stay complete and the rest are recorded as failed\n"
            "(interrupted). Either way the exit status is 1.\n"
            "Every option except --policy and --codec may be given once.\n\n"
            "Budgets are nominal: prompt-only policies (SnapKV, PyramidKV, Ada-KV) bound the prompt only and\n"
            "keep every generated token, so compare policies at equal measured memory or traffic too\n"
            "(kvsim compare DB --match mem|traffic, kvsim plot --kind error-vs-memory|error-vs-traffic).\n\n"
            "policies:\n");
    kvs_policy_print_help(f);
}

/* SIGINT/SIGTERM during the replay: the engine stops at the next position and every run is recorded as
 * failed ("interrupted"), so the database says what happened; a second signal kills as usual. */
static volatile int stop_requested;

static void on_stop_signal(int sig) {
    stop_requested = 1;
    signal(sig, SIG_DFL);
}

static void install_stop_handlers(void) {
    signal(SIGINT, on_stop_signal);
    signal(SIGTERM, on_stop_signal);
}

typedef struct {
    double start;
    int shown;
} replay_progress;

/* One self-overwriting line on stderr: percentage, elapsed and estimated remaining time. */
static void show_progress(void *user, int64_t done, int64_t total) {
    replay_progress *p = user;
    double el = kvs_now_s() - p->start, frac = total > 0 ? (double)done / (double)total : 1.0;
    double left = frac > 0 ? el * (1.0 - frac) / frac : 0.0;
    fprintf(stderr, "\rkvsim replay: %5.1f%% (%lld of %lld layer-steps), %.0f s elapsed, ~%.0f s left   ", 100.0 * frac,
            (long long)done, (long long)total, el, left);
    fflush(stderr);
    p->shown = 1;
}

/* Prints the runs just written (ids in order), as `kvsim runs` would. */
static kvs_status print_written_runs(kvs_results_db *db, const int64_t *ids, int n) {
    kvs_results_run_row *all = calloc((size_t)(n > 0 ? n : 1), sizeof *all);
    if (!all) return kvs_fail(KVS_ERR_NOMEM, "out of memory");
    int64_t got = 0;
    kvs_status st = KVS_OK;
    for (int i = 0; i < n && st == KVS_OK; i++) {
        kvs_results_filter f = {.run_id = ids[i], .include_failed = 1};
        kvs_results_run_row *one = NULL;
        int64_t k = 0;
        st = kvs_results_query_runs(db, &f, &one, &k);
        if (st == KVS_OK && k == 1) {
            all[got++] = one[0]; /* moved: the strings now belong to `all` */
            free(one);
        } else {
            kvs_results_run_rows_free(one, k);
            if (st == KVS_OK) st = kvs_fail(KVS_ERR_DB, "run %lld just written cannot be read back", (long long)ids[i]);
        }
    }
    if (st == KVS_OK) kvs_cli_print_runs_table(stdout, all, got, 0, 1);
    kvs_results_run_rows_free(all, got);
    return st;
}

/* Removes repeated budgets in place (the first occurrence stays, with its fraction); @return the new count. */
static int dedup_budgets(const char *text, int64_t *budgets, double *fractions, int n) {
    int w = 0;
    for (int b = 0; b < n; b++) {
        int times = 1, seen = 0;
        for (int j = 0; j < b && !seen; j++) seen = budgets[j] == budgets[b];
        if (seen) continue;
        for (int j = b + 1; j < n; j++) times += budgets[j] == budgets[b];
        if (times > 1)
            fprintf(stderr, "kvsim replay: warning: budget %lld given %d times in --budgets %s: run once\n",
                    (long long)budgets[b], times, text);
        budgets[w] = budgets[b];
        fractions[w++] = fractions[b];
    }
    return w;
}

static int same_config(const kvs_policy_config *a, const kvs_policy_config *b) {
    return a->ops == b->ops && !strcmp(a->canonical, b->canonical);
}

/* Removes repeated policy configurations in place (compared by canonical parameters); @return the new count. */
static int dedup_specs(kvs_policy_config *cfgs, int n) {
    int w = 0;
    for (int i = 0; i < n; i++) {
        int times = 1, seen = 0;
        for (int j = 0; j < i && !seen; j++) seen = same_config(&cfgs[j], &cfgs[i]);
        if (seen) continue;
        for (int j = i + 1; j < n; j++) times += same_config(&cfgs[j], &cfgs[i]);
        if (times > 1)
            fprintf(stderr, "kvsim replay: warning: --policy %s%s%s given %d times: run once\n", cfgs[i].ops->name,
                    cfgs[i].canonical[0] ? ":" : "", cfgs[i].canonical, times);
        if (w != i) cfgs[w] = cfgs[i];
        w++;
    }
    return w;
}

/* A bad --page value: its message, exit 1 (a bad value, as a bad --codec spec). */
static int page_error(kvs_status st) {
    kvs_cli_fail("replay", st);
    return KVS_EXIT_FAIL;
}

int kvs_cmd_replay(int argc, char **argv) {
    const char *trace_path = NULL, *db_path = NULL, *budget_text = NULL;
    const char *specs[MAX_POLICIES];
    int n_specs = 0;
    const char *codec_specs[MAX_CODECS];
    int n_codec_specs = 0;
    long threads = 0, series_every = 0, kv_bytes = 0, aux_bytes = 0;
    int progress = -1; /* -1: on a terminal only */
    const char *page_text = NULL;
    int page_score = KVS_PAGE_SCORE_AUTO, seen_page_score = 0;
    int reference = 0;
    /* One rule for every single-valued option: given twice is a usage error (never "the last wins"). */
    int seen_threads = 0, seen_series = 0, seen_kvb = 0, seen_auxb = 0, seen_measure = 0;
    kvs_replay_measure measure = KVS_MEASURE_DECODE;
    for (int i = 1; i < argc; i++) {
        int m = 0; /* set when argv[i] is the option but its value is missing */
        const char *v;
        if (kvs_cli_is_help(argv[i])) {
            usage(stdout);
            return KVS_EXIT_OK;
        }
        if ((v = kvs_cli_opt_value("--db", argc, argv, &i, &m)) || m) {
            if (!v) return kvs_cli_usage_error("replay", "--db needs a FILE");
            if (db_path) return kvs_cli_usage_error("replay", "--db given twice");
            db_path = v;
        } else if ((v = kvs_cli_opt_value("--policy", argc, argv, &i, &m)) || m) {
            if (!v) return kvs_cli_usage_error("replay", "--policy needs a SPEC");
            if (n_specs == MAX_POLICIES) return kvs_cli_usage_error("replay", "at most %d --policy options", MAX_POLICIES);
            specs[n_specs++] = v;
        } else if ((v = kvs_cli_opt_value("--codec", argc, argv, &i, &m)) || m) {
            if (!v) return kvs_cli_usage_error("replay", "--codec needs a SPEC");
            if (n_codec_specs == MAX_CODECS) return kvs_cli_usage_error("replay", "at most %d --codec options", MAX_CODECS);
            codec_specs[n_codec_specs++] = v;
        } else if ((v = kvs_cli_opt_value("--page", argc, argv, &i, &m)) || m) {
            if (!v) return kvs_cli_usage_error("replay", "--page needs a LIST");
            if (page_text) return kvs_cli_usage_error("replay", "--page given twice");
            page_text = v;
        } else if ((v = kvs_cli_opt_value("--page-score", argc, argv, &i, &m)) || m) {
            if (!v) return kvs_cli_usage_error("replay", "--page-score needs max, sum or count");
            if (seen_page_score++) return kvs_cli_usage_error("replay", "--page-score given twice");
            if (!strcmp(v, "max")) page_score = KVS_PAGE_SCORE_MAX;
            else if (!strcmp(v, "sum")) page_score = KVS_PAGE_SCORE_SUM;
            else if (!strcmp(v, "count")) page_score = KVS_PAGE_SCORE_COUNT;
            else return kvs_cli_usage_error("replay", "--page-score: '%s' is not max, sum or count", v);
        } else if ((v = kvs_cli_opt_value("--budgets", argc, argv, &i, &m)) || m) {
            if (!v) return kvs_cli_usage_error("replay", "--budgets needs a LIST");
            if (budget_text) return kvs_cli_usage_error("replay", "--budgets given twice");
            budget_text = v;
        } else if ((v = kvs_cli_opt_value("--threads", argc, argv, &i, &m)) || m) {
            if (!v) return kvs_cli_usage_error("replay", "--threads needs N");
            if (seen_threads++) return kvs_cli_usage_error("replay", "--threads given twice");
            if (kvs_cli_parse_long("--threads", v, 1, KVS_CLI_MAX_THREADS, &threads) != KVS_OK) return kvs_cli_fail("replay", KVS_ERR_INVALID_ARG);
        } else if ((v = kvs_cli_opt_value("--series-every", argc, argv, &i, &m)) || m) {
            if (!v) return kvs_cli_usage_error("replay", "--series-every needs N");
            if (seen_series++) return kvs_cli_usage_error("replay", "--series-every given twice");
            if (kvs_cli_parse_long("--series-every", v, 0, 1L << 40, &series_every) != KVS_OK)
                return kvs_cli_fail("replay", KVS_ERR_INVALID_ARG);
        } else if ((v = kvs_cli_opt_value("--kv-bytes", argc, argv, &i, &m)) || m) {
            if (!v) return kvs_cli_usage_error("replay", "--kv-bytes needs N");
            if (seen_kvb++) return kvs_cli_usage_error("replay", "--kv-bytes given twice");
            if (kvs_cli_parse_long("--kv-bytes", v, 1, 8, &kv_bytes) != KVS_OK) return kvs_cli_fail("replay", KVS_ERR_INVALID_ARG);
        } else if ((v = kvs_cli_opt_value("--aux-bytes", argc, argv, &i, &m)) || m) {
            if (!v) return kvs_cli_usage_error("replay", "--aux-bytes needs N");
            if (seen_auxb++) return kvs_cli_usage_error("replay", "--aux-bytes given twice");
            if (kvs_cli_parse_long("--aux-bytes", v, 1, 8, &aux_bytes) != KVS_OK) return kvs_cli_fail("replay", KVS_ERR_INVALID_ARG);
        } else if ((v = kvs_cli_opt_value("--measure", argc, argv, &i, &m)) || m) {
            if (!v) return kvs_cli_usage_error("replay", "--measure needs decode, prefill or all");
            if (seen_measure++) return kvs_cli_usage_error("replay", "--measure given twice");
            if (!strcmp(v, "decode")) measure = KVS_MEASURE_DECODE;
            else if (!strcmp(v, "all")) measure = KVS_MEASURE_ALL;
            else if (!strcmp(v, "prefill")) measure = KVS_MEASURE_PREFILL;
            else return kvs_cli_usage_error("replay", "--measure: '%s' is not decode, prefill or all", v);
        } else if (!strcmp(argv[i], "--reference")) {
            if (reference++) return kvs_cli_usage_error("replay", "--reference given twice");
        } else if (!strcmp(argv[i], "--progress") || !strcmp(argv[i], "--no-progress")) {
            if (progress >= 0) return kvs_cli_usage_error("replay", "--progress/--no-progress given twice");
            progress = !strcmp(argv[i], "--progress");
        } else if (argv[i][0] == '-' && argv[i][1]) {
            return kvs_cli_usage_error("replay", "unknown option '%s'", argv[i]);
        } else {
            if (trace_path) return kvs_cli_usage_error("replay", "unexpected argument '%s'", argv[i]);
            trace_path = argv[i];
        }
    }
    if (!trace_path) return kvs_cli_usage_error("replay", "missing TRACE");
    if (!db_path) return kvs_cli_usage_error("replay", "missing --db FILE");
    if (!n_specs) return kvs_cli_usage_error("replay", "missing --policy SPEC");
    if (!budget_text) return kvs_cli_usage_error("replay", "missing --budgets LIST");

    /* the page sizes: none given = one, token granularity (0); a repeated size runs once */
    int64_t page_sizes[MAX_PAGES] = {0};
    int n_pages = 1;
    if (page_text) {
        n_pages = 0;
        const char *q = page_text;
        for (;;) {
            const char *end = strchr(q, ',');
            size_t len = end ? (size_t)(end - q) : strlen(q);
            char item[32];
            long val = 0;
            if (len == 0 || len >= sizeof item)
                return page_error(kvs_fail(KVS_ERR_INVALID_ARG, "--page: '%s' is not a list of page sizes (0 or none, or 1..%d "
                                                                  "positions)", page_text, INT32_MAX));
            memcpy(item, q, len);
            item[len] = '\0';
            if (strcmp(item, "none") && kvs_cli_parse_long("--page", item, 0, INT32_MAX, &val) != KVS_OK)
                return page_error(KVS_ERR_INVALID_ARG);
            int dup = 0;
            for (int k = 0; k < n_pages; k++) dup |= page_sizes[k] == val;
            if (dup) fprintf(stderr, "kvsim replay: warning: --page %ld given more than once: run once\n", val);
            else if (n_pages == MAX_PAGES) return kvs_cli_usage_error("replay", "at most %d page sizes", MAX_PAGES);
            else page_sizes[n_pages++] = val;
            if (!end) break;
            q = end + 1;
        }
    }

    kvs_policy_config cfgs[MAX_POLICIES];
    for (int i = 0; i < n_specs; i++)
        if (kvs_policy_parse(specs[i], &cfgs[i]) != KVS_OK) return kvs_cli_fail("replay", KVS_ERR_INVALID_ARG);
    /* the codecs: none given = one "codec", K/V as captured (NULL); "none" names that one among others */
    kvs_codec *codecs[MAX_CODECS] = {NULL};
    int n_codecs = 0;
    if (kvs_cli_parse_codecs("replay", (const char *const *)codec_specs, n_codec_specs, codecs, &n_codecs) != KVS_OK) {
        kvs_cli_fail("replay", KVS_ERR_INVALID_ARG); /* the codec's message; a bad value, exit 1 */
        return KVS_EXIT_FAIL;
    }
    /* parameters naming a results database (SyncKV's clusters) are loaded here: policies never open one */
    void *inputs = NULL;
    kvs_status rst = kvs_results_resolve_policy_inputs(cfgs, n_specs, &inputs);
    if (rst != KVS_OK) {
        for (int k = 0; k < n_codecs; k++) kvs_codec_free(codecs[k]);
        return kvs_cli_fail("replay", rst);
    }

    int rc = KVS_EXIT_FAIL;
    const kvs_codec **run_codec = NULL, **valid_codec = NULL; /* [n_runs] / [n_valid] each run's codec */
    int64_t *run_page = NULL, *valid_page = NULL;              /* [n_runs] / [n_valid] each run's page size */
    int *valid_page_score = NULL;                              /* [n_valid] the asked page score rule (one for all) */
    char (*codec_options)[96 + KVS_CODEC_SPEC_MAX] = NULL;
    kvs_trace *tr = NULL;
    kvs_results_db *db = NULL;
    kvs_replay_result *res = NULL;
    kvs_replay_config *runs = NULL, *valid = NULL;
    char (*reasons)[512] = NULL;
    char (*notes)[KVS_POLICY_CANON_MAX] = NULL;
    int64_t *run_ids = NULL;
    int *valid_of = NULL;
    int64_t *budgets = NULL;
    double *fractions = NULL;
    int n_budgets = 0, n_runs = 0, n_valid = 0, n_invalid = 0;
    kvs_status st = kvs_trace_open(trace_path, &tr);
    if (st != KVS_OK) {
        rc = kvs_cli_fail("replay", st == KVS_ERR_INVALID_ARG ? KVS_ERR_IO : st);
        goto cleanup;
    }
    const kvs_trace_info *info = kvs_trace_info_get(tr);
    st = kvs_replay_parse_budgets(budget_text, info->prompt_len, info->n_positions, &budgets, &fractions, &n_budgets);
    if (st != KVS_OK) {
        rc = kvs_cli_fail("replay", st);
        goto cleanup;
    }
    size_t max_runs = (size_t)n_specs * (size_t)n_codecs * (size_t)n_pages * (size_t)n_budgets;
    runs = calloc(max_runs, sizeof *runs);
    run_codec = calloc(max_runs, sizeof *run_codec);
    valid_codec = calloc(max_runs, sizeof *valid_codec);
    run_page = calloc(max_runs, sizeof *run_page);
    valid_page = calloc(max_runs, sizeof *valid_page);
    valid_page_score = calloc(max_runs, sizeof *valid_page_score);
    if (!runs || !run_codec || !valid_codec || !run_page || !valid_page || !valid_page_score) {
        rc = kvs_cli_fail("replay", kvs_fail(KVS_ERR_NOMEM, "out of memory"));
        goto cleanup;
    }
    /* Identical (policy configuration, budget) pairs run once: the same numbers twice would only look like
     * two independent measurements. A repeated budget (also "10%" resolving to a budget given in tokens) and
     * a repeated policy configuration (also spelt differently: "snapkv" and "snapkv:window=32") each get one
     * warning, however often they were given. */
    n_budgets = dedup_budgets(budget_text, budgets, fractions, n_budgets);
    n_specs = dedup_specs(cfgs, n_specs);
    for (int i = 0; i < n_specs; i++)
        for (int k = 0; k < n_codecs; k++)
            for (int pk = 0; pk < n_pages; pk++)
                for (int b = 0; b < n_budgets; b++) {
                    run_codec[n_runs] = codecs[k];
                    run_page[n_runs] = page_sizes[pk];
                    runs[n_runs++] = (kvs_replay_config){.policy = cfgs[i], .budget = budgets[b],
                                                         .budget_fraction = fractions[b]};
                }
    kvs_replay_source src;
    if ((st = kvs_replay_source_from_trace(tr, &src)) != KVS_OK) {
        rc = kvs_cli_fail("replay", st);
        goto cleanup;
    }
    if (kv_bytes) src.model.kv_bytes = (int32_t)kv_bytes;
    if (aux_bytes) src.model.aux_bytes = (int32_t)aux_bytes;
    kvs_replay_opts opts = {.configs = runs, .n_configs = n_runs, .threads = (int)threads, .measure = measure,
                            .series_every = series_every, .hooks = NULL};
    /* Trace-level problems (nothing to measure, malformed turns) stop everything before the database is
     * touched; a (policy, budget) pair the policy rejects only fails its own run. */
    valid = calloc((size_t)n_runs, sizeof *valid);
    valid_of = calloc((size_t)n_runs, sizeof *valid_of);
    reasons = calloc((size_t)n_runs, sizeof *reasons);
    if (!valid || !valid_of || !reasons) {
        rc = kvs_cli_fail("replay", kvs_fail(KVS_ERR_NOMEM, "out of memory"));
        goto cleanup;
    }
    for (int i = 0; i < n_runs; i++) {
        kvs_replay_opts one = opts;
        one.configs = &runs[i];
        one.n_configs = 1;
        one.codecs = &run_codec[i];
        one.pages = &run_page[i];
        if (run_page[i] > info->n_positions) {
            rc = page_error(kvs_fail(KVS_ERR_INVALID_ARG, "--page %lld: more than the trace's %lld positions",
                                     (long long)run_page[i], (long long)info->n_positions));
            goto cleanup;
        }
        st = kvs_replay_validate(&src, &one);
        if (st == KVS_OK) {
            valid_of[i] = n_valid;
            valid_codec[n_valid] = run_codec[i];
            valid_page[n_valid] = run_page[i];
            valid_page_score[n_valid] = page_score;
            valid[n_valid++] = runs[i];
            continue;
        }
        if (st != KVS_ERR_INVALID_ARG || !kvs_policy_find(runs[i].policy.ops->name) ||
            kvs_policy_validate(&runs[i].policy, &src.model, runs[i].budget) == KVS_OK) {
            /* not the policy's objection: the trace or the options are at fault, for every run */
            rc = kvs_cli_fail("replay", st == KVS_ERR_INVALID_ARG ? KVS_ERR_FORMAT : st);
            if (st == KVS_ERR_INVALID_ARG) rc = KVS_EXIT_FAIL;
            goto cleanup;
        }
        valid_of[i] = -1;
        snprintf(reasons[i], sizeof reasons[i], "invalid configuration: %s", kvs_last_error());
        n_invalid++;
    }
    /* Degenerate configurations run, with a warning: one line per (configuration, note) listing the budgets
     * it concerns, and the note in the run's `notes` column. */
    notes = calloc((size_t)n_runs, sizeof *notes);
    if (!notes) {
        rc = kvs_cli_fail("replay", kvs_fail(KVS_ERR_NOMEM, "out of memory"));
        goto cleanup;
    }
    for (int i = 0; i < n_runs; i++)
        if (valid_of[i] >= 0) kvs_policy_notes(&runs[i].policy, &src.model, runs[i].budget, notes[i], sizeof notes[i]);
    for (int i = 0; i < n_runs; i++) {
        if (!notes[i][0]) continue;
        int first = 1;
        for (int j = 0; j < i && first; j++)
            first = !(same_config(&runs[j].policy, &runs[i].policy) && !strcmp(notes[j], notes[i]));
        if (!first) continue;
        char list[256] = "";
        int n_at = 0;
        size_t len = 0;
        for (int j = i; j < n_runs; j++)
            if (same_config(&runs[j].policy, &runs[i].policy) && !strcmp(notes[j], notes[i]) && len < sizeof list) {
                len += (size_t)snprintf(list + len, sizeof list - len, "%s%lld", n_at ? "," : "", (long long)runs[j].budget);
                n_at++;
            }
        fprintf(stderr, "kvsim replay: warning: %s%s%s at budget%s %s: %s\n", runs[i].policy.ops->name,
                runs[i].policy.canonical[0] ? ":" : "", runs[i].policy.canonical, n_at > 1 ? "s" : "", list, notes[i]);
    }
    /* One rule for pairs a policy refuses (its budget below a window, say), whether some or all of them: each is
     * recorded as a failed run with its reason and the exit status is 1. A command-line error (unknown policy,
     * malformed budget) is a usage error before this point, with nothing recorded. */
    /* The database is created only once there is something to record: a replay that fails on its input
     * leaves no empty database (nor -wal/-shm) behind. An existing file is checked now, read-only, so a
     * foreign or newer database is refused before the (possibly long) replay. */
    if (access(db_path, F_OK) == 0) {
        kvs_results_db *probe = NULL;
        /* an empty database (KVS_ERR_END: a replay killed before its schema committed) is initialised below */
        if ((st = kvs_results_open_readonly(db_path, &probe)) != KVS_OK && st != KVS_ERR_END) {
            rc = kvs_cli_fail("replay", st == KVS_ERR_INVALID_ARG ? KVS_ERR_DB : st);
            goto cleanup;
        }
        kvs_results_close(probe);
    }
    replay_progress prog = {.start = kvs_now_s()};
    opts.configs = valid;
    opts.n_configs = n_valid;
    opts.codecs = valid_codec;
    opts.pages = valid_page;
    opts.page_scores = valid_page_score;
    opts.progress = (progress == 1 || (progress < 0 && isatty(STDERR_FILENO))) ? show_progress : NULL;
    opts.progress_user = &prog;
    opts.cancel = &stop_requested;
    install_stop_handlers();
    kvs_status exec_st = KVS_OK;
    char exec_err[512] = "";
    if (n_valid > 0) {
        exec_st = reference ? kvs_replay_reference(&src, &opts, &res) : kvs_replay_execute(&src, &opts, &res);
        if (prog.shown) fputc('\n', stderr);
        if (exec_st != KVS_OK && exec_st != KVS_ERR_INTERRUPTED) {
            rc = kvs_cli_fail("replay", exec_st == KVS_ERR_INVALID_ARG ? KVS_ERR_FORMAT : exec_st);
            goto cleanup;
        }
        if (exec_st == KVS_ERR_INTERRUPTED)
            snprintf(exec_err, sizeof exec_err, "interrupted by signal after %.1f s (%s)", kvs_now_s() - prog.start,
                     kvs_last_error());
    }
    if ((st = kvs_results_open(db_path, &db)) != KVS_OK) {
        rc = kvs_cli_fail("replay", st == KVS_ERR_INVALID_ARG ? KVS_ERR_DB : st);
        goto cleanup;
    }
    /* plots mark turn boundaries and break lines at unmeasured prompt spans (the row carries the turns) */
    kvs_results_trace rt = kvs_results_trace_of(trace_path, info);
    /* the trace's content hash beside its row: runs of one trace through any path spelling are one trace's runs
     * (kvsim merge, sweep resumption) */
    int64_t trace_row = 0;
    if ((st = kvs_results_sweep_trace(db, &rt, src.content_hash, &trace_row)) != KVS_OK) {
        rc = kvs_cli_fail("replay", st);
        goto cleanup;
    }
    int n_failed = 0;
    run_ids = calloc((size_t)n_runs, sizeof *run_ids);
    if (!run_ids) {
        rc = kvs_cli_fail("replay", kvs_fail(KVS_ERR_NOMEM, "out of memory"));
        goto cleanup;
    }
    /* the options that change a run's numbers beyond its policy, budget and measure: part of its identity */
    char run_options[96];
    snprintf(run_options, sizeof run_options, "kv_bytes=%d,aux_bytes=%d,series_every=%lld", (int)src.model.kv_bytes,
             (int)src.model.aux_bytes, (long long)series_every);
    /* with a codec, its spec ends the options (the last key: its value has commas), so that kvsim merge and sweep
     * resumption tell its runs apart; a run without one keeps the options of before */
    codec_options = calloc((size_t)n_codecs, sizeof *codec_options);
    if (!codec_options) {
        rc = kvs_cli_fail("replay", kvs_fail(KVS_ERR_NOMEM, "out of memory"));
        goto cleanup;
    }
    for (int k = 0; k < n_codecs; k++)
        snprintf(codec_options[k], sizeof codec_options[k], "%s%s%s", run_options, codecs[k] ? ",codec=" : "",
                 codecs[k] ? kvs_codec_spec(codecs[k]) : "");
    /* A signal that arrives once the engine has finished stops the writing: the runs already stored stay
     * complete (their numbers are whole), every run not yet stored is recorded as failed (interrupted). */
    int n_stored_before_stop = -1;
    for (int i = 0; i < n_runs; i++) {
        if (stop_requested && !exec_err[0]) {
            n_stored_before_stop = i;
            snprintf(exec_err, sizeof exec_err, "interrupted by signal while storing the results (after %d of %d runs)",
                     i, n_runs);
        }
        const kvs_replay_config *c = &runs[i];
        const kvs_replay_run_result *r = valid_of[i] >= 0 && res ? &res->runs[valid_of[i]] : NULL;
        const kvs_codec *codec = run_codec[i];
        int ck = 0;
        while (ck + 1 < n_codecs && codecs[ck] != codec) ck++;
        /* a paged run's options end with its page size and the page score rule it followed (after a codec's spec,
         * whose commas separate none of its words from these keys) */
        char run_opts[sizeof codec_options[0] + 64];
        if (run_page[i] > 0)
            snprintf(run_opts, sizeof run_opts, "%s,page=%lld,page_score=%s", codec_options[ck],
                     (long long)run_page[i],
                     kvs_host_page_score_name(kvs_host_page_rule(c->policy.ops, (kvs_page_score)page_score)));
        else
            snprintf(run_opts, sizeof run_opts, "%s", codec_options[ck]);
        const char *error = valid_of[i] < 0 ? reasons[i] : exec_err[0] ? exec_err : r && r->status != KVS_OK ? r->error : NULL;
        int ok = error == NULL;
        kvs_results_run run = {
            .policy = c->policy.ops->name, .params = c->policy.canonical, .budget_tokens = c->budget,
            .budget_fraction = c->budget_fraction, .is_oracle = c->policy.ops->is_oracle,
            .measure = measure == KVS_MEASURE_ALL ? "all" : measure == KVS_MEASURE_PREFILL ? "prefill" : "decode",
            .budget_scope = c->policy.ops->budget_scope == KVS_BUDGET_PROMPT  ? "prompt"
                            : c->policy.ops->budget_scope == KVS_BUDGET_NONE ? "none"
                                                                             : "every_step",
            .layout = kvs_policy_layout(&c->policy) == KVS_SEL_PER_QUERY_HEAD ? "per_query_head" : "per_kv_head",
            .notes = notes[i][0] ? notes[i] : NULL, .status = ok ? "complete" : "failed", .error = error,
            .wall_seconds = r ? r->wall_seconds : 0, .kvsim_version = KVSIM_VERSION_STRING, .options = run_opts,
            .codec = codec ? kvs_codec_spec(codec) : NULL, .page = run_page[i],
        };
        st = kvs_results_write_run(db, &rt, &run, ok ? r->layer_aggs : NULL, ok ? r->n_layers : 0, ok ? &r->run_agg : NULL,
                                   ok ? r->steps : NULL, ok ? r->n_steps : 0, &run_ids[i]);
        if (st != KVS_OK) {
            rc = kvs_cli_fail("replay", st);
            goto cleanup;
        }
        if (!ok) {
            n_failed++;
            if (!exec_err[0] || valid_of[i] < 0)
                fprintf(stderr, "kvsim replay: run %s%s%s%s%s budget %lld failed: %s\n", c->policy.ops->name,
                        c->policy.canonical[0] ? ":" : "", c->policy.canonical, codec ? " codec " : "",
                        codec ? kvs_codec_spec(codec) : "", (long long)c->budget, error);
        }
    }
    /* The summary is what the database now holds, in the one table layout of `kvsim runs`. */
    if ((st = print_written_runs(db, run_ids, n_runs)) != KVS_OK) {
        rc = kvs_cli_fail("replay", st);
        goto cleanup;
    }
    if (n_stored_before_stop >= 0)
        fprintf(stderr, "kvsim replay: %s: %d runs stored complete, the other %d recorded as failed (interrupted) in %s\n",
                exec_err, n_stored_before_stop, n_runs - n_stored_before_stop, db_path);
    else if (exec_err[0])
        fprintf(stderr, "kvsim replay: %s: the %d runs were recorded as failed (interrupted) in %s\n", exec_err,
                n_valid, db_path);
    else if (stop_requested)
        fprintf(stderr, "kvsim replay: interrupted by signal after every run was stored (complete) in %s\n", db_path);
    if (!exec_err[0] && n_failed)
        fprintf(stderr, "kvsim replay: %d of %d runs failed (recorded with their reason in %s)\n", n_failed, n_runs,
                db_path);
    rc = n_failed || stop_requested ? KVS_EXIT_FAIL : KVS_EXIT_OK;
    if (kvs_cli_finish_stdout("replay") != KVS_EXIT_OK) rc = KVS_EXIT_FAIL;
cleanup:
    for (int k = 0; k < n_codecs; k++) kvs_codec_free(codecs[k]);
    free(codec_options);
    kvs_results_policy_inputs_free(inputs);
    kvs_replay_result_free(res);
    kvs_results_close(db);
    kvs_trace_close(tr);
    free(runs);
    free((void *)run_codec);
    free((void *)valid_codec);
    free(run_page);
    free(valid_page);
    free(valid_page_score);
    free(valid);
    free(valid_of);
    free(reasons);
    free(notes);
    free(run_ids);
    free(budgets);
    free(fractions);
    return rc;
}
