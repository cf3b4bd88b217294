#!/usr/bin/python3
"""gen_llama_checkpoint.py — writes a Llama-SHAPED Hugging Face checkpoint with RANDOM WEIGHTS, for measuring
speed on realistic shapes only (d = 128, 4 or 8 query heads per KV head, 4K-8K positions). It is not a
model: its text is noise and no quality number measured on it means anything; config.json says so
("kvsim_note"). kvsim names a model after its folder, so OUT_DIR must start with "random-weights" (the traces
recorded from it then say so too).

usage: gen_llama_checkpoint.py OUT_DIR [--layers L] [--hidden H] [--heads Hq] [--kv-heads Hkv] [--head-dim D]
                               [--intermediate I] [--vocab V] [--positions P] [--seed S]
Defaults: 4 layers, hidden 1024, 8 query heads of d 128, 2 KV heads (G = 4), intermediate 2816, vocab 1024,
8192 positions, fp16 weights in one model.safetensors (about 67 MB). Llama-3.1-8B itself is --layers 32
--hidden 4096 --heads 32 --kv-heads 8 --intermediate 14336 (16 GB of fp16: only where the disk allows).
No tokenizer is written: capture with --prompt-ids, e.g.
  gen_llama_checkpoint.py /tmp/random-weights-llama
  kvsim capture --model /tmp/random-weights-llama --prompt-ids 1,2,3 --steps 4000 --ignore-eos --out t.kvt
"""
import argparse
import json
import os
import struct
import sys

import numpy as np


def tensors(a, rng):
    d, hq, hkv, hid, inter, vocab = a.head_dim, a.heads, a.kv_heads, a.hidden, a.intermediate, a.vocab

    def w(rows, cols):  # N(0, 1/cols): activations keep their scale through the random layers
        return (rng.standard_normal((rows, cols), dtype=np.float32) / np.sqrt(cols)).astype(np.float16)

    yield "model.embed_tokens.weight", (rng.standard_normal((vocab, hid), dtype=np.float32)).astype(np.float16)
    for i in range(a.layers):
        p = f"model.layers.{i}."
        yield p + "input_layernorm.weight", np.ones(hid, np.float16)
        yield p + "self_attn.q_proj.weight", w(hq * d, hid)
        yield p + "self_attn.k_proj.weight", w(hkv * d, hid)
        yield p + "self_attn.v_proj.weight", w(hkv * d, hid)
        yield p + "self_attn.o_proj.weight", w(hid, hq * d)
        yield p + "post_attention_layernorm.weight", np.ones(hid, np.float16)
        yield p + "mlp.gate_proj.weight", w(inter, hid)
        yield p + "mlp.up_proj.weight", w(inter, hid)
        yield p + "mlp.down_proj.weight", w(hid, inter)
    yield "model.norm.weight", np.ones(hid, np.float16)
    yield "lm_head.weight", w(vocab, hid)


def write_safetensors(path, items):
    """safetensors: u64 little-endian header length, a JSON header of dtype/shape/offsets, the raw data."""
    header, blobs, off = {"__metadata__": {"format": "pt", "kvsim_note": "random weights, speed only"}}, [], 0
    for name, t in items:
        b = np.ascontiguousarray(t).tobytes()
        header[name] = {"dtype": "F16", "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    tmp = path + ".partial"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)
    return off


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--intermediate", type=int, default=2816)
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument("--positions", type=int, default=8192)
    ap.add_argument("--seed", type=int, default=14)
    a = ap.parse_args()
    if not os.path.basename(os.path.normpath(a.out)).startswith("random-weights"):
        ap.error("OUT_DIR's name must start with 'random-weights' (kvsim names the model after the folder)")
    if a.heads % a.kv_heads:
        ap.error("--heads must be a multiple of --kv-heads")
    os.makedirs(a.out, exist_ok=True)
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "_name_or_path": f"RANDOM-WEIGHTS-llama-shape-L{a.layers}-H{a.heads}-KV{a.kv_heads}-d{a.head_dim}",
        "kvsim_note": "RANDOM WEIGHTS: a Llama-shaped checkpoint for speed measurement only, not a model",
        "hidden_size": a.hidden,
        "intermediate_size": a.intermediate,
        "num_hidden_layers": a.layers,
        "num_attention_heads": a.heads,
        "num_key_value_heads": a.kv_heads,
        "head_dim": a.head_dim,
        "vocab_size": a.vocab,
        "max_position_embeddings": a.positions,
        "rope_theta": 500000.0,
        "rms_norm_eps": 1e-05,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "float16",
    }
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    n = write_safetensors(os.path.join(a.out, "model.safetensors"), tensors(a, np.random.default_rng(a.seed)))
    print(f"{a.out}: RANDOM-WEIGHT Llama-shaped checkpoint (speed only), {n / 1e6:.1f} MB of fp16 weights")
    return 0


if __name__ == "__main__":
    sys.exit(main())
