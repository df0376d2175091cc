//! NCCL communicators that cannot hang a run.
//!
//! Creation and collectives are non-blocking, each waited for within the run's timeout while
//! watching its abort flag, and a dropped communicator is aborted with `ncclCommAbort` (never a
//! blocking destroy).
//!
//! cudarc's `Comm` cannot do this: it is created only by the blocking `ncclCommInitRank`, which
//! waits forever for a rank that died after the rendezvous, and it cannot be built from a raw
//! communicator. With `config.blocking = 0` every NCCL call returns at once, possibly with
//! `ncclInProgress`, and `ncclCommGetAsyncError` says when the call is done; nothing else may
//! be issued on the communicator meanwhile, so every call here settles before it returns.

use crate::error::{ExecError, Result};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
use cudarc::nccl::{sys, Id, NcclType};
use std::ffi::{c_int, CStr};
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const POLL: Duration = Duration::from_micros(100);
/// How long a wait polls without sleeping.
const SPIN: Duration = Duration::from_millis(2);

/// The `version` of cudarc's `ncclConfig_t` layout (NCCL 2.30): NCCL reads the fields of the
/// versions it knows and takes the defaults for the rest.
const CONFIG_VERSION: u32 = 2 * 10000 + 30 * 100;
/// NCCL_CONFIG_UNDEF_INT: "NCCL's default".
const UNDEF: c_int = c_int::MIN;

/// NCCL_CONFIG_INITIALIZER with `blocking = 0`.
fn non_blocking() -> sys::ncclConfig_t {
    sys::ncclConfig_t {
        size: std::mem::size_of::<sys::ncclConfig_t>(),
        magic: 0xcafe_beef,
        version: CONFIG_VERSION,
        blocking: 0,
        cgaClusterSize: UNDEF,
        minCTAs: UNDEF,
        maxCTAs: UNDEF,
        netName: std::ptr::null(),
        splitShare: UNDEF,
        trafficClass: UNDEF,
        commName: std::ptr::null(),
        collnetEnable: UNDEF,
        CTAPolicy: UNDEF,
        shrinkShare: UNDEF,
        nvlsCTAs: UNDEF,
        nChannelsPerNetPeer: UNDEF,
        nvlinkCentricSched: UNDEF,
        graphUsageMode: UNDEF,
        numRmaCtx: UNDEF,
        maxP2pPeers: UNDEF,
    }
}

/// Which half of a point-to-point exchange a call is.
#[derive(Clone, Copy)]
enum Way {
    Send,
    Recv,
}

/// One rank's communicator on one CUDA stream; collectives sum where they reduce.
pub(super) struct Communicator<'a> {
    comm: sys::ncclComm_t,
    stream: Arc<CudaStream>,
    rank: u32,
    world: u32,
    /// Which of the rank's communicators (comm streams) this is, for messages.
    lane: u32,
    timeout: Duration,
    abort: &'a AtomicBool,
}

