/* test_unicode.c — gpu_capture/unicode.c: general categories, White_Space and NFC (Unicode Standard Annex #15).
 *
 * Each table is checked against a source other than itself:
 *   - NFC against the UCD conformance file NormalizationTest.txt (all five columns of Part 0-3, and every code
 *     point not in Part 1 unchanged), read from Debian's unicode-data package when it is installed and its
 *     version is that of the committed tables; skipped otherwise;
 *   - the committed gpu_capture/unicode_tables.c against a fresh run of tools/gen_unicode_tables.py on the same
 *     package (skipped without it);
 *   - general categories against Python's unicodedata (Unicode 14.0 in python3.11) on every code point assigned
 *     there (skipped without python3);
 *   - always: hand-checked characters of scripts the earlier block tables left out (Syriac, Myanmar, Ethiopic,
 *     Lao, CJK Ext. H), NFC cases worked out from the standard's rules, and the pre-tokenizer on those scripts.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include "tests/util/testenv.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "../gpu_capture/tokenizer_internal.h"
#include "../gpu_capture/unicode.h"

#define UCD "/usr/share/unicode"

/* NFC of in[0..n) must equal want[0..wn). */
static int nfc_is(const uint32_t *in, size_t n, const uint32_t *want, size_t wn) {
    uint32_t *out = NULL;
    size_t on = 0;
    assert_int_equal(kvs_uni_nfc(in, n, &out, &on), KVS_OK);
    int ok = on == wn && (wn == 0 || memcmp(out, want, wn * sizeof *want) == 0);
    free(out);
    return ok;
}

#define NFC_IS(in, want) assert_true(nfc_is(in, sizeof in / sizeof in[0], want, sizeof want / sizeof want[0]))

static void test_nfc_rules(void **state) {
    (void)state;
    {   /* composition with the preceding base */
        const uint32_t in[] = {'e', 0x0301}, want[] = {0x00E9};
        NFC_IS(in, want);
    }
    {   /* Hangul: L V T compose algorithmically, and a precomposed LV takes a T */
        const uint32_t in[] = {0x1100, 0x1161, 0x11A8, 0xAC00, 0x11A8}, want[] = {0xAC01, 0xAC01};
        NFC_IS(in, want);
    }
    {   /* singleton: ANGSTROM SIGN -> A WITH RING ABOVE; OHM SIGN -> OMEGA */
        const uint32_t in[] = {0x212B, 0x2126}, want[] = {0x00C5, 0x03A9};
        NFC_IS(in, want);
    }
    {   /* composition exclusion: DEVANAGARI QA stays decomposed */
        const uint32_t in[] = {0x0958}, want[] = {0x0915, 0x093C};
        NFC_IS(in, want);
    }
    {   /* canonical ordering: dot below (220) before dot above (230); a + dot below composes first */
        const uint32_t in[] = {'a', 0x0307, 0x0323}, want[] = {0x1EA1, 0x0307};
        NFC_IS(in, want);
    }
    {   /* blocked: a second mark of the same class cannot reach the base */
        const uint32_t in[] = {'a', 0x0305, 0x0301}, want[] = {'a', 0x0305, 0x0301};
        NFC_IS(in, want);
    }
    {   /* a leading non-starter composes with nothing; recursion: U+1F82 decomposes to 4 and recomposes */
        const uint32_t in[] = {0x0301, 'e', 0x03B1, 0x0313, 0x0300, 0x0345}, want[] = {0x0301, 'e', 0x1F82};
        NFC_IS(in, want);
    }
    {   /* recursive decomposition: U+01D5 -> U+00DC U+0304 -> U U+0308 U+0304; the dot below (220) moves to the
         * base, U+0308 cannot compose with U+1EE4 and U+0304 is blocked by it */
        const uint32_t in[] = {0x01D5, 0x0323}, want[] = {0x1EE4, 0x0308, 0x0304};
        NFC_IS(in, want);
    }
    {   /* the full decomposition of U+1F82 is four code points and NFC rebuilds it */
        const uint32_t in[] = {0x1F82}, want[] = {0x1F82};
        NFC_IS(in, want);
    }
    {
        const uint32_t want[] = {0};
        assert_true(nfc_is(NULL, 0, want, 0));
    }
}

