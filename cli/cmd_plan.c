/* cmd_plan.c — `kvsim plan`: capacity planning with nominal budgets or a policy's MEASURED storage profile
 * (analysis/plan.h; ../shared/DESIGN.md "Analysis"; POLICY_SPEC §7 G3, M22, R2, D1, D10): KV bytes per token,
 * total KV of a batch, max batch at a context, max context at a batch, memory against the response length for
 * the full cache, constant-size and prompt-only policies (and offloading: host memory, PCIe per step), with plain
 * KV elements or a KV codec's real bytes (--codec, sim/codec.h: scales, zero points and 16-bit residual rows
 * counted), as text, CSV or JSON, into the results database (results/results_plan.h; a codec's canonical spec in
 * the plan's kv_dtype column) and as two plots (plots/plan_plot.h); with --hw GPU, time: a roofline per phase
 * (analysis/plan_time.h) giving time to first token, time per output token and tokens/s per series at the plan's
 * batch and against the batch up to the memory limit (a third plot, --plot-throughput; table plan_times).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../analysis/plan.h"
#include "../analysis/plan_time.h"
#include "../plots/plan_plot.h"
#include "../sim/policy.h"
#include "../policies/registry.h"
#include "../results/results_plan.h"
#include "../trace/trace.h"
#include "cli.h"

#ifndef KVSIM_VERSION_STRING
#define KVSIM_VERSION_STRING "0.1.0"
#endif

#define MAX_LIST KVS_PLAN_MAX_LIST
#define MAX_SERIES 5

static void usage(FILE *f) {
    fprintf(f,
            "usage: kvsim plan (--model PRESET | --config CONFIG.json|DIR | --trace TRACE) [options]\n"
            "       kvsim plan --list-presets\n"
            "Capacity planning: KV bytes per token, the KV cache of a batch, how many sequences fit beside the\n"
            "weights, and memory against the response length, for the full cache and for policies at a budget\n"
            "(tokens per KV head), or with a policy's storage profile MEASURED by kvsim replay.\n"
            "Sizes print as GB = 10^9 bytes and GiB = 2^30 bytes (TB/TiB, MB/MiB likewise); CSV/JSON give bytes.\n"
            "Model:\n"
            "  --model PRESET       a built-in preset with its published shape (--list-presets)\n"
            "  --config PATH        a Hugging Face config.json (or the folder holding it): layers, heads, KV heads,\n"
            "                       head_dim, hidden/intermediate size, vocab (weights counted from them)\n"
            "  --trace TRACE        the model recorded in a kvsim trace header\n"
            "  --tied-embeddings yes|no  the classifier is (not) the token embedding, for the weight count (a trace\n"
            "                       header does not record it: counted untied, with a warning, unless given)\n"
            "  --window W|W/K|0     sliding-window layers (hybrid KV): every layer attends to the last W positions,\n"
            "                       or every K-th layer is full and the others W (Gemma-3: 1024/6); 0 none. Default:\n"
            "                       the config's (layer_types, Gemma-3's pattern, Mistral's sliding_window) or the\n"
            "                       trace header's. A windowed layer's cache, every policy's included, stops at W\n"
            "Memory:\n"
            "  --kv-dtype T         plain KV elements: fp16 (default), bf16, fp8, fp32 (int4: use --codec)\n"
            "  --codec SPEC         a quantized KV cache (kvsim's codecs, sim/codec.h): int:bits=B,group=G,k_axis=,\n"
            "                       v_axis= | kivi:bits=,group=,residual= | hf:bits=,group=,residual= | fp8:format=,\n"
            "                       scale=,per=. A position costs its codes + fp16 scale/zero per group (token-axis\n"
            "                       groups amortised over their positions; fp8: a byte per element); the rows the\n"
            "                       codec holds in 16 bits (kivi/hf residual, an unfilled int token-axis group) are\n"
            "                       counted at each length exactly, 2 bytes per element; fp8 scale=prompt scales 8\n"
            "                       bytes per layer (per=tensor) or per layer and KV head (per=head). Excludes --kv-dtype\n"
            "  --weights T|none     weight dtype resident on the GPUs (default fp16); none = not resident\n"
            "  --gpu-mem SIZE       memory per GPU: 80GB (10^9), 80GiB (2^30), 141e9 ...; without it no max batch\n"
            "  --gpus N             GPUs the weights are sharded over (default 1)\n"
            "  --reserve SIZE       per GPU, held back for activations and the runtime (default 0)\n"
            "Workload:\n"
            "  --batch N            sequences (default 1)\n"
            "  --context N          prompt tokens per sequence (default 4096)\n"
            "  --response N         generated tokens per sequence (default 0)\n"
            "  --responses LIST     response lengths of the memory curve (default 0, R/4, R/2, 3R/4, R; with R = 0:\n"
            "                       0,1024,2048,4096,8192)\n"
            "  --settings LIST      context+response settings of the max-batch table, e.g. 256+1024,512+2048\n"
            "                       (default C/4+R/4, C/2+R/2, C+R, 2C+2R, 4C+4R)\n"
            "Policy (per KV head, the unit of kvsim replay's budgets):\n"
            "  --policy P           full (default), constant (min(n, B) tokens), prompt-only (min(P, B) + generated),\n"
            "                       offload (device min(n, B), host n, PCIe min(n, B) + 1 tokens per step: an upper\n"
            "                       bound), or a registered policy NAME[:key=value,...] (its budget scope decides the\n"
            "                       kind, its layout the sets per KV head); with --profile a NAME choosing the run\n"
            "  --budget B           budget in tokens (default 1024, or the --profile run's); full, constant and\n"
            "                       prompt-only are always shown\n"
            "  --profile DB         the MEASURED profile of one complete replay run in DB (recorded with\n"
            "                       --series-every N); choose it with --run ID, or --policy NAME and --budget B\n"
            "  --run ID             the run of --profile (a --policy or --budget beside it must be that run's)\n"
            "  --aux-scale auto|kv|none  how measured auxiliary bytes carry to the planned model (default auto)\n"
            "How a measured profile is scaled to the planned model: per step, the run's resident device KV, auxiliary,\n"
            "host and transfer bytes per (layer, KV head), mean over layers and heads, are divided by the traced\n"
            "model's token size tok_t = 2 x head_dim x KV element bytes of the run (token equivalents) and fitted by\n"
            "least squares as a line in the sequence length n (for a prompt-only run: in the tokens generated, n -\n"
            "prompt, so the line carries to another prompt length) over the run's STEADY STATE only: the decode steps\n"
            "with n > budget for an every-step budget (before, the cache is still filling), every decode step for a\n"
            "prompt-only budget whose trace prompt is at least the budget, every decode step for the full cache. A run\n"
            "that never reaches it is refused; the plan names the steps the fit used. The planned KV per KV head is\n"
            "the line's token equivalents x the planned per-head token size (2 x head_dim x KV dtype bytes), at most\n"
            "the tokens seen (the filling phase); with --codec, the codec's bytes of that many positions, its 16-bit\n"
            "rows included. Auxiliary state scales by what it depends on, per policy (auto):\n"
            "per list (a score per held slot: x the copies of the KV), per query head (MorphKV's G x R rows: x\n"
            "G_plan / G_trace), per KV head (page summaries, index lists: x 1); with head_dim (page min/max, key\n"
            "copies: x (d_plan + k) / (d_trace + k)) or not (scalars); in the KV dtype (x its bytes ratio) or in the\n"
            "auxiliary element bytes as measured. --aux-scale kv / none override the head_dim and dtype dependence\n"
            "(proportional to head_dim in the KV dtype / bytes as measured); the copies stay the policy's. A\n"
            "per-query-head run (layout per_query_head: one set per query head, stored G times per KV head) is\n"
            "scaled by G_plan / G_trace, the copies the planned model's GQA groups hold; a nominal policy whose\n"
            "layout is per query head (h2o, snapkv... with gqa=expand) keeps G sets per KV head likewise. Outside\n"
            "the fitted lengths the line is extrapolated (a warning). Max context never exceeds the model's context\n"
            "(max_position_embeddings) less the response; where that binds before memory the plan says so.\n"
            "Output:\n"
            "  --csv | --json       machine-readable points (bytes) instead of the tables\n"
            "  --db FILE            also record the plan (tables plans, plan_points; results/SCHEMA.md)\n"
            "  --plot-memory F      memory of the batch vs response length (.png or .svg)\n"
            "  --plot-batch F       max batch per context+response setting (.png or .svg)\n"
            "  --gnuplot PROG       the gnuplot to run (default gnuplot on PATH)\n"
            "Time (a roofline per phase, analysis/plan_time.h):\n"
            "  --hw GPU|FILE.json   a GPU preset (--list-hw: A100-40GB-SXM, A100-80GB-SXM, H100-SXM, H100-PCIe, H200,\n"
            "                       L40S, RTX-4090, MI300X) or a JSON file {\"name\", \"memory_gb\", \"hbm_tb_s\",\n"
            "                       \"bf16_tflops\", \"fp8_tflops\", \"host_gb_s\", \"link_gb_s\"} (per direction); its memory\n"
            "                       is the --gpu-mem unless given. Prints time to first token (the prefill of the batch's\n"
            "                       prompts), time per output token (mean decode step over the response) and decode\n"
            "                       tokens/s = batch / TPOT per policy, at each batch up to the memory limit, and the\n"
            "                       batch that maximises tokens/s. Each phase is max(compute, memory) time: prefill\n"
            "                       matmul + causal attention FLOPs vs the weights and activations; a decode step the\n"
            "                       weights once + every sequence's K/V and auxiliary reads (a measured profile: its\n"
            "                       replayed traffic), plus host transfers over PCIe (offloading) and, with --gpus N,\n"
            "                       two ring all-reduces per layer over the GPU link\n"
            "  --mbu X              memory-bandwidth utilisation in (0, 1] (default 1: the roofline bound)\n"
            "  --mfu X              FLOP utilisation in (0, 1] (default 1: the roofline bound)\n"
            "  --batches LIST       batches of the throughput table (default 1, 2, 4, ... up to the max batch, and it)\n"
            "  --plot-throughput F  decode tokens/s vs batch per policy (.png or .svg)\n"
            "  --list-hw            the GPU presets and their sources\n");
}

/* "343.6 GB = 320.0 GiB": each side in its own prefix (kilo .. peta), four significant digits kept. */
static void fmt_size(char *buf, size_t cap, double b) {
    static const char *const dec[] = {"B", "KB", "MB", "GB", "TB", "PB"}, *const bin[] = {"B", "KiB", "MiB", "GiB",
                                                                                          "TiB", "PiB"};
    int i = 0, j = 0;
    double d = b, e = b;
    while (d >= 1000 && i < 5) d /= 1000, i++;
    while (e >= 1024 && j < 5) e /= 1024, j++;
    if (i == 0) snprintf(buf, cap, "%.0f B", b);
    else snprintf(buf, cap, "%#.4g %s = %#.4g %s", d, dec[i], e, bin[j]);
}

