//! One rank's codec state of every piece of a schedule, driven op by op from Python.
//!
//! The transports are torch.distributed's.

use crate::{exec_error, sim_error, views, SyncopateError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::sync::{Mutex, MutexGuard};
use syncopate_exec::runtime::piece_state::PieceState;
use syncopate_exec::runtime::pieces;
use syncopate_exec::runtime::ring::Half;
use syncopate_sim::compress::{Compressor, Element, Memory};
use syncopate_sim::schedule::{Piece, Schedule};

/// A rank's codecs, memories and payloads, one per piece of the schedule.
#[pyclass(module = "syncopate._syncopate")]
pub struct Rank {
    /// The schedule as it runs this epoch: DGC's warm-up changes its pieces' ratios.
    schedule: Schedule,
    /// Each piece's compressor as lowered (the target of DGC's warm-up).
    lowered: Vec<Compressor>,
    rank: u32,
    world: u32,
    seed: u64,
    /// Locked per call: pyo3 classes must be shareable between threads.
    pieces: Vec<Mutex<PieceState>>,
}

/// Parses and checks a schedule handed over as JSON.
pub fn parse_schedule(json: &str) -> PyResult<Schedule> {
    let schedule: Schedule = serde_json::from_str(json)
        .map_err(|err| SyncopateError::new_err(format!("schedule: {err}")))?;
    schedule.validate("schedule").map_err(sim_error)?;
    syncopate_exec::runtime::refuse_unrunnable(&schedule).map_err(crate::exec_error)?;
    Ok(schedule)
}

impl Rank {
    fn spec(&self, index: usize) -> PyResult<&Piece> {
        Ok(self.piece(index)?.0)
    }

    fn piece(&self, index: usize) -> PyResult<(&Piece, MutexGuard<'_, PieceState>)> {
        match (self.schedule.pieces.get(index), self.pieces.get(index)) {
            (Some(spec), Some(state)) => Ok((spec, state.lock().expect("a piece lock"))),
            _ => Err(SyncopateError::new_err(format!(
                "piece {index} does not exist (the schedule has {})",
                self.pieces.len()
            ))),
        }
    }
}

#[pymethods]
impl Rank {
    /// Rank `rank`'s state of `schedule` (JSON), its codecs drawing from `seed` as `exec`'s do.
    #[new]
    fn new(schedule: &str, rank: u32, seed: u64) -> PyResult<Rank> {
        let schedule = parse_schedule(schedule)?;
        let world = schedule.world.ranks();
        if rank >= world {
            return Err(SyncopateError::new_err(format!(
                "rank {rank} is not below the schedule's {world} ranks"
            )));
        }
        let pieces = (0..schedule.pieces.len())
            .map(|i| Mutex::new(PieceState::new(&schedule, seed, i, rank)))
            .collect();
        let lowered = schedule.pieces.iter().map(|p| p.compressor).collect();
        Ok(Rank {
            schedule,
            lowered,
            rank,
            world,
            seed,
            pieces,
        })
    }

    /// Enters training epoch `epoch` (from 0): a piece with DGC's memory sparsifies at its
    /// warm-up ratio for that epoch (`Memory::compression_ratio`: 0.25, 0.063, 0.015, 0.004,
    /// 0.001 stretched over the warm-up epochs, never below the plan's ratio), the plan's ratio
    /// after the warm-up. A piece whose ratio changes gets fresh codecs (same seeds). Returns the
    /// pieces that changed. Without a call the plan's ratios hold from the start.
    fn set_epoch(&mut self, epoch: u32) -> Vec<usize> {
        let changes = epoch_changes(&self.schedule, &self.lowered, epoch);
        for &(index, compressor) in &changes {
            self.schedule.pieces[index].compressor = compressor;
            let state = self.pieces[index].get_mut().expect("a piece lock");
            state.codec = pieces::codec(&self.schedule, self.seed, index, Some(self.rank));
            state.server_codec = pieces::codec(&self.schedule, self.seed, index, None);
        }
        changes.into_iter().map(|(index, _)| index).collect()
    }

    /// Whether the codecs run on a device (`DeviceRank`): these run on the CPU.
    #[getter]
    fn on_device(&self) -> bool {
        false
    }

    /// The schedule as it runs now (JSON): the lowered one with this epoch's warm-up ratios.
    fn schedule_json(&self) -> PyResult<String> {
        serde_json::to_string(&self.schedule)
            .map_err(|err| SyncopateError::new_err(format!("schedule: {err}")))
    }

    /// The element type a summable payload is reduced in (`f32`, `f16`, `bf16`), or `None`
    /// for payloads that are gathered or pushed whole.
    fn wire_dtype(&self, piece: usize) -> PyResult<Option<&'static str>> {
        Ok(wire_dtype_name(&self.spec(piece)?.compressor))
    }

    /// The seed of this rank's codec for the piece (what `encode_reference` takes to agree).
    fn codec_seed(&self, piece: usize) -> PyResult<u64> {
        self.spec(piece)?;
        Ok(pieces::codec_seed(
            &self.schedule,
            self.seed,
            piece,
            Some(self.rank),
        ))
    }

    /// The rank that aggregates a push-pull piece.
    fn server_rank(&self, piece: usize) -> PyResult<u32> {
        Ok(pieces::server_rank(self.spec(piece)?, self.world))
    }

    /// Reads the piece from its group's buffer (float32, in place) and adds the error feedback.
    fn compensate(&self, piece: usize, group_buffer: &Bound<'_, PyAny>) -> PyResult<()> {
        let (spec, mut state) = self.piece(piece)?;
        views::read(group_buffer, "group buffer", |b: &[f32]| {
            covers(b, spec, piece, "group buffer")?;
            state.compensate(spec, b).map_err(exec_error)
        })?
    }

    /// Whether the piece's elements of its group buffer are finite (the identity codec's
    /// exchange skips compensate and encode, whose check this is); the error names the element.
    fn check_finite(&self, piece: usize, group_buffer: &Bound<'_, PyAny>) -> PyResult<()> {
        let spec = self.spec(piece)?;
        views::read(group_buffer, "group buffer", |b: &[f32]| {
            covers(b, spec, piece, "group buffer")?;
            syncopate_exec::compress::check_finite(&b[pieces::range(spec)]).map_err(exec_error)
        })?
    }

    /// Encodes the compression input into the payload; returns the payload's length in bytes.
    /// With `out` (bytes, exactly the payload's length: the exchange's buffer) the payload is
    /// written there instead, and with `group_buffer` (float32) the piece's elements in it are
    /// the input (a piece without memory, where compensating would only copy them).
    #[pyo3(signature = (piece, out=None, group_buffer=None))]
    fn encode(
        &self,
        piece: usize,
        out: Option<&Bound<'_, PyAny>>,
        group_buffer: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<usize> {
        let (spec, mut state) = self.piece(piece)?;
        match (out, group_buffer) {
            (None, None) => {
                state.encode(spec).map_err(exec_error)?;
                Ok(state.payload.len())
            }
            (Some(out), None) => views::write(out, "payload buffer", |o: &mut [u8]| {
                state.encode_into(spec, None, o).map_err(exec_error)?;
                Ok(o.len())
            })?,
            (Some(out), Some(group)) => views::read_write(
                group,
                "group buffer",
                out,
                "payload buffer",
                |b: &[f32], o: &mut [u8]| {
                    covers(b, spec, piece, "group buffer")?;
                    state.encode_into(spec, Some(b), o).map_err(exec_error)?;
                    Ok(o.len())
                },
            )?,
            (None, Some(_)) => Err(SyncopateError::new_err(format!(
                "piece {piece}: encoding from the group buffer needs an out buffer"
            ))),
        }
    }

    /// The next round's payload from the reduced one in place; returns its length.
    fn next_round(&self, piece: usize) -> PyResult<usize> {
        let (_, mut state) = self.piece(piece)?;
        state.next_round().map_err(exec_error)?;
        Ok(state.payload.len())
    }

    /// Copies the payload into `out` (bytes, exactly its length).
    fn copy_payload(&self, piece: usize, out: &Bound<'_, PyAny>) -> PyResult<()> {
        let (_, state) = self.piece(piece)?;
        views::write(out, "payload buffer", |o: &mut [u8]| {
            if o.len() == state.payload.len() {
                o.copy_from_slice(&state.payload);
                Ok(())
            } else {
                Err(SyncopateError::new_err(format!(
                    "piece {piece}: a payload of {} bytes does not fit a buffer of {}",
                    state.payload.len(),
                    o.len()
                )))
            }
        })?
    }

    /// The payload the exchange delivered (a reduced or pulled one), copied into the payload's
    /// own allocation (a fresh one of tens of MB costs its page faults every step).
    fn set_payload(&self, piece: usize, data: &Bound<'_, PyAny>) -> PyResult<()> {
        let (_, mut state) = self.piece(piece)?;
        views::read(data, "payload", |d: &[u8]| {
            state.payload.clear();
            state.payload.extend_from_slice(d);
        })
    }

    /// What step `step` of the piece's CaSync-Ring half `phase` ("hop": decode, add and
    /// re-encode; "pass": the summed shards) sends to the next rank on the ring.
    fn ring_outgoing<'py>(
        &self,
        py: Python<'py>,
        piece: usize,
        phase: &str,
        step: usize,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let phase = ring_phase(phase)?;
        let (spec, state) = self.piece(piece)?;
        let out = state.ring_outgoing(spec, phase, step).map_err(exec_error)?;
        Ok(PyBytes::new(py, out))
    }

    /// Takes what step `step` of the ring's half `phase` received from the previous rank
    /// (bytes).
    fn ring_take(
        &self,
        piece: usize,
        phase: &str,
        step: usize,
        incoming: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let phase = ring_phase(phase)?;
        let (spec, mut state) = self.piece(piece)?;
        views::read(incoming, "ring message", |d: &[u8]| {
            state.ring_take(spec, phase, step, d).map_err(exec_error)
        })?
    }

    /// Every rank's payload of an allgather, in rank order.
    fn set_gathered(&self, piece: usize, payloads: Vec<Bound<'_, PyAny>>) -> PyResult<()> {
        let gathered = payloads
            .iter()
            .map(|p| views::read(p, "gathered payload", <[u8]>::to_vec))
            .collect::<PyResult<Vec<_>>>()?;
        let (_, mut state) = self.piece(piece)?;
        state.gathered = gathered;
        Ok(())
    }

    /// The parameter server's aggregation of the pushed payloads (rank order) into the payload
    /// every rank pulls; returns its length.
    fn serve(&self, piece: usize, pushed: Vec<Bound<'_, PyAny>>) -> PyResult<usize> {
        let copies = pushed
            .iter()
            .map(|p| views::read(p, "pushed payload", <[u8]>::to_vec))
            .collect::<PyResult<Vec<_>>>()?;
        let (spec, mut state) = self.piece(piece)?;
        let slices: Vec<&[u8]> = copies.iter().map(Vec::as_slice).collect();
        state.serve(spec, &slices).map_err(exec_error)?;
        Ok(state.payload.len())
    }

    /// Decodes what the exchanges delivered into the result: the payload, or `delivered` (bytes:
    /// the exchange's buffer of a summed or pulled payload) read where it arrived. With `out`
    /// (float32, the group's result buffer) a delivered payload is decoded straight into the
    /// piece's elements there instead (pieces without memory: nothing else reads the result).
    #[pyo3(signature = (piece, delivered=None, out=None))]
    fn decode(
        &self,
        piece: usize,
        delivered: Option<&Bound<'_, PyAny>>,
        out: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let (spec, mut state) = self.piece(piece)?;
        match (delivered, out) {
            (None, None) => state.decode(spec, None).map_err(exec_error),
            (Some(delivered), None) => {
                views::read(delivered, "delivered payload", |d: &[u8]| {
                    state.decode(spec, Some(d)).map_err(exec_error)
                })?
            }
            (Some(delivered), Some(out)) => views::read_write(
                delivered,
                "delivered payload",
                out,
                "result buffer",
                |d: &[u8], o: &mut [f32]| {
                    covers(o, spec, piece, "result buffer")?;
                    state
                        .decode_into(spec, d, &mut o[pieces::range(spec)])
                        .map_err(exec_error)
                },
            )?,
            (None, Some(_)) => Err(SyncopateError::new_err(format!(
                "piece {piece}: decoding into the result buffer needs the delivered payload"
            ))),
        }
    }

    fn update_memory(&self, piece: usize) -> PyResult<()> {
        let world = self.world;
        let (spec, mut state) = self.piece(piece)?;
        state.update_memory(spec, world).map_err(exec_error)
    }

    fn scale_output(&self, piece: usize) -> PyResult<()> {
        self.piece(piece)?.1.scale_output();
        Ok(())
    }

    /// Writes the result times `scale` into the piece's elements of `group_buffer` (float32).
    fn write_result(
        &self,
        piece: usize,
        group_buffer: &Bound<'_, PyAny>,
        scale: f32,
    ) -> PyResult<()> {
        let (spec, state) = self.piece(piece)?;
        views::write(group_buffer, "result buffer", |b: &mut [f32]| {
            covers(b, spec, piece, "result buffer")?;
            for (o, &r) in b[pieces::range(spec)].iter_mut().zip(state.result()) {
                *o = r * scale;
            }
            Ok(())
        })?
    }

    /// Copies the compression input of the last step into `out` (float32, the piece's length).
    fn copy_compensated(&self, piece: usize, out: &Bound<'_, PyAny>) -> PyResult<()> {
        let (_, state) = self.piece(piece)?;
        copy_floats(state.compensated(), out, piece)
    }

    /// Copies the last decoded result into `out` (float32, the piece's length).
    fn copy_result(&self, piece: usize, out: &Bound<'_, PyAny>) -> PyResult<()> {
        let (_, state) = self.piece(piece)?;
        copy_floats(state.result(), out, piece)
    }
}

