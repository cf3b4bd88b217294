/* cmd_heads.c — `kvsim heads TRACE --db DB`: head-to-head similarity of query heads and of units (KV groups,
 * MAX-pooled) over the decode steps, layer-to-layer similarity (SyncKV §3.3, Fig. 2c; POLICY_SPEC §5.4 S4 with
 * the §8.4g reading), the K-means clustering of each layer's units with one representative per cluster (SyncKV
 * §4.1, App. B.1; POLICY_SPEC §2.4, §8.4h) and its stability (adjusted Rand index, S12), into the results
 * database (results/results_heads.h) and optionally the clusters file SyncKV reads (common/head_clusters.h).
 * Analysis: analysis/heads.h. Exit codes per cli.h: 0 done, 1 bad/corrupt input or database, 2 bad usage.
 * Nothing is written unless the whole analysis succeeded: the database gets one transaction at the end.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../analysis/heads.h"
#include "../common/kvs_cluster.h"
#include "../common/kvs_out.h"
#include "../results/results_heads.h"
#include "../trace/trace.h"
#include "cli.h"

#ifndef KVSIM_VERSION_STRING
#define KVSIM_VERSION_STRING "0.1.0"
#endif

/* SyncKV's default number of clusters per layer for Llama models (§5.1; POLICY_SPEC §2.4 N_r). */
#define HEADS_DEFAULT_CLUSTERS 2

static void usage(FILE *f) {
    fprintf(f,
            "usage: kvsim heads TRACE --db DB [--k K] [--clusters N|auto] [--seed S] [--clusters-out FILE]\n"
            "                   [--stability halves|TRACE2] [--csv | --json]\n"
            "Head-to-head similarity of TRACE (SyncKV Eq. 2, Fig. 2c) and the K-means clustering of each layer's\n"
            "units that the SyncKV policy replays with (SyncKV App. B.1; POLICY_SPEC 2.4), into the results database.\n"
            "  similarity  S_ij = mean over the decode steps (every generated position) of the overlap coefficient\n"
            "              |T_i n T_j| / min(|T_i|, |T_j|) of the top-K sets of the exact full attention of heads i\n"
            "              and j, for every pair of query heads and every pair of units (a unit is a KV group, its\n"
            "              attention MAX-pooled over its query heads, App. B.1; a head under MHA), across all layers.\n"
            "  layer-to-layer similarity (Fig. 2c, S4; the reading of POLICY_SPEC 8.4g): Sim(a, b) = the mean of S\n"
            "              over the heads of layer a paired with the heads of layer b; on the diagonal (a = b) the\n"
            "              pairs of a head with itself are left out, so it is the mean similarity of distinct heads\n"
            "              of the layer. SyncKV's claim: the diagonal (intralayer) is well above the rest.\n"
            "  same KV head  under GQA the query heads of one KV group read identical keys, so their top-k sets\n"
            "              agree for a reason that is not head similarity: the within-layer mean is also given\n"
            "              without those pairs (and over them alone); no pair across layers, and no two units,\n"
            "              share a KV head, so those means are the same with and without.\n"
            "  clusters    per layer, K-means on the rows of D = max(S) - S of the layer's units (k-means++, 10\n"
            "              seeded restarts, lowest inertia, canonical labels); the representative of a cluster is\n"
            "              the member nearest its centroid. Deterministic for a seed.\n"
            "  --k K          top-k size k_c (default %d, POLICY_SPEC 2.4; the default is clipped to the context of\n"
            "                 the first decode step, and said so; an explicit K larger than it is an error)\n"
            "  --clusters N   clusters per layer (default %d, SyncKV's Llama setting; more than the units is\n"
            "                 clipped, and said so); auto: the N in 2..units-1 with the highest mean silhouette of\n"
            "                 the D rows (a layer of fewer than 3 units gets 1 cluster)\n"
            "  --seed S       K-means seed (default 0)\n"
            "  --stability halves   also cluster the first and the second half of the decode steps separately\n"
            "                 and report the adjusted Rand index of the two clusterings per layer (S12)\n"
            "  --stability TRACE2   the same between TRACE and a second trace of the same model\n"
            "  --clusters-out FILE  also write the clustering in the text form SyncKV's clusters=FILE reads\n"
            "                 (common/head_clusters.h); '-' is standard output\n"
            "  --csv          instead of the text, the layer-to-layer similarity as CSV: kind,scope,layer_a,layer_b,\n"
            "                 sim,sim_other_kv,sim_same_kv,pairs,pairs_same_kv; scope 'layer' rows are the matrix\n"
            "                 cells (sim_other_kv: pairs that share no KV head; sim_same_kv: distinct pairs that\n"
            "                 do), 'within' and 'across' rows (layers empty) the means of the diagonal and off-\n"
            "                 diagonal cells\n"
            "  --json         the same as one object: the run, per kind the within/across means with and without\n"
            "                 the same-KV-head pairs, the cells, and per layer its clusters\n"
            "Results: tables heads_* of DB (results/SCHEMA.md \"Table family heads\"); `kvsim plot DB --kind\n"
            "head-similarity|layer-similarity` draws them.\n",
            KVS_ANALYSIS_HEADS_DEFAULT_K, HEADS_DEFAULT_CLUSTERS);
}

