/* cmd_interval.c — `kvsim interval`: the mean of numbers read from standard input, one unit (trace, prompt) per
 * line, with its percentile bootstrap interval resampling the units (common/kvs_stats.h kvs_bootstrap_mean, the
 * one bootstrap of kvsim); `--paired` reads two numbers a line and gives the paired difference mean(a - b) and
 * whether it is resolved (its interval excludes 0). For study scripts (examples/findings.sh) that aggregate a
 * per-trace figure of `drift`, `heads` or `runs` over the prompts of a model.
 *
 * The resampling is seeded from what is aggregated (--label and the values themselves, FNV-1a 64), never from the
 * clock, so an interval is a function of its input.
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/kvs_rng.h"
#include "../common/kvs_stats.h"
#include "cli.h"

static void usage(FILE *f) {
    fprintf(f, "usage: kvsim interval [--paired] [--label TEXT] [--level L] [--reps N] [--json] < VALUES\n\n"
               "The mean of the numbers on standard input (one unit a line: a trace, a prompt) and its percentile\n"
               "bootstrap interval resampling the lines. Prints: mean lo hi n (tab-separated).\n"
               "  --paired      two numbers a line, a and b: the paired difference mean(a - b), its interval and\n"
               "                whether it is resolved (+1: above 0, -1: below, 0: the interval holds 0 or n < 2),\n"
               "                printed as a fifth column\n"
               "  --label TEXT  what is aggregated: with the values it seeds the resampling (FNV-1a 64), so the\n"
               "                same input gives the same interval\n"
               "  --level L     the interval's coverage, in (0, 1) (default 0.95)\n"
               "  --reps N      bootstrap resamples (default %d)\n"
               "  --json        {\"mean\", \"lo\", \"hi\", \"n\", \"level\", \"reps\", \"seed\"[, \"resolved\"]}\n"
               "One line (n = 1) has no interval: lo = hi = the value. Blank lines and lines starting with # are\n"
               "skipped; anything else that is not a number is an error (exit 1).\n",
            KVS_BOOTSTRAP_REPS);
}

/* One finite number at *p (skipping blanks), advancing *p; 0 when there is none. */
static int next_number(char **p, double *v) {
    while (**p == ' ' || **p == '\t') (*p)++;
    if (**p == '\0' || **p == '\n' || **p == '\r') return 0;
    char *end = NULL;
    errno = 0;
    double x = strtod(*p, &end);
    if (end == *p || errno == ERANGE || !isfinite(x)) return -1;
    if (*end != '\0' && *end != ' ' && *end != '\t' && *end != '\n' && *end != '\r') return -1;
    *p = end;
    *v = x;
    return 1;
}

