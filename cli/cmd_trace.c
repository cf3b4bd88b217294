/* cmd_trace.c — the trace subcommands of kvsim: `info`, `verify`, `export` and `trace recover`.
 *
 * They are thin layers over the trace library (file format: trace/FORMAT.md): options, one library call,
 * printing. `info` reads trace/trace.h's header view; `verify` is trace/verify.h's kvs_trace_verify (exact
 * causal full attention recomputed from the stored q/k/v, each row against its own error bound; FORMAT.md
 * "What verify checks"); `export` decodes blocks into a .npy (common/npy.h); `trace recover` is
 * kvs_trace_recover_with_report. Exit codes as in cli.h.
 */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/kvs_out.h"
#include "../common/npy.h"
#include "../trace/trace.h"
#include "../trace/verify.h"
#include "cli.h"

/* Reports getopt's complaint for the option it stopped at (opterr = 0, optstring starts with ':'). */
static int option_error(const char *cmd, int c, char **argv) {
    const char *arg = argv[optind - 1];
    if (c == ':') return kvs_cli_usage_error(cmd, "option '%s' needs a value", arg);
    if (optopt && optopt < 256) return kvs_cli_usage_error(cmd, "unknown option '-%c'", optopt);
    return kvs_cli_usage_error(cmd, "unknown option '%s'", arg);
}

/* The one rule for single-valued options (cli.h kvs_cli_once): the long option getopt_long matched
 * (longindex li; every option here is long-only) given a second time is a usage error naming it. seen[] has
 * one slot per entry of opts. */
static int option_once(const char *cmd, const struct option *opts, int li, int *seen) {
    if (li < 0) return 0;
    char name[64];
    snprintf(name, sizeof name, "--%s", opts[li].name);
    return kvs_cli_once(cmd, name, &seen[li]);
}

/* Reports a missing TRACE or an extra positional argument (exactly one is wanted). */
static int positional_error(const char *cmd, int argc, char **argv) {
    if (argc - optind < 1) return kvs_cli_usage_error(cmd, "missing TRACE argument");
    return kvs_cli_usage_error(cmd, "unexpected argument '%s'", argv[optind + 1]);
}

/* ------------------------------------------------------------------------------------------------
 * kvsim info TRACE
 * ---------------------------------------------------------------------------------------------- */

static void info_usage(FILE *f) {
    fprintf(f, "usage: kvsim info TRACE\n\n"
               "Prints the trace's model config, storage dtype and block size, positions (prompt / generated),\n"
               "turns, chunk count, raw vs compressed payload bytes and the capture settings.\n");
}

static void print_bytes(const char *label, uint64_t b) {
    printf("  %-11s %llu bytes (%.2f MiB)\n", label, (unsigned long long)b, (double)b / (1024.0 * 1024.0));
}