/* The clustering of every layer from per-layer similarity blocks: block(l) is layer l's U x U unit matrix. */
static kvs_status cluster_all(const kvs_analysis_heads_sim *s, const double *halves, int32_t n_clusters, uint64_t seed,
                              kvs_head_clusters **out, double *silhouette) {
    const int32_t L = s->n_layers, U = s->n_kv_heads;
    double *block = malloc((size_t)U * (size_t)U * sizeof *block);
    kvs_head_clusters *c = NULL;
    kvs_status st = block ? kvs_head_clusters_create(L, U, &c) : kvs_fail(KVS_ERR_NOMEM, "out of memory");
    for (int32_t l = 0; l < L && st == KVS_OK; l++) {
        if (halves) memcpy(block, halves + (size_t)l * (size_t)U * (size_t)U, (size_t)U * (size_t)U * sizeof *block);
        else kvs_analysis_heads_layer_block(s->unit_sim, L, U, l, block);
        st = kvs_analysis_heads_cluster(c, l, block, n_clusters, seed, &silhouette[l]);
    }
    free(block);
    if (st != KVS_OK) {
        kvs_head_clusters_free(c);
        return st;
    }
    *out = c;
    return KVS_OK;
}

static void print_members(const kvs_head_clusters *c, int32_t l) {
    const int32_t U = c->n_units;
    for (int32_t g = 0; g < c->n_clusters[l]; g++) {
        printf(" {");
        int first = 1;
        for (int32_t u = 0; u < U; u++) {
            size_t i = (size_t)l * (size_t)U + (size_t)u;
            if (c->cluster[i] != g) continue;
            printf("%s%d%s", first ? "" : ",", u, c->is_rep[i] ? "*" : "");
            first = 0;
        }
        printf("}");
    }
}

/* The layer-to-layer matrix and S4's comparison: the mean of the diagonal against the mean off it, with and
 * without the pairs of heads that share a KV head. */
static void print_layer_matrix(const char *what, const double *m, const kvs_analysis_heads_split *sp, int32_t L) {
    printf("layer-to-layer similarity of %s (row: source layer, column: target layer)\n      ", what);
    for (int32_t b = 0; b < L; b++) printf("  L%-5d", b);
    printf("\n");
    for (int32_t a = 0; a < L; a++) {
        printf("  L%-3d", a);
        for (int32_t b = 0; b < L; b++) {
            double v = m[(size_t)a * (size_t)L + (size_t)b];
            if (isnan(v)) printf(" %7s", "-");
            else printf(" %7.4f", v);
        }
        printf("\n");
    }
    printf("  all pairs: intralayer (diagonal) mean ");
    if (!isnan(sp->within)) printf("%.4f", sp->within);
    else printf("-");
    printf(", interlayer (off-diagonal) mean ");
    if (!isnan(sp->across)) printf("%.4f\n", sp->across);
    else printf("- (one layer)\n");
    if (sp->pairs_within_same_kv == 0) {
        printf("  no two of them share a KV head: nothing to leave out\n");
        return;
    }
    printf("  without the %lld of %lld intralayer pairs that share a KV head (identical keys): intralayer ",
           (long long)sp->pairs_within_same_kv, (long long)sp->pairs_within);
    if (!isnan(sp->within_other_kv)) printf("%.4f", sp->within_other_kv);
    else printf("- (one KV head)");
    printf(", interlayer ");
    if (!isnan(sp->across_other_kv)) printf("%.4f", sp->across_other_kv);
    else printf("- (one layer)");
    printf(" (unchanged: no pair across layers shares one); the pairs that share one: %.4f\n", sp->within_same_kv);
}

