#!/usr/bin/env python3
"""transformers judges the rotaries autoshard builds from a Hugging Face config.json.

Per case, a tiny transformers model of a family whose rotary turns part of each head
(GPT-NeoX's rotary_pct, default 0.25; transformers 5's rope_parameters.partial_rotary_factor;
Phi-3's / Phi-4-mini's partial_rotary_factor), or the whole head (a control), is made from its
config; the config as `save_pretrained` writes it is planned by `autoshard plan --model
config.json` (inference, 1x2), and the plan's graph must hold, for q and k of every layer, a
rotary that turns what transformers turns:
  * its frequencies: pair i of the R turned dims (rotary_dims; 0 or absent: the whole head) at
    rotary_base^(-2i/R), or its explicit rotary_frequencies, are the model's own
    rotary_emb.inv_freq, R/2 of them (float32: 1e-5 relative);
  * its turn: the graph's rotary, as docs/graph.md defines it (the first R dims of each head,
    rotate_half's pairs (i, i + R/2) with rotary_half, the other dims unchanged), applied to a
    random q [1, heads, S, D] equals transformers' own apply_rotary_pos_emb of the model's
    module with the model's cos and sin (1e-5);
  * it runs with the heads split: every rotary is pinned (--pin NAME=RRS1) to its heads split
    over the 2 ranks (the solver would split this small batch), the plan is checked to hold
    that layout (each rotary's strategy RRS1->RRS1, so rank 1 turns the second half of the
    heads from its own piece), and `autoshard verify --forward-only` executes it on 2 Gloo
    ranks and matches the unsharded forward.
Usage: rotary_test.py --tool build/release/tools/autoshard [--only NAME ...]
"""
import importlib, os, sys

os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = "1"
import torch  # noqa: E402
import transformers  # noqa: E402

import cases  # noqa: E402  (the command line and the loop; this script's directory is on sys.path)

transformers.logging.set_verbosity_error()
SEQ = 16
SMALL = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128, vocab_size=128,
             max_position_embeddings=64)

CASES = {
    # Pythia's: GPTNeoXConfig's default rotary_pct 0.25 of heads of 16, R = 4.
    "gpt_neox-default": (transformers.GPTNeoXConfig, dict(SMALL), "gpt_neox"),
    "gpt_neox-pct-0.5-linear": (transformers.GPTNeoXConfig,
                                dict(SMALL, rotary_pct=0.5, rope_scaling={"rope_type": "linear", "factor": 4.0}), "gpt_neox"),
    # Phi-4-mini's 0.75 of heads of 24 (R = 18), over 2 key/value heads.
    "phi3-partial-0.75": (transformers.Phi3Config,
                          dict(SMALL, hidden_size=96, num_key_value_heads=2, partial_rotary_factor=0.75, pad_token_id=0,
                               bos_token_id=1, eos_token_id=2), "phi3"),
    # The whole head, at LLaMA-3's base: the control.
    "llama-whole": (transformers.LlamaConfig, dict(SMALL, rope_theta=500000.0), "llama"),
}


# Where a family's attention (and its rotaries) sit in the graph, layer i at {}.
ATTENTION_PREFIX = {"gpt_neox": "gpt_neox.layers.{}.attention", "phi3": "model.layers.{}.self_attn", "llama": "model.layers.{}.self_attn"}


def graph_turn(attrs, x):
    """The rotary of graph attributes `attrs` on x [B, heads, S, D], as docs/graph.md defines it."""
    D = x.shape[-1]
    R = attrs.get("rotary_dims") or D
    freqs = attrs.get("rotary_frequencies") or [attrs.get("rotary_base", 10000.0) ** (-2 * i / R) for i in range(R // 2)]
    pos = torch.arange(x.shape[-2], dtype=torch.float64)[:, None]
    angle = pos * torch.tensor(freqs, dtype=torch.float64)[None, :]  # [S, R/2]
    cos, sin = torch.cos(angle), torch.sin(angle)
    y = x.clone()
    if attrs.get("rotary_half"):
        a, b = slice(0, R // 2), slice(R // 2, R)
    else:
        a, b = slice(0, R, 2), slice(1, R, 2)
    y[..., a] = x[..., a] * cos - x[..., b] * sin
    y[..., b] = x[..., a] * sin + x[..., b] * cos
    return y


def check(name, tool, work):
    config_class, kwargs, family = CASES[name]
    torch.manual_seed(0)
    config = config_class(**kwargs)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    # q's and k's rotary of every layer pinned to the heads split over the 2 ranks.
    prefix = ATTENTION_PREFIX[family]
    pins = cases.heads_split_pins(f"{prefix.format(i)}.{r}" for i in range(config.num_hidden_layers) for r in ("rotary_q", "rotary_k"))
    plan, nodes = cases.plan_config(tool, config, work, name, SEQ, pins)
    rotaries = [n for n in nodes if n["kind"] == "rotary"]
    if len(rotaries) != 2 * config.num_hidden_layers:
        raise AssertionError(f"{len(rotaries)} rotary vertices, expected q's and k's of {config.num_hidden_layers} layers")
    inv = [float(f) for f in model.model.rotary_emb.inv_freq] if hasattr(model, "model") else \
          [float(f) for f in model.gpt_neox.rotary_emb.inv_freq]
    heads = config.num_attention_heads
    D = config.hidden_size // heads
    R = len(inv) * 2
    # transformers' own turn: its family's apply_rotary_pos_emb with the model's cos and sin.
    modeling = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    rotary_emb = model.model.rotary_emb if hasattr(model, "model") else model.gpt_neox.rotary_emb
    q = torch.randn(1, heads, SEQ, D, dtype=torch.float64)
    positions = torch.arange(SEQ)[None, :]
    with torch.no_grad():
        cos, sin = rotary_emb(q.float(), positions)
        want, _ = modeling.apply_rotary_pos_emb(q, q.clone(), cos.double(), sin.double())
    for rot in rotaries:
        a = rot["attrs"]
        turned = a.get("rotary_dims") or D
        freqs = a.get("rotary_frequencies") or [a.get("rotary_base", 10000.0) ** (-2 * i / turned) for i in range(turned // 2)]
        if turned != R or len(freqs) != len(inv) or any(abs(x / y - 1) > 1e-5 for x, y in zip(freqs, inv)):
            raise AssertionError(f"{rot['name']}: turns {turned} dims at {freqs[:3]}..., transformers {R} of {D} at {inv[:3]}...")
        err = (graph_turn(a, q) - want).abs().max().item()
        if err > 1e-5:
            raise AssertionError(f"{rot['name']} ({a}): the graph's turn differs from transformers' apply_rotary_pos_emb by {err}")
    cases.check_heads_split(plan, "rotary", len(rotaries))
    cases.verify_forward(tool, plan)
    return f"{len(rotaries)} rotaries turn {R} of {D} dims at transformers' {len(inv)} frequencies, as its " \
           f"apply_rotary_pos_emb does; verified on 2 ranks, heads split"


def main():
    return cases.run(CASES, check)


if __name__ == "__main__":
    sys.exit(main())
