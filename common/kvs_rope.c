/* kvs_rope.c — RoPE, its inverse, R̄ and a Jacobi eigen-solver (see kvs_rope.h; POLICY_SPEC_2 §1.1-§1.2). */
#include "kvs_rope.h"

#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static int name_says_llama3(const char *name) {
    char low[64];
    size_t i = 0;
    for (; name && name[i] && i + 1 < sizeof low; i++) low[i] = (char)tolower((unsigned char)name[i]);
    low[i] = 0;
    return strstr(low, "llama-3") || strstr(low, "llama3") || strstr(low, "llama_3");
}

kvs_status kvs_rope_scaling_of(kvs_rope_scaling_choice choice, const char *model_name, const char *who,
                               kvs_rope_scaling *sc) {
    memset(sc, 0, sizeof *sc);
    /* the Llama-3.x config.json rope_scaling blocks */
    if (choice == KVS_ROPE_SCALING_LLAMA31) *sc = (kvs_rope_scaling){.factor = 8, .low = 1, .high = 4, .orig = 8192};
    if (choice == KVS_ROPE_SCALING_LLAMA32) *sc = (kvs_rope_scaling){.factor = 32, .low = 1, .high = 4, .orig = 8192};
    if (choice == KVS_ROPE_SCALING_AUTO && name_says_llama3(model_name))
        return kvs_fail(KVS_ERR_INVALID_ARG,
                        "%s: model %s looks like Llama-3, whose RoPE scaling the trace does not record: give "
                        "rope_scaling=llama31, llama32 or none", who, model_name);
    return KVS_OK;
}

void kvs_rope_freqs(double theta_b, int d, const kvs_rope_scaling *sc, double *freq) {
    for (int i = 0; i < d / 2; i++) {
        double f = pow(theta_b, -2.0 * i / (double)d);
        if (sc && sc->factor > 0) {
            /* the same arithmetic as gpu_capture/model.c finish_config, so a pre-RoPE vector is recovered exactly */
            double lo_wl = sc->orig / sc->low, hi_wl = sc->orig / sc->high, wl = 2.0 * M_PI / f;
            if (wl > lo_wl) {
                f = f / sc->factor;
            } else if (wl >= hi_wl) {
                double sm = (sc->orig / wl - sc->low) / (sc->high - sc->low);
                f = (1.0 - sm) * f / sc->factor + sm * f;
            }
        }
        freq[i] = (double)(float)f;
    }
}

void kvs_rope_pair(int d, int layout, int i, int *a, int *b) {
    *a = layout == 0 ? 2 * i : i;
    *b = layout == 0 ? 2 * i + 1 : i + d / 2;
}

void kvs_rope_apply(float *v, int d, int layout, int64_t pos, const double *freq) {
    for (int i = 0; i < d / 2; i++) {
        double ang = (double)pos * freq[i];
        float c = (float)cos(ang), s = (float)sin(ang);
        int a, b;
        kvs_rope_pair(d, layout, i, &a, &b);
        float x0 = v[a], x1 = v[b];
        v[a] = x0 * c - x1 * s;
        v[b] = x0 * s + x1 * c;
    }
}

void kvs_rope_invert(const float *in, float *out, int d, int layout, int64_t pos, const double *freq) {
    for (int i = 0; i < d / 2; i++) {
        double ang = (double)pos * freq[i];
        /* capture's fp32 cos/sin: c^2 + s^2 = 1 to fp32 precision, so R^T undoes R to within an ulp */
        double c = (float)cos(ang), s = (float)sin(ang);
        int a, b;
        kvs_rope_pair(d, layout, i, &a, &b);
        double y0 = in[a], y1 = in[b];
        out[a] = (float)(y0 * c + y1 * s);
        out[b] = (float)(-y0 * s + y1 * c);
    }
}

void kvs_rope_invert_f64(const double *in, double *out, int d, int layout, int64_t pos, const double *freq) {
    for (int i = 0; i < d / 2; i++) {
        double ang = (double)pos * freq[i], c = cos(ang), s = sin(ang);
        int a, b;
        kvs_rope_pair(d, layout, i, &a, &b);
        double y0 = in[a], y1 = in[b];
        out[a] = y0 * c + y1 * s;
        out[b] = -y0 * s + y1 * c;
    }
}

void kvs_rope_apply_f64(double *v, int d, int layout, int64_t pos, const double *freq) {
    for (int i = 0; i < d / 2; i++) {
        double ang = (double)pos * freq[i], c = cos(ang), s = sin(ang);
        int a, b;
        kvs_rope_pair(d, layout, i, &a, &b);
        double x0 = v[a], x1 = v[b];
        v[a] = x0 * c - x1 * s;
        v[b] = x0 * s + x1 * c;
    }
}

