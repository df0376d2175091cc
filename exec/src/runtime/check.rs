//! `--check`: compares every rank's aggregated gradient with the CPU reference and the exact sum.
//!
//! The reference is the compressor's CPU reference aggregation of all ranks' inputs; the exact sum
//! is of the same inputs. A sharded plan's rank holds only its chunk of the sum, which is compared
//! so, and its gathers are checked too (`gather_check`).
//!
//! The reference replays the same codecs (same seeds, so the same stochastic choices and state)
//! on every rank's compression input, centrally and in rank order. A transport bug (a lost or
//! misplaced chunk, a wrong peer) shows up as a difference from it; the only legitimate
//! difference is the summation order of the ring, bounded by the wire type's rounding.

use super::alltoall;
use super::compressed_ring::{self, Shards};
use super::gather_check::{GatherChecks, GatherDigests};
use super::pieces::{self, wire_element_bytes};
use super::ring::{self, Ring};
use crate::compress::{aggregate, Codec, MemoryState};
use crate::error::Result;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Mutex;
use syncopate_sim::compress::{Aggregation, Compressor, Element, Family};
use syncopate_sim::schedule::{Schedule, World};

/// What `--check` found for one group over every checked iteration and piece.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct GroupCheck {
    /// Index of the schedule's group checked.
    pub group: usize,
    /// The group's compressor spec.
    pub compressor: String,
    /// Pieces checked, counting each iteration of a piece once.
    pub checked: u32,
    /// Largest |result − reference| / max |reference| over ranks, pieces and iterations.
    pub max_error_vs_reference: f64,
    /// Bound on `max_error_vs_reference`: the slack of a different summation order.
    pub tolerance_vs_reference: f64,
    /// Largest ‖result − Σ inputs‖₂ / ‖Σ inputs‖₂: the compressor's own loss.
    pub max_error_vs_sum: f64,
    /// Bound on the loss for the precision casts; sparsifiers and quantizers drop information by
    /// design and are judged against the reference only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tolerance_vs_sum: Option<f64>,
    /// Whether every error so far is within its tolerance.
    pub ok: bool,
    /// A sharded plan's gathers of the group's parameters checked, counting each iteration of
    /// a gather once: every rank held every rank's shard, bit for bit (a difference fails the
    /// run, naming the rank and the shard).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub gathers_checked: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

struct PieceCheck {
    codecs: Vec<Box<dyn Codec>>,
    server: Box<dyn Codec>,
    /// Per iteration, each rank's input and result: a fast rank may encode the next iteration
    /// before a slow one has decoded this one.
    inputs: BTreeMap<u32, Vec<Option<Vec<f32>>>>,
    results: BTreeMap<u32, Vec<Option<Vec<f32>>>>,
    /// The parameter server's rank for this piece.
    server_rank: usize,
    /// Elements of the piece.
    numel: usize,
    aggregation: Aggregation,
    /// Each rank's shards, for a piece that goes round a CaSync-Ring (none otherwise).
    ring: Vec<Shards>,
    /// When each rank keeps only its chunk of the sum (`pieces::ends_scattered`), the ranks of
    /// the ring that split it: every rank, or each node's under hybrid sharding.
    scattered: Option<usize>,
    /// For an all-to-all reduce-scatter, each chunk's elements and payload bytes, and the
    /// world whose nodes it hops through.
    alltoall: Option<(alltoall::Chunks, World)>,
    group: usize,
    /// The memory's factor on the result (EF-SignSGD's 1/lr), applied to the reference too.
    output_scale: f32,
}

/// Collects inputs and results from every rank and checks each piece once all ranks reported.
pub struct Checker {
    world: usize,
    pieces: Vec<Mutex<PieceCheck>>,
    gathers: GatherChecks,
    groups: Mutex<Vec<GroupCheck>>,
}

