/* policy.c — the policy framework shared by every plugin: parsing and validation of "NAME:key=value,..." specs
 * against a policy's parameter table (the registry, policies/registry.h, finds the policy by name), canonical parameter strings (stored in
 * the results database, results/SCHEMA.md) and byte helpers. Interface and rules: sim/policy.h.
 */
#include "policy.h"

#include "../common/sha256.h"

#include <errno.h>
#include <stdarg.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* KVS_ERR_VERSION unless ops was written for this interface (policy.h KVS_POLICY_INTERFACE_VERSION). */
static kvs_status check_version(const struct kvs_policy_ops *ops) {
    if (ops->version != KVS_POLICY_INTERFACE_VERSION)
        return kvs_fail(KVS_ERR_VERSION, "policy %s is written for policy interface version %d; this kvsim runs version %d",
                        ops->name, ops->version, KVS_POLICY_INTERFACE_VERSION);
    return KVS_OK;
}

/* The index of choice `s` (length len) in "a|b|c", or -1. */
static int enum_index(const char *choices, const char *s, size_t len) {
    int i = 0;
    const char *p = choices;
    for (;;) {
        const char *bar = strchr(p, '|');
        size_t n = bar ? (size_t)(bar - p) : strlen(p);
        if (n == len && !strncmp(p, s, len)) return i;
        if (!bar) return -1;
        p = bar + 1;
        i++;
    }
}

/* Writes choice number `idx` of "a|b|c" into out (size cap). */
static void enum_name(const char *choices, int idx, char *out, size_t cap) {
    const char *p = choices;
    for (int i = 0; i < idx && p; i++) {
        p = strchr(p, '|');
        if (p) p++;
    }
    if (!p) {
        snprintf(out, cap, "?");
        return;
    }
    const char *bar = strchr(p, '|');
    size_t n = bar ? (size_t)(bar - p) : strlen(p);
    snprintf(out, cap, "%.*s", (int)n, p);
}

/* Formats a value the shortest way that parses back to the same double. */
static void format_value(const kvs_policy_param *pp, double v, char *out, size_t cap) {
    switch (pp->type) {
    case KVS_PARAM_INT: snprintf(out, cap, "%lld", (long long)v); break;
    case KVS_PARAM_BOOL: snprintf(out, cap, "%s", v != 0 ? "true" : "false"); break;
    case KVS_PARAM_ENUM: enum_name(pp->choices, (int)v, out, cap); break;
    case KVS_PARAM_DOUBLE: kvs_format_real(out, cap, v); break;
    case KVS_PARAM_STRING:
    case KVS_PARAM_FILE: snprintf(out, cap, "%s", ""); break; /* text values live in cfg->str */
    }
}

static int is_text_param(const kvs_policy_param *pp) {
    return pp->type == KVS_PARAM_STRING || pp->type == KVS_PARAM_FILE;
}

static void build_canonical(kvs_policy_config *cfg) {
    const struct kvs_policy_ops *ops = cfg->ops;
    size_t used = 0;
    cfg->canonical[0] = 0;
    for (int i = 0; i < ops->n_params; i++) {
        char val[KVS_POLICY_STR_MAX + 80];
        if (ops->params[i].type == KVS_PARAM_FILE && cfg->str[i][0] && cfg->sha256[i][0]) /* not a keyword */
            snprintf(val, sizeof val, "%s@sha256:%s", cfg->str[i], cfg->sha256[i]);
        else if (is_text_param(&ops->params[i]))
            snprintf(val, sizeof val, "%s", cfg->str[i]);
        else
            format_value(&ops->params[i], cfg->v[i], val, sizeof val);
        int w = snprintf(cfg->canonical + used, sizeof cfg->canonical - used, "%s%s=%s", i ? "," : "",
                         ops->params[i].key, val);
        /* Parameter tables are short; a truncation would be a table bug, not user input. */
        KVS_ASSERT(w > 0 && (size_t)w < sizeof cfg->canonical - used);
        used += (size_t)w;
    }
}

void kvs_policy_defaults(const struct kvs_policy_ops *ops, kvs_policy_config *cfg) {
    KVS_ASSERT(ops->n_params <= KVS_POLICY_MAX_PARAMS);
    memset(cfg, 0, sizeof *cfg);
    cfg->ops = ops;
    for (int i = 0; i < ops->n_params; i++) {
        cfg->v[i] = ops->params[i].def;
        if (is_text_param(&ops->params[i]) && ops->params[i].def_str)
            snprintf(cfg->str[i], sizeof cfg->str[i], "%s", ops->params[i].def_str);
    }
    build_canonical(cfg);
}