static void fmt_count(char *buf, size_t cap, int64_t v) {
    if (v == KVS_PLAN_UNBOUNDED) snprintf(buf, cap, "unbounded");
    else if (v < 0) snprintf(buf, cap, "-");
    else snprintf(buf, cap, "%lld", (long long)v);
}

static int list_presets(void) {
    printf("%-16s %6s %6s %6s %5s %7s %7s %7s %8s %12s %11s\n", "preset", "layers", "heads", "kv", "hd", "hidden",
           "ffn", "vocab", "max_pos", "params", "KV/token");
    for (int i = 0; i < kvs_plan_preset_count(); i++) {
        const kvs_plan_model *m = kvs_plan_preset_at(i);
        printf("%-16s %6d %6d %6d %5d %7d %7d %7d %8d %11.2fB %11.0f   %s\n", m->name, m->n_layers, m->n_heads,
               m->n_kv_heads, m->head_dim, m->hidden, m->intermediate, m->vocab, m->max_positions,
               kvs_plan_params(m) / 1e9, kvs_plan_kv_bytes_per_token(m, 2), m->source);
    }
    printf("KV/token: bytes per position at fp16, 2 x layers x kv heads x head_dim x 2; params counted from the shape\n");
    return kvs_cli_finish_stdout("plan");
}

static int list_hw(void) {
    printf("%-14s %9s %9s %11s %10s %10s %10s\n", "gpu", "memory", "HBM", "bf16 dense", "fp8 dense", "host", "link");
    for (int i = 0; i < kvs_plan_hw_count(); i++) {
        const kvs_plan_hw *h = kvs_plan_hw_at(i);
        printf("%-14s %7.0fGB %5.4gTB/s %6.1fTFLOPS %6.1fTFLOPS %5.0fGB/s %5.0fGB/s   %s\n", h->name, h->mem_bytes / 1e9,
               h->hbm_bw / 1e12, h->flops16 / 1e12, h->flops8 / 1e12, h->host_bw / 1e9, h->link_bw / 1e9, h->source);
    }
    printf("dense tensor throughput (no sparsity); host and link bandwidths per direction; GB = 10^9 bytes\n");
    return kvs_cli_finish_stdout("plan");
}

/* One series of the plan. */
typedef struct {
    char label[160];
    char id[128];       /* unique in the plan, naming the policy and budget: the CSV/JSON/database series */
    kvs_plan_policy pol;
} series;

/* max batch / max context as JSON: null when not computed, "unbounded", or the count */
static void json_count(int64_t v) {
    if (v < 0) printf("null");
    else if (v == KVS_PLAN_UNBOUNDED) printf("\"unbounded\"");
    else printf("%lld", (long long)v);
}

/* decode bound of a timing: "compute" or "memory" */
static const char *bound_name(int compute_bound) { return compute_bound ? "compute" : "memory"; }

static void json_point(const kvs_plan_point *p, const series *s, const kvs_plan_timing *t) {
    printf("{\"kind\":");
    kvs_cli_json_string(stdout, kvs_plan_kind_name(s->pol.kind));
    printf(",\"series\":");
    kvs_cli_json_string(stdout, s->id);
    printf(",\"label\":");
    kvs_cli_json_string(stdout, s->label);
    printf(",\"budget\":");
    if (s->pol.kind == KVS_PLAN_FULL) printf("null");
    else if (s->pol.kind == KVS_PLAN_MEASURED) printf("%lld", (long long)s->pol.profile->budget_tokens);
    else printf("%lld", (long long)s->pol.budget);
    printf(",\"context\":%lld,\"response\":%lld,\"batch\":%lld,\"seq_device_bytes\":", (long long)p->context,
           (long long)p->response, (long long)p->batch);
    kvs_cli_json_number(stdout, p->seq_device_bytes);
    printf(",\"total_bytes\":");
    kvs_cli_json_number(stdout, p->total_bytes);
    printf(",\"host_bytes\":");
    kvs_cli_json_number(stdout, p->host_bytes);
    printf(",\"pcie_bytes_per_step\":");
    kvs_cli_json_number(stdout, p->pcie_bytes_per_step);
    printf(",\"max_batch\":");
    json_count(p->max_batch);
    printf(",\"max_context\":");
    json_count(p->max_context);
    printf(",\"max_context_memory\":");
    json_count(p->max_context_memory);
    printf(",\"context_clamped\":%s", p->context_clamped ? "true" : "false");
    if (t) {
        printf(",\"ttft_s\":");
        kvs_cli_json_number(stdout, t->ttft);
        printf(",\"tpot_s\":");
        kvs_cli_json_number(stdout, t->tpot);
        printf(",\"tokens_per_s\":");
        kvs_cli_json_number(stdout, t->tokens_per_s);
        printf(",\"prefill_bound\":\"%s\",\"decode_bound\":\"%s\"", bound_name(t->prefill_compute_bound),
               bound_name(t->decode_compute_bound));
    }
    printf("}");
}

static void csv_count(int64_t v) {
    if (v == KVS_PLAN_UNBOUNDED) printf("unbounded");
    else if (v >= 0) printf("%lld", (long long)v);
}

static void csv_point(const kvs_plan_point *p, const series *s) {
    char b[4][64];
    kvs_cli_fmt_real(b[0], sizeof b[0], p->seq_device_bytes);
    kvs_cli_fmt_real(b[1], sizeof b[1], p->total_bytes);
    kvs_cli_fmt_real(b[2], sizeof b[2], p->host_bytes);
    kvs_cli_fmt_real(b[3], sizeof b[3], p->pcie_bytes_per_step);
    printf("%s,", kvs_plan_kind_name(s->pol.kind));
    kvs_cli_csv_field(stdout, s->id);
    printf(",");
    kvs_cli_csv_field(stdout, s->label);
    if (s->pol.kind == KVS_PLAN_FULL) printf(",");
    else if (s->pol.kind == KVS_PLAN_MEASURED) printf(",%lld", (long long)s->pol.profile->budget_tokens);
    else printf(",%lld", (long long)s->pol.budget);
    printf(",%lld,%lld,%lld,%s,%s,%s,%s,", (long long)p->context, (long long)p->response, (long long)p->batch, b[0],
           b[1], b[2], b[3]);
    csv_count(p->max_batch);
    printf(",");
    csv_count(p->max_context);
    printf(",");
    csv_count(p->max_context_memory);
    printf(",%d", p->context_clamped);
}

/* the time columns of a CSV row (--hw): after the plan's columns, so theirs keep their places */
static void csv_time(const kvs_plan_timing *t, int64_t best_batch) {
    {
        char b3[3][64];
        kvs_cli_fmt_real(b3[0], sizeof b3[0], t->ttft);
        kvs_cli_fmt_real(b3[1], sizeof b3[1], t->tpot);
        kvs_cli_fmt_real(b3[2], sizeof b3[2], t->tokens_per_s);
        printf(",%s,%s,%s,%s,%s,", b3[0], b3[1], b3[2], bound_name(t->prefill_compute_bound),
               bound_name(t->decode_compute_bound));
        if (best_batch > 0) printf("%lld", (long long)best_batch);
    }
}

