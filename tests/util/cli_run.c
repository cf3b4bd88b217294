/* cli_run.c — TEST HELPER: the kvsim binary as a child process with redirected output; see cli_run.h. */
#include "cli_run.h"

#include "testenv.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

int kvs_test_cli_setup(void **state) {
    kvs_test_cli_fx *f = calloc(1, sizeof *f);
    if (!f || kvs_test_make_tmp(f->dir, sizeof f->dir) != 0) {
        free(f);
        return -1;
    }
    snprintf(f->out, sizeof f->out, "%s/out", f->dir);
    snprintf(f->err, sizeof f->err, "%s/err", f->dir);
    *state = f;
    return 0;
}

int kvs_test_cli_teardown(void **state) {
    kvs_test_cli_fx *f = *state;
    int rc = kvs_test_rm_rf(f->dir);
    free(f);
    return rc;
}

int kvs_test_cli_run(const kvs_test_cli_fx *f, const char *const *args) { return kvs_test_cli(f->out, f->err, args); }

int kvs_test_file_has(const char *path, const char *needle) {
    char *t = kvs_test_slurp(path, NULL);
    int ok = t && strstr(t, needle) != NULL;
    if (!ok) printf("'%s' not in %s:\n%s\n", needle, path, t ? t : "(cannot be read)");
    free(t);
    return ok;
}
