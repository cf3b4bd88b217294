/* fuzz_study.c — libFuzzer harness of the STUDY file parser of `kvsim sweep` (results/study.c, format results/STUDY.md):
 * the input is the study file, written beside two small real traces (fuzz/corpus/trace/tiny_*.kvt copied into
 * the scratch folder as a.kvt and b.kvt) so that `trace` lines, globs and budgets resolve against real headers.
 * A study that loads must describe a consistent task list: every task names a loaded trace and a non-empty slice
 * of the policies, and the tasks of each trace cover its policies exactly once, in order (results/STUDY.md "Tasks").
 * Inputs naming a path outside the scratch folder (an absolute path or "..") are skipped: a glob of
 * everything under /proc would open thousands of files per input and a FIFO could block; relative paths are what the parser's
 * own code (resolution against the study's folder, globbing) handles. Seeds: fuzz/corpus/study.
 */
#include "fuzz.h"

#include "../common/kvs.h"
#include "../results/study.h"

static void copy_fixture(const char *from, const char *name) {
    char src[512], dst[128];
    snprintf(src, sizeof src, "%s/%s", kvs_fuzz_root(), from);
    FILE *f = fopen(src, "rb");
    if (!f) {
        perror(src);
        abort();
    }
    static uint8_t buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    kvs_fuzz_write(name, buf, n, dst, sizeof dst);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    copy_fixture("fuzz/corpus/trace/tiny_fp16_block3.kvt", "a.kvt");
    copy_fixture("fuzz/corpus/trace/tiny_fp32_block1.kvt", "b.kvt");
    return 0;
}

/* A path leaving the scratch folder: '/' at the start of a value (after blanks) or "..". */
static int leaves_scratch(const uint8_t *data, size_t size) {
    int value_start = 1;
    for (size_t i = 0; i < size; i++) {
        if (data[i] == '/' && value_start) return 1;
        if (data[i] == '.' && i + 1 < size && data[i + 1] == '.') return 1;
        if (data[i] == '~' || data[i] == '\\') return 1;
        value_start = data[i] == ' ' || data[i] == '\t' || data[i] == '\n' || data[i] == '\r' || data[i] == '=';
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 4096 || leaves_scratch(data, size)) return -1; /* -1: not added to the corpus */
    char path[128];
    kvs_fuzz_write("s.study", data, size, path, sizeof path);
    kvs_study *s = NULL;
    if (kvs_study_load(path, &s) == KVS_OK) {
        int32_t nt = kvs_study_n_traces(s), np = kvs_study_n_policies(s), nk = kvs_study_n_tasks(s);
        if (nt < 1 || np < 1 || kvs_study_n_budgets(s) < 1 || nk < 1 || !kvs_study_name(s) ||
            !kvs_study_budgets(s) || !kvs_study_options(s) || !kvs_study_measure(s))
            abort();
        for (int32_t i = 0; i < nt; i++)
            if (!kvs_study_trace_path(s, i)) abort();
        for (int32_t i = 0; i < np; i++)
            if (!kvs_study_policy_spec(s, i)) abort();
        int32_t trace = 0, next = 0; /* tasks trace by trace, each trace's slices covering [0, np) in order */
        for (int32_t i = 0; i < nk; i++) {
            const kvs_study_task *t = kvs_study_task_get(s, i);
            if (next == np) trace++, next = 0;
            if (t->trace != trace || t->policy_begin != next || t->policy_end <= t->policy_begin ||
                t->policy_end > np || !(t->work >= 0) || !(t->mem_bytes >= 0))
                abort();
            next = t->policy_end;
        }
        if (trace != nt - 1 || next != np) abort();
    }
    kvs_study_free(s);
    kvs_clear_error();
    return 0;
}
