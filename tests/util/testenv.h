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

/*! kvs_test_make_tmp() : a fresh folder /tmp/kvs_test_XXXXXX, its path in dir (cap bytes). @return 0, or -1. */
int kvs_test_make_tmp(char *dir, size_t cap);

/*! kvs_test_rm_rf() : removes `dir` and everything in it. @return 0, or -1 when that failed. */
int kvs_test_rm_rf(const char *dir);

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

/*! kvs_test_findings() : runs `sh examples/findings.sh --check --only SECTIONS` (comma-separated sections of
 *  examples/findings/) on the shared models with $KVSIM_BIN, in a fresh folder under /tmp: the sections' generated
 *  blocks of examples/FINDINGS.md must be what kvsim measures now, and the script's outputs (its $OUT) are left in
 *  out (cap bytes) for the test to recompute the blocks another way. @return 1 when it ran and matched; 0 when it
 *  cannot run here (no $KVSIM_BIN, no shared models, or under the sanitizers: a whole study, whose commands have
 *  their own tests there), the reason printed; -1 when it failed (its log printed). Remove the folder with
 *  kvs_test_findings_cleanup(out). */
int kvs_test_findings(const char *sections, char *out, size_t cap);

/*! kvs_test_findings_once() : kvs_test_findings(sections) run once per process: the first call runs the script,
 *  later calls with the same sections answer from that run (another sections string runs again, the previous
 *  folder removed). *out receives the script's $OUT (borrowed, valid until exit) when it ran and matched, NULL
 *  otherwise. The folder is removed at exit. @return 1, 0 or -1 as kvs_test_findings (0: skip; -1: fail, the log
 *  printed once). */
int kvs_test_findings_once(const char *sections, const char **out);

/*! kvs_test_findings_block() : the generated text of block NAME that kvs_test_findings' run wrote (out/blocks/
 *  NAME.md) in a malloc'd string (caller frees); NULL when it is missing. */
char *kvs_test_findings_block(const char *out, const char *name);

/*! kvs_test_csv_fields() : splits one CSV line (RFC 4180 quotes, "" inside quotes; ends at NUL or newline) into at
 *  most max fields, in place; @return the count. */
int kvs_test_csv_fields(char *line, char **fields, int max);

/*! kvs_test_findings_cleanup() : removes the folder kvs_test_findings made for `out`; nothing when out is "". */
void kvs_test_findings_cleanup(const char *out);

#endif /* KVS_TESTENV_H */
