/* cmd_sweep.c — `kvsim sweep STUDY`: the task list of a study (results/study.h, format results/STUDY.md) and the runs of
 * its tasks, one task at a time, a range, or every task; with the MPI build (`make mpi`, KVS_WITH_MPI) under
 * mpirun, tasks handed out dynamically to the ranks, each writing its own shard, rank 0 merging them
 * (results/results_sweep.h), and a resumed one skipping every task complete in any database of the folder. A task is
 * one `kvsim replay` pass (cli/cmd_replay.c) of one trace under a slice of the study's policies, all its codecs
 * (`codec` lines or --codec: one run per (policy, codec, budget)) and all its budgets; a completed task is recorded
 * (table sweep_tasks) and skipped when re-run.
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifdef KVS_WITH_MPI
#include <mpi.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>
#endif

#include "../common/kvs_math.h"
#include "../common/sha256.h"
#include "../results/results.h"
#include "../results/results_sweep.h"
#include "../results/study.h"
#include "../trace/trace.h"
#include "cli.h"

#ifndef KVSIM_VERSION_STRING
#define KVSIM_VERSION_STRING "0.1.0"
#endif

static void usage(FILE *f) {
    fprintf(f,
            "usage: kvsim sweep STUDY --list-tasks [--estimate] [--codec SPEC ...] [--page LIST]\n"
            "       kvsim sweep STUDY --db OUT.db [--task I | --tasks I:J] [--codec SPEC ...] [--page LIST]\n"
            "       kvsim sweep STUDY --db DIR/          (under mpirun with the MPI build: every task, all ranks)\n\n"
            "Runs a study: traces x policies x codecs x budgets (STUDY file format: results/STUDY.md). Its work is\n"
            "cut into a deterministic list of tasks (one trace x a slice of the policies, every codec, every\n"
            "budget), sized so that tasks take similar time.\n\n"
            "  --list-tasks    print the task list: index, trace, policies, (policy, budget) pairs\n"
            "  --estimate      with --list-tasks: estimated attention work (GMAC) and peak memory of each task\n"
            "  --db OUT.db     results database the runs go to (created if missing)\n"
            "  --task I        run task I only (0-based)\n"
            "  --tasks I:J     run tasks I..J-1\n"
            "                  (neither: every task)\n"
            "  --codec SPEC    a KV codec (`kvsim replay --codec`: int, kivi, hf, fp8 specs, or none for K/V as\n"
            "                  captured), repeatable: replaces the study's `codec` lines; each (policy, codec,\n"
            "                  budget) is one run. Give the same --codec to every command of one sweep (the task\n"
            "                  list and the completed-task keys depend on it; a Slurm array passes only STUDY: put\n"
            "                  the codecs in the study file there)\n"
            "  --page LIST     page sizes (`kvsim replay --page`: 16, or 0,16,32; 0 or none = token granularity):\n"
            "                  replaces the study's `page` line; each (policy, codec, page, budget) is one run.\n"
            "                  Like --codec, give it to every command of one sweep\n"
            "  --db DIR/       a folder (trailing /): each process writes DIR/shard-RANK.db, then rank 0 merges every\n"
            "                  DIR/shard-N.db into DIR/study.db; under mpirun (make mpi) tasks go dynamically to the\n"
            "                  ranks; a task complete in DIR/study.db or any shard there is skipped\n\n"
            "A task that completed is recorded in the database and skipped when run again (resumable). Merge shard\n"
            "databases with `kvsim merge`.\n");
}

/* The key a completed task is recorded under: the trace's content, the measurement options, the budgets, the
 * task's policies and codecs (task_configs) and the kvsim version (a changed trace or option is another task). */
static void task_key(const kvs_study *s, const kvs_study_task *t, const char *trace_sha, const char *configs,
                     char key[65]) {
    char buf[8192];
    snprintf(buf, sizeof buf, "%s|%s|%s|%s|%s", trace_sha, kvs_study_options(s), kvs_study_budgets(s), configs,
             KVSIM_VERSION_STRING);
    kvs_sha256_hex(buf, strlen(buf), key);
    (void)t;
}

