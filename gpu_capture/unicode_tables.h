/* unicode_tables.h — layout of the Unicode Character Database tables that tools/gen_unicode_tables.py writes
 * into gpu_capture/unicode_tables.c (generated, committed). Only gpu_capture/unicode.c reads them; everyone
 * else asks through gpu_capture/unicode.h.
 *
 * Every array is sorted for binary search:
 *   kvs_unitab_gc           one entry per run of equal general category over U+0000..U+10FFFF, unassigned (Cn)
 *                           runs included: (first code point << 5) | category (kvs_uni_category_t in unicode.h);
 *                           a code point's category is that of the last run starting at or before it
 *   kvs_unitab_white_space  inclusive ranges with the White_Space property (value 1)
 *   kvs_unitab_ccc          inclusive ranges of equal non-zero canonical combining class
 *   kvs_unitab_decomp       {cp, first, second}: the canonical decomposition mapping of cp (second 0 for a
 *                           singleton), one level; full decomposition applies it recursively (UAX #15 1.3)
 *   kvs_unitab_comp         {first, second, composite}: the primary composites (two-code-point canonical
 *                           mappings without Full_Composition_Exclusion), sorted by (first, second)
 *   kvs_unitab_fold         {cp, folded, 0}: simple case folding (CaseFolding.txt statuses C and S), sorted by cp;
 *                           a code point not listed folds to itself
 * Hangul syllables are algorithmic (Unicode chapter 3.12) and are in neither decomposition table.
 */
#ifndef KVS_UNICODE_TABLES_H
#define KVS_UNICODE_TABLES_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint32_t lo, hi;
    uint8_t value;
} kvs_uni_range;

typedef struct {
    uint32_t a, b, c;
} kvs_uni_triple;

extern const char kvs_unitab_version[];
extern const uint32_t kvs_unitab_gc[];
extern const size_t kvs_unitab_n_gc;
extern const kvs_uni_range kvs_unitab_white_space[];
extern const size_t kvs_unitab_n_white_space;
extern const kvs_uni_range kvs_unitab_ccc[];
extern const size_t kvs_unitab_n_ccc;
extern const kvs_uni_triple kvs_unitab_decomp[];
extern const size_t kvs_unitab_n_decomp;
extern const kvs_uni_triple kvs_unitab_comp[];
extern const size_t kvs_unitab_n_comp;
extern const kvs_uni_triple kvs_unitab_fold[];
extern const size_t kvs_unitab_n_fold;

#endif /* KVS_UNICODE_TABLES_H */
