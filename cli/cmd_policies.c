/* cmd_policies.c — `kvsim policies [--json]`: every registered policy (policies/registry.c) with its summary,
 * what its budget bounds, its GQA layout and its parameter table (type, default, range or choices, help),
 * as text or as one JSON document for scripts. The same registry and parameter tables drive `kvsim replay`'s
 * parsing (sim/policy.h), so what is listed is exactly what replay accepts.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../sim/policy.h"
#include "../policies/registry.h"
#include "cli.h"

static void usage(FILE *f) {
    fprintf(f, "usage: kvsim policies [--json]\n"
               "Lists every policy kvsim replay accepts (--policy NAME:key=value,...) with its parameters:\n"
               "type, default, range or choices and what it does, and its named presets: the settings a paper\n"
               "used (--policy NAME@PRESET, optionally followed by :key=value overrides). Oracles see full\n"
               "attention (a bound, not a deployable policy).\n"
               "  --json   one JSON object: {\"policies\": [{\"name\", \"summary\", \"oracle\", \"budget_scope\",\n"
               "           \"layout\", \"params\": [{\"key\", \"type\", \"default\", \"min\", \"max\", \"choices\",\n"
               "           \"help\"}], \"presets\": [{\"name\", \"params\", \"help\"}]}]}\n");
}

static const char *scope_name(kvs_policy_budget_scope s) {
    return s == KVS_BUDGET_PROMPT ? "prompt" : s == KVS_BUDGET_NONE ? "none" : "every_step";
}

static const char *scope_text(kvs_policy_budget_scope s) {
    return s == KVS_BUDGET_PROMPT  ? "the budget bounds the retained prompt; generated tokens are all kept"
           : s == KVS_BUDGET_NONE ? "no token budget: a given budget is ignored (the full cache, or a rule of the "
                                    "policy's own: SimLayerKV's lazy layers, DuoAttention's streaming heads, LagKV's "
                                    "ratio)"
                                  : "the budget bounds the attended tokens at every step";
}

/* The layout of the default configuration; a parameter may change it (say so when one does). */
static const char *layout_name(const struct kvs_policy_ops *ops, int *param_dependent) {
    *param_dependent = ops->layout != NULL;
    kvs_policy_config cfg;
    kvs_policy_defaults(ops, &cfg);
    return kvs_policy_layout(&cfg) == KVS_SEL_PER_QUERY_HEAD ? "per_query_head" : "per_kv_head";
}

static const char *type_name(kvs_param_type t) {
    switch (t) {
    case KVS_PARAM_INT: return "int";
    case KVS_PARAM_DOUBLE: return "real";
    case KVS_PARAM_BOOL: return "bool";
    case KVS_PARAM_ENUM: return "choice";
    case KVS_PARAM_STRING: return "text";
    case KVS_PARAM_FILE: return "file";
    }
    return "?";
}

/* The n-th '|'-separated choice of `choices` into out. */
static void choice_at(const char *choices, int n, char *out, size_t cap) {
    const char *p = choices;
    for (int i = 0; i < n && p; i++) {
        p = strchr(p, '|');
        if (p) p++;
    }
    size_t len = p ? strcspn(p, "|") : 0;
    if (len >= cap) len = cap - 1;
    if (p) memcpy(out, p, len);
    out[len] = '\0';
}

static void print_json(FILE *o) {
    fputs("{\"policies\":[", o);
    for (int i = 0; i < kvs_policy_count(); i++) {
        const struct kvs_policy_ops *ops = kvs_policy_at(i);
        int dep;
        const char *layout = layout_name(ops, &dep);
        fprintf(o, "%s\n{\"name\":", i ? "," : "");
        kvs_cli_json_string(o, ops->name);
        fputs(",\"summary\":", o);
        kvs_cli_json_string(o, ops->summary);
        fprintf(o, ",\"oracle\":%s,\"budget_scope\":\"%s\",\"layout\":\"%s\",\"layout_set_by_params\":%s,\"params\":[",
                ops->is_oracle ? "true" : "false", scope_name(ops->budget_scope), layout, dep ? "true" : "false");
        for (int j = 0; j < ops->n_params; j++) {
            const kvs_policy_param *pp = &ops->params[j];
            fprintf(o, "%s{\"key\":", j ? "," : "");
            kvs_cli_json_string(o, pp->key);
            fprintf(o, ",\"type\":\"%s\",\"default\":", type_name(pp->type));
            char buf[128];
            switch (pp->type) {
            case KVS_PARAM_INT:
            case KVS_PARAM_DOUBLE:
                kvs_cli_json_number(o, pp->def);
                fputs(",\"min\":", o);
                kvs_cli_json_number(o, pp->lo);
                fputs(",\"max\":", o);
                kvs_cli_json_number(o, pp->hi);
                break;
            case KVS_PARAM_BOOL: fputs(pp->def != 0 ? "true" : "false", o); break;
            case KVS_PARAM_ENUM:
                choice_at(pp->choices, (int)pp->def, buf, sizeof buf);
                kvs_cli_json_string(o, buf);
                fputs(",\"choices\":[", o);
                for (int c = 0;; c++) {
                    choice_at(pp->choices, c, buf, sizeof buf);
                    if (!buf[0]) break;
                    if (c) fputc(',', o);
                    kvs_cli_json_string(o, buf);
                }
                fputc(']', o);
                break;
            case KVS_PARAM_STRING: kvs_cli_json_string(o, pp->def_str ? pp->def_str : ""); break;
            case KVS_PARAM_FILE:
                if (pp->def_str && pp->def_str[0]) kvs_cli_json_string(o, pp->def_str);
                else fputs("null", o);
                break;
            }
            fputs(",\"help\":", o);
            kvs_cli_json_string(o, pp->help);
            fputc('}', o);
        }
        fputs("],\"presets\":[", o);
        for (int j = 0; j < ops->n_presets; j++) {
            fprintf(o, "%s{\"name\":", j ? "," : "");
            kvs_cli_json_string(o, ops->presets[j].name);
            fputs(",\"params\":", o);
            kvs_cli_json_string(o, ops->presets[j].params);
            fputs(",\"help\":", o);
            kvs_cli_json_string(o, ops->presets[j].help);
            fputc('}', o);
        }
        fputs("]}", o);
    }
    fputs("\n]}\n", o);
}

