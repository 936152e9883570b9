#!/usr/bin/env python3
"""transformers judges the sliding windows and the ALiBi biases autoshard builds from a Hugging
Face config.json.

Per case, a tiny transformers model of a family with a sliding window (Mistral's and Phi-3's
sliding_window on every layer; Qwen2's with use_sliding_window on the layers from
max_window_layers on, or on those its layer_types names) is made from its config, with a window
of 4 at a sequence of 16 (and controls: no window, a window at least the sequence). The config
as `save_pretrained` writes it is planned by `autoshard plan --model config.json` (inference,
1x2), and for every layer the plan's graph attention must mask what transformers masks:
  * transformers' own attention probabilities (attn_implementation "eager",
    output_attentions=True, on random token ids) are 0 exactly where the graph's mask drops a
    key, as docs/graph.md defines it (causal; with `window` W the query at q sees keys
    q-W+1..q) and positive everywhere else;
  * it runs: `autoshard verify --forward-only` executes the plan on 2 Gloo ranks and matches the
    unsharded forward. Each layer's attention is pinned to its heads split over the 2 ranks (the
    solver would split the batch, S1RR, where the window is each rank's whole), so every rank
    masks its own heads' keys with the window, and the plan is checked to split them.
The mask is compared here, layer by layer: the window dropped from the graph keeps keys
transformers drops, and the case fails. (real_weights_test.py compares whole models' logits on
a checkpoint's weights, a window among them.)

ALiBi (the alibi-* cases, in this process to spare the suite another start of torch): a tiny
BLOOM and tiny Falcons with alibi: true, 12 heads (not a power of two, so the extra slopes are
used), are planned the same way, and
  * every attention of the graph has the alibi rule of its family ("bloom", "falcon");
  * per layer, the queries and keys transformers computes (captured from query_key_value's
    output with a hook, split as the model's code splits it) scored by the graph's rule as
    docs/graph.md defines it (QK^T / sqrt(D) plus the rule's bias of the head's slope and the
    key's position, causal mask, softmax) give transformers' own attention probabilities
    (eager, output_attentions=True, float32) to 1e-6; the same rule without the bias, with the
    other family's rule, or (Falcon) without its bfloat16 rounding misses them by far more:
    the comparison can fail;
  * `autoshard verify --forward-only` runs the plan on 2 ranks, and the plan splits the heads
    there, so each rank must take its heads' global slopes.
Usage: sliding_window_test.py --tool build/release/tools/autoshard [--only NAME ...]
"""
import math, os, sys

os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = "1"
import torch  # noqa: E402
import transformers  # noqa: E402

import cases  # noqa: E402  (the command line and the loop; this script's directory is on sys.path)

transformers.logging.set_verbosity_error()
SEQ = 16
SMALL = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
             vocab_size=128, max_position_embeddings=64)
PHI = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)

CASES = {
    # name: (config class, its arguments, the window each layer must have (0: none))
    "mistral-window-4": (transformers.MistralConfig, dict(SMALL, sliding_window=4), [4, 4]),
    "phi3-window-4": (transformers.Phi3Config, dict(SMALL, **PHI, sliding_window=4), [4, 4]),
    # Qwen2Config: the window from max_window_layers on (layer 1 of 2 here)
    "qwen2-window-4-from-layer-1": (transformers.Qwen2Config,
                                    dict(SMALL, use_sliding_window=True, sliding_window=4, max_window_layers=1), [0, 4]),
    # layer_types named one by one, over max_window_layers
    "qwen2-layer-types": (transformers.Qwen2Config,
                          dict(SMALL, use_sliding_window=True, sliding_window=4, max_window_layers=0,
                               layer_types=["sliding_attention", "full_attention"]), [4, 0]),
    # controls: no window (Mistral's null; Qwen2 without use_sliding_window), a window at least the sequence
    "mistral-no-window": (transformers.MistralConfig, dict(SMALL, sliding_window=None), [0, 0]),
    "qwen2-not-used": (transformers.Qwen2Config, dict(SMALL, sliding_window=4, max_window_layers=0), [0, 0]),
    "mistral-window-32": (transformers.MistralConfig, dict(SMALL, sliding_window=32), [32, 32]),
}

