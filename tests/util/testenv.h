/* testenv.h — TEST HELPER: where the tests find the repository (KVSIM_ROOT, set by `make test`; the shared
 * models are at KVSIM_ROOT/../shared/models) and small file checks shared by the test files.
 */
#ifndef KVS_TESTENV_H
#define KVS_TESTENV_H

/*! kvs_test_root() : $KVSIM_ROOT, or "." when it is unset or empty. Borrowed. */
const char *kvs_test_root(void);

/*! kvs_test_exists() : 1 when `path` exists (any file type). */
int kvs_test_exists(const char *path);

#endif /* KVS_TESTENV_H */
