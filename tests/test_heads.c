/* test_heads.c — analysis/heads (head-to-head similarity, SyncKV Eq. 2; layer-to-layer similarity, Fig. 2c /
 * POLICY_SPEC §8.4g; per-layer clustering, §2.4), results/results_heads (the heads table family) and `kvsim heads`.
 * The streamed similarity is checked against a brute-force computation written separately here: the whole
 * GENERATED trace (tests/util/gen_trace.h, not a model) in memory, attention in double, top-k by a full sort,
 * overlaps by a double loop. Determinism of the clustering, the ARI of a trace's halves against clusterings made
 * directly from the brute-force half matrices, the database round trip (the SHA-256 of a clustering read from the
 * database equals the clusters file's), and bad input (no decode steps, k larger than the context, foreign,
 * empty or heads-less database, traces of different shapes): a clear error and nothing written.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <sqlite3.h>

#include "analysis/heads.h"
#include "common/kvs_cluster.h"
#include "common/sha256.h"
#include "plots/plot.h"
#include "results/results_heads.h"
#include "tests/util/cli_run.h"
#include "tests/util/gen_trace.h"
#include "tests/util/testenv.h"

enum { K = 4 };

typedef struct {
    char dir[64], path[128], db[128];
    kvs_gen_trace *g;
    kvs_trace *t;
} fixture;

/* 3 layers, 4 query heads on 2 KV heads (G = 2), 2 turns of 24 positions (12 prompt + 12 generated each), fp32:
 * 24 decode steps in two turns, the first of them attending to 13 positions. */
static int fx_setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    if (!f) return -1;
    snprintf(f->dir, sizeof f->dir, "/tmp/kvs_heads_XXXXXX");
    if (!mkdtemp(f->dir)) return -1;
    snprintf(f->path, sizeof f->path, "%s/t.kvt", f->dir);
    snprintf(f->db, sizeof f->db, "%s/r.db", f->dir);
    kvs_gen_trace_opts o = kvs_gen_trace_defaults();
    o.n_layers = 3;
    o.n_positions = 48;
    o.n_turns = 2;
    o.q_scale = 3.0f; /* peaked attention: clear top-k margins, so float and double rank alike */
    o.dtype = KVS_DTYPE_F32;
    o.seed = 7;
    if (kvs_gen_trace_create(&o, &f->g) != KVS_OK || kvs_gen_trace_write(f->g, f->path) != KVS_OK) return -1;
    if (kvs_trace_open(f->path, &f->t) != KVS_OK) return -1;
    *state = f;
    return 0;
}

static int fx_teardown(void **state) {
    fixture *f = *state;
    kvs_trace_close(f->t);
    kvs_gen_trace_free(f->g);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", f->dir);
    int rc = system(cmd);
    free(f);
    return rc == 0 ? 0 : -1;
}

/* ---- the brute-force reference ---- */


/* Membership mask of the k largest of p[0..n): selection by repeated maximum (ties to the lower index). */
static void naive_topk_mask(const double *p, int64_t n, int k, unsigned char *mask) {
    memset(mask, 0, (size_t)n);
    for (int r = 0; r < k; r++) {
        int64_t best = -1;
        for (int64_t j = 0; j < n; j++)
            if (!mask[j] && (best < 0 || p[j] > p[best])) best = j;
        mask[best] = 1;
    }
}

typedef struct {
    double *q, *u;       /* [L*H][L*H], [L*U][L*U] */
    double *half[2];     /* [L][U][U] */
    int64_t steps, half_steps[2];
} naive_sim;

/* Every decode step's top-k masks of every query head and unit, every pair's |A ∩ B| / k summed. */
static naive_sim naive_similarity(const kvs_gen_trace *g, int k) {
    const kvs_gen_trace_opts *o = &g->opt;
    const int L = o->n_layers, H = o->n_heads, U = o->n_kv_heads, G = H / U, N = o->n_positions;
    const int nq = L * H, nu = L * U;
    naive_sim r = {.q = calloc((size_t)nq * nq, sizeof(double)), .u = calloc((size_t)nu * nu, sizeof(double))};
    for (int h = 0; h < 2; h++) r.half[h] = calloc((size_t)L * U * U, sizeof(double));
    unsigned char *mq = malloc((size_t)nq * N), *mu = malloc((size_t)nu * N);
    double *p = malloc((size_t)N * sizeof *p), *pool = malloc((size_t)N * sizeof *pool);
    int64_t n_dec = 0;
    for (int t = 0; t < N; t++) n_dec += g->roles[t] == KVS_ROLE_GENERATED;
    for (int t = 0; t < N; t++) {
        if (g->roles[t] != KVS_ROLE_GENERATED) continue;
        for (int l = 0; l < L; l++)
            for (int u = 0; u < U; u++) {
                for (int j = 0; j <= t; j++) pool[j] = 0;
                for (int gi = 0; gi < G; gi++) {
                    kvs_gen_trace_naive_probs(g, l, u * G + gi, t, p);
                    naive_topk_mask(p, t + 1, k, mq + (size_t)(l * H + u * G + gi) * N);
                    for (int j = 0; j <= t; j++) pool[j] = fmax(pool[j], p[j]);
                }
                naive_topk_mask(pool, t + 1, k, mu + (size_t)(l * U + u) * N);
            }
        int half = r.steps < (n_dec + 1) / 2 ? 0 : 1;
        for (int kind = 0; kind < 2; kind++) {
            int n = kind ? nu : nq;
            unsigned char *m = kind ? mu : mq;
            for (int i = 0; i < n; i++)
                for (int j = 0; j < n; j++) {
                    int common = 0;
                    for (int x = 0; x <= t; x++) common += m[(size_t)i * N + x] && m[(size_t)j * N + x];
                    (kind ? r.u : r.q)[(size_t)i * n + j] += (double)common / k;
                    if (kind && i / U == j / U)
                        r.half[half][(size_t)(i / U) * U * U + (size_t)(i % U) * U + (size_t)(j % U)] += (double)common / k;
                }
        }
        r.steps++;
        r.half_steps[half]++;
    }
    for (int i = 0; i < nq * nq; i++) r.q[i] /= (double)r.steps;
    for (int i = 0; i < nu * nu; i++) r.u[i] /= (double)r.steps;
    for (int h = 0; h < 2; h++)
        for (int i = 0; i < L * U * U; i++) r.half[h][i] /= (double)r.half_steps[h];
    free(mq);
    free(mu);
    free(p);
    free(pool);
    return r;
}

