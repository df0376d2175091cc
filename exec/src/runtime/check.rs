//! `--check`: compares every rank's aggregated gradient with the CPU reference and the exact sum.
//!
//! The reference is the compressor's CPU reference aggregation of all ranks' inputs; the exact sum
//! is of the same inputs.
//!
//! The reference replays the same codecs (same seeds, so the same stochastic choices and state)
//! on every rank's compression input, centrally and in rank order. A transport bug (a lost or
//! misplaced chunk, a wrong peer) shows up as a difference from it; the only legitimate
//! difference is the summation order of the ring, bounded by the wire type's rounding.

use super::compressed_ring::{self, Shards};
use super::pieces;
use crate::compress::{aggregate, Codec, MemoryState};
use crate::error::Result;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Mutex;
use syncopate_sim::compress::{Aggregation, Compressor, Element, Family};
use syncopate_sim::schedule::Schedule;

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
    group: usize,
    /// The memory's factor on the result (EF-SignSGD's 1/lr), applied to the reference too.
    output_scale: f32,
}

/// Collects inputs and results from every rank and checks each piece once all ranks reported.
pub struct Checker {
    world: usize,
    pieces: Vec<Mutex<PieceCheck>>,
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
                });
            }
        }
        Checker {
            world,
            pieces,
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
        let sum_norm = sum
            .iter()
            .map(|s| s * s)
            .sum::<f64>()
            .sqrt()
            .max(f64::MIN_POSITIVE);
        let mut groups = self.groups.lock().expect("a checker lock");
        let report = &mut groups[group];
        for (result, reference) in results.iter().zip(&reference) {
            let vs_reference = result
                .iter()
                .zip(reference)
                .fold(0.0f64, |m, (&a, &b)| m.max(f64::from(a - b).abs()))
                / scale;
            let vs_sum = result
                .iter()
                .zip(&sum)
                .map(|(&a, &s)| (f64::from(a) - s).powi(2))
                .sum::<f64>()
                .sqrt()
                / sum_norm;
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

    /// Every group's check so far, by group index.
    pub fn report(&self) -> Vec<GroupCheck> {
        self.groups.lock().expect("a checker lock").clone()
    }
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

/// Where a rank reports its compression inputs and aggregated results for `--check`: the
/// [`Checker`] itself in one process, a `check_report::Collector` for rank 0 in one of several.
pub trait CheckSink: Sync {
    /// Rank `rank`'s compression input of piece `piece` in `iteration`.
    fn input(&self, piece: usize, rank: u32, iteration: u32, input: &[f32]);
    /// Rank `rank`'s aggregated result of piece `piece` in `iteration`.
    fn result(&self, piece: usize, rank: u32, iteration: u32, result: &[f32]) -> Result<()>;
}

impl CheckSink for Checker {
    fn input(&self, piece: usize, rank: u32, iteration: u32, input: &[f32]) {
        Checker::input(self, piece, rank, iteration, input);
    }

    fn result(&self, piece: usize, rank: u32, iteration: u32, result: &[f32]) -> Result<()> {
        Checker::result(self, piece, rank, iteration, result)
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
