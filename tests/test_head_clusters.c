/* test_head_clusters.c — common/head_clusters.c: the SyncKV derivation of clusters and representatives from a
 * similarity matrix (POLICY_SPEC §2.4 steps 3-5) against a hand-worked case and against a direct evaluation
 * (K-means of the rows of D = max(S) - S), the file form (round trip, byte-exact output, SHA-256 of the file),
 * and every malformed file the reader must refuse with the line named.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../common/head_clusters.h"
#include "../common/sha256.h"

static char dir[64];

static int setup(void **state) {
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/kvs_hc_XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    char cmd[96];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, strlen(text), f), strlen(text));
    assert_int_equal(fclose(f), 0);
}

/* Two obvious groups {0,1,2} and {3,4,5} (overlap 0.9 inside, 0.1 across, 1 on the diagonal), where units 1
 * and 4 overlap a little more with their group's others (0.95): D = 1 - S, and the rows of 1 and 4 are the
 * ones nearest their groups' mean rows, so they are the representatives (checked directly as well). */
static void test_similarity_to_clusters_hand_case(void **state) {
    (void)state;
    enum { N = 6 };
    double S[N * N];
    for (int i = 0; i < N; i++)
        for (int j = 0; j < N; j++) S[i * N + j] = i == j ? 1.0 : ((i < 3) == (j < 3) ? 0.9 : 0.1);
    const int pairs[4][2] = {{0, 1}, {1, 2}, {3, 4}, {4, 5}};
    for (int p = 0; p < 4; p++) S[pairs[p][0] * N + pairs[p][1]] = S[pairs[p][1] * N + pairs[p][0]] = 0.95;
    kvs_head_clusters *c = NULL;
    assert_int_equal(kvs_head_clusters_create(2, N, &c), KVS_OK);
    assert_int_equal(kvs_head_clusters_from_similarity(c, 1, S, 2, NULL), KVS_OK);
    const int32_t want[N] = {0, 0, 0, 1, 1, 1};
    for (int u = 0; u < N; u++) assert_int_equal(c->cluster[N + u], want[u]);
    /* Representatives, directly: the member whose D-row is nearest its cluster's mean D-row. */
    for (int g = 0; g < 2; g++) {
        double mu[N] = {0};
        for (int u = 0; u < N; u++)
            if (want[u] == g)
                for (int j = 0; j < N; j++) mu[j] += (1.0 - S[u * N + j]) / 3;
        int best = -1;
        double bd = 1e300;
        for (int u = 0; u < N; u++) {
            if (want[u] != g) continue;
            double d = 0;
            for (int j = 0; j < N; j++) d += (1.0 - S[u * N + j] - mu[j]) * (1.0 - S[u * N + j] - mu[j]);
            if (d < bd) bd = d, best = u;
        }
        for (int u = 0; u < N; u++)
            if (want[u] == g) assert_int_equal(c->is_rep[N + u], u == best);
    }
    assert_int_equal(c->is_rep[N + 1], 1);
    assert_int_equal(c->is_rep[N + 4], 1);
    /* Layer 0 was never set: one cluster, no representative yet -> the check refuses it. */
    assert_int_equal(kvs_head_clusters_check(c), KVS_ERR_FORMAT);
    assert_non_null(strstr(kvs_last_error(), "layer 0 cluster 0 has 0 representatives"));
    assert_int_equal(kvs_head_clusters_from_similarity(c, 0, S, 1, NULL), KVS_OK);
    assert_int_equal(kvs_head_clusters_check(c), KVS_OK);
    assert_int_equal(kvs_head_clusters_from_similarity(c, 2, S, 2, NULL), KVS_ERR_INVALID_ARG);
    assert_int_equal(kvs_head_clusters_from_similarity(c, 0, S, N + 1, NULL), KVS_ERR_INVALID_ARG);
    kvs_head_clusters_free(c);
}

