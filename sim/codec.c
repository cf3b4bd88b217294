/* codec.c — the KV codec core: spec parsing, the integer (int, kivi, hf) and fp8 arithmetic, the time rule's
 * quantized prefix q(n), the incremental per-(layer, KV head) state and the exact byte counts. Every rule is stated
 * in codec.h; this file only implements it. The NumPy reference (tools/gen_codec_fixtures.py) is written from the
 * papers' and libraries' procedures (KIVI Algorithm 1, transformers' QuantizedLayer.update, a cache write per
 * position) rather than from q(n), so the fixtures test the closed forms here against the step-by-step algorithms.
 */
#include "codec.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- specs ---------------------------------------------------------------------------------------------- */

struct kvs_codec {
    kvs_codec_kind kind;
    int bits;                    /* int, kivi, hf */
    int64_t group;               /* elements per group */
    int64_t residual;            /* kivi, hf: R */
    kvs_codec_axis axis[2];      /* [KVS_CODEC_K], [KVS_CODEC_V]: the axis each tensor's groups run along */
    kvs_codec_fp8_format format; /* fp8 */
    int scale_prompt;            /* fp8: 1 = scale=prompt */
    int per_head;                /* fp8: 1 = per=head */
    float scale;                 /* fp8: the numeric scale (scale_prompt = 0) */
    double ratio;                /* think: lambda, the share of key channels pruned */
    int64_t window;              /* think: observation window (prompt query positions scored) */
    int64_t recent;              /* think: last prompt positions kept whole */
    char spec[KVS_CODEC_SPEC_MAX];
};

typedef enum { P_INT = 0, P_ENUM = 1, P_SCALE = 2, P_RATIO = 3 } param_type;

/* One parameter of a codec: an integer in [lo, hi] (and, with `allowed`, one of those values), an enumeration
 * ("a|b": stored as the index), the fp8 scale (a positive number or `prompt`) or a ratio (a number in [0, 1)). */
typedef struct {
    const char *key;
    param_type type;
    int64_t lo, hi;        /* P_INT range (without `allowed`) */
    const int *allowed;    /* P_INT: the values allowed (0-terminated) instead of a range */
    const char *choices;   /* P_ENUM */
    const char *def;       /* default as text */
} param_def;

#define MAX_PARAMS 4

typedef struct {
    const char *name;
    kvs_codec_kind kind;
    int n_params;
    param_def params[MAX_PARAMS];
} codec_def;

static const int BITS_INT[] = {2, 3, 4, 8, 0};
static const int BITS_2_4[] = {2, 4, 0};

static const codec_def DEFS[] = {
    {"int", KVS_CODEC_INT, 4,
     {{"bits", P_INT, 2, 8, BITS_INT, NULL, "4"},
      {"group", P_INT, 1, 65536, NULL, NULL, "32"},
      {"k_axis", P_ENUM, 0, 0, NULL, "token|channel", "token"},
      {"v_axis", P_ENUM, 0, 0, NULL, "token|channel", "channel"}}},
    {"kivi", KVS_CODEC_KIVI, 3,
     {{"bits", P_INT, 2, 4, BITS_2_4, NULL, "2"},
      {"group", P_INT, 1, 65536, NULL, NULL, "32"},
      {"residual", P_INT, 1, 1 << 24, NULL, NULL, "128"}}},
    {"hf", KVS_CODEC_HF, 3,
     {{"bits", P_INT, 2, 4, BITS_2_4, NULL, "4"},
      {"group", P_INT, 1, 65536, NULL, NULL, "64"},
      {"residual", P_INT, 2, 1 << 24, NULL, NULL, "128"}}},
    {"fp8", KVS_CODEC_FP8, 3,
     {{"format", P_ENUM, 0, 0, NULL, "e4m3|e5m2", "e4m3"},
      {"scale", P_SCALE, 0, 0, NULL, NULL, "1"},
      {"per", P_ENUM, 0, 0, NULL, "tensor|head", "tensor"}}},
    /* ThinK's defaults are the authors' (SalesforceAIResearch/ThinK): pruning_ratio 0.4 and recent_size 32 in
     * scripts_longBench/eval.sh and init_snapkv/init_H2O, the observation window the 32 last queries that
     * key_pruner_query_driven reads (q_states[..., -32:, :], SnapKV's window_size 32). */
    {"think", KVS_CODEC_THINK, 3,
     {{"ratio", P_RATIO, 0, 0, NULL, NULL, "0.4"},
      {"window", P_INT, 1, 1 << 24, NULL, NULL, "32"},
      {"recent", P_INT, 0, 1 << 24, NULL, NULL, "32"}}},
};
#define N_DEFS ((int)(sizeof DEFS / sizeof DEFS[0]))

/* A parsed value: the integer / enumeration index, or for P_SCALE the number (is_prompt = 0) or `prompt`. */
typedef struct {
    int64_t i;
    float f;
    double r; /* P_RATIO */
    int is_prompt;
} param_val;

/* Index of `val` (length n) among the '|'-separated choices, -1 when absent. */
static int enum_index(const char *choices, const char *val, size_t n) {
    int idx = 0;
    const char *p = choices;
    for (;;) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (len == n && memcmp(p, val, n) == 0) return idx;
        if (!bar) return -1;
        p = bar + 1;
        idx++;
    }
}

/* The idx-th choice copied into buf. */
static void enum_name(const char *choices, int idx, char *buf, size_t cap) {
    const char *p = choices;
    for (int i = 0; i < idx; i++) p = strchr(p, '|') + 1;
    const char *bar = strchr(p, '|');
    size_t len = bar ? (size_t)(bar - p) : strlen(p);
    if (len >= cap) len = cap - 1;
    memcpy(buf, p, len);
    buf[len] = '\0';
}

/* The shortest decimal that reads back (strtod) to exactly r: the canonical text of a ratio. */
static void format_double(char *buf, size_t cap, double r) {
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, cap, "%.*g", prec, r);
        if (strtod(buf, NULL) == r) return;
    }
    snprintf(buf, cap, "%.17g", r);
}

