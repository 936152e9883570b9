#!/usr/bin/env python3
"""Independent check of a sharded checkpoint: every rank file's tensor equals the global
tensor's pieces (numpy slices at the offsets index.json names) concatenated along concat_dim.
Usage: check_shards.py ORIGINAL.safetensors SHARD_DIR [--expect-split NAME:RANKS] [--subset]
With --subset (a pipeline stage's directory) the index may hold some of the original's tensors."""
import json, sys
import numpy as np
from safetensors.numpy import load_file

orig = load_file(sys.argv[1])
d = sys.argv[2]
index = json.load(open(f"{d}/index.json"))
ranks = [load_file(f"{d}/{f}") for f in index["files"]]
checked = 0
for name, t in index["tensors"].items():
    g = orig[name]
    assert list(g.shape) == t["global_shape"], name
    for s in t["shards"]:
        pieces = [g[tuple(slice(o, o + n) for o, n in zip(p["offset"], p["shape"]))] for p in s["pieces"]]
        want = np.concatenate(pieces, axis=s["concat_dim"]) if pieces else np.zeros(s["shape"], g.dtype)
        got = ranks[s["rank"]][name]
        assert got.shape == want.shape, (name, s["rank"], got.shape, want.shape)
        assert np.array_equal(got, want), (name, s["rank"])
        checked += 1
assert set(index["tensors"]) <= set(orig), "tensors the original does not have"
if "--subset" not in sys.argv:
    assert set(orig) == set(index["tensors"]), "tensors missing from the index"
print(f"checked {checked} shards of {len(index['tensors'])} tensors")
