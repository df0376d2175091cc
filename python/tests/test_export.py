"""`syncopate export` and `tune --framework` write settings the frameworks accept: real PyTorch DDP
builds the buckets the export predicts and trains with them; Horovod's, BytePS's and DeepSpeed's
settings use only the option names, types and values their sources define (profiles/native/)."""

import ast
import importlib.util
import inspect
import json
import os
import sys

import pytest
import torch

import conftest
import models
import ranks


def load_settings(path):
    spec = importlib.util.spec_from_file_location("exported_settings", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def train_with_export(rank, world, settings_path, steps):
    """Wraps the tiny model with the exported `wrap`, trains `steps` steps; DDP's rebuilt buckets
    (parameter names, in the order they were reduced), the last loss and the parameters."""
    torch.manual_seed(0)
    model = models.tiny()
    ddp = load_settings(settings_path).wrap(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
    for step in range(steps):
        x, y = models.batch(rank, step)
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    names = [name for name, _ in model.named_parameters()]
    rebuilt = ddp._get_ddp_logging_data().get("rebuilt_per_bucket_param_indices", "")
    buckets = [[names[int(i)] for i in bucket.split()] for bucket in rebuilt.split(", ") if bucket]
    # Plain lists: tensors would cross the queue as shared memory the exiting rank takes along.
    return buckets, loss.item(), [p.detach().flatten().tolist() for p in model.parameters()]


def predicted_buckets(plan_path, profile_path):
    plan = json.loads(plan_path.read_text())
    tensors = json.loads(profile_path.read_text())["tensors"]
    return [sorted(tensors[t]["name"] for t in group["tensors"]) for group in plan["groups"]]


@pytest.mark.parametrize("groups,argument", [(3, "bucket_cap_mb="), (4, "bucket_cap_mb_list=")])
def test_ddp_builds_the_exported_buckets_and_trains(profile_path, tmp_path, groups, argument):
    plan, settings, ddp_plan = tmp_path / "plan.json", tmp_path / "ddp_settings.py", tmp_path / "ddp-plan.json"
    # Groups of the backward order: DDP rebuilds them with one cap (3 groups of the tiny model)
    # or with one cap per bucket (4).
    conftest.cli("simulate", "--model", profile_path, "--cluster", "v100-10gbe", "--nodes", 2, "--gpus-per-node", 1,
                 "--strategy", f"fixed-groups:{groups}", "--save-plan", plan)
    report = json.loads(conftest.cli("export", "--plan", plan, "--to", "ddp", "--out", settings, "--save-plan", ddp_plan,
                                     "--format", "json").stdout)
    assert report["not_expressed"] == []
    assert argument in settings.read_text()
    # The file names only arguments DDP has.
    arguments = {k.arg for node in ast.walk(ast.parse(settings.read_text())) if isinstance(node, ast.Call) for k in node.keywords}
    signature = inspect.signature(torch.nn.parallel.DistributedDataParallel.__init__).parameters
    assert arguments <= set(signature), arguments - set(signature)
    outcomes = ranks.values(ranks.run(train_with_export, str(settings), 3))
    (buckets, loss, params), (other_buckets, _, other_params) = outcomes
    assert [sorted(b) for b in buckets] == predicted_buckets(ddp_plan, profile_path)
    assert predicted_buckets(ddp_plan, profile_path) == predicted_buckets(plan, profile_path)
    assert buckets == other_buckets
    assert loss == loss and params == other_params
    # `simulate --plan` on the saved plan gives the time the export printed.
    simulated = json.loads(conftest.cli("simulate", "--plan", ddp_plan, "--format", "json").stdout)
    assert simulated["iteration_time_ms"] == report["iteration_ms"]


def test_per_bucket_caps_say_what_an_older_pytorch_lacks(profile_path, tmp_path):
    plan, settings = tmp_path / "plan.json", tmp_path / "ddp_settings.py"
    conftest.cli("simulate", "--model", profile_path, "--cluster", "v100-10gbe", "--nodes", 2, "--gpus-per-node", 1,
                 "--strategy", "fixed-groups:4", "--save-plan", plan)
    conftest.cli("export", "--plan", plan, "--to", "ddp", "--out", settings)
    module = load_settings(settings)
    assert "bucket_cap_mb_list=" in settings.read_text()

    # A DistributedDataParallel without the argument, as in PyTorch releases before it.
    def older(module, device_ids=None, process_group=None, bucket_cap_mb=25, gradient_as_bucket_view=False):
        raise AssertionError("not reached")

    module.DistributedDataParallel = older
    with pytest.raises(TypeError, match="bucket_cap_mb_list.*--bucket-mb"):
        module.wrap(models.tiny())


@pytest.mark.parametrize("compressor,memory,written", [
    ("powersgd:2", "residual", ["powerSGD_hook", "matrix_approximation_rank=2", "use_error_feedback=True"]),
    ("fp16", "none", ["default_hooks.fp16_compress_hook"]),
])
def test_tuned_ddp_settings_with_a_hook_train_under_ddp(profile_path, tmp_path, compressor, memory, written):
    settings = tmp_path / "ddp_settings.py"
    done = conftest.cli("tune", "--model", profile_path, "--cluster", "v100-10gbe", "--nodes", 2, "--gpus-per-node", 1,
                        "--framework", "ddp", "--compressor", compressor, "--memory", memory, "--search", "fusion",
                        "--export", settings)
    assert "tuned" in done.stdout
    # `--search fusion` keeps the named compressor on every bucket: its hook.
    text = settings.read_text()
    assert all(part in text for part in written), text
    # PowerSGD compresses from its start iteration (1000, PyTorch's default, in the file): start
    # it at the third step here, so that the steps after it run the compressed hook.
    settings.write_text(text.replace("start_powerSGD_iter=1000", "start_powerSGD_iter=3"))
    (_, loss, params), (_, other_loss, other_params) = ranks.values(ranks.run(train_with_export, str(settings), 5))
    assert loss == loss and other_loss == other_loss and params == other_params


def test_horovod_settings_use_only_its_options(profile_path, tmp_path):
    options = json.loads((conftest.REPO / "profiles/native/horovod.json").read_text())["options"]
    env = {o["name"]: o for o in options if o["kind"] == "env"}
    kwargs = {o["name"] for o in options if o["kind"] == "kwarg"}
    plan, settings = tmp_path / "plan.json", tmp_path / "hvd_settings.py"
    conftest.cli("simulate", "--model", profile_path, "--cluster", "v100-10gbe", "--nodes", 2, "--gpus-per-node", 1,
                 "--strategy", "fixed-groups:2", "--compressor", "fp16", "--save-plan", plan)
    # Move the second tensor into the other group: groups that skip a tensor in backward order
    # are ones Horovod's own fusion never forms, whatever the measured timings, so the export
    # must name them (a contiguous split may match some threshold and cycle, and then it won't).
    saved = json.loads(plan.read_text())
    first, second = saved["groups"][0]["tensors"], saved["groups"][1]["tensors"]
    second.insert(0, first.pop(1))
    plan.write_text(json.dumps(saved))
    conftest.cli("export", "--plan", plan, "--to", "horovod", "--out", settings)
    tree = ast.parse(settings.read_text())
    assigned = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Subscript):
            assigned[node.targets[0].slice.value] = node.value.value
    assert set(assigned) == {"HOROVOD_FUSION_THRESHOLD", "HOROVOD_CYCLE_TIME", "HOROVOD_DISABLE_GROUP_FUSION"}
    for name, value in assigned.items():
        kind = env[name]["type"]
        parse = {"int": int, "float": float, "bool": int}[kind]
        parse(value)
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "DistributedOptimizer"]
    assert len(calls) == 1
    named = {k.arg for k in calls[0].keywords}
    assert named <= kwargs and {"groups", "compression"} <= named
    # The groups name every parameter of the model once.
    groups = ast.literal_eval(next(n.value for n in ast.walk(tree) if isinstance(n, ast.Assign)
                                   and getattr(n.targets[0], "id", "") == "GROUPS"))
    names = [name for name, _ in models.tiny().named_parameters()]
    assert sorted(sum(groups, [])) == sorted(names)