int kvs_cmd_plan(int argc, char **argv) {
    const char *preset = NULL, *config = NULL, *trace_path = NULL, *kv_dtype = NULL, *weights = NULL,
               *gpu_mem = NULL, *gpus_s = NULL, *reserve_s = NULL, *batch_s = NULL, *context_s = NULL,
               *response_s = NULL, *responses_s = NULL, *settings_s = NULL, *policy_s = NULL, *budget_s = NULL,
               *profile_db = NULL, *run_s = NULL, *aux_s = NULL, *db_path = NULL, *plot_mem = NULL,
               *plot_batch = NULL, *gnuplot = NULL, *tied_s = NULL, *codec_s = NULL, *hw_s = NULL, *mbu_s = NULL,
               *mfu_s = NULL, *batches_s = NULL, *plot_tput = NULL, *window_s = NULL;
    int csv = 0, json = 0, list = 0, list_gpus = 0;
    for (int i = 1; i < argc; i++) {
        int missing = 0, r;
        struct {
            const char *opt;
            const char **slot;
        } const opts[] = {{"--model", &preset},         {"--config", &config},       {"--trace", &trace_path},
                          {"--kv-dtype", &kv_dtype},    {"--weights", &weights},     {"--gpu-mem", &gpu_mem},
                          {"--gpus", &gpus_s},          {"--reserve", &reserve_s},   {"--batch", &batch_s},
                          {"--context", &context_s},    {"--response", &response_s}, {"--responses", &responses_s},
                          {"--settings", &settings_s},  {"--policy", &policy_s},     {"--budget", &budget_s},
                          {"--profile", &profile_db},   {"--run", &run_s},           {"--aux-scale", &aux_s},
                          {"--db", &db_path},           {"--plot-memory", &plot_mem}, {"--plot-batch", &plot_batch},
                          {"--gnuplot", &gnuplot},      {"--tied-embeddings", &tied_s}, {"--codec", &codec_s},
                          {"--hw", &hw_s},              {"--mbu", &mbu_s},           {"--mfu", &mfu_s},
                          {"--batches", &batches_s},    {"--plot-throughput", &plot_tput},
                          {"--window", &window_s}};
        if (kvs_cli_is_help(argv[i])) {
            usage(stdout);
            return KVS_EXIT_OK;
        }
        int matched = 0;
        for (size_t k = 0; k < sizeof opts / sizeof opts[0] && !matched && !missing; k++) {
            r = kvs_cli_single_value("plan", opts[k].opt, argc, argv, &i, &missing, opts[k].slot);
            if (r < 0) return KVS_EXIT_USAGE;
            matched = r;
        }
        if (matched) continue;
        if (missing) return kvs_cli_usage_error("plan", "option %s needs a value", argv[i]);
        if (!strcmp(argv[i], "--csv")) {
            if (kvs_cli_once("plan", "--csv", &csv)) return KVS_EXIT_USAGE;
        } else if (!strcmp(argv[i], "--json")) {
            if (kvs_cli_once("plan", "--json", &json)) return KVS_EXIT_USAGE;
        } else if (!strcmp(argv[i], "--list-presets")) {
            if (kvs_cli_once("plan", "--list-presets", &list)) return KVS_EXIT_USAGE;
        } else if (!strcmp(argv[i], "--list-hw")) {
            if (kvs_cli_once("plan", "--list-hw", &list_gpus)) return KVS_EXIT_USAGE;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            return kvs_cli_usage_error("plan", "unknown option '%s'", argv[i]);
        } else {
            return kvs_cli_usage_error("plan", "unexpected argument '%s'", argv[i]);
        }
    }
    if (list) return list_presets();
    if (list_gpus) return list_hw();
    if (!!preset + !!config + !!trace_path != 1)
        return kvs_cli_usage_error("plan", "give exactly one of --model PRESET, --config CONFIG.json, --trace TRACE");
    if (csv && json) return kvs_cli_usage_error("plan", "--csv and --json exclude each other");
    if (run_s && !profile_db) return kvs_cli_usage_error("plan", "--run needs --profile DB");

    /* ---- numbers ---- */
    kvs_plan_setup setup = {.n_gpus = 1};
    long batch = 1, context = 4096, response = 0, budget = 1024, gpus = 1, run_id = 0;
    double kv_bytes = 2, w_bytes = 2;
    if (kv_dtype && kvs_plan_kv_dtype_bytes(kv_dtype, &kv_bytes) != KVS_OK)
        return kvs_cli_fail("plan", KVS_ERR_INVALID_ARG);
    if (kv_dtype && codec_s)
        return kvs_cli_usage_error("plan", "--kv-dtype and --codec exclude each other (the codec's unquantized rows "
                                           "are 16-bit)");
    if (weights && strcmp(weights, "none") && kvs_plan_dtype_bytes(weights, &w_bytes) != KVS_OK)
        return kvs_cli_fail("plan", KVS_ERR_INVALID_ARG);
    if (weights && !strcmp(weights, "none")) w_bytes = 0;
    if ((batch_s && kvs_cli_parse_long("--batch", batch_s, 1, 1L << 40, &batch) != KVS_OK) ||
        (context_s && kvs_cli_parse_long("--context", context_s, 1, 1L << 40, &context) != KVS_OK) ||
        (response_s && kvs_cli_parse_long("--response", response_s, 0, 1L << 40, &response) != KVS_OK) ||
        (budget_s && kvs_cli_parse_long("--budget", budget_s, 1, 1L << 40, &budget) != KVS_OK) ||
        (gpus_s && kvs_cli_parse_long("--gpus", gpus_s, 1, 1L << 20, &gpus) != KVS_OK) ||
        (run_s && kvs_cli_parse_long("--run", run_s, 1, INT64_MAX, &run_id) != KVS_OK) ||
        (gpu_mem && kvs_cli_parse_size("--gpu-mem", gpu_mem, &setup.gpu_bytes) != KVS_OK) ||
        (reserve_s && kvs_cli_parse_size("--reserve", reserve_s, &setup.reserve_bytes) != KVS_OK))
        return kvs_cli_fail("plan", KVS_ERR_INVALID_ARG);
    kvs_plan_time_setup tsetup = {.mbu = 1, .mfu = 1};
    if ((mbu_s && kvs_cli_parse_double("--mbu", mbu_s, 1e-6, 1, &tsetup.mbu) != KVS_OK) ||
        (mfu_s && kvs_cli_parse_double("--mfu", mfu_s, 1e-6, 1, &tsetup.mfu) != KVS_OK))
        return kvs_cli_fail("plan", KVS_ERR_INVALID_ARG);
    if ((mbu_s || mfu_s || batches_s || plot_tput) && !hw_s)
        return kvs_cli_usage_error("plan", "--mbu, --mfu, --batches and --plot-throughput need --hw GPU");
    if (hw_s) {
        kvs_status hst = kvs_plan_hw_resolve(hw_s, &tsetup.hw);
        if (hst != KVS_OK) return kvs_cli_fail("plan", hst);
        if (!gpu_mem) setup.gpu_bytes = tsetup.hw.mem_bytes;
    }
    int64_t batches[MAX_LIST];
    int n_batches = 0;
    if (batches_s && kvs_plan_parse_list("--batches", batches_s, 1, batches, &n_batches) != KVS_OK)
        return kvs_cli_usage_error("plan", "%s", kvs_last_error());
    if (reserve_s && !gpu_mem && !hw_s) return kvs_cli_usage_error("plan", "--reserve needs --gpu-mem or --hw");
    kvs_plan_aux_scale aux_scale = KVS_PLAN_AUX_AUTO;
    if (aux_s) {
        if (!strcmp(aux_s, "none")) aux_scale = KVS_PLAN_AUX_NONE;
        else if (!strcmp(aux_s, "kv")) aux_scale = KVS_PLAN_AUX_KV;
        else if (strcmp(aux_s, "auto"))
            return kvs_cli_usage_error("plan", "--aux-scale: '%s' is not auto, kv or none", aux_s);
    }
    int tied = -1;
    if (tied_s) {
        if (!strcmp(tied_s, "yes")) tied = 1;
        else if (!strcmp(tied_s, "no")) tied = 0;
        else return kvs_cli_usage_error("plan", "--tied-embeddings: '%s' is not yes or no", tied_s);
    }
    if (aux_s && !profile_db) return kvs_cli_usage_error("plan", "--aux-scale needs --profile DB");
    setup.kv_elem_bytes = kv_bytes;
    setup.weight_elem_bytes = w_bytes;
    setup.n_gpus = (int32_t)gpus;
    int64_t responses[MAX_LIST], set_ctx[MAX_LIST], set_resp[MAX_LIST];
    int n_resp = 0, n_set = 0;
    if (responses_s) {
        if (kvs_plan_parse_list("--responses", responses_s, 0, responses, &n_resp) != KVS_OK)
            return kvs_cli_usage_error("plan", "%s", kvs_last_error());
    } else if (response > 0) {
        for (int k = 0; k <= 4; k++) {
            int64_t r = response * k / 4;
            if (n_resp == 0 || responses[n_resp - 1] != r) responses[n_resp++] = r;
        }
    } else {
        const int64_t d[] = {0, 1024, 2048, 4096, 8192};
        for (int k = 0; k < 5; k++) responses[n_resp++] = d[k];
    }
    if (settings_s) {
        if (kvs_plan_parse_settings(settings_s, set_ctx, set_resp, &n_set) != KVS_OK)
            return kvs_cli_usage_error("plan", "%s", kvs_last_error());
    } else {
        const int num[] = {1, 1, 1, 2, 4}, den[] = {4, 2, 1, 1, 1};
        for (int k = 0; k < 5; k++) {
            int64_t c = context * num[k] / den[k], r = response * num[k] / den[k];
            if (c < 1 || (n_set && set_ctx[n_set - 1] == c && set_resp[n_set - 1] == r)) continue;
            set_ctx[n_set] = c;
            set_resp[n_set++] = r;
        }
    }

    /* ---- the model ---- */
    kvs_status st = KVS_OK;
    kvs_trace *trace = NULL;
    kvs_plan_profile profile = {.aux_scale = aux_scale};
    kvs_results_db *db = NULL;
    int rc = KVS_EXIT_OK;
    if (preset) {
        const kvs_plan_model *m;
        if ((st = kvs_plan_preset_find(preset, &m)) != KVS_OK) return kvs_cli_fail("plan", st);
        setup.model = *m;
    } else if (config) {
        if ((st = kvs_plan_model_from_config(config, &setup.model)) != KVS_OK)
            return kvs_cli_fail("plan", st == KVS_ERR_INVALID_ARG ? KVS_ERR_IO : st);
    } else {
        if ((st = kvs_trace_open(trace_path, &trace)) != KVS_OK)
            return kvs_cli_fail("plan", st == KVS_ERR_INVALID_ARG ? KVS_ERR_IO : st);
        const kvs_trace_info *ti = kvs_trace_info_get(trace);
        kvs_plan_model_from_trace(&ti->model, ti->capture.settings, trace_path, &setup.model);
    }
    if (tied >= 0) setup.model.tied_embeddings = tied;
    kvs_codec *codec = NULL;
    if (window_s && kvs_plan_window_parse(window_s, &setup.model) != KVS_OK) {
        rc = kvs_cli_usage_error("plan", "%s", kvs_last_error());
        goto cleanup;
    }
    if (codec_s) {
        if (kvs_codec_parse(codec_s, &codec) != KVS_OK) {
            rc = kvs_cli_usage_error("plan", "--codec: %s", kvs_last_error());
            goto cleanup;
        }
        setup.codec = codec;
    }

    /* ---- the series: full, constant(B), prompt-only(B), then what is planned when it is another: offload(B), a
     * registered policy at its nominal budget (its scope's kind, its layout's sets per KV head) and its measured
     * profile. Each series has an id unique in the plan that names its policy and budget (CSV, JSON, database). */
    series ser[MAX_SERIES];
    int n_ser = 0, planned = 0;
    kvs_plan_kind kind = KVS_PLAN_FULL;
    const char *named = NULL; /* the registered policy planned, if any */
    kvs_plan_kind named_kind = KVS_PLAN_FULL;
    int named_per_q = 0;
    /* with --profile, --policy names the measured run's policy (the registry's "full" included) */
    const int nominal_kind = policy_s && !profile_db &&
                             (!strcmp(policy_s, "full") || !strcmp(policy_s, "constant") ||
                              !strcmp(policy_s, "prompt-only") || !strcmp(policy_s, "offload"));
    if (nominal_kind) {
        kind = !strcmp(policy_s, "full")       ? KVS_PLAN_FULL
               : !strcmp(policy_s, "constant") ? KVS_PLAN_CONSTANT
               : !strcmp(policy_s, "offload")  ? KVS_PLAN_OFFLOAD
                                               : KVS_PLAN_PROMPT_ONLY;
    } else if (policy_s) {
        kvs_policy_config cfg;
        if (kvs_policy_parse(policy_s, &cfg) != KVS_OK) {
            rc = profile_db ? kvs_cli_usage_error("plan", "--policy: with --profile, the name of the measured run's "
                                                          "policy: %s", kvs_last_error())
                            : kvs_cli_usage_error("plan", "--policy: '%s' is neither full, constant, prompt-only, "
                                                          "offload nor a registered policy (kvsim policies): %s",
                                                  policy_s, kvs_last_error());
            goto cleanup;
        }
        if (profile_db && strcmp(policy_s, cfg.ops->name)) {
            rc = kvs_cli_usage_error("plan", "--policy: with --profile, name the policy of the run ('%s'): its "
                                             "parameters are the run's", cfg.ops->name);
            goto cleanup;
        }
        named = cfg.ops->name;
        kind = named_kind = cfg.ops->budget_scope == KVS_BUDGET_NONE     ? KVS_PLAN_FULL
                            : cfg.ops->budget_scope == KVS_BUDGET_PROMPT ? KVS_PLAN_PROMPT_ONLY
                                                                         : KVS_PLAN_CONSTANT;
        named_per_q = kvs_policy_layout(&cfg) == KVS_SEL_PER_QUERY_HEAD;
    }
    if (profile_db) {
        if ((st = kvs_plan_profile_read(profile_db, run_id, named ? named : NULL, budget_s ? budget : 0, &profile)) !=
            KVS_OK) {
            rc = kvs_cli_fail("plan", st);
            goto cleanup;
        }
        kind = KVS_PLAN_MEASURED;
        budget = (long)profile.budget_tokens; /* the nominal series at the measured run's budget */
        /* the nominal series of the measured policy: the run's scope and layout */
        const struct kvs_policy_ops *ops = kvs_policy_find(profile.policy);
        named = ops ? ops->name : NULL;
        named_kind = !strcmp(profile.budget_scope, "none")     ? KVS_PLAN_FULL
                     : !strcmp(profile.budget_scope, "prompt") ? KVS_PLAN_PROMPT_ONLY
                                                               : KVS_PLAN_CONSTANT;
        named_per_q = profile.per_query_head;
    }
    const kvs_plan_kind base[3] = {KVS_PLAN_FULL, KVS_PLAN_CONSTANT, KVS_PLAN_PROMPT_ONLY};
    for (int k = 0; k < 3; k++) {
        series *z = &ser[n_ser];
        z->pol = (kvs_plan_policy){.kind = base[k], .budget = budget};
        if (base[k] == KVS_PLAN_FULL) {
            snprintf(z->label, sizeof z->label, "full cache");
            snprintf(z->id, sizeof z->id, "full");
        } else {
            snprintf(z->label, sizeof z->label, "%s, budget %ld", kvs_plan_kind_name(base[k]), budget);
            snprintf(z->id, sizeof z->id, "%s B=%ld", kvs_plan_kind_name(base[k]), budget);
        }
        if (base[k] == kind) planned = n_ser;
        n_ser++;
    }
    if (kind == KVS_PLAN_OFFLOAD) {
        ser[n_ser].pol = (kvs_plan_policy){.kind = KVS_PLAN_OFFLOAD, .budget = budget};
        snprintf(ser[n_ser].label, sizeof ser[n_ser].label, "offload, budget %ld", budget);
        snprintf(ser[n_ser].id, sizeof ser[n_ser].id, "offload B=%ld", budget);
        planned = n_ser++;
    }
    if (named && named_kind != KVS_PLAN_FULL) {
        /* the full cache's own series stands for a policy without a budget */
        const int g = setup.model.n_heads / setup.model.n_kv_heads;
        series *z = &ser[n_ser];
        z->pol = (kvs_plan_policy){.kind = named_kind, .budget = budget, .per_query_head = named_per_q};
        if (named_per_q)
            snprintf(z->label, sizeof z->label, "%s, budget %ld, nominal (%s, %d set%s per KV head)", named, budget,
                     kvs_plan_kind_name(named_kind), g, g == 1 ? "" : "s");
        else
            snprintf(z->label, sizeof z->label, "%s, budget %ld, nominal (%s)", named, budget,
                     kvs_plan_kind_name(named_kind));
        snprintf(z->id, sizeof z->id, "%s B=%ld nominal", named, budget);
        if (kind != KVS_PLAN_MEASURED) planned = n_ser;
        n_ser++;
    }
    if (kind == KVS_PLAN_MEASURED) {
        series *z = &ser[n_ser];
        z->pol = (kvs_plan_policy){.kind = KVS_PLAN_MEASURED, .profile = &profile};
        snprintf(z->label, sizeof z->label, "measured: %s, budget %lld (run %lld)", profile.policy,
                 (long long)profile.budget_tokens, (long long)profile.run_id);
        snprintf(z->id, sizeof z->id, "measured %s B=%lld (run %lld)", profile.policy,
                 (long long)profile.budget_tokens, (long long)profile.run_id);
        planned = n_ser++;
    }

    /* ---- evaluate: the main point of every series, the memory curve, the max-batch settings ---- */
    /* with --hw, each series' throughput sweep (batches other than --batch) follows its points */
    const int n_pts_max = n_ser * (1 + n_resp + n_set) + (hw_s ? n_ser * (MAX_LIST + 1) : 0);
    kvs_plan_point *pts = calloc((size_t)n_pts_max, sizeof *pts);
    kvs_plan_timing *ptime = calloc((size_t)n_pts_max, sizeof *ptime);
    int *pts_ser = calloc((size_t)n_pts_max, sizeof *pts_ser);
    kvs_results_plan_point *rows = calloc((size_t)n_pts_max, sizeof *rows);
    double *curve = calloc((size_t)(n_ser * (n_resp + n_set) + n_resp), sizeof *curve);
    if (!pts || !ptime || !pts_ser || !rows || !curve) {
        st = kvs_fail(KVS_ERR_NOMEM, "out of memory");
        goto fail;
    }
    kvs_plan_point main_pt[MAX_SERIES];
    int n_pts = 0;
    for (int s = 0; s < n_ser; s++) {
        if ((st = kvs_plan_eval(&setup, &ser[s].pol, context, response, batch, &main_pt[s])) != KVS_OK) goto fail;
        /* every distinct (context, response) once per series, for CSV/JSON/db */
        int64_t cs[1 + 2 * MAX_LIST], rs[1 + 2 * MAX_LIST];
        int nc = 0;
        cs[nc] = context, rs[nc++] = response;
        for (int k = 0; k < n_resp; k++) cs[nc] = context, rs[nc++] = responses[k];
        for (int k = 0; k < n_set; k++) cs[nc] = set_ctx[k], rs[nc++] = set_resp[k];
        for (int k = 0; k < nc; k++) {
            int dup = 0;
            for (int j = 0; j < k && !dup; j++) dup = cs[j] == cs[k] && rs[j] == rs[k];
            if (dup) continue;
            if ((st = kvs_plan_eval(&setup, &ser[s].pol, cs[k], rs[k], batch, &pts[n_pts])) != KVS_OK) goto fail;
            pts_ser[n_pts++] = s;
        }
        for (int k = 0; k < n_resp; k++) {
            kvs_plan_point q;
            if ((st = kvs_plan_eval(&setup, &ser[s].pol, context, responses[k], batch, &q)) != KVS_OK) goto fail;
            curve[s * n_resp + k] = q.total_bytes;
        }
        for (int k = 0; k < n_set; k++) {
            kvs_plan_point q;
            if ((st = kvs_plan_eval(&setup, &ser[s].pol, set_ctx[k], set_resp[k], 1, &q)) != KVS_OK) goto fail;
            curve[n_ser * n_resp + s * n_set + k] = (double)q.max_batch;
        }
    }
    const double kvtok = codec ? kvs_plan_codec_bytes_per_token(&setup.model, codec)
                               : kvs_plan_kv_bytes_per_token(&setup.model, kv_bytes),
                 wbytes = kvs_plan_weight_bytes(&setup);
    /* what the codec holds beside its quantized rows in a full-cache sequence of context + response positions: the
     * 16-bit rows (their bytes beyond the quantized ones) and the fp8 scales */
    const char *kv_name = codec ? kvs_codec_spec(codec) : kv_dtype ? kv_dtype : "fp16";
    const double kv_heads = (double)setup.model.n_layers * setup.model.n_kv_heads;
    int64_t held[2] = {0, 0};
    double held_bytes = 0, scale_bytes = 0;
    if (codec) {
        for (int t = 0; t < 2; t++) {
            held[t] = kvs_plan_codec_held(codec, (kvs_codec_tensor)t, context, context + response);
            held_bytes += kv_heads * (double)held[t] *
                          (2.0 * setup.model.head_dim -
                           kvs_plan_codec_row_bytes(codec, (kvs_codec_tensor)t, setup.model.head_dim));
        }
        scale_bytes = kv_heads * kvs_plan_codec_head_bytes(codec, setup.model.head_dim) + setup.model.n_layers * kvs_codec_layer_bytes(codec);
    }
    double pool = NAN;
    if (setup.gpu_bytes > 0 && (st = kvs_plan_kv_pool(&setup, &pool)) != KVS_OK) goto fail;
    const kvs_plan_model *m = &setup.model;
    /* outside the steady-state lengths the fit used, the line is carried further than measured */
    const int extrapolated = kind == KVS_PLAN_MEASURED &&
                             (context + response > profile.fit_n_max ||
                              (!profile.x_is_generated && context < profile.fit_n_min - 1) ||
                              (profile.x_is_generated && response > profile.fit_n_max - profile.prompt_len));
    char aux_rule[256] = "";
    if (kind == KVS_PLAN_MEASURED) kvs_plan_aux_describe(&profile, aux_rule, sizeof aux_rule);
    const double aux_factor = kind == KVS_PLAN_MEASURED ? kvs_plan_aux_factor(&profile, &setup) : NAN;
    const int64_t steady_from = kind == KVS_PLAN_MEASURED ? kvs_plan_profile_steady_from(&profile) : 0;

    /* ---- time (--hw): every point's timing; per series the throughput against the batch, from 1 to the largest
     * batch that fits at (context, response) (or --batches), and the batch that maximises it ---- */
    const int n_base = n_pts;        /* the plan's points; then the sweep rows */
    int sweep_from[MAX_SERIES], sweep_n[MAX_SERIES], best[MAX_SERIES];
    kvs_plan_timing main_t[MAX_SERIES];
    if (hw_s) {
        for (int k = 0; k < n_base; k++)
            if ((st = kvs_plan_time(&setup, &tsetup, &ser[pts_ser[k]].pol, pts[k].context, pts[k].response,
                                    pts[k].batch, &ptime[k])) != KVS_OK)
                goto fail;
        for (int s = 0; s < n_ser; s++) {
            if ((st = kvs_plan_time(&setup, &tsetup, &ser[s].pol, context, response, batch, &main_t[s])) != KVS_OK)
                goto fail;
            int64_t bs[MAX_LIST + 1];
            int nb = 0;
            const int64_t mb = main_pt[s].max_batch == KVS_PLAN_UNBOUNDED ? INT64_C(1) << 20 : main_pt[s].max_batch;
            if (n_batches) {
                for (int k = 0; k < n_batches; k++) bs[nb++] = batches[k];
            } else {
                for (int64_t b = 1; b <= mb && nb < MAX_LIST; b *= 2) bs[nb++] = b;
                if (mb >= 1 && bs[nb - 1] != mb) bs[nb++] = mb;
            }
            sweep_from[s] = n_pts;
            best[s] = -1;
            for (int k = 0; k < nb; k++) {
                if ((st = kvs_plan_eval(&setup, &ser[s].pol, context, response, bs[k], &pts[n_pts])) != KVS_OK ||
                    (st = kvs_plan_time(&setup, &tsetup, &ser[s].pol, context, response, bs[k], &ptime[n_pts])) !=
                        KVS_OK)
                    goto fail;
                pts_ser[n_pts] = s;
                /* the best batch among those that fit in memory; of equal throughputs (a compute-bound plateau)
                 * the smallest, less a rounding's worth */
                if (bs[k] <= mb &&
                    (best[s] < 0 || ptime[n_pts].tokens_per_s > ptime[best[s]].tokens_per_s * (1 + 1e-9)))
                    best[s] = n_pts;
                n_pts++;
            }
            sweep_n[s] = n_pts - sweep_from[s];
        }
    }

    /* ---- print ---- */
    if (json) {
        printf("{\"model\":{\"name\":");
        kvs_cli_json_string(stdout, m->name);
        printf(",\"source\":");
        kvs_cli_json_string(stdout, m->source);
        printf(",\"n_layers\":%d,\"n_heads\":%d,\"n_kv_heads\":%d,\"head_dim\":%d,\"hidden\":%d,\"intermediate\":%d,"
               "\"vocab\":%d,\"max_positions\":%d,\"tied_embeddings\":%s,\"params\":",
               m->n_layers, m->n_heads, m->n_kv_heads, m->head_dim, m->hidden, m->intermediate, m->vocab,
               m->max_positions, m->tied_embeddings < 0 ? "null" : m->tied_embeddings ? "true" : "false");
        kvs_cli_json_number(stdout, kvs_plan_params(m));
        printf("},\"kv_dtype\":");
        kvs_cli_json_string(stdout, kv_name);
        printf(",\"codec\":");
        kvs_cli_json_string(stdout, codec ? kvs_codec_spec(codec) : NULL);
        printf(",\"kv_bytes_per_token\":");
        kvs_cli_json_number(stdout, kvtok);
        if (codec) {
            printf(",\"codec_k_row_bytes\":");
            kvs_cli_json_number(stdout, kvs_plan_codec_row_bytes(codec, KVS_CODEC_K, m->head_dim));
            printf(",\"codec_v_row_bytes\":");
            kvs_cli_json_number(stdout, kvs_plan_codec_row_bytes(codec, KVS_CODEC_V, m->head_dim));
            printf(",\"codec_held_k\":%lld,\"codec_held_v\":%lld,\"codec_held_bytes\":", (long long)held[0],
                   (long long)held[1]);
            kvs_cli_json_number(stdout, held_bytes);
            printf(",\"codec_scale_bytes\":");
            kvs_cli_json_number(stdout, scale_bytes);
        }
        printf(",\"weight_dtype\":");
        kvs_cli_json_string(stdout, w_bytes > 0 ? (weights ? weights : "fp16") : NULL);
        printf(",\"weight_bytes\":");
        kvs_cli_json_number(stdout, wbytes);
        printf(",\"gpus\":%ld,\"gpu_bytes\":", gpus);
        kvs_cli_json_number(stdout, setup.gpu_bytes > 0 ? setup.gpu_bytes : NAN);
        printf(",\"reserve_bytes\":");
        kvs_cli_json_number(stdout, setup.reserve_bytes);
        printf(",\"kv_pool_bytes\":");
        kvs_cli_json_number(stdout, pool);
        printf(",\"batch\":%ld,\"context\":%ld,\"response\":%ld,\"policy\":", batch, context, response);
        kvs_cli_json_string(stdout, kvs_plan_kind_name(kind));
        printf(",\"planned_series\":");
        kvs_cli_json_string(stdout, ser[planned].id);
        printf(",\"budget\":%ld,\"profile\":", budget);
        if (kind == KVS_PLAN_MEASURED) {
            printf("{\"db\":");
            kvs_cli_json_string(stdout, profile_db);
            printf(",\"run_id\":%lld,\"policy\":", (long long)profile.run_id);
            kvs_cli_json_string(stdout, profile.policy);
            printf(",\"params\":");
            kvs_cli_json_string(stdout, profile.params);
            printf(",\"budget_tokens\":%lld,\"budget_scope\":", (long long)profile.budget_tokens);
            kvs_cli_json_string(stdout, profile.budget_scope);
            printf(",\"x\":\"%s\",\"aux_scale\":\"%s\",\"aux_rule\":", profile.x_is_generated ? "generated" : "n",
                   aux_scale == KVS_PLAN_AUX_NONE ? "none" : aux_scale == KVS_PLAN_AUX_KV ? "kv" : "auto");
            kvs_cli_json_string(stdout, aux_rule);
            printf(",\"aux_factor\":");
            kvs_cli_json_number(stdout, aux_factor);
            printf(",\"copies\":");
            kvs_cli_json_number(stdout, profile.per_query_head && profile.trace_group > 0
                                            ? (double)(m->n_heads / m->n_kv_heads) / profile.trace_group
                                            : 1);
            printf(",\"tok_bytes\":");
            kvs_cli_json_number(stdout, profile.tok_bytes);
            const kvs_plan_line *ls[6] = {&profile.kv,       &profile.aux,     &profile.host,
                                          &profile.transfer, &profile.read_kv, &profile.read_aux};
            const char *names[6] = {"kv", "aux", "host", "transfer", "read_kv", "read_aux"};
            printf(",\"has_reads\":%s", profile.has_reads ? "true" : "false");
            for (int k = 0; k < 6; k++) {
                printf(",\"%s\":{\"a\":", names[k]);
                kvs_cli_json_number(stdout, ls[k]->a);
                printf(",\"b\":");
                kvs_cli_json_number(stdout, ls[k]->b);
                printf("}");
            }
            printf(",\"r2\":");
            kvs_cli_json_number(stdout, profile.kv_r2);
            printf(",\"n_min\":%lld,\"n_max\":%lld,\"n_points\":%lld,\"steady_from\":%lld,\"fit_n_min\":%lld,"
                   "\"fit_n_max\":%lld,\"fit_points\":%lld,\"extrapolated\":%s}",
                   (long long)profile.n_min, (long long)profile.n_max, (long long)profile.n_points,
                   (long long)steady_from, (long long)profile.fit_n_min, (long long)profile.fit_n_max,
                   (long long)profile.fit_points, extrapolated ? "true" : "false");
        } else {
            printf("null");
        }
        printf(",\"points\":[");
        for (int k = 0, first = 1; k < n_pts; k++) {
            if (k >= n_base && pts[k].batch == batch) continue; /* the sweep's row of --batch: a plan point */
            if (!first) printf(",");
            first = 0;
            json_point(&pts[k], &ser[pts_ser[k]], hw_s ? &ptime[k] : NULL);
        }
        printf("]");
        if (hw_s) {
            printf(",\"time\":{\"hw\":");
            kvs_cli_json_string(stdout, tsetup.hw.name);
            printf(",\"hw_source\":");
            kvs_cli_json_string(stdout, tsetup.hw.source);
            printf(",\"hbm_bytes_per_s\":");
            kvs_cli_json_number(stdout, tsetup.hw.hbm_bw);
            printf(",\"flops_per_s\":");
            kvs_cli_json_number(stdout, w_bytes == 1 && tsetup.hw.flops8 > 0 ? tsetup.hw.flops8 : tsetup.hw.flops16);
            printf(",\"host_bytes_per_s\":");
            kvs_cli_json_number(stdout, tsetup.hw.host_bw);
            printf(",\"link_bytes_per_s\":");
            kvs_cli_json_number(stdout, tsetup.hw.link_bw);
            printf(",\"gpus\":%ld,\"mbu\":", gpus);
            kvs_cli_json_number(stdout, tsetup.mbu);
            printf(",\"mfu\":");
            kvs_cli_json_number(stdout, tsetup.mfu);
            printf(",\"series\":[");
            for (int z = 0; z < n_ser; z++) {
                printf("%s{\"series\":", z ? "," : "");
                kvs_cli_json_string(stdout, ser[z].id);
                printf(",\"ttft_s\":");
                kvs_cli_json_number(stdout, main_t[z].ttft);
                printf(",\"tpot_s\":");
                kvs_cli_json_number(stdout, main_t[z].tpot);
                printf(",\"tokens_per_s\":");
                kvs_cli_json_number(stdout, main_t[z].tokens_per_s);
                printf(",\"layer_prefill_s\":");
                kvs_cli_json_number(stdout, main_t[z].prefill.layer_seconds);
                printf(",\"layer_decode_s\":");
                kvs_cli_json_number(stdout, main_t[z].last_step.layer_seconds);
                printf(",\"best_batch\":");
                if (best[z] >= 0) printf("%lld", (long long)pts[best[z]].batch);
                else printf("null");
                printf(",\"best_tokens_per_s\":");
                kvs_cli_json_number(stdout, best[z] >= 0 ? ptime[best[z]].tokens_per_s : NAN);
                printf(",\"throughput\":[");
                for (int k = 0; k < sweep_n[z]; k++) {
                    const kvs_plan_timing *q = &ptime[sweep_from[z] + k];
                    printf("%s{\"batch\":%lld,\"ttft_s\":", k ? "," : "", (long long)q->batch);
                    kvs_cli_json_number(stdout, q->ttft);
                    printf(",\"tpot_s\":");
                    kvs_cli_json_number(stdout, q->tpot);
                    printf(",\"tokens_per_s\":");
                    kvs_cli_json_number(stdout, q->tokens_per_s);
                    printf(",\"fits\":%s}", pts[sweep_from[z] + k].max_batch >= q->batch ? "true" : "false");
                }
                printf("]}");
            }
            printf("]}");
        }
        printf("}\n");
    } else if (csv) {
        printf("kind,series,label,budget,context,response,batch,seq_device_bytes,total_bytes,host_bytes,"
               "pcie_bytes_per_step,max_batch,max_context,max_context_memory,context_clamped,kv,kv_bytes_per_token%s\n",
               hw_s ? ",ttft_s,tpot_s,tokens_per_s,prefill_bound,decode_bound,best_batch" : "");
        char kb[64];
        kvs_cli_fmt_real(kb, sizeof kb, kvtok);
        for (int k = 0; k < n_pts; k++) {
            if (k >= n_base && pts[k].batch == batch) continue; /* the sweep's row of --batch: a plan point */
            csv_point(&pts[k], &ser[pts_ser[k]]);
            printf(",");
            kvs_cli_csv_field(stdout, kv_name);
            printf(",%s", kb);
            if (hw_s) csv_time(&ptime[k], best[pts_ser[k]] >= 0 ? pts[best[pts_ser[k]]].batch : -1);
            printf("\n");
        }
    } else {
        char a[96], b[96], c[96];
        printf("model       %s: %d layers, %d query heads, %d KV heads (GQA group %d), head_dim %d  [%s]\n", m->name,
               m->n_layers, m->n_heads, m->n_kv_heads, m->n_heads / m->n_kv_heads, m->head_dim, m->source);
        fmt_size(a, sizeof a, kvtok);
        if (codec) {
            const double rk = kvs_plan_codec_row_bytes(codec, KVS_CODEC_K, m->head_dim),
                         rv = kvs_plan_codec_row_bytes(codec, KVS_CODEC_V, m->head_dim);
            printf("KV / token  %.6g bytes (%s) = %d layers x %d KV heads x (K %.6g + V %.6g bytes per row) (codec "
                   "%s; fp16: %.0f)\n",
                   kvtok, a, m->n_layers, m->n_kv_heads, rk, rv, kvs_codec_spec(codec),
                   kvs_plan_kv_bytes_per_token(m, 2));
            fmt_size(b, sizeof b, held_bytes);
            fmt_size(c, sizeof c, scale_bytes);
            if (kvs_codec_kind_of(codec) == KVS_CODEC_THINK) /* V is never pruned: its rows are its size */
                printf("            K rows kept whole at %ld tokens: %lld per (layer, KV head) (the last `recent` of the "
                       "prompt and every generated one), %s per sequence beyond their pruned size; channel masks held "
                       "once: %s per sequence\n",
                       context + response, (long long)held[0], b, c);
            else
                printf("            rows held in 16 bits at %ld tokens: K %lld, V %lld per (layer, KV head), %s per "
                       "sequence beyond their quantized size; scales held once: %s per sequence\n",
                       context + response, (long long)held[0], (long long)held[1], b, c);
        } else {
            printf("KV / token  %.0f bytes (%s) = 2 x %d layers x %d KV heads x %d head_dim x %g bytes (%s)\n", kvtok,
                   a, m->n_layers, m->n_kv_heads, m->head_dim, kv_bytes, kv_name);
        }
        if (m->window > 0)
            printf("windows     %d of %d layers attend to the last %d positions: their cache (every policy's there too) "
                   "stops growing at %d positions; the KV / token above holds below the window\n", m->window_layers,
                   m->n_layers, m->window, m->window);
        fmt_size(a, sizeof a, wbytes);
        const char *tie_note = m->tied_embeddings < 0 ? " (classifier counted apart from the token embedding: "
                                                        "the trace does not say)"
                                                      : "";
        if (w_bytes > 0)
            printf("weights     %.4g billion parameters x %g bytes (%s) = %s%s\n", kvs_plan_params(m) / 1e9, w_bytes,
                   weights ? weights : "fp16", a, tie_note);
        else
            printf("weights     not resident on the GPUs (%.4g billion parameters%s)\n", kvs_plan_params(m) / 1e9,
                   tie_note);
        if (setup.gpu_bytes > 0) {
            fmt_size(a, sizeof a, setup.gpu_bytes);
            fmt_size(b, sizeof b, pool);
            printf("GPUs        %ld x (%s)%s; left for the KV cache: %s\n", gpus, a,
                   setup.reserve_bytes > 0 ? " less the reserve" : "", b);
        }
        if (kind == KVS_PLAN_MEASURED) {
            printf("profile     run %lld of %s: %s (%s), budget %lld tokens per KV head (%s), trace model %s (head_dim %d, "
                   "GQA group %d, %g-byte KV elements)\n",
                   (long long)profile.run_id, profile_db, profile.policy, profile.params, (long long)profile.budget_tokens,
                   profile.budget_scope, profile.trace_model, profile.trace_head_dim, profile.trace_group,
                   profile.trace_elem_bytes);
            char why[128];
            if (!strcmp(profile.budget_scope, "every_step"))
                snprintf(why, sizeof why, "decode steps with the cache full, n > budget %lld",
                         (long long)profile.budget_tokens);
            else if (!strcmp(profile.budget_scope, "prompt"))
                snprintf(why, sizeof why, "every decode step: the %lld-token prompt was compressed to the budget",
                         (long long)profile.prompt_len);
            else snprintf(why, sizeof why, "every decode step");
            printf("            steady state from n = %lld (%s): fitted on n = %lld..%lld, %lld of the %lld measured "
                   "steps\n",
                   (long long)steady_from, why, (long long)profile.fit_n_min, (long long)profile.fit_n_max,
                   (long long)profile.fit_points, (long long)profile.n_points);
            printf("            device token equivalents per KV head = %.4g + %.4g x %s (KV) + %.4g + %.4g x %s (aux), "
                   "R^2 %.4f\n",
                   profile.kv.a, profile.kv.b, profile.x_is_generated ? "generated" : "n", profile.aux.a,
                   profile.aux.b, profile.x_is_generated ? "generated" : "n", profile.kv_r2);
            printf("            auxiliary state %s; x %.4g on the planned model\n", aux_rule, aux_factor);
            if (profile.per_query_head)
                printf("            per-query-head layout: %d copies per KV head measured, %d on the planned model\n",
                       profile.trace_group, m->n_heads / m->n_kv_heads);
        }
        printf("\nbatch %ld, context %ld, response %ld (%ld tokens per sequence):\n", batch, context, response,
               context + response);
        printf("  %-60s %-28s %-28s %10s %20s\n", "policy (budget in tokens per KV head)", "per sequence",
               "batch total", "max batch", "max context");
        int any_clamped = 0;
        for (int s = 0; s < n_ser; s++) {
            char mb[32], mc[64];
            fmt_size(a, sizeof a, main_pt[s].seq_device_bytes);
            fmt_size(b, sizeof b, main_pt[s].total_bytes);
            fmt_count(mb, sizeof mb, main_pt[s].max_batch);
            fmt_count(mc, sizeof mc, main_pt[s].max_context);
            if (main_pt[s].context_clamped) {
                size_t l = strlen(mc);
                snprintf(mc + l, sizeof mc - l, " (model)");
                any_clamped = 1;
            }
            printf("%c %-60s %-28s %-28s %10s %20s\n", s == planned ? '*' : ' ', ser[s].label, a, b, mb, mc);
            if (main_pt[s].host_bytes > 0 || main_pt[s].pcie_bytes_per_step > 0) {
                fmt_size(a, sizeof a, main_pt[s].host_bytes);
                fmt_size(c, sizeof c, main_pt[s].pcie_bytes_per_step);
                printf("    host memory %s; PCIe per decode step %s\n", a, c);
            }
        }
        if (any_clamped) {
            printf("(model): the model's context of %d positions less the response binds before memory; memory alone "
                   "allows",
                   m->max_positions);
            for (int s = 0, first = 1; s < n_ser; s++) {
                if (!main_pt[s].context_clamped) continue;
                char mc[32];
                fmt_count(mc, sizeof mc, main_pt[s].max_context_memory);
                printf("%s %s: %s", first ? "" : ";", ser[s].label, mc);
                first = 0;
            }
            printf("\n");
        }
        printf("(* the planned policy; max batch: sequences of this context and response that fit; max context: the "
               "longest prompt with this response at this batch)\n");
        printf("\nKV cache of the batch against the response length (context %ld, batch %ld):\n  %10s", context, batch,
               "response");
        for (int s = 0; s < n_ser; s++) printf("  %-24.24s", ser[s].label);
        printf("\n");
        for (int k = 0; k < n_resp; k++) {
            printf("  %10lld", (long long)responses[k]);
            for (int s = 0; s < n_ser; s++) {
                fmt_size(a, sizeof a, curve[s * n_resp + k]);
                printf("  %-24s", a);
            }
            printf("\n");
        }
        if (setup.gpu_bytes > 0) {
            printf("\nmax batch per context+response setting:\n  %15s", "setting");
            for (int s = 0; s < n_ser; s++) printf("  %-24.24s", ser[s].label);
            printf("\n");
            for (int k = 0; k < n_set; k++) {
                char set[48];
                snprintf(set, sizeof set, "%lld+%lld", (long long)set_ctx[k], (long long)set_resp[k]);
                printf("  %15s", set);
                for (int s = 0; s < n_ser; s++) {
                    fmt_count(a, sizeof a, (int64_t)curve[n_ser * n_resp + s * n_set + k]);
                    printf("  %-24s", a);
                }
                printf("\n");
            }
        }
        if (hw_s) {
            const double F = w_bytes == 1 && tsetup.hw.flops8 > 0 ? tsetup.hw.flops8 : tsetup.hw.flops16;
            fmt_size(c, sizeof c, wbytes);
            printf("\ntime on %ld x %s: HBM %.4g TB/s x mbu %g, %s tensor %.4g TFLOP/s x mfu %g, host %.4g GB/s, link "
                   "%.4g GB/s per direction  [%s]\n",
                   gpus, tsetup.hw.name, tsetup.hw.hbm_bw / 1e12, tsetup.mbu, F == tsetup.hw.flops8 ? "fp8" : "bf16",
                   F / 1e12, tsetup.mfu, tsetup.hw.host_bw / 1e9, tsetup.hw.link_bw / 1e9, tsetup.hw.source);
            printf("  roofline per phase: max(compute, memory) + host transfers + all-reduces (analysis/plan_time.h); "
                   "weights %s read once per decode step\n", c);
            printf("\nlatency at batch %ld, context %ld, response %ld:\n  %-60s %12s %12s %12s %8s %10s %14s\n", batch,
                   context, response, "policy", "TTFT", "TPOT", "tokens/s", "decode", "best batch", "tokens/s there");
            for (int z = 0; z < n_ser; z++) {
                char bb[32] = "-", bt[32] = "-";
                if (best[z] >= 0) {
                    snprintf(bb, sizeof bb, "%lld", (long long)pts[best[z]].batch);
                    snprintf(bt, sizeof bt, "%.4g", ptime[best[z]].tokens_per_s);
                }
                printf("%c %-60s %10.4g ms %10.4g ms %12.4g %8s %10s %14s\n", z == planned ? '*' : ' ', ser[z].label,
                       main_t[z].ttft * 1e3, main_t[z].tpot * 1e3, main_t[z].tokens_per_s,
                       bound_name(main_t[z].decode_compute_bound), bb, bt);
            }
            {
                /* one layer of the planned series (the last decode step's): its compute and memory time */
                const kvs_plan_timing *pt = &main_t[planned];
                const double L = m->n_layers, lc = pt->last_step.layer_flops / (gpus * F * tsetup.mfu),
                             lm = pt->last_step.layer_bytes / (gpus * tsetup.hw.hbm_bw * tsetup.mbu);
                printf("  per layer (%s): prefill %.4g ms x %d layers + %.4g ms (classifier, embedding); last decode "
                       "step %.4g us x %d + %.4g us (a layer: compute %.4g us, memory %.4g us)\n",
                       ser[planned].label, pt->prefill.layer_seconds * 1e3, m->n_layers,
                       (pt->prefill.seconds - L * pt->prefill.layer_seconds) * 1e3, pt->last_step.layer_seconds * 1e6,
                       m->n_layers, (pt->last_step.seconds - L * pt->last_step.layer_seconds) * 1e6, lc * 1e6,
                       lm * 1e6);
            }
            printf("(TTFT: the prefill of the batch's prompts; TPOT: the mean decode step over the response; tokens/s: "
                   "batch / TPOT; decode: what bounds the last step; best batch: the batch of the table below with the "
                   "most tokens/s that fits in memory)\n");
            printf("\ndecode tokens/s against the batch (context %ld, response %ld; x: over the memory limit):\n",
                   context, response);
            for (int z = 0; z < n_ser; z++) {
                printf("  %s:", ser[z].label);
                if (!sweep_n[z]) printf(" no batch fits");
                for (int k = 0; k < sweep_n[z]; k++) {
                    const int i = sweep_from[z] + k;
                    printf(" %lld:%.4g%s", (long long)pts[i].batch, ptime[i].tokens_per_s,
                           pts[i].batch > pts[i].max_batch ? "x" : "");
                }
                printf("\n");
            }
        }
        printf("GB/TB/MB/KB = 10^9/10^12/10^6/10^3 bytes; GiB/TiB/MiB/KiB = 2^30/2^40/2^20/2^10 bytes\n");
    }
    if (m->max_positions > 0 && context + response > m->max_positions)
        fprintf(stderr, "kvsim plan: warning: context + response (%ld) exceeds the model's max_position_embeddings (%d)\n",
                context + response, m->max_positions);
    if (extrapolated)
        fprintf(stderr, "kvsim plan: warning: the measured profile's steady state was fitted on sequence lengths "
                        "%lld..%lld; the plan extrapolates its line beyond them\n",
                (long long)profile.fit_n_min, (long long)profile.fit_n_max);
    if (kind == KVS_PLAN_MEASURED && profile.fit_points < 2)
        fprintf(stderr, "kvsim plan: warning: the measured profile's steady state is a single step (n = %lld): its "
                        "line is flat, whatever the policy does later\n", (long long)profile.fit_n_min);
    if (m->tied_embeddings < 0)
        fprintf(stderr, "kvsim plan: warning: %s does not record whether the classifier is tied to the token "
                        "embedding: the weights count it apart (%.4g million parameters more than tied); "
                        "--tied-embeddings yes|no says which\n",
                m->source, (double)m->vocab * m->hidden / 1e6);

    /* ---- plots ---- */
    if (plot_tput) {
        /* the union of the series' batches, ascending; NaN where a series was not timed */
        double xb[MAX_SERIES * (MAX_LIST + 1)];
        int nx = 0;
        for (int k = n_base; k < n_pts; k++) {
            int dup = 0;
            for (int j = 0; j < nx && !dup; j++) dup = xb[j] == (double)pts[k].batch;
            if (!dup) xb[nx++] = (double)pts[k].batch;
        }
        for (int i = 1; i < nx; i++) /* insertion sort: a few dozen values */
            for (int j = i; j > 0 && xb[j - 1] > xb[j]; j--) {
                double t = xb[j];
                xb[j] = xb[j - 1];
                xb[j - 1] = t;
            }
        double *yb = malloc((size_t)(n_ser * (nx > 0 ? nx : 1)) * sizeof *yb);
        if (!yb) {
            st = kvs_fail(KVS_ERR_NOMEM, "out of memory");
            goto fail;
        }
        for (int i = 0; i < n_ser * nx; i++) yb[i] = NAN;
        for (int k = n_base; k < n_pts; k++)
            for (int j = 0; j < nx; j++)
                if (xb[j] == (double)pts[k].batch) yb[pts_ser[k] * nx + j] = ptime[k].tokens_per_s;
        const char *labels[MAX_SERIES];
        for (int z = 0; z < n_ser; z++) labels[z] = ser[z].label;
        char title[320];
        snprintf(title, sizeof title, "%s on %ld x %s: decode tokens/s vs batch (context %ld, response %ld; mbu %g, "
                                      "mfu %g)", m->name, gpus, tsetup.hw.name, context, response, tsetup.mbu,
                 tsetup.mfu);
        kvs_plot_plan pp = {.kind = KVS_PLOT_PLAN_THROUGHPUT, .title = title, .out_path = plot_tput,
                            .gnuplot = gnuplot, .n_series = n_ser, .labels = labels, .n_x = nx, .x = xb, .y = yb,
                            .hline = NAN};
        st = nx > 0 ? kvs_plot_plan_render(&pp) : kvs_fail(KVS_ERR_INVALID_ARG, "--plot-throughput: no batch fits");
        free(yb);
        if (st != KVS_OK) goto fail;
    }
    if (plot_mem || plot_batch) {
        const char *labels[MAX_SERIES], *xl[MAX_LIST];
        double xs[MAX_LIST];
        char xlbuf[MAX_LIST][48], title[320];
        for (int s = 0; s < n_ser; s++) labels[s] = ser[s].label;
        for (int k = 0; k < n_resp; k++) xs[k] = (double)responses[k];
        for (int k = 0; k < n_set; k++) {
            snprintf(xlbuf[k], sizeof xlbuf[k], "%lld+%lld", (long long)set_ctx[k], (long long)set_resp[k]);
            xl[k] = xlbuf[k];
        }
        if (plot_mem) {
            snprintf(title, sizeof title, "%s, %s KV: memory vs response length (batch %ld, context %ld)", m->name,
                     kv_name, batch, context);
            kvs_plot_plan p = {.kind = KVS_PLOT_PLAN_MEMORY, .title = title, .out_path = plot_mem, .gnuplot = gnuplot,
                               .n_series = n_ser, .labels = labels, .n_x = n_resp, .x = xs, .y = curve, .hline = pool};
            if ((st = kvs_plot_plan_render(&p)) != KVS_OK) goto fail;
        }
        if (plot_batch) {
            if (!(setup.gpu_bytes > 0)) {
                st = kvs_fail(KVS_ERR_INVALID_ARG, "--plot-batch needs --gpu-mem");
                goto fail;
            }
            snprintf(title, sizeof title, "%s, %s KV: max batch on %ld GPU(s)", m->name, kv_name, gpus);
            kvs_plot_plan p = {.kind = KVS_PLOT_PLAN_MAX_BATCH, .title = title, .out_path = plot_batch,
                               .gnuplot = gnuplot, .n_series = n_ser, .labels = labels, .n_x = n_set, .x_labels = xl,
                               .y = curve + n_ser * n_resp, .hline = NAN};
            if ((st = kvs_plot_plan_render(&p)) != KVS_OK) goto fail;
        }
    }

    /* ---- database ---- */
    if (db_path) {
        kvs_results_plan pr = {
            .model = m->name, .model_source = m->source, .n_layers = m->n_layers, .n_heads = m->n_heads,
            .n_kv_heads = m->n_kv_heads, .head_dim = m->head_dim, .params = kvs_plan_params(m),
            .kv_dtype = kv_name, .kv_bytes_per_token = kvtok,
            .weight_dtype = w_bytes > 0 ? (weights ? weights : "fp16") : NULL, .weight_bytes = wbytes,
            .n_gpus = (int32_t)gpus, .gpu_bytes = setup.gpu_bytes > 0 ? setup.gpu_bytes : NAN,
            .reserve_bytes = setup.reserve_bytes, .kv_pool_bytes = pool, .batch = batch, .context = context,
            .response = response, .policy = kvs_plan_kind_name(kind), .budget = kind == KVS_PLAN_FULL ? 0 : budget,
            .kv_a = NAN, .kv_b = NAN, .aux_a = NAN, .aux_b = NAN, .host_a = NAN, .host_b = NAN, .transfer_a = NAN,
            .transfer_b = NAN, .fit_r2 = NAN, .kvsim_version = KVSIM_VERSION_STRING};
        if (kind == KVS_PLAN_MEASURED) {
            pr.budget = profile.budget_tokens;
            pr.profile_db = profile_db;
            pr.profile_run_id = profile.run_id;
            pr.profile_policy = profile.policy;
            pr.profile_params = profile.params;
            pr.profile_x = profile.x_is_generated ? "generated" : "n";
            pr.aux_scale = aux_rule;
            pr.fit_n_min = profile.fit_n_min, pr.fit_n_max = profile.fit_n_max, pr.fit_points = profile.fit_points;
            pr.kv_a = profile.kv.a, pr.kv_b = profile.kv.b, pr.aux_a = profile.aux.a, pr.aux_b = profile.aux.b;
            pr.host_a = profile.host.a, pr.host_b = profile.host.b;
            pr.transfer_a = profile.transfer.a, pr.transfer_b = profile.transfer.b, pr.fit_r2 = profile.kv_r2;
        }
        for (int k = 0; k < n_base; k++) {
            const series *s = &ser[pts_ser[k]];
            rows[k] = (kvs_results_plan_point){
                .series = s->id,
                .budget = s->pol.kind == KVS_PLAN_FULL ? 0
                          : s->pol.kind == KVS_PLAN_MEASURED ? profile.budget_tokens
                                                             : s->pol.budget,
                .context = pts[k].context, .response = pts[k].response, .batch = pts[k].batch,
                .seq_device_bytes = pts[k].seq_device_bytes, .total_bytes = pts[k].total_bytes,
                .host_bytes = pts[k].host_bytes, .pcie_bytes_per_step = pts[k].pcie_bytes_per_step,
                .max_batch = pts[k].max_batch == KVS_PLAN_UNBOUNDED ? -1 : pts[k].max_batch < 0 ? -2 : pts[k].max_batch,
                .max_context = pts[k].max_context == KVS_PLAN_UNBOUNDED ? -1
                               : pts[k].max_context < 0                 ? -2
                                                                        : pts[k].max_context};
        }
        kvs_results_trace tr;
        if (trace) tr = kvs_results_trace_of(trace_path, kvs_trace_info_get(trace));
        int64_t id = 0;
        if ((st = kvs_results_open(db_path, &db)) != KVS_OK ||
            (st = kvs_results_write_plan(db, &pr, trace ? &tr : NULL, rows, n_base, &id)) != KVS_OK)
            goto fail;
        if (hw_s) { /* the timed points: the plan's and the sweeps' (a sweep row of --batch is a plan point) */
            kvs_results_plan_time *tr_rows = calloc((size_t)n_pts, sizeof *tr_rows);
            if (!tr_rows) {
                st = kvs_fail(KVS_ERR_NOMEM, "out of memory");
                goto fail;
            }
            int nt = 0;
            for (int k = 0; k < n_pts; k++) {
                if (k >= n_base && pts[k].batch == batch) continue;
                const int z = pts_ser[k];
                tr_rows[nt++] = (kvs_results_plan_time){
                    .series = ser[z].id, .context = pts[k].context, .response = pts[k].response,
                    .batch = pts[k].batch, .hw = tsetup.hw.name, .n_gpus = (int32_t)gpus, .mbu = tsetup.mbu,
                    .mfu = tsetup.mfu, .ttft_s = ptime[k].ttft, .tpot_s = ptime[k].tpot,
                    .tokens_per_s = ptime[k].tokens_per_s, .decode_bound = bound_name(ptime[k].decode_compute_bound),
                    .fits = pts[k].max_batch >= pts[k].batch,
                    .best = best[z] >= 0 && pts[k].context == context && pts[k].response == response &&
                            pts[k].batch == pts[best[z]].batch};
            }
            st = kvs_results_write_plan_times(db, id, tr_rows, nt);
            free(tr_rows);
            if (st != KVS_OK) goto fail;
        }
        fprintf(stderr, "kvsim plan: plan %lld (%d points) recorded in %s\n", (long long)id, n_base, db_path);
    }
    rc = kvs_cli_finish_stdout("plan");
    goto done;
fail:
    rc = kvs_cli_fail("plan", st);
done:
    free(pts);
    free(ptime);
    free(pts_ser);
    free(rows);
    free(curve);
cleanup:
    kvs_codec_free(codec);
    kvs_results_close(db);
    kvs_trace_close(trace);
    return rc;
}
