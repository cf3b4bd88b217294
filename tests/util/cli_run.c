/* cli_run.c — TEST HELPER: the kvsim binary as a child process with redirected output; see cli_run.h. */
#include "cli_run.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

const char *kvs_test_kvsim_bin(void) {
    const char *b = getenv("KVSIM_BIN");
    return b && b[0] ? b : NULL;
}

pid_t kvs_test_cli_spawn(const char *out_path, const char *err_path, const char *const *args) {
    const char *bin = kvs_test_kvsim_bin();
    if (!bin) return -1;
    char *argv[64];
    int n = 0;
    argv[n++] = (char *)bin;
    for (; args[n - 1] && n < 63; n++) argv[n] = (char *)args[n - 1];
    argv[n] = NULL;
    pid_t pid = fork();
    if (pid != 0) return pid;
    int o = open(out_path ? out_path : "/dev/null", O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int e = open(err_path ? err_path : "/dev/null", O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (o < 0 || e < 0 || dup2(o, 1) < 0 || dup2(e, 2) < 0) _exit(120);
    execv(bin, argv);
    _exit(121);
}

int kvs_test_cli_wait(pid_t pid) {
    if (pid < 0) return -1;
    int st = 0;
    if (waitpid(pid, &st, 0) != pid) return -1;
    if (WIFSIGNALED(st)) return 128 + WTERMSIG(st);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

int kvs_test_cli(const char *out_path, const char *err_path, const char *const *args) {
    return kvs_test_cli_wait(kvs_test_cli_spawn(out_path, err_path, args));
}
