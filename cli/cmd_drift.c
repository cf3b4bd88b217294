/* cmd_drift.c — `kvsim drift TRACE --db DB`: attention drift (prefill top-k vs each decode step's), the top-k
 * attention mass and the temporal locality of the top-k sets, per layer, query head and KV group, for a sweep of k
 * in one pass (SyncKV §3.1-3.2, Fig. 2a/2b; POLICY_SPEC §5.4 S1-S3, §6.3; analysis/drift.h), stored in the results
 * database (results/results_drift.h, results/SCHEMA.md "Drift tables") and summarised on stdout.
 * Exit codes per cli.h: 0 done, 1 bad trace / database / I/O (nothing written), 2 bad usage (nothing written).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../analysis/drift.h"
#include "../results/results_drift.h"
#include "../trace/trace.h"
#include "cli.h"

#define DRIFT_AT_STEP 50 /* S1: "after 50 decode steps" */

static void usage(FILE *f) {
    fprintf(f,
            "usage: kvsim drift TRACE --db DB [--k K,...|--k-frac F,...] [--prefill-score window|last|both]\n"
            "                   [--delta-max N] [--window W] [--csv | --json]\n"
            "Attention drift and temporal locality of TRACE's top-k sets (SyncKV 3.1-3.2, Fig. 2a/2b; POLICY_SPEC\n"
            "5.4 S1-S3), exact full attention, over the decode steps of the first turn, per layer and per unit:\n"
            "each query head, and each KV group with its query heads' attention max-pooled (POLICY_SPEC 2.4), all\n"
            "k of the sweep in one pass. Written to DB in one transaction (tables drift_*, results/SCHEMA.md).\n"
            "  drift     overlap_k(prefill set, step set) = |A n B| / min(|A|, |B|) (SyncKV Eq. 1) at every step;\n"
            "            the step set is the top-k of the step's attention over all positions so far (prompt and\n"
            "            generated), the prefill set the top-k of a prefill score (POLICY_SPEC 6.3, both by default):\n"
            "              window  SnapKV's score: attention of the last W prompt queries summed, no pooling, over\n"
            "                      the prompt positions before the window (SnapKV keeps the window itself)\n"
            "              last    the last prompt query's attention over the whole prompt (SyncKV Eq. 3)\n"
            "  mass      attention mass on the step's top-k set (S2; a group: mean over its heads)\n"
            "  locality  overlap_k(step t, step t+d) for d = 1..N (S3), stored as a step x d matrix (rows t,\n"
            "            columns d: Fig. 2b's diagonal band in T x N cells instead of T x T) summarised over the\n"
            "            layer's units (mean, min, max), and per unit averaged over t\n"
            "  chance    beside each of them, what a uniformly random k-subset of the n positions the step attends\n"
            "            to would give: k/n for the overlap with either prefill set (|A n B| is hypergeometric, mean\n"
            "            k*k/n), for the mass (each position is in the set with probability k/n) and for locality\n"
            "            (n: the context of step t+d); n grows by one a step, and an average is taken over the same\n"
            "            steps as the measured value\n"
            "  --k K,...        top-k sizes (sorted, duplicates dropped). Default: of {4,8,16,32} (the tiny models'\n"
            "                   short prompts) and S1's {64,128,256,1024}, every k with 2k <= m, m the prompt\n"
            "                   positions the prefill set is chosen from: two k-sets of m candidates share at least\n"
            "                   2k - m members whatever the attention does, so above m/2 the overlap has an\n"
            "                   arithmetic floor, not a measured one. k > m is an error.\n"
            "  --k-frac F,...   top-k sizes as fractions of m (0 < F <= 1, k = max(1, floor(F m)))\n"
            "  --prefill-score  window, last or both (default both)\n"
            "  --delta-max N    temporal locality up to d = N (default 16; 0 = none)\n"
            "  --window W       observation window of the window score (default 32, SnapKV's and POLICY_SPEC 6.3's)\n"
            "  --csv            the summary as CSV, one row per (unit, k, layer; layer 'all' = the mean over layers):\n"
            "                   unit,k,layer,at_step,win_at,last_at,chance_at,win_avg,last_avg,mass,chance_avg,\n"
            "                   delta_n,loc_d1,chance_d1,loc_dn,chance_dn (empty: not measured)\n"
            "  --json           the same rows in one object with the run ({\"rows\": [...]}, layer null = all)\n"
            "Output: per unit and k, the mean over layers and units, then per layer: overlap with each prefill set\n"
            "at step %d (or the last step when the turn is shorter) and averaged over all steps, the mean top-k\n"
            "mass, and the locality at d = 1 and d = N, each with its chance level. Plots: kvsim plot DB --kind\n"
            "drift-curve|drift-locality.\n",
            DRIFT_AT_STEP);
}