@pytest.mark.parametrize("compressor", ["none", "fp16"])
def test_byteps_settings_use_only_its_options(profile_path, tmp_path, compressor):
    # BytePS 0.2.5.post15 does not build here (its build fetches ZeroMQ from the network), so its
    # settings are checked against the option names, types and values read from its source.
    options = json.loads((conftest.REPO / "profiles/native/byteps.json").read_text())["options"]
    env = {o["name"]: o for o in options if o["kind"] == "env"}
    kwargs = {o["name"]: o for o in options if o["kind"] == "kwarg"}
    plan, settings, bps_plan = tmp_path / "plan.json", tmp_path / "bps_settings.py", tmp_path / "bps-plan.json"
    # Partitions of one page (4,096 B): the tiny model's largest gradients (6,144 B) are cut in two.
    conftest.cli("simulate", "--model", profile_path, "--cluster", "v100-10gbe", "--nodes", 2, "--gpus-per-node", 1,
                 "--strategy", "byteps", "--partition-mb", 4096 / 2**20, "--compressor", compressor,
                 "--save-plan", plan)
    report = json.loads(conftest.cli("export", "--plan", plan, "--to", "byteps", "--out", settings,
                                     "--save-plan", bps_plan, "--format", "json").stdout)
    tree = ast.parse(settings.read_text())
    assigned = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Subscript):
            assigned[node.targets[0].slice.value] = node.value.value
    assert set(assigned) == {"BYTEPS_PARTITION_BYTES", "BYTEPS_SCHEDULING_CREDIT"}
    for name, value in assigned.items():
        parse = {"int": int, "bool": int}[env[name]["type"]]
        assert parse(value) >= env[name]["min"], (name, value)
    # BytePS cuts the gradients as the plan does: uncompressed, into the same partitions; with
    # fp16 the core cuts the half tensor, at least a page (4,096 B) a partition, so whole here.
    parts = [[g["partitions"] for g in json.loads(p.read_text())["groups"]] for p in (plan, bps_plan)]
    assert max(parts[0]) == 2
    assert parts[1] == (parts[0] if compressor == "none" else [1] * len(parts[0]))
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "DistributedOptimizer"]
    assert len(calls) == 1
    named = {k.arg: ast.unparse(k.value) for k in calls[0].keywords}
    assert set(named) <= set(kwargs)
    if compressor == "fp16":
        assert named["compression"] in kwargs["compression"]["allowed"]
    else:
        assert "compression" not in named
    # Only the strategy's priorities are beyond BytePS's PyTorch plugin.
    assert len(report["not_expressed"]) == 1 and "priority" in report["not_expressed"][0]