/* Parses the text (length len) of STRING/FILE parameter i into cfg->str[i] (and cfg->sha256[i]). Values
 * cannot hold ',' or '=' (the spec separators) or control characters. A FILE value PATH@sha256:HEX must
 * still hash to HEX: a result recorded against one file content is never silently re-run on another. */
static kvs_status parse_text(const char *policy, const kvs_policy_param *pp, const char *s, size_t len,
                             kvs_policy_config *cfg, int i) {
    if (len >= KVS_POLICY_STR_MAX)
        return kvs_fail(KVS_ERR_INVALID_ARG, "%s: value of parameter '%s' is longer than %d bytes", policy,
                        pp->key, KVS_POLICY_STR_MAX - 1);
    for (size_t j = 0; j < len; j++)
        if ((unsigned char)s[j] < 0x20 || s[j] == 0x7f || s[j] == '=')
            return kvs_fail(KVS_ERR_INVALID_ARG, "%s: parameter '%s': value '%.*s' holds a control character or "
                                                 "'=' (values cannot contain ',' or '=')",
                            policy, pp->key, (int)len, s);
    memcpy(cfg->str[i], s, len);
    cfg->str[i][len] = 0;
    cfg->sha256[i][0] = 0;
    if (pp->type != KVS_PARAM_FILE || len == 0) return KVS_OK;
    /* a FILE parameter's keywords (its `choices`, e.g. SyncKV's clusters=prefill) name no file: nothing to hash */
    if (pp->choices && enum_index(pp->choices, cfg->str[i], len) >= 0) return KVS_OK;
    char *at = strstr(cfg->str[i], "@sha256:");
    char want[65] = "";
    if (at) {
        snprintf(want, sizeof want, "%s", at + 8);
        *at = 0;
        if (strlen(want) != 64 || strspn(want, "0123456789abcdef") != 64)
            return kvs_fail(KVS_ERR_INVALID_ARG, "%s: parameter '%s': '%s' is not a 64-digit lowercase sha256",
                            policy, pp->key, want);
    }
    if (!cfg->str[i][0]) return kvs_fail(KVS_ERR_INVALID_ARG, "%s: parameter '%s': empty path", policy, pp->key);
    if (kvs_sha256_file_hex(cfg->str[i], cfg->sha256[i]) != KVS_OK)
        return kvs_fail(KVS_ERR_INVALID_ARG, "%s: parameter '%s': %s", policy, pp->key, kvs_last_error());
    if (want[0] && strcmp(want, cfg->sha256[i]))
        return kvs_fail(KVS_ERR_INVALID_ARG, "%s: parameter '%s': file %s changed since it was recorded "
                                             "(sha256 %s, recorded %s)",
                        policy, pp->key, cfg->str[i], cfg->sha256[i], want);
    return KVS_OK;
}

