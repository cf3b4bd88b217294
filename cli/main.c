/* main.c — the kvsim program: dispatches `kvsim CMD ...` to the subcommand table, prints `kvsim help`,
 * and turns unknown commands into a clear error with exit status 2 (see cli.h for exit codes).
 */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "../sim/codec.h"
#include "../trace/trace.h"

#define KVSIM_VERSION "0.1.0"

static int cmd_help(int argc, char **argv);
static int cmd_version(int argc, char **argv);

/* The subcommands, in the order `kvsim help` lists them. */
static const kvs_cli_command commands[] = {
    {"capture", "decode a real model on the CPU and record its attention as a trace", kvs_cmd_capture},
    {"chat-template", "render messages with a model's own chat template (tokenizer_config.json): text or token ids",
     kvs_cmd_chat_template},
    {"info", "print a trace's model config, positions, turns and compression ratio", kvs_cmd_info},
    {"verify", "check every checksum and recompute attention against the stored outputs", kvs_cmd_verify},
    {"export", "write one layer's q/k/v/o/lse or the token ids of a trace as a NumPy .npy file", kvs_cmd_export},
    {"trace", "trace maintenance: `kvsim trace recover IN OUT` restores a killed capture", kvs_cmd_trace},
    {"replay", "replay a trace under policy/budget sweeps and store the metrics in a results database", kvs_cmd_replay},
    {"sweep", "run a study (traces x policies x budgets) as resumable tasks, one, a range, or all; MPI with make mpi",
     kvs_cmd_sweep},
    {"merge", "combine the shard databases of a sweep into one, de-duplicating runs by identity (atomic)",
     kvs_cmd_merge},
    {"runs", "list the runs of a results database: one row per run (--csv: one row per run and layer; --json)",
     kvs_cmd_runs},
    {"plot", "draw error vs budget, measured memory or traffic (Pareto frontier), or vs position (gnuplot)",
     kvs_cmd_plot},
    {"compare", "compare policies at equal measured memory, traffic or tokens (interpolated between runs)",
     kvs_cmd_compare},
    {"report", "write the study report of a results database: one self-contained HTML page and Markdown",
     kvs_cmd_report},
    {"policies", "list every replay policy with its parameters, defaults and ranges (--json for scripts)",
     kvs_cmd_policies},
    {"keys", "key geometry against attention per head: KeyDiff's premises (K3, K12) and retained-key diversity (K11)",
     kvs_cmd_keys},
    {"attn", "attention per layer and head: D2O's density diagnostic (column-sum variance) and RocketKV's top-k union",
     kvs_cmd_attn},
    {"drift", "attention drift (prefill vs decode top-k), top-k mass and temporal locality per head (SyncKV S1-S3)",
     kvs_cmd_drift},
    {"heads", "head-to-head top-k similarity within and across layers, K-means clusters of units for SyncKV, stability",
     kvs_cmd_heads},
    {"generate", "closed-loop decoding with a policy active in the CPU forward pass beside the full model: KL, "
     "top-1, perplexity, divergence", kvs_cmd_generate},
    {"calibrate", "rank correlation of offline replay metrics with closed-loop effects (bootstrap intervals, plot)",
     kvs_cmd_calibrate},
    {"interval", "the mean of per-trace numbers on standard input with its bootstrap interval (--paired: a paired "
                 "difference, resolved or not)", kvs_cmd_interval},
    {"plan", "capacity planning: KV per token, max batch and context beside the weights, with nominal budgets or a "
             "measured profile", kvs_cmd_plan},
    {"tokenize", "the token ids of a text or a corpus under a tokenizer.json, with load time and encode speed",
     kvs_cmd_tokenize},
    {"help", "list the commands, or `kvsim help CMD` for one command's options", cmd_help},
    {"version", "print the kvsim version", cmd_version},
};
#define N_COMMANDS (sizeof commands / sizeof commands[0])

static const kvs_cli_command *find_command(const char *name) {
    for (size_t i = 0; i < N_COMMANDS; i++)
        if (!strcmp(commands[i].name, name)) return &commands[i];
    return NULL;
}

static void print_overview(FILE *f) {
    fprintf(f, "kvsim %s — trace-driven KV-cache simulator and analyzer\n\n", KVSIM_VERSION);
    fprintf(f, "usage: kvsim COMMAND [options]   (kvsim COMMAND --help for a command's options)\n\ncommands:\n");
    for (size_t i = 0; i < N_COMMANDS; i++) fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
}

