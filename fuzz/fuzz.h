/* fuzz.h — shared pieces of the libFuzzer harnesses in fuzz/ (fuzz/README.md): the entry point's prototype and a
 * per-process scratch folder where a harness writes its input as the file the code under test reads (the
 * readers take paths, as kvsim's commands do). Built only by `make fuzz` (fuzz/fuzz.mk), with clang's
 * -fsanitize=fuzzer,address,undefined.
 */
#ifndef KVS_FUZZ_H
#define KVS_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

static char kvs_fuzz_dir_path[64];

static inline void kvs_fuzz_remove_dir(void) {
    char cmd[96];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", kvs_fuzz_dir_path);
    if (system(cmd) != 0) fprintf(stderr, "fuzz: could not remove %s\n", kvs_fuzz_dir_path);
}

/* The process's scratch folder (created on first use, removed at exit). Aborts when it cannot be created: a
 * harness that cannot write its input tests nothing. */
static inline const char *kvs_fuzz_dir(void) {
    if (!kvs_fuzz_dir_path[0]) {
        const char *tmp = getenv("TMPDIR");
        snprintf(kvs_fuzz_dir_path, sizeof kvs_fuzz_dir_path, "%s/kvs_fuzz_XXXXXX",
                 tmp && *tmp && strlen(tmp) < 40 ? tmp : "/tmp");
        if (!mkdtemp(kvs_fuzz_dir_path)) {
            perror("fuzz: mkdtemp");
            abort();
        }
        atexit(kvs_fuzz_remove_dir);
    }
    return kvs_fuzz_dir_path;
}

/* Writes data[0..size) to `name` in the scratch folder; the full path goes to out. */
static inline void kvs_fuzz_write(const char *name, const uint8_t *data, size_t size, char *out, size_t out_n) {
    snprintf(out, out_n, "%s/%s", kvs_fuzz_dir(), name);
    FILE *f = fopen(out, "wb");
    if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f) != 0) {
        perror(out);
        abort();
    }
}

/* A NUL-terminated copy of the input (caller frees); aborts on out of memory. */
static inline char *kvs_fuzz_cstr(const uint8_t *data, size_t size) {
    char *s = malloc(size + 1);
    if (!s) abort();
    if (size) memcpy(s, data, size);
    s[size] = '\0';
    return s;
}

/* $KVSIM_ROOT (the repository, for fixed inputs a harness loads once) or ".". */
static inline const char *kvs_fuzz_root(void) {
    const char *r = getenv("KVSIM_ROOT");
    return r && *r ? r : ".";
}

#endif /* KVS_FUZZ_H */
