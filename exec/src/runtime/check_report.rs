//! A rank's `--check` data kept for rank 0 in a multi-process run, as bytes, and their replay.
//!
//! One process per rank cannot check centrally while it runs: each rank keeps its compression
//! inputs and aggregated results, and the digests of a sharded plan's gathers ([`Collector`]),
//! sends them to rank 0 once the run ended (over MPI, or the control plane of a CUDA launch), and
//! rank 0 feeds every rank's into one [`Checker`] ([`replay`]), which then checks as it does in
//! one process.

use super::check::{CheckSink, Checker};
use super::gather_check::GatherDigests;
use crate::error::{ExecError, Result};
use std::sync::Mutex;

/// The most `--check` bytes one rank keeps for rank 0 (reports' headers and values).
pub const MAX_BYTES: usize = 1 << 30;
/// Bytes of one report's header: piece (or step), iteration, kind and length, u32 each.
const HEADER: usize = 16;

/// What a report holds, as its header's kind word says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// A piece's compression input, f32 values.
    Input = 0,
    /// A piece's aggregated result, f32 values.
    Result = 1,
    /// A gather step's digests (`GatherDigests`): the shard sent, the scales, then every shard held, u64
    /// each as two words, the low one first.
    Gathered = 2,
}

impl Kind {
    fn from_word(word: u32) -> Option<Kind> {
        [Kind::Input, Kind::Result, Kind::Gathered]
            .into_iter()
            .find(|k| *k as u32 == word)
    }
}

/// One `--check` report of this rank, kept for rank 0: of a piece, or of a gather step.
struct Report {
    index: u32,
    iteration: u32,
    kind: Kind,
    words: Vec<u32>,
}

/// Keeps this rank's `--check` inputs and results until the run ends.
#[derive(Default)]
pub struct Collector {
    reports: Mutex<Vec<Report>>,
    bytes: Mutex<usize>,
}

impl Collector {
    fn keep(&self, index: u32, iteration: u32, kind: Kind, words: Vec<u32>) -> Result<()> {
        let mut total = self.bytes.lock().expect("a check lock");
        *total = total.saturating_add(HEADER + 4 * words.len());
        if *total > MAX_BYTES {
            return Err(ExecError::Check {
                group: 0,
                message: format!(
                    "--check keeps every input and result for rank 0: more than {MAX_BYTES} bytes; check fewer iterations"
                ),
            });
        }
        self.reports.lock().expect("a check lock").push(Report {
            index,
            iteration,
            kind,
            words,
        });
        Ok(())
    }

    /// The reports as bytes: per report piece or step, iteration, kind, length in words, then
    /// the words (u32 each).
    pub fn encode(self) -> Vec<u8> {
        let mut bytes = Vec::new();
        for r in self.reports.into_inner().expect("a check lock") {
            let header = [r.index, r.iteration, r.kind as u32, r.words.len() as u32];
            bytes.extend(header.iter().chain(&r.words).flat_map(|w| w.to_le_bytes()));
        }
        bytes
    }
}

fn f32_words(values: &[f32]) -> Vec<u32> {
    values.iter().map(|v| v.to_bits()).collect()
}

impl CheckSink for Collector {
    fn input(&self, piece: usize, _: u32, iteration: u32, input: &[f32]) {
        // Bounded by `keep`; an overflow shows when the result is reported.
        let _ = self.keep(piece as u32, iteration, Kind::Input, f32_words(input));
    }

    fn result(&self, piece: usize, _: u32, iteration: u32, result: &[f32]) -> Result<()> {
        self.keep(piece as u32, iteration, Kind::Result, f32_words(result))
    }

    fn gathered(&self, step: u32, _: u32, iteration: u32, digests: &GatherDigests) -> Result<()> {
        let words = [digests.sent, digests.scales]
            .iter()
            .chain(&digests.held)
            .flat_map(|&d| [d as u32, (d >> 32) as u32])
            .collect();
        self.keep(step, iteration, Kind::Gathered, words)
    }
}

