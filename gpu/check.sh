#!/usr/bin/env bash
# What only a GPU can check, in one command sized for a short GPU lease:
#   gpu/check.sh [--bundle DIR] [--out DIR] [--only STEP,...] [--deadline SECONDS] [--list]
# Runs the steps below in order, each under its own timeout and all under one deadline (default
# and at most 420 s), printing a PASS, FAIL or SKIP line with figures per step. After every step
# it refreshes at most 8 flat files in OUT (default $OUT, else target/gpu-check):
#   check.log      the PASS/FAIL/SKIP lines      logs.txt          every step's whole output
#   device.json    profile --backend cuda        captures.tar      the captured model profiles
#   ddp_overhead.json, contention.json, op_rates.json   gpu/measure/'s measurements
# The bundle (gpu/bundle.sh: the binaries and the Python wheel; the GPU machine needs no Rust)
# defaults to target/gpu-bundle and is built first where cargo is, when it is missing or was
# built from other sources than the checkout's; --bundle DIR is used as it is. Without a GPU
# every step fails fast, naming its cause. --only reruns a subset, e.g. --only gpu-tests,nccl2.
set -uo pipefail
cd "$(dirname "$0")/.."
steps_all=(env gpu-tests nccl2 torch op-rates capture profile ddp contention)
usage="usage: gpu/check.sh [--bundle DIR] [--out DIR] [--only STEP,...] [--deadline SECONDS] [--list]; steps: ${steps_all[*]}"
bundle=target/gpu-bundle
given_bundle=
out=${OUT:-target/gpu-check}
only=
deadline=420
while [ $# -gt 0 ]; do
    case "$1" in
        --bundle) bundle=${2:?$usage}; given_bundle=1; shift 2 ;;
        --out) out=${2:?$usage}; shift 2 ;;
        --only) only=${2:?$usage}; shift 2 ;;
        --deadline) deadline=${2:?$usage}; shift 2 ;;
        --list) printf '%s\n' "${steps_all[@]}"; exit 0 ;;
        *) echo "$usage" >&2; exit 2 ;;
    esac
done
if ! [[ "$deadline" =~ ^[0-9]+$ ]] || [ "$deadline" -lt 10 ] || [ "$deadline" -gt 420 ]; then
    echo "gpu/check.sh: --deadline must be 10 to 420 seconds, got '$deadline'" >&2
    exit 2
