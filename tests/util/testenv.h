/* testenv.h — TEST HELPER: where the tests find the repository (KVSIM_ROOT, set by `make test`; the shared
 * models are at KVSIM_ROOT/../shared/models) and the small file helpers every test file used to write its own
 * copy of (read a whole file, write one).
 */
#ifndef KVS_TESTENV_H
#define KVS_TESTENV_H

/*! kvs_test_root() : $KVSIM_ROOT, or "." when it is unset or empty. Borrowed. */
const char *kvs_test_root(void);

/*! kvs_test_sanitized() : 1 under `make asan` (KVS_TEST_SANITIZED=1, set through the Makefile's TEST_ENV). The
 *  tests that run whole study scripts (the examples/ scripts: minutes of real decoding under the sanitizers) skip there and
 *  run in the plain suite; the commands those scripts call have their own tests, which do run under the sanitizers. */
int kvs_test_sanitized(void);

/*! kvs_test_exists() : 1 when `path` exists (any file type). */
int kvs_test_exists(const char *path);

#include <stddef.h>

/*! kvs_test_slurp() : the whole file at `path` in a malloc'd buffer (caller frees) with a NUL appended, its size
 *  in *len (len may be NULL); NULL when it cannot be read. void * so that text and byte buffers take it alike. */
void *kvs_test_slurp(const char *path, size_t *len);

/*! kvs_test_spit() : writes `len` bytes to `path` (created or truncated). @return 0, or -1 when it cannot. */
int kvs_test_spit(const char *path, const void *data, size_t len);

/*! kvs_test_spit_text() : kvs_test_spit of a NUL-terminated text. */
int kvs_test_spit_text(const char *path, const char *text);

/* A cmocka fixture: a fresh folder under /tmp per test and a trace path in it, removed with everything in it
 * afterwards. Give kvs_test_tmp_setup / kvs_test_tmp_teardown to cmocka_unit_test_setup_teardown; the test's
 * state is then a kvs_test_tmp *. */
typedef struct {
    char dir[64];   /* the folder */
    char path[128]; /* dir/t.kvt */
} kvs_test_tmp;

int kvs_test_tmp_setup(void **state);
int kvs_test_tmp_teardown(void **state);

/*! kvs_test_tmp_path() : out = "<c->dir>/<name>" (n bytes at most). */
void kvs_test_tmp_path(const kvs_test_tmp *c, const char *name, char *out, size_t n);

#endif /* KVS_TESTENV_H */
