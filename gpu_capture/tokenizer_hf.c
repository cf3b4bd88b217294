/* tokenizer_hf.c — Hugging Face tokenizer.json (model.type "BPE") loading, encoding and decoding,
 * following the semantics of the `tokenizers` library (tokenizer/added_vocabulary.rs, normalizers,
 * pre_tokenizers/{metaspace,byte_level,split}.rs, models/bpe/{model,word}.rs, decoders/ (strip.rs, fuse.rs, ...)) for the
 * subset listed in tokenizer.h. Unsupported configurations fail at load time with KVS_ERR_UNSUPPORTED
 * naming the JSON field.
 */
#include "tokenizer_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/json.h"
#include "unicode.h"

/* The exact Split regex strings the scanner in tokenizer_pretok.c implements. */
static const char *const RE_GPT2 = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
static const char *const RE_LLAMA3 = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?"
                                     "[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char *const RE_QWEN2 = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?"
                                    "[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/* ============================== GPT-2 byte <-> unicode map ============================== */
/* bytes_to_unicode() of GPT-2's encoder.py: printable Latin-1 bytes map to themselves, the other 68 bytes
 * to U+0100.. in byte order, so every byte becomes a visible character. */
static void gpt2_byte_map(uint32_t cp_of[256]) {
    uint32_t extra = 0;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        cp_of[b] = printable ? (uint32_t)b : 256 + extra++;
    }
}

/* ============================== loading ============================== */

static char *dup_bytes(const char *s, size_t n) {
    char *p = malloc(n + 1);
    if (p) {
        if (n) memcpy(p, s, n);
        p[n] = '\0';
    }
    return p;
}

/* Adds added token k (its content) to trie tr; the first token of a content keeps the node. */
static kvs_status trie_add(kvs_tok_trie *tr, const char *key, size_t key_len, int32_t k) {
    if (tr->n == 0) {
        tr->cap = 64;
        tr->nodes = malloc(tr->cap * sizeof *tr->nodes);
        if (!tr->nodes) return kvs_fail(KVS_ERR_NOMEM, "tokenizer: out of memory");
        tr->nodes[0] = (kvs_tok_trie_node){.child = -1, .sibling = -1, .token = -1};
        tr->n = 1;
    }
    int32_t node = 0;
    for (size_t i = 0; i < key_len; i++) {
        uint8_t b = (uint8_t)key[i];
        int32_t c = tr->nodes[node].child;
        while (c >= 0 && tr->nodes[c].byte != b) c = tr->nodes[c].sibling;
        if (c < 0) {
            if (tr->n == tr->cap) {
                kvs_tok_trie_node *g = realloc(tr->nodes, 2 * tr->cap * sizeof *g);
                if (!g) return kvs_fail(KVS_ERR_NOMEM, "tokenizer: out of memory");
                tr->nodes = g;
                tr->cap *= 2;
            }
            if (tr->n > INT32_MAX - 1) return kvs_fail(KVS_ERR_UNSUPPORTED, "tokenizer: added tokens too long");
            c = (int32_t)tr->n++;
            tr->nodes[c] = (kvs_tok_trie_node){.child = -1, .sibling = tr->nodes[node].child, .token = -1, .byte = b};
            tr->nodes[node].child = c;
        }
        node = c;
    }
    if (tr->nodes[node].token < 0) tr->nodes[node].token = k;
    return KVS_OK;
}

static const char *type_of_step(const kvs_json *v) {
    const char *s = kvs_json_string(kvs_json_get(v, "type"));
    return s ? s : "";
}

/* Reads an optional boolean field; absent or null leaves *out unchanged. */
static kvs_status get_bool(const char *path, const char *where, const kvs_json *obj, const char *key, int *out) {
    const kvs_json *v = kvs_json_get(obj, key);
    if (!v || kvs_json_type_of(v) == KVS_JSON_NULL) return KVS_OK;
    if (kvs_json_type_of(v) != KVS_JSON_BOOL)
        return kvs_fail(KVS_ERR_FORMAT, "%s: %s.%s is not a boolean", path, where, key);
    *out = kvs_json_bool(v);
    return KVS_OK;
}

static kvs_status get_string(const char *path, const char *where, const kvs_json *obj, const char *key,
                             const char **s, size_t *n) {
    const kvs_json *v = kvs_json_get(obj, key);
    if (kvs_json_type_of(v) != KVS_JSON_STRING)
        return kvs_fail(KVS_ERR_FORMAT, "%s: %s.%s is missing or not a string", path, where, key);
    *s = kvs_json_string(v);
    *n = kvs_json_string_len(v);
    return KVS_OK;
}

/* A Replace step's pattern: {"String": "..."} (*is_regex 0) or {"Regex": "..."} (*is_regex 1, only where
 * allow_regex; the decoders' Replace steps take String patterns only). */
static kvs_status get_pattern(const char *path, const char *where, const kvs_json *step, int allow_regex,
                              const char **s, size_t *n, int *is_regex) {
    const kvs_json *pat = kvs_json_get(step, "pattern");
    if (kvs_json_type_of(pat) != KVS_JSON_OBJECT)
        return kvs_fail(KVS_ERR_FORMAT, "%s: %s.pattern is missing or not an object", path, where);
    *is_regex = 0;
    if (kvs_json_get(pat, "Regex")) {
        if (!allow_regex)
            return kvs_fail(KVS_ERR_UNSUPPORTED, "%s: %s.pattern.Regex is not supported (only String patterns)", path,
                            where);
        *is_regex = 1;
        return get_string(path, where, pat, "Regex", s, n);
    }
    return get_string(path, where, pat, "String", s, n);
}

static kvs_status get_string_pattern(const char *path, const char *where, const kvs_json *step, const char **s,
                                     size_t *n) {
    int is_regex;
    return get_pattern(path, where, step, 0, s, n, &is_regex);
}

/* Compiles a tokenizer.json pattern, the engine's message prefixed with the file and the field. */
static kvs_status compile_pattern(const char *path, const char *where, const char *pat, size_t n, int is_regex,
                                  kvs_tok_rx **rx) {
    kvs_status st = kvs_tok_rx_compile(pat, n, !is_regex, rx);
    if (st != KVS_OK) return kvs_fail(st, "%s: %s \"%.80s\": %s", path, where, pat, kvs_last_error());
    return KVS_OK;
}

