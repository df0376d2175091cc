//! The backend trait: the few primitives in which the host, MPI and CUDA backends really differ.
//!
//! These are compute, timing, the codec ops on a piece's buffers and a round's exchange; everything
//! else is shared.

use crate::error::Result;

/// Where a synchronization step runs: the rank's compression stream, or one of its
/// communication streams with that stream's end of the collective link.
pub(super) enum Lane<'l, L> {
    Codec,
    Comm { link: &'l L, stream: u32 },
}

impl<L> Lane<'_, L> {
    /// The trace lane of a task on it: 0 for the compression stream, else the comm stream.
    pub(super) fn trace_stream(&self) -> u32 {
        match self {
            Lane::Codec => 0,
            Lane::Comm { stream, .. } => *stream,
        }
    }
}

/// One backend. The driver ([`super::driver::drive`]) decides when each task runs and
/// releases its successors once the call returns; [`super::sequence`] decides which of the
/// piece primitives a synchronization step runs, in which order.
pub(super) trait Backend: Sync {
    /// One rank's buffers and streams.
    type Rank: Sync;
    /// One rank's state of one piece (its buffers, codec and memory).
    type Piece;
    /// What a comm thread opens its end of a stream from; moved onto that thread.
    type Opener: Send;
    /// A comm thread's end of its stream: opened, used and dropped on that thread.
    type Link;
    /// Compute work enqueued on a device stream and not yet seen done.
    type Running;

    /// A forward, backward, optimizer or update task (a backward task also writes its
    /// gradient into its group buffer): done when this returns (`None`), or enqueued behind
    /// the rank's earlier compute tasks (`Some`), to be finished with [`Backend::finish`].
    fn compute(&self, rank: &Self::Rank, task: u32) -> Result<Option<Self::Running>>;
    /// Whether enqueued compute work is done, without waiting.
    fn is_done(&self, running: &Self::Running) -> Result<bool>;
    /// Waits (bounded) until enqueued compute work is done and records its task.
    fn finish(&self, rank: &Self::Rank, task: u32, running: Self::Running) -> Result<()>;

    /// Opens the rank's end of comm stream `stream`, on that stream's thread.
    fn open(&self, rank: &Self::Rank, stream: u32, opener: Self::Opener) -> Result<Self::Link>;
    /// Closes the rank's end of a stream after its last collective succeeded (on a failure the
    /// link is only dropped).
    fn close(&self, link: Self::Link) -> Result<()> {
        drop(link);
        Ok(())
    }

    /// Runs `body` on the rank's state of piece `piece` between the backend's timing marks on
    /// `lane`, records it as task `task`, then does what the backend does after a step
    /// outside its timing (the `--check` copies of the compression input and the result).
    fn timed(
        &self,
        rank: &Self::Rank,
        lane: &Lane<Self::Link>,
        task: u32,
        piece: usize,
        body: &mut dyn FnMut(&mut Self::Piece) -> Result<()>,
    ) -> Result<()>;

    /// Runs gather task `task` (`StepKind::Gather`) on the comm stream `lane`: the all-gather of
    /// its unit's parameter shards, every rank's into every rank, timed and recorded as a
    /// collective.
    fn gather(&self, rank: &Self::Rank, lane: &Lane<Self::Link>, task: u32) -> Result<()>;

    // The primitives of the synchronization sequence, on one rank's state of piece `index`.

    /// Reads the piece from its group buffer and adds the error feedback: the compression input.
    fn compensate(
        &self,
        rank: &Self::Rank,
        lane: &Lane<Self::Link>,
        piece: &mut Self::Piece,
        index: usize,
    ) -> Result<()>;
    /// Encodes the compression input into the payload (round 0's, for multi-round codecs).
    fn encode(
        &self,
        rank: &Self::Rank,
        lane: &Lane<Self::Link>,
        piece: &mut Self::Piece,
        index: usize,
    ) -> Result<()>;
    /// Computes the next round's payload from the reduced one (PowerSGD's Q from P).
    fn next_round(
        &self,
        rank: &Self::Rank,
        lane: &Lane<Self::Link>,
        piece: &mut Self::Piece,
        index: usize,
    ) -> Result<()>;
    /// Runs round `round`'s exchange of the piece's payload with every other rank.
    fn exchange(
        &self,
        rank: &Self::Rank,
        lane: &Lane<Self::Link>,
        piece: &mut Self::Piece,
        index: usize,
        round: u32,
    ) -> Result<()>;
    /// Decodes what the exchanges delivered into the piece's result.
    fn decode(
        &self,
        rank: &Self::Rank,
        lane: &Lane<Self::Link>,
        piece: &mut Self::Piece,
        index: usize,
    ) -> Result<()>;
    /// Keeps in the error-feedback memory what this rank's own payload did not transmit.
    fn update_memory(
        &self,
        rank: &Self::Rank,
        lane: &Lane<Self::Link>,
        piece: &mut Self::Piece,
        index: usize,
    ) -> Result<()>;
    /// Scales the result by the memory's output factor (EF-SignSGD divides by its lr again).
    fn scale_output(
        &self,
        rank: &Self::Rank,
        lane: &Lane<Self::Link>,
        piece: &mut Self::Piece,
        index: usize,
    ) -> Result<()>;
}