def flatten_keys(config, prefix=""):
    """Every leaf of a nested config dict as (dotted path, value)."""
    for key, value in config.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            yield from flatten_keys(value, path + ".")
        else:
            yield path, value


@pytest.mark.parametrize("compressor", ["none", "fp16", "bf16"])
def test_deepspeed_settings_use_only_its_keys_and_values(profile_path, tmp_path, compressor):
    options = json.loads((conftest.REPO / "profiles/native/deepspeed.json").read_text())["options"]
    known = {o["path"]: o for o in options if o["kind"] == "config-key"}
    plan, settings = tmp_path / "plan.json", tmp_path / "ds_settings.py"
    conftest.cli("simulate", "--model", profile_path, "--cluster", "v100-10gbe", "--nodes", 2, "--gpus-per-node", 1,
                 "--strategy", "deepspeed", "--compressor", compressor, "--save-plan", plan)
    conftest.cli("export", "--plan", plan, "--to", "deepspeed", "--out", settings)
    spec = importlib.util.spec_from_file_location("ds_settings", settings)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    leaves = dict(flatten_keys(module.DS_CONFIG))
    assert leaves["zero_optimization.stage"] == 0
    assert leaves["communication_data_type"] == {"none": "fp32"}.get(compressor, compressor)
    assert_known(leaves, known)