static void naive_free(naive_sim *r) {
    free(r->q);
    free(r->u);
    free(r->half[0]);
    free(r->half[1]);
}

static void assert_close(double a, double b) {
    if (!(fabs(a - b) <= 1e-12)) fail_msg("%.17g != %.17g", a, b);
}

/* ---- tests ---- */

/* G5 (POLICY_SPEC §7): the overlap coefficient the similarity is built from. */
static void test_g5_overlap(void **state) {
    (void)state;
    const int32_t a[] = {1, 2, 3, 4}, b[] = {3, 4, 5, 6, 7, 8};
    assert_true(kvs_overlap_sorted(a, 4, b, 6) == 0.5);
}

static void test_streamed_similarity_equals_brute_force(void **state) {
    fixture *f = *state;
    kvs_analysis_heads_opts o = {.k = K, .halves = 1};
    kvs_analysis_heads_sim *s = NULL;
    assert_int_equal(kvs_analysis_heads_similarity(f->t, &o, &s), KVS_OK);
    naive_sim r = naive_similarity(f->g, K);
    assert_int_equal(s->n_steps, 24);
    assert_int_equal(s->n_steps, r.steps);
    assert_int_equal(s->n_steps_half[0], r.half_steps[0]);
    assert_int_equal(s->n_steps_half[1], r.half_steps[1]);
    assert_int_equal(s->k, K);
    assert_int_equal(s->first_decode_ctx, 13);
    const int L = 3, H = 4, U = 2;
    int off_diag_not_one = 0;
    for (int i = 0; i < L * H * L * H; i++) {
        assert_close(s->qhead_sim[i], r.q[i]);
        off_diag_not_one += r.q[i] < 1.0;
    }
    assert_true(off_diag_not_one > L * H); /* the fixture is not trivial: the heads' sets differ */
    for (int i = 0; i < L * U * L * U; i++) assert_close(s->unit_sim[i], r.u[i]);
    for (int h = 0; h < 2; h++)
        for (int i = 0; i < L * U * U; i++) assert_close(s->unit_sim_half[h][i], r.half[h][i]);
    /* Layer-to-layer: mean over head pairs, self pairs left out on the diagonal (the §8.4g reading). */
    double ls[9];
    kvs_analysis_heads_layer_sim(s->qhead_sim, L, H, ls);
    for (int a = 0; a < L; a++)
        for (int b = 0; b < L; b++) {
            double sum = 0;
            int n = 0;
            for (int i = 0; i < H; i++)
                for (int j = 0; j < H; j++)
                    if (a != b || i != j) sum += r.q[(a * H + i) * L * H + b * H + j], n++;
            assert_close(ls[a * L + b], sum / n);
        }
    naive_free(&r);
    kvs_analysis_heads_sim_free(s);
}

/* A hand case of the layer-to-layer mean: 2 layers of 2 heads. */
static void test_layer_similarity_hand_case(void **state) {
    (void)state;
    const double S[16] = {1, .5, .2, .4, /**/ .5, 1, .6, .8, /**/ .2, .6, 1, .3, /**/ .4, .8, .3, 1};
    double out[4];
    kvs_analysis_heads_layer_sim(S, 2, 2, out);
    assert_close(out[0], 0.5);                   /* (S01 + S10) / 2 */
    assert_close(out[1], (.2 + .4 + .6 + .8) / 4); /* every pair across */
    assert_close(out[2], out[1]);
    assert_close(out[3], 0.3);
    double per_head[16];
    kvs_analysis_heads_layer_sim(S, 4, 1, per_head); /* one head per layer: the diagonal has no pair */
    assert_true(isnan(per_head[0]) && isnan(per_head[15]));
    assert_close(per_head[1], .5);
}