/* The shortest decimal that reads back (strtof) to exactly f: the canonical text of a float parameter. */
static void format_float(char *buf, size_t cap, float f) {
    for (int prec = 1; prec <= 9; prec++) {
        snprintf(buf, cap, "%.*g", prec, (double)f);
        if (strtof(buf, NULL) == f) return;
    }
    snprintf(buf, cap, "%.9g", (double)f);
}

static kvs_status parse_value(const codec_def *cd, const param_def *pd, const char *val, size_t n, param_val *out) {
    char text[64];
    if (n == 0) return kvs_fail(KVS_ERR_INVALID_ARG, "codec %s: %s has no value", cd->name, pd->key);
    if (n >= sizeof text)
        return kvs_fail(KVS_ERR_INVALID_ARG, "codec %s: value of %s is too long", cd->name, pd->key);
    memcpy(text, val, n);
    text[n] = '\0';
    memset(out, 0, sizeof *out);
    switch (pd->type) {
    case P_INT: {
        char *end = NULL;
        errno = 0;
        long long v = strtoll(text, &end, 10);
        if (errno != 0 || end == text || *end != '\0' || text[0] == '+' || text[0] == ' ')
            return kvs_fail(KVS_ERR_INVALID_ARG, "codec %s: %s=%s is not a whole number", cd->name, pd->key, text);
        if (!pd->allowed && (v < pd->lo || v > pd->hi))
            return kvs_fail(KVS_ERR_INVALID_ARG, "codec %s: %s=%s out of range [%lld, %lld]", cd->name, pd->key,
                            text, (long long)pd->lo, (long long)pd->hi);
        if (pd->allowed) {
            int ok = 0;
            char list[32] = "";
            size_t len = 0;
            for (const int *a = pd->allowed; *a; a++) {
                ok |= *a == v;
                len += (size_t)snprintf(list + len, sizeof list - len, "%s%d", a == pd->allowed ? "" : ",", *a);
            }
            if (!ok)
                return kvs_fail(KVS_ERR_INVALID_ARG, "codec %s: %s=%s not one of {%s}", cd->name, pd->key, text,
                                list);
        }
        out->i = v;
        return KVS_OK;
    }
    case P_ENUM: {
        int idx = enum_index(pd->choices, text, n);
        if (idx < 0)
            return kvs_fail(KVS_ERR_INVALID_ARG, "codec %s: %s=%s is not one of %s", cd->name, pd->key, text,
                            pd->choices);
        out->i = idx;
        return KVS_OK;
    }
    case P_SCALE: {
        if (strcmp(text, "prompt") == 0) {
            out->is_prompt = 1;
            return KVS_OK;
        }
        char *end = NULL;
        errno = 0;
        double v = strtod(text, &end);
        float f = (float)v;
        if (errno != 0 || end == text || *end != '\0' || !isfinite(v) || !(f > 0.0f) || !isfinite(f))
            return kvs_fail(KVS_ERR_INVALID_ARG,
                            "codec %s: %s=%s must be a positive number (fp32, finite) or 'prompt'", cd->name,
                            pd->key, text);
        out->f = f;
        return KVS_OK;
    }
    case P_RATIO: {
        char *end = NULL;
        errno = 0;
        double v = strtod(text, &end);
        if (errno != 0 || end == text || *end != '\0' || !isfinite(v) || !(v >= 0.0 && v < 1.0))
            return kvs_fail(KVS_ERR_INVALID_ARG, "codec %s: %s=%s must be a number in [0, 1)", cd->name, pd->key,
                            text);
        out->r = v == 0.0 ? 0.0 : v; /* -0 reads as 0: one canonical text */
        return KVS_OK;
    }
    }
    return kvs_fail(KVS_ERR_INVALID_ARG, "codec %s: bad parameter table", cd->name);
}

