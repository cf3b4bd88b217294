/* cmd_trace.c — the trace subcommands of kvsim: `info`, `verify`, `export` and `trace recover`.
 *
 * They are thin layers over trace/trace.h (file format: trace/FORMAT.md). `verify` recomputes exact causal
 * full attention from the stored q/k/v with kvs_attention() (common/kvs_math.h, the definitions in
 * ../shared/DESIGN.md "Capture") and compares it with the stored o and lse. Exit codes as in cli.h.
 */
#include <getopt.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/kvs_math.h"
#include "../common/npy.h"
#include "../trace/trace.h"
#include "cli.h"

/* Reports getopt's complaint for the option it stopped at (opterr = 0, optstring starts with ':'). */
static int option_error(const char *cmd, int c, char **argv) {
    const char *arg = argv[optind - 1];
    if (c == ':') return kvs_cli_usage_error(cmd, "option '%s' needs a value", arg);
    if (optopt && optopt < 256) return kvs_cli_usage_error(cmd, "unknown option '-%c'", optopt);
    return kvs_cli_usage_error(cmd, "unknown option '%s'", arg);
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
            return KVS_EXIT_OK;
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
    printf("storage      %s q/k/v/o (lse fp32), %d positions per block, byte shuffle %s\n",
           kvs_dtype_name((kvs_dtype)cp->dtype), cp->block_positions, (cp->flags & KVS_TRACE_FLAG_SHUFFLE) ? "on" : "off");
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
    return KVS_EXIT_OK;
}

/* ------------------------------------------------------------------------------------------------
 * kvsim verify TRACE [--tolerance X] [--lse-tolerance X] [--threads N]
 * ---------------------------------------------------------------------------------------------- */

/* Default tolerances per storage dtype.
 *
 * What is compared: the stored o/lse were computed at capture from the unrounded q/k/v; verify recomputes
 * them in fp32 from the STORED q/k/v, which were each rounded to the storage dtype (unit roundoff u:
 * fp32 2^-24, fp16 2^-11, bf16 2^-8), and the stored o was rounded too. First-order bounds:
 *  - scores s_j = scale q.k_j move by δs_j = scale (δq.k_j + q.δk_j), |δs_j| <= 2u scale |q||k_j| (worst
 *    case; independent roundings make it ~sqrt(2/d) of that typically);
 *  - LSE is 1-Lipschitz in the max-norm of the scores: |δlse| <= Δ := max_j |δs_j|;
 *  - o = Σ p_j v_j: ||δo||/||o|| <= u (stored o) + (u + e^{2Δ} - 1) Σ p_j ||v_j|| / ||o||, since each
 *    p_j moves by a factor within e^{±2Δ} and each v_j by u relative.
 * Both grow with scale |q||k| (sharp heads) and with small d (less cancellation), so the defaults are set
 * from real captures, not from Gaussian data: on stories260K (d = 8, the worst case we have; 401 positions,
 * greedy, `kvsim capture --steps 400 --ignore-eos`) the largest errors were, fp16: output 0.025 (51 u),
 * lse 0.059 (120 u); bf16: output 0.18 (47 u), lse 0.52 (134 u); tinystories-656K (d = 16) gave 5-10x
 * less. Defaults: output 128 u, lse 512 u (2.5x and 4x above the worst measured), i.e. fp16 0.0625 / 0.25,
 * bf16 0.5 / 2.0. fp32 traces are recomputed exactly up to summation order: 1e-4 for both (measured 0 and
 * 1e-6 on the CPU capture; the margin absorbs a GPU capture's different reduction order).
 * A wrong o (another position's output, or a bug) gives a maximum relative error of order 1 or more over a
 * trace (0.5 .. 3 on generated data, see tests/test_cli_trace.c; 4.7 .. 8.0 on the stories260K and
 * tinystories-656K captures with o shifted by one position), which these tolerances catch in every
 * dtype. Pass --tolerance / --lse-tolerance to tighten or loosen. */