/* Automatic choice: three clear groups of 2 in 6 units -> 3 clusters, the groups; same seed, same clusters. */
static void test_auto_clusters_and_determinism(void **state) {
    (void)state;
    enum { N = 6 };
    double S[N * N];
    for (int i = 0; i < N; i++)
        for (int j = 0; j < N; j++) S[i * N + j] = i == j ? 1.0 : (i / 2 == j / 2 ? 0.9 - 0.01 * (i + j) : 0.1 + 0.01 * i * j);
    kvs_head_clusters *a = NULL, *b = NULL;
    assert_int_equal(kvs_head_clusters_create(1, N, &a), KVS_OK);
    assert_int_equal(kvs_head_clusters_create(1, N, &b), KVS_OK);
    double sa, sb;
    assert_int_equal(kvs_analysis_heads_cluster(a, 0, S, 0, 5, &sa), KVS_OK);
    assert_int_equal(a->n_clusters[0], 3);
    for (int u = 0; u < N; u++) assert_int_equal(a->cluster[u], u / 2);
    /* the silhouette reported is the best over k = 2..5, computed here directly for each k */
    double best = -2;
    for (int k = 2; k <= N - 1; k++) {
        assert_int_equal(kvs_analysis_heads_cluster(b, 0, S, k, 5, &sb), KVS_OK);
        if (sb > best) best = sb;
    }
    assert_close(sa, best);
    assert_int_equal(kvs_analysis_heads_cluster(b, 0, S, 0, 5, &sb), KVS_OK);
    assert_memory_equal(a->cluster, b->cluster, N * sizeof *a->cluster);
    assert_memory_equal(a->is_rep, b->is_rep, N);
    assert_close(sa, sb);
    /* fixed k = 1 or k = n: no silhouette */
    assert_int_equal(kvs_analysis_heads_cluster(b, 0, S, 1, 5, &sb), KVS_OK);
    assert_true(isnan(sb));
    assert_int_equal(kvs_analysis_heads_cluster(b, 0, S, 7, 5, &sb), KVS_ERR_INVALID_ARG);
    kvs_head_clusters_free(a);
    kvs_head_clusters_free(b);
}

static const char *bin(void) { return kvs_test_kvsim_bin(); }


/* `kvsim heads --stability halves`: the database holds the brute-force similarity, the clustering file's digest
 * equals the digest of the clustering read back, and each layer's ARI is that of two clusterings made directly
 * from the brute-force half matrices. Twice with the same seed: the same clusters file, byte for byte. */
static void test_cli_halves_db_roundtrip_and_determinism(void **state) {
    fixture *f = *state;
    if (!bin()) skip();
    char out[160], err[160], cl1[160], cl2[160];
    snprintf(out, sizeof out, "%s/out.txt", f->dir);
    snprintf(err, sizeof err, "%s/err.txt", f->dir);
    snprintf(cl1, sizeof cl1, "%s/c1.txt", f->dir);
    snprintf(cl2, sizeof cl2, "%s/c2.txt", f->dir);
    const char *a1[] = {"heads", f->path, "--db", f->db, "--k", "4", "--seed", "3", "--stability", "halves",
                        "--clusters-out", cl1, NULL};
    assert_int_equal(kvs_test_cli(out, err, a1), 0);
    const char *a2[] = {"heads", f->path, "--db", f->db, "--k", "4", "--seed", "3", "--clusters-out", cl2, NULL};
    assert_int_equal(kvs_test_cli(out, err, a2), 0);
    size_t n1, n2;
    char *t1 = kvs_test_slurp(cl1, &n1), *t2 = kvs_test_slurp(cl2, &n2);
    assert_non_null(t1);
    assert_non_null(t2);
    assert_int_equal(n1, n2);
    assert_memory_equal(t1, t2, n1);
    free(t1);
    free(t2);

    kvs_results_db *db = NULL;
    assert_int_equal(kvs_results_open_readonly(f->db, &db), KVS_OK);
    kvs_results_heads_row *r = NULL;
    assert_int_equal(kvs_results_heads_read(db, 1, NULL, NULL, &r), KVS_OK);
    naive_sim ref = naive_similarity(f->g, K);
    const int L = 3, H = 4, U = 2;
    assert_int_equal(r->n_layers, L);
    assert_int_equal(r->k, K);
    assert_int_equal(r->n_steps, 24);
    assert_int_equal(r->seed, 3);
    assert_string_equal(r->stability, "halves");
    for (int i = 0; i < L * H * L * H; i++) assert_close(r->qhead_sim[i], ref.q[i]);
    for (int i = 0; i < L * U * L * U; i++) assert_close(r->unit_sim[i], ref.u[i]);
    for (int l = 0; l < L; l++) {
        kvs_head_clusters *ca = NULL, *cb = NULL;
        assert_int_equal(kvs_head_clusters_create(1, U, &ca), KVS_OK);
        assert_int_equal(kvs_head_clusters_create(1, U, &cb), KVS_OK);
        const kvs_kmeans_opts ko = {.seed = 3};
        assert_int_equal(kvs_head_clusters_from_similarity(ca, 0, ref.half[0] + l * U * U, 2, &ko), KVS_OK);
        assert_int_equal(kvs_head_clusters_from_similarity(cb, 0, ref.half[1] + l * U * U, 2, &ko), KVS_OK);
        double ari;
        assert_int_equal(kvs_adjusted_rand(ca->cluster, cb->cluster, U, &ari), KVS_OK);
        assert_close(r->ari[l], ari);
        kvs_head_clusters_free(ca);
        kvs_head_clusters_free(cb);
    }
    /* The clustering: from the run's whole-trace similarity, and the same digest as the file's. */
    kvs_head_clusters *c = NULL, *fc = NULL;
    char sha_db[65], sha_file[65];
    assert_int_equal(kvs_results_heads_read_clusters(db, 1, &c, sha_db), KVS_OK);
    assert_int_equal(kvs_head_clusters_read(cl1, &fc, sha_file), KVS_OK);
    assert_string_equal(sha_db, sha_file);
    assert_string_equal(sha_db, r->clusters_sha256);
    assert_memory_equal(c->cluster, fc->cluster, (size_t)L * U * sizeof *c->cluster);
    kvs_head_clusters_free(c);
    /* run id <= 0: the latest run (the second, without stability) */
    assert_int_equal(kvs_results_heads_read_clusters(db, 0, &c, NULL), KVS_OK);
    assert_memory_equal(c->cluster, fc->cluster, (size_t)L * U * sizeof *c->cluster);
    kvs_head_clusters_free(c);
    kvs_head_clusters_free(fc);
    assert_int_equal(kvs_results_heads_read_clusters(db, 99, &c, NULL), KVS_ERR_DB);
    assert_non_null(strstr(kvs_last_error(), "no heads run 99"));
    kvs_results_heads_row_free(r);
    naive_free(&ref);
    kvs_results_close(db);
}