static void test_categories_of_added_scripts(void **state) {
    (void)state;
    /* letters (Lo) and digits of scripts the earlier block tables did not cover */
    const uint32_t letters[] = {0x0710, 0x0712, 0x1000, 0x1200, 0x12A0, 0x0E81, 0x31350, 0x323AF, 0x0041, 0x01C5};
    for (size_t i = 0; i < sizeof letters / sizeof letters[0]; i++) assert_true(kvs_tok_is_letter(letters[i]));
    assert_int_equal(kvs_uni_category(0x0710), KVS_UNI_LO);  /* SYRIAC LETTER ALAPH */
    assert_int_equal(kvs_uni_category(0x31350), KVS_UNI_LO); /* CJK Ext. H, new in Unicode 15.0 */
    assert_int_equal(kvs_uni_category(0x01C5), KVS_UNI_LT);
    assert_int_equal(kvs_uni_category(0x0041), KVS_UNI_LU);
    const uint32_t numbers[] = {0x1040, 0x1049, 0x1369, 0x0ED0, 0x0ED9, 0x16EE, 0x0030};
    for (size_t i = 0; i < sizeof numbers / sizeof numbers[0]; i++) assert_true(kvs_tok_is_number(numbers[i]));
    assert_int_equal(kvs_uni_category(0x1040), KVS_UNI_ND); /* MYANMAR DIGIT ZERO */
    assert_int_equal(kvs_uni_category(0x1369), KVS_UNI_NO); /* ETHIOPIC DIGIT ONE */
    assert_int_equal(kvs_uni_category(0x16EE), KVS_UNI_NL); /* RUNIC ARLAUG SYMBOL */
    /* neither: marks, punctuation, unassigned, beyond U+10FFFF */
    const uint32_t neither[] = {0x0301, 0x102C, 0x1362, 0x0378, 0x323B0, 0x110000, 0xFFFFFFFF};
    for (size_t i = 0; i < sizeof neither / sizeof neither[0]; i++) {
        assert_false(kvs_tok_is_letter(neither[i]));
        assert_false(kvs_tok_is_number(neither[i]));
    }
    assert_int_equal(kvs_uni_category(0x102C), KVS_UNI_MC);
    assert_int_equal(kvs_uni_category(0x0378), KVS_UNI_CN);
    /* \s is White_Space: NEL, OGHAM SPACE MARK yes; ZERO WIDTH SPACE and U+180E (no longer Zs) no */
    assert_true(kvs_tok_is_space(0x85) && kvs_tok_is_space(0x1680) && kvs_tok_is_space(0x3000));
    assert_false(kvs_tok_is_space(0x200B) || kvs_tok_is_space(0x180E) || kvs_tok_is_space('a'));
    assert_int_equal(kvs_uni_ccc(0x0301), 230);
    assert_int_equal(kvs_uni_ccc(0x0323), 220);
    assert_int_equal(kvs_uni_ccc('a'), 0);
}

static void expect_split(int regex, const char *s, const char *want) {
    char got[256] = "";
    size_t len = strlen(s);
    for (size_t pos = 0; pos < len;) {
        size_t m = kvs_tok_pretok_match(regex, s, len, pos);
        assert_true(m >= 1 && pos + m <= len);
        if (pos) strcat(got, "|");
        strncat(got, s + pos, m);
        pos += m;
    }
    assert_string_equal(got, want);
}

static void test_pretok_on_added_scripts(void **state) {
    (void)state;
    /* Syriac letters make one ' ?\p{L}+' piece, the '!' its own */
    expect_split(KVS_TOK_RE_GPT2, "x \xdc\xab\xdc\xa0\xdc\xa1\xdc\x90!", "x| \xdc\xab\xdc\xa0\xdc\xa1\xdc\x90|!");
    /* Myanmar digits are \p{N}: Llama 3 groups them by three, Qwen2 one by one */
    expect_split(KVS_TOK_RE_LLAMA3, "\xe1\x81\x81\xe1\x81\x82\xe1\x81\x83\xe1\x81\x84",
                 "\xe1\x81\x81\xe1\x81\x82\xe1\x81\x83|\xe1\x81\x84");
    expect_split(KVS_TOK_RE_QWEN2, "\xe1\x81\x81\xe1\x81\x82", "\xe1\x81\x81|\xe1\x81\x82");
    /* a Myanmar vowel sign (Mc) is not \p{L}: it leaves the letter run, as in the regex */
    expect_split(KVS_TOK_RE_LLAMA3, "\xe1\x80\x80\xe1\x80\xac", "\xe1\x80\x80|\xe1\x80\xac");
    /* Ethiopic word then an Ethiopic digit; Lao letters */
    expect_split(KVS_TOK_RE_GPT2, "\xe1\x88\x80\xe1\x88\x88\xe1\x8d\xa9 \xe0\xba\x81\xe0\xba\x82",
                 "\xe1\x88\x80\xe1\x88\x88|\xe1\x8d\xa9| \xe0\xba\x81\xe0\xba\x82");
}