kvs_status kvs_codec_parse(const char *spec, kvs_codec **out) {
    if (!out) return kvs_fail(KVS_ERR_INVALID_ARG, "codec: NULL output");
    *out = NULL;
    if (!spec || !spec[0])
        return kvs_fail(KVS_ERR_INVALID_ARG, "codec: empty spec (one of int, kivi, hf, fp8, think [:key=value,...])");
    const char *colon = strchr(spec, ':');
    size_t name_len = colon ? (size_t)(colon - spec) : strlen(spec);
    const codec_def *cd = NULL;
    for (int i = 0; i < N_DEFS; i++)
        if (strlen(DEFS[i].name) == name_len && memcmp(DEFS[i].name, spec, name_len) == 0) cd = &DEFS[i];
    if (!cd)
        return kvs_fail(KVS_ERR_INVALID_ARG, "codec: unknown codec '%.*s' (one of int, kivi, hf, fp8, think)",
                        (int)(name_len > 64 ? 64 : name_len), spec);

    param_val vals[MAX_PARAMS];
    int given[MAX_PARAMS] = {0};
    for (int i = 0; i < cd->n_params; i++) {
        kvs_status st = parse_value(cd, &cd->params[i], cd->params[i].def, strlen(cd->params[i].def), &vals[i]);
        if (st != KVS_OK) return st; /* a default that does not parse is a table bug */
    }
    if (colon) {
        const char *p = colon + 1;
        if (!*p) return kvs_fail(KVS_ERR_INVALID_ARG, "codec %s: empty parameter list after ':'", cd->name);
        for (;;) {
            const char *comma = strchr(p, ',');
            size_t len = comma ? (size_t)(comma - p) : strlen(p);
            const char *eq = memchr(p, '=', len);
            if (len == 0) return kvs_fail(KVS_ERR_INVALID_ARG, "codec %s: empty parameter in '%s'", cd->name, spec);
            if (!eq)
                return kvs_fail(KVS_ERR_INVALID_ARG, "codec %s: '%.*s' is not key=value", cd->name,
                                (int)(len > 64 ? 64 : len), p);
            size_t klen = (size_t)(eq - p);
            int k = -1;
            for (int i = 0; i < cd->n_params; i++)
                if (strlen(cd->params[i].key) == klen && memcmp(cd->params[i].key, p, klen) == 0) k = i;
            if (k < 0) {
                char keys[96] = "";
                size_t kl = 0;
                for (int i = 0; i < cd->n_params; i++)
                    kl += (size_t)snprintf(keys + kl, sizeof keys - kl, "%s%s", i ? ", " : "", cd->params[i].key);
                return kvs_fail(KVS_ERR_INVALID_ARG, "codec %s: unknown key '%.*s' (keys: %s)", cd->name,
                                (int)(klen > 64 ? 64 : klen), p, keys);
            }
            if (given[k]) return kvs_fail(KVS_ERR_INVALID_ARG, "codec %s: %s given twice", cd->name, cd->params[k].key);
            given[k] = 1;
            kvs_status st = parse_value(cd, &cd->params[k], eq + 1, len - klen - 1, &vals[k]);
            if (st != KVS_OK) return st;
            if (!comma) break;
            p = comma + 1;
        }
    }

    kvs_codec *c = calloc(1, sizeof *c);
    if (!c) return kvs_fail(KVS_ERR_NOMEM, "codec: out of memory");
    c->kind = cd->kind;
    c->scale = 1.0f;
    switch (cd->kind) {
    case KVS_CODEC_INT:
        c->bits = (int)vals[0].i;
        c->group = vals[1].i;
        c->axis[KVS_CODEC_K] = (kvs_codec_axis)vals[2].i;
        c->axis[KVS_CODEC_V] = (kvs_codec_axis)vals[3].i;
        break;
    case KVS_CODEC_KIVI:
        c->bits = (int)vals[0].i;
        c->group = vals[1].i;
        c->residual = vals[2].i;
        c->axis[KVS_CODEC_K] = KVS_CODEC_AXIS_TOKEN;
        c->axis[KVS_CODEC_V] = KVS_CODEC_AXIS_CHANNEL;
        /* Algorithm 1 flushes R keys into R/G whole groups: R must be a multiple of G (the repository asserts it) */
        if (c->residual % c->group != 0) {
            free(c);
            return kvs_fail(KVS_ERR_INVALID_ARG, "codec kivi: residual=%lld must be a multiple of group=%lld",
                            (long long)vals[2].i, (long long)vals[1].i);
        }
        break;
    case KVS_CODEC_HF:
        c->bits = (int)vals[0].i;
        c->group = vals[1].i;
        c->residual = vals[2].i;
        c->axis[KVS_CODEC_K] = c->axis[KVS_CODEC_V] = KVS_CODEC_AXIS_CHANNEL;
        break;
    case KVS_CODEC_FP8:
        c->format = (kvs_codec_fp8_format)vals[0].i;
        c->scale_prompt = vals[1].is_prompt;
        c->scale = vals[1].is_prompt ? 1.0f : vals[1].f;
        c->per_head = (int)vals[2].i;
        c->axis[KVS_CODEC_K] = c->axis[KVS_CODEC_V] = KVS_CODEC_AXIS_CHANNEL;
        /* one number for every head is per-tensor already: per=head with a number would be a second spelling */
        if (c->per_head && !c->scale_prompt) {
            free(c);
            return kvs_fail(KVS_ERR_INVALID_ARG, "codec fp8: per=head needs scale=prompt (a number is one scale "
                                                 "for every head)");
        }
        break;
    case KVS_CODEC_THINK:
        c->ratio = vals[0].r;
        c->window = vals[1].i;
        c->recent = vals[2].i;
        /* V is held whole and K per channel: the channel axis, so that no token-axis group is ever assumed */
        c->axis[KVS_CODEC_K] = c->axis[KVS_CODEC_V] = KVS_CODEC_AXIS_CHANNEL;
        break;
    }

    /* the canonical spec: every key in table order */
    size_t len = (size_t)snprintf(c->spec, sizeof c->spec, "%s:", cd->name);
    for (int i = 0; i < cd->n_params; i++) {
        const param_def *pd = &cd->params[i];
        char val[48];
        if (pd->type == P_INT)
            snprintf(val, sizeof val, "%lld", (long long)vals[i].i);
        else if (pd->type == P_ENUM)
            enum_name(pd->choices, (int)vals[i].i, val, sizeof val);
        else if (pd->type == P_RATIO)
            format_double(val, sizeof val, vals[i].r);
        else if (vals[i].is_prompt)
            snprintf(val, sizeof val, "prompt");
        else
            format_float(val, sizeof val, vals[i].f);
        len += (size_t)snprintf(c->spec + len, sizeof c->spec - len, "%s%s=%s", i ? "," : "", pd->key, val);
    }
    KVS_ASSERT(len < sizeof c->spec);
    *out = c;
    return KVS_OK;
}

void kvs_codec_free(kvs_codec *c) { free(c); }

const char *kvs_codec_spec(const kvs_codec *c) { return c->spec; }

kvs_codec_kind kvs_codec_kind_of(const kvs_codec *c) { return c->kind; }

/* Groups of `group` channels over a row of d: the last one may be narrower; a group wider than d is the row. */
static int64_t channel_groups(const kvs_codec *c, int64_t d) { return (d + c->group - 1) / c->group; }

double kvs_codec_position_bytes(const kvs_codec *c, int64_t d) {
    if (c->kind == KVS_CODEC_FP8) return 2.0 * (double)d;
    if (c->kind == KVS_CODEC_THINK) return 2.0 * (double)kvs_codec_kept_channels(c, d) + 2.0 * (double)d;
    double total = 0;
    for (int t = 0; t < 2; t++) {
        total += (double)d * c->bits / 8.0;
        if (c->axis[t] == KVS_CODEC_AXIS_CHANNEL)
            total += 4.0 * (double)channel_groups(c, d);
        else
            total += 4.0 * (double)d / (double)c->group;
    }
    return total;
}

double kvs_codec_layer_bytes(const kvs_codec *c) {
    return c->kind == KVS_CODEC_FP8 && c->scale_prompt && !c->per_head ? 8.0 : 0.0;
}

