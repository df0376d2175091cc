//! MPI's non-blocking operations: the MPI transport's only `unsafe` code.
//!
//! They are started on buffers this module holds until they complete, and completed by a test loop
//! bounded by a deadline and an abort flag.
//!
//! MPI keeps raw pointers into the buffers of an operation until it completes. An
//! [`InFlight`] owns those buffers (heap allocations: moving the `InFlight` does not move
//! them) and hands them back only when every request has completed. An operation that never
//! completes — a dead or silent peer, an abort — cannot be taken back from MPI, so its buffers
//! are leaked on purpose: MPI may still write into them, and freed memory must not be. The
//! same holds for an `InFlight` dropped before it completed.

use mpi::datatype::Equivalence;
use mpi::ffi;
use mpi::raw::AsRaw;
use std::os::raw::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How long a wait spins (yielding the core between tests) before it sleeps between tests:
/// small operations finish within it at full speed; a long one then costs the core little.
/// Open MPI's TCP transport only progresses inside MPI calls, so the sleep is short enough
/// for the socket buffers to keep the link busy between two tests.
const SPIN: Duration = Duration::from_micros(300);
const NAP: Duration = Duration::from_micros(50);

/// Operations in flight and the buffers MPI reads and writes for them.
#[must_use = "an operation in flight must be completed (or its buffers are leaked)"]
pub(super) struct InFlight<B> {
    requests: Vec<ffi::MPI_Request>,
    /// Taken out only once every request has completed.
    buffers: Option<B>,
}

impl<B> Drop for InFlight<B> {
    fn drop(&mut self) {
        // Still here: the operations did not complete, so MPI may still use the buffers.
        if let Some(buffers) = self.buffers.take() {
            std::mem::forget(buffers);
        }
    }
}

/// Why a wait ended without its operations completing.
#[derive(Debug)]
pub(super) enum Stop {
    Deadline,
    Aborted,
    Failed(String),
}

impl<B> InFlight<B> {
    /// Both operations, completed together.
    pub(super) fn and<C>(mut self, mut other: InFlight<C>) -> InFlight<(B, C)> {
        let requests = std::mem::take(&mut self.requests)
            .into_iter()
            .chain(std::mem::take(&mut other.requests))
            .collect();
        let buffers = self.buffers.take().zip(other.buffers.take());
        InFlight { requests, buffers }
    }

    /// Tests the requests until all have completed, `deadline` passes or `abort` is set.
    pub(super) fn complete(mut self, deadline: Instant, abort: &AtomicBool) -> Result<B, Stop> {
        let start = Instant::now();
        loop {
            let mut all = true;
            for request in &mut self.requests {
                let mut flag: c_int = 0;
                // SAFETY: `request` came from a start function below and is tested only
                // here; a completed request has been set to MPI_REQUEST_NULL by MPI, and
                // testing a null request is allowed (it reports completion).
                let rc = unsafe { ffi::MPI_Test(request, &mut flag, ffi::RSMPI_STATUS_IGNORE) };
                if rc != ffi::MPI_SUCCESS as c_int {
                    return Err(Stop::Failed(error_string(rc)));
                }
                all &= flag != 0;
            }
            if all {
                return Ok(self.buffers.take().expect("buffers until completion"));
            }
            if abort.load(Ordering::Relaxed) {
                return Err(Stop::Aborted);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Stop::Deadline);
            }
            if now - start < SPIN {
                std::thread::yield_now();
            } else {
                std::thread::sleep(NAP);
            }
        }
    }
}

/// MPI's message for an error code.
pub(super) fn error_string(code: c_int) -> String {
    let mut text = vec![0 as c_char; ffi::MPI_MAX_ERROR_STRING as usize + 1];
    let mut len: c_int = 0;
    // SAFETY: the buffer holds MPI_MAX_ERROR_STRING characters, as MPI_Error_string requires.
    let rc = unsafe { ffi::MPI_Error_string(code, text.as_mut_ptr(), &mut len) };
    if rc != ffi::MPI_SUCCESS as c_int {
        return format!("MPI error code {code}");
    }
    let bytes: Vec<u8> = text[..len.clamp(0, ffi::MPI_MAX_ERROR_STRING as c_int) as usize]
        .iter()
        .map(|&c| c as u8)
        .collect();
    format!(
        "{} (MPI error code {code})",
        String::from_utf8_lossy(&bytes)
    )
}