int kvs_cmd_info(int argc, char **argv) {
    static const struct option opts[] = {{"help", no_argument, NULL, 'h'}, {NULL, 0, NULL, 0}};
    opterr = 0;
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        if (c == 'h') {
            info_usage(stdout);
            return kvs_cli_finish_stdout("info");
        }
        return option_error("info", c, argv);
    }
    if (argc - optind != 1) return positional_error("info", argc, argv);
    const char *path = argv[optind];
    kvs_trace *t = NULL;
    kvs_status s = kvs_trace_open(path, &t);
    if (s != KVS_OK) return kvs_cli_fail("info", s);
    const kvs_trace_info *in = kvs_trace_info_get(t);
    const kvs_model_config *m = &in->model;
    const kvs_capture_config *cp = &in->capture;
    printf("trace        %s (format version %u)\n", path, in->version);
    printf("model        %s\n", m->model_name[0] ? m->model_name : "(unnamed)");
    printf("  layers %d, query heads %d, kv heads %d (group %d), head_dim %d\n", m->n_layers, m->n_heads,
           m->n_kv_heads, m->n_heads / m->n_kv_heads, m->head_dim);
    printf("  dim %d, hidden_dim %d, vocab %d, max_seq_len %d\n", m->dim, m->hidden_dim, m->vocab_size,
           m->max_seq_len);
    printf("  rope_theta %g (%s pairs), norm_eps %g, attn_scale %g\n", (double)m->rope_theta,
           m->rope_layout == KVS_ROPE_HALVES ? "rotate_half" : "adjacent", (double)m->norm_eps, (double)m->attn_scale);
    if (kvs_model_config_has_windows(m)) { /* sliding-window layers: the window of every layer, 0 = full */
        printf("  layer windows");
        for (int l = 0; l < m->n_layers; l++) printf("%s%d", l ? "," : " ", m->layer_window[l]);
        printf(" (positions attended, the current one included; 0 = full causal attention)\n");
    }
    if (cp->flags & KVS_TRACE_FLAG_QKV)
        printf("storage      %s q/k/v (lean record: o and lse not stored, readers recompute them), %d positions per "
               "block, byte shuffle %s\n", kvs_dtype_name((kvs_dtype)cp->dtype), cp->block_positions,
               (cp->flags & KVS_TRACE_FLAG_SHUFFLE) ? "on" : "off");
    else
        printf("storage      %s q/k/v/o (lse fp32), %d positions per block, byte shuffle %s\n",
               kvs_dtype_name((kvs_dtype)cp->dtype), cp->block_positions,
               (cp->flags & KVS_TRACE_FLAG_SHUFFLE) ? "on" : "off");
    int64_t generated = 0;
    for (int64_t i = 0; i < in->n_turns; i++) generated += in->turns[i].end - in->turns[i].prompt_end;
    printf("positions    %lld (%lld prompt, %lld generated; prompt length before the first generated token "
           "%lld)\n", (long long)in->n_positions, (long long)(in->n_positions - generated), (long long)generated,
           (long long)in->prompt_len);
    printf("max_new_tokens %d%s\n", cp->max_new_tokens, cp->max_new_tokens ? "" : " (unknown)");
    printf("turns        %lld\n", (long long)in->n_turns);
    for (int64_t i = 0; i < in->n_turns; i++) {
        const kvs_turn *tu = &in->turns[i];
        printf("  turn %lld: begin %lld, prompt_end %lld, end %lld (%lld prompt, %lld generated)\n", (long long)i,
               (long long)tu->begin, (long long)tu->prompt_end, (long long)tu->end,
               (long long)(tu->prompt_end - tu->begin), (long long)(tu->end - tu->prompt_end));
    }
    printf("chunks       %lld (%lld blocks x (%d layers x %d kv heads + 1 tokens chunk))\n", (long long)in->n_chunks,
           (long long)in->n_blocks, m->n_layers, m->n_kv_heads);
    printf("bytes\n");
    print_bytes("raw", in->raw_bytes);
    print_bytes("compressed", in->compressed_bytes);
    print_bytes("file", in->file_bytes);
    printf("  ratio       %.3f (raw / compressed)\n",
           in->compressed_bytes ? (double)in->raw_bytes / (double)in->compressed_bytes : 0.0);
    printf("settings     %s\n", cp->settings[0] ? cp->settings : "(none)");
    kvs_trace_close(t);
    return kvs_cli_finish_stdout("info");
}

/* ------------------------------------------------------------------------------------------------
 * kvsim verify TRACE [--tolerance X] [--lse-tolerance X] [--threads N]
 * ---------------------------------------------------------------------------------------------- */

static void verify_usage(FILE *f) {
    fprintf(f, "usage: kvsim verify TRACE [--tolerance X] [--lse-tolerance X] [--threads N]\n\n"
               "1. reads and checksums every chunk;\n"
               "2. for every (layer, KV head) stream recomputes exact causal full attention of every position and\n"
               "   query head from the stored q/k/v (fp32 math) and compares with the stored o and lse.\n"
               "By default each row (position, query head) is checked against a rigorous error bound computed for\n"
               "that row from the storage dtype's rounding (fp16 u = 2^-11, bf16 2^-8, fp32 2^-24) of q/k/v/o and\n"
               "the fp32 arithmetic of capture and recomputation (derivation: trace/verify.c; summary:\n"
               "trace/FORMAT.md \"What verify checks\"). Prints per layer the largest relative output error\n"
               "||o - o'|| / ||o||, the largest absolute lse error and the bound usage (error / bound, <= 1 on a\n"
               "correct trace). Exit 0 only when every row is within its bound (or the fixed tolerances).\n"
               "A lean trace (capture --record qkv) stores no o or lse: verify then checks the chunks and that\n"
               "every stored q/k/v value is finite, and says that the outputs cannot be checked.\n\n"
               "  --tolerance X      use fixed tolerances instead of the bound: max relative output error X;\n"
               "                     also the LSE tolerance unless --lse-tolerance is given\n"
               "  --lse-tolerance X  use fixed tolerances: max absolute LSE error X (the output tolerance is\n"
               "                     then --tolerance, or fp32 1e-4, fp16 0.0625, bf16 0.5)\n"
               "  --threads N        parallel streams, 1..%d (default: all %d cores)\n"
               "Each option may be given once.\n", KVS_CLI_MAX_THREADS, kvs_n_cpus());
}