/* "POLICY POLICY ..." and, when the study has codecs, " x codecs SPEC SPEC ..." (canonical specs), and when it has
 * page sizes, " x pages 0,16" (canonical list): what the task runs, printed and recorded with it and part of its
 * key. Without codecs or pages the text (and so the key) is what it was before they existed: a study without codec
 * or page lines resumes from an older database. */
static void task_configs(const kvs_study *s, const kvs_study_task *t, char *buf, size_t cap) {
    size_t len = 0;
    buf[0] = '\0';
    for (int32_t p = t->policy_begin; p < t->policy_end && len < cap; p++)
        len += (size_t)snprintf(buf + len, cap - len, "%s%s", p > t->policy_begin ? " " : "", kvs_study_policy_spec(s, p));
    for (int32_t k = 0; k < kvs_study_n_codecs(s) && len < cap; k++)
        len += (size_t)snprintf(buf + len, cap - len, "%s%s", k ? " " : " x codecs ", kvs_study_codec_spec(s, k));
    if (kvs_study_pages(s) && len < cap) snprintf(buf + len, cap - len, " x pages %s", kvs_study_pages(s));
}

/* Runs task i into db_path. @return KVS_EXIT_OK (done, or already complete), else KVS_EXIT_FAIL. */
static int run_task(const kvs_study *s, int32_t i, const char *db_path, int rank) {
    const kvs_study_task *t = kvs_study_task_get(s, i);
    const char *trace_path = kvs_study_trace_path(s, t->trace);
    char sha[65], key[65], configs[4096];
    kvs_status st = kvs_sha256_file_hex(trace_path, sha);
    if (st != KVS_OK) return kvs_cli_fail("sweep", st == KVS_ERR_INVALID_ARG ? KVS_ERR_IO : st);
    task_configs(s, t, configs, sizeof configs);
    task_key(s, t, sha, configs, key);
    kvs_results_db *db = NULL;
    kvs_trace *tr = NULL;
    int64_t trace_id = 0, first_run_id = 0;
    int done = 0;
    if ((st = kvs_results_open(db_path, &db)) == KVS_OK && (st = kvs_results_sweep_task_done(db, key, &done)) == KVS_OK &&
        !done && (st = kvs_results_sweep_next_run_id(db, &first_run_id)) == KVS_OK &&
        (st = kvs_trace_open(trace_path, &tr)) == KVS_OK) {
        kvs_results_trace rt = kvs_results_trace_of(trace_path, kvs_trace_info_get(tr));
        st = kvs_results_sweep_trace(db, &rt, sha, &trace_id);
    }
    kvs_trace_close(tr);
    kvs_results_close(db);
    db = NULL;
    if (st != KVS_OK) return kvs_cli_fail("sweep", st == KVS_ERR_INVALID_ARG ? KVS_ERR_IO : st);
    if (done) {
        fprintf(stderr, "kvsim sweep: task %d (%s: %s) already complete in %s: skipped\n", i, trace_path, configs,
                db_path);
        return KVS_EXIT_OK;
    }
    fprintf(stderr, "kvsim sweep: rank %d: task %d: %s: %s\n", rank, i, trace_path, configs);
    /* One task is one `kvsim replay` of the trace: the same validation, recording and failure semantics. */
    char series[32], kvb[16], auxb[16], thr[16];
    const char *args[18 + 2 * 64 + 2 * 16]; /* fixed options, --page, --policy x 64 and --codec x 16 at most (study.c) */
    int n = 0;
    args[n++] = "replay";
    args[n++] = trace_path;
    args[n++] = "--db";
    args[n++] = db_path;
    args[n++] = "--budgets";
    args[n++] = kvs_study_budgets(s);
    args[n++] = "--measure";
    args[n++] = kvs_study_measure(s);
    snprintf(series, sizeof series, "%lld", (long long)kvs_study_series_every(s));
    args[n++] = "--series-every";
    args[n++] = series;
    args[n++] = "--no-progress";
    if (kvs_study_kv_bytes(s)) {
        snprintf(kvb, sizeof kvb, "%d", kvs_study_kv_bytes(s));
        args[n++] = "--kv-bytes";
        args[n++] = kvb;
    }
    if (kvs_study_aux_bytes(s)) {
        snprintf(auxb, sizeof auxb, "%d", kvs_study_aux_bytes(s));
        args[n++] = "--aux-bytes";
        args[n++] = auxb;
    }
    if (kvs_study_threads(s)) {
        snprintf(thr, sizeof thr, "%d", kvs_study_threads(s));
        args[n++] = "--threads";
        args[n++] = thr;
    }
    for (int32_t p = t->policy_begin; p < t->policy_end; p++) {
        args[n++] = "--policy";
        args[n++] = kvs_study_policy_spec(s, p);
    }
    for (int32_t k = 0; k < kvs_study_n_codecs(s); k++) {
        args[n++] = "--codec";
        args[n++] = kvs_study_codec_spec(s, k);
    }
    if (kvs_study_pages(s)) {
        args[n++] = "--page";
        args[n++] = kvs_study_pages(s);
    }
    args[n] = NULL;
    int rc = kvs_cmd_replay(n, (char **)args);
    if (rc != KVS_EXIT_OK) {
        fprintf(stderr, "kvsim sweep: task %d did not complete (replay exit status %d): it runs again next time\n", i,
                rc);
        return KVS_EXIT_FAIL;
    }
    if ((st = kvs_results_open(db_path, &db)) == KVS_OK)
        st = kvs_results_sweep_task_record(db, key, kvs_study_name(s), i, trace_id, configs, kvs_study_options(s),
                                           first_run_id);
    kvs_results_close(db);
    return st == KVS_OK ? KVS_EXIT_OK : kvs_cli_fail("sweep", st);
}