static int cmd_help(int argc, char **argv) {
    if (argc >= 2 && !kvs_cli_is_help(argv[1])) {
        const kvs_cli_command *c = find_command(argv[1]);
        if (!c) return kvs_cli_usage_error("help", "unknown command '%s'", argv[1]);
        if (c->run == cmd_help) {
            print_overview(stdout);
            return KVS_EXIT_OK;
        }
        char *sub[] = {argv[1], "--help", NULL};
        return c->run(2, sub);
    }
    print_overview(stdout);
    return KVS_EXIT_OK;
}

static int cmd_version(int argc, char **argv) {
    if (argc > 1 && !kvs_cli_is_help(argv[1])) return kvs_cli_usage_error("version", "unexpected argument '%s'", argv[1]);
    printf("kvsim %s\n", KVSIM_VERSION);
    return KVS_EXIT_OK;
}

int kvs_cli_is_help(const char *arg) { return !strcmp(arg, "-h") || !strcmp(arg, "--help"); }

int kvs_cli_fail(const char *cmd, kvs_status s) {
    const char *detail = kvs_last_error();
    if (detail[0]) fprintf(stderr, "kvsim %s: %s\n", cmd, detail);
    else fprintf(stderr, "kvsim %s: %s\n", cmd, kvs_strerror(s));
    return s == KVS_ERR_INVALID_ARG ? KVS_EXIT_USAGE : KVS_EXIT_FAIL;
}

int kvs_cli_usage_error(const char *cmd, const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "kvsim %s: ", cmd);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n(see 'kvsim %s --help')\n", cmd);
    return KVS_EXIT_USAGE;
}

kvs_status kvs_cli_parse_long(const char *opt, const char *val, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(val, &end, 10);
    if (!val[0] || end == val || *end || (errno && errno != ERANGE))
        return kvs_fail(KVS_ERR_INVALID_ARG, "%s: '%s' is not an integer", opt, val);
    if (errno == ERANGE || v < lo || v > hi) /* the user's text, never strtol's clamped LONG_MAX */
        return kvs_fail(KVS_ERR_INVALID_ARG, "%s: '%s' is out of range [%ld, %ld]", opt, val, lo, hi);
    *out = v;
    return KVS_OK;
}

kvs_status kvs_cli_parse_double(const char *opt, const char *val, double lo, double hi, double *out) {
    char *end;
    double v = strtod(val, &end);
    if (!val[0] || end == val || *end || isnan(v))
        return kvs_fail(KVS_ERR_INVALID_ARG, "%s: '%s' is not a number", opt, val);
    /* out of range: "inf", an overflow such as 1e999 (an underflow reads as 0), or outside [lo, hi]; the
     * message echoes the user's text and prints the bounds exactly ("1048576", never "1.04858e+06") */
    if (isinf(v) || v < lo || v > hi) {
        char l[40], h[40];
        kvs_cli_fmt_real(l, sizeof l, lo);
        kvs_cli_fmt_real(h, sizeof h, hi);
        return kvs_fail(KVS_ERR_INVALID_ARG, "%s: '%s' is out of range [%s, %s]", opt, val, l, h);
    }
    *out = v;
    return KVS_OK;
}

int kvs_cli_once(const char *cmd, const char *opt, int *seen) {
    if (*seen) return kvs_cli_usage_error(cmd, "%s given twice", opt);
    *seen = 1;
    return 0;
}

kvs_status kvs_cli_parse_codecs(const char *cmd, const char *const *specs, int n_specs, kvs_codec **codecs,
                                int *n_codecs) {
    codecs[0] = NULL;
    *n_codecs = 1;
    if (n_specs < 1) return KVS_OK;
    int n = 0;
    for (int i = 0; i < n_specs; i++) {
        kvs_codec *c = NULL;
        if (strcmp(specs[i], "none") && kvs_codec_parse(specs[i], &c) != KVS_OK) {
            for (int j = 0; j < n; j++) kvs_codec_free(codecs[j]);
            *n_codecs = 0;
            return KVS_ERR_INVALID_ARG;
        }
        int dup = 0; /* the same codec spelt twice runs once */
        for (int j = 0; j < n && !dup; j++)
            dup = (!c && !codecs[j]) || (c && codecs[j] && !strcmp(kvs_codec_spec(c), kvs_codec_spec(codecs[j])));
        if (dup) {
            fprintf(stderr, "kvsim %s: warning: --codec %s given more than once: run once\n", cmd,
                    c ? kvs_codec_spec(c) : "none");
            kvs_codec_free(c);
            continue;
        }
        codecs[n++] = c;
    }
    *n_codecs = n;
    return KVS_OK;
}

