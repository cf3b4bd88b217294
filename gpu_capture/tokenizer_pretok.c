/* tokenizer_pretok.c — the Split pre-tokenizer regexes of GPT-2, Llama 3 and Qwen2 run by a dedicated
 * hand-written scanner (no regex engine), and the Unicode classes they need.
 *
 * Patterns (tokenizer.json pre_tokenizer Split.pattern.Regex, or ByteLevel use_regex for GPT-2):
 *   GPT-2 : 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *   Llama3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 *   Qwen2 : the Llama 3 pattern with \p{N} instead of \p{N}{1,3}
 * kvs_tok_pretok_match() returns the length of the leftmost-first (Perl/Oniguruma semantics) match at a
 * position; each alternative is worked out by hand below, including the backtracking of \s*[\r\n]+ and
 * \s+(?!\S). Every character is matched by some alternative of these patterns, so splitting is a
 * sequence of matches with no gaps ("Isolated" behaviour).
 *
 * Unicode classes: \p{L} (Lu Ll Lt Lm Lo), \p{N} (Nd Nl No) as range tables for the blocks
 * U+0000-06FF (Latin, IPA, Greek, Cyrillic, Armenian, Hebrew, Arabic), Devanagari, Thai, Georgian,
 * Hangul Jamo, U+1E00-1FFF (Latin Extended Additional, Greek Extended), U+2000-24FF (punctuation,
 * super/subscripts, letterlike, number forms, enclosed alphanumerics), Latin Extended-C, U+3000-33FF (CJK
 * symbols, kana, bopomofo, Hangul compatibility jamo, enclosed CJK), CJK Ext. A, CJK unified, Yi,
 * Hangul syllables, CJK compatibility, alphabetic presentation forms, Arabic presentation forms-B,
 * halfwidth/fullwidth forms, Aegean numbers, mathematical alphanumerics, enclosed alphanumeric supplement,
 * CJK Ext. B-H; values from Unicode 14.0 (range lists extracted once from Python's unicodedata for these
 * blocks and pasted here; no generator is part of the build). Code points in other blocks count as
 * neither L nor N. \s is the Unicode White_Space property.
 */
#include "tokenizer_internal.h"