static int list_tasks(const kvs_study *s, int estimate) {
    int32_t n = kvs_study_n_tasks(s);
    int32_t n_codecs = kvs_study_n_codecs(s), n_pages = kvs_study_n_pages(s);
    int32_t per_codec = (n_codecs > 0 ? n_codecs : 1) * (n_pages > 0 ? n_pages : 1); /* runs per (policy, budget) */
    int64_t pairs = (int64_t)kvs_study_n_traces(s) * kvs_study_n_policies(s) * per_codec * kvs_study_n_budgets(s);
    char codecs[96] = "";
    int cl = n_codecs > 0 ? snprintf(codecs, sizeof codecs, " x %d codecs", n_codecs) : 0;
    if (n_pages > 0) snprintf(codecs + cl, sizeof codecs - (size_t)cl, " x %d page sizes", n_pages);
    printf("# study %s: %d traces x %d policies%s x %d budgets = %lld runs in %d tasks\n", kvs_study_name(s),
           kvs_study_n_traces(s), kvs_study_n_policies(s), codecs, kvs_study_n_budgets(s), (long long)pairs, n);
    printf(estimate ? "task\ttrace\truns\twork_gmac\tmem_mib\tpolicies\n" : "task\ttrace\truns\tpolicies\n");
    double total = 0, max_mem = 0;
    for (int32_t i = 0; i < n; i++) {
        const kvs_study_task *t = kvs_study_task_get(s, i);
        char configs[4096];
        task_configs(s, t, configs, sizeof configs);
        int runs = (t->policy_end - t->policy_begin) * per_codec * kvs_study_n_budgets(s);
        if (estimate)
            printf("%d\t%s\t%d\t%.3f\t%.1f\t%s\n", i, kvs_study_trace_path(s, t->trace), runs, t->work / 1e9,
                   t->mem_bytes / 1048576.0, configs);
        else
            printf("%d\t%s\t%d\t%s\n", i, kvs_study_trace_path(s, t->trace), runs, configs);
        total += t->work;
        if (t->mem_bytes > max_mem) max_mem = t->mem_bytes;
    }
    if (estimate)
        printf("# total %.3f GMAC; largest task memory %.1f MiB (request it per Slurm array element, with margin)\n",
               total / 1e9, max_mem / 1048576.0);
    return kvs_cli_finish_stdout("sweep");
}