impl<'a> Communicator<'a> {
    /// Joins the communicator `id` as `rank` of `world`, waiting at most `timeout` for the
    /// other ranks and giving up as soon as `abort` is raised. The calling thread must have
    /// the stream's context bound.
    pub(super) fn init(
        stream: Arc<CudaStream>,
        rank: u32,
        world: u32,
        lane: u32,
        id: Id,
        timeout: Duration,
        abort: &'a AtomicBool,
    ) -> Result<Communicator<'a>> {
        let mut config = non_blocking();
        let mut comm: sys::ncclComm_t = std::ptr::null_mut();
        let unique = sys::ncclUniqueId {
            internal: *id.internal(),
        };
        // SAFETY: `comm` and `config` outlive the call, which copies the config.
        let status = unsafe {
            sys::ncclCommInitRankConfig(
                &mut comm,
                world as c_int,
                unique,
                rank as c_int,
                &mut config,
            )
        };
        let fail = |message: String| ExecError::Rank { rank, message };
        if comm.is_null() {
            return Err(fail(format!(
                "NCCL communicator {lane} failed to initialize: {status:?}"
            )));
        }
        // From here on, dropping it aborts the half-made communicator.
        let communicator = Communicator {
            comm,
            stream,
            rank,
            world,
            lane,
            timeout,
            abort,
        };
        communicator.settle(status, "initialization")?;
        Ok(communicator)
    }

    /// The communicator of the ranks that pass the same `color`, numbered by `key` from 0
    /// (`ncclCommSplit`), on the same stream; `ranks` of them. Collective over this
    /// communicator: every rank splits it, in the same order.
    pub(super) fn split(&self, color: u32, key: u32, ranks: u32) -> Result<Communicator<'a>> {
        let mut config = non_blocking();
        let started = Instant::now();
        // NCCL keeps the slot's address and fills it from its own thread when the split's job
        // ends, failed or not, which may be after a timeout returns from here: the slot is on
        // the heap, and let go rather than freed while the job may still run.
        let slot = Box::new(AtomicPtr::new(std::ptr::null_mut::<sys::ncclComm>()));
        // SAFETY: a live communicator with no call in progress; the slot outlives NCCL's write
        // (below), and `config` the call, which copies it.
        let status = unsafe {
            sys::ncclCommSplit(
                self.comm,
                color as c_int,
                key as c_int,
                slot.as_ptr(),
                &mut config,
            )
        };
        // From NCCL 2.23 on, a non-blocking parent fills the slot only once the parent itself
        // settles (NVIDIA/nccl#1472; PyTorch waits so too, pytorch/pytorch#137741): wait for
        // it even where the call says it succeeded. Settled, the parent's state was stored
        // after the slot and is read with acquire ordering, so the load below sees the child.
        let pending = match status {
            sys::ncclResult_t::ncclSuccess => sys::ncclResult_t::ncclInProgress,
            other => other,
        };
        let child = |comm| Communicator {
            comm,
            stream: self.stream.clone(),
            rank: key,
            world: ranks,
            lane: self.lane,
            timeout: self.timeout,
            abort: self.abort,
        };
        match self.outcome(pending) {
            Ok(()) => {}
            Err(stop @ (Stop::TimedOut | Stop::Aborted)) => {
                // The job may still write the slot, and make a child nobody can abort.
                Box::leak(slot);
                return Err(self.stopped(stop, "split"));
            }
            Err(stop) => {
                // A failed job has ended and may have left a child: dropping it aborts it.
                drop(child(slot.load(Ordering::Acquire)));
                return Err(self.stopped(stop, "split"));
            }
        }
        let comm = slot.load(Ordering::Acquire);
        if comm.is_null() {
            return Err(ExecError::Rank {
                rank: self.rank,
                message: format!(
                    "NCCL communicator {} gave no communicator for color {color}, key {key}, though the split succeeded{}",
                    self.lane,
                    self.last_error()
                ),
            });
        }
        // From here on, dropping it aborts the half-made communicator.
        let split = child(comm);
        // Defensive: NCCL 2.23 to 2.30 finish the child's set-up before filling the slot, but
        // its own state is the contract; both waits share the one timeout (one poll at least).
        let left = self.timeout.saturating_sub(started.elapsed()).max(POLL);
        split
            .outcome_within(sys::ncclResult_t::ncclInProgress, left)
            .map_err(|stop| split.stopped(stop, "split"))?;
        Ok(split)
    }

    /// Sums `buffer` over all ranks, in place.
    pub(super) fn all_reduce_sum<T: NcclType>(
        &self,
        buffer: &mut impl DevicePtrMut<T>,
    ) -> Result<()> {
        let count = buffer.len();
        let (ptr, _record) = buffer.device_ptr_mut(&self.stream);
        // SAFETY: `ptr` holds `count` elements of T on this communicator's device; the record
        // guard orders the stream after earlier uses of the buffer.
        let status = unsafe {
            sys::ncclAllReduce(
                ptr as _,
                ptr as _,
                count,
                T::as_nccl_type(),
                sys::ncclRedOp_t::ncclSum,
                self.comm,
                self.stream.cu_stream() as _,
            )
        };
        self.settle(status, "all-reduce")
    }

    /// Sums `send` over all ranks and leaves this rank's block of the sum in `recv`.
    pub(super) fn reduce_scatter_sum<T: NcclType>(
        &self,
        send: &impl DevicePtr<T>,
        recv: &mut impl DevicePtrMut<T>,
    ) -> Result<()> {
        let count = recv.len();
        let (src, _read) = send.device_ptr(&self.stream);
        let (dst, _write) = recv.device_ptr_mut(&self.stream);
        // SAFETY: `dst` holds `count` elements and `src` (NCCL's contract) world × count.
        let status = unsafe {
            sys::ncclReduceScatter(
                src as _,
                dst as _,
                count,
                T::as_nccl_type(),
                sys::ncclRedOp_t::ncclSum,
                self.comm,
                self.stream.cu_stream() as _,
            )
        };
        self.settle(status, "reduce-scatter")
    }

    /// Concatenates every rank's `send`, in rank order, into `recv`.
    pub(super) fn all_gather<T: NcclType>(
        &self,
        send: &impl DevicePtr<T>,
        recv: &mut impl DevicePtrMut<T>,
    ) -> Result<()> {
        let count = send.len();
        let (src, _read) = send.device_ptr(&self.stream);
        let (dst, _write) = recv.device_ptr_mut(&self.stream);
        // SAFETY: `src` holds `count` elements and `dst` (NCCL's contract) world × count.
        let status = unsafe {
            sys::ncclAllGather(
                src as _,
                dst as _,
                count,
                T::as_nccl_type(),
                self.comm,
                self.stream.cu_stream() as _,
            )
        };
        self.settle(status, "all-gather")
    }

    /// Gathers every rank's `send` (`len` bytes each) on rank `root` with grouped point-to-point
    /// calls, NCCL having no gather: on `root`, whose `recv` must be `Some`, block r of `recv`
    /// receives rank r's bytes (its own block is left to the caller); the others send.
    pub(super) fn gather_bytes(
        &self,
        send: &impl DevicePtr<u8>,
        recv: Option<&mut CudaSlice<u8>>,
        root: u32,
    ) -> Result<()> {
        let len = send.len();
        let Some(recv) = recv else {
            let (src, _read) = send.device_ptr(&self.stream);
            // SAFETY: `src` holds `len` bytes on this communicator's device.
            let status = unsafe { self.point_to_point(Way::Send, src, len, root) };
            return self.settle(status, "send");
        };
        let (dst, _write) = recv.device_ptr_mut(&self.stream);
        // One group, so that the receives from all ranks progress together.
        let status = grouped(|call| {
            for from in (0..self.world).filter(|&r| r != self.rank) {
                let block = dst + u64::from(from) * len as u64;
                // SAFETY: block `from` of `dst` lies inside `recv`, which holds world × len
                // bytes.
                call(unsafe { self.point_to_point(Way::Recv, block, len, from) });
            }
        });
        self.settle(status, "grouped receive")
    }

    /// One step of a ring: sends `send` to rank `next` and receives `recv` from rank `prev`, in
    /// one group so that every rank's send meets its neighbour's receive.
    pub(super) fn shift(
        &self,
        send: &impl DevicePtr<u8>,
        recv: &mut impl DevicePtrMut<u8>,
        next: u32,
        prev: u32,
    ) -> Result<()> {
        let (sent, received) = (send.len(), recv.len());
        let (src, _read) = send.device_ptr(&self.stream);
        let (dst, _write) = recv.device_ptr_mut(&self.stream);
        let status = grouped(|call| {
            // SAFETY: `src` holds `sent` bytes and `dst` `received` bytes on this
            // communicator's device, and the two buffers do not overlap (one is borrowed
            // mutably).
            unsafe {
                call(self.point_to_point(Way::Send, src, sent, next));
                call(self.point_to_point(Way::Recv, dst, received, prev));
            }
        });
        self.settle(status, "ring step")
    }

    /// Enqueues the send of `len` bytes at `ptr` to rank `peer` (`Way::Send`), or their receive
    /// from it into `ptr` (`Way::Recv`), on this communicator's stream.
    ///
    /// # Safety
    /// `ptr` must hold `len` bytes on this communicator's device until the call completed,
    /// writable and aliased by nothing else for a receive.
    unsafe fn point_to_point(
        &self,
        way: Way,
        ptr: u64,
        len: usize,
        peer: u32,
    ) -> sys::ncclResult_t {
        let (bytes, peer, stream) = (
            sys::ncclDataType_t::ncclUint8,
            peer as c_int,
            self.stream.cu_stream() as _,
        );
        // SAFETY: the caller's.
        unsafe {
            match way {
                Way::Send => sys::ncclSend(ptr as _, len, bytes, peer, self.comm, stream),
                Way::Recv => sys::ncclRecv(ptr as _, len, bytes, peer, self.comm, stream),
            }
        }
    }

    /// Copies rank `root`'s `buffer` into every other rank's, in place.
    pub(super) fn broadcast<T: NcclType>(
        &self,
        buffer: &mut impl DevicePtrMut<T>,
        root: u32,
    ) -> Result<()> {
        let count = buffer.len();
        let (ptr, _record) = buffer.device_ptr_mut(&self.stream);
        // SAFETY: `ptr` holds `count` elements of T on this communicator's device.
        let status = unsafe {
            sys::ncclBroadcast(
                ptr as _,
                ptr as _,
                count,
                T::as_nccl_type(),
                root as c_int,
                self.comm,
                self.stream.cu_stream() as _,
            )
        };
        self.settle(status, "broadcast")
    }

    pub(super) fn rank(&self) -> u32 {
        self.rank
    }

    pub(super) fn world(&self) -> u32 {
        self.world
    }

    pub(super) fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Waits until the call that returned `status` is done: enqueued on the stream, or the
    /// communicator initialized.
    fn settle(&self, status: sys::ncclResult_t, what: &str) -> Result<()> {
        self.outcome(status)
            .map_err(|stop| self.stopped(stop, what))
    }

    /// How the call that returned `status` ended, polling the communicator's state.
    fn outcome(&self, status: sys::ncclResult_t) -> Result<(), Stop> {
        self.outcome_within(status, self.timeout)
    }

    /// [`Self::outcome`], given up after `timeout`.
    fn outcome_within(&self, status: sys::ncclResult_t, timeout: Duration) -> Result<(), Stop> {
        let poll = || {
            let mut state = sys::ncclResult_t::ncclInProgress;
            // SAFETY: a live communicator and a valid out-pointer.
            let polled = unsafe { sys::ncclCommGetAsyncError(self.comm, &mut state) };
            if polled == sys::ncclResult_t::ncclSuccess {
                state
            } else {
                polled
            }
        };
        wait(status, poll, timeout, self.abort)
    }

    /// The error of a call that did not settle.
    fn stopped(&self, stop: Stop, what: &str) -> ExecError {
        let lane = self.lane;
        let message = match stop {
            Stop::Failed(failed) => format!(
                "NCCL {what} failed on communicator {lane}: {failed:?}{}",
                self.last_error()
            ),
            Stop::Aborted => {
                format!("aborted during NCCL {what} on communicator {lane}: another rank failed")
            }
            Stop::TimedOut => format!(
                "NCCL {what} on communicator {lane} did not finish within {:.1} s (a peer rank may be dead or stuck; the communicator is aborted)",
                self.timeout.as_secs_f64()
            ),
        };
        ExecError::Rank {
            rank: self.rank,
            message,
        }
    }

    /// NCCL's own explanation of the last failure, if it has one.
    fn last_error(&self) -> String {
        // SAFETY: NCCL returns a NUL-terminated string it owns, or null.
        let text = unsafe {
            let ptr = sys::ncclGetLastError(self.comm);
            (!ptr.is_null()).then(|| CStr::from_ptr(ptr).to_string_lossy().into_owned())
        };
        match text {
            Some(text) if !text.trim().is_empty() => format!(" ({})", text.trim()),
            _ => String::new(),
        }
    }
}

