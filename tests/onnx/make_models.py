#!/usr/bin/env python3
"""Writes the ONNX models the tests plan, with python3-onnx's helper API (Debian's package).

  python3 tests/onnx/make_models.py OUTDIR
  python3 tests/onnx/make_models.py --tiny OUTDIR   # a 1-layer GPT-2 of width 8: fuzz/corpus/onnx
  python3 tests/onnx/make_models.py --mlp FILE      # docs/getting-started.md's MLP, as torch exports it

gpt2-block.onnx        a GPT-2 model as torch.onnx.export writes transformers' GPT2LMHeadModel
                       at opset 14: token and position Gather, per layer the decomposed layer
                       norm (ReduceMean, Sub, Pow, Add, Sqrt, Div, Mul, Add), c_attn MatMul +
                       Add, Split into q/k/v, Reshape + Transpose into heads, scores MatMul,
                       Div by sqrt(head_dim), the causal mask as GPT2Attention applies it
                       (Where(bias[:, :, :S, :S], scores, finfo(float32).min) with the bool
                       `bias` buffer), Softmax, MatMul with v, Transpose + Reshape back,
                       c_proj, the residual Add, the MLP with gelu_new (0.5 x (1 + tanh(
                       sqrt(2/pi) (x + 0.044715 x^3)))), ln_f and the tied lm_head (MatMul by
                       Transpose of wte); batch and sequence symbolic. Initializers carry
                       Hugging Face's names and [in,out] Conv1D layouts.
gpt2-block-leaky.onnx  gpt2-block.onnx with one mask entry above the diagonal true: not causal.
gpt2-block-fused.onnx  the same model at opset 17: LayerNormalization nodes instead of the
                       pattern, and the older additive causal mask (0 / -1e4, Add).
gpt2-dynamo.onnx       the opset 17 model at opset 18 with attention as torch's dynamo exporter
                       writes scaled_dot_product_attention: the causal mask built at run time
                       from a Range over the sequence (LessOrEqual of positions, Where(mask, 0,
                       finfo.min) added to the scores), q and k^T each scaled by sqrt(scale),
                       k^T transposed over a 3-D view, the softmax guarded by
                       Where(IsNaN(p), 0, p).
llama-dynamo.onnx      LlamaAttention as torch's dynamo exporter writes it: rotary in the heads'
                       layout from the inv_freq buffer (base 500000), key/value heads repeated
                       (4 heads over 2), q and k^T scaled apart; -10k: the same at base 10000;
                       -llama3: base 500000 with Llama-3.1's rope_scaling (llama3_inv_freq);
                       -yarn: -llama3's tables times an attention factor of 1.1, as YaRN's.
rms-mlp.onnx           a LLaMA-style residual MLP block: RMSNorm as LlamaRMSNorm exports it
                       (Pow, ReduceMean, Add eps, Sqrt, Reciprocal, Mul, Mul by the weight), an
                       exact (Erf) GELU MLP, and a padding select Where(keep [batch, seq, 1],
                       y, Expand(fill [64] -> Shape(y))), and a mean as the loss (a scalar,
                       so that `verify` runs a training step).
rms-mlp-buffers.onnx   rms-mlp.onnx as torch's dynamo exporter marks its initializers: each has a
                       value_info whose metadata (pkg.torch.export.graph_signature.InputSpec.kind)
                       says PARAMETER, but the padding fill's, BUFFER (data, not a parameter).
unmapped.onnx          a small MLP with a custom-domain operator and a CumSum between its layers.
hostile-names.onnx     unmapped.onnx with an ESC sequence and a newline in a MatMul's name, the
                       custom operator's name and op_type, and a weight's name: a report prints
                       them escaped.
bad-*.onnx             hostile files: truncated, a dim of 2^62, raw_data that disagrees with
                       its shape, a cycle, a value_info that ONNX's shape inference contradicts
                       at an unnamed node.
"""
import math
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

LAYERS, HIDDEN, HEADS, VOCAB, POSITIONS = 2, 128, 4, 512, 128


def init(name, shape, rng):
    return numpy_helper.from_array((rng.standard_normal(shape) * 0.02).astype(np.float32), name)


def const(nodes, name, value, dtype=np.float32):
    nodes.append(helper.make_node("Constant", [], [name], name=name + "_const",
                                  value=numpy_helper.from_array(np.array(value, dtype=dtype), name)))
    return name


def gelu_tanh(nodes, x, p):
    """transformers' NewGELUActivation (gpt2's gelu_new) as torch.onnx.export writes it."""
    nodes.append(helper.make_node("Mul", [x, const(nodes, p + "half", 0.5)], [p + "hx"], name=p + "Mul"))
    nodes.append(helper.make_node("Pow", [x, const(nodes, p + "three", 3.0)], [p + "x3"], name=p + "Pow"))
    nodes.append(helper.make_node("Mul", [p + "x3", const(nodes, p + "c", 0.044715)], [p + "cx3"], name=p + "Mul_1"))
    nodes.append(helper.make_node("Add", [x, p + "cx3"], [p + "inner"], name=p + "Add"))
    nodes.append(helper.make_node("Mul", [p + "inner", const(nodes, p + "s2pi", math.sqrt(2.0 / math.pi))], [p + "arg"], name=p + "Mul_2"))
    nodes.append(helper.make_node("Tanh", [p + "arg"], [p + "t"], name=p + "Tanh"))
    nodes.append(helper.make_node("Add", [p + "t", const(nodes, p + "one", 1.0)], [p + "t1"], name=p + "Add_1"))
    nodes.append(helper.make_node("Mul", [p + "hx", p + "t1"], [p + "out"], name=p + "Mul_3"))
    return p + "out"


