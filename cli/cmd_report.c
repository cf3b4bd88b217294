/* cmd_report.c — `kvsim report DB --out DIR [--mem-at X] [--traffic-at X]`: the study report of a results
 * database, DIR/report.html (self-contained: plots embedded as data: URIs) and DIR/report.md with its plots
 * beside it (plots/report.h; ../shared/DESIGN.md "Results (SQLite) and plots"; the comparisons follow
 * POLICY_SPEC.md §1.5 "Budget-matching modes").
 * Exit codes per cli.h: 0 written, 1 database, gnuplot or output failure (nothing written), 2 bad usage.
 */
#include <stdio.h>
#include <string.h>

#include "../plots/report.h"
#include "cli.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: kvsim report DB --out DIR [--mem-at X] [--traffic-at X]\n"
            "Writes the study report of the results database DB into the folder DIR: report.html, one\n"
            "self-contained page (every plot embedded; no external file or network), and report.md with the\n"
            "plots as PNG files beside it. Sections: the summary (at each power-of-two memory level, every\n"
            "policy at its best run using no more memory, the lowest mean output error crowned; a level with one\n"
            "candidate or a tie is no win; degenerate (N) and oracle (O) runs are marked, never crowned), the\n"
            "traces used (model, positions, turns, and the capture settings when the trace file is readable),\n"
            "every run with its parameters and flags, the equal-memory and equal-traffic comparisons (what\n"
            "kvsim compare prints), error vs measured memory and traffic with the Pareto frontier, error and\n"
            "memory vs nominal budget, error vs decode position, and the drift, heads and capacity plans when\n"
            "the database holds them. A KV codec's runs (replay --codec) are a candidate of their own, named\n"
            "\"policy (params) [codec]\" in the summary and in a codec column of the tables (- = K/V as captured).\n"
            "With two or more traces of a model (one per prompt), the summary and the\n"
            "equal-cost comparisons are over the traces: each policy's mean [lo, hi] (n), a percentile bootstrap\n"
            "95%% interval resampling traces, and a level counts as a win only when the paired difference with the\n"
            "runner-up is resolved (its interval below 0); one trace: that trace's tables, no interval.\n"
            "A section the database has nothing for is listed at the end with the\n"
            "reason; a damaged database (SQLite's quick_check) or a read that fails is an error (exit 1,\n"
            "nothing written).\n"
            "  --out DIR       the report folder: created, or replaced when it holds a previous report and nothing\n"
            "                  else; written beside it first (.DIR.tmp.XXXXXX), so a failed report changes nothing\n"
            "  --mem-at X      the equal-memory table at X resident bytes per KV head (K M G T = x1000^n, Ki Mi Gi\n"
            "                  Ti = x1024^n, optional B); default: the middle power of two of the measured range\n"
            "  --traffic-at X  the equal-traffic table at X bytes read per step per KV head; default likewise\n");
}

int kvs_cmd_report(int argc, char **argv) {
    const char *db = NULL, *out = NULL, *mem_s = NULL, *traffic_s = NULL;
    for (int i = 1; i < argc; i++) {
        int missing = 0, r;
        if (kvs_cli_is_help(argv[i])) {
            usage(stdout);
            return KVS_EXIT_OK;
        } else if ((r = kvs_cli_single_value("report", "--out", argc, argv, &i, &missing, &out)) ||
                   (r = kvs_cli_single_value("report", "--mem-at", argc, argv, &i, &missing, &mem_s)) ||
                   (r = kvs_cli_single_value("report", "--traffic-at", argc, argv, &i, &missing, &traffic_s))) {
            if (r < 0) return KVS_EXIT_USAGE;
        } else if (missing) return kvs_cli_usage_error("report", "option %s needs a value", argv[i]);
        else if (argv[i][0] == '-' && argv[i][1]) return kvs_cli_usage_error("report", "unknown option '%s'", argv[i]);
        else if (!db) db = argv[i];
        else return kvs_cli_usage_error("report", "unexpected argument '%s'", argv[i]);
    }
    if (!db) return kvs_cli_usage_error("report", "missing the results database DB");
    if (!out || !out[0]) return kvs_cli_usage_error("report", "missing --out DIR (the report folder)");
    if (!strcmp(out, "-")) return kvs_cli_usage_error("report", "--out: a report is a folder, not standard output");
    kvs_report_options o = {.db_path = db, .out_dir = out};
    kvs_status st;
    if (mem_s && (st = kvs_cli_parse_size("--mem-at", mem_s, &o.mem_at)) != KVS_OK) return kvs_cli_fail("report", st);
    if (traffic_s && (st = kvs_cli_parse_size("--traffic-at", traffic_s, &o.traffic_at)) != KVS_OK)
        return kvs_cli_fail("report", st);
    kvs_report_result res;
    if ((st = kvs_report_write(&o, &res)) != KVS_OK) return kvs_cli_fail("report", st);
    printf("wrote %s/report.html (%d sections, %d plots embedded; %d sections not in this database) and "
           "%s/report.md\n",
           out, res.n_present, res.n_images, res.n_absent, out);
    return kvs_cli_finish_stdout("report");
}