impl Checker {
    /// A checker of every piece of `schedule` whose codecs draw from `seed`.
    pub fn new(schedule: &Schedule, seed: u64) -> Checker {
        let ranks = schedule.world.ranks();
        let world = ranks as usize;
        let pieces = schedule
            .pieces
            .iter()
            .enumerate()
            .map(|(i, piece)| {
                Mutex::new(PieceCheck {
                    codecs: (0..ranks)
                        .map(|r| pieces::codec(schedule, seed, i, Some(r)))
                        .collect(),
                    server: pieces::codec(schedule, seed, i, None),
                    inputs: BTreeMap::new(),
                    results: BTreeMap::new(),
                    server_rank: pieces::server_rank(piece, ranks) as usize,
                    numel: piece.numel as usize,
                    aggregation: piece.aggregation,
                    ring: match piece.compressed_ring() {
                        true => (0..ranks)
                            .map(|r| {
                                let codecs = pieces::shard_codecs(schedule, seed, i, r);
                                Shards::new(r as usize, world, piece.numel as usize, codecs)
                            })
                            .collect(),
                        false => Vec::new(),
                    },
                    scattered: pieces::ends_scattered(piece)
                        .then(|| pieces::scatter_ranks(piece, &schedule.world)),
                    alltoall: piece
                        .alltoall_scattered()
                        .then(|| (alltoall::Chunks::of(piece), schedule.world)),
                    group: piece.group as usize,
                    output_scale: MemoryState::new(piece.memory, 0).output_scale(),
                })
            })
            .collect();
        let mut groups: Vec<GroupCheck> = Vec::new();
        for piece in &schedule.pieces {
            if groups.len() == piece.group as usize {
                groups.push(GroupCheck {
                    group: piece.group as usize,
                    compressor: piece.compressor.to_string(),
                    checked: 0,
                    max_error_vs_reference: 0.0,
                    tolerance_vs_reference: reference_tolerance(&piece.compressor, world),
                    max_error_vs_sum: 0.0,
                    tolerance_vs_sum: sum_tolerance(&piece.compressor, world),
                    ok: true,
                    gathers_checked: 0,
                });
            }
        }
        Checker {
            world,
            pieces,
            gathers: GatherChecks::new(schedule),
            groups: Mutex::new(groups),
        }
    }

    /// Whether `values` values of rank `rank` for piece `index` fit this checker's schedule:
    /// reports from another process are checked before they are taken.
    pub fn accepts(&self, index: usize, rank: u32, values: usize) -> bool {
        (rank as usize) < self.world
            && self
                .pieces
                .get(index)
                .is_some_and(|p| p.lock().expect("a checker lock").numel == values)
    }

    /// Rank `rank`'s compression input (after error feedback) of piece `index`.
    pub fn input(&self, index: usize, rank: u32, iteration: u32, input: &[f32]) {
        let mut piece = self.pieces[index].lock().expect("a checker lock");
        piece
            .inputs
            .entry(iteration)
            .or_insert_with(|| vec![None; self.world])[rank as usize] = Some(input.to_vec());
    }

    /// Rank `rank`'s aggregated result of piece `index` (after the memory's output scale); the
    /// last rank to report runs the check.
    pub fn result(&self, index: usize, rank: u32, iteration: u32, result: &[f32]) -> Result<()> {
        let mut piece = self.pieces[index].lock().expect("a checker lock");
        let (group, aggregation, output_scale) =
            (piece.group, piece.aggregation, piece.output_scale);
        let results = piece
            .results
            .entry(iteration)
            .or_insert_with(|| vec![None; self.world]);
        results[rank as usize] = Some(result.to_vec());
        if results.iter().any(Option::is_none) {
            return Ok(());
        }
        let results: Vec<Vec<f32>> = piece
            .results
            .remove(&iteration)
            .unwrap_or_default()
            .into_iter()
            .flatten()
            .collect();
        // Every rank encoded before any rank could decode, so all inputs are in.
        let inputs: Vec<Vec<f32>> = piece
            .inputs
            .remove(&iteration)
            .unwrap_or_default()
            .into_iter()
            .flatten()
            .collect();
        let mut reference = reference(&mut piece, aggregation, &inputs)?;
        // The backends scale their result after decoding it, as here.
        if output_scale != 1.0 {
            reference
                .iter_mut()
                .flatten()
                .for_each(|x| *x *= output_scale);
        }
        let mut sum = vec![0.0f64; inputs[0].len()];
        for input in &inputs {
            for (s, &x) in sum.iter_mut().zip(input) {
                *s += f64::from(x) * f64::from(output_scale);
            }
        }
        let scale = reference
            .iter()
            .flatten()
            .fold(0.0f64, |m, &x| m.max(f64::from(x).abs()))
            .max(f64::MIN_POSITIVE);
        let mut groups = self.groups.lock().expect("a checker lock");
        let report = &mut groups[group];
        for (rank, (result, reference)) in results.iter().zip(&reference).enumerate() {
            let vs_reference = result
                .iter()
                .zip(reference)
                .fold(0.0f64, |m, (&a, &b)| m.max(f64::from(a - b).abs()))
                / scale;
            // A scattered piece's rank holds the sum of its chunk of the payload only: for the
            // casts, those elements of the gradient (random-k's chunk holds other coordinates,
            // and its loss against the sum is reported, not judged).
            let held = match piece.scattered {
                Some(per) => ring::chunk(ring::summed_chunk(rank % per, per), per, sum.len()),
                None => 0..sum.len(),
            };
            let vs_sum = relative_l2(&result[held.clone()], &sum[held]);
            report.max_error_vs_reference = report.max_error_vs_reference.max(vs_reference);
            report.max_error_vs_sum = report.max_error_vs_sum.max(vs_sum);
        }
        report.checked += 1;
        report.ok = report.max_error_vs_reference <= report.tolerance_vs_reference
            && report
                .tolerance_vs_sum
                .is_none_or(|t| report.max_error_vs_sum <= t);
        Ok(())
    }

