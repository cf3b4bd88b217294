/* cli.h — shared pieces of the kvsim command-line program: the subcommand table entry type, the
 * subcommand entry points, and uniform error/usage reporting and option-value parsing.
 *
 * Exit codes, for every subcommand: 0 success, 1 failure while doing the work (bad file, failed check,
 * I/O), 2 bad usage (unknown command or option, bad option value, missing argument).
 */
#ifndef KVS_CLI_H
#define KVS_CLI_H

#include <stdio.h>

#include "../common/kvs.h"

#define KVS_EXIT_OK 0
#define KVS_EXIT_FAIL 1
#define KVS_EXIT_USAGE 2

/* One subcommand: argv[0] is the subcommand name; returns an exit code. */
typedef struct {
    const char *name;
    const char *summary;  /* one line for `kvsim help` */
    int (*run)(int argc, char **argv);
} kvs_cli_command;

/*! kvs_cli_fail() : prints "kvsim CMD: <detail>" (or the status text when there is no detail) to stderr;
 *  @return KVS_EXIT_FAIL, or KVS_EXIT_USAGE for KVS_ERR_INVALID_ARG. */
int kvs_cli_fail(const char *cmd, kvs_status s);

/*! kvs_cli_usage_error() : prints "kvsim CMD: <message>" and a pointer to `kvsim CMD --help`;
 *  @return KVS_EXIT_USAGE. */
int kvs_cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/*! kvs_cli_is_help() : true when arg is -h or --help. */
int kvs_cli_is_help(const char *arg);

/*! kvs_cli_parse_long() : parses a whole decimal integer in [lo, hi] for option `opt`, else a usage
 *  error message naming the option; returns KVS_OK or KVS_ERR_INVALID_ARG (detail set). */
kvs_status kvs_cli_parse_long(const char *opt, const char *val, long lo, long hi, long *out);

/*! kvs_cli_parse_double() : parses a whole finite number in [lo, hi] for option `opt`. */
kvs_status kvs_cli_parse_double(const char *opt, const char *val, double lo, double hi, double *out);

/* Subcommand entry points (cli/cmd_*.c). */
int kvs_cmd_info(int argc, char **argv);
int kvs_cmd_verify(int argc, char **argv);
int kvs_cmd_export(int argc, char **argv);
int kvs_cmd_trace(int argc, char **argv);
int kvs_cmd_capture(int argc, char **argv);
int kvs_cmd_runs(int argc, char **argv);
int kvs_cmd_plot(int argc, char **argv);
int kvs_cmd_replay(int argc, char **argv);

#endif /* KVS_CLI_H */
