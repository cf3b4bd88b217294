/* capture_progress.c — the progress line's bookkeeping and text (capture_progress.h): plan, rates, ETAs. */
#include "capture_progress.h"

#include <stdio.h>
#include <string.h>

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* Positions of each phase that the turns after the current one will feed, starting from position `from`,
 * cut at max_positions as the capture loop cuts them. */
static void plan_rest(const kvs_capture_progress *p, const int64_t *prompt_len, int64_t from, int64_t out[2]) {
    out[0] = out[1] = 0;
    int64_t pos = from;
    for (int t = p->turn + 1; t < p->n_turns; t++) {
        int64_t a = min64(prompt_len[t], p->max_positions - pos);
        pos += a;
        int64_t b = min64(p->steps, p->max_positions - pos);
        pos += b;
        out[0] += a;
        out[1] += b;
    }
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
    plan_rest(p, prompt_len, 0, p->planned);
}

void kvs_capture_progress_turn(kvs_capture_progress *p, int turn, int64_t prompt_len) {
    p->turn = turn;
    p->turn_planned[0] = min64(prompt_len, p->max_positions - p->pos);
    p->turn_planned[1] = min64(p->steps, p->max_positions - p->pos - p->turn_planned[0]);
    p->turn_done[0] = p->turn_done[1] = 0;
    p->phase = p->turn_planned[0] > 0 ? KVS_CAPTURE_PREFILL : KVS_CAPTURE_DECODE; /* what comes next */
}

void kvs_capture_progress_add(kvs_capture_progress *p, kvs_capture_phase phase, int64_t n, double now) {
    p->phase = phase;
    p->done[phase] += n;
    p->turn_done[phase] += n;
    p->seconds[phase] += now - p->t_last;
    p->t_last = now;
    p->pos += n;
}

/* Positions left per phase: the current turn's, then the later turns' plan from where this one will end. */
static void left_positions(const kvs_capture_progress *p, int64_t left[2]) {
    int64_t cur[2], rest[2];
    for (int k = 0; k < 2; k++) {
        cur[k] = p->turn_planned[k] - p->turn_done[k];
        if (cur[k] < 0) cur[k] = 0;
    }
    plan_rest(p, p->prompt_len, p->pos + cur[0] + cur[1], rest);
    for (int k = 0; k < 2; k++) left[k] = cur[k] + rest[k];
}

static double phase_rate(const kvs_capture_progress *p, int phase) {
    return p->done[phase] > 0 && p->seconds[phase] > 0 ? (double)p->done[phase] / p->seconds[phase] : -1.0;
}

void kvs_capture_progress_estimate(const kvs_capture_progress *p, double now, kvs_capture_eta *e) {
    int64_t left[2];
    left_positions(p, left);
    e->elapsed = now - p->t0;
    e->rate = phase_rate(p, p->phase);
    int64_t turn_left = p->turn_planned[p->phase] - p->turn_done[p->phase];
    e->eta_phase = turn_left <= 0 ? 0.0 : e->rate > 0 ? (double)turn_left / e->rate : -1.0;
    e->eta_total = 0.0;
    for (int k = 0; k < 2; k++) {
        if (left[k] <= 0) continue;
        double r = phase_rate(p, k);
        if (r <= 0) { /* a phase still to come, never timed: no estimate rather than a wrong one */
            e->eta_total = -1.0;
            break;
        }
        e->eta_total += (double)left[k] / r;
    }
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
    left_positions(p, left);
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
