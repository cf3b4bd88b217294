/* tokenizer_regex.c — a backtracking regex engine for tokenizer.json patterns (syntax, semantics and bounds in
 * tokenizer_regex.h). It follows Oniguruma, the engine Hugging Face's `tokenizers` library compiles
 * pre_tokenizer and normalizer patterns with: the first alternative that leads to a match wins (not the longest),
 * greedy quantifiers try the most repetitions first, (?i:...) compares simple case foldings, \p{..} are Unicode
 * general categories and \s the White_Space property (gpu_capture/unicode.h, UCD tables).
 *
 * Pattern -> syntax tree (recursive descent) -> a small instruction program in the style of Thompson / Pike VMs
 * (CHAR, CLASS, SPLIT with a preferred branch, JMP, LOOK for lookahead, MATCH) run by a depth-first backtracking
 * interpreter with an explicit stack of (instruction, position) alternatives. Counted repeats are expanded
 * X{2,4} = X X (?:X (?:X)?)? so that no thread needs a counter; the interpreter's state is then just the pair,
 * and its work is capped by a step budget per search.
 */
#include "tokenizer_regex.h"

#include <stdlib.h>
#include <string.h>

#include "tokenizer_internal.h"
#include "unicode.h"

/* ---------------------------------------------------------------- classes */

#define RX_MAX_NOT 8 /* \P{..} / \S-style "not in" items one class may hold */

typedef struct {
    uint32_t *lo, *hi;            /* inclusive code point ranges */
    size_t n, cap;
    uint32_t cats;                /* bit c: general category c is in the class */
    uint32_t notcats[RX_MAX_NOT]; /* a character outside any of these masks is in the class */
    int n_not;
    int space, notspace;          /* \s, \S items */
    int neg;                      /* [^...] */
    uint64_t ascii[2];            /* class_has for U+0000..U+007F, precomputed (no case folding) */
} rx_class;

static uint32_t cat_bit(kvs_uni_category_t c) { return 1u << (unsigned)c; }

static int class_has(const rx_class *c, uint32_t x) {
    for (size_t i = 0; i < c->n; i++)
        if (x >= c->lo[i] && x <= c->hi[i]) return 1;
    if (c->cats || c->n_not) {
        uint32_t b = cat_bit(kvs_uni_category(x));
        if (c->cats & b) return 1;
        for (int i = 0; i < c->n_not; i++)
            if (!(c->notcats[i] & b)) return 1;
    }
    if (c->space && kvs_uni_is_white_space(x)) return 1;
    if (c->notspace && !kvs_uni_is_white_space(x)) return 1;
    return 0;
}

/* Membership after case folding (Oniguruma folds the class's contents, then applies the negation). */
static int class_match(const rx_class *c, uint32_t x, int icase) {
    int m;
    if (x < 128 && !icase) return (int)((c->ascii[x >> 6] >> (x & 63)) & 1) ^ c->neg;
    m = class_has(c, x);
    if (!m && icase) {
        uint32_t f = kvs_uni_simple_fold(x), src[4];
        m = f != x && class_has(c, f);
        size_t ns = kvs_uni_fold_sources(f, src, 4);
        for (size_t i = 0; !m && i < ns && i < 4; i++) m = src[i] != x && class_has(c, src[i]);
    }
    return m ^ c->neg;
}

static kvs_status class_add_range(rx_class *c, uint32_t lo, uint32_t hi) {
    if (c->n == c->cap) {
        size_t cap = c->cap ? 2 * c->cap : 8;
        uint32_t *a = realloc(c->lo, cap * sizeof *a);
        if (!a) return kvs_fail(KVS_ERR_NOMEM, "regex: out of memory");
        c->lo = a;
        uint32_t *b = realloc(c->hi, cap * sizeof *b);
        if (!b) return kvs_fail(KVS_ERR_NOMEM, "regex: out of memory");
        c->hi = b;
        c->cap = cap;
    }
    c->lo[c->n] = lo;
    c->hi[c->n] = hi;
    c->n++;
    return KVS_OK;
}

/* ---------------------------------------------------------------- syntax tree and program */

enum { N_EMPTY, N_CHAR, N_CLASS, N_ANY, N_CAT, N_ALT, N_REP, N_LOOK, N_BOL, N_EOL, N_BOT, N_EOT };
typedef struct {
    int type;
    uint32_t cp;  /* N_CHAR: the code point (folded when icase) */
    int icase;    /* N_CHAR, N_CLASS */
    int cls;      /* N_CLASS: index into classes */
    int a, b;     /* children: N_CAT / N_ALT both, N_REP / N_LOOK a */
    int min, max; /* N_REP; max -1 = unbounded */
    int greedy;   /* N_REP */
    int neg;      /* N_LOOK: (?!...) */
} rx_node;

enum {
    I_CHAR, I_CHARI, I_CLASS, I_ANY, I_SPLIT, I_JMP, I_LOOK, I_NLOOK, I_BOL, I_EOL, I_BOT, I_EOT, I_MATCH, I_SETREG,
    I_EMPTYCHK
};
typedef struct {
    uint8_t op;
    uint32_t arg;   /* I_CHAR / I_CHARI code point; I_CLASS class index */
    int32_t x, y;   /* I_SPLIT preferred / other branch; I_JMP x; I_LOOK sub-program x, continuation y;
                     * I_CLASS y = icase; I_SETREG / I_EMPTYCHK arg = register, I_EMPTYCHK x = the loop's exit */
} rx_inst;

/* Registers: one per unbounded repeat of an expression that can match empty, holding where its current iteration
 * started; an iteration that ends where it started leaves the loop (Oniguruma's empty check), so X* with a nullable X
 * terminates. */
#define RX_MAX_REGS 32