/* One kind's cells and means as CSV rows (see usage). */
static void csv_kind(const char *kind, const double *all, const double *other, const double *same,
                     const kvs_analysis_heads_split *sp, int32_t L, int32_t n, int32_t group) {
    char a[64], o[64], s[64];
    const int64_t per_kv = group < n ? group : n;
    for (int32_t la = 0; la < L; la++)
        for (int32_t lb = 0; lb < L; lb++) {
            const size_t at = (size_t)la * (size_t)L + (size_t)lb;
            kvs_cli_fmt_real(a, sizeof a, all[at]);
            kvs_cli_fmt_real(o, sizeof o, other[at]);
            kvs_cli_fmt_real(s, sizeof s, same[at]);
            const int64_t pairs = la == lb ? (int64_t)n * (n - 1) : (int64_t)n * n;
            printf("%s,layer,%d,%d,%s,%s,%s,%lld,%lld\n", kind, la, lb, a, o, s, (long long)pairs,
                   (long long)(la == lb ? (int64_t)n * (per_kv - 1) : 0));
        }
    kvs_cli_fmt_real(a, sizeof a, sp->within);
    kvs_cli_fmt_real(o, sizeof o, sp->within_other_kv);
    kvs_cli_fmt_real(s, sizeof s, sp->within_same_kv);
    printf("%s,within,,,%s,%s,%s,%lld,%lld\n", kind, a, o, s, (long long)sp->pairs_within,
           (long long)sp->pairs_within_same_kv);
    kvs_cli_fmt_real(a, sizeof a, sp->across);
    kvs_cli_fmt_real(o, sizeof o, sp->across_other_kv);
    printf("%s,across,,,%s,%s,,%lld,0\n", kind, a, o, (long long)sp->pairs_across);
}

/* One kind's means and cells as a JSON object (see usage). */
static void json_kind(const char *kind, const double *all, const double *other, const double *same,
                      const kvs_analysis_heads_split *sp, int32_t L) {
    printf("\"%s\":{\"within\":", kind);
    kvs_cli_json_number(stdout, sp->within);
    printf(",\"within_other_kv\":");
    kvs_cli_json_number(stdout, sp->within_other_kv);
    printf(",\"within_same_kv\":");
    kvs_cli_json_number(stdout, sp->within_same_kv);
    printf(",\"across\":");
    kvs_cli_json_number(stdout, sp->across);
    printf(",\"across_other_kv\":");
    kvs_cli_json_number(stdout, sp->across_other_kv);
    printf(",\"pairs_within\":%lld,\"pairs_within_same_kv\":%lld,\"pairs_across\":%lld,\"cells\":[",
           (long long)sp->pairs_within, (long long)sp->pairs_within_same_kv, (long long)sp->pairs_across);
    for (int32_t la = 0; la < L; la++)
        for (int32_t lb = 0; lb < L; lb++) {
            const size_t at = (size_t)la * (size_t)L + (size_t)lb;
            printf("%s{\"layer_a\":%d,\"layer_b\":%d,\"sim\":", at ? "," : "", la, lb);
            kvs_cli_json_number(stdout, all[at]);
            printf(",\"sim_other_kv\":");
            kvs_cli_json_number(stdout, other[at]);
            printf(",\"sim_same_kv\":");
            kvs_cli_json_number(stdout, same[at]);
            printf("}");
        }
    printf("]}");
}