static kvs_status add_norm(const char *path, kvs_tokenizer *t, const kvs_json *n) {
    const char *type = type_of_step(n);
    if (strcmp(type, "Sequence") == 0) {
        const kvs_json *list = kvs_json_get(n, "normalizers");
        if (kvs_json_type_of(list) != KVS_JSON_ARRAY)
            return kvs_fail(KVS_ERR_FORMAT, "%s: normalizer Sequence has no normalizers array", path);
        for (size_t i = 0; i < kvs_json_len(list); i++) {
            kvs_status st = add_norm(path, t, kvs_json_at(list, i));
            if (st != KVS_OK) return st;
        }
        return KVS_OK;
    }
    kvs_tok_norm_step step = {0};
    const char *a = NULL, *b = NULL;
    size_t a_len = 0, b_len = 0;
    kvs_status st;
    if (strcmp(type, "Prepend") == 0) {
        step.kind = KVS_TOK_NORM_PREPEND;
        if ((st = get_string(path, "normalizer Prepend", n, "prepend", &a, &a_len)) != KVS_OK) return st;
    } else if (strcmp(type, "Replace") == 0) {
        step.kind = KVS_TOK_NORM_REPLACE;
        int is_regex;
        if ((st = get_pattern(path, "normalizer Replace", n, 1, &a, &a_len, &is_regex)) != KVS_OK) return st;
        if ((st = get_string(path, "normalizer Replace", n, "content", &b, &b_len)) != KVS_OK) return st;
        if (a_len == 0) return kvs_fail(KVS_ERR_FORMAT, "%s: normalizer Replace has an empty pattern", path);
        if (is_regex &&
            (st = compile_pattern(path, "normalizer Replace.pattern.Regex", a, a_len, 1, &step.rx)) != KVS_OK)
            return st;
    } else if (strcmp(type, "NFC") == 0) {
        step.kind = KVS_TOK_NORM_NFC;
    } else {
        return kvs_fail(KVS_ERR_UNSUPPORTED, "%s: normalizer.type \"%s\" is not supported "
                        "(Sequence, Prepend, Replace, NFC are)", path, type);
    }
    kvs_tok_norm_step *p = realloc(t->norm, (t->n_norm + 1) * sizeof *p);
    if (!p) {
        kvs_tok_rx_free(step.rx);
        return kvs_fail(KVS_ERR_NOMEM, "tokenizer: out of memory");
    }
    t->norm = p;
    step.a = a ? dup_bytes(a, a_len) : NULL;
    step.b = b ? dup_bytes(b, b_len) : NULL;
    step.a_len = a_len;
    step.b_len = b_len;
    t->norm[t->n_norm++] = step;
    if ((a && !step.a) || (b && !step.b)) return kvs_fail(KVS_ERR_NOMEM, "tokenizer: out of memory");
    return KVS_OK;
}

/* Metaspace prepend_scheme (new) or add_prefix_space (old serialisation). */
static kvs_status get_prepend_scheme(const char *path, const char *where, const kvs_json *v, int *out) {
    *out = KVS_TOK_PREPEND_ALWAYS;
    const char *ps = kvs_json_string(kvs_json_get(v, "prepend_scheme"));
    if (ps) {
        if (strcmp(ps, "always") == 0) *out = KVS_TOK_PREPEND_ALWAYS;
        else if (strcmp(ps, "first") == 0) *out = KVS_TOK_PREPEND_FIRST;
        else if (strcmp(ps, "never") == 0) *out = KVS_TOK_PREPEND_NEVER;
        else return kvs_fail(KVS_ERR_UNSUPPORTED, "%s: %s.prepend_scheme \"%s\" is not supported", path, where, ps);
        return KVS_OK;
    }
    int aps = 1;
    kvs_status st = get_bool(path, where, v, "add_prefix_space", &aps);
    *out = aps ? KVS_TOK_PREPEND_ALWAYS : KVS_TOK_PREPEND_NEVER;
    return st;
}

static kvs_status get_char(const char *path, const char *where, const kvs_json *v, const char *key, char *out,
                           size_t *out_len) {
    const char *s;
    size_t n;
    kvs_status st = get_string(path, where, v, key, &s, &n);
    if (st != KVS_OK) return st;
    uint32_t cp;
    if (n == 0 || kvs_tok_utf8_next(s, n, &cp) != n)
        return kvs_fail(KVS_ERR_FORMAT, "%s: %s.%s must be one character", path, where, key);
    memcpy(out, s, n);
    *out_len = n;
    return KVS_OK;
}

static kvs_status add_pre(const char *path, kvs_tokenizer *t, const kvs_json *v) {
    const char *type = type_of_step(v);
    kvs_status st;
    if (strcmp(type, "Sequence") == 0) {
        const kvs_json *list = kvs_json_get(v, "pretokenizers");
        if (kvs_json_type_of(list) != KVS_JSON_ARRAY)
            return kvs_fail(KVS_ERR_FORMAT, "%s: pre_tokenizer Sequence has no pretokenizers array", path);
        for (size_t i = 0; i < kvs_json_len(list); i++)
            if ((st = add_pre(path, t, kvs_json_at(list, i))) != KVS_OK) return st;
        return KVS_OK;
    }
    kvs_tok_pre_step step = {0};
    if (strcmp(type, "Metaspace") == 0) {
        step.kind = KVS_TOK_PRE_METASPACE;
        if ((st = get_char(path, "pre_tokenizer Metaspace", v, "replacement", step.repl, &step.repl_len)) != KVS_OK)
            return st;
        if ((st = get_prepend_scheme(path, "pre_tokenizer Metaspace", v, &step.prepend)) != KVS_OK) return st;
        step.split = 1;
        if ((st = get_bool(path, "pre_tokenizer Metaspace", v, "split", &step.split)) != KVS_OK) return st;
    } else if (strcmp(type, "ByteLevel") == 0) {
        step.kind = KVS_TOK_PRE_BYTELEVEL;
        step.add_prefix_space = 1; /* the library's defaults */
        step.use_regex = 1;
        if ((st = get_bool(path, "pre_tokenizer ByteLevel", v, "add_prefix_space", &step.add_prefix_space)) != KVS_OK)
            return st;
        if ((st = get_bool(path, "pre_tokenizer ByteLevel", v, "use_regex", &step.use_regex)) != KVS_OK) return st;
    } else if (strcmp(type, "Split") == 0) {
        step.kind = KVS_TOK_PRE_SPLIT;
        static const char *const behaviors[] = {"Isolated", "Removed", "MergedWithPrevious", "MergedWithNext",
                                                "Contiguous"};
        const char *beh = kvs_json_string(kvs_json_get(v, "behavior"));
        step.behavior = -1;
        for (int k = 0; beh && k < 5; k++)
            if (strcmp(beh, behaviors[k]) == 0) step.behavior = k;
        if (step.behavior < 0)
            return kvs_fail(KVS_ERR_UNSUPPORTED, "%s: pre_tokenizer Split.behavior \"%s\" is not supported "
                            "(Isolated, Removed, MergedWithPrevious, MergedWithNext, Contiguous are)", path,
                            beh ? beh : "(missing)");
        if ((st = get_bool(path, "pre_tokenizer Split", v, "invert", &step.invert)) != KVS_OK) return st;
        const char *re;
        size_t re_len;
        int is_regex;
        if ((st = get_pattern(path, "pre_tokenizer Split", v, 1, &re, &re_len, &is_regex)) != KVS_OK) return st;
        step.regex = KVS_TOK_RE_NONE;
        if (is_regex && strcmp(re, RE_GPT2) == 0) step.regex = KVS_TOK_RE_GPT2;
        else if (is_regex && strcmp(re, RE_LLAMA3) == 0) step.regex = KVS_TOK_RE_LLAMA3;
        else if (is_regex && strcmp(re, RE_QWEN2) == 0) step.regex = KVS_TOK_RE_QWEN2;
        if ((st = compile_pattern(path, is_regex ? "pre_tokenizer Split.pattern.Regex" :
                                  "pre_tokenizer Split.pattern.String", re, re_len, is_regex, &step.rx)) != KVS_OK)
            return st;
    } else {
        return kvs_fail(KVS_ERR_UNSUPPORTED, "%s: pre_tokenizer.type \"%s\" is not supported "
                        "(Sequence, Metaspace, ByteLevel, Split are)", path, type);
    }
    kvs_tok_pre_step *p = realloc(t->pre, (t->n_pre + 1) * sizeof *p);
    if (!p) {
        kvs_tok_rx_free(step.rx);
        return kvs_fail(KVS_ERR_NOMEM, "tokenizer: out of memory");
    }
    t->pre = p;
    t->pre[t->n_pre++] = step;
    return KVS_OK;
}

