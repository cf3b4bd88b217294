/* head_clusters.c — per-layer clusterings of attention units with representatives: the SyncKV derivation
 * from a similarity matrix (App. B.1; POLICY_SPEC §2.4 steps 3-5), validation, and the text file form that
 * `kvsim heads` writes and the SyncKV policy reads. Implements common/head_clusters.h.
 */
#include "head_clusters.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvs_out.h"
#include "sha256.h"

kvs_status kvs_head_clusters_create(int32_t n_layers, int32_t n_units, kvs_head_clusters **out) {
    *out = NULL;
    if (n_layers < 1 || n_layers > KVS_HEAD_CLUSTERS_MAX_LAYERS || n_units < 1 || n_units > KVS_HEAD_CLUSTERS_MAX_UNITS)
        return kvs_fail(KVS_ERR_INVALID_ARG, "head clusters: %d layers x %d units (each must be 1..%d)", n_layers,
                        n_units, KVS_HEAD_CLUSTERS_MAX_UNITS);
    kvs_head_clusters *c = calloc(1, sizeof *c);
    size_t cells = (size_t)n_layers * (size_t)n_units;
    if (c) {
        c->n_layers = n_layers;
        c->n_units = n_units;
        c->n_clusters = calloc((size_t)n_layers, sizeof *c->n_clusters);
        c->cluster = calloc(cells, sizeof *c->cluster);
        c->is_rep = calloc(cells, sizeof *c->is_rep);
    }
    if (!c || !c->n_clusters || !c->cluster || !c->is_rep) {
        kvs_head_clusters_free(c);
        return kvs_fail(KVS_ERR_NOMEM, "head clusters: out of memory");
    }
    for (int32_t l = 0; l < n_layers; l++) c->n_clusters[l] = 1;
    *out = c;
    return KVS_OK;
}

void kvs_head_clusters_free(kvs_head_clusters *c) {
    if (!c) return;
    free(c->n_clusters);
    free(c->cluster);
    free(c->is_rep);
    free(c);
}

kvs_status kvs_head_clusters_from_similarity(kvs_head_clusters *c, int32_t layer, const double *S, int32_t n_clusters,
                                             const kvs_kmeans_opts *opts) {
    if (!c || !S || layer < 0 || layer >= c->n_layers)
        return kvs_fail(KVS_ERR_INVALID_ARG, "head clusters: layer %d outside 0..%d", layer, c ? c->n_layers - 1 : -1);
    int32_t n = c->n_units;
    if (n_clusters < 1 || n_clusters > n)
        return kvs_fail(KVS_ERR_INVALID_ARG, "head clusters: %d clusters of %d units (need 1..%d)", n_clusters, n, n);
    size_t nn = (size_t)n * (size_t)n;
    double smax = -INFINITY;
    for (size_t i = 0; i < nn; i++) {
        if (!isfinite(S[i]))
            return kvs_fail(KVS_ERR_INVALID_ARG, "head clusters: layer %d similarity (%zu, %zu) is not finite", layer,
                            i / (size_t)n, i % (size_t)n);
        if (S[i] > smax) smax = S[i];
    }
    double *D = malloc(nn * sizeof *D);
    if (!D) return kvs_fail(KVS_ERR_NOMEM, "head clusters: out of memory");
    for (size_t i = 0; i < nn; i++) D[i] = smax - S[i]; /* §2.4 step 3: D = max(S) - S */
    kvs_kmeans_result r;
    kvs_status st = kvs_kmeans(D, (size_t)n, (size_t)n, n_clusters, opts, &r); /* step 4: rows of D as features */
    free(D);
    if (st != KVS_OK) return st;
    int32_t *cl = c->cluster + (size_t)layer * (size_t)n;
    uint8_t *rep = c->is_rep + (size_t)layer * (size_t)n;
    c->n_clusters[layer] = n_clusters;
    for (int32_t i = 0; i < n; i++) {
        cl[i] = r.labels[i];
        rep[i] = 0;
    }
    for (int32_t g = 0; g < n_clusters; g++) rep[r.rep[g]] = 1; /* step 5: nearest the centroid */
    kvs_kmeans_result_free(&r);
    return KVS_OK;
}

