#!/usr/bin/env bash
# DeAR's five benchmark workloads captured on one H200, and the pairs that check their carry to a V100.
#   experiments/dear/capture.sh [--bundle DIR] [--deadline SECONDS]   (on a machine with an H200)
# Each is `python -m syncopate.capture` in fp32 with TF32 off, the arithmetic of the V100s DeAR's
# shipped profiles stand for, at the batch DeAR's benchmarks.py gives it (resnet50 64,
# densenet201 32, inceptionv4 64, bert_base 64, bert 32; BERT on 64 tokens). The pairs are the
# shapes of shipped V100 profiles measured on V100s (resnet101, vgg16 at 32; bert-large at 4 x 384;
# resnet50 and bert-base were captured on 2026-11-29, gpu/results/h200-2026-11-29): they check,
# on models that did not set it, the carry of a capture to a V100 by the GPU's measured
# compute_speed_vs_v100 (experiments/dear/README.md).
# Writes dear-captures.tar (the profiles) and dear-captures.log (every capture's output, PASS/FAIL
# lines) into OUT (default target/dear-captures); each capture has 120 s, cut to what the deadline
# (default 300 s) leaves. The profiles are named and labelled for the H200 (`h200-sxm-141gb`, the
# device profile whose compute_speed_vs_v100 carries them), so another GPU is refused.
set -uo pipefail
usage="usage: experiments/dear/capture.sh [--bundle DIR] [--deadline SECONDS]"
bundle=target/gpu-bundle
deadline=300
while [ $# -gt 0 ]; do
    case "$1" in
        --bundle) bundle=${2:?$usage}; shift 2 ;;
        --deadline) deadline=${2:?$usage}; shift 2 ;;
        *) echo "$usage" >&2; exit 2 ;;
    esac
done
if ! [[ "$deadline" =~ ^[0-9]+$ ]] || [ "$deadline" -lt 30 ]; then
    echo "experiments/dear/capture.sh: --deadline must be a whole number of seconds, at least 30, got '$deadline'" >&2
    exit 2
fi
# The bundle as the caller named it, before the script moves to the repository's root.
if ! bundle_dir=$(cd "$bundle" 2>/dev/null && pwd); then
    echo "experiments/dear/capture.sh: --bundle: no folder '$bundle'" >&2
    exit 2
fi
bundle=$bundle_dir
cd "$(dirname "$0")/../.."
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
if [[ "$gpu" != *H200* ]]; then
    echo "experiments/dear/capture.sh: needs an NVIDIA H200 (the profiles are the H200's), found '${gpu:-no GPU}'" >&2
    exit 1
fi
out=${OUT:-target/dear-captures}
py=${PYTHON:-python3}
mkdir -p "$out"
work=$(mktemp -d "${TMPDIR:-/tmp}/dear-captures.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/models"
log="$out/dear-captures.log"
: >"$log"
if ! $py -m pip install --quiet --no-deps --no-index --target "$work/python" "$bundle"/syncopate-*.whl >>"$log" 2>&1; then
    echo "FAIL: installing the bundle's wheel from $bundle" | tee -a "$log"
    exit 1
fi
failures=0
# capture NAME ARGS...: one profile under a timeout of 120 s, cut to what the deadline leaves.
capture() {
    local name=$1 t0=$SECONDS limit=$((deadline - SECONDS))
    shift
    [ "$limit" -gt 120 ] && limit=120
    if [ "$limit" -lt 10 ]; then
        echo "SKIP $name: the ${deadline} s deadline is spent" | tee -a "$log"
        failures=$((failures + 1))
        return
    fi
    echo "===== $name" >>"$log"
    if PYTHONPATH="$work/python:experiments/dear" timeout -k 5 "$limit" $py -m syncopate.capture --tf32 off \
        --device-name h200-sxm-141gb --name "$name" --out "$work/models/$name.json" "$@" >>"$log" 2>&1; then
        echo "PASS $name ($((SECONDS - t0)) s)" | tee -a "$log"
    else
        echo "FAIL $name ($((SECONDS - t0)) s)" | tee -a "$log"
        failures=$((failures + 1))
    fi
    tar -C "$work/models" -cf "$out/dear-captures.tar" .
}
capture dear-resnet50-h200-fp32 --torchvision resnet50 --batch-size 64
capture dear-densenet201-h200-fp32 --torchvision densenet201 --batch-size 32
capture dear-inception-v4-h200-fp32 --module workloads:inception_v4 --batch-size 64 --sample-unit images
capture dear-bert-base-h200-fp32 --module workloads:bert_base_pretraining --batch-size 64 --sample-unit sequences
capture dear-bert-large-h200-fp32 --module workloads:bert_large_pretraining --batch-size 32 --sample-unit sequences
capture resnet101-h200-fp32 --torchvision resnet101 --batch-size 32
capture vgg16-h200-fp32 --torchvision vgg16 --batch-size 32
capture bert-large-h200-fp32 --module workloads:bert_large_squad --batch-size 4 --sample-unit sequences
echo "$failures capture(s) failed" | tee -a "$log"
[ "$failures" -eq 0 ]
