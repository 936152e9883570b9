#!/usr/bin/env python3
"""Every option a subcommand's --help shows is one it reads (issue 18: options that do nothing
for a subcommand are not shown).

For each subcommand the table below has a base command and, for every option --help lists,
a change: an option set to another value, added, or removed. The test
  1. fails when --help lists an option the table does not know, or the table knows one that
     --help no longer lists (an option added without a test that it does something);
  2. runs the base command and the changed one, each in an empty directory, and fails when
     nothing the user can see differs: exit status, stdout (a JSON document compared as data),
     stderr, and the files written (JSON compared as data, others byte for byte). Values that
     differ from run to run (wall-clock times, a shard generation id, measured bandwidths) are
     left out of the comparison, so a difference is the option's.
A few options change nothing a short run can show (a collective's time-out, the number of
timed repeats): for those the table says why, and the test checks only that the option is
parsed and range-checked (a value out of range exits 2), listed as "weak"; a flag whose
effect no short run shows is listed as "unseen" with why.

Then every kind of usage error docs/cli.md names exits 2, names the option, and writes
nothing: an unknown option, a missing argument, a number out of its range or not a number
(sizes, bandwidths, latencies, fractions, seeds, time limits), a value not among an option's
choices (dtypes included), a byte size that does not parse.

usage: cli_options_test.py AUTOSHARD [SUBCOMMAND...]
"""
import hashlib, json, os, pathlib, re, shutil, subprocess, sys, tempfile

tool = str(pathlib.Path(sys.argv[1]).resolve())
only = set(sys.argv[2:])
root = pathlib.Path(__file__).resolve().parent.parent.parent

REMOVE = object()  # the change removes the option from the base command
FLAG = True        # the change adds a flag


def weak(bad_value, why):
    return ("weak", bad_value, why)


def unseen(why):
    """An option whose effect a short run cannot show at all (listed with why, not checked)."""
    return ("unseen", why)


def based(base_change, change):
    """A change made to the base command changed by `base_change` first (an option that works
    only next to another one: --tensor next to --plan)."""
    return ("based", base_change, change)


def pre(files, change):
    """A change run with `files` (fixture name -> name in the run's directory) copied in first,
    for the base run too. A name "->T" makes a symbolic link to T (relative, T need not exist)."""
    return ("pre", files, change)


# Per subcommand: (base options in order, positional arguments, {option: change}), where a
# change is a value (replaces or adds the option), FLAG, REMOVE, a dict of several such
# changes, weak(...) or pre(...). {F} in a value is the fixture directory.
TINY_LLAMA = [("--model", "llama-7b"), ("--layers", "1"), ("--hidden", "32"), ("--heads", "4"), ("--kv-heads", "4"),
              ("--ffn", "64"), ("--vocab", "128"), ("--seq", "16"), ("--batch", "8")]