kvs_status kvs_head_clusters_check(const kvs_head_clusters *c) {
    if (!c) return kvs_fail(KVS_ERR_INVALID_ARG, "head clusters: NULL");
    for (int32_t l = 0; l < c->n_layers; l++) {
        int32_t k = c->n_clusters[l];
        if (k < 1 || k > c->n_units)
            return kvs_fail(KVS_ERR_FORMAT, "head clusters: layer %d has %d clusters of %d units", l, k, c->n_units);
        for (int32_t u = 0; u < c->n_units; u++) {
            int32_t g = c->cluster[(size_t)l * (size_t)c->n_units + (size_t)u];
            if (g < 0 || g >= k)
                return kvs_fail(KVS_ERR_FORMAT, "head clusters: layer %d unit %d is in cluster %d (layer has %d)", l, u,
                                g, k);
        }
        for (int32_t g = 0; g < k; g++) {
            int32_t members = 0, reps = 0;
            for (int32_t u = 0; u < c->n_units; u++) {
                size_t i = (size_t)l * (size_t)c->n_units + (size_t)u;
                if (c->cluster[i] != g) continue;
                members++;
                reps += c->is_rep[i] != 0;
            }
            if (members == 0) return kvs_fail(KVS_ERR_FORMAT, "head clusters: layer %d cluster %d is empty", l, g);
            if (reps != 1)
                return kvs_fail(KVS_ERR_FORMAT, "head clusters: layer %d cluster %d has %d representatives (needs 1)", l,
                                g, reps);
        }
    }
    return KVS_OK;
}

/* The file form of a checked clustering: the one formatter of the writer and of kvs_head_clusters_sha256. */
static void put_file_form(FILE *f, const kvs_head_clusters *c) {
    fprintf(f, "kvsim-head-clusters 1\nlayers %d units %d\n# layer unit cluster representative\n", c->n_layers,
            c->n_units);
    for (int32_t l = 0; l < c->n_layers; l++)
        for (int32_t u = 0; u < c->n_units; u++) {
            size_t i = (size_t)l * (size_t)c->n_units + (size_t)u;
            fprintf(f, "%d %d %d %d\n", l, u, c->cluster[i], c->is_rep[i] ? 1 : 0);
        }
}

kvs_status kvs_head_clusters_write(const kvs_head_clusters *c, const char *path) {
    kvs_status st = kvs_head_clusters_check(c);
    if (st != KVS_OK) return st;
    kvs_out *o = NULL;
    if ((st = kvs_out_open(path, &o)) != KVS_OK) return st;
    FILE *f = kvs_out_stream(o);
    if (!f) {
        kvs_out_abort(o);
        return KVS_ERR_NOMEM;
    }
    put_file_form(f, c);
    return kvs_out_commit(o);
}

kvs_status kvs_head_clusters_write_begin(const kvs_head_clusters *c, const char *path, kvs_out **out) {
    *out = NULL;
    kvs_status st = kvs_head_clusters_check(c);
    if (st != KVS_OK) return st;
    kvs_out *o = NULL;
    if ((st = kvs_out_open(path, &o)) != KVS_OK) return st;
    FILE *f = kvs_out_stream(o);
    if (!f) {
        kvs_out_abort(o);
        return KVS_ERR_NOMEM;
    }
    put_file_form(f, c);
    if ((st = kvs_out_write(o, "", 0)) != KVS_OK) { /* flushes the stream: a full disk fails here */
        kvs_out_abort(o);
        return st;
    }
    *out = o;
    return KVS_OK;
}

kvs_status kvs_head_clusters_sha256(const kvs_head_clusters *c, char sha256_hex[65]) {
    kvs_status st = kvs_head_clusters_check(c);
    if (st != KVS_OK) return st;
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) return kvs_fail(KVS_ERR_NOMEM, "head clusters: out of memory");
    put_file_form(f, c);
    int bad = ferror(f);
    if (fclose(f) != 0 || bad || !text) {
        free(text);
        return kvs_fail(KVS_ERR_NOMEM, "head clusters: out of memory");
    }
    kvs_sha256_hex(text, len, sha256_hex);
    free(text);
    return KVS_OK;
}