static void default_tolerances(kvs_dtype dt, double *out_tol, double *lse_tol) {
    switch (dt) {
    case KVS_DTYPE_F32: *out_tol = 1e-4, *lse_tol = 1e-4; break;
    case KVS_DTYPE_F16: *out_tol = 128.0 / 2048.0, *lse_tol = 512.0 / 2048.0; break;
    case KVS_DTYPE_BF16: *out_tol = 128.0 / 256.0, *lse_tol = 512.0 / 256.0; break;
    }
}

typedef struct {
    double max_rel, max_lse;
    int64_t worst_pos;       /* position of max_rel */
    int worst_head;
    kvs_status status;
    char detail[1024];
} stream_result;

typedef struct {
    const kvs_trace *t;
    stream_result *res;      /* [L * Hkv] */
    int n_streams;
    int next;                /* next stream to take (atomic) */
} verify_job;

/* Recomputes one (layer, KV head) stream. Memory: the stream's K/V history (N x d floats each) + one block. */
static void verify_stream(const kvs_trace *t, int layer, int kv_head, stream_result *r, float *keys, float *vals,
                          float *probs, float *out) {
    const kvs_trace_info *in = kvs_trace_info_get(t);
    size_t d = (size_t)in->model.head_dim;
    float scale = in->model.attn_scale;
    kvs_trace_stream *st = NULL;
    r->status = kvs_trace_stream_open(t, layer, kv_head, &st);
    const kvs_trace_block *b;
    while (r->status == KVS_OK && (r->status = kvs_trace_stream_next(st, &b)) == KVS_OK) {
        size_t G = (size_t)b->group;
        memcpy(keys + (size_t)b->first_pos * d, b->k, (size_t)b->n_pos * d * sizeof(float));
        memcpy(vals + (size_t)b->first_pos * d, b->v, (size_t)b->n_pos * d * sizeof(float));
        for (int32_t i = 0; i < b->n_pos; i++) {
            size_t p = (size_t)b->first_pos + (size_t)i;
            for (size_t g = 0; g < G; g++) {
                const float *q = b->q + ((size_t)i * G + g) * d, *o = b->o + ((size_t)i * G + g) * d;
                double lse = kvs_attention(q, keys, vals, d, NULL, p + 1, d, scale, probs, out);
                double rel = kvs_rel_l2(o, out, d);
                double el = fabs(lse - (double)b->lse[(size_t)i * G + g]);
                if (isnan(rel)) rel = INFINITY; /* NaN must never look like a pass */
                if (isnan(el)) el = INFINITY;
                if (rel > r->max_rel) {
                    r->max_rel = rel;
                    r->worst_pos = (int64_t)p;
                    r->worst_head = kv_head * (int)G + (int)g;
                }
                if (el > r->max_lse) r->max_lse = el;
            }
        }
    }
    if (r->status == KVS_ERR_END) r->status = KVS_OK;
    if (r->status != KVS_OK) snprintf(r->detail, sizeof r->detail, "%s", kvs_last_error());
    kvs_trace_stream_free(st);
}

static void *verify_worker(void *arg) {
    verify_job *job = arg;
    const kvs_trace_info *in = kvs_trace_info_get(job->t);
    size_t N = (size_t)in->n_positions, d = (size_t)in->model.head_dim;
    float *keys = malloc(N * d * sizeof(float)), *vals = malloc(N * d * sizeof(float));
    float *probs = malloc(N * sizeof(float)), *out = malloc(d * sizeof(float));
    for (;;) {
        int i = __atomic_fetch_add(&job->next, 1, __ATOMIC_RELAXED);
        if (i >= job->n_streams) break;
        stream_result *r = &job->res[i];
        if (!keys || !vals || !probs || !out) {
            r->status = KVS_ERR_NOMEM;
            snprintf(r->detail, sizeof r->detail, "cannot allocate the K/V history (%zu positions)", N);
            continue;
        }
        verify_stream(job->t, i / in->model.n_kv_heads, i % in->model.n_kv_heads, r, keys, vals, probs, out);
    }
    free(keys);
    free(vals);
    free(probs);
    free(out);
    return NULL;
}

