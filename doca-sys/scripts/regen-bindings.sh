#!/usr/bin/env bash
# Regenerates src/bindings_software.rs from include/doca_rpc_sw.h with the pinned bindgen-cli.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bindgen-args.sh
source scripts/bindgen-args.sh
ensure_bindgen
generate src/bindings_software.rs
echo "regenerated doca-sys/src/bindings_software.rs"
