/* fuzz_head_clusters.c — libFuzzer harness of the head clusters file reader (common/head_clusters.c: the text
 * form `kvsim heads --clusters-out FILE` writes and SyncKV reads with clusters=FILE; format in
 * common/head_clusters.h). A file that reads must pass kvs_head_clusters_check, its reported SHA-256 must be
 * the digest kvs_head_clusters_sha256 computes when the file is already in the canonical form, and writing it
 * back and reading that again must give the same clustering and the same digest (a round trip through the
 * writer is exact). Seeds: fuzz/corpus/head_clusters (files written by `kvsim heads`).
 */
#include "fuzz.h"

#include "../common/head_clusters.h"
#include "../common/kvs.h"

static int same(const kvs_head_clusters *a, const kvs_head_clusters *b) {
    if (a->n_layers != b->n_layers || a->n_units != b->n_units) return 0;
    size_t n = (size_t)a->n_layers * (size_t)a->n_units;
    return !memcmp(a->n_clusters, b->n_clusters, (size_t)a->n_layers * sizeof *a->n_clusters) &&
           !memcmp(a->cluster, b->cluster, n * sizeof *a->cluster) && !memcmp(a->is_rep, b->is_rep, n);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[128], back[128];
    kvs_fuzz_write("clusters.txt", data, size, path, sizeof path);
    snprintf(back, sizeof back, "%s/back.txt", kvs_fuzz_dir());
    kvs_head_clusters *c = NULL, *c2 = NULL;
    char sha[65], sha_canon[65], sha_back[65];
    if (kvs_head_clusters_read(path, &c, sha) == KVS_OK) {
        if (strlen(sha) != 64 || kvs_head_clusters_check(c) != KVS_OK) abort();
        if (kvs_head_clusters_sha256(c, sha_canon) != KVS_OK) abort();
        if (kvs_head_clusters_write(c, back) != KVS_OK) abort();
        if (kvs_head_clusters_read(back, &c2, sha_back) != KVS_OK) abort();
        if (!same(c, c2) || strcmp(sha_back, sha_canon)) abort();
        /* the input was canonical (byte-identical to what the writer makes) exactly when the digests agree */
        FILE *f = fopen(back, "rb");
        if (!f) abort();
        uint8_t *buf = malloc(size + 1);
        if (!buf) abort();
        size_t n = fread(buf, 1, size + 1, f);
        fclose(f);
        int canonical = n == size && (size == 0 || !memcmp(buf, data, size));
        free(buf);
        if (canonical != !strcmp(sha, sha_canon)) abort();
        unlink(back);
    }
    kvs_head_clusters_free(c);
    kvs_head_clusters_free(c2);
    kvs_clear_error();
    return 0;
}