def assert_known(leaves, known):
    """Every key is one DeepSpeed defines, of its type, within its allowed values or bounds."""
    for path, value in leaves.items():
        option = known[path]
        assert type(value).__name__ == {"string": "str"}.get(option["type"], option["type"]), path
        if "allowed" in option:
            assert value in option["allowed"], (path, value)
        elif "min" in option:
            assert value >= option["min"], (path, value)


def train_with_deepspeed(rank, world, settings_path, steps):
    """The tiny model trained `steps` steps by DeepSpeed with the exported DS_CONFIG merged into
    a minimal config; the data type DeepSpeed says it reduces in, the last loss and the parameters."""
    # What DeepSpeed's launcher sets for each rank; the gloo group is already up.
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world))
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    model = models.tiny()
    x, _ = models.batch(rank, 0)
    # ZeRO names only its fused Adam variants as tested; plain SGD runs once allowed.
    config = {"train_micro_batch_size_per_gpu": len(x), "optimizer": {"type": "SGD", "params": {"lr": 0.05}},
              "zero_allow_untested_optimizer": True, **load_settings(settings_path).DS_CONFIG}
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    for step in range(steps):
        x, y = models.batch(rank, step)
        loss = torch.nn.functional.cross_entropy(engine(x), y)
        engine.backward(loss)
        engine.step()
    params = [p.detach().flatten().tolist() for p in model.parameters()]
    return str(engine.communication_data_type), engine.zero_optimization_stage(), loss.item(), params


def test_deepspeed_trains_with_the_exported_config(profile_path, tmp_path, monkeypatch):
    # DeepSpeed on a CPU builds its shared-memory op with ninja, from the environment's bin/.
    monkeypatch.setenv("PATH", f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ['PATH']}")
    trained = {}
    for compressor in ["none", "fp16"]:
        plan, settings = tmp_path / f"{compressor}.json", tmp_path / f"ds_{compressor}.py"
        conftest.cli("simulate", "--model", profile_path, "--cluster", "v100-10gbe", "--nodes", 2, "--gpus-per-node", 1,
                     "--strategy", "deepspeed", "--compressor", compressor, "--save-plan", plan)
        conftest.cli("export", "--plan", plan, "--to", "deepspeed", "--out", settings)
        (dtype, _, loss, params), (other_dtype, _, _, other_params) = ranks.values(
            ranks.run(train_with_deepspeed, str(settings), 3, timeout=600))
        assert dtype == other_dtype == {"none": "torch.float32", "fp16": "torch.float16"}[compressor]
        assert loss == loss and params == other_params
        trained[compressor] = torch.tensor(sum(params, []))
    # The fp16 allreduce rounds the averaged gradients: close to fp32's, not equal.
    assert not torch.equal(trained["none"], trained["fp16"])
    assert torch.allclose(trained["none"], trained["fp16"], rtol=1e-2, atol=1e-3)


