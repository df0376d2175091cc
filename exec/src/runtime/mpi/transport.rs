//! One communication stream over MPI, with the in-process mesh's API (`host::comm::Mesh`).
//!
//! It offers allreduce in the wire type, the steps of `runtime::ring`'s rings, variable-size
//! allgather, the messages of `runtime::push_pull` and broadcast — each a non-blocking MPI
//! operation completed under the stream's timeout and the run's abort flag.
//!
//! Summation order. For two ranks every element is one addition of two values, which is
//! commutative, so results are bit-identical to the host backend's ring. For p ≥ 3, Open MPI
//! picks its own algorithm (recursive doubling, ring, Rabenseifner) and so its own order of the
//! p − 1 additions of each element: with rounding after each addition (always for fp16/bf16,
//! and in f32) results may differ from the ring's by up to (p − 1) rounding errors of the
//! partial sums, i.e. |mpi − ring| ≤ 2(p − 1)·u·Σ|xᵢ| with u the wire type's unit roundoff
//! (2⁻²⁴ f32, 2⁻¹¹ fp16, 2⁻⁸ bf16). Values whose partial sums are all exact (small integers)
//! agree bit for bit in any order.

use super::nonblocking::{self, Comm, InFlight, Stop};
use super::wire::{HalfSums, WireType};
use super::world::World;
use crate::compress::Codec;
use crate::error::{ExecError, Result};
use crate::runtime::push_pull::{Leg, Messages};
use crate::runtime::ring::RingLink;
use mpi::collective::SystemOperation;
use mpi::datatype::Equivalence;
use mpi::raw::AsRaw;
use mpi::topology::{Communicator, SimpleCommunicator};
use std::cell::RefCell;
use std::marker::PhantomData;
use std::os::raw::c_int;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

/// Tags of the point-to-point messages (each stream has its own communicator, so they only
/// need to tell a message's role).
const TAG_PUSH_SIZE: c_int = 1;
const TAG_PUSH: c_int = 2;
const TAG_PULL_SIZE: c_int = 3;
const TAG_PULL: c_int = 4;
/// Tag of the ring steps' chunks.
const TAG_RING: c_int = 8;
/// Tags of the control messages (launch decisions, and the records gathered after a run).
const TAG_WORD: c_int = 5;
const TAG_DATA_SIZE: c_int = 6;
const TAG_DATA: c_int = 7;

/// A summing operation on payload bytes with a given MPI reduction.
type Summing<'w> = fn(&Stream<'w>, &mut Vec<u8>, mpi::ffi::MPI_Op, &AtomicBool) -> Result<()>;

/// One rank's end of one stream.
pub struct Stream<'w> {
    comm: SimpleCommunicator,
    /// The communication stream's index in the schedule.
    pub index: u32,
    /// This process's rank.
    pub rank: u32,
    /// Ranks in the run.
    pub world: u32,
    /// How long a collective may take before the run fails instead of hanging.
    pub timeout: Duration,
    halves: HalfSums,
    /// The receive buffer of this stream's allreduces and ring steps, kept from one to the
    /// next at the largest payload's size: a fresh 32 MiB buffer cost this machine about
    /// 13 ms of page faults when MPI first wrote into it.
    received: RefCell<Vec<u8>>,
    /// The send buffer of this stream's ring steps, kept for the same reason.
    sending: RefCell<Vec<u8>>,
    _world: PhantomData<&'w World>,
}

// SAFETY: MPI is initialized with MPI_THREAD_MULTIPLE (World::init refuses anything less),
// under which MPI handles may be used from any thread. A Stream is not Sync: one thread at a
// time uses it, which also keeps one stream's operations in one order on every rank.
unsafe impl Send for Stream<'_> {}