static kvs_status add_dec(const char *path, kvs_tokenizer *t, const kvs_json *v) {
    const char *type = type_of_step(v);
    kvs_status st;
    if (strcmp(type, "Sequence") == 0) {
        const kvs_json *list = kvs_json_get(v, "decoders");
        if (kvs_json_type_of(list) != KVS_JSON_ARRAY)
            return kvs_fail(KVS_ERR_FORMAT, "%s: decoder Sequence has no decoders array", path);
        for (size_t i = 0; i < kvs_json_len(list); i++)
            if ((st = add_dec(path, t, kvs_json_at(list, i))) != KVS_OK) return st;
        return KVS_OK;
    }
    kvs_tok_dec_step step = {0};
    const char *a = NULL, *b = NULL;
    size_t a_len = 0, b_len = 0;
    if (strcmp(type, "Replace") == 0) {
        step.kind = KVS_TOK_DEC_REPLACE;
        if ((st = get_string_pattern(path, "decoder Replace", v, &a, &a_len)) != KVS_OK) return st;
        if ((st = get_string(path, "decoder Replace", v, "content", &b, &b_len)) != KVS_OK) return st;
        if (a_len == 0) return kvs_fail(KVS_ERR_FORMAT, "%s: decoder Replace has an empty pattern", path);
    } else if (strcmp(type, "ByteFallback") == 0) {
        step.kind = KVS_TOK_DEC_BYTEFALLBACK;
    } else if (strcmp(type, "Fuse") == 0) {
        step.kind = KVS_TOK_DEC_FUSE;
    } else if (strcmp(type, "Strip") == 0) {
        step.kind = KVS_TOK_DEC_STRIP;
        if ((st = get_char(path, "decoder Strip", v, "content", step.strip, &step.strip_len)) != KVS_OK) return st;
        const kvs_json *s0 = kvs_json_get(v, "start"), *s1 = kvs_json_get(v, "stop");
        if (kvs_json_type_of(s0) != KVS_JSON_NUMBER || kvs_json_type_of(s1) != KVS_JSON_NUMBER ||
            kvs_json_number(s0) < 0 || kvs_json_number(s1) < 0 || kvs_json_number(s0) > 1e6 ||
            kvs_json_number(s1) > 1e6)
            return kvs_fail(KVS_ERR_FORMAT, "%s: decoder Strip.start/stop missing or out of range", path);
        step.start = (int)kvs_json_number(s0);
        step.stop = (int)kvs_json_number(s1);
    } else if (strcmp(type, "Metaspace") == 0) {
        step.kind = KVS_TOK_DEC_METASPACE;
        if ((st = get_char(path, "decoder Metaspace", v, "replacement", step.strip, &step.strip_len)) != KVS_OK)
            return st;
        if ((st = get_prepend_scheme(path, "decoder Metaspace", v, &step.prepend)) != KVS_OK) return st;
    } else if (strcmp(type, "ByteLevel") == 0) {
        step.kind = KVS_TOK_DEC_BYTELEVEL;
    } else {
        return kvs_fail(KVS_ERR_UNSUPPORTED, "%s: decoder.type \"%s\" is not supported (Sequence, Replace, "
                        "ByteFallback, Fuse, Strip, Metaspace, ByteLevel are)", path, type);
    }
    kvs_tok_dec_step *p = realloc(t->dec, (t->n_dec + 1) * sizeof *p);
    if (!p) return kvs_fail(KVS_ERR_NOMEM, "tokenizer: out of memory");
    t->dec = p;
    step.a = a ? dup_bytes(a, a_len) : NULL;
    step.b = b ? dup_bytes(b, b_len) : NULL;
    step.a_len = a_len;
    step.b_len = b_len;
    t->dec[t->n_dec++] = step;
    if ((a && !step.a) || (b && !step.b)) return kvs_fail(KVS_ERR_NOMEM, "tokenizer: out of memory");
    return KVS_OK;
}

/* Ids must be integers in [0, 2^24): larger values would be implausible and make the id arrays huge. */
static kvs_status get_id(const char *path, const char *what, const kvs_json *v, int32_t *id) {
    if (kvs_json_type_of(v) != KVS_JSON_NUMBER)
        return kvs_fail(KVS_ERR_FORMAT, "%s: %s: id is missing or not a number", path, what);
    double d = kvs_json_number(v);
    if (!(d >= 0 && d < 16777216.0) || d != (double)(int32_t)d)
        return kvs_fail(KVS_ERR_RANGE, "%s: %s: id %g is not an integer in [0, 2^24)", path, what, d);
    *id = (int32_t)d;
    return KVS_OK;
}

/* id of the token string s: added tokens first (as `tokenizers` token_to_id does), then the vocabulary. */
static int32_t token_id(const kvs_tokenizer *t, const char *s, size_t n) {
    for (size_t i = 0; i < t->n_added; i++)
        if (t->added[i].len == n && memcmp(t->added[i].content, s, n) == 0) return t->added[i].id;
    return kvs_tok_lookup2(t, s, n, NULL, 0);
}

/* bos_token / eos_token in tokenizer_config.json: a string, {"content": ...} or null. */
static const char *config_token(const kvs_json *cfg, const char *key) {
    const kvs_json *v = kvs_json_get(cfg, key);
    if (kvs_json_type_of(v) == KVS_JSON_OBJECT) v = kvs_json_get(v, "content");
    return kvs_json_string(v);
}

/* BOS from the post_processor: the first item of a TemplateProcessing "single" template when it is a
 * SpecialToken (Llama 3: <|begin_of_text|> $A). */
static const char *template_bos(const kvs_json *pp) {
    if (!pp) return NULL;
    if (strcmp(type_of_step(pp), "Sequence") == 0) {
        const kvs_json *list = kvs_json_get(pp, "processors");
        for (size_t i = 0; i < kvs_json_len(list); i++) {
            const char *s = template_bos(kvs_json_at(list, i));
            if (s) return s;
        }
        return NULL;
    }
    if (strcmp(type_of_step(pp), "TemplateProcessing") != 0) return NULL;
    const kvs_json *first = kvs_json_at(kvs_json_get(pp, "single"), 0);
    return kvs_json_string(kvs_json_get(kvs_json_get(first, "SpecialToken"), "id"));
}

static kvs_status load_config(const char *json_path, kvs_tokenizer *t, const kvs_json *root) {
    /* tokenizer_config.json in the same directory */
    const char *slash = strrchr(json_path, '/');
    size_t dir_len = slash ? (size_t)(slash - json_path) + 1 : 0;
    static const char name[] = "tokenizer_config.json";
    char *cfg_path = malloc(dir_len + sizeof name);
    if (!cfg_path) return kvs_fail(KVS_ERR_NOMEM, "tokenizer: out of memory");
    memcpy(cfg_path, json_path, dir_len);
    memcpy(cfg_path + dir_len, name, sizeof name);
    kvs_json *cfg = NULL;
    char *text = NULL;
    size_t len = 0;
    kvs_status st = KVS_OK;
    FILE *probe = fopen(cfg_path, "rb");
    if (probe) {
        fclose(probe);
        KVS_TRY(st = kvs_read_file(cfg_path, &text, &len));
        if ((st = kvs_json_parse(text, len, &cfg)) != KVS_OK) {
            st = kvs_fail(st, "%s: %s", cfg_path, kvs_last_error());
            goto cleanup;
        }
    }
    const char *tmpl = template_bos(kvs_json_get(root, "post_processor"));
    const char *bos = cfg ? config_token(cfg, "bos_token") : NULL;
    const char *eos = cfg ? config_token(cfg, "eos_token") : NULL;
    if (!bos && !(cfg && kvs_json_get(cfg, "bos_token"))) bos = tmpl;
    t->bos = bos ? token_id(t, bos, strlen(bos)) : -1;
    t->eos = eos ? token_id(t, eos, strlen(eos)) : -1;
    if (bos && t->bos < 0) {
        st = kvs_fail(KVS_ERR_FORMAT, "%s: bos_token \"%s\" is not a token", cfg ? cfg_path : json_path, bos);
        goto cleanup;
    }
    if (eos && t->eos < 0) {
        st = kvs_fail(KVS_ERR_FORMAT, "%s: eos_token \"%s\" is not a token", cfg_path, eos);
        goto cleanup;
    }
    t->add_bos = tmpl != NULL;
    if (cfg) {
        int add = t->add_bos;
        KVS_TRY(st = get_bool(cfg_path, "config", cfg, "add_bos_token", &add));
        t->add_bos = add;
    }
    if (t->bos >= 0) t->skip[t->bos] = 1;
    if (t->eos >= 0) t->skip[t->eos] = 1;
cleanup:
    kvs_json_free(cfg);
    free(text);
    free(cfg_path);
    return st;
}

