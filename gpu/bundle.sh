#!/usr/bin/env bash
# Builds what a GPU machine without a Rust toolchain needs into target/gpu-bundle/: the release
# `syncopate` binary and syncopate-exec's unit-test binary (which holds the GPU tests), both
# stripped so that the bundle travels within a device transfer limit. Run here, then carry the
# directory to the GPU machine and run gpu/session.sh there.
set -euo pipefail
cd "$(dirname "$0")/.."
bundle=target/gpu-bundle
rm -rf "$bundle"
mkdir -p "$bundle"
cargo build --release --locked
# Cargo names test binaries with a hash: ask it which file it built.
tests=$(cargo test --release --locked -p syncopate-exec --lib --no-run --message-format=json |
    python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "syncopate_exec":
        print(m["executable"])')
strip -o "$bundle/syncopate" target/release/syncopate
strip -o "$bundle/exec-tests" "$tests"
git rev-parse HEAD > "$bundle/COMMIT"
du -sh "$bundle"