/* Prints the report of a lean trace (what was and was not checked). @return the exit status. */
static int verify_print_lean(const char *path, const kvs_verify_report *r) {
    if (r->lean_status != KVS_OK)
        return kvs_cli_fail("verify", kvs_fail(r->lean_status, "%s", r->lean_detail));
    printf("lean trace (recorded with --record qkv): o and lse were not stored, so the recorded attention outputs "
           "cannot be checked against a recomputation; readers recompute them from the stored q/k/v\n");
    printf("checked: every chunk's checksums and decoding; every stored q/k/v value finite (%lld values, %lld not "
           "finite)\n", (long long)r->lean_values, (long long)r->lean_bad);
    if (r->lean_bad) {
        fprintf(stderr, "kvsim verify: %s: %lld stored q/k/v values are not finite (the first at layer %d, kv head %d, "
                "position %lld)\n", path, (long long)r->lean_bad, r->lean_first_layer, r->lean_first_kv,
                (long long)r->lean_first_pos);
        (void)kvs_cli_finish_stdout("verify");
        return KVS_EXIT_FAIL;
    }
    printf("verify: OK (lean trace: chunks and q/k/v only)\n");
    return kvs_cli_finish_stdout("verify");
}

/* Prints the report of a full trace: the configuration, one line per layer (a stream that could not be checked
 * on stderr before its layer's line), the verdict. @return the exit status. */
static int verify_print(const char *path, const kvs_verify_report *r) {
    const kvs_verify_cfg *cfg = &r->cfg;
    const char *what = cfg->fixed ? "tolerance" : "bound";
    if (cfg->fixed)
        printf("attention recomputed from stored q/k/v (%s storage; fixed tolerances: output %.3g relative, lse "
               "%.3g absolute)\n", kvs_dtype_name(r->dtype), cfg->tol, cfg->lse_tol);
    else
        printf("attention recomputed from stored q/k/v (%s storage, u = 2^%d; per-row error bound; usage = error / "
               "bound)\n", kvs_dtype_name(r->dtype), (int)lround(log2(cfg->u)));
    for (int l = 0; l < r->n_layers; l++) {
        for (int h = 0; h < r->n_kv_heads; h++) {
            const kvs_verify_stream_result *sr = &r->streams[l * r->n_kv_heads + h];
            if (sr->status != KVS_OK)
                fprintf(stderr, "kvsim verify: %s\n", sr->detail[0] ? sr->detail : kvs_strerror(sr->status));
        }
        kvs_verify_layer a;
        (void)kvs_verify_report_layer(r, l, &a);
        printf("layer %3d: max rel output error %.3e (position %lld, head %d), max lse error %.3e, %s usage "
               "output %.3g lse %.3g (position %lld, head %d)  ", l, a.max_rel, (long long)a.worst_pos, a.worst_head,
               a.max_lse, what, a.use_o, a.use_lse, (long long)a.use_pos, a.use_head);
        if (a.n_fail) printf("FAIL (%lld rows)\n", (long long)a.n_fail);
        else printf("ok\n");
    }
    if (r->n_errors) {
        (void)kvs_cli_finish_stdout("verify"); /* a write error is reported too; exit 1 either way */
        return KVS_EXIT_FAIL;
    }
    if (r->n_fail) {
        fprintf(stderr, "kvsim verify: %s: stored attention outputs do not match the recomputation (%lld rows "
                        "exceed their %s)\n", path, (long long)r->n_fail, cfg->fixed ? "tolerance" : "error bound");
        (void)kvs_cli_finish_stdout("verify");
        return KVS_EXIT_FAIL;
    }
    printf("verify: OK (max %s usage %.3g)\n", what, r->max_usage);
    return kvs_cli_finish_stdout("verify");
}

