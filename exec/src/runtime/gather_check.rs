//! `--check` of a sharded plan's gathers: every rank holds every shard of its split, in order.
//!
//! Each rank reports digests of the shard it sent and of every shard it holds after the gather
//! ([`GatherDigests`]); once every rank reported, every rank's shard s must be the one its owner
//! sent (`ring::summed_chunk`), bit for bit: a gather moves bytes and adds nothing, so any
//! difference is a transport bug, and fails the run naming the rank and the shard; with float8
//! weights every rank must have cast with the same scales (torchao's agreed ones). Digests, not
//! the shards, go to rank 0 in a run of several processes: a gathered unit per rank and gather
//! would be more than the gradients' reports.

use super::pieces::mix;
use crate::error::{ExecError, Result};
use std::collections::BTreeMap;
use std::sync::Mutex;
use syncopate_sim::schedule::{chunk_keeper, Schedule, StepKind};

/// What a rank reports of one gather.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GatherDigests {
    /// The [`digest`] of the shard it sent.
    pub sent: u64,
    /// The digest of the float8 scales it cast that shard with (of none without float8 weights).
    pub scales: u64,
    /// The digest of every shard it holds after the gather, in shard order.
    pub held: Vec<u64>,
}

/// A 64-bit digest of `bytes`, word by word through SplitMix64's bijective mixing: a difference
/// in one word always changes it, in several words all but with odds of 2⁻⁶⁴.
pub fn digest(bytes: &[u8]) -> u64 {
    let words = bytes.chunks_exact(8);
    let mut tail = [0u8; 8];
    tail[..words.remainder().len()].copy_from_slice(words.remainder());
    words
        .map(|w| u64::from_le_bytes(w.try_into().expect("eight bytes")))
        .chain([u64::from_le_bytes(tail)])
        .fold(bytes.len() as u64, mix)
}

/// Each rank's report of one gather in one iteration, until every rank reported.
type Reports = Vec<Option<GatherDigests>>;

/// The gathers of a schedule and the reports of those not yet checked.
pub(super) struct GatherChecks {
    world: usize,
    /// Per schedule step, if it is a gather: its group, its label, and the ranks its unit is
    /// split over (every rank, or each node's under hybrid sharding and for hpZ's gathers before
    /// backward: the node gathers its shards, and each node holds the same split).
    steps: Vec<Option<(usize, String, usize)>>,
    /// Per (gather step, iteration): each rank's report so far.
    open: Mutex<BTreeMap<(u32, u32), Reports>>,
}

impl GatherChecks {
    /// The gathers of `schedule`.
    pub(super) fn new(schedule: &Schedule) -> GatherChecks {
        let steps = schedule
            .steps
            .iter()
            .map(|step| match step.kind {
                StepKind::Gather { group, pass } => {
                    let per = schedule.gather_shard(group, pass).ranks(schedule.world);
                    Some((group as usize, step.kind.label(), per as usize))
                }
                _ => None,
            })
            .collect();
        GatherChecks {
            world: schedule.world.ranks() as usize,
            steps,
            open: Mutex::new(BTreeMap::new()),
        }
    }

    /// Whether rank `rank`'s report of `held` digests fits gather step `step`: reports from
    /// another process are checked before they are taken.
    pub(super) fn accepts(&self, step: u32, rank: u32, held: usize) -> bool {
        (rank as usize) < self.world && self.gather(step).is_some_and(|g| held == g.2)
    }

    fn gather(&self, step: u32) -> Option<&(usize, String, usize)> {
        self.steps.get(step as usize)?.as_ref()
    }

