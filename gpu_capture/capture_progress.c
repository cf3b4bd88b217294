/* capture_progress.c — the progress line's bookkeeping and text (capture_progress.h): plan, rates, ETAs. */
#include "capture_progress.h"

#include <stdio.h>
#include <string.h>

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* Seconds that n positions of `phase` from position lo on will take, from the cost per position fitted as
 * a + b * position over the phase's positions so far (weighted least squares on the sums add() keeps; b < 0,
 * from noise or a slow start, is taken as 0, which leaves the phase's mean). 0 for n = 0; -1 when the phase
 * has no timed position yet. */
static double span_seconds(const kvs_capture_progress *p, int phase, int64_t lo, int64_t n) {
    if (n <= 0) return 0.0;
    const double *f = p->fit[phase]; /* sums of w, w x, w x^2, w y, w x y */
    if (p->done[phase] <= 0 || !(p->seconds[phase] > 0)) return -1.0;
    double a = f[3] / f[0], b = 0.0, var = f[0] * f[2] - f[1] * f[1];
    if (var > 1e-9 * f[0] * f[2]) {
        b = (f[0] * f[4] - f[1] * f[3]) / var;
        if (b > 0) a = (f[3] - b * f[1]) / f[0];
        else b = 0.0;
    }
    double t = a * (double)n + b * (double)n * ((double)lo + (double)(lo + n - 1)) / 2.0;
    return t > 0 ? t : 0.0;
}

/* Walks the plan from the current position: the current turn's positions left in each phase, then the later
 * turns' prompts and generations, cut at max_positions as the capture loop cuts them. left[k]: positions of
 * phase k; *secs: their time by span_seconds, -1 when a phase with positions left has no timing (may be NULL). */
static void plan_rest(const kvs_capture_progress *p, int64_t left[2], double *secs) {
    int64_t pos = p->pos;
    double total = 0.0;
    left[0] = left[1] = 0;
    for (int t = p->turn < 0 ? 0 : p->turn; t < p->n_turns; t++) {
        int64_t n[2];
        for (int k = 0; k < 2; k++) {
            if (t == p->turn) n[k] = p->turn_planned[k] - p->turn_done[k];
            else n[k] = min64(k == 0 ? p->prompt_len[t] : p->steps, p->max_positions - pos);
            if (n[k] < 0) n[k] = 0;
            double ts = span_seconds(p, k, pos, n[k]);
            total = total < 0 || ts < 0 ? -1.0 : total + ts;
            left[k] += n[k];
            pos += n[k];
        }
    }
    if (secs) *secs = total;
}

void kvs_capture_progress_start(kvs_capture_progress *p, double now, const int64_t *prompt_len, int n_turns,
                                int64_t steps, int64_t max_positions) {
    memset(p, 0, sizeof *p);
    p->steps = steps;
    p->max_positions = max_positions;
    p->n_turns = n_turns;
    p->turn = -1;
    p->t0 = p->t_last = now;
    p->prompt_len = prompt_len;
    plan_rest(p, p->planned, NULL);
}

void kvs_capture_progress_turn(kvs_capture_progress *p, int turn, int64_t prompt_len) {
    p->turn = turn;
    p->turn_planned[0] = min64(prompt_len, p->max_positions - p->pos);
    p->turn_planned[1] = min64(p->steps, p->max_positions - p->pos - p->turn_planned[0]);
    p->turn_done[0] = p->turn_done[1] = 0;
    p->phase = p->turn_planned[0] > 0 ? KVS_CAPTURE_PREFILL : KVS_CAPTURE_DECODE; /* what comes next */
}

void kvs_capture_progress_add(kvs_capture_progress *p, kvs_capture_phase phase, int64_t n, double now) {
    double x = (double)p->pos + (double)(n - 1) / 2.0, w = (double)n, y = (now - p->t_last) / w;
    double *f = p->fit[phase]; /* a batch (a CUDA prefill) is one point: its mean position and cost, weight n */
    f[0] += w;
    f[1] += w * x;
    f[2] += w * x * x;
    f[3] += w * y;
    f[4] += w * x * y;
    p->phase = phase;
    p->done[phase] += n;
    p->turn_done[phase] += n;
    p->seconds[phase] += now - p->t_last;
    p->t_last = now;
    p->pos += n;
}

static double phase_rate(const kvs_capture_progress *p, int phase) {
    return p->done[phase] > 0 && p->seconds[phase] > 0 ? (double)p->done[phase] / p->seconds[phase] : -1.0;
}

void kvs_capture_progress_estimate(const kvs_capture_progress *p, double now, kvs_capture_eta *e) {
    int64_t left[2];
    e->elapsed = now - p->t0;
    e->rate = phase_rate(p, p->phase);
    int64_t turn_left = p->turn_planned[p->phase] - p->turn_done[p->phase];
    /* the current phase's positions left come first, from the current position (prefill: decode follows it) */
    e->eta_phase = turn_left <= 0 ? 0.0 : span_seconds(p, p->phase, p->pos, turn_left);
    plan_rest(p, left, &e->eta_total); /* a phase still to come, never timed: no estimate rather than a wrong one */
}

void kvs_capture_progress_duration(double seconds, char *buf, size_t cap) {
    if (seconds < 0) {
        snprintf(buf, cap, "--");
        return;
    }
    long long s = (long long)(seconds + 0.5);
    if (s < 3600) snprintf(buf, cap, "%lld:%02lld", s / 60, s % 60);
    else snprintf(buf, cap, "%lld:%02lld:%02lld", s / 3600, s / 60 % 60, s % 60);
}

int kvs_capture_progress_format(const kvs_capture_progress *p, double now, uint64_t trace_bytes, char *buf,
                                size_t cap) {
    kvs_capture_eta e;
    kvs_capture_progress_estimate(p, now, &e);
    int64_t left[2];
    plan_rest(p, left, NULL);
    char turn[48] = "", rate[32], eta_phase[24], eta_total[24], elapsed[24];
    if (p->n_turns > 1) snprintf(turn, sizeof turn, " (turn %d/%d)", p->turn + 1, p->n_turns);
    if (e.rate > 0) snprintf(rate, sizeof rate, "%.1f", e.rate);
    else snprintf(rate, sizeof rate, "--");
    kvs_capture_progress_duration(e.eta_phase, eta_phase, sizeof eta_phase);
    kvs_capture_progress_duration(e.eta_total, eta_total, sizeof eta_total);
    kvs_capture_progress_duration(e.elapsed, elapsed, sizeof elapsed);
    const char *name = p->phase == KVS_CAPTURE_DECODE ? "decode" : "prefill";
    return snprintf(buf, cap,
                    "capture: %s%s %lld/%lld, %lld/%lld positions, %s tok/s, ETA %s %s total %s, trace %.2f MB, "
                    "%s elapsed",
                    name, turn, (long long)p->turn_done[p->phase], (long long)p->turn_planned[p->phase],
                    (long long)p->pos, (long long)(p->pos + left[0] + left[1]), rate, name, eta_phase, eta_total,
                    (double)trace_bytes / 1e6, elapsed);
}