static void verify_usage(FILE *f) {
    fprintf(f, "usage: kvsim verify TRACE [--tolerance X] [--lse-tolerance X] [--threads N]\n\n"
               "1. reads and checksums every chunk;\n"
               "2. for every (layer, KV head) stream recomputes exact causal full attention of every position and\n"
               "   query head from the stored q/k/v (fp32 math) and compares with the stored o (relative L2 error\n"
               "   ||o - o'|| / ||o||) and lse (absolute error). Prints per layer the largest errors.\n"
               "Exit 0 only when every error is within tolerance.\n\n"
               "  --tolerance X      max relative output error (default: fp32 1e-4, fp16 0.0625, bf16 0.5);\n"
               "                     also the LSE tolerance unless --lse-tolerance is given\n"
               "  --lse-tolerance X  max absolute LSE error (default: fp32 1e-4, fp16 0.25, bf16 2)\n"
               "  --threads N        parallel streams (default: all %d cores)\n", kvs_n_cpus());
}

int kvs_cmd_verify(int argc, char **argv) {
    static const struct option opts[] = {{"tolerance", required_argument, NULL, 't'},
                                         {"lse-tolerance", required_argument, NULL, 'l'},
                                         {"threads", required_argument, NULL, 'j'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    double tol = -1, lse_tol = -1;
    long threads = kvs_n_cpus();
    opterr = 0;
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        kvs_status s = KVS_OK;
        switch (c) {
        case 'h': verify_usage(stdout); return KVS_EXIT_OK;
        case 't': s = kvs_cli_parse_double("--tolerance", optarg, 0, 1e30, &tol); break;
        case 'l': s = kvs_cli_parse_double("--lse-tolerance", optarg, 0, 1e30, &lse_tol); break;
        case 'j': s = kvs_cli_parse_long("--threads", optarg, 1, 4096, &threads); break;
        default: return option_error("verify", c, argv);
        }
        if (s != KVS_OK) return kvs_cli_usage_error("verify", "%s", kvs_last_error());
    }
    if (argc - optind != 1) return positional_error("verify", argc, argv);
    const char *path = argv[optind];
    kvs_trace *t = NULL;
    kvs_status s = kvs_trace_open(path, &t);
    if (s != KVS_OK) return kvs_cli_fail("verify", s);
    const kvs_trace_info *in = kvs_trace_info_get(t);
    double dtol = 1e-4, dlse = 1e-4;
    default_tolerances((kvs_dtype)in->capture.dtype, &dtol, &dlse);
    if (lse_tol < 0) lse_tol = tol >= 0 ? tol : dlse; /* --tolerance alone sets both */
    if (tol < 0) tol = dtol;

    s = kvs_trace_check_chunks(t);
    if (s != KVS_OK) {
        int rc = kvs_cli_fail("verify", s);
        kvs_trace_close(t);
        return rc;
    }
    printf("checksums: all %lld chunks ok\n", (long long)in->n_chunks);

    int L = in->model.n_layers, Hkv = in->model.n_kv_heads;
    int n_streams = L * Hkv;
    if (threads > n_streams) threads = n_streams;
    stream_result *res = calloc((size_t)n_streams, sizeof *res);
    pthread_t *th = calloc((size_t)threads, sizeof *th);
    if (!res || !th) {
        free(res);
        free(th);
        kvs_trace_close(t);
        return kvs_cli_fail("verify", kvs_fail(KVS_ERR_NOMEM, "out of memory"));
    }
    verify_job job = {.t = t, .res = res, .n_streams = n_streams, .next = 0};
    long started = 0;
    for (; started < threads; started++)
        if (pthread_create(&th[started], NULL, verify_worker, &job) != 0) break;
    if (started == 0) verify_worker(&job); /* could not start a thread: do the work here */
    for (long i = 0; i < started; i++) pthread_join(th[i], NULL);

    int failed = 0, error = 0;
    printf("attention recomputed from stored q/k/v (%s storage; tolerances: output %.3g relative, lse %.3g absolute)\n",
           kvs_dtype_name((kvs_dtype)in->capture.dtype), tol, lse_tol);
    for (int l = 0; l < L; l++) {
        double mr = 0, ml = 0;
        int64_t wp = -1;
        int wh = -1;
        for (int h = 0; h < Hkv; h++) {
            stream_result *r = &res[l * Hkv + h];
            if (r->status != KVS_OK) {
                fprintf(stderr, "kvsim verify: %s\n", r->detail[0] ? r->detail : kvs_strerror(r->status));
                error = 1;
            }
            if (r->max_rel > mr || wp < 0) mr = r->max_rel, wp = r->worst_pos, wh = r->worst_head;
            if (r->max_lse > ml) ml = r->max_lse;
        }
        int ok = mr <= tol && ml <= lse_tol;
        if (!ok) failed = 1;
        printf("layer %3d: max rel output error %.3e (position %lld, head %d), max lse error %.3e  %s\n", l, mr,
               (long long)wp, wh, ml, ok ? "ok" : "FAIL");
    }
    free(res);
    free(th);
    kvs_trace_close(t);
    if (error) return KVS_EXIT_FAIL;
    if (failed) {
        fprintf(stderr, "kvsim verify: %s: stored attention outputs do not match the recomputation (tolerance "
                        "exceeded)\n", path);
        return KVS_EXIT_FAIL;
    }
    printf("verify: OK\n");
    return KVS_EXIT_OK;
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
               "  tokens  int32   [positions] (no --layer needed)\n");
}