    /// Whether a report of `held` shard digests of rank `rank` fits gather step `step`:
    /// reports from another process are checked before they are taken.
    pub fn accepts_gather(&self, step: u32, rank: u32, held: usize) -> bool {
        self.gathers.accepts(step, rank, held)
    }

    /// Rank `rank`'s report of gather step `step` in `iteration`; the last rank to report
    /// checks every rank's.
    pub fn gathered(
        &self,
        step: u32,
        rank: u32,
        iteration: u32,
        digests: &GatherDigests,
    ) -> Result<()> {
        if let Some(group) = self.gathers.gathered(step, rank, iteration, digests)? {
            self.groups.lock().expect("a checker lock")[group].gathers_checked += 1;
        }
        Ok(())
    }

    /// Every group's check so far, by group index.
    pub fn report(&self) -> Vec<GroupCheck> {
        self.groups.lock().expect("a checker lock").clone()
    }
}

/// ‖result − sum‖₂ / ‖sum‖₂.
fn relative_l2(result: &[f32], sum: &[f64]) -> f64 {
    let norm = sum.iter().map(|s| s * s).sum::<f64>().sqrt();
    let error = result
        .iter()
        .zip(sum)
        .map(|(&a, &s)| (f64::from(a) - s).powi(2))
        .sum::<f64>()
        .sqrt();
    error / norm.max(f64::MIN_POSITIVE)
}

/// Every rank's expected result, computed centrally with the reference codecs.
fn reference(
    piece: &mut PieceCheck,
    aggregation: Aggregation,
    inputs: &[Vec<f32>],
) -> Result<Vec<Vec<f32>>> {
    let n = inputs[0].len();
    if !piece.ring.is_empty() {
        let result = compressed_ring::reference(&mut piece.ring, inputs)?;
        return Ok(vec![result; inputs.len()]);
    }
    if let Some((chunks, world)) = &piece.alltoall {
        return alltoall_scattered(&mut piece.codecs, inputs, chunks, *world);
    }
    if let Some(per) = piece.scattered {
        return scattered(&mut piece.codecs, inputs, per);
    }
    let mut outs = vec![vec![0.0f32; n]; inputs.len()];
    match aggregation {
        Aggregation::Allreduce | Aggregation::Allgather => {
            let grads: Vec<&[f32]> = inputs.iter().map(Vec::as_slice).collect();
            aggregate(&mut piece.codecs, &grads, &mut outs)?;
        }
        Aggregation::ParameterServer => {
            // The server decodes every pushed payload with its worker codec, re-encodes the sum
            // with the server codec, and every rank decodes that one payload.
            let mut payloads = vec![Vec::new(); inputs.len()];
            for ((codec, input), payload) in piece.codecs.iter_mut().zip(inputs).zip(&mut payloads)
            {
                codec.encode(input, payload)?;
            }
            let mut sum = vec![0.0f32; n];
            let s = piece.server_rank;
            for payload in &payloads {
                piece.codecs[s].decode_add(payload, &mut sum)?;
            }
            let mut pulled = Vec::new();
            piece.server.encode(&sum, &mut pulled)?;
            for (codec, out) in piece.codecs.iter_mut().zip(&mut outs) {
                codec.decode_add(&pulled, out)?;
            }
        }
    }
    Ok(outs)
}