/// Whether `buffer` (a group's) reaches the piece's end.
fn covers<T>(buffer: &[T], spec: &Piece, piece: usize, what: &str) -> PyResult<()> {
    if pieces::range(spec).end <= buffer.len() {
        Ok(())
    } else {
        Err(SyncopateError::new_err(format!(
            "piece {piece}: the {what} is shorter than the piece's end"
        )))
    }
}

/// The element type a compressor's summable payload is reduced in, by its Python name.
pub(crate) fn wire_dtype_name(compressor: &Compressor) -> Option<&'static str> {
    compressor.summed_as().map(|element| match element {
        Element::F32 => "f32",
        Element::F16 => "f16",
        Element::Bf16 => "bf16",
    })
}

/// The pieces of `schedule` whose compressor changes in `epoch`, each with the one it runs then
/// (`lowered`: each piece's compressor as lowered).
pub(crate) fn epoch_changes(
    schedule: &Schedule,
    lowered: &[Compressor],
    epoch: u32,
) -> Vec<(usize, Compressor)> {
    schedule
        .pieces
        .iter()
        .zip(lowered)
        .enumerate()
        .filter_map(|(index, (piece, &lowered))| {
            let compressor = warmed_up(lowered, piece.memory, epoch);
            (compressor != piece.compressor).then_some((index, compressor))
        })
        .collect()
}

