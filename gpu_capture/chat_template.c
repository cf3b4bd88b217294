/* chat_template.c — the Jinja-subset interpreter behind kvs_chat_render (see chat_template.h for the subset and
 * the reference it is tested against). Written from the Jinja2 Template Designer Documentation and the lexer
 * settings Hugging Face uses (trim_blocks, lstrip_blocks, no kept trailing newline).
 *
 * Layout: arena -> lexer (tags, text, whitespace control) -> parser (statements and expressions into an AST) ->
 * evaluator (values, scopes, filters, tests, methods) -> loading from a model folder.
 *
 * Errors inside the lexer, parser and evaluator leave through longjmp to the one entry point that started them:
 * every allocation of a parse or a render lives in one arena freed there, so an error path owns nothing else and
 * the deeply recursive code needs no status checks at each of its hundreds of call sites.
 */
#include "chat_template.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../common/sha256.h"

/* ------------------------------------------------------------------------------------------------ arena -- */

typedef struct ct_chunk {
    struct ct_chunk *next;
    size_t cap, used;
    max_align_t data[];
} ct_chunk;

/* Where an error jumps, and its status. */
typedef struct {
    jmp_buf jb;
    kvs_status st;
} ct_err;

typedef struct {
    ct_chunk *head;
    size_t total; /* bytes held */
    size_t limit;
    ct_err *jb;   /* where an allocation failure jumps */
} ct_arena;

/* The one error exit of lexer, parser and evaluator: records the detail, then jumps. */
static void ct_jump(ct_err *e, kvs_status s, const char *fmt, ...) __attribute__((format(printf, 3, 4), noreturn));
static void ct_jump(ct_err *e, kvs_status s, const char *fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    e->st = kvs_fail(s, "chat template: %s", buf);
    longjmp(e->jb, 1);
}

static void *ar_alloc(ct_arena *a, size_t n) {
    n = (n + sizeof(max_align_t) - 1) / sizeof(max_align_t) * sizeof(max_align_t);
    if (!a->head || a->head->cap - a->head->used < n) {
        size_t cap = n > 65536 ? n : 65536;
        if (a->total + cap > a->limit)
            ct_jump(a->jb, KVS_ERR_RANGE, "more than %zu MiB of scratch memory (limit)", a->limit >> 20);
        ct_chunk *c = malloc(sizeof *c + cap);
        if (!c) ct_jump(a->jb, KVS_ERR_NOMEM, "out of memory");
        c->next = a->head;
        c->cap = cap;
        c->used = 0;
        a->head = c;
        a->total += cap;
    }
    void *p = (char *)a->head->data + a->head->used;
    a->head->used += n;
    return p;
}