TABLE = {
    "explain": (
        [("--mesh", "2x2"), ("--shape", "8,4"), ("--from", "[S(0),S(1)]"), ("--to", "[R,R]"), ("--json", FLAG)], [],
        {"--mesh": "2x4", "--inter-bw": "1e9", "--intra-bw": "1e9", "--inter-lat": "1e-3", "--intra-lat": "1e-3",
         "--inter-hop": "1e-4", "--intra-hop": "1e-4", "--shape": "16,4", "--from": "[R,R]", "--to": "[S(0),R]",
         "--dtype": "f64", "--json": REMOVE}),
    "show": (
        [("--mesh", "2x2"), ("--shape", "8,4"), ("--spec", "[S(0),S(1)]"), ("--json", FLAG)], [],
        {"--mesh": "2x4", "--shape": "16,4", "--spec": "[R,S(1)]",
         "--plan": {"--plan": "{F}/megatron.json", "--mesh": REMOVE, "--shape": REMOVE, "--spec": REMOVE},
         "--tensor": based({"--plan": "{F}/megatron.json", "--mesh": REMOVE, "--shape": REMOVE, "--spec": REMOVE},
                           "model.layers.0.mlp.up_proj"),
         "--svg": "m.svg", "--slice": based({"--shape": "4,8,4"}, "1"), "--json": REMOVE,
         "--follow-symlinks": pre({"->t.svg": "m.svg"}, based({"--svg": "m.svg"}, FLAG))}),
    "plan": (
        TINY_LLAMA + [("--mesh", "2x2"), ("--out", "p.json"), ("--json", FLAG), ("--quiet", FLAG)], [],
        {"--model": "gpt2", "--mode": "infer", "--layers": "2", "--hidden": "64", "--heads": "8", "--kv-heads": "2",
         "--ffn": "128", "--vocab": "256", "--seq": "32", "--batch": "4", "--kv-cache": based({"--mode": "infer"}, "4"),
         "--dtype": "f32", "--mesh": "2x4",
         "--inter-bw": "1e9", "--intra-bw": "1e9", "--inter-lat": "1e-2", "--intra-lat": "1e-2",
         "--inter-hop": "1e-3", "--intra-hop": "1e-3", "--algo": "megatron", "--backend": "gloo",
         "--device": "h100-80g", "--optimizer": "sgd", "--gradient-bucket": "0", "--gradient-overlap": "1",
         "--no-zero": based({"--memory-budget": "300KiB"}, FLAG),
         "--micro-batch": "1", "--micro-batches": "2", "--recompute": "full", "--attention": "unfused",
         "--peak-compute": FLAG, "--tp": based({"--algo": "megatron"}, "1"),
         "--pp": based({"--layers": "2"}, "2"), "--schedule": based({"--layers": "2", "--pp": "2"}, "gpipe"),
         "--memory-budget": "1MiB", "--calibration": "{F}/links.json", "--force": based({"--calibration": "{F}/links.json", "--mesh": "4"}, FLAG), "--time-limit": "30", "--mip-rel-gap": "0.5",
         "--skip-fully-replicated": FLAG,
         "--run-checks": FLAG,
         "--preload": pre({"megatron.json": "p.json"}, FLAG),
         "--no-tie-layers": {"--no-tie-layers": FLAG, "--layers": "2"}, "--pin": "input_ids=S0R",
         "--out": "q.json", "--dot": "x.dot", "--no-svg": FLAG, "--json": REMOVE,
         "--follow-symlinks": pre({"->t.json": "p.json"}, FLAG),
         "--progress": {"--progress": FLAG, "--quiet": REMOVE},
         "--quiet": based({"--progress": FLAG}, REMOVE)}),
    "solve": (
        [("--json", FLAG), ("--quiet", FLAG)], [str(root / "tests/data/solve/example.json")],
        {"--time-limit": "1e-9", "--mip-rel-gap": weak("2", "the example is solved to optimality before any gap stops it"),
         "--solution-out": "a.json", "--evaluate": "{F}/answer.json", "--json": REMOVE,
         "--follow-symlinks": pre({"->t.json": "a.json"}, based({"--solution-out": "a.json"}, FLAG)),
         "--threads": "3",
         "--seed": weak("-1", "the example is solved exactly by the ILP's thread, whatever the search threads' seed"),
         "--cutoff": "1",
         "--progress": {"--progress": FLAG, "--quiet": REMOVE},
         "--quiet": based({"--progress": FLAG}, REMOVE)}),
    "shard": (
        [("--policy", "gpt2"), ("--tp", "2"), ("--out", "s"), ("--json", FLAG), ("--quiet", FLAG)], ["{F}/ckpt"],
        {"--policy": {"--policy": REMOVE, "--tp": REMOVE}, "--tp": "4",
         "--plan": {"--policy": REMOVE, "--tp": REMOVE, "--plan": "{F}/ckpt-plan.json"},
         "--config": "{F}/other/config.json", "--out": "s2", "--dtype": "bf16", "--json": REMOVE, "--quiet": REMOVE,
         "--follow-symlinks": pre({"->../t.safetensors": "s/rank-0.safetensors"}, FLAG)}),
    "verify": (
        [("--plan", "{F}/v.json"), ("--json", FLAG)], [],
        {"--plan": "{F}/v-infer.json", "--dtype": "f32", "--seed": "2", "--rtol": "0.5",
         "--timeout": weak("0", "a collective's time-out shows only when a rank hangs"),
         "--max-memory": "1KiB", "--optimizer": "sgd", "--forward-only": FLAG, "--json": REMOVE, "--progress": FLAG,
         "--batch": "8", "--seq": "4", "--weights": "{F}/vck", "--tokens": "{F}/tokens.json", "--outputs": "o.safetensors"}),
    "synth": (
        TINY_LLAMA[:-2] + [("--out", "c"), ("--json", FLAG)], [],
        {"--model": "gpt2", "--layers": "2", "--hidden": "64", "--heads": "8", "--kv-heads": "2", "--ffn": "128",
         "--vocab": "256", "--seq": "64", "--dtype": "bf16", "--out": "c2", "--seed": "2", "--json": REMOVE,
         "--follow-symlinks": pre({"->../t.json": "c/config.json"}, FLAG)}),
    "export": (
        [("--plan", "{F}/tp.json"), ("--to", "hf-tp-plan"), ("--out", "e.json")], [],
        {"--plan": "{F}/megatron.json", "--to": "dtensor", "--out": "e2.json", "--axis": "dp", "--transformers": "4",
         "--follow-symlinks": pre({"->t.json": "e.json"}, FLAG)}),
    "calibrate": (
        [("--mesh", "2"), ("--max-bytes", "65536"), ("--repeats", "1"), ("--out", "l.json"), ("--json", FLAG)], [],
        {"--mesh": "2x2", "--out": "l2.json", "--max-bytes": "262144",
         "--repeats": weak("0", "more repeats change only the measured times, which differ from run to run anyway"),
         "--json": REMOVE, "--from-env": FLAG, "--follow-symlinks": pre({"->t.json": "l.json"}, FLAG)}),
    "completion": ([], [], {}),
}

