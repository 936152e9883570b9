"""Runs every `autoshard` command that README.md and docs/*.md show, so the docs stay true
against the tool (`check_docs.py --tool PATH`, the `docs.commands` test).

Per document, in a fresh scratch directory (`tests/` there links to the repository's, so
`tests/data/...` paths work; `autoshard` on PATH is the tool under test), in the order the
document shows them:

* Shell blocks (```sh, ```bash, ```console): each line (`\\` continuations joined) that
  starts with `autoshard` runs in bash and must exit 0. The optional groups of a synopsis
  (`[--dtype f32]`, `[--json]`) are left out of the run, and each option they name must be
  one that `autoshard SUB --help` lists. A line that starts autoshard through another
  program (`torchrun ... autoshard calibrate`) must be in a skipped block; other lines
  (`bash scripts/demo.sh`) are listed as not run, with the count.
* Transcripts (```text blocks whose first line starts with `$ `): each `$ autoshard ...`
  line runs, and what it prints (stdout and stderr together, as a terminal shows them)
  must equal the lines shown under it; a line `...` stands for any number of lines, and
  trailing blanks are ignored.
* What the examples write into the working directory (not what a setup directive or the run
  itself made) must be ignored by the root .gitignore: run from the checkout, the docs'
  examples leave `git status` clean.
* Python blocks (```python) run, in the real client's environment (scripts/client_env.sh,
  made once per machine; one that cannot be made fails the run): the first line is a comment
  naming the file, `# apply.py — ...`, which is written to the scratch directory and run there;
  when that line says `torchrun --nproc-per-node N apply.py`, on N ranks
  (tests/client/launch.py: torchrun's environment, the ranks forked from one import of torch
  and transformers), else with `python apply.py`. Each must exit 0. (scripts/test.sh runs
  the docs tests in the GCC or Clang step only, so once per run.)
* Directives, HTML comments right before a block (only blank lines or other directives
  between), which a reader of the rendered page does not see:
    <!-- docs-test: skip (why) -->   the block's commands are not run: listed with why, counted
    <!-- docs-test: exit N -->       the block's commands must exit N instead of 0
    <!-- docs-test: setup CMD -->    CMD runs first (e.g. makes the model directory that a
                                     placeholder such as `path/to/Qwen2-0.5B` stands for)
  A directive that no block follows is an error.
* Inline code spans in prose that read `autoshard SUB --opt ...`: SUB must be a subcommand
  and every option one that its --help lists (they are not run: their files are the
  reader's).
"""
import difflib, os, pathlib, re, shlex, subprocess, tempfile, time

SHELL_LANGS = {"sh", "bash", "shell", "console"}
FENCE_OPEN = re.compile(r"^\s*```([\w+-]*)\s*$")
FENCE_CLOSE = re.compile(r"^\s*```\s*$")
DIRECTIVE = re.compile(r"^\s*<!--\s*docs-test:\s*(.*?)\s*-->\s*$")
INLINE = re.compile(r"`(autoshard (?:[a-z]+|--[a-z-]+)(?: [^`]*)?)`")
OPTION_LINE = re.compile(r"^\s+(?:-\w,)?(--[a-z][a-z0-9-]*)")


def blocks(text):
    """(language, body lines, directives, first body line number) of each fenced block, where
    directives are (text, line number); and the problems: directives that no block follows."""
    lines = text.splitlines()
    found, problems, pending = [], [], []
    i = 0
    while i < len(lines):
        m = FENCE_OPEN.match(lines[i])
        if m:
            start, body = i + 2, []
            i += 1
            while i < len(lines) and not FENCE_CLOSE.match(lines[i]):
                body.append(lines[i])
                i += 1
            found.append((m.group(1), body, pending, start))
            pending = []
        else:
            d = DIRECTIVE.match(lines[i])
            if d:
                pending.append((d.group(1), i + 1))
            elif lines[i].strip() and pending:
                problems += [(n, f"docs-test directive '{t}' is not right before a block") for t, n in pending]
                pending = []
        i += 1
    problems += [(n, f"docs-test directive '{t}' is not right before a block") for t, n in pending]
    return found, problems