impl<'w> Stream<'w> {
    pub(super) fn new(
        world: &'w World,
        comm: SimpleCommunicator,
        index: u32,
        timeout: Duration,
    ) -> Result<Stream<'w>> {
        nonblocking::errors_return(comm.as_raw()).map_err(|message| ExecError::Mpi {
            rank: world.rank,
            operation: format!("MPI_Comm_set_errhandler (stream {index})"),
            message,
        })?;
        Ok(Stream {
            index,
            rank: comm.rank() as u32,
            world: comm.size() as u32,
            comm,
            timeout,
            halves: HalfSums::new(),
            received: RefCell::default(),
            sending: RefCell::default(),
            _world: PhantomData,
        })
    }

    fn raw(&self) -> Comm {
        Comm {
            raw: self.comm.as_raw(),
            size: self.world as usize,
        }
    }

    /// Completes `flight`, or fails naming this rank, the operation, the stream, and `peer`
    /// when one peer is awaited.
    fn finish<B>(
        &self,
        flight: std::result::Result<InFlight<B>, String>,
        what: &str,
        peer: Option<usize>,
        abort: &AtomicBool,
    ) -> Result<B> {
        let flight = flight.map_err(|message| self.error(what, message))?;
        let deadline = Instant::now() + self.timeout;
        flight.complete(deadline, abort).map_err(|stop| match stop {
            Stop::Deadline => match peer {
                Some(peer) => ExecError::Timeout {
                    rank: peer as u32,
                    waiting: self.rank,
                    what: format!("{what} on MPI stream {}", self.index),
                    seconds: self.timeout.as_secs_f64(),
                },
                None => self.error(
                    what,
                    format!(
                        "did not complete within {:.1} s: one of ranks 0..{} is dead or silent (the launcher names a rank that died)",
                        self.timeout.as_secs_f64(),
                        self.world
                    ),
                ),
            },
            Stop::Aborted => ExecError::Rank {
                rank: self.rank,
                message: format!("aborted during {what}: another rank failed"),
            },
            Stop::Failed(message) => self.error(what, message),
        })
    }

    fn error(&self, what: &str, message: String) -> ExecError {
        ExecError::Mpi {
            rank: self.rank,
            operation: format!("{what} on stream {}", self.index),
            message,
        }
    }

    /// The MPI reduction that sums payloads of `wire` type: MPI_SUM for f32, the codec's own
    /// sum for the half types.
    fn sum_op(&self, wire: WireType) -> mpi::ffi::MPI_Op {
        match wire {
            WireType::F32 => SystemOperation::sum().as_raw(),
            WireType::F16 => self.halves.fp16.as_raw(),
            WireType::Bf16 => self.halves.bf16.as_raw(),
        }
    }

    /// Runs `words32` or `words16` (one operation for the two element sizes) with the sum of
    /// `codec`'s wire type.
    fn in_wire_type(
        &self,
        payload: &mut Vec<u8>,
        element: usize,
        codec: &dyn Codec,
        abort: &AtomicBool,
        words32: Summing<'w>,
        words16: Summing<'w>,
    ) -> Result<()> {
        let wire = WireType::of(codec, element)?;
        let run = if wire == WireType::F32 {
            words32
        } else {
            words16
        };
        run(self, payload, self.sum_op(wire), abort)
    }

    /// Allreduce in the wire type: f32 with MPI_SUM, fp16/bf16 with the codec's sum.
    pub fn allreduce(
        &self,
        payload: &mut Vec<u8>,
        element: usize,
        codec: &dyn Codec,
        abort: &AtomicBool,
    ) -> Result<()> {
        let (words32, words16) = (Self::allreduce_words::<f32>, Self::allreduce_words::<u16>);
        self.in_wire_type(payload, element, codec, abort, words32, words16)
    }

    /// The payload's bytes are MPI's send buffer and the stream's kept buffer its receive
    /// buffer; the sum is copied back once. A fresh buffer of each element type and copies
    /// in and out had made a 32 MiB allreduce on a 2-node, 1 Gb/s lab take 308 ms, against
    /// 283 ms for Open MPI's own `MPI_Iallreduce` called from C (2026-11-25).
    fn allreduce_words<W: Equivalence>(
        &self,
        payload: &mut Vec<u8>,
        op: mpi::ffi::MPI_Op,
        abort: &AtomicBool,
    ) -> Result<()> {
        let len = payload.len();
        let mut recv = self.received.take();
        if recv.len() < len {
            recv.resize(len, 0);
        }
        let flight = nonblocking::allreduce::<W>(self.raw(), std::mem::take(payload), recv, op);
        let (sent, summed) = self.finish(flight, "allreduce", None, abort)?;
        *payload = sent;
        payload.copy_from_slice(&summed[..len]);
        self.received.replace(summed);
        Ok(())
    }

    /// Allgather of payloads of any length: the lengths first, then MPI_Iallgatherv. Returns
    /// every rank's payload in rank order.
    pub fn allgather(&self, mine: Vec<u8>, abort: &AtomicBool) -> Result<Vec<Vec<u8>>> {
        let w = self.world as usize;
        let sizes = vec![0u64; w];
        let flight = nonblocking::allgather(self.raw(), vec![mine.len() as u64], sizes);
        let (_, sizes) = self.finish(flight, "allgather of payload sizes", None, abort)?;
        let what = "allgather";
        let mut counts = Vec::with_capacity(w);
        let mut displs = Vec::with_capacity(w);
        let mut total: usize = 0;
        for &size in &sizes {
            let size = usize::try_from(size)
                .map_err(|_| self.error(what, format!("a payload of {size} bytes")))?;
            counts.push(nonblocking::count(size).map_err(|m| self.error(what, m))?);
            displs.push(nonblocking::count(total).map_err(|m| self.error(what, m))?);
            total = total
                .checked_add(size)
                .ok_or_else(|| self.error(what, "payload sizes overflow".into()))?;
        }
        let flight = nonblocking::allgatherv(self.raw(), mine, vec![0u8; total], counts, displs);
        let (_, gathered, counts, displs) = self.finish(flight, what, None, abort)?;
        Ok(counts
            .iter()
            .zip(&displs)
            .map(|(&c, &d)| gathered[d as usize..d as usize + c as usize].to_vec())
            .collect())
    }

    /// Sends a payload of any length to `to`: its length, then its bytes.
    fn send_sized(
        &self,
        to: usize,
        payload: Vec<u8>,
        tags: (c_int, c_int),
        what: &str,
        abort: &AtomicBool,
    ) -> Result<()> {
        let size = nonblocking::send(self.raw(), vec![payload.len() as u64], to, tags.0);
        let body = nonblocking::send(self.raw(), payload, to, tags.1);
        let flight = size.and_then(|s| body.map(|b| s.and(b)));
        self.finish(flight, what, Some(to), abort).map(|_| ())
    }

    /// Receives a payload of any length from `from` (see `send_sized`).
    fn receive_sized(
        &self,
        from: usize,
        tags: (c_int, c_int),
        what: &str,
        abort: &AtomicBool,
    ) -> Result<Vec<u8>> {
        let flight = nonblocking::receive(self.raw(), vec![0u64], from, tags.0);
        let size = self.finish(flight, what, Some(from), abort)?[0];
        let size = usize::try_from(size)
            .map_err(|_| self.error(what, format!("a payload of {size} bytes")))?;
        let flight = nonblocking::receive(self.raw(), vec![0u8; size], from, tags.1);
        self.finish(flight, what, Some(from), abort)
    }

    /// Broadcast from `root`: its length, then its bytes.
    pub fn broadcast(&self, payload: &mut Vec<u8>, root: usize, abort: &AtomicBool) -> Result<()> {
        if root >= self.world as usize {
            return Err(self.error(
                "broadcast",
                format!("root {root} is outside the {} ranks", self.world),
            ));
        }
        let flight = nonblocking::broadcast(self.raw(), vec![payload.len() as u64], root);
        let size = self.finish(flight, "broadcast of the size", None, abort)?[0];
        let size = usize::try_from(size)
            .map_err(|_| self.error("broadcast", format!("a payload of {size} bytes")))?;
        let buffer = if self.rank as usize == root {
            std::mem::take(payload)
        } else {
            vec![0u8; size]
        };
        let flight = nonblocking::broadcast(self.raw(), buffer, root);
        *payload = self.finish(flight, "broadcast", None, abort)?;
        Ok(())
    }

    /// Sends one word to `to` (a launch decision).
    pub fn send_word(&self, to: usize, value: u64, what: &str, abort: &AtomicBool) -> Result<()> {
        let flight = nonblocking::send(self.raw(), vec![value], to, TAG_WORD);
        self.finish(flight, what, Some(to), abort).map(|_| ())
    }

    /// Receives one word from `from` (see [`Stream::send_word`]).
    pub fn receive_word(&self, from: usize, what: &str, abort: &AtomicBool) -> Result<u64> {
        let flight = nonblocking::receive(self.raw(), vec![0u64], from, TAG_WORD);
        Ok(self.finish(flight, what, Some(from), abort)?[0])
    }

    /// Sends bytes of any length to `to` (the records and `--check` data of a run).
    pub fn send_data(
        &self,
        to: usize,
        data: Vec<u8>,
        what: &str,
        abort: &AtomicBool,
    ) -> Result<()> {
        self.send_sized(to, data, (TAG_DATA_SIZE, TAG_DATA), what, abort)
    }

    /// Receives bytes sent by [`Stream::send_data`].
    pub fn receive_data(&self, from: usize, what: &str, abort: &AtomicBool) -> Result<Vec<u8>> {
        self.receive_sized(from, (TAG_DATA_SIZE, TAG_DATA), what, abort)
    }

    /// A barrier, bounded like every other operation (for benchmarks and tests).
    pub fn barrier(&self, abort: &AtomicBool) -> Result<()> {
        let flight = nonblocking::allreduce::<u8>(
            self.raw(),
            vec![0u8],
            vec![0u8],
            SystemOperation::max().as_raw(),
        );
        self.finish(flight, "barrier", None, abort).map(|_| ())
    }
}