# Values that differ from run to run, left out of the comparison: JSON keys (anywhere), and
# for calibrate every measured (non-integer) number.
VOLATILE_KEYS = {"seconds", "first_feasible_seconds", "read_seconds", "reference_seconds", "sharded_seconds", "generation",
                 "bytes_per_second"}
MEASURED = {"calibrate"}


def scrub(x, sub):
    if isinstance(x, dict):  # explain's "seconds" are modeled, not measured
        return {k: scrub(v, sub) for k, v in x.items() if not (k in VOLATILE_KEYS and sub != "explain")}
    if isinstance(x, list):
        return [scrub(v, sub) for v in x]
    if sub in MEASURED and isinstance(x, float) and x != int(x):
        return "measured"
    return x


def text_scrub(s):
    """Times and rates in progress lines and reports differ from run to run."""
    return re.sub(r"\d+(\.\d+)?(e[-+]?\d+)?", "#", s)


def as_data(text, sub):
    try:
        return ("json", scrub(json.loads(text), sub))
    except ValueError:
        return ("text", text_scrub(text))


def observe(sub, argv, files):
    with tempfile.TemporaryDirectory() as d:
        for src, dst in files.items():
            (pathlib.Path(d) / dst).parent.mkdir(parents=True, exist_ok=True)
            if src.startswith("->"):
                os.symlink(src[2:], pathlib.Path(d) / dst)
            else:
                shutil.copy(fixture / src, pathlib.Path(d) / dst)
        r = subprocess.run([tool, sub, *argv], cwd=d, capture_output=True, text=True, timeout=300)
        written = {}
        for p in sorted(pathlib.Path(d).rglob("*")):
            if not p.is_file():
                continue
            rel = str(p.relative_to(d))
            data = p.read_bytes()
            if p.suffix == ".json":
                written[rel] = as_data(data.decode(), sub)
            elif sub == "shard" and p.suffix == ".safetensors":  # holds the generation id
                written[rel] = len(data)
            else:
                written[rel] = hashlib.sha256(data).hexdigest()
        return {"exit status": r.returncode, "stdout": as_data(r.stdout, sub), "stderr": text_scrub(r.stderr),
                "files": written}, r


def command(base, positional, change):
    opts = dict(base)
    order = [k for k, _ in base]
    changes = change if isinstance(change, dict) else None
    for k, v in (changes or {}).items():
        if v is REMOVE:
            opts.pop(k, None)
        else:
            if k not in opts:
                order.append(k)
            opts[k] = v
    argv = [a.replace("{F}", str(fixture)) for a in positional]
    for k in order:
        if k not in opts:
            continue
        v = opts[k]
        argv += [k] if v is FLAG else [k, v.replace("{F}", str(fixture))]
    return argv


def help_options(sub):
    h = subprocess.run([tool, sub, "--help"], capture_output=True, text=True).stdout
    body = h.split("Options:", 1)[1] if "Options:" in h else ""
    return {m.group(1) for m in (re.match(r"^\s+(?:-\w,)?(--[a-z][a-z0-9-]*)", l) for l in body.splitlines()) if m} - {"--help"}


