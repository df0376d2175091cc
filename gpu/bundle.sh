#!/usr/bin/env bash
# Builds what a GPU machine without a Rust toolchain needs into target/gpu-bundle/: the release
# `syncopate` binary and syncopate-exec's unit-test binary (which holds the GPU tests), both
# stripped so that the bundle travels within a device transfer limit, and the Python package's
# abi3 wheel (its `python -m syncopate.capture` records the model profiles). Run here, then carry
# the directory to the GPU machine and run gpu/session.sh there.
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
# maturin comes with the package's build environment (target/pyenv, made once by setup-env).
python/setup-env
target/pyenv/bin/maturin build --release --locked --quiet --strip -m python/Cargo.toml -o "$bundle"
git rev-parse HEAD > "$bundle/COMMIT"
du -sh "$bundle"
