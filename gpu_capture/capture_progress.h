/* capture_progress.h — the progress line of `kvsim capture` (capture.h, opts.progress): positions done,
 * the rate and estimated time left of each phase (prefill = prompt positions, decode = generated ones),
 * the trace's size so far and the time elapsed.
 *
 * Pure bookkeeping on a clock the caller passes in (seconds), so the numbers are tested on a fake clock
 * (tests/test_capture_progress.c); capture.c feeds it kvs_now_s() and prints the line.
 *
 * Estimates: the rate shown is the phase's positions done over the time spent on them, over all turns so
 * far (a prompt position and a generated one cost about the same on the CPU, but not on CUDA, where a prompt
 * is one batched prefill: the two phases are timed apart). The ETAs use each phase's own timings too, as a
 * cost per position linear in the position (a + b * position, least squares), because attention over the
 * context makes later positions dearer: on a model whose attention dominates (4 layers of dim 512, 8192
 * positions) the mean rate after 2 s predicted 1:26 for a capture that took over 5 minutes. The phase's
 * ETA covers the turn's positions left in that phase; the whole capture's adds every position left, each
 * phase's from its own fit, and is unknown ("--") while a phase with positions left has no timing yet:
 * before the first generated token, the decode cost is not guessed from the prefill's. The plan assumes
 * every turn generates its --steps tokens; an end token or max positions can end the capture sooner.
 */
#ifndef KVS_CAPTURE_PROGRESS_H
#define KVS_CAPTURE_PROGRESS_H

#include <stddef.h>
#include <stdint.h>

typedef enum { KVS_CAPTURE_PREFILL = 0, KVS_CAPTURE_DECODE = 1 } kvs_capture_phase;

typedef struct {
    int64_t planned[2];      /* positions planned for the whole capture, per phase */
    int64_t done[2];         /* positions done, per phase */
    double seconds[2];       /* time spent on them, per phase */
    double fit[2][5];        /* per phase, over its positions x with cost y s each, weight w: sums of w, w x,
                                w x^2, w y, w x y (the least-squares fit of y = a + b x) */
    int64_t turn_planned[2]; /* the current turn's */
    int64_t turn_done[2];
    const int64_t *prompt_len; /* borrowed [n_turns]: the later turns' plan is rebuilt from it after a turn
                                  ends early (an end token) */
    int64_t steps, max_positions, pos; /* pos: positions done */
    int phase, turn, n_turns;
    double t0, t_last;
} kvs_capture_progress;

/* Estimates at one moment; a negative value is unknown. */
typedef struct {
    double rate;      /* positions per second of the current phase */
    double eta_phase; /* seconds left in the current phase of the current turn */
    double eta_total; /* seconds left in the whole capture */
    double elapsed;   /* seconds since the start */
} kvs_capture_eta;

/*! kvs_capture_progress_start() : starts the bookkeeping at time `now` for n_turns turns of prompt_len[t]
 *  prompt positions, each followed by `steps` generated ones, all within max_positions (a turn's prompt and
 *  generation are cut where the capture loop cuts them). */
void kvs_capture_progress_start(kvs_capture_progress *p, double now, const int64_t *prompt_len, int n_turns,
                                int64_t steps, int64_t max_positions);

/*! kvs_capture_progress_turn() : turn `turn` (from 0) starts with prompt_len prompt positions. */
void kvs_capture_progress_turn(kvs_capture_progress *p, int turn, int64_t prompt_len);

/*! kvs_capture_progress_add() : n positions of `phase` finished at time `now` (the time since the previous
 *  call, or the start, is theirs). */
void kvs_capture_progress_add(kvs_capture_progress *p, kvs_capture_phase phase, int64_t n, double now);

/*! kvs_capture_progress_estimate() : the rate and ETAs of the positions done so far, elapsed time at `now`. */
void kvs_capture_progress_estimate(const kvs_capture_progress *p, double now, kvs_capture_eta *e);

/*! kvs_capture_progress_format() : the line, without "\r" or "\n", e.g.
 *  "capture: decode (turn 2/3) 40/64, 312/495 positions, 85.3 tok/s, ETA decode 0:02 total 0:05,
 *  trace 1.23 MB, 0:10 elapsed". @return what snprintf returns. */
int kvs_capture_progress_format(const kvs_capture_progress *p, double now, uint64_t trace_bytes, char *buf,
                                size_t cap);

/*! kvs_capture_progress_duration() : seconds as "m:ss" (under an hour) or "h:mm:ss", rounded to the second;
 *  "--" when negative (unknown). buf holds at least 16 bytes. */
void kvs_capture_progress_duration(double seconds, char *buf, size_t cap);

#endif /* KVS_CAPTURE_PROGRESS_H */