/* Parses one value text (length len) for parameter pp. */
static kvs_status parse_value(const char *policy, const kvs_policy_param *pp, const char *s, size_t len,
                              double *out) {
    char buf[128];
    if (len == 0) return kvs_fail(KVS_ERR_INVALID_ARG, "%s: parameter '%s' has an empty value", policy, pp->key);
    if (len >= sizeof buf)
        return kvs_fail(KVS_ERR_INVALID_ARG, "%s: value of parameter '%s' is too long", policy, pp->key);
    memcpy(buf, s, len);
    buf[len] = 0;
    switch (pp->type) {
    case KVS_PARAM_ENUM: {
        int i = enum_index(pp->choices, buf, len);
        if (i < 0)
            return kvs_fail(KVS_ERR_INVALID_ARG, "%s: parameter '%s': '%s' is not one of %s", policy, pp->key,
                            buf, pp->choices);
        *out = i;
        return KVS_OK;
    }
    case KVS_PARAM_BOOL:
        if (!strcasecmp(buf, "1") || !strcasecmp(buf, "true") || !strcasecmp(buf, "yes") || !strcasecmp(buf, "on")) {
            *out = 1;
            return KVS_OK;
        }
        if (!strcasecmp(buf, "0") || !strcasecmp(buf, "false") || !strcasecmp(buf, "no") || !strcasecmp(buf, "off")) {
            *out = 0;
            return KVS_OK;
        }
        return kvs_fail(KVS_ERR_INVALID_ARG, "%s: parameter '%s': '%s' is not a boolean", policy, pp->key, buf);
    case KVS_PARAM_INT: {
        char *end;
        errno = 0;
        long long v = strtoll(buf, &end, 10);
        if (!buf[0] || *end || (errno && errno != ERANGE))
            return kvs_fail(KVS_ERR_INVALID_ARG, "%s: parameter '%s': '%s' is not an integer", policy, pp->key,
                            buf);
        if (errno == ERANGE || (double)v < pp->lo || (double)v > pp->hi) { /* the user's text, exact bounds */
            char lo[40], hi[40];
            format_value(pp, pp->lo, lo, sizeof lo);
            format_value(pp, pp->hi, hi, sizeof hi);
            return kvs_fail(KVS_ERR_INVALID_ARG, "%s: parameter '%s': '%s' is out of range [%s, %s]", policy,
                            pp->key, buf, lo, hi);
        }
        *out = (double)v;
        return KVS_OK;
    }
    case KVS_PARAM_DOUBLE: {
        char *end;
        errno = 0;
        double v = strtod(buf, &end);
        if (*end || errno || !isfinite(v))
            return kvs_fail(KVS_ERR_INVALID_ARG, "%s: parameter '%s': '%s' is not a number", policy, pp->key,
                            buf);
        if (v < pp->lo || v > pp->hi) {
            char lo[40], hi[40];
            format_value(pp, pp->lo, lo, sizeof lo);
            format_value(pp, pp->hi, hi, sizeof hi);
            return kvs_fail(KVS_ERR_INVALID_ARG, "%s: parameter '%s': '%s' is out of range [%s, %s]", policy,
                            pp->key, buf, lo, hi);
        }
        *out = v;
        return KVS_OK;
    }
    case KVS_PARAM_STRING:
    case KVS_PARAM_FILE: break; /* parse_text() */
    }
    return kvs_fail(KVS_ERR_INVALID_ARG, "%s: parameter '%s' has an unknown type", policy, pp->key);
}

const kvs_policy_preset *kvs_policy_find_preset(const struct kvs_policy_ops *ops, const char *name) {
    for (int i = 0; i < ops->n_presets; i++)
        if (!strcmp(ops->presets[i].name, name)) return &ops->presets[i];
    return NULL;
}

/* Parses the key=value list `params` (NULL or "" = nothing) into cfg on top of what cfg holds; `what` names
 * the list in messages ("policy h2o" or "policy h2o preset morphkv-longwriter"). Keys may repeat across
 * lists (a user's value overrides a preset's) but not within one. */
static kvs_status parse_params(const struct kvs_policy_ops *ops, const char *what, const char *params,
                               kvs_policy_config *cfg) {
    int seen[KVS_POLICY_MAX_PARAMS] = {0};
    const char *p = params;
    while (p && *p) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        const char *eq = memchr(p, '=', len);
        if (!eq) return kvs_fail(KVS_ERR_INVALID_ARG, "%s: '%.*s' is not key=value", what, (int)len, p);
        size_t klen = (size_t)(eq - p);
        int found = -1;
        for (int i = 0; i < ops->n_params; i++)
            if (strlen(ops->params[i].key) == klen && !strncmp(ops->params[i].key, p, klen)) found = i;
        if (found < 0) return kvs_fail(KVS_ERR_INVALID_ARG, "%s: unknown parameter '%.*s'", what, (int)klen, p);
        if (seen[found])
            return kvs_fail(KVS_ERR_INVALID_ARG, "%s: parameter '%s' given twice", what, ops->params[found].key);
        seen[found] = 1;
        kvs_status st = is_text_param(&ops->params[found])
                            ? parse_text(what, &ops->params[found], eq + 1, len - klen - 1, cfg, found)
                            : parse_value(what, &ops->params[found], eq + 1, len - klen - 1, &cfg->v[found]);
        if (st != KVS_OK) return st;
        if (!comma) break;
        p = comma + 1;
        if (!*p) return kvs_fail(KVS_ERR_INVALID_ARG, "%s: trailing ',' in parameter list", what);
    }
    return KVS_OK;
}

