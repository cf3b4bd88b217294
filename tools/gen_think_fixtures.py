#!/usr/bin/python3
"""gen_think_fixtures.py — NumPy reference for ThinK in sim/codec.c (tests/test_codec_think.c). Run with the Debian
interpreter:
    /usr/bin/python3 tools/gen_think_fixtures.py            (writes tests/fixtures/codec/think.txt)

Written from ThinK's definitions and its authors' cache (Xu et al. 2024, §3.2; SalesforceAIResearch/ThinK,
ThinK_flash/src), not from kvsim's closed forms:
  score   the paper's Score[c] = || Q[-S_obs:, c] K[:, c]^T ||_F, computed literally as the Frobenius norm of the
          outer product of the window's query column (the group's query heads stacked, codec.h) and the prompt's
          key column, in float64; the generator also checks that the authors' own ranking, mean(q_c^2) * mean(k_c^2),
          orders the channels the same way;
  kept    the int(d * ratio) channels of lowest score are pruned (Python's int() of the float64 product, as the
          authors' key_pruner_query_driven; a tie prunes the lower channel index first), the others kept;
  cache   the authors' split at prefill: the keys of positions < P - recent stored with the kept channels only, the
          last `recent` prompt keys whole; every decode step appends its key to the whole part (cache_utils.py
          update()), and attention sees recover_cache(pruned) (zeros in the pruned channels) followed by the whole
          part (llama_model.py). Values are stored whole. Before the first decode step attention is the prefill's,
          over the keys as captured.
The simulation records, at every step n = 1..N, how many rows are held pruned (q_K) and asserts that the rows
attention sees at step n are the final rows' first n (a representation never changes once fixed).

File format (one case after another; '#' lines are comments):
    case NAME SPEC N D P G NQ        positions, head dim, prompt length, query heads per KV head, query positions
    q HEX*NQ*G*D                     the queries of prompt positions P-NQ .. P-1, [NQ][G][D] (driver's layout)
    in k|v HEX*N*D
    score DEC*D                      the channel scores (float64, %.17g)
    keep 0|1 *D
    steps QK_1 QV_1 ... QK_N QV_N    for n = 1..N
    out k|v HEX*N*D                  every position's rows at step N
    end
"""
import os

import numpy as np

from codec_ref import OUT, f32, hexs


def shortest(r):
    """The shortest %g text that reads back to r (kvsim's canonical spec text of a ratio)."""
    for p in range(1, 18):
        t = "%.*g" % (p, r)
        if float(t) == r:
            return t
    return "%.17g" % r


def scores_of(qwin, k):
    """Paper §3.2: ||Q_win[:, c] K[:, c]^T||_F per channel, the outer product formed explicitly."""
    d = k.shape[1]
    q2 = qwin.reshape(-1, d).astype(np.float64)
    k2 = k.astype(np.float64)
    return np.array([np.linalg.norm(np.outer(q2[:, c], k2[:, c])) for c in range(d)])


def kept_of(score, d, ratio):
    n_prune = int(d * ratio)
    order = np.lexsort((np.arange(d), score))  # by score, then by channel index
    keep = np.ones(d, dtype=int)
    keep[order[:n_prune]] = 0
    return keep


def simulate(spec_ratio, window, recent, N, d, P, G, NQ, k, v, q):
    """The authors' cache, step by step. q: [NQ][G][d], the queries of prompt positions P-NQ..P-1."""
    w = min(window, P)
    qwin = q[NQ - w:] if P > 0 else q[:0]
    score = scores_of(qwin, k[:P]) if P > 0 else np.zeros(d)
    keep = kept_of(score, d, spec_ratio) if P > 0 else np.ones(d, dtype=int)
    if P > 0 and len(set(score.tolist())) == d:
        # the authors' ranking (mean over the window and the group of q^2, times mean over the keys of k^2)
        authors = (qwin.reshape(-1, d).astype(np.float64) ** 2).mean(0) * (k[:P].astype(np.float64) ** 2).mean(0)
        n_prune = int(d * spec_ratio)
        assert set(np.argsort(authors, kind="stable")[:n_prune]) == set(np.flatnonzero(keep == 0))
    split = max(0, P - recent)
    pruned = k[:split][:, keep == 1].copy()  # what the cache stores for the pruned rows
    whole = k[split:P].copy()
    steps, seen = [], []
    for n in range(1, N + 1):
        if n <= P:
            rows_k = k[:n].copy()  # prefill attention: the keys as captured
            steps.append((0, 0))
        else:
            whole = np.concatenate([whole, k[n - 1:n]])  # the new key joins the whole part
            rec = np.zeros((split, d), dtype=f32)
            rec[:, keep == 1] = pruned  # recover_cache
            rows_k = np.concatenate([rec, whole])
            steps.append((split, 0))
        assert rows_k.shape == (n, d)
        seen.append(rows_k)
    final_k = seen[-1]
    for n in range(P + 1, N + 1):  # fixed once pruned: every later step's prefix is the final rows
        assert np.array_equal(seen[n - 1].view(np.uint32), final_k[:n].view(np.uint32))
    return score, keep, steps, final_k, v.copy()