/* The next line that is neither blank nor a comment, into buf; 0 at end of file. */
static int next_line(FILE *f, char *buf, size_t cap, int *line_no, int *too_long) {
    while (fgets(buf, (int)cap, f)) {
        (*line_no)++;
        size_t len = strlen(buf);
        if (len == cap - 1 && buf[len - 1] != '\n' && !feof(f)) {
            *too_long = 1;
            return 1;
        }
        char *p = buf;
        while (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n') p++;
        if (*p == '\0' || *p == '#') continue;
        return 1;
    }
    return 0;
}

kvs_status kvs_head_clusters_read(const char *path, kvs_head_clusters **out, char sha256_hex[65]) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return kvs_fail(KVS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    char buf[256];
    /* numbers are read as long and range-checked: an int conversion of "4294967297" would wrap to 1 */
    int line = 0, too_long = 0, n_layers = 0, n_units = 0, used = 0;
    long version = 0, layers_l = 0, units_l = 0;
    kvs_head_clusters *c = NULL;
    uint8_t *seen = NULL;
    kvs_status st = KVS_OK;
#define BAD(...)                                                    \
    do {                                                            \
        char msg_[192];                                             \
        snprintf(msg_, sizeof msg_, __VA_ARGS__);                   \
        st = kvs_fail(KVS_ERR_FORMAT, "%s:%d: %s", path, line, msg_); \
        goto cleanup;                                               \
    } while (0)
    if (!next_line(f, buf, sizeof buf, &line, &too_long) || too_long ||
        sscanf(buf, "kvsim-head-clusters %ld %n", &version, &used) != 1 || buf[used] != '\0')
        BAD("not a kvsim head-clusters file (first line must be 'kvsim-head-clusters 1')");
    if (version != 1) {
        st = kvs_fail(KVS_ERR_VERSION, "%s:%d: head-clusters version %ld (this kvsim reads 1)", path, line, version);
        goto cleanup;
    }
    if (!next_line(f, buf, sizeof buf, &line, &too_long) || too_long ||
        sscanf(buf, "layers %ld units %ld %n", &layers_l, &units_l, &used) != 2 || buf[used] != '\0')
        BAD("expected 'layers L units U'");
    if (layers_l < 1 || layers_l > KVS_HEAD_CLUSTERS_MAX_LAYERS || units_l < 1 || units_l > KVS_HEAD_CLUSTERS_MAX_UNITS ||
        kvs_head_clusters_create((int32_t)layers_l, (int32_t)units_l, &c) != KVS_OK)
        BAD("%ld layers x %ld units is out of range (1..%d each)", layers_l, units_l, KVS_HEAD_CLUSTERS_MAX_UNITS);
    n_layers = (int)layers_l;
    n_units = (int)units_l;
    seen = calloc((size_t)n_layers * (size_t)n_units, 1);
    if (!seen) {
        st = kvs_fail(KVS_ERR_NOMEM, "%s: out of memory", path);
        goto cleanup;
    }
    for (int32_t l = 0; l < n_layers; l++) c->n_clusters[l] = 0;
    size_t rows = 0;
    while (next_line(f, buf, sizeof buf, &line, &too_long)) {
        long l, u, g, r;
        if (too_long) BAD("line too long");
        if (sscanf(buf, "%ld %ld %ld %ld %n", &l, &u, &g, &r, &used) != 4 || buf[used] != '\0')
            BAD("expected 'layer unit cluster representative'");
        if (l < 0 || l >= n_layers || u < 0 || u >= n_units) BAD("layer %ld unit %ld outside the %d x %d header", l, u, n_layers, n_units);
        if (g < 0 || g >= n_units) BAD("cluster %ld outside 0..%d", g, n_units - 1);
        if (r != 0 && r != 1) BAD("representative must be 0 or 1, not %ld", r);
        size_t i = (size_t)l * (size_t)n_units + (size_t)u;
        if (seen[i]) BAD("layer %ld unit %ld given twice", l, u);
        seen[i] = 1;
        rows++;
        c->cluster[i] = (int32_t)g;
        c->is_rep[i] = (uint8_t)r;
        if (g + 1 > c->n_clusters[l]) c->n_clusters[l] = (int32_t)(g + 1);
    }
    if (ferror(f)) {
        st = kvs_fail(KVS_ERR_IO, "%s: read error: %s", path, strerror(errno));
        goto cleanup;
    }
    if (rows != (size_t)n_layers * (size_t)n_units)
        BAD("%zu units listed; the header announces %d x %d", rows, n_layers, n_units);
    if ((st = kvs_head_clusters_check(c)) != KVS_OK) {
        st = kvs_fail(KVS_ERR_FORMAT, "%s: %s", path, kvs_last_error());
        goto cleanup;
    }
#undef BAD
    if (sha256_hex && (st = kvs_sha256_file_hex(path, sha256_hex)) != KVS_OK) goto cleanup;
    *out = c;
    c = NULL;
cleanup:
    fclose(f);
    free(seen);
    kvs_head_clusters_free(c);
    return st;
}
