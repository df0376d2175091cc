//! A rank's `--check` data kept for rank 0 in a multi-process run, as bytes, and their replay.
//!
//! One process per rank cannot check centrally while it runs: each rank keeps its compression
//! inputs and aggregated results ([`Collector`]), sends them to rank 0 once the run ended (over
//! MPI, or the control plane of a CUDA launch), and rank 0 feeds every rank's into one
//! [`Checker`] ([`replay`]), which then checks as it does in one process.

use super::check::{CheckSink, Checker};
use crate::error::{ExecError, Result};
use std::sync::Mutex;

/// The most `--check` bytes one rank keeps for rank 0 (reports' headers and values).
pub const MAX_BYTES: usize = 1 << 30;
/// Bytes of one report's header: piece, iteration, kind and length, u32 each.
const HEADER: usize = 16;

/// One `--check` report of this rank, kept for rank 0.
struct Report {
    piece: u32,
    iteration: u32,
    result: bool,
    values: Vec<f32>,
}

/// Keeps this rank's `--check` inputs and results until the run ends.
#[derive(Default)]
pub struct Collector {
    reports: Mutex<Vec<Report>>,
    bytes: Mutex<usize>,
}

impl Collector {
    fn keep(&self, piece: usize, iteration: u32, result: bool, values: &[f32]) -> Result<()> {
        let mut total = self.bytes.lock().expect("a check lock");
        *total = total.saturating_add(HEADER + 4 * values.len());
        if *total > MAX_BYTES {
            return Err(ExecError::Check {
                group: 0,
                message: format!(
                    "--check keeps every input and result for rank 0: more than {MAX_BYTES} bytes; check fewer iterations"
                ),
            });
        }
        self.reports.lock().expect("a check lock").push(Report {
            piece: piece as u32,
            iteration,
            result,
            values: values.to_vec(),
        });
        Ok(())
    }

    /// The reports as bytes: per report piece, iteration, kind, length (u32 each), values.
    pub fn encode(self) -> Vec<u8> {
        let mut bytes = Vec::new();
        for r in self.reports.into_inner().expect("a check lock") {
            for word in [
                r.piece,
                r.iteration,
                u32::from(r.result),
                r.values.len() as u32,
            ] {
                bytes.extend(word.to_le_bytes());
            }
            bytes.extend(r.values.iter().flat_map(|v| v.to_le_bytes()));
        }
        bytes
    }
}

impl CheckSink for Collector {
    fn input(&self, piece: usize, _: u32, iteration: u32, input: &[f32]) {
        // Bounded by `keep`; an overflow shows when the result is reported.
        let _ = self.keep(piece, iteration, false, input);
    }

    fn result(&self, piece: usize, _: u32, iteration: u32, result: &[f32]) -> Result<()> {
        self.keep(piece, iteration, true, result)
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
        let (piece, iteration, result, len) = (
            word(&mut at)?,
            word(&mut at)?,
            word(&mut at)?,
            word(&mut at)?,
        );
        let end = at.checked_add(4 * len as usize).ok_or_else(bad)?;
        let values: Vec<f32> = bytes
            .get(at..end)
            .ok_or_else(bad)?
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().expect("four bytes")))
            .collect();
        at = end;
        if !checker.accepts(piece as usize, rank, values.len()) {
            return Err(bad());
        }
        match result {
            1 => checker.result(piece as usize, rank, iteration, &values)?,
            0 => checker.input(piece as usize, rank, iteration, &values),
            _ => return Err(bad()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::test_plans::{group, lowered};
    use syncopate_sim::compress::Memory;
    use syncopate_sim::plan::Scheme;
    use syncopate_sim::schedule::Schedule;

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
