/* bench_heads.c — `kvsim heads` analysis throughput (`make bench`): decode steps per second of the streamed
 * head-to-head similarity (analysis/heads.h: exact full attention of every head, top-k sets, every pair's overlap),
 * and the pair overlaps per second, at two trace lengths, with the peak resident memory of each run (a forked
 * child per length, so VmHWM is the analysis's own): the analysis state is heads x k, the rest is the K/V history
 * the streams hold. Data: KVSIM_BENCH_TRACE when set, otherwise GENERATED Gaussian data (tests/util/gen_trace.h),
 * labelled as such. Numbers go to stdout, never asserted.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../analysis/heads.h"
#include "../common/kvs.h"
#include "../tests/util/gen_trace.h"

static long vm_hwm_kib(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kib = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmHWM:", 6)) kib = strtol(line + 6, NULL, 10);
    if (f) fclose(f);
    return kib;
}

/* One analysis of `path` in this process; prints its line. */
static int run_one(const char *path, const char *label) {
    kvs_trace *t = NULL;
    if (kvs_trace_open(path, &t) != KVS_OK) {
        fprintf(stderr, "bench_heads: %s: %s\n", path, kvs_last_error());
        return 1;
    }
    const kvs_trace_info *info = kvs_trace_info_get(t);
    kvs_analysis_heads_sim *s = NULL;
    double t0 = kvs_now_s();
    kvs_status st = kvs_analysis_heads_similarity(t, NULL, &s);
    double el = kvs_now_s() - t0;
    if (st != KVS_OK) {
        fprintf(stderr, "bench_heads: %s\n", kvs_last_error());
        kvs_trace_close(t);
        return 1;
    }
    double nq = (double)info->model.n_layers * info->model.n_heads, nu = (double)info->model.n_layers * info->model.n_kv_heads;
    double pairs = (nq * (nq - 1) / 2 + nu * (nu - 1) / 2) * (double)s->n_steps;
    printf("%-34s %6lld positions %5lld steps  k %3lld  %8.1f steps/s  %10.3g pair overlaps/s  %.3f s  "
           "state %.1f KiB  peak RSS %ld KiB\n",
           label, (long long)info->n_positions, (long long)s->n_steps, (long long)s->k, (double)s->n_steps / el,
           pairs / el, el, (nq + nu) * (double)s->k * 4 / 1024.0, vm_hwm_kib());
    kvs_analysis_heads_sim_free(s);
    kvs_trace_close(t);
    return 0;
}

static int run_forked(const char *path, const char *label) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        int rc = run_one(path, label);
        fflush(stdout);
        _exit(rc);
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) < 0) return 1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

int main(void) {
    const char *real = getenv("KVSIM_BENCH_TRACE");
    if (real && real[0]) return run_forked(real, "real trace (KVSIM_BENCH_TRACE)");
    char dir[] = "/tmp/kvs_bench_heads_XXXXXX";
    if (!mkdtemp(dir)) return 1;
    int rc = 0;
    const int32_t lengths[2] = {512, 2048};
    for (int i = 0; i < 2 && rc == 0; i++) {
        /* the shape of stories260K (5 layers, 8 heads on 4 KV heads), head_dim 64; half prompt, half generated */
        kvs_gen_trace_opts o = kvs_gen_trace_defaults();
        o.n_layers = 5;
        o.n_heads = 8;
        o.n_kv_heads = 4;
        o.head_dim = 64;
        o.n_positions = lengths[i];
        o.block_positions = 64;
        o.dtype = KVS_DTYPE_F16;
        char path[96], label[64];
        snprintf(path, sizeof path, "%s/g%d.kvt", dir, lengths[i]);
        snprintf(label, sizeof label, "generated 5x8/4 d64 N=%d", lengths[i]);
        kvs_gen_trace *g = NULL;
        if (kvs_gen_trace_create(&o, &g) != KVS_OK || kvs_gen_trace_write(g, path) != KVS_OK) {
            fprintf(stderr, "bench_heads: %s\n", kvs_last_error());
            rc = 1;
        }
        kvs_gen_trace_free(g);
        if (rc == 0) rc = run_forked(path, label);
        unlink(path);
    }
    rmdir(dir);
    return rc;
}