static void test_file_round_trip_and_hash(void **state) {
    (void)state;
    kvs_head_clusters *c = NULL, *back = NULL;
    assert_int_equal(kvs_head_clusters_create(2, 4, &c), KVS_OK);
    const int32_t cl[8] = {0, 1, 0, 1, 0, 0, 0, 0};
    const uint8_t rep[8] = {0, 1, 1, 0, 0, 0, 1, 0};
    memcpy(c->cluster, cl, sizeof cl);
    memcpy(c->is_rep, rep, sizeof rep);
    c->n_clusters[0] = 2;
    c->n_clusters[1] = 1;
    char path[128], hex[65], want_hex[65];
    snprintf(path, sizeof path, "%s/c.txt", dir);
    assert_int_equal(kvs_head_clusters_write(c, path), KVS_OK);
    const char *want = "kvsim-head-clusters 1\nlayers 2 units 4\n# layer unit cluster representative\n"
                       "0 0 0 0\n0 1 1 1\n0 2 0 1\n0 3 1 0\n1 0 0 0\n1 1 0 0\n1 2 0 1\n1 3 0 0\n";
    FILE *f = fopen(path, "rb");
    char buf[512] = {0};
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    assert_int_equal(n, strlen(want));
    assert_string_equal(buf, want);
    assert_int_equal(kvs_head_clusters_read(path, &back, hex), KVS_OK);
    kvs_sha256_hex(want, strlen(want), want_hex);
    assert_string_equal(hex, want_hex);
    assert_int_equal(back->n_layers, 2);
    assert_int_equal(back->n_units, 4);
    assert_memory_equal(back->cluster, cl, sizeof cl);
    assert_memory_equal(back->is_rep, rep, sizeof rep);
    assert_int_equal(back->n_clusters[0], 2);
    assert_int_equal(back->n_clusters[1], 1);
    kvs_head_clusters_free(back);
    /* An invalid clustering is not written, and no file is left. */
    c->is_rep[0] = 1;
    snprintf(path, sizeof path, "%s/bad.txt", dir);
    assert_int_equal(kvs_head_clusters_write(c, path), KVS_ERR_FORMAT);
    assert_int_equal(access(path, F_OK), -1);
    kvs_head_clusters_free(c);
}

/* kvs_head_clusters_write_begin: the file is not in place (an older one keeps its content) until kvs_out_commit;
 * kvs_out_abort leaves the older file and no temporary; the committed file is what kvs_head_clusters_write makes. */
static void test_write_begin_puts_the_file_in_place_only_on_commit(void **state) {
    (void)state;
    kvs_head_clusters *c = NULL;
    assert_int_equal(kvs_head_clusters_create(1, 2, &c), KVS_OK);
    c->is_rep[0] = 1;
    c->n_clusters[0] = 1;
    char path[128], ref[128], buf[256], want[256];
    snprintf(path, sizeof path, "%s/begin.txt", dir);
    snprintf(ref, sizeof ref, "%s/ref.txt", dir);
    assert_int_equal(kvs_head_clusters_write(c, ref), KVS_OK);
    FILE *f = fopen(path, "w");
    fputs("old\n", f);
    fclose(f);
    kvs_out *o = NULL;
    assert_int_equal(kvs_head_clusters_write_begin(c, path, &o), KVS_OK);
    assert_non_null(o);
    f = fopen(path, "r");
    memset(buf, 0, sizeof buf);
    assert_int_equal(fread(buf, 1, sizeof buf - 1, f), 4);
    fclose(f);
    assert_string_equal(buf, "old\n"); /* not yet in place */
    kvs_out_abort(o);
    f = fopen(path, "r");
    memset(buf, 0, sizeof buf);
    assert_int_equal(fread(buf, 1, sizeof buf - 1, f), 4);
    fclose(f);
    assert_string_equal(buf, "old\n");
    char cmd[300];
    snprintf(cmd, sizeof cmd, "test $(ls -A '%s' | grep -c begin) -eq 1", dir); /* begin.txt, no temporary */
    assert_int_equal(system(cmd), 0);
    assert_int_equal(kvs_head_clusters_write_begin(c, path, &o), KVS_OK);
    assert_int_equal(kvs_out_commit(o), KVS_OK);
    f = fopen(path, "r");
    memset(buf, 0, sizeof buf);
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    f = fopen(ref, "r");
    memset(want, 0, sizeof want);
    assert_int_equal(fread(want, 1, sizeof want - 1, f), n);
    fclose(f);
    assert_string_equal(buf, want);
    /* an invalid clustering: refused before anything is opened */
    c->is_rep[1] = 1;
    o = (kvs_out *)1;
    assert_int_equal(kvs_head_clusters_write_begin(c, path, &o), KVS_ERR_FORMAT);
    assert_null(o);
    unlink(path);
    unlink(ref);
    kvs_head_clusters_free(c);
}

