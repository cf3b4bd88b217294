/* samples.h — per-step metric samples of a replay spilled to disk, with EXACT summary statistics.
 *
 * The replay engine produces one float per metric per (query head, measured step); holding them all in RAM
 * to take percentiles costs gigabytes on long traces. A kvs_sample_set keeps only a 1024-sample buffer in
 * memory and appends full buffers as chunks to a kvs_sample_spill, one unlinked temporary file (in $TMPDIR,
 * else /tmp) shared by many sets; kvs_sample_stats() then computes, in bounded memory, the same statistics
 * as kvs_results_stat_compute() (results/results.h) over the union of any sets' samples:
 *  - n, min, max, p50 and p95 (nearest rank on the sorted samples: index ceil(p*n)-1) are exact and compare
 *    == with kvs_results_stat_compute(); their bits can differ only in the sign of a zero, because qsort
 *    leaves the order of -0.0 and +0.0 unspecified (here -0.0 always sorts before +0.0);
 *  - mean is BIT-IDENTICAL: the same Kahan-compensated sum over the samples in ascending order, then
 *    divided by n (the sum does not depend on the order of -0.0 and +0.0; see samples.c).
 * How (samples.c has the details): the floats are mapped to order-preserving 32-bit keys; one pass builds a
 * 65536-bucket histogram of the keys' top 16 bits per metric; consecutive buckets are grouped into
 * partitions of at most a fixed number of samples, a bucket larger than that alone gets a 65536-entry
 * count array of its low 16 bits (each entry is one exact float value); a second pass distributes the keys
 * to a second unlinked scratch file partition by partition; each partition is then read back, radix
 * sorted (or counted) and folded into the sum and the ranks in ascending order. When every key fits in the
 * memory budget the samples are gathered and sorted in memory in one pass instead.
 *
 * Threads: a spill, its sets and kvs_sample_stats() calls on them are used by one thread at a time
 * (one replay task owns one spill and the sets of its configurations). Different spills are independent.
 * Costs: see kvs_sample_set_create() and kvs_sample_stats().
 */
#ifndef KVS_SAMPLES_H
#define KVS_SAMPLES_H

#include <stddef.h>
#include <stdint.h>

#include "../common/kvs.h"
#include "metrics.h"

/* Samples held in memory per set before they are appended to the spill file as one chunk. */
#define KVS_SAMPLE_CHUNK 1024

/* Default memory budget of kvs_sample_stats() (see kvs_sample_spill_set_stats_memory()). */
#define KVS_SAMPLE_STATS_MEMORY_DEFAULT ((size_t)32 << 20)

typedef struct kvs_sample_spill kvs_sample_spill;
typedef struct kvs_sample_set kvs_sample_set;

/*! kvs_sample_spill_create() : creates an empty spill: one temporary file created with mkostemp(O_CLOEXEC)
 *  in $TMPDIR (or /tmp when unset or empty) and unlinked at once, so it vanishes with the process.
 *  @return KVS_ERR_IO (directory and errno in the detail) when the file cannot be created.
 *  Caller owns *out, frees with kvs_sample_spill_free() after freeing every set that uses it. */
kvs_status kvs_sample_spill_create(kvs_sample_spill **out);

/*! kvs_sample_spill_free() : closes the file (its disk space is released); accepts NULL. */
void kvs_sample_spill_free(kvs_sample_spill *spill);

/*! kvs_sample_spill_bytes() : bytes appended to the spill file so far (0 for NULL). The file is append-only:
 *  a freed set's chunks keep their space until the spill is freed. */
uint64_t kvs_sample_spill_bytes(const kvs_sample_spill *spill);