/* ---- Unicode range tables (sorted, inclusive) ---- */
static const uint32_t letter_ranges[][2] = {
    {0x0041, 0x005A}, {0x0061, 0x007A}, {0x00AA, 0x00AA}, {0x00B5, 0x00B5}, {0x00BA, 0x00BA}, {0x00C0, 0x00D6},
    {0x00D8, 0x00F6}, {0x00F8, 0x02C1}, {0x02C6, 0x02D1}, {0x02E0, 0x02E4}, {0x02EC, 0x02EC}, {0x02EE, 0x02EE},
    {0x0370, 0x0374}, {0x0376, 0x0377}, {0x037A, 0x037D}, {0x037F, 0x037F}, {0x0386, 0x0386}, {0x0388, 0x038A},
    {0x038C, 0x038C}, {0x038E, 0x03A1}, {0x03A3, 0x03F5}, {0x03F7, 0x0481}, {0x048A, 0x052F}, {0x0531, 0x0556},
    {0x0559, 0x0559}, {0x0560, 0x0588}, {0x05D0, 0x05EA}, {0x05EF, 0x05F2}, {0x0620, 0x064A}, {0x066E, 0x066F},
    {0x0671, 0x06D3}, {0x06D5, 0x06D5}, {0x06E5, 0x06E6}, {0x06EE, 0x06EF}, {0x06FA, 0x06FC}, {0x06FF, 0x06FF},
    {0x0904, 0x0939}, {0x093D, 0x093D}, {0x0950, 0x0950}, {0x0958, 0x0961}, {0x0971, 0x097F}, {0x0E01, 0x0E30},
    {0x0E32, 0x0E33}, {0x0E40, 0x0E46}, {0x10A0, 0x10C5}, {0x10C7, 0x10C7}, {0x10CD, 0x10CD}, {0x10D0, 0x10FA},
    {0x10FC, 0x11FF}, {0x1E00, 0x1F15}, {0x1F18, 0x1F1D}, {0x1F20, 0x1F45}, {0x1F48, 0x1F4D}, {0x1F50, 0x1F57},
    {0x1F59, 0x1F59}, {0x1F5B, 0x1F5B}, {0x1F5D, 0x1F5D}, {0x1F5F, 0x1F7D}, {0x1F80, 0x1FB4}, {0x1FB6, 0x1FBC},
    {0x1FBE, 0x1FBE}, {0x1FC2, 0x1FC4}, {0x1FC6, 0x1FCC}, {0x1FD0, 0x1FD3}, {0x1FD6, 0x1FDB}, {0x1FE0, 0x1FEC},
    {0x1FF2, 0x1FF4}, {0x1FF6, 0x1FFC}, {0x2071, 0x2071}, {0x207F, 0x207F}, {0x2090, 0x209C}, {0x2102, 0x2102},
    {0x2107, 0x2107}, {0x210A, 0x2113}, {0x2115, 0x2115}, {0x2119, 0x211D}, {0x2124, 0x2124}, {0x2126, 0x2126},
    {0x2128, 0x2128}, {0x212A, 0x212D}, {0x212F, 0x2139}, {0x213C, 0x213F}, {0x2145, 0x2149}, {0x214E, 0x214E},
    {0x2183, 0x2184}, {0x2C00, 0x2C7F}, {0x2E2F, 0x2E2F}, {0x3005, 0x3006}, {0x3031, 0x3035}, {0x303B, 0x303C},
    {0x3041, 0x3096}, {0x309D, 0x309F}, {0x30A1, 0x30FA}, {0x30FC, 0x30FF}, {0x3105, 0x312F}, {0x3131, 0x318E},
    {0x31A0, 0x31BF}, {0x31F0, 0x31FF}, {0x3400, 0x4DBF}, {0x4E00, 0xA48C}, {0xAC00, 0xD7A3}, {0xD7B0, 0xD7C6},
    {0xD7CB, 0xD7FB}, {0xF900, 0xFA6D}, {0xFA70, 0xFAD9}, {0xFB00, 0xFB06}, {0xFB13, 0xFB17}, {0xFB1D, 0xFB1D},
    {0xFB1F, 0xFB28}, {0xFB2A, 0xFB36}, {0xFB38, 0xFB3C}, {0xFB3E, 0xFB3E}, {0xFB40, 0xFB41}, {0xFB43, 0xFB44},
    {0xFB46, 0xFB4F}, {0xFE70, 0xFE74}, {0xFE76, 0xFEFC}, {0xFF21, 0xFF3A}, {0xFF41, 0xFF5A}, {0xFF66, 0xFFBE},
    {0xFFC2, 0xFFC7}, {0xFFCA, 0xFFCF}, {0xFFD2, 0xFFD7}, {0xFFDA, 0xFFDC}, {0x1D400, 0x1D454}, {0x1D456, 0x1D49C},
    {0x1D49E, 0x1D49F}, {0x1D4A2, 0x1D4A2}, {0x1D4A5, 0x1D4A6}, {0x1D4A9, 0x1D4AC}, {0x1D4AE, 0x1D4B9}, {0x1D4BB, 0x1D4BB},
    {0x1D4BD, 0x1D4C3}, {0x1D4C5, 0x1D505}, {0x1D507, 0x1D50A}, {0x1D50D, 0x1D514}, {0x1D516, 0x1D51C}, {0x1D51E, 0x1D539},
    {0x1D53B, 0x1D53E}, {0x1D540, 0x1D544}, {0x1D546, 0x1D546}, {0x1D54A, 0x1D550}, {0x1D552, 0x1D6A5}, {0x1D6A8, 0x1D6C0},
    {0x1D6C2, 0x1D6DA}, {0x1D6DC, 0x1D6FA}, {0x1D6FC, 0x1D714}, {0x1D716, 0x1D734}, {0x1D736, 0x1D74E}, {0x1D750, 0x1D76E},
    {0x1D770, 0x1D788}, {0x1D78A, 0x1D7A8}, {0x1D7AA, 0x1D7C2}, {0x1D7C4, 0x1D7CB}, {0x20000, 0x2A6DF}, {0x2A700, 0x2B738},
    {0x2B740, 0x2B81D}, {0x2B820, 0x2CEA1}, {0x2CEB0, 0x2EBE0}, {0x2F800, 0x2FA1D}, {0x30000, 0x3134A},
};

static const uint32_t number_ranges[][2] = {
    {0x0030, 0x0039}, {0x00B2, 0x00B3}, {0x00B9, 0x00B9}, {0x00BC, 0x00BE}, {0x0660, 0x0669}, {0x06F0, 0x06F9},
    {0x0966, 0x096F}, {0x0E50, 0x0E59}, {0x2070, 0x2070}, {0x2074, 0x2079}, {0x2080, 0x2089}, {0x2150, 0x2182},
    {0x2185, 0x2189}, {0x2460, 0x249B}, {0x24EA, 0x24FF}, {0x3007, 0x3007}, {0x3021, 0x3029}, {0x3038, 0x303A},
    {0x3192, 0x3195}, {0x3220, 0x3229}, {0x3248, 0x324F}, {0x3251, 0x325F}, {0x3280, 0x3289}, {0x32B1, 0x32BF},
    {0xFF10, 0xFF19}, {0x10107, 0x10133}, {0x10140, 0x1014F}, {0x1D7CE, 0x1D7FF}, {0x1F100, 0x1F10C},
};

