/* unicode.h — the Unicode character properties and the NFC normalization that the tokenizer.json support needs
 * (gpu_capture/tokenizer_hf.c, tokenizer_pretok.c): general category (the \p{L}, \p{N}, \p{Lu} ... classes of
 * the pre-tokenizer regexes), White_Space (their \s) and Normalization Form C (the tokenizer.json "NFC"
 * normalizer), after Unicode Standard Annex #15 "Unicode Normalization Forms" (sections 1.3, 3 and 9-10) and
 * the Unicode Standard chapter 3.11-3.12 (canonical ordering, Hangul syllables).
 *
 * The data are the Unicode Character Database version kvs_uni_version (gpu_capture/unicode_tables.c, generated
 * by tools/gen_unicode_tables.py); code points unassigned in that version are Cn, have combining class 0 and
 * no decomposition, as the standard says they must be treated.
 */
#ifndef KVS_UNICODE_H
#define KVS_UNICODE_H

#include <stddef.h>
#include <stdint.h>

#include "../common/kvs.h"

/* General category values (UCD PropertyValueAliases.txt, gc); KVS_UNI_CN (unassigned) is 0. */
typedef enum {
    KVS_UNI_CN, KVS_UNI_LU, KVS_UNI_LL, KVS_UNI_LT, KVS_UNI_LM, KVS_UNI_LO, KVS_UNI_MN, KVS_UNI_MC, KVS_UNI_ME,
    KVS_UNI_ND, KVS_UNI_NL, KVS_UNI_NO, KVS_UNI_PC, KVS_UNI_PD, KVS_UNI_PS, KVS_UNI_PE, KVS_UNI_PI, KVS_UNI_PF,
    KVS_UNI_PO, KVS_UNI_SM, KVS_UNI_SC, KVS_UNI_SK, KVS_UNI_SO, KVS_UNI_ZS, KVS_UNI_ZL, KVS_UNI_ZP, KVS_UNI_CC,
    KVS_UNI_CF, KVS_UNI_CS, KVS_UNI_CO
} kvs_uni_category_t;

/* UCD version of the tables, e.g. "15.0.0". */
const char *kvs_uni_ucd_version(void);
/* General category of cp (KVS_UNI_CN above U+10FFFF). */
kvs_uni_category_t kvs_uni_category(uint32_t cp);
/* \p{L}: Lu Ll Lt Lm Lo. */
int kvs_uni_is_letter(uint32_t cp);
/* \p{N}: Nd Nl No. */
int kvs_uni_is_number(uint32_t cp);
/* White_Space property (PropList.txt), the regex crate's Unicode \s. */
int kvs_uni_is_white_space(uint32_t cp);
/* Simple case folding (CaseFolding.txt statuses C and S): the code point a (?i:...) regex group compares;
 * cp itself when it has no mapping. */
uint32_t kvs_uni_simple_fold(uint32_t cp);
/* The code points whose simple case folding is f, other than f itself, into out[0..max); returns how many there
 * are (at most 3 in Unicode 15: 'k' has 'K' and U+212A KELVIN SIGN). */
size_t kvs_uni_fold_sources(uint32_t f, uint32_t *out, size_t max);
/* Canonical_Combining_Class (0 for starters and unassigned code points). */
int kvs_uni_ccc(uint32_t cp);

/*! kvs_uni_nfc() : Normalization Form C of the code points in[0..n): full canonical decomposition (Hangul
 *  syllables algorithmically), canonical ordering of each run of non-starters by combining class (stable), then
 *  canonical composition skipping the composition exclusions. *out is a malloc'd array the caller frees (it
 *  holds at least one element, also for n == 0), *out_n its length (never more than 4 * n: the longest
 *  canonical decomposition).
 *  @return KVS_OK, KVS_ERR_NOMEM (*out NULL). */
kvs_status kvs_uni_nfc(const uint32_t *in, size_t n, uint32_t **out, size_t *out_n);

#endif /* KVS_UNICODE_H */