/* Exit status, a message containing `msg`, and the database path untouched (absent, or byte-identical). */
static void expect_refused(fixture *f, const char *const *args, int want_rc, const char *msg, const char *db,
                           const char *db_before) {
    char out[160], err[160];
    snprintf(out, sizeof out, "%s/out.txt", f->dir);
    snprintf(err, sizeof err, "%s/err.txt", f->dir);
    assert_int_equal(kvs_test_cli(out, err, args), want_rc);
    char *e = kvs_test_slurp(err, NULL);
    assert_non_null(e);
    if (!strstr(e, msg)) fail_msg("stderr '%s' lacks '%s'", e, msg);
    free(e);
    if (!db_before) {
        assert_int_not_equal(access(db, F_OK), 0);
    } else {
        char *now = kvs_test_slurp(db, NULL);
        assert_non_null(now);
        assert_string_equal(now, db_before);
        free(now);
    }
}

static void test_cli_bad_input(void **state) {
    fixture *f = *state;
    if (!bin()) skip();
    /* a trace without decode steps */
    char nodec[160];
    snprintf(nodec, sizeof nodec, "%s/nodec.kvt", f->dir);
    kvs_gen_trace_opts o = kvs_gen_trace_defaults();
    o.prompt_len = o.n_positions;
    kvs_gen_trace *g = NULL;
    assert_int_equal(kvs_gen_trace_create(&o, &g), KVS_OK);
    assert_int_equal(kvs_gen_trace_write(g, nodec), KVS_OK);
    kvs_gen_trace_free(g);
    const char *a1[] = {"heads", nodec, "--db", f->db, NULL};
    expect_refused(f, a1, 1, "no generated positions", f->db, NULL);
    /* k larger than the context of the first decode step (13 positions) */
    const char *a2[] = {"heads", f->path, "--db", f->db, "--k", "14", NULL};
    expect_refused(f, a2, 2, "larger than the context of the first decode step (13 positions", f->db, NULL);
    /* two halves of a single decode step */
    char onedec[160];
    snprintf(onedec, sizeof onedec, "%s/onedec.kvt", f->dir);
    o = kvs_gen_trace_defaults();
    o.prompt_len = o.n_positions - 1;
    assert_int_equal(kvs_gen_trace_create(&o, &g), KVS_OK);
    assert_int_equal(kvs_gen_trace_write(g, onedec), KVS_OK);
    kvs_gen_trace_free(g);
    const char *a7[] = {"heads", onedec, "--db", f->db, "--k", "2", "--stability", "halves", NULL};
    expect_refused(f, a7, 1, "two halves need at least 2", f->db, NULL);
    /* a trace of another shape for --stability */
    char other[160];
    snprintf(other, sizeof other, "%s/other.kvt", f->dir);
    o = kvs_gen_trace_defaults();
    assert_int_equal(kvs_gen_trace_create(&o, &g), KVS_OK);
    assert_int_equal(kvs_gen_trace_write(g, other), KVS_OK);
    kvs_gen_trace_free(g);
    const char *a3[] = {"heads", f->path, "--db", f->db, "--stability", other, NULL};
    expect_refused(f, a3, 1, "cannot be compared", f->db, NULL);
    /* bad usage */
    const char *a4[] = {"heads", f->path, "--db", f->db, "--clusters", "many", NULL};
    expect_refused(f, a4, 2, "--clusters", f->db, NULL);
    const char *a5[] = {"heads", f->path, NULL};
    expect_refused(f, a5, 2, "missing --db", f->db, NULL);
    /* a foreign file as the database: refused before the analysis, unchanged */
    char foreign[160];
    snprintf(foreign, sizeof foreign, "%s/foreign.db", f->dir);
    FILE *fp = fopen(foreign, "wb");
    fputs("not a database\n", fp);
    fclose(fp);
    const char *a6[] = {"heads", f->path, "--db", foreign, NULL};
    expect_refused(f, a6, 1, "not a kvsim results database", foreign, "not a database\n");
    /* reading heads results from a kvsim database without any, and from an empty file */
    char replay_db[160];
    snprintf(replay_db, sizeof replay_db, "%s/noheads.db", f->dir);
    kvs_results_db *db = NULL;
    assert_int_equal(kvs_results_open(replay_db, &db), KVS_OK);
    kvs_head_clusters *c = NULL;
    assert_int_equal(kvs_results_heads_read_clusters(db, 0, &c, NULL), KVS_ERR_DB);
    assert_non_null(strstr(kvs_last_error(), "no heads results"));
    assert_null(c);
    kvs_results_close(db);
    char empty[160];
    snprintf(empty, sizeof empty, "%s/empty.db", f->dir);
    fp = fopen(empty, "wb");
    fclose(fp);
    assert_int_not_equal(kvs_results_open_readonly(empty, &db), KVS_OK);
    struct stat sb;
    assert_int_equal(stat(empty, &sb), 0);
    assert_int_equal(sb.st_size, 0);
}

