"""model_profile records a torch module's parameters in gradient-ready order with their timings.

The result is a profile the CLI accepts.
"""

import json

import pytest

import conftest
import models
import ranks


def test_profile_lists_every_parameter_in_gradient_ready_order(profile_path):
    profile = json.loads(profile_path.read_text())
    names = [name for name, _ in models.tiny().named_parameters()]
    tensors = profile["tensors"]
    assert sorted(t["name"] for t in tensors) == sorted(names)
    # Backward runs from the last layer to the first.
    assert tensors[0]["name"].startswith("8.") and tensors[-1]["name"].startswith("1.")
    assert [names[t["registration_index"]] for t in tensors] == [t["name"] for t in tensors]
    assert all(t["backward_us"] >= 0 and t["forward_us"] >= 0 for t in tensors)
    # Each tensor's module class: the tiny model's Conv1d and nn.Linear layers.
    assert {t["name"]: t["module"] for t in tensors if t["name"].endswith("weight")} == {
        "1.weight": "Conv1d", "4.weight": "Linear", "6.weight": "Linear", "8.weight": "Linear"}


def test_the_cli_simulates_the_recorded_profile(profile_path):
    done = conftest.cli("simulate", "--model", profile_path, "--cluster", "v100-10gbe", "--nodes", 1,
                        "--gpus-per-node", 2, "--strategy", "horovod", "--format", "json")
    assert json.loads(done.stdout)["iteration_time_ms"] > 0


def test_profile_records_its_batch_and_thread_counts(profile_path):
    import torch

    profile = json.loads(profile_path.read_text())
    assert profile["batch_size_per_gpu"] == 8 and "batch_size=8" in profile["timing"]["batch"]["method"]
    assert profile["threads"]["intra_op"] == torch.get_num_threads()
    assert profile["threads"]["inter_op"] == torch.get_num_interop_threads()


def test_activations_are_what_backward_keeps_and_grow_with_the_batch(tmp_path):
    import torch

    from syncopate.torch import model_profile

    def recorded(batch):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 512), torch.nn.ReLU(), torch.nn.Linear(512, 4))
        x, y = torch.randn(batch, 16), torch.randint(0, 4, (batch,))
        profile = model_profile(model, lambda: torch.nn.functional.cross_entropy(model(x), y), name="mlp",
                                batch_size=batch, iterations=1, warmup=0)
        # Measured after the timed steps, without training: no gradient is left behind.
        assert all(p.grad is None for p in model.parameters())
        return profile

    small, large = recorded(8), recorded(32)
    # The hidden layer's output (kept by ReLU, read by the second Linear: one storage) is most of
    # it; the weights (34 KB of the first layer's, 8 KB of the second's) are not activations.
    hidden = 8 * 512 * 4
    assert hidden <= small["activation_bytes"] < 2 * hidden, small["activation_bytes"]
    assert 3.9 <= large["activation_bytes"] / small["activation_bytes"] <= 4.0
    path = tmp_path / "mlp.json"
    path.write_text(json.dumps(large))
    done = conftest.cli("simulate", "--model", path, "--cluster", "v100-10gbe", "--nodes", 1, "--gpus-per-node", 2,
                        "--strategy", "ddp", "--format", "json")
    memory = json.loads(done.stdout)["memory_per_rank"]
    assert memory["activation_bytes"] == large["activation_bytes"]
    text = conftest.cli("simulate", "--model", path, "--cluster", "v100-10gbe", "--nodes", 1, "--gpus-per-node", 2,
                        "--strategy", "ddp").stdout
    assert "GiB of activations" in text, text


def test_a_preemption_that_every_tensors_median_misses_is_kept_in_the_total():
    """Ranks time-sharing cores: each iteration loses 3 ms in a different tensor's gap. Every
    tensor's median misses it; the recorded tensors keep their shape and sum to the median
    iteration's total."""
    import torch

    from syncopate.torch.profile import _tensors

    named = [(f"w{i}", torch.nn.Parameter(torch.zeros(4))) for i in range(4)]
    samples = []
    for k in range(5):
        backward = {i: 500.0 + (3000.0 if i == k % 4 else 0.0) for i in range(4)}
        samples.append({"order": [3, 2, 1, 0], "backward": backward, "forward": {i: 250.0 for i in range(4)},
                        "optimizer": 10.0})
    tensors = _tensors(named, samples, ["Linear"] * 4)
    assert abs(sum(t["backward_us"] for t in tensors) - 5000.0) < 1e-6
    assert len({t["backward_us"] for t in tensors}) == 1  # the shape: equal gaps stay equal
    assert abs(sum(t["forward_us"] for t in tensors) - 1000.0) < 1e-6  # nothing to correct: unchanged


def recorded_with_skew(rank, world):
    import torch

    from syncopate.torch import model_profile

    torch.manual_seed(0)
    model = models.tiny()
    x, y = models.batch(0, 0)
    return model_profile(model, lambda: torch.nn.functional.cross_entropy(model(x), y), name="tiny",
                         batch_size=len(x), iterations=3, warmup=1, rank_skew=True)


def test_ranks_recording_at_once_measure_their_skew_and_the_cli_simulates_every_rank(tmp_path):
    profiles = ranks.values(ranks.run(recorded_with_skew))
    skews = [p["rank_skew"] for p in profiles]
    assert skews[0] == skews[1]  # every rank computes the same figure from everyone's samples
    assert skews[0]["ranks"] == 2 and skews[0]["cv"] >= 0
    assert skews[0]["provenance"]["status"] == "measured"
    profiles[0]["rank_skew"]["cv"] = 0.2  # a skew large enough to matter, whatever this machine measured
    path = tmp_path / "skewed.json"
    path.write_text(json.dumps(profiles[0]))
    done = conftest.cli("simulate", "--model", path, "--cluster", "v100-10gbe", "--nodes", 2,
                        "--gpus-per-node", 1, "--strategy", "horovod", "--format", "json")
    summary = json.loads(done.stdout)
    assert summary["path"] == "explicit" and summary["rank_skew_cv"] == 0.2
    assert summary["measured_iterations"] > 1


def test_rank_skew_without_a_world_is_an_error():
    import torch

    from syncopate.torch import model_profile

    model = models.tiny()
    x, y = models.batch(0, 0)
    with pytest.raises(ValueError, match="rank_skew needs an initialized torch.distributed world"):
        model_profile(model, lambda: torch.nn.functional.cross_entropy(model(x), y), name="tiny",
                      batch_size=len(x), rank_skew=True)


def test_the_skew_is_the_ranks_robust_spread_around_each_iterations_mean(monkeypatch):
    """Two ranks 10 % either side of the iteration's mean of 100 µs in three iterations, and 50 %
    in a fourth (a stall): the median deviation is 10, a σ of 1.4826 × 10 × √2 around a mean of
    100, whatever the stall."""
    from syncopate.torch import profile as module

    gathered = [[90.0, 110.0, 90.0, 50.0], [110.0, 90.0, 110.0, 150.0]]
    monkeypatch.setattr(module.dist, "all_gather_object", lambda out, mine: out.__setitem__(slice(None), gathered))
    samples = [{"backward": {0: 90.0}, "forward": {0: 0.0}, "optimizer": 0.0}]
    skew = module._rank_skew(samples, 2, "m")
    assert skew["cv"] == round(1.4826 * 0.1 * 2 ** 0.5, 4) and skew["ranks"] == 2
