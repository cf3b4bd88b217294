#!/usr/bin/python3
"""gen_unicode_tables.py — writes gpu_capture/unicode_tables.c, the Unicode Character Database tables that
gpu_capture/unicode.c looks up: general categories, the White_Space property, canonical combining classes,
canonical decompositions and the primary composites of canonical composition (Unicode Standard Annex #15,
"Unicode Normalization Forms", sections 1.3 and 3; Unicode Standard chapter 3.11).

Inputs (Debian package unicode-data, Unicode 15.0, under /usr/share/unicode by default):
    UnicodeData.txt                  categories, combining classes, decomposition mappings
    PropList.txt                     White_Space (what the regex crate's and Oniguruma's Unicode \\s match)
    DerivedNormalizationProps.txt    Full_Composition_Exclusion (the composition exclusions, singletons and
                                     non-starter decompositions together)
    CaseFolding.txt                  simple case folding (statuses C and S), what a (?i:...) group of a
                                     pre-tokenizer regex compares (Oniguruma's Unicode case folding)
Every table is a sorted array of code point runs or ranges, or of keys, for binary search, never one entry per
code point of a block, so the object stays small. Standard library only:

    /usr/bin/python3 tools/gen_unicode_tables.py [--ucd DIR] [--out FILE]

tests/test_unicode.c runs this script when the package is installed and compares its output with the committed
file byte for byte.
"""
import argparse
import os
import sys

# General category values in the order of gpu_capture/unicode.h's enum (Cn, unassigned, is 0 and not stored).
CATEGORIES = ["Cn", "Lu", "Ll", "Lt", "Lm", "Lo", "Mn", "Mc", "Me", "Nd", "Nl", "No", "Pc", "Pd", "Ps", "Pe",
              "Pi", "Pf", "Po", "Sm", "Sc", "Sk", "So", "Zs", "Zl", "Zp", "Cc", "Cf", "Cs", "Co"]


def read_unicode_data(path):
    """Per assigned code point: (category, ccc, decomposition field); First/Last pairs expanded."""
    cat, ccc, dec = {}, {}, {}
    first = None
    with open(path, encoding="utf-8") as f:
        for line in f:
            fields = line.rstrip("\n").split(";")
            if len(fields) < 6:
                continue
            cp = int(fields[0], 16)
            name = fields[1]
            if name.endswith(", First>"):
                first = cp
                continue
            lo = first if name.endswith(", Last>") else cp
            first = None
            for c in range(lo, cp + 1):
                cat[c] = fields[2]
                if int(fields[3]):
                    ccc[c] = int(fields[3])
            if fields[5] and not fields[5].startswith("<"):
                dec[cp] = [int(x, 16) for x in fields[5].split()]
    return cat, ccc, dec


def read_property(path, prop):
    """Code points with the binary property prop in a PropList-style file."""
    out = set()
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            rng, name = [x.strip() for x in line.split(";")[:2]]
            if name != prop:
                continue
            lo, _, hi = rng.partition("..")
            out.update(range(int(lo, 16), int(hi or lo, 16) + 1))
    return out


def read_simple_folding(path):
    """cp -> folded cp for the C (common) and S (simple) mappings of CaseFolding.txt."""
    out = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            code, status, mapping = [x.strip() for x in line.split(";")[:3]]
            if status in ("C", "S"):
                out[int(code, 16)] = int(mapping, 16)
    return out


def ranges(values):
    """Sorted (lo, hi, value) runs of consecutive code points with equal value; values: dict cp -> value."""
    out = []
    for cp in sorted(values):
        v = values[cp]
        if out and out[-1][1] == cp - 1 and out[-1][2] == v:
            out[-1][1] = cp
        else:
            out.append([cp, cp, v])
    return out


def emit_rows(rows, fmt, per_line):
    lines = []
    for i in range(0, len(rows), per_line):
        lines.append("    " + " ".join(fmt(r) for r in rows[i:i + per_line]))
    return "\n".join(lines)