/* Code points of a NormalizationTest.txt field ("0044 0307") into cp; returns the count. */
static size_t parse_field(const char *f, uint32_t *cp, size_t cap) {
    size_t n = 0;
    char *end;
    while (*f == ' ') f++;
    while (*f && *f != ';' && n < cap) {
        cp[n++] = (uint32_t)strtoul(f, &end, 16);
        f = end;
        while (*f == ' ') f++;
    }
    return n;
}

static void test_normalization_conformance(void **state) {
    (void)state;
    if (access(UCD "/NormalizationTest.txt.bz2", R_OK) != 0) {
        print_message("no " UCD "/NormalizationTest.txt.bz2 (Debian package unicode-data): skipped\n");
        skip();
    }
    FILE *f = popen("bzcat " UCD "/NormalizationTest.txt.bz2", "r");
    assert_non_null(f);
    char line[1024];
    if (!fgets(line, sizeof line, f)) { pclose(f); fail(); }
    char want_head[64];
    snprintf(want_head, sizeof want_head, "# NormalizationTest-%s.txt", kvs_uni_ucd_version());
    if (strncmp(line, want_head, strlen(want_head)) != 0) {
        print_message("NormalizationTest.txt is not version %s: %s", kvs_uni_ucd_version(), line);
        pclose(f);
        skip();
    }
    uint8_t *part1 = calloc(0x110000, 1);
    assert_non_null(part1);
    int part = -1;
    size_t cases = 0, bad = 0;
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '@') { part = line[5] - '0'; continue; }
        if (line[0] == '#' || line[0] == '\n') continue;
        uint32_t c[5][32];
        size_t n[5];
        const char *p = line;
        for (int k = 0; k < 5; k++) {
            n[k] = parse_field(p, c[k], 32);
            p = strchr(p, ';');
            assert_non_null(p);
            p++;
        }
        if (part == 1 && n[0] == 1) part1[c[0][0]] = 1;
        /* c2 == NFC(c1) == NFC(c2) == NFC(c3); c4 == NFC(c4) == NFC(c5) */
        int ok = nfc_is(c[0], n[0], c[1], n[1]) && nfc_is(c[1], n[1], c[1], n[1]) &&
                 nfc_is(c[2], n[2], c[1], n[1]) && nfc_is(c[3], n[3], c[3], n[3]) && nfc_is(c[4], n[4], c[3], n[3]);
        if (!ok && bad++ < 5) print_message("NFC fails on: %s", line);
        cases++;
    }
    assert_int_equal(pclose(f), 0);
    assert_true(cases > 19000);
    /* every code point outside Part 1 is its own NFC */
    size_t singles = 0;
    for (uint32_t cp = 0; cp < 0x110000; cp++) {
        if (part1[cp] || (cp >= 0xD800 && cp <= 0xDFFF)) continue;
        if (!nfc_is(&cp, 1, &cp, 1) && bad++ < 5) print_message("NFC changes U+%04X\n", (unsigned)cp);
        singles++;
    }
    free(part1);
    print_message("NormalizationTest %s: %zu lines, %zu single code points, %zu failures\n", kvs_uni_ucd_version(),
                  cases, singles, bad);
    assert_int_equal(bad, 0);
}