static char *ar_strdup(ct_arena *a, const char *s, size_t n) {
    char *p = ar_alloc(a, n + 1);
    memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

static void ar_free(ct_arena *a) {
    for (ct_chunk *c = a->head, *next; c; c = next) {
        next = c->next;
        free(c);
    }
    a->head = NULL;
    a->total = 0;
}

/* A growable array of pointers in the arena (old storage is abandoned on growth: parse-time only). */
typedef struct {
    void **v;
    size_t n, cap;
} ct_ptrs;

static void ptrs_push(ct_arena *a, ct_ptrs *p, void *x) {
    if (p->n == p->cap) {
        size_t cap = p->cap ? 2 * p->cap : 4;
        void **nv = ar_alloc(a, cap * sizeof *nv);
        if (p->n) memcpy(nv, p->v, p->n * sizeof *nv);
        p->v = nv;
        p->cap = cap;
    }
    p->v[p->n++] = x;
}

/* ------------------------------------------------------------------------------------------------ lexer -- */

enum { TK_TEXT, TK_BLOCK_BEGIN, TK_BLOCK_END, TK_VAR_BEGIN, TK_VAR_END, TK_COMMENT, TK_NAME, TK_STRING, TK_INT,
       TK_FLOAT, TK_OP, TK_EOF };

typedef struct {
    int kind;
    const char *s; /* TEXT/STRING: decoded (arena); NAME/OP: points into the source */
    size_t n;
    int64_t i;
    double f;
    int line;
    char lmod, rmod; /* tags: '-', '+' or 0 on the inner side of the delimiter ({%- / -%}) */
    int at_start;    /* TEXT: starts at byte 0 of the template */
} ct_tok;

typedef struct {
    ct_arena *ar;
    ct_err *jb;
    const char *src;
    size_t len, pos;
    int line;
    ct_tok *t;
    size_t n, cap;
} ct_lexer;

static ct_tok *lx_push(ct_lexer *L, int kind) {
    if (L->n == L->cap) {
        size_t cap = L->cap ? 2 * L->cap : 256;
        ct_tok *nt = ar_alloc(L->ar, cap * sizeof *nt);
        if (L->n) memcpy(nt, L->t, L->n * sizeof *nt);
        L->t = nt;
        L->cap = cap;
    }
    ct_tok *k = &L->t[L->n++];
    memset(k, 0, sizeof *k);
    k->kind = kind;
    k->line = L->line;
    return k;
}

static int is_ident_start(unsigned char c) { return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
static int is_ident(unsigned char c) { return is_ident_start(c) || (c >= '0' && c <= '9'); }
static int is_ws(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

static void lx_count_lines(ct_lexer *L, size_t from, size_t to) {
    for (size_t i = from; i < to; i++) L->line += L->src[i] == '\n';
}

/* Appends code point cp as UTF-8. */
static size_t utf8_put(char *o, uint32_t cp) {
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) { o[0] = (char)(0xC0 | cp >> 6); o[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | cp >> 12); o[1] = (char)(0x80 | ((cp >> 6) & 0x3F)); o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | cp >> 18); o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* A string literal at L->pos (quote included): Python escapes (\n \t \r \b \f \v \0 \a \\ \' \" \xHH \uHHHH
 * \UHHHHHHHH; an unknown escape keeps its backslash, as Python's unicode-escape does); newlines normalized. */
static void lx_string(ct_lexer *L) {
    char q = L->src[L->pos];
    size_t i = L->pos + 1, start_line = (size_t)L->line;
    char *o = ar_alloc(L->ar, L->len - L->pos + 1); /* decoded text is never longer than the source */
    size_t n = 0;
    for (;;) {
        if (i >= L->len) ct_jump(L->jb, KVS_ERR_FORMAT, "line %zu: unterminated string literal", start_line);
        char c = L->src[i];
        if (c == q) break;
        if (c == '\n') L->line++;
        if (c == '\r') {
            o[n++] = '\n';
            i += (i + 1 < L->len && L->src[i + 1] == '\n') ? 2 : 1;
            continue;
        }
        if (c != '\\') {
            o[n++] = c;
            i++;
            continue;
        }
        if (i + 1 >= L->len) ct_jump(L->jb, KVS_ERR_FORMAT, "line %d: unterminated string literal", L->line);
        char e = L->src[i + 1];
        int hex = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
        if (hex) {
            uint32_t cp = 0;
            if (i + 2 + (size_t)hex > L->len) ct_jump(L->jb, KVS_ERR_FORMAT, "line %d: truncated \\%c escape", L->line, e);
            for (int k = 0; k < hex; k++) {
                char h = L->src[i + 2 + (size_t)k];
                int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
                if (d < 0) ct_jump(L->jb, KVS_ERR_FORMAT, "line %d: bad \\%c escape", L->line, e);
                cp = cp * 16 + (uint32_t)d;
            }
            if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
                ct_jump(L->jb, KVS_ERR_UNSUPPORTED, "line %d: escape \\%c%.*s is not a Unicode scalar value", L->line, e,
                        hex, L->src + i + 2);
            n += utf8_put(o + n, cp);
            i += 2 + (size_t)hex;
            continue;
        }
        static const char esc_in[] = {'n', 't', 'r', 'b', 'f', 'v', 'a', '0', '\\', '\'', '"'};
        static const char esc_out[] = {'\n', '\t', '\r', '\b', '\f', '\v', '\a', '\0', '\\', '\'', '"'};
        int m = -1;
        for (int k = 0; k < (int)sizeof esc_in; k++)
            if (esc_in[k] == e) m = k;
        if (m >= 0) {
            o[n++] = esc_out[m];
        } else if (e == 'N') {
            ct_jump(L->jb, KVS_ERR_UNSUPPORTED, "line %d: \\N{...} escapes", L->line);
        } else {
            o[n++] = '\\';
            o[n++] = e;
        }
        i += 2;
    }
    ct_tok *k = lx_push(L, TK_STRING);
    k->line = (int)start_line;
    k->s = o;
    k->n = n;
    o[n] = '\0';
    L->pos = i + 1;
}

/* Expression tokens of one tag, up to its closing delimiter at bracket depth 0. */
static void lx_tag(ct_lexer *L, int block) {
    int depth = 0;
    int start_line = L->line;
    for (;;) {
        while (L->pos < L->len && is_ws((unsigned char)L->src[L->pos])) {
            L->line += L->src[L->pos] == '\n';
            L->pos++;
        }
        if (L->pos >= L->len)
            ct_jump(L->jb, KVS_ERR_FORMAT, "line %d: unclosed %s tag", start_line, block ? "{%" : "{{");
        const char *p = L->src + L->pos;
        size_t left = L->len - L->pos;
        if (depth == 0) {
            char m = (p[0] == '-' || p[0] == '+') ? p[0] : 0;
            const char *q = m ? p + 1 : p;
            size_t ql = m ? left - 1 : left;
            if (ql >= 2 && q[0] == (block ? '%' : '}') && q[1] == '}') {
                if (m == '+' && !block) ct_jump(L->jb, KVS_ERR_FORMAT, "line %d: '+}}' is not a delimiter", L->line);
                ct_tok *k = lx_push(L, block ? TK_BLOCK_END : TK_VAR_END);
                k->lmod = m;
                L->pos += (size_t)(q - p) + 2;
                return;
            }
        }
        unsigned char c = (unsigned char)p[0];
        if (c == '\'' || c == '"') {
            lx_string(L);
        } else if (is_ident_start(c)) {
            size_t n = 1;
            while (n < left && is_ident((unsigned char)p[n])) n++;
            ct_tok *k = lx_push(L, TK_NAME);
            k->s = p;
            k->n = n;
            L->pos += n;
        } else if (c >= '0' && c <= '9') {
            size_t n = 0;
            int flt = 0;
            while (n < left && ((p[n] >= '0' && p[n] <= '9') || p[n] == '_')) n++;
            if (n + 1 < left && p[n] == '.' && p[n + 1] >= '0' && p[n + 1] <= '9') {
                flt = 1;
                n++;
                while (n < left && ((p[n] >= '0' && p[n] <= '9') || p[n] == '_')) n++;
            }
            if (n < left && (p[n] == 'e' || p[n] == 'E')) {
                size_t m = n + 1;
                if (m < left && (p[m] == '+' || p[m] == '-')) m++;
                if (m < left && p[m] >= '0' && p[m] <= '9') {
                    flt = 1;
                    n = m;
                    while (n < left && p[n] >= '0' && p[n] <= '9') n++;
                }
            }
            char buf[64];
            size_t b = 0;
            for (size_t k2 = 0; k2 < n && b + 1 < sizeof buf; k2++)
                if (p[k2] != '_') buf[b++] = p[k2];
            buf[b] = '\0';
            if (n >= sizeof buf) ct_jump(L->jb, KVS_ERR_UNSUPPORTED, "line %d: number literal too long", L->line);
            ct_tok *k = lx_push(L, flt ? TK_FLOAT : TK_INT);
            if (flt) {
                k->f = strtod(buf, NULL);
            } else {
                unsigned long long v = strtoull(buf, NULL, 10);
                if (b > 18 && (v > (unsigned long long)INT64_MAX || b > 19))
                    ct_jump(L->jb, KVS_ERR_UNSUPPORTED, "line %d: integer literal beyond 64 bits", L->line);
                k->i = (int64_t)v;
            }
            L->pos += n;
        } else {
            static const char *const ops2[] = {"//", "**", "==", "!=", "<=", ">="};
            size_t n = 0;
            for (size_t k2 = 0; k2 < sizeof ops2 / sizeof *ops2; k2++)
                if (left >= 2 && p[0] == ops2[k2][0] && p[1] == ops2[k2][1]) n = 2;
            if (!n && strchr("+-*/%~<>=()[]{},.:|", c) && c) n = 1;
            if (!n) ct_jump(L->jb, KVS_ERR_FORMAT, "line %d: unexpected character '%c' in a tag", L->line, c);
            if (n == 1 && (c == '(' || c == '[' || c == '{')) depth++;
            if (n == 1 && (c == ')' || c == ']' || c == '}')) {
                if (depth == 0) ct_jump(L->jb, KVS_ERR_FORMAT, "line %d: unbalanced '%c'", L->line, c);
                depth--;
            }
            ct_tok *k = lx_push(L, TK_OP);
            k->s = p;
            k->n = n;
            L->pos += n;
        }
    }
}

/* Text with newlines normalized to "\n", as Jinja's lexer does. */
static void lx_text(ct_lexer *L, size_t a, size_t b) {
    char *o = ar_alloc(L->ar, b - a + 1);
    size_t n = 0;
    for (size_t i = a; i < b; i++) {
        if (L->src[i] == '\r') {
            o[n++] = '\n';
            if (i + 1 < b && L->src[i + 1] == '\n') i++;
        } else {
            o[n++] = L->src[i];
        }
    }
    o[n] = '\0';
    ct_tok *k = lx_push(L, TK_TEXT);
    k->s = o;
    k->n = n;
    k->at_start = a == 0;
    lx_count_lines(L, a, b);
}

/* Whitespace control, on the text tokens: "-" strips every whitespace character on its side; otherwise
 * trim_blocks drops the one newline after a block or comment tag and lstrip_blocks the spaces and tabs between
 * the start of a line and a block or comment tag ("+" turns either off for its tag). */
static void lx_whitespace(ct_lexer *L) {
    for (size_t i = 0; i < L->n; i++) {
        ct_tok *k = &L->t[i];
        if (k->kind != TK_TEXT) continue;
        char *s = (char *)k->s;
        size_t a = 0, b = k->n;
        const ct_tok *next = i + 1 < L->n ? &L->t[i + 1] : NULL;
        const ct_tok *prev = i > 0 ? &L->t[i - 1] : NULL;
        if (next && (next->kind == TK_BLOCK_BEGIN || next->kind == TK_VAR_BEGIN || next->kind == TK_COMMENT)) {
            if (next->lmod == '-') {
                while (b > a && is_ws((unsigned char)s[b - 1])) b--;
            } else if (next->lmod != '+' && next->kind != TK_VAR_BEGIN) {
                size_t j = b;
                while (j > 0 && (s[j - 1] == ' ' || s[j - 1] == '\t')) j--;
                if ((j > 0 && s[j - 1] == '\n') || (j == 0 && k->at_start)) b = j;
            }
        }
        if (prev && (prev->kind == TK_BLOCK_END || prev->kind == TK_VAR_END || prev->kind == TK_COMMENT)) {
            char m = prev->kind == TK_COMMENT ? prev->rmod : prev->lmod;
            if (m == '-') {
                while (a < b && is_ws((unsigned char)s[a])) a++;
            } else if (m != '+' && prev->kind != TK_VAR_END && a < b && s[a] == '\n') {
                a++;
            }
        }
        k->s = s + a;
        k->n = b > a ? b - a : 0;
    }
}

static void lex(ct_lexer *L) {
    L->line = 1;
    while (L->pos < L->len) {
        const char *p = L->src + L->pos;
        const char *open = NULL;
        for (const char *q = p; (q = memchr(q, '{', (size_t)(L->src + L->len - q))) != NULL; q++)
            if (q + 1 < L->src + L->len && (q[1] == '{' || q[1] == '%' || q[1] == '#')) {
                open = q;
                break;
            }
        size_t text_end = open ? (size_t)(open - L->src) : L->len;
        if (text_end > L->pos) lx_text(L, L->pos, text_end);
        if (!open) break;
        L->pos = text_end + 2;
        char m = L->pos < L->len && (L->src[L->pos] == '-' || L->src[L->pos] == '+') ? L->src[L->pos] : 0;
        if (m) L->pos++;
        if (open[1] == '#') {
            const char *end = NULL;
            for (size_t i = L->pos; i + 1 < L->len; i++)
                if (L->src[i] == '#' && L->src[i + 1] == '}') {
                    end = L->src + i;
                    break;
                }
            if (!end) ct_jump(L->jb, KVS_ERR_FORMAT, "line %d: unclosed comment", L->line);
            ct_tok *k = lx_push(L, TK_COMMENT);
            k->lmod = m;
            k->rmod = end > L->src + L->pos && (end[-1] == '-' || end[-1] == '+') ? end[-1] : 0;
            lx_count_lines(L, L->pos, (size_t)(end - L->src));
            L->pos = (size_t)(end - L->src) + 2;
            continue;
        }
        if (m == '+' && open[1] == '{') ct_jump(L->jb, KVS_ERR_FORMAT, "line %d: '{{+' is not a delimiter", L->line);
        ct_tok *k = lx_push(L, open[1] == '%' ? TK_BLOCK_BEGIN : TK_VAR_BEGIN);
        k->lmod = m;
        lx_tag(L, open[1] == '%');
    }
    lx_whitespace(L);
    lx_push(L, TK_EOF);
}

/* ----------------------------------------------------------------------------------------------- parser -- */

enum { S_TEXT, S_OUT, S_IF, S_FOR, S_SET, S_SETBLOCK,
       E_STR, E_INT, E_FLOAT, E_BOOL, E_NONE, E_NAME, E_LIST, E_TUPLE, E_DICT, E_ATTR, E_INDEX, E_SLICE, E_CALL,
       E_FILTER, E_TEST, E_NEG, E_POS, E_NOT, E_AND, E_OR, E_BIN, E_COND };

enum { OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_FDIV, OP_MOD, OP_POW, OP_CAT, OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE,
       OP_IN, OP_NOTIN };

typedef struct ct_node ct_node;
struct ct_node {
    int kind, op, line;
    const char *s; /* text, string literal, name, attribute, filter/test name, set target */
    size_t n;
    int64_t i;     /* int literal, bool literal, test negation */
    double f;
    ct_node *a, *b, *c;
    ct_node **kids; /* body / elements / positional args / slice parts [3] */
    size_t nk;
    ct_node **kids2; /* else body / keyword values */
    size_t nk2;
    const char **names; /* for-loop targets / keyword names */
    size_t nn;
};

typedef struct {
    ct_arena *ar;
    ct_err *jb;
    ct_tok *t;
    size_t p;
    int depth;
} ct_parser;

static ct_node *nd(ct_parser *P, int kind) {
    ct_node *x = ar_alloc(P->ar, sizeof *x);
    memset(x, 0, sizeof *x);
    x->kind = kind;
    x->line = P->t[P->p].line;
    return x;
}

static ct_tok *cur(ct_parser *P) { return &P->t[P->p]; }
static int is_op(ct_parser *P, const char *op) {
    ct_tok *k = cur(P);
    return k->kind == TK_OP && k->n == strlen(op) && !memcmp(k->s, op, k->n);
}
static int is_name(ct_parser *P, const char *nm) {
    ct_tok *k = cur(P);
    return k->kind == TK_NAME && k->n == strlen(nm) && !memcmp(k->s, nm, k->n);
}
static int is_name_at(ct_parser *P, size_t off, const char *nm) {
    ct_tok *k = &P->t[P->p + off];
    if (k->kind == TK_EOF && off) return 0;
    return k->kind == TK_NAME && k->n == strlen(nm) && !memcmp(k->s, nm, k->n);
}
static const char *tok_desc(ct_tok *k) {
    switch (k->kind) {
    case TK_BLOCK_END: return "'%}'";
    case TK_VAR_END: return "'}}'";
    case TK_EOF: return "end of template";
    case TK_STRING: return "a string";
    case TK_INT: case TK_FLOAT: return "a number";
    default: return "a token";
    }
}
static void expect_op(ct_parser *P, const char *op) {
    if (!is_op(P, op)) {
        ct_tok *k = cur(P);
        if (k->kind == TK_OP || k->kind == TK_NAME)
            ct_jump(P->jb, KVS_ERR_FORMAT, "line %d: expected '%s', found '%.*s'", k->line, op, (int)k->n, k->s);
        ct_jump(P->jb, KVS_ERR_FORMAT, "line %d: expected '%s', found %s", k->line, op, tok_desc(k));
    }
    P->p++;
}
static void expect_kind(ct_parser *P, int kind, const char *what) {
    ct_tok *k = cur(P);
    if (k->kind != kind) {
        if (k->kind == TK_OP || k->kind == TK_NAME)
            ct_jump(P->jb, KVS_ERR_FORMAT, "line %d: expected %s, found '%.*s'", k->line, what, (int)k->n, k->s);
        ct_jump(P->jb, KVS_ERR_FORMAT, "line %d: expected %s, found %s", k->line, what, tok_desc(k));
    }
    P->p++;
}
static const char *take_name(ct_parser *P) {
    ct_tok *k = cur(P);
    if (k->kind != TK_NAME) ct_jump(P->jb, KVS_ERR_FORMAT, "line %d: expected a name, found %s", k->line, tok_desc(k));
    P->p++;
    return ar_strdup(P->ar, k->s, k->n);
}
static void enter(ct_parser *P) {
    if (++P->depth > KVS_CHAT_MAX_DEPTH)
        ct_jump(P->jb, KVS_ERR_RANGE, "line %d: nesting deeper than %d (limit)", cur(P)->line, KVS_CHAT_MAX_DEPTH);
}

static ct_node *parse_expr(ct_parser *P);
static ct_node *parse_or(ct_parser *P);
static ct_node *parse_unary(ct_parser *P, int with_filter);
static ct_node *parse_primary(ct_parser *P);
static ct_node *parse_postfix(ct_parser *P, ct_node *x);

static void set_list(ct_node ***dst, size_t *n, ct_ptrs *src) {
    *dst = (ct_node **)src->v;
    *n = src->n;
}

/* "(" args ")" : positional into x->kids, keyword into x->names/kids2. */
static void parse_args(ct_parser *P, ct_node *x) {
    ct_ptrs pos = {0}, kw = {0}, kwn = {0};
    expect_op(P, "(");
    while (!is_op(P, ")")) {
        if (is_op(P, "*") || is_op(P, "**"))
            ct_jump(P->jb, KVS_ERR_UNSUPPORTED, "line %d: *args / **kwargs in a call", cur(P)->line);
        if (cur(P)->kind == TK_NAME && P->t[P->p + 1].kind == TK_OP && P->t[P->p + 1].n == 1 && P->t[P->p + 1].s[0] == '=') {
            ptrs_push(P->ar, &kwn, (void *)take_name(P));
            P->p++;
            ptrs_push(P->ar, &kw, parse_expr(P));
        } else {
            if (kw.n) ct_jump(P->jb, KVS_ERR_FORMAT, "line %d: positional argument after a keyword argument", cur(P)->line);
            ptrs_push(P->ar, &pos, parse_expr(P));
        }
        if (!is_op(P, ",")) break;
        P->p++;
    }
    expect_op(P, ")");
    set_list(&x->kids, &x->nk, &pos);
    set_list(&x->kids2, &x->nk2, &kw);
    x->names = (const char **)kwn.v;
    x->nn = kwn.n;
}

static ct_node *parse_primary(ct_parser *P) {
    ct_tok *k = cur(P);
    ct_node *x;
    enter(P);
    switch (k->kind) {
    case TK_NAME: {
        static const char *const t[] = {"true", "True"}, *const f[] = {"false", "False"}, *const no[] = {"none", "None"};
        x = NULL;
        for (int j = 0; j < 2 && !x; j++) {
            if (is_name(P, t[j]) || is_name(P, f[j])) {
                x = nd(P, E_BOOL);
                x->i = is_name(P, t[j]);
            } else if (is_name(P, no[j])) {
                x = nd(P, E_NONE);
            }
        }
        if (!x) {
            x = nd(P, E_NAME);
            x->s = ar_strdup(P->ar, k->s, k->n);
            x->n = k->n;
        }
        P->p++;
        break;
    }
    case TK_STRING: {
        x = nd(P, E_STR);
        /* adjacent literals concatenate */
        size_t total = 0, q = P->p;
        while (P->t[q].kind == TK_STRING) total += P->t[q++].n;
        char *s = ar_alloc(P->ar, total + 1);
        size_t o = 0;
        while (cur(P)->kind == TK_STRING) {
            memcpy(s + o, cur(P)->s, cur(P)->n);
            o += cur(P)->n;
            P->p++;
        }
        s[o] = '\0';
        x->s = s;
        x->n = o;
        break;
    }
    case TK_INT: x = nd(P, E_INT); x->i = k->i; P->p++; break;
    case TK_FLOAT: x = nd(P, E_FLOAT); x->f = k->f; P->p++; break;
    case TK_OP:
        if (is_op(P, "(")) {
            P->p++;
            if (is_op(P, ")")) {
                P->p++;
                x = nd(P, E_TUPLE);
                break;
            }
            ct_node *first = parse_expr(P);
            if (is_op(P, ",")) {
                ct_ptrs el = {0};
                ptrs_push(P->ar, &el, first);
                x = nd(P, E_TUPLE);
                while (is_op(P, ",")) {
                    P->p++;
                    if (is_op(P, ")")) break;
                    ptrs_push(P->ar, &el, parse_expr(P));
                }
                set_list(&x->kids, &x->nk, &el);
            } else {
                x = first;
            }
            expect_op(P, ")");
            break;
        }
        if (is_op(P, "[")) {
            P->p++;
            ct_ptrs el = {0};
            x = nd(P, E_LIST);
            while (!is_op(P, "]")) {
                ptrs_push(P->ar, &el, parse_expr(P));
                if (!is_op(P, ",")) break;
                P->p++;
            }
            expect_op(P, "]");
            set_list(&x->kids, &x->nk, &el);
            break;
        }
        if (is_op(P, "{")) {
            P->p++;
            ct_ptrs el = {0};
            x = nd(P, E_DICT);
            while (!is_op(P, "}")) {
                ptrs_push(P->ar, &el, parse_expr(P));
                expect_op(P, ":");
                ptrs_push(P->ar, &el, parse_expr(P));
                if (!is_op(P, ",")) break;
                P->p++;
            }
            expect_op(P, "}");
            set_list(&x->kids, &x->nk, &el);
            break;
        }
        /* fall through */
    default:
        if (k->kind == TK_OP)
            ct_jump(P->jb, KVS_ERR_FORMAT, "line %d: unexpected '%.*s' in an expression", k->line, (int)k->n, k->s);
        ct_jump(P->jb, KVS_ERR_FORMAT, "line %d: expected an expression, found %s", k->line, tok_desc(k));
    }
    P->depth--;
    return x;
}

static ct_node *parse_postfix(ct_parser *P, ct_node *x) {
    for (;;) {
        if (is_op(P, ".")) {
            P->p++;
            ct_node *y = nd(P, E_ATTR);
            y->a = x;
            if (cur(P)->kind == TK_INT) { /* x.0 is x[0] */
                y->kind = E_INDEX;
                y->b = nd(P, E_INT);
                y->b->i = cur(P)->i;
                P->p++;
            } else {
                y->s = take_name(P);
                y->n = strlen(y->s);
            }
            x = y;
        } else if (is_op(P, "[")) {
            P->p++;
            ct_node *parts[3] = {NULL, NULL, NULL};
            int slice = 0;
            if (!is_op(P, ":")) parts[0] = parse_expr(P);
            if (is_op(P, ":")) {
                slice = 1;
                P->p++;
                if (!is_op(P, ":") && !is_op(P, "]")) parts[1] = parse_expr(P);
                if (is_op(P, ":")) {
                    P->p++;
                    if (!is_op(P, "]")) parts[2] = parse_expr(P);
                }
            }
            if (is_op(P, ",")) ct_jump(P->jb, KVS_ERR_UNSUPPORTED, "line %d: tuple subscripts", cur(P)->line);
            expect_op(P, "]");
            ct_node *y = nd(P, slice ? E_SLICE : E_INDEX);
            y->a = x;
            if (slice) {
                y->kids = ar_alloc(P->ar, 3 * sizeof *y->kids);
                memcpy(y->kids, parts, sizeof parts);
                y->nk = 3;
            } else {
                y->b = parts[0];
            }
            x = y;
        } else if (is_op(P, "(")) {
            ct_node *y = nd(P, E_CALL);
            y->a = x;
            parse_args(P, y);
            x = y;
        } else {
            return x;
        }
    }
}

static ct_node *parse_filters(ct_parser *P, ct_node *x) {
    for (;;) {
        if (is_op(P, "|")) {
            P->p++;
            ct_node *y = nd(P, E_FILTER);
            y->s = take_name(P);
            y->a = x;
            if (is_op(P, "(")) parse_args(P, y);
            x = y;
        } else if (is_name(P, "is")) {
            P->p++;
            ct_node *y = nd(P, E_TEST);
            if (is_name(P, "not")) {
                y->i = 1;
                P->p++;
            }
            ct_tok *k = cur(P);
            if (k->kind != TK_NAME)
                ct_jump(P->jb, KVS_ERR_FORMAT, "line %d: expected a test name after 'is', found %s", k->line, tok_desc(k));
            y->s = take_name(P);
            y->a = x;
            if (is_op(P, "(")) {
                parse_args(P, y);
            } else {
                k = cur(P);
                int arg = k->kind == TK_STRING || k->kind == TK_INT || k->kind == TK_FLOAT || is_op(P, "[") || is_op(P, "{") ||
                          (k->kind == TK_NAME && !is_name(P, "else") && !is_name(P, "or") && !is_name(P, "and") &&
                           !is_name(P, "if") && !is_name(P, "is") && !is_name(P, "in") && !is_name(P, "not"));
                if (arg) {
                    y->kids = ar_alloc(P->ar, sizeof *y->kids);
                    y->kids[0] = parse_postfix(P, parse_primary(P));
                    y->nk = 1;
                }
            }
            x = y;
        } else if (is_op(P, "(")) {
            ct_node *y = nd(P, E_CALL);
            y->a = x;
            parse_args(P, y);
            x = y;
        } else {
            return x;
        }
    }
}

static ct_node *parse_unary(ct_parser *P, int with_filter) {
    ct_node *x;
    enter(P);
    if (is_op(P, "-") || is_op(P, "+")) {
        x = nd(P, is_op(P, "-") ? E_NEG : E_POS);
        P->p++;
        x->a = parse_unary(P, 0);
    } else {
        x = parse_primary(P);
    }
    x = parse_postfix(P, x);
    if (with_filter) x = parse_filters(P, x);
    P->depth--;
    return x;
}

static ct_node *bin(ct_parser *P, int op, ct_node *a, ct_node *b) {
    ct_node *x = nd(P, E_BIN);
    x->op = op;
    x->a = a;
    x->b = b;
    return x;
}

static ct_node *parse_pow(ct_parser *P) {
    ct_node *x = parse_unary(P, 1);
    while (is_op(P, "**")) {
        P->p++;
        x = bin(P, OP_POW, x, parse_unary(P, 1));
    }
    return x;
}
static ct_node *parse_math2(ct_parser *P) {
    ct_node *x = parse_pow(P);
    for (;;) {
        int op = is_op(P, "*") ? OP_MUL : is_op(P, "/") ? OP_DIV : is_op(P, "//") ? OP_FDIV : is_op(P, "%") ? OP_MOD : -1;
        if (op < 0) return x;
        P->p++;
        x = bin(P, op, x, parse_pow(P));
    }
}
static ct_node *parse_concat(ct_parser *P) {
    ct_node *x = parse_math2(P);
    while (is_op(P, "~")) {
        P->p++;
        x = bin(P, OP_CAT, x, parse_math2(P));
    }
    return x;
}
static ct_node *parse_math1(ct_parser *P) {
    ct_node *x = parse_concat(P);
    for (;;) {
        int op = is_op(P, "+") ? OP_ADD : is_op(P, "-") ? OP_SUB : -1;
        if (op < 0) return x;
        P->p++;
        x = bin(P, op, x, parse_concat(P));
    }
}
static ct_node *parse_compare(ct_parser *P) {
    ct_node *x = parse_math1(P);
    int n_ops = 0;
    for (;;) {
        int op = is_op(P, "==") ? OP_EQ : is_op(P, "!=") ? OP_NE : is_op(P, "<") ? OP_LT : is_op(P, "<=") ? OP_LE
                 : is_op(P, ">") ? OP_GT : is_op(P, ">=") ? OP_GE : is_name(P, "in") ? OP_IN : -1;
        int skip = 1;
        if (op < 0 && is_name(P, "not") && is_name_at(P, 1, "in")) {
            op = OP_NOTIN;
            skip = 2;
        }
        if (op < 0) return x;
        if (++n_ops > 1) ct_jump(P->jb, KVS_ERR_UNSUPPORTED, "line %d: chained comparisons (a < b < c)", cur(P)->line);
        P->p += (size_t)skip;
        x = bin(P, op, x, parse_math1(P));
    }
}
static ct_node *parse_not(ct_parser *P) {
    if (is_name(P, "not")) {
        enter(P);
        ct_node *x = nd(P, E_NOT);
        P->p++;
        x->a = parse_not(P);
        P->depth--;
        return x;
    }
    return parse_compare(P);
}
static ct_node *parse_and(ct_parser *P) {
    ct_node *x = parse_not(P);
    while (is_name(P, "and")) {
        ct_node *y = nd(P, E_AND);
        P->p++;
        y->a = x;
        y->b = parse_not(P);
        x = y;
    }
    return x;
}
static ct_node *parse_or(ct_parser *P) {
    ct_node *x = parse_and(P);
    while (is_name(P, "or")) {
        ct_node *y = nd(P, E_OR);
        P->p++;
        y->a = x;
        y->b = parse_and(P);
        x = y;
    }
    return x;
}
static ct_node *parse_expr(ct_parser *P) {
    enter(P);
    ct_node *x = parse_or(P);
    if (is_name(P, "if")) {
        ct_node *y = nd(P, E_COND);
        P->p++;
        y->b = x;
        y->a = parse_or(P);
        if (is_name(P, "else")) {
            P->p++;
            y->c = parse_expr(P);
        }
        x = y;
    }
    P->depth--;
    return x;
}

static void parse_body(ct_parser *P, const char *const *stops, ct_ptrs *out);

/* After "{% if" / "{% elif": condition, body, and the elif/else chain, through "endif %}". */
static ct_node *parse_if(ct_parser *P) {
    static const char *const stops[] = {"elif", "else", "endif", NULL};
    static const char *const stop_end[] = {"endif", NULL};
    ct_node *x = nd(P, S_IF);
    x->a = parse_expr(P);
    expect_kind(P, TK_BLOCK_END, "'%}'");
    ct_ptrs body = {0}, els = {0};
    parse_body(P, stops, &body);
    set_list(&x->kids, &x->nk, &body);
    if (is_name(P, "elif")) {
        P->p++;
        enter(P);
        ptrs_push(P->ar, &els, parse_if(P));
        P->depth--;
        set_list(&x->kids2, &x->nk2, &els);
        return x; /* the nested if consumed endif */
    }
    if (is_name(P, "else")) {
        P->p++;
        expect_kind(P, TK_BLOCK_END, "'%}'");
        parse_body(P, stop_end, &els);
        set_list(&x->kids2, &x->nk2, &els);
    }
    P->p++; /* endif */
    expect_kind(P, TK_BLOCK_END, "'%}'");
    return x;
}

static void parse_statement(ct_parser *P, ct_ptrs *out) {
    ct_tok *k = cur(P);
    int line = k->line;
    if (k->kind != TK_NAME) ct_jump(P->jb, KVS_ERR_FORMAT, "line %d: expected a statement name after '{%%'", line);
    if (is_name(P, "if")) {
        P->p++;
        ptrs_push(P->ar, out, parse_if(P));
        return;
    }
    if (is_name(P, "for")) {
        static const char *const stops[] = {"else", "endfor", NULL};
        static const char *const stop_end[] = {"endfor", NULL};
        P->p++;
        ct_node *x = nd(P, S_FOR);
        ct_ptrs names = {0};
        int paren = is_op(P, "(");
        if (paren) P->p++;
        ptrs_push(P->ar, &names, (void *)take_name(P));
        while (is_op(P, ",")) {
            P->p++;
            ptrs_push(P->ar, &names, (void *)take_name(P));
        }
        if (paren) expect_op(P, ")");
        x->names = (const char **)names.v;
        x->nn = names.n;
        if (!is_name(P, "in")) ct_jump(P->jb, KVS_ERR_FORMAT, "line %d: expected 'in' in a for statement", line);
        P->p++;
        x->a = parse_or(P); /* no conditional expression: "if" here filters the loop */
        if (is_name(P, "if")) {
            P->p++;
            x->c = parse_expr(P);
        }
        if (is_name(P, "recursive")) ct_jump(P->jb, KVS_ERR_UNSUPPORTED, "line %d: recursive for loops", line);
        expect_kind(P, TK_BLOCK_END, "'%}'");
        ct_ptrs body = {0}, els = {0};
        parse_body(P, stops, &body);
        set_list(&x->kids, &x->nk, &body);
        if (is_name(P, "else")) {
            P->p++;
            expect_kind(P, TK_BLOCK_END, "'%}'");
            parse_body(P, stop_end, &els);
            set_list(&x->kids2, &x->nk2, &els);
        }
        P->p++; /* endfor */
        expect_kind(P, TK_BLOCK_END, "'%}'");
        ptrs_push(P->ar, out, x);
        return;
    }
    if (is_name(P, "set")) {
        static const char *const stops[] = {"endset", NULL};
        P->p++;
        ct_node *x = nd(P, S_SET);
        x->s = take_name(P);
        if (is_op(P, ".")) {
            P->p++;
            x->names = ar_alloc(P->ar, sizeof *x->names);
            x->names[0] = take_name(P);
            x->nn = 1;
        }
        if (is_op(P, ",")) ct_jump(P->jb, KVS_ERR_UNSUPPORTED, "line %d: tuple assignment in set", line);
        if (cur(P)->kind == TK_BLOCK_END) {
            if (x->nn) ct_jump(P->jb, KVS_ERR_UNSUPPORTED, "line %d: block set of an attribute", line);
            P->p++;
            x->kind = S_SETBLOCK;
            ct_ptrs body = {0};
            parse_body(P, stops, &body);
            set_list(&x->kids, &x->nk, &body);
            P->p++; /* endset */
            expect_kind(P, TK_BLOCK_END, "'%}'");
        } else {
            expect_op(P, "=");
            x->a = parse_expr(P);
            expect_kind(P, TK_BLOCK_END, "'%}'");
        }
        ptrs_push(P->ar, out, x);
        return;
    }
    static const char *const unsupported[] = {"macro", "call", "filter", "include", "extends", "import", "from",
                                               "block", "raw", "with", "break", "continue", "autoescape", "do",
                                               "generation", "trans", "pluralize", "print", NULL};
    for (int j = 0; unsupported[j]; j++)
        if (is_name(P, unsupported[j]))
            ct_jump(P->jb, KVS_ERR_UNSUPPORTED, "line %d: the {%% %s %%} statement", line, unsupported[j]);
    ct_jump(P->jb, KVS_ERR_FORMAT, "line %d: unexpected statement '%.*s'", line, (int)k->n, k->s);
}

/* Statements until "{% <one of stops>" (left with the stop name current) or the end of the template. */
static void parse_body(ct_parser *P, const char *const *stops, ct_ptrs *out) {
    enter(P);
    int start_line = cur(P)->line;
    for (;;) {
        ct_tok *k = cur(P);
        if (k->kind == TK_EOF) {
            if (stops) {
                const char *end = stops[0];
                for (int j = 0; stops[j]; j++)
                    if (!strncmp(stops[j], "end", 3)) end = stops[j];
                ct_jump(P->jb, KVS_ERR_FORMAT, "line %d: missing {%% %s %%} (template ends)", start_line, end);
            }
            break;
        }
        if (k->kind == TK_TEXT) {
            if (k->n) {
                ct_node *x = nd(P, S_TEXT);
                x->s = k->s;
                x->n = k->n;
                ptrs_push(P->ar, out, x);
            }
            P->p++;
        } else if (k->kind == TK_COMMENT) {
            P->p++;
        } else if (k->kind == TK_VAR_BEGIN) {
            P->p++;
            ct_node *x = nd(P, S_OUT);
            x->a = parse_expr(P);
            expect_kind(P, TK_VAR_END, "'}}'");
            ptrs_push(P->ar, out, x);
        } else if (k->kind == TK_BLOCK_BEGIN) {
            P->p++;
            for (int j = 0; stops && stops[j]; j++)
                if (is_name(P, stops[j])) {
                    P->depth--;
                    return;
                }
            static const char *const enders[] = {"endif", "endfor", "endset", "elif", "else", "endmacro", NULL};
            for (int j = 0; enders[j]; j++)
                if (is_name(P, enders[j]))
                    ct_jump(P->jb, KVS_ERR_FORMAT, "line %d: unexpected {%% %s %%}", cur(P)->line, enders[j]);
            parse_statement(P, out);
        } else {
            ct_jump(P->jb, KVS_ERR_FORMAT, "line %d: unexpected %s", k->line, tok_desc(k));
        }
    }
    P->depth--;
}

/* ----------------------------------------------------------------------------------------------- values -- */

#define N_TOKENS 7
static const char *const token_names[N_TOKENS] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                                  "pad_token", "cls_token", "mask_token"};

struct kvs_chat_template {
    ct_arena ar;
    ct_node **body;
    size_t n_body;
    char *tokens[N_TOKENS];
    char hash[65];
};

typedef enum { V_UNDEF, V_NONE, V_BOOL, V_INT, V_FLOAT, V_STR, V_LIST, V_DICT, V_FUNC, V_LOOP } ct_vt;

typedef struct ct_list ct_list;
typedef struct ct_dict ct_dict;
typedef struct ct_loop ct_loop;

typedef struct ct_val {
    ct_vt t;
    int64_t i; /* bool, int, function id */
    double f;
    const char *s; /* string (NUL-terminated), or a method's name */
    size_t n;
    ct_list *l;
    ct_dict *d;
    ct_loop *lp;
    struct ct_val *self; /* bound method: its object */
} ct_val;

struct ct_list {
    ct_val *v;
    size_t n;
    int tuple;
};

struct ct_dict {
    const char **k;
    size_t *kn;
    ct_val *v;
    size_t n, cap;
    int ns; /* a namespace(): attributes may be set */
};

struct ct_loop {
    const ct_list *items;
    size_t idx;
};

enum { F_RAISE = 1, F_RANGE, F_NAMESPACE, F_STRFTIME, F_METHOD };

typedef struct ct_scope {
    struct ct_scope *parent;
    const char **names;
    ct_val *vals;
    size_t n, cap;
} ct_scope;

typedef struct {
    ct_err jb;
    ct_arena ar;
    char *out;
    size_t n, cap;
    long steps;
    int depth;
    const kvs_chat_render_opts *o;
    const kvs_chat_template *t;
    ct_val messages;
} ct_render;

static void rfail(ct_render *R, const ct_node *x, kvs_status s, const char *fmt, ...) __attribute__((format(printf, 4, 5), noreturn));
static void rfail(ct_render *R, const ct_node *x, kvs_status s, const char *fmt, ...) {
    char buf[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    ct_jump(&R->jb, s, "line %d: %s", x ? x->line : 0, buf);
}

static const char *type_name(const ct_val *v) {
    static const char *const n[] = {"undefined", "none", "boolean", "integer", "float", "string", "list", "dict",
                                    "function", "loop"};
    return v->t == V_LIST && v->l->tuple ? "tuple" : n[v->t];
}

static ct_val v_undef(void) { ct_val v; memset(&v, 0, sizeof v); return v; }
static ct_val v_none(void) { ct_val v = v_undef(); v.t = V_NONE; return v; }
static ct_val v_bool(int b) { ct_val v = v_undef(); v.t = V_BOOL; v.i = b != 0; return v; }
static ct_val v_int(int64_t i) { ct_val v = v_undef(); v.t = V_INT; v.i = i; return v; }
static ct_val v_float(double f) { ct_val v = v_undef(); v.t = V_FLOAT; v.f = f; return v; }
static ct_val v_str(const char *s, size_t n) { ct_val v = v_undef(); v.t = V_STR; v.s = s; v.n = n; return v; }
static ct_val v_func(int id) { ct_val v = v_undef(); v.t = V_FUNC; v.i = id; return v; }

static ct_val v_strcopy(ct_render *R, const char *s, size_t n) { return v_str(ar_strdup(&R->ar, s, n), n); }

static ct_val v_list(ct_render *R, size_t n, int tuple) {
    ct_val v = v_undef();
    v.t = V_LIST;
    v.l = ar_alloc(&R->ar, sizeof *v.l);
    v.l->v = n ? ar_alloc(&R->ar, n * sizeof *v.l->v) : NULL;
    v.l->n = n;
    v.l->tuple = tuple;
    return v;
}

static ct_val v_dict(ct_render *R) {
    ct_val v = v_undef();
    v.t = V_DICT;
    v.d = ar_alloc(&R->ar, sizeof *v.d);
    memset(v.d, 0, sizeof *v.d);
    return v;
}

static ct_val *dict_find(const ct_dict *d, const char *k, size_t kn) {
    for (size_t i = 0; i < d->n; i++)
        if (d->kn[i] == kn && !memcmp(d->k[i], k, kn)) return &d->v[i];
    return NULL;
}

static void dict_set(ct_render *R, ct_dict *d, const char *k, size_t kn, ct_val v) {
    ct_val *slot = dict_find(d, k, kn);
    if (slot) {
        *slot = v;
        return;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? 2 * d->cap : 8;
        const char **nk = ar_alloc(&R->ar, cap * sizeof *nk);
        size_t *nkn = ar_alloc(&R->ar, cap * sizeof *nkn);
        ct_val *nv = ar_alloc(&R->ar, cap * sizeof *nv);
        if (d->n) {
            memcpy(nk, d->k, d->n * sizeof *nk);
            memcpy(nkn, d->kn, d->n * sizeof *nkn);
            memcpy(nv, d->v, d->n * sizeof *nv);
        }
        d->k = nk;
        d->kn = nkn;
        d->v = nv;
        d->cap = cap;
    }
    d->k[d->n] = ar_strdup(&R->ar, k, kn);
    d->kn[d->n] = kn;
    d->v[d->n] = v;
    d->n++;
}

static void step(ct_render *R, const ct_node *x) {
    if (++R->steps > KVS_CHAT_MAX_STEPS)
        rfail(R, x, KVS_ERR_RANGE, "more than %ld evaluation steps (limit)", (long)KVS_CHAT_MAX_STEPS);
}

static void out_put(ct_render *R, const ct_node *x, const char *s, size_t n) {
    if (R->n + n > KVS_CHAT_MAX_OUTPUT)
        rfail(R, x, KVS_ERR_RANGE, "output longer than %zu MiB (limit)", KVS_CHAT_MAX_OUTPUT >> 20);
    if (R->n + n + 1 > R->cap) {
        size_t cap = R->cap ? R->cap : 4096;
        while (cap < R->n + n + 1) cap *= 2;
        char *o = realloc(R->out, cap);
        if (!o) rfail(R, x, KVS_ERR_NOMEM, "out of memory");
        R->out = o;
        R->cap = cap;
    }
    memcpy(R->out + R->n, s, n);
    R->n += n;
    R->out[R->n] = '\0';
}

static int truthy(const ct_val *v) {
    switch (v->t) {
    case V_UNDEF: case V_NONE: return 0;
    case V_BOOL: case V_INT: return v->i != 0;
    case V_FLOAT: return v->f != 0;
    case V_STR: return v->n > 0;
    case V_LIST: return v->l->n > 0;
    case V_DICT: return v->d->n > 0;
    default: return 1;
    }
}

static int is_num(const ct_val *v) { return v->t == V_INT || v->t == V_FLOAT || v->t == V_BOOL; }
static double num(const ct_val *v) { return v->t == V_FLOAT ? v->f : (double)v->i; }

static int equal(const ct_val *a, const ct_val *b) {
    if (is_num(a) && is_num(b)) {
        if (a->t != V_FLOAT && b->t != V_FLOAT) return a->i == b->i;
        return num(a) == num(b);
    }
    if (a->t != b->t) return 0;
    switch (a->t) {
    case V_UNDEF: case V_NONE: return 1;
    case V_STR: return a->n == b->n && !memcmp(a->s, b->s, a->n);
    case V_LIST:
        if (a->l->n != b->l->n) return 0;
        for (size_t i = 0; i < a->l->n; i++)
            if (!equal(&a->l->v[i], &b->l->v[i])) return 0;
        return 1;
    case V_DICT:
        if (a->d->n != b->d->n) return 0;
        for (size_t i = 0; i < a->d->n; i++) {
            ct_val *o = dict_find(b->d, a->d->k[i], a->d->kn[i]);
            if (!o || !equal(&a->d->v[i], o)) return 0;
        }
        return 1;
    default: return a == b;
    }
}

/* Python's repr of a float where it and JavaScript's Number printing agree (integral values below 1e16 get
 * ".0" from Python and none from JavaScript: refused, as are exponents). */
static int float_repr(double f, char *buf, size_t cap) {
    if (!isfinite(f)) return 0;
    double a = fabs(f);
    if (a != 0 && (a >= 1e16 || a < 1e-4)) return 0;
    if (f == floor(f)) return 0;
    for (int p = 1; p <= 17; p++) {
        snprintf(buf, cap, "%.*g", p, f);
        if (strtod(buf, NULL) == f) break;
    }
    return !strchr(buf, 'e');
}

/* String form for output and "~": strings as they are, integers in decimal; undefined is empty. The forms on
 * which the references disagree are refused. */
static void to_text(ct_render *R, const ct_node *x, const ct_val *v, const char **s, size_t *n, char *buf, size_t cap) {
    switch (v->t) {
    case V_STR: *s = v->s; *n = v->n; return;
    case V_UNDEF: *s = ""; *n = 0; return;
    case V_INT: *n = (size_t)snprintf(buf, cap, "%lld", (long long)v->i); *s = buf; return;
    case V_FLOAT:
        if (float_repr(v->f, buf, cap)) { *s = buf; *n = strlen(buf); return; }
        rfail(R, x, KVS_ERR_UNSUPPORTED, "printing the float %g (Python and JavaScript print it differently)", v->f);
    default:
        rfail(R, x, KVS_ERR_UNSUPPORTED, "printing a %s value (Python Jinja and transformers.js print it differently)",
              type_name(v));
    }
}

/* ---- UTF-8 helpers: code point counts, JavaScript whitespace ---- */

static size_t u8_len(unsigned char c) { return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4; }

static uint32_t u8_get(const char *s, size_t n, size_t i, size_t *len) {
    const unsigned char *u = (const unsigned char *)s + i;
    size_t l = u8_len(u[0]);
    if (i + l > n) l = 1;
    *len = l;
    if (l == 1) return u[0];
    if (l == 2) return (uint32_t)(u[0] & 0x1F) << 6 | (u[1] & 0x3F);
    if (l == 3) return (uint32_t)(u[0] & 0x0F) << 12 | (uint32_t)(u[1] & 0x3F) << 6 | (u[2] & 0x3F);
    return (uint32_t)(u[0] & 0x07) << 18 | (uint32_t)(u[1] & 0x3F) << 12 | (uint32_t)(u[2] & 0x3F) << 6 | (u[3] & 0x3F);
}

static size_t u8_count(const char *s, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i += u8_len((unsigned char)s[i])) c++;
    return c;
}

/* ECMAScript WhiteSpace and LineTerminator, what String.prototype.trim removes. */
static int js_space(uint32_t c) {
    return (c >= 9 && c <= 13) || c == 32 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
           c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000 || c == 0xFEFF;
}

/* Strips from the left (side & 1) and right (side & 2): whitespace when chars is NULL, else the code points of
 * chars[0..cn). */
static ct_val strip(const ct_val *v, const char *chars, size_t cn, int side) {
    size_t a = 0, b = v->n, l;
    while (a < b) {
        uint32_t c = u8_get(v->s, v->n, a, &l);
        int hit = 0;
        if (!(side & 1)) break;
        if (!chars) hit = js_space(c);
        else
            for (size_t j = 0, m; j < cn && !hit; j += m) hit = u8_get(chars, cn, j, &m) == c;
        if (!hit) break;
        a += l;
    }
    while (b > a && (side & 2)) {
        size_t k = b - 1;
        while (k > a && ((unsigned char)v->s[k] & 0xC0) == 0x80) k--;
        uint32_t c = u8_get(v->s, v->n, k, &l);
        int hit = 0;
        if (!chars) hit = js_space(c);
        else
            for (size_t j = 0, m; j < cn && !hit; j += m) hit = u8_get(chars, cn, j, &m) == c;
        if (!hit) break;
        b = k;
    }
    return v_str(v->s + a, b - a);
}

static int ascii_only(const ct_val *v) {
    for (size_t i = 0; i < v->n; i++)
        if ((unsigned char)v->s[i] >= 0x80) return 0;
    return 1;
}

/* upper (mode 1), lower (2), capitalize (3): ASCII text only (full Unicode case mapping is not implemented). */
static ct_val recase(ct_render *R, const ct_node *x, const ct_val *v, int mode) {
    if (!ascii_only(v)) rfail(R, x, KVS_ERR_UNSUPPORTED, "changing the case of non-ASCII text");
    char *o = ar_strdup(&R->ar, v->s, v->n);
    for (size_t i = 0; i < v->n; i++) {
        int up = mode == 1 || (mode == 3 && i == 0);
        if (up && o[i] >= 'a' && o[i] <= 'z') o[i] = (char)(o[i] - 32);
        if (!up && o[i] >= 'A' && o[i] <= 'Z') o[i] = (char)(o[i] + 32);
    }
    return v_str(o, v->n);
}

/* Byte offsets of the code points of a string: off[0..count], off[count] = n. */
static size_t *cp_offsets(ct_render *R, const ct_val *v, size_t *count) {
    size_t c = u8_count(v->s, v->n);
    size_t *off = ar_alloc(&R->ar, (c + 1) * sizeof *off);
    size_t k = 0;
    for (size_t i = 0; i < v->n; i += u8_len((unsigned char)v->s[i])) off[k++] = i;
    off[k] = v->n;
    *count = c;
    return off;
}

static const char *find_bytes(const char *h, size_t hn, const char *nd2, size_t nn) {
    if (nn == 0) return h;
    for (size_t i = 0; i + nn <= hn; i++)
        if (h[i] == nd2[0] && !memcmp(h + i, nd2, nn)) return h + i;
    return NULL;
}

static ct_val str_replace(ct_render *R, const ct_node *x, const ct_val *v, const ct_val *old, const ct_val *nw, int64_t count) {
    if (old->n == 0) rfail(R, x, KVS_ERR_UNSUPPORTED, "replace() of an empty string");
    size_t cap = v->n + 1, n = 0;
    char *o = NULL;
    size_t i = 0;
    int64_t done = 0;
    /* two passes: size, then copy */
    for (int pass = 0; pass < 2; pass++) {
        i = 0;
        n = 0;
        done = 0;
        while (i < v->n) {
            const char *f = (count < 0 || done < count) ? find_bytes(v->s + i, v->n - i, old->s, old->n) : NULL;
            size_t upto = f ? (size_t)(f - v->s) : v->n;
            if (pass) memcpy(o + n, v->s + i, upto - i);
            n += upto - i;
            if (!f) break;
            if (pass) memcpy(o + n, nw->s, nw->n);
            n += nw->n;
            i = upto + old->n;
            done++;
        }
        if (!pass) {
            if (n > KVS_CHAT_MAX_OUTPUT) rfail(R, x, KVS_ERR_RANGE, "replace() result longer than the output limit");
            cap = n + 1;
            o = ar_alloc(&R->ar, cap);
        }
    }
    o[n] = '\0';
    return v_str(o, n);
}

/* Python str.split: sep NULL splits on runs of whitespace and drops empty ends. */
static ct_val str_split(ct_render *R, const ct_node *x, const ct_val *v, const ct_val *sep, int64_t maxsplit) {
    ct_ptrs parts = {0};
    if (sep) {
        if (sep->n == 0) rfail(R, x, KVS_ERR_FORMAT, "split(): empty separator");
        size_t i = 0;
        int64_t done = 0;
        for (;;) {
            const char *f = (maxsplit < 0 || done < maxsplit) ? find_bytes(v->s + i, v->n - i, sep->s, sep->n) : NULL;
            size_t upto = f ? (size_t)(f - v->s) : v->n;
            ct_val *p = ar_alloc(&R->ar, sizeof *p);
            *p = v_strcopy(R, v->s + i, upto - i);
            ptrs_push(&R->ar, &parts, p);
            if (!f) break;
            i = upto + sep->n;
            done++;
        }
    } else {
        size_t i = 0, l;
        int64_t done = 0;
        for (;;) {
            while (i < v->n && js_space(u8_get(v->s, v->n, i, &l))) i += l;
            if (i >= v->n) break;
            size_t a = i;
            if (maxsplit >= 0 && done >= maxsplit) {
                ct_val tail = strip(&(ct_val){.t = V_STR, .s = v->s + a, .n = v->n - a}, NULL, 0, 2);
                ct_val *p = ar_alloc(&R->ar, sizeof *p);
                *p = v_strcopy(R, tail.s, tail.n);
                ptrs_push(&R->ar, &parts, p);
                break;
            }
            while (i < v->n && !js_space(u8_get(v->s, v->n, i, &l))) i += l;
            ct_val *p = ar_alloc(&R->ar, sizeof *p);
            *p = v_strcopy(R, v->s + a, i - a);
            ptrs_push(&R->ar, &parts, p);
            done++;
        }
    }
    ct_val r = v_list(R, parts.n, 0);
    for (size_t i = 0; i < parts.n; i++) r.l->v[i] = *(ct_val *)parts.v[i];
    return r;
}

/* ---- JSON (tojson): Python json.dumps(ensure_ascii=False) spacing, which transformers.js matches ---- */

typedef struct {
    char *p;
    size_t n, cap;
} ct_buf;

static void buf_put(ct_render *R, const ct_node *x, ct_buf *b, const char *s, size_t n) {
    if (b->n + n > KVS_CHAT_MAX_OUTPUT) rfail(R, x, KVS_ERR_RANGE, "tojson result longer than the output limit");
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? 2 * b->cap : 64;
        while (cap < b->n + n + 1) cap *= 2;
        char *np = ar_alloc(&R->ar, cap);
        if (b->n) memcpy(np, b->p, b->n);
        b->p = np;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

static void json_str(ct_render *R, const ct_node *x, ct_buf *b, const char *s, size_t n) {
    buf_put(R, x, b, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char e[8];
        const char *rep = NULL;
        switch (c) {
        case '"': rep = "\\\""; break;
        case '\\': rep = "\\\\"; break;
        case '\n': rep = "\\n"; break;
        case '\r': rep = "\\r"; break;
        case '\t': rep = "\\t"; break;
        case '\b': rep = "\\b"; break;
        case '\f': rep = "\\f"; break;
        default:
            if (c < 0x20) {
                snprintf(e, sizeof e, "\\u%04x", c);
                rep = e;
            }
        }
        if (rep) buf_put(R, x, b, rep, strlen(rep));
        else buf_put(R, x, b, (const char *)&c, 1);
    }
    buf_put(R, x, b, "\"", 1);
}

static void to_json(ct_render *R, const ct_node *x, ct_buf *b, const ct_val *v, int depth) {
    char num_buf[64];
    if (depth > KVS_CHAT_MAX_DEPTH) rfail(R, x, KVS_ERR_RANGE, "tojson nesting deeper than %d", KVS_CHAT_MAX_DEPTH);
    step(R, x);
    switch (v->t) {
    case V_NONE: buf_put(R, x, b, "null", 4); return;
    case V_BOOL: buf_put(R, x, b, v->i ? "true" : "false", v->i ? 4 : 5); return;
    case V_INT: buf_put(R, x, b, num_buf, (size_t)snprintf(num_buf, sizeof num_buf, "%lld", (long long)v->i)); return;
    case V_FLOAT:
        if (!float_repr(v->f, num_buf, sizeof num_buf))
            rfail(R, x, KVS_ERR_UNSUPPORTED, "tojson of the float %g (Python and JavaScript print it differently)", v->f);
        buf_put(R, x, b, num_buf, strlen(num_buf));
        return;
    case V_STR: json_str(R, x, b, v->s, v->n); return;
    case V_LIST:
        buf_put(R, x, b, "[", 1);
        for (size_t i = 0; i < v->l->n; i++) {
            if (i) buf_put(R, x, b, ", ", 2);
            to_json(R, x, b, &v->l->v[i], depth + 1);
        }
        buf_put(R, x, b, "]", 1);
        return;
    case V_DICT:
        buf_put(R, x, b, "{", 1);
        for (size_t i = 0; i < v->d->n; i++) {
            if (i) buf_put(R, x, b, ", ", 2);
            json_str(R, x, b, v->d->k[i], v->d->kn[i]);
            buf_put(R, x, b, ": ", 2);
            to_json(R, x, b, &v->d->v[i], depth + 1);
        }
        buf_put(R, x, b, "}", 1);
        return;
    default: rfail(R, x, KVS_ERR_UNSUPPORTED, "tojson of a %s value", type_name(v));
    }
}

/* ---------------------------------------------------------------------------------------------- evaluator -- */

static ct_val eval(ct_render *R, ct_scope *sc, const ct_node *x);
static void exec_body(ct_render *R, ct_scope *sc, ct_node **body, size_t n);

static ct_val lookup(ct_render *R, ct_scope *sc, const char *name) {
    for (ct_scope *s = sc; s; s = s->parent)
        for (size_t i = s->n; i-- > 0;)
            if (!strcmp(s->names[i], name)) return s->vals[i];
    if (!strcmp(name, "messages")) return R->messages;
    if (!strcmp(name, "add_generation_prompt")) return v_bool(R->o->add_generation_prompt);
    if (!strcmp(name, "tools") || !strcmp(name, "documents")) return v_none();
    for (int k = 0; k < N_TOKENS; k++)
        if (!strcmp(name, token_names[k]) && R->t->tokens[k]) return v_str(R->t->tokens[k], strlen(R->t->tokens[k]));
    if (!strcmp(name, "raise_exception")) return v_func(F_RAISE);
    if (!strcmp(name, "range")) return v_func(F_RANGE);
    if (!strcmp(name, "namespace")) return v_func(F_NAMESPACE);
    if (!strcmp(name, "strftime_now")) return v_func(F_STRFTIME);
    return v_undef();
}

static void scope_set(ct_render *R, ct_scope *sc, const char *name, ct_val v) {
    for (size_t i = 0; i < sc->n; i++)
        if (!strcmp(sc->names[i], name)) {
            sc->vals[i] = v;
            return;
        }
    if (sc->n == sc->cap) {
        size_t cap = sc->cap ? 2 * sc->cap : 8;
        const char **nn = ar_alloc(&R->ar, cap * sizeof *nn);
        ct_val *nv = ar_alloc(&R->ar, cap * sizeof *nv);
        if (sc->n) {
            memcpy(nn, sc->names, sc->n * sizeof *nn);
            memcpy(nv, sc->vals, sc->n * sizeof *nv);
        }
        sc->names = nn;
        sc->vals = nv;
        sc->cap = cap;
    }
    sc->names[sc->n] = name;
    sc->vals[sc->n] = v;
    sc->n++;
}

static ct_val method(const ct_val *obj, const char *name) {
    static const char *const str_m[] = {"startswith", "endswith", "split", "strip", "lstrip", "rstrip", "replace",
                                        "upper", "lower", "capitalize", "count", "find", NULL};
    static const char *const dict_m[] = {"items", "keys", "values", "get", NULL};
    const char *const *m = obj->t == V_STR ? str_m : obj->t == V_DICT ? dict_m : NULL;
    for (int i = 0; m && m[i]; i++)
        if (!strcmp(m[i], name)) {
            ct_val f = v_func(F_METHOD);
            f.s = m[i];
            f.self = (ct_val *)obj;
            return f;
        }
    return v_undef();
}

static ct_val get_attr(ct_render *R, const ct_node *x, const ct_val *obj, const char *name, size_t nlen) {
    switch (obj->t) {
    case V_UNDEF:
        rfail(R, x, KVS_ERR_FORMAT, "'%s' of an undefined value (Python Jinja raises, transformers.js gives "
              "undefined)", name);
    case V_DICT: {
        ct_val *v = dict_find(obj->d, name, nlen);
        if (v) return *v;
        if (obj->d->ns) return v_undef();
        break;
    }
    case V_LOOP: {
        const ct_loop *lp = obj->lp;
        size_t i = lp->idx, n = lp->items->n;
        if (!strcmp(name, "index")) return v_int((int64_t)i + 1);
        if (!strcmp(name, "index0")) return v_int((int64_t)i);
        if (!strcmp(name, "revindex")) return v_int((int64_t)(n - i));
        if (!strcmp(name, "revindex0")) return v_int((int64_t)(n - i - 1));
        if (!strcmp(name, "first")) return v_bool(i == 0);
        if (!strcmp(name, "last")) return v_bool(i + 1 == n);
        if (!strcmp(name, "length")) return v_int((int64_t)n);
        if (!strcmp(name, "previtem")) return i > 0 ? lp->items->v[i - 1] : v_undef();
        if (!strcmp(name, "nextitem")) return i + 1 < n ? lp->items->v[i + 1] : v_undef();
        rfail(R, x, KVS_ERR_UNSUPPORTED, "loop.%s", name);
    }
    default: break;
    }
    ct_val *self = ar_alloc(&R->ar, sizeof *self);
    *self = *obj;
    return method(self, name);
}

static ct_val get_index(ct_render *R, const ct_node *x, const ct_val *obj, const ct_val *key) {
    if (obj->t == V_UNDEF) rfail(R, x, KVS_ERR_FORMAT, "subscript of an undefined value");
    if (obj->t == V_DICT) {
        if (key->t != V_STR) rfail(R, x, KVS_ERR_UNSUPPORTED, "dict subscript with a %s key", type_name(key));
        ct_val *v = dict_find(obj->d, key->s, key->n);
        return v ? *v : v_undef();
    }
    if (obj->t == V_LOOP && key->t == V_STR) return get_attr(R, x, obj, key->s, key->n);
    if (obj->t == V_LIST || obj->t == V_STR) {
        if (key->t == V_STR) return obj->t == V_STR ? get_attr(R, x, obj, key->s, key->n) : v_undef();
        if (key->t != V_INT) rfail(R, x, KVS_ERR_FORMAT, "index of a %s by a %s", type_name(obj), type_name(key));
        if (obj->t == V_LIST) {
            int64_t n = (int64_t)obj->l->n, i = key->i < 0 ? key->i + n : key->i;
            return i >= 0 && i < n ? obj->l->v[i] : v_undef();
        }
        size_t count;
        size_t *off = cp_offsets(R, obj, &count);
        int64_t n = (int64_t)count, i = key->i < 0 ? key->i + n : key->i;
        return i >= 0 && i < n ? v_str(obj->s + off[i], off[i + 1] - off[i]) : v_undef();
    }
    return v_undef();
}

/* Python slice bounds for a sequence of n items. */
static void slice_bounds(ct_render *R, const ct_node *x, const ct_val *p, int64_t n, int64_t *start, int64_t *stop, int64_t *stp) {
    for (int k = 0; k < 3; k++)
        if (p[k].t != V_UNDEF && p[k].t != V_NONE && p[k].t != V_INT)
            rfail(R, x, KVS_ERR_FORMAT, "slice bound of type %s", type_name(&p[k]));
    int64_t s = p[2].t == V_INT ? p[2].i : 1;
    if (s == 0) rfail(R, x, KVS_ERR_FORMAT, "slice step cannot be zero");
    int64_t lo = s > 0 ? 0 : -1, hi = s > 0 ? n : n - 1;
    int64_t a, b;
    if (p[0].t == V_INT) {
        a = p[0].i < 0 ? p[0].i + n : p[0].i;
        a = a < lo ? lo : a > hi ? hi : a;
    } else {
        a = s > 0 ? lo : hi;
    }
    if (p[1].t == V_INT) {
        b = p[1].i < 0 ? p[1].i + n : p[1].i;
        b = b < lo ? lo : b > hi ? hi : b;
    } else {
        b = s > 0 ? hi : lo;
    }
    *start = a;
    *stop = b;
    *stp = s;
}

static ct_val do_slice(ct_render *R, const ct_node *x, const ct_val *obj, const ct_val *p) {
    int64_t a, b, s, n;
    size_t *off = NULL, count = 0;
    if (obj->t == V_LIST) n = (int64_t)obj->l->n;
    else if (obj->t == V_STR) {
        off = cp_offsets(R, obj, &count);
        n = (int64_t)count;
    } else rfail(R, x, KVS_ERR_FORMAT, "slice of a %s", type_name(obj));
    slice_bounds(R, x, p, n, &a, &b, &s);
    size_t m = 0;
    for (int64_t i = a; s > 0 ? i < b : i > b; i += s) m++;
    if (obj->t == V_LIST) {
        ct_val r = v_list(R, m, obj->l->tuple);
        size_t k = 0;
        for (int64_t i = a; s > 0 ? i < b : i > b; i += s) r.l->v[k++] = obj->l->v[i];
        return r;
    }
    char *o = ar_alloc(&R->ar, obj->n + 1);
    size_t len = 0;
    for (int64_t i = a; s > 0 ? i < b : i > b; i += s) {
        memcpy(o + len, obj->s + off[i], off[i + 1] - off[i]);
        len += off[i + 1] - off[i];
    }
    o[len] = '\0';
    return v_str(o, len);
}

/* Arguments of a call: positional pos[0..np), keyword kwn/kwv[0..nk). */
typedef struct {
    ct_val *pos;
    size_t np;
    const char **kwn;
    ct_val *kwv;
    size_t nk;
} ct_args;

static void eval_args(ct_render *R, ct_scope *sc, const ct_node *x, ct_args *a) {
    a->np = x->nk;
    a->nk = x->nk2;
    a->kwn = x->names;
    a->pos = x->nk ? ar_alloc(&R->ar, x->nk * sizeof *a->pos) : NULL;
    a->kwv = x->nk2 ? ar_alloc(&R->ar, x->nk2 * sizeof *a->kwv) : NULL;
    for (size_t i = 0; i < x->nk; i++) a->pos[i] = eval(R, sc, x->kids[i]);
    for (size_t i = 0; i < x->nk2; i++) a->kwv[i] = eval(R, sc, x->kids2[i]);
}

/* Argument `k` named `name` (positional index k or keyword), NULL when absent; checks the count. */
static const ct_val *arg(ct_render *R, const ct_node *x, const ct_args *a, size_t k, const char *name, size_t max,
                         const char *fn) {
    if (a->np > max) rfail(R, x, KVS_ERR_FORMAT, "%s() takes at most %zu arguments", fn, max);
    for (size_t i = 0; i < a->nk; i++) {
        int known = 0;
        (void)known;
        if (!strcmp(a->kwn[i], name)) return &a->kwv[i];
    }
    return k < a->np ? &a->pos[k] : NULL;
}

static void no_kwargs(ct_render *R, const ct_node *x, const ct_args *a, const char *fn, const char *const *allowed) {
    for (size_t i = 0; i < a->nk; i++) {
        int ok = 0;
        for (int j = 0; allowed && allowed[j]; j++) ok |= !strcmp(a->kwn[i], allowed[j]);
        if (!ok) rfail(R, x, KVS_ERR_UNSUPPORTED, "keyword argument '%s' of %s()", a->kwn[i], fn);
    }
}

static const ct_val *need_str(ct_render *R, const ct_node *x, const ct_val *v, const char *what) {
    if (!v || v->t != V_STR) rfail(R, x, KVS_ERR_FORMAT, "%s expects a string, got %s", what, v ? type_name(v) : "nothing");
    return v;
}

static int64_t opt_int(ct_render *R, const ct_node *x, const ct_val *v, int64_t dflt, const char *what) {
    if (!v || v->t == V_NONE) return dflt;
    if (v->t != V_INT) rfail(R, x, KVS_ERR_FORMAT, "%s expects an integer, got %s", what, type_name(v));
    return v->i;
}

static int prefix_match(const ct_val *s, const ct_val *p, int at_end) {
    if (p->n > s->n) return 0;
    return !memcmp(at_end ? s->s + s->n - p->n : s->s, p->s, p->n);
}

static ct_val call_method(ct_render *R, const ct_node *x, const ct_val *f, const ct_args *a) {
    const ct_val *self = f->self;
    const char *m = f->s;
    static const char *const none[] = {NULL};
    if (self->t == V_STR) {
        if (!strcmp(m, "startswith") || !strcmp(m, "endswith")) {
            no_kwargs(R, x, a, m, none);
            const ct_val *p = arg(R, x, a, 0, "", 1, m);
            if (!p) rfail(R, x, KVS_ERR_FORMAT, "%s() needs an argument", m);
            int end = m[0] == 'e';
            if (p->t == V_LIST && p->l->tuple) {
                for (size_t i = 0; i < p->l->n; i++)
                    if (prefix_match(self, need_str(R, x, &p->l->v[i], m), end)) return v_bool(1);
                return v_bool(0);
            }
            return v_bool(prefix_match(self, need_str(R, x, p, m), end));
        }
        if (!strcmp(m, "split")) {
            static const char *const kw[] = {"sep", "maxsplit", NULL};
            no_kwargs(R, x, a, m, kw);
            const ct_val *sep = arg(R, x, a, 0, "sep", 2, m);
            int64_t mx = opt_int(R, x, arg(R, x, a, 1, "maxsplit", 2, m), -1, "split() maxsplit");
            return str_split(R, x, self, sep && sep->t != V_NONE ? need_str(R, x, sep, m) : NULL, mx);
        }
        if (!strcmp(m, "strip") || !strcmp(m, "lstrip") || !strcmp(m, "rstrip")) {
            no_kwargs(R, x, a, m, none);
            const ct_val *c = arg(R, x, a, 0, "", 1, m);
            int side = m[0] == 'l' ? 1 : m[0] == 'r' ? 2 : 3;
            if (c && c->t != V_NONE) return strip(self, need_str(R, x, c, m)->s, c->n, side);
            return strip(self, NULL, 0, side);
        }
        if (!strcmp(m, "replace")) {
            no_kwargs(R, x, a, m, none);
            const ct_val *o = arg(R, x, a, 0, "", 3, m), *n = arg(R, x, a, 1, "", 3, m);
            int64_t cnt = opt_int(R, x, arg(R, x, a, 2, "", 3, m), -1, "replace() count");
            return str_replace(R, x, self, need_str(R, x, o, m), need_str(R, x, n, m), cnt);
        }
        if (!strcmp(m, "upper") || !strcmp(m, "lower") || !strcmp(m, "capitalize")) {
            if (a->np || a->nk) rfail(R, x, KVS_ERR_FORMAT, "%s() takes no arguments", m);
            return recase(R, x, self, m[0] == 'u' ? 1 : m[0] == 'l' ? 2 : 3);
        }
        if (!strcmp(m, "count") || !strcmp(m, "find")) {
            no_kwargs(R, x, a, m, none);
            const ct_val *sub = need_str(R, x, arg(R, x, a, 0, "", 1, m), m);
            if (m[0] == 'f') {
                const char *p = find_bytes(self->s, self->n, sub->s, sub->n);
                return v_int(p ? (int64_t)u8_count(self->s, (size_t)(p - self->s)) : -1);
            }
            if (sub->n == 0) return v_int((int64_t)u8_count(self->s, self->n) + 1);
            int64_t c = 0;
            for (size_t i = 0; i + sub->n <= self->n;) {
                const char *p = find_bytes(self->s + i, self->n - i, sub->s, sub->n);
                if (!p) break;
                c++;
                i = (size_t)(p - self->s) + sub->n;
            }
            return v_int(c);
        }
    }
    if (self->t == V_DICT) {
        if (!strcmp(m, "items") || !strcmp(m, "keys") || !strcmp(m, "values")) {
            if (a->np || a->nk) rfail(R, x, KVS_ERR_FORMAT, "%s() takes no arguments", m);
            ct_val r = v_list(R, self->d->n, 0);
            for (size_t i = 0; i < self->d->n; i++) {
                ct_val key = v_str(self->d->k[i], self->d->kn[i]);
                if (m[0] == 'k') r.l->v[i] = key;
                else if (m[0] == 'v') r.l->v[i] = self->d->v[i];
                else {
                    r.l->v[i] = v_list(R, 2, 1);
                    r.l->v[i].l->v[0] = key;
                    r.l->v[i].l->v[1] = self->d->v[i];
                }
            }
            return r;
        }
        if (!strcmp(m, "get")) {
            no_kwargs(R, x, a, m, none);
            const ct_val *k = need_str(R, x, arg(R, x, a, 0, "", 2, m), m), *d = arg(R, x, a, 1, "", 2, m);
            ct_val *v = dict_find(self->d, k->s, k->n);
            return v ? *v : d ? *d : v_none();
        }
    }
    rfail(R, x, KVS_ERR_UNSUPPORTED, "the %s method %s()", type_name(self), m);
}

static ct_val call(ct_render *R, ct_scope *sc, const ct_node *x) {
    ct_val f = eval(R, sc, x->a);
    ct_args a;
    eval_args(R, sc, x, &a);
    if (f.t != V_FUNC) {
        if (x->a->kind == E_ATTR && f.t == V_UNDEF)
            rfail(R, x, KVS_ERR_UNSUPPORTED, "the method %s() (not in the supported subset, or not one of this type)",
                  x->a->s);
        if (x->a->kind == E_NAME)
            rfail(R, x, KVS_ERR_UNSUPPORTED, "the function %s() (not in the supported subset)", x->a->s);
        rfail(R, x, KVS_ERR_FORMAT, "calling a %s value", type_name(&f));
    }
    switch (f.i) {
    case F_RAISE: {
        const ct_val *m = a.np ? &a.pos[0] : NULL;
        char buf[300];
        const char *s = "";
        size_t n = 0;
        if (m) to_text(R, x, m, &s, &n, buf, sizeof buf);
        rfail(R, x, KVS_ERR_FORMAT, "template raised: %.*s", (int)(n > 300 ? 300 : n), s);
    }
    case F_RANGE: {
        if (a.nk || a.np < 1 || a.np > 3) rfail(R, x, KVS_ERR_FORMAT, "range() takes 1 to 3 integers");
        int64_t lo = 0, hi, st = 1;
        for (size_t i = 0; i < a.np; i++)
            if (a.pos[i].t != V_INT) rfail(R, x, KVS_ERR_FORMAT, "range() takes integers");
        if (a.np == 1) hi = a.pos[0].i;
        else { lo = a.pos[0].i; hi = a.pos[1].i; }
        if (a.np == 3) st = a.pos[2].i;
        if (st == 0) rfail(R, x, KVS_ERR_FORMAT, "range() step cannot be zero");
        int64_t n = st > 0 ? (hi > lo ? (hi - lo + st - 1) / st : 0) : (lo > hi ? (lo - hi - st - 1) / -st : 0);
        if (n > 1000000) rfail(R, x, KVS_ERR_RANGE, "range() of %lld items (limit 1000000)", (long long)n);
        ct_val r = v_list(R, (size_t)n, 0);
        for (int64_t i = 0; i < n; i++) r.l->v[i] = v_int(lo + i * st);
        return r;
    }
    case F_NAMESPACE: {
        ct_val d = v_dict(R);
        d.d->ns = 1;
        for (size_t i = 0; i < a.np; i++) {
            if (a.pos[i].t != V_DICT) rfail(R, x, KVS_ERR_FORMAT, "namespace() takes a dict or keyword arguments");
            for (size_t j = 0; j < a.pos[i].d->n; j++)
                dict_set(R, d.d, a.pos[i].d->k[j], a.pos[i].d->kn[j], a.pos[i].d->v[j]);
        }
        for (size_t i = 0; i < a.nk; i++) dict_set(R, d.d, a.kwn[i], strlen(a.kwn[i]), a.kwv[i]);
        return d;
    }
    case F_STRFTIME: {
        if (!R->o->date)
            rfail(R, x, KVS_ERR_UNSUPPORTED, "strftime_now() reads the clock, which would make the rendering "
                  "irreproducible: give a fixed date (kvsim: --chat-date YYYY-MM-DD)");
        const ct_val *fmt = need_str(R, x, a.np ? &a.pos[0] : NULL, "strftime_now()");
        struct tm tm;
        memset(&tm, 0, sizeof tm);
        int y, mo, d;
        if (sscanf(R->o->date, "%d-%d-%d", &y, &mo, &d) != 3 || mo < 1 || mo > 12 || d < 1 || d > 31)
            rfail(R, x, KVS_ERR_FORMAT, "date '%s' is not YYYY-MM-DD", R->o->date);
        tm.tm_year = y - 1900;
        tm.tm_mon = mo - 1;
        tm.tm_mday = d;
        tm.tm_hour = 12;
        time_t tt = timegm(&tm);
        gmtime_r(&tt, &tm); /* fills the weekday */
        char out[256];
        size_t n = 0;
        if (fmt->n < 100) {
            char f2[128];
            memcpy(f2, fmt->s, fmt->n);
            f2[fmt->n] = '\0';
            /* the format is the template's: strftime only reads it (no arguments to mismatch) */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
            n = strftime(out, sizeof out, f2, &tm);
#pragma GCC diagnostic pop
        }
        if (n == 0 && fmt->n) rfail(R, x, KVS_ERR_UNSUPPORTED, "strftime_now() format too long or empty result");
        return v_strcopy(R, out, n);
    }
    default: return call_method(R, x, &f, &a);
    }
}

static ct_val filter(ct_render *R, ct_scope *sc, const ct_node *x) {
    ct_val v = eval(R, sc, x->a);
    ct_args a;
    eval_args(R, sc, x, &a);
    const char *f = x->s;
    static const char *const none[] = {NULL};
    if (!strcmp(f, "default") || !strcmp(f, "d")) {
        static const char *const kw[] = {"default_value", "boolean", NULL};
        no_kwargs(R, x, &a, f, kw);
        const ct_val *d = arg(R, x, &a, 0, "default_value", 2, f), *b = arg(R, x, &a, 1, "boolean", 2, f);
        int use = v.t == V_UNDEF || (b && truthy(b) && !truthy(&v));
        return use ? (d ? *d : v_str("", 0)) : v;
    }
    if (v.t == V_UNDEF && strcmp(f, "items"))
        rfail(R, x, KVS_ERR_FORMAT, "filter %s of an undefined value", f);
    if (!strcmp(f, "trim")) {
        no_kwargs(R, x, &a, f, none);
        const ct_val *c = arg(R, x, &a, 0, "", 1, f);
        need_str(R, x, &v, "trim");
        return c && c->t != V_NONE ? strip(&v, need_str(R, x, c, "trim")->s, c->n, 3) : strip(&v, NULL, 0, 3);
    }
    if (!strcmp(f, "length") || !strcmp(f, "count")) {
        if (v.t == V_STR) return v_int((int64_t)u8_count(v.s, v.n));
        if (v.t == V_LIST) return v_int((int64_t)v.l->n);
        if (v.t == V_DICT) return v_int((int64_t)v.d->n);
        rfail(R, x, KVS_ERR_FORMAT, "length of a %s", type_name(&v));
    }
    if (!strcmp(f, "upper") || !strcmp(f, "lower") || !strcmp(f, "capitalize"))
        return recase(R, x, need_str(R, x, &v, f), f[0] == 'u' ? 1 : f[0] == 'l' ? 2 : 3);
    if (!strcmp(f, "items")) {
        if (v.t == V_UNDEF) return v_list(R, 0, 0);
        if (v.t != V_DICT) rfail(R, x, KVS_ERR_FORMAT, "items of a %s", type_name(&v));
        ct_val m = method(&v, "items");
        return call_method(R, x, &m, &(ct_args){0});
    }
    if (!strcmp(f, "first") || !strcmp(f, "last")) {
        int64_t k = f[0] == 'f' ? 0 : -1;
        if (v.t != V_LIST && v.t != V_STR) rfail(R, x, KVS_ERR_FORMAT, "%s of a %s", f, type_name(&v));
        ct_val key = v_int(k);
        return get_index(R, x, &v, &key);
    }
    if (!strcmp(f, "join")) {
        static const char *const kw[] = {"d", NULL};
        no_kwargs(R, x, &a, f, kw);
        const ct_val *sep = arg(R, x, &a, 0, "d", 1, f);
        if (sep) need_str(R, x, sep, "join");
        if (v.t != V_LIST) rfail(R, x, KVS_ERR_FORMAT, "join of a %s", type_name(&v));
        ct_buf b = {0};
        buf_put(R, x, &b, "", 0);
        for (size_t i = 0; i < v.l->n; i++) {
            char nb[64];
            const char *s;
            size_t n;
            if (i && sep) buf_put(R, x, &b, sep->s, sep->n);
            to_text(R, x, &v.l->v[i], &s, &n, nb, sizeof nb);
            buf_put(R, x, &b, s, n);
        }
        return v_str(b.p, b.n);
    }
    if (!strcmp(f, "list")) {
        if (v.t == V_LIST) {
            ct_val r = v_list(R, v.l->n, 0);
            if (v.l->n) memcpy(r.l->v, v.l->v, v.l->n * sizeof *r.l->v);
            return r;
        }
        if (v.t == V_DICT) { ct_val m = method(&v, "keys"); return call_method(R, x, &m, &(ct_args){0}); }
        if (v.t == V_STR) {
            size_t count, *off = cp_offsets(R, &v, &count);
            ct_val r = v_list(R, count, 0);
            for (size_t i = 0; i < count; i++) r.l->v[i] = v_str(v.s + off[i], off[i + 1] - off[i]);
            return r;
        }
        rfail(R, x, KVS_ERR_FORMAT, "list of a %s", type_name(&v));
    }
    if (!strcmp(f, "reverse")) {
        ct_val p[3] = {v_undef(), v_undef(), v_int(-1)};
        if (v.t != V_LIST && v.t != V_STR) rfail(R, x, KVS_ERR_FORMAT, "reverse of a %s", type_name(&v));
        return do_slice(R, x, &v, p);
    }
    if (!strcmp(f, "tojson")) {
        static const char *const kw[] = {"indent", NULL};
        no_kwargs(R, x, &a, f, kw);
        const ct_val *ind = arg(R, x, &a, 0, "indent", 1, f);
        if (ind && ind->t != V_NONE) rfail(R, x, KVS_ERR_UNSUPPORTED, "tojson with an indent");
        ct_buf b = {0};
        to_json(R, x, &b, &v, 0);
        return v_str(b.p, b.n);
    }
    if (!strcmp(f, "string")) {
        char nb[64];
        const char *s;
        size_t n;
        to_text(R, x, &v, &s, &n, nb, sizeof nb);
        return v_strcopy(R, s, n);
    }
    if (!strcmp(f, "int")) {
        if (v.t == V_INT || v.t == V_BOOL) return v_int(v.i);
        if (v.t == V_FLOAT && fabs(v.f) < 9e18) return v_int((int64_t)v.f);
        if (v.t == V_STR) {
            ct_val t = strip(&v, NULL, 0, 3);
            char buf[32];
            if (t.n == 0 || t.n >= sizeof buf) return v_int(0);
            memcpy(buf, t.s, t.n);
            buf[t.n] = '\0';
            char *end;
            long long r = strtoll(buf, &end, 10);
            return v_int(*end ? 0 : (int64_t)r);
        }
        return v_int(0);
    }
    if (!strcmp(f, "abs")) {
        if (v.t == V_INT) return v_int(v.i < 0 ? -v.i : v.i);
        if (v.t == V_FLOAT) return v_float(fabs(v.f));
        rfail(R, x, KVS_ERR_FORMAT, "abs of a %s", type_name(&v));
    }
    if (!strcmp(f, "replace")) {
        ct_val m = method(&v, "replace");
        if (v.t != V_STR) rfail(R, x, KVS_ERR_FORMAT, "replace of a %s", type_name(&v));
        return call_method(R, x, &m, &a);
    }
    rfail(R, x, KVS_ERR_UNSUPPORTED, "the filter '%s'", f);
}

static int test(ct_render *R, ct_scope *sc, const ct_node *x) {
    ct_val v = eval(R, sc, x->a);
    ct_args a;
    eval_args(R, sc, x, &a);
    const char *t = x->s;
    if (!strcmp(t, "defined")) return v.t != V_UNDEF;
    if (!strcmp(t, "undefined")) return v.t == V_UNDEF;
    if (!strcmp(t, "none")) return v.t == V_NONE;
    if (!strcmp(t, "string")) return v.t == V_STR;
    if (!strcmp(t, "number")) return v.t == V_INT || v.t == V_FLOAT;
    if (!strcmp(t, "integer")) return v.t == V_INT;
    if (!strcmp(t, "float")) return v.t == V_FLOAT;
    if (!strcmp(t, "boolean")) return v.t == V_BOOL;
    if (!strcmp(t, "true")) return v.t == V_BOOL && v.i;
    if (!strcmp(t, "false")) return v.t == V_BOOL && !v.i;
    if (!strcmp(t, "mapping")) return v.t == V_DICT;
    if (!strcmp(t, "iterable")) return v.t == V_LIST || v.t == V_STR || v.t == V_DICT;
    if (!strcmp(t, "sequence")) return v.t == V_LIST || v.t == V_STR || v.t == V_DICT;
    if (!strcmp(t, "callable")) return v.t == V_FUNC;
    if (!strcmp(t, "odd") || !strcmp(t, "even")) {
        if (v.t != V_INT) rfail(R, x, KVS_ERR_FORMAT, "test %s of a %s", t, type_name(&v));
        return (int)((v.i % 2 != 0) == (t[0] == 'o'));
    }
    if (!strcmp(t, "lower") || !strcmp(t, "upper")) {
        if (v.t != V_STR) return 0;
        ct_val c = recase(R, x, &v, t[0] == 'u' ? 1 : 2);
        return equal(&c, &v);
    }
    if (a.np != 1 || a.nk) rfail(R, x, KVS_ERR_UNSUPPORTED, "the test '%s' (or its arguments)", t);
    if (!strcmp(t, "divisibleby")) {
        if (v.t != V_INT || a.pos[0].t != V_INT || a.pos[0].i == 0) rfail(R, x, KVS_ERR_FORMAT, "divisibleby of non-integers or 0");
        return v.i % a.pos[0].i == 0;
    }
    if (!strcmp(t, "eq") || !strcmp(t, "equalto") || !strcmp(t, "sameas")) return equal(&v, &a.pos[0]);
    if (!strcmp(t, "ne")) return !equal(&v, &a.pos[0]);
    rfail(R, x, KVS_ERR_UNSUPPORTED, "the test '%s'", t);
}

static int contains(ct_render *R, const ct_node *x, const ct_val *item, const ct_val *in) {
    if (in->t == V_STR) {
        if (item->t != V_STR) rfail(R, x, KVS_ERR_FORMAT, "'in <string>' requires a string on the left, got %s", type_name(item));
        return find_bytes(in->s, in->n, item->s, item->n) != NULL;
    }
    if (in->t == V_LIST) {
        for (size_t i = 0; i < in->l->n; i++)
            if (equal(item, &in->l->v[i])) return 1;
        return 0;
    }
    if (in->t == V_DICT) return item->t == V_STR && dict_find(in->d, item->s, item->n) != NULL;
    rfail(R, x, KVS_ERR_FORMAT, "'in' a %s value", type_name(in));
}

static ct_val binop(ct_render *R, const ct_node *x, int op, ct_val *l, ct_val *r) {
    switch (op) {
    case OP_EQ: return v_bool(equal(l, r));
    case OP_NE: return v_bool(!equal(l, r));
    case OP_IN: return v_bool(contains(R, x, l, r));
    case OP_NOTIN: return v_bool(!contains(R, x, l, r));
    case OP_CAT: {
        char b1[64], b2[64];
        const char *s1, *s2;
        size_t n1, n2;
        to_text(R, x, l, &s1, &n1, b1, sizeof b1);
        to_text(R, x, r, &s2, &n2, b2, sizeof b2);
        if (n1 + n2 > KVS_CHAT_MAX_OUTPUT) rfail(R, x, KVS_ERR_RANGE, "string longer than the output limit");
        char *o = ar_alloc(&R->ar, n1 + n2 + 1);
        memcpy(o, s1, n1);
        memcpy(o + n1, s2, n2);
        o[n1 + n2] = '\0';
        return v_str(o, n1 + n2);
    }
    default: break;
    }
    if (l->t == V_UNDEF || r->t == V_UNDEF)
        rfail(R, x, KVS_ERR_FORMAT, "arithmetic or ordering on an undefined value");
    int ints = (l->t == V_INT || l->t == V_BOOL) && (r->t == V_INT || r->t == V_BOOL);
    if (is_num(l) && is_num(r)) {
        int64_t a = l->i, b = r->i, z;
        double fa = num(l), fb = num(r);
        switch (op) {
        case OP_ADD: case OP_SUB: case OP_MUL:
            if (!ints) return v_float(op == OP_ADD ? fa + fb : op == OP_SUB ? fa - fb : fa * fb);
            z = 0;
            if (op == OP_ADD ? __builtin_add_overflow(a, b, &z) : op == OP_SUB ? __builtin_sub_overflow(a, b, &z)
                             : __builtin_mul_overflow(a, b, &z))
                rfail(R, x, KVS_ERR_RANGE, "integer overflow");
            return v_int(z);
        case OP_DIV:
            if (fb == 0) rfail(R, x, KVS_ERR_FORMAT, "division by zero");
            return v_float(fa / fb);
        case OP_FDIV: case OP_MOD:
            if (fb == 0) rfail(R, x, KVS_ERR_FORMAT, "division by zero");
            if (ints) {
                if (a == INT64_MIN && b == -1) rfail(R, x, KVS_ERR_RANGE, "integer overflow");
                int64_t q = a / b, m = a % b;
                if (m != 0 && ((m < 0) != (b < 0))) { q--; m += b; }
                return v_int(op == OP_FDIV ? q : m);
            } else {
                double q = floor(fa / fb), m = fa - q * fb;
                return v_float(op == OP_FDIV ? q : m);
            }
        case OP_POW:
            if (ints && b >= 0) {
                int64_t res = 1;
                for (int64_t k = 0; k < b; k++) {
                    if (__builtin_mul_overflow(res, a, &res)) rfail(R, x, KVS_ERR_RANGE, "integer overflow");
                    if (res == 0 || res == 1) break;
                    step(R, x);
                }
                return v_int(res);
            }
            return v_float(pow(fa, fb));
        case OP_LT: return v_bool(fa < fb);
        case OP_LE: return v_bool(fa <= fb);
        case OP_GT: return v_bool(fa > fb);
        case OP_GE: return v_bool(fa >= fb);
        default: break;
        }
    }
    if (l->t == V_STR && r->t == V_STR) {
        if (op == OP_ADD) return binop(R, x, OP_CAT, l, r);
        if (op >= OP_LT && op <= OP_GE) {
            size_t m = l->n < r->n ? l->n : r->n;
            int c = memcmp(l->s, r->s, m);
            if (c == 0) c = l->n < r->n ? -1 : l->n > r->n;
            return v_bool(op == OP_LT ? c < 0 : op == OP_LE ? c <= 0 : op == OP_GT ? c > 0 : c >= 0);
        }
    }
    if (l->t == V_LIST && r->t == V_LIST && op == OP_ADD) {
        ct_val o = v_list(R, l->l->n + r->l->n, 0);
        if (l->l->n) memcpy(o.l->v, l->l->v, l->l->n * sizeof *o.l->v);
        if (r->l->n) memcpy(o.l->v + l->l->n, r->l->v, r->l->n * sizeof *o.l->v);
        return o;
    }
    if (op == OP_MUL && ((l->t == V_STR || l->t == V_LIST) && r->t == V_INT)) {
        int64_t k = r->i < 0 ? 0 : r->i;
        size_t unit = l->t == V_STR ? l->n : l->l->n;
        if (unit && (uint64_t)k > KVS_CHAT_MAX_OUTPUT / unit) rfail(R, x, KVS_ERR_RANGE, "repetition longer than the output limit");
        if (l->t == V_STR) {
            char *o = ar_alloc(&R->ar, unit * (size_t)k + 1);
            for (int64_t j = 0; j < k; j++) memcpy(o + (size_t)j * unit, l->s, unit);
            o[unit * (size_t)k] = '\0';
            return v_str(o, unit * (size_t)k);
        }
        ct_val o = v_list(R, unit * (size_t)k, 0);
        for (int64_t j = 0; j < k; j++) memcpy(o.l->v + (size_t)j * unit, l->l->v, unit * sizeof *o.l->v);
        return o;
    }
    static const char *const names[] = {"+", "-", "*", "/", "//", "%", "**", "~", "==", "!=", "<", "<=", ">", ">="};
    rfail(R, x, KVS_ERR_UNSUPPORTED, "'%s' between %s and %s", names[op], type_name(l), type_name(r));
}

static ct_val eval(ct_render *R, ct_scope *sc, const ct_node *x) {
    step(R, x);
    switch (x->kind) {
    case E_STR: return v_str(x->s, x->n);
    case E_INT: return v_int(x->i);
    case E_FLOAT: return v_float(x->f);
    case E_BOOL: return v_bool((int)x->i);
    case E_NONE: return v_none();
    case E_NAME: return lookup(R, sc, x->s);
    case E_LIST: case E_TUPLE: {
        ct_val r = v_list(R, x->nk, x->kind == E_TUPLE);
        for (size_t i = 0; i < x->nk; i++) r.l->v[i] = eval(R, sc, x->kids[i]);
        return r;
    }
    case E_DICT: {
        ct_val r = v_dict(R);
        for (size_t i = 0; i + 1 < x->nk; i += 2) {
            ct_val k = eval(R, sc, x->kids[i]);
            if (k.t != V_STR) rfail(R, x, KVS_ERR_UNSUPPORTED, "dict literal with a %s key", type_name(&k));
            dict_set(R, r.d, k.s, k.n, eval(R, sc, x->kids[i + 1]));
        }
        return r;
    }
    case E_ATTR: {
        ct_val o = eval(R, sc, x->a);
        return get_attr(R, x, &o, x->s, x->n);
    }
    case E_INDEX: {
        ct_val o = eval(R, sc, x->a), k = eval(R, sc, x->b);
        return get_index(R, x, &o, &k);
    }
    case E_SLICE: {
        ct_val o = eval(R, sc, x->a), p[3];
        for (int k = 0; k < 3; k++) p[k] = x->kids[k] ? eval(R, sc, x->kids[k]) : v_undef();
        return do_slice(R, x, &o, p);
    }
    case E_CALL: return call(R, sc, x);
    case E_FILTER: return filter(R, sc, x);
    case E_TEST: return v_bool(test(R, sc, x) != (int)x->i);
    case E_NOT: { ct_val v = eval(R, sc, x->a); return v_bool(!truthy(&v)); }
    case E_NEG: case E_POS: {
        ct_val v = eval(R, sc, x->a);
        if (v.t == V_INT || v.t == V_BOOL) {
            if (x->kind == E_POS) return v_int(v.i);
            if (v.i == INT64_MIN) rfail(R, x, KVS_ERR_RANGE, "integer overflow");
            return v_int(-v.i);
        }
        if (v.t == V_FLOAT) return v_float(x->kind == E_NEG ? -v.f : v.f);
        rfail(R, x, KVS_ERR_FORMAT, "unary %c of a %s", x->kind == E_NEG ? '-' : '+', type_name(&v));
    }
    case E_AND: { ct_val l = eval(R, sc, x->a); return truthy(&l) ? eval(R, sc, x->b) : l; }
    case E_OR: { ct_val l = eval(R, sc, x->a); return truthy(&l) ? l : eval(R, sc, x->b); }
    case E_COND: {
        ct_val c = eval(R, sc, x->a);
        if (truthy(&c)) return eval(R, sc, x->b);
        return x->c ? eval(R, sc, x->c) : v_undef();
    }
    case E_BIN: {
        ct_val l = eval(R, sc, x->a), r = eval(R, sc, x->b);
        return binop(R, x, x->op, &l, &r);
    }
    default: rfail(R, x, KVS_ERR_FORMAT, "statement where an expression was expected");
    }
}

static void exec_for(ct_render *R, ct_scope *sc, const ct_node *x) {
    ct_val it = eval(R, sc, x->a);
    ct_list *items;
    if (it.t == V_LIST) {
        items = it.l;
    } else if (it.t == V_DICT) {
        ct_val m = method(&it, "keys");
        items = call_method(R, x, &m, &(ct_args){0}).l;
    } else if (it.t == V_STR) {
        ct_val m = it;
        ct_node fake = *x;
        fake.s = "list";
        (void)fake;
        size_t count, *off = cp_offsets(R, &m, &count);
        ct_val r = v_list(R, count, 0);
        for (size_t i = 0; i < count; i++) r.l->v[i] = v_str(m.s + off[i], off[i + 1] - off[i]);
        items = r.l;
    } else {
        rfail(R, x, KVS_ERR_FORMAT, "for loop over a %s value", type_name(&it));
    }
    ct_scope *loop_sc = ar_alloc(&R->ar, sizeof *loop_sc);
    memset(loop_sc, 0, sizeof *loop_sc);
    loop_sc->parent = sc;
    if (x->c) { /* "for x in xs if cond": filter first; loop.* counts the kept items */
        ct_val kept = v_list(R, items->n, 0);
        size_t k = 0;
        for (size_t i = 0; i < items->n; i++) {
            step(R, x);
            if (x->nn == 1) scope_set(R, loop_sc, x->names[0], items->v[i]);
            else if (items->v[i].t == V_LIST && items->v[i].l->n == x->nn)
                for (size_t j = 0; j < x->nn; j++) scope_set(R, loop_sc, x->names[j], items->v[i].l->v[j]);
            else rfail(R, x, KVS_ERR_FORMAT, "cannot unpack a %s into %zu names", type_name(&items->v[i]), x->nn);
            ct_val c = eval(R, loop_sc, x->c);
            if (truthy(&c)) kept.l->v[k++] = items->v[i];
        }
        kept.l->n = k;
        items = kept.l;
    }
    ct_loop *lp = ar_alloc(&R->ar, sizeof *lp);
    lp->items = items;
    ct_val loopv = v_undef();
    loopv.t = V_LOOP;
    loopv.lp = lp;
    for (size_t i = 0; i < items->n; i++) {
        step(R, x);
        lp->idx = i;
        scope_set(R, loop_sc, "loop", loopv);
        if (x->nn == 1) {
            scope_set(R, loop_sc, x->names[0], items->v[i]);
        } else {
            const ct_val *e = &items->v[i];
            if (e->t != V_LIST || e->l->n != x->nn)
                rfail(R, x, KVS_ERR_FORMAT, "cannot unpack a %s into %zu names", type_name(e), x->nn);
            for (size_t j = 0; j < x->nn; j++) scope_set(R, loop_sc, x->names[j], e->l->v[j]);
        }
        exec_body(R, loop_sc, x->kids, x->nk);
    }
    if (items->n == 0) exec_body(R, sc, x->kids2, x->nk2);
}

static void exec_body(ct_render *R, ct_scope *sc, ct_node **body, size_t n) {
    if (++R->depth > KVS_CHAT_MAX_DEPTH) rfail(R, n ? body[0] : NULL, KVS_ERR_RANGE, "nesting deeper than the limit");
    for (size_t i = 0; i < n; i++) {
        const ct_node *x = body[i];
        step(R, x);
        switch (x->kind) {
        case S_TEXT: out_put(R, x, x->s, x->n); break;
        case S_OUT: {
            ct_val v = eval(R, sc, x->a);
            char nb[64];
            const char *s;
            size_t len;
            to_text(R, x, &v, &s, &len, nb, sizeof nb);
            out_put(R, x, s, len);
            break;
        }
        case S_IF: {
            ct_val c = eval(R, sc, x->a);
            if (truthy(&c)) exec_body(R, sc, x->kids, x->nk);
            else exec_body(R, sc, x->kids2, x->nk2);
            break;
        }
        case S_FOR: exec_for(R, sc, x); break;
        case S_SET: {
            ct_val v = eval(R, sc, x->a);
            if (x->nn) {
                ct_val ns = lookup(R, sc, x->s);
                if (ns.t != V_DICT || !ns.d->ns)
                    rfail(R, x, KVS_ERR_FORMAT, "set %s.%s: only a namespace() takes attribute assignment", x->s, x->names[0]);
                dict_set(R, ns.d, x->names[0], strlen(x->names[0]), v);
            } else {
                scope_set(R, sc, x->s, v);
            }
            break;
        }
        case S_SETBLOCK: {
            size_t mark = R->n;
            exec_body(R, sc, x->kids, x->nk);
            ct_val v = v_strcopy(R, R->out ? R->out + mark : "", R->n - mark);
            R->n = mark;
            if (R->out) R->out[mark] = '\0';
            scope_set(R, sc, x->s, v);
            break;
        }
        default: rfail(R, x, KVS_ERR_FORMAT, "expression where a statement was expected");
        }
    }
    R->depth--;
}

/* ------------------------------------------------------------------------------------------- public API -- */

/* The body of kvs_chat_template_parse below its setjmp (a separate function: no local of the setjmp caller
 * changes after it, so none can be clobbered by the longjmp). */
static void parse_into(kvs_chat_template *t, ct_err *err, const char *src, size_t len) {
    /* keep_trailing_newline off: one final newline of the source is not output */
    if (len && src[len - 1] == '\n') len--;
    if (memchr(src, '\0', len)) ct_jump(err, KVS_ERR_FORMAT, "NUL byte in the template");
    ct_lexer L = {.ar = &t->ar, .jb = err, .src = src, .len = len};
    lex(&L);
    ct_parser P = {.ar = &t->ar, .jb = err, .t = L.t};
    ct_ptrs body = {0};
    parse_body(&P, NULL, &body);
    t->body = (ct_node **)body.v;
    t->n_body = body.n;
}

kvs_status kvs_chat_template_parse(const char *src, size_t len, kvs_chat_template **out) {
    if (!src || !out) return kvs_fail(KVS_ERR_INVALID_ARG, "chat template: NULL argument");
    *out = NULL;
    kvs_chat_template *t = calloc(1, sizeof *t);
    if (!t) return kvs_fail(KVS_ERR_NOMEM, "chat template: out of memory");
    ct_err err;
    t->ar.limit = KVS_CHAT_MAX_MEMORY;
    t->ar.jb = &err;
    kvs_sha256_hex(src, len, t->hash);
    if (setjmp(err.jb)) {
        kvs_chat_template_free(t);
        return err.st;
    }
    parse_into(t, &err, src, len);
    t->ar.jb = NULL;
    *out = t;
    return KVS_OK;
}

void kvs_chat_template_free(kvs_chat_template *t) {
    if (!t) return;
    ar_free(&t->ar);
    for (int k = 0; k < N_TOKENS; k++) free(t->tokens[k]);
    free(t);
}

kvs_status kvs_chat_template_set_token(kvs_chat_template *t, const char *name, const char *value) {
    if (!t || !name) return kvs_fail(KVS_ERR_INVALID_ARG, "chat template: NULL argument");
    for (int k = 0; k < N_TOKENS; k++)
        if (!strcmp(name, token_names[k])) {
            char *c = NULL;
            if (value && !(c = strdup(value))) return kvs_fail(KVS_ERR_NOMEM, "chat template: out of memory");
            free(t->tokens[k]);
            t->tokens[k] = c;
            return KVS_OK;
        }
    return kvs_fail(KVS_ERR_INVALID_ARG, "chat template: '%s' is not a special token name", name);
}

const char *kvs_chat_template_token(const kvs_chat_template *t, const char *name) {
    for (int k = 0; t && name && k < N_TOKENS; k++)
        if (!strcmp(name, token_names[k])) return t->tokens[k];
    return NULL;
}

const char *kvs_chat_template_hash(const kvs_chat_template *t) { return t ? t->hash : NULL; }

static ct_val from_json(ct_render *R, const kvs_json *j, int depth) {
    if (depth > KVS_CHAT_MAX_DEPTH) rfail(R, NULL, KVS_ERR_RANGE, "messages nested deeper than %d", KVS_CHAT_MAX_DEPTH);
    switch (kvs_json_type_of(j)) {
    case KVS_JSON_NULL: return v_none();
    case KVS_JSON_BOOL: return v_bool(kvs_json_bool(j));
    case KVS_JSON_NUMBER: {
        double d = kvs_json_number(j);
        return d == floor(d) && fabs(d) < 9e15 ? v_int((int64_t)d) : v_float(d);
    }
    case KVS_JSON_STRING:
        if (memchr(kvs_json_string(j), '\0', kvs_json_string_len(j)))
            rfail(R, NULL, KVS_ERR_UNSUPPORTED, "a message string with a NUL character");
        return v_str(kvs_json_string(j), kvs_json_string_len(j));
    case KVS_JSON_ARRAY: {
        ct_val r = v_list(R, kvs_json_len(j), 0);
        for (size_t i = 0; i < r.l->n; i++) r.l->v[i] = from_json(R, kvs_json_at(j, i), depth + 1);
        return r;
    }
    case KVS_JSON_OBJECT: {
        ct_val r = v_dict(R);
        for (size_t i = 0; i < kvs_json_len(j); i++) {
            const char *k = kvs_json_key_at(j, i);
            dict_set(R, r.d, k, strlen(k), from_json(R, kvs_json_at(j, i), depth + 1));
        }
        return r;
    }
    }
    return v_undef();
}

/* One render: messages come from m[0..n) or the JSON array `jm`. */
static kvs_status render(const kvs_chat_template *t, const kvs_chat_message *m, size_t n, const kvs_json *jm,
                         const kvs_chat_render_opts *o, char **out, size_t *out_len) {
    if (!t || !out || (!m && n) || (jm && kvs_json_type_of(jm) != KVS_JSON_ARRAY))
        return kvs_fail(KVS_ERR_INVALID_ARG, "chat template: bad arguments (messages must be an array)");
    *out = NULL;
    if (out_len) *out_len = 0;
    kvs_chat_render_opts dflt = {0};
    ct_render *R = calloc(1, sizeof *R);
    if (!R) return kvs_fail(KVS_ERR_NOMEM, "chat template: out of memory");
    R->o = o ? o : &dflt;
    R->t = t;
    R->ar.limit = KVS_CHAT_MAX_MEMORY;
    R->ar.jb = &R->jb;
    if (setjmp(R->jb.jb)) {
        kvs_status st = R->jb.st;
        ar_free(&R->ar);
        free(R->out);
        free(R);
        return st;
    }
    if (jm) {
        R->messages = from_json(R, jm, 0);
    } else {
        R->messages = v_list(R, n, 0);
        for (size_t i = 0; i < n; i++) {
            if (!m[i].role || !m[i].content) rfail(R, NULL, KVS_ERR_FORMAT, "message %zu has no role or content", i);
            ct_val d = v_dict(R);
            dict_set(R, d.d, "role", 4, v_str(m[i].role, strlen(m[i].role)));
            dict_set(R, d.d, "content", 7, v_str(m[i].content, strlen(m[i].content)));
            R->messages.l->v[i] = d;
        }
    }
    ct_scope top = {0};
    out_put(R, NULL, "", 0);
    exec_body(R, &top, t->body, t->n_body);
    if (memchr(R->out, '\0', R->n)) /* from a "\0" escape: the text would end there for every C-string user */
        rfail(R, NULL, KVS_ERR_UNSUPPORTED, "a NUL character in the rendered text");
    *out = R->out;
    if (out_len) *out_len = R->n;
    ar_free(&R->ar);
    free(R);
    return KVS_OK;
}

kvs_status kvs_chat_render(const kvs_chat_template *t, const kvs_chat_message *m, size_t n,
                           const kvs_chat_render_opts *o, char **out, size_t *out_len) {
    return render(t, m, n, NULL, o, out, out_len);
}

kvs_status kvs_chat_render_json(const kvs_chat_template *t, const kvs_json *messages, const kvs_chat_render_opts *o,
                                char **out, size_t *out_len) {
    if (!messages) return kvs_fail(KVS_ERR_INVALID_ARG, "chat template: NULL messages");
    return render(t, NULL, 0, messages, o, out, out_len);
}

/* A special token in tokenizer_config.json: a string or {"content": string}; NULL otherwise. */
static const char *config_token(const kvs_json *cfg, const char *key) {
    const kvs_json *v = kvs_json_get(cfg, key);
    if (kvs_json_type_of(v) == KVS_JSON_OBJECT) v = kvs_json_get(v, "content");
    return kvs_json_type_of(v) == KVS_JSON_STRING ? kvs_json_string(v) : NULL;
}

kvs_status kvs_chat_template_load(const char *dir, kvs_chat_template **out) {
    kvs_status s = KVS_OK;
    char path[4200], *text = NULL, *jinja = NULL;
    size_t len = 0, jlen = 0;
    kvs_json *cfg = NULL;
    kvs_chat_template *t = NULL;
    const char *src = NULL;
    size_t src_len = 0;
    if (!dir || !out) return kvs_fail(KVS_ERR_INVALID_ARG, "chat template: NULL argument");
    *out = NULL;
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    int have_cfg = kvs_read_file(path, &text, &len) == KVS_OK;
    if (have_cfg) {
        if ((s = kvs_json_parse(text, len, &cfg)) != KVS_OK) {
            s = kvs_fail(s, "%s: %s", path, kvs_last_error());
            goto cleanup;
        }
        const kvs_json *ct = kvs_json_get(cfg, "chat_template");
        if (kvs_json_type_of(ct) == KVS_JSON_STRING) {
            src = kvs_json_string(ct);
            src_len = kvs_json_string_len(ct);
        } else if (kvs_json_type_of(ct) == KVS_JSON_ARRAY) {
            for (size_t i = 0; i < kvs_json_len(ct); i++) {
                const kvs_json *e = kvs_json_at(ct, i), *nm = kvs_json_get(e, "name"), *tp = kvs_json_get(e, "template");
                if (kvs_json_type_of(nm) == KVS_JSON_STRING && !strcmp(kvs_json_string(nm), "default") &&
                    kvs_json_type_of(tp) == KVS_JSON_STRING) {
                    src = kvs_json_string(tp);
                    src_len = kvs_json_string_len(tp);
                }
            }
            if (!src) {
                s = kvs_fail(KVS_ERR_UNSUPPORTED, "%s: chat_template is a list without a \"default\" entry", path);
                goto cleanup;
            }
        } else if (ct && kvs_json_type_of(ct) != KVS_JSON_NULL) {
            s = kvs_fail(KVS_ERR_FORMAT, "%s: chat_template is neither a string nor a list", path);
            goto cleanup;
        }
    }
    if (!src) {
        char jp[4200];
        snprintf(jp, sizeof jp, "%s/chat_template.jinja", dir);
        if (kvs_read_file(jp, &jinja, &jlen) == KVS_OK) {
            src = jinja;
            src_len = jlen;
        } else if (!have_cfg) {
            s = kvs_fail(KVS_ERR_IO, "%s: no tokenizer_config.json or chat_template.jinja to take a chat template from", dir);
            goto cleanup;
        } else {
            s = kvs_fail(KVS_ERR_UNSUPPORTED, "%s has no chat template (no \"chat_template\" in tokenizer_config.json, "
                         "no chat_template.jinja): kvsim does not invent one", dir);
            goto cleanup;
        }
    }
    if ((s = kvs_chat_template_parse(src, src_len, &t)) != KVS_OK) {
        s = kvs_fail(s, "%s: %s", dir, kvs_last_error());
        goto cleanup;
    }
    for (int k = 0; cfg && k < N_TOKENS; k++) {
        const char *v = config_token(cfg, token_names[k]);
        if (v && v[0] && (s = kvs_chat_template_set_token(t, token_names[k], v)) != KVS_OK) goto cleanup;
    }
    *out = t;
    t = NULL;
cleanup:
    kvs_chat_template_free(t);
    kvs_json_free(cfg);
    free(text);
    free(jinja);
    return s;
}
