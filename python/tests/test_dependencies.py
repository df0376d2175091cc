"""`syncopate.torch` takes its dependency rules from the Rust extension: the counts, successors and
tails it walks are those of the simulator's unrolled program, iteration by iteration."""

import json

import syncopate
from syncopate.torch.schedule import Layout, kind_of


def layout_of(make_plan, strategy):
    schedule_json, _ = syncopate.lower(str(make_plan(strategy)), 2)
    return Layout(json.loads(schedule_json), schedule_json), json.loads(schedule_json)


def test_per_group_updates_run_from_the_second_iteration_and_wait_for_the_first(make_plan):
    # DeAR updates each group before its next forward: the update steps do not run in the
    # first iteration, and from the second on each waits for its group's all-gathers before.
    layout, schedule = layout_of(make_plan, "dear")
    assert layout.update_step
    first, steady = layout.waiting(0), layout.waiting(1)
    for group, step in layout.update_step.items():
        assert first[step] is None and steady[step] is not None
        assert layout.tails[group], group
        assert all(kind_of(schedule["steps"][t])[0] != "update" for t in layout.tails[group])
    # Nothing waits in the first iteration for a step that does not run in it.
    successors = layout.successors(0)
    for index, count in enumerate(first):
        if count is None:
            assert all(index not in following for following in successors)


def test_counts_and_successors_are_one_relation(make_plan):
    for strategy in ["horovod", "dear", "bytescheduler"]:
        layout, schedule = layout_of(make_plan, strategy)
        for iteration in (0, 1, 5):
            waiting, successors = layout.waiting(iteration), layout.successors(iteration)
            for index in range(len(schedule["steps"])):
                before = layout.waits_for(index, iteration)
                if waiting[index] is not None:
                    assert waiting[index] == len(before)
                    assert all(index in successors[b] for b in before)
        # Bad indices are answered with nothing, not a crash.
        assert layout.waits_for(10**6, 1) == [] and layout.dependencies.waits_for_previous(10**6, 1) == []