def prose(text):
    """The text outside fenced blocks."""
    out, inside = [], False
    for line in text.splitlines():
        if (FENCE_CLOSE if inside else FENCE_OPEN).match(line):
            inside = not inside
        elif not inside:
            out.append(line)
    return "\n".join(out)


def shell_commands(body):
    """(command, line offset) for each logical line of a shell block, continuations joined."""
    cmd, first = "", 0
    for k, line in enumerate(body):
        if not cmd:
            first = k
        if line.rstrip().endswith("\\"):
            cmd += line.rstrip()[:-1] + " "
            continue
        cmd += line
        if cmd.strip():
            yield cmd.strip(), first
        cmd = ""
    if cmd.strip():
        yield cmd.strip(), first


def transcript(body):
    """(command, shown output lines, line offset) for each `$ ` line of a transcript."""
    out = []
    for k, line in enumerate(body):
        if line.startswith("$ "):
            out.append([line[2:].strip(), [], k])
        elif out:
            out[-1][1].append(line)
    return out


def output_matches(shown, got):
    """Whether `got` is `shown`, where a `...` line of `shown` stands for any number of lines."""
    shown = [l.rstrip() for l in shown]
    got = [l.rstrip() for l in got]
    while shown and not shown[-1]:
        shown.pop()
    while got and not got[-1]:
        got.pop()
    # ok[j]: shown[:i] matches got[:j]
    ok = [True] + [False] * len(got)
    for line in shown:
        if line.strip() == "...":
            for j in range(1, len(got) + 1):
                ok[j] = ok[j] or ok[j - 1]
        else:
            ok = [False] + [ok[j - 1] and got[j - 1] == line for j in range(1, len(got) + 1)]
    return ok[len(got)]


class Tool:
    def __init__(self, path):
        self.path = path
        top = subprocess.run([str(path), "--help"], capture_output=True, text=True).stdout
        sub = top.split("Subcommands:", 1)[1] if "Subcommands:" in top else ""
        self.subcommands = {l.split()[0] for l in sub.splitlines() if l.strip()}
        self.top_options = {m.group(1) for m in map(OPTION_LINE.match, top.splitlines()) if m}
        self._options = {}

    def options(self, sub):
        if sub not in self._options:
            h = subprocess.run([str(self.path), sub, "--help"], capture_output=True, text=True).stdout
            opts = h.split("Options:", 1)[1] if "Options:" in h else ""
            self._options[sub] = {m.group(1) for m in map(OPTION_LINE.match, opts.splitlines()) if m}
        return self._options[sub]

    def check_options(self, words):
        """Problems with `autoshard SUB --opt ...` written as words: an unknown subcommand or option."""
        if len(words) < 2:
            return []
        if words[1].startswith("--"):
            return [] if words[1] in self.top_options else [f"autoshard has no option {words[1]}"]
        sub = words[1]
        if sub not in self.subcommands:
            return [f"autoshard has no subcommand '{sub}'"]
        known = self.options(sub)
        return [f"autoshard {sub} has no option {w.strip('[]')}" for w in words[2:]
                if re.fullmatch(r"\[?--[a-z][a-z0-9-]*(=.*)?\]?", w) and w.strip("[]").split("=")[0] not in known]


def synopsis(cmd):
    """A synopsis without its optional groups (`[--dtype f32]`), and the words of those groups."""
    words = shlex.split(cmd, comments=True)
    kept, optional, depth = [], [], 0
    for w in words:
        if depth == 0 and w.startswith("[--"):
            depth = 1
        if depth:
            optional.append(w)
            if w.endswith("]"):
                depth = 0
        else:
            kept.append(w)
    return (shlex.join(kept) if optional else cmd), optional


PYTHON_FILE = re.compile(r"^#\s*([\w\-]+\.py)\b")
TORCHRUN = re.compile(r"torchrun --nproc-per-node[ =](\d+) ([\w\-]+\.py)")
_client_python = []
REPO = pathlib.Path(__file__).resolve().parents[1]  # this checkout (the docs checked may lie elsewhere)