static kvs_status load_model(const char *path, kvs_tokenizer *t, const kvs_json *root) {
    const kvs_json *model = kvs_json_get(root, "model");
    if (kvs_json_type_of(model) != KVS_JSON_OBJECT)
        return kvs_fail(KVS_ERR_FORMAT, "%s: \"model\" is missing or not an object", path);
    const char *type = kvs_json_string(kvs_json_get(model, "type"));
    if (type && strcmp(type, "BPE") != 0)
        return kvs_fail(KVS_ERR_UNSUPPORTED, "%s: model.type \"%s\" is not supported (BPE is)", path, type);
    const kvs_json *vocab = kvs_json_get(model, "vocab");
    const kvs_json *merges = kvs_json_get(model, "merges");
    if (kvs_json_type_of(vocab) != KVS_JSON_OBJECT)
        return kvs_fail(KVS_ERR_FORMAT, "%s: model.vocab is missing or not an object", path);
    if (merges && kvs_json_type_of(merges) != KVS_JSON_ARRAY)
        return kvs_fail(KVS_ERR_FORMAT, "%s: model.merges is not an array", path);
    const kvs_json *v;
    if ((v = kvs_json_get(model, "dropout")) && kvs_json_type_of(v) != KVS_JSON_NULL && kvs_json_number(v) != 0)
        return kvs_fail(KVS_ERR_UNSUPPORTED, "%s: model.dropout %g is not supported (encoding must be "
                        "deterministic)", path, kvs_json_number(v));
    static const char *const affixes[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        const char *s = kvs_json_string(kvs_json_get(model, affixes[i]));
        if (s && s[0]) return kvs_fail(KVS_ERR_UNSUPPORTED, "%s: model.%s \"%s\" is not supported", path, affixes[i], s);
    }
    kvs_status st;
    t->fuse_unk = 0;
    if ((st = get_bool(path, "model", model, "byte_fallback", &t->byte_fallback)) != KVS_OK) return st;
    if ((st = get_bool(path, "model", model, "fuse_unk", &t->fuse_unk)) != KVS_OK) return st;
    if ((st = get_bool(path, "model", model, "ignore_merges", &t->ignore_merges)) != KVS_OK) return st;

    /* added tokens */
    const kvs_json *added = kvs_json_get(root, "added_tokens");
    if (added && kvs_json_type_of(added) != KVS_JSON_ARRAY && kvs_json_type_of(added) != KVS_JSON_NULL)
        return kvs_fail(KVS_ERR_FORMAT, "%s: added_tokens is not an array", path);
    size_t n_added = kvs_json_len(added);
    if (n_added) {
        t->added = calloc(n_added, sizeof *t->added);
        if (!t->added) return kvs_fail(KVS_ERR_NOMEM, "tokenizer: out of memory");
    }
    int32_t max_id = -1;
    for (size_t i = 0; i < n_added; i++) {
        const kvs_json *a = kvs_json_at(added, i);
        kvs_tok_added *ad = &t->added[t->n_added];
        const char *c;
        size_t n;
        char where[64];
        snprintf(where, sizeof where, "added_tokens[%zu]", i);
        if ((st = get_id(path, where, kvs_json_get(a, "id"), &ad->id)) != KVS_OK) return st;
        if ((st = get_string(path, where, a, "content", &c, &n)) != KVS_OK) return st;
        if (n == 0) return kvs_fail(KVS_ERR_FORMAT, "%s: %s has empty content", path, where);
        int single = 0;
        if ((st = get_bool(path, where, a, "special", &ad->special)) != KVS_OK) return st;
        if ((st = get_bool(path, where, a, "normalized", &ad->normalized)) != KVS_OK) return st;
        if ((st = get_bool(path, where, a, "lstrip", &ad->lstrip)) != KVS_OK) return st;
        if ((st = get_bool(path, where, a, "rstrip", &ad->rstrip)) != KVS_OK) return st;
        if ((st = get_bool(path, where, a, "single_word", &single)) != KVS_OK) return st;
        if (single) return kvs_fail(KVS_ERR_UNSUPPORTED, "%s: %s.single_word true is not supported", path, where);
        ad->content = dup_bytes(c, n);
        if (!ad->content) return kvs_fail(KVS_ERR_NOMEM, "tokenizer: out of memory");
        ad->len = n;
        t->n_added++;
        if (ad->id > max_id) max_id = ad->id;
    }
    size_t nv = kvs_json_len(vocab);
    for (size_t i = 0; i < nv; i++) {
        int32_t id;
        if ((st = get_id(path, "model.vocab", kvs_json_at(vocab, i), &id)) != KVS_OK) return st;
        if (id > max_id) max_id = id;
    }
    if (max_id < 0) return kvs_fail(KVS_ERR_FORMAT, "%s: model.vocab is empty", path);
    if ((st = kvs_tok_alloc_vocab(t, max_id + 1)) != KVS_OK) return st;
    uint8_t *in_model = calloc((size_t)max_id + 1, 1);
    if (!in_model) return kvs_fail(KVS_ERR_NOMEM, "tokenizer: out of memory");
    for (size_t i = 0; i < nv; i++) {
        int32_t id;
        get_id(path, "model.vocab", kvs_json_at(vocab, i), &id); /* checked above */
        const char *key = kvs_json_key_at(vocab, i);
        if (t->pieces[id]) {
            free(in_model);
            return kvs_fail(KVS_ERR_FORMAT, "%s: model.vocab gives id %d to both \"%s\" and \"%s\"", path, (int)id,
                            t->pieces[id], key);
        }
        size_t n = strlen(key);
        t->pieces[id] = dup_bytes(key, n);
        if (!t->pieces[id]) { free(in_model); return kvs_fail(KVS_ERR_NOMEM, "tokenizer: out of memory"); }
        t->piece_len[id] = (uint32_t)n;
        in_model[id] = 1;
    }
    for (size_t i = 0; i < t->n_added; i++) {
        kvs_tok_added *ad = &t->added[i];
        if (t->pieces[ad->id]) {
            if (t->piece_len[ad->id] != ad->len || memcmp(t->pieces[ad->id], ad->content, ad->len) != 0) {
                free(in_model);
                return kvs_fail(KVS_ERR_UNSUPPORTED, "%s: added token \"%s\" reuses id %d of vocabulary entry \"%s\"",
                                path, ad->content, (int)ad->id, t->pieces[ad->id]);
            }
        } else {
            t->pieces[ad->id] = dup_bytes(ad->content, ad->len);
            if (!t->pieces[ad->id]) { free(in_model); return kvs_fail(KVS_ERR_NOMEM, "tokenizer: out of memory"); }
            t->piece_len[ad->id] = (uint32_t)ad->len;
        }
        if (ad->special) t->skip[ad->id] = 1;
        /* normalized tokens go into their trie once the normalizer is known (add_normalized_tokens) */
        if (!ad->normalized && (st = trie_add(&t->added_trie[0], ad->content, ad->len, (int32_t)i)) != KVS_OK) {
            free(in_model);
            return st;
        }
    }
    st = kvs_tok_build_map(t, in_model);
    free(in_model);
    if (st != KVS_OK) return st;

    t->unk = -1;
    const char *unk = kvs_json_string(kvs_json_get(model, "unk_token"));
    if (unk) {
        t->unk = kvs_tok_lookup2(t, unk, strlen(unk), NULL, 0);
        if (t->unk < 0) return kvs_fail(KVS_ERR_FORMAT, "%s: model.unk_token \"%s\" is not in model.vocab", path, unk);
    }

    size_t nm = kvs_json_len(merges);
    if ((st = kvs_tok_pairmap_init(&t->merges, nm)) != KVS_OK) return st;
    for (size_t i = 0; i < nm; i++) {
        const kvs_json *m = kvs_json_at(merges, i);
        const char *a, *b;
        size_t a_len, b_len;
        if (kvs_json_type_of(m) == KVS_JSON_STRING) {
            /* "a b": exactly one space separates the two parts (tokenizers rejects anything else) */
            a = kvs_json_string(m);
            const char *sp = memchr(a, ' ', kvs_json_string_len(m));
            if (!sp || memchr(sp + 1, ' ', kvs_json_string_len(m) - (size_t)(sp + 1 - a)))
                return kvs_fail(KVS_ERR_FORMAT, "%s: model.merges[%zu] \"%s\" is not two tokens separated by one space",
                                path, i, a);
            a_len = (size_t)(sp - a);
            b = sp + 1;
            b_len = kvs_json_string_len(m) - a_len - 1;
        } else if (kvs_json_type_of(m) == KVS_JSON_ARRAY && kvs_json_len(m) == 2 &&
                   kvs_json_type_of(kvs_json_at(m, 0)) == KVS_JSON_STRING &&
                   kvs_json_type_of(kvs_json_at(m, 1)) == KVS_JSON_STRING) {
            a = kvs_json_string(kvs_json_at(m, 0));
            a_len = kvs_json_string_len(kvs_json_at(m, 0));
            b = kvs_json_string(kvs_json_at(m, 1));
            b_len = kvs_json_string_len(kvs_json_at(m, 1));
        } else {
            return kvs_fail(KVS_ERR_FORMAT, "%s: model.merges[%zu] is neither \"a b\" nor [\"a\", \"b\"]", path, i);
        }
        int32_t ia = kvs_tok_lookup2(t, a, a_len, NULL, 0), ib = kvs_tok_lookup2(t, b, b_len, NULL, 0);
        int32_t inew = kvs_tok_lookup2(t, a, a_len, b, b_len);
        if (ia < 0 || ib < 0 || inew < 0)
            return kvs_fail(KVS_ERR_FORMAT, "%s: model.merges[%zu] (\"%.*s\", \"%.*s\"): %s not in model.vocab", path, i,
                            (int)a_len, a, (int)b_len, b, ia < 0 ? "first token" : ib < 0 ? "second token" : "merged token");
        kvs_tok_pairmap_put(&t->merges, ia, ib, (int32_t)i, inew);
    }
    return KVS_OK;
}