int kvs_cmd_heads(int argc, char **argv) {
    const char *path = NULL, *db_path = NULL, *k_s = NULL, *clusters_s = NULL, *seed_s = NULL, *out_s = NULL,
               *stab_s = NULL;
    int csv = 0, json = 0;
    for (int i = 1; i < argc; i++) {
        int missing = 0, r;
        if (kvs_cli_is_help(argv[i])) {
            usage(stdout);
            return KVS_EXIT_OK;
        } else if ((r = kvs_cli_single_value("heads", "--db", argc, argv, &i, &missing, &db_path)) ||
                   (r = kvs_cli_single_value("heads", "--k", argc, argv, &i, &missing, &k_s)) ||
                   (r = kvs_cli_single_value("heads", "--clusters", argc, argv, &i, &missing, &clusters_s)) ||
                   (r = kvs_cli_single_value("heads", "--seed", argc, argv, &i, &missing, &seed_s)) ||
                   (r = kvs_cli_single_value("heads", "--clusters-out", argc, argv, &i, &missing, &out_s)) ||
                   (r = kvs_cli_single_value("heads", "--stability", argc, argv, &i, &missing, &stab_s))) {
            if (r < 0) return KVS_EXIT_USAGE;
        } else if (missing) {
            return kvs_cli_usage_error("heads", "option %s needs a value", argv[i]);
        } else if (!strcmp(argv[i], "--csv")) {
            if (kvs_cli_once("heads", "--csv", &csv)) return KVS_EXIT_USAGE;
        } else if (!strcmp(argv[i], "--json")) {
            if (kvs_cli_once("heads", "--json", &json)) return KVS_EXIT_USAGE;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            return kvs_cli_usage_error("heads", "unknown option '%s'", argv[i]);
        } else if (!path) {
            path = argv[i];
        } else {
            return kvs_cli_usage_error("heads", "unexpected argument '%s'", argv[i]);
        }
    }
    if (!path) return kvs_cli_usage_error("heads", "missing TRACE");
    if (!db_path || !db_path[0]) return kvs_cli_usage_error("heads", "missing --db DB");
    if (csv && json) return kvs_cli_usage_error("heads", "--csv and --json exclude each other");
    if ((csv || json) && out_s && kvs_out_path_is_stdout(out_s))
        return kvs_cli_usage_error("heads", "--clusters-out - and --%s both want standard output", csv ? "csv" : "json");
    kvs_analysis_heads_opts ao = {0};
    long v;
    kvs_status st;
    if (k_s) {
        if ((st = kvs_cli_parse_long("--k", k_s, 1, 1L << 30, &v)) != KVS_OK) return kvs_cli_fail("heads", st);
        ao.k = v;
    }
    int32_t n_clusters = HEADS_DEFAULT_CLUSTERS; /* 0 = auto */
    if (clusters_s && !strcmp(clusters_s, "auto")) n_clusters = 0;
    else if (clusters_s) {
        if (kvs_cli_parse_long("--clusters", clusters_s, 1, KVS_HEAD_CLUSTERS_MAX_UNITS, &v) != KVS_OK)
            return kvs_cli_usage_error("heads", "--clusters: '%s' is not auto or a number of clusters in 1..%d",
                                       clusters_s, KVS_HEAD_CLUSTERS_MAX_UNITS);
        n_clusters = (int32_t)v;
    }
    uint64_t seed = 0;
    if (seed_s) {
        if ((st = kvs_cli_parse_long("--seed", seed_s, 0, 0x7fffffffffffffffL, &v)) != KVS_OK)
            return kvs_cli_fail("heads", st);
        seed = (uint64_t)v;
    }
    const char *trace2_path = stab_s && strcmp(stab_s, "halves") ? stab_s : NULL;
    ao.halves = stab_s && !trace2_path;

    int rc = KVS_EXIT_FAIL;
    kvs_trace *t = NULL, *t2 = NULL;
    kvs_analysis_heads_sim *s = NULL, *s2 = NULL;
    kvs_head_clusters *cl = NULL, *ca = NULL, *cb = NULL;
    kvs_results_db *db = NULL;
    double *sil = NULL, *sil_a = NULL, *sil_b = NULL, *ari = NULL, *lsq = NULL, *lsu = NULL, *kv = NULL;
    char notes[512] = "";
    if ((st = kvs_trace_open(path, &t)) != KVS_OK) {
        rc = kvs_cli_fail("heads", st == KVS_ERR_INVALID_ARG ? KVS_ERR_IO : st);
        goto cleanup;
    }
    const kvs_trace_info *info = kvs_trace_info_get(t);
    const int32_t L = info->model.n_layers, H = info->model.n_heads, U = info->model.n_kv_heads;
    if (trace2_path) {
        if ((st = kvs_trace_open(trace2_path, &t2)) != KVS_OK) {
            rc = kvs_cli_fail("heads", st == KVS_ERR_INVALID_ARG ? KVS_ERR_IO : st);
            goto cleanup;
        }
        const kvs_trace_info *i2 = kvs_trace_info_get(t2);
        if (i2->model.n_layers != L || i2->model.n_heads != H || i2->model.n_kv_heads != U) {
            rc = kvs_cli_fail("heads", kvs_fail(KVS_ERR_UNSUPPORTED,
                                                "--stability %s: %d layers x %d heads / %d KV heads, but %s has %d x "
                                                "%d / %d: clusterings of different shapes cannot be compared",
                                                trace2_path, i2->model.n_layers, i2->model.n_heads,
                                                i2->model.n_kv_heads, path, L, H, U));
            goto cleanup;
        }
    }
    if (n_clusters > U) {
        snprintf(notes, sizeof notes, "--clusters %d clipped to the %d units per layer; ", n_clusters, U);
        n_clusters = U;
    }
    /* An existing database is checked now, read-only, so a foreign or newer one is refused before the analysis;
     * a new one is created only when there is something to record (a failed analysis leaves no file). */
    if (access(db_path, F_OK) == 0) {
        kvs_results_db *probe = NULL;
        if ((st = kvs_results_open_readonly(db_path, &probe)) != KVS_OK) {
            rc = kvs_cli_fail("heads", st == KVS_ERR_INVALID_ARG ? KVS_ERR_DB : st);
            goto cleanup;
        }
        kvs_results_close(probe);
    }
    double t0 = kvs_now_s();
    if ((st = kvs_analysis_heads_similarity(t, &ao, &s)) != KVS_OK) {
        rc = kvs_cli_fail("heads", st);
        goto cleanup;
    }
    if (t2) {
        kvs_analysis_heads_opts ao2 = {.k = s->k}; /* the same k_c on both traces */
        if ((st = kvs_analysis_heads_similarity(t2, &ao2, &s2)) != KVS_OK) {
            rc = kvs_cli_fail("heads", kvs_fail(st, "--stability %s: %s", trace2_path, kvs_last_error()));
            goto cleanup;
        }
    }
    if (s->k_clipped)
        snprintf(notes + strlen(notes), sizeof notes - strlen(notes),
                 "k_c %d clipped to %lld, the context of the first decode step; ", KVS_ANALYSIS_HEADS_DEFAULT_K,
                 (long long)s->k);
    sil = malloc((size_t)L * sizeof *sil);
    sil_a = malloc((size_t)L * sizeof *sil_a);
    sil_b = malloc((size_t)L * sizeof *sil_b);
    ari = malloc((size_t)L * sizeof *ari);
    lsq = malloc((size_t)L * (size_t)L * sizeof *lsq);
    lsu = malloc((size_t)L * (size_t)L * sizeof *lsu);
    kv = malloc((size_t)4 * (size_t)L * (size_t)L * sizeof *kv); /* query other, query same, unit other, unit same */
    if (!sil || !sil_a || !sil_b || !ari || !lsq || !lsu || !kv) {
        rc = kvs_cli_fail("heads", kvs_fail(KVS_ERR_NOMEM, "out of memory"));
        goto cleanup;
    }
    kvs_analysis_heads_layer_sim(s->qhead_sim, L, H, lsq);
    kvs_analysis_heads_layer_sim(s->unit_sim, L, U, lsu);
    const size_t LL = (size_t)L * (size_t)L;
    kvs_analysis_heads_layer_sim_kv(s->qhead_sim, L, H, H / U, kv, kv + LL);
    kvs_analysis_heads_layer_sim_kv(s->unit_sim, L, U, 1, kv + 2 * LL, kv + 3 * LL);
    const kvs_analysis_heads_split split_q = kvs_analysis_heads_split_of(lsq, kv, kv + LL, L, H, H / U),
                                   split_u = kvs_analysis_heads_split_of(lsu, kv + 2 * LL, kv + 3 * LL, L, U, 1);
    st = cluster_all(s, NULL, n_clusters, seed, &cl, sil);
    if (st == KVS_OK && ao.halves) st = cluster_all(s, s->unit_sim_half[0], n_clusters, seed, &ca, sil_a);
    if (st == KVS_OK && ao.halves) st = cluster_all(s, s->unit_sim_half[1], n_clusters, seed, &cb, sil_b);
    if (st == KVS_OK && s2) {
        st = cluster_all(s, NULL, n_clusters, seed, &ca, sil_a);
        if (st == KVS_OK) st = cluster_all(s2, NULL, n_clusters, seed, &cb, sil_b);
    }
    for (int32_t l = 0; l < L && st == KVS_OK && ca; l++)
        st = kvs_adjusted_rand(ca->cluster + (size_t)l * (size_t)U, cb->cluster + (size_t)l * (size_t)U, (size_t)U,
                               &ari[l]);
    if (st != KVS_OK) {
        rc = kvs_cli_fail("heads", st);
        goto cleanup;
    }
    if (notes[0]) notes[strlen(notes) - 2] = '\0'; /* the last "; " */
    kvs_results_trace rt = kvs_results_trace_of(path, info), rt2 = {0};
    if (t2) rt2 = kvs_results_trace_of(trace2_path, kvs_trace_info_get(t2));
    kvs_results_heads_run run = {.k = s->k, .k_requested = ao.k, .n_steps = s->n_steps,
                                 .n_clusters_requested = n_clusters, .seed = seed,
                                 .stability = ao.halves ? "halves" : t2 ? "trace" : NULL,
                                 .stability_trace = t2 ? &rt2 : NULL, .notes = notes[0] ? notes : NULL,
                                 .wall_seconds = kvs_now_s() - t0, .kvsim_version = KVSIM_VERSION_STRING};
    kvs_results_heads_data data = {.n_layers = L, .n_heads = H, .n_kv_heads = U, .qhead_sim = s->qhead_sim,
                                   .unit_sim = s->unit_sim, .layer_sim_q = lsq, .layer_sim_u = lsu, .clusters = cl,
                                   .silhouette = sil, .stab_a = ca, .stab_b = cb, .ari = ca ? ari : NULL};
    int64_t run_id = 0;
    /* The clusters file is written (to its temporary) before the database and put in place after its commit, so
     * a full disk fails the command with neither; only the final fsync/rename can fail after the commit. */
    kvs_out *clusters_out = NULL;
    if (out_s && (st = kvs_head_clusters_write_begin(cl, out_s, &clusters_out)) != KVS_OK) {
        rc = kvs_cli_fail("heads", st == KVS_ERR_INVALID_ARG ? KVS_ERR_IO : st);
        goto cleanup;
    }
    if ((st = kvs_results_open(db_path, &db)) != KVS_OK ||
        (st = kvs_results_heads_write(db, &rt, &run, &data, &run_id)) != KVS_OK) {
        kvs_out_abort(clusters_out);
        rc = kvs_cli_fail("heads", st == KVS_ERR_INVALID_ARG ? KVS_ERR_DB : st);
        goto cleanup;
    }
    if (clusters_out && (st = kvs_out_commit(clusters_out)) != KVS_OK) {
        rc = kvs_cli_fail("heads", kvs_fail(st, "%s (heads run %lld is recorded in %s)", kvs_last_error(),
                                            (long long)run_id, db_path));
        goto cleanup;
    }
    int to_stdout = out_s && kvs_out_path_is_stdout(out_s);
    if (to_stdout) {
        /* The clusters file owns standard output: the report goes to stderr. */
        fprintf(stderr, "kvsim heads: heads run %lld written to %s; clustering on standard output\n",
                (long long)run_id, db_path);
        rc = kvs_cli_finish_stdout("heads");
        goto cleanup;
    }
    if (csv) {
        printf("kind,scope,layer_a,layer_b,sim,sim_other_kv,sim_same_kv,pairs,pairs_same_kv\n");
        csv_kind("query", lsq, kv, kv + LL, &split_q, L, H, H / U);
        csv_kind("unit", lsu, kv + 2 * LL, kv + 3 * LL, &split_u, L, U, 1);
        rc = kvs_cli_finish_stdout("heads");
        goto cleanup;
    }
    if (json) {
        printf("{\"trace\":");
        kvs_cli_json_string(stdout, path);
        printf(",\"model\":");
        kvs_cli_json_string(stdout, info->model.model_name);
        printf(",\"db\":");
        kvs_cli_json_string(stdout, db_path);
        printf(",\"run_id\":%lld,\"n_layers\":%d,\"n_heads\":%d,\"n_kv_heads\":%d,\"k\":%lld,\"n_steps\":%lld,",
               (long long)run_id, L, H, U, (long long)s->k, (long long)s->n_steps);
        json_kind("query", lsq, kv, kv + LL, &split_q, L);
        printf(",");
        json_kind("unit", lsu, kv + 2 * LL, kv + 3 * LL, &split_u, L);
        printf(",\"layers\":[");
        for (int32_t l = 0; l < L; l++) {
            printf("%s\n{\"layer\":%d,\"n_clusters\":%d,\"silhouette\":", l ? "," : "", l, cl->n_clusters[l]);
            kvs_cli_json_number(stdout, sil[l]);
            printf(",\"ari\":");
            kvs_cli_json_number(stdout, ca ? ari[l] : NAN);
            printf(",\"cluster\":[");
            for (int32_t u = 0; u < U; u++) printf("%s%d", u ? "," : "", cl->cluster[(size_t)l * (size_t)U + (size_t)u]);
            printf("],\"is_rep\":[");
            for (int32_t u = 0; u < U; u++) printf("%s%d", u ? "," : "", cl->is_rep[(size_t)l * (size_t)U + (size_t)u] ? 1 : 0);
            printf("]}");
        }
        printf("\n]}\n");
        rc = kvs_cli_finish_stdout("heads");
        goto cleanup;
    }
    printf("%s: %s, %d layers x %d query heads (%d KV heads = units), %lld decode steps, k_c = %lld\n", path,
           info->model.model_name, L, H, U, (long long)s->n_steps, (long long)s->k);
    if (notes[0]) printf("note: %s\n", notes);
    print_layer_matrix("query heads", lsq, &split_q, L);
    print_layer_matrix("units (KV groups, MAX-pooled)", lsu, &split_u, L);
    printf("clusters of units per layer (K-means on the rows of D = max(S) - S, seed %llu, ", (unsigned long long)seed);
    if (n_clusters) printf("%d clusters", n_clusters);
    else printf("number of clusters by silhouette over 2..%d", U - 1);
    printf("; * = representative)\n");
    if (ca) printf("stability: ARI between the clusterings of %s\n",
                   ao.halves ? "the first and the second half of the decode steps" : "TRACE and TRACE2");
    printf("%5s %8s %10s %s%s\n", "layer", "clusters", "silhouette", ca ? "    ARI " : "", " members");
    double ari_sum = 0;
    for (int32_t l = 0; l < L; l++) {
        printf("%5d %8d ", l, cl->n_clusters[l]);
        if (isnan(sil[l])) printf("%10s", "-");
        else printf("%10.4f", sil[l]);
        if (ca) {
            printf(" %7.4f", ari[l]);
            ari_sum += ari[l];
        }
        print_members(cl, l);
        if (ca) {
            printf("   [a:");
            print_members(ca, l);
            printf("  b:");
            print_members(cb, l);
            printf("]");
        }
        printf("\n");
    }
    if (ca) printf("mean ARI over layers %.4f\n", ari_sum / L);
    printf("heads run %lld written to %s", (long long)run_id, db_path);
    if (out_s) printf("; clusters written to %s", out_s);
    printf("\n");
    rc = kvs_cli_finish_stdout("heads");
cleanup:
    kvs_results_close(db);
    kvs_head_clusters_free(cl);
    kvs_head_clusters_free(ca);
    kvs_head_clusters_free(cb);
    kvs_analysis_heads_sim_free(s);
    kvs_analysis_heads_sim_free(s2);
    free(sil);
    free(sil_a);
    free(sil_b);
    free(ari);
    free(lsq);
    free(lsu);
    free(kv);
    kvs_trace_close(t);
    kvs_trace_close(t2);
    return rc;
}
