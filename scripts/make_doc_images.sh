#!/usr/bin/env bash
# Regenerates the block-map pictures of docs/specs.md (docs/img/spec_*.svg) with the
# autoshard tool itself, and checks that every terminal rendering quoted in the docs (a
# ```text block whose first line is `$ autoshard show ... --spec ...`) is still what the
# tool prints.
#
#   bash scripts/make_doc_images.sh [TOOL]     # TOOL: the autoshard binary; default
#                                              # build/release/tools/autoshard, then build/gcc/...
#   bash scripts/make_doc_images.sh --check    # also fail if a picture changed (git diff)
#
# The pictures are a [4,8] tensor on a 2x2 mesh under each kind of spec, and two uneven splits.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
check=0
tool=${AUTOSHARD_TOOL:-}
for a in "$@"; do
  case $a in
    --check) check=1 ;;
    *) tool=$a ;;
  esac
done
if [ -z "$tool" ]; then
  for t in "$root/build/release/tools/autoshard" "$root/build/gcc/tools/autoshard"; do
    if [ -x "$t" ]; then tool=$t; break; fi
  done
fi
if [ -z "$tool" ] || [ ! -x "$tool" ]; then
  echo "make_doc_images: no autoshard tool; build it (cmake --preset release && cmake --build --preset release --target autoshard_tool) or pass its path" >&2
  exit 1
fi
img=$root/docs/img
mkdir -p "$img"

draw() {  # draw NAME show-arguments...
  local name=$1; shift
  "$tool" show "$@" --svg "$img/$name.svg" >/dev/null
  echo "wrote docs/img/$name.svg: autoshard show $*"
}
draw spec_S0R  --mesh 2x2 --shape 4,8 --spec "[S(0),R]"
draw spec_RS1  --mesh 2x2 --shape 4,8 --spec "[R,S(1)]"
draw spec_S0S1 --mesh 2x2 --shape 4,8 --spec "[S(0),S(1)]"
draw spec_S1S0 --mesh 2x2 --shape 4,8 --spec "[S(1),S(0)]"
draw spec_S01R --mesh 2x2 --shape 4,8 --spec "[S(0),S(0)]"
draw spec_RR   --mesh 2x2 --shape 4,8 --spec "[R,R]"
draw spec_PR   --mesh 2x2 --shape 4,8 --spec "[P,R]"
draw spec_uneven_6_over_4 --mesh 4 --shape 6,8 --spec "[S(0)]"
draw spec_uneven_nested   --mesh 2x4 --shape 10,4 --spec "[S(0),S(0)]"

# The terminal renderings quoted in the docs: run each quoted command, compare its output.
python3 - "$tool" "$root" <<'PY'
import pathlib, re, shlex, subprocess, sys
tool, root = sys.argv[1], pathlib.Path(sys.argv[2])
bad = checked = 0
for md in sorted((root / "docs").glob("*.md")):
    for m in re.finditer(r"```text\n\$ autoshard (show [^\n]*)\n(.*?)```", md.read_text(), re.S):
        args = shlex.split(m.group(1))
        if "--spec" not in args:  # `show --plan` needs a plan file; those quotes are excerpts
            continue
        if "--svg" in args:  # the picture is not needed, and the "wrote" line is not quoted
            i = args.index("--svg")
            del args[i:i + 2]
        got = subprocess.run([tool, *args], capture_output=True, text=True).stdout
        checked += 1
        if got != m.group(2):
            bad += 1
            print(f"make_doc_images: {md.name}: `autoshard {m.group(1)}` now prints:\n{got}", file=sys.stderr)
print(f"make_doc_images: {checked} quoted terminal renderings checked, {bad} differ")
sys.exit(1 if bad else 0)
PY

if [ "$check" = 1 ]; then
  git -C "$root" diff --exit-code --stat -- docs/img/ || { echo "make_doc_images: pictures changed; commit them" >&2; exit 1; }
fi