/* ---- the arithmetic ---------------------------------------------------------------------------------------- */

/* The stored fp16 scale and zero of a group (codec.h "Integer arithmetic"); KVS_ERR_RANGE (detail without the
 * group's place: the callers prefix it) for non-finite input or an fp16 overflow. */
static kvs_status group_params(const float *x, int64_t stride, int64_t m, int bits, float *scale, float *zero) {
    float mn = x[0], mx = x[0];
    for (int64_t i = 0; i < m; i++) {
        float v = x[i * stride];
        if (!isfinite(v)) return kvs_fail(KVS_ERR_RANGE, "non-finite value %g", (double)v);
        if (v < mn) mn = v;
        if (v > mx) mx = v;
    }
    float levels = (float)((1 << bits) - 1);
    float range = mx - mn;
    float z = kvs_f16_to_f32(kvs_f32_to_f16(mn));
    float s = kvs_f16_to_f32(kvs_f32_to_f16(range / levels));
    if (!isfinite(z)) return kvs_fail(KVS_ERR_RANGE, "minimum %g does not fit fp16", (double)mn);
    if (!isfinite(s)) return kvs_fail(KVS_ERR_RANGE, "scale (%g - %g) / %g does not fit fp16", (double)mx,
                                      (double)mn, (double)levels);
    *scale = s;
    *zero = z;
    return KVS_OK;
}

static void group_apply(const float *x, int64_t stride, int64_t m, int bits, float scale, float zero, float *out) {
    float levels = (float)((1 << bits) - 1);
    for (int64_t i = 0; i < m; i++) {
        float q = 0.0f;
        if (scale > 0.0f) {
            float t = (x[i * stride] - zero) / scale;
            q = rintf(t); /* the default rounding mode: to nearest, ties to even */
            if (q < 0.0f) q = 0.0f;
            if (q > levels) q = levels;
        }
        /* two statements: no contraction into a fused multiply-add, whatever the compiler's -ffp-contract */
        float prod = q * scale;
        out[i * stride] = prod + zero;
    }
}

kvs_status kvs_codec_quant_group(const float *x, int64_t stride, int64_t m, int bits, float *out, float *scale,
                                 float *zero) {
    if (!(bits == 2 || bits == 3 || bits == 4 || bits == 8) || m < 1 || stride < 1 || !x || !out)
        return kvs_fail(KVS_ERR_INVALID_ARG, "codec: quant_group needs bits in {2,3,4,8}, m >= 1, stride >= 1");
    float s, z;
    kvs_status st = group_params(x, stride, m, bits, &s, &z);
    if (st != KVS_OK) return st;
    group_apply(x, stride, m, bits, s, z, out);
    if (scale) *scale = s;
    if (zero) *zero = z;
    return KVS_OK;
}

float kvs_codec_fp8_max(kvs_codec_fp8_format format) { return format == KVS_CODEC_E4M3 ? 448.0f : 57344.0f; }

float kvs_codec_fp8_round(float x, kvs_codec_fp8_format format) {
    if (isnan(x)) return x;
    const float max = kvs_codec_fp8_max(format);
    const int mant = format == KVS_CODEC_E4M3 ? 3 : 2;      /* stored mantissa bits */
    const int emin = format == KVS_CODEC_E4M3 ? -6 : -14;   /* exponent of the smallest normal */
    float a = fabsf(x);
    if (a >= max) {
        a = max; /* saturate (vLLM clamps before the cast; e4m3fn has no infinity) */
    } else if (a > 0.0f) {
        int e;
        (void)frexpf(a, &e); /* a = f * 2^e with f in [0.5, 1): a lies in [2^(e-1), 2^e) */
        e -= 1;
        if (e < emin) e = emin; /* subnormals share the smallest normal's spacing */
        float quantum = ldexpf(1.0f, e - mant);
        /* a / quantum and the product are exact (powers of two); rintf rounds to nearest even. Below max the result
         * is at most max: the values between the largest finite and the next binade's first step round down. */
        a = rintf(a / quantum) * quantum;
    }
    return copysignf(a, x);
}

/* ---- ThinK: query-driven key channel pruning ------------------------------------------------------------ */

/* Prompt positions [0, P - recent) are pruned; the last `recent` and every decode position are kept whole. */
static int64_t think_pruned_prefix(const kvs_codec *c, int64_t P) { return P > c->recent ? P - c->recent : 0; }

int64_t kvs_codec_kept_channels(const kvs_codec *c, int64_t d) {
    if (c->kind != KVS_CODEC_THINK) return d;
    /* the authors' int(head_dim * ratio) pruned channels: the double product truncated, as Python's int() does */
    return d - (int64_t)((double)d * c->ratio);
}

int64_t kvs_codec_query_window(const kvs_codec *c) { return c->kind == KVS_CODEC_THINK ? c->window : 0; }

int kvs_codec_needs_queries(const kvs_codec *c) { return kvs_codec_query_window(c) > 0; }

/* acc[c] += sum over `rows` rows of x (row-major, d wide) of x_c^2, in double, rows in order. */
static void sum_squares(const float *x, int64_t rows, int64_t d, double *acc) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < d; j++) {
            double v = (double)x[r * d + j];
            acc[j] += v * v;
        }
}

/* keep[c] = 0 for the n_prune channels of lowest score (a tie prunes the lower channel index first), 1 otherwise.
 * O(d^2) by counting each channel's rank, once per stream: d <= 256 in every model kvsim reads. */
static void rank_keep(const double *score, int64_t d, int64_t n_prune, uint8_t *keep) {
    for (int64_t j = 0; j < d; j++) {
        int64_t rank = 0;
        for (int64_t i = 0; i < d; i++) rank += score[i] < score[j] || (score[i] == score[j] && i < j);
        keep[j] = rank >= n_prune;
    }
}

static kvs_status check_finite(const char *spec, const char *what, const float *x, int64_t rows, int64_t d) {
    for (int64_t i = 0; i < rows * d; i++)
        if (!isfinite(x[i]))
            return kvs_fail(KVS_ERR_RANGE, "codec %s: non-finite %s at row %lld channel %lld", spec, what,
                            (long long)(i / d), (long long)(i % d));
    return KVS_OK;
}