def gelu_erf(nodes, x, p):
    """torch.nn.GELU() (exact) as torch.onnx.export writes it."""
    nodes.append(helper.make_node("Div", [x, const(nodes, p + "sqrt2", math.sqrt(2.0))], [p + "g0"], name=p + "Div"))
    nodes.append(helper.make_node("Erf", [p + "g0"], [p + "g1"], name=p + "Erf"))
    nodes.append(helper.make_node("Add", [p + "g1", const(nodes, p + "one", 1.0)], [p + "g2"], name=p + "Add"))
    nodes.append(helper.make_node("Mul", [x, p + "g2"], [p + "g3"], name=p + "Mul"))
    nodes.append(helper.make_node("Mul", [p + "g3", const(nodes, p + "half", 0.5)], [p + "out"], name=p + "Mul_1"))
    return p + "out"


def gpt2(fused_norm, LAYERS=LAYERS, HIDDEN=HIDDEN, HEADS=HEADS, VOCAB=VOCAB, POSITIONS=POSITIONS, leaky_mask=False, dynamo=False):
    rng = np.random.default_rng(0)
    H, nh, hd = HIDDEN, HEADS, HIDDEN // HEADS
    nodes, inits = [], []
    inits += [init("transformer.wte.weight", [VOCAB, H], rng), init("transformer.wpe.weight", [POSITIONS, H], rng)]
    nodes.append(helper.make_node("Gather", ["transformer.wte.weight", "input_ids"], ["tok"], name="/transformer/wte/Gather"))
    nodes.append(helper.make_node("Gather", ["transformer.wpe.weight", "position_ids"], ["pos"], name="/transformer/wpe/Gather"))
    nodes.append(helper.make_node("Add", ["tok", "pos"], ["embed"], name="/transformer/Add"))
    nodes.append(helper.make_node("Dropout", ["embed"], ["h_in0"], name="/transformer/drop/Dropout"))
    shape_ids = 0

    def layer_norm(prefix, x, out):
        w, b = prefix + ".weight", prefix + ".bias"
        inits.append(numpy_helper.from_array(np.ones([H], np.float32), w))
        inits.append(numpy_helper.from_array(np.zeros([H], np.float32), b))
        p = "/" + prefix.replace(".", "/") + "/"
        if fused_norm:
            nodes.append(helper.make_node("LayerNormalization", [x, w, b], [out], name=p + "LayerNormalization", axis=-1, epsilon=1e-5))
            return out
        nodes.append(helper.make_node("ReduceMean", [x], [p + "mean"], name=p + "ReduceMean", axes=[-1]))
        nodes.append(helper.make_node("Sub", [x, p + "mean"], [p + "d"], name=p + "Sub"))
        nodes.append(helper.make_node("Pow", [p + "d", const(nodes, p + "two", 2.0)], [p + "sq"], name=p + "Pow"))
        nodes.append(helper.make_node("ReduceMean", [p + "sq"], [p + "var"], name=p + "ReduceMean_1", axes=[-1]))
        nodes.append(helper.make_node("Add", [p + "var", const(nodes, p + "eps", 1e-5)], [p + "ve"], name=p + "Add"))
        nodes.append(helper.make_node("Sqrt", [p + "ve"], [p + "s"], name=p + "Sqrt"))
        nodes.append(helper.make_node("Div", [p + "d", p + "s"], [p + "n"], name=p + "Div"))
        nodes.append(helper.make_node("Mul", [p + "n", w], [p + "g"], name=p + "Mul"))
        nodes.append(helper.make_node("Add", [p + "g", b], [out], name=p + "Add_1"))
        return out

    def linear(prefix, x, n_in, n_out, out):
        w, b = prefix + ".weight", prefix + ".bias"
        inits.extend([init(w, [n_in, n_out], rng), numpy_helper.from_array(np.zeros([n_out], np.float32), b)])
        p = "/" + prefix.replace(".", "/") + "/"
        nodes.append(helper.make_node("MatMul", [x, w], [p + "mm"], name=p + "MatMul"))
        nodes.append(helper.make_node("Add", [p + "mm", b], [out], name=p + "Add"))
        return out

    def dynamic_shape(x, tail, name):  # Shape -> Slice [0:2] -> Concat with constant tail, as torch writes views
        nonlocal shape_ids
        shape_ids += 1
        s = name + "_shape"
        nodes.append(helper.make_node("Shape", [x], [s], name=s))
        nodes.append(helper.make_node("Slice", [s, const(nodes, s + "_st", [0], np.int64), const(nodes, s + "_en", [2], np.int64)],
                                      [s + "_bs"], name=s + "_Slice"))
        nodes.append(helper.make_node("Concat", [s + "_bs", const(nodes, s + "_tail", tail, np.int64)], [s + "_new"], name=s + "_Concat", axis=0))
        return s + "_new"

    # the causal mask [1, 1, P, P] sliced to the sequence by the Shape of the scores: GPT2Attention's
    # bool `bias` buffer for Where, or the older additive form (0 / -1e4)
    if fused_norm:
        mask = np.triu(np.full([POSITIONS, POSITIONS], -1e4, np.float32), 1)[None, None]
    else:
        mask = np.tril(np.ones([POSITIONS, POSITIONS], np.bool_))[None, None]
        if leaky_mask:  # token 0 sees token 1: not causal, so not the attention kind
            mask[0, 0, 0, 1] = True
    if dynamo:  # the mask as torch's dynamo exporter builds it at run time, from positions
        seq = "/mask/seq"
        nodes.append(helper.make_node("Shape", ["input_ids"], ["/mask/ids_shape"], name="/mask/Shape"))
        nodes.append(helper.make_node("Slice", ["/mask/ids_shape", const(nodes, "/mask/s1", [1], np.int64),
                                                const(nodes, "/mask/s2", [2], np.int64)], ["/mask/seq1"], name="/mask/Slice"))
        nodes.append(helper.make_node("Squeeze", ["/mask/seq1"], [seq], name="/mask/Squeeze"))
        nodes.append(helper.make_node("Range", [const(nodes, "/mask/zero_i", 0, np.int64), seq, const(nodes, "/mask/one_i", 1, np.int64)],
                                      ["/mask/arange"], name="node_arange"))
        nodes.append(helper.make_node("Unsqueeze", ["/mask/arange", const(nodes, "/mask/ax0", [0], np.int64)], ["/mask/cols"], name="node_unsqueeze"))
        nodes.append(helper.make_node("Unsqueeze", ["/mask/arange", const(nodes, "/mask/ax1", [1], np.int64)], ["/mask/rows"], name="node_unsqueeze_1"))
        nodes.append(helper.make_node("LessOrEqual", ["/mask/cols", "/mask/rows"], ["/mask/le"], name="node_le"))
        nodes.append(helper.make_node("Unsqueeze", ["/mask/le", const(nodes, "/mask/ax01", [0, 1], np.int64)], ["/mask/mask"], name="node_unsqueeze_2"))
        nodes.append(helper.make_node("Where", ["/mask/mask", const(nodes, "/mask/zero_f", 0.0), const(nodes, "/mask/min", np.finfo(np.float32).min)],
                                      ["/mask/bias"], name="node_where"))
    x = "h_in0"
    for i in range(LAYERS):
        n = f"transformer.h.{i}"
        p = f"/transformer/h.{i}/attn/"
        h = layer_norm(n + ".ln_1", x, p + "ln_1_out")
        qkv = linear(n + ".attn.c_attn", h, H, 3 * H, p + "qkv")
        nodes.append(helper.make_node("Split", [qkv, const(nodes, p + "split", [H, H, H], np.int64)], [p + "q", p + "k", p + "v"],
                                      name=p + "Split", axis=2))
        heads = {}
        if dynamo:  # q, k, v into heads; k^T over a 3-D view; q and k^T each scaled by sqrt(scale)
            for t in ("q", "k", "v"):
                shp = dynamic_shape(p + t, [nh, hd], p + t + "_view")
                nodes.append(helper.make_node("Reshape", [p + t, shp], [p + t + "4"], name=p + "Reshape_" + t))
                nodes.append(helper.make_node("Transpose", [p + t + "4"], [p + t + "h"], name=p + "Transpose_" + t, perm=[0, 2, 1, 3]))
            kshape = p + "kt_shape"
            nodes.append(helper.make_node("Shape", [p + "kh"], [kshape], name=p + "Shape_kh"))
            nodes.append(helper.make_node("Slice", [kshape, const(nodes, p + "kf_s2", [2], np.int64), const(nodes, p + "kf_s4", [4], np.int64)],
                                          [p + "kf_tail"], name=p + "Slice_kf"))
            nodes.append(helper.make_node("Concat", [const(nodes, p + "kf_m1", [-1], np.int64), p + "kf_tail"], [p + "kflat_shape"],
                                          name=p + "Concat_kf", axis=0))
            nodes.append(helper.make_node("Reshape", [p + "kh", p + "kflat_shape"], [p + "kflat"], name=p + "Reshape_kflat"))
            nodes.append(helper.make_node("Transpose", [p + "kflat"], [p + "ktflat"], name=p + "Transpose_kt", perm=[0, 2, 1]))
            nodes.append(helper.make_node("Slice", [kshape, const(nodes, p + "kt_s0", [0], np.int64), const(nodes, p + "kt_s2", [2], np.int64)],
                                          [p + "kt_bh"], name=p + "Slice_kt_bh"))
            nodes.append(helper.make_node("Slice", [kshape, const(nodes, p + "kt_s2b", [2], np.int64), const(nodes, p + "kt_s3", [3], np.int64)],
                                          [p + "kt_s"], name=p + "Slice_kt_s"))
            nodes.append(helper.make_node("Concat", [p + "kt_bh", const(nodes, p + "kt_hd", [hd], np.int64), p + "kt_s"], [p + "kt_new"],
                                          name=p + "Concat_kt", axis=0))
            nodes.append(helper.make_node("Reshape", [p + "ktflat", p + "kt_new"], [p + "kt"], name=p + "Reshape_kt"))
            c = const(nodes, p + "sqrt_scale", math.sqrt(1.0 / math.sqrt(hd)))
            nodes.append(helper.make_node("Mul", [p + "qh", c], [p + "qs"], name=p + "Mul_q"))
            nodes.append(helper.make_node("Mul", [p + "kt", c], [p + "ks"], name=p + "Mul_k"))
            nodes.append(helper.make_node("MatMul", [p + "qs", p + "ks"], [p + "scores"], name=p + "MatMul"))
            nodes.append(helper.make_node("Add", [p + "scores", "/mask/bias"], [p + "masked"], name=p + "Add_mask"))
            nodes.append(helper.make_node("Softmax", [p + "masked"], [p + "probs0"], name=p + "Softmax", axis=-1))
            nodes.append(helper.make_node("IsNaN", [p + "probs0"], [p + "nan"], name=p + "IsNaN"))
            nodes.append(helper.make_node("Where", [p + "nan", const(nodes, p + "zero", 0.0), p + "probs0"], [p + "probs"], name=p + "Where_guard"))
            nodes.append(helper.make_node("MatMul", [p + "probs", p + "vh"], [p + "ctx4"], name=p + "MatMul_1"))
        for t, perm in (("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1]), ("v", [0, 2, 1, 3])) if not dynamo else ():
            shp = dynamic_shape(p + t, [nh, hd], p + t + "_view")
            nodes.append(helper.make_node("Reshape", [p + t, shp], [p + t + "4"], name=p + "Reshape_" + t))
            nodes.append(helper.make_node("Transpose", [p + t + "4"], [p + t + "t"], name=p + "Transpose_" + t, perm=perm))
            heads[t] = p + t + "t"
        if not dynamo:
            nodes.append(helper.make_node("MatMul", [heads["q"], heads["k"]], [p + "scores"], name=p + "MatMul"))
            nodes.append(helper.make_node("Div", [p + "scores", const(nodes, p + "scale", math.sqrt(hd))], [p + "scaled"], name=p + "Div"))
            inits.append(numpy_helper.from_array(mask, n + ".attn.bias_mask"))
            nodes.append(helper.make_node("Shape", [p + "scores"], [p + "sshape"], name=p + "Shape_scores"))
            nodes.append(helper.make_node("Slice", [p + "sshape", const(nodes, p + "ss_st", [2], np.int64), const(nodes, p + "ss_en", [4], np.int64)],
                                          [p + "seq2"], name=p + "Slice_seq"))
            nodes.append(helper.make_node("Slice", [n + ".attn.bias_mask", const(nodes, p + "m_st", [0, 0], np.int64), p + "seq2",
                                                    const(nodes, p + "m_ax", [2, 3], np.int64)], [p + "mask"], name=p + "Slice_mask"))
            if fused_norm:
                nodes.append(helper.make_node("Add", [p + "scaled", p + "mask"], [p + "masked"], name=p + "Add_mask"))
            else:
                nodes.append(helper.make_node("Where", [p + "mask", p + "scaled", const(nodes, p + "min", np.finfo(np.float32).min)],
                                              [p + "masked"], name=p + "Where"))
            nodes.append(helper.make_node("Softmax", [p + "masked"], [p + "probs"], name=p + "Softmax", axis=-1))
            nodes.append(helper.make_node("MatMul", [p + "probs", heads["v"]], [p + "ctx4"], name=p + "MatMul_1"))
        nodes.append(helper.make_node("Transpose", [p + "ctx4"], [p + "ctxt"], name=p + "Transpose_ctx", perm=[0, 2, 1, 3]))
        shp = dynamic_shape(p + "ctxt", [H], p + "ctx_view")
        nodes.append(helper.make_node("Reshape", [p + "ctxt", shp], [p + "ctx"], name=p + "Reshape_ctx"))
        a = linear(n + ".attn.c_proj", p + "ctx", H, H, p + "proj")
        nodes.append(helper.make_node("Add", [x, a], [p + "res"], name=f"/transformer/h.{i}/Add"))
        x = p + "res"
        m = f"/transformer/h.{i}/mlp/"
        h = layer_norm(n + ".ln_2", x, m + "ln_2_out")
        h = linear(n + ".mlp.c_fc", h, H, 4 * H, m + "fc")
        h = linear(n + ".mlp.c_proj", gelu_tanh(nodes, h, m + "act/"), 4 * H, H, m + "proj")
        nodes.append(helper.make_node("Add", [x, h], [m + "res"], name=f"/transformer/h.{i}/Add_1"))
        x = m + "res"
    h = layer_norm("transformer.ln_f", x, "ln_f_out")
    nodes.append(helper.make_node("Transpose", ["transformer.wte.weight"], ["wte_t"], name="/lm_head/Transpose", perm=[1, 0]))
    nodes.append(helper.make_node("MatMul", [h, "wte_t"], ["logits"], name="/lm_head/MatMul"))
    graph = helper.make_graph(
        nodes, "gpt2",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"]),
         helper.make_tensor_value_info("position_ids", TensorProto.INT64, [1, "sequence"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "sequence", VOCAB])], inits)
    opset = 18 if dynamo else 17 if fused_norm else 14
    model = helper.make_model(graph, producer_name="autoshard-tests", opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def llama3_inv_freq(base, D, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original=8192):
    """transformers' _compute_llama3_parameters (modeling_rope_utils), in numpy float64:
    frequencies whose wavelength 2 pi / f is below original / high_freq_factor are kept, above
    original / low_freq_factor divided by factor, and interpolated between."""
    inv = base ** (-np.arange(0, D, 2, dtype=np.float64) / D)
    wavelen = 2 * math.pi / inv
    smooth = (original / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    mid = (1 - smooth) * inv / factor + smooth * inv
    return np.where(wavelen < original / high_freq_factor, inv, np.where(wavelen > original / low_freq_factor, inv / factor, mid))


def llama_attention(H=64, HEADS=4, KV=2, BASE=500000.0, INV=None, ATTENTION_FACTOR=1.0):
    """LlamaAttention as torch's dynamo exporter writes it, on x [batch, sequence, H]: q/k/v
    projections (MatMul by the [in, out] weights the exporter folds), heads by Reshape +
    Transpose, q and k turned by apply_rotary_pos_emb in the heads' layout (x * cos +
    cat(-x[..., D/2:], x[..., :D/2]) * sin, the tables cos/sin of Range(0, S) x the inv_freq
    buffer, BASE^(-2i/D), concatenated twice), k and v repeated for the query heads (repeat_kv:
    Unsqueeze, Expand, Reshape), q and k^T each scaled by sqrt(1/sqrt(D)), softmax, merged back
    and o_proj. inv_freq is marked a BUFFER as the exporter marks it; INV replaces its values
    (scaled frequencies), and an ATTENTION_FACTOR other than 1 multiplies cos and sin."""
    rng = np.random.default_rng(5)
    D = H // HEADS
    nodes = []
    p = "/model/layers.0/self_attn/"
    inv = (BASE ** (-np.arange(0, D, 2, dtype=np.float64) / D) if INV is None else np.asarray(INV, np.float64)).astype(np.float32)
    inits = [numpy_helper.from_array(inv, "model.rotary_emb.inv_freq")]
    for name, n_out in (("q_proj", H), ("k_proj", KV * D), ("v_proj", KV * D), ("o_proj", H)):
        inits.append(init(f"model.layers.0.self_attn.{name}.weight", [H, n_out], rng))

    def i64(name, v):
        return const(nodes, p + name, v, np.int64)
    nodes.append(helper.make_node("Shape", ["x"], [p + "xs"], name=p + "Shape"))
    nodes.append(helper.make_node("Gather", [p + "xs", i64("one", 1)], [p + "seq"], name=p + "Gather_seq", axis=0))
    nodes.append(helper.make_node("Gather", [p + "xs", i64("zero", 0)], [p + "bat"], name=p + "Gather_batch", axis=0))
    nodes.append(helper.make_node("Range", [i64("r0", 0), p + "seq", i64("r1", 1)], [p + "pos"], name="node_arange"))
    nodes.append(helper.make_node("Cast", [p + "pos"], [p + "posf"], name="node_to_copy", to=TensorProto.FLOAT))
    nodes.append(helper.make_node("Unsqueeze", [p + "posf", i64("axl", [-1])], [p + "pos2"], name="node_unsqueeze"))
    nodes.append(helper.make_node("Mul", [p + "pos2", "model.rotary_emb.inv_freq"], [p + "freqs"], name="node_mul"))
    nodes.append(helper.make_node("Concat", [p + "freqs", p + "freqs"], [p + "emb"], name="node_cat", axis=-1))
    for f in ("Cos", "Sin"):
        table = p + f.lower()
        nodes.append(helper.make_node(f, [p + "emb"], [table], name="node_" + f.lower()))
        if ATTENTION_FACTOR != 1.0:  # cos() * attention_scaling, sin() * attention_scaling
            af = const(nodes, table + "_af", ATTENTION_FACTOR)
            nodes.append(helper.make_node("Mul", [table, af], [table + "_scaled"], name="node_" + f.lower() + "_factor"))
            table += "_scaled"
        nodes.append(helper.make_node("Unsqueeze", [table, i64(f.lower() + "_ax", [0, 1])], [p + f.lower() + "4"],
                                      name="node_unsqueeze_" + f.lower()))

    def view(x, tail, name):  # Reshape(x, [batch, seq] + tail), the shape built from Shape(x) as torch writes views
        nodes.append(helper.make_node("Unsqueeze", [p + "bat", i64(name + "_a0", [0])], [p + name + "_b"], name=p + name + "_ub"))
        nodes.append(helper.make_node("Unsqueeze", [p + "seq", i64(name + "_a1", [0])], [p + name + "_s"], name=p + name + "_us"))
        nodes.append(helper.make_node("Concat", [p + name + "_b", p + name + "_s", i64(name + "_t", tail)], [p + name + "_shape"],
                                      name=p + name + "_Concat", axis=0))
        nodes.append(helper.make_node("Reshape", [x, p + name + "_shape"], [p + name], name=p + name))
        return p + name
    heads = {}
    for t, n in (("q", HEADS), ("k", KV), ("v", KV)):
        nodes.append(helper.make_node("MatMul", ["x", f"model.layers.0.self_attn.{t}_proj.weight"], [p + t], name=f"/model/layers.0/self_attn/{t}_proj/MatMul"))
        nodes.append(helper.make_node("Transpose", [view(p + t, [n, D], t + "_view")], [p + t + "h"], name=p + "Transpose_" + t, perm=[0, 2, 1, 3]))
        heads[t] = p + t + "h"
    for t in ("q", "k"):  # apply_rotary_pos_emb
        x = heads[t]
        nodes.append(helper.make_node("Mul", [x, p + "cos4"], [p + t + "_c"], name=p + "Mul_cos_" + t))
        nodes.append(helper.make_node("Slice", [x, i64(t + "_lo0", [0]), i64(t + "_lo1", [D // 2]), i64(t + "_lax", [-1])], [p + t + "_lo"],
                                      name=p + "Slice_lo_" + t))
        nodes.append(helper.make_node("Slice", [x, i64(t + "_hi0", [D // 2]), i64(t + "_hi1", [2 ** 63 - 1]), i64(t + "_hax", [-1])],
                                      [p + t + "_hi"], name=p + "Slice_hi_" + t))
        nodes.append(helper.make_node("Neg", [p + t + "_hi"], [p + t + "_n"], name=p + "Neg_" + t))
        nodes.append(helper.make_node("Concat", [p + t + "_n", p + t + "_lo"], [p + t + "_rh"], name=p + "Concat_rh_" + t, axis=-1))
        nodes.append(helper.make_node("Mul", [p + t + "_rh", p + "sin4"], [p + t + "_s"], name=p + "Mul_sin_" + t))
        nodes.append(helper.make_node("Add", [p + t + "_c", p + t + "_s"], [p + t + "_r"], name=p + "Add_rot_" + t))
        heads[t] = p + t + "_r"
    rep = HEADS // KV
    for t in ("k", "v"):  # repeat_kv: [B, kv, S, D] -> [B, kv, rep, S, D] -> [B, kv * rep, S, D]
        nodes.append(helper.make_node("Unsqueeze", [heads[t], i64(t + "_rep_ax", [2])], [p + t + "_u"], name=p + "Unsqueeze_rep_" + t))
        nodes.append(helper.make_node("Unsqueeze", [p + "bat", i64(t + "_eb_ax", [0])], [p + t + "_eb"], name=p + "Unsqueeze_eb_" + t))
        nodes.append(helper.make_node("Unsqueeze", [p + "seq", i64(t + "_es_ax", [0])], [p + t + "_es"], name=p + "Unsqueeze_es_" + t))
        nodes.append(helper.make_node("Concat", [p + t + "_eb", i64(t + "_e1", [KV, rep]), p + t + "_es", i64(t + "_e2", [D])],
                                      [p + t + "_eshape"], name=p + "Concat_e_" + t, axis=0))
        nodes.append(helper.make_node("Expand", [p + t + "_u", p + t + "_eshape"], [p + t + "_e"], name=p + "Expand_" + t))
        nodes.append(helper.make_node("Concat", [p + t + "_eb", i64(t + "_r1", [HEADS]), p + t + "_es", i64(t + "_r2", [D])],
                                      [p + t + "_rshape"], name=p + "Concat_r_" + t, axis=0))
        nodes.append(helper.make_node("Reshape", [p + t + "_e", p + t + "_rshape"], [p + t + "_rep"], name=p + "Reshape_rep_" + t))
        heads[t] = p + t + "_rep"
    c = const(nodes, p + "sqrt_scale", math.sqrt(1.0 / math.sqrt(D)))
    nodes.append(helper.make_node("Transpose", [heads["k"]], [p + "kt"], name=p + "Transpose_kt", perm=[0, 1, 3, 2]))
    nodes.append(helper.make_node("Mul", [heads["q"], c], [p + "qs"], name=p + "Mul_q"))
    nodes.append(helper.make_node("Mul", [p + "kt", c], [p + "ks"], name=p + "Mul_k"))
    nodes.append(helper.make_node("MatMul", [p + "qs", p + "ks"], [p + "scores"], name=p + "MatMul"))
    nodes.append(helper.make_node("Softmax", [p + "scores"], [p + "probs"], name=p + "Softmax", axis=-1))
    nodes.append(helper.make_node("MatMul", [p + "probs", heads["v"]], [p + "ctx4"], name=p + "MatMul_1"))
    nodes.append(helper.make_node("Transpose", [p + "ctx4"], [p + "ctxt"], name=p + "Transpose_ctx", perm=[0, 2, 1, 3]))
    nodes.append(helper.make_node("MatMul", [view(p + "ctxt", [H], "ctx_view"), "model.layers.0.self_attn.o_proj.weight"], ["y"],
                                  name="/model/layers.0/self_attn/o_proj/MatMul"))
    graph = helper.make_graph(nodes, "llama_attention",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "sequence", H])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "sequence", H])], inits)
    model = helper.make_model(graph, producer_name="autoshard-tests", opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return with_input_specs(model, {"model.rotary_emb.inv_freq"})


def mlp():
    """torch.nn.Sequential(Linear(256, 1024), GELU(), Linear(1024, 256)) through torch.onnx.export
    (opset 14, input x [batch, 256]): Gemm with transB for each Linear, the Erf pattern for GELU."""
    rng = np.random.default_rng(2)
    nodes = [helper.make_node("Gemm", ["x", "0.weight", "0.bias"], ["h"], name="/0/Gemm", alpha=1.0, beta=1.0, transB=1)]
    g = gelu_erf(nodes, "h", "/1/")
    nodes.append(helper.make_node("Gemm", [g, "2.weight", "2.bias"], ["y"], name="/2/Gemm", alpha=1.0, beta=1.0, transB=1))
    inits = [init("0.weight", [1024, 256], rng), init("0.bias", [1024], rng), init("2.weight", [256, 1024], rng), init("2.bias", [256], rng)]
    graph = helper.make_graph(nodes, "main_graph", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 256])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 256])], inits)
    model = helper.make_model(graph, producer_name="pytorch", opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 7
    onnx.checker.check_model(model)
    return model


def rms_mlp(H=64, F=256):
    rng = np.random.default_rng(3)
    nodes, p = [], "/model/norm/"
    inits = [numpy_helper.from_array(np.ones([H], np.float32), "model.norm.weight"),
             init("model.mlp.up_proj.weight", [F, H], rng), init("model.mlp.down_proj.weight", [H, F], rng),
             init("model.pad_fill", [H], rng)]
    nodes.append(helper.make_node("Pow", ["x", const(nodes, p + "two", 2.0)], [p + "sq"], name=p + "Pow"))
    nodes.append(helper.make_node("ReduceMean", [p + "sq"], [p + "ms"], name=p + "ReduceMean", axes=[-1], keepdims=1))
    nodes.append(helper.make_node("Add", [p + "ms", const(nodes, p + "eps", 1e-6)], [p + "mse"], name=p + "Add"))
    nodes.append(helper.make_node("Sqrt", [p + "mse"], [p + "rms"], name=p + "Sqrt"))
    nodes.append(helper.make_node("Reciprocal", [p + "rms"], [p + "inv"], name=p + "Reciprocal"))
    nodes.append(helper.make_node("Mul", ["x", p + "inv"], [p + "xn"], name=p + "Mul"))
    nodes.append(helper.make_node("Mul", ["model.norm.weight", p + "xn"], ["normed"], name=p + "Mul_1"))
    for name, w in (("up", "model.mlp.up_proj.weight"), ("down", "model.mlp.down_proj.weight")):
        nodes.append(helper.make_node("Transpose", [w], [name + "_wt"], name=f"/model/mlp/{name}_proj/Transpose", perm=[1, 0]))
    nodes.append(helper.make_node("MatMul", ["normed", "up_wt"], ["up"], name="/model/mlp/up_proj/MatMul"))
    act = gelu_erf(nodes, "up", "/model/mlp/act/")
    nodes.append(helper.make_node("MatMul", [act, "down_wt"], ["down"], name="/model/mlp/down_proj/MatMul"))
    nodes.append(helper.make_node("Add", ["x", "down"], ["res"], name="/model/Add"))
    nodes.append(helper.make_node("Shape", ["res"], ["res_shape"], name="/model/Shape"))
    nodes.append(helper.make_node("Expand", ["model.pad_fill", "res_shape"], ["fill"], name="/model/Expand"))
    nodes.append(helper.make_node("Where", ["keep", "res", "fill"], ["y"], name="/model/Where"))
    nodes.append(helper.make_node("ReduceMean", ["y"], ["loss"], name="/loss/ReduceMean", keepdims=0))
    graph = helper.make_graph(
        nodes, "rms_mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "sequence", H]),
         helper.make_tensor_value_info("keep", TensorProto.BOOL, ["batch", "sequence", 1])],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])], inits)
    model = helper.make_model(graph, producer_name="autoshard-tests", opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def with_input_specs(model, buffers):
    """`model` with a value_info per initializer recording its kind as torch's dynamo exporter
    does (ValueInfoProto.metadata_props, field 4, ONNX 1.16: Debian's ONNX 1.12 predates it, so
    the entry is appended as the bytes a newer exporter writes): BUFFER for the names in
    `buffers`, PARAMETER for the others."""
    for t in model.graph.initializer:
        e = onnx.StringStringEntryProto(key="pkg.torch.export.graph_signature.InputSpec.kind",
                                        value="BUFFER" if t.name in buffers else "PARAMETER").SerializeToString()
        v = onnx.ValueInfoProto()
        v.ParseFromString(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)).SerializeToString() +
                          bytes([4 << 3 | 2, len(e)]) + e)
        model.graph.value_info.append(v)
    return model