/* "I:J" -> [lo, hi) within [0, n]. */
static int parse_range(const char *v, int32_t n, long *lo, long *hi) {
    char a[32];
    const char *colon = strchr(v, ':');
    if (!colon || (size_t)(colon - v) >= sizeof a) return -1;
    memcpy(a, v, (size_t)(colon - v));
    a[colon - v] = '\0';
    if (kvs_cli_parse_long("--tasks", a, 0, n, lo) != KVS_OK) return -1;
    if (kvs_cli_parse_long("--tasks", colon + 1, *lo, n, hi) != KVS_OK) return -1;
    return 0;
}

typedef char folder_db[4096]; /* a database path in the --db folder */

/* The one spelling of a rank's shard: DIR/shard-RANK.db (dir "" gives the file name alone). */
static void shard_path_of(folder_db out, const char *dir, int rank) {
    snprintf(out, sizeof(folder_db), "%sshard-%d.db", dir, rank);
}

/* The merged database of the folder: DIR/study.db. */
static void study_db_of(folder_db out, const char *dir) { snprintf(out, sizeof(folder_db), "%sstudy.db", dir); }

/* N when `name` is shard-N.db exactly as shard_path_of spells it, else -1 (shard-1.db-wal, shard-03.db). */
static int shard_rank_of(const char *name) {
    int r = -1, end = 0;
    if (sscanf(name, "shard-%d.db%n", &r, &end) != 1 || name[end] != '\0' || r < 0) return -1;
    folder_db canon;
    shard_path_of(canon, "", r);
    return strcmp(canon, name) ? -1 : r;
}

/* The shard databases in DIR: every DIR/shard-N.db (N a rank number, any N: an earlier run may have had more ranks
 * than this one), sorted by N. *paths: malloc'd, *n entries. @return KVS_OK, or KVS_ERR_NOMEM (a folder that cannot
 * be read has none). */
static kvs_status list_shards(const char *dir, folder_db **paths, int *n) {
    *paths = NULL;
    *n = 0;
    DIR *dp = opendir(dir);
    if (!dp) return KVS_OK;
    int32_t *ranks = NULL;
    int cap = 0, m = 0;
    kvs_status st = KVS_OK;
    for (struct dirent *e; (e = readdir(dp));) {
        int r = shard_rank_of(e->d_name);
        if (r < 0) continue;
        if (m == cap) {
            int32_t *grown = realloc(ranks, (size_t)(cap = cap ? 2 * cap : 16) * sizeof *ranks);
            if (!grown) {
                st = kvs_fail(KVS_ERR_NOMEM, "out of memory");
                break;
            }
            ranks = grown;
        }
        ranks[m++] = r;
    }
    closedir(dp);
    if (st == KVS_OK && m > 0) {
        kvs_sort_positions(ranks, (size_t)m); /* ascending */
        if (!(*paths = malloc((size_t)m * sizeof **paths))) st = kvs_fail(KVS_ERR_NOMEM, "out of memory");
        for (int i = 0; st == KVS_OK && i < m; i++) shard_path_of((*paths)[i], dir, ranks[i]);
        if (st == KVS_OK) *n = m;
    }
    free(ranks);
    return st;
}

