/* codec_fixture.c — see codec_fixture.h (test helper). */
#include "codec_fixture.h"

#include "common/kvs.h"
#include "testenv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

char *kvs_test_codec_fixture(const char *file) {
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/fixtures/codec/%s", kvs_test_root(), file);
    char *text = kvs_test_slurp(path, NULL);
    if (!text) printf("cannot read %s\n", path);
    return text;
}

char *kvs_test_fixture_line(char **cursor) {
    char *p = *cursor;
    for (;;) {
        char *eol = strchr(p, '\n');
        if (!eol) return NULL;
        *eol = '\0';
        char *line = p;
        p = eol + 1;
        *cursor = p;
        if (line[0] != '#' && line[0] != '\0') return line;
    }
}

float *kvs_test_hex_floats(char **p, int64_t n) {
    float *a = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    if (!a) return NULL;
    for (int64_t i = 0; i < n; i++) {
        char *end;
        unsigned long w = strtoul(*p, &end, 16);
        if (end == *p) {
            free(a);
            return NULL;
        }
        a[i] = kvs_bits_f32((uint32_t)w);
        *p = end;
    }
    return a;
}

kvs_codec *kvs_test_codec_parse(const char *spec) {
    kvs_codec *c = NULL;
    if (kvs_codec_parse(spec, &c) != KVS_OK) {
        printf("parse %s: %s\n", spec ? spec : "(NULL)", kvs_last_error());
        return NULL;
    }
    return c;
}

int kvs_test_codec_rejects(const char *spec, const char *msg) {
    kvs_codec *c = (kvs_codec *)1; /* must come back NULL */
    kvs_clear_error();
    kvs_status st = kvs_codec_parse(spec, &c);
    int ok = st == KVS_ERR_INVALID_ARG && c == NULL && (!msg || strcmp(kvs_last_error(), msg) == 0);
    if (!ok) {
        printf("parse '%s': status %d (want %d), codec %s, message '%s'%s%s%s\n", spec ? spec : "(NULL)", (int)st,
               (int)KVS_ERR_INVALID_ARG, c ? "set" : "NULL", kvs_last_error(), msg ? " (want '" : "", msg ? msg : "",
               msg ? "')" : "");
        if (st == KVS_OK && c != (kvs_codec *)1) kvs_codec_free(c);
    }
    return ok;
}
