"""gpu/measure/contention.py, ddp_overhead.py and op_rates.py, dry-run on the CPU.

With --quick --device cpu each writes its JSON with every documented key, each timing a positive
finite median between its min and max; --device cuda without a GPU prints one SKIP line and exits
77 writing nothing; a bad number exits 2 naming its flag.
"""

import json
import math
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
CONTENTION = REPO / "gpu" / "measure" / "contention.py"
DDP_OVERHEAD = REPO / "gpu" / "measure" / "ddp_overhead.py"
OP_RATES = REPO / "gpu" / "measure" / "op_rates.py"
SCRIPTS = pytest.mark.parametrize("script", [CONTENTION, DDP_OVERHEAD, OP_RATES],
                                  ids=["contention", "ddp_overhead", "op_rates"])
TOP_KEYS = {"schema", "script", "what", "command", "started_utc", "environment", "settings", "measurements",
            "skipped", "skipped_for_time", "errors", "elapsed_s", "complete"}
ENVIRONMENT_KEYS = {"torch", "cuda", "nccl", "gpu_name", "sm_count", "device", "python", "cpu_threads"}
PRECISION = {"matmul_allow_tf32": False, "cudnn_allow_tf32": False}


def measure(script, *args):
    return subprocess.run([sys.executable, str(script), *map(str, args)], capture_output=True, text=True,
                          timeout=300, cwd=REPO)


def timings(node, path=""):
    """Every (path, record) in the document that holds a median_ms."""
    if isinstance(node, dict):
        if "median_ms" in node:
            yield path, node
        for key, value in node.items():
            yield from timings(value, f"{path}/{key}")


def check_timings(document):
    found = list(timings(document["measurements"]))
    assert found
    for path, record in found:
        assert {"median_ms", "min_ms", "max_ms", "repeats"} <= record.keys(), path
        assert all(math.isfinite(record[k]) and record[k] > 0 for k in ("median_ms", "min_ms", "max_ms")), path
        assert record["min_ms"] <= record["median_ms"] <= record["max_ms"], path
        assert record["repeats"] >= 1, path
    return dict(found)


def check_common(document, device="cpu"):
    assert TOP_KEYS <= document.keys()
    assert ENVIRONMENT_KEYS <= document["environment"].keys()
    assert document["environment"]["device"] == device
    assert document["settings"]["quick"] is True
    assert PRECISION.items() <= document["settings"]["precision"].items()
    assert document["errors"] == {} and document["skipped_for_time"] == []


def quick_run(tmp_path_factory, script):
    """The script's --quick CPU run: its JSON document and its standard output."""
    out = tmp_path_factory.mktemp(script.stem)
    done = measure(script, "--device", "cpu", "--quick", "--out-dir", out)
    assert done.returncode == 0, done.stderr
    return json.loads((out / f"{script.stem}.json").read_text()), done.stdout


@pytest.fixture(scope="module")
def contention(tmp_path_factory):
    return quick_run(tmp_path_factory, CONTENTION)


@pytest.fixture(scope="module")
def ddp_overhead(tmp_path_factory):
    return quick_run(tmp_path_factory, DDP_OVERHEAD)


@pytest.fixture(scope="module")
def op_rates(tmp_path_factory):
    return quick_run(tmp_path_factory, OP_RATES)