def unmapped(fc1="fc1", fancy="fancy", fancy_type="FancyNorm", fc1_weight="fc1.weight"):
    rng = np.random.default_rng(1)
    nodes = [
        helper.make_node("MatMul", ["x", fc1_weight], ["h1"], name=fc1),
        helper.make_node("Relu", ["h1"], ["a1"], name="act1"),
        helper.make_node(fancy_type, ["a1"], ["n1"], name=fancy, domain="com.example"),
        helper.make_node("CumSum", ["n1", "axis"], ["c1"], name="cumsum"),
        helper.make_node("MatMul", ["c1", "fc2.weight"], ["y"], name="fc2"),
    ]
    inits = [init(fc1_weight, [32, 64], rng), init("fc2.weight", [64, 16], rng),
             numpy_helper.from_array(np.array(1, np.int64), "axis")]
    graph = helper.make_graph(nodes, "unmapped", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 16])], inits,
                              value_info=[helper.make_tensor_value_info("n1", TensorProto.FLOAT, ["batch", 64])])
    model = helper.make_model(graph, producer_name="autoshard-tests",
                              opset_imports=[helper.make_opsetid("", 14), helper.make_opsetid("com.example", 1)])
    model.ir_version = 8
    return model


def small(inits_override=None, input_shape=(4, 8), cycle=False, unnamed=False, value_info=()):
    w = numpy_helper.from_array(np.ones([8, 8], np.float32), "w")
    if inits_override is not None:
        w = inits_override
    a_in = "b" if cycle else "x"
    nodes = [helper.make_node("MatMul", [a_in, "w"], ["a"], name="first"),
             helper.make_node("Relu", ["a"], ["b"], name="" if unnamed else "second"),
             helper.make_node("Tanh", ["b"], ["y"], name="" if unnamed else "third")]
    graph = helper.make_graph(nodes, "small", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(input_shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w],
                              value_info=[helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in value_info])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    return model


