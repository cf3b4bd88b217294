/* main.c — the kvsim program: dispatches `kvsim CMD ...` to the subcommand table, prints `kvsim help`,
 * and turns unknown commands into a clear error with exit status 2 (see cli.h for exit codes).
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

#define KVSIM_VERSION "0.1.0"

static int cmd_help(int argc, char **argv);
static int cmd_version(int argc, char **argv);

/* The subcommands, in the order `kvsim help` lists them. */
static const kvs_cli_command commands[] = {
    {"capture", "decode a real model on the CPU and record its attention as a trace", kvs_cmd_capture},
    {"info", "print a trace's model config, positions, turns and compression ratio", kvs_cmd_info},
    {"verify", "check every checksum and recompute attention against the stored outputs", kvs_cmd_verify},
    {"export", "write one layer's q/k/v/o/lse or the token ids of a trace as a NumPy .npy file", kvs_cmd_export},
    {"trace", "trace maintenance: `kvsim trace recover IN OUT` restores a killed capture", kvs_cmd_trace},
    {"replay", "replay a trace under policy/budget sweeps and store the metrics in a results database", kvs_cmd_replay},
    {"runs", "list the runs of a results database as a table or CSV (one row per run and layer)", kvs_cmd_runs},
    {"plot", "draw error/memory vs budget or error vs position from a results database (gnuplot)", kvs_cmd_plot},
    {"help", "list the commands, or `kvsim help CMD` for one command's options", cmd_help},
    {"version", "print the kvsim version", cmd_version},
};
#define N_COMMANDS (sizeof commands / sizeof commands[0])

static const kvs_cli_command *find_command(const char *name) {
    for (size_t i = 0; i < N_COMMANDS; i++)
        if (!strcmp(commands[i].name, name)) return &commands[i];
    return NULL;
}

static void print_overview(FILE *f) {
    fprintf(f, "kvsim %s — trace-driven KV-cache simulator and analyzer\n\n", KVSIM_VERSION);
    fprintf(f, "usage: kvsim COMMAND [options]   (kvsim COMMAND --help for a command's options)\n\ncommands:\n");
    for (size_t i = 0; i < N_COMMANDS; i++) fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
}

static int cmd_help(int argc, char **argv) {
    if (argc >= 2 && !kvs_cli_is_help(argv[1])) {
        const kvs_cli_command *c = find_command(argv[1]);
        if (!c) return kvs_cli_usage_error("help", "unknown command '%s'", argv[1]);
        if (c->run == cmd_help) {
            print_overview(stdout);
            return KVS_EXIT_OK;
        }
        char *sub[] = {argv[1], "--help", NULL};
        return c->run(2, sub);
    }
    print_overview(stdout);
    return KVS_EXIT_OK;
}

static int cmd_version(int argc, char **argv) {
    if (argc > 1 && !kvs_cli_is_help(argv[1])) return kvs_cli_usage_error("version", "unexpected argument '%s'", argv[1]);
    printf("kvsim %s\n", KVSIM_VERSION);
    return KVS_EXIT_OK;
}

int kvs_cli_is_help(const char *arg) { return !strcmp(arg, "-h") || !strcmp(arg, "--help"); }

int kvs_cli_fail(const char *cmd, kvs_status s) {
    const char *detail = kvs_last_error();
    if (detail[0]) fprintf(stderr, "kvsim %s: %s\n", cmd, detail);
    else fprintf(stderr, "kvsim %s: %s\n", cmd, kvs_strerror(s));
    return s == KVS_ERR_INVALID_ARG ? KVS_EXIT_USAGE : KVS_EXIT_FAIL;
}

int kvs_cli_usage_error(const char *cmd, const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "kvsim %s: ", cmd);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n(see 'kvsim %s --help')\n", cmd);
    return KVS_EXIT_USAGE;
}

kvs_status kvs_cli_parse_long(const char *opt, const char *val, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(val, &end, 10);
    if (!val[0] || *end || errno)
        return kvs_fail(KVS_ERR_INVALID_ARG, "%s: '%s' is not an integer", opt, val);
    if (v < lo || v > hi)
        return kvs_fail(KVS_ERR_INVALID_ARG, "%s: %ld is out of range [%ld, %ld]", opt, v, lo, hi);
    *out = v;
    return KVS_OK;
}

kvs_status kvs_cli_parse_double(const char *opt, const char *val, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double v = strtod(val, &end);
    if (!val[0] || *end || errno || !isfinite(v))
        return kvs_fail(KVS_ERR_INVALID_ARG, "%s: '%s' is not a number", opt, val);
    if (v < lo || v > hi) return kvs_fail(KVS_ERR_INVALID_ARG, "%s: %g is out of range [%g, %g]", opt, v, lo, hi);
    *out = v;
    return KVS_OK;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        print_overview(stderr);
        return KVS_EXIT_USAGE;
    }
    if (kvs_cli_is_help(argv[1])) {
        print_overview(stdout);
        return KVS_EXIT_OK;
    }
    if (!strcmp(argv[1], "--version")) return cmd_version(1, argv + 1);
    const kvs_cli_command *c = find_command(argv[1]);
    if (!c) {
        fprintf(stderr, "kvsim: unknown command '%s' (run 'kvsim help' for the list)\n", argv[1]);
        return KVS_EXIT_USAGE;
    }
    kvs_clear_error();
    return c->run(argc - 1, argv + 1);
}
