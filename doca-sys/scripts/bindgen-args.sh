# Shared bindgen settings for the committed software bindings (sourced by the other scripts).
# Keep them in sync with `generate_sdk_bindings` in build.rs.
BINDGEN_CLI_VERSION="0.73.2"
HEADER="include/doca_rpc_sw.h"
BINDGEN_ARGS=(
    --allowlist-item 'doca_.*'
    --allowlist-item 'DOCA_.*'
    --blocklist-function 'doca_rdma_bridge_.*'
    --opaque-type 'rdma_cm_id'
    --default-enum-style consts
    --no-prepend-enum-name
    --rust-target 1.82
    --rust-edition 2021
)
CLANG_ARGS=(-DDOCA_ALLOW_EXPERIMENTAL_API -Iinclude)

# Installs bindgen-cli (pinned) and libclang when missing. A debug build: it makes the same
# bindings (checked against the release build's, byte for byte) and builds in 28 s instead of
# 84 s, for a run over one small header that takes a fifth of a second either way.
ensure_bindgen() {
    if ! command -v bindgen >/dev/null 2>&1 \
        || [ "$(bindgen --version | awk '{print $2}')" != "$BINDGEN_CLI_VERSION" ]; then
        cargo install bindgen-cli --version "$BINDGEN_CLI_VERSION" --locked --debug
    fi
    if ! ldconfig -p 2>/dev/null | grep -q 'libclang\(-[0-9.]*\)\?\.so'; then
        if command -v apt-get >/dev/null 2>&1; then
            SUDO=""
            [ "$(id -u)" = "0" ] || SUDO="sudo"
            $SUDO apt-get update -qq
            DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq libclang-dev
        else
            echo "libclang is required by bindgen; install it (e.g. libclang-dev)" >&2
            exit 1
        fi
    fi
}

# generate OUTPUT: writes the bindings of $HEADER to OUTPUT.
generate() {
    bindgen "$HEADER" -o "$1" "${BINDGEN_ARGS[@]}" -- "${CLANG_ARGS[@]}"
}