/* The most a chain of Replace steps may multiply a text's length by. Real tokenizers stay near 3 (Llama's " " ->
 * U+2581, 1 -> 3 bytes); a chain of k steps "a" -> "aa" doubles the text k times, so 34 such steps in a 2 KB
 * tokenizer.json asked encode for 2^34 times its input. */
#define KVS_TOK_MAX_GROWTH 1024.0

/* Refuses a normalizer or decoder chain whose Replace steps can grow a text more than KVS_TOK_MAX_GROWTH-fold:
 * a step replacing pattern a by b turns every a_len bytes into at most max(a_len, b_len), and the steps run one
 * after another on the whole text, so the worst case is the product (Prepend adds a constant, the other steps
 * never lengthen a text). Checked once at load, before any text is encoded or decoded. */
static kvs_status check_growth(const char *path, const char *what, size_t n, const size_t *a_len,
                               const size_t *b_len) {
    double growth = 1.0;
    for (size_t i = 0; i < n; i++) {
        if (a_len[i] == 0 || b_len[i] <= a_len[i]) continue;
        growth *= (double)b_len[i] / (double)a_len[i];
        if (growth > KVS_TOK_MAX_GROWTH)
            return kvs_fail(KVS_ERR_FORMAT, "%s: the %s Replace steps can grow a text more than %.0f-fold (%zu steps "
                            "reach %.4g at step %zu): refused", path, what, KVS_TOK_MAX_GROWTH, n, growth, i + 1);
    }
    return KVS_OK;
}

/* The Replace steps of the normalizer and of the decoder, each chain checked by check_growth. */
static kvs_status check_replace_growth(const char *path, const kvs_tokenizer *t) {
    size_t n = t->n_norm > t->n_dec ? t->n_norm : t->n_dec;
    size_t *a = calloc(n + 1, sizeof *a), *b = calloc(n + 1, sizeof *b);
    kvs_status st = KVS_OK;
    if (!a || !b) {
        st = kvs_fail(KVS_ERR_NOMEM, "tokenizer: out of memory");
        goto cleanup;
    }
    for (size_t i = 0; i < t->n_norm; i++)
        if (t->norm[i].kind == KVS_TOK_NORM_REPLACE && t->norm[i].rx) a[i] = 1, b[i] = t->norm[i].b_len + 1;
        /* a regex may match one character or even the empty string before each one: content per byte, plus it */
        else if (t->norm[i].kind == KVS_TOK_NORM_REPLACE) a[i] = t->norm[i].a_len, b[i] = t->norm[i].b_len;
        else a[i] = b[i] = 0;
    KVS_TRY(st = check_growth(path, "normalizer", t->n_norm, a, b));
    for (size_t i = 0; i < t->n_dec; i++)
        if (t->dec[i].kind == KVS_TOK_DEC_REPLACE) a[i] = t->dec[i].a_len, b[i] = t->dec[i].b_len;
        else a[i] = b[i] = 0;
    KVS_TRY(st = check_growth(path, "decoder", t->n_dec, a, b));
cleanup:
    free(a);
    free(b);
    return st;
}

static kvs_status normalize(const kvs_tokenizer *t, const char *s, size_t n, kvs_tok_buf *out);

/* The added tokens marked "normalized": true are found in the NORMALIZED text, by their normalized content, as the
 * Rust library's AddedVocabulary does (it runs the normalizer over each such token's content when it builds its
 * matcher): with a Prepend("▁") normalizer "<|x|>" is matched as "▁<|x|>", so a text starting with it gives the
 * token alone and the same string after a word is not a match. */
static kvs_status add_normalized_tokens(kvs_tokenizer *t) {
    for (size_t i = 0; i < t->n_added; i++) {
        const kvs_tok_added *ad = &t->added[i];
        if (!ad->normalized || ad->len == 0) continue;
        kvs_tok_buf norm = {0}; /* normalize() hands back a buffer of its own */
        kvs_status st = normalize(t, ad->content, ad->len, &norm);
        if (st == KVS_OK && norm.len > 0) st = trie_add(&t->added_trie[1], norm.p, norm.len, (int32_t)i);
        kvs_tok_buf_free(&norm);
        if (st != KVS_OK) return st;
    }
    return KVS_OK;
}