/// The compressor a piece runs in `epoch`: DGC's warm-up ratio for the sparsifiers (whose
/// ratio is k/n), the lowered compressor for every other piece or memory.
fn warmed_up(lowered: Compressor, memory: Memory, epoch: u32) -> Compressor {
    lowered
        .kept_fraction()
        .and_then(|ratio| lowered.with_kept_fraction(memory.compression_ratio(epoch, ratio)))
        .unwrap_or(lowered)
}

fn copy_floats(values: &[f32], out: &Bound<'_, PyAny>, piece: usize) -> PyResult<()> {
    views::write(out, "float buffer", |o: &mut [f32]| {
        if o.len() == values.len() {
            o.copy_from_slice(values);
            Ok(())
        } else {
            Err(SyncopateError::new_err(format!(
                "piece {piece}: {} values do not fit a buffer of {}",
                values.len(),
                o.len()
            )))
        }
    })?
}

/// A CaSync-Ring half by its Python name: `hop` the reduce-scatter (decode, add, re-encode),
/// `pass` the all-gather of the summed shards.
fn ring_phase(name: &str) -> PyResult<Half> {
    match name {
        "hop" => Ok(Half::ReduceScatter),
        "pass" => Ok(Half::AllGather),
        other => Err(SyncopateError::new_err(format!(
            "a ring phase is `hop` or `pass`, not `{other}`"
        ))),
    }
}