/// Each rank's shard of the sum of every rank's payload, decoded: the payloads summed in the
/// wire type, every chunk but the one the rank holds after a ring reduce-scatter zeroed
/// (`ring::keep_summed_chunk`, as the backends keep it, on rings of `per` ranks), then decoded
/// by the rank's codec.
fn scattered(
    codecs: &mut [Box<dyn Codec>],
    inputs: &[Vec<f32>],
    per: usize,
) -> Result<Vec<Vec<f32>>> {
    let world = inputs.len();
    let mut payloads = vec![Vec::new(); world];
    for ((codec, input), payload) in codecs.iter_mut().zip(inputs).zip(&mut payloads) {
        codec.encode(input, payload)?;
    }
    let (first, rest) = payloads.split_first_mut().expect("a piece has ranks");
    for other in rest.iter() {
        codecs[0].sum_into(first, other)?;
    }
    let element = wire_element_bytes(&codecs[0].compressor());
    codecs
        .iter_mut()
        .enumerate()
        .map(|(rank, codec)| {
            let mut shard = first.clone();
            ring::keep_summed_chunk(&Ring::node(rank, per), &mut shard, element);
            let mut out = vec![0.0f32; inputs[rank].len()];
            codec.decode_add(&shard, &mut out)?;
            Ok(out)
        })
        .collect()
}

/// Each rank's shard of the sum after an all-to-all reduce-scatter over `world`: every rank's
/// input encoded by its codec, one call a chunk; on several nodes of several ranks, each node's
/// payloads of a chunk decoded and added, in rank order, by the node's rank of its keeper's
/// place, which re-encodes the sum with its codec; then the keeper's (`ring::summed_chunk`)
/// decode of every payload of its chunk it receives, in the order of their senders.
fn alltoall_scattered(
    codecs: &mut [Box<dyn Codec>],
    inputs: &[Vec<f32>],
    calls: &alltoall::Chunks,
    world: World,
) -> Result<Vec<Vec<f32>>> {
    let ranks = inputs.len();
    let per_node = world.ranks_per_node as usize;
    let mut payloads = vec![Vec::new(); ranks];
    for ((codec, input), payload) in codecs.iter_mut().zip(inputs).zip(&mut payloads) {
        codec.encode(input, payload)?;
    }
    let mut outs = Vec::with_capacity(ranks);
    for rank in 0..ranks {
        let kept = ring::summed_chunk(rank, ranks);
        let part = |payload: &Vec<u8>| payload[calls.bytes[kept].clone()].to_vec();
        let received: Vec<Vec<u8>> = match world.two_hop_alltoall() {
            false => payloads.iter().map(part).collect(),
            true => (0..world.nodes as usize)
                .map(|node| {
                    let collector = node * per_node + rank % per_node;
                    let mut sum = vec![0.0f32; inputs[rank].len()];
                    for payload in &payloads[node * per_node..(node + 1) * per_node] {
                        codecs[collector].decode_call_add(kept, &part(payload), &mut sum)?;
                    }
                    let mut encoded = Vec::new();
                    let values = &sum[calls.elements[kept].clone()];
                    codecs[collector].encode_call(kept, values, &mut encoded)?;
                    Ok(encoded)
                })
                .collect::<Result<_>>()?,
        };
        let mut out = vec![0.0f32; inputs[rank].len()];
        for payload in &received {
            codecs[rank].decode_call_add(kept, payload, &mut out)?;
        }
        outs.push(out);
    }
    Ok(outs)
}

/// Where a rank reports its compression inputs and aggregated results for `--check`: the
/// [`Checker`] itself in one process, a `check_report::Collector` for rank 0 in one of several.
pub trait CheckSink: Sync {
    /// Rank `rank`'s compression input of piece `piece` in `iteration`.
    fn input(&self, piece: usize, rank: u32, iteration: u32, input: &[f32]);
    /// Rank `rank`'s aggregated result of piece `piece` in `iteration`.
    fn result(&self, piece: usize, rank: u32, iteration: u32, result: &[f32]) -> Result<()>;
    /// Rank `rank`'s report of gather step `step` in `iteration`.
    fn gathered(&self, step: u32, rank: u32, iteration: u32, digests: &GatherDigests)
        -> Result<()>;
}