def client_python():
    """The real client's python (scripts/client_env.sh makes its environment once per machine)."""
    if not _client_python:
        r = subprocess.run(["bash", str(REPO / "scripts" / "client_env.sh")], capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"scripts/client_env.sh exited {r.returncode}:\n{r.stderr[-3000:]}")
        _client_python.append(r.stdout.strip())
    return _client_python[0]


class Runner:
    def __init__(self, root, tool, doc, scratch, bindir):
        self.root, self.tool, self.doc, self.scratch = root, tool, doc, scratch
        self.env = dict(os.environ, PATH=f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")
        self.ran = self.compared = self.skipped = self.failed = self.other = 0
        self.not_written = {"tests"}  # what the harness or a setup directive made, not the doc's examples

    def entries(self):
        return {p.name for p in self.scratch.iterdir()}

    def where(self, line):
        return f"{self.doc.relative_to(self.root)}:{line}"

    def fail(self, line, what):
        print(f"FAIL {self.where(line)}: {what}")
        self.failed += 1

    def run(self, cmd, line, want_rc=0, shown=None):
        t0 = time.monotonic()
        try:
            r = subprocess.run(["bash", "-c", "set -o pipefail\n" + cmd], cwd=self.scratch, env=self.env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
        except subprocess.TimeoutExpired:
            self.fail(line, f"`{cmd}` ran longer than 300 s")
            return
        self.ran += 1
        secs = time.monotonic() - t0
        if r.returncode != want_rc:
            self.fail(line, f"`{cmd}` exited {r.returncode}, the doc expects {want_rc}:\n{r.stdout[-3000:]}")
            return
        if shown is not None:
            self.compared += 1
            if not output_matches(shown, r.stdout.splitlines()):
                diff = "\n".join(difflib.unified_diff(shown, r.stdout.splitlines(), "shown in the doc", "printed", lineterm=""))
                self.fail(line, f"`{cmd}` prints other than the doc shows:\n{diff[:4000]}")
                return
        print(f"ok   {self.where(line)}: {cmd}  ({secs:.1f} s)")

    def python(self, body, line, skip, want_rc):
        """Runs a python block in the real client (see the module comment)."""
        m = PYTHON_FILE.match(body[0]) if body else None
        if not m:
            self.fail(line, "a python block starts with a comment naming its file (`# apply.py — ...`): every snippet runs")
            return
        name = m.group(1)
        if skip is not None:
            print(f"SKIP {self.where(line)}: {name}  ({skip})")
            self.skipped += 1
            return
        (self.scratch / name).write_text("\n".join(body) + "\n", encoding="utf-8")
        self.not_written.add(name)
        ranks = TORCHRUN.search(body[0])
        if ranks and ranks.group(2) != name:
            self.fail(line, f"the block is {name}, but its first line runs {ranks.group(2)}")
            return
        try:
            py = client_python()
        except RuntimeError as e:
            self.fail(line, f"no environment for the real client: {e}")
            return
        launch = [str(REPO / "tests" / "client" / "launch.py"), ranks.group(1)] if ranks else []
        t0 = time.monotonic()
        try:
            r = subprocess.run([py, *launch, name], cwd=self.scratch, env=self.env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, timeout=300)
        except subprocess.TimeoutExpired:
            self.fail(line, f"{name} ran longer than 300 s")
            return
        self.ran += 1
        if r.returncode != want_rc:
            self.fail(line, f"{name} exited {r.returncode}, the doc expects {want_rc}:\n{r.stdout[-3000:]}")
            return
        print(f"ok   {self.where(line)}: {name}" + (f" on {ranks.group(1)} ranks" if ranks else "") +
              f"  ({time.monotonic() - t0:.1f} s)")

    def document(self):
        text = self.doc.read_text(encoding="utf-8")
        for span in INLINE.findall(prose(text)):
            for problem in self.tool.check_options(span.split()):
                self.fail("prose", f"`{span}`: {problem}")
        found, problems = blocks(text)
        for line, problem in problems:
            self.fail(line, problem)
        for lang, body, directives, start in found:
            skip, want_rc = None, 0
            for d, dline in directives:
                if m := re.fullmatch(r"skip \((.+)\)", d):
                    skip = m.group(1)
                elif m := re.fullmatch(r"exit (\d+)", d):
                    want_rc = int(m.group(1))
                elif m := re.fullmatch(r"setup (.+)", d):
                    before = self.entries()
                    self.run(m.group(1), dline)
                    self.not_written |= self.entries() - before
                else:
                    self.fail(dline, f"unknown docs-test directive '{d}' (skip (why), exit N, setup CMD)")
            if lang == "python":
                self.python(body, start, skip, want_rc)
                continue
            if lang in SHELL_LANGS:
                cmds = [(c, start + k, None) for c, k in shell_commands(body) if not c.startswith("#")]
            elif body and body[0].startswith("$ "):
                cmds = [(c, start + k, shown) for c, shown, k in transcript(body)]
            else:
                continue
            for cmd, line, shown in cmds:
                launched = not re.match(r"autoshard(\s|$)", cmd) and re.search(r"(^|\s)autoshard\s+[a-z]", cmd)
                if skip is None and launched:
                    self.fail(line, f"`{cmd}` runs autoshard through another program: show it plainly or mark "
                                    "the block <!-- docs-test: skip (why) -->")
                    continue
                if not re.match(r"autoshard(\s|$)", cmd) and not launched:
                    if lang in SHELL_LANGS and not shown:
                        print(f"--   {self.where(line)}: not an autoshard command, not run: {cmd[:100]}")
                        self.other += 1
                    continue
                if skip is not None:
                    words = shlex.split(cmd, comments=True)
                    first = next(k for k, w in enumerate(words) if w == "autoshard")
                    for problem in self.tool.check_options(words[first:]):  # not run, but still true
                        self.fail(line, f"`{cmd}`: {problem}")
                    print(f"SKIP {self.where(line)}: {cmd}  ({skip})")
                    self.skipped += 1
                    continue
                run_cmd, optional = synopsis(cmd)
                words = shlex.split(cmd, comments=True)
                for problem in self.tool.check_options([*words[:2], *optional]):
                    self.fail(line, f"`{cmd}`: {problem}")
                self.run(run_cmd, line, want_rc, shown)
        self.check_ignored()

    def check_ignored(self):
        """What the doc's examples wrote into the working directory is ignored by the repository's
        .gitignore at its root: run from the checkout, they leave `git status` clean."""
        written = sorted(self.entries() - self.not_written)
        if not written:
            return
        paths = [n + "/" if (self.scratch / n).is_dir() else n for n in written]
        r = subprocess.run(["git", "-C", str(self.root), "check-ignore", "--no-index", "--stdin"], input="\n".join(paths) + "\n",
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if r.returncode > 1 and "not a git repository" in r.stderr:
            print(f"--   {self.where('files')}: not a git checkout, .gitignore not checked for {len(paths)} files")
            return
        if r.returncode > 1:
            self.fail("files", f"git check-ignore failed: {r.stderr.strip()}")
            return
        left = sorted(set(paths) - set(r.stdout.split()))
        if left:
            self.fail("files", f"its examples, run from the checkout, leave {left} untracked: .gitignore must ignore them at the root")


def check(root, tool_path):
    tool = Tool(tool_path)
    docs = [root / "README.md", *sorted((root / "docs").glob("*.md"))]
    totals = dict(ran=0, compared=0, skipped=0, failed=0, other=0)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        bindir = pathlib.Path(tmp) / "bin"
        bindir.mkdir()
        (bindir / "autoshard").symlink_to(tool_path)
        for doc in docs:
            scratch = pathlib.Path(tmp) / doc.stem
            scratch.mkdir()
            (scratch / "tests").symlink_to(root / "tests")
            r = Runner(root, tool, doc, scratch, bindir)
            r.document()
            for k in totals:
                totals[k] += getattr(r, k)
    print(f"{totals['ran']} commands run ({totals['compared']} outputs compared), {totals['skipped']} skipped, "
          f"{totals['other']} not autoshard commands; {totals['failed']} failed; {time.monotonic() - t0:.0f} s")
    return 1 if totals["failed"] or totals["ran"] == 0 else 0
