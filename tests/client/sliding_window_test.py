#!/usr/bin/env python3
"""transformers judges the sliding windows autoshard builds from a Hugging Face config.json.

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
  * it runs: `autoshard verify --forward-only` executes the plan on 2 Gloo ranks (the heads
    split) and matches the unsharded forward.
No client path runs autoshard's executor on a checkpoint's weights against transformers' logits
(verify draws its own weights), so the mask is what is compared: the window dropped from the
graph keeps keys transformers drops, and the case fails.
Usage: sliding_window_test.py --tool build/release/tools/autoshard [--only NAME ...]
"""
import json, os, sys

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
    config_class, kwargs, windows = CASES[name]
    torch.manual_seed(0)
    config = config_class(**kwargs)
    config._attn_implementation = "eager"
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    plan, nodes = cases.plan_config(tool, config, work, name, SEQ)
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
    cases.verify_forward(tool, plan)
    return f"windows {got} mask the keys transformers' eager attention drops at seq {SEQ}; verified on 2 ranks"


def main():
    return cases.run(CASES, check)


if __name__ == "__main__":
    sys.exit(main())
