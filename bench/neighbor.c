/* neighbor.c — a controlled neighbour for contention experiments on a shared machine (sim/BENCH.md "Where the
 * time goes now"): what another core's load costs the sweep that shares the caches and the memory with it.
 *
 *   build/bench/neighbor fma SECONDS      fp64 multiply-adds on registers alone (no memory traffic)
 *   build/bench/neighbor read MIB SECONDS sums a buffer of MIB MiB over and over (4 doubles a step): with MIB
 *                                         below the L3 it keeps the L3 busy and takes MIB of it; far above it,
 *                                         the memory
 *
 * Run it pinned to one core (taskset -c 0) beside a one-core `bench_speed sweep` on the other (bench/contention.sh
 * does both). It stops after SECONDS or at SIGTERM (contention.sh stops it when the sweep ends), and then prints
 * what it did, so that a neighbour that did nothing is seen. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static volatile sig_atomic_t stop_asked;

static void on_sigterm(int sig) {
    (void)sig;
    stop_asked = 1;
}

static int usage(void) {
    fprintf(stderr, "usage: neighbor fma SECONDS | neighbor read MIB SECONDS\n");
    return 2;
}

int main(int argc, char **argv) {
    int is_read = argc == 4 && !strcmp(argv[1], "read");
    if (!is_read && !(argc == 3 && !strcmp(argv[1], "fma"))) return usage();
    double seconds = atof(argv[argc - 1]);
    long mib = is_read ? atol(argv[2]) : 0;
    if (!(seconds > 0 && seconds <= 3600) || (is_read && (mib < 1 || mib > 65536))) return usage();
    struct sigaction sa = {.sa_handler = on_sigterm};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    double t0 = now_s(), s[4] = {0, 0, 0, 0};
    double rounds = 0;
    if (is_read) {
        size_t n = (size_t)mib << 17; /* doubles */
        double *buf = malloc(n * sizeof *buf);
        if (!buf) {
            fprintf(stderr, "neighbor: out of memory for %ld MiB\n", mib);
            return 1;
        }
        for (size_t i = 0; i < n; i++) buf[i] = (double)(i & 1023);
        while (!stop_asked && now_s() - t0 < seconds) {
            for (size_t i = 0; i < n; i += 4)
                for (int k = 0; k < 4; k++) s[k] += buf[i + (size_t)k];
            rounds++;
        }
        free(buf);
        double el = now_s() - t0;
        printf("neighbor: read %.0f x %ld MiB in %.1f s (%.1f GB/s), sum %g\n", rounds, mib, el,
               rounds * (double)mib * 1048576.0 / 1e9 / el, s[0] + s[1] + s[2] + s[3]);
    } else {
        double x[8] = {1, 2, 3, 4, 5, 6, 7, 8};
        while (!stop_asked && now_s() - t0 < seconds) {
            for (long i = 0; i < 10000000; i++)
                for (int k = 0; k < 8; k++) x[k] = x[k] * 0.999999 + 1e-6;
            rounds++;
        }
        for (int k = 0; k < 8; k++) s[k & 3] += x[k];
        printf("neighbor: %.0f x 8e7 multiply-adds in %.1f s, sum %g\n", rounds, now_s() - t0,
               s[0] + s[1] + s[2] + s[3]);
    }
    return 0;
}
