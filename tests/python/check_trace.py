"""check_trace.py — the checks of the Python trace module (python/kvsim), one case per command-line argument,
driven by tests/test_python_trace.c (which gives $KVSIM_BIN, $KVSIM_ROOT and a scratch folder). Each case prints
its measured numbers and "PASS <case>" last, or raises (exit status 1) with what differed.

  roundtrip  a kvsim capture (plane-blocked zstd) and the bundled trace (one-shot zstd) read into NumPy and written
             back: every stored array bit-equal, `kvsim verify` passes, and the one-shot file comes back byte for
             byte (same level, same chunk order: Python's writer is kvsim's one-shot writer); the lean record and
             bf16/fp32 storage round-trip too, and a lean trace's recomputed o/lse match kvsim's full record.
  hooks      tests/python/torch_llama.py (gen_reference.py's float64 model as nn.Modules) run over the token ids
             of a kvsim capture, q/k/v/o/lse recorded by forward hooks on the attention module, written as a
             trace; `kvsim verify` passes, its header equals the capture's, and `kvsim replay` of several
             policies gives the capture's numbers within the stated tolerance.
  results    Python's reading of a `kvsim replay --db` database against `kvsim runs --csv` and `--json`, and the
             run-wide mean recomputed from the per-step series.
  corrupt    every single flipped byte and every truncation of a small trace raises TraceError (never another
             exception, never a hang); writer misuse raises TraceError and leaves no file; a database that is
             not kvsim's raises ResultsError.
"""
import csv
import io
import json
import math
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.environ.get("KVSIM_ROOT") or os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))
import kvsim  # noqa: E402
from kvsim import results as kres  # noqa: E402

KVSIM = os.environ.get("KVSIM_BIN") or os.path.join(ROOT, "kvsim")
MODELS = os.path.normpath(os.path.join(ROOT, "..", "shared", "models"))
TMP = None


def run(*args, ok=True):
    p = subprocess.run([KVSIM] + [str(a) for a in args], capture_output=True, text=True, timeout=300)
    if ok and p.returncode != 0:
        raise AssertionError("kvsim %s: exit %d\n%s%s" % (" ".join(map(str, args)), p.returncode, p.stdout,
                                                         p.stderr))
    return p


def capture(model, out, steps, *extra):
    run("capture", "--model", model, "--prompt", "Once upon a time", "--steps", steps, "--ignore-eos", "--threads",
        1, "--out", out, *extra)


def copy_trace(src, dst):
    """Reads src with the Python reader (the stored values) and writes them with the Python writer in a few appends
    of uneven sizes, so that the writer's assembly of blocks across appends is exercised."""
    t = kvsim.Trace(src)
    cfg = t.writer_config()
    a = t.arrays(raw=True)
    lean = cfg["record"] == "qkv"
    with kvsim.TraceWriter(dst, **cfg) as w:
        cuts = [0, 1, 50, 51, 130, t.n_positions]
        for a0, b0 in zip(cuts, cuts[1:]):
            if a0 >= b0 or a0 >= t.n_positions:
                continue
            s = slice(a0, min(b0, t.n_positions))
            w.append(t.tokens[s], t.roles[s], t.turn_of[s], a["q"][:, s], a["k"][:, s], a["v"][:, s],
                     None if lean else a["o"][:, s], None if lean else a["lse"][:, s])
    return t, a


def arrays_equal(p1, p2, names=("q", "k", "v", "o", "lse")):
    a, b = kvsim.Trace(p1), kvsim.Trace(p2)
    x, y = a.arrays(raw=True), b.arrays(raw=True)
    for n in names:
        if x[n] is None and y[n] is None:
            continue
        assert x[n].dtype == y[n].dtype and x[n].shape == y[n].shape, n
        assert x[n].tobytes() == y[n].tobytes(), "%s: %s and %s differ" % (n, p1, p2)
    for n in ("tokens", "roles", "turn_of"):
        assert np.array_equal(getattr(a, n), getattr(b, n)), n
    assert a.turns == b.turns