int kvs_cmd_verify(int argc, char **argv) {
    static const struct option opts[] = {{"tolerance", required_argument, NULL, 't'},
                                         {"lse-tolerance", required_argument, NULL, 'l'},
                                         {"threads", required_argument, NULL, 'j'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    kvs_verify_options vo = kvs_verify_options_default();
    long threads = kvs_n_cpus();
    if (threads > KVS_CLI_MAX_THREADS) threads = KVS_CLI_MAX_THREADS;
    int seen[4] = {0};
    opterr = 0;
    optind = 1;
    int c, li = -1;
    while ((c = getopt_long(argc, argv, ":h", opts, &li)) != -1) {
        kvs_status s = KVS_OK;
        if (c != ':' && c != '?' && option_once("verify", opts, li, seen)) return KVS_EXIT_USAGE;
        li = -1;
        switch (c) {
        case 'h': verify_usage(stdout); return kvs_cli_finish_stdout("verify");
        case 't': s = kvs_cli_parse_double("--tolerance", optarg, 0, 1e30, &vo.tolerance); break;
        case 'l': s = kvs_cli_parse_double("--lse-tolerance", optarg, 0, 1e30, &vo.lse_tolerance); break;
        case 'j': s = kvs_cli_parse_long("--threads", optarg, 1, KVS_CLI_MAX_THREADS, &threads); break;
        default: return option_error("verify", c, argv);
        }
        if (s != KVS_OK) return kvs_cli_usage_error("verify", "%s", kvs_last_error());
    }
    if (argc - optind != 1) return positional_error("verify", argc, argv);
    vo.threads = (int)threads;
    const char *path = argv[optind];
    kvs_trace *t = NULL;
    kvs_status s = kvs_trace_open(path, &t);
    if (s != KVS_OK) return kvs_cli_fail("verify", s);
    kvs_verify_report *r = NULL;
    s = kvs_trace_verify(t, &vo, &r);
    kvs_trace_close(t);
    if (s != KVS_OK) return kvs_cli_fail("verify", s);
    printf("checksums: all %lld chunks ok\n", (long long)r->n_chunks);
    int rc = r->lean ? verify_print_lean(path, r) : verify_print(path, r);
    kvs_verify_report_free(r);
    return rc;
}

/* ------------------------------------------------------------------------------------------------
 * kvsim export TRACE --layer L --what q|k|v|o|lse|tokens --out F.npy
 * ---------------------------------------------------------------------------------------------- */

static void export_usage(FILE *f) {
    fprintf(f, "usage: kvsim export TRACE --what q|k|v|o|lse|tokens [--layer L] --out FILE.npy\n\n"
               "Writes one array of one layer as a NumPy .npy file (values decoded to float32):\n"
               "  q, o    float32 [positions, n_heads, head_dim]\n"
               "  k, v    float32 [positions, n_kv_heads, head_dim]\n"
               "  lse     float32 [positions, n_heads]\n"
               "          (a lean trace, capture --record qkv, stores no o or lse: they are recomputed in fp32\n"
               "          from its q/k/v)\n"
               "  tokens  int32   [positions] (no --layer needed)\n\n"
               "--out FILE: a regular file is replaced atomically (written beside it, then renamed); a symbolic\n"
               "link is written through (its target is replaced, the link stays); a FIFO or device is written\n"
               "directly; - is standard output (the \"wrote\" line then goes to stderr).\n"
               "Each option may be given once.\n");
}

/* Writes a .npy file to o: the common/npy.h header, then the elements little-endian (4 bytes each). */
static kvs_status write_npy(kvs_out *o, kvs_npy_type type, const int64_t *shape, int ndim, const void *data) {
    uint8_t hdr[640], chunk[1 << 16];
    size_t hlen;
    kvs_status s = kvs_npy_header(type, shape, ndim, hdr, sizeof hdr, &hlen);
    if (s != KVS_OK || (s = kvs_out_write(o, hdr, hlen)) != KVS_OK) return s;
    uint64_t count = 1;
    for (int i = 0; i < ndim; i++) count *= (uint64_t)shape[i];
    const uint32_t *src = data; /* float32 and int32 alike: their 4 bytes */
    for (uint64_t i = 0; i < count;) {
        size_t m = 0;
        for (; m < sizeof chunk / 4 && i < count; m++, i++) {
            uint32_t u;
            memcpy(&u, src + i, 4);
            kvs_put_u32(chunk + 4 * m, u);
        }
        if ((s = kvs_out_write(o, chunk, 4 * m)) != KVS_OK) return s;
    }
    return KVS_OK;
}

/* Writes the .npy to `path` through common/kvs_out.h (nothing half-written is left on failure);
 * *to_stdout: whether it went to standard output. */
static kvs_status export_npy(const char *path, kvs_npy_type type, const int64_t *shape, int ndim, const void *data,
                             int *to_stdout) {
    kvs_out *o = NULL;
    kvs_status s = kvs_out_open(path, &o);
    if (s != KVS_OK) return s;
    *to_stdout = kvs_out_is_stdout(o);
    if ((s = write_npy(o, type, shape, ndim, data)) != KVS_OK) {
        kvs_out_abort(o);
        return s;
    }
    return kvs_out_commit(o);
}

int kvs_cmd_export(int argc, char **argv) {
    static const struct option opts[] = {{"layer", required_argument, NULL, 'l'},
                                         {"what", required_argument, NULL, 'w'},
                                         {"out", required_argument, NULL, 'o'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    long layer = -1;
    const char *what = NULL, *out_path = NULL;
    int seen[4] = {0};
    opterr = 0;
    optind = 1;
    int c, li = -1;
    while ((c = getopt_long(argc, argv, ":h", opts, &li)) != -1) {
        if (c != ':' && c != '?' && option_once("export", opts, li, seen)) return KVS_EXIT_USAGE;
        li = -1;
        switch (c) {
        case 'h': export_usage(stdout); return kvs_cli_finish_stdout("export");
        case 'l':
            if (kvs_cli_parse_long("--layer", optarg, 0, KVS_TRACE_MAX_LAYERS - 1, &layer) != KVS_OK)
                return kvs_cli_usage_error("export", "%s", kvs_last_error());
            break;
        case 'w': what = optarg; break;
        case 'o': out_path = optarg; break;
        default: return option_error("export", c, argv);
        }
    }
    if (argc - optind != 1) return positional_error("export", argc, argv);
    if (!what) return kvs_cli_usage_error("export", "missing --what (q, k, v, o, lse or tokens)");
    int wi = -1;
    static const char *const whats[] = {"q", "k", "v", "o", "lse", "tokens"};
    for (int i = 0; i < 6; i++)
        if (!strcmp(what, whats[i])) wi = i;
    if (wi < 0) return kvs_cli_usage_error("export", "--what: '%s' is not one of q, k, v, o, lse, tokens", what);
    if (!out_path) return kvs_cli_usage_error("export", "missing --out FILE.npy");
    if (wi != 5 && layer < 0) return kvs_cli_usage_error("export", "missing --layer (needed for --what %s)", what);

    kvs_trace *t = NULL;
    kvs_status s = kvs_trace_open(argv[optind], &t);
    if (s != KVS_OK) return kvs_cli_fail("export", s);
    const kvs_trace_info *in = kvs_trace_info_get(t);
    uint32_t in_flags = in->capture.flags; /* `in` is borrowed from t, closed before the message */
    int64_t N = in->n_positions;
    int H = in->model.n_heads, Hkv = in->model.n_kv_heads, d = in->model.head_dim, G = H / Hkv;
    int to_stdout = 0;
    const char *out_name = strcmp(out_path, "-") ? out_path : "standard output";
    if (wi == 5) {
        int64_t shape[1] = {N};
        s = export_npy(out_path, KVS_NPY_I32, shape, 1, kvs_trace_tokens(t), &to_stdout);
        kvs_trace_close(t);
        if (s != KVS_OK) return kvs_cli_fail("export", s);
        fprintf(to_stdout ? stderr : stdout, "wrote %s: tokens int32 [%lld]\n", out_name, (long long)N);
        return kvs_cli_finish_stdout("export");
    }
    if (layer >= in->model.n_layers) {
        int n_layers = in->model.n_layers; /* `in` is borrowed from t */
        kvs_trace_close(t);
        return kvs_cli_usage_error("export", "--layer %ld: the trace has layers 0..%d", layer, n_layers - 1);
    }
    int per_pos_heads = (wi == 1 || wi == 2) ? Hkv : H; /* k, v per KV head; q, o, lse per query head */
    size_t row = wi == 4 ? 1 : (size_t)d;
    size_t n_elem = (size_t)N * (size_t)per_pos_heads * row;
    float *arr = malloc(n_elem * sizeof(float));
    kvs_trace_block *b = NULL;
    if (!arr) {
        kvs_trace_close(t);
        return kvs_cli_fail("export", kvs_fail(KVS_ERR_NOMEM, "cannot allocate %zu floats", n_elem));
    }
    if ((s = kvs_trace_block_create(t, &b)) != KVS_OK) goto done;
    for (int kh = 0; kh < Hkv && s == KVS_OK; kh++) {
        for (int64_t blk = 0; blk < in->n_blocks && s == KVS_OK; blk++) {
            if ((s = kvs_trace_read_block(t, (int)layer, kh, blk, b)) != KVS_OK) break;
            for (int32_t i = 0; i < b->n_pos; i++) {
                size_t p = (size_t)(b->first_pos + i);
                if (wi == 1 || wi == 2) {
                    const float *src = (wi == 1 ? b->k : b->v) + (size_t)i * row;
                    memcpy(arr + (p * (size_t)Hkv + (size_t)kh) * row, src, row * sizeof(float));
                    continue;
                }
                for (int g = 0; g < G; g++) {
                    size_t h = (size_t)kh * (size_t)G + (size_t)g;
                    const float *src = wi == 0 ? b->q : wi == 3 ? b->o : b->lse;
                    memcpy(arr + (p * (size_t)H + h) * row, src + ((size_t)i * (size_t)G + (size_t)g) * row,
                           row * sizeof(float));
                }
            }
        }
    }
    if (s == KVS_OK) {
        int64_t shape[3] = {N, per_pos_heads, d};
        s = export_npy(out_path, KVS_NPY_F32, shape, wi == 4 ? 2 : 3, arr, &to_stdout);
    }
done:
    kvs_trace_block_free(b);
    free(arr);
    kvs_trace_close(t);
    if (s != KVS_OK) return kvs_cli_fail("export", s);
    FILE *msg = to_stdout ? stderr : stdout; /* the .npy bytes own standard output */
    if (wi == 4) fprintf(msg, "wrote %s: layer %ld lse float32 [%lld, %d]\n", out_name, layer, (long long)N, per_pos_heads);
    else
        fprintf(msg, "wrote %s: layer %ld %s float32 [%lld, %d, %d]\n", out_name, layer, what, (long long)N,
                per_pos_heads, d);
    if ((wi == 3 || wi == 4) && (in_flags & KVS_TRACE_FLAG_QKV))
        fprintf(msg, "(a lean trace stores no %s: recomputed in fp32 from the stored q/k/v)\n", what);
    return kvs_cli_finish_stdout("export");
}

/* ------------------------------------------------------------------------------------------------
 * kvsim trace recover IN OUT
 * ---------------------------------------------------------------------------------------------- */

static void trace_usage(FILE *f) {
    fprintf(f, "usage: kvsim trace recover IN OUT\n\n"
               "  recover   restores the complete blocks of a trace whose writer was killed (IN is usually\n"
               "            CAPTURE.kvt.partial) into a complete, valid trace OUT\n\n"
               "OUT may be IN's final name (kvsim trace recover cap.kvt.partial cap.kvt): a regular file is\n"
               "replaced atomically (written beside it, then renamed), a symbolic link is written through, a\n"
               "FIFO or device directly, - is standard output (the report then goes to stderr).\n"
               "Prints the positions and blocks recovered and what was left out, and why. Exit status:\n"
               "  0  clean recovery: everything IN holds was recovered, except an unfinished tail (the chunks of\n"
               "     a block the killed writer had not finished, a chunk cut off by the end of the file)\n"
               "  1  partial recovery: OUT holds the positions before the first bad chunk, and stderr says\n"
               "     \"partial recovery\", how many positions and blocks IN holds past it that were dropped,\n"
               "     the bad chunk, its offset and its error (a checksum or header check failed, or the chunks\n"
               "     are out of order); or a failure: nothing to recover, I/O error (no OUT is written)\n"
               "  2  bad usage\n");
}

/* Prints the outcome of a recovery: what OUT holds (stdout, or stderr when OUT is standard output), an
 * unfinished tail that was left out, and for a partial recovery what was dropped and why (stderr).
 * @return the exit status: 0 clean, 1 partial. */
static int recover_report(const char *in_path, const char *out_path, const kvs_trace_recovery *r, int out_is_stdout) {
    FILE *msg = out_is_stdout ? stderr : stdout;
    fprintf(msg, "recovered %lld positions (%lld block%s) from %s into %s\n", (long long)r->positions,
            (long long)r->blocks, r->blocks == 1 ? "" : "s", in_path, out_is_stdout ? "standard output" : out_path);
    if (!r->partial) {
        if (r->tail[0]) fprintf(msg, "left out (an unfinished tail, as a killed capture leaves): %s\n", r->tail);
        return KVS_EXIT_OK;
    }
    fprintf(stderr, "kvsim trace recover: partial recovery: ");
    if (r->lost_positions > 0)
        fprintf(stderr, "dropped %lld positions (%lld..%lld, %lld block%s) that %s holds past the first bad chunk",
                (long long)r->lost_positions, (long long)r->positions, (long long)r->input_positions - 1,
                (long long)r->lost_blocks, r->lost_blocks == 1 ? "" : "s", in_path);
    else
        fprintf(stderr, "dropped what %s holds past the first bad chunk (no chunk header is readable there)", in_path);
    fprintf(stderr, " (%llu bytes from offset %lld on); first bad chunk%s%s at offset %lld: %s\n",
            (unsigned long long)r->dropped_bytes, (long long)r->bad_offset, r->bad_chunk[0] ? ": " : "", r->bad_chunk,
            (long long)r->bad_offset, r->bad_error);
    return KVS_EXIT_FAIL;
}

int kvs_cmd_trace(int argc, char **argv) {
    if (argc < 2) return kvs_cli_usage_error("trace", "missing subcommand (recover)");
    if (kvs_cli_is_help(argv[1])) {
        trace_usage(stdout);
        return kvs_cli_finish_stdout("trace");
    }
    if (strcmp(argv[1], "recover") != 0) return kvs_cli_usage_error("trace", "unknown subcommand '%s'", argv[1]);
    static const struct option opts[] = {{"help", no_argument, NULL, 'h'}, {NULL, 0, NULL, 0}};
    opterr = 0;
    optind = 1;
    int c, sub_argc = argc - 1;
    char **sub_argv = argv + 1;
    while ((c = getopt_long(sub_argc, sub_argv, ":h", opts, NULL)) != -1) {
        if (c == 'h') {
            trace_usage(stdout);
            return kvs_cli_finish_stdout("trace recover");
        }
        return option_error("trace recover", c, sub_argv);
    }
    int npos = sub_argc - optind;
    if (npos < 2) return kvs_cli_usage_error("trace recover", "needs IN and OUT arguments");
    if (npos > 2) return kvs_cli_usage_error("trace recover", "unexpected argument '%s'", sub_argv[optind + 2]);
    const char *in_path = sub_argv[optind], *out_path = sub_argv[optind + 1];
    kvs_trace_recovery rep;
    kvs_status s = kvs_trace_recover_with_report(in_path, out_path, &rep);
    if (s != KVS_OK) return kvs_cli_fail("trace recover", s);
    int rc = recover_report(in_path, out_path, &rep, kvs_out_path_is_stdout(out_path));
    int wrc = kvs_cli_finish_stdout("trace recover");
    return rc != KVS_EXIT_OK ? rc : wrc;
}