static void print_text(FILE *o) {
    fprintf(o, "%d policies (kvsim replay --policy NAME or NAME:key=value,key=value):\n\n", kvs_policy_count());
    for (int i = 0; i < kvs_policy_count(); i++) {
        const struct kvs_policy_ops *ops = kvs_policy_at(i);
        int dep;
        const char *layout = layout_name(ops, &dep);
        fprintf(o, "%s%s\n  %s\n  budget: %s\n  layout: %s%s\n", ops->name, ops->is_oracle ? "  [ORACLE]" : "",
                ops->summary, scope_text(ops->budget_scope), layout, dep ? " (by default; a parameter chooses it)" : "");
        if (ops->n_params == 0) fprintf(o, "  parameters: none\n");
        for (int j = 0; j < ops->n_params; j++) {
            const kvs_policy_param *pp = &ops->params[j];
            char def[128], lo[40], hi[40];
            switch (pp->type) {
            case KVS_PARAM_INT:
                snprintf(def, sizeof def, "%lld", (long long)pp->def);
                snprintf(lo, sizeof lo, "%lld", (long long)pp->lo);
                snprintf(hi, sizeof hi, "%lld", (long long)pp->hi);
                fprintf(o, "  %s=INT in [%s, %s], default %s\n", pp->key, lo, hi, def);
                break;
            case KVS_PARAM_DOUBLE:
                kvs_cli_fmt_real(def, sizeof def, pp->def);
                kvs_cli_fmt_real(lo, sizeof lo, pp->lo);
                kvs_cli_fmt_real(hi, sizeof hi, pp->hi);
                fprintf(o, "  %s=REAL in [%s, %s], default %s\n", pp->key, lo, hi, def);
                break;
            case KVS_PARAM_BOOL:
                fprintf(o, "  %s=true|false, default %s\n", pp->key, pp->def != 0 ? "true" : "false");
                break;
            case KVS_PARAM_ENUM:
                choice_at(pp->choices, (int)pp->def, def, sizeof def);
                fprintf(o, "  %s=%s, default %s\n", pp->key, pp->choices, def);
                break;
            case KVS_PARAM_STRING:
                fprintf(o, "  %s=TEXT, default '%s'\n", pp->key, pp->def_str ? pp->def_str : "");
                break;
            case KVS_PARAM_FILE:
                if (pp->choices)
                    fprintf(o, "  %s=PATH|%s, default %s (a PATH is recorded with its sha256)\n", pp->key, pp->choices,
                            pp->def_str && pp->def_str[0] ? pp->def_str : "none");
                else
                    fprintf(o, "  %s=PATH, default none (recorded with its sha256)\n", pp->key);
                break;
            }
            fprintf(o, "      %s\n", pp->help);
        }
        for (int j = 0; j < ops->n_presets; j++)
            fprintf(o, "  preset %s@%s = %s\n      %s\n", ops->name, ops->presets[j].name,
                    ops->presets[j].params[0] ? ops->presets[j].params : "(the defaults)", ops->presets[j].help);
        fputc('\n', o);
    }
}

int kvs_cmd_policies(int argc, char **argv) {
    int json = 0, seen_json = 0;
    for (int i = 1; i < argc; i++) {
        if (kvs_cli_is_help(argv[i])) {
            usage(stdout);
            return KVS_EXIT_OK;
        }
        if (!strcmp(argv[i], "--json")) {
            if (kvs_cli_once("policies", "--json", &seen_json)) return KVS_EXIT_USAGE;
            json = 1;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            return kvs_cli_usage_error("policies", "unknown option '%s'", argv[i]);
        } else {
            return kvs_cli_usage_error("policies", "unexpected argument '%s'", argv[i]);
        }
    }
    if (json) print_json(stdout);
    else print_text(stdout);
    return kvs_cli_finish_stdout("policies");
}
