#!/usr/bin/env python3
"""How the tool's time grows with a model's depth and a mesh's ranks (issue 30, classes 6 and 7).

Three sweeps of `autoshard` command lines, each size run `--repeats` times: the median wall
seconds, the median CPU seconds (user + system of the command, all its threads: on a shared
machine the wall time also counts the others' load) and the median peak resident memory
(MiB, GNU time's %M of the command: Debian's `time`, which scripts/setup.sh installs), and
for each step to the next size the growth exponent of the CPU time and of the memory,
k = log(t2/t1) / log(n2/n1): linear growth gives k = 1, n log n slightly above 1, quadratic 2
(memory has a fixed base of about 10 MiB, so its k is below 1 at the small sizes).

  plan    an element-wise chain (a parameter, then n GELUs, model JSON; an ONNX Relu chain too
          when python3-onnx is there), trained on a 2x2 mesh: `plan --no-svg`, n = 1,000 ->
          100,000 operators
  shard   a tiny GPT-2 checkpoint cut by a data-parallel plan onto 8x8 ... 64x64 meshes:
          `shard --plan`, 64 -> 4,096 ranks (each rank file holds the parameters whole: the
          bytes written grow with the ranks)
  show    a block map of a tensor split over every rank of a 1-D mesh (`show --mesh N --shape
          N,8 --spec "[S(0)]" --json`, 4,096 -> 262,144 ranks) and of the plans' input_ids (`show --plan
          --tensor`)

With `--before BIN` every command also runs with that (older) build, each repeat of the one
followed by a repeat of the other so both see the same load: the peer measured side by side.
A run that exceeds `--timeout` (`--before-timeout` for the older build) is reported as such
and that size is not run again for it. Nothing is asserted.

  python3 bench/tool/scaling.py --tool build/release/tools/autoshard
  python3 bench/tool/scaling.py --tool build/release/tools/autoshard --before /tmp/before/autoshard --before-timeout 120
"""
import argparse, json, math, os, shutil, signal, statistics, subprocess, sys, tempfile, time

PLAN_SIZES = [1000, 4000, 16000, 64000, 100000]
SHARD_MESHES = ["8x8", "16x16", "32x32", "64x64"]
SHOW_RANKS = [4096, 32768, 262144]
TINY = ["--model", "gpt2", "--layers", "1", "--hidden", "32", "--heads", "4", "--vocab", "64", "--seq", "16", "--batch", "4096"]


def chain_json(n, path):
    nodes = [{"name": "w", "kind": "parameter", "shape": [8, 64], "dtype": "f32"}]
    prev = "w"
    for i in range(n):
        nodes.append({"name": f"g{i}", "kind": "gelu", "shape": [8, 64], "dtype": "f32", "inputs": [prev]})
        prev = f"g{i}"
    with open(path, "w") as f:
        json.dump({"nodes": nodes}, f)


def chain_onnx(n, path):
    """An ONNX Relu chain through Debian's python3-onnx (False when it is not there)."""
    script = (
        "import onnx, sys\nfrom onnx import helper, TensorProto\nn = int(sys.argv[1])\n"
        "nodes = [helper.make_node('Relu', ['x' if i == 0 else f't{i-1}'], [f't{i}'], name=f'relu{i}') for i in range(n)]\n"
        "g = helper.make_graph(nodes, 'chain', [helper.make_tensor_value_info('x', TensorProto.FLOAT, [8, 64])],\n"
        "                      [helper.make_tensor_value_info(f't{n-1}', TensorProto.FLOAT, None)])\n"
        "onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid('', 17)]), sys.argv[2])\n")
    for py in ("python3", "/usr/bin/python3"):
        if shutil.which(py) and subprocess.run([py, "-c", script, str(n), path], capture_output=True).returncode == 0:
            return True
    return False


def timed(cmd, timeout, cwd, env=None):
    """(wall seconds, CPU seconds, peak resident MiB) of one run, or (None, why). The peak is GNU
    time's (%M): a child of this process would start with its maximum resident size, which
    Linux keeps across exec (the chains built here make it 60 MiB and more)."""
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as err, tempfile.NamedTemporaryFile("r") as rss:
        p = subprocess.Popen(["/usr/bin/time", "-f", "%M", "-o", rss.name, *cmd], stdout=subprocess.DEVNULL, stderr=err,
                             cwd=cwd, env=env, start_new_session=True)
        while True:
            pid, status, use = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() - t0 > timeout:
                os.killpg(p.pid, signal.SIGKILL)  # time and the command it runs
                os.wait4(p.pid, 0)
                return None, f"timed out after {timeout:g} s"
            time.sleep(0.01)
        wall = time.perf_counter() - t0
        if os.waitstatus_to_exitcode(status) != 0:
            err.seek(0)
            return None, (err.read().decode(errors="replace").strip().splitlines() or [f"status {status}"])[-1]
        peak_kib = int(rss.read().split()[-1])
    return (wall, use.ru_utime + use.ru_stime, peak_kib / 1024), None