int kvs_cmd_export(int argc, char **argv) {
    static const struct option opts[] = {{"layer", required_argument, NULL, 'l'},
                                         {"what", required_argument, NULL, 'w'},
                                         {"out", required_argument, NULL, 'o'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    long layer = -1;
    const char *what = NULL, *out_path = NULL;
    opterr = 0;
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        switch (c) {
        case 'h': export_usage(stdout); return KVS_EXIT_OK;
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
    int64_t N = in->n_positions;
    int H = in->model.n_heads, Hkv = in->model.n_kv_heads, d = in->model.head_dim, G = H / Hkv;
    if (wi == 5) {
        int64_t shape[1] = {N};
        s = kvs_npy_write(out_path, KVS_NPY_I32, shape, 1, kvs_trace_tokens(t));
        kvs_trace_close(t);
        if (s != KVS_OK) return kvs_cli_fail("export", s);
        printf("wrote %s: tokens int32 [%lld]\n", out_path, (long long)N);
        return KVS_EXIT_OK;
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
        s = kvs_npy_write(out_path, KVS_NPY_F32, shape, wi == 4 ? 2 : 3, arr);
    }
done:
    kvs_trace_block_free(b);
    free(arr);
    kvs_trace_close(t);
    if (s != KVS_OK) return kvs_cli_fail("export", s);
    if (wi == 4) printf("wrote %s: layer %ld lse float32 [%lld, %d]\n", out_path, layer, (long long)N, per_pos_heads);
    else
        printf("wrote %s: layer %ld %s float32 [%lld, %d, %d]\n", out_path, layer, what, (long long)N, per_pos_heads, d);
    return KVS_EXIT_OK;
}

/* ------------------------------------------------------------------------------------------------
 * kvsim trace recover IN OUT
 * ---------------------------------------------------------------------------------------------- */

static void trace_usage(FILE *f) {
    fprintf(f, "usage: kvsim trace recover IN OUT\n\n"
               "  recover   restores the complete blocks of a trace whose writer was killed (IN is usually\n"
               "            CAPTURE.kvt.partial) into a complete, valid trace OUT (written via OUT.partial)\n");
}

int kvs_cmd_trace(int argc, char **argv) {
    if (argc < 2) return kvs_cli_usage_error("trace", "missing subcommand (recover)");
    if (kvs_cli_is_help(argv[1])) {
        trace_usage(stdout);
        return KVS_EXIT_OK;
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
            return KVS_EXIT_OK;
        }
        return option_error("trace recover", c, sub_argv);
    }
    int npos = sub_argc - optind;
    if (npos < 2) return kvs_cli_usage_error("trace recover", "needs IN and OUT arguments");
    if (npos > 2) return kvs_cli_usage_error("trace recover", "unexpected argument '%s'", sub_argv[optind + 2]);
    const char *in_path = sub_argv[optind], *out_path = sub_argv[optind + 1];
    int64_t n = 0;
    kvs_status s = kvs_trace_recover(in_path, out_path, &n);
    if (s != KVS_OK) return kvs_cli_fail("trace recover", s);
    printf("recovered %lld positions from %s into %s\n", (long long)n, in_path, out_path);
    return KVS_EXIT_OK;
}