/* Which tasks an earlier run of this sweep completed in any database of DIR (study.db or any rank's shard): a
 * resumed sweep skips them whichever rank ran them (before, a task was skipped only when the rank that drew it
 * this time had run it last time, so a resume under dynamic distribution re-ran most completed tasks and the merge
 * dropped the duplicates). A database that cannot be read is left out with a warning: what it holds runs again.
 * @return skip[n_tasks] (1 = complete), or NULL when nothing is complete or memory ran out. */
static unsigned char *completed_tasks(const kvs_study *s, const char *dir) {
    folder_db *shards = NULL;
    int n_shards = 0;
    if (list_shards(dir, &shards, &n_shards) != KVS_OK) return NULL;
    folder_db study_db;
    study_db_of(study_db, dir);
    int n_db = 0;
    kvs_results_db **dbs = calloc((size_t)n_shards + 1, sizeof *dbs);
    const char **db_paths = calloc((size_t)n_shards + 1, sizeof *db_paths);
    for (int i = -1; dbs && db_paths && i < n_shards; i++) {
        const char *path = i < 0 ? study_db : shards[i];
        if (access(path, F_OK) != 0) continue;
        if (kvs_results_open_readonly(path, &dbs[n_db]) == KVS_OK) db_paths[n_db++] = path;
        else fprintf(stderr, "kvsim sweep: warning: %s: %s: its tasks are not counted as complete\n", path, kvs_last_error());
    }
    int32_t n_tasks = kvs_study_n_tasks(s), n_traces = kvs_study_n_traces(s);
    unsigned char *skip = n_db > 0 ? calloc((size_t)n_tasks, 1) : NULL;
    char(*sha)[65] = skip ? calloc((size_t)n_traces, sizeof *sha) : NULL; /* each trace hashed once, "" = not yet */
    int any = 0;
    for (int32_t i = 0; sha && i < n_tasks; i++) {
        const kvs_study_task *t = kvs_study_task_get(s, i);
        if (!sha[t->trace][0] && kvs_sha256_file_hex(kvs_study_trace_path(s, t->trace), sha[t->trace]) != KVS_OK) {
            sha[t->trace][0] = '\0'; /* unreadable: the task runs and reports it */
            continue;
        }
        char configs[4096], key[65];
        task_configs(s, t, configs, sizeof configs);
        task_key(s, t, sha[t->trace], configs, key);
        for (int k = 0; k < n_db && !skip[i]; k++) {
            int done = 0;
            if (kvs_results_sweep_task_done(dbs[k], key, &done) == KVS_OK && done) {
                skip[i] = 1;
                any = 1;
                fprintf(stderr, "kvsim sweep: task %d (%s: %s) already complete in %s: skipped\n", i,
                        kvs_study_trace_path(s, t->trace), configs, db_paths[k]);
            }
        }
    }
    for (int k = 0; k < n_db; k++) kvs_results_close(dbs[k]);
    free(dbs);
    free(db_paths);
    free(sha);
    free(shards);
    if (!any) {
        free(skip);
        return NULL;
    }
    return skip;
}

#ifdef KVS_WITH_MPI
/* Dynamic distribution under MPI: rank 0's main thread is a dispatcher that answers every other rank's request for
 * a task with the next task index (-1: none left, or a task failed somewhere), while a worker thread of rank 0 takes
 * tasks from the same counter. Not a one-sided counter (MPI_Fetch_and_op on a window of rank 0): where
 * Open MPI's window is not in shared memory (osc/pt2pt, e.g. between nodes over TCP) a request is served only when
 * rank 0 enters MPI, so the other ranks would stall for the length of rank 0's task (sim/BENCH.md "Sharded sweep"). The
 * dispatcher polls every millisecond and never computes, so a request waits at most that long. Only the main
 * thread calls MPI (MPI_THREAD_FUNNELED). */
enum { TAG_REQUEST = 1, TAG_REPLY = 2 };