def sweep(title, unit, rows, tools, repeats, timeouts, work):
    """rows: (size, label, argv without the tool (or a function of the build's name giving it),
    setup or None). Prints one table per sweep."""
    print(f"\n{title}")
    header = f"  {unit:>10}  {'case':<34}" + "".join(
        f"{name + ' wall s':>14}{'cpu s':>9}{'k':>6}{'MiB':>8}{'k':>6}" for name in tools)
    print(header)
    last = {}

    def growth(key, size, value):
        k = ""
        if key in last and last[key][0] != size and last[key][1] > 0 and value > 0:
            k = f"{math.log(value / last[key][1]) / math.log(size / last[key][0]):.2f}"
        last[key] = (size, value)
        return k

    for size, label, argv, setup in rows:
        runs = {name: [] for name in tools}
        errors = {}
        for _ in range(repeats):  # one run of each build in turn: both see the same load
            for name, tool in tools.items():
                if name in errors:
                    continue
                if setup:
                    setup(tool)
                args = argv(name) if callable(argv) else argv
                env = None
                if "--no-svg" in args and not has_no_svg(tool):  # an older build: no Graphviz on its PATH instead
                    args, env = [x for x in args if x != "--no-svg"], dict(os.environ, PATH="/nonexistent")
                t, err = timed([tool, *args], timeouts[name], work, env)
                if t is None:
                    errors[name] = err
                else:
                    runs[name].append(t)
        cells = ""
        for name in tools:
            case = label.split(" (")[0]
            if name in errors:
                cells += f"{errors[name][:41]:>43}"
                last.pop((name, case, "cpu"), None)
                last.pop((name, case, "mem"), None)
                continue
            wall, cpu, mem = (statistics.median(r[i] for r in runs[name]) for i in range(3))
            kc, km = growth((name, case, "cpu"), size, cpu), growth((name, case, "mem"), size, mem)
            cells += f"{wall:>14.3f}{cpu:>9.3f}{kc:>6}{mem:>8.1f}{km:>6}"
        print(f"  {size:>10}  {label:<34}{cells}", flush=True)


def has_no_svg(tool, known={}):
    """Whether this build's `plan` takes --no-svg (builds before issue 30 do not)."""
    if tool not in known:
        known[tool] = "--no-svg" in subprocess.run([tool, "plan", "--help"], capture_output=True, text=True).stdout
    return known[tool]


def loadavg():
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tool", required=True, help="the autoshard build to measure")
    ap.add_argument("--before", help="an older build, run alternately beside --tool")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--before-timeout", type=float, help="--timeout for the --before build (default: --timeout)")
    ap.add_argument("--only", choices=["plan", "shard", "show"], action="append")
    a = ap.parse_args()
    tools = {"now": os.path.abspath(a.tool)}
    if a.before:
        tools["before"] = os.path.abspath(a.before)
    only = set(a.only or ["plan", "shard", "show"])
    timeouts = {"now": a.timeout, "before": a.before_timeout or a.timeout}
    print(f"autoshard scaling: {', '.join(f'{k} = {v}' for k, v in tools.items())}; {a.repeats} runs each, "
          f"median wall seconds; load average {loadavg()} ({os.cpu_count()} cores)")
    with tempfile.TemporaryDirectory() as work:
        if "plan" in only:
            rows = []
            for n in PLAN_SIZES:
                path = os.path.join(work, f"chain{n}.json")
                chain_json(n, path)
                rows.append((n, "gelu chain, model JSON", ["plan", "--model", path, "--mesh", "2x2", "--no-svg", "--quiet",
                                                           "--out", os.path.join(work, "p.json")], None))
            for n in PLAN_SIZES:
                path = os.path.join(work, f"chain{n}.onnx")
                if chain_onnx(n, path):
                    rows.append((n, "relu chain, ONNX", ["plan", "--model", path, "--mesh", "2x2", "--no-svg", "--quiet",
                                                         "--out", os.path.join(work, "p.json")], None))
            sweep("plan: operators of an element-wise chain (training, 2x2)", "operators", rows, tools, a.repeats,
                  timeouts, work)
        plans = {}  # (build, mesh): each build plans for itself (the plan file's format changes)
        if "shard" in only or "show" in only:
            ck = os.path.join(work, "ck")
            subprocess.run([tools["now"], "synth", *TINY, "--out", ck], check=True, capture_output=True)
            for name, tool in tools.items():
                for m in SHARD_MESHES:
                    plans[name, m] = os.path.join(work, f"plan-{name}-{m}.json")
                    subprocess.run([tool, "plan", *TINY, "--mesh", m, "--algo", "data_parallel", "--mode", "infer",
                                    *(["--no-svg"] if has_no_svg(tool) else []), "--quiet", "--out", plans[name, m]],
                                   check=True, capture_output=True, env=None if has_no_svg(tool) else
                                   dict(os.environ, PATH="/nonexistent"))
        if "shard" in only:
            rows = []
            for m in SHARD_MESHES:
                ranks = math.prod(int(x) for x in m.split("x"))
                out = os.path.join(work, "shards")
                rows.append((ranks, f"shard --plan ({m})",
                             lambda name, m=m, out=out: ["shard", ck, "--plan", plans[name, m], "--out", out, "--quiet"],
                             lambda _tool, out=out: shutil.rmtree(out, ignore_errors=True)))
            sweep("shard: ranks of a plan's mesh (tiny GPT-2)", "ranks", rows, tools, a.repeats, timeouts, work)
        if "show" in only:
            # --json: the same block map, for any mesh (a drawing of more than 4,096 ranks is refused).
            rows = [(n, "show --spec [S(0)] --json (1-D mesh)",
                     ["show", "--mesh", str(n), "--shape", f"{n},8", "--spec", "[S(0)]", "--json"], None)
                    for n in SHOW_RANKS]
            for m in SHARD_MESHES:
                ranks = math.prod(int(x) for x in m.split("x"))
                rows.append((ranks, f"show --plan --tensor ({m})",
                             lambda name, m=m: ["show", "--plan", plans[name, m], "--tensor", "input_ids"], None))
            sweep("show: ranks of the mesh", "ranks", rows, tools, a.repeats, timeouts, work)
    print(f"\nload average at the end {loadavg()}")


if __name__ == "__main__":
    sys.exit(main())