def exported(path):
    """Python's float32 arrays of the first and last layer against `kvsim export` of the same trace: the stored
    values equal; a lean trace's recomputed o/lse (float64 here, fp32 in kvsim) within 1e-4. Returns the largest
    difference."""
    t = kvsim.Trace(path)
    worst = 0.0
    for l in (0, t.n_layers - 1):
        a = t.layer(l)
        for n in ("q", "k", "v", "o", "lse"):
            f = os.path.join(TMP, "export.npy")
            run("export", path, "--what", n, "--layer", l, "--out", f)
            e = np.load(f)
            assert e.dtype == np.float32 and e.shape == a[n].shape, (path, n, e.shape, a[n].shape)
            if t.lean and n in ("o", "lse"):
                d = float(np.abs(e - a[n]).max())
                assert d < 1e-4, (path, l, n, d)
                worst = max(worst, d)
            else:
                assert e.tobytes() == a[n].tobytes(), (path, l, n)
    f = os.path.join(TMP, "export.npy")
    run("export", path, "--what", "tokens", "--out", f)
    assert np.array_equal(np.load(f), t.tokens)
    return worst


def verify(path):
    p = run("verify", path)
    assert "verify: OK" in p.stdout, p.stdout
    return p.stdout


# ---------------------------------------------------------------------------------------------- roundtrip
def case_roundtrip():
    cap = os.path.join(TMP, "cap.kvt")
    capture(os.path.join(MODELS, "stories260K.bin"), cap, 100)
    out = os.path.join(TMP, "py.kvt")
    copy_trace(cap, out)
    arrays_equal(cap, out)
    verify(out)
    print("kvsim capture -> python -> file: arrays bit-equal, verify OK (%d and %d bytes: kvsim's plane blocks "
          "vs one-shot)" % (os.path.getsize(cap), os.path.getsize(out)))
    # the bundled trace is one-shot coded: the Python writer reproduces it byte for byte
    bundled = os.path.join(ROOT, "examples", "stories260K.kvt")
    out2 = os.path.join(TMP, "bundled.kvt")
    copy_trace(bundled, out2)
    assert open(bundled, "rb").read() == open(out2, "rb").read(), "bundled trace not reproduced byte for byte"
    print("bundled trace -> python -> file: byte-identical (%d bytes)" % os.path.getsize(out2))
    # other storage types: the stored values round-trip; and the writer's rounding of float32 input is kvsim's (the
    # capture's forward pass does not depend on the storage type, so its fp32 trace rounded by the Python writer
    # must give its fp16 and bf16 traces bit for bit: kvs_f32_to_f16 / kvs_f32_to_bf16, round to nearest even)
    for dt in ("fp32", "bf16", "fp16"):
        k = os.path.join(TMP, "cap_%s.kvt" % dt)
        capture(os.path.join(MODELS, "stories260K.bin"), k, 40, "--dtype", dt, "--block", "16")
        p = os.path.join(TMP, "py_%s.kvt" % dt)
        copy_trace(k, p)
        arrays_equal(k, p)
        verify(p)
        if dt != "fp32":
            f = kvsim.Trace(os.path.join(TMP, "cap_fp32.kvt"))
            a = f.arrays(raw=True)
            r = os.path.join(TMP, "rounded_%s.kvt" % dt)
            kvsim.write_trace(r, a["q"], a["k"], a["v"], a["o"], a["lse"], tokens=f.tokens, roles=f.roles,
                              turns=f.turn_of, **dict(f.writer_config(), dtype=dt))
            arrays_equal(k, r)
        print("%s: arrays bit-equal, verify OK%s" % (dt, "" if dt == "fp32" else
                                                     "; kvsim's fp32 capture rounded by the writer = its %s capture"
                                                     % dt))
    # the float32 decode against kvsim's own (`kvsim export`, every array of the first and last layer): equal
    for dt in ("fp32", "bf16", "fp16"):
        exported(os.path.join(TMP, "cap_%s.kvt" % dt))
    lean = os.path.join(TMP, "cap_lean.kvt")
    capture(os.path.join(MODELS, "stories260K.bin"), lean, 100, "--record", "qkv")
    p = os.path.join(TMP, "py_lean.kvt")
    copy_trace(lean, p)
    arrays_equal(lean, p, ("q", "k", "v"))
    assert run("verify", p, ok=False).returncode == run("verify", lean, ok=False).returncode == 0
    # a lean trace's recomputed outputs against the full record of the same capture (FORMAT.md "Lean record":
    # the full record stores fp32 outputs rounded to fp16, the lean reader recomputes from rounded q/k/v)
    worst = exported(lean)
    print("lean: recomputed o/lse (float64) vs kvsim export's (fp32): max |diff| %.2g" % worst)
    full, ln = kvsim.Trace(cap).arrays(), kvsim.Trace(lean).arrays()
    rel = np.linalg.norm(full["o"] - ln["o"], axis=-1) / np.linalg.norm(full["o"], axis=-1)
    dl = np.abs(full["lse"] - ln["lse"]).max()
    print("lean: q/k/v bit-equal; recomputed o vs full record: max rel %.3g, max lse diff %.3g" % (rel.max(), dl))
    assert rel.max() < 2e-2 and dl < 0.05
    # full record from a lean one: q/k/v stored, o/lse from attention_outputs (float64): verify passes
    t = kvsim.Trace(lean)
    a, r = t.arrays(), t.arrays(raw=True)
    ol = [kvsim.attention_outputs(a["q"][l], a["k"][l], a["v"][l], t.header["attn_scale"]) for l in range(t.n_layers)]
    cfg = dict(t.writer_config(), record="full")
    full2 = os.path.join(TMP, "py_full_from_lean.kvt")
    kvsim.write_trace(full2, r["q"], r["k"], r["v"], np.stack([x[0] for x in ol]), np.stack([x[1] for x in ol]),
                      tokens=t.tokens, roles=t.roles, turns=t.turn_of, **cfg)
    verify(full2)
    print("full record written from a lean trace with attention_outputs(): verify OK")
    windows_case()
    print("PASS roundtrip")