struct kvs_tok_rx {
    rx_inst *prog;
    size_t n_prog;
    rx_class *classes;
    size_t n_classes;
    uint64_t budget; /* 0: the default */
    int n_regs;
};

#define RX_MAX_DEPTH 200  /* group nesting the recursive-descent parser accepts */
#define RX_MAX_COUNT 1000 /* largest n or m of {n,m} */

typedef struct {
    const char *p;
    size_t len, i;
    rx_node *nodes;
    size_t n_nodes, cap_nodes;
    rx_class *classes;
    size_t n_classes, cap_classes;
    int depth;
    int n_regs; /* registers the empty checks of nullable unbounded repeats use */
} rx_parser;

static kvs_status unsupported(const rx_parser *ps, const char *what) {
    return kvs_fail(KVS_ERR_UNSUPPORTED, "regex: %s (at offset %zu) is not supported", what, ps->i);
}
static kvs_status malformed(const rx_parser *ps, const char *what) {
    return kvs_fail(KVS_ERR_FORMAT, "regex: %s (at offset %zu)", what, ps->i);
}

static kvs_status new_node(rx_parser *ps, int type, int *out) {
    if (ps->n_nodes == ps->cap_nodes) {
        size_t cap = ps->cap_nodes ? 2 * ps->cap_nodes : 64;
        rx_node *n = realloc(ps->nodes, cap * sizeof *n);
        if (!n) return kvs_fail(KVS_ERR_NOMEM, "regex: out of memory");
        ps->nodes = n;
        ps->cap_nodes = cap;
    }
    memset(&ps->nodes[ps->n_nodes], 0, sizeof ps->nodes[0]);
    ps->nodes[ps->n_nodes].type = type;
    *out = (int)ps->n_nodes++;
    return KVS_OK;
}

static kvs_status new_class(rx_parser *ps, int *out) {
    if (ps->n_classes == ps->cap_classes) {
        size_t cap = ps->cap_classes ? 2 * ps->cap_classes : 8;
        rx_class *c = realloc(ps->classes, cap * sizeof *c);
        if (!c) return kvs_fail(KVS_ERR_NOMEM, "regex: out of memory");
        ps->classes = c;
        ps->cap_classes = cap;
    }
    memset(&ps->classes[ps->n_classes], 0, sizeof ps->classes[0]);
    *out = (int)ps->n_classes++;
    return KVS_OK;
}

static int peek(const rx_parser *ps, char c) { return ps->i < ps->len && ps->p[ps->i] == c; }

/* The next pattern character (UTF-8) and its byte length; FORMAT on invalid UTF-8. */
static kvs_status next_cp(rx_parser *ps, uint32_t *cp) {
    if (ps->i >= ps->len) return malformed(ps, "unexpected end of pattern");
    size_t n = kvs_tok_utf8_next(ps->p + ps->i, ps->len - ps->i, cp);
    if (n == 0) return malformed(ps, "invalid UTF-8 in the pattern");
    ps->i += n;
    return KVS_OK;
}