impl CheckSink for Checker {
    fn input(&self, piece: usize, rank: u32, iteration: u32, input: &[f32]) {
        Checker::input(self, piece, rank, iteration, input);
    }

    fn result(&self, piece: usize, rank: u32, iteration: u32, result: &[f32]) -> Result<()> {
        Checker::result(self, piece, rank, iteration, result)
    }

    fn gathered(
        &self,
        step: u32,
        rank: u32,
        iteration: u32,
        digests: &GatherDigests,
    ) -> Result<()> {
        Checker::gathered(self, step, rank, iteration, digests)
    }
}

/// Summation-order slack: a ring adds p payloads in another order than the reference, each
/// addition rounding to the wire type (unit roundoff u), so results may differ by about p·u of
/// the largest value (4·p·u for f32 sums of decoded values, whose magnitudes vary more).
/// PowerSGD orthogonalizes the reduced P, which can amplify that a little.
fn reference_tolerance(c: &Compressor, world: usize) -> f64 {
    let p = world as f64;
    if c.family() == Family::PowerSgd {
        return 1e-3;
    }
    match c.summed_as() {
        Some(half @ (Element::F16 | Element::Bf16)) => 2.0 * p * half.unit_roundoff(),
        _ => 4.0 * p * Element::F32.unit_roundoff(),
    }
}

/// Relative L2 loss of the precision casts: each of p inputs is rounded once (relative error
/// u) and the sum of p rounded values is rounded at most p more times.
fn sum_tolerance(c: &Compressor, world: usize) -> Option<f64> {
    c.rounding_error().map(|u| 2.0 * world as f64 * u)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::test_plans::small_sharded;
    use syncopate_sim::sharding::ParamDtype;

    /// A sharded plan's reduce-scatter on three ranks (uneven chunks), summed in fp32 and in
    /// fp16: a rank holding the sum of its chunk, and zeros elsewhere as the backends keep it,
    /// checks; one holding the whole sum, or another rank's chunk, does not.
    #[test]
    fn a_reduce_scattered_shard_is_checked_against_the_reference_shard() {
        for spec in ["none", "fp16"] {
            let schedule = small_sharded("fsdp", spec, ParamDtype::Fp32, (1, 3));
            assert!(pieces::ends_scattered(&schedule.pieces[0]));
            let n = schedule.pieces[0].numel as usize;
            assert_ne!(n % 3, 0);
            // Halves in [-2, 3]: exact in fp16, and so are their sums.
            let inputs: Vec<Vec<f32>> = (0..3)
                .map(|r| {
                    (0..n)
                        .map(|i| ((i * 7 + r * 3) % 11) as f32 * 0.5 - 2.0)
                        .collect()
                })
                .collect();
            let sum: Vec<f32> = (0..n).map(|i| inputs.iter().map(|x| x[i]).sum()).collect();
            let shard = |rank: usize| -> Vec<f32> {
                let kept = ring::chunk(ring::summed_chunk(rank, 3), 3, n);
                (0..n)
                    .map(|i| if kept.contains(&i) { sum[i] } else { 0.0 })
                    .collect()
            };
            let check = |result: &dyn Fn(usize) -> Vec<f32>| {
                let checker = Checker::new(&schedule, 1);
                for (rank, input) in inputs.iter().enumerate() {
                    checker.input(0, rank as u32, 0, input);
                }
                for rank in 0..3 {
                    checker.result(0, rank as u32, 0, &result(rank)).unwrap();
                }
                checker.report().swap_remove(0)
            };
            let held = check(&shard);
            assert!(held.ok && held.checked == 1, "{spec}: {held:?}");
            assert_eq!(held.max_error_vs_reference, 0.0, "{spec}");
            assert_eq!(held.max_error_vs_sum, 0.0, "{spec}");
            let whole = check(&|_| sum.clone());
            assert!(!whole.ok, "{spec}: the whole sum is no rank's result");
            let another = check(&|rank| shard((rank + 1) % 3));
            assert!(!another.ok, "{spec}: another rank's chunk");
        }
    }
}