fi
for step in ${only//,/ }; do
    if ! printf '%s\n' "${steps_all[@]}" | grep -qx "$step"; then
        echo "gpu/check.sh: --only: no step '$step' ($usage)" >&2
        exit 2
    fi
done
# Where cargo is, the default bundle is rebuilt when it is missing or was built from other
# sources than the checkout's; a bundle given with --bundle is used as it is.
stale() {
    [ -z "$given_bundle" ] || return 1
    [ ! -x "$bundle/syncopate" ] || grep -q "uncommitted" "$bundle/COMMIT" 2>/dev/null ||
        [ "$(head -n 1 "$bundle/COMMIT" 2>/dev/null)" != "$(git rev-parse HEAD 2>/dev/null)" ]
}
if command -v cargo >/dev/null 2>&1 && stale; then
    gpu/bundle.sh || { echo "gpu/check.sh: gpu/bundle.sh failed" >&2; exit 1; }
elif [ ! -x "$bundle/syncopate" ]; then
    echo "gpu/check.sh: no bundle at $bundle and no cargo to build one: run gpu/bundle.sh where Rust is, and carry $bundle" >&2
    exit 1
fi
bundle=$(cd "$bundle" && pwd)
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/syncopate-check.XXXXXX")
mkdir -p "$work/logs" "$work/models"
py=${PYTHON:-python3}
bin="$bundle/syncopate"
start=$SECONDS
failures=0
: >"$out/check.log"

say() { echo "$*" | tee -a "$out/check.log"; }

# The step's timeout: its own, cut to what the deadline leaves.
budget() {
    local left=$((deadline - (SECONDS - start)))
    [ "$1" -lt "$left" ] && echo "$1" || echo "$left"
}

# Copies what the steps wrote into OUT's flat files, so that a kill keeps what is done.
refresh() {
    for log in "$work"/logs/*.log; do
        [ -e "$log" ] || continue
        echo "===== $(basename "$log" .log)"
        cat "$log"
    done >"$out/logs.txt"
    for file in device.json ddp_overhead.json contention.json op_rates.json; do
        [ -e "$work/$file" ] && cp "$work/$file" "$out/$file"
    done
    if compgen -G "$work/models/*.json" >/dev/null; then
        tar -C "$work/models" -cf "$out/captures.tar" .
    fi
}

# step NAME SECONDS FIGURES COMMAND...: runs COMMAND under its timeout, then prints the line.
# FIGURES is a function printing the step's figures from its outputs (or `-`).
step() {
    local name=$1 limit=$2 figures=$3
    shift 3
    if [ -n "$only" ] && ! [[ ",$only," == *",${name%%:*},"* ]]; then
        return
    fi
    local seconds
    seconds=$(budget "$limit")
    if [ "$seconds" -lt 5 ]; then
        say "SKIP $name: the ${deadline} s deadline is spent"
        return
    fi
    local log="$work/logs/${name//:/-}.log" t0=$SECONDS rc
    # Through bash -c, so that COMMAND may be one of the (exported) functions below, which may
    # size their work to STEP_SECONDS.
    STEP_SECONDS=$seconds timeout -k 5 "$seconds" bash -c '"$@"' step "$@" >"$log" 2>&1
    rc=$?
    local took=$((SECONDS - t0)) facts=""
    [ "$figures" != - ] && facts=$("$figures" "$log" 2>/dev/null | tr '\n' ' ')
    if [ $rc -eq 0 ]; then
        say "PASS $name (${took} s) $facts"
    elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
        say "FAIL $name: timed out after ${seconds} s $facts"
        failures=$((failures + 1))
    else
        say "FAIL $name (exit $rc, ${took} s): $(grep -v '^\s*$' "$log" | tail -n 1 | cut -c1-300) $facts"
        failures=$((failures + 1))
    fi
    refresh
}

environment() {
    echo "bundle: $(tr '\n' ' ' <"$bundle/COMMIT" 2>/dev/null)"
    uname -a
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv || return 1
    $py - <<'PY'
import glob, os, site, sys
print("python", sys.version.split()[0], sys.executable)
try:
    import torch
    print("torch", torch.__version__, "cuda", torch.version.cuda,
          "nccl", ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else "-")
except Exception as e:
    print("torch: not importable:", e)
for root in site.getsitepackages() + [site.getusersitepackages()]:
    for hit in sorted(glob.glob(os.path.join(root, "nvidia", "*", "lib", "lib*.so*"))):
        if any(k in hit for k in ("nvrtc", "nccl", "cublas.", "cudart")):
            print("library", hit)
PY
}
environment_figures() { grep -m1 -E "^NVIDIA|H200|H100|A100" "$1"; grep -m1 "^torch" "$1"; }

gpu_tests() {
    local output rc
    output=$("$bundle/exec-tests" --test-threads 1 --nocapture runtime::cuda 2>&1)
    rc=$?
    echo "$output"
    # A GPU test that skipped did not run: the skip names why (no driver, no library).
    if grep -m1 "skipped: no CUDA device" <<<"$output"; then
        return 1
    fi
    return $rc
}
gpu_tests_figures() {
    # A test's first line follows the harness's `test NAME ... ` on the same line.
    grep -c 'codec [^ ]*: ' "$1" | sed 's/$/ codec specs compared;/'
    grep -o -m1 'nccl world of one.*' "$1"
    grep -E '^test result' "$1" | tail -n 1
}

# capture MODEL PRECISION ARGS...: one model profile, then its tensor inventory check (in any
# order under autocast, whose casts move some gradients); a capture that fails the check is
# kept as *.mismatch, out of --compute-from's way.
capture() {
    local model=$1 precision=$2
    shift 2
    local file="$work/models/$model-$tag-$precision.json" order=()
    [ "$precision" = amp ] && order=(--any-order)
    PYTHONPATH="$work/python" $py -m syncopate.capture "$@" --device-name "$device" \
        --name "$model-$tag-$precision" --out "$file" || return 1
    if ! $py profiles/capture/check_inventory.py "${order[@]}" "$file" "profiles/models/$model.json"; then
        mv "$file" "$file.mismatch"
        return 1
    fi
}
capture_figures() {
    $py - "$work/models" <<'PY'
import glob, json, sys
for path in sorted(glob.glob(sys.argv[1] + "/*.json*")):
    p = json.load(open(path))
    total = sum(x.get("forward_us", 0) + x.get("backward_us", 0) for x in p["tensors"]) + p.get("optimizer_us", 0)
    print(f"{p['name']} {total / 1e3:.1f} ms;")
PY
}

# The fp32 captures beside the simulator's prediction for this GPU (gpu/compare_captures.py).
compare_captures() {
    if ! compgen -G "$work/models/*-fp32.json" >/dev/null; then
        echo "no fp32 capture to compare" >&2
        return 1
    fi
    $py gpu/compare_captures.py "$bin" "$cluster" "$work"/models/*-fp32.json
}
compare_figures() { awk -F'|' '/^\| [a-z]/ && !/^\| capture/ {print $2 $6 ";"} /^Median/ {print}' "$1"; }

install_package() {
    $py -m pip install --quiet --no-deps --no-index --upgrade --target "$work/python" "$bundle"/syncopate-*.whl
}

# torch: syncopate.torch trains the tests' tiny model on this GPU over NCCL, two processes on GPU 0
# as two NCCL hosts, with check=2 and a trace (python/tests/test_torch_device.py, with pytest from
# the bundle). A skipped test did not run: it fails the step.
torch_training() {
    local output rc
    install_package || return 1
    $py -m pip install --quiet --no-deps --no-index --upgrade --target "$work/pytest" "$bundle"/pytest/*.whl || return 1
    output=$(PYTHONPATH="$work/python:$work/pytest" SYNCOPATE_BIN="$bin" $py -m pytest -q -rs -p no:cacheprovider \
        python/tests/test_torch_device.py -k gpu 2>&1)
    rc=$?
    echo "$output"
    if grep -m1 "SKIPPED" <<<"$output"; then
        return 1
    fi
    return $rc
}
torch_figures() { grep -E '(passed|failed|error)' "$1" | tail -n 1; }

measure_figures() { grep '^RESULT' "$1" | head -n 12; }
# The rates the carry's check needs most: the shipped profiles' layer shapes in fp32, the host.
op_rates_figures() {
    grep -E '^RESULT (matmul (1536|4096)x768x3072 fp32|conv (256->256 3x3|1024->256 1x1)/1 @14 b32 fp32|host|wrote)' "$1"
}

# measure SCRIPT: one of gpu/measure/'s scripts, its soft budget 15 s inside the step's timeout
# so that it writes its JSON before the step is cut.
measure() {
    $py "gpu/measure/$1.py" --out-dir "$work" --seconds $((STEP_SECONDS > 30 ? STEP_SECONDS - 15 : STEP_SECONDS / 2))
}

profile_figures() {
    $py - "$work/device.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
c = d["contention"]
print(f"{len(d['compression'])} codec curves; copy {d['memory_bandwidth_gbytes_per_s']:.0f} GB/s;"
      f" GEMM {d['peak_fp32_tflops']:.1f} TFLOP/s; compute beside NCCL x{c['compute_slowdown_with_collective']:.3f},"
      f" beside a codec x{c['compute_slowdown_with_compression']:.3f};"
      f" compute_speed_vs_v100 {d['compute_speed_vs_v100']:.2f} ({d['compute_speed_provenance']['status']})")
PY
}

# nccl2: two processes on this one GPU, made two NCCL hosts by NCCL_HOSTID so that NCCL accepts
# them (over its socket transport; functional only, NVIDIA does not support two ranks per GPU).
# Each run checks every piece (--check: rank 1 sends its inputs and results to rank 0, which
# fails the run on a mismatch).
# Each case is compressor/scheme/nodes/GPUs per node; the hierarchical one splits the world's
# communicator into its node's (both ranks) and the across-nodes ones (one rank each); `ring` is
# HiPress's CaSync-Ring (`--strategy hipress:ring`), hops of decode, add and re-encode.
nccl2() {
    local failed=0 case compressor scheme nodes per_node port=29611
    for case in fp16/auto/2/1 topk:0.01/auto/2/1 powersgd:4/auto/2/1 fp16/hierarchical/1/2 onebit/ring/2/1; do
        IFS=/ read -r compressor scheme nodes per_node <<<"$case"
        local plan="$work/plan-${compressor%%:*}-$scheme.json" strategy=(--strategy horovod --scheme "$scheme")
        [ "$scheme" = ring ] && strategy=(--strategy hipress:ring)
        echo "--- $compressor $scheme ${nodes}x$per_node"
        "$bin" simulate --model resnet50 --cluster dgx-h200 --nodes "$nodes" --gpus-per-node "$per_node" \
            "${strategy[@]}" --compressor "$compressor" --save-plan "$plan" >/dev/null || { failed=1; continue; }
        local pids=()
        for rank in 0 1; do
            RANK=$rank WORLD_SIZE=2 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
                NCCL_HOSTID="syncopate-check-$rank" NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1 \
                timeout -k 5 30 "$bin" exec --backend cuda --plan "$plan" --iterations 3 --timeout-s 20 --check \
                >"$work/nccl2-$rank.txt" 2>&1 &
            pids+=($!)
        done
        for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
        sed 's/^/rank 0: /' "$work/nccl2-0.txt"
        sed 's/^/rank 1: /' "$work/nccl2-1.txt" | tail -n 5
        port=$((port + 1))
    done
    return $failed
}
nccl2_figures() { grep -E '^--- |rank 0: +iteration time|--check failed' "$1" | tr -s ' ' | head -n 12; }

gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
case "$gpu_name" in
    *H200*) tag=h200 device=h200-sxm-141gb cluster=dgx-h200 ;;
    *H100*) tag=h100 device=h100-sxm5-80gb cluster=dgx-h100 ;;
    *A100*) tag=a100 device=a100-sxm4-80gb cluster=dgx-a100 ;;
    *) tag=gpu device=h100-sxm5-80gb cluster=dgx-h100 ;;
esac
# The binaries' library probe asks the same Python for its site-packages.
export SYNCOPATE_PYTHON=$py
export bundle work py bin tag device cluster
export -f environment gpu_tests capture install_package torch_training nccl2 measure compare_captures
say "gpu/check.sh on ${gpu_name:-no GPU (nvidia-smi lists none)}, deadline ${deadline} s, bundle $(tr "\n" " " <"$bundle/COMMIT" 2>/dev/null)"

step env 20 environment_figures environment
step gpu-tests 150 gpu_tests_figures gpu_tests
step nccl2 125 nccl2_figures nccl2
step torch 180 torch_figures torch_training
# Before the captures, which have run once already: the op rates have not.
step op-rates 60 op_rates_figures measure op_rates
step capture:package 30 - install_package
# The shipped profiles' batches and inputs (profiles/models/*.json), so that the captures compare
# with them: fp32 with TF32 off (the V100 profiles' arithmetic), and autocast fp16.
for precision in fp32 amp; do
    flags=(--tf32 off)
    [ "$precision" = amp ] && flags=(--amp)
    step "capture:resnet50-$precision" 45 - capture resnet50 "$precision" "${flags[@]}" \
        --torchvision resnet50 --batch-size 32
    step "capture:bert-base-$precision" 45 - capture bert-base "$precision" "${flags[@]}" \
        --hf bert --hf-from-config --task question-answering --seq-len 384 --batch-size 4
    step "capture:gpt2-$precision" 45 capture_figures capture gpt2 "$precision" "${flags[@]}" \
        --hf gpt2 --hf-from-config --task causal-lm --seq-len 1024 --batch-size 4
done
step capture:compare 60 compare_figures compare_captures
# compute_speed_vs_v100 from the fp32 captures, where they were made.
compute_from=()
for file in "$work"/models/*-fp32.json; do
    [ -e "$file" ] && compute_from+=(--compute-from "$file")
done
step profile 120 profile_figures "$bin" profile --backend cuda --name "$device" \
    --out "$work/device.json" "${compute_from[@]}"
step ddp 90 measure_figures measure ddp_overhead
step contention 70 measure_figures measure contention

refresh
say "$failures step(s) failed in $((SECONDS - start)) s; files in $out: $(ls "$out" | tr '\n' ' ')"
rm -rf "$work"
[ "$failures" -eq 0 ]