static int in_ranges(const uint32_t (*r)[2], size_t n, uint32_t cp) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < r[mid][0]) hi = mid;
        else if (cp > r[mid][1]) lo = mid + 1;
        else return 1;
    }
    return 0;
}

int kvs_tok_is_letter(uint32_t cp) {
    if (cp < 0x80) return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z';
    return in_ranges(letter_ranges, sizeof letter_ranges / sizeof letter_ranges[0], cp);
}

int kvs_tok_is_number(uint32_t cp) {
    if (cp < 0x80) return cp >= '0' && cp <= '9';
    return in_ranges(number_ranges, sizeof number_ranges / sizeof number_ranges[0], cp);
}

int kvs_tok_is_space(uint32_t cp) {
    return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
           cp == 0x3000;
}

int kvs_tok_nfc_unsafe(uint32_t cp) {
    /* Combining marks that may compose with a preceding base, conjoining Hangul jamo, and the
     * singletons / compatibility ideographs whose NFC form is another code point. */
    return (cp >= 0x0300 && cp <= 0x036F) || (cp >= 0x0483 && cp <= 0x0489) || (cp >= 0x0591 && cp <= 0x05C7) ||
           (cp >= 0x0610 && cp <= 0x061A) || (cp >= 0x064B && cp <= 0x065F) || cp == 0x0670 ||
           (cp >= 0x0900 && cp <= 0x0903) || (cp >= 0x093A && cp <= 0x094F) || (cp >= 0x0951 && cp <= 0x0957) ||
           (cp >= 0x0958 && cp <= 0x095F) || (cp >= 0x09BC && cp <= 0x09D7) || (cp >= 0x0B3C && cp <= 0x0B57) ||
           (cp >= 0x0BBE && cp <= 0x0BD7) || (cp >= 0x0C56 && cp <= 0x0C56) || (cp >= 0x0CC2 && cp <= 0x0CD6) ||
           (cp >= 0x0D3E && cp <= 0x0D57) || (cp >= 0x0DCA && cp <= 0x0DDF) || (cp >= 0x0E31 && cp <= 0x0E3A) ||
           (cp >= 0x0E47 && cp <= 0x0E4E) || (cp >= 0x0F00 && cp <= 0x0FFF) || (cp >= 0x1000 && cp <= 0x109F) ||
           (cp >= 0x1100 && cp <= 0x11FF) || (cp >= 0x1AB0 && cp <= 0x1AFF) || (cp >= 0x1B00 && cp <= 0x1B7F) ||
           (cp >= 0x1DC0 && cp <= 0x1DFF) || (cp >= 0x1F00 && cp <= 0x1FFF) || (cp >= 0x2000 && cp <= 0x2001) ||
           (cp >= 0x20D0 && cp <= 0x20FF) || cp == 0x2126 || cp == 0x212A || cp == 0x212B ||
           cp == 0x2329 || cp == 0x232A || cp == 0x2ADC || (cp >= 0x302A && cp <= 0x302F) ||
           (cp >= 0x3099 && cp <= 0x309A) || (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0xFB1D && cp <= 0xFB4E) ||
           (cp >= 0xFE20 && cp <= 0xFE2F) || (cp >= 0x110B9 && cp <= 0x110BA) || (cp >= 0x2F800 && cp <= 0x2FA1F) ||
           cp == 0x0340 || cp == 0x0341 || cp == 0x0343 || cp == 0x0344 || cp == 0x0374 || cp == 0x037E ||
           cp == 0x0387;
}

/* ---- scanner ---- */

/* Code point at s[pos] (the caller validated the UTF-8) and its byte length. */
static size_t cp_at(const char *s, size_t len, size_t pos, uint32_t *cp) {
    if (pos >= len) { *cp = 0; return 0; }
    size_t n = kvs_tok_utf8_next(s + pos, len - pos, cp);
    if (n == 0) { *cp = (uint8_t)s[pos]; n = 1; } /* defensive: treat a stray byte as one "other" char */
    return n;
}

static int is_other(uint32_t cp) { return !kvs_tok_is_space(cp) && !kvs_tok_is_letter(cp) && !kvs_tok_is_number(cp); }

