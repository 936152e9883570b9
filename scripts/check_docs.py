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
    "autoshard/pass/": ["-lglpk"],
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

def base_flags(root: pathlib.Path):
    return ["-std=c++20", "-O0", "-I", str(root / "include"), "-isystem", "/usr/include/eigen3"]

def link_flags(body: str):
    libs = []
    for key, extra in AREA_FLAGS.items():
        if key in body or (key == "autoshard/gloo/" and "autoshard/gloo" in body):
            libs += [f for f in extra if f not in libs]
    return libs

def code_mask(code: str):
    """For each character of C++ source, True where it is code (not a comment or a literal)."""
    mask, i, n = [True] * len(code), 0, len(code)
    def hide(a, b):
        for k in range(a, min(b, n)):
            mask[k] = False
    while i < n:
        c = code[i]
        if code.startswith("//", i):
            j = code.find("\n", i); j = n if j < 0 else j
            hide(i, j); i = j
        elif code.startswith("/*", i):
            j = code.find("*/", i + 2); j = n if j < 0 else j + 2
            hide(i, j); i = j
        elif c == "R" and i + 1 < n and code[i + 1] == '"' and (i == 0 or not (code[i - 1].isalnum() or code[i - 1] == "_")):
            open_paren = code.find("(", i + 2)
            delim = code[i + 2:open_paren]
            j = code.find(")" + delim + '"', open_paren); j = n if j < 0 else j + len(delim) + 2
            hide(i, j); i = j
        elif c in "\"'":
            j = i + 1
            while j < n and code[j] != c:
                j += 2 if code[j] == "\\" else 1
            hide(i, j + 1); i = j + 1
        else:
            i += 1
    return mask

def ends_with_return(code: str):
    """The snippet with `return 0;` as the last statement of its main(): in a namespace, main is
    an ordinary function, and flowing off its end would be undefined (the global main returns 0).
    None when main() is not found at the top level."""
    mask = code_mask(code)
    for m in re.finditer(r"\bint\s+main\s*\(", code):
        if not mask[m.start()]:
            continue
        depth = sum(1 if ch == "{" else -1 for ch, ok in zip(code[:m.start()], mask) if ok and ch in "{}")
        if depth != 0:
            continue
        i = code.find("{", m.end())
        while i >= 0 and not mask[i]:
            i = code.find("{", i + 1)
        depth = 0
        for k in range(i, len(code)):
            if mask[k] and code[k] in "{}":
                depth += 1 if code[k] == "{" else -1
                if depth == 0:
                    return code[:k] + "  return 0;\n" + code[k:]
        return None
    return None

def compile_batch(compiler, root: pathlib.Path, tmp: pathlib.Path, items):
    """All snippets as one program: their #include lines first, each body in a namespace of its
    own (its main() becomes snippet_<k>::main), and a main() that runs the snippet named by
    argv[1]. Returns the executable, or None when a snippet does not fit this scheme (another
    preprocessor directive than #include) or the program does not compile."""
    includes, parts, calls = [], [], []
    for k, (_, name, body) in enumerate(items):
        lines = body.splitlines()
        if any(l.lstrip().startswith("#") and not l.lstrip().startswith("#include") for l in lines):
            return None
        includes += [l for l in lines if l.lstrip().startswith("#include") and l not in includes]
        code = ends_with_return("\n".join(l for l in lines if not l.lstrip().startswith("#include")))
        if code is None:
            return None
        with_args = re.search(r"\bint\s+main\s*\(\s*int\b", code) is not None
        parts.append(f"namespace snippet_{k} {{\n{code}\n}}  // namespace snippet_{k}\n")
        call = f"snippet_{k}::main(argc, argv)" if with_args else f"snippet_{k}::main()"
        calls.append(f'  if (std::strcmp(argv[1], "{name}") == 0) return {call};\n')
    src = tmp / "all_snippets.cpp"
    src.write_text("\n".join(["#include <cstring>", *includes]) + "\n\n" + "\n".join(parts) +
                   "\nint main(int argc, char** argv) {\n  if (argc < 2) return 2;\n" + "".join(calls) +
                   "  return 2;\n}\n", encoding="utf-8")
    exe = tmp / "all_snippets.out"
    r = subprocess.run([compiler, *base_flags(root), str(src), "-o", str(exe),
                        *link_flags("\n".join(body for _, _, body in items))], capture_output=True, text=True, cwd=tmp)
    if r.returncode != 0:
        print(f"note: the snippets do not compile as one program; compiling each alone:\n{r.stderr[-1500:]}")
        return None
    return exe

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
    items = [(md, name, body) for md in sorted((root / "docs").glob("*.md")) for name, body in snippets(md)]
    passed = failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        # One translation unit for all snippets: they include the same heavy headers (Boost.Graph,
        # nlohmann, Eigen, GLPK, Gloo), whose parsing is most of the time of each compile. Each
        # snippet still runs as its own process (`all.out <name>`). Should the batch not compile,
        # every snippet is compiled alone, so that the failure names its snippet.
        batch = compile_batch(a.compiler, root, tmp, items)
        for md, name, body in items:
            if batch:
                cmd = [str(batch), name]
            else:
                exe = tmp / (name[:-4] + ".out")
                src = tmp / name
                src.write_text(body, encoding="utf-8")
                r = subprocess.run([a.compiler, *base_flags(root), str(src), "-o", str(exe), *link_flags(body)],
                                   capture_output=True, text=True, cwd=tmp)
                if r.returncode != 0:
                    print(f"FAIL {md.name}: {name} does not compile:\n{r.stderr[-3000:]}")
                    failed += 1
                    continue
                cmd = [str(exe)]
            try:
                r = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp, timeout=a.timeout)
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