def shard_and_train(rank, world, settings_path, steps, per_node=None):
    """Shards the tiny model with the exported `shard` under FSDP2 (HSDP's 2-D mesh, from the
    export's `hybrid_mesh`, with `per_node` ranks a node) and trains `steps` steps, calling the
    export's `after_step` (torchao's float8 scales) before the first and after each; the units
    FSDP formed (parameter names, the root's last), each unit's forward prefetch count, the last
    loss, the full parameters and the names of the weights FSDP2 gathers in float8."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule

    torch.manual_seed(0)
    model = models.tiny()
    names = {id(p): name for name, p in model.named_parameters()}
    settings = load_settings(settings_path)
    if per_node is None:
        mesh = init_device_mesh("cpu", (world,))
    else:
        os.environ["LOCAL_WORLD_SIZE"] = str(per_node)
        mesh = settings.hybrid_mesh("cpu")
    settings.shard(model, mesh=mesh)
    units, prefetch, states = [], [], []
    for module in [m for m in model.modules() if isinstance(m, FSDPModule)]:
        # The modules of one fully_shard call share its state.
        state = module._get_fsdp_state()
        group = state._fsdp_param_group
        if group is None or any(state is s for s in states):
            continue
        states.append(state)
        units.append(sorted(f"{module_name(model, p._module_info.module)}{p._module_info.param_name}"
                            for p in group.fsdp_params))
        prefetch.append(len(state._states_to_forward_prefetch))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    after_step = getattr(settings, "after_step", lambda model: None)
    after_step(model)
    for step in range(steps):
        x, y = models.batch(rank, step)
        loss = torch.nn.functional.cross_entropy(model(x).float(), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        after_step(model)
    float8 = sorted(name for name, p in model.named_parameters()
                    if type(p._local_tensor).__name__ == "WeightWithDynamicFloat8CastTensor")
    full = [p.full_tensor().detach().float().flatten().tolist() for p in model.parameters()]
    assert len(names) == sum(len(u) for u in units)
    return units, prefetch, loss.item(), full, float8


def module_name(model, module):
    """`module`'s qualified name in `model` with a trailing dot, or "" for the model itself."""
    name = next(n for n, m in model.named_modules() if m is module)
    return f"{name}." if name else ""


@pytest.mark.parametrize("strategy,blocks,prefetch,dtype", [("fsdp", 2, 2, "bf16"), ("fsdp", 1, 1, "fp32"),
                                                           ("hsdp", 1, 1, "fp32")])
def test_fsdp_export_shards_the_planned_units_and_trains_under_fsdp2(profile_path, tmp_path, strategy, blocks, prefetch,
                                                                     dtype):
    plan, settings, fsdp_plan = tmp_path / "plan.json", tmp_path / "fsdp_settings.py", tmp_path / "fsdp-plan.json"
    # HSDP on 2 nodes of 2 ranks: sharded inside each node, replicated across them.
    nodes, per_node = (2, 2) if strategy == "hsdp" else (2, 1)
    conftest.cli("simulate", "--model", profile_path, "--cluster", "v100-10gbe", "--nodes", nodes, "--gpus-per-node",
                 per_node, "--strategy", strategy, "--blocks-per-unit", blocks, "--prefetch", prefetch, "--param-dtype",
                 dtype, "--save-plan", plan)
    report = json.loads(conftest.cli("export", "--plan", plan, "--to", "fsdp", "--out", settings, "--save-plan",
                                     fsdp_plan, "--format", "json").stdout)
    # Only bf16 compute, which the fp32 profile does not price, is beyond the plan.
    assert len(report["not_expressed"]) == (dtype == "bf16"), report["not_expressed"]
    # The file calls only what FSDP2 has, with arguments it takes.
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    tree = ast.parse(settings.read_text())
    for call in [n for n in ast.walk(tree) if isinstance(n, ast.Call)]:
        name = getattr(call.func, "id", getattr(call.func, "attr", ""))
        target = {"fully_shard": fully_shard, "MixedPrecisionPolicy": MixedPrecisionPolicy}.get(name)
        if target is not None:
            assert {k.arg for k in call.keywords} <= set(inspect.signature(target).parameters), ast.unparse(call)
    hybrid = {"per_node": per_node} if strategy == "hsdp" else {}
    outcomes = ranks.values(ranks.run(shard_and_train, str(settings), 3, world=nodes * per_node, **hybrid))
    (units, prefetches, loss, params, float8), (other_units, _, other_loss, other_params, _) = outcomes[0], outcomes[-1]
    assert float8 == []
    # FSDP2 forms the plan's units (the root, with no parameters of its own here, forms none).
    assert sorted(units) == sorted(predicted_buckets(fsdp_plan, profile_path)) == sorted(predicted_buckets(plan, profile_path))
    assert units == other_units
    if prefetch > 1:
        assert prefetches[:-1] and all(p == min(prefetch, len(units) - 1 - i) for i, p in enumerate(prefetches[:-1]))
    assert loss == loss and other_loss == other_loss and params == other_params
    simulated = json.loads(conftest.cli("simulate", "--plan", fsdp_plan, "--format", "json").stdout)
    assert simulated["iteration_time_ms"] == report["iteration_ms"]


