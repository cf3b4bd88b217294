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
#include "../results/results.h"

#define KVS_EXIT_OK 0
#define KVS_EXIT_FAIL 1
#define KVS_EXIT_USAGE 2

/* The one limit on --threads for every command (capture, verify, replay): the thread pool's own limit
 * (common/threadpool.h). */
#define KVS_CLI_MAX_THREADS 1024

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
 *  error message naming the option and echoing the user's text ("--steps: '99999999999999999999' is out of
 *  range [0, 16777216]"); returns KVS_OK or KVS_ERR_INVALID_ARG (detail set). */
kvs_status kvs_cli_parse_long(const char *opt, const char *val, long lo, long hi, long *out);

/*! kvs_cli_parse_double() : parses a whole finite number in [lo, hi] for option `opt` (messages as
 *  kvs_cli_parse_long, bounds printed exactly). */
kvs_status kvs_cli_parse_double(const char *opt, const char *val, double lo, double hi, double *out);

/*! kvs_cli_once() : the one rule for options that take a single value (and for flags): the first time
 *  (*seen == 0) marks *seen and returns 0; the second prints the usage error "kvsim CMD: OPT given twice"
 *  and returns KVS_EXIT_USAGE. Options that may be given several times say "repeatable" in their help. */
int kvs_cli_once(const char *cmd, const char *opt, int *seen);

/*! kvs_cli_opt_value() : matches "--opt VALUE" or "--opt=VALUE" at argv[*i]: returns the value (advancing *i
 *  past a separate value), or NULL when argv[*i] is not `opt`, or when the value is missing (then *missing
 *  is set to 1). */
const char *kvs_cli_opt_value(const char *opt, int argc, char **argv, int *i, int *missing);

/*! kvs_cli_parse_codecs() : the codecs of a command's repeatable --codec SPEC (`kvsim replay --codec`): none given
 *  = one entry NULL (K/V as captured), "none" names that entry among others; the same canonical codec given twice runs
 *  once (a warning "kvsim CMD: warning: --codec SPEC given more than once: run once" on stderr). codecs[] (capacity
 *  >= max(n_specs, 1)) receives the parsed codecs, *n_codecs their count; the caller frees each with
 *  kvs_codec_free. KVS_ERR_INVALID_ARG (the codec's message in kvs_last_error; nothing to free) for a bad spec. */
struct kvs_codec;
kvs_status kvs_cli_parse_codecs(const char *cmd, const char *const *specs, int n_specs, struct kvs_codec **codecs,
                                int *n_codecs);

/*! kvs_cli_single_value() : kvs_cli_opt_value() for a single-valued option stored in *slot: 1 when argv[*i] is
 *  `opt` (its value now in *slot), 0 when it is not (*missing set when it is but its value is missing), -1 after
 *  printing the usage error "kvsim CMD: OPT given twice" when *slot already holds a value (the one rule:
 *  never "the last wins"; the command then exits KVS_EXIT_USAGE). */
int kvs_cli_single_value(const char *cmd, const char *opt, int argc, char **argv, int *i, int *missing,
                         const char **slot);

/* ---- run filters shared by `kvsim runs`, `plot` and `compare` (results/results.h kvs_results_filter) ---- */
#define KVS_CLI_FILTER_POLICY 0x01u  /* --policy NAME */
#define KVS_CLI_FILTER_BUDGET 0x02u  /* --budget TOKENS */
#define KVS_CLI_FILTER_TRACE 0x04u   /* --trace PATH */
#define KVS_CLI_FILTER_MODEL 0x08u   /* --model NAME */
#define KVS_CLI_FILTER_MEASURE 0x10u /* --measure decode|prefill|all */
#define KVS_CLI_FILTER_RUN 0x20u     /* --run ID */

/*! kvs_cli_filter_option() : when argv[*i] is one of the filter options in `accept`, stores its value in *f
 *  (advancing *i) and returns 1; returns 0 when it is none of them; on a bad or missing value prints the
 *  usage error for `cmd` and returns -1 (the command then exits KVS_EXIT_USAGE). */