def test_op_rates_times_every_class_and_precision_forward_and_backward(op_rates):
    document, stdout = op_rates
    check_common(document)
    records = check_timings(document)
    measured = document["measurements"]
    # Matrix products and convolutions in fp32 and bf16 (TF32 exists on a GPU only), then the
    # memory-bound ops.
    classes = [(r["class"], r["precision"]) for r in measured.values()]
    assert classes.count(("matmul", "fp32")) == classes.count(("matmul", "bf16")) == 2
    assert classes.count(("conv", "fp32")) == classes.count(("conv", "bf16")) == 2
    assert classes.count(("memory", "fp32")) == 2
    for name, record in measured.items():
        for p in ("forward", "backward"):
            if p not in record:
                assert name.startswith("add ") and p == "backward"
                continue
            seconds = records[f"/{name}/{p}"]["median_ms"] / 1e3
            if "flops" in record[p]:
                assert record[p]["tflops"] == pytest.approx(record[p]["flops"] / seconds / 1e12)
            else:
                assert record[p]["gbytes_per_s"] == pytest.approx(record[p]["bytes"] / seconds / 1e9)
    # The backward does twice the forward's FLOPs: the input's and the weight's gradients.
    matmul = measured["matmul 64x32x96 fp32"]
    assert matmul["backward"]["flops"] == 2 * matmul["forward"]["flops"] == 4 * 64 * 32 * 96
    host = document["host"]
    assert all(math.isfinite(v) and v > 0 for v in host.values())
    assert host["launch_us_per_op"] <= host["wall_us_per_op"]
    assert "RESULT host: " in stdout


def test_contention_times_each_victim_alone_and_beside_each_cpu_companion(contention):
    document, stdout = contention
    check_common(document)
    records = check_timings(document)
    victims, companions = ["gemm_bf16", "gemm_fp32", "conv_fp32"], ["copy_GBps", "fp16_cast", "topk_1pct"]
    assert set(document["victims"]) == set(victims) and set(document["companions"]) == set(companions)
    for victim in victims:
        assert records[f"/{victim}/alone"]["ops_per_loop"] >= 1
        for companion in companions:
            beside = records[f"/{victim}/beside/{companion}"]
            slowdown = beside["slowdown"]
            assert 0 < slowdown["min"] <= slowdown["median"] <= slowdown["max"]
            assert 0 < beside["companion_cover_min"] <= 1
    for companion in companions:
        rate = records[f"/{companion}/alone"]["throughput"]
        assert 0 < rate["min"] <= rate["median"] <= rate["max"] and rate["unit"]
    # What the CPU cannot run is recorded with its reason, not left out silently.
    assert set(document["skipped"]) == {"resnet50_step", "nccl_world1", "spin_sms_1", "spin_sms_8", "spin_sms_16",
                                        "spin_sms_32", "hold_sms_8", "hold_sms_16", "hold_sms_32"}
    assert "GPU kernel" in document["skipped"]["spin_sms_8"]
    assert "GPU kernel" in document["skipped"]["hold_sms_8"]
    assert "RESULT gemm_bf16/beside/copy_GBps: slowdown x" in stdout


def test_ddp_overhead_times_plain_and_every_bucket_size_for_both_models(ddp_overhead):
    document, stdout = ddp_overhead
    check_common(document)
    records = check_timings(document)
    assert document["settings"]["ddp"]["backend"] == "gloo"
    assert len(document["models"]) == 2 and "tiny_transformer" in document["models"]
    configs = ["plain", "ddp_cap1mb", "ddp_cap5mb", "ddp_cap25mb", "ddp_cap100mb", "ddp_cap25mb_gav", "ddp_default"]
    for model, info in document["models"].items():
        assert info["parameters"] > 0 and info["gradient_bytes"] == 4 * info["parameters"]
        for config in configs:
            record = records[f"/{model}/{config}"]
            assert record["iterations"] == record["repeats"] * record["iterations_per_repeat"] == 6
            assert math.isfinite(record["overhead_vs_plain"]) and record["overhead_vs_plain"] > -1
            assert record["final_loss"] is not None
            if config == "plain":
                assert record["overhead_vs_plain"] == 0 and "buckets" not in record
            else:
                buckets = record["buckets"]
                assert buckets["source"] in ("reported", "estimated") and buckets["count"] >= 1
                assert sum(buckets["sizes_bytes"]) == info["gradient_bytes"]
    # Same weights, same batch, same number of steps: with one rank DDP trains the CNN exactly as plain
    # training does (the transformer's dropout draws differ between configurations).
    vision = next(model for model in document["models"] if model != "tiny_transformer")
    assert len({document["measurements"][f"{vision}/{c}"]["final_loss"] for c in configs}) == 1
    assert "RESULT tiny_transformer/ddp_cap25mb:" in stdout