ALIBI_SMALL = dict(hidden_size=96, vocab_size=128)  # 12 heads of 8
ALIBI_CASES = {
    # name: (config class, its arguments, the graph's rule, query_key_value's layout)
    "alibi-bloom-12-heads": (transformers.BloomConfig, dict(ALIBI_SMALL, n_layer=2, n_head=12), "bloom", "per-head"),
    # Falcon-RW's layout: one key/value per head, [heads, 3, D] rows, attention then MLP
    "alibi-falcon-12-heads": (transformers.FalconConfig,
                              dict(ALIBI_SMALL, num_hidden_layers=2, num_attention_heads=12, alibi=True, multi_query=False,
                                   parallel_attn=False, bias=True), "falcon", "per-head"),
    # FalconConfig's default multi_query: 12 query heads, one key/value (heads x D | D | D)
    "alibi-falcon-multi-query": (transformers.FalconConfig,
                                 dict(ALIBI_SMALL, num_hidden_layers=2, num_attention_heads=12, alibi=True), "falcon", "multi-query"),
}
CASES.update({name: None for name in ALIBI_CASES})


def f32(x):
    return float(torch.tensor(x, dtype=torch.float32))


def bf16(x):
    return float(torch.tensor(x, dtype=torch.float32).to(torch.bfloat16).float())


def alibi_slope(heads, h):
    """docs/graph.md's slope of head h of `heads` (float32): p = the largest power of two <= heads,
    b^(h+1) with b = 2^(-8/p) for h < p, else e^(2(h-p)+1) with e = 2^(-4/p)."""
    p = 1 << (heads.bit_length() - 1)
    base, power = (f32(2.0 ** (-8.0 / p)), h + 1) if h < p else (f32(2.0 ** (-4.0 / p)), 2 * (h - p) + 1)
    return f32(base ** power)


def alibi_scores(rule, q, k, bf16_rounding=True):
    """The graph's scores of q [B, H, S, D] and k [B, H or 1, S, D] (float64) by the alibi rule
    of docs/graph.md: QK^T / sqrt(D) + bias(h, j), 'bloom' float32(slope x j), 'falcon'
    bf16(bf16(slope) x bf16(j)) / sqrt(D) (without the rounding when told), 'none' 0."""
    B, H, S, D = q.shape
    scores = q.double() @ k.double().transpose(-1, -2) / math.sqrt(D)
    bias = torch.zeros(H, S, dtype=torch.float64)
    for h in range(H):
        s = alibi_slope(H, h)
        for j in range(S):
            if rule == "bloom":
                bias[h, j] = f32(s * j)
            elif rule == "falcon":
                bias[h, j] = (bf16(bf16(s) * bf16(j)) if bf16_rounding else s * j) / math.sqrt(D)
    return scores + bias[None, :, None, :]


def graph_probabilities(rule, q, k, bf16_rounding=True):
    S = q.shape[2]
    scores = alibi_scores(rule, q, k, bf16_rounding).masked_fill(~graph_keeps({"causal": True}, S), float("-inf"))
    return torch.softmax(scores, dim=-1)