kvs_status kvs_tokenizer_load_hf(const char *path, kvs_tokenizer **out) {
    if (!path || !out) return kvs_fail(KVS_ERR_INVALID_ARG, "tokenizer: NULL path or out");
    *out = NULL;
    char *text = NULL;
    size_t len = 0;
    kvs_json *root = NULL;
    kvs_tokenizer *t = NULL;
    kvs_status st = kvs_read_file(path, &text, &len);
    if (st != KVS_OK) return st;
    if ((st = kvs_json_parse(text, len, &root)) != KVS_OK) {
        st = kvs_fail(st, "%s: %s", path, kvs_last_error());
        goto cleanup;
    }
    if (kvs_json_type_of(root) != KVS_JSON_OBJECT) {
        st = kvs_fail(KVS_ERR_FORMAT, "%s: top level is not a JSON object", path);
        goto cleanup;
    }
    t = calloc(1, sizeof *t);
    if (!t) { st = kvs_fail(KVS_ERR_NOMEM, "tokenizer: out of memory"); goto cleanup; }
    t->family = KVS_TOK_HF;
    t->bos = t->eos = t->unk = -1;
    KVS_TRY(st = load_model(path, t, root));
    const kvs_json *v;
    if ((v = kvs_json_get(root, "normalizer")) && kvs_json_type_of(v) != KVS_JSON_NULL)
        KVS_TRY(st = add_norm(path, t, v));
    if ((v = kvs_json_get(root, "pre_tokenizer")) && kvs_json_type_of(v) != KVS_JSON_NULL)
        KVS_TRY(st = add_pre(path, t, v));
    if ((v = kvs_json_get(root, "decoder")) && kvs_json_type_of(v) != KVS_JSON_NULL)
        KVS_TRY(st = add_dec(path, t, v));
    KVS_TRY(st = check_replace_growth(path, t));
    KVS_TRY(st = add_normalized_tokens(t));
    KVS_TRY(st = load_config(path, t, root));
    *out = t;
    t = NULL;
cleanup:
    kvs_tokenizer_free(t);
    kvs_json_free(root);
    free(text);
    return st;
}

/* ============================== encoding ============================== */

static kvs_status replace_all(const char *s, size_t n, const char *pat, size_t pat_len, const char *rep,
                              size_t rep_len, kvs_tok_buf *out) {
    size_t i = 0, from = 0;
    kvs_status st;
    while (i + pat_len <= n) {
        if (memcmp(s + i, pat, pat_len) == 0) {
            if ((st = kvs_tok_buf_add(out, s + from, i - from)) != KVS_OK) return st;
            if ((st = kvs_tok_buf_add(out, rep, rep_len)) != KVS_OK) return st;
            i += pat_len;
            from = i;
        } else {
            i++;
        }
    }
    return kvs_tok_buf_add(out, s + from, n - from);
}

/* The tokenizer.json "NFC" normalizer: Normalization Form C of the UTF-8 text s[0..n) (validated by the
 * caller) appended to out. Text below U+0300 is already NFC (no combining class or composition involves it),
 * so ASCII and Latin-1 pass through with one scan. */
static kvs_status nfc_utf8(const char *s, size_t n, kvs_tok_buf *out) {
    size_t i = 0;
    while (i < n && (uint8_t)s[i] < 0xCC) i++; /* lead bytes below 0xCC encode code points below U+0300 */
    if (i == n) return kvs_tok_buf_add(out, s, n);
    uint32_t *cps = malloc((n + 1) * sizeof *cps), *norm = NULL;
    if (!cps) return kvs_fail(KVS_ERR_NOMEM, "tokenizer: out of memory");
    size_t m = 0, nn = 0;
    for (i = 0; i < n;) {
        size_t cl = kvs_tok_utf8_next(s + i, n - i, &cps[m]);
        if (cl == 0) { cps[m] = (uint8_t)s[i]; cl = 1; } /* cannot happen: text was validated */
        m++;
        i += cl;
    }
    kvs_status st = kvs_uni_nfc(cps, m, &norm, &nn);
    free(cps);
    char u[4];
    for (size_t k = 0; st == KVS_OK && k < nn; k++) st = kvs_tok_buf_add(out, u, kvs_tok_utf8_put(norm[k], u));
    free(norm);
    return st;
}

/* Every match of rx (the library's find_iter: an empty match right after a match is skipped) replaced by rep. */
static kvs_status replace_regex(const kvs_tok_rx *rx, const char *s, size_t n, const char *rep, size_t rep_len,
                                kvs_tok_buf *out) {
    kvs_tok_pre_step ps = {.kind = KVS_TOK_PRE_SPLIT, .regex = KVS_TOK_RE_NONE, .rx = (kvs_tok_rx *)rx,
                           .behavior = KVS_TOK_SPLIT_ISOLATED};
    kvs_tok_piece *pc = NULL;
    size_t np = 0;
    kvs_status st = kvs_tok_split_pieces(&ps, s, n, 0, &pc, &np);
    if (st == KVS_OK) st = kvs_tok_buf_add(out, "", 0);
    for (size_t i = 0; st == KVS_OK && i < np; i++)
        st = pc[i].match ? kvs_tok_buf_add(out, rep, rep_len) : kvs_tok_buf_add(out, s + pc[i].start,
                                                                                pc[i].end - pc[i].start);
    free(pc);
    return st;
}

static kvs_status normalize(const kvs_tokenizer *t, const char *s, size_t n, kvs_tok_buf *out) {
    kvs_tok_buf cur = {0}, nxt = {0};
    kvs_status st;
    KVS_TRY(st = kvs_tok_buf_add(&cur, s, n));
    for (size_t k = 0; k < t->n_norm; k++) {
        const kvs_tok_norm_step *ns = &t->norm[k];
        nxt.len = 0;
        if (ns->kind == KVS_TOK_NORM_PREPEND) {
            if (cur.len == 0) continue; /* Prepend leaves empty strings alone */
            KVS_TRY(st = kvs_tok_buf_add(&nxt, ns->a, ns->a_len));
            KVS_TRY(st = kvs_tok_buf_add(&nxt, cur.p, cur.len));
        } else if (ns->kind == KVS_TOK_NORM_REPLACE && ns->rx) {
            KVS_TRY(st = replace_regex(ns->rx, cur.p, cur.len, ns->b, ns->b_len, &nxt));
        } else if (ns->kind == KVS_TOK_NORM_REPLACE) {
            KVS_TRY(st = replace_all(cur.p, cur.len, ns->a, ns->a_len, ns->b, ns->b_len, &nxt));
        } else {
            KVS_TRY(st = nfc_utf8(cur.p, cur.len, &nxt));
        }
        kvs_tok_buf tmp = cur;
        cur = nxt;
        nxt = tmp;
    }
    kvs_tok_buf_free(&nxt);
    *out = cur;
    return KVS_OK;
cleanup:
    kvs_tok_buf_free(&cur);
    kvs_tok_buf_free(&nxt);
    return st;
}

static int hf_pair(const kvs_tokenizer *t, int32_t a, int32_t b, double *prio, int32_t *new_id) {
    int32_t rank;
    if (!kvs_tok_pairmap_get(&t->merges, a, b, &rank, new_id)) return 0;
    *prio = (double)rank;
    return 1;
}

/* models/bpe/model.rs merge_word: one symbol per character (or its <0xNN> bytes, or <unk>, fused runs
 * of <unk> when fuse_unk), then merges by rank. */