int kvs_cli_single_value(const char *cmd, const char *opt, int argc, char **argv, int *i, int *missing,
                         const char **slot) {
    const char *v = kvs_cli_opt_value(opt, argc, argv, i, missing);
    if (!v) return 0;
    if (*slot) {
        kvs_cli_usage_error(cmd, "%s given twice", opt);
        return -1;
    }
    *slot = v;
    return 1;
}

const char *kvs_cli_opt_value(const char *opt, int argc, char **argv, int *i, int *missing) {
    size_t n = strlen(opt);
    if (strncmp(argv[*i], opt, n) != 0) return NULL;
    if (argv[*i][n] == '=') return argv[*i] + n + 1;
    if (argv[*i][n] != '\0') return NULL;
    if (*i + 1 >= argc) {
        *missing = 1;
        return NULL;
    }
    return argv[++*i];
}

/* ---- run filters ---- */

/* The content hash of the trace file at `path` when it is one (a command's one --trace filter: a static buffer),
 * so runs of that file through any path spelling match; NULL when it is not a readable trace (a path recorded on
 * another machine still matches by its spelling). */
static const char *trace_content_of(const char *path) {
    static char sha[65];
    kvs_trace *t = NULL;
    if (kvs_trace_open(path, &t) != KVS_OK) return NULL;
    kvs_status st = kvs_trace_content_sha256(t, sha);
    kvs_trace_close(t);
    return st == KVS_OK ? sha : NULL;
}

int kvs_cli_filter_option(const char *cmd, int argc, char **argv, int *i, unsigned accept, kvs_results_filter *f) {
    static const struct {
        unsigned bit;
        const char *opt;
    } opts[] = {{KVS_CLI_FILTER_POLICY, "--policy"}, {KVS_CLI_FILTER_BUDGET, "--budget"},
                {KVS_CLI_FILTER_TRACE, "--trace"},   {KVS_CLI_FILTER_MODEL, "--model"},
                {KVS_CLI_FILTER_MEASURE, "--measure"}, {KVS_CLI_FILTER_RUN, "--run"}};
    for (size_t k = 0; k < sizeof opts / sizeof opts[0]; k++) {
        if (!(accept & opts[k].bit)) continue;
        int missing = 0;
        const char *v = kvs_cli_opt_value(opts[k].opt, argc, argv, i, &missing);
        if (missing) {
            kvs_cli_usage_error(cmd, "option %s needs a value", opts[k].opt);
            return -1;
        }
        if (!v) continue;
        /* The one rule for single-valued options: a filter given twice is a usage error, never "the last wins"
         * (a value already set in *f is a filter given before). */
        int given = 0;
        switch (opts[k].bit) {
        case KVS_CLI_FILTER_POLICY: given = f->policy != NULL; break;
        case KVS_CLI_FILTER_TRACE: given = f->trace_path != NULL; break;
        case KVS_CLI_FILTER_MODEL: given = f->model != NULL; break;
        case KVS_CLI_FILTER_MEASURE: given = f->measure != NULL; break;
        case KVS_CLI_FILTER_BUDGET: given = f->budget_tokens > 0; break;
        case KVS_CLI_FILTER_RUN: given = f->run_id > 0; break;
        default: break;
        }
        if (given) {
            kvs_cli_usage_error(cmd, "%s given twice", opts[k].opt);
            return -1;
        }
        long num;
        switch (opts[k].bit) {
        case KVS_CLI_FILTER_POLICY: f->policy = v; break;
        case KVS_CLI_FILTER_TRACE:
            f->trace_path = v;
            f->trace_sha256 = trace_content_of(v);
            break;
        case KVS_CLI_FILTER_MODEL: f->model = v; break;
        case KVS_CLI_FILTER_MEASURE:
            if (strcmp(v, "decode") && strcmp(v, "prefill") && strcmp(v, "all")) {
                kvs_cli_usage_error(cmd, "--measure: '%s' is not decode, prefill or all", v);
                return -1;
            }
            f->measure = v;
            break;
        case KVS_CLI_FILTER_BUDGET:
        case KVS_CLI_FILTER_RUN:
            if (kvs_cli_parse_long(opts[k].opt, v, 1, LONG_MAX, &num) != KVS_OK) {
                kvs_cli_fail(cmd, KVS_ERR_INVALID_ARG);
                return -1;
            }
            if (opts[k].bit == KVS_CLI_FILTER_RUN) f->run_id = num;
            else f->budget_tokens = num;
            break;
        default: break;
        }
        return 1;
    }
    return 0;
}