def make_case(rng, name, ratio, window, recent, N, d, P, G, NQ, spread=3.0):
    # per-channel magnitudes spread over orders of magnitude: ThinK's premise (a few large key channels)
    kmag = np.exp(rng.uniform(-spread, spread, d)).astype(f32)
    qmag = np.exp(rng.uniform(-spread, spread, d)).astype(f32)
    k = (rng.standard_normal((N, d)) * kmag).astype(f32)
    v = rng.standard_normal((N, d)).astype(f32)
    q = (rng.standard_normal((NQ, G, d)) * qmag).astype(f32)
    spec = "think:ratio=%s,window=%d,recent=%d" % (shortest(ratio), window, recent)
    score, keep, steps, out_k, out_v = simulate(ratio, window, recent, N, d, P, G, NQ, k, v, q)
    lines = ["case %s %s %d %d %d %d %d" % (name, spec, N, d, P, G, NQ),
             "q " + hexs(q) if NQ > 0 else "q",
             "in k " + hexs(k), "in v " + hexs(v),
             "score " + " ".join("%.17g" % s for s in score),
             "keep " + " ".join(str(int(x)) for x in keep),
             "steps " + " ".join("%d %d" % s for s in steps),
             "out k " + hexs(out_k), "out v " + hexs(out_v), "end"]
    return lines


def main():
    rng = np.random.RandomState(20240730)
    cases = [
        # name, ratio, window, recent, N, d, P, G, NQ
        ("defaults_d16", 0.4, 32, 32, 60, 16, 40, 1, 40),     # the authors' defaults, P > recent
        ("defaults_d8_gqa2", 0.4, 32, 32, 50, 8, 45, 2, 45),  # group of 2 query heads
        ("half_d64_gqa4", 0.5, 16, 16, 36, 64, 32, 4, 20),    # 4 query heads; 20 positions given, 16 read
        ("w4_r8_d16", 0.25, 4, 8, 30, 16, 20, 1, 20),         # small window, queries beyond it ignored
        ("w1_r0_d8", 0.5, 1, 0, 20, 8, 12, 2, 5),             # one window query, no recent rows
        ("window_gt_P", 0.4, 64, 4, 30, 16, 10, 1, 10),       # the window reads the whole prompt
        ("recent_ge_P", 0.4, 32, 32, 30, 16, 20, 1, 20),      # nothing pruned: every prompt row recent
        ("ratio0", 0.0, 32, 4, 24, 8, 16, 1, 16),             # no channel pruned
        ("ratio09_d10", 0.9, 8, 2, 24, 10, 16, 1, 16),        # int(10 * 0.9) = 9 pruned, 1 kept
        ("trunc_d100", 0.29, 16, 8, 24, 100, 20, 1, 16),      # 100 * 0.29 = 28.999999999999996: 28 pruned
        ("d128_llama", 0.4, 32, 16, 40, 128, 36, 1, 32),     # a LLaMA head; only the window's positions given
        ("P_equals_N", 0.5, 8, 4, 16, 8, 16, 1, 16),          # no decode step
        ("P0", 0.4, 32, 32, 10, 8, 0, 1, 0),                  # no prompt: nothing pruned, no queries
    ]
    text = ["# generated by tools/gen_think_fixtures.py; do not edit"]
    for c in cases:
        text += make_case(rng, *c)
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "think.txt"), "w") as f:
        f.write("\n".join(text) + "\n")


if __name__ == "__main__":
    main()