static int hex_val(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* A general-category name (case-insensitive) -> mask of categories; 0 when unknown. */
static uint32_t category_mask(const char *name, size_t n) {
    static const struct {
        const char *name;
        uint32_t mask;
    } tab[] = {
#define B(c) (1u << KVS_UNI_##c)
        {"L", B(LU) | B(LL) | B(LT) | B(LM) | B(LO)}, {"Letter", B(LU) | B(LL) | B(LT) | B(LM) | B(LO)},
        {"LC", B(LU) | B(LL) | B(LT)}, {"L&", B(LU) | B(LL) | B(LT)}, {"Lu", B(LU)}, {"Ll", B(LL)}, {"Lt", B(LT)},
        {"Lm", B(LM)}, {"Lo", B(LO)}, {"M", B(MN) | B(MC) | B(ME)}, {"Mark", B(MN) | B(MC) | B(ME)},
        {"Mn", B(MN)}, {"Mc", B(MC)}, {"Me", B(ME)}, {"N", B(ND) | B(NL) | B(NO)},
        {"Number", B(ND) | B(NL) | B(NO)}, {"Nd", B(ND)}, {"Nl", B(NL)}, {"No", B(NO)},
        {"P", B(PC) | B(PD) | B(PS) | B(PE) | B(PI) | B(PF) | B(PO)},
        {"Punctuation", B(PC) | B(PD) | B(PS) | B(PE) | B(PI) | B(PF) | B(PO)}, {"Pc", B(PC)}, {"Pd", B(PD)},
        {"Ps", B(PS)}, {"Pe", B(PE)}, {"Pi", B(PI)}, {"Pf", B(PF)}, {"Po", B(PO)},
        {"S", B(SM) | B(SC) | B(SK) | B(SO)}, {"Symbol", B(SM) | B(SC) | B(SK) | B(SO)}, {"Sm", B(SM)},
        {"Sc", B(SC)}, {"Sk", B(SK)}, {"So", B(SO)}, {"Z", B(ZS) | B(ZL) | B(ZP)},
        {"Separator", B(ZS) | B(ZL) | B(ZP)}, {"Zs", B(ZS)}, {"Zl", B(ZL)}, {"Zp", B(ZP)},
        {"C", B(CN) | B(CC) | B(CF) | B(CS) | B(CO)}, {"Other", B(CN) | B(CC) | B(CF) | B(CS) | B(CO)},
        {"Cc", B(CC)}, {"Cf", B(CF)}, {"Cs", B(CS)}, {"Co", B(CO)}, {"Cn", B(CN)},
#undef B
    };
    for (size_t k = 0; k < sizeof tab / sizeof tab[0]; k++) {
        size_t m = strlen(tab[k].name);
        if (m != n) continue;
        size_t j = 0;
        while (j < n && (tab[k].name[j] | 32) == (name[j] | 32)) j++;
        if (j == n) return tab[k].mask;
    }
    return 0;
}

enum { ESC_CHAR, ESC_CLASS, ESC_BOT, ESC_EOT };

/* Adds "category mask" (negated: "not in mask") to c. */
static kvs_status class_add_cats(rx_parser *ps, rx_class *c, uint32_t mask, int negated) {
    if (!negated) {
        c->cats |= mask;
        return KVS_OK;
    }
    if (c->n_not == RX_MAX_NOT) return unsupported(ps, "a class with more than 8 negated items");
    c->notcats[c->n_not++] = mask;
    return KVS_OK;
}

/* After a backslash: a character (*cp, ESC_CHAR), an item added to class c (ESC_CLASS), or an anchor. */
static kvs_status parse_escape(rx_parser *ps, int in_class, rx_class *c, int *kind, uint32_t *cp) {
    if (ps->i >= ps->len) return malformed(ps, "pattern ends with a backslash");
    char e = ps->p[ps->i++];
    *kind = ESC_CHAR;
    switch (e) {
    case 't': *cp = '\t'; return KVS_OK;
    case 'n': *cp = '\n'; return KVS_OK;
    case 'r': *cp = '\r'; return KVS_OK;
    case 'f': *cp = '\f'; return KVS_OK;
    case 'v': *cp = '\v'; return KVS_OK;
    case 'a': *cp = 7; return KVS_OK;
    case 'e': *cp = 27; return KVS_OK;
    case '0': {
        uint32_t v = 0;
        for (int k = 0; k < 2 && ps->i < ps->len && ps->p[ps->i] >= '0' && ps->p[ps->i] <= '7'; k++)
            v = v * 8 + (uint32_t)(ps->p[ps->i++] - '0');
        *cp = v;
        return KVS_OK;
    }
    case 'x':
    case 'u': {
        uint32_t v = 0;
        int digits = 0;
        if (e == 'x' && peek(ps, '{')) {
            ps->i++;
            while (ps->i < ps->len && hex_val(ps->p[ps->i]) >= 0 && digits < 8) {
                v = v * 16 + (uint32_t)hex_val(ps->p[ps->i++]);
                digits++;
            }
            if (!digits || !peek(ps, '}')) return malformed(ps, "bad \\x{...} escape");
            ps->i++;
        } else {
            int want = e == 'x' ? 2 : 4;
            while (digits < want && ps->i < ps->len && hex_val(ps->p[ps->i]) >= 0) {
                v = v * 16 + (uint32_t)hex_val(ps->p[ps->i++]);
                digits++;
            }
            if (!digits || (e == 'u' && digits != 4)) return malformed(ps, "bad \\x / \\u escape");
        }
        if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return malformed(ps, "escape beyond Unicode scalar values");
        *cp = v;
        return KVS_OK;
    }
    case 's': case 'S': case 'd': case 'D': case 'w': case 'W': case 'p': case 'P': break;
    case 'A': case 'z':
        if (in_class) return malformed(ps, "anchor inside a character class");
        *kind = e == 'A' ? ESC_BOT : ESC_EOT;
        return KVS_OK;
    case 'b': return unsupported(ps, "word boundary \\b");
    case 'B': return unsupported(ps, "non-boundary \\B");
    case 'Z': return unsupported(ps, "end anchor \\Z");
    case 'G': return unsupported(ps, "search-start anchor \\G");
    case 'h': case 'H': return unsupported(ps, "hex-digit class \\h / \\H");
    case 'k': case 'g': return unsupported(ps, "backreference / subexpression call \\k \\g");
    case 'K': return unsupported(ps, "keep \\K");
    case 'R': case 'X': case 'N': case 'O': return unsupported(ps, "escape \\R / \\X / \\N / \\O");
    default:
        if (e >= '1' && e <= '9') return unsupported(ps, "backreference \\1..\\9");
        if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z')) return unsupported(ps, "unknown letter escape");
        ps->i--;
        return next_cp(ps, cp); /* an escaped punctuation or other character stands for itself */
    }
    *kind = ESC_CLASS;
    const uint32_t nd = 1u << KVS_UNI_ND;
    /* Oniguruma's Unicode Word: letters, marks, every number (U+00BD VULGAR FRACTION ONE HALF, No, is \w there) and
     * connector punctuation */
    const uint32_t word = (1u << KVS_UNI_LU) | (1u << KVS_UNI_LL) | (1u << KVS_UNI_LT) | (1u << KVS_UNI_LM) |
                          (1u << KVS_UNI_LO) | (1u << KVS_UNI_MN) | (1u << KVS_UNI_MC) | (1u << KVS_UNI_ME) | nd |
                          (1u << KVS_UNI_NL) | (1u << KVS_UNI_NO) | (1u << KVS_UNI_PC);
    switch (e) {
    case 's': c->space = 1; return KVS_OK;
    case 'S': c->notspace = 1; return KVS_OK;
    case 'd': return class_add_cats(ps, c, nd, 0);
    case 'D': return class_add_cats(ps, c, nd, 1);
    case 'w': return class_add_cats(ps, c, word, 0);
    case 'W': return class_add_cats(ps, c, word, 1);
    default: break;
    }
    /* \p{Name} \p{^Name} \pN, \P negates */
    int negated = e == 'P';
    const char *name;
    size_t n;
    if (peek(ps, '{')) {
        size_t start = ++ps->i;
        while (ps->i < ps->len && ps->p[ps->i] != '}') ps->i++;
        if (ps->i >= ps->len) return malformed(ps, "unterminated \\p{...}");
        name = ps->p + start;
        n = ps->i - start;
        ps->i++;
        if (n && name[0] == '^') {
            negated = !negated;
            name++;
            n--;
        }
    } else {
        if (ps->i >= ps->len) return malformed(ps, "\\p without a property name");
        name = ps->p + ps->i++;
        n = 1;
    }
    uint32_t mask = category_mask(name, n);
    if (!mask) {
        ps->i -= 1;
        return unsupported(ps, "a \\p{...} property other than a general category (scripts, binary properties)");
    }
    return class_add_cats(ps, c, mask, negated);
}

static kvs_status parse_alt(rx_parser *ps, int icase, int *out);

static kvs_status finish_class(rx_class *c) {
    for (uint32_t x = 0; x < 128; x++)
        if (class_has(c, x)) c->ascii[x >> 6] |= 1ull << (x & 63);
    return KVS_OK;
}

/* After '[': the class up to its ']'. */
static kvs_status parse_class(rx_parser *ps, int icase, int *out) {
    int ci;
    kvs_status st;
    if ((st = new_class(ps, &ci)) != KVS_OK) return st;
    int node;
    if ((st = new_node(ps, N_CLASS, &node)) != KVS_OK) return st;
    ps->nodes[node].cls = ci;
    ps->nodes[node].icase = icase;
    *out = node;
    if (peek(ps, '^')) {
        ps->classes[ci].neg = 1;
        ps->i++;
    }
    int first = 1;
    for (;;) {
        if (ps->i >= ps->len) return malformed(ps, "unterminated character class");
        char ch = ps->p[ps->i];
        if (ch == ']' && !first) {
            ps->i++;
            break;
        }
        first = 0;
        if (ch == '[') return unsupported(ps, "a nested class or POSIX bracket [[...]] inside a class");
        if (ch == '&' && ps->i + 1 < ps->len && ps->p[ps->i + 1] == '&')
            return unsupported(ps, "class intersection &&");
        uint32_t lo;
        int kind = ESC_CHAR;
        if (ch == '\\') {
            ps->i++;
            if ((st = parse_escape(ps, 1, &ps->classes[ci], &kind, &lo)) != KVS_OK) return st;
            if (kind == ESC_CLASS) continue;
        } else if ((st = next_cp(ps, &lo)) != KVS_OK) {
            return st;
        }
        uint32_t hi = lo;
        if (peek(ps, '-') && ps->i + 1 < ps->len && ps->p[ps->i + 1] != ']') {
            ps->i++;
            if (peek(ps, '\\')) {
                ps->i++;
                if ((st = parse_escape(ps, 1, &ps->classes[ci], &kind, &hi)) != KVS_OK) return st;
                if (kind != ESC_CHAR) return malformed(ps, "a class range ends in a class escape");
            } else if (peek(ps, '[')) {
                return unsupported(ps, "a nested class inside a class");
            } else if ((st = next_cp(ps, &hi)) != KVS_OK) {
                return st;
            }
            if (hi < lo) return malformed(ps, "class range out of order");
        }
        if ((st = class_add_range(&ps->classes[ci], lo, hi)) != KVS_OK) return st;
    }
    return finish_class(&ps->classes[ci]);
}

/* {n}, {n,}, {n,m}, {,m} at ps->i (on the '{'): 1 and the bounds when it is one, else 0 (a literal '{', as
 * Oniguruma's Ruby syntax reads it). */
static int parse_interval(rx_parser *ps, int *mn, int *mx, kvs_status *st) {
    size_t i = ps->i + 1;
    long a = -1, b = -1;
    *st = KVS_OK;
    if (i < ps->len && ps->p[i] >= '0' && ps->p[i] <= '9') {
        a = 0;
        while (i < ps->len && ps->p[i] >= '0' && ps->p[i] <= '9') {
            if (a <= 100000) a = a * 10 + (ps->p[i] - '0');
            i++;
        }
    }
    int comma = 0;
    if (i < ps->len && ps->p[i] == ',') {
        comma = 1;
        i++;
        if (i < ps->len && ps->p[i] >= '0' && ps->p[i] <= '9') {
            b = 0;
            while (i < ps->len && ps->p[i] >= '0' && ps->p[i] <= '9') {
                if (b <= 100000) b = b * 10 + (ps->p[i] - '0');
                i++;
            }
        }
    }
    if (i >= ps->len || ps->p[i] != '}' || (a < 0 && b < 0)) return 0;
    if (!comma) b = a;
    if (a < 0) a = 0;
    ps->i = i + 1;
    if (a > RX_MAX_COUNT || b > RX_MAX_COUNT) {
        *st = unsupported(ps, "a repeat count above 1000");
        return 1;
    }
    if (b >= 0 && b < a) {
        *st = malformed(ps, "repeat {n,m} with m < n");
        return 1;
    }
    *mn = (int)a;
    *mx = (int)b;
    return 1;
}

static int nullable(const rx_parser *ps, int k) {
    const rx_node *n = &ps->nodes[k];
    switch (n->type) {
    case N_CHAR: case N_CLASS: case N_ANY: return 0;
    case N_CAT: return nullable(ps, n->a) && nullable(ps, n->b);
    case N_ALT: return nullable(ps, n->a) || nullable(ps, n->b);
    case N_REP: return n->min == 0 || nullable(ps, n->a);
    default: return 1;
    }
}

static kvs_status parse_group(rx_parser *ps, int icase, int *out);

/* One atom and its quantifiers. *out -1 when the atom was "(?i)" (it changed *icase for the rest). */
static kvs_status parse_repeat(rx_parser *ps, int *icase, int *out) {
    kvs_status st;
    int node = -1;
    char ch = ps->p[ps->i];
    uint32_t cp;
    if (ch == '(') {
        ps->i++;
        if (ps->i + 1 < ps->len && ps->p[ps->i] == '?' && (ps->p[ps->i + 1] == 'i' || ps->p[ps->i + 1] == '-') &&
            ps->i + 2 < ps->len && ps->p[ps->i + 2] == ')') {
            /* (?i) / (?-) alone: flags for the rest of the enclosing group */
            *icase = ps->p[ps->i + 1] == 'i';
            ps->i += 3;
            *out = -1;
            return KVS_OK;
        }
        if ((st = parse_group(ps, *icase, &node)) != KVS_OK) return st;
    } else if (ch == '[') {
        ps->i++;
        if ((st = parse_class(ps, *icase, &node)) != KVS_OK) return st;
    } else if (ch == '.') {
        ps->i++;
        if ((st = new_node(ps, N_ANY, &node)) != KVS_OK) return st;
    } else if (ch == '^' || ch == '$') {
        ps->i++;
        if ((st = new_node(ps, ch == '^' ? N_BOL : N_EOL, &node)) != KVS_OK) return st;
    } else if (ch == '*' || ch == '+' || ch == '?') {
        return malformed(ps, "a quantifier with nothing to repeat");
    } else {
        int kind = ESC_CHAR, ci = -1;
        if (ch == '\\') {
            ps->i++;
            if ((st = new_class(ps, &ci)) != KVS_OK) return st;
            if ((st = parse_escape(ps, 0, &ps->classes[ci], &kind, &cp)) != KVS_OK) return st;
            if (kind != ESC_CLASS) ps->n_classes--; /* the class was not needed */
        } else if ((st = next_cp(ps, &cp)) != KVS_OK) {
            return st;
        }
        if (kind == ESC_CLASS) {
            finish_class(&ps->classes[ci]);
            if ((st = new_node(ps, N_CLASS, &node)) != KVS_OK) return st;
            ps->nodes[node].cls = ci;
            ps->nodes[node].icase = *icase;
        } else if (kind == ESC_BOT || kind == ESC_EOT) {
            if ((st = new_node(ps, kind == ESC_BOT ? N_BOT : N_EOT, &node)) != KVS_OK) return st;
        } else {
            if ((st = new_node(ps, N_CHAR, &node)) != KVS_OK) return st;
            ps->nodes[node].icase = *icase;
            ps->nodes[node].cp = *icase ? kvs_uni_simple_fold(cp) : cp;
        }
    }
    /* quantifiers (several may follow one another: each repeats the previous result) */
    for (;;) {
        int mn = 0, mx = 0;
        if (ps->i >= ps->len) break;
        ch = ps->p[ps->i];
        if (ch == '*') mn = 0, mx = -1, ps->i++;
        else if (ch == '+') mn = 1, mx = -1, ps->i++;
        else if (ch == '?') mn = 0, mx = 1, ps->i++;
        else if (ch == '{') {
            if (!parse_interval(ps, &mn, &mx, &st)) break;
            if (st != KVS_OK) return st;
        } else
            break;
        int greedy = 1;
        if (peek(ps, '?')) greedy = 0, ps->i++;
        else if (peek(ps, '+') && ch != '{') return unsupported(ps, "a possessive quantifier");
        int t = ps->nodes[node].type;
        if (t == N_BOL || t == N_EOL || t == N_BOT || t == N_EOT || t == N_LOOK)
            return malformed(ps, "a quantifier on an anchor or a lookahead");
        int reg = -1;
        if (mx < 0 && nullable(ps, node)) {
            if (ps->n_regs == RX_MAX_REGS)
                return unsupported(ps, "more than 32 unbounded repeats of expressions that can match empty");
            reg = ps->n_regs++;
        }
        int r;
        if ((st = new_node(ps, N_REP, &r)) != KVS_OK) return st;
        ps->nodes[r].a = node;
        ps->nodes[r].min = mn;
        ps->nodes[r].max = mx;
        ps->nodes[r].greedy = greedy;
        ps->nodes[r].cls = reg; /* N_REP: the empty-check register, -1 for none */
        node = r;
    }
    *out = node;
    return KVS_OK;
}

static kvs_status cat_of(rx_parser *ps, int type, int a, int b, int *out) {
    kvs_status st = new_node(ps, type, out);
    if (st != KVS_OK) return st;
    ps->nodes[*out].a = a;
    ps->nodes[*out].b = b;
    return KVS_OK;
}

/* A sequence up to '|', ')' or the end. */
static kvs_status parse_cat(rx_parser *ps, int *icase, int *out) {
    kvs_status st;
    int acc = -1;
    while (ps->i < ps->len && ps->p[ps->i] != '|' && ps->p[ps->i] != ')') {
        int node = -1;
        if ((st = parse_repeat(ps, icase, &node)) != KVS_OK) return st;
        if (node < 0) {
            /* "a(?i)b|c" is "a(?i:b|c)" in Oniguruma: the rest of the group, alternatives included */
            int rest;
            if ((st = parse_alt(ps, *icase, &rest)) != KVS_OK) return st;
            if (acc < 0) acc = rest;
            else if ((st = cat_of(ps, N_CAT, acc, rest, &acc)) != KVS_OK) return st;
            break;
        }
        if (acc < 0) acc = node;
        else if ((st = cat_of(ps, N_CAT, acc, node, &acc)) != KVS_OK) return st;
    }
    if (acc < 0 && (st = new_node(ps, N_EMPTY, &acc)) != KVS_OK) return st;
    *out = acc;
    return KVS_OK;
}

static kvs_status parse_alt(rx_parser *ps, int icase, int *out) {
    kvs_status st;
    if (++ps->depth > RX_MAX_DEPTH) return unsupported(ps, "group nesting deeper than 200");
    int flags = icase, acc;
    if ((st = parse_cat(ps, &flags, &acc)) != KVS_OK) return st;
    while (peek(ps, '|')) {
        ps->i++;
        flags = icase;
        int rhs;
        if ((st = parse_cat(ps, &flags, &rhs)) != KVS_OK) return st;
        if ((st = cat_of(ps, N_ALT, acc, rhs, &acc)) != KVS_OK) return st;
    }
    ps->depth--;
    *out = acc;
    return KVS_OK;
}

/* After '(': the group's kind, its body and the ')'. */
static kvs_status parse_group(rx_parser *ps, int icase, int *out) {
    kvs_status st;
    int look = 0, neg = 0;
    if (peek(ps, '?')) {
        ps->i++;
        if (ps->i >= ps->len) return malformed(ps, "unterminated group");
        char k = ps->p[ps->i];
        if (k == ':') {
            ps->i++;
        } else if (k == '=' || k == '!') {
            look = 1;
            neg = k == '!';
            ps->i++;
        } else if (k == '<' && ps->i + 1 < ps->len && (ps->p[ps->i + 1] == '=' || ps->p[ps->i + 1] == '!')) {
            return unsupported(ps, "lookbehind (?<= / (?<!");
        } else if (k == '>') {
            return unsupported(ps, "an atomic group (?>");
        } else if (k == '<' || k == 'P' || k == '\'') {
            return unsupported(ps, "a named group");
        } else if (k == '#') {
            return unsupported(ps, "a comment group (?#");
        } else {
            /* flags: i, -i, and the ':' of a scoped group; m / x / others are refused */
            int on = 1;
            while (ps->i < ps->len && ps->p[ps->i] != ':' && ps->p[ps->i] != ')') {
                char f = ps->p[ps->i];
                if (f == '-') on = 0;
                else if (f == 'i') icase = on;
                else return unsupported(ps, "a group option other than i (m, x, ...)");
                ps->i++;
            }
            if (!peek(ps, ':')) return unsupported(ps, "an option group (?flags) combined with other options");
            ps->i++;
        }
    }
    int body;
    if ((st = parse_alt(ps, icase, &body)) != KVS_OK) return st;
    if (!peek(ps, ')')) return malformed(ps, "missing ')'");
    ps->i++;
    if (!look) {
        *out = body;
        return KVS_OK;
    }
    if ((st = new_node(ps, N_LOOK, out)) != KVS_OK) return st;
    ps->nodes[*out].a = body;
    ps->nodes[*out].neg = neg;
    return KVS_OK;
}

/* ---------------------------------------------------------------- code generation */

typedef struct {
    rx_inst *prog;
    size_t n, cap;
} rx_code;

static kvs_status emit(rx_code *c, int op, uint32_t arg, int32_t x, int32_t y, int32_t *at) {
    if (c->n >= KVS_TOK_RX_MAX_PROG)
        return kvs_fail(KVS_ERR_RANGE, "regex: the compiled pattern exceeds %d instructions (counted repeats are "
                        "expanded)", KVS_TOK_RX_MAX_PROG);
    if (c->n == c->cap) {
        size_t cap = c->cap ? 2 * c->cap : 64;
        rx_inst *p = realloc(c->prog, cap * sizeof *p);
        if (!p) return kvs_fail(KVS_ERR_NOMEM, "regex: out of memory");
        c->prog = p;
        c->cap = cap;
    }
    c->prog[c->n] = (rx_inst){(uint8_t)op, arg, x, y};
    if (at) *at = (int32_t)c->n;
    c->n++;
    return KVS_OK;
}

static kvs_status gen(const rx_parser *ps, int k, rx_code *c) {
    const rx_node *n = &ps->nodes[k];
    kvs_status st = KVS_OK;
    int32_t at, at2;
    switch (n->type) {
    case N_EMPTY: return KVS_OK;
    case N_CHAR: return emit(c, n->icase ? I_CHARI : I_CHAR, n->cp, 0, 0, NULL);
    case N_CLASS: return emit(c, I_CLASS, (uint32_t)n->cls, 0, n->icase, NULL);
    case N_ANY: return emit(c, I_ANY, 0, 0, 0, NULL);
    case N_BOL: return emit(c, I_BOL, 0, 0, 0, NULL);
    case N_EOL: return emit(c, I_EOL, 0, 0, 0, NULL);
    case N_BOT: return emit(c, I_BOT, 0, 0, 0, NULL);
    case N_EOT: return emit(c, I_EOT, 0, 0, 0, NULL);
    case N_CAT:
        if ((st = gen(ps, n->a, c)) != KVS_OK) return st;
        return gen(ps, n->b, c);
    case N_ALT:
        if ((st = emit(c, I_SPLIT, 0, 0, 0, &at)) != KVS_OK) return st;
        c->prog[at].x = (int32_t)c->n;
        if ((st = gen(ps, n->a, c)) != KVS_OK) return st;
        if ((st = emit(c, I_JMP, 0, 0, 0, &at2)) != KVS_OK) return st;
        c->prog[at].y = (int32_t)c->n;
        if ((st = gen(ps, n->b, c)) != KVS_OK) return st;
        c->prog[at2].x = (int32_t)c->n;
        return KVS_OK;
    case N_LOOK:
        if ((st = emit(c, n->neg ? I_NLOOK : I_LOOK, 0, 0, 0, &at)) != KVS_OK) return st;
        c->prog[at].x = (int32_t)c->n;
        if ((st = gen(ps, n->a, c)) != KVS_OK) return st;
        if ((st = emit(c, I_MATCH, 0, 0, 0, NULL)) != KVS_OK) return st;
        c->prog[at].y = (int32_t)c->n;
        return KVS_OK;
    case N_REP: {
        for (int i = 0; i < n->min; i++)
            if ((st = gen(ps, n->a, c)) != KVS_OK) return st;
        if (n->max < 0) {
            /* L: SPLIT body, out; body [SETREG r]; X; [EMPTYCHK r -> out]; JMP L; out: */
            if ((st = emit(c, I_SPLIT, 0, 0, 0, &at)) != KVS_OK) return st;
            int32_t body = (int32_t)c->n;
            if (n->cls >= 0 && (st = emit(c, I_SETREG, (uint32_t)n->cls, 0, 0, NULL)) != KVS_OK) return st;
            if ((st = gen(ps, n->a, c)) != KVS_OK) return st;
            if (n->cls >= 0 && (st = emit(c, I_EMPTYCHK, (uint32_t)n->cls, 0, 0, &at2)) != KVS_OK) return st;
            if ((st = emit(c, I_JMP, 0, at, 0, NULL)) != KVS_OK) return st;
            int32_t out = (int32_t)c->n;
            if (n->cls >= 0) c->prog[at2].x = out;
            c->prog[at].x = n->greedy ? body : out;
            c->prog[at].y = n->greedy ? out : body;
            return KVS_OK;
        }
        /* (max - min) nested optional copies; skipping one skips all the rest: every SPLIT exits to one end */
        size_t first = c->n;
        int32_t *splits = malloc(((size_t)(n->max - n->min) + 1) * sizeof *splits);
        if (!splits) return kvs_fail(KVS_ERR_NOMEM, "regex: out of memory");
        int ns = 0;
        for (int i = n->min; i < n->max; i++) {
            if ((st = emit(c, I_SPLIT, 0, 0, 0, &at)) != KVS_OK) break;
            splits[ns++] = at;
            c->prog[at].x = (int32_t)c->n; /* body, patched below for lazy */
            if ((st = gen(ps, n->a, c)) != KVS_OK) break;
        }
        if (st == KVS_OK)
            for (int i = 0; i < ns; i++) {
                int32_t body = splits[i] + 1, out = (int32_t)c->n;
                c->prog[splits[i]].x = n->greedy ? body : out;
                c->prog[splits[i]].y = n->greedy ? out : body;
            }
        (void)first;
        free(splits);
        return st;
    }
    default: return kvs_fail(KVS_ERR_FORMAT, "regex: internal node type %d", n->type);
    }
}

/* ---------------------------------------------------------------- compile */

kvs_status kvs_tok_rx_compile(const char *pat, size_t len, int literal, kvs_tok_rx **out) {
    if (!pat || !out) return kvs_fail(KVS_ERR_INVALID_ARG, "regex: NULL pattern or out");
    *out = NULL;
    rx_parser ps = {.p = pat, .len = len};
    rx_code code = {0};
    kvs_status st;
    int root = -1;
    if (literal) {
        /* a {"String": ...} pattern: its characters in sequence */
        int acc = -1;
        st = KVS_OK;
        while (st == KVS_OK && ps.i < ps.len) {
            uint32_t cp;
            int node;
            if ((st = next_cp(&ps, &cp)) != KVS_OK) break;
            if ((st = new_node(&ps, N_CHAR, &node)) != KVS_OK) break;
            ps.nodes[node].cp = cp;
            if (acc < 0) acc = node;
            else st = cat_of(&ps, N_CAT, acc, node, &acc);
        }
        if (st == KVS_OK && acc < 0) st = new_node(&ps, N_EMPTY, &acc);
        root = acc;
    } else {
        st = parse_alt(&ps, 0, &root);
        if (st == KVS_OK && ps.i < ps.len) st = malformed(&ps, "unbalanced ')'");
    }
    if (st == KVS_OK) st = gen(&ps, root, &code);
    if (st == KVS_OK) st = emit(&code, I_MATCH, 0, 0, 0, NULL);
    kvs_tok_rx *rx = NULL;
    if (st == KVS_OK && !(rx = calloc(1, sizeof *rx))) st = kvs_fail(KVS_ERR_NOMEM, "regex: out of memory");
    if (st != KVS_OK) {
        for (size_t i = 0; i < ps.n_classes; i++) {
            free(ps.classes[i].lo);
            free(ps.classes[i].hi);
        }
        free(ps.classes);
        free(ps.nodes);
        free(code.prog);
        return st;
    }
    free(ps.nodes);
    rx->prog = code.prog;
    rx->n_prog = code.n;
    rx->classes = ps.classes;
    rx->n_classes = ps.n_classes;
    rx->n_regs = ps.n_regs;
    *out = rx;
    return KVS_OK;
}

void kvs_tok_rx_free(kvs_tok_rx *rx) {
    if (!rx) return;
    for (size_t i = 0; i < rx->n_classes; i++) {
        free(rx->classes[i].lo);
        free(rx->classes[i].hi);
    }
    free(rx->classes);
    free(rx->prog);
    free(rx);
}

void kvs_tok_rx_set_step_budget(kvs_tok_rx *rx, uint64_t steps) {
    if (rx) rx->budget = steps;
}

/* ---------------------------------------------------------------- matching */

typedef struct {
    int32_t pc;
    size_t pos;
} rx_thread;

typedef struct {
    const kvs_tok_rx *rx;
    const char *s;
    size_t len;
    rx_thread *stack;
    size_t sp, cap;
    int on_heap; /* stack was malloc'd (else it is the caller's local array) */
    size_t reg[RX_MAX_REGS]; /* iteration starts of the nullable loops (restored on backtracking) */
    uint64_t steps, budget;
} rx_ctx;

#define RX_LOCAL_STACK 128 /* alternatives a search keeps on the C stack before it allocates (most need a few) */

static int push(rx_ctx *c, int32_t pc, size_t pos) {
    if (c->sp == c->cap) {
        size_t cap = 2 * c->cap;
        rx_thread *t = c->on_heap ? realloc(c->stack, cap * sizeof *t) : malloc(cap * sizeof *t);
        if (!t) return 0;
        if (!c->on_heap) memcpy(t, c->stack, c->sp * sizeof *t);
        c->stack = t;
        c->cap = cap;
        c->on_heap = 1;
    }
    c->stack[c->sp++] = (rx_thread){pc, pos};
    return 1;
}

static size_t cp_at(const rx_ctx *c, size_t pos, uint32_t *cp) {
    if (pos >= c->len) return 0;
    size_t n = kvs_tok_utf8_next(c->s + pos, c->len - pos, cp);
    if (n == 0) { *cp = (uint8_t)c->s[pos]; n = 1; } /* defensive: the caller validated the text */
    return n;
}

/* Depth-first run of the program from pc0 at pos0: 1 and *end on a match, 0 when none, -1 over budget, -2 out of
 * memory. Alternatives are pushed above the entry stack height; lookaheads run recursively on the same stack. */
static int run(rx_ctx *c, int32_t pc0, size_t pos0, size_t *end) {
    size_t base = c->sp;
    if (!push(c, pc0, pos0)) return -2;
    const rx_inst *prog = c->rx->prog;
    while (c->sp > base) {
        rx_thread th = c->stack[--c->sp];
        if (th.pc < 0) { /* an undo entry: a register's value before an I_SETREG on the path being abandoned */
            c->reg[-1 - th.pc] = th.pos;
            continue;
        }
        int32_t pc = th.pc;
        size_t pos = th.pos;
        for (;;) {
            if (++c->steps > c->budget) {
                c->sp = base;
                return -1;
            }
            const rx_inst *in = &prog[pc];
            uint32_t cp;
            size_t n;
            int r;
            switch (in->op) {
            case I_CHAR:
                if (pos < c->len && (uint8_t)c->s[pos] < 0x80) {
                    if ((uint8_t)c->s[pos] != in->arg) goto fail;
                    pos++;
                    pc++;
                    continue;
                }
                if (!(n = cp_at(c, pos, &cp)) || cp != in->arg) goto fail;
                pos += n;
                pc++;
                continue;
            case I_CHARI:
                if (!(n = cp_at(c, pos, &cp)) || kvs_uni_simple_fold(cp) != in->arg) goto fail;
                pos += n;
                pc++;
                continue;
            case I_CLASS:
                if (!(n = cp_at(c, pos, &cp)) || !class_match(&c->rx->classes[in->arg], cp, in->y)) goto fail;
                pos += n;
                pc++;
                continue;
            case I_ANY:
                if (!(n = cp_at(c, pos, &cp)) || cp == '\n') goto fail;
                pos += n;
                pc++;
                continue;
            case I_SPLIT:
                if (!push(c, in->y, pos)) { c->sp = base; return -2; }
                pc = in->x;
                continue;
            case I_JMP: pc = in->x; continue;
            case I_LOOK:
            case I_NLOOK: {
                size_t e;
                r = run(c, in->x, pos, &e);
                if (r < 0) { c->sp = base; return r; }
                if ((r == 1) != (in->op == I_LOOK)) goto fail;
                pc = in->y;
                continue;
            }
            case I_BOL:
                if (pos != 0 && c->s[pos - 1] != '\n') goto fail;
                pc++;
                continue;
            case I_EOL:
                if (pos != c->len && c->s[pos] != '\n') goto fail;
                pc++;
                continue;
            case I_BOT:
                if (pos != 0) goto fail;
                pc++;
                continue;
            case I_EOT:
                if (pos != c->len) goto fail;
                pc++;
                continue;
            case I_MATCH:
                *end = pos;
                c->sp = base;
                return 1;
            case I_SETREG:
                if (!push(c, -1 - (int32_t)in->arg, c->reg[in->arg])) { c->sp = base; return -2; }
                c->reg[in->arg] = pos;
                pc++;
                continue;
            case I_EMPTYCHK:
                pc = pos == c->reg[in->arg] ? in->x : pc + 1;
                continue;
            default: goto fail;
            }
        }
    fail:;
    }
    return 0;
}

kvs_status kvs_tok_rx_find(const kvs_tok_rx *rx, const char *s, size_t len, size_t from, uint64_t *steps, int *found,
                           size_t *ms, size_t *me) {
    *found = 0;
    rx_thread local[RX_LOCAL_STACK];
    rx_ctx c = {.rx = rx, .s = s, .len = len, .stack = local, .cap = RX_LOCAL_STACK, .steps = *steps};
    c.budget = rx->budget ? rx->budget : ((uint64_t)len * 4096 > (1u << 24) ? (uint64_t)len * 4096 : (1u << 24));
    kvs_status st = KVS_OK;
    for (size_t start = from; start <= len;) {
        size_t end;
        int r = run(&c, 0, start, &end);
        if (r == 1) {
            *found = 1;
            *ms = start;
            *me = end;
            break;
        }
        if (r == -1) {
            st = kvs_fail(KVS_ERR_UNSUPPORTED, "regex: the pattern backtracks more than %llu steps on a %zu-byte text: "
                          "refused", (unsigned long long)c.budget, len);
            break;
        }
        if (r == -2) {
            st = kvs_fail(KVS_ERR_NOMEM, "regex: out of memory");
            break;
        }
        if (start == len) break;
        uint32_t cp;
        start += cp_at(&c, start, &cp);
    }
    if (c.on_heap) free(c.stack);
    *steps = c.steps;
    return st;
}