def windows_case():
    """Per-layer attention windows (FORMAT.md "Layer windows", header flag bit 2 and a table after the settings):
    a trace with a sliding layer written and read back, its lean twin's recomputed outputs equal to the window's
    attention, a trace without windows unchanged by the field; `kvsim verify` where the binary reads the bit (a
    kvsim that predates it must refuse the trace by its unknown flag bit, nothing else)."""
    rng = np.random.default_rng(11)
    L, P, H, Hkv, d, win = 3, 40, 4, 2, 8, [0, 7, 0]
    q, k, v = (rng.standard_normal((L, P, n, d)) for n in (H, Hkv, Hkv))
    ol = [kvsim.attention_outputs(q[l], k[l], v[l], d ** -0.5, window=win[l]) for l in range(L)]
    o, lse = np.stack([x[0] for x in ol]), np.stack([x[1] for x in ol])
    # the window, written out row by row: position p of layer 1 attends to keys max(0, p - 6) .. p
    for p in range(P):
        for h in range(H):
            j = np.arange(max(0, p - win[1] + 1), p + 1)
            sc = k[1, j, h // (H // Hkv)] @ q[1, p, h] * d ** -0.5
            m = sc.max()
            w = np.exp(sc - m)
            assert abs(m + np.log(w.sum()) - lse[1, p, h]) < 1e-12
            assert np.abs(w @ v[1, j, h // (H // Hkv)] / w.sum() - o[1, p, h]).max() < 1e-12
    cfg = dict(tokens=np.arange(P) % 5, prompt_len=30, vocab_size=5, block_positions=16, dtype="fp32")
    paths = {}
    for rec in ("full", "qkv"):
        paths[rec] = os.path.join(TMP, "win_%s.kvt" % rec)
        kvsim.write_trace(paths[rec], q, k, v, *((o, lse) if rec == "full" else (None, None)), layer_window=win,
                          record=rec, **cfg)
        t = kvsim.Trace(paths[rec])
        assert t.layer_window == win and t.header["layer_window"] == win
        assert t.header["flags"] & 4 == 0  # a layout bit, not reported (kvsim's reader does the same)
        assert t.header["header_size"] == 152 + t.header["settings_len"] + 4 * L
    lean, full = kvsim.Trace(paths["qkv"]).arrays(), kvsim.Trace(paths["full"]).arrays()
    dmax = max(float(np.abs(lean[n] - full[n]).max()) for n in ("o", "lse"))
    assert dmax < 1e-5, dmax  # fp32 storage: the recomputation from rounded q/k/v within fp32 rounding
    nowin = os.path.join(TMP, "win_none.kvt")
    kvsim.write_trace(nowin, q, k, v, o, lse, layer_window=[0] * L, **cfg)
    t = kvsim.Trace(nowin)
    assert t.layer_window == [0] * L and t.header["header_size"] == 152 + t.header["settings_len"]
    # kvsim reads the table where its trace/FORMAT.md documents it; a kvsim that predates it refuses the trace
    knows = "## Layer windows" in open(os.path.join(ROOT, "trace", "FORMAT.md"), encoding="utf-8").read()
    for rec, path in paths.items():
        p = run("verify", path, ok=False)
        if knows:
            assert p.returncode == 0, p.stdout + p.stderr
            print("layer windows (%s): kvsim verify: %s" % (rec, p.stdout.strip().splitlines()[-1]))
        else:
            assert p.returncode == 1 and "header" in p.stderr, p.stdout + p.stderr
            print("layer windows (%s): this kvsim predates them (trace/FORMAT.md) and refuses the header: %s"
                  % (rec, p.stderr.strip().splitlines()[-1]))
    print("layer windows: written and read back, lean recomputation = the window's attention (max diff %.2g)" % dmax)
    # a kvsim that captures sliding-window models (tests/fixtures/gemma3_tiny, layer_types in its config): its
    # windowed traces read here with the config's windows, round-trip bit-equal, verify, and a lean one's outputs
    # recomputed over the windows equal kvsim's (`kvsim export`)
    gemma = os.path.join(ROOT, "tests", "fixtures", "gemma3_tiny")
    if knows and os.path.isdir(gemma):
        c = json.load(open(os.path.join(gemma, "config.json")))
        want = [c["sliding_window"] if ty == "sliding_attention" else 0 for ty in c["layer_types"]]
        for rec in ("full", "qkv"):
            g = os.path.join(TMP, "gemma_%s.kvt" % rec)
            run("capture", "--model", gemma, "--prompt-ids", "1,5,9,13", "--steps", 60, "--ignore-eos", "--threads",
                1, "--block", 16, "--dtype", "fp32", "--record", rec, "--out", g)
            assert kvsim.Trace(g).layer_window == want, (kvsim.Trace(g).layer_window, want)
            gp = os.path.join(TMP, "gemma_py_%s.kvt" % rec)
            copy_trace(g, gp)
            arrays_equal(g, gp, ("q", "k", "v") if rec == "qkv" else ("q", "k", "v", "o", "lse"))
            assert run("verify", gp, ok=False).returncode == 0
            d = exported(g)
            print("gemma3_tiny %s capture, windows %s: Python round trip bit-equal, verify OK; export max diff %.2g"
                  % (rec, want, d))


# ---------------------------------------------------------------------------------------------- hooks
POLICIES = ("window", "streaming", "h2o", "snapkv", "tova")
BUDGETS = "16,32,64"
QUALITY = ("out_err", "attn_recall", "topk_overlap")
BYTES = ("storage_bytes", "traffic_bytes", "attended_tokens")


def hooks_one(model, name, steps):
    import torch_llama as tl
    cap = os.path.join(TMP, "%s_cap.kvt" % name)
    capture(model, cap, steps)
    t = kvsim.Trace(cap)
    m, cfg, header = tl.load(model)
    logits, a = tl.record(m, t.tokens)
    # kvsim decoded greedily; the float64 reference's argmax at every generated step must agree
    gen = np.arange(t.prompt_len - 1, t.n_positions - 1)
    agree = int((logits.argmax(1)[gen] == t.tokens[gen + 1]).sum())
    assert agree == len(gen), "greedy tokens: reference agrees on %d of %d" % (agree, len(gen))
    out = os.path.join(TMP, "%s_hooks.kvt" % name)
    kvsim.write_trace(out, a["q"], a["k"], a["v"], a["o"], a["lse"], tokens=t.tokens, prompt_len=t.prompt_len,
                      dtype="fp16", max_new_tokens=steps, settings={"backend": "pytorch-hooks", "reference":
                                                                     "float64"}, **header)
    vout = verify(out)
    usage = float(vout.split("max bound usage ")[1].split(")")[0])
    h = kvsim.Trace(out)
    for k in header:
        want = t.header[k]
        got = h.header[k]
        assert got == want, "header %s: hooks trace %r, capture %r" % (k, got, want)
    # stored values: how many fp16 codes differ from kvsim's fp32 capture, and by how much
    x, y = t.arrays(raw=True), h.arrays(raw=True)
    xf, yf = t.arrays(), h.arrays()
    for n in ("q", "k", "v", "o"):
        codes = x[n].view(np.int16) != y[n].view(np.int16)
        # a difference against the head vector's norm: fp16 rounds each element to within 2^-11 of itself, and
        # float64 vs fp32 arithmetic moves an element by ~1e-6 of the vector's scale, so an element near zero may
        # sit several codes away while the vector is within about one rounding of its largest element
        rel = np.abs(xf[n] - yf[n]).max(-1) / np.maximum(np.linalg.norm(xf[n], axis=-1), 1e-30)
        print("%s %s: %.4f of fp16 codes differ; max |diff| %.3g, max |diff| / ||row|| %.3g" % (
            name, n, float(codes.mean()), float(np.abs(xf[n] - yf[n]).max()), float(rel.max())))
        assert rel.max() < 2.0 ** -10, n
    dl = float(np.abs(xf["lse"] - yf["lse"]).max())
    print("%s lse (fp32): max |diff| %.3g; verify of the hooks trace: max bound usage %.3f" % (name, dl, usage))
    assert dl < 1e-4
    # replay both traces under the same policies
    db = {}
    for tag, path in (("cap", cap), ("hooks", out)):
        db[tag] = os.path.join(TMP, "%s_%s.db" % (name, tag))
        for f in (db[tag], db[tag] + "-wal", db[tag] + "-shm"):
            if os.path.exists(f):
                os.unlink(f)
        args = ["replay", path, "--db", db[tag], "--budgets", BUDGETS, "--threads", "1"]
        for p in POLICIES:
            args += ["--policy", p]
        run(*args)
    rc, rh = kres.Results(db["cap"]).runs(), kres.Results(db["hooks"]).runs()
    assert len(rc) == len(rh) == len(POLICIES) * 3
    worst = {m: 0.0 for m in QUALITY}
    for a_, b_ in zip(rc, rh):
        assert (a_["policy"], a_["params"], a_["budget_tokens"]) == (b_["policy"], b_["params"], b_["budget_tokens"])
        for m in BYTES:
            assert a_["metrics"][m] == b_["metrics"][m], (a_["policy"], m)
        for m in QUALITY:
            d = abs(a_["metrics"][m]["mean"] - b_["metrics"][m]["mean"])
            worst[m] = max(worst[m], d)
            print("%s %-9s B=%-3d %-13s capture %.6f hooks %.6f delta %.2e" % (
                name, a_["policy"], a_["budget_tokens"], m, a_["metrics"][m]["mean"], b_["metrics"][m]["mean"], d))
    print("%s replay: bytes and attended tokens equal; largest |delta| of the run means: %s" % (
        name, ", ".join("%s %.2e" % kv for kv in worst.items())))
    # Tolerance 1e-5 on the run means. The two traces differ only in the fp16 rounding of values computed in
    # float64 (the reference) and in fp32 (kvsim's capture): 0.1-0.4% of the stored codes, each by about one
    # rounding of its vector, which moves a step's error by ~1e-3 of itself; averaged over the ~4000 (head, step)
    # samples of a run that measured ~1e-7. A near-tie flipped in a policy's ranking would move one sample's
    # error by up to ~1e-2, i.e. the mean by ~3e-6: still inside. Anything wrong in what the hooks recorded (a
    # head, a position or the RoPE layout off) moves the means by 1e-2 or more.
    for m in QUALITY:
        assert worst[m] < 1e-5, (m, worst[m])


def case_hooks():
    hooks_one(os.path.join(MODELS, "stories260K.bin"), "stories260K", 100)
    hooks_one(os.path.join(MODELS, "tinystories-656K"), "tinystories-656K", 100)
    print("PASS hooks")


# ---------------------------------------------------------------------------------------------- results
def case_results():
    trace = os.path.join(ROOT, "examples", "stories260K.kvt")
    db = os.path.join(TMP, "r.db")
    for f in (db, db + "-wal", db + "-shm"):
        if os.path.exists(f):
            os.unlink(f)
    run("replay", trace, "--db", db, "--policy", "h2o", "--policy", "window", "--policy", "snapkv", "--budgets",
        "24,48", "--threads", "1", "--series-every", "1")
    r = kres.Results(db)
    runs = r.runs()
    assert len(runs) == 6
    # kvsim runs --json: every run-wide statistic
    js = {x["id"]: x for x in json.loads(run("runs", db, "--json").stdout)}
    n = 0
    for x in runs:
        j = js[x["id"]]
        assert (j["policy"], j["params"], j["budget_tokens"], j["trace"]["path"]) == (
            x["policy"], x["params"], x["budget_tokens"], x["trace_path"])
        assert j["trace"]["sha256"] == x["trace_sha256"]
        for m, st in x["metrics"].items():
            for s, v in st.items():
                jv = j["metrics"][m][s]
                assert (jv is None and (v == 0 if s == "n" else math.isnan(v))) or jv == v, (x["id"], m, s, jv, v)
                n += 1
    # kvsim runs --csv: the per-layer rows
    rows = list(csv.DictReader(io.StringIO(run("runs", db, "--csv").stdout)))
    m_ = 0
    for row in rows:
        lay = {l["layer"]: l for l in r.layers(int(row["run_id"]))}[int(row["layer"])]
        for col in ("out_err_mean", "out_err_p95", "out_err_max", "attn_recall_mean", "topk_overlap_mean",
                    "storage_bytes_max"):
            met, st = col.rsplit("_", 1)
            assert float(row[col]) == lay["metrics"][met][st], (row["run_id"], row["layer"], col)
            m_ += 1
        assert float(row["traffic_bytes_per_step_mean"]) == lay["metrics"]["traffic_bytes"]["mean"]
    # the run-wide mean recomputed from the per-step series (every step stored: --series-every 1)
    for x in runs:
        s = r.steps(x["id"], ["out_err", "attended_tokens"])
        for met in ("out_err", "attended_tokens"):
            v = s[met][~np.isnan(s[met])]
            assert len(v) == x["metrics"][met]["n"]
            assert abs(v.mean() - x["metrics"][met]["mean"]) <= 1e-9 * max(1.0, abs(v.mean())), (x["id"], met)
    # kvsim compare: at a budget replayed, the run's own values; at equal memory, the interpolation in ln x between
    # the two runs that bracket X (results/SCHEMA.md), recomputed here from the values Python read
    byid = {x["id"]: x for x in runs}
    cmp_n = 0
    for match, at in (("tokens", "24"), ("mem", "2000")):
        rows = list(csv.DictReader(io.StringIO(run("compare", db, "--match", match, "--at", at, "--csv").stdout)))
        assert len(rows) == 3
        for row in rows:
            if row["status"] == "out_of_range":
                continue
            lo, hi = byid[int(row["run_lo"])], byid[int(row["run_hi"])]
            xl, xh = float(row["x_lo"]), float(row["x_hi"])
            xkey = "storage_bytes" if match == "mem" else None
            if xkey:
                assert xl == lo["metrics"][xkey]["mean"] and xh == hi["metrics"][xkey]["mean"]
            for col in ("out_err_mean", "out_err_p95", "attn_recall_mean", "topk_overlap_mean"):
                met, st = col.rsplit("_", 1)
                yl, yh = lo["metrics"][met][st], hi["metrics"][met][st]
                want = yl if xl == xh else yl + (yh - yl) * (math.log(float(at)) - math.log(xl)) / (math.log(xh) -
                                                                                                    math.log(xl))
                assert abs(float(row[col]) - want) <= 1e-12 * max(1.0, abs(want)), (match, row["policy"], col,
                                                                                   row[col], want)
                cmp_n += 1
    assert r.turns(runs[0]["trace_id"]) == [(0, 0, 239, 495)]
    print("results: %d run-wide statistics equal to `kvsim runs --json`, %d per-layer values to `--csv`, %d values "
          "of `kvsim compare` (exact and interpolated at equal memory) recomputed; run means recomputed from %d step "
          "rows" % (n, m_, cmp_n, sum(len(r.steps(x["id"], ["out_err"])["out_err"]) for x in runs)))
    ids, vals = r.summary("out_err")
    assert list(ids) == [x["id"] for x in runs] and np.all(vals > 0)
    print("PASS results")


# ---------------------------------------------------------------------------------------------- corrupt
def small_trace(path, dtype="fp16", record="full"):
    rng = np.random.default_rng(5)
    L, P, H, Hkv, d = 2, 21, 4, 2, 4
    q, k, v = (rng.standard_normal((L, P, n, d)) for n in (H, Hkv, Hkv))
    o = lse = None
    if record == "full":
        ol = [kvsim.attention_outputs(q[l], k[l], v[l], 0.5) for l in range(L)]
        o, lse = np.stack([x[0] for x in ol]), np.stack([x[1] for x in ol])
    kvsim.write_trace(path, q, k, v, o, lse, tokens=np.arange(P) % 7, roles=(np.arange(P) % 11 >= 6),
                      turns=np.arange(P) // 11, vocab_size=7, block_positions=8, dtype=dtype, record=record,
                      model_name="tiny", settings="x=1")
    return q, k, v


def expect_error(fn, cls=kvsim.TraceError, what=""):
    try:
        fn()
    except cls as ex:
        return str(ex)
    except Exception as ex:  # noqa: BLE001  (any other exception type is the defect this test looks for)
        raise AssertionError("%s: raised %s (%s), expected %s" % (what, type(ex).__name__, ex, cls.__name__))
    raise AssertionError("%s: no error, expected %s" % (what, cls.__name__))


def read_all(path):
    t = kvsim.Trace(path)
    t.check()
    t.arrays()
    t.close()


def case_corrupt():
    for dtype, record in (("fp16", "full"), ("bf16", "qkv")):
        p = os.path.join(TMP, "small_%s_%s.kvt" % (dtype, record))
        small_trace(p, dtype, record)
        verify_rc = run("verify", p, ok=False).returncode
        assert verify_rc == 0, verify_rc
        read_all(p)
        data = open(p, "rb").read()
        # the damaged copies go to memory (/dev/shm) when it is there: ~17000 small files
        scratch = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else TMP
        bad = os.path.join(scratch, "kvsim_check_trace_%d.kvt" % os.getpid())
        kinds = set()
        try:
            for i in range(len(data)):
                b = bytearray(data)
                b[i] ^= 1 << (i % 8)  # one bit a byte, each bit position in turn
                open(bad, "wb").write(b)
                msg = expect_error(lambda: read_all(bad), what="byte %d ^ 0x%02x" % (i, 1 << (i % 8)))
                kinds.add(msg.split(": ", 1)[1].split(":")[0][:40])
            for n in range(len(data)):
                open(bad, "wb").write(data[:n])
                expect_error(lambda: read_all(bad), what="truncated to %d bytes" % n)
        finally:
            if os.path.exists(bad):
                os.unlink(bad)
        print("%s %s (%d bytes): every one of %d single-bit flips (one a byte) and %d truncations raises TraceError "
              "(%d distinct leading messages)" % (dtype, record, len(data), len(data), len(data), len(kinds)))
    # the named classes: a flipped payload byte is a checksum error, a cut file a truncation
    p = os.path.join(TMP, "small_fp16_full.kvt")
    bad = os.path.join(TMP, "bad.kvt")
    data = bytearray(open(p, "rb").read())
    b = bytearray(data)
    b[200] ^= 4
    open(bad, "wb").write(b)
    assert "checksum" in expect_error(lambda: read_all(bad), kvsim.ChecksumError, "payload flip")
    open(bad, "wb").write(data[:-1])
    expect_error(lambda: read_all(bad), kvsim.TruncatedError, "cut by one byte")
    open(bad, "wb").write(data[:100])
    expect_error(lambda: read_all(bad), kvsim.TruncatedError, "cut to 100 bytes")
    expect_error(lambda: kvsim.Trace(os.path.join(TMP, "none.kvt")), FileNotFoundError, "missing file")

    # writer misuse: a clear TraceError, nothing left behind
    w_ok = dict(n_layers=1, n_heads=2, n_kv_heads=1, head_dim=4, vocab_size=10)
    out = os.path.join(TMP, "w.kvt")
    z = lambda *s: np.zeros(s)  # noqa: E731
    full = (z(1, 3, 2, 4), z(1, 3, 1, 4), z(1, 3, 1, 4), z(1, 3, 2, 4), z(1, 3, 2))
    cases = [
        ("bad q shape", lambda w: w.append([1, 2, 3], 0, 0, z(1, 3, 3, 4), *full[1:])),
        ("integer q", lambda w: w.append([1, 2, 3], 0, 0, np.zeros((1, 3, 2, 4), int), *full[1:])),
        ("NaN in k", lambda w: w.append([1, 2, 3], 0, 0, full[0], np.full((1, 3, 1, 4), np.nan), *full[2:])),
        ("fp16 overflow", lambda w: w.append([1, 2, 3], 0, 0, full[0] + 1e5, *full[1:])),
        ("token >= vocab", lambda w: w.append([1, 2, 10], 0, 0, *full)),
        ("negative token", lambda w: w.append([1, -2, 3], 0, 0, *full)),
        ("turn starts at 1", lambda w: w.append([1, 2, 3], 0, 1, *full)),
        ("turn jumps by 2", lambda w: w.append([1, 2, 3], 0, [0, 0, 2], *full)),
        ("prompt after generated", lambda w: w.append([1, 2, 3], [0, 1, 0], 0, *full)),
        ("role 2", lambda w: w.append([1, 2, 3], [0, 2, 1], 0, *full)),
        ("o missing", lambda w: w.append([1, 2, 3], 0, 0, *full[:3])),
        ("lse shape", lambda w: w.append([1, 2, 3], 0, 0, *full[:4], z(1, 3, 1))),
        ("closed with no position", lambda w: w.close()),
    ]
    for what, fn in cases:
        w = kvsim.TraceWriter(out, **w_ok)
        try:
            msg = expect_error(lambda: fn(w), what=what)
        finally:
            w.abort()
        assert not os.path.exists(out) and not os.path.exists(out + ".partial"), what
        print("writer, %s: %s" % (what, msg))
    # an exception inside a `with` block removes the .partial; a turn broken across two appends is caught
    try:
        with kvsim.TraceWriter(out, **w_ok) as w:
            w.append([1, 2, 3], [0, 0, 1], 0, *full)
            w.append([1, 2, 3], [0, 0, 1], 0, *full)
    except kvsim.TraceError as ex:
        print("writer, prompt after generated across appends: %s" % ex)
    else:
        raise AssertionError("a prompt position after a generated one across appends was accepted")
    assert not os.path.exists(out) and not os.path.exists(out + ".partial")
    for what, kw in (("n_heads % n_kv_heads", dict(w_ok, n_kv_heads=3, n_heads=4)), ("dtype", dict(w_ok, dtype="int8")),
                     ("head_dim 0", dict(w_ok, head_dim=0)), ("block 0", dict(w_ok, block_positions=0)),
                     ("record", dict(w_ok, record="kv")), ("long name", dict(w_ok, model_name="x" * 64))):
        msg = expect_error(lambda: kvsim.TraceWriter(out, **kw), what=what)
        assert not os.path.exists(out + ".partial"), what
        print("writer config, %s: %s" % (what, msg))

    # results: files that are not kvsim databases
    notdb = os.path.join(TMP, "not.db")
    open(notdb, "wb").write(b"hello world, not sqlite at all")
    expect_error(lambda: kres.Results(notdb), kres.ResultsError, "text file")
    open(notdb, "wb").close()
    assert "empty" in expect_error(lambda: kres.Results(notdb), kres.ResultsError, "empty file")
    import sqlite3
    other = os.path.join(TMP, "other.db")
    c = sqlite3.connect(other)
    c.execute("CREATE TABLE meta (key TEXT, value TEXT)")
    c.execute("INSERT INTO meta VALUES ('creator', 'someone')")
    c.commit()
    c.close()
    before = open(other, "rb").read()
    assert "not a kvsim" in expect_error(lambda: kres.Results(other), kres.ResultsError, "other program's db")
    assert open(other, "rb").read() == before
    print("PASS corrupt")


def main():
    global TMP
    if len(sys.argv) < 3:
        sys.exit("usage: check_trace.py TMPDIR CASE...")
    TMP = sys.argv[1]
    os.makedirs(TMP, exist_ok=True)
    sys.path.insert(0, HERE)
    for c in sys.argv[2:]:
        globals()["case_" + c]()


if __name__ == "__main__":
    main()