    /// Rank `rank`'s report of gather step `step` in `iteration`. The last rank to report
    /// checks every rank's and returns the unit's group; a shard that differs is an error.
    pub(super) fn gathered(
        &self,
        step: u32,
        rank: u32,
        iteration: u32,
        digests: &GatherDigests,
    ) -> Result<Option<usize>> {
        let reports = {
            let mut open = self.open.lock().expect("a gather check lock");
            let reports = open
                .entry((step, iteration))
                .or_insert_with(|| vec![None; self.world]);
            reports[rank as usize] = Some(digests.clone());
            if reports.iter().any(Option::is_none) {
                return Ok(None);
            }
            open.remove(&(step, iteration)).expect("reported above")
        };
        let reports: Vec<GatherDigests> = reports.into_iter().flatten().collect();
        let (group, label, per) = self.gather(step).expect("only gather steps report gathers");
        let per = *per;
        if let Some(r) = reports.iter().position(|r| r.scales != reports[0].scales) {
            return Err(ExecError::Check {
                group: *group,
                message: format!(
                    "{label} of iteration {iteration}: rank {r} cast its float8 weights with scales other than rank 0's"
                ),
            });
        }
        for (r, report) in reports.iter().enumerate() {
            // The rank's split: its node's ranks under hybrid sharding, else every rank.
            let first = r - r % per;
            for s in 0..per {
                // The shard's owner: the rank that keeps it after a ring reduce-scatter.
                let owner = first + chunk_keeper(s, per);
                let sent = reports[owner].sent;
                if report.held.get(s) == Some(&sent) {
                    continue;
                }
                return Err(ExecError::Check {
                    group: *group,
                    message: format!(
                        "{label} of iteration {iteration}: rank {r} holds a shard {s} other than the one rank {owner} sent"
                    ),
                });
            }
        }
        Ok(Some(*group))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::test_plans::{first_gather, small_sharded};
    use syncopate_sim::sharding::ParamDtype;

    /// Three ranks' reports of a gather: rank r sent shard (r + 1) mod 3 with digest 10 + r, and
    /// every rank holds every shard.
    fn reports() -> Vec<GatherDigests> {
        (0..3)
            .map(|r| GatherDigests {
                sent: 10 + r,
                scales: 0,
                held: vec![12, 10, 11],
            })
            .collect()
    }

    #[test]
    fn every_rank_holding_every_shard_checks_once_all_reported() {
        let schedule = small_sharded("zero2", "none", ParamDtype::Fp32, (1, 3));
        let checks = GatherChecks::new(&schedule);
        let (step, group) = first_gather(&schedule);
        assert!(checks.accepts(step, 2, 3));
        assert!(!checks.accepts(step, 3, 3), "rank 3 of 3");
        assert!(!checks.accepts(step, 0, 2), "two shards of three");
        assert!(!checks.accepts(step - 1, 0, 3), "not a gather");
        let reports = reports();
        assert_eq!(checks.gathered(step, 1, 5, &reports[1]).unwrap(), None);
        assert_eq!(checks.gathered(step, 0, 5, &reports[0]).unwrap(), None);
        assert_eq!(
            checks.gathered(step, 2, 5, &reports[2]).unwrap(),
            Some(group)
        );
        assert!(checks.open.lock().unwrap().is_empty());
    }

    /// The error of an fsdp gather on three ranks whose reports `spoil` changed, and the group.
    fn spoiled(spoil: impl Fn(&mut [GatherDigests])) -> (String, usize) {
        let schedule = small_sharded("fsdp", "none", ParamDtype::Fp32, (1, 3));
        let checks = GatherChecks::new(&schedule);
        let (step, group) = first_gather(&schedule);
        let mut reports = reports();
        spoil(&mut reports);
        checks.gathered(step, 0, 0, &reports[0]).unwrap();
        checks.gathered(step, 1, 0, &reports[1]).unwrap();
        let err = checks.gathered(step, 2, 0, &reports[2]).unwrap_err();
        (err.to_string(), group)
    }

    #[test]
    fn a_shard_other_than_its_owner_sent_fails_naming_the_rank_and_shard() {
        // Rank 1 holds the shards in rank order: shard 0 is rank 0's.
        let (err, group) = spoiled(|reports| reports[1].held = vec![10, 11, 12]);
        assert!(
            err.contains(&format!("group {group}"))
                && err.contains("gather g")
                && err.contains("iteration 0: rank 1 holds a shard 0")
                && err.contains("rank 2 sent"),
            "{err}"
        );
    }

    #[test]
    fn a_rank_casting_with_other_scales_fails_naming_it() {
        let (err, _) = spoiled(|reports| reports[2].scales = 7);
        assert!(
            err.contains("rank 2 cast its float8 weights with scales other than rank 0's"),
            "{err}"
        );
    }

    #[test]
    fn under_hybrid_sharding_each_node_holds_its_own_ranks_shards() {
        // Two nodes of two: rank r sends shard (r % 2 + 1) % 2 of its node's split, and each
        // node holds its two shards; the nodes' digests need not match.
        let schedule = small_sharded("hsdp", "none", ParamDtype::Fp32, (2, 2));
        let checks = GatherChecks::new(&schedule);
        let (step, group) = first_gather(&schedule);
        assert!(checks.accepts(step, 3, 2));
        assert!(!checks.accepts(step, 0, 4), "four shards of a node's two");
        let report = |sent, held: [u64; 2]| GatherDigests {
            sent,
            scales: 0,
            held: held.to_vec(),
        };
        let mut reports = [
            report(10, [11, 10]),
            report(11, [11, 10]),
            report(20, [21, 20]),
            report(21, [21, 20]),
        ];
        for (r, report) in reports.iter().enumerate().take(3) {
            assert_eq!(checks.gathered(step, r as u32, 0, report).unwrap(), None);
        }
        assert_eq!(
            checks.gathered(step, 3, 0, &reports[3]).unwrap(),
            Some(group)
        );
        // Rank 2 holding the other node's shard fails, naming it.
        reports[2].held = vec![11, 20];
        for (r, report) in reports.iter().enumerate().take(3) {
            checks.gathered(step, r as u32, 1, report).unwrap();
        }
        let err = checks
            .gathered(step, 3, 1, &reports[3])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("rank 2 holds a shard 0") && err.contains("rank 3 sent"),
            "{err}"
        );
    }

    #[test]
    fn any_changed_word_changes_the_digest() {
        let bytes: Vec<u8> = (0..37u8).collect();
        let d = digest(&bytes);
        for i in 0..bytes.len() {
            let mut flipped = bytes.clone();
            flipped[i] ^= 1;
            assert_ne!(digest(&flipped), d, "byte {i}");
        }
        let mut swapped = bytes.clone();
        swapped[..16].rotate_left(8);
        assert_ne!(digest(&swapped), d, "words in another order");
        assert_ne!(digest(&bytes[..36]), d, "a byte less");
        assert_ne!(digest(&[0; 8]), digest(&[0; 16]), "zeros of another length");
    }
}
