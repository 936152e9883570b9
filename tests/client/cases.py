"""The command line and the loop of a client test made of named cases (onnx_import_test.py,
rotary_test.py, sliding_window_test.py, megatron_test.py): `--tool PATH [--only NAME ...] [--keep DIR]`, each case run
as check(name, tool, work) -> what it proved, printed `ok   NAME: ... (s)` or `FAIL NAME:` with
its traceback; exit 1 when any failed. Imports nothing heavy: each test sets up torch first.
"""
import argparse, pathlib, tempfile, time, traceback


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