/* The default k (64) is clipped to the first decode context of a small trace, and the run says so. */
static void test_default_k_clipped_and_noted(void **state) {
    fixture *f = *state;
    kvs_analysis_heads_sim *s = NULL;
    assert_int_equal(kvs_analysis_heads_similarity(f->t, NULL, &s), KVS_OK);
    assert_int_equal(s->k, 13);
    assert_int_equal(s->k_clipped, 1);
    kvs_analysis_heads_sim_free(s);
    if (!bin()) return;
    char out[160];
    snprintf(out, sizeof out, "%s/out.txt", f->dir);
    const char *a[] = {"heads", f->path, "--db", f->db, "--clusters", "auto", NULL};
    assert_int_equal(kvs_test_cli(out, NULL, a), 0);
    char *o = kvs_test_slurp(out, NULL);
    assert_non_null(strstr(o, "k_c 64 clipped to 13"));
    assert_non_null(strstr(o, "by silhouette over 2..1")); /* 2 units: 1 cluster, said so */
    free(o);
    kvs_results_db *db = NULL;
    kvs_results_heads_row *r = NULL;
    assert_int_equal(kvs_results_open_readonly(f->db, &db), KVS_OK);
    assert_int_equal(kvs_results_heads_read(db, 0, "t.kvt", NULL, &r), KVS_OK);
    assert_non_null(strstr(r->notes, "clipped"));
    assert_int_equal(r->clusters->n_clusters[0], 1);
    kvs_results_heads_row_free(r);
    assert_int_equal(kvs_results_heads_read(db, 0, "elsewhere.kvt", NULL, &r), KVS_ERR_DB);
    assert_non_null(strstr(kvs_last_error(), "no heads run matching"));
    kvs_results_close(db);
}

/* The heads plots: the script's datablock is the stored matrix in cluster order, one box per cluster; a database
 * without heads runs is refused; with gnuplot present, a real PNG. */
