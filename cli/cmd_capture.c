/* cmd_capture.c — `kvsim capture`: real decoding of a real model on the CPU, recorded as a trace
 * (issue "Real decoding capture on the CPU"; ../shared/DESIGN.md "Capture"). Option parsing only; the
 * work is kvs_capture_run (gpu_capture/capture.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../gpu_capture/capture.h"
#include "../trace/trace.h"
#include "cli.h"

static const char *const capture_help =
    "usage: kvsim capture --model PATH (--prompt TEXT | --prompt-file F | --prompt-ids 1,2,3 | --turns FILE)\n"
    "                     (--out TRACE | --no-trace) [options]\n"
    "\n"
    "Decodes with the CPU reference forward pass and records, for every position, layer and head, the\n"
    "post-RoPE q/k, v, attention output and log-sum-exp (trace/FORMAT.md).\n"
    "\n"
    "  --model PATH         llama2.c .bin checkpoint or Hugging Face folder (config.json + *.safetensors)\n"
    "  --tokenizer FILE     tokenizer (default: tok<vocab>.bin / tokenizer.bin beside a .bin, tokenizer.json in a folder)\n"
    "  --prompt TEXT        prompt text            --prompt-file F   prompt text read from a file\n"
    "  --prompt-ids LIST    comma-separated token ids (BOS is prepended unless --no-bos or LIST starts with it)\n"
    "  --turns FILE         multi-turn: each non-empty line is one user turn (\\n inside a line = newline);\n"
    "                       each turn's tokens are fed as prompt, then --steps tokens are generated\n"
    "                       (no prompt option at all: start from BOS alone)\n"
    "  --no-bos             do not prepend BOS\n"
    "  --steps N            tokens to generate (per turn), default 64; every one is forwarded and recorded\n"
    "  --ignore-eos         keep generating past the end-of-sequence token\n"
    "  --max-positions N    stop after N positions (default: the model context)\n"
    "  --temperature T      0 = greedy (default); --top-p P nucleus sampling (default 1 = off)\n"
    "  --seed S             sampling seed (default 42)\n"
    "  --dtype D            trace storage of q/k/v/o: fp16 (default), bf16, fp32 (lse is always fp32)\n"
    "  --block N            positions per trace block (default 64)\n"
    "  --threads N          worker threads for the CPU forward pass and for trace compression\n"
    "                       (default: all cores; with --device cuda, compression only, all cores but one)\n"
    "  --device cpu|cuda    backend (default cpu; cuda needs a build made with `make cuda` and a GPU)\n"
    "  --out TRACE          trace file to write (written as TRACE.partial, renamed when complete)\n"
    "  --no-trace           decode without recording; prints the token ids and the text\n"
    "  --progress / --quiet progress lines on stderr (default: only when stderr is a terminal)\n"
    "\n"
    "Exit status: 0 success, 1 failure (bad model/tokenizer/prompt, I/O), 2 bad usage.\n";

/* Parses "1,2, 3" into a malloc'd array. */
static kvs_status parse_ids(const char *s, int32_t **out, size_t *n) {
    size_t cap = 16, k = 0;
    int32_t *ids = malloc(cap * sizeof *ids);
    if (!ids) return kvs_fail(KVS_ERR_NOMEM, "out of memory");
    const char *p = s;
    while (*p) {
        while (*p == ' ') p++;
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v > INT32_MAX) {
            free(ids);
            return kvs_fail(KVS_ERR_INVALID_ARG, "--prompt-ids: '%s' is not a comma-separated list of token ids", s);
        }
        if (k == cap) {
            int32_t *m = realloc(ids, 2 * cap * sizeof *ids);
            if (!m) {
                free(ids);
                return kvs_fail(KVS_ERR_NOMEM, "out of memory");
            }
            ids = m;
            cap *= 2;
        }
        ids[k++] = (int32_t)v;
        p = end;
        while (*p == ' ') p++;
        if (*p == ',') {
            p++;
            if (!*p) break;
        } else if (*p) {
            free(ids);
            return kvs_fail(KVS_ERR_INVALID_ARG, "--prompt-ids: '%s' is not a comma-separated list of token ids", s);
        }
    }
    if (k == 0) {
        free(ids);
        return kvs_fail(KVS_ERR_INVALID_ARG, "--prompt-ids: empty list");
    }
    *out = ids;
    *n = k;
    return KVS_OK;
}