def test_the_estimated_buckets_match_the_ones_ddp_reports():
    """The fallback estimate against DDP's own rebuilt buckets, on a chain of layers whose gradients
    (0.5 to 1.4 MiB each) fill several buckets at caps of 1, 2 and 5 MiB and at DDP's default."""
    code = f"""
import importlib.util, json, sys, torch, torch.distributed as dist
sys.path.insert(0, {str(DDP_OVERHEAD.parent)!r})  # as when the script runs: measuring.py beside it
spec = importlib.util.spec_from_file_location("ddp_overhead", {str(DDP_OVERHEAD)!r})
script = importlib.util.module_from_spec(spec)
spec.loader.exec_module(script)
script.torch = script.measuring.import_torch("cpu")
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{{script.measuring.free_port()}}", rank=0, world_size=1)
widths = (300, 700, 200, 900, 400, 600)
out = []
for caps in ({{"bucket_cap_mb": 1}}, {{"bucket_cap_mb": 2}}, {{"bucket_cap_mb": 5}}, {{}}):
    model = torch.nn.Sequential(*[torch.nn.Linear(a, b) for a, b in zip(widths, widths[1:])])
    ddp = torch.nn.parallel.DistributedDataParallel(model, **caps)
    for _ in range(3):  # DDP rebuilds its buckets after the first iteration, and reports them after the second
        ddp(torch.randn(2, widths[0])).sum().backward()
    out.append((script.reported_buckets(ddp), script.estimated_buckets(model, script.bucket_limits(ddp))))
dist.destroy_process_group()
print(json.dumps(out))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    pairs = json.loads(done.stdout.splitlines()[-1])
    # Worked out by hand from the sizes: an explicit cap applies to the first bucket too, the default
    # (25 MiB) closes the first bucket at 1 MiB.
    assert [estimated["count"] for _, estimated in pairs] == [3, 2, 1, 2]
    for reported, estimated in pairs:
        assert estimated["source"] == "estimated"
        assert reported["source"] == "reported" and reported["sizes_bytes"] == estimated["sizes_bytes"]


def test_a_spent_budget_skips_measurements_but_still_writes_the_json(tmp_path):
    done = measure(CONTENTION, "--device", "cpu", "--quick", "--seconds", "0.01", "--out-dir", tmp_path)
    assert done.returncode == 0, done.stderr
    document = json.loads((tmp_path / "contention.json").read_text())
    assert document["complete"] is False and document["skipped_for_time"]
    assert document["settings"]["seconds_budget"] == 0.01
    assert "skipped for time" in done.stdout.splitlines()[-1]


@SCRIPTS
def test_cuda_without_a_gpu_skips_with_77_and_writes_nothing(script, tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    out = tmp_path / "out"
    done = measure(script, "--device", "cuda", "--out-dir", out)
    assert done.returncode == 77, done.stderr
    assert done.stdout == f"SKIP: no CUDA device (torch {torch.__version__})\n"
    assert not out.exists()


@SCRIPTS
@pytest.mark.parametrize("args, flag", [
    (["--seconds", "0"], "--seconds"),
    (["--seconds", "-5"], "--seconds"),
    (["--seconds", "nan"], "--seconds"),
    (["--seconds", "inf"], "--seconds"),
    (["--seconds", "1e9"], "--seconds"),
    (["--seconds", "soon"], "--seconds"),
    (["--device", "tpu"], "--device"),
])
def test_a_bad_argument_exits_2_naming_its_flag(script, args, flag, tmp_path):
    done = measure(script, "--device", "cpu", "--quick", "--out-dir", tmp_path / "out", *args)
    assert done.returncode == 2
    assert f"argument {flag}:" in done.stderr
    assert not (tmp_path / "out").exists()


@SCRIPTS
def test_the_output_directory_is_required(script):
    done = measure(script, "--device", "cpu", "--quick")
    assert done.returncode == 2 and "--out-dir" in done.stderr