static void test_tables_match_generator(void **state) {
    (void)state;
    if (access(UCD "/UnicodeData.txt", R_OK) != 0 || access("/usr/bin/python3", X_OK) != 0) {
        print_message("no " UCD "/UnicodeData.txt (Debian package unicode-data) or no python3: skipped\n");
        skip();
    }
    char *dnp = kvs_test_slurp(UCD "/DerivedNormalizationProps.txt", NULL);
    char want_head[64];
    snprintf(want_head, sizeof want_head, "# DerivedNormalizationProps-%s.txt", kvs_uni_ucd_version());
    int same_version = dnp && strncmp(dnp, want_head, strlen(want_head)) == 0;
    free(dnp);
    if (!same_version) { /* a newer UCD: regenerating is a deliberate update, not a test failure */
        print_message("the installed UCD is not version %s: skipped\n", kvs_uni_ucd_version());
        skip();
    }
    char dir[256], out[320], cmd[1024], committed[512];
    assert_int_equal(kvs_test_make_tmp(dir, sizeof dir), 0);
    snprintf(out, sizeof out, "%s/unicode_tables.c", dir);
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 '%s/tools/gen_unicode_tables.py' --ucd " UCD " --out '%s'",
             kvs_test_root(), out);
    assert_int_equal(system(cmd), 0);
    snprintf(committed, sizeof committed, "%s/gpu_capture/unicode_tables.c", kvs_test_root());
    size_t na, nb;
    char *a = kvs_test_slurp(out, &na), *b = kvs_test_slurp(committed, &nb);
    assert_non_null(a);
    assert_non_null(b);
    assert_int_equal(na, nb);
    assert_memory_equal(a, b, na);
    free(a);
    free(b);
    kvs_test_rm_rf(dir);
}

/* Python's unicodedata (its own UCD build, 14.0 in python3.11) as an independent reference for the categories of
 * every code point it knows (no general category changed between 14.0 and 15.0); a newer Python's characters
 * that the tables do not have yet are left out. */
static void test_categories_match_python(void **state) {
    (void)state;
    if (access("/usr/bin/python3", X_OK) != 0) {
        print_message("no /usr/bin/python3: skipped\n");
        skip();
    }
    FILE *f = popen("/usr/bin/python3 -c 'import unicodedata as u, sys\n"
                    "print(u.unidata_version)\n"
                    "for c in range(0x110000):\n"
                    "    k = u.category(chr(c))\n"
                    "    if k != \"Cn\": sys.stdout.write(\"%X %s\\n\" % (c, k))'",
                    "r");
    assert_non_null(f);
    char line[64], version[32] = "";
    if (fgets(version, sizeof version, f)) version[strcspn(version, "\n")] = 0;
    /* a Python newer than the tables knows characters they do not (versions compare as "major.minor.patch") */
    unsigned pv[3] = {0}, tv[3] = {0};
    sscanf(version, "%u.%u.%u", &pv[0], &pv[1], &pv[2]);
    sscanf(kvs_uni_ucd_version(), "%u.%u.%u", &tv[0], &tv[1], &tv[2]);
    int newer = pv[0] != tv[0] ? pv[0] > tv[0] : pv[1] != tv[1] ? pv[1] > tv[1] : pv[2] > tv[2];
    size_t n = 0, bad = 0;
    static const char names[][3] = {"Cn", "Lu", "Ll", "Lt", "Lm", "Lo", "Mn", "Mc", "Me", "Nd", "Nl", "No",
                                    "Pc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po", "Sm", "Sc", "Sk", "So", "Zs",
                                    "Zl", "Zp", "Cc", "Cf", "Cs", "Co"};
    while (fgets(line, sizeof line, f)) {
        char *sp;
        uint32_t cp = (uint32_t)strtoul(line, &sp, 16);
        const char *mine = names[kvs_uni_category(cp)];
        if (kvs_uni_category(cp) == KVS_UNI_CN && newer) continue; /* assigned after the tables' version */
        if (strncmp(sp + 1, mine, 2) != 0 && bad++ < 5) print_message("U+%04X: python %s, kvsim %s\n", cp, sp + 1, mine);
        n++;
    }
    assert_int_equal(pclose(f), 0);
    print_message("unicodedata %s: %zu assigned code points, %zu differ\n", version, n, bad);
    assert_true(n > 140000);
    assert_int_equal(bad, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nfc_rules),
        cmocka_unit_test(test_categories_of_added_scripts),
        cmocka_unit_test(test_pretok_on_added_scripts),
        cmocka_unit_test(test_normalization_conformance),
        cmocka_unit_test(test_tables_match_generator),
        cmocka_unit_test(test_categories_match_python),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