int kvs_cli_filter_option(const char *cmd, int argc, char **argv, int *i, unsigned accept, kvs_results_filter *f);

/*! kvs_cli_filter_usage() : the help lines of the filter options in `accept`. */
void kvs_cli_filter_usage(FILE *out, unsigned accept);

/*! kvs_cli_parse_size() : a positive finite number with an optional suffix for option `opt`: K M G T
 *  (x1000^n), Ki Mi Gi Ti (x1024^n), then an optional B (bytes); case-insensitive; exponents allowed.
 *  "12K" = 12000, "3.5MiB" = 3670016, "1e6" = 1000000, "4096B" = 4096. Else KVS_ERR_INVALID_ARG. */
kvs_status kvs_cli_parse_size(const char *opt, const char *val, double *out);

/* ---- output helpers ---- */

/*! kvs_cli_fmt_real() : a whole number as an integer ("1000000"), else the shortest "%.*g" that reads back
 *  to exactly v; "" for NaN (an empty field). */
void kvs_cli_fmt_real(char *buf, size_t cap, double v);

/*! kvs_cli_fmt_bytes() : a byte count for a table: "512B", "1.50KiB", "12.3MiB" (3 significant digits, binary
 *  prefixes); "-" for NaN. */
void kvs_cli_fmt_bytes(char *buf, size_t cap, double v);

/*! kvs_cli_csv_field() : writes s as one RFC 4180 field (quoted when it holds a comma, quote, CR or LF); NULL
 *  writes nothing (an empty field). */
void kvs_cli_csv_field(FILE *out, const char *s);

/*! kvs_cli_json_string() : writes s as a JSON string (RFC 8259 escapes), or null for NULL. */
void kvs_cli_json_string(FILE *out, const char *s);

/*! kvs_cli_json_number() : writes v in the shortest exact form, or null when v is not finite. */
void kvs_cli_json_number(FILE *out, double v);

/*! kvs_cli_finish_stdout() : flushes stdout; on a write error (disk full, closed pipe) prints
 *  "kvsim CMD: writing the output failed: ..." and returns KVS_EXIT_FAIL, else KVS_EXIT_OK. */
int kvs_cli_finish_stdout(const char *cmd);

/*! kvs_cli_print_runs_table() : the one table layout of runs (cmd_runs.c), printed by `kvsim runs` and after
 *  `kvsim replay`: labelled fixed-width columns, the free-length trace name and params last, flags and
 *  their legend; `count_line` adds the "N runs" line, `all` says failed runs were asked for. */
void kvs_cli_print_runs_table(FILE *o, const kvs_results_run_row *rows, int64_t n, int count_line, int all);

/* Subcommand entry points (cli/cmd_*.c). */
int kvs_cmd_info(int argc, char **argv);
int kvs_cmd_verify(int argc, char **argv);
int kvs_cmd_export(int argc, char **argv);
int kvs_cmd_trace(int argc, char **argv);
int kvs_cmd_capture(int argc, char **argv);
int kvs_cmd_chat_template(int argc, char **argv);
int kvs_cmd_runs(int argc, char **argv);
int kvs_cmd_plot(int argc, char **argv);
int kvs_cmd_compare(int argc, char **argv);
int kvs_cmd_policies(int argc, char **argv);
int kvs_cmd_keys(int argc, char **argv);
int kvs_cmd_attn(int argc, char **argv);
int kvs_cmd_drift(int argc, char **argv);
int kvs_cmd_heads(int argc, char **argv);
int kvs_cmd_plan(int argc, char **argv);
int kvs_cmd_replay(int argc, char **argv);
int kvs_cmd_report(int argc, char **argv);
int kvs_cmd_generate(int argc, char **argv);
int kvs_cmd_tokenize(int argc, char **argv);
int kvs_cmd_calibrate(int argc, char **argv);
int kvs_cmd_sweep(int argc, char **argv);
int kvs_cmd_merge(int argc, char **argv);
int kvs_cmd_interval(int argc, char **argv);

#endif /* KVS_CLI_H */