int kvs_cmd_interval(int argc, char **argv) {
    int paired = 0, json = 0, seen_label = 0, seen_level = 0, seen_reps = 0;
    const char *label = "";
    double level = 0.95;
    long reps = KVS_BOOTSTRAP_REPS;
    for (int i = 1; i < argc; i++) {
        const char *v;
        int m = 0;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return KVS_EXIT_OK;
        } else if (!strcmp(argv[i], "--paired")) {
            if (paired++) return kvs_cli_usage_error("interval", "--paired given twice");
        } else if (!strcmp(argv[i], "--json")) {
            if (json++) return kvs_cli_usage_error("interval", "--json given twice");
        } else if ((v = kvs_cli_opt_value("--label", argc, argv, &i, &m)) || m) {
            if (!v) return kvs_cli_usage_error("interval", "--label needs TEXT");
            if (seen_label++) return kvs_cli_usage_error("interval", "--label given twice");
            label = v;
        } else if ((v = kvs_cli_opt_value("--level", argc, argv, &i, &m)) || m) {
            if (!v) return kvs_cli_usage_error("interval", "--level needs L");
            if (seen_level++) return kvs_cli_usage_error("interval", "--level given twice");
            if (kvs_cli_parse_double("--level", v, 0, 1, &level) != KVS_OK || level <= 0 || level >= 1)
                return kvs_cli_usage_error("interval", "--level must be in (0, 1), not '%s'", v);
        } else if ((v = kvs_cli_opt_value("--reps", argc, argv, &i, &m)) || m) {
            if (!v) return kvs_cli_usage_error("interval", "--reps needs N");
            if (seen_reps++) return kvs_cli_usage_error("interval", "--reps given twice");
            if (kvs_cli_parse_long("--reps", v, 1, 10000000, &reps) != KVS_OK) return KVS_EXIT_USAGE;
        } else {
            return kvs_cli_usage_error("interval", "unknown argument '%s'", argv[i]);
        }
    }
    size_t cap = 64, n = 0;
    double *a = malloc(cap * sizeof *a), *b = malloc(cap * sizeof *b);
    char line[4096];
    long lineno = 0;
    uint64_t seed = kvs_fnv1a64(KVS_FNV1A64_BASIS, label);
    int rc = KVS_EXIT_OK;
    if (!a || !b) {
        rc = kvs_cli_fail("interval", kvs_fail(KVS_ERR_NOMEM, "out of memory"));
        goto done;
    }
    while (fgets(line, sizeof line, stdin)) {
        lineno++;
        if (!strchr(line, '\n') && !feof(stdin)) {
            rc = kvs_cli_fail("interval", kvs_fail(KVS_ERR_FORMAT, "line %ld is longer than %zu bytes", lineno,
                                                   sizeof line - 2));
            goto done;
        }
        char *p = line;
        while (*p == ' ' || *p == '\t') p++;
        if (*p == '#' || *p == '\n' || *p == '\r' || *p == '\0') continue;
        double x, y = 0;
        int want = paired ? 2 : 1, got = 0, r;
        while (got < want && (r = next_number(&p, got ? &y : &x)) == 1) got++;
        double extra;
        if (got != want || next_number(&p, &extra) != 0) {
            rc = kvs_cli_fail("interval", kvs_fail(KVS_ERR_FORMAT, "line %ld: expected %s", lineno,
                                                   paired ? "two numbers (a b)" : "one number"));
            goto done;
        }
        if (n == cap) {
            cap *= 2;
            double *na = realloc(a, cap * sizeof *a), *nb = na ? realloc(b, cap * sizeof *b) : NULL;
            if (na) a = na;
            if (nb) b = nb;
            if (!na || !nb) {
                rc = kvs_cli_fail("interval", kvs_fail(KVS_ERR_NOMEM, "out of memory"));
                goto done;
            }
        }
        a[n] = x;
        b[n] = y;
        n++;
        char text[64];
        snprintf(text, sizeof text, paired ? "\n%.17g %.17g" : "\n%.17g", x, y);
        seed = kvs_fnv1a64(seed, text);
    }
    if (ferror(stdin)) {
        rc = kvs_cli_fail("interval", kvs_fail(KVS_ERR_IO, "cannot read standard input"));
        goto done;
    }
    if (n == 0) {
        rc = kvs_cli_fail("interval", kvs_fail(KVS_ERR_FORMAT, "no values on standard input"));
        goto done;
    }
    kvs_interval iv;
    kvs_status st = paired ? kvs_bootstrap_mean_diff(a, b, n, (int)reps, level, seed, &iv)
                           : kvs_bootstrap_mean(a, n, (int)reps, level, seed, &iv);
    if (st != KVS_OK) {
        rc = kvs_cli_fail("interval", st);
        goto done;
    }
    if (json) {
        printf("{\"mean\":%.17g,\"lo\":%.17g,\"hi\":%.17g,\"n\":%zu,\"level\":%.17g,\"reps\":%ld,\"seed\":%llu", iv.mean,
               iv.lo, iv.hi, iv.n, level, reps, (unsigned long long)seed);
        if (paired) printf(",\"resolved\":%d", kvs_interval_resolved(&iv));
        printf("}\n");
    } else {
        printf("%.17g\t%.17g\t%.17g\t%zu", iv.mean, iv.lo, iv.hi, iv.n);
        if (paired) printf("\t%d", kvs_interval_resolved(&iv));
        printf("\n");
    }
    rc = kvs_cli_finish_stdout("interval");
done:
    free(a);
    free(b);
    return rc;
}
