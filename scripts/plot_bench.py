#!/usr/bin/env python3
"""Runs the benches behind docs/performance.md's plots and draws them as SVG.

    python3 -m pip install matplotlib     # a docs tool only: not needed by the demo or the tests
    cmake --preset release && cmake --build --preset release \
        --target bench_solve_pass_models bench_tensor_shard_bench bench_comm_collectives
    python3 scripts/plot_bench.py --build build/release          # run the benches, then plot
    python3 scripts/plot_bench.py --no-run                       # plot the JSON of the last run again

Three plots, each from one bench's Google Benchmark JSON (--benchmark_out):

  solve_depth.svg   bench_solve_pass_models --benchmark_filter=_depth: CPU time of the whole
                    auto-sharding pass (one thread; wall time on a loaded machine is more)
                    against the number of layers (GPT-2 1.5B's width in
                    training, BERT-base's in inference, 2x4 mesh; layers tied or not), and the
                    ILP's variables before and after the reductions.
  shard_memcpy.svg  bench_tensor_shard_bench: bandwidth of cutting rank 1's shard out of a
                    [d,d] f32 weight (row split, column split, four fused parts) against memcpy
                    of the same bytes, d = 256 .. 4096.
  gloo_model.svg    bench_comm_collectives: bus bandwidth of Gloo all-reduce, all-gather and
                    reduce-scatter (4 ranks, threads over loopback) against the alpha-beta
                    model fitted at start-up, and memcpy of the same bytes.

Every plot states the machine's CPU count and load average (Google Benchmark's, taken when
the bench started, and ours when it ended): on a shared machine the figures are inflated by
that load. The JSON and the bench's text output are kept in --json-dir (default out/bench).
"""
import argparse
import json
import os
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent

BENCHES = {
    # name: (executable, extra args, extra environment)
    "solve": ("bench_solve_pass_models", ["--benchmark_filter=_depth"], {}),
    "shard": ("bench_tensor_shard_bench", ["--benchmark_min_time=0.05"], {"AUTOSHARD_BENCH_TABLES": "0"}),
    "comm": ("bench_comm_collectives", [], {"AUTOSHARD_BENCH_MAX_BYTES": str(16 << 20), "AUTOSHARD_BENCH_RANKS": "4"}),
}


def run_bench(name, build, json_dir):
    exe, args, env = BENCHES[name]
    path = pathlib.Path(build) / "bench" / exe
    if not path.exists():
        sys.exit(f"plot_bench: {path} not built (cmake --build {build} --target {exe})")
    out = json_dir / f"{name}.json"
    cmd = [str(path), *args, f"--benchmark_out={out}", "--benchmark_out_format=json"]
    shown = " ".join([*(f"{k}={v}" for k, v in env.items()), exe, *args])
    print(f"plot_bench: running {shown}", flush=True)
    with open(json_dir / f"{name}.txt", "w") as log:
        r = subprocess.run(cmd, env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT)
    if r.returncode != 0:
        sys.exit(f"plot_bench: {exe} failed (exit {r.returncode}); see {json_dir / (name + '.txt')}")
    d = json.loads(out.read_text())
    d["autoshard_plot"] = {"command": shown, "load_avg_after": list(os.getloadavg())}
    out.write_text(json.dumps(d, indent=1))


def load(name, json_dir):
    p = json_dir / f"{name}.json"
    if not p.exists():
        sys.exit(f"plot_bench: {p} missing: run without --no-run first")
    return json.loads(p.read_text())


def machine_note(d):
    c = d["context"]
    before = c.get("load_avg", [float("nan")])[0]
    after = d.get("autoshard_plot", {}).get("load_avg_after", [float("nan")])[0]
    cmd = d.get("autoshard_plot", {}).get("command", c.get("executable", ""))
    return (f"{c.get('num_cpus', '?')} CPUs, load average {before:.1f} at start, {after:.1f} at end "
            f"({c['date'][:10]})\n{cmd}")