/// Why a call did not settle.
#[derive(Debug, PartialEq)]
enum Stop {
    Failed(sys::ncclResult_t),
    Aborted,
    TimedOut,
}

/// Issues `calls`' NCCL calls inside one group (`ncclGroupStart` … `ncclGroupEnd`), passing each
/// call's status to the callback: the group is closed whatever a call returned, and the first
/// failure wins.
fn grouped(calls: impl FnOnce(&mut dyn FnMut(sys::ncclResult_t))) -> sys::ncclResult_t {
    // SAFETY: group calls take no arguments; every start is matched by the end below.
    let mut first = unsafe { sys::ncclGroupStart() };
    calls(&mut |status| {
        if first == sys::ncclResult_t::ncclSuccess {
            first = status;
        }
    });
    // SAFETY: as above.
    let end = unsafe { sys::ncclGroupEnd() };
    if first == sys::ncclResult_t::ncclSuccess {
        end
    } else {
        first
    }
}

/// Polls a call that returned `status` until it is no longer in progress, within `timeout` and
/// until `abort` is raised.
fn wait(
    mut status: sys::ncclResult_t,
    mut poll: impl FnMut() -> sys::ncclResult_t,
    timeout: Duration,
    abort: &AtomicBool,
) -> Result<(), Stop> {
    let start = Instant::now();
    let (deadline, spin_until) = (start + timeout, start + SPIN);
    loop {
        match status {
            sys::ncclResult_t::ncclSuccess => return Ok(()),
            sys::ncclResult_t::ncclInProgress => {}
            failed => return Err(Stop::Failed(failed)),
        }
        if abort.load(Ordering::Relaxed) {
            return Err(Stop::Aborted);
        }
        if Instant::now() >= deadline {
            return Err(Stop::TimedOut);
        }
        // Collective calls usually settle within microseconds, inside a timed task: yield
        // first, and sleep only for the long waits (connection set-up, a slow peer).
        if Instant::now() < spin_until {
            std::thread::yield_now();
        } else {
            std::thread::sleep(POLL);
        }
        status = poll();
    }
}