/* End of the run of characters satisfying pred starting at pos. */
static size_t run_end(const char *s, size_t len, size_t pos, int (*pred)(uint32_t)) {
    uint32_t cp;
    size_t n;
    while (pos < len && (n = cp_at(s, len, pos, &cp)) > 0 && pred(cp)) pos += n;
    return pos;
}

static int is_cr_lf(uint32_t cp) { return cp == '\r' || cp == '\n'; }

static size_t contraction(const char *s, size_t len, size_t pos, int ignore_case) {
    if (s[pos] != '\'' || pos + 1 >= len) return 0;
    char c1 = s[pos + 1], c2 = pos + 2 < len ? s[pos + 2] : 0;
    if (ignore_case) {
        if (c1 >= 'A' && c1 <= 'Z') c1 = (char)(c1 + 32);
        if (c2 >= 'A' && c2 <= 'Z') c2 = (char)(c2 + 32);
    }
    /* alternatives in pattern order: 's 't 're 've 'm 'll 'd */
    if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return 2;
    if ((c1 == 'r' || c1 == 'v') && c2 == 'e') return 3;
    if (c1 == 'l' && c2 == 'l') return 3;
    return 0;
}

/* \s*[\r\n]+ | \s+(?!\S) | \s+ starting at a whitespace character (tail alternatives shared by all
 * three patterns; the first only for Llama 3 / Qwen2). */
static size_t space_tail(const char *s, size_t len, size_t pos, int with_newline_alt) {
    size_t e = run_end(s, len, pos, kvs_tok_is_space);
    if (with_newline_alt) {
        /* \s* backtracks from the whole run until [\r\n]+ can match: the match ends just after the last
         * \r or \n of the run. */
        size_t last = 0, found = 0;
        for (size_t i = pos; i < e; i++)
            if (s[i] == '\r' || s[i] == '\n') { last = i; found = 1; }
        if (found) return last + 1 - pos;
    }
    if (e == len) return e - pos;                 /* \s+(?!\S) at the end of the text */
    /* \s+(?!\S): give back the last whitespace character so that whitespace (not \S) follows */
    uint32_t cp;
    size_t last_start = pos, i = pos;
    while (i < e) { last_start = i; i += cp_at(s, len, i, &cp); }
    if (last_start > pos) return last_start - pos;
    return e - pos;                               /* \s+ : a single whitespace character */
}

size_t kvs_tok_pretok_match(int regex, const char *s, size_t len, size_t pos) {
    uint32_t c0, c1;
    size_t n0 = cp_at(s, len, pos, &c0);
    if (n0 == 0) return 0;
    size_t n1 = cp_at(s, len, pos + n0, &c1);
    size_t m = contraction(s, len, pos, regex != KVS_TOK_RE_GPT2);
    if (m) return m;
    if (regex == KVS_TOK_RE_GPT2) {
        /* ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+' */
        int (*cls[3])(uint32_t) = {kvs_tok_is_letter, kvs_tok_is_number, is_other};
        for (int k = 0; k < 3; k++) {
            if (c0 == ' ' && n1 && cls[k](c1)) return run_end(s, len, pos + 1, cls[k]) - pos;
            if (cls[k](c0)) return run_end(s, len, pos, cls[k]) - pos;
        }
        return space_tail(s, len, pos, 0);
    }
    /* [^\r\n\p{L}\p{N}]?\p{L}+ */
    if (!is_cr_lf(c0) && !kvs_tok_is_letter(c0) && !kvs_tok_is_number(c0) && n1 && kvs_tok_is_letter(c1))
        return run_end(s, len, pos + n0, kvs_tok_is_letter) - pos;
    if (kvs_tok_is_letter(c0)) return run_end(s, len, pos, kvs_tok_is_letter) - pos;
    /* \p{N}{1,3} (Llama 3) or \p{N} (Qwen2) */
    if (kvs_tok_is_number(c0)) {
        size_t e = pos, max = regex == KVS_TOK_RE_LLAMA3 ? 3 : 1;
        uint32_t cp;
        for (size_t k = 0; k < max && e < len; k++) {
            size_t n = cp_at(s, len, e, &cp);
            if (!kvs_tok_is_number(cp)) break;
            e += n;
        }
        return e - pos;
    }
    /* ' ?[^\s\p{L}\p{N}]+[\r\n]*' */
    size_t start = pos;
    int other = 0;
    if (c0 == ' ' && n1 && is_other(c1)) { start = pos + 1; other = 1; }
    else if (is_other(c0)) other = 1;
    if (other) {
        size_t e = run_end(s, len, start, is_other);
        e = run_end(s, len, e, is_cr_lf);
        return e - pos;
    }
    return space_tail(s, len, pos, 1);
}