static void test_malformed_files_are_refused_with_their_line(void **state) {
    (void)state;
    static const struct {
        const char *text;
        kvs_status st;
        const char *msg;
    } cases[] = {
        {"", KVS_ERR_FORMAT, ":0: not a kvsim head-clusters file"},
        {"hello\n", KVS_ERR_FORMAT, ":1: not a kvsim head-clusters file"},
        {"kvsim-head-clusters 2\n", KVS_ERR_VERSION, ":1: head-clusters version 2"},
        {"kvsim-head-clusters 1\nlayers 1\n", KVS_ERR_FORMAT, ":2: expected 'layers L units U'"},
        {"kvsim-head-clusters 1\nlayers 0 units 2\n", KVS_ERR_FORMAT, ":2: 0 layers x 2 units is out of range"},
        {"kvsim-head-clusters 1\nlayers 1 units 2\n0 0 0 1\n", KVS_ERR_FORMAT, "1 units listed; the header announces 1 x 2"},
        {"kvsim-head-clusters 1\nlayers 1 units 2\n0 0 0 1\n0 0 0 1\n", KVS_ERR_FORMAT, ":4: layer 0 unit 0 given twice"},
        {"kvsim-head-clusters 1\nlayers 1 units 2\n0 0 0 1\n0 2 0 0\n", KVS_ERR_FORMAT, ":4: layer 0 unit 2 outside"},
        {"kvsim-head-clusters 1\nlayers 1 units 2\n0 0 0 1\n0 1 0 2\n", KVS_ERR_FORMAT, ":4: representative must be 0 or 1"},
        {"kvsim-head-clusters 1\nlayers 1 units 2\n0 0 0 1\n0 1 0 1 x\n", KVS_ERR_FORMAT, ":4: expected 'layer unit"},
        {"kvsim-head-clusters 1\nlayers 1 units 2\n0 0 0 1\n0 1 0 1\n", KVS_ERR_FORMAT, "has 2 representatives"},
        {"kvsim-head-clusters 1\nlayers 1 units 3\n0 0 0 1\n0 1 2 1\n0 2 2 0\n", KVS_ERR_FORMAT, "layer 0 cluster 1 is empty"},
        {"kvsim-head-clusters 1\nlayers 1 units 2\n0 0 0 0\n0 1 1 1\n", KVS_ERR_FORMAT, "cluster 0 has 0 representatives"},
        /* numbers beyond int: refused, not wrapped (4294967297 read as an int was 1, and the file accepted) */
        {"kvsim-head-clusters 1\nlayers 4294967297 units 1\n0 0 0 1\n", KVS_ERR_FORMAT,
         ":2: 4294967297 layers x 1 units is out of range"},
        {"kvsim-head-clusters 4294967297\n", KVS_ERR_VERSION, ":1: head-clusters version 4294967297"},
        {"kvsim-head-clusters 1\nlayers 1 units 1\n4294967296 0 0 1\n", KVS_ERR_FORMAT,
         ":3: layer 4294967296 unit 0 outside"},
        {"kvsim-head-clusters 1\nlayers 1 units 1\n0 0 0 4294967297\n", KVS_ERR_FORMAT,
         ":3: representative must be 0 or 1, not 4294967297"},
        {"kvsim-head-clusters 1\nlayers 1 units 1\n0 0 99999999999999999999 1\n", KVS_ERR_FORMAT,
         ":3: cluster 9223372036854775807 outside 0..0"},
    };
    char path[128];
    snprintf(path, sizeof path, "%s/in.txt", dir);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_file(path, cases[i].text);
        kvs_head_clusters *c = (kvs_head_clusters *)1;
        kvs_status st = kvs_head_clusters_read(path, &c, NULL);
        if (st != cases[i].st || !strstr(kvs_last_error(), cases[i].msg))
            fail_msg("case %zu: status %d, detail '%s' (want %d, '%s')", i, st, kvs_last_error(), cases[i].st,
                     cases[i].msg);
        assert_null(c);
    }
    /* Comments and blank lines are fine. */
    write_file(path, "# made by hand\nkvsim-head-clusters 1\n\nlayers 1 units 2\n0 1 0 0\n# x\n0 0 0 1\n");
    kvs_head_clusters *c = NULL;
    assert_int_equal(kvs_head_clusters_read(path, &c, NULL), KVS_OK);
    assert_int_equal(c->is_rep[0], 1);
    kvs_head_clusters_free(c);
    snprintf(path, sizeof path, "%s/missing.txt", dir);
    assert_int_equal(kvs_head_clusters_read(path, &c, NULL), KVS_ERR_IO);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_similarity_to_clusters_hand_case),
        cmocka_unit_test(test_file_round_trip_and_hash),
        cmocka_unit_test(test_malformed_files_are_refused_with_their_line),
        cmocka_unit_test(test_write_begin_puts_the_file_in_place_only_on_commit),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