/// The rings of `runtime::ring` over MPI's point-to-point messages. Open MPI's non-blocking
/// MPI_Ireduce_scatter (libnbc) reduces to one rank and scatters, which moved twice the bytes
/// and took 2.1× an allreduce of the same buffer on a 2-node, 1 Gb/s lab; its MPI_Iallgatherv
/// took 1.5–2.1× the ring reduce-scatter of the same chunks on a 2-node, 0.2 Gb/s lab (DeAR's
/// all-gathers of 17–30 MB). The ring steps are what the model prices.
impl RingLink for Stream<'_> {
    fn rank(&self) -> usize {
        self.rank as usize
    }

    /// Both go through the stream's kept buffers.
    fn shift(
        &self,
        out: &[u8],
        to: usize,
        from: usize,
        len: usize,
        what: &str,
        abort: &AtomicBool,
        take: &mut dyn FnMut(&[u8]) -> Result<()>,
    ) -> Result<()> {
        let mut outgoing = self.sending.take();
        outgoing.clear();
        outgoing.extend_from_slice(out);
        let mut incoming = self.received.take();
        incoming.resize(len, 0);
        let sent = nonblocking::send(self.raw(), outgoing, to, TAG_RING);
        let incoming = nonblocking::receive(self.raw(), incoming, from, TAG_RING);
        let flight = sent.and_then(|o| incoming.map(|i| o.and(i)));
        let (sent, received) = self.finish(flight, what, Some(from), abort)?;
        let taken = take(&received);
        self.sending.replace(sent);
        self.received.replace(received);
        taken
    }
}

/// Push/pull messages of any length (`send_sized`), each leg with tags of its own.
impl Messages for Stream<'_> {
    fn place(&self) -> (usize, usize) {
        (self.rank as usize, self.world as usize)
    }

    fn send(&self, to: usize, bytes: Vec<u8>, leg: Leg, abort: &AtomicBool) -> Result<()> {
        self.send_sized(to, bytes, tags(leg), leg.what(), abort)
    }

    fn receive(&self, from: usize, leg: Leg, abort: &AtomicBool) -> Result<Vec<u8>> {
        self.receive_sized(from, tags(leg), leg.what(), abort)
    }
}

/// The (size, payload) tags of a push/pull leg.
fn tags(leg: Leg) -> (c_int, c_int) {
    match leg {
        Leg::Push => (TAG_PUSH_SIZE, TAG_PUSH),
        Leg::Pull => (TAG_PULL_SIZE, TAG_PULL),
    }
}
