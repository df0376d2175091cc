#!/usr/bin/env bash
# Builds what a GPU machine without a Rust toolchain needs into target/gpu-bundle/, for
# gpu/check.sh there: the release `syncopate` binary and syncopate-exec's unit-test binary (which
# holds the GPU tests), both stripped and built for the CUDA API of the machine's driver, and the
# Python package's abi3 wheel (its `python -m syncopate.capture` records model profiles, its
# `syncopate.torch` runs the device codecs, bound to the same CUDA API), and
# pytest's wheels for the torch step.
#   gpu/bundle.sh [12|13]      # the CUDA major version of the bindings (default 13: driver 580+)
# maturin comes alone into target/maturin-env: the wheel needs no PyTorch to build.
set -euo pipefail
cd "$(dirname "$0")/.."
cuda=${1:-13}
case "$cuda" in
    12 | 13) ;;
    *) echo "usage: gpu/bundle.sh [12|13] (the CUDA major version), got '$cuda'" >&2; exit 2 ;;
esac
features=(--no-default-features --features "cuda-$cuda")
bundle=target/gpu-bundle
rm -rf "$bundle"
mkdir -p "$bundle"
cargo build --release --locked "${features[@]}"
# Cargo names test binaries with a hash: ask it which file it built.
tests=$(cargo test --release --locked -p syncopate-exec "${features[@]}" --lib --no-run --message-format=json |
    python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "syncopate_exec":
        print(m["executable"])')
strip -o "$bundle/syncopate" target/release/syncopate
strip -o "$bundle/exec-tests" "$tests"
maturin_env=target/maturin-env
maturin_version=$(sed -n 's/^maturin==//p' python/requirements-test.txt)
if ! "$maturin_env/bin/maturin" --version 2>/dev/null | grep -qF "$maturin_version"; then
    python3 -m venv --clear "$maturin_env"
    "$maturin_env/bin/pip" install --quiet --disable-pip-version-check "maturin==$maturin_version"
fi
"$maturin_env/bin/maturin" build --release --locked --quiet --strip -m python/Cargo.toml -o "$bundle" "${features[@]}"
# pytest and its requirements, at the versions the tests here use, for the torch step's GPU test.
pins=()
for package in pytest iniconfig packaging pluggy Pygments; do
    pins+=("$(grep -m1 -i "^$package==" python/requirements-test.txt)")
done
"$maturin_env/bin/pip" download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --dest "$bundle/pytest" "${pins[@]}"
{
    git rev-parse HEAD
    git diff --quiet HEAD -- . ':!target' || echo "(with uncommitted changes)"
    echo "CUDA $cuda bindings"
} >"$bundle/COMMIT"
du -sh "$bundle"
