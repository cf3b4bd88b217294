"""torch_llama.py — the independent float64 PyTorch reference of tests/fixtures/gen_reference.py (its checkpoint
loaders, RoPE, RMSNorm and weights; nothing of kvsim's C code) as torch.nn.Modules, so that a trace can be recorded
the way one records any PyTorch model: forward hooks on the attention module. Each layer's `core`
(CausalAttention) takes the post-RoPE q [P, H, d], k and v [P, Hkv, d] of the whole sequence and returns the
attention output o [P, H, d] and the log-sum-exp lse [P, H] of the scaled scores; a forward hook on it sees exactly
what a kvsim trace stores (trace/FORMAT.md), for every position at once (teacher-forced forward of the sequence).
"""
import math
import os
import sys

import torch
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "fixtures"))
import gen_reference as ref  # noqa: E402  (the loaders and the float64 building blocks)

DT = ref.DT


class CausalAttention(nn.Module):
    """softmax(scale * q k^T + causal mask) v per query head, GQA by repeating each KV head over its G query heads;
    returns (o, lse). The module forward hooks attach to."""

    def __init__(self, n_heads, n_kv, scale):
        super().__init__()
        self.G, self.scale = n_heads // n_kv, scale

    def forward(self, q, k, v):
        P = q.shape[0]
        kq = k.repeat_interleave(self.G, dim=1)                       # [P, H, d]
        vq = v.repeat_interleave(self.G, dim=1)
        s = torch.einsum("phd,jhd->hpj", q, kq) * self.scale         # [H, P, P]
        s = s.masked_fill(torch.ones(P, P, dtype=torch.bool).triu(1), float("-inf"))
        lse = torch.logsumexp(s, dim=2)                               # [H, P]
        o = torch.einsum("hpj,jhd->phd", torch.exp(s - lse[:, :, None]), vq)
        return o, lse.T.contiguous()


class Attention(nn.Module):
    def __init__(self, cfg, w, freqs):
        super().__init__()
        self.cfg, self.w, self.freqs = cfg, w, freqs
        self.core = CausalAttention(cfg["n_heads"], cfg["n_kv"], 1.0 / math.sqrt(cfg["hd"]))

    def forward(self, xb):
        cfg, w = self.cfg, self.w
        P, H, Hkv, hd = xb.shape[0], cfg["n_heads"], cfg["n_kv"], cfg["hd"]
        q = xb @ w["wq"].T + (w["bq"] if "bq" in w else 0)
        k = xb @ w["wk"].T + (w["bk"] if "bk" in w else 0)
        v = (xb @ w["wv"].T + (w["bv"] if "bv" in w else 0)).view(P, Hkv, hd)
        q = torch.stack([ref.rope(q[p].view(H, hd), p, self.freqs, cfg["layout"]) for p in range(P)])
        k = torch.stack([ref.rope(k[p].view(Hkv, hd), p, self.freqs, cfg["layout"]) for p in range(P)])
        o, _ = self.core(q, k, v)
        return o.reshape(P, H * hd) @ w["wo"].T


class Block(nn.Module):
    def __init__(self, cfg, w, freqs):
        super().__init__()
        self.cfg, self.w = cfg, w
        self.attn = Attention(cfg, w, freqs)

    def forward(self, x):
        w, eps = self.w, self.cfg["eps"]
        x = x + self.attn(torch.stack([ref.rmsnorm(r, w["rms_att"], eps) for r in x]))
        xb = torch.stack([ref.rmsnorm(r, w["rms_ffn"], eps) for r in x])
        return x + (torch.nn.functional.silu(xb @ w["w1"].T) * (xb @ w["w3"].T)) @ w["w2"].T


class Llama(nn.Module):
    def __init__(self, cfg, W):
        super().__init__()
        self.cfg, self.W = cfg, W
        freqs = ref.inv_freq(cfg)
        self.layers = nn.ModuleList([Block(cfg, w, freqs) for w in W["layers"]])

    def forward(self, tokens):
        x = self.W["emb"][torch.as_tensor(tokens)].clone()
        for b in self.layers:
            x = b(x)
        xf = torch.stack([ref.rmsnorm(r, self.W["rms_final"], self.cfg["eps"]) for r in x])
        return xf @ self.W["cls"].T


def load(model_path):
    """(Llama module, cfg, header fields of a trace of it) for a llama2.c .bin or a Hugging Face folder."""
    if os.path.isdir(model_path):
        cfg, W = ref.load_hf(model_path)
        import json
        c = json.load(open(os.path.join(model_path, "config.json")))
        max_seq = c.get("max_position_embeddings", 2048)
        name = os.path.basename(os.path.normpath(model_path))
    else:
        cfg, W = ref.load_llama2c(model_path)
        import struct
        max_seq = struct.unpack("<7i", open(model_path, "rb").read(28))[6]
        name = os.path.splitext(os.path.basename(model_path))[0]
    header = dict(n_layers=cfg["n_layers"], n_heads=cfg["n_heads"], n_kv_heads=cfg["n_kv"], head_dim=cfg["hd"],
                  dim=cfg["dim"], hidden_dim=cfg["hidden"], vocab_size=cfg["vocab"], max_seq_len=max_seq,
                  rope_theta=cfg["theta"], norm_eps=cfg["eps"], attn_scale=1.0 / math.sqrt(cfg["hd"]),
                  rope_layout=cfg["layout"], model_name=name)
    return Llama(cfg, W), cfg, header


def record(model, tokens):
    """Runs the model over `tokens` with a forward hook on every layer's attention core; returns (logits [P, V],
    dict q/k/v/o/lse of NumPy float64 arrays with a leading layer axis: q [L, P, H, d], ...)."""
    rec = {}

    def hook(layer):
        def fn(module, inputs, outputs):
            rec[layer] = [t.detach().numpy() for t in inputs + outputs]
        return fn

    handles = [b.attn.core.register_forward_hook(hook(l)) for l, b in enumerate(model.layers)]
    try:
        with torch.no_grad():
            logits = model(list(map(int, tokens)))
    finally:
        for h in handles:
            h.remove()
    import numpy as np
    names = ("q", "k", "v", "o", "lse")
    return logits.numpy(), {n: np.stack([rec[l][i] for l in range(len(model.layers))]) for i, n in enumerate(names)}
