#!/usr/bin/env bash
# The measurements only a GPU machine can make, in phases that each fit one device command:
#   gpu/session.sh BUNDLE OUT tests|profile|capture|validate|report|all
# BUNDLE is target/gpu-bundle from gpu/bundle.sh (the machine needs no Rust); OUT collects
# everything to commit: measured device profile, captured model profiles, validate reports,
# logs and results.md. The machine needs an NVIDIA driver and PyTorch (its pip wheels bring
# NVRTC and NCCL, which this script puts where syncopate looks for them).
set -uo pipefail
cd "$(dirname "$0")/.."
usage="usage: gpu/session.sh BUNDLE OUT tests|profile|capture|validate|report|all"
bundle=${1:?$usage}
out=${2:?$usage}
phase=${3:?$usage}
syncopate="$bundle/syncopate"
py=${PYTHON:-python3}
mkdir -p "$out/logs" "$out/models" "$out/devices" "$out/plans" "$out/validate"

# NCCL and NVRTC from the Python install: pip's nvidia-* wheels (CUDA 12: nvidia/cuda_nvrtc/lib,
# CUDA 13: nvidia/cu13/lib) or torch/lib.
read -r nccl nvrtc < <($py - <<'PY'
import glob, os, site
roots = site.getsitepackages() + [site.getusersitepackages()]
def first(*patterns):
    for pattern in patterns:
        hits = sorted(h for r in roots for h in glob.glob(os.path.join(r, pattern)))
        if hits:
            return hits[0]
    return "-"
print(first("nvidia/nccl/lib/libnccl.so.2", "torch/lib/libnccl.so*"),
      first("nvidia/cuda_nvrtc/lib/libnvrtc.so.1*", "nvidia/cu1*/lib/libnvrtc.so.1*", "torch/lib/libnvrtc*.so*"))
PY
)
[ "$nccl" != "-" ] && export SYNCOPATE_NCCL_LIB="$nccl"
nvrtc_dir=-
if [ "$nvrtc" != "-" ]; then
    # cudarc opens NVRTC by names that a newer major version (libnvrtc.so.13) lacks, the first
    # of them plain libnvrtc.so: link that name to it.
    nvrtc_dir=$(dirname "$nvrtc")
    mkdir -p "$out/lib-links"
    ln -sf "$nvrtc" "$out/lib-links/libnvrtc.so"
    export LD_LIBRARY_PATH="$out/lib-links:$nvrtc_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi

gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | wc -l)
case "$gpu_name" in
    *H200*) tag=h200 device=h200-sxm-141gb cluster=dgx-h200 ;;
    *H100*) tag=h100 device=h100-sxm5-80gb cluster=dgx-h100 ;;
    *A100*) tag=a100 device=a100-sxm4-80gb cluster=dgx-a100 ;;
    *) tag=gpu device=h100-sxm5-80gb cluster=dgx-h100 ;;
esac

failures=0
# step NAME COMMAND...: runs one measurement, logs it, and goes on when it fails.
step() {
    local name=$1
    shift
    echo "== $name"
    if "$@" >"$out/logs/$name.log" 2>&1; then
        echo "   ok"
    else
        echo "   FAILED (exit $?), last lines of logs/$name.log:"
        tail -n 8 "$out/logs/$name.log" | sed 's/^/   | /'
        failures=$((failures + 1))
    fi
}

# into FILE COMMAND...: the command's standard output into FILE (its JSON), the rest logged.
into() {
    local file=$1
    shift
    "$@" >"$file"
}

phase_tests() {
    {
        echo "GPU: $gpu_name × $gpus; NCCL: ${SYNCOPATE_NCCL_LIB:-not found}; NVRTC: $nvrtc_dir"
        echo "bundle commit: $(cat "$bundle/COMMIT" 2>/dev/null)"
        nvidia-smi
    } >"$out/logs/environment.log" 2>&1
    step gpu-tests "$bundle/exec-tests" --nocapture --test-threads 1 gpu
    # A GPU test that skips on a GPU machine means the libraries were not found: a failure here.
    if [ "$gpus" -gt 0 ] && grep -q "skipped: no CUDA device" "$out/logs/gpu-tests.log"; then
        echo "   FAILED: the GPU tests skipped although nvidia-smi lists $gpus GPU(s):"
        grep -m1 "skipped: no CUDA device" "$out/logs/gpu-tests.log" | sed 's/^/   | /'
        failures=$((failures + 1))
    fi
    step nvrtc-test "$bundle/exec-tests" --nocapture every_kernel_source
}