/* Summary accumulators of one (unit, k, layer). */
typedef struct {
    double win_at, last_at, chance_at, n_at; /* overlaps at the summary step and their chance level */
    double win_sum, last_sum, mass_sum, chance_sum, n;
    double loc1_sum, chance1_sum, n1, locN_sum, chanceN_sum, nN;
} drift_acc;

typedef struct {
    kvs_results_drift_writer *w;
    const kvs_drift_opts *o;
    int32_t n_layers;
    int64_t at_step;
    drift_acc *acc; /* [unit][n_k][n_layers] */
} drift_ctx;

static int k_index(const kvs_drift_opts *o, int64_t k) {
    for (int i = 0; i < o->n_k; i++)
        if (o->k[i] == k) return i;
    return 0;
}

static drift_acc *acc_of(drift_ctx *c, kvs_drift_unit u, int64_t k, int32_t layer) {
    return &c->acc[((size_t)u * (size_t)c->o->n_k + (size_t)k_index(c->o, k)) * (size_t)c->n_layers + (size_t)layer];
}

static kvs_status sink_step(void *ctx, const kvs_drift_step *r) {
    drift_ctx *c = ctx;
    drift_acc *a = acc_of(c, r->unit, r->k, r->layer);
    /* the chance levels are summed over the same rows as the measures: averaged over the same steps */
    if (r->step == c->at_step) {
        a->win_at += r->overlap_window;
        a->last_at += r->overlap_last;
        a->chance_at += r->chance;
        a->n_at += 1;
    }
    a->win_sum += r->overlap_window;
    a->last_sum += r->overlap_last;
    a->mass_sum += r->mass;
    a->chance_sum += r->chance;
    a->n += 1;
    return kvs_results_drift_put_step(c->w, r);
}

static kvs_status sink_locality(void *ctx, const kvs_drift_locality *r) {
    drift_ctx *c = ctx;
    drift_acc *a = acc_of(c, r->unit, r->k, r->layer);
    if (r->delta == 1) {
        a->loc1_sum += r->mean;
        a->chance1_sum += r->chance;
        a->n1 += 1;
    }
    if (r->delta == c->o->delta_max) {
        a->locN_sum += r->mean;
        a->chanceN_sum += r->chance;
        a->nN += 1;
    }
    return kvs_results_drift_put_locality(c->w, r);
}

