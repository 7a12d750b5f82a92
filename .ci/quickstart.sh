#!/usr/bin/env bash
# Builds and runs the README's quickstart exactly as written: extracts every block marked
# `<!-- quickstart: PATH -->` into a new crate next to (a link to) this repository.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
ln -s "$repo" "$work/rdma-rpc"
mkdir -p "$work/greeter"
python3 - "$repo/README.md" "$work/greeter" <<'PY'
import os, re, sys
readme, dest = sys.argv[1], sys.argv[2]
text = open(readme).read()
blocks = re.findall(r"<!-- quickstart: (\S+) -->\n```\w*\n(.*?)```", text, re.S)
if len(blocks) < 4:
    sys.exit(f"quickstart: found {len(blocks)} marked blocks in the README, expected 4")
for path, body in blocks:
    target = os.path.join(dest, path)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    open(target, "w").write(body)
    print(f"quickstart: wrote {path}")
PY
cd "$work/greeter"
# Share the workspace's build directory: the registry crates this crate resolves to the same
# versions and features are built once (a directory of its own rebuilt all of them: 49 s
# against 31 s on this repository's 2-core machines).
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$repo/target}"
out="$(cargo run --quiet)"
echo "$out"
grep -q "hello, world!" <<<"$out"
grep -q "the server stored 3145728 bytes" <<<"$out"
echo "quickstart: works as written"
