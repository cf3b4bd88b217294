/* cmd_keys.c — `kvsim keys TRACE`: key geometry against attention per (layer, KV head), the premises of
 * KeyDiff measured on a real trace (analysis/keys.h; POLICY_SPEC §5.5 K3, K11, K12): Spearman correlation
 * of a key's mean cosine similarity with the attention it receives, cos(mean key, mean query), key norm
 * spread, where the most distinctive key ranks; with --policy, the log-determinant of the unit keys each
 * policy retains after compressing the first prompt.
 */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../analysis/keys.h"
#include "../sim/policy.h"
#include "../policies/registry.h"
#include "../trace/trace.h"
#include "cli.h"
#include "results/results_heads.h"

#define MAX_POLICIES 16

static void usage(FILE *f) {
    fprintf(f,
            "usage: kvsim keys TRACE [--scope all|prompt] [--layer L] [--csv | --json]\n"
            "                  [--policy SPEC ... --budget TOKENS [--eps E]]\n"
            "Key geometry against attention, per (layer, KV head) of TRACE (KeyDiff's premises; POLICY_SPEC 5.5):\n"
            "  rho_sum    K3: Spearman correlation between a key's mean cosine similarity to the other keys and\n"
            "             the attention it receives, summed over every later query (itself included), mean over\n"
            "             the group's query heads; negative = less similar keys get more attention\n"
            "  rho_perq   the same with the attention per query that saw the key (the sum / their number):\n"
            "             early keys are seen by more queries, which alone can make rho_sum negative\n"
            "  cos_kq     K12: cos(mean key, mean query) (the paper: negative in every head)\n"
            "  cos_k_mk   K12: mean cos(key, mean key) (near 1: keys nearly collinear with their mean)\n"
            "  norm_cv    K12: standard deviation / mean of the key norms\n"
            "  distinct   K12: share of keys receiving less attention than the key least similar to the mean\n"
            "             key (1 = it receives the most)\n"
            "A summary line gives the median of every column and how many heads have rho < 0.\n"
            "  --scope S    all (default): every position of the trace; prompt: the first turn's prompt only\n"
            "  --layer L    one layer (default: all)\n"
            "  --policy SPEC --budget B   K11: replay each policy at budget B and, after it compressed the first\n"
            "             prompt, the log-determinant of its retained unit keys' Gram matrix per head,\n"
            "             logdet(K^T K + eps I_d) (equal to the paper's logdet(K K^T + eps I_m) minus\n"
            "             (m - d) log eps, so policies keeping the same m compare alike); repeatable --policy;\n"
            "             prints the mean over heads, m, and per policy the share of heads where it is the\n"
            "             largest\n"
            "  --eps E      the ridge of the log-determinant (default 1e-6)\n"
            "  --csv        one row per (layer, KV head): layer,kv_head,n_keys,rho_sum,rho_perq,cos_kq,cos_k_mk,\n"
            "             norm_cv,distinct, then logdet_<i>,m_<i> per --policy i\n"
            "  --json       {\"heads\": [...], \"policies\": [...]}\n"
            "Cost: exact full attention of every position, O(n^2 * heads * head_dim).\n");
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median of the non-NaN values of a strided column. */
static double median_of(const kvs_key_stats *st, size_t n, size_t offset) {
    double *v = malloc((n ? n : 1) * sizeof *v);
    size_t m = 0;
    if (!v) return NAN;
    for (size_t i = 0; i < n; i++) {
        double x = *(const double *)((const char *)&st[i] + offset);
        if (!isnan(x)) v[m++] = x;
    }
    qsort(v, m, sizeof *v, cmp_double);
    double r = m == 0 ? NAN : m % 2 ? v[m / 2] : 0.5 * (v[m / 2 - 1] + v[m / 2]);
    free(v);
    return r;
}

static void put_real(FILE *o, double v, int json) {
    char buf[64];
    if (json) {
        kvs_cli_json_number(o, v);
        return;
    }
    kvs_cli_fmt_real(buf, sizeof buf, v);
    fputs(buf, o);
}

int kvs_cmd_keys(int argc, char **argv) {
    const char *path = NULL;
    const char *specs[MAX_POLICIES];
    int n_specs = 0, csv = 0, json = 0, seen_scope = 0, seen_layer = 0, seen_budget = 0, seen_eps = 0;
    long layer = -1, budget = 0;
    double eps = 1e-6;
    kvs_keys_scope scope = KVS_KEYS_ALL;
    for (int i = 1; i < argc; i++) {
        int missing = 0;
        const char *v;
        if (kvs_cli_is_help(argv[i])) {
            usage(stdout);
            return KVS_EXIT_OK;
        } else if ((v = kvs_cli_opt_value("--scope", argc, argv, &i, &missing))) {
            if (kvs_cli_once("keys", "--scope", &seen_scope)) return KVS_EXIT_USAGE;
            if (!strcmp(v, "all")) scope = KVS_KEYS_ALL;
            else if (!strcmp(v, "prompt")) scope = KVS_KEYS_PROMPT;
            else return kvs_cli_usage_error("keys", "--scope: '%s' is not all or prompt", v);
        } else if ((v = kvs_cli_opt_value("--layer", argc, argv, &i, &missing))) {
            if (kvs_cli_once("keys", "--layer", &seen_layer)) return KVS_EXIT_USAGE;
            if (kvs_cli_parse_long("--layer", v, 0, 1 << 20, &layer) != KVS_OK) return kvs_cli_fail("keys", KVS_ERR_INVALID_ARG);
        } else if ((v = kvs_cli_opt_value("--budget", argc, argv, &i, &missing))) {
            if (kvs_cli_once("keys", "--budget", &seen_budget)) return KVS_EXIT_USAGE;
            if (kvs_cli_parse_long("--budget", v, 1, 1L << 40, &budget) != KVS_OK) return kvs_cli_fail("keys", KVS_ERR_INVALID_ARG);
        } else if ((v = kvs_cli_opt_value("--eps", argc, argv, &i, &missing))) {
            if (kvs_cli_once("keys", "--eps", &seen_eps)) return KVS_EXIT_USAGE;
            if (kvs_cli_parse_double("--eps", v, 1e-30, 1e3, &eps) != KVS_OK) return kvs_cli_fail("keys", KVS_ERR_INVALID_ARG);
        } else if ((v = kvs_cli_opt_value("--policy", argc, argv, &i, &missing))) {
            if (n_specs == MAX_POLICIES) return kvs_cli_usage_error("keys", "at most %d --policy options", MAX_POLICIES);
            specs[n_specs++] = v;
        } else if (missing) {
            return kvs_cli_usage_error("keys", "option %s needs a value", argv[i]);
        } else if (!strcmp(argv[i], "--csv")) {
            if (kvs_cli_once("keys", "--csv", &csv)) return KVS_EXIT_USAGE;
        } else if (!strcmp(argv[i], "--json")) {
            if (kvs_cli_once("keys", "--json", &json)) return KVS_EXIT_USAGE;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            return kvs_cli_usage_error("keys", "unknown option '%s'", argv[i]);
        } else if (!path) {
            path = argv[i];
        } else {
            return kvs_cli_usage_error("keys", "unexpected argument '%s'", argv[i]);
        }
    }
    if (!path) return kvs_cli_usage_error("keys", "missing TRACE");
    if (csv && json) return kvs_cli_usage_error("keys", "--csv and --json exclude each other");
    if (n_specs && !budget) return kvs_cli_usage_error("keys", "--policy needs --budget TOKENS");
    if (budget && !n_specs) return kvs_cli_usage_error("keys", "--budget goes with --policy");
    kvs_policy_config cfgs[MAX_POLICIES];
    for (int i = 0; i < n_specs; i++)
        if (kvs_policy_parse(specs[i], &cfgs[i]) != KVS_OK) return kvs_cli_fail("keys", KVS_ERR_INVALID_ARG);
    /* parameters naming a results database (SyncKV's clusters) are loaded here: policies never open one */
    void *inputs = NULL;
    kvs_status rst = kvs_results_resolve_policy_inputs(cfgs, n_specs, &inputs);
    if (rst != KVS_OK) return kvs_cli_fail("keys", rst);

    kvs_trace *t = NULL;
    kvs_key_stats *st = NULL;
    double *ld = NULL;
    int64_t *cnt = NULL;
    kvs_status s = kvs_trace_open(path, &t);
    if (s != KVS_OK) {
        kvs_results_policy_inputs_free(inputs);
        return kvs_cli_fail("keys", s == KVS_ERR_INVALID_ARG ? KVS_ERR_IO : s);
    }
    const kvs_trace_info *info = kvs_trace_info_get(t);
    const int L = info->model.n_layers, H = info->model.n_kv_heads;
    if (layer >= L) {
        s = kvs_fail(KVS_ERR_RANGE, "--layer %ld: the trace has layers 0..%d", layer, L - 1);
        goto cleanup;
    }
    if (budget > info->n_positions) {
        s = kvs_fail(KVS_ERR_INVALID_ARG, "--budget %ld is larger than the trace's %lld positions", budget,
                     (long long)info->n_positions);
        goto cleanup;
    }
    const int l0 = layer >= 0 ? (int)layer : 0, l1 = layer >= 0 ? (int)layer + 1 : L;
    const size_t n_heads = (size_t)(l1 - l0) * (size_t)H, all = (size_t)L * (size_t)H;
    st = calloc(n_heads, sizeof *st);
    ld = calloc((size_t)(n_specs ? n_specs : 1) * all, sizeof *ld);
    cnt = calloc((size_t)(n_specs ? n_specs : 1) * all, sizeof *cnt);
    if (!st || !ld || !cnt) {
        s = kvs_fail(KVS_ERR_NOMEM, "out of memory");
        goto cleanup;
    }
    for (int l = l0; l < l1; l++)
        for (int h = 0; h < H; h++)
            if ((s = kvs_analysis_key_stats(t, l, h, scope, &st[(size_t)(l - l0) * (size_t)H + (size_t)h])) != KVS_OK)
                goto cleanup;
    for (int i = 0; i < n_specs; i++) {
        if ((s = kvs_analysis_retained_logdet(t, &cfgs[i], budget, eps, ld + (size_t)i * all, cnt + (size_t)i * all)) !=
            KVS_OK) {
            s = kvs_fail(s, "--policy %s: %s", specs[i], kvs_last_error());
            goto cleanup;
        }
    }

    static const char *const cols[] = {"rho_sum", "rho_perq", "cos_kq", "cos_k_mk", "norm_cv", "distinct"};
    static const size_t offs[] = {offsetof(kvs_key_stats, spearman_sum),    offsetof(kvs_key_stats, spearman_per_query),
                                  offsetof(kvs_key_stats, cos_meank_meanq), offsetof(kvs_key_stats, mean_cos_to_meank),
                                  offsetof(kvs_key_stats, norm_cv),         offsetof(kvs_key_stats, distinct_key_pct)};
    enum { N_COLS = 6 };
    FILE *o = stdout;
    if (json) {
        fprintf(o, "{\"trace\":");
        kvs_cli_json_string(o, path);
        fprintf(o, ",\"scope\":\"%s\",\"heads\":[", scope == KVS_KEYS_PROMPT ? "prompt" : "all");
        for (size_t i = 0; i < n_heads; i++) {
            fprintf(o, "%s\n{\"layer\":%d,\"kv_head\":%d,\"n_keys\":%lld", i ? "," : "", st[i].layer, st[i].kv_head,
                    (long long)st[i].n_keys);
            for (int c = 0; c < N_COLS; c++) {
                fprintf(o, ",\"%s\":", cols[c]);
                put_real(o, *(const double *)((const char *)&st[i] + offs[c]), 1);
            }
            fputc('}', o);
        }
        fprintf(o, "],\"policies\":[");
        for (int p = 0; p < n_specs; p++) {
            fprintf(o, "%s\n{\"policy\":", p ? "," : "");
            kvs_cli_json_string(o, cfgs[p].ops->name);
            fprintf(o, ",\"params\":");
            kvs_cli_json_string(o, cfgs[p].canonical);
            fprintf(o, ",\"budget\":%ld,\"eps\":", budget);
            put_real(o, eps, 1);
            fprintf(o, ",\"logdet\":[");
            for (int l = l0; l < l1; l++)
                for (int h = 0; h < H; h++) {
                    size_t k = (size_t)l * (size_t)H + (size_t)h;
                    if (l > l0 || h) fputc(',', o);
                    fprintf(o, "{\"layer\":%d,\"kv_head\":%d,\"m\":%lld,\"logdet\":", l, h, (long long)cnt[(size_t)p * all + k]);
                    put_real(o, ld[(size_t)p * all + k], 1);
                    fputc('}', o);
                }
            fputs("]}", o);
        }
        fputs("\n]}\n", o);
    } else if (csv) {
        fprintf(o, "layer,kv_head,n_keys");
        for (int c = 0; c < N_COLS; c++) fprintf(o, ",%s", cols[c]);
        for (int p = 0; p < n_specs; p++) fprintf(o, ",logdet_%d,m_%d", p, p);
        fputc('\n', o);
        for (size_t i = 0; i < n_heads; i++) {
            fprintf(o, "%d,%d,%lld", st[i].layer, st[i].kv_head, (long long)st[i].n_keys);
            for (int c = 0; c < N_COLS; c++) {
                fputc(',', o);
                put_real(o, *(const double *)((const char *)&st[i] + offs[c]), 0);
            }
            size_t k = (size_t)st[i].layer * (size_t)H + (size_t)st[i].kv_head;
            for (int p = 0; p < n_specs; p++) {
                fputc(',', o);
                put_real(o, ld[(size_t)p * all + k], 0);
                fprintf(o, ",%lld", (long long)cnt[(size_t)p * all + k]);
            }
            fputc('\n', o);
        }
    } else {
        fprintf(o, "%s: %s, %lld keys per head (%s)\n", path, info->model.model_name,
                (long long)(n_heads ? st[0].n_keys : 0), scope == KVS_KEYS_PROMPT ? "the first prompt" : "every position");
        fprintf(o, "%5s %7s", "layer", "kv_head");
        for (int c = 0; c < N_COLS; c++) fprintf(o, " %9s", cols[c]);
        fputc('\n', o);
        for (size_t i = 0; i < n_heads; i++) {
            fprintf(o, "%5d %7d", st[i].layer, st[i].kv_head);
            for (int c = 0; c < N_COLS; c++) fprintf(o, " %9.4f", *(const double *)((const char *)&st[i] + offs[c]));
            fputc('\n', o);
        }
        fprintf(o, "%13s", "median");
        for (int c = 0; c < N_COLS; c++) fprintf(o, " %9.4f", median_of(st, n_heads, offs[c]));
        int neg_sum = 0, neg_perq = 0;
        for (size_t i = 0; i < n_heads; i++) {
            neg_sum += st[i].spearman_sum < 0;
            neg_perq += st[i].spearman_per_query < 0;
        }
        fprintf(o, "\nheads with rho < 0: %d of %zu (rho_sum), %d of %zu (rho_perq)\n", neg_sum, n_heads, neg_perq,
                n_heads);
        if (n_specs) {
            int lw = 6;
            for (int p = 0; p < n_specs; p++) {
                int w = (int)(strlen(cfgs[p].ops->name) + 1 + strlen(cfgs[p].canonical));
                if (w > lw) lw = w;
            }
            fprintf(o, "\nretained key diversity after the first prompt at budget %ld (logdet(K^T K + %g I_d) of unit "
                       "keys; higher = more diverse):\n%-*s %10s %8s %12s\n",
                    budget, eps, lw, "policy", "mean", "mean_m", "largest_in");
            for (int p = 0; p < n_specs; p++) {
                double sum = 0, msum = 0;
                int wins = 0;
                for (size_t i = 0; i < n_heads; i++) {
                    size_t k = (size_t)st[i].layer * (size_t)H + (size_t)st[i].kv_head;
                    double v = ld[(size_t)p * all + k];
                    sum += v;
                    msum += (double)cnt[(size_t)p * all + k];
                    int best = 1;
                    for (int q = 0; q < n_specs; q++)
                        if (q != p && ld[(size_t)q * all + k] >= v) best = 0;
                    wins += best;
                }
                char label[KVS_POLICY_NAME_MAX + KVS_POLICY_CANON_MAX + 2];
                snprintf(label, sizeof label, "%s%s%s", cfgs[p].ops->name, cfgs[p].canonical[0] ? ":" : "",
                         cfgs[p].canonical);
                fprintf(o, "%-*s %10.4f %8.1f %7d of %zu\n", lw, label, sum / (double)n_heads, msum / (double)n_heads, wins,
                        n_heads);
            }
        }
    }
cleanup:
    kvs_results_policy_inputs_free(inputs);
    free(st);
    free(ld);
    free(cnt);
    kvs_trace_close(t);
    if (s != KVS_OK) return kvs_cli_fail("keys", s);
    return kvs_cli_finish_stdout("keys");
}