def save(fig, path):
    import matplotlib.pyplot as plt
    fig.savefig(path, format="svg", metadata={"Date": None}, bbox_inches="tight")
    plt.close(fig)
    print(f"plot_bench: wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")


def seconds(b):
    scale = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}[b["time_unit"]]
    return b["real_time"] * scale, b["cpu_time"] * scale


def plot_solve(d, out):
    import matplotlib.pyplot as plt
    runs = {}
    for b in d["benchmarks"]:
        m = re.match(r"BM_(\w+)_depth/layers:(\d+)/tied:(\d)", b["name"])
        if not m or b.get("error_occurred"):
            continue
        real, cpu = seconds(b)
        runs.setdefault((m.group(1), m.group(3) == "1"), []).append(
            (int(m.group(2)), real, cpu, b["vars_in"], b["vars_ilp"], b["solve_s"]))
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4.2))
    label = {"gpt2": "GPT-2 1.5B width, training", "bert": "BERT-base width, inference"}
    colour = {"gpt2": "tab:blue", "bert": "tab:orange"}
    for (model, tied), pts in sorted(runs.items()):
        pts.sort()
        ls = "-" if tied else "--"
        tag = f"{label[model]}, {'tied' if tied else 'untied'}"
        ax.plot([p[0] for p in pts], [p[2] for p in pts], ls, marker="o", color=colour[model], label=tag)
        if tied:
            bx.plot([p[0] for p in pts], [p[3] for p in pts], "-", marker="o", color=colour[model],
                    label=f"{label[model]}: ILP input")
        bx.plot([p[0] for p in pts], [max(p[4], 0.5) for p in pts], ls, marker="s", color=colour[model],
                alpha=0.6, label=f"{label[model]}: after reductions, {'tied' if tied else 'untied'}")
    ax.set_xlabel("layers")
    ax.set_ylabel("auto-sharding pass, CPU seconds (one thread)")
    ax.set_title("pass time against model depth (2x4 mesh)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    bx.set_xlabel("layers")
    bx.set_ylabel("ILP variables (0 drawn at 0.5)")
    bx.set_yscale("log")
    bx.set_title("ILP size before and after the reductions")
    bx.legend(fontsize=7)
    bx.grid(alpha=0.3)
    fig.text(0.01, -0.06, machine_note(d), fontsize=8, color="#444")
    save(fig, out / "solve_depth.svg")


def plot_shard(d, out):
    import matplotlib.pyplot as plt
    series = {}
    for b in d["benchmarks"]:
        m = re.match(r"BM_(?:shard_copy/(\w+)|(memcpy)_same_bytes)/(\d+)$", b["name"])
        if not m or b.get("error_occurred"):
            continue
        which = m.group(1) or m.group(2)
        dim = int(m.group(3))
        series.setdefault(which, []).append((dim * dim * 4 // 4, b["bytes_per_second"] / 1e9, seconds(b)[1]))
    names = {"row_split_contiguous": "row split (contiguous)", "column_split_strided": "column split (strided runs)",
             "fused_4_parts_in_out": "4 fused parts, [in,out]", "memcpy": "memcpy, same bytes"}
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4.2))
    base = {p[0]: p[2] for p in series.get("memcpy", [])}
    for which in ["memcpy", "row_split_contiguous", "column_split_strided", "fused_4_parts_in_out"]:
        pts = sorted(series.get(which, []))
        if not pts:
            continue
        style = dict(color="black", ls="--") if which == "memcpy" else {}
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=names[which], **style)
        if which != "memcpy":
            bx.plot([p[0] for p in pts], [p[2] / base[p[0]] for p in pts if p[0] in base], marker="o", label=names[which])
    for a in (ax, bx):
        a.set_xscale("log", base=2)
        a.set_xlabel("bytes of rank 1's shard (1/4 of a [d,d] f32 weight)")
        a.grid(alpha=0.3)
    ax.set_ylabel("GB/s (CPU time)")
    ax.set_title("shard copy bandwidth against memcpy")
    ax.legend(fontsize=8)
    bx.axhline(1.0, color="black", ls="--", lw=1)
    bx.set_ylabel("shard time / memcpy time")
    bx.set_title("slowdown against memcpy of the same bytes")
    bx.legend(fontsize=8)
    fig.text(0.01, -0.06, machine_note(d), fontsize=8, color="#444")
    save(fig, out / "shard_memcpy.svg")


