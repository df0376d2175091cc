//! Local search on a plan: move a group boundary by one tensor, merge two neighbours, split a
//! group in two, or give a group another compressor; steepest descent under an evaluation budget.

use super::{Choice, Search, SearchSpace};
use crate::base::time::SimTime;
use crate::plan::Plan;

/// Most plans local search scores in total, for models of up to [`FULL_BUDGET_TENSORS`]
/// tensors; larger models get proportionally fewer (each plan costs more to simulate).
const BUDGET: usize = 3000;
const FULL_BUDGET_TENSORS: usize = super::surrogate::MAX_UNITS;
/// The fewest plans local search may score.
const MIN_BUDGET: usize = 100;

/// The plans local search may score on a model of `tensors` tensors.
pub(super) fn budget(tensors: usize) -> usize {
    if tensors <= FULL_BUDGET_TENSORS {
        BUDGET
    } else {
        (BUDGET * FULL_BUDGET_TENSORS / tensors).max(MIN_BUDGET)
    }
}

pub(super) fn improve(
    search: &Search,
    start: (Plan, SimTime),
    choices: &[Choice],
    space: SearchSpace,
    budget: usize,
) -> (Plan, SimTime) {
    let mut best = start;
    let mut spent = 0;
    while spent < budget {
        let mut moves = neighbours(&best.0, choices, space);
        moves.truncate(budget - spent);
        if moves.is_empty() {
            break;
        }
        spent += moves.len();
        match super::fastest(search.evaluate_all(moves)) {
            Some(found) if found.1 < best.1 => best = found,
            _ => break,
        }
    }
    best
}

/// Whether every group is a run of consecutive tensors in backward order, groups in order.
fn contiguous(plan: &Plan) -> bool {
    let mut next = 0;
    plan.groups.iter().all(|g| {
        let ok = g.tensors.iter().enumerate().all(|(i, &t)| t == next + i);
        next += g.tensors.len();
        ok
    })
}

fn neighbours(plan: &Plan, choices: &[Choice], space: SearchSpace) -> Vec<Plan> {
    let mut moves = Vec::new();
    let groups = plan.groups.len();
    if space != SearchSpace::Compression && contiguous(plan) {
        for i in 0..groups.saturating_sub(1) {
            // The last tensor of group i joins group i+1, or the first of i+1 joins i.
            if plan.groups[i].tensors.len() > 1 {
                let mut p = plan.clone();
                let t = p.groups[i].tensors.pop().expect("more than one tensor");
                p.groups[i + 1].tensors.insert(0, t);
                moves.push(p);
            }
            if plan.groups[i + 1].tensors.len() > 1 {
                let mut p = plan.clone();
                let t = p.groups[i + 1].tensors.remove(0);
                p.groups[i].tensors.push(t);
                moves.push(p);
            }
            let mut merged = plan.clone();
            let next = merged.groups.remove(i + 1);
            merged.groups[i].tensors.extend(next.tensors);
            moves.push(merged);
        }
        for i in 0..groups {
            let len = plan.groups[i].tensors.len();
            if len > 1 {
                let mut p = plan.clone();
                let tail = p.groups[i].tensors.split_off(len / 2);
                let mut second = p.groups[i].clone();
                second.tensors = tail;
                p.groups.insert(i + 1, second);
                moves.push(p);
            }
        }
    }
    if space != SearchSpace::Fusion {
        for i in 0..groups {
            for &(compressor, memory) in choices {
                let group = &plan.groups[i];
                if group.compressor == compressor && group.memory == memory {
                    continue;
                }
                let mut p = plan.clone();
                p.groups[i].compressor = compressor;
                p.groups[i].memory = memory;
                // A compressor that cannot use the group's scheme is no neighbour.
                if p.groups[i]
                    .compressor
                    .allowed_aggregations()
                    .contains(&p.groups[i].aggregation())
                {
                    moves.push(p);
                }
            }
        }
    }
    for p in &mut moves {
        p.strategy = "tuned".to_string();
        for (i, g) in p.groups.iter_mut().enumerate() {
            if plan.policy.launch == crate::plan::Launch::PlanOrder {
                g.priority = i as i64;
            }
        }
    }
    moves
}