typedef struct {
    const kvs_study *s;
    const char *shard;
    const unsigned char *skip; /* [n_tasks] complete in DIR already (completed_tasks), or NULL */
    atomic_long next;  /* the next task to hand out */
    atomic_int failed; /* a task failed on some rank: hand out no more (the error ends the sweep early) */
} dispatcher;

/* The next task for anyone, or -1. */
static long dispatch_take(dispatcher *d) {
    if (atomic_load(&d->failed)) return -1;
    long n = kvs_study_n_tasks(d->s), t;
    while ((t = atomic_fetch_add(&d->next, 1)) < n && d->skip && d->skip[t]) {}
    return t < n ? t : -1;
}

static void *rank0_worker(void *arg) {
    dispatcher *d = arg;
    for (long t; (t = dispatch_take(d)) >= 0;)
        if (run_task(d->s, (int32_t)t, d->shard, 0) != KVS_EXIT_OK) atomic_store(&d->failed, 1);
    return NULL;
}

/* Rank 0: serves the other ranks' requests until each was told "no more", computing beside in a worker thread.
 * A request carries 1 when the requester's previous task failed. `compute`: whether rank 0 may start a thread
 * (MPI_THREAD_FUNNELED provided). @return 1 when a task failed anywhere. */
static int serve_tasks(const kvs_study *s, const char *shard, const unsigned char *skip, int size, int failed,
                       int compute) {
    dispatcher d = {.s = s, .shard = shard, .skip = skip};
    atomic_init(&d.next, 0);
    atomic_init(&d.failed, failed);
    pthread_t worker;
    int have_worker = compute && pthread_create(&worker, NULL, rank0_worker, &d) == 0;
    if (!have_worker) fprintf(stderr, "kvsim sweep: rank 0 only dispatches (no worker thread)\n");
    if (!have_worker && size == 1) rank0_worker(&d); /* nobody else would compute */
    for (int active = size - 1; active > 0;) {
        int msg = 0, flag = 0;
        MPI_Request req;
        MPI_Status status;
        MPI_Irecv(&msg, 1, MPI_INT, MPI_ANY_SOURCE, TAG_REQUEST, MPI_COMM_WORLD, &req);
        while (MPI_Test(&req, &flag, &status), !flag) nanosleep(&(struct timespec){0, 1000000}, NULL);
        if (msg) atomic_store(&d.failed, 1);
        long t = dispatch_take(&d);
        MPI_Send(&t, 1, MPI_LONG, status.MPI_SOURCE, TAG_REPLY, MPI_COMM_WORLD);
        if (t < 0) active--;
    }
    if (have_worker) pthread_join(worker, NULL);
    return atomic_load(&d.failed);
}