kvs_status kvs_codec_think_channels(const kvs_codec *c, const float *q, int64_t n_q, int group, const float *k,
                                    int64_t P, int64_t d, double *score, uint8_t *keep) {
    if (!c || c->kind != KVS_CODEC_THINK)
        return kvs_fail(KVS_ERR_INVALID_ARG, "codec: think_channels needs a think codec");
    if (n_q < 0 || P < 0 || group < 1 || d < 1 || d > KVS_CODEC_MAX_HEAD_DIM || (n_q > 0 && !q) || (P > 0 && !k) ||
        !score || !keep)
        return kvs_fail(KVS_ERR_INVALID_ARG, "codec %s: think_channels: bad sizes or NULL arrays", c->spec);
    kvs_status rc = check_finite(c->spec, "query", q, n_q * group, d);
    if (rc == KVS_OK) rc = check_finite(c->spec, "K", k, P, d);
    if (rc != KVS_OK) return rc;
    for (int64_t j = 0; j < d; j++) score[j] = 0.0;
    sum_squares(q, n_q * group, d, score);
    for (int64_t j = 0; j < d; j++) {
        double ksq = 0.0;
        for (int64_t p = 0; p < P; p++) ksq += (double)k[p * d + j] * (double)k[p * d + j];
        score[j] = sqrt(score[j] * ksq); /* one rounding: equal products tie exactly */
    }
    rank_keep(score, d, d - kvs_codec_kept_channels(c, d), keep);
    return KVS_OK;
}

/* ---- one stream ------------------------------------------------------------------------------------------- */

struct kvs_codec_state {
    const kvs_codec *c;
    int64_t d, cap;
    int64_t P;          /* prompt length; -1 before the prefill */
    int64_t n;          /* current step */
    int64_t q[2];       /* quantized prefix of K, V at step n */
    int need_share;     /* fp8 per=tensor: kvs_codec_share_scale still to call */
    float amax[2];      /* fp8 scale=prompt: amax of the prompt's K, V */
    float scale[2];     /* fp8 scale in use for K, V */
    float *rows[2];     /* [cap][d]: what attention sees */
    uint32_t *pos_mark; /* [cap]: epoch stamps of kvs_codec_state_bytes (repeats) */
    uint32_t *grp_mark[2]; /* K, V: [cap / group + 1]: epoch stamps of token-axis groups already counted */
    uint32_t epoch;
    /* think (NULL / -1 for the other codecs) */
    double *qsq;        /* [d]: sum of q_c^2 over the window's queries of the group (prefill_queries) */
    double *score;      /* [d]: ||Q_c||_2 * ||K_c||_2 after the prefill */
    uint8_t *keep;      /* [d]: 1 = channel kept */
    int64_t q_rows;     /* query positions of the window read; -1 before prefill_queries */
    int64_t q_given;    /* query positions the driver passed */
};

/* Entries of a token-axis group stamp array: one per group of up to cap positions (fp8, groupless, gets cap + 1). */
static size_t n_groups(const kvs_codec_state *st) {
    return (size_t)(st->cap / (st->c->group > 0 ? st->c->group : 1) + 1);
}

kvs_status kvs_codec_state_create(const kvs_codec *c, int64_t d, int64_t max_positions, kvs_codec_state **out) {
    if (!out) return kvs_fail(KVS_ERR_INVALID_ARG, "codec: NULL output");
    *out = NULL;
    if (!c) return kvs_fail(KVS_ERR_INVALID_ARG, "codec: NULL codec");
    if (d < 1 || d > KVS_CODEC_MAX_HEAD_DIM)
        return kvs_fail(KVS_ERR_INVALID_ARG, "codec %s: head_dim %lld outside 1..%d", c->spec, (long long)d,
                        KVS_CODEC_MAX_HEAD_DIM);
    if (max_positions < 1 || (uint64_t)max_positions > ((uint64_t)1 << 40) / (uint64_t)d)
        return kvs_fail(KVS_ERR_INVALID_ARG, "codec %s: max_positions %lld out of range", c->spec,
                        (long long)max_positions);
    kvs_codec_state *st = calloc(1, sizeof *st);
    if (!st) return kvs_fail(KVS_ERR_NOMEM, "codec: out of memory");
    st->c = c;
    st->d = d;
    st->cap = max_positions;
    st->P = -1;
    st->n = -1;
    st->scale[0] = st->scale[1] = c->scale;
    size_t nrow = (size_t)max_positions * (size_t)d;
    st->rows[0] = kvs_alloc_rows(nrow * sizeof(float));
    st->rows[1] = kvs_alloc_rows(nrow * sizeof(float));
    st->pos_mark = calloc((size_t)max_positions, sizeof(uint32_t));
    for (int t = 0; t < 2; t++) st->grp_mark[t] = calloc(n_groups(st), sizeof(uint32_t));
    st->q_rows = -1;
    int think_ok = 1;
    if (c->kind == KVS_CODEC_THINK) {
        st->qsq = calloc((size_t)d, sizeof(double));
        st->score = calloc((size_t)d, sizeof(double));
        st->keep = calloc((size_t)d, 1);
        think_ok = st->qsq && st->score && st->keep;
    }
    if (!st->rows[0] || !st->rows[1] || !st->pos_mark || !st->grp_mark[0] || !st->grp_mark[1] || !think_ok) {
        kvs_codec_state_free(st);
        return kvs_fail(KVS_ERR_NOMEM, "codec %s: out of memory for %lld positions x %lld", c->spec,
                        (long long)max_positions, (long long)d);
    }
    *out = st;
    return KVS_OK;
}

void kvs_codec_state_free(kvs_codec_state *st) {
    if (!st) return;
    free(st->rows[0]);
    free(st->rows[1]);
    free(st->pos_mark);
    free(st->grp_mark[0]);
    free(st->grp_mark[1]);
    free(st->qsq);
    free(st->score);
    free(st->keep);
    free(st);
}