@pytest.mark.parametrize("strategy,nodes,per_node", [("fsdp", 2, 1), ("hsdp", 2, 2)])
def test_a_float8_plan_exports_as_torchao_float8_linears_that_train_under_fsdp2(profile_path, tmp_path, strategy,
                                                                              nodes, per_node):
    plan, settings = tmp_path / "plan.json", tmp_path / "fsdp_settings.py"
    # Float8 linears need float8 matrix products: an H100's (a V100 is refused).
    refused = conftest.cli("simulate", "--model", profile_path, "--cluster", "v100-10gbe", "--nodes", 2,
                           "--strategy", "fsdp", "--float8-all-gather", check=False)
    assert refused.returncode == 1 and "peak_fp8_tflops" in refused.stderr, refused.stderr
    conftest.cli("simulate", "--model", profile_path, "--cluster", "dgx-h100", "--nodes", nodes, "--gpus-per-node",
                 per_node, "--strategy", strategy, "--float8-all-gather", "--param-dtype", "bf16", "--save-plan", plan)
    report = json.loads(conftest.cli("export", "--plan", plan, "--to", "fsdp", "--out", settings, "--format",
                                     "json").stdout)
    # The tiny model's one nn.Linear whose dimensions are multiples of 16 (32 x 48).
    assert load_settings(settings).FLOAT8_LINEARS == {"4"}
    assert any("float8 linears" in note for note in report["not_expressed"]), report["not_expressed"]
    hybrid = {"per_node": per_node} if strategy == "hsdp" else {}
    outcomes = ranks.values(ranks.run(shard_and_train, str(settings), 3, world=nodes * per_node, timeout=300,
                                      **hybrid))
    (_, _, loss, params, float8), (_, _, other_loss, other_params, other_float8) = outcomes[0], outcomes[-1]
    # torchao made it a float8 linear whose weight FSDP2 gathers in float8, and it trains.
    assert float8 == other_float8 == ["4.weight"]
    assert loss == loss and other_loss == other_loss and params == other_params


@pytest.mark.parametrize("strategy,stage", [("zero1", 1), ("zero2", 2)])
def test_zero_plans_export_as_a_deepspeed_stage_that_trains(profile_path, tmp_path, monkeypatch, strategy, stage):
    monkeypatch.setenv("PATH", f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ['PATH']}")
    options = json.loads((conftest.REPO / "profiles/native/deepspeed.json").read_text())["options"]
    known = {o["path"]: o for o in options if o["kind"] == "config-key"}
    plan, settings, ds_plan = tmp_path / "plan.json", tmp_path / "ds.py", tmp_path / "ds-plan.json"
    # Buckets of 600 elements: the tiny model's 2,030 parameters in several.
    conftest.cli("simulate", "--model", profile_path, "--cluster", "v100-10gbe", "--nodes", 2, "--gpus-per-node", 1,
                 "--strategy", strategy, "--reduce-bucket-size", 600, "--save-plan", plan)
    report = json.loads(conftest.cli("export", "--plan", plan, "--to", "deepspeed", "--out", settings, "--save-plan",
                                     ds_plan, "--format", "json").stdout)
    assert report["not_expressed"] == []
    leaves = dict(flatten_keys(load_settings(settings).DS_CONFIG))
    # The roundest bucket size that forms the plan's buckets.
    assert leaves["zero_optimization.stage"] == stage and leaves["zero_optimization.reduce_bucket_size"] % 100 == 0
    assert_known(leaves, known)
    assert predicted_buckets(ds_plan, profile_path) == predicted_buckets(plan, profile_path)
    (dtype, ran_stage, loss, params), (_, _, _, other_params) = ranks.values(
        ranks.run(train_with_deepspeed, str(settings), 3, timeout=600))
    assert ran_stage == stage and dtype == "torch.float32"
    assert loss == loss and params == other_params


