#!/usr/bin/env python3
"""The MSRV check that runs without a second toolchain (this machine has one, and no other
can be fetched): every crate in Cargo.lock must declare a rust-version no newer than the
workspace's. The workspace's own code is held to it by clippy's `incompatible_msrv` lint,
which runs in the clippy step (it reads `rust-version` from Cargo.toml)."""
import json
import subprocess
import sys

meta = json.loads(
    subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--locked"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
)
members = set(meta["workspace_members"])
ours = {p["rust_version"] for p in meta["packages"] if p["id"] in members and p.get("rust_version")}
if len(ours) != 1:
    sys.exit(f"msrv: the workspace members declare {sorted(ours) or 'no'} rust-version(s); expected one")
msrv = ours.pop()


def version(v):
    return tuple(int(x) for x in v.split(".")[:3]) + (0,) * (3 - len(v.split(".")))


too_new = [
    f"{p['name']} {p['version']} needs rust {p['rust_version']}"
    for p in meta["packages"]
    if p.get("rust_version") and version(p["rust_version"]) > version(msrv)
]
if too_new:
    sys.exit(
        f"msrv: {len(too_new)} locked crate(s) need a newer Rust than the workspace's {msrv}:\n  "
        + "\n  ".join(too_new)
        + "\npin an older version (cargo update -p NAME --precise VERSION) or raise rust-version"
    )
print(f"msrv: all {len(meta['packages'])} locked crates build with rust {msrv} or older")