static const char *tensor_name(int t) { return t == KVS_CODEC_K ? "K" : "V"; }

/* fp8 scale=prompt: amax / max_fp8, 1 when the prompt is all zero (or the quotient underflows). */
static float calibrated_scale(float amax, kvs_codec_fp8_format f) {
    float s = amax / kvs_codec_fp8_max(f);
    return s > 0.0f && isfinite(s) ? s : 1.0f;
}

kvs_status kvs_codec_state_prefill_queries(kvs_codec_state *st, const float *q, int64_t n_q, int group) {
    const kvs_codec *c = st->c;
    if (c->kind != KVS_CODEC_THINK)
        return kvs_fail(KVS_ERR_INVALID_ARG, "codec %s reads no queries (kvs_codec_needs_queries is 0)", c->spec);
    if (st->P >= 0) return kvs_fail(KVS_ERR_STATE, "codec %s: queries after the prefill", c->spec);
    if (st->q_rows >= 0) return kvs_fail(KVS_ERR_STATE, "codec %s: prefill_queries called twice", c->spec);
    if (n_q < 0 || n_q > st->cap || group < 1 || group > 65536 || (n_q > 0 && !q))
        return kvs_fail(KVS_ERR_INVALID_ARG, "codec %s: queries of %lld positions x %d heads (state holds %lld)",
                        c->spec, (long long)n_q, group, (long long)st->cap);
    const int64_t d = st->d;
    const int64_t w = n_q < c->window ? n_q : c->window;
    const float *win = q ? q + (size_t)(n_q - w) * (size_t)group * (size_t)d : NULL;
    kvs_status rc = check_finite(c->spec, "window query", win, w * group, d);
    if (rc != KVS_OK) return rc;
    for (int64_t j = 0; j < d; j++) st->qsq[j] = 0.0;
    sum_squares(win, w * group, d, st->qsq);
    st->q_rows = w;
    st->q_given = n_q;
    return KVS_OK;
}

/* ThinK's prefill: the channel scores from the window's queries (summed at prefill_queries) and the prompt's keys,
 * and the kept set. Writes only score and keep. */
static kvs_status think_prefill(kvs_codec_state *st, const float *k, int64_t P) {
    const kvs_codec *c = st->c;
    const int64_t d = st->d;
    if (P == 0) { /* nothing to prune: every channel kept */
        for (int64_t j = 0; j < d; j++) st->score[j] = 0.0, st->keep[j] = 1;
        return KVS_OK;
    }
    if (st->q_rows < 0)
        return kvs_fail(KVS_ERR_STATE, "codec %s: prefill before kvs_codec_state_prefill_queries (ThinK scores the "
                        "key channels with the window's queries)", c->spec);
    const int64_t w = P < c->window ? P : c->window;
    if (st->q_given > P)
        return kvs_fail(KVS_ERR_INVALID_ARG, "codec %s: queries of %lld positions for a prompt of %lld (the window "
                        "ends at the prompt's last position)", c->spec, (long long)st->q_given, (long long)P);
    if (st->q_rows < w)
        return kvs_fail(KVS_ERR_INVALID_ARG, "codec %s: queries of %lld positions, the window needs min(window, P) "
                        "= %lld", c->spec, (long long)st->q_rows, (long long)w);
    kvs_status rc = check_finite(c->spec, "prompt K", k, P, d);
    if (rc != KVS_OK) return rc;
    for (int64_t j = 0; j < d; j++) {
        double ksq = 0.0;
        for (int64_t p = 0; p < P; p++) ksq += (double)k[p * d + j] * (double)k[p * d + j];
        st->score[j] = sqrt(st->qsq[j] * ksq);
    }
    rank_keep(st->score, d, d - kvs_codec_kept_channels(c, d), st->keep);
    return KVS_OK;
}

kvs_status kvs_codec_state_prefill(kvs_codec_state *st, const float *k, const float *v, int64_t P) {
    if (st->P >= 0) return kvs_fail(KVS_ERR_STATE, "codec %s: prefill called twice", st->c->spec);
    if (P < 0 || P > st->cap)
        return kvs_fail(KVS_ERR_INVALID_ARG, "codec %s: prompt of %lld positions (state holds %lld)", st->c->spec,
                        (long long)P, (long long)st->cap);
    if (P > 0 && (!k || !v)) return kvs_fail(KVS_ERR_INVALID_ARG, "codec %s: NULL prompt rows", st->c->spec);
    const kvs_codec *c = st->c;
    if (c->kind == KVS_CODEC_THINK) {
        kvs_status rc = think_prefill(st, k, P);
        if (rc != KVS_OK) return rc;
    }
    size_t n = (size_t)P * (size_t)st->d;
    float amax[2] = {0.0f, 0.0f};
    if (c->kind == KVS_CODEC_FP8 && c->scale_prompt) {
        for (int t = 0; t < 2; t++) {
            const float *x = t == KVS_CODEC_K ? k : v;
            for (size_t i = 0; i < n; i++) {
                if (!isfinite(x[i]))
                    return kvs_fail(KVS_ERR_RANGE, "codec %s: non-finite %s at prompt position %lld", c->spec,
                                    tensor_name(t), (long long)(i / (size_t)st->d));
                float a = fabsf(x[i]);
                if (a > amax[t]) amax[t] = a;
            }
        }
    }
    if (n) {
        memcpy(st->rows[0], k, n * sizeof(float));
        memcpy(st->rows[1], v, n * sizeof(float));
    }
    st->amax[0] = amax[0];
    st->amax[1] = amax[1];
    if (c->kind == KVS_CODEC_FP8 && c->scale_prompt) {
        if (c->per_head) {
            st->scale[0] = calibrated_scale(amax[0], c->format);
            st->scale[1] = calibrated_scale(amax[1], c->format);
        } else {
            st->need_share = 1;
        }
    }
    st->P = P;
    st->n = P;
    st->q[0] = st->q[1] = 0;
    return KVS_OK;
}