/* Splits a turns file into lines (in place); "\n" two-character sequences become newlines. */
static kvs_status split_turns(char *text, char ***turns, size_t *n) {
    size_t cap = 8, k = 0;
    char **t = malloc(cap * sizeof *t);
    if (!t) return kvs_fail(KVS_ERR_NOMEM, "out of memory");
    char *line = text;
    while (line && *line) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = '\0';
        size_t len = strlen(line);
        if (len && line[len - 1] == '\r') line[--len] = '\0';
        char *o = line;
        for (char *i = line; *i; i++) {
            if (i[0] == '\\' && i[1] == 'n') {
                *o++ = '\n';
                i++;
            } else {
                *o++ = *i;
            }
        }
        *o = '\0';
        if (line[0]) {
            if (k == cap) {
                char **m = realloc(t, 2 * cap * sizeof *t);
                if (!m) {
                    free(t);
                    return kvs_fail(KVS_ERR_NOMEM, "out of memory");
                }
                t = m;
                cap *= 2;
            }
            t[k++] = line;
        }
        line = nl ? nl + 1 : NULL;
    }
    *turns = t;
    *n = k;
    return KVS_OK;
}

int kvs_cmd_capture(int argc, char **argv) {
    const char *cmd = "capture";
    kvs_capture_opts o;
    memset(&o, 0, sizeof o);
    o.steps = 64;
    o.top_p = 1.0f;
    o.seed = 42;
    o.dtype = KVS_DTYPE_F16;
    const char *prompt_file = NULL, *prompt_ids = NULL, *turns_file = NULL, *device = "cpu";
    int no_trace = 0, progress = -1, rc = KVS_EXIT_OK;
    int32_t *ids = NULL;
    char *file_text = NULL, **turns = NULL, src[4200];
    kvs_capture_result res;
    memset(&res, 0, sizeof res);
    kvs_status s;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (kvs_cli_is_help(a)) {
            fputs(capture_help, stdout);
            return KVS_EXIT_OK;
        }
        int flag = !strcmp(a, "--no-bos") || !strcmp(a, "--ignore-eos") || !strcmp(a, "--no-trace") ||
                   !strcmp(a, "--progress") || !strcmp(a, "--quiet");
        if (flag) {
            if (!strcmp(a, "--no-bos")) o.no_bos = 1;
            else if (!strcmp(a, "--ignore-eos")) o.ignore_eos = 1;
            else if (!strcmp(a, "--no-trace")) no_trace = 1;
            else progress = !strcmp(a, "--progress");
            continue;
        }
        if (strncmp(a, "--", 2) != 0) return kvs_cli_usage_error(cmd, "unexpected argument '%s'", a);
        if (i + 1 >= argc) return kvs_cli_usage_error(cmd, "option %s needs a value", a);
        const char *v = argv[++i];
        long lv;
        double dv;
        if (!strcmp(a, "--model")) o.model_path = v;
        else if (!strcmp(a, "--tokenizer")) o.tokenizer_path = v;
        else if (!strcmp(a, "--prompt")) o.prompt_text = v;
        else if (!strcmp(a, "--prompt-file")) prompt_file = v;
        else if (!strcmp(a, "--prompt-ids")) prompt_ids = v;
        else if (!strcmp(a, "--turns")) turns_file = v;
        else if (!strcmp(a, "--out")) o.out_path = v;
        else if (!strcmp(a, "--device")) device = v;
        else if (!strcmp(a, "--steps") || !strcmp(a, "--max-positions") || !strcmp(a, "--block") ||
                 !strcmp(a, "--threads")) {
            long lo = !strcmp(a, "--steps") ? 0 : 1;
            long hi = !strcmp(a, "--block") ? KVS_TRACE_MAX_BLOCK : !strcmp(a, "--threads") ? 1024 : (1L << 24);
            if (kvs_cli_parse_long(a, v, lo, hi, &lv) != KVS_OK) return kvs_cli_fail(cmd, KVS_ERR_INVALID_ARG);
            if (!strcmp(a, "--steps")) o.steps = (int)lv;
            else if (!strcmp(a, "--max-positions")) o.max_positions = (int)lv;
            else if (!strcmp(a, "--block")) o.block = (int)lv;
            else o.threads = (int)lv;
        } else if (!strcmp(a, "--temperature")) {
            if (kvs_cli_parse_double(a, v, 0, 100, &dv) != KVS_OK) return kvs_cli_fail(cmd, KVS_ERR_INVALID_ARG);
            o.temperature = (float)dv;
        } else if (!strcmp(a, "--top-p")) {
            if (kvs_cli_parse_double(a, v, 0, 1, &dv) != KVS_OK) return kvs_cli_fail(cmd, KVS_ERR_INVALID_ARG);
            if (dv <= 0) return kvs_cli_usage_error(cmd, "--top-p: %g must be in (0, 1]", dv);
            o.top_p = (float)dv;
        } else if (!strcmp(a, "--seed")) {
            char *end;
            unsigned long long sv = strtoull(v, &end, 10);
            if (!v[0] || *end || v[0] == '-') return kvs_cli_usage_error(cmd, "--seed: '%s' is not a non-negative integer", v);
            o.seed = sv;
        } else if (!strcmp(a, "--dtype")) {
            kvs_dtype dt;
            if (kvs_dtype_parse(v, &dt) != KVS_OK) return kvs_cli_usage_error(cmd, "--dtype: '%s' is not fp32, fp16 or bf16", v);
            o.dtype = dt;
        } else {
            return kvs_cli_usage_error(cmd, "unknown option '%s'", a);
        }
    }
    if (!o.model_path) return kvs_cli_usage_error(cmd, "--model PATH is required");
    if ((o.prompt_text != NULL) + (prompt_file != NULL) + (prompt_ids != NULL) + (turns_file != NULL) > 1)
        return kvs_cli_usage_error(cmd, "give only one of --prompt, --prompt-file, --prompt-ids, --turns");
    if (!!o.out_path + no_trace != 1) return kvs_cli_usage_error(cmd, "give exactly one of --out TRACE and --no-trace");
    if (strcmp(device, "cpu") && strcmp(device, "cuda"))
        return kvs_cli_usage_error(cmd, "--device: '%s' is not cpu or cuda", device);
    o.device = !strcmp(device, "cuda") ? KVS_CAPTURE_CUDA : KVS_CAPTURE_CPU;
    o.progress = progress < 0 ? isatty(2) : progress;

    if (o.prompt_text) {
        snprintf(src, sizeof src, "text");
    } else if (prompt_file || turns_file) {
        const char *f = prompt_file ? prompt_file : turns_file;
        size_t len;
        if ((s = kvs_read_file(f, &file_text, &len)) != KVS_OK) return kvs_cli_fail(cmd, s);
        if (strlen(file_text) != len) {
            free(file_text);
            return kvs_cli_fail(cmd, kvs_fail(KVS_ERR_FORMAT, "%s: contains a NUL byte", f));
        }
        snprintf(src, sizeof src, "%s:%s", prompt_file ? "file" : "turns", f);
        if (prompt_file) {
            o.prompt_text = file_text;
        } else {
            size_t n = 0;
            if ((s = split_turns(file_text, &turns, &n)) != KVS_OK) {
                rc = kvs_cli_fail(cmd, s);
                goto done;
            }
            if (n == 0) {
                rc = kvs_cli_fail(cmd, kvs_fail(KVS_ERR_FORMAT, "%s: no turns (every line is empty)", f));
                goto done;
            }
            o.turns = (const char *const *)turns;
            o.n_turns = n;
        }
    } else if (prompt_ids) {
        if ((s = parse_ids(prompt_ids, &ids, &o.n_prompt_ids)) != KVS_OK) return kvs_cli_fail(cmd, s);
        o.prompt_ids = ids;
        snprintf(src, sizeof src, "ids");
    } else {
        snprintf(src, sizeof src, "bos");
    }
    o.prompt_source = src;

    if ((s = kvs_capture_run(&o, &res)) != KVS_OK) {
        rc = kvs_cli_fail(cmd, s);
        goto done;
    }
    if (no_trace || !res.text) {
        printf("ids:");
        for (int64_t i = 0; i < res.n_positions; i++) printf("%s%d", i ? "," : " ", res.tokens[i]);
        printf("\n");
    }
    if (res.text) printf("%s\n", res.text);
    double tps = res.seconds > 0 ? (double)res.n_positions / res.seconds : 0;
    printf("---\nmodel %s: %lld positions (%lld prompt, %lld generated%s), %.1f tok/s", res.model_name,
           (long long)res.n_positions, (long long)res.n_prompt, (long long)res.n_generated,
           res.stopped_eos ? ", stopped at EOS" : res.stopped_max ? ", stopped at max positions" : "", tps);
    if (o.out_path) printf(", trace %s %llu bytes", o.out_path, (unsigned long long)res.trace_bytes);
    printf("\n");
done:
    kvs_capture_result_free(&res);
    free(ids);
    free(turns);
    free(file_text);
    return rc;
}
