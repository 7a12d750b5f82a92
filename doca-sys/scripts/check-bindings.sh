#!/usr/bin/env bash
# Regenerates the software bindings into a temporary file and fails (exit 1) if they differ
# from the committed src/bindings_software.rs. Installs bindgen-cli and libclang when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bindgen-args.sh
source scripts/bindgen-args.sh
ensure_bindgen
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
generate "$tmp/bindings_software.rs"
if ! diff -u src/bindings_software.rs "$tmp/bindings_software.rs"; then
    echo "doca-sys: src/bindings_software.rs is out of date; run doca-sys/scripts/regen-bindings.sh" >&2
    exit 1
fi
echo "doca-sys: committed bindings are up to date"