static void test_heads_plots(void **state) {
    fixture *f = *state;
    kvs_analysis_heads_sim *s = NULL;
    kvs_analysis_heads_opts ao = {.k = K};
    assert_int_equal(kvs_analysis_heads_similarity(f->t, &ao, &s), KVS_OK);
    const int L = 3, H = 4, U = 2;
    double lsq[9], lsu[9], sil[3], block[4];
    kvs_analysis_heads_layer_sim(s->qhead_sim, L, H, lsq);
    kvs_analysis_heads_layer_sim(s->unit_sim, L, U, lsu);
    kvs_head_clusters *c = NULL;
    assert_int_equal(kvs_head_clusters_create(L, U, &c), KVS_OK);
    for (int l = 0; l < L; l++) {
        kvs_analysis_heads_layer_block(s->unit_sim, L, U, l, block);
        assert_int_equal(kvs_analysis_heads_cluster(c, l, block, l == 1 ? 1 : 2, 0, &sil[l]), KVS_OK);
    }
    kvs_results_db *db = NULL;
    assert_int_equal(kvs_results_open(f->db, &db), KVS_OK);
    kvs_trace_info const *info = kvs_trace_info_get(f->t);
    kvs_results_trace rt = kvs_results_trace_of(f->path, info);
    kvs_results_heads_run run = {.k = s->k, .n_steps = s->n_steps, .n_clusters_requested = 2, .kvsim_version = "t"};
    kvs_results_heads_data d = {.n_layers = L, .n_heads = H, .n_kv_heads = U, .qhead_sim = s->qhead_sim,
                                .unit_sim = s->unit_sim, .layer_sim_q = lsq, .layer_sim_u = lsu, .clusters = c,
                                .silhouette = sil};
    assert_int_equal(kvs_results_heads_write(db, &rt, &run, &d, NULL), KVS_OK);
    kvs_results_close(db);

    char png[160];
    snprintf(png, sizeof png, "%s/h.png", f->dir);
    kvs_plot_options o = {.kind = KVS_PLOT_HEAD_SIMILARITY, .layer = -1, .budget_tokens = -1, .out_path = png};
    kvs_plot *p = NULL;
    assert_int_equal(kvs_plot_prepare(f->db, &o, &p), KVS_OK);
    char *text = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&text, &len);
    assert_int_equal(kvs_plot_write_script(p, "img.png", m), KVS_OK);
    fclose(m);
    int boxes = 0;
    for (const char *q = text; (q = strstr(q, "# cluster: ")); q++) boxes++;
    assert_int_equal(boxes, 2 + 1 + 2);
    /* the datablock: rows in (layer, cluster, unit) order, values as stored */
    int order[6], k = 0;
    for (int l = 0; l < L; l++)
        for (int g = 0; g < c->n_clusters[l]; g++)
            for (int u = 0; u < U; u++)
                if (c->cluster[l * U + u] == g) order[k++] = l * U + u;
    const char *row = strstr(text, "$S << EOD\n");
    assert_non_null(row);
    row += strlen("$S << EOD\n");
    for (int i = 0; i < 6; i++)
        for (int j = 0; j < 6; j++) {
            char *end;
            double v = strtod(row, &end);
            assert_true(end != row);
            assert_true(v == s->unit_sim[order[i] * 6 + order[j]]);
            row = end;
        }
    free(text);
    kvs_plot_free(p);
    o.kind = KVS_PLOT_LAYER_SIMILARITY;
    o.layer = 1;
    assert_int_equal(kvs_plot_prepare(f->db, &o, &p), KVS_ERR_INVALID_ARG);
    o.layer = -1;
    o.metric = "out_err_mean";
    assert_int_equal(kvs_plot_prepare(f->db, &o, &p), KVS_ERR_INVALID_ARG);
    o.metric = NULL;
    if (access("/usr/bin/gnuplot", X_OK) == 0) {
        assert_int_equal(kvs_plot_make(f->db, &o), KVS_OK);
        char *img = kvs_test_slurp(png, &len);
        assert_non_null(img);
        assert_true(len > 8 && !memcmp(img, "\x89PNG", 4));
        free(img);
    }
    /* a kvsim database without heads runs */
    char other[160];
    snprintf(other, sizeof other, "%s/noheads.db", f->dir);
    assert_int_equal(kvs_results_open(other, &db), KVS_OK);
    kvs_results_close(db);
    assert_int_equal(kvs_plot_prepare(other, &o, &p), KVS_ERR_DB);
    assert_non_null(strstr(kvs_last_error(), "no heads results"));
    kvs_head_clusters_free(c);
    kvs_analysis_heads_sim_free(s);
}


/* The within/across split of the query heads' similarity by brute force over every ordered pair of distinct heads:
 * classified by (layer, KV head = head / G) straight from the pair matrix, pooled means over the pairs. */
typedef struct {
    double within, within_other, within_same, across;
    int64_t n_within, n_same, n_across;
} brute_split;

static brute_split brute_split_of(const double *q, int L, int H, int G) {
    brute_split b = {0};
    double s_other = 0;
    for (int la = 0; la < L; la++)
        for (int i = 0; i < H; i++)
            for (int lb = 0; lb < L; lb++)
                for (int j = 0; j < H; j++) {
                    if (la == lb && i == j) continue;
                    const double v = q[(la * H + i) * L * H + lb * H + j];
                    if (la != lb) {
                        b.across += v, b.n_across++;
                        continue;
                    }
                    b.within += v, b.n_within++;
                    if (i / G == j / G) b.within_same += v, b.n_same++;
                    else s_other += v;
                }
    b.within_other = s_other / (double)(b.n_within - b.n_same);
    b.within /= (double)b.n_within;
    b.within_same /= (double)b.n_same;
    b.across /= (double)b.n_across;
    return b;
}

/* A field of a CSV line after `key` (field index `field` counted from there); NaN for an empty field. */
static double csv_field(const char *text, const char *key, int field) {
    const char *p = strstr(text, key);
    if (!p) fail_msg("no '%s' in the CSV", key);
    p += strlen(key);
    for (int i = 0; i < field; i++) p = strchr(p, ',') + 1;
    if (*p == ',' || *p == '\n') return NAN;
    return strtod(p, NULL);
}

/* The number after `"key":` following `after` in a JSON text. */
static double json_field(const char *text, const char *after, const char *key) {
    const char *p = strstr(text, after);
    if (!p) fail_msg("no '%s' in the JSON", after);
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    p = strstr(p, pat);
    if (!p) fail_msg("no '%s' after '%s' in the JSON", key, after);
    p += strlen(pat);
    return !strncmp(p, "null", 4) ? NAN : strtod(p, NULL);
}

/* The number printed (4 decimals) after the first `label` of text is v. */
static void assert_text_number(const char *text, const char *label, double v) {
    const char *p = text ? strstr(text, label) : NULL;
    if (!p) fail_msg("no '%s' in '%s'", label, text ? text : "(null)");
    const double got = strtod(p + strlen(label), NULL);
    if (!(fabs(got - v) <= 0.5e-4 + 1e-12)) fail_msg("'%s' %.4f, expected %.6f", label, got, v);
}

static void assert_same_or_nan(double a, double b) {
    if (isnan(a) && isnan(b)) return;
    assert_close(a, b);
}

/* Pairs of query heads that share a KV head (same GQA group: identical keys) are split from the others: the
 * analysis' cells and means, `kvsim heads` text, CSV and JSON, and the tables (per pair same_kv, per cell
 * sim_other_kv / sim_same_kv) against a brute force over the pairs of the brute-force similarity. Then the old
 * form (tables without the new columns) reads back the same split. */