void kvs_rope_avg(int d, int64_t a, int64_t T, const double *freq, double *cbar, double *sbar) {
    for (int i = 0; i < d / 2; i++) {
        double th = freq[i], sh = sin(th / 2.0);
        if (fabs(sh) < 1e-300) {
            cbar[i] = cos((double)a * th);
            sbar[i] = sin((double)a * th);
            continue;
        }
        /* Dirichlet kernel: sum_{t=a}^{a+T-1} e^{i t th} = e^{i m} sin(T th/2) / sin(th/2), m the mean angle */
        double D = sin((double)T * th / 2.0) / ((double)T * sh), m = ((double)a + ((double)T - 1.0) / 2.0) * th;
        cbar[i] = D * cos(m);
        sbar[i] = D * sin(m);
    }
}

void kvs_rope_avg_apply(const double *x, double *out, int d, int layout, const double *cbar, const double *sbar) {
    for (int i = 0; i < d / 2; i++) {
        int a, b;
        kvs_rope_pair(d, layout, i, &a, &b);
        double x0 = x[a], x1 = x[b];
        out[a] = cbar[i] * x0 - sbar[i] * x1;
        out[b] = sbar[i] * x0 + cbar[i] * x1;
    }
}

kvs_status kvs_sym_eig(double *A, int n, double *w, double *V) {
    for (int r = 0; r < n; r++)
        for (int c = 0; c < n; c++) V[(size_t)r * n + c] = r == c ? 1.0 : 0.0;
    for (int sweep = 0; sweep < 100; sweep++) {
        double off = 0, tot = 0;
        for (int r = 0; r < n; r++)
            for (int c = 0; c < n; c++) {
                double x = A[(size_t)r * n + c] * A[(size_t)r * n + c];
                tot += x;
                if (r != c) off += x;
            }
        if (off <= 1e-30 * tot || off == 0) break;
        /* an element below 1e-17 of |A| moves no eigenvalue by more than rounding: zero it instead of rotating, so that
         * the sweeps end (the relative test above alone can stall at rounding level for large n) */
        double tiny = 1e-17 * sqrt(tot);
        int rotated = 0;
        for (int p = 0; p < n - 1; p++)
            for (int q = p + 1; q < n; q++) {
                double apq = A[(size_t)p * n + q];
                if (fabs(apq) <= tiny) {
                    A[(size_t)p * n + q] = A[(size_t)q * n + p] = 0;
                    continue;
                }
                rotated = 1;
                double app = A[(size_t)p * n + p], aqq = A[(size_t)q * n + q];
                double tau = (aqq - app) / (2.0 * apq);
                double t = (tau >= 0 ? 1.0 : -1.0) / (fabs(tau) + sqrt(1.0 + tau * tau));
                double c = 1.0 / sqrt(1.0 + t * t), s = t * c;
                for (int k = 0; k < n; k++) { /* A <- J^T A J, columns p and q then rows p and q */
                    double akp = A[(size_t)k * n + p], akq = A[(size_t)k * n + q];
                    A[(size_t)k * n + p] = c * akp - s * akq;
                    A[(size_t)k * n + q] = s * akp + c * akq;
                }
                for (int k = 0; k < n; k++) {
                    double apk = A[(size_t)p * n + k], aqk = A[(size_t)q * n + k];
                    A[(size_t)p * n + k] = c * apk - s * aqk;
                    A[(size_t)q * n + k] = s * apk + c * aqk;
                }
                for (int k = 0; k < n; k++) {
                    double vkp = V[(size_t)k * n + p], vkq = V[(size_t)k * n + q];
                    V[(size_t)k * n + p] = c * vkp - s * vkq;
                    V[(size_t)k * n + q] = s * vkp + c * vkq;
                }
            }
        if (!rotated) break;
    }
    int *ord = malloc((size_t)n * sizeof *ord);
    double *tmp = malloc((size_t)n * (size_t)n * sizeof *tmp);
    if (!ord || !tmp) {
        free(ord);
        free(tmp);
        return kvs_fail(KVS_ERR_NOMEM, "eigen-decomposition: out of memory (n = %d)", n);
    }
    for (int i = 0; i < n; i++) ord[i] = i;
    for (int i = 1; i < n; i++) { /* insertion sort, descending eigenvalue, stable */
        int x = ord[i], j = i;
        while (j > 0 && A[(size_t)ord[j - 1] * n + ord[j - 1]] < A[(size_t)x * n + x]) {
            ord[j] = ord[j - 1];
            j--;
        }
        ord[j] = x;
    }
    memcpy(tmp, V, (size_t)n * (size_t)n * sizeof *tmp);
    for (int c = 0; c < n; c++) {
        w[c] = A[(size_t)ord[c] * n + ord[c]];
        int big = 0;
        for (int r = 0; r < n; r++)
            if (fabs(tmp[(size_t)r * n + ord[c]]) > fabs(tmp[(size_t)big * n + ord[c]])) big = r;
        double sg = tmp[(size_t)big * n + ord[c]] < 0 ? -1.0 : 1.0;
        for (int r = 0; r < n; r++) V[(size_t)r * n + c] = sg * tmp[(size_t)r * n + ord[c]];
    }
    free(ord);
    free(tmp);
    return KVS_OK;
}