def make_fixture(d):
    def run(*args):
        r = subprocess.run([tool, *args], cwd=d, capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"fixture: autoshard {' '.join(args)} failed:\n{r.stderr}")
    tiny = [a for kv in TINY_LLAMA for a in kv]
    run("plan", *tiny, "--mesh", "2x2", "--algo", "megatron", "--out", "megatron.json", "--quiet")
    run("calibrate", "--mesh", "2x2", "--max-bytes", "65536", "--repeats", "1", "--out", "links.json")
    run("solve", str(root / "tests/data/solve/example.json"), "--solution-out", "answer.json", "--quiet")
    run("synth", "--model", "gpt2", "--layers", "2", "--hidden", "64", "--heads", "4", "--vocab", "256", "--out", "ckpt")
    run("synth", "--model", "gpt2", "--layers", "3", "--hidden", "64", "--heads", "4", "--vocab", "256", "--out", "other")
    run("plan", "--model", "ckpt", "--mesh", "2x2", "--out", "ckpt-plan.json", "--quiet")
    v = ["--model", "gpt2", "--layers", "1", "--hidden", "16", "--heads", "2", "--vocab", "32", "--seq", "8", "--batch", "4",
         "--mesh", "2x2", "--quiet"]
    run("plan", *v, "--out", "v.json")
    run("plan", *v, "--mode", "infer", "--out", "v-infer.json")
    run("synth", *v[:10], "--out", "vck")  # v.json's model's checkpoint (verify --weights)
    (pathlib.Path(d) / "tokens.json").write_text(json.dumps([[(3 * i + r) % 32 for i in range(8)] for r in range(4)]))
    run("plan", "--model", "llama-7b", "--layers", "2", "--mesh", "dp=2,tp=4", "--algo", "megatron", "--out", "tp.json", "--quiet")


# (subcommand, arguments, what stderr must name): each must exit 2 and write nothing.
EXPLAIN = ["--mesh", "2x2", "--shape", "8,4", "--from", "[R,R]", "--to", "[R,R]"]
TINY_PLAN = ["--model", "gpt2", "--layers", "1", "--hidden", "16", "--heads", "2", "--vocab", "32", "--seq", "8",
             "--batch", "4", "--mesh", "2x2", "--quiet", "--out", "p.json"]
USAGE = [
    ("explain", EXPLAIN + ["--bogus"], "--bogus"),
    ("explain", ["--mesh", "2x2", "--shape", "8,4", "--from", "[R,R]"], "--to"),
    ("explain", EXPLAIN + ["--inter-hop", "-1"], "--inter-hop"),
    ("explain", EXPLAIN + ["--intra-lat", "nan"], "--intra-lat"),
    ("explain", EXPLAIN + ["--dtype", "f8"], "--dtype"),
    ("plan", TINY_PLAN + ["--layers", "0"], "--layers"),
    ("plan", TINY_PLAN + ["--mip-rel-gap", "2"], "--mip-rel-gap"),
    ("plan", TINY_PLAN + ["--time-limit", "0"], "--time-limit"),
    ("plan", TINY_PLAN + ["--inter-bw", "inf"], "--inter-bw"),
    ("plan", TINY_PLAN + ["--dtype", "f8"], "--dtype"),
    ("plan", TINY_PLAN + ["--memory-budget", "lots"], "--memory-budget"),
    ("plan", TINY_PLAN + ["--algo", "greedy"], "--algo"),
    ("plan", TINY_PLAN + ["--device", "v100"], "--device"),
    ("plan", TINY_PLAN + ["--optimizer", "lamb"], "--optimizer"),
    ("plan", TINY_PLAN + ["--gradient-overlap", "1.5"], "--gradient-overlap"),
    ("solve", [str(root / "tests/data/solve/example.json"), "--mip-rel-gap", "1.5"], "--mip-rel-gap"),
    ("verify", ["--plan", "{F}/v.json", "--rtol", "2"], "--rtol"),
    ("verify", ["--plan", "{F}/v.json", "--timeout", "100000"], "--timeout"),
    ("verify", ["--plan", "{F}/v.json", "--max-memory", "lots"], "--max-memory"),
    ("verify", ["--plan", "{F}/v.json", "--dtype", "bf16"], "--dtype"),
    ("verify", ["--plan", "{F}/v.json", "--batch", "0"], "--batch"),
    ("verify", ["--plan", "{F}/v.json", "--seq", "-3"], "--seq"),
    ("synth", ["--model", "gpt2", "--layers", "1", "--out", "c", "--seed", "-1"], "--seed"),
    ("synth", ["--model", "gpt2", "--layers", "1", "--out", "c", "--dtype", "f8"], "--dtype"),
    ("shard", ["{F}/ckpt", "--policy", "gpt2", "--tp", "0", "--out", "s"], "--tp"),
    ("shard", ["{F}/ckpt", "--policy", "gpt2", "--tp", "2", "--out", "s", "--dtype", "f8"], "--dtype"),
    ("calibrate", ["--repeats", "0", "--out", "l.json"], "--repeats"),
    ("calibrate", ["--max-bytes", "1e30", "--out", "l.json"], "--max-bytes"),
    ("export", ["--plan", "{F}/tp.json", "--to", "onnx", "--out", "e.json"], "--to"),
    ("show", ["--mesh", "2x2", "--shape", "8,4", "--spec", "[R,R]", "--tensor", "x"], "--tensor"),
]