kvs_status kvs_codec_share_scale(kvs_codec_state *const *states, int n_states) {
    if (n_states < 1 || !states || !states[0]) return kvs_fail(KVS_ERR_INVALID_ARG, "codec: no states to share");
    const kvs_codec *c = states[0]->c;
    for (int i = 0; i < n_states; i++) {
        if (!states[i] || strcmp(states[i]->c->spec, c->spec) != 0)
            return kvs_fail(KVS_ERR_INVALID_ARG, "codec %s: share_scale over states of different codecs", c->spec);
    }
    if (!(c->kind == KVS_CODEC_FP8 && c->scale_prompt && !c->per_head)) return KVS_OK;
    float amax[2] = {0.0f, 0.0f};
    for (int i = 0; i < n_states; i++) {
        const kvs_codec_state *s = states[i];
        if (s->P < 0 || s->n != s->P)
            return kvs_fail(KVS_ERR_STATE, "codec %s: share_scale needs every head after its prefill and before its "
                            "first decode step (state %d)", c->spec, i);
        for (int t = 0; t < 2; t++)
            if (s->amax[t] > amax[t]) amax[t] = s->amax[t];
    }
    for (int i = 0; i < n_states; i++) {
        states[i]->scale[0] = calibrated_scale(amax[0], c->format);
        states[i]->scale[1] = calibrated_scale(amax[1], c->format);
        states[i]->need_share = 0;
    }
    return KVS_OK;
}

/* The time rule's quantized prefix of tensor t at step n for a prompt of P positions (codec.h). */
static int64_t quantized_prefix(const kvs_codec *c, int t, int64_t P, int64_t n) {
    if (n <= P) return 0;
    switch ((int)c->kind) { /* int: KVS_CODEC_THINK lies outside the enumerators (codec.h) */
    case KVS_CODEC_INT:
        return c->axis[t] == KVS_CODEC_AXIS_CHANNEL ? n : c->group * (n / c->group);
    case KVS_CODEC_KIVI:
        if (t == KVS_CODEC_K) return c->residual * ((n - 1) / c->residual);
        return n - 1 - c->residual > 0 ? n - 1 - c->residual : 0;
    case KVS_CODEC_HF:
        return P + c->residual * ((n - 1 - P) / c->residual);
    case KVS_CODEC_FP8:
        return n;
    case KVS_CODEC_THINK:
        return t == KVS_CODEC_K ? think_pruned_prefix(c, P) : 0;
    }
    return 0;
}

/* Checks (pass 0) or quantizes in place (pass 1) the rows [a, b) of tensor t: token-axis groups (a and b are
 * multiples of the group), channel-axis groups of each row, or fp8 elements. Pass 0 touches nothing, so that an
 * error leaves the state unchanged. */
static kvs_status quantize_range(kvs_codec_state *st, int t, int64_t a, int64_t b, int pass) {
    const kvs_codec *c = st->c;
    const int64_t d = st->d;
    float *rows = st->rows[t];
    if (c->kind == KVS_CODEC_THINK) { /* K only (q_V = 0): the pruned channels read as zero */
        KVS_ASSERT(t == KVS_CODEC_K || a == b);
        if (pass == 1)
            for (int64_t p = a; p < b; p++)
                for (int64_t j = 0; j < d; j++)
                    if (!st->keep[j]) rows[p * d + j] = 0.0f;
        return KVS_OK;
    }
    if (c->kind == KVS_CODEC_FP8) {
        const float scale = st->scale[t];
        for (int64_t p = a; p < b; p++) {
            float *x = rows + p * d;
            for (int64_t j = 0; j < d; j++) {
                if (pass == 0) {
                    if (!isfinite(x[j]))
                        return kvs_fail(KVS_ERR_RANGE, "codec %s: non-finite %s at position %lld channel %lld",
                                        c->spec, tensor_name(t), (long long)p, (long long)j);
                    continue;
                }
                float y = x[j] / scale;
                float r = kvs_codec_fp8_round(y, c->format);
                x[j] = r * scale;
            }
        }
        return KVS_OK;
    }
    if (c->axis[t] == KVS_CODEC_AXIS_TOKEN) {
        const int64_t G = c->group;
        KVS_ASSERT(a % G == 0 && b % G == 0);
        for (int64_t g0 = a; g0 < b; g0 += G) {
            for (int64_t j = 0; j < d; j++) {
                float *x = rows + g0 * d + j;
                float s, z;
                kvs_status rc = group_params(x, d, G, c->bits, &s, &z);
                if (rc != KVS_OK)
                    return kvs_fail(rc, "codec %s: %s group of positions %lld..%lld, channel %lld: %s", c->spec,
                                    tensor_name(t), (long long)g0, (long long)(g0 + G - 1), (long long)j,
                                    kvs_last_error());
                if (pass == 1) group_apply(x, d, G, c->bits, s, z, x);
            }
        }
        return KVS_OK;
    }
    const int64_t G = c->group;
    for (int64_t p = a; p < b; p++) {
        for (int64_t j0 = 0; j0 < d; j0 += G) {
            int64_t m = d - j0 < G ? d - j0 : G;
            float *x = rows + p * d + j0;
            float s, z;
            kvs_status rc = group_params(x, 1, m, c->bits, &s, &z);
            if (rc != KVS_OK)
                return kvs_fail(rc, "codec %s: %s group of position %lld, channels %lld..%lld: %s", c->spec,
                                tensor_name(t), (long long)p, (long long)j0, (long long)(j0 + m - 1),
                                kvs_last_error());
            if (pass == 1) group_apply(x, 1, m, c->bits, s, z, x);
        }
    }
    return KVS_OK;
}