kvs_status kvs_policy_parse_spec(const struct kvs_policy_ops *ops, const char *spec, kvs_policy_config *cfg) {
    const char *colon = strchr(spec, ':');
    size_t hlen = colon ? (size_t)(colon - spec) : strlen(spec); /* NAME or NAME@PRESET */
    const char *at = memchr(spec, '@', hlen);
    size_t nlen = at ? (size_t)(at - spec) : hlen;
    const char *name = ops->name;
    if (nlen != strlen(ops->name) || memcmp(spec, ops->name, nlen))
        return kvs_fail(KVS_ERR_INVALID_ARG, "policy spec '%s' does not name policy %s", spec, ops->name);
    char preset[64] = "";
    if (colon && !colon[1]) return kvs_fail(KVS_ERR_INVALID_ARG, "policy %s: empty parameter list after ':'", name);
    if (!at) return kvs_policy_parse_ops(ops, colon ? colon + 1 : NULL, cfg);
    size_t plen = hlen - nlen - 1;
    if (plen == 0 || plen >= sizeof preset)
        return kvs_fail(KVS_ERR_INVALID_ARG, "policy %s: missing or unknown preset after '@'", name);
    memcpy(preset, at + 1, plen);
    preset[plen] = 0;
    const kvs_policy_preset *pr = kvs_policy_find_preset(ops, preset);
    if (!pr) {
        char known[512] = "";
        size_t used = 0;
        for (int i = 0; i < ops->n_presets && used < sizeof known; i++)
            used += (size_t)snprintf(known + used, sizeof known - used, "%s%s", i ? ", " : "", ops->presets[i].name);
        return kvs_fail(KVS_ERR_INVALID_ARG, "policy %s: unknown preset '%s' (%s%s)", name, preset,
                        ops->n_presets ? "known: " : "it has none", known);
    }
    char what[160];
    snprintf(what, sizeof what, "policy %s preset %s", name, preset);
    kvs_policy_defaults(ops, cfg);
    kvs_status st = parse_params(ops, what, pr->params, cfg);
    char user[64];
    snprintf(user, sizeof user, "policy %s", name);
    if (st == KVS_OK) st = parse_params(ops, user, colon ? colon + 1 : NULL, cfg);
    if (st != KVS_OK) return st;
    build_canonical(cfg);
    return KVS_OK;
}

kvs_status kvs_policy_parse_ops(const struct kvs_policy_ops *ops, const char *params, kvs_policy_config *cfg) {
    kvs_policy_defaults(ops, cfg);
    kvs_status vst = check_version(ops);
    if (vst != KVS_OK) return vst;
    if (!params) return KVS_OK;
    char what[64];
    snprintf(what, sizeof what, "policy %s", ops->name);
    if (!*params) return kvs_fail(KVS_ERR_INVALID_ARG, "%s: empty parameter list", what);
    kvs_status st = parse_params(ops, what, params, cfg);
    if (st != KVS_OK) return st;
    build_canonical(cfg);
    return KVS_OK;
}

double kvs_policy_param_get(const kvs_policy_config *cfg, const char *key) {
    for (int i = 0; i < cfg->ops->n_params; i++)
        if (!strcmp(cfg->ops->params[i].key, key)) return cfg->v[i];
    kvs_assert_fail(key, __FILE__, __LINE__); /* a policy asked for a key its own table lacks */
}

const char *kvs_policy_param_str(const kvs_policy_config *cfg, const char *key) {
    for (int i = 0; i < cfg->ops->n_params; i++)
        if (!strcmp(cfg->ops->params[i].key, key) && is_text_param(&cfg->ops->params[i])) return cfg->str[i];
    kvs_assert_fail(key, __FILE__, __LINE__); /* not a STRING/FILE key of the policy's own table */
}

const char *kvs_policy_param_sha256(const kvs_policy_config *cfg, const char *key) {
    for (int i = 0; i < cfg->ops->n_params; i++)
        if (!strcmp(cfg->ops->params[i].key, key) && cfg->ops->params[i].type == KVS_PARAM_FILE) return cfg->sha256[i];
    kvs_assert_fail(key, __FILE__, __LINE__);
}

kvs_status kvs_policy_validate(const kvs_policy_config *cfg, const kvs_policy_model *m, int64_t budget) {
    kvs_status st = check_version(cfg->ops);
    if (st != KVS_OK) return st;
    if (budget < 1)
        return kvs_fail(KVS_ERR_INVALID_ARG, "policy %s: budget %lld must be at least 1 token", cfg->ops->name,
                        (long long)budget);
    if (cfg->ops->validate) return cfg->ops->validate(cfg, m, budget);
    return KVS_OK;
}