/*! kvs_sample_spill_set_stats_memory() : memory budget in bytes of kvs_sample_stats() on this spill's sets
 *  (default KVS_SAMPLE_STATS_MEMORY_DEFAULT): half for the sort buffers (budget/16 samples of one metric
 *  per partition, plus as much again for the radix sort), a quarter for the scratch file's write buffers,
 *  a quarter for the low-16-bit count arrays of buckets too large to sort (512 KiB each, at least one).
 *  Sets of several spills use the smallest budget. Smaller budgets only cost more passes, never exactness.
 *  @return KVS_ERR_INVALID_ARG for NULL or a budget outside [4 KiB, 16 GiB]. */
kvs_status kvs_sample_spill_set_stats_memory(kvs_sample_spill *spill, size_t bytes);

/*! kvs_sample_set_create() : an empty set of samples of `n_metrics` floats each (n_metrics >= 1), appending
 *  to `spill` (borrowed: it must outlive the set).
 *  Costs: memory n_metrics * KVS_SAMPLE_CHUNK * 4 bytes of buffer + 8 bytes per KVS_SAMPLE_CHUNK samples
 *  pushed (the chunk index); disk n_metrics * 4 bytes per sample (full chunks only).
 *  Caller owns *out, frees with kvs_sample_set_free(). */
kvs_status kvs_sample_set_create(kvs_sample_spill *spill, int n_metrics, kvs_sample_set **out);

/*! kvs_sample_set_free() : frees the set's memory (its chunks stay in the spill file); accepts NULL. */
void kvs_sample_set_free(kvs_sample_set *set);

/*! kvs_sample_set_push() : appends one sample, values[n_metrics] (copied). When the buffer is already full it
 *  is first appended to the spill file as a chunk; if that write fails (disk full: ENOSPC, ...) the result
 *  is KVS_ERR_IO, the sample is not added and the set is unchanged, so a later push may retry.
 *  NaN values are accepted here and refused by kvs_sample_stats() (a NaN has no rank). */
kvs_status kvs_sample_set_push(kvs_sample_set *set, const float *values);

/*! kvs_sample_set_count() : samples pushed so far (0 for NULL). */
int64_t kvs_sample_set_count(const kvs_sample_set *set);

/*! kvs_sample_set_n_metrics() : floats per sample (0 for NULL). */
int kvs_sample_set_n_metrics(const kvs_sample_set *set);

/*! kvs_sample_stats() : *out = statistics of metric `metric` (0-based, < every set's n_metrics) over the
 *  union of the samples of sets[0..n_sets-1] (buffered and spilled), equal to kvs_results_stat_compute()
 *  on the same samples converted to double (see the top of this file for the exact contract). No samples
 *  (n_sets == 0 or all sets empty) gives all zeros.
 *  Costs: memory at most the budget of kvs_sample_spill_set_stats_memory() plus 1 MiB (one top-bucket
 *  histogram, radix counts) and one chunk of read buffer, whatever the number of samples; reads only
 *  this metric's column of each chunk. Passes over the sets: one when n fits in budget/16 samples;
 *  otherwise one histogram pass, then one distribution pass per group of partitions (usually one), the
 *  scratch file holding at most one group's keys (4 bytes per sample) and released on return.
 *  @return KVS_ERR_INVALID_ARG for bad arguments or a NaN sample (the detail names set, sample and metric),
 *  KVS_ERR_IO when the spill or scratch file cannot be read or written, KVS_ERR_NOMEM. *out is zeroed on
 *  error. The sets are not modified. */
kvs_status kvs_sample_stats(kvs_sample_set *const *sets, int n_sets, int metric, kvs_results_stat *out);

/*! kvs_sample_stats_all() : out_per_metric[m] = kvs_sample_stats(sets, n_sets, m) for every metric m of the
 *  sets (all sets must have the same n_metrics; n_sets >= 1), computed together: each pass reads every
 *  chunk once for all metrics. Memory: as kvs_sample_stats() plus 512 KiB of histogram per metric. */
kvs_status kvs_sample_stats_all(kvs_sample_set *const *sets, int n_sets, kvs_results_stat *out_per_metric);

#endif /* KVS_SAMPLES_H */