static kvs_status sink_locality_unit(void *ctx, const kvs_drift_locality_unit *r) {
    drift_ctx *c = ctx;
    return kvs_results_drift_put_locality_unit(c->w, r);
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* A comma-separated list of integers (as_frac == 0) or fractions of m (as_frac != 0) into ks, sorted and
 * deduplicated; @return the count, or -1 after a usage error message. */
static int parse_k_list(const char *opt, const char *text, int as_frac, int64_t m, int64_t *ks) {
    int n = 0;
    const char *p = text;
    for (;;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        char item[64];
        if (len == 0 || len >= sizeof item) {
            kvs_cli_usage_error("drift", "%s: '%s' is not a comma-separated list", opt, text);
            return -1;
        }
        if (n >= KVS_DRIFT_MAX_KS) {
            kvs_cli_usage_error("drift", "%s: at most %d values", opt, KVS_DRIFT_MAX_KS);
            return -1;
        }
        memcpy(item, p, len);
        item[len] = '\0';
        if (as_frac) {
            double f = 0;
            if (kvs_cli_parse_double(opt, item, 0, 1, &f) != KVS_OK) {
                kvs_cli_fail("drift", KVS_ERR_INVALID_ARG);
                return -1;
            }
            if (f <= 0) {
                kvs_cli_usage_error("drift", "%s: '%s' must be > 0", opt, item);
                return -1;
            }
            int64_t k = (int64_t)floor(f * (double)m);
            ks[n++] = k < 1 ? 1 : k;
        } else {
            long k;
            if (kvs_cli_parse_long(opt, item, 1, 1L << 30, &k) != KVS_OK) {
                kvs_cli_fail("drift", KVS_ERR_INVALID_ARG);
                return -1;
            }
            ks[n++] = k;
        }
        if (!comma) break;
        p = comma + 1;
    }
    qsort(ks, (size_t)n, sizeof *ks, cmp_i64);
    int w = 0;
    for (int i = 0; i < n; i++)
        if (w == 0 || ks[i] != ks[w - 1]) ks[w++] = ks[i];
    return w;
}

/* The output forms of the summary. */
typedef enum { OUT_TEXT, OUT_CSV, OUT_JSON } out_form;

/* sum / n, or NaN when there is no sample (or the measure was not asked: a NaN sum). */
static double mean_of(double sum, double n) { return n > 0 ? sum / n : NAN; }

/* The summary row of (unit, k, layer), layer -1 = every layer (their rows pooled: every layer has as many). */
static drift_acc acc_row(drift_ctx *c, kvs_drift_unit u, int64_t k, int l) {
    if (l >= 0) return *acc_of(c, u, k, l);
    drift_acc a = {0};
    for (int j = 0; j < c->n_layers; j++) {
        const drift_acc *b = acc_of(c, u, k, j);
        a.win_at += b->win_at, a.last_at += b->last_at, a.chance_at += b->chance_at, a.n_at += b->n_at;
        a.win_sum += b->win_sum, a.last_sum += b->last_sum, a.mass_sum += b->mass_sum, a.chance_sum += b->chance_sum;
        a.n += b->n;
        a.loc1_sum += b->loc1_sum, a.chance1_sum += b->chance1_sum, a.n1 += b->n1;
        a.locN_sum += b->locN_sum, a.chanceN_sum += b->chanceN_sum, a.nN += b->nN;
    }
    return a;
}

#define N_SUMMARY_COLS 11
/* The columns of a summary row, measured and chance side by side, in the order the text, CSV and JSON give them. */
static const char *const col_csv[N_SUMMARY_COLS] = {"win_at", "last_at", "chance_at", "win_avg", "last_avg", "mass",
                                                    "chance_avg", "loc_d1", "chance_d1", "loc_dn", "chance_dn"};
static const char *const col_text[N_SUMMARY_COLS] = {"win@s", "last@s", "rand@s", "win_avg", "last_avg", "mass",
                                                     "rand_avg", "loc_d1", "rand_d1", "loc_dN", "rand_dN"};

static void summary_values(const drift_acc *a, double v[N_SUMMARY_COLS]) {
    v[0] = mean_of(a->win_at, a->n_at);
    v[1] = mean_of(a->last_at, a->n_at);
    v[2] = mean_of(a->chance_at, a->n_at);
    v[3] = mean_of(a->win_sum, a->n);
    v[4] = mean_of(a->last_sum, a->n);
    v[5] = mean_of(a->mass_sum, a->n);
    v[6] = mean_of(a->chance_sum, a->n);
    v[7] = mean_of(a->loc1_sum, a->n1);
    v[8] = mean_of(a->chance1_sum, a->n1);
    v[9] = mean_of(a->locN_sum, a->nN);
    v[10] = mean_of(a->chanceN_sum, a->nN);
}

static void print_summary(const char *path, const kvs_trace_info *info, const kvs_drift_opts *o, drift_ctx *c,
                          int64_t run_id, const char *db, out_form form) {
    const int64_t P = info->turns[0].prompt_end, T = info->turns[0].end - P;
    FILE *out = stdout;
    if (form == OUT_JSON) {
        fprintf(out, "{\"trace\":");
        kvs_cli_json_string(out, path);
        fprintf(out, ",\"model\":");
        kvs_cli_json_string(out, info->model.model_name);
        fprintf(out, ",\"db\":");
        kvs_cli_json_string(out, db);
        fprintf(out, ",\"run_id\":%lld,\"prompt_len\":%lld,\"n_steps\":%lld,\"at_step\":%lld,\"delta_n\":%d,\"rows\":[",
                (long long)run_id, (long long)P, (long long)T, (long long)c->at_step, (int)o->delta_max);
    } else if (form == OUT_CSV) {
        fprintf(out, "unit,k,layer,at_step");
        for (int i = 0; i < N_SUMMARY_COLS; i++) fprintf(out, ",%s%s", col_csv[i], i == 6 ? ",delta_n" : "");
        fputc('\n', out);
    } else {
        printf("%s: %s, %d layers x %d query heads (%d KV heads), prompt %lld positions, %lld decode steps\n", path,
               info->model.model_name, info->model.n_layers, info->model.n_heads, info->model.n_kv_heads,
               (long long)P, (long long)T);
        printf("drift run %lld written to %s; prefill sets:\n", (long long)run_id, db);
        if (o->scores & KVS_DRIFT_SCORE_WINDOW)
            printf("  window: top-k of the last %d prompt queries' attention among positions 0..%lld\n", (int)o->window,
                   (long long)(P - o->window - 1));
        if (o->scores & KVS_DRIFT_SCORE_LAST)
            printf("  last:   top-k of the last prompt query's attention among positions 0..%lld\n", (long long)(P - 1));
        printf("%-5s %5s %5s", "unit", "k", "layer");
        for (int i = 0; i < N_SUMMARY_COLS; i++) printf(" %8s", col_text[i]);
        printf("\n");
    }
    int first = 1;
    for (int u = 0; u < KVS_DRIFT_N_UNITS; u++)
        for (int ki = 0; ki < o->n_k; ki++)
            for (int l = -1; l < c->n_layers; l++) {
                const drift_acc a = acc_row(c, (kvs_drift_unit)u, o->k[ki], l);
                double v[N_SUMMARY_COLS];
                summary_values(&a, v);
                const char *unit = kvs_drift_unit_name((kvs_drift_unit)u);
                if (form == OUT_JSON) {
                    fprintf(out, "%s\n{\"unit\":\"%s\",\"k\":%lld,\"layer\":", first ? "" : ",", unit,
                            (long long)o->k[ki]);
                    if (l < 0) fprintf(out, "null");
                    else fprintf(out, "%d", l);
                    for (int i = 0; i < N_SUMMARY_COLS; i++) {
                        fprintf(out, ",\"%s\":", col_csv[i]);
                        kvs_cli_json_number(out, v[i]);
                    }
                    fputc('}', out);
                } else if (form == OUT_CSV) {
                    fprintf(out, "%s,%lld,", unit, (long long)o->k[ki]);
                    if (l < 0) fprintf(out, "all");
                    else fprintf(out, "%d", l);
                    fprintf(out, ",%lld", (long long)c->at_step);
                    for (int i = 0; i < N_SUMMARY_COLS; i++) {
                        char buf[64];
                        kvs_cli_fmt_real(buf, sizeof buf, v[i]);
                        fprintf(out, ",%s", buf);
                        if (i == 6) fprintf(out, ",%d", (int)o->delta_max);
                    }
                    fputc('\n', out);
                } else {
                    printf("%-5s %5lld ", unit, (long long)o->k[ki]);
                    if (l < 0) printf("%5s", "all");
                    else printf("%5d", l);
                    for (int i = 0; i < N_SUMMARY_COLS; i++) {
                        if (isnan(v[i])) printf(" %8s", "-");
                        else printf(" %8.3f", v[i]);
                    }
                    printf("\n");
                }
                first = 0;
            }
    if (form == OUT_JSON) fprintf(out, "\n]}\n");
    if (form != OUT_TEXT) return;
    printf("win@s/last@s: overlap with the window/last prefill set at decode step %lld (mean over units); _avg: over "
           "all %lld steps; mass: attention on the top-k; loc_d1/loc_dN: overlap of steps t and t+1 / t+%d\n",
           (long long)c->at_step, (long long)T, (int)o->delta_max);
    printf("rand@s, rand_avg, rand_d1, rand_dN: the chance level of the measures just before them, what a uniformly "
           "random k-subset of the n positions a step attends to gives (k/n; the same for both prefill sets and the "
           "mass), averaged over the same steps\n");
}

int kvs_cmd_drift(int argc, char **argv) {
    const char *path = NULL, *db_path = NULL, *k_s = NULL, *kfrac_s = NULL, *score_s = NULL, *delta_s = NULL,
               *window_s = NULL;
    int csv = 0, json = 0;
    for (int i = 1; i < argc; i++) {
        int missing = 0, r;
        if (kvs_cli_is_help(argv[i])) {
            usage(stdout);
            return KVS_EXIT_OK;
        } else if ((r = kvs_cli_single_value("drift", "--db", argc, argv, &i, &missing, &db_path)) ||
                   (r = kvs_cli_single_value("drift", "--k", argc, argv, &i, &missing, &k_s)) ||
                   (r = kvs_cli_single_value("drift", "--k-frac", argc, argv, &i, &missing, &kfrac_s)) ||
                   (r = kvs_cli_single_value("drift", "--prefill-score", argc, argv, &i, &missing, &score_s)) ||
                   (r = kvs_cli_single_value("drift", "--delta-max", argc, argv, &i, &missing, &delta_s)) ||
                   (r = kvs_cli_single_value("drift", "--window", argc, argv, &i, &missing, &window_s))) {
            if (r < 0) return KVS_EXIT_USAGE;
        } else if (missing) {
            return kvs_cli_usage_error("drift", "option %s needs a value", argv[i]);
        } else if (!strcmp(argv[i], "--csv")) {
            if (kvs_cli_once("drift", "--csv", &csv)) return KVS_EXIT_USAGE;
        } else if (!strcmp(argv[i], "--json")) {
            if (kvs_cli_once("drift", "--json", &json)) return KVS_EXIT_USAGE;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            return kvs_cli_usage_error("drift", "unknown option '%s'", argv[i]);
        } else if (!path) {
            path = argv[i];
        } else {
            return kvs_cli_usage_error("drift", "unexpected argument '%s'", argv[i]);
        }
    }
    if (!path) return kvs_cli_usage_error("drift", "missing TRACE");
    if (!db_path) return kvs_cli_usage_error("drift", "missing --db DB (the results database to write)");
    if (k_s && kfrac_s) return kvs_cli_usage_error("drift", "--k and --k-frac exclude each other");
    if (csv && json) return kvs_cli_usage_error("drift", "--csv and --json exclude each other");
    kvs_drift_opts o = {.scores = KVS_DRIFT_SCORE_WINDOW | KVS_DRIFT_SCORE_LAST, .window = 32, .delta_max = 16};
    if (score_s) {
        if (!strcmp(score_s, "window")) o.scores = KVS_DRIFT_SCORE_WINDOW;
        else if (!strcmp(score_s, "last")) o.scores = KVS_DRIFT_SCORE_LAST;
        else if (strcmp(score_s, "both"))
            return kvs_cli_usage_error("drift", "--prefill-score: '%s' is not window, last or both", score_s);
    }
    long v;
    if (delta_s) {
        if (kvs_cli_parse_long("--delta-max", delta_s, 0, 4096, &v) != KVS_OK) return kvs_cli_fail("drift", KVS_ERR_INVALID_ARG);
        o.delta_max = (int32_t)v;
    }
    if (window_s) {
        if (kvs_cli_parse_long("--window", window_s, 1, 1L << 20, &v) != KVS_OK) return kvs_cli_fail("drift", KVS_ERR_INVALID_ARG);
        o.window = (int32_t)v;
    }

    kvs_trace *t = NULL;
    kvs_status st = kvs_trace_open(path, &t);
    if (st != KVS_OK) return kvs_cli_fail("drift", st == KVS_ERR_INVALID_ARG ? KVS_ERR_IO : st);
    const kvs_trace_info *info = kvs_trace_info_get(t);
    int rc = KVS_EXIT_OK;
    kvs_results_db *db = NULL;
    kvs_results_drift_writer *w = NULL;
    drift_ctx c = {.o = &o, .n_layers = info->model.n_layers};
    int64_t ks[KVS_DRIFT_MAX_KS];
    const int no_steps = info->n_turns < 1 || info->turns[0].end <= info->turns[0].prompt_end;
    const int64_t m = kvs_analysis_drift_candidates(info, o.scores, o.window);
    int n_k;
    if (no_steps) n_k = 1, ks[0] = 1; /* reported by the check below */
    else if (k_s || kfrac_s) n_k = parse_k_list(k_s ? "--k" : "--k-frac", k_s ? k_s : kfrac_s, kfrac_s != NULL, m, ks);
    else {
        n_k = kvs_analysis_drift_default_ks(info, o.scores, o.window, ks, KVS_DRIFT_MAX_KS);
        if (n_k == 0) {
            rc = kvs_cli_usage_error("drift", "%s: the prefill set is chosen among %lld prompt positions, too few for "
                                              "the default k >= 4 (2k <= m); give --k",
                                     path, (long long)m);
            goto cleanup;
        }
    }
    if (n_k < 0) {
        rc = KVS_EXIT_USAGE;
        goto cleanup;
    }
    o.k = ks;
    o.n_k = n_k;
    /* Everything is checked before the database is opened: a bad trace or option writes nothing. */
    if ((st = kvs_analysis_drift_check(t, &o)) != KVS_OK) {
        kvs_cli_fail("drift", st);
        rc = no_steps ? KVS_EXIT_FAIL : KVS_EXIT_USAGE;
        goto cleanup;
    }
    const int64_t T = info->turns[0].end - info->turns[0].prompt_end;
    c.at_step = T > DRIFT_AT_STEP ? DRIFT_AT_STEP : T - 1;
    c.acc = calloc((size_t)KVS_DRIFT_N_UNITS * (size_t)n_k * (size_t)c.n_layers, sizeof *c.acc);
    if (!c.acc) {
        st = kvs_fail(KVS_ERR_NOMEM, "out of memory");
        goto fail;
    }
    if ((st = kvs_results_open(db_path, &db)) != KVS_OK) goto fail;
    const kvs_results_trace rt = kvs_results_trace_of(path, info);
    const kvs_results_drift_params params = {.prompt_len = info->turns[0].prompt_end, .n_steps = T,
                                             .window = o.window, .delta_max = o.delta_max, .scores = o.scores,
                                             .k = ks, .n_k = n_k};
    if ((st = kvs_results_drift_begin(db, &rt, &params, &w)) != KVS_OK) goto fail;
    c.w = w;
    const kvs_drift_sink sink = {.ctx = &c, .step = sink_step, .locality = sink_locality,
                                 .locality_unit = sink_locality_unit};
    if ((st = kvs_analysis_drift_run(t, &o, &sink)) != KVS_OK) goto fail;
    int64_t run_id = 0;
    st = kvs_results_drift_commit(w, &run_id);
    w = NULL;
    if (st != KVS_OK) goto fail;
    print_summary(path, info, &o, &c, run_id, db_path, csv ? OUT_CSV : json ? OUT_JSON : OUT_TEXT);
    rc = kvs_cli_finish_stdout("drift");
    goto cleanup;
fail:
    /* A failure here is the trace's (a corrupt chunk), the database's or the machine's, not the usage's. */
    kvs_cli_fail("drift", st);
    rc = KVS_EXIT_FAIL;
cleanup:
    kvs_results_drift_abort(w);
    kvs_results_close(db);
    free(c.acc);
    kvs_trace_close(t);
    return rc;
}
