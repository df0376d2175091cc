//! One rank's codec state on a CUDA device, driven op by op from Python on PyTorch's tensors and streams.
//!
//! Each op takes the tensors it reads or writes and the raw handle of the CUDA stream it is
//! enqueued on (`torch.cuda.current_stream().cuda_stream`); the kernels are exec's, the same
//! the CUDA backend runs, so the payloads are byte-identical to the CPU codecs'.

use crate::rank::{epoch_changes, parse_schedule, wire_dtype_name};
use crate::{exec_error, SyncopateError};
use pyo3::prelude::*;
use std::path::PathBuf;
use syncopate_exec::runtime::cuda::foreign::{self, ForeignRank, Region};
use syncopate_exec::runtime::cuda::probe;
use syncopate_sim::compress::Compressor;

/// A rank's device codecs and memories, one per piece with codec work.
#[pyclass(module = "syncopate._syncopate")]
pub struct DeviceRank {
    /// Its schedule is the one running this epoch.
    state: ForeignRank,
    /// Each piece's compressor as lowered.
    lowered: Vec<Compressor>,
    rank: u32,
    seed: u64,
    device: i64,
}

/// Why syncopate.torch cannot run the schedule (JSON) on a CUDA device, or None when it can.
#[pyfunction]
pub fn device_refusal(schedule: &str) -> PyResult<Option<String>> {
    Ok(foreign::refusal(&parse_schedule(schedule)?))
}

impl DeviceRank {
    /// The tensor as a region of `dtype` elements on this rank's device.
    fn region(&self, tensor: &Bound<'_, PyAny>, dtype: &str, what: &str) -> PyResult<Region> {
        let device = tensor.getattr("device")?;
        let on = device.getattr("type")?.extract::<String>()? == "cuda"
            && device.getattr("index")?.extract::<Option<i64>>()? == Some(self.device);
        if !on {
            return Err(SyncopateError::new_err(format!(
                "{what}: on {}, not on cuda:{}",
                device.str()?,
                self.device
            )));
        }
        let have = tensor.getattr("dtype")?.str()?.to_string();
        if have != format!("torch.{dtype}") {
            return Err(SyncopateError::new_err(format!(
                "{what}: a {have} tensor, not torch.{dtype}"
            )));
        }
        if !tensor.call_method0("is_contiguous")?.extract::<bool>()? {
            return Err(SyncopateError::new_err(format!("{what}: not contiguous")));
        }
        Ok(Region {
            address: tensor.call_method0("data_ptr")?.extract()?,
            len: tensor.call_method0("numel")?.extract()?,
        })
    }
}

// SAFETY (every `unsafe` block below): the regions are live tensors on this rank's device,
// checked by `region`; syncopate.torch keeps them alive while their ops run (its `Buffers`
// keep every exchange's tensor for the run, the group buffers live as long as the optimizer)
// and orders every other use of them with the stream it passes, a live stream of the device
// (`torch.cuda.current_stream`).
#[pymethods]
impl DeviceRank {
    /// Rank `rank`'s device state of `schedule` (JSON) on `cuda:device`, seeded as `exec`'s
    /// codecs are. `sites` are the interpreter's site-packages, where pip's NVRTC is looked for
    /// when the loader does not find it.
    #[new]
    fn new(
        schedule: &str,
        rank: u32,
        seed: u64,
        device: i64,
        sites: Vec<PathBuf>,
    ) -> PyResult<DeviceRank> {
        let parsed = parse_schedule(schedule)?;
        let ordinal = usize::try_from(device)
            .map_err(|_| SyncopateError::new_err(format!("device {device}: not a CUDA ordinal")))?;
        probe::probe_in_process(&sites).map_err(exec_error)?;
        let state = ForeignRank::new(&parsed, seed, rank, ordinal).map_err(exec_error)?;
        Ok(DeviceRank {
            state,
            lowered: parsed.pieces.iter().map(|p| p.compressor).collect(),
            rank,
            seed,
            device,
        })
    }

    /// Whether the codecs run on a device: these do.
    #[getter]
    fn on_device(&self) -> bool {
        true
    }

    /// As `Rank.set_epoch`: DGC's warm-up ratio of `epoch`; the pieces whose codec changed.
    fn set_epoch(&mut self, epoch: u32) -> PyResult<Vec<usize>> {
        let changes = epoch_changes(self.state.schedule(), &self.lowered, epoch);
        for &(index, compressor) in &changes {
            self.state
                .set_compressor(index, compressor, self.seed, self.rank)
                .map_err(exec_error)?;
        }
        Ok(changes.into_iter().map(|(index, _)| index).collect())
    }