static void test_same_kv_pairs_split(void **state) {
    fixture *f = *state;
    const int L = 3, H = 4, U = 2, G = 2;
    naive_sim ref = naive_similarity(f->g, K);
    const brute_split b = brute_split_of(ref.q, L, H, G);
    assert_int_equal(b.n_within, L * H * (H - 1));
    assert_int_equal(b.n_same, L * H * (G - 1));
    assert_true(fabs(b.within_same - b.within_other) > 1e-3); /* the fixture tells the two kinds of pair apart */

    kvs_analysis_heads_opts ao = {.k = K};
    kvs_analysis_heads_sim *s = NULL;
    assert_int_equal(kvs_analysis_heads_similarity(f->t, &ao, &s), KVS_OK);
    double all[9], other[9], same[9], uall[9], uother[9], usame[9];
    kvs_analysis_heads_layer_sim(s->qhead_sim, L, H, all);
    kvs_analysis_heads_layer_sim_kv(s->qhead_sim, L, H, G, other, same);
    kvs_analysis_heads_layer_sim(s->unit_sim, L, U, uall);
    kvs_analysis_heads_layer_sim_kv(s->unit_sim, L, U, 1, uother, usame);
    /* per cell, against the pairs of that cell */
    for (int la = 0; la < L; la++)
        for (int lb = 0; lb < L; lb++) {
            double so = 0, ss = 0;
            int no = 0, ns = 0;
            for (int i = 0; i < H; i++)
                for (int j = 0; j < H; j++) {
                    if (la == lb && i == j) continue;
                    const double v = ref.q[(la * H + i) * L * H + lb * H + j];
                    if (la == lb && i / G == j / G) ss += v, ns++;
                    else so += v, no++;
                }
            assert_close(other[la * L + lb], so / no);
            if (ns) assert_close(same[la * L + lb], ss / ns);
            else assert_true(isnan(same[la * L + lb]));
            assert_close(uother[la * L + lb], uall[la * L + lb]); /* units never share a KV head */
            assert_true(isnan(usame[la * L + lb]));
        }
    const kvs_analysis_heads_split sp = kvs_analysis_heads_split_of(all, other, same, L, H, G);
    assert_close(sp.within, b.within);
    assert_close(sp.within_other_kv, b.within_other);
    assert_close(sp.within_same_kv, b.within_same);
    assert_close(sp.across, b.across);
    assert_close(sp.across_other_kv, b.across);
    assert_int_equal(sp.pairs_within, b.n_within);
    assert_int_equal(sp.pairs_within_same_kv, b.n_same);
    assert_int_equal(sp.pairs_across, b.n_across);
    const kvs_analysis_heads_split su = kvs_analysis_heads_split_of(uall, uother, usame, L, U, 1);
    assert_int_equal(su.pairs_within_same_kv, 0);
    assert_close(su.within_other_kv, su.within);
    assert_true(isnan(su.within_same_kv));
    kvs_analysis_heads_sim_free(s);
    if (!bin()) {
        naive_free(&ref);
        return;
    }

    char out[160], err[160];
    snprintf(out, sizeof out, "%s/out.txt", f->dir);
    snprintf(err, sizeof err, "%s/err.txt", f->dir);
    /* text: the old line kept (labelled), the split beside it */
    const char *a_text[] = {"heads", f->path, "--db", f->db, "--k", "4", NULL};
    assert_int_equal(kvs_test_cli(out, err, a_text), 0);
    char *t = kvs_test_slurp(out, NULL), want[160];
    assert_text_number(t, "all pairs: intralayer (diagonal) mean ", b.within);
    assert_text_number(t, ", interlayer (off-diagonal) mean ", b.across);
    snprintf(want, sizeof want, "without the %lld of %lld intralayer pairs that share a KV head (identical keys): intralayer ",
             (long long)b.n_same, (long long)b.n_within);
    assert_text_number(t, want, b.within_other);
    assert_text_number(strstr(t, want), ", interlayer ", b.across);
    assert_text_number(t, "the pairs that share one: ", b.within_same);
    assert_non_null(strstr(t, "no two of them share a KV head")); /* units */
    free(t);
    /* CSV */
    const char *a_csv[] = {"heads", f->path, "--db", f->db, "--k", "4", "--csv", NULL};
    assert_int_equal(kvs_test_cli(out, err, a_csv), 0);
    t = kvs_test_slurp(out, NULL);
    static const char header[] = "kind,scope,layer_a,layer_b,sim,sim_other_kv,sim_same_kv,pairs,pairs_same_kv\n";
    assert_true(!strncmp(t, header, strlen(header)));
    assert_close(csv_field(t, "\nquery,within,,,", 0), b.within);
    assert_close(csv_field(t, "\nquery,within,,,", 1), b.within_other);
    assert_close(csv_field(t, "\nquery,within,,,", 2), b.within_same);
    assert_close(csv_field(t, "\nquery,within,,,", 3), (double)b.n_within);
    assert_close(csv_field(t, "\nquery,within,,,", 4), (double)b.n_same);
    assert_close(csv_field(t, "\nquery,across,,,", 0), b.across);
    assert_close(csv_field(t, "\nquery,across,,,", 1), b.across);
    assert_true(isnan(csv_field(t, "\nunit,within,,,", 2)));
    assert_close(csv_field(t, "\nquery,layer,1,1,", 1), other[1 * L + 1]);
    assert_close(csv_field(t, "\nquery,layer,1,1,", 2), same[1 * L + 1]);
    assert_true(isnan(csv_field(t, "\nquery,layer,0,2,", 2)));
    free(t);
    /* JSON */
    const char *a_json[] = {"heads", f->path, "--db", f->db, "--k", "4", "--json", NULL};
    assert_int_equal(kvs_test_cli(out, err, a_json), 0);
    t = kvs_test_slurp(out, NULL);
    assert_close(json_field(t, "\"query\":", "within"), b.within);
    assert_close(json_field(t, "\"query\":", "within_other_kv"), b.within_other);
    assert_close(json_field(t, "\"query\":", "within_same_kv"), b.within_same);
    assert_close(json_field(t, "\"query\":", "across_other_kv"), b.across);
    assert_true(isnan(json_field(t, "\"unit\":", "within_same_kv")));
    free(t);
    /* both, or one with the clusters file on standard output: usage errors */
    const char *a_both[] = {"heads", f->path, "--db", f->db, "--csv", "--json", NULL};
    assert_int_equal(kvs_test_cli(out, err, a_both), 2);
    const char *a_stdout[] = {"heads", f->path, "--db", f->db, "--csv", "--clusters-out", "-", NULL};
    assert_int_equal(kvs_test_cli(out, err, a_stdout), 2);

    /* the tables: every pair's same_kv, every cell's split, and the reader (runs 1-3 are the three above) */
    for (int form = 0; form < 2; form++) {
        kvs_results_db *db = NULL;
        assert_int_equal(kvs_results_open_readonly(f->db, &db), KVS_OK);
        kvs_results_heads_row *r = NULL;
        assert_int_equal(kvs_results_heads_read(db, 1, NULL, NULL, &r), KVS_OK);
        for (int i = 0; i < L * L; i++) {
            assert_same_or_nan(r->layer_sim_q_other_kv[i], other[i]);
            assert_same_or_nan(r->layer_sim_q_same_kv[i], same[i]);
            assert_same_or_nan(r->layer_sim_u_other_kv[i], uother[i]);
        }
        kvs_results_heads_row_free(r);
        kvs_results_close(db);
        if (form == 1) break;
        sqlite3 *raw = NULL;
        sqlite3_stmt *q = NULL;
        assert_int_equal(sqlite3_open(f->db, &raw), SQLITE_OK);
        assert_int_equal(sqlite3_prepare_v2(raw, "SELECT layer_a, head_a, layer_b, head_b, same_kv FROM heads_similarity "
                                                 "WHERE run_id = 1 AND kind = 'query'", -1, &q, NULL),
                         SQLITE_OK);
        int rows = 0, shared = 0;
        while (sqlite3_step(q) == SQLITE_ROW) {
            const int la = sqlite3_column_int(q, 0), i = sqlite3_column_int(q, 1), lb = sqlite3_column_int(q, 2),
                      j = sqlite3_column_int(q, 3);
            assert_int_equal(sqlite3_column_int(q, 4), la == lb && i / G == j / G);
            shared += sqlite3_column_int(q, 4);
            rows++;
        }
        sqlite3_finalize(q);
        assert_int_equal(rows, L * H * L * H);
        assert_int_equal(shared, b.n_same + L * H); /* and every head with itself */
        /* the old form: without the new columns, the reader computes the split from the stored pairs */
        assert_int_equal(sqlite3_exec(raw, "ALTER TABLE heads_similarity DROP COLUMN same_kv; ALTER TABLE "
                                           "heads_layer_similarity DROP COLUMN sim_other_kv; ALTER TABLE "
                                           "heads_layer_similarity DROP COLUMN sim_same_kv;",
                                      NULL, NULL, NULL),
                         SQLITE_OK);
        sqlite3_close(raw);
    }
    /* a new run into the old form adds the columns back; the old runs still read their split */
    assert_int_equal(kvs_test_cli(out, err, a_text), 0);
    kvs_results_db *db = NULL;
    assert_int_equal(kvs_results_open_readonly(f->db, &db), KVS_OK);
    for (int64_t run = 1; run <= 4; run += 3) {
        kvs_results_heads_row *r = NULL;
        assert_int_equal(kvs_results_heads_read(db, run, NULL, NULL, &r), KVS_OK);
        for (int i = 0; i < L * L; i++) assert_same_or_nan(r->layer_sim_q_other_kv[i], other[i]);
        kvs_results_heads_row_free(r);
    }
    kvs_results_close(db);
    naive_free(&ref);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_g5_overlap),
        cmocka_unit_test_setup_teardown(test_streamed_similarity_equals_brute_force, fx_setup, fx_teardown),
        cmocka_unit_test(test_layer_similarity_hand_case),
        cmocka_unit_test(test_auto_clusters_and_determinism),
        cmocka_unit_test_setup_teardown(test_cli_halves_db_roundtrip_and_determinism, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_cli_bad_input, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_default_k_clipped_and_noted, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_heads_plots, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_same_kv_pairs_split, fx_setup, fx_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