kvs_status kvs_codec_state_advance(kvs_codec_state *st, const float *k, const float *v, int64_t n) {
    const kvs_codec *c = st->c;
    if (st->P < 0) return kvs_fail(KVS_ERR_STATE, "codec %s: advance before the prefill", c->spec);
    if (st->need_share)
        return kvs_fail(KVS_ERR_STATE, "codec %s: per=tensor scale not shared yet (kvs_codec_share_scale over the "
                        "layer's heads after their prefill)", c->spec);
    if (n < st->n)
        return kvs_fail(KVS_ERR_STATE, "codec %s: step %lld after step %lld (positions arrive in order)", c->spec,
                        (long long)n, (long long)st->n);
    if (n > st->cap)
        return kvs_fail(KVS_ERR_INVALID_ARG, "codec %s: step %lld beyond the %lld positions of the state", c->spec,
                        (long long)n, (long long)st->cap);
    if (n == st->n) return KVS_OK;
    if (!k || !v) return kvs_fail(KVS_ERR_INVALID_ARG, "codec %s: NULL rows", c->spec);
    const int64_t d = st->d;
    /* rows [n_prev, n) as captured: the only rows of the caller read (rows below were copied at earlier steps) */
    size_t off = (size_t)st->n * (size_t)d, cnt = (size_t)(n - st->n) * (size_t)d;
    memcpy(st->rows[0] + off, k + off, cnt * sizeof(float));
    memcpy(st->rows[1] + off, v + off, cnt * sizeof(float));
    int64_t q_new[2];
    for (int t = 0; t < 2; t++) {
        q_new[t] = quantized_prefix(c, t, st->P, n);
        KVS_ASSERT(q_new[t] >= st->q[t] && q_new[t] <= n);
    }
    for (int pass = 0; pass < 2; pass++) {
        for (int t = 0; t < 2; t++) {
            kvs_status rc = quantize_range(st, t, st->q[t], q_new[t], pass);
            if (rc != KVS_OK) return rc; /* pass 0 only: nothing written below n_prev, n not moved */
        }
    }
    st->q[0] = q_new[0];
    st->q[1] = q_new[1];
    st->n = n;
    return KVS_OK;
}

const float *kvs_codec_state_rows(const kvs_codec_state *st, kvs_codec_tensor t) { return st->rows[t]; }

int64_t kvs_codec_state_step(const kvs_codec_state *st) { return st->n; }

int64_t kvs_codec_state_quantized(const kvs_codec_state *st, kvs_codec_tensor t) { return st->q[t]; }

float kvs_codec_state_scale(const kvs_codec_state *st, kvs_codec_tensor t) { return st->scale[t]; }

const double *kvs_codec_state_channel_scores(const kvs_codec_state *st) { return st->P >= 0 ? st->score : NULL; }

const uint8_t *kvs_codec_state_kept(const kvs_codec_state *st) { return st->P >= 0 ? st->keep : NULL; }

kvs_status kvs_codec_state_bytes(kvs_codec_state *st, const int64_t *pos, int64_t m, kvs_codec_bytes *out) {
    const kvs_codec *c = st->c;
    memset(out, 0, sizeof *out);
    if (st->P < 0) return kvs_fail(KVS_ERR_STATE, "codec %s: bytes before the prefill", c->spec);
    if (m < 0 || (m > 0 && !pos)) return kvs_fail(KVS_ERR_INVALID_ARG, "codec %s: bad resident list", c->spec);
    if (++st->epoch == 0) { /* stamps wrapped: clear them once every 2^32 calls */
        memset(st->pos_mark, 0, (size_t)st->cap * sizeof(uint32_t));
        for (int t = 0; t < 2; t++) memset(st->grp_mark[t], 0, n_groups(st) * sizeof(uint32_t));
        st->epoch = 1;
    }
    const double d = (double)st->d;
    const double code_bytes = c->kind == KVS_CODEC_FP8 ? d : d * c->bits / 8.0;
    double codes[2] = {0, 0}, meta[2] = {0, 0}, full[2] = {0, 0};
    for (int64_t i = 0; i < m; i++) {
        int64_t p = pos[i];
        if (p < 0 || p >= st->n)
            return kvs_fail(KVS_ERR_INVALID_ARG, "codec %s: resident position %lld outside [0, %lld)", c->spec,
                            (long long)p, (long long)st->n);
        if (st->pos_mark[p] == st->epoch)
            return kvs_fail(KVS_ERR_INVALID_ARG, "codec %s: resident position %lld listed twice", c->spec,
                            (long long)p);
        st->pos_mark[p] = st->epoch;
    }
    if (c->kind == KVS_CODEC_THINK) {
        const double kept = (double)kvs_codec_kept_channels(c, st->d);
        int pruned_resident = 0;
        for (int64_t i = 0; i < m; i++) {
            if (pos[i] < st->q[KVS_CODEC_K]) {
                codes[0] += 2.0 * kept;
                pruned_resident = 1;
            } else {
                full[0] += 2.0 * d;
            }
            full[1] += 2.0 * d;
        }
        /* the channel mask, a torch.bool [d] per head in the authors' cache: one byte per channel, held while a
         * pruned row is (recover_cache reads it for the pruned rows only) */
        if (pruned_resident) meta[0] = d;
    }
    for (int t = 0; t < 2 && c->kind != KVS_CODEC_THINK; t++) {
        for (int64_t i = 0; i < m; i++) {
            int64_t p = pos[i];
            if (p >= st->q[t]) {
                full[t] += 2.0 * d;
                continue;
            }
            codes[t] += code_bytes;
            if (c->kind == KVS_CODEC_FP8) continue;
            if (c->axis[t] == KVS_CODEC_AXIS_CHANNEL) {
                meta[t] += 4.0 * (double)channel_groups(c, st->d);
            } else {
                int64_t g = p / c->group;
                if (st->grp_mark[t][g] != st->epoch) {
                    st->grp_mark[t][g] = st->epoch;
                    meta[t] += 4.0 * d;
                }
            }
        }
    }
    out->k_codes = codes[0];
    out->k_meta = meta[0];
    out->k_full = full[0];
    out->v_codes = codes[1];
    out->v_meta = meta[1];
    out->v_full = full[1];
    out->scale = c->kind == KVS_CODEC_FP8 && c->scale_prompt && c->per_head ? 8.0 : 0.0;
    out->total = out->k_codes + out->k_meta + out->k_full + out->v_codes + out->v_meta + out->v_full + out->scale;
    return KVS_OK;
}