    /// The schedule as it runs now (JSON).
    fn schedule_json(&self) -> PyResult<String> {
        serde_json::to_string(self.state.schedule())
            .map_err(|err| SyncopateError::new_err(format!("schedule: {err}")))
    }

    /// As `Rank.wire_dtype`.
    fn wire_dtype(&self, piece: usize) -> PyResult<Option<&'static str>> {
        let spec = self
            .state
            .schedule()
            .pieces
            .get(piece)
            .ok_or_else(|| SyncopateError::new_err(format!("piece {piece} does not exist")))?;
        Ok(wire_dtype_name(&spec.compressor))
    }

    /// Bytes of the payload buffer the piece's encode writes.
    fn wire_bytes(&self, piece: usize) -> PyResult<usize> {
        self.state.wire_bytes(piece).map_err(exec_error)
    }

    /// Enqueues the compression input from the piece's elements of `group_buffer` (float32).
    fn compensate(
        &self,
        piece: usize,
        group_buffer: &Bound<'_, PyAny>,
        stream: u64,
    ) -> PyResult<()> {
        let group = self.region(group_buffer, "float32", "group buffer")?;
        // SAFETY: see above the impl.
        unsafe { self.state.compensate(piece, stream, group) }.map_err(exec_error)
    }

    /// Enqueues the encode into `out` (uint8, at least the wire bytes); returns the first
    /// round's length in bytes.
    fn encode(&self, piece: usize, out: &Bound<'_, PyAny>, stream: u64) -> PyResult<usize> {
        let out = self.region(out, "uint8", "payload buffer")?;
        // SAFETY: see above the impl.
        unsafe { self.state.encode(piece, stream, out) }.map_err(exec_error)
    }

    /// Enqueues the next round's payload from the last round's reduced one in `payload` (the
    /// encode's buffer), in place; returns its length in bytes.
    fn next_round(&self, piece: usize, payload: &Bound<'_, PyAny>, stream: u64) -> PyResult<usize> {
        let payload = self.region(payload, "uint8", "payload buffer")?;
        // SAFETY: see above the impl.
        unsafe { self.state.next_round(piece, stream, payload) }.map_err(exec_error)
    }

    /// Enqueues the decoded sum of the `blocks` equal payloads in `delivered` (uint8).
    fn decode(
        &self,
        piece: usize,
        delivered: &Bound<'_, PyAny>,
        blocks: usize,
        stream: u64,
    ) -> PyResult<()> {
        let delivered = self.region(delivered, "uint8", "delivered payload")?;
        // SAFETY: see above the impl.
        unsafe { self.state.decode(piece, stream, delivered, blocks) }.map_err(exec_error)
    }

    fn update_memory(&self, piece: usize, stream: u64) -> PyResult<()> {
        // SAFETY: see above the impl.
        unsafe { self.state.update_memory(piece, stream) }.map_err(exec_error)
    }

    fn scale_output(&self, piece: usize, stream: u64) -> PyResult<()> {
        // SAFETY: see above the impl.
        unsafe { self.state.scale_output(piece, stream) }.map_err(exec_error)
    }

    /// Enqueues the result times `scale` into the piece's elements of `group_buffer` (float32).
    fn write_result(
        &self,
        piece: usize,
        group_buffer: &Bound<'_, PyAny>,
        scale: f32,
        stream: u64,
    ) -> PyResult<()> {
        let group = self.region(group_buffer, "float32", "result buffer")?;
        // SAFETY: see above the impl.
        unsafe { self.state.write_result(piece, stream, group, scale) }.map_err(exec_error)
    }

    /// Enqueues a copy of the last compression input (`result` false) or decoded sum (true)
    /// into `out` (float32, the piece's length).
    fn copy_values(
        &self,
        piece: usize,
        out: &Bound<'_, PyAny>,
        result: bool,
        stream: u64,
    ) -> PyResult<()> {
        let out = self.region(out, "float32", "values buffer")?;
        // SAFETY: see above the impl.
        unsafe { self.state.copy_values(piece, stream, out, result) }.map_err(exec_error)
    }

    /// Raises NonFiniteError naming the first non-finite element of the piece's last
    /// compression input, if any; synchronizes `stream`.
    fn check_finite(&self, piece: usize, stream: u64) -> PyResult<()> {
        // SAFETY: see above the impl.
        unsafe { self.state.check_finite(piece, stream) }.map_err(exec_error)
    }
}
