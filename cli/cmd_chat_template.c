/* cmd_chat_template.c — `kvsim chat-template`: renders messages with a model's own chat template
 * (gpu_capture/chat_template.h) and prints the text, or the token ids of that text, so a template can be checked
 * against a reference without capturing. The ids are the tokenizer's encoding of the rendered text without the
 * tokenizer's own BOS: the template writes bos_token itself, as Hugging Face's apply_chat_template(tokenize=True)
 * encodes with add_special_tokens=False. Exit codes as in cli.h.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/json.h"
#include "../gpu_capture/chat_template.h"
#include "../gpu_capture/tokenizer.h"
#include "cli.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: kvsim chat-template --model DIR --messages FILE [--ids] [--no-generation-prompt] [--date YYYY-MM-DD]\n"
            "\n"
            "Renders the messages of FILE (a JSON array of {\"role\": ..., \"content\": ...} objects; other fields\n"
            "are visible to the template as they are) with the chat template of the model folder DIR\n"
            "(tokenizer_config.json \"chat_template\", else chat_template.jinja) and writes the text to standard\n"
            "output exactly, with no newline added.\n"
            "  --model DIR              model folder (tokenizer_config.json, tokenizer.json)\n"
            "  --messages FILE          the conversation (- = standard input)\n"
            "  --ids                    print the token ids of the text instead (comma-separated, one line): DIR's\n"
            "                           tokenizer.json, no BOS added (the template writes its own)\n"
            "  --no-generation-prompt   add_generation_prompt = false (default true: end with the assistant header)\n"
            "  --date YYYY-MM-DD        the date strftime_now() formats (without it a template calling it is refused)\n"
            "A template using a construct outside kvsim's Jinja subset is refused with the construct named.\n"
            "Exit status: 0 success, 1 failure (no/unsupported template, bad messages, I/O), 2 bad usage.\n");
}

static kvs_status encode_all(const kvs_tokenizer *tok, const char *text, int32_t **ids, size_t *n) {
    size_t cap = strlen(text) + 8;
    *ids = malloc(cap * sizeof **ids);
    if (!*ids) return kvs_fail(KVS_ERR_NOMEM, "out of memory");
    kvs_status s = kvs_tokenizer_encode(tok, text, 0, *ids, cap, n);
    if (s == KVS_ERR_RANGE && *n > cap) {
        int32_t *b = realloc(*ids, *n * sizeof *b);
        if (!b) return kvs_fail(KVS_ERR_NOMEM, "out of memory");
        *ids = b;
        cap = *n;
        s = kvs_tokenizer_encode(tok, text, 0, *ids, cap, n);
    }
    return s;
}

/* All of standard input (a pipe too) in a malloc'd NUL-terminated buffer. */
static kvs_status read_stdin(char **out, size_t *len) {
    size_t cap = 4096, n = 0;
    char *b = malloc(cap);
    if (!b) return kvs_fail(KVS_ERR_NOMEM, "out of memory");
    for (;;) {
        if (n + 1 >= cap) {
            char *nb = cap > ((size_t)1 << 30) ? NULL : realloc(b, cap * 2);
            if (!nb) {
                free(b);
                return kvs_fail(KVS_ERR_NOMEM, "standard input: out of memory");
            }
            b = nb;
            cap *= 2;
        }
        size_t got = fread(b + n, 1, cap - n - 1, stdin);
        n += got;
        if (got == 0) break;
    }
    if (ferror(stdin)) {
        free(b);
        return kvs_fail(KVS_ERR_IO, "reading standard input failed");
    }
    b[n] = '\0';
    *out = b;
    *len = n;
    return KVS_OK;
}

int kvs_cmd_chat_template(int argc, char **argv) {
    static const char *cmd = "chat-template";
    static const struct option opts[] = {{"model", required_argument, NULL, 'm'},
                                         {"messages", required_argument, NULL, 'f'},
                                         {"ids", no_argument, NULL, 'i'},
                                         {"no-generation-prompt", no_argument, NULL, 'n'},
                                         {"date", required_argument, NULL, 'd'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    const char *model = NULL, *messages = NULL;
    int want_ids = 0, seen[6] = {0};
    kvs_chat_render_opts ro = {.add_generation_prompt = 1};
    opterr = 0;
    optind = 1;
    int c, li;
    while ((li = -1, c = getopt_long(argc, argv, ":h", opts, &li)) != -1) {
        if (li >= 0) {
            char name[64];
            snprintf(name, sizeof name, "--%s", opts[li].name);
            if (kvs_cli_once(cmd, name, &seen[li])) return 2;
        }
        switch (c) {
        case 'm': model = optarg; break;
        case 'f': messages = optarg; break;
        case 'i': want_ids = 1; break;
        case 'n': ro.add_generation_prompt = 0; break;
        case 'd': ro.date = optarg; break;
        case 'h': usage(stdout); return 0;
        case ':': return kvs_cli_usage_error(cmd, "option '%s' needs a value", argv[optind - 1]);
        default: return kvs_cli_usage_error(cmd, "unknown option '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc) return kvs_cli_usage_error(cmd, "unexpected argument '%s'", argv[optind]);
    if (!model) return kvs_cli_usage_error(cmd, "--model DIR is required");
    if (!messages) return kvs_cli_usage_error(cmd, "--messages FILE is required");

    kvs_status s = KVS_OK;
    char *text = NULL, *out = NULL;
    size_t len = 0, out_len = 0, n_ids = 0;
    kvs_json *msgs = NULL;
    kvs_chat_template *t = NULL;
    kvs_tokenizer *tok = NULL;
    int32_t *ids = NULL;
    int rc = 1;
    KVS_TRY(s = strcmp(messages, "-") ? kvs_read_file(messages, &text, &len) : read_stdin(&text, &len));
    if ((s = kvs_json_parse(text, len, &msgs)) != KVS_OK) {
        s = kvs_fail(s, "%s: %s", messages, kvs_last_error());
        goto cleanup;
    }
    if (kvs_json_type_of(msgs) != KVS_JSON_ARRAY) {
        s = kvs_fail(KVS_ERR_FORMAT, "%s: not a JSON array of messages", messages);
        goto cleanup;
    }
    KVS_TRY(s = kvs_chat_template_load(model, &t));
    KVS_TRY(s = kvs_chat_render_json(t, msgs, &ro, &out, &out_len));
    if (!want_ids) {
        if (fwrite(out, 1, out_len, stdout) != out_len) {
            s = kvs_fail(KVS_ERR_IO, "writing standard output failed");
            goto cleanup;
        }
    } else {
        char tp[4200];
        snprintf(tp, sizeof tp, "%s/tokenizer.json", model);
        KVS_TRY(s = kvs_tokenizer_load_hf(tp, &tok));
        KVS_TRY(s = encode_all(tok, out, &ids, &n_ids));
        for (size_t i = 0; i < n_ids; i++) printf("%s%d", i ? "," : "", ids[i]);
        printf("\n");
    }
    rc = kvs_cli_finish_stdout(cmd);
cleanup:
    if (s != KVS_OK) rc = kvs_cli_fail(cmd, s);
    free(ids);
    kvs_tokenizer_free(tok);
    kvs_chat_template_free(t);
    free(out);
    kvs_json_free(msgs);
    free(text);
    return rc;
}