def generate(ucd):
    cat, ccc, dec = read_unicode_data(os.path.join(ucd, "UnicodeData.txt"))
    ws = read_property(os.path.join(ucd, "PropList.txt"), "White_Space")
    fce = read_property(os.path.join(ucd, "DerivedNormalizationProps.txt"), "Full_Composition_Exclusion")
    fold = read_simple_folding(os.path.join(ucd, "CaseFolding.txt"))
    version = "unknown"
    with open(os.path.join(ucd, "DerivedNormalizationProps.txt"), encoding="utf-8") as f:
        head = f.readline().strip()  # "# DerivedNormalizationProps-15.0.0.txt"
        if "-" in head and head.endswith(".txt"):
            version = head.rsplit("-", 1)[1][:-4]
    # general categories as run starts packed (start << 5 | category), unassigned runs included: 4 bytes a run
    gc, prev = [], None
    for cp in range(0x110000):
        v = CATEGORIES.index(cat.get(cp, "Cn"))
        if v != prev:
            gc.append(cp << 5 | v)
            prev = v
    cc = ranges(ccc)
    wsr = ranges({cp: 1 for cp in ws})
    decomp = sorted((cp, d[0], d[1] if len(d) > 1 else 0) for cp, d in dec.items())
    assert all(len(d) <= 2 for d in dec.values()), "canonical mappings have at most two code points"
    comp = sorted((d[0], d[1], cp) for cp, d in dec.items() if len(d) == 2 and cp not in fce)
    # gpu_capture/unicode.c relies on these two facts of the data (both hold since Unicode 3.1)
    assert all(len(d) < 2 or d[1] not in dec for d in dec.values()), "only a first element decomposes further"
    assert all(a not in ccc for a, _, _ in comp), "no primary composite begins with a non-starter"

    hex_ = lambda v: "0x%04X" % v
    out = []
    out.append("/* unicode_tables.c — GENERATED by tools/gen_unicode_tables.py from the Unicode Character Database "
               "%s\n * (UnicodeData.txt, PropList.txt, DerivedNormalizationProps.txt, CaseFolding.txt); do not edit, rerun the "
               "script.\n * Layout and meaning: gpu_capture/unicode_tables.h. */" % version)
    out.append('#include "unicode_tables.h"\n')
    out.append('const char kvs_unitab_version[] = "%s";\n' % version)
    out.append("const uint32_t kvs_unitab_gc[] = {")
    out.append(emit_rows(gc, lambda r: "0x%07X," % r, 10))
    out.append("};\nconst size_t kvs_unitab_n_gc = sizeof kvs_unitab_gc / sizeof kvs_unitab_gc[0];\n")
    out.append("const kvs_uni_range kvs_unitab_white_space[] = {")
    out.append(emit_rows(wsr, lambda r: "{%s, %s, 1}," % (hex_(r[0]), hex_(r[1])), 5))
    out.append("};\nconst size_t kvs_unitab_n_white_space = sizeof kvs_unitab_white_space / "
               "sizeof kvs_unitab_white_space[0];\n")
    out.append("const kvs_uni_range kvs_unitab_ccc[] = {")
    out.append(emit_rows(cc, lambda r: "{%s, %s, %d}," % (hex_(r[0]), hex_(r[1]), r[2]), 5))
    out.append("};\nconst size_t kvs_unitab_n_ccc = sizeof kvs_unitab_ccc / sizeof kvs_unitab_ccc[0];\n")
    out.append("const kvs_uni_triple kvs_unitab_decomp[] = {")
    out.append(emit_rows(decomp, lambda r: "{%s, %s, %s}," % tuple(hex_(x) for x in r), 5))
    out.append("};\nconst size_t kvs_unitab_n_decomp = sizeof kvs_unitab_decomp / sizeof kvs_unitab_decomp[0];\n")
    out.append("const kvs_uni_triple kvs_unitab_comp[] = {")
    out.append(emit_rows(comp, lambda r: "{%s, %s, %s}," % tuple(hex_(x) for x in r), 5))
    out.append("};\nconst size_t kvs_unitab_n_comp = sizeof kvs_unitab_comp / sizeof kvs_unitab_comp[0];\n")
    out.append("const kvs_uni_triple kvs_unitab_fold[] = {")
    out.append(emit_rows(sorted((cp, f, 0) for cp, f in fold.items()),
                         lambda r: "{%s, %s, %d}," % (hex_(r[0]), hex_(r[1]), r[2]), 5))
    out.append("};\nconst size_t kvs_unitab_n_fold = sizeof kvs_unitab_fold / sizeof kvs_unitab_fold[0];")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ucd", default="/usr/share/unicode", help="folder of the UCD text files")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "gpu_capture",
                                                  "unicode_tables.c"))
    a = ap.parse_args()
    try:
        text = generate(a.ucd)
    except OSError as e:
        print("gen_unicode_tables.py: %s" % e, file=sys.stderr)
        return 1
    with open(a.out, "w", encoding="utf-8") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