def main():
    if sys.argv[1] == "--mlp":
        onnx.save(mlp(), sys.argv[2])
        return
    tiny = sys.argv[1] == "--tiny"
    out = sys.argv[2] if tiny else sys.argv[1]
    os.makedirs(out, exist_ok=True)
    sizes = dict(LAYERS=1, HIDDEN=8, HEADS=2, VOCAB=16, POSITIONS=8) if tiny else {}
    onnx.save(gpt2(False, **sizes), os.path.join(out, "gpt2-block.onnx"))
    onnx.save(gpt2(True, **sizes), os.path.join(out, "gpt2-block-fused.onnx"))
    onnx.save(gpt2(False, leaky_mask=True, **sizes), os.path.join(out, "gpt2-block-leaky.onnx"))
    onnx.save(gpt2(True, dynamo=True, **sizes), os.path.join(out, "gpt2-dynamo.onnx"))
    onnx.save(llama_attention(**(dict(H=8, HEADS=2, KV=1) if tiny else {})), os.path.join(out, "llama-dynamo.onnx"))
    onnx.save(llama_attention(BASE=10000.0, **(dict(H=8, HEADS=2, KV=1) if tiny else {})), os.path.join(out, "llama-dynamo-10k.onnx"))
    llama = dict(H=8, HEADS=2, KV=1) if tiny else dict(H=64, HEADS=4, KV=2)
    inv3 = llama3_inv_freq(500000.0, llama["H"] // llama["HEADS"])
    onnx.save(llama_attention(INV=inv3, **llama), os.path.join(out, "llama-dynamo-llama3.onnx"))
    onnx.save(llama_attention(INV=inv3, ATTENTION_FACTOR=1.1, **llama), os.path.join(out, "llama-dynamo-yarn.onnx"))
    onnx.save(unmapped(), os.path.join(out, "unmapped.onnx"))
    hostile = "a\x1b[31mb\nc"  # recolours a terminal, and forges a line of its own
    onnx.save(unmapped(fc1="fc1" + hostile, fancy="fancy" + hostile, fancy_type="Fancy" + hostile,
                       fc1_weight="w" + hostile), os.path.join(out, "hostile-names.onnx"))
    onnx.save(rms_mlp(**(dict(H=8, F=16) if tiny else {})), os.path.join(out, "rms-mlp.onnx"))
    onnx.save(with_input_specs(rms_mlp(**(dict(H=8, F=16) if tiny else {})), {"model.pad_fill"}),
              os.path.join(out, "rms-mlp-buffers.onnx"))
    good = small().SerializeToString()
    with open(os.path.join(out, "small.onnx"), "wb") as f:
        f.write(good)
    with open(os.path.join(out, "bad-truncated.onnx"), "wb") as f:
        f.write(good[: len(good) * 2 // 3])
    with open(os.path.join(out, "bad-huge-dim.onnx"), "wb") as f:
        f.write(small(input_shape=(4, 2 ** 62)).SerializeToString())
    short = onnx.TensorProto()
    short.name, short.data_type = "w", TensorProto.FLOAT
    short.dims.extend([8, 8])
    short.raw_data = np.ones([8, 7], np.float32).tobytes()
    with open(os.path.join(out, "bad-raw-data.onnx"), "wb") as f:
        f.write(small(inits_override=short).SerializeToString())
    with open(os.path.join(out, "bad-cycle.onnx"), "wb") as f:
        f.write(small(cycle=True).SerializeToString())
    # a value_info that contradicts what ONNX infers for an unnamed node's output
    with open(os.path.join(out, "bad-inference.onnx"), "wb") as f:
        f.write(small(unnamed=True, value_info=[("b", [4, 9])]).SerializeToString())


if __name__ == "__main__":
    main()
