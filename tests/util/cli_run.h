/* cli_run.h — TEST HELPER: runs the kvsim binary under test ($KVSIM_BIN, set by `make test`) as a child
 * process with its standard output and error in files, the way a user's shell would, for the CLI tests.
 */
#ifndef KVS_CLI_RUN_H
#define KVS_CLI_RUN_H

#include <sys/types.h>

/*! kvs_test_kvsim_bin() : $KVSIM_BIN, or NULL when unset or empty (the CLI tests then skip). */
const char *kvs_test_kvsim_bin(void);

/*! kvs_test_cli_spawn() : starts `$KVSIM_BIN args...` (args NULL-terminated, args[0] the subcommand) with
 *  stdout to out_path and stderr to err_path (created or truncated; NULL = /dev/null); @return the child's
 *  pid, or -1 when it could not be started. */
pid_t kvs_test_cli_spawn(const char *out_path, const char *err_path, const char *const *args);

/*! kvs_test_cli_wait() : waits for a child of kvs_test_cli_spawn(); @return its exit status, 128 + the
 *  signal when a signal killed it, or -1 when waiting failed. */
int kvs_test_cli_wait(pid_t pid);

/*! kvs_test_cli() : kvs_test_cli_spawn() then kvs_test_cli_wait(). */
int kvs_test_cli(const char *out_path, const char *err_path, const char *const *args);

/* A cmocka fixture for the CLI tests: a fresh folder under /tmp with the files a run's standard output and error go
 * to, removed with everything in it afterwards. Give kvs_test_cli_setup / kvs_test_cli_teardown to
 * cmocka_unit_test_setup_teardown; the test's state is then a kvs_test_cli_fx *. */
typedef struct {
    char dir[64];  /* the folder (the test may write its own files there) */
    char out[128]; /* dir/out: the last run's standard output */
    char err[128]; /* dir/err: its standard error */
} kvs_test_cli_fx;

int kvs_test_cli_setup(void **state);
int kvs_test_cli_teardown(void **state);

/*! kvs_test_cli_run() : kvs_test_cli(f->out, f->err, args): `$KVSIM_BIN args...`, its exit status. */
int kvs_test_cli_run(const kvs_test_cli_fx *f, const char *const *args);

/*! kvs_test_file_has() : 1 when the file at `path` holds `needle`; else 0, with the file's text (or that it cannot
 *  be read) printed. */
int kvs_test_file_has(const char *path, const char *needle);

#endif /* KVS_CLI_RUN_H */