/// Feeds reports decoded from `bytes` (rank `rank`'s) into the checker; malformed bytes are an
/// error naming the rank.
pub fn replay(checker: &Checker, rank: u32, bytes: &[u8]) -> Result<()> {
    let bad = || ExecError::Rank {
        rank,
        message: "sent malformed --check data".into(),
    };
    let mut at = 0;
    let word = |at: &mut usize| -> Result<u32> {
        let b = bytes.get(*at..*at + 4).ok_or_else(bad)?;
        *at += 4;
        Ok(u32::from_le_bytes(b.try_into().expect("four bytes")))
    };
    while at < bytes.len() {
        let (index, iteration, kind, len) = (
            word(&mut at)?,
            word(&mut at)?,
            word(&mut at)?,
            word(&mut at)?,
        );
        let end = (4 * len as usize)
            .checked_add(at)
            .filter(|&end| end <= bytes.len())
            .ok_or_else(bad)?;
        let words: Vec<u32> = bytes[at..end]
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().expect("four bytes")))
            .collect();
        at = end;
        let piece = index as usize;
        let values = || {
            words
                .iter()
                .map(|&w| f32::from_bits(w))
                .collect::<Vec<f32>>()
        };
        let digests = || {
            let mut d = words
                .chunks_exact(2)
                .map(|p| u64::from(p[0]) | u64::from(p[1]) << 32);
            let (sent, scales) = (d.next()?, d.next()?);
            Some(GatherDigests {
                sent,
                scales,
                held: d.collect(),
            })
        };
        match Kind::from_word(kind) {
            Some(Kind::Input) if checker.accepts(piece, rank, words.len()) => {
                checker.input(piece, rank, iteration, &values())
            }
            Some(Kind::Result) if checker.accepts(piece, rank, words.len()) => {
                checker.result(piece, rank, iteration, &values())?
            }
            Some(Kind::Gathered) => match digests() {
                Some(d)
                    if words.len().is_multiple_of(2)
                        && checker.accepts_gather(index, rank, d.held.len()) =>
                {
                    checker.gathered(index, rank, iteration, &d)?
                }
                _ => return Err(bad()),
            },
            _ => return Err(bad()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::test_plans::{first_gather, group, lowered, small_sharded};
    use syncopate_sim::compress::Memory;
    use syncopate_sim::plan::Scheme;
    use syncopate_sim::schedule::Schedule;
    use syncopate_sim::sharding::ParamDtype;

    /// ResNet-50's first tensor in one fp16 group and the rest in another, on two ranks.
    fn schedule() -> Schedule {
        let fp16 = |tensors| group(tensors, "fp16", Memory::None, Scheme::Allreduce, 1);
        lowered(vec![fp16(vec![0]), fp16((1..161).collect())], 2)
    }

    /// Each rank's input of piece 0, and the sum every rank got.
    fn values(schedule: &Schedule) -> (Vec<Vec<f32>>, Vec<f32>) {
        let n = schedule.pieces[0].numel as usize;
        let inputs: Vec<Vec<f32>> = (0..2)
            .map(|r| (0..n).map(|i| (i % 7) as f32 * 0.25 + r as f32).collect())
            .collect();
        let sum = (0..n).map(|i| inputs[0][i] + inputs[1][i]).collect();
        (inputs, sum)
    }

    #[test]
    fn replayed_reports_check_as_reports_made_in_one_process() {
        let schedule = schedule();
        let (inputs, sum) = values(&schedule);
        let direct = Checker::new(&schedule, 1);
        let collected: Vec<Collector> = (0..2).map(|_| Collector::default()).collect();
        for (rank, input) in inputs.iter().enumerate() {
            let sinks: [&dyn CheckSink; 2] = [&direct, &collected[rank]];
            for sink in sinks {
                sink.input(0, rank as u32, 3, input);
            }
        }
        for (rank, collector) in collected.iter().enumerate() {
            direct.result(0, rank as u32, 3, &sum).unwrap();
            collector.result(0, rank as u32, 3, &sum).unwrap();
        }
        let replayed = Checker::new(&schedule, 1);
        for (rank, collector) in collected.into_iter().enumerate() {
            replay(&replayed, rank as u32, &collector.encode()).unwrap();
        }
        let (a, b) = (direct.report(), replayed.report());
        assert_eq!(a[0].checked, 1);
        assert!(a[0].ok);
        assert_eq!(
            serde_json::to_string(&a).unwrap(),
            serde_json::to_string(&b).unwrap()
        );
    }

    #[test]
    fn gather_reports_replay_into_the_same_check() {
        let schedule = small_sharded("zero2", "none", ParamDtype::Fp32, (1, 3));
        let (step, group) = first_gather(&schedule);
        // Digests with both halves set: rank r sent shard (r + 1) mod 3.
        let digest = |r: u64| (r + 1) << 40 | (r + 7);
        let held: Vec<u64> = [2, 0, 1].map(digest).to_vec();
        let collected: Vec<Collector> = (0..3).map(|_| Collector::default()).collect();
        for (rank, collector) in collected.iter().enumerate() {
            let sent = digest(rank as u64);
            let digests = GatherDigests {
                sent,
                scales: digest(9),
                held: held.clone(),
            };
            collector.gathered(step, rank as u32, 2, &digests).unwrap();
        }
        let checker = Checker::new(&schedule, 1);
        for (rank, collector) in collected.into_iter().enumerate() {
            replay(&checker, rank as u32, &collector.encode()).unwrap();
        }
        assert_eq!(checker.report()[group].gathers_checked, 1);
        // A report of two shards of three is refused.
        let collector = Collector::default();
        let two = GatherDigests {
            sent: 1,
            scales: 0,
            held: vec![1, 2],
        };
        collector.gathered(step, 1, 0, &two).unwrap();
        let err = replay(&Checker::new(&schedule, 1), 1, &collector.encode()).unwrap_err();
        assert!(err.to_string().contains("malformed"), "{err}");
    }

    #[test]
    fn malformed_reports_are_refused_naming_the_rank() {
        let schedule = schedule();
        let (inputs, _) = values(&schedule);
        let collector = Collector::default();
        collector.input(0, 1, 0, &inputs[1]);
        let good = collector.encode();
        let mut unknown_piece = good.clone();
        unknown_piece[0..4].copy_from_slice(&99u32.to_le_bytes());
        let mut wrong_length = good.clone();
        wrong_length[12..16].copy_from_slice(&1u32.to_le_bytes());
        wrong_length.truncate(20);
        let mut bad_kind = good.clone();
        bad_kind[8..12].copy_from_slice(&7u32.to_le_bytes());
        let cases = [
            ("truncated", good[..good.len() - 3].to_vec()),
            ("unknown piece", unknown_piece),
            ("wrong length", wrong_length),
            ("bad kind", bad_kind),
        ];
        for (what, bytes) in cases {
            let checker = Checker::new(&schedule, 1);
            let err = replay(&checker, 1, &bytes).unwrap_err().to_string();
            assert!(
                err.contains("rank 1") && err.contains("malformed"),
                "{what}: {err}"
            );
        }
        // A rank outside the world is refused too.
        let checker = Checker::new(&schedule, 1);
        assert!(replay(&checker, 2, &good).is_err());
    }
}
