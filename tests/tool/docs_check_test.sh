#!/usr/bin/env bash
# The docs' command checker (scripts/docs_commands.py) fails on each kind of wrong document
# in tests/data/docs_check and passes the right ones, so docs.commands cannot pass vacuously.
source "$(dirname "$0")/common.sh" "$1"
root=$(cd "$(dirname "$0")/../.." && pwd)
out=$(python3 "$root/scripts/check_docs.py" --root "$root/tests/data/docs_check" --tool "$tool" 2>&1); rc=$?
check() {  # check DESCRIPTION PATTERN: the checker's output has a line matching PATTERN
  if grep -qE -- "$2" <<<"$out"; then passes=$((passes+1)); else echo "FAIL: $1 (no line matching '$2')"; fails=$((fails+1)); fi
}
[ "$rc" -eq 1 ] && passes=$((passes+1)) || { echo "FAIL: the checker exited $rc on wrong docs, wanted 1"; fails=$((fails+1)); }
check "right output passes" '^ok   README.md:4: autoshard show'
check "an expected exit code passes" '^ok   README.md:11: autoshard explain --mesh 2x2'
check "output other than shown" '^FAIL docs/wrong.md:6: .* prints other than the doc shows'
check "a synopsis option the subcommand lacks" '^FAIL docs/wrong.md:14: .*has no option --no-such-option$'
check "the synopsis runs without its optional groups" "^ok   docs/wrong.md:14: autoshard explain --mesh 2 --shape 4 --from '\[R\]' --to '\[S\(0\)\]'  "
check "a failing command" '^FAIL docs/wrong.md:20: .* exited 1, the doc expects 0'
check "an inline command's wrong option" '^FAIL docs/wrong.md:prose: .*has no option --frm'
check "a launcher not marked skipped" '^FAIL docs/wrong.md:28: .*runs autoshard through another program'
check "a skipped command's wrong option" '^FAIL docs/wrong.md:35: .*autoshard calibrate has no option --bogus'
check "a skipped command is listed with why" '^SKIP docs/wrong.md:35: .*\(shows a launch\)'
check "a directive away from its block" '^FAIL docs/wrong.md:38: docs-test directive'
check "a python block without its file named" '^FAIL docs/wrong.md:49: a python block starts with a comment naming its file'
check "a python block that fails" '^FAIL docs/wrong.md:53: fails.py exited 3'
check "the summary counts" '^7 commands run \(2 outputs compared\), 1 skipped, 0 not autoshard commands; 9 failed'
[ "$fails" -eq 0 ] || echo "$out"
finish docs_check