/* Ranks other than 0: ask rank 0 for tasks until it says none is left. @return 1 when a task of this rank failed. */
static int request_tasks(const kvs_study *s, const char *shard, int rank, int failed) {
    int msg = failed;
    for (;;) {
        long t = -1;
        MPI_Send(&msg, 1, MPI_INT, 0, TAG_REQUEST, MPI_COMM_WORLD);
        MPI_Recv(&t, 1, MPI_LONG, 0, TAG_REPLY, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        if (t < 0) break;
        if (run_task(s, (int32_t)t, shard, rank) != KVS_EXIT_OK) msg = failed = 1;
    }
    return failed;
}
#endif

/* --db DIR/: every task over the processes (MPI ranks, or this one process), one shard each, rank 0 merging. */
static int run_sharded(const kvs_study *s, const char *dir) {
    int rank = 0, failed = 0;
#ifdef KVS_WITH_MPI
    int provided = 0, size = 1;
    MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
#endif
    folder_db shard;
    shard_path_of(shard, dir, rank);
    if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
        fprintf(stderr, "kvsim sweep: %s: cannot create the folder: %s\n", dir, strerror(errno));
        failed = 1;
    }
    /* rank 0 (the one that hands out tasks) looks up what earlier runs completed, before any rank writes */
    unsigned char *skip = rank == 0 && !failed ? completed_tasks(s, dir) : NULL;
#ifdef KVS_WITH_MPI
    /* without MPI_THREAD_FUNNELED rank 0 starts no thread: it only dispatches, the others compute */
    failed = rank == 0 ? serve_tasks(s, shard, skip, size, failed, provided >= MPI_THREAD_FUNNELED)
                       : request_tasks(s, shard, rank, failed);
#else
    for (int32_t i = 0; !failed && i < kvs_study_n_tasks(s); i++)
        if (!(skip && skip[i]) && run_task(s, i, shard, rank) != KVS_EXIT_OK) failed = 1;
#endif
    free(skip);
    int any_failed = failed;
#ifdef KVS_WITH_MPI
    MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
#endif
    int rc = any_failed ? KVS_EXIT_FAIL : KVS_EXIT_OK;
    if (any_failed && rank == 0)
        fprintf(stderr, "kvsim sweep: a task failed: no merge; the shards in %s keep the completed tasks, run the "
                        "same command again to resume\n", dir);
    if (rank == 0 && !any_failed) {
        folder_db out;
        study_db_of(out, dir);
        /* every shard in the folder: this run's ranks' (a rank that got no task wrote none) and an earlier run's
         * with more ranks, whose completed tasks this run skipped */
        folder_db *paths = NULL;
        int n_in = 0;
        kvs_status st = list_shards(dir, &paths, &n_in);
        const char **inputs = st == KVS_OK ? calloc((size_t)n_in + 1, sizeof *inputs) : NULL;
        if (st == KVS_OK && !inputs) st = kvs_fail(KVS_ERR_NOMEM, "out of memory");
        for (int r = 0; inputs && r < n_in; r++) inputs[r] = paths[r];
        kvs_results_merge_stats ms;
        double t0 = kvs_now_s();
        if (st == KVS_OK) st = kvs_results_merge(out, inputs, n_in, &ms);
        if (st != KVS_OK) rc = kvs_cli_fail("sweep", st);
        else
            fprintf(stderr, "kvsim sweep: merged %d shards into %s in %.2f s: %lld runs (%lld duplicates dropped)\n",
                    n_in, out, kvs_now_s() - t0, (long long)ms.runs_copied, (long long)ms.runs_duplicate);
        free(paths);
        free(inputs);
    }
#ifdef KVS_WITH_MPI
    MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
    MPI_Finalize();
#endif
    return rc;
}