def plot_comm(d, out, log_text):
    import matplotlib.pyplot as plt
    series = {}
    for b in d["benchmarks"]:
        m = re.match(r"gloo_(\w+)/(\d+)", b["name"])
        if not m or b.get("error_occurred"):
            continue
        busbw = b["busbw_GBps"]
        series.setdefault(m.group(1), []).append((b["B"], busbw, busbw * b["measured/model"], b["memcpy_GBps"],
                                                  b["measured/model"]))
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4.2))
    colours = {"all_reduce": "tab:blue", "all_gather": "tab:green", "reduce_scatter": "tab:red"}
    memcpy = {}
    for kind, pts in sorted(series.items()):
        pts.sort()
        c = colours.get(kind)
        name = kind.replace("_", "-")
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "-", marker="o", color=c, label=f"{name}, measured")
        ax.plot([p[0] for p in pts], [p[2] for p in pts], ":", color=c, label=f"{name}, alpha-beta model")
        bx.plot([p[0] for p in pts], [p[4] for p in pts], "-", marker="o", color=c, label=name)
        for p in pts:
            memcpy.setdefault(p[0], []).append(p[3])
    xs = sorted(memcpy)
    ax.plot(xs, [sorted(memcpy[x])[len(memcpy[x]) // 2] for x in xs], "--", color="black", label="memcpy, same bytes")
    for a in (ax, bx):
        a.set_xscale("log", base=2)
        a.set_xlabel("B: message bytes (buffer, gathered size, or input size)")
        a.grid(alpha=0.3)
    ax.set_yscale("log")
    ax.set_ylabel("bus bandwidth, GB/s")
    ax.set_title("Gloo collectives, 4 ranks on loopback")
    ax.legend(fontsize=7)
    bx.axhline(1.0, color="black", ls="--", lw=1)
    bx.set_ylabel("measured time / model time")
    bx.set_title("against the alpha-beta model")
    bx.legend(fontsize=8)
    fit = re.search(r"calibrated.*", log_text)
    note = machine_note(d) + ("\n" + fit.group(0) if fit else "")
    fig.text(0.01, -0.1, note, fontsize=8, color="#444")
    save(fig, out / "gloo_model.svg")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=str(ROOT / "build" / "release"), help="a release build directory")
    ap.add_argument("--json-dir", default=str(ROOT / "out" / "bench"), help="where the bench JSON goes")
    ap.add_argument("--out", default=str(ROOT / "docs" / "img"), help="where the SVG plots go")
    ap.add_argument("--only", default="solve,shard,comm", help="comma-separated subset of solve,shard,comm")
    ap.add_argument("--no-run", action="store_true", help="plot the JSON already in --json-dir")
    a = ap.parse_args()
    try:
        import matplotlib
    except ImportError:
        sys.exit("plot_bench: needs matplotlib: python3 -m pip install matplotlib")
    matplotlib.use("Agg")
    matplotlib.rcParams["svg.hashsalt"] = "autoshard"  # stable ids: the same data, the same file
    matplotlib.rcParams["svg.fonttype"] = "none"  # text stays text
    json_dir, out = pathlib.Path(a.json_dir), pathlib.Path(a.out)
    json_dir.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    which = [w for w in a.only.split(",") if w]
    for w in which:
        if w not in BENCHES:
            sys.exit(f"plot_bench: unknown bench '{w}' (solve, shard, comm)")
        if not a.no_run:
            run_bench(w, a.build, json_dir)
    if "solve" in which:
        plot_solve(load("solve", json_dir), out)
    if "shard" in which:
        plot_shard(load("shard", json_dir), out)
    if "comm" in which:
        txt = json_dir / "comm.txt"
        plot_comm(load("comm", json_dir), out, txt.read_text() if txt.exists() else "")


if __name__ == "__main__":
    main()
