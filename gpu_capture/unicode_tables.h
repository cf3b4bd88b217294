/* unicode_tables.h — layout of the Unicode Character Database tables that tools/gen_unicode_tables.py writes
 * into gpu_capture/unicode_tables.c (generated, committed). Only gpu_capture/unicode.c reads them; everyone
 * else asks through gpu_capture/unicode.h.
 *
 * Every array is sorted by its first field(s) for binary search:
 *   kvs_unitab_gc           inclusive ranges of equal general category (value: enum kvs_unitab_gc in unicode.h);
 *                        unassigned code points (Cn) are absent
 *   kvs_unitab_white_space  ranges with the White_Space property (value 1)
 *   kvs_unitab_ccc          ranges of equal non-zero canonical combining class
 *   kvs_unitab_decomp       {cp, first, second}: the canonical decomposition mapping of cp (second 0 for a
 *                        singleton), one level; full decomposition applies it recursively (UAX #15 1.3)
 *   kvs_unitab_comp         {first, second, composite}: the primary composites (two-code-point canonical mappings
 *                        without Full_Composition_Exclusion), sorted by (first, second)
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
extern const kvs_uni_range kvs_unitab_gc[];
extern const size_t kvs_unitab_n_gc;
extern const kvs_uni_range kvs_unitab_white_space[];
extern const size_t kvs_unitab_n_white_space;
extern const kvs_uni_range kvs_unitab_ccc[];
extern const size_t kvs_unitab_n_ccc;
extern const kvs_uni_triple kvs_unitab_decomp[];
extern const size_t kvs_unitab_n_decomp;
extern const kvs_uni_triple kvs_unitab_comp[];
extern const size_t kvs_unitab_n_comp;

#endif /* KVS_UNICODE_TABLES_H */
