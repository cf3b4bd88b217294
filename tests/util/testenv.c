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

int kvs_test_make_tmp(char *dir, size_t cap) {
    if (snprintf(dir, cap, "/tmp/kvs_test_XXXXXX") >= (int)cap) return -1;
    return mkdtemp(dir) ? 0 : -1;
}

int kvs_test_rm_rf(const char *dir) {
    char cmd[1100];
    if (snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir) >= (int)sizeof cmd) return -1;
    return system(cmd) == 0 ? 0 : -1;
}

int kvs_test_tmp_setup(void **state) {
    kvs_test_tmp *c = calloc(1, sizeof *c);
    if (!c || kvs_test_make_tmp(c->dir, sizeof c->dir) != 0) {
        free(c);
        return -1;
    }
    snprintf(c->path, sizeof c->path, "%s/t.kvt", c->dir);
    *state = c;
    return 0;
}

int kvs_test_tmp_teardown(void **state) {
    kvs_test_tmp *c = *state;
    int rc = kvs_test_rm_rf(c->dir);
    free(c);
    return rc;
}

void kvs_test_tmp_path(const kvs_test_tmp *c, const char *name, char *out, size_t n) {
    snprintf(out, n, "%s/%s", c->dir, name);
}

int kvs_test_findings(const char *sections, char *out, size_t cap) {
    out[0] = '\0';
    const char *bin = getenv("KVSIM_BIN");
    char models[1024], probe[1100];
    snprintf(models, sizeof models, "%s/../shared/models", kvs_test_root());
    snprintf(probe, sizeof probe, "%s/tinystories-656K", models);
    const char *why = NULL;
    if (!bin || !bin[0]) why = "KVSIM_BIN is not set (run through `make test`)";
    else if (kvs_test_sanitized()) why = "a whole study script: it runs in the plain suite";
    else if (!kvs_test_exists(probe)) why = "the shared models are not beside the repository";
    if (why) {
        printf("findings (%s): %s: skipping\n", sections, why);
        return 0;
    }
    char dir[] = "/tmp/kvs_findings_XXXXXX";
    if (!mkdtemp(dir)) return -1;
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "OUT='%s/f' KVSIM_BIN='%s' sh '%s/examples/findings.sh' --check --only '%s' '%s' >'%s/log' 2>&1",
             dir, bin, kvs_test_root(), sections, models, dir);
    int rc = system(cmd);
    snprintf(out, cap, "%s/f", dir);
    if (rc != 0) {
        snprintf(cmd, sizeof cmd, "cat '%s/log'", dir);
        (void)system(cmd);
        return -1;
    }
    return 1;
}

/* The one run of kvs_test_findings_once in this process. */
static struct {
    char sections[256];
    char out[1024];
    int rc;         /* kvs_test_findings' answer */
    int ran;        /* 1 once a run is cached */
    int registered; /* 1 once the exit handler is registered */
} g_findings;

static void findings_at_exit(void) { kvs_test_findings_cleanup(g_findings.out); }

int kvs_test_findings_once(const char *sections, const char **out) {
    if (!g_findings.ran || strcmp(g_findings.sections, sections) != 0) {
        kvs_test_findings_cleanup(g_findings.out);
        if (!g_findings.registered) g_findings.registered = atexit(findings_at_exit) == 0;
        snprintf(g_findings.sections, sizeof g_findings.sections, "%s", sections);
        g_findings.rc = kvs_test_findings(sections, g_findings.out, sizeof g_findings.out);
        g_findings.ran = 1;
    }
    *out = g_findings.rc == 1 ? g_findings.out : NULL;
    return g_findings.rc;
}

void kvs_test_findings_cleanup(const char *out) {
    if (!out || !out[0]) return;
    const char *slash = strrchr(out, '/');
    if (!slash || strncmp(out, "/tmp/kvs_findings_", 18) != 0) return; /* only what kvs_test_findings made */
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "rm -rf '%.*s'", (int)(slash - out), out);
    (void)system(cmd);
}

char *kvs_test_findings_block(const char *out, const char *name) {
    char path[1024];
    snprintf(path, sizeof path, "%s/blocks/%s.md", out, name);
    return kvs_test_slurp(path, NULL);
}

int kvs_test_csv_fields(char *line, char **fields, int max) {
    int n = 0;
    char *p = line;
    while (*p && *p != '\n' && n < max) {
        if (*p == '"') {
            char *w = ++p;
            fields[n++] = w;
            for (;;) {
                if (*p == '"' && p[1] == '"') {
                    *w++ = '"';
                    p += 2;
                } else if (*p == '"' || !*p) {
                    if (*p) p++;
                    break;
                } else {
                    *w++ = *p++;
                }
            }
            *w = '\0';
            if (*p == ',') p++;
        } else {
            fields[n++] = p;
            char *c = p + strcspn(p, ",\n");
            int end = *c != ',';
            *c = '\0';
            if (end) break;
            p = c + 1;
        }
    }
    return n;
}
