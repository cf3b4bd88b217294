/* study.h — the declarative STUDY file of `kvsim sweep` and its deterministic task list (format: results/STUDY.md).
 *
 * A study is traces x policy configurations x KV codecs (optional) x budgets with one set of measurement options.
 * Its work is cut into TASKS: one trace x a slice of consecutive policies (each with every codec and every budget),
 * so one task is one replay pass
 * (the full attention of the trace is computed once per task). Cheaper traces get more policies per task so
 * that tasks take similar time (kvs_study_load, "Task sizing" in results/STUDY.md). The list depends only on the
 * study file and the trace headers: every rank and every Slurm array element computes the same list.
 */
#ifndef KVS_STUDY_H
#define KVS_STUDY_H

#include <stdint.h>

#include "../common/kvs.h"

typedef struct kvs_study kvs_study;

/* One task: trace `trace` x policies [policy_begin, policy_end) x every codec x every budget. */
typedef struct {
    int32_t trace;                   /* index into the study's traces */
    int32_t policy_begin, policy_end;
    double work;                     /* estimated attention multiply-adds of the task (cost model in STUDY.md) */
    double mem_bytes;                /* estimated peak replay memory of the task, bytes */
} kvs_study_task;

/*! kvs_study_load() : reads and checks the study file at `path`: every line, every trace (globs expanded, each
 *  header opened), every policy spec. Errors are KVS_ERR_FORMAT (syntax, unknown key, bad value) or
 *  KVS_ERR_IO (unreadable study or trace) with a detail "PATH:LINE: what". Caller frees with kvs_study_free. */
kvs_status kvs_study_load(const char *path, kvs_study **out);
void kvs_study_free(kvs_study *s);

/* The study's name (`name` line, else the file name without directory). Borrowed. */
const char *kvs_study_name(const kvs_study *s);
int32_t kvs_study_n_traces(const kvs_study *s);
/* Trace i's path as it is opened (relative paths resolved against the study file's folder). Borrowed. */
const char *kvs_study_trace_path(const kvs_study *s, int32_t i);
int32_t kvs_study_n_policies(const kvs_study *s);
const char *kvs_study_policy_spec(const kvs_study *s, int32_t i); /* the spec as written. Borrowed. */
const char *kvs_study_budgets(const kvs_study *s);                /* the budget list as written. Borrowed. */
/* The codecs (`codec` lines, results/STUDY.md): 0 when none is given (every run K/V as captured, the replay gets no
 * --codec); else each run of a (policy, budget) is repeated per codec. Codec i's canonical spec (sim/codec.h), or
 * "none" for K/V as captured among others. Borrowed. */
int32_t kvs_study_n_codecs(const kvs_study *s);
const char *kvs_study_codec_spec(const kvs_study *s, int32_t i);
/*! kvs_study_set_codecs() : replaces the study's codecs by specs[0..n) (`kvsim sweep --codec`; n 0: none) and
 *  rebuilds the task list (their cost scales with the codecs). A spec that does not parse, or one codec twice:
 *  KVS_ERR_INVALID_ARG naming it ("--codec SPEC: ..."), the study unchanged. */
kvs_status kvs_study_set_codecs(kvs_study *s, const char *const *specs, int32_t n);
/* The page sizes (a `page` line, results/STUDY.md): 0 when none is given (every run at token granularity, the
 * replay gets no --page); else each run of a (policy, codec, budget) is repeated per page size (0 = token
 * granularity among them). kvs_study_pages: the canonical list ("0,16"), NULL without a page line. Borrowed. */
int32_t kvs_study_n_pages(const kvs_study *s);
const char *kvs_study_pages(const kvs_study *s);
/*! kvs_study_set_pages() : replaces the study's page sizes by the list `text` ("16", "0,16,32"; `kvsim sweep --page`)
 *  and rebuilds the task list. A list that does not parse, or a size twice: KVS_ERR_INVALID_ARG naming it ("--page:
 *  ..."), the study unchanged. */
kvs_status kvs_study_set_pages(kvs_study *s, const char *text);
int32_t kvs_study_n_budgets(const kvs_study *s);
/* The measurement options as `kvsim replay` options: measure, series-every, kv-bytes, aux-bytes, threads; 0
 * (or NULL) = the replay default. */
const char *kvs_study_measure(const kvs_study *s);
int64_t kvs_study_series_every(const kvs_study *s);
int32_t kvs_study_kv_bytes(const kvs_study *s), kvs_study_aux_bytes(const kvs_study *s),
    kvs_study_threads(const kvs_study *s);
/* The canonical options text "measure=...,series_every=...,kv_bytes=...,aux_bytes=..." (part of a task's key). */
const char *kvs_study_options(const kvs_study *s);

int32_t kvs_study_n_tasks(const kvs_study *s);
/* Task i (0 <= i < n_tasks). Borrowed. */
const kvs_study_task *kvs_study_task_get(const kvs_study *s, int32_t i);

#endif /* KVS_STUDY_H */
