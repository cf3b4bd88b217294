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

#endif /* KVS_CLI_RUN_H */
