/* testenv.c — see testenv.h (test helper). */
#include "testenv.h"

#include "common/kvs.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int kvs_test_sanitized(void) {
    const char *v = getenv("KVS_TEST_SANITIZED");
    return v && v[0] == '1';
}

const char *kvs_test_root(void) {
    const char *r = getenv("KVSIM_ROOT");
    return r && r[0] ? r : ".";
}

int kvs_test_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

void *kvs_test_slurp(const char *path, size_t *len) {
    char *data = NULL;
    size_t n = 0;
    if (kvs_read_file(path, &data, &n) != KVS_OK) return NULL;
    if (len) *len = n;
    return data;
}

int kvs_test_spit(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    int ok = fwrite(data, 1, len, f) == len;
    return fclose(f) == 0 && ok ? 0 : -1;
}

int kvs_test_spit_text(const char *path, const char *text) { return kvs_test_spit(path, text, strlen(text)); }

int kvs_test_tmp_setup(void **state) {
    kvs_test_tmp *c = calloc(1, sizeof *c);
    if (!c) return -1;
    snprintf(c->dir, sizeof c->dir, "/tmp/kvs_test_XXXXXX");
    if (!mkdtemp(c->dir)) {
        free(c);
        return -1;
    }
    snprintf(c->path, sizeof c->path, "%s/t.kvt", c->dir);
    *state = c;
    return 0;
}

int kvs_test_tmp_teardown(void **state) {
    kvs_test_tmp *c = *state;
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", c->dir);
    int rc = system(cmd);
    free(c);
    return rc == 0 ? 0 : -1;
}

void kvs_test_tmp_path(const kvs_test_tmp *c, const char *name, char *out, size_t n) {
    snprintf(out, n, "%s/%s", c->dir, name);
}
