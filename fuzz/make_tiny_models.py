#!/usr/bin/env python3
"""make_tiny_models.py -- writes the tiny checkpoints the model-loader fuzz harnesses start from (Python standard library only):
   argv[1]: a llama2.c .bin (llama2.c run.c read_checkpoint layout: 7 int32 header, then fp32 tensors), and
   argv[2]/config.json + argv[2]/model.safetensors: a Llama folder (safetensors format: u64 header length, JSON
   header, tensor bytes). Weights are seeded Gaussian numbers, not a trained model: the harnesses test parsing.
   Shapes: dim 8, hidden 16, 1 layer, 2 heads, 1 KV head (llama2.c: 2), vocab 16, seq_len 8."""
import json, os, random, struct, sys

rng = random.Random(16)
dim, hidden, layers, heads, kv, vocab, seq = 8, 16, 1, 2, 2, 16, 8
hs = dim // heads

class Tensor:
    """a row-major array of seeded Gaussian values (x 0.1) with its shape"""
    def __init__(self, *shape):
        self.shape = shape
        n = 1
        for s in shape:
            n *= s
        self.values = [rng.gauss(0.0, 1.0) * 0.1 for _ in range(n)]

    def bytes(self, fmt):
        return struct.pack('<%d%s' % (len(self.values), fmt), *self.values)

w = Tensor

# llama2.c: shared classifier (vocab_size > 0)
parts = [w(vocab, dim), w(layers, dim), w(layers, dim, dim), w(layers, dim, kv * hs), w(layers, dim, kv * hs),
         w(layers, dim, dim), w(layers, dim), w(layers, hidden, dim), w(layers, dim, hidden), w(layers, hidden, dim),
         w(dim), w(seq, hs // 2), w(seq, hs // 2)]
with open(sys.argv[1], 'wb') as f:
    f.write(struct.pack('<7i', dim, hidden, layers, heads, kv, vocab, seq))
    for p in parts:
        f.write(p.bytes('f'))

kv = 1
cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": dim,
       "intermediate_size": hidden, "num_hidden_layers": layers, "num_attention_heads": heads,
       "num_key_value_heads": kv, "vocab_size": vocab, "max_position_embeddings": seq, "rope_theta": 10000.0,
       "rms_norm_eps": 1e-5, "tie_word_embeddings": True, "hidden_act": "silu", "bos_token_id": 1,
       "eos_token_id": 2, "torch_dtype": "float16"}
tensors = {"model.embed_tokens.weight": w(vocab, dim), "model.norm.weight": w(dim)}
for l in range(layers):
    p = "model.layers.%d." % l
    tensors.update({p + "input_layernorm.weight": w(dim), p + "post_attention_layernorm.weight": w(dim),
                    p + "self_attn.q_proj.weight": w(dim, dim), p + "self_attn.k_proj.weight": w(kv * hs, dim),
                    p + "self_attn.v_proj.weight": w(kv * hs, dim), p + "self_attn.o_proj.weight": w(dim, dim),
                    p + "mlp.gate_proj.weight": w(hidden, dim), p + "mlp.up_proj.weight": w(hidden, dim),
                    p + "mlp.down_proj.weight": w(dim, hidden)})
header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
for name, t in tensors.items():
    b = t.bytes('e')
    header[name] = {"dtype": "F16", "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
    blobs.append(b)
    off += len(b)
h = json.dumps(header, separators=(',', ':')).encode()
h += b' ' * (-len(h) % 8)
os.makedirs(sys.argv[2], exist_ok=True)
with open(os.path.join(sys.argv[2], 'model.safetensors'), 'wb') as f:
    f.write(struct.pack('<Q', len(h)) + h + b''.join(blobs))
with open(os.path.join(sys.argv[2], 'config.json'), 'w') as f:
    json.dump(cfg, f, indent=1)
