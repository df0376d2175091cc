"""The zero-copy path gives the payload bytes of the Rust codec on a copy, for every compressor.

The zero-copy path is a torch tensor's memory read in place by the Rust codecs; every compressor of
the catalog is covered.
"""

import json

import pytest
import torch

import syncopate


@pytest.fixture(scope="module")
def base_plan(make_plan):
    return json.loads(make_plan("horovod").read_text())


# Every compressor in one codec call per piece, and the element-wise ones of fixed payload
# length in one per tensor (a plan refuses PowerSGD and threshold there).
CASES = [(spec, "group") for spec in syncopate.compressors()] + [
    (spec, "tensor") for spec in syncopate.compressors() if not spec.startswith(("powersgd", "threshold"))
]


@pytest.mark.parametrize("spec,calls", CASES)
def test_payload_bytes_match_the_rust_reference(spec, calls, base_plan, tmp_path):
    plan = dict(base_plan, groups=[dict(g, compressor=spec) for g in base_plan["groups"]], codec_calls=calls)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    schedule_json, _ = syncopate.lower(str(path), 2)
    schedule = json.loads(schedule_json)
    state = syncopate.Rank(schedule_json, 0, 7)
    generator = torch.Generator().manual_seed(3)
    groups = [torch.randn(b["numel"], generator=generator) for b in schedule["buffers"]]
    for index, piece in enumerate(schedule["pieces"]):
        group = groups[piece["group"]]
        state.compensate(index, group.numpy())
        length = state.encode(index)
        payload = torch.empty(length, dtype=torch.uint8)
        state.copy_payload(index, payload.numpy())
        values = group[piece["offset"]: piece["offset"] + piece["numel"]].clone()
        expected = syncopate.encode_reference(spec, values.numpy(), piece.get("shapes") or [], state.codec_seed(index),
                                              piece.get("calls") or [])
        assert payload.numpy().tobytes() == expected, f"{spec}: piece {index}"