def check_alibi(name, tool, work):
    config_class, kwargs, rule, layout = ALIBI_CASES[name]
    torch.manual_seed(0)
    config = config_class(**kwargs)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    # Each layer's attention pinned to its heads split over the 2 ranks (the solver would split
    # the batch): rank 1 holds heads 6..11 and must add their slopes, not heads 0..5's.
    pins = cases.heads_split_pins(f"transformer.h.{i}.self_attention.attention" for i in range(config.num_hidden_layers))
    plan, nodes = cases.plan_config(tool, config, work, name, SEQ, pins)
    cores = [n for n in nodes if n["kind"] == "attention"]
    rules = [c.get("attrs", {}).get("alibi", "none") for c in cores]
    if rules != [rule] * config.num_hidden_layers:
        raise AssertionError(f"the graph's alibi per layer is {rules}, expected {[rule] * config.num_hidden_layers}")
    H = cores[0]["attrs"]["heads"]
    D = config.hidden_size // H
    fused = []
    hooks = [m.register_forward_hook(lambda _m, _i, out: fused.append(out.detach()))
             for n, m in model.named_modules() if n.endswith("self_attention.query_key_value")]
    ids = torch.randint(3, config.vocab_size, (2, SEQ))
    with torch.no_grad():
        probs = model(ids, output_attentions=True).attentions  # per layer [B, heads, S, S]
    for h in hooks:
        h.remove()
    other = {"bloom": "falcon", "falcon": "bloom"}[rule]
    worst, nearest_control = 0.0, math.inf
    for layer, (qkv, p) in enumerate(zip(fused, probs)):
        B = qkv.shape[0]
        if layout == "per-head":  # [B, S, heads, 3, D]: BLOOM's _reshape, Falcon's unflatten(-2, (heads, 3))
            x = qkv.view(B, SEQ, H, 3, D)
            q, k = x[..., 0, :].transpose(1, 2), x[..., 1, :].transpose(1, 2)
        else:  # multi-query: heads x D | D | D
            x = qkv.view(B, SEQ, H + 2, D)
            q, k = x[:, :, :H].transpose(1, 2), x[:, :, H:H + 1].transpose(1, 2)
        err = (graph_probabilities(rule, q, k) - p.double()).abs().max().item()
        if err > 1e-6:
            raise AssertionError(f"layer {layer}: the graph's rule '{rule}' gives probabilities {err:.3g} from transformers'")
        worst = max(worst, err)
        # The comparison can fail: no bias, the other family's rule, Falcon's bias unrounded.
        controls = {"no bias": graph_probabilities("none", q, k), f"the {other} rule": graph_probabilities(other, q, k)}
        if rule == "falcon":
            controls["no bfloat16 rounding"] = graph_probabilities(rule, q, k, bf16_rounding=False)
        for what, c in controls.items():
            miss = (c - p.double()).abs().max().item()
            if miss < 1e-4:
                raise AssertionError(f"layer {layer}: {what} gives probabilities only {miss:.3g} from transformers': the check is blind")
            nearest_control = min(nearest_control, miss)
    cases.check_heads_split(plan, "attention", config.num_hidden_layers)
    cases.verify_forward(tool, plan)
    return (f"alibi '{rule}' on every layer gives transformers' probabilities to {worst:.1g} (the controls miss by "
            f">= {nearest_control:.1g}); verified on 2 ranks, heads split")


def graph_keeps(attrs, S):
    """[S, S] bool: the keys the graph's attention of attributes `attrs` keeps per query (docs/graph.md)."""
    q = torch.arange(S)[:, None]
    k = torch.arange(S)[None, :]
    keep = torch.ones(S, S, dtype=torch.bool)
    if attrs.get("causal"):
        keep &= k <= q
        if attrs.get("window", 0) > 0:
            keep &= k > q - attrs["window"]
    return keep


def check(name, tool, work):
    if name in ALIBI_CASES:
        return check_alibi(name, tool, work)
    config_class, kwargs, windows = CASES[name]
    torch.manual_seed(0)
    config = config_class(**kwargs)
    config._attn_implementation = "eager"
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    # The heads split (the solver would split the batch): each rank masks its heads' keys.
    plan, nodes = cases.plan_config(tool, config, work, name, SEQ,
                                    cases.heads_split_pins(f"model.layers.{i}.self_attn.attention" for i in range(config.num_hidden_layers)))
    cores = [n for n in nodes if n["kind"] == "attention"]
    if len(cores) != config.num_hidden_layers:
        raise AssertionError(f"{len(cores)} attention vertices, expected {config.num_hidden_layers}")
    got = [c.get("attrs", {}).get("window", 0) for c in cores]
    if got != windows:
        raise AssertionError(f"the graph's windows per layer are {got}, expected {windows}")
    ids = torch.randint(3, config.vocab_size, (2, SEQ))
    with torch.no_grad():
        probs = model(ids, output_attentions=True).attentions  # per layer [B, heads, S, S]
    for layer, (core, p) in enumerate(zip(cores, probs)):
        keep = graph_keeps(core.get("attrs", {}), SEQ)
        kept_by_hf = (p > 0).all(dim=(0, 1))
        dropped_by_hf = (p == 0).all(dim=(0, 1))
        if not torch.equal(kept_by_hf, keep) or not torch.equal(dropped_by_hf, ~keep):
            diff = (kept_by_hf != keep).nonzero().tolist()[:6]
            raise AssertionError(f"layer {layer} ({core['name']}, {core.get('attrs')}): the graph's mask differs from transformers' "
                                 f"attention at (query, key) {diff}")
    cases.check_heads_split(plan, "attention", config.num_hidden_layers)
    cases.verify_forward(tool, plan)
    return f"windows {got} mask the keys transformers' eager attention drops at seq {SEQ}; verified on 2 ranks, heads split"


def main():
    return cases.run(CASES, check)


if __name__ == "__main__":
    sys.exit(main())