static kvs_status bpe_word(const kvs_tokenizer *t, const char *w, size_t n, kvs_tok_out *o) {
    if (t->ignore_merges) {
        int32_t id = kvs_tok_lookup2(t, w, n, NULL, 0);
        if (id >= 0) { kvs_tok_out_push(o, id); return KVS_OK; }
    }
    int32_t *sym = malloc((n + 1) * sizeof *sym);
    if (!sym) return kvs_fail(KVS_ERR_NOMEM, "tokenizer: out of memory");
    size_t ns = 0;
    int unk_pending = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t cl = kvs_tok_utf8_next(w + i, n - i, &cp);
        if (cl == 0) cl = 1; /* cannot happen: text was validated */
        int32_t id = kvs_tok_lookup2(t, w + i, cl, NULL, 0);
        int bytes_ok = t->byte_fallback;
        for (size_t k = 0; bytes_ok && k < cl; k++) bytes_ok = t->byte_id[(uint8_t)w[i + k]] >= 0;
        if (id >= 0 || bytes_ok) {
            if (unk_pending) { sym[ns++] = t->unk; unk_pending = 0; }
            if (id >= 0) sym[ns++] = id;
            else
                for (size_t k = 0; k < cl; k++) sym[ns++] = t->byte_id[(uint8_t)w[i + k]];
        } else if (t->unk >= 0) {
            if (unk_pending && !t->fuse_unk) sym[ns++] = t->unk;
            unk_pending = 1;
        } else {
            free(sym);
            return kvs_fail(KVS_ERR_INVALID_ARG, "tokenizer: character U+%04X is not in the vocabulary and the "
                            "tokenizer has neither byte_fallback tokens nor an unk_token", (unsigned)cp);
        }
        i += cl;
    }
    if (unk_pending) sym[ns++] = t->unk;
    kvs_status st = kvs_tok_bpe(t, sym, &ns, hf_pair);
    if (st == KVS_OK)
        for (size_t i = 0; i < ns; i++) kvs_tok_out_push(o, sym[i]);
    free(sym);
    return st;
}

/* Applies one pre-tokenizer step to every word of `in`, producing `out`. */
static kvs_status pre_step(const kvs_tok_pre_step *ps, const kvs_tok_words *in, int is_first, int use_scanner,
                           kvs_tok_words *out) {
    kvs_status st = KVS_OK;
    kvs_tok_buf tmp = {0};
    uint32_t cp_of[256];
    if (ps->kind == KVS_TOK_PRE_BYTELEVEL) gpt2_byte_map(cp_of);
    for (size_t wi = 0; wi < in->n; wi++) {
        const char *w = in->text.p + in->off[wi];
        size_t n = in->len[wi];
        tmp.len = 0;
        if (ps->kind == KVS_TOK_PRE_METASPACE) {
            int prepend = ps->prepend == KVS_TOK_PREPEND_ALWAYS ||
                          (ps->prepend == KVS_TOK_PREPEND_FIRST && is_first && wi == 0);
            if (prepend && !(n >= ps->repl_len && memcmp(w, ps->repl, ps->repl_len) == 0))
                KVS_TRY(st = kvs_tok_buf_add(&tmp, ps->repl, ps->repl_len));
            KVS_TRY(st = replace_all(w, n, " ", 1, ps->repl, ps->repl_len, &tmp));
            if (!ps->split) {
                KVS_TRY(st = kvs_tok_words_add(out, tmp.p, tmp.len));
                continue;
            }
            /* MergedWithNext: each word starts at a replacement character */
            size_t from = 0;
            for (size_t i = 1; i + ps->repl_len <= tmp.len; i++)
                if (memcmp(tmp.p + i, ps->repl, ps->repl_len) == 0) {
                    KVS_TRY(st = kvs_tok_words_add(out, tmp.p + from, i - from));
                    from = i;
                }
            KVS_TRY(st = kvs_tok_words_add(out, tmp.p + from, tmp.len - from));
        } else if (ps->kind == KVS_TOK_PRE_SPLIT) {
            kvs_tok_piece *pc = NULL;
            size_t np = 0;
            KVS_TRY(st = kvs_tok_split_pieces(ps, w, n, use_scanner, &pc, &np));
            for (size_t i = 0; st == KVS_OK && i < np; i++)
                st = kvs_tok_words_add(out, w + pc[i].start, pc[i].end - pc[i].start);
            free(pc);
            KVS_TRY(st);
        } else { /* BYTELEVEL */
            if (ps->add_prefix_space && !(n > 0 && w[0] == ' ')) KVS_TRY(st = kvs_tok_buf_add(&tmp, " ", 1));
            KVS_TRY(st = kvs_tok_buf_add(&tmp, w, n));
            size_t pos = 0;
            while (pos < tmp.len) {
                size_t m = ps->use_regex ? kvs_tok_pretok_match(KVS_TOK_RE_GPT2, tmp.p, tmp.len, pos) : tmp.len - pos;
                if (m == 0) m = 1;
                /* map every byte to its GPT-2 character */
                char enc[4 * 64];
                size_t el = 0;
                size_t word_start = out->text.len;
                int first_chunk = 1;
                for (size_t i = pos; i < pos + m; i++) {
                    el += kvs_tok_utf8_put(cp_of[(uint8_t)tmp.p[i]], enc + el);
                    if (el + 4 > sizeof enc || i + 1 == pos + m) {
                        /* long words are appended in chunks and joined into one word below */
                        if (first_chunk) {
                            KVS_TRY(st = kvs_tok_words_add(out, enc, el));
                            first_chunk = 0;
                        } else {
                            KVS_TRY(st = kvs_tok_buf_add(&out->text, enc, el));
                            out->len[out->n - 1] = out->text.len - word_start;
                        }
                        el = 0;
                    }
                }
                pos += m;
            }
        }
    }
cleanup:
    kvs_tok_buf_free(&tmp);
    return st;
}

/* Pre-tokenizes a normalized segment and runs BPE on each word. */
static kvs_status encode_segment(const kvs_tokenizer *t, const char *s, size_t n, int is_first, kvs_tok_out *o) {
    kvs_tok_words a = {0}, b = {0};
    kvs_status st;
    KVS_TRY(st = kvs_tok_words_add(&a, s, n));
    for (size_t k = 0; k < t->n_pre; k++) {
        kvs_tok_words_free(&b);
        KVS_TRY(st = pre_step(&t->pre[k], &a, is_first, !t->no_scanner, &b));
        kvs_tok_words tmp = a;
        a = b;
        b = tmp;
    }
    for (size_t i = 0; i < a.n; i++)
        KVS_TRY(st = o->pieces ? kvs_tok_words_add(o->pieces, a.text.p + a.off[i], a.len[i])
                               : bpe_word(t, a.text.p + a.off[i], a.len[i], o));
cleanup:
    kvs_tok_words_free(&a);
    kvs_tok_words_free(&b);
    return st;
}

/* Leftmost-longest match of an added token with the given `normalized` flag in s[from..n): start/end of
 * the match (whitespace absorbed for lstrip/rstrip) and its index; 0 when there is none. Walks the added tokens'
 * trie from each position (the longest token ending on the path; among equal contents the first in the file). */
static int find_added(const kvs_tokenizer *t, int normalized, const char *s, size_t n, size_t from,
                      size_t *m_start, size_t *m_end, size_t *which) {
    const kvs_tok_trie *tr = &t->added_trie[normalized ? 1 : 0];
    if (tr->n < 2) return 0;
    for (size_t pos = from; pos < n; pos++) {
        size_t best_len = 0, best = 0;
        int32_t node = 0;
        for (size_t j = pos; j < n; j++) {
            int32_t c = tr->nodes[node].child;
            while (c >= 0 && tr->nodes[c].byte != (uint8_t)s[j]) c = tr->nodes[c].sibling;
            if (c < 0) break;
            node = c;
            if (tr->nodes[node].token >= 0) {
                best_len = j - pos + 1;
                best = (size_t)tr->nodes[node].token;
            }
        }
        if (best_len == 0) continue;
        size_t st = pos, en = pos + best_len;
        uint32_t cp;
        size_t cl;
        if (t->added[best].lstrip)
            while (st > from && (s[st - 1] == ' ' || s[st - 1] == '\t' || s[st - 1] == '\n' || s[st - 1] == '\r'))
                st--;
        if (t->added[best].rstrip)
            while (en < n && (cl = kvs_tok_utf8_next(s + en, n - en, &cp)) > 0 && kvs_tok_is_space(cp)) en += cl;
        *m_start = st;
        *m_end = en;
        *which = best;
        return 1;
    }
    return 0;
}