fails = passes = weaks = unseens = 0


def fail(msg):
    global fails
    print(f"FAIL {msg}")
    fails += 1


with tempfile.TemporaryDirectory() as fx:
    fixture = pathlib.Path(fx)
    make_fixture(fixture)
    subs = set(TABLE) if not only else only
    top = subprocess.run([tool, "--help"], capture_output=True, text=True).stdout.split("Subcommands:", 1)[1]
    for sub in sorted({l.split()[0] for l in top.splitlines() if l.strip()} | set(TABLE)):
        if sub not in subs:
            continue
        if sub not in TABLE:
            fail(f"{sub}: a subcommand the table does not know")
            continue
        base, positional, changes = TABLE[sub]
        shown = help_options(sub)
        for o in sorted(shown - set(changes)):
            fail(f"{sub} --help shows {o}, which the table does not know: add what it changes (or hide it if it changes nothing)")
        for o in sorted(set(changes) - shown):
            fail(f"{sub} --help does not show {o}, which the table lists")
        base_seen = {}
        for opt, change in changes.items():
            if opt not in shown:
                continue
            files = {}
            if isinstance(change, tuple) and change[0] == "unseen":
                print(f"unseen {sub} {opt}: not checked ({change[1]})")
                unseens += 1
                continue
            if isinstance(change, tuple) and change[0] == "weak":
                argv = command(base, positional, {opt: change[1]})
                r = subprocess.run([tool, sub, *argv], capture_output=True, text=True, cwd=fixture)
                if r.returncode == 2 and opt in r.stderr:
                    print(f"weak {sub} {opt}: only its range is checked ({change[2]})")
                    weaks += 1
                else:
                    fail(f"{sub} {opt} {change[1]}: exit {r.returncode}, wanted a usage error naming {opt}")
                continue
            row_base = base
            if isinstance(change, tuple) and change[0] == "pre":
                files, change = change[1], change[2]
            if isinstance(change, tuple) and change[0] == "based":
                row_base = [(k, v) for k, v in base if change[1].get(k, v) is not REMOVE]
                row_base = [(k, change[1].get(k, v)) for k, v in row_base] + \
                           [(k, v) for k, v in change[1].items() if v is not REMOVE and k not in dict(base)]
                change = change[2]
            key = (tuple(sorted(files.items())), tuple(row_base))
            if key not in base_seen:
                base_seen[key] = observe(sub, command(row_base, positional, {}), files)
            b, _ = base_seen[key]
            argv = command(row_base, positional, change if isinstance(change, dict) else {opt: change})
            c, r = observe(sub, argv, files)
            differs = [k for k in b if b[k] != c[k]]
            if differs:
                print(f"ok   {sub} {opt}: changes the {', '.join(differs)}")
                passes += 1
            else:
                fail(f"{sub} {opt}: `autoshard {sub} {' '.join(argv)}` does the same as without the change "
                     f"(exit {r.returncode}): an option that changes nothing should not be shown")
    for sub, args, names in USAGE:
        if only and sub not in only:
            continue
        with tempfile.TemporaryDirectory() as d:
            argv = [a.replace("{F}", str(fixture)) for a in args]
            r = subprocess.run([tool, sub, *argv], cwd=d, capture_output=True, text=True, timeout=120)
            left = sorted(p.name for p in pathlib.Path(d).iterdir())
            if r.returncode == 2 and names in r.stderr and not left:
                print(f"ok   {sub} {' '.join(args[-2:])}: a usage error naming {names}")
                passes += 1
            else:
                fail(f"autoshard {sub} {' '.join(argv)}: exit {r.returncode}, wrote {left}, said "
                     f"{r.stderr.strip()[:300]!r}; wanted a usage error (exit 2) naming {names}, nothing written")
print(f"cli options: {passes} change what the command does, {weaks} weak, {unseens} unseen, {fails} failed")
sys.exit(1 if fails else 0)