/// An element count as MPI takes it (a C int).
pub(super) fn count(n: usize) -> Result<c_int, String> {
    c_int::try_from(n).map_err(|_| {
        format!(
            "{n} elements exceed MPI's count limit of {} per call",
            c_int::MAX
        )
    })
}

fn started<B>(rc: c_int, request: ffi::MPI_Request, buffers: B) -> Started<B> {
    if rc == ffi::MPI_SUCCESS as c_int {
        Ok(InFlight {
            requests: vec![request],
            buffers: Some(buffers),
        })
    } else {
        Err(error_string(rc))
    }
}

fn null_request() -> ffi::MPI_Request {
    // SAFETY: reading an extern constant that mpi-sys initializes at load time.
    unsafe { ffi::RSMPI_REQUEST_NULL }
}

/// What a start function returns: the operation in flight, or MPI's message.
pub(super) type Started<B> = Result<InFlight<B>, String>;

/// A send and a receive buffer.
pub(super) type Pair<T> = (Vec<T>, Vec<T>);

/// A communicator handle and what the start functions need of it.
#[derive(Clone, Copy)]
pub(super) struct Comm {
    pub raw: ffi::MPI_Comm,
    pub size: usize,
}

/// `MPI_Iallreduce` of the elements of T that the bytes of `send` hold into the first as many
/// bytes of `recv` with `op`. The payload's own bytes go to MPI, with no copy into a buffer of
/// T; they hold T's native (little-endian, see the assertion below) representation.
pub(super) fn allreduce<T: Equivalence>(
    comm: Comm,
    send: Vec<u8>,
    mut recv: Vec<u8>,
    op: ffi::MPI_Op,
) -> Started<Pair<u8>> {
    assert!(
        send.len() <= recv.len(),
        "a receive buffer as long as the send buffer"
    );
    let size = std::mem::size_of::<T>();
    let align = std::mem::align_of::<T>();
    // The system allocator aligns every allocation to 16 bytes; an empty Vec's dangling
    // pointer is aligned to 1 only, and its zero elements are never read.
    if !send.len().is_multiple_of(size)
        || (!send.is_empty()
            && (send.as_ptr().align_offset(align) != 0 || recv.as_ptr().align_offset(align) != 0))
    {
        return Err(format!(
            "allreduce buffers of {} bytes that are not whole aligned {size}-byte elements",
            send.len()
        ));
    }
    let n = count(send.len() / size)?;
    let mut request = null_request();
    // SAFETY: both buffers hold `n` aligned elements of T's MPI datatype (checked above) and
    // stay alive and untouched in the returned InFlight until MPI has completed the request.
    let rc = unsafe {
        ffi::MPI_Iallreduce(
            send.as_ptr().cast::<c_void>(),
            recv.as_mut_ptr().cast::<c_void>(),
            n,
            T::equivalent_datatype().as_raw(),
            op,
            comm.raw,
            &mut request,
        )
    };
    started(rc, request, (send, recv))
}

// Payload bytes are little-endian; MPI sums native numbers in place of them.
const _: () = assert!(
    cfg!(target_endian = "little"),
    "the MPI transport hands little-endian payload bytes to MPI as native numbers"
);

/// `MPI_Iallgather` of one equal-size block per rank: `recv` holds `send.len()` × ranks.
pub(super) fn allgather<T: Equivalence>(
    comm: Comm,
    send: Vec<T>,
    mut recv: Vec<T>,
) -> Started<Pair<T>> {
    assert_eq!(recv.len(), send.len() * comm.size, "a block per rank");
    let n = count(send.len())?;
    let datatype = T::equivalent_datatype().as_raw();
    let mut request = null_request();
    // SAFETY: `send` holds n elements and `recv` n per rank; both live in the InFlight.
    let rc = unsafe {
        ffi::MPI_Iallgather(
            send.as_ptr().cast::<c_void>(),
            n,
            datatype,
            recv.as_mut_ptr().cast::<c_void>(),
            n,
            datatype,
            comm.raw,
            &mut request,
        )
    };
    started(rc, request, (send, recv))
}

/// Buffers of an `MPI_Iallgatherv`: what this rank sends, what everyone receives, and the
/// counts and displacements MPI reads until completion.
pub(super) type Gatherv<T> = (Vec<T>, Vec<T>, Vec<c_int>, Vec<c_int>);