phase_profile() {
    # Named as the shipped profile of this GPU, so that models captured on it (whose device is
    # that name) run at their captured times against the measured curves.
    step profile "$syncopate" profile --backend cuda --name "$device" \
        --out "$out/devices/$device-measured.json"
}

# capture NAME ARGS...: one model profile with the package's capture tool.
capture() {
    local name=$1
    shift
    step "capture-$name" env PYTHONPATH="$out/python" $py -m syncopate.capture "$@" --device-name "$device" \
        --name "$name-$tag" --out "$out/models/$name-$tag.json"
    step "inventory-$name" $py profiles/capture/check_inventory.py "$out/models/$name-$tag.json" \
        "profiles/models/$name.json"
}

phase_capture() {
    # The bundle's wheel into OUT/python, beside (not inside) the machine's PyTorch install.
    step install-package $py -m pip install --quiet --no-deps --upgrade --target "$out/python" \
        "$bundle"/syncopate-*.whl
    # The shipped V100 profiles' batch sizes and inputs (profiles/models/*.json), so that the
    # captured profiles compare with them.
    capture resnet50 --torchvision resnet50 --batch-size 32
    capture vgg16 --torchvision vgg16 --batch-size 32
    capture bert-base --hf bert --hf-from-config --task question-answering --seq-len 384 --batch-size 8
    capture gpt2 --hf gpt2 --hf-from-config --task causal-lm --seq-len 1024 --batch-size 4
}

# The issue's one-GPU validation: compute + compression + NCCL with one rank.
phase_validate() {
    local model="$out/models/resnet50-$tag.json"
    [ -e "$model" ] || model=resnet50
    local profile="$out/devices/$device-measured.json"
    [ -e "$profile" ] || profile=$device
    local single=(--cluster "$cluster" --nodes 1 --gpus-per-node 1)
    for compressor in none fp16 topk:0.01 dgc:0.01 powersgd:4; do
        local name=${compressor%%:*}
        local plan="$out/plans/resnet50-$name.json"
        step "plan-$name" "$syncopate" simulate --model "$model" "${single[@]}" --strategy horovod \
            --compressor "$compressor" --save-plan "$plan"
        step "check-$name" "$syncopate" exec --backend cuda --plan "$plan" --model "$model" \
            "${single[@]}" --check --iterations 3
        step "validate-$name" into "$out/validate/resnet50-$name.json" "$syncopate" validate \
            --backend cuda --plan "$plan" --model "$model" "${single[@]}" \
            --device-profile "$profile" --iterations 10 --warmup 3 --format json
    done
}

# results.md: predicted versus measured per plan and the median |error|.
phase_report() {
    $py - "$out" "$gpu_name" <<'PY' >"$out/results.md"
import glob, json, os, statistics, sys
out, gpu = sys.argv[1], sys.argv[2]
rows = []
for path in sorted(glob.glob(os.path.join(out, "validate", "*.json"))):
    try:
        r = json.load(open(path))
    except (OSError, ValueError):
        continue
    rows.append((os.path.basename(path)[:-5], r["predicted_iteration_ms"], r["measured_iteration_ms"], r["error"]))
print(f"# One-GPU validation on {gpu}\n")
print("Command: `gpu/session.sh target/gpu-bundle OUT validate` (see gpu/session.sh).\n")
print("| plan | predicted ms | measured ms | error |")
print("|---|---:|---:|---:|")
for name, p, m, e in rows:
    print(f"| {name} | {p:.3f} | {m:.3f} | {100 * e:+.1f} % |")
if rows:
    print(f"\nMedian |error|: {100 * statistics.median(abs(e) for *_, e in rows):.1f} % over {len(rows)} plans.")
PY
    echo "== report: $out/results.md"
}

case "$phase" in
    tests) phase_tests ;;
    profile) phase_profile ;;
    capture) phase_capture ;;
    validate) phase_validate ;;
    report) phase_report ;;
    all) phase_tests; phase_profile; phase_capture; phase_validate; phase_report ;;
    *) echo "$usage" >&2; exit 2 ;;
esac
echo "$failures step(s) failed"
[ "$failures" -eq 0 ]
