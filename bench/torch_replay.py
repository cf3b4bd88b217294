#!/usr/bin/env python3
"""torch_replay.py — the side-by-side yardstick of `make bench` (sim/BENCH.md): the replay of full / window /
streaming / topk written the way a researcher would in PyTorch (one masked softmax over a whole block of decode
steps, vectorised over heads and steps), on the trace arrays bench_speed wrote (GENERATED data, not a model).
Numbers first: every per-layer mean output error must equal kvsim's within a stated tolerance, else the timing
is not reported and the exit status is 1. Then the wall times side by side. Never asserted as a test.

usage: torch_replay.py DIR   (DIR holds q.npy, k.npy, v.npy and kvsim.csv from bench_speed with
                              KVSIM_BENCH_NPY_DIR=DIR)
Policies as kvsim defines them (`kvsim policies`): window = the last B positions including the current one;
streaming = the first 4 positions (sinks) + the last B-4; topk (gqa=group) = the B positions with the largest
full attention summed over the query heads of the KV head (ties to the lower position).
"""
import sys
import time

import numpy as np
import torch

# Per-layer mean output error (relative L2 of the output against full attention) may differ from kvsim's by fp32
# rounding of different summation orders: 1e-4 relative + 1e-6 absolute. A topk selection that flips on a near
# tie moves one sample; the data is continuous random, where that does not happen at this tolerance.
REL_TOL, ABS_TOL = 1e-4, 1e-6
STEP_BLOCK = 64  # decode steps per masked-softmax block


def read_kvsim(path):
    with open(path) as f:
        head = f.readline().lstrip("# ").split()
        meta = dict(kv.split("=") for kv in head)
        f.readline()
        rows = [line.strip().split(",") for line in f if line.strip()]
    return meta, {(r[0], int(r[1]), int(r[2])): float(r[3]) for r in rows}


def replay(q, k, v, prompt, scale, budgets):
    """q [N,H,d], k/v [N,Hkv,d] of one layer -> {(policy, budget): mean out_err} over the decode steps."""
    N, H, d = q.shape
    Hkv = k.shape[1]
    G = H // Hkv
    kh = k.permute(1, 0, 2).repeat_interleave(G, dim=0)  # [H,N,d]
    vh = v.permute(1, 0, 2).repeat_interleave(G, dim=0)
    pos = torch.arange(N)
    errs = {}
    for t0 in range(prompt, N, STEP_BLOCK):
        t1 = min(N, t0 + STEP_BLOCK)
        qb = q[t0:t1].permute(1, 0, 2)  # [H,T,d]
        s = torch.matmul(qb, kh.transpose(1, 2)) * scale  # [H,T,N]
        p_idx = pos[t0:t1].view(1, -1, 1)
        causal = pos.view(1, 1, -1) <= p_idx  # [1,T,N]
        full_p = torch.softmax(s.masked_fill(~causal, float("-inf")), dim=-1)
        full_o = torch.matmul(full_p, vh)  # [H,T,d]
        full_n = full_o.norm(dim=-1)
        grp = full_p.view(Hkv, G, t1 - t0, N).sum(dim=1)  # [Hkv,T,N]
        for b in budgets:
            masks = {
                "full": causal,
                "window": causal & (pos.view(1, 1, -1) > p_idx - b),
                "streaming": causal & ((pos.view(1, 1, -1) < 4) | (pos.view(1, 1, -1) > p_idx - (b - 4))),
            }
            kk = min(b, t0 + 1)
            top = torch.topk(grp, kk, dim=-1).indices  # [Hkv,T,kk]; positions > p have probability 0
            sel = torch.zeros(Hkv, t1 - t0, N, dtype=torch.bool).scatter_(-1, top, True)
            masks["topk"] = sel.repeat_interleave(G, dim=0) & causal
            # steps whose prefix is shorter than b keep it all
            masks["topk"] |= causal & (p_idx + 1 <= b)
            for name, m in masks.items():
                o = torch.matmul(torch.softmax(s.masked_fill(~m, float("-inf")), dim=-1), vh)
                e = (o - full_o).norm(dim=-1) / full_n  # [H,T]
                errs.setdefault((name, b), []).append(e.double().sum().item())
    n = (N - prompt) * H
    return {key: sum(v) / n for key, v in errs.items()}


def main():
    if len(sys.argv) != 2:
        sys.stderr.write(__doc__)
        return 2
    d = sys.argv[1]
    meta, ref = read_kvsim(d + "/kvsim.csv")
    prompt, scale = int(meta["prompt_len"]), float(meta["scale"])
    kvsim_wall, threads = float(meta["kvsim_wall_s"]), int(meta["threads"])
    torch.set_num_threads(threads)
    q, k, v = (torch.from_numpy(np.load(f"{d}/{x}.npy")) for x in ("q", "k", "v"))
    budgets = sorted({key[1] for key in ref})
    t0 = time.time()
    got = {}
    with torch.no_grad():
        for layer in range(q.shape[0]):
            for key, e in replay(q[layer], k[layer], v[layer], prompt, scale, budgets).items():
                got[key + (layer,)] = e
    wall = time.time() - t0
    worst, bad = 0.0, []
    for key, r in ref.items():
        g = got[key]
        diff = abs(g - r)
        worst = max(worst, diff / max(abs(r), 1e-30))
        if diff > REL_TOL * abs(r) + ABS_TOL:
            bad.append(f"{key}: kvsim {r:.9g} torch {g:.9g}")
    print(f"torch {torch.__version__} ({threads} threads): {len(ref)} per-layer mean output errors compared, "
          f"worst relative difference {worst:.3g} (tolerance {REL_TOL} + {ABS_TOL})")
    if bad:
        print("MISMATCH, timing not reported:\n  " + "\n  ".join(bad[:10]))
        return 1
    print(f"full/window/streaming/topk x {len(budgets)} budgets: torch {wall:.2f} s, kvsim {kvsim_wall:.2f} s "
          f"-> kvsim {wall / kvsim_wall:.1f}x faster")
    return 0


if __name__ == "__main__":
    sys.exit(main())