/// `MPI_Iallgatherv`: rank i's block of `counts[i]` elements lands at `displs[i]` of `recv`.
pub(super) fn allgatherv<T: Equivalence>(
    comm: Comm,
    send: Vec<T>,
    mut recv: Vec<T>,
    counts: Vec<c_int>,
    displs: Vec<c_int>,
) -> Started<Gatherv<T>> {
    assert_eq!(counts.len(), comm.size, "one count per rank");
    assert_eq!(displs.len(), comm.size, "one displacement per rank");
    assert!(
        counts
            .iter()
            .zip(&displs)
            .all(|(&c, &d)| c >= 0 && d >= 0 && (c as usize + d as usize) <= recv.len()),
        "every block fits the receive buffer"
    );
    let n = count(send.len())?;
    let datatype = T::equivalent_datatype().as_raw();
    let mut request = null_request();
    // SAFETY: every block (counts[i] elements at displs[i]) lies inside `recv`, checked
    // above; `send` holds n elements; buffers, counts and displacements live in the InFlight.
    let rc = unsafe {
        ffi::MPI_Iallgatherv(
            send.as_ptr().cast::<c_void>(),
            n,
            datatype,
            recv.as_mut_ptr().cast::<c_void>(),
            counts.as_ptr(),
            displs.as_ptr(),
            datatype,
            comm.raw,
            &mut request,
        )
    };
    started(rc, request, (send, recv, counts, displs))
}

/// `MPI_Ibcast` of `buffer` (the same length on every rank) from `root`.
pub(super) fn broadcast<T: Equivalence>(
    comm: Comm,
    mut buffer: Vec<T>,
    root: usize,
) -> Started<Vec<T>> {
    let n = count(buffer.len())?;
    let root = count(root)?;
    let mut request = null_request();
    // SAFETY: `buffer` holds n elements and lives in the InFlight.
    let rc = unsafe {
        ffi::MPI_Ibcast(
            buffer.as_mut_ptr().cast::<c_void>(),
            n,
            T::equivalent_datatype().as_raw(),
            root,
            comm.raw,
            &mut request,
        )
    };
    started(rc, request, buffer)
}

/// `MPI_Isend` of `buffer` to rank `to` with `tag`.
pub(super) fn send<T: Equivalence>(
    comm: Comm,
    buffer: Vec<T>,
    to: usize,
    tag: c_int,
) -> Started<Vec<T>> {
    let n = count(buffer.len())?;
    let to = count(to)?;
    let mut request = null_request();
    // SAFETY: `buffer` holds n elements and lives in the InFlight.
    let rc = unsafe {
        ffi::MPI_Isend(
            buffer.as_ptr().cast::<c_void>(),
            n,
            T::equivalent_datatype().as_raw(),
            to,
            tag,
            comm.raw,
            &mut request,
        )
    };
    started(rc, request, buffer)
}

/// `MPI_Irecv` into `buffer` (exactly the message's length) from rank `from` with `tag`.
pub(super) fn receive<T: Equivalence>(
    comm: Comm,
    mut buffer: Vec<T>,
    from: usize,
    tag: c_int,
) -> Started<Vec<T>> {
    let n = count(buffer.len())?;
    let from = count(from)?;
    let mut request = null_request();
    // SAFETY: `buffer` holds n elements (MPI writes at most n) and lives in the InFlight.
    let rc = unsafe {
        ffi::MPI_Irecv(
            buffer.as_mut_ptr().cast::<c_void>(),
            n,
            T::equivalent_datatype().as_raw(),
            from,
            tag,
            comm.raw,
            &mut request,
        )
    };
    started(rc, request, buffer)
}

/// Makes MPI return error codes on `comm` instead of aborting the process, so that a failed
/// operation becomes an error naming the rank and the operation.
pub(super) fn errors_return(comm: ffi::MPI_Comm) -> Result<(), String> {
    // SAFETY: `comm` is a valid communicator; ERRORS_RETURN is a predefined handler.
    let rc = unsafe { ffi::MPI_Comm_set_errhandler(comm, ffi::RSMPI_ERRORS_RETURN) };
    if rc == ffi::MPI_SUCCESS as c_int {
        Ok(())
    } else {
        Err(error_string(rc))
    }
}