void kvs_cli_filter_usage(FILE *out, unsigned accept) {
    if (accept & KVS_CLI_FILTER_POLICY) fprintf(out, "  --policy NAME     only runs of this policy\n");
    if (accept & KVS_CLI_FILTER_BUDGET) fprintf(out, "  --budget TOKENS   only runs with this budget (tokens per KV head)\n");
    if (accept & KVS_CLI_FILTER_TRACE)
        fprintf(out, "  --trace PATH      only runs of this trace (the path given to replay, or its trailing part)\n");
    if (accept & KVS_CLI_FILTER_MODEL) fprintf(out, "  --model NAME      only runs of traces of this model\n");
    if (accept & KVS_CLI_FILTER_MEASURE)
        fprintf(out, "  --measure M       only runs measured at decode, prefill or all positions\n");
    if (accept & KVS_CLI_FILTER_RUN) fprintf(out, "  --run ID          only this run\n");
}

kvs_status kvs_cli_parse_size(const char *opt, const char *val, double *out) {
    char *end;
    errno = 0;
    double v = strtod(val, &end);
    if (!val[0] || end == val || errno || !isfinite(v))
        return kvs_fail(KVS_ERR_INVALID_ARG, "%s: '%s' is not a number (e.g. 12K, 3.5MiB, 1e6)", opt, val);
    static const char prefixes[] = "kmgt";
    double mult = 1;
    const char *p = end;
    const char *at = *p ? strchr(prefixes, tolower((unsigned char)*p)) : NULL;
    if (at) {
        int binary = p[1] == 'i' || p[1] == 'I';
        for (long k = 0; k <= at - prefixes; k++) mult *= binary ? 1024.0 : 1000.0;
        p += binary ? 2 : 1;
    }
    if (*p == 'b' || *p == 'B') p++;
    if (*p)
        return kvs_fail(KVS_ERR_INVALID_ARG, "%s: '%s' has an unknown suffix '%s' (use K M G T, Ki Mi Gi Ti, "
                                             "optionally followed by B)",
                        opt, val, end);
    v *= mult;
    if (!(v > 0) || !isfinite(v)) return kvs_fail(KVS_ERR_INVALID_ARG, "%s: '%s' must be positive", opt, val);
    *out = v;
    return KVS_OK;
}

/* ---- output helpers ---- */

void kvs_cli_fmt_real(char *buf, size_t cap, double v) {
    if (isnan(v)) {
        snprintf(buf, cap, "%s", "");
        return;
    }
    kvs_format_real(buf, cap, v);
}

void kvs_cli_fmt_bytes(char *buf, size_t cap, double v) { kvs_format_bytes(buf, cap, v); }

void kvs_cli_csv_field(FILE *out, const char *s) {
    if (!s) return;
    if (!strpbrk(s, ",\"\r\n")) {
        fputs(s, out);
        return;
    }
    fputc('"', out);
    for (; *s; s++) {
        if (*s == '"') fputc('"', out);
        fputc(*s, out);
    }
    fputc('"', out);
}

void kvs_cli_json_string(FILE *out, const char *s) {
    if (!s) {
        fputs("null", out);
        return;
    }
    fputc('"', out);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        switch (*p) {
        case '"': fputs("\\\"", out); break;
        case '\\': fputs("\\\\", out); break;
        case '\n': fputs("\\n", out); break;
        case '\r': fputs("\\r", out); break;
        case '\t': fputs("\\t", out); break;
        default:
            if (*p < 0x20) fprintf(out, "\\u%04x", *p);
            else fputc(*p, out);
        }
    }
    fputc('"', out);
}

void kvs_cli_json_number(FILE *out, double v) {
    char buf[64];
    if (!isfinite(v)) {
        fputs("null", out);
        return;
    }
    kvs_cli_fmt_real(buf, sizeof buf, v);
    fputs(buf, out);
}

int kvs_cli_finish_stdout(const char *cmd) {
    errno = 0;
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "kvsim %s: writing the output failed: %s\n", cmd, errno ? strerror(errno) : "I/O error");
        return KVS_EXIT_FAIL;
    }
    return KVS_EXIT_OK;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        print_overview(stderr);
        return KVS_EXIT_USAGE;
    }
    if (kvs_cli_is_help(argv[1])) {
        print_overview(stdout);
        return KVS_EXIT_OK;
    }
    if (!strcmp(argv[1], "--version")) return cmd_version(1, argv + 1);
    const kvs_cli_command *c = find_command(argv[1]);
    if (!c) {
        fprintf(stderr, "kvsim: unknown command '%s' (run 'kvsim help' for the list)\n", argv[1]);
        return KVS_EXIT_USAGE;
    }
    kvs_clear_error();
    return c->run(argc - 1, argv + 1);
}
