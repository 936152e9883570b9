#!/usr/bin/env python3
"""autoshard solve on IOPDDL requests made k times larger, one run: memory and answer at scale.

The contest's largest requests reach 1.3 GB of JSON (65,000 nodes); the six here reach 58.7 MB.
This bench writes k disjoint copies of one instance as one problem: node and edge indices
shifted per copy, and every copy's live intervals moved past the previous copy's last time, so
each copy meets the usage limit on its own and the optimum of the whole is exactly k times the
instance's. It then runs `autoshard solve FILE --json --threads N` under /usr/bin/time and prints
the text size, the peak resident memory (RSS), the seconds to the first answer and in all, the
answer and its ratio to k x the best known value, the bound, why it stopped, and whether the LP
was built (the solver leaves it out when it would not fit the memory left). The generated files
are written to a temporary directory (or --workdir) and removed.

  bench/solve/iopddl_scale.py --tool build/release/tools/autoshard --time-limit 120 --threads 2 \\
      --copies 1,4,22 ../shared/iopddl/asplos-2025-iopddl-S.json.gz
"""
import argparse, gzip, json, os, pathlib, re, subprocess, sys, tempfile, time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from iopddl_vs_highs import BEST_KNOWN, stem  # noqa: E402  one table of best known values


def load(path):
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)["problem"]


def write_copies(p, copies, out):
    """k disjoint copies of problem p as one IOPDDL file, written element by element."""
    nd, ed = p["nodes"], p["edges"]
    n = len(nd["costs"])
    span = max((iv[1] for iv in nd["intervals"]), default=0) + 1

    def array(f, items):
        f.write("[")
        for i, x in enumerate(items):
            if i:
                f.write(",")
            f.write(x)
        f.write("]")

    dump = lambda x: json.dumps(x, separators=(",", ":"))
    with open(out, "w") as f:
        f.write('{"problem":{"name":%s,"nodes":{"intervals":' % dump("%s-x%d" % (p.get("name", "p"), copies)))
        array(f, ("[%d,%d]" % (a + k * span, b + k * span) for k in range(copies) for a, b in nd["intervals"]))
        for key in ("costs", "usages"):
            f.write(',"%s":' % key)
            array(f, (dump(c) for _ in range(copies) for c in nd[key]))
        f.write('},"edges":{"nodes":')
        array(f, ("[%d,%d]" % (a + k * n, b + k * n) for k in range(copies) for a, b in ed["nodes"]))
        f.write(',"costs":')
        array(f, (dump(c) for _ in range(copies) for c in ed["costs"]))
        f.write("}")
        if p.get("usage_limit") is not None:
            f.write(',"usage_limit":%d' % p["usage_limit"])
        f.write("}}\n")


def run(tool, path, time_limit, threads):
    t0 = time.perf_counter()
    out = subprocess.run(["/usr/bin/time", "-f", "maxrss_kb=%M", tool, "solve", path, "--json", "--quiet",
                          "--time-limit", str(time_limit), "--threads", str(threads)], capture_output=True, text=True)
    wall = time.perf_counter() - t0
    m = re.search(r"maxrss_kb=(\d+)", out.stderr)
    rss = int(m.group(1)) * 1024 if m else None
    if out.returncode != 0:
        return {"error": out.stderr.strip().splitlines()[0] if out.stderr.strip() else "exit %d" % out.returncode,
                "wall": wall, "rss": rss}
    r = json.loads(out.stdout)
    r["wall"], r["rss"] = wall, rss
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tool", required=True)
    ap.add_argument("--time-limit", type=float, default=120)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--copies", default="1,4,22", help="comma-separated copy counts")
    ap.add_argument("--workdir", help="where the generated files go (default: a temporary directory)")
    ap.add_argument("instances", nargs="+")
    a = ap.parse_args()
    print("load average before: %.2f %.2f %.2f" % os.getloadavg())
    print("instance | copies | JSON MB | peak RSS MB | RSS / JSON | first s | time s | objective | ratio to copies x best known"
          " | bound | stop | LP built")
    with tempfile.TemporaryDirectory(dir=a.workdir) as work:
        for inst in a.instances:
            p = load(inst)
            best = BEST_KNOWN.get(stem(inst))
            for k in (int(x) for x in a.copies.split(",")):
                path = os.path.join(work, "%s-x%d.json" % (stem(inst), k))
                write_copies(p, k, path)
                size = os.path.getsize(path)
                r = run(a.tool, path, a.time_limit, a.threads)
                os.remove(path)
                rss = r.get("rss")
                cells = [stem(inst), str(k), "%.1f" % (size / 1e6), "%.0f" % (rss / 1e6) if rss else "-",
                         "%.2f" % (rss / size) if rss else "-"]
                if "error" in r:
                    cells += ["-", "%.1f" % r["wall"], "error: " + r["error"], "-", "-", "-", "-"]
                else:
                    ratio = "%.5f" % (r["objective"] / (k * best)) if best else "-"
                    lp = "no" if "it was not built" in r.get("stopped", "") else "yes"
                    cells += ["%.2f" % r.get("first_feasible_seconds", 0.0), "%.1f" % r["wall"], str(r["objective"]), ratio,
                              str(r["bound"]), r["stop"], lp]
                print(" | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
