"""The command line and the loop of a client test made of named cases (onnx_import_test.py,
rotary_test.py, sliding_window_test.py, megatron_test.py): `--tool PATH [--only NAME ...] [--keep DIR]`, each case run
as check(name, tool, work) -> what it proved, printed `ok   NAME: ... (s)` or `FAIL NAME:` with
its traceback; exit 1 when any failed. Imports nothing heavy: each test sets up torch first.
The tests that judge a graph built from a transformers config (rotary_test.py,
sliding_window_test.py) share its plan and its run: plan_config and verify_forward, and the
pins that put vertices on their heads split over the 2 ranks and the check that the plan did:
heads_split_pins and check_heads_split.
"""
import argparse, json, pathlib, subprocess, tempfile, time, traceback


def run(cases, check, doc=None):
    ap = argparse.ArgumentParser(description=doc)
    ap.add_argument("--tool", required=True)
    ap.add_argument("--only", nargs="*", choices=list(cases), metavar="NAME")
    ap.add_argument("--keep", help="work in this directory (kept) instead of a temporary one")
    a = ap.parse_args()
    tool = str(pathlib.Path(a.tool).resolve())
    names = a.only or list(cases)
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        work = pathlib.Path(a.keep) if a.keep else pathlib.Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        for name in names:
            start = time.monotonic()
            try:
                what = check(name, tool, work)
                print(f"ok   {name}: {what} ({time.monotonic() - start:.1f} s)", flush=True)
            except Exception:  # noqa: BLE001  (every failure is reported, and fails the run)
                failed += 1
                print(f"FAIL {name}:\n{traceback.format_exc()}", flush=True)
    print(f"{len(names) - failed} passed, {failed} failed")
    return 1 if failed else 0


def plan_config(tool, config, work, name, seq, extra=(), mesh="1x2"):
    """`config` (a transformers config) as `save_pretrained` writes it, planned by `autoshard plan
    --model config.json` in inference on `mesh` at batch 2 and sequence `seq` (and the plan
    options `extra`, e.g. --pin): the plan file's path and its graph's nodes."""
    config_dir = work / name
    config.save_pretrained(str(config_dir))
    plan = work / f"{name}-plan.json"
    r = subprocess.run([tool, "plan", "--model", str(config_dir / "config.json"), "--batch", "2", "--seq", str(seq), "--mesh", mesh,
                        "--mode", "infer", "--quiet", "--no-svg", "--json", "--out", str(plan), *extra], capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise AssertionError(f"plan exited {r.returncode}: {r.stderr[-2000:]}")
    return plan, json.loads(plan.read_text())["graph"]["nodes"]


def verify_forward(tool, plan):
    """`autoshard verify --forward-only` of `plan` on its ranks: an AssertionError unless it passed."""
    v = subprocess.run([tool, "verify", "--plan", str(plan), "--forward-only", "--json"], capture_output=True, text=True, timeout=300)
    if v.returncode != 0 or not json.loads(v.stdout)["passed"]:
        raise AssertionError(f"verify exited {v.returncode}: {v.stderr[-2000:]}")


def heads_split_pins(names, spec="RRS1"):
    """--pin options putting each vertex of `names` on its heads split over the 2 ranks (RRS1:
    rank 1 holds the second half of the heads; on a 2x2 mesh S0RS1, the batch over mesh axis 0
    as well)."""
    return [a for n in names for a in ("--pin", n + "=" + spec)]


def check_heads_split(plan, kind, count, spec="RRS1"):
    """Raises unless plan file `plan` holds `count` vertices of `kind`, each taking its first
    operand and giving its output split on the heads over the 2 ranks (`spec`, as pinned)."""
    strategies = [t["strategy"] for t in json.loads(plan.read_text())["tensors"] if t["kind"] == kind]
    if len(strategies) != count or not all(s.split("->")[0].split(",")[0] == spec and s.endswith("->" + spec) for s in strategies):
        raise AssertionError(f"the plan's {kind} strategies are {strategies}, not the heads split over the 2 ranks ({spec})")
