/* cmd_attn.c — `kvsim attn TRACE`: per layer and head, D2O's attention-density diagnostic (the variance of
 * the column-summed prompt attention, POLICY_SPEC §5.3 D2/D3) and RocketKV's top-k union over the generated
 * steps (§5.2 R4); analysis/attn.h.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../analysis/attn.h"
#include "../trace/trace.h"
#include "cli.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: kvsim attn TRACE [--k K] [--csv]\n"
            "Attention statistics per layer and query head of TRACE, exact full attention:\n"
            "  colsum_var  D2O's density diagnostic (POLICY_SPEC 5.3 D2, D3): the variance over the first\n"
            "              prompt's positions of the attention each receives summed over the prompt's queries;\n"
            "              low = dense (spread) attention, high = sparse. D2O's claim: lower in shallow layers.\n"
            "  union       RocketKV's top-k union (5.2 R4): the number of distinct positions ever among the top-K\n"
            "              of the full attention over the generated steps, against K and the sequence length.\n"
            "The table gives per layer the mean, min and max colsum_var over heads and the median and max union.\n"
            "  --k K     top-k size (default 16)\n"
            "  --csv     one row per (layer, query head): layer,q_head,colsum_var,k,union,steps,max_len\n");
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

int kvs_cmd_attn(int argc, char **argv) {
    const char *path = NULL;
    long k = 16;
    int csv = 0, seen_k = 0;
    for (int i = 1; i < argc; i++) {
        int missing = 0;
        const char *v;
        if (kvs_cli_is_help(argv[i])) {
            usage(stdout);
            return KVS_EXIT_OK;
        } else if ((v = kvs_cli_opt_value("--k", argc, argv, &i, &missing))) {
            if (kvs_cli_once("attn", "--k", &seen_k)) return KVS_EXIT_USAGE;
            if (kvs_cli_parse_long("--k", v, 1, 1L << 30, &k) != KVS_OK) return kvs_cli_fail("attn", KVS_ERR_INVALID_ARG);
        } else if (missing) {
            return kvs_cli_usage_error("attn", "option %s needs a value", argv[i]);
        } else if (!strcmp(argv[i], "--csv")) {
            if (kvs_cli_once("attn", "--csv", &csv)) return KVS_EXIT_USAGE;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            return kvs_cli_usage_error("attn", "unknown option '%s'", argv[i]);
        } else if (!path) {
            path = argv[i];
        } else {
            return kvs_cli_usage_error("attn", "unexpected argument '%s'", argv[i]);
        }
    }
    if (!path) return kvs_cli_usage_error("attn", "missing TRACE");
    kvs_trace *t = NULL;
    kvs_status st = kvs_trace_open(path, &t);
    if (st != KVS_OK) return kvs_cli_fail("attn", st == KVS_ERR_INVALID_ARG ? KVS_ERR_IO : st);
    const kvs_trace_info *info = kvs_trace_info_get(t);
    const int L = info->model.n_layers, H = info->model.n_heads, Hkv = info->model.n_kv_heads, G = H / Hkv;
    double *var = malloc((size_t)L * (size_t)H * sizeof *var);
    kvs_topk_union *un = malloc((size_t)L * (size_t)H * sizeof *un);
    int64_t *sorted = malloc((size_t)H * sizeof *sorted);
    if (!var || !un || !sorted) {
        st = kvs_fail(KVS_ERR_NOMEM, "out of memory");
        goto cleanup;
    }
    for (int l = 0; l < L && st == KVS_OK; l++) {
        st = kvs_analysis_colsum_variance(t, l, var + (size_t)l * (size_t)H);
        for (int h = 0; h < Hkv && st == KVS_OK; h++)
            st = kvs_analysis_topk_union(t, l, h, k, un + (size_t)l * (size_t)H + (size_t)h * (size_t)G);
    }
    if (st != KVS_OK) goto cleanup;
    if (csv) {
        printf("layer,q_head,colsum_var,k,union,steps,max_len\n");
        for (int l = 0; l < L; l++)
            for (int h = 0; h < H; h++) {
                const kvs_topk_union *u = &un[(size_t)l * (size_t)H + (size_t)h];
                char b[64];
                kvs_cli_fmt_real(b, sizeof b, var[(size_t)l * (size_t)H + (size_t)h]);
                printf("%d,%d,%s,%ld,%lld,%lld,%lld\n", l, h, b, k, (long long)u->n_union, (long long)u->steps,
                       (long long)u->max_len);
            }
    } else {
        printf("%s: %s, %d layers x %d query heads, first prompt %lld positions, %lld generated\n", path,
               info->model.model_name, L, H, (long long)info->turns[0].prompt_end,
               (long long)(info->n_positions - info->prompt_len));
        printf("%5s %11s %11s %11s   %8s %8s %9s %9s\n", "layer", "colsum_var", "min", "max", "union_md", "union_mx",
               "md/k", "md/len");
        for (int l = 0; l < L; l++) {
            const double *v = var + (size_t)l * (size_t)H;
            double mean = 0, mn = v[0], mx = v[0];
            for (int h = 0; h < H; h++) {
                mean += v[h] / H;
                if (v[h] < mn) mn = v[h];
                if (v[h] > mx) mx = v[h];
                sorted[h] = un[(size_t)l * (size_t)H + (size_t)h].n_union;
            }
            qsort(sorted, (size_t)H, sizeof *sorted, cmp_i64);
            double md = H % 2 ? (double)sorted[H / 2] : 0.5 * (double)(sorted[H / 2 - 1] + sorted[H / 2]);
            int64_t len = un[(size_t)l * (size_t)H].max_len;
            printf("%5d %11.4f %11.4f %11.4f   %8.1f %8lld %9.2f %9.3f\n", l, mean, mn, mx, md,
                   (long long)sorted[H - 1], md / (double)k, md / (double)len);
        }
        printf("colsum_var: variance over prompt positions of the attention they receive from the prompt's queries "
               "(low = dense); union: distinct positions in the top-%ld over %lld generated steps (md = median over "
               "heads, len = final sequence length %lld)\n",
               k, (long long)un[0].steps, (long long)un[0].max_len);
    }
cleanup:
    free(var);
    free(un);
    free(sorted);
    kvs_trace_close(t);
    if (st != KVS_OK) return kvs_cli_fail("attn", st);
    return kvs_cli_finish_stdout("attn");
}
