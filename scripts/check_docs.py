#!/usr/bin/env python3
"""Keeps the docs true: compiles and runs every runnable C++ example in docs/*.md, or (with
--tool) runs every `autoshard` command the docs and the README show.

C++: a fenced ```cpp block is runnable when its first line is a comment naming a file,
e.g. `// first.cpp — ...`. Link flags follow the autoshard areas it includes.

Commands (--tool PATH): see docs_commands.py.
Prints 'N passed, N failed' and exits non-zero on any failure.
"""
import argparse, pathlib, re, subprocess, sys, tempfile

AREA_FLAGS = {
    "autoshard/solve/": ["-lglpk"],
    "autoshard/gloo/": ["-lgloo", "-pthread"],
    "autoshard/exec/": ["-lglpk", "-lgloo", "-pthread"],
    "autoshard/onnx/": ["-DONNX_NAMESPACE=onnx", "-DONNX_ML=1", "-lonnx", "-lonnx_proto", "-lprotobuf", "-pthread"],
}

def snippets(md: pathlib.Path):
    text = md.read_text(encoding="utf-8")
    for m in re.finditer(r"```cpp\n(.*?)```", text, re.S):
        body = m.group(1)
        first = body.splitlines()[0] if body.strip() else ""
        name = re.match(r"//\s*([\w\-]+\.cpp)\b", first)
        if name:
            yield name.group(1), body

def missing_headers(root: pathlib.Path):
    """Every <autoshard/...hpp> named in a header, a doc, the tool, cmake or the README exists."""
    out = []
    files = [*(root / "include").rglob("*.hpp"), *(root / "docs").glob("*.md"), root / "README.md",
             *(root / "tools").rglob("*.[ch]pp"), *(root / "cmake").glob("*"), *(root / "examples").rglob("*.c*")]
    for f in files:
        if not f.is_file():
            continue
        for m in re.finditer(r"(?<![\w/])autoshard/((?:[a-z_]+/)*[a-z_]+\.hpp)", f.read_text(encoding="utf-8", errors="replace")):
            if not (root / "include" / "autoshard" / m.group(1)).is_file():
                out.append(f"{f.relative_to(root)} names <autoshard/{m.group(1)}>, which does not exist")
    return out

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--compiler", default="c++")
    ap.add_argument("--root", default=str(pathlib.Path(__file__).resolve().parent.parent))
    ap.add_argument("--timeout", type=int, default=300)
    ap.add_argument("--tool", help="run the docs' autoshard commands with this binary instead of the C++ examples")
    a = ap.parse_args()
    root = pathlib.Path(a.root)
    if a.tool:
        sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
        import docs_commands
        return docs_commands.check(root, pathlib.Path(a.tool).resolve())
    passed = failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for md in sorted((root / "docs").glob("*.md")):
            for name, body in snippets(md):
                src = pathlib.Path(tmp) / name
                src.write_text(body, encoding="utf-8")
                exe = pathlib.Path(tmp) / (name[:-4] + ".out")
                flags = ["-std=c++20", "-O0", "-I", str(root / "include"), "-isystem", "/usr/include/eigen3"]
                libs = []
                for key, extra in AREA_FLAGS.items():
                    if key in body or (key == "autoshard/gloo/" and "autoshard/gloo" in body):
                        libs += extra
                cmd = [a.compiler, *flags, str(src), "-o", str(exe), *libs]
                r = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp)
                if r.returncode != 0:
                    print(f"FAIL {md.name}: {name} does not compile:\n{r.stderr[-3000:]}")
                    failed += 1
                    continue
                try:
                    r = subprocess.run([str(exe)], capture_output=True, text=True, cwd=tmp, timeout=a.timeout)
                except subprocess.TimeoutExpired:
                    print(f"FAIL {md.name}: {name} timed out")
                    failed += 1
                    continue
                if r.returncode != 0:
                    print(f"FAIL {md.name}: {name} exited {r.returncode}:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
                    failed += 1
                else:
                    print(f"ok   {md.name}: {name}")
                    passed += 1
    for problem in missing_headers(root):
        print(f"FAIL {problem}")
        failed += 1
    print(f"{passed} passed, {failed} failed")
    return 1 if failed or passed == 0 else 0

if __name__ == "__main__":
    sys.exit(main())
