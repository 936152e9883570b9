#!/usr/bin/env python3
"""The auto-sharding pass's wall time, two builds of the tool side by side in one run.

Issue 14 changed what the pass prices (hierarchical collectives, adjoint backward, bucketed
gradient sync, ZeRO storage strategies, device budgets, baselines) and asked that the pass stay
within 2x of its time before. This runs the same `autoshard plan` command lines with an older
build (`--before`, e.g. built from the commit the issue was filed at) and the current one
(`--after`), alternating them so both see the same load, `--repeats` times each, and prints
per model the median wall seconds of each, their ratio after/before, and the step time each
plan reports. Options a build does not know make that row say so; nothing is asserted.

With --compare-plans the last plan file each build wrote for a model is compared too, member
by member (every spec, strategy, collective, cost and memory figure; the solver's wall seconds
left out): a change meant to keep behaviour (a refactor) shows "same" on every row, anything
else the first JSON paths that differ.

  git worktree add --detach /tmp/before a215739 && (cd /tmp/before && cmake --preset release \\
      && cmake --build --preset release --target autoshard)
  bench/solve/pass_before_after.py --before /tmp/before/build/release/tools/autoshard \\
      --after build/release/tools/autoshard --repeats 3
"""
import argparse, json, os, re, statistics, subprocess, sys, tempfile, time

# (label, plan arguments): the models of docs/autosharding.md, as a user plans them, with the
# links stated (both builds default to 25/300 GB/s, but older ones had no device presets).
CASES = [
    ("gpt2 2x4 train", ["--model", "gpt2", "--mesh", "2x4", "--mode", "train"]),
    ("gpt2-xl 2x4 train", ["--model", "gpt2-xl", "--mesh", "2x4", "--mode", "train"]),
    ("bert-base 2x4 infer", ["--model", "bert-base", "--mesh", "2x4", "--mode", "infer"]),
    ("bert-large 2x4 train", ["--model", "bert-large", "--mesh", "2x4", "--mode", "train"]),
    ("llama-7b 2x8 train", ["--model", "llama-7b", "--mesh", "2x8", "--mode", "train"]),
    ("llama-7b 1x8 infer", ["--model", "llama-7b", "--mesh", "1x8", "--mode", "infer"]),
    ("llama-70b 8x8 infer", ["--model", "llama-70b", "--mesh", "8x8", "--mode", "infer"]),
]
LINKS = ["--inter-bw", "25e9", "--intra-bw", "300e9"]


def run(tool, args, out_dir, timeout, out_name="plan.json"):
    """Wall seconds of one plan, its reported step time (ms, or None) and an error line."""
    out = os.path.join(out_dir, out_name)
    cmd = [tool, "plan", *args, *LINKS, "--out", out]
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, None, f"timed out after {timeout} s"
    wall = time.perf_counter() - t0
    if p.returncode not in (0, 3):  # 3: the plan does not fit its budget, still a solved pass
        return None, None, (p.stderr.strip().splitlines() or ["exit %d" % p.returncode])[-1]
    step = None
    m = re.search(r"^\s*\*\s+\S+\s+([0-9.]+)\s+(us|ms|s)\b", p.stdout, re.M)
    if m:
        step = float(m.group(1)) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[m.group(2)]
    return wall, step, None


# The members of a plan file that measure the run, not the plan: the solver's wall time.
VOLATILE = {("solver", "seconds")}


def plan_differences(a, b, path=()):
    """JSON paths where two plan documents differ (VOLATILE members left out)."""
    if path[-2:] in VOLATILE:
        return []
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                out.append("/".join(map(str, path + (k,))) + (" (only after)" if k not in a else " (only before)"))
            else:
                out += plan_differences(a[k], b[k], path + (k,))
        return out
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return ["/".join(map(str, path)) + " (%d items before, %d after)" % (len(a), len(b))]
        out = []
        for i, (x, y) in enumerate(zip(a, b)):
            out += plan_differences(x, y, path + (i,))
        return out
    return [] if a == b else ["/".join(map(str, path)) + ": %r before, %r after" % (a, b)]


def compare_plans(before, after):
    """"same", or the first paths where the two plan files differ."""
    try:
        with open(before) as f:
            a = json.load(f)
        with open(after) as f:
            b = json.load(f)
    except (OSError, ValueError) as e:
        return "not compared: %s" % e
    diff = plan_differences(a, b)
    if not diff:
        return "same"
    return "differ at %d places: %s" % (len(diff), "; ".join(diff[:5]))


def loadavg():
    try:
        return " ".join(open("/proc/loadavg").read().split()[:3])
    except OSError:
        return "?"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, help="the older autoshard binary")
    ap.add_argument("--after", required=True, help="the current autoshard binary")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per plan")
    ap.add_argument("--only", default="", help="run only the cases whose label contains this")
    ap.add_argument("--compare-plans", action="store_true",
                    help="compare the plan file each build wrote for a model (a refactor: the same on every row)")
    a = ap.parse_args()
    if not 1 <= a.repeats <= 100:
        sys.exit("--repeats must be in [1, 100], got %d" % a.repeats)
    for tool in (a.before, a.after):
        if not os.access(tool, os.X_OK):
            sys.exit("not an executable: " + tool)
    print("load average at start:", loadavg())
    print(f"{'model':<22} {'before s':>9} {'after s':>9} {'after/before':>12} {'step before':>12} {'step after':>11}")
    with tempfile.TemporaryDirectory() as d:
        for label, args in CASES:
            if a.only and a.only not in label:
                continue
            walls = {"before": [], "after": []}
            steps = {"before": None, "after": None}
            errors = {}
            for _ in range(a.repeats):
                for name, tool in (("before", a.before), ("after", a.after)):
                    if name in errors:
                        continue
                    wall, step, err = run(tool, args, d, a.timeout, name + ".json")
                    if err:
                        errors[name] = err
                    else:
                        walls[name].append(wall)
                        steps[name] = step
            med = {k: statistics.median(v) if v else None for k, v in walls.items()}
            fmt = lambda x, f="%.3g": (f % x) if x is not None else "-"
            ratio = med["after"] / med["before"] if med["before"] and med["after"] else None
            print(f"{label:<22} {fmt(med['before']):>9} {fmt(med['after']):>9} {fmt(ratio):>12} "
                  f"{fmt(steps['before']):>12} {fmt(steps['after']):>11}")
            for name, err in errors.items():
                print(f"    {name}: {err}")
            if a.compare_plans and not errors:
                print("    plans: " + compare_plans(os.path.join(d, "before.json"), os.path.join(d, "after.json")))
    print("load average at end:", loadavg())


if __name__ == "__main__":
    main()