/* An added token: its id, or its content when collecting pieces. */
static kvs_status push_added(const kvs_tokenizer *t, size_t which, kvs_tok_out *o) {
    if (o->pieces) return kvs_tok_words_add(o->pieces, t->added[which].content, t->added[which].len);
    kvs_tok_out_push(o, t->added[which].id);
    return KVS_OK;
}

/* Normalizes a raw segment, splits out the normalized added tokens, and encodes the rest. */
static kvs_status encode_raw_segment(const kvs_tokenizer *t, const char *s, size_t n, int is_first, kvs_tok_out *o) {
    kvs_tok_buf norm = {0};
    kvs_status st;
    if (n == 0) return KVS_OK;
    KVS_TRY(st = normalize(t, s, n, &norm));
    size_t from = 0, ms, me, which;
    while (find_added(t, 1, norm.p, norm.len, from, &ms, &me, &which)) {
        KVS_TRY(st = encode_segment(t, norm.p + from, ms - from, is_first && from == 0, o));
        KVS_TRY(st = push_added(t, which, o));
        from = me;
    }
    KVS_TRY(st = encode_segment(t, norm.p + from, norm.len - from, is_first && from == 0, o));
cleanup:
    kvs_tok_buf_free(&norm);
    return st;
}

kvs_status kvs_tok_hf_encode(const kvs_tokenizer *t, const char *text, size_t len, kvs_tok_out *o) {
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        size_t cl = kvs_tok_utf8_next(text + i, len - i, &cp);
        if (cl == 0)
            return kvs_fail(KVS_ERR_INVALID_ARG, "tokenizer: text is not valid UTF-8 at byte %zu (0x%02X)", i,
                            (unsigned)(uint8_t)text[i]);
        i += cl;
    }
    size_t from = 0, ms, me, which;
    kvs_status st;
    while (find_added(t, 0, text, len, from, &ms, &me, &which)) {
        if ((st = encode_raw_segment(t, text + from, ms - from, from == 0, o)) != KVS_OK) return st;
        if ((st = push_added(t, which, o)) != KVS_OK) return st;
        from = me;
    }
    return encode_raw_segment(t, text + from, len - from, from == 0, o);
}

/* ============================== decoding ============================== */

static int starts_with(const char *s, size_t n, const char *p, size_t pn) { return n >= pn && memcmp(s, p, pn) == 0; }

kvs_status kvs_tok_hf_decode(const kvs_tokenizer *t, const int32_t *ids, size_t n, int at_start, kvs_tok_buf *out) {
    kvs_tok_words a = {0}, b = {0};
    kvs_tok_buf tmp = {0};
    kvs_status st = KVS_OK;
    for (size_t i = 0; i < n; i++) {
        if (t->skip[ids[i]]) continue;
        KVS_TRY(st = kvs_tok_words_push(&a, t->pieces[ids[i]], t->piece_len[ids[i]]));
    }
    if (t->n_dec == 0) { /* no decoder: the library joins tokens with spaces */
        for (size_t i = 0; i < a.n; i++) {
            if (i) KVS_TRY(st = kvs_tok_buf_add(out, " ", 1));
            KVS_TRY(st = kvs_tok_buf_add(out, a.text.p + a.off[i], a.len[i]));
        }
        goto cleanup;
    }
    uint32_t cp_of[256];
    int byte_of_cp[324];
    gpt2_byte_map(cp_of);
    for (int i = 0; i < 324; i++) byte_of_cp[i] = -1;
    for (int i = 0; i < 256; i++) byte_of_cp[cp_of[i]] = i;
    for (size_t k = 0; k < t->n_dec; k++) {
        const kvs_tok_dec_step *ds = &t->dec[k];
        kvs_tok_words_free(&b);
        if (ds->kind == KVS_TOK_DEC_FUSE) {
            tmp.len = 0;
            for (size_t i = 0; i < a.n; i++) KVS_TRY(st = kvs_tok_buf_add(&tmp, a.text.p + a.off[i], a.len[i]));
            KVS_TRY(st = kvs_tok_words_push(&b, tmp.p, tmp.len));
        } else {
            for (size_t i = 0; i < a.n; i++) {
                const char *w = a.text.p + a.off[i];
                size_t wn = a.len[i];
                tmp.len = 0;
                KVS_TRY(st = kvs_tok_buf_add(&tmp, "", 0));
                if (ds->kind == KVS_TOK_DEC_REPLACE) {
                    KVS_TRY(st = replace_all(w, wn, ds->a, ds->a_len, ds->b, ds->b_len, &tmp));
                } else if (ds->kind == KVS_TOK_DEC_BYTEFALLBACK) {
                    int bv = kvs_tok_byte_piece_value(w, wn);
                    char c = (char)bv;
                    KVS_TRY(st = bv >= 0 ? kvs_tok_buf_add(&tmp, &c, 1) : kvs_tok_buf_add(&tmp, w, wn));
                } else if (ds->kind == KVS_TOK_DEC_STRIP) {
                    size_t s0 = 0, e0 = wn;
                    /* the start of the first token is the start of the text only when at_start */
                    for (int c = 0; c < ds->start && (i > 0 || at_start) &&
                                    starts_with(w + s0, e0 - s0, ds->strip, ds->strip_len); c++)
                        s0 += ds->strip_len;
                    for (int c = 0; c < ds->stop && e0 - s0 >= ds->strip_len &&
                                    memcmp(w + e0 - ds->strip_len, ds->strip, ds->strip_len) == 0; c++)
                        e0 -= ds->strip_len;
                    KVS_TRY(st = kvs_tok_buf_add(&tmp, w + s0, e0 - s0));
                } else if (ds->kind == KVS_TOK_DEC_METASPACE) {
                    KVS_TRY(st = replace_all(w, wn, ds->strip, ds->strip_len, " ", 1, &tmp));
                    if (i == 0 && at_start && ds->prepend != KVS_TOK_PREPEND_NEVER && tmp.len > 0 && tmp.p[0] == ' ') {
                        memmove(tmp.p, tmp.p + 1, tmp.len);
                        tmp.len--;
                    }
                } else if (ds->kind == KVS_TOK_DEC_BYTELEVEL) {
                    /* each character back to its byte; a token with a character outside the map (an added
                     * token such as "<|eot_id|>" is all ASCII, but others may not be) stays as it is */
                    size_t start_len = tmp.len;
                    int ok = 1;
                    for (size_t p = 0; p < wn;) {
                        uint32_t cp;
                        size_t cl = kvs_tok_utf8_next(w + p, wn - p, &cp);
                        if (cl == 0 || cp >= 324 || byte_of_cp[cp] < 0) { ok = 0; break; }
                        char c = (char)byte_of_cp[cp];
                        KVS_TRY(st = kvs_tok_buf_add(&tmp, &c, 1));
                        p += cl;
                    }
                    if (!ok) {
                        tmp.len = start_len;
                        KVS_TRY(st = kvs_tok_buf_add(&tmp, w, wn));
                    }
                }
                KVS_TRY(st = kvs_tok_words_push(&b, tmp.p, tmp.len));
            }
        }
        kvs_tok_words sw = a;
        a = b;
        b = sw;
    }
    for (size_t i = 0; i < a.n; i++) KVS_TRY(st = kvs_tok_buf_add(out, a.text.p + a.off[i], a.len[i]));
cleanup:
    kvs_tok_words_free(&a);
    kvs_tok_words_free(&b);
    kvs_tok_buf_free(&tmp);
    return st;
}
