# findings_lib.sh — sourced by the scripts that regenerate examples/FINDINGS.md (findings.sh): the generated
# blocks of the file and their check.
#
# Every measured number of FINDINGS.md sits in a generated block,
#     <!-- begin generated NAME -->
#     ...
#     <!-- end generated NAME -->
# whose text a script writes to $blocks/NAME.md (block_line). `findings_blocks check FILE DIR PREFIX` regenerates the
# file with each block of PREFIX replaced by DIR/NAME.md and fails, naming them, when a block differs, a block of
# PREFIX has no generated text, or a generated block is not in the file: the file cannot drift from the code.
# `findings_blocks update FILE DIR PREFIX` writes the regenerated file in its place (atomically).

# block_line NAME TEXT...: appends one line to block NAME.
block_line() {
    name=$1
    shift
    printf '%s\n' "$*" >> "$blocks/$name.md"
}

# The CSV of `kvsim compare --csv` (RFC 4180: quoted fields with commas) as tab-separated fields, header first.
csv_to_tsv() {
    awk '{ line = $0; out = ""; f = ""; inq = 0
           for (i = 1; i <= length(line); i++) { ch = substr(line, i, 1)
               if (ch == "\"") { if (inq && substr(line, i + 1, 1) == "\"") { f = f "\""; i++ } else inq = !inq; continue }
               if (ch == "," && !inq) { out = out f "\t"; f = ""; continue }
               f = f ch }
           print out f }'
}

findings_blocks() {
    mode=$1 file=$2 dir=$3 prefix=$4
    tmp="$file.tmp.$$"
    awk -v dir="$dir" -v prefixes="$prefix" -v missing="$dir/.missing" '
        function mine_of(name,   n, p, i) { n = split(prefixes, p, " "); if (n == 0) return 1
            for (i = 1; i <= n; i++) if (name == p[i] || index(name, p[i] "-") == 1) return 1
            return 0 }
        function flush(name,   f, l) { f = dir "/" name ".md"
            if ((getline l < f) <= 0) { print name >> missing; return }
            print l; while ((getline l < f) > 0) print l; close(f) }
        /^<!-- begin generated / { print; name = $4; mine = mine_of(name)
            if (mine) { flush(name); skip = 1; seen[name] = 1 }; next }
        /^<!-- end generated / { skip = 0; print; next }
        !skip { print }
        END { for (n in seen) print n > (dir "/.seen") }' "$file" > "$tmp" || { rm -f "$tmp"; return 1; }
    bad=0
    if [ -s "$dir/.missing" ]; then
        echo "findings: blocks of $file with no generated text: $(tr '\n' ' ' < "$dir/.missing")" >&2
        bad=1
    fi
    for f in "$dir"/*.md; do
        [ -e "$f" ] || continue
        n=$(basename "$f" .md)
        if [ -n "$prefix" ]; then
            in_list=0
            for p in $prefix; do case $n in "$p" | "$p"-*) in_list=1 ;; esac; done
            [ $in_list -eq 1 ] || continue
        fi
        grep -qx "$n" "$dir/.seen" 2> /dev/null || { echo "findings: generated block $n is not in $file" >&2; bad=1; }
    done
    rm -f "$dir/.missing" "$dir/.seen"
    if [ "$mode" = check ]; then
        if ! cmp -s "$file" "$tmp"; then
            echo "findings: $file does not match what the scripts measure now:" >&2
            diff -u "$file" "$tmp" | head -n 80 >&2
            bad=1
        fi
        rm -f "$tmp"
    elif [ $bad -eq 0 ]; then
        mv "$tmp" "$file"
    else
        rm -f "$tmp"
    fi
    return $bad
}
