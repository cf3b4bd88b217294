# d2o_a9.awk — D2O's App. A.9 numerical example (POLICY_SPEC §5.3 D14) on one trace's measured heads, for
# examples/findings/d2o.sh; tests/test_d2o_a9.c recomputes every output another way.
#
#   awk -v P=PROMPT_LEN -v rho=RHO -f d2o_a9.awk FILE      (FILE: one head's colsum_var F_v per line, kvsim attn)
#
# The appendix models the information a head keeps with cache size S as I = H (1 − e^{−kS}) (Eq. 33), H the head's
# attention entropy, and maximises Σ I under Σ S = S_total = ρ · heads · P (Eq. 17) by equal marginal gains,
# S = −(1/k) ln(μ / (H k)) (Eq. 36), "solving iteratively for μ". It gives no entropy; here H is the collision
# (Rényi-2) entropy of the head's column-summed prompt attention normalised to a distribution, which kvsim attn's
# F_v gives exactly: the P column sums s_j have mean 1 (each of the P rows sums to 1), so Σ_j (s_j / P)^2 =
# (1 + F_v) / P and H = ln P − ln(1 + F_v) — lower variance, higher entropy, the link A.9.2 assumes. k is the
# appendix's free constant: k = 1 / (ρ P), so a head at the uniform share ρP keeps 1 − 1/e of its H.
#
# Output, one line: Q_uniform / Q_opt, Q_eq28 / Q_opt, heads the optimum gives no cache (S clamped at 0), the
# largest relative gap between an unclamped head's marginal gain and μ, and |ln μ (bisection) − ln μ (closed form
# over the unclamped heads)|; Q_uniform: S = ρP for every head (Eq. 30), Q_eq28: S ∝ e^{−F_v} (Eq. 28), Q_opt:
# Eq. 36 with μ by bisection (the appendix's iteration) and S ≥ 0 (a head cannot hold a negative cache).
function opt_sum(lm,   i, s, x) { s = 0; for (i = 1; i <= n; i++) if (H[i] > 0) { x = (log(H[i] * k) - lm) / k; if (x > 0) s += x }
    return s }
NF == 0 { next }
{ if ($1 !~ /^[-+]?[0-9.]+([eE][-+]?[0-9]+)?$/ || $1 < 0) { print "d2o_a9.awk: line " NR ": not a variance: " $1 > "/dev/stderr"; bad = 1; exit 1 }
  F[++n] = $1 + 0 }
END {
    if (bad) exit 1
    if (n == 0) { print "d2o_a9.awk: no heads" > "/dev/stderr"; exit 1 }
    if (P + 0 < 2 || rho + 0 <= 0 || rho + 0 > 1) { print "d2o_a9.awk: needs P >= 2 and 0 < rho <= 1" > "/dev/stderr"; exit 1 }
    k = 1 / (rho * P); total = rho * n * P
    any = 0
    for (i = 1; i <= n; i++) { H[i] = log(P) - log(1 + F[i]); if (H[i] > 0) { lh = log(H[i] * k)
        if (!any || lh > lhmax) lhmax = lh; if (!any || lh < lhmin) lhmin = lh; any = 1 } }
    if (!any) { print "d2o_a9.awk: every head has zero entropy" > "/dev/stderr"; exit 1 }
    # Σ S falls as ln μ grows: at lo every head of positive entropy gets at least the total, at hi none gets any
    lo = lhmin - k * total; hi = lhmax
    for (it = 0; it < 200; it++) { mid = (lo + hi) / 2; if (opt_sum(mid) > total) lo = mid; else hi = mid }
    lm = (lo + hi) / 2; mu = exp(lm)
    qu = qo = q28 = z = 0; clamped = 0; gap = 0; m = 0; sl = 0
    for (i = 1; i <= n; i++) z += exp(-F[i])
    for (i = 1; i <= n; i++) {
        if (H[i] <= 0) { clamped++; continue }
        s = (log(H[i] * k) - lm) / k
        if (s <= 0) { clamped++; s = 0 } else { m++; sl += log(H[i] * k); g = H[i] * k * exp(-k * s) / mu - 1; if (g < 0) g = -g; if (g > gap) gap = g }
        qo += H[i] * (1 - exp(-k * s))
        qu += H[i] * (1 - exp(-k * rho * P))
        q28 += H[i] * (1 - exp(-k * total * exp(-F[i]) / z))
    }
    closed = (sl - k * total) / m
    d = lm - closed; if (d < 0) d = -d
    printf "%.10g %.10g %d %.3g %.3g\n", qu / qo, q28 / qo, clamped, gap, d
}