int kvs_policy_note(char *buf, size_t cap, const char *fmt, ...) {
    if (!buf || cap == 0) return 1;
    size_t len = strnlen(buf, cap - 1);
    if (len > 0 && len + 2 < cap) {
        memcpy(buf + len, "; ", 3);
        len += 2;
    }
    va_list ap;
    va_start(ap, fmt);
    if (len + 1 < cap) vsnprintf(buf + len, cap - len, fmt, ap);
    va_end(ap);
    buf[cap - 1] = '\0';
    return 1;
}

int kvs_policy_notes(const kvs_policy_config *cfg, const kvs_policy_model *m, int64_t budget, char *buf, size_t cap) {
    if (cap) buf[0] = '\0';
    int n = 0;
    const struct kvs_policy_ops *ops = cfg->ops;
    /* A budget that never binds makes the run a copy of the full cache: legitimate as a sanity point, but
     * easy to mistake for a compression result. The texts name no budget, so that kvsim replay can print one
     * warning for every budget of a configuration that shares it. */
    if (ops->budget_scope == KVS_BUDGET_EVERY_STEP && m->n_positions > 0 && budget >= m->n_positions)
        n += kvs_policy_note(buf, cap, "the budget is at least the trace's %lld positions: nothing is ever evicted "
                                       "(the run equals the full cache)",
                             (long long)m->n_positions);
    else if (ops->budget_scope == KVS_BUDGET_PROMPT && m->prompt_len > 0 && budget >= m->prompt_len)
        n += kvs_policy_note(buf, cap, "the budget is at least the first prompt's %lld positions: nothing of it is "
                                       "evicted (a single-turn run equals the full cache)",
                             (long long)m->prompt_len);
    else if (ops->notes)
        n += ops->notes(cfg, m, budget, buf, cap);
    return n;
}

kvs_policy_granularity kvs_policy_layout(const kvs_policy_config *cfg) {
    return cfg->ops->layout ? cfg->ops->layout(cfg) : cfg->ops->granularity;
}

int64_t kvs_policy_max_new(const kvs_policy_model *m, int64_t given) {
    if (given > 0) return given;
    return m->max_new_tokens > 0 ? m->max_new_tokens : 0;
}

int64_t kvs_policy_seq_len(const kvs_policy_model *m, int64_t n, int64_t max_new) {
    int64_t S = n + max_new;
    if (m->max_seq_len > 0 && S > m->max_seq_len) S = m->max_seq_len;
    return S > 0 ? S : 1;
}

double kvs_policy_kv_bytes(const kvs_policy_model *m, double slots) {
    return slots * 2.0 * (double)m->head_dim * (double)m->kv_bytes;
}

void kvs_policy_print_ops_help(const struct kvs_policy_ops *ops, void *fp) {
    FILE *f = fp;
    {
        fprintf(f, "  %-12s %s%s\n", ops->name, ops->is_oracle ? "[ORACLE] " : "", ops->summary);
        for (int j = 0; j < ops->n_presets; j++)
            fprintf(f, "      @%s = %s: %s\n", ops->presets[j].name, ops->presets[j].params[0] ? ops->presets[j].params : "(defaults)",
                    ops->presets[j].help);
        for (int j = 0; j < ops->n_params; j++) {
            const kvs_policy_param *pp = &ops->params[j];
            char def[64];
            format_value(pp, pp->def, def, sizeof def);
            if (pp->type == KVS_PARAM_STRING)
                fprintf(f, "      %s=TEXT (default '%s'): %s\n", pp->key, pp->def_str ? pp->def_str : "", pp->help);
            else if (pp->type == KVS_PARAM_FILE)
                fprintf(f, "      %s=PATH%s%s (default %s; a PATH is recorded with its sha256): %s\n", pp->key,
                        pp->choices ? "|" : "", pp->choices ? pp->choices : "",
                        pp->def_str && pp->def_str[0] ? pp->def_str : "none", pp->help);
            else if (pp->type == KVS_PARAM_ENUM)
                fprintf(f, "      %s=%s (default %s): %s\n", pp->key, pp->choices, def, pp->help);
            else if (pp->type == KVS_PARAM_BOOL)
                fprintf(f, "      %s=true|false (default %s): %s\n", pp->key, def, pp->help);
            else {
                char lo[40], hi[40];
                format_value(pp, pp->lo, lo, sizeof lo);
                format_value(pp, pp->hi, hi, sizeof hi);
                fprintf(f, "      %s in [%s, %s] (default %s): %s\n", pp->key, lo, hi, def, pp->help);
            }
        }
    }
}