int kvs_cmd_sweep(int argc, char **argv) {
    const char *study_path = NULL, *db_path = NULL, *task_text = NULL, *tasks_text = NULL;
    const char *codec_specs[16]; /* study.c's limit too */
    const char *page_text = NULL;
    int list = 0, estimate = 0, n_codec_specs = 0, codec_limit = 0;
    for (int i = 1; i < argc; i++) {
        int m = 0, r;
        const char *v;
        if (kvs_cli_is_help(argv[i])) {
            usage(stdout);
            return KVS_EXIT_OK;
        }
        if ((r = kvs_cli_single_value("sweep", "--db", argc, argv, &i, &m, &db_path)) || m) {
            if (r < 0) return KVS_EXIT_USAGE;
            if (!r) return kvs_cli_usage_error("sweep", "--db needs a FILE or DIR/");
        } else if ((r = kvs_cli_single_value("sweep", "--task", argc, argv, &i, &m, &task_text)) || m) {
            if (r < 0) return KVS_EXIT_USAGE;
            if (!r) return kvs_cli_usage_error("sweep", "--task needs I");
        } else if ((r = kvs_cli_single_value("sweep", "--tasks", argc, argv, &i, &m, &tasks_text)) || m) {
            if (r < 0) return KVS_EXIT_USAGE;
            if (!r) return kvs_cli_usage_error("sweep", "--tasks needs I:J");
        } else if ((r = kvs_cli_single_value("sweep", "--page", argc, argv, &i, &m, &page_text)) || m) {
            if (r < 0) return KVS_EXIT_USAGE;
            if (!r) return kvs_cli_usage_error("sweep", "--page needs a LIST");
        } else if ((v = kvs_cli_opt_value("--codec", argc, argv, &i, &m)) || m) {
            if (!v) return kvs_cli_usage_error("sweep", "--codec needs a SPEC");
            if (n_codec_specs == (int)(sizeof codec_specs / sizeof codec_specs[0])) codec_limit = 1;
            else codec_specs[n_codec_specs++] = v;
        } else if (!strcmp(argv[i], "--list-tasks")) {
            if (kvs_cli_once("sweep", "--list-tasks", &list)) return KVS_EXIT_USAGE;
        } else if (!strcmp(argv[i], "--estimate")) {
            if (kvs_cli_once("sweep", "--estimate", &estimate)) return KVS_EXIT_USAGE;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            return kvs_cli_usage_error("sweep", "unknown option '%s'", argv[i]);
        } else {
            if (study_path) return kvs_cli_usage_error("sweep", "unexpected argument '%s'", argv[i]);
            study_path = argv[i];
        }
    }
    if (!study_path) return kvs_cli_usage_error("sweep", "missing STUDY");
    if (estimate && !list) return kvs_cli_usage_error("sweep", "--estimate goes with --list-tasks");
    if (list && (db_path || task_text || tasks_text))
        return kvs_cli_usage_error("sweep", "--list-tasks runs nothing: no --db, --task or --tasks with it");
    if (!list && !db_path) return kvs_cli_usage_error("sweep", "missing --db OUT.db (or --list-tasks)");
    if (task_text && tasks_text) return kvs_cli_usage_error("sweep", "--task and --tasks together");
    size_t dl = db_path ? strlen(db_path) : 0;
    int sharded = dl && db_path[dl - 1] == '/';
    if (sharded && (task_text || tasks_text))
        return kvs_cli_usage_error("sweep", "--db DIR/ runs every task: no --task or --tasks with it");
    if (codec_limit) return kvs_cli_usage_error("sweep", "at most %d --codec options", n_codec_specs);

    kvs_study *s = NULL;
    int rc;
    kvs_status st = kvs_study_load(study_path, &s);
    int bad_codec = 0;
    if (st == KVS_OK && n_codec_specs) bad_codec = (st = kvs_study_set_codecs(s, codec_specs, n_codec_specs)) != KVS_OK;
    if (st == KVS_OK && page_text) bad_codec = (st = kvs_study_set_pages(s, page_text)) != KVS_OK;
    if (st != KVS_OK) {
        kvs_study_free(s);
        rc = kvs_cli_fail("sweep", st);
        return bad_codec ? KVS_EXIT_FAIL : rc; /* a codec spec or page list that does not parse is a bad value, as in
                                                * replay */
    }
    long lo = 0, hi = kvs_study_n_tasks(s);
    if (list) {
        rc = list_tasks(s, estimate);
    } else if (sharded) {
        rc = run_sharded(s, db_path);
    } else if ((task_text && kvs_cli_parse_long("--task", task_text, 0, hi - 1, &lo) != KVS_OK) ||
               (tasks_text && parse_range(tasks_text, kvs_study_n_tasks(s), &lo, &hi) != 0)) {
        rc = kvs_cli_usage_error("sweep", "%s (the study has %d tasks)",
                                 tasks_text && !strchr(tasks_text, ':') ? "--tasks needs I:J" : kvs_last_error(),
                                 kvs_study_n_tasks(s));
    } else {
        if (task_text) hi = lo + 1;
        rc = KVS_EXIT_OK;
        for (long i = lo; i < hi; i++)
            if (run_task(s, (int32_t)i, db_path, 0) != KVS_EXIT_OK) rc = KVS_EXIT_FAIL;
    }
    kvs_study_free(s);
    return rc;
}