def test_a_zero3_plan_exports_as_deepspeed_stage_3_that_trains(profile_path, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ['PATH']}")
    options = json.loads((conftest.REPO / "profiles/native/deepspeed.json").read_text())["options"]
    known = {o["path"]: o for o in options if o["kind"] == "config-key"}
    plan, settings = tmp_path / "plan.json", tmp_path / "ds.py"
    conftest.cli("simulate", "--model", profile_path, "--cluster", "v100-10gbe", "--nodes", 3, "--gpus-per-node", 1,
                 "--strategy", "fsdp", "--prefetch", 2, "--save-plan", plan)
    conftest.cli("export", "--plan", plan, "--to", "deepspeed", "--out", settings)
    leaves = dict(flatten_keys(load_settings(settings).DS_CONFIG))
    assert leaves["zero_optimization.stage"] == 3
    # Buckets of the largest block, prefetching two of them; no ZeRO++ switch asked for.
    bucket = leaves["zero_optimization.reduce_bucket_size"]
    assert leaves["zero_optimization.stage3_prefetch_bucket_size"] == 2 * bucket
    assert not leaves["zero_optimization.zero_quantized_weights"]
    assert not leaves["zero_optimization.zero_quantized_gradients"]
    assert leaves["zero_optimization.zero_hpz_partition_size"] == 1
    assert_known(leaves, known)
    (dtype, ran_stage, loss, _), _ = ranks.values(ranks.run(train_with_deepspeed, str(settings), 3, timeout=600))
    assert ran_stage == 3 and dtype == "torch.float32"
    assert loss == loss


def test_zero_plus_plus_plans_switch_on_its_quantized_weights_gradients_and_hpz(profile_path, tmp_path):
    options = json.loads((conftest.REPO / "profiles/native/deepspeed.json").read_text())["options"]
    known = {o["path"]: o for o in options if o["kind"] == "config-key"}
    plan, settings = tmp_path / "plan.json", tmp_path / "ds.py"
    conftest.cli("simulate", "--model", profile_path, "--cluster", "v100-10gbe", "--nodes", 2, "--gpus-per-node", 2,
                 "--strategy", "fsdp", "--param-dtype", "int8", "--compressor", "int4:256", "--hpz", "--save-plan", plan)
    report = json.loads(conftest.cli("export", "--plan", plan, "--to", "deepspeed", "--out", settings,
                                     "--format", "json").stdout)
    leaves = dict(flatten_keys(load_settings(settings).DS_CONFIG))
    assert leaves["zero_optimization.stage"] == 3
    assert leaves["zero_optimization.zero_quantized_weights"] and leaves["zero_optimization.zero_quantized_gradients"]
    # hpZ's second shards over a node's two ranks.
    assert leaves["zero_optimization.zero_hpz_partition_size"] == 2
    assert_known(leaves, known)
    # What DeepSpeed does differently is said: its module-wise fetches and its own qgZ groups.
    assert any("qgZ" in note for note in report["not_expressed"])