impl Communicator<'_> {
    /// Ends a communicator whose collectives all succeeded: `ncclCommFinalize` waits (within
    /// the timeout, watching for failures) until the peers no longer need this rank's buffers,
    /// which a peer still finishing its last collective may, then `ncclCommDestroy` frees them.
    /// On any failure the communicator is aborted instead, by `Drop`.
    pub(super) fn finish(mut self) -> Result<()> {
        // SAFETY: a live communicator with no call in progress (every call here settles).
        let status = unsafe { sys::ncclCommFinalize(self.comm) };
        self.settle(status, "finalization")?;
        // SAFETY: finalized, so destroying frees local resources without waiting for peers.
        let status = unsafe { sys::ncclCommDestroy(self.comm) };
        self.comm = std::ptr::null_mut();
        if status != sys::ncclResult_t::ncclSuccess {
            return Err(ExecError::Rank {
                rank: self.rank,
                message: format!(
                    "NCCL communicator {} could not be destroyed: {status:?}",
                    self.lane
                ),
            });
        }
        Ok(())
    }
}

impl Drop for Communicator<'_> {
    /// Abort, not destroy, unless `finish` already destroyed it: destroying an unfinalized
    /// communicator waits for outstanding work, which never ends when a peer is gone.
    fn drop(&mut self) {
        if self.comm.is_null() {
            return;
        }
        // SAFETY: the communicator came from ncclCommInitRankConfig and is not used after this.
        // Its status is ignored: nothing is left to do with a communicator that failed to abort.
        let _ = unsafe { sys::ncclCommAbort(self.comm) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sys::ncclResult_t::{ncclInProgress, ncclRemoteError, ncclSuccess};

    /// On a GPU: a communicator of one rank initializes, runs every collective the backend
    /// uses and is finalized; with one rank each result is its input.
    #[test]
    fn a_world_of_one_runs_every_collective() {
        let Some((_ctx, stream, _kernels)) = super::super::kernels::gpu_or_skip() else {
            return;
        };
        let mut version = 0;
        // SAFETY: NCCL writes one int.
        let _ = unsafe { sys::ncclGetVersion(&mut version) };
        let abort = AtomicBool::new(false);
        let id = Id::new().expect("an NCCL unique id");
        let comm = Communicator::init(stream.clone(), 0, 1, 0, id, Duration::from_secs(60), &abort)
            .expect("a communicator of one rank");
        let host: Vec<f32> = (0..4099).map(|i| i as f32 * 0.5 - 7.0).collect();
        let mut summed = stream.clone_htod(&host).unwrap();
        comm.all_reduce_sum(&mut summed).unwrap();
        let mut block = stream.alloc_zeros::<f32>(host.len()).unwrap();
        comm.reduce_scatter_sum(&summed, &mut block).unwrap();
        let mut gathered = stream.alloc_zeros::<f32>(host.len()).unwrap();
        comm.all_gather(&block, &mut gathered).unwrap();
        comm.broadcast(&mut gathered, 0).unwrap();
        // The root's own block is the caller's: with one rank the group is empty.
        let bytes = stream.clone_htod(&[7u8; 33]).unwrap();
        let mut blocks = stream.alloc_zeros::<u8>(33).unwrap();
        comm.gather_bytes(&bytes, Some(&mut blocks), 0).unwrap();
        assert_eq!(stream.clone_dtoh(&gathered).unwrap(), host);
        // A split, as the hierarchical allreduce makes its node communicators.
        let node = comm.split(0, 0, 1).expect("a split communicator");
        node.all_reduce_sum(&mut gathered).unwrap();
        assert_eq!(stream.clone_dtoh(&gathered).unwrap(), host);
        node.finish().expect("the split communicator finalizes");
        comm.finish().expect("the communicator finalizes");
        println!("nccl world of one: NCCL {version}: all-reduce, reduce-scatter, all-gather, broadcast, a gather and a split ran");
    }

    #[test]
    fn a_call_settles_fails_or_gives_up_in_time() {
        let (calm, raised) = (AtomicBool::new(false), AtomicBool::new(true));
        let long = Duration::from_secs(10);
        let mut polls = 0;
        let after_three = || {
            polls += 1;
            if polls < 3 {
                ncclInProgress
            } else {
                ncclSuccess
            }
        };
        assert_eq!(wait(ncclInProgress, after_three, long, &calm), Ok(()));
        let remote = || ncclRemoteError;
        assert_eq!(
            wait(ncclInProgress, remote, long, &calm),
            Err(Stop::Failed(ncclRemoteError))
        );
        let forever = || ncclInProgress;
        assert_eq!(
            wait(ncclInProgress, forever, long, &raised),
            Err(Stop::Aborted)
        );
        let start = Instant::now();
        assert_eq!(
            wait(ncclInProgress, forever, Duration::from_millis(50), &calm),
            Err(Stop::TimedOut)
        );
        assert!(start.elapsed() < long);
    }
}
