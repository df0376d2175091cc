//! The control plane of a multi-process launch: the rendezvous connections kept open as a star.
//!
//! The star runs through rank 0, so that a rank that dies, goes silent or fails is named on every
//! other rank within a bounded time.
//!
//! Frames: a tag byte, the rank the frame is about (u32 LE), a body length (u32 LE) and a UTF-8
//! body (a binary one for `REPORT`, the `--check` data a rank sends rank 0 before its final
//! frame). Both ends of every connection send heartbeats; a connection that closes, or stays
//! silent longer than `Liveness::silence`, before the final frame of the rank behind it means
//! that rank is dead. Rank 0 relays what it learns about rank r (its death, or the error it
//! failed with) to every other rank; the others learn about rank 0 directly. Every rank ends
//! with one final frame, `DONE` or `FAILED`, after its last heartbeat; rank 0 closes a
//! connection only once it read that frame (or gave up waiting), so a final frame is never lost
//! to a connection reset and an orderly end is never taken for a death.

use super::rendezvous::Link;
use super::sched::Failure;
use crate::error::{ExecError, Result};
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// "Still alive"; no body.
const HEARTBEAT: u8 = b'H';
/// The rank failed; the body is its error.
const FAILED: u8 = b'F';
/// Rank 0 lost the rank; the body says how.
const DIED: u8 = b'D';
/// The rank finished cleanly; no body.
const DONE: u8 = b'E';
/// The rank's report for rank 0 (`check_report`); a binary body.
const REPORT: u8 = b'R';
/// A longer body is a broken or foreign peer, not a message.
const MAX_BODY: usize = 64 * 1024;
/// The largest report: every `--check` byte one rank may keep.
const MAX_REPORT: usize = super::check_report::MAX_BYTES;

/// The control plane's clocks.
#[derive(Clone, Copy, Debug)]
pub(super) struct Liveness {
    /// How often every rank says it is alive.
    pub heartbeat: Duration,
    /// A peer silent this long is unreachable.
    pub silence: Duration,
    /// How long rank 0, once done, waits for the other ranks' final frames (relaying meanwhile).
    pub linger: Duration,
}

impl Liveness {
    /// For a run whose ranks wait at most `timeout` for each other: 200 ms heartbeats, 5 s of
    /// silence (less under a shorter timeout), and rank 0 lingering up to the timeout.
    pub(super) fn for_run(timeout: Duration) -> Liveness {
        let heartbeat = Duration::from_millis(200);
        Liveness {
            heartbeat,
            silence: timeout.min(Duration::from_secs(5)).max(heartbeat * 4),
            linger: timeout,
        }
    }
}

/// `body` cut to `MAX_BODY` bytes at a character boundary.
fn text_body(body: &str) -> &[u8] {
    let mut end = body.len().min(MAX_BODY);
    while !body.is_char_boundary(end) {
        end -= 1;
    }
    &body.as_bytes()[..end]
}

/// A frame's head: its tag, the rank it is about and its body's length.
fn head(tag: u8, rank: u32, len: usize) -> [u8; 9] {
    let mut head = [tag, 0, 0, 0, 0, 0, 0, 0, 0];
    head[1..5].copy_from_slice(&rank.to_le_bytes());
    head[5..9].copy_from_slice(&(len as u32).to_le_bytes());
    head
}

struct Frame {
    tag: u8,
    rank: u32,
    body: Vec<u8>,
}

impl Frame {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

fn read_frame(stream: &mut impl Read) -> io::Result<Frame> {
    let mut head = [0u8; 9];
    stream.read_exact(&mut head)?;
    let rank = u32::from_le_bytes(head[1..5].try_into().expect("4 bytes"));
    let len = u32::from_le_bytes(head[5..9].try_into().expect("4 bytes")) as usize;
    let limit = match head[0] {
        REPORT => MAX_REPORT,
        _ => MAX_BODY,
    };
    if len > limit {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a frame body of {len} bytes"),
        ));
    }
    let mut body = vec![0u8; len];
    stream.read_exact(&mut body)?;
    Ok(Frame {
        tag: head[0],
        rank,
        body,
    })
}

/// What a `FAILED` or `DIED` frame about `rank` tells this rank.
fn notice(tag: u8, rank: u32, body: &str) -> ExecError {
    let message = if tag == FAILED {
        // The rank's own error usually names it already.
        let own = body.strip_prefix(&format!("rank {rank}: ")).unwrap_or(body);
        format!("failed: {own}")
    } else {
        body.to_string()
    };
    ExecError::Rank { rank, message }
}

/// Why a connection ended before the final frame of the rank behind it.
fn loss(err: &io::Error, silence: Duration) -> String {
    match err.kind() {
        io::ErrorKind::UnexpectedEof
        | io::ErrorKind::ConnectionReset
        | io::ErrorKind::ConnectionAborted
        | io::ErrorKind::BrokenPipe => "died (connection to rank 0 closed mid-run)".into(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => format!(
            "unreachable (no heartbeat for {:.1} s on the connection to rank 0)",
            silence.as_secs_f64()
        ),
        io::ErrorKind::InvalidData => format!("broke the control protocol ({err})"),
        _ => format!("unreachable (connection to rank 0: {err})"),
    }
}

/// One open connection: the rank at its other end and the writing half, shared by the
/// heartbeats, rank 0's relays and the final frame.
struct Peer {
    rank: u32,
    writer: Mutex<TcpStream>,
}

impl Peer {
    /// A failed write is not reported here: the reader of the same connection sees it broken
    /// or silent and names the rank.
    fn send(&self, tag: u8, rank: u32, body: &str) {
        self.send_bytes(tag, rank, text_body(body));
    }

    /// A frame of any body, written as its head then the body itself (a report is not copied).
    fn send_bytes(&self, tag: u8, rank: u32, body: &[u8]) {
        let mut writer = self.writer.lock().expect("a control writer lock");
        let _ = writer
            .write_all(&head(tag, rank, body.len()))
            .and_then(|()| writer.write_all(body));
    }

    /// Unblocks the connection's reader; the peer reads an end of stream.
    fn close(&self) {
        let writer = self.writer.lock().expect("a control writer lock");
        let _ = writer.shutdown(Shutdown::Both);
    }
}

/// What the control plane's threads share.
struct Shared {
    rank: u32,
    peers: Vec<Peer>,
    failure: Arc<Failure>,
    liveness: Liveness,
    /// Set once losing a connection is no longer news: a rank other than 0 after its final
    /// frame, rank 0 when it closes every connection at its end.
    quiet: AtomicBool,
    /// Rank 0: the reports the other ranks sent, with their ranks.
    reports: Mutex<Vec<(u32, Vec<u8>)>>,
}

impl Shared {
    fn heartbeat(&self, stop: Receiver<()>) {
        while let Err(RecvTimeoutError::Timeout) = stop.recv_timeout(self.liveness.heartbeat) {
            for peer in &self.peers {
                peer.send(HEARTBEAT, self.rank, "");
            }
        }
    }

    /// Rank 0: tells every rank but `about` what became of `about`.
    fn relay(&self, tag: u8, about: u32, body: &str) {
        for peer in self.peers.iter().filter(|p| p.rank != about) {
            peer.send(tag, about, body);
        }
    }

    /// Reads the connection to `self.peers[index]` until the peer's final frame or its loss.
    fn read(&self, index: usize, mut stream: TcpStream) {
        let peer = &self.peers[index];
        let hub = self.rank == 0;
        // A rank other than 0: whether rank 0 sent its final frame (its relays may still follow).
        let mut peer_ended = false;
        let err = loop {
            let frame = match read_frame(&mut stream) {
                Ok(frame) => frame,
                Err(err) => break err,
            };
            match frame.tag {
                HEARTBEAT => {}
                REPORT if hub && frame.rank == peer.rank => {
                    let mut reports = self.reports.lock().expect("a report lock");
                    reports.push((frame.rank, frame.body));
                }
                DONE | FAILED if hub && frame.rank == peer.rank => {
                    if frame.tag == FAILED {
                        self.failure
                            .raise(notice(FAILED, frame.rank, &frame.text()));
                        self.relay(FAILED, frame.rank, &frame.text());
                    }
                    peer.close();
                    return;
                }
                DONE if !hub && frame.rank == 0 => peer_ended = true,
                FAILED | DIED if !hub => {
                    self.failure
                        .raise(notice(frame.tag, frame.rank, &frame.text()));
                    peer_ended |= frame.rank == 0;
                }
                tag => {
                    break io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("frame `{}` about rank {}", tag as char, frame.rank),
                    )
                }
            }
        };
        if peer_ended || self.quiet.load(Ordering::Relaxed) {
            return;
        }
        let reason = loss(&err, self.liveness.silence);
        self.failure.raise(ExecError::Rank {
            rank: peer.rank,
            message: reason.clone(),
        });
        if hub {
            self.relay(DIED, peer.rank, &reason);
        }
    }
}

/// A rank's part of the control plane: a reader thread per connection (one on ranks other than
/// 0) and a heartbeat thread, raising the run's [`Failure`] when another rank is lost or failed.
pub(super) struct Control {
    shared: Arc<Shared>,
    readers: Vec<JoinHandle<()>>,
    /// Dropping the sender stops the heartbeats.
    heartbeat: Option<(Sender<()>, JoinHandle<()>)>,
    /// Every reader holds a sender: disconnected once all of them ended.
    ended: Receiver<()>,
}

impl Control {
    /// Starts rank `rank`'s control plane on the connections the rendezvous left open.
    pub(super) fn start(
        rank: u32,
        link: Link,
        liveness: Liveness,
        failure: Arc<Failure>,
    ) -> Result<Control> {
        let streams: Vec<(u32, TcpStream)> = match link {
            Link::Hub(streams) => (1..).zip(streams).collect(),
            Link::Spoke(stream) => vec![(0, stream)],
        };
        let mut peers = Vec::with_capacity(streams.len());
        let mut inputs = Vec::with_capacity(streams.len());
        for (peer, stream) in streams {
            let io = |source| ExecError::Io {
                what: format!("control plane: the connection between ranks {rank} and {peer}"),
                source,
            };
            stream.set_nodelay(true).map_err(io)?;
            stream
                .set_read_timeout(Some(liveness.silence))
                .map_err(io)?;
            // A peer that stopped reading must not stall the heartbeats to everyone else.
            stream
                .set_write_timeout(Some(liveness.heartbeat))
                .map_err(io)?;
            inputs.push(stream.try_clone().map_err(io)?);
            peers.push(Peer {
                rank: peer,
                writer: Mutex::new(stream),
            });
        }
        let shared = Arc::new(Shared {
            rank,
            peers,
            failure,
            liveness,
            quiet: AtomicBool::new(false),
            reports: Mutex::new(Vec::new()),
        });
        let (ended_tx, ended) = mpsc::channel();
        let readers = inputs
            .into_iter()
            .enumerate()
            .map(|(index, stream)| {
                let (shared, ended) = (shared.clone(), ended_tx.clone());
                std::thread::spawn(move || {
                    shared.read(index, stream);
                    drop(ended);
                })
            })
            .collect();
        let (stop, ticks) = mpsc::channel();
        let beating = shared.clone();
        let heartbeat = std::thread::spawn(move || beating.heartbeat(ticks));
        Ok(Control {
            shared,
            readers,
            heartbeat: Some((stop, heartbeat)),
            ended,
        })
    }

    /// Ends this rank's part: its `report` for rank 0 when it has one and did not fail, then its
    /// final frame (`DONE`, or `FAILED` with `outcome`); then rank 0 waits up to
    /// `Liveness::linger` for every other rank's final frame, relaying meanwhile, and any other
    /// rank up to `Liveness::silence` for rank 0 to close. Every thread is joined. Rank 0
    /// returns the reports it received, by rank; the others none.
    pub(super) fn finish(
        mut self,
        outcome: Option<&ExecError>,
        report: Option<Vec<u8>>,
    ) -> Vec<(u32, Vec<u8>)> {
        let shared = self.shared.clone();
        let (tag, body) = match outcome {
            None => (DONE, String::new()),
            Some(err) => (FAILED, err.to_string()),
        };
        let wait = if shared.rank == 0 {
            shared.liveness.linger
        } else {
            // Nothing may follow the final frame: rank 0 closes once it has read it.
            self.stop_heartbeats();
            shared.quiet.store(true, Ordering::Relaxed);
            shared.liveness.silence
        };
        // Only a rank other than 0 that did not fail sends a report (to rank 0, its one peer).
        let report = report.filter(|_| outcome.is_none() && shared.rank != 0);
        for peer in &shared.peers {
            if let Some(report) = &report {
                peer.send_bytes(REPORT, shared.rank, report);
            }
            peer.send(tag, shared.rank, &body);
        }
        // Nothing is ever sent on `ended`: this returns once every reader ended, or after `wait`.
        let _ = self.ended.recv_timeout(wait);
        let mut reports = std::mem::take(&mut *shared.reports.lock().expect("a report lock"));
        reports.sort_by_key(|&(rank, _)| rank);
        reports
    }

    fn stop_heartbeats(&mut self) {
        if let Some((stop, heartbeat)) = self.heartbeat.take() {
            drop(stop);
            let _ = heartbeat.join();
        }
    }
}

impl Drop for Control {
    /// Closes every connection and joins every thread, whether or not `finish` ran.
    fn drop(&mut self) {
        self.shared.quiet.store(true, Ordering::Relaxed);
        self.stop_heartbeats();
        for peer in &self.shared.peers {
            peer.close();
        }
        for reader in self.readers.drain(..) {
            let _ = reader.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::rendezvous::{join, serve};
    use std::net::TcpListener;
    use std::time::Instant;

    /// Short clocks, so that a loss is noticed well within the tests' bounds.
    const FAST: Liveness = Liveness {
        heartbeat: Duration::from_millis(50),
        silence: Duration::from_secs(1),
        linger: Duration::from_secs(3),
    };
    /// What proves "no hang": far above every clock in `FAST`.
    const BOUND: Duration = Duration::from_secs(5);

    /// A rank whose control plane runs: its number, its control plane and its run's failure.
    type Started = (u32, Control, Arc<Failure>);

    /// The connections of a `world`-rank launch on this machine, rank 0's first.
    fn links(world: u32) -> Vec<Link> {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let timeout = Duration::from_secs(10);
        std::thread::scope(|scope| {
            let spokes: Vec<_> = (1..world)
                .map(|rank| {
                    let address = &address;
                    scope.spawn(move || join(address, rank, world, timeout).unwrap().1)
                })
                .collect();
            let hub = Link::Hub(serve(listener, world, b"id", timeout).unwrap());
            std::iter::once(hub)
                .chain(spokes.into_iter().map(|s| Link::Spoke(s.join().unwrap())))
                .collect()
        })
    }

    /// Starts the control plane of every rank on `links` but those in `raw`, whose connections
    /// come back untouched (a rank that crashed or hangs).
    fn start(links: Vec<Link>, raw: &[u32]) -> (Vec<Started>, Vec<Link>) {
        let (mut started, mut untouched) = (Vec::new(), Vec::new());
        for (rank, link) in (0..).zip(links) {
            if raw.contains(&rank) {
                untouched.push(link);
            } else {
                let failure = Arc::new(Failure::default());
                let control = Control::start(rank, link, FAST, failure.clone()).unwrap();
                started.push((rank, control, failure));
            }
        }
        (started, untouched)
    }

    /// The failure `failure` reports, waiting for it within `BOUND`.
    fn reported(failure: &Failure) -> (u32, String) {
        let deadline = Instant::now() + BOUND;
        while !failure.flag().load(Ordering::Relaxed) {
            assert!(
                Instant::now() < deadline,
                "nothing reported within {BOUND:?}"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        match failure.take() {
            Some(ExecError::Rank { rank, message }) => (rank, message),
            other => panic!("not a rank's failure: {other:?}"),
        }
    }

    /// Finishes every rank at once (rank 0 lingers for the others), each with its own failure.
    fn finish_all(ranks: Vec<Started>, outcome: Option<&ExecError>) {
        std::thread::scope(|scope| {
            for (_, control, _) in ranks {
                scope.spawn(move || control.finish(outcome, None));
            }
        });
    }

    #[test]
    fn a_clean_finish_reports_nothing_even_when_rank_0_ends_first() {
        let start_at = Instant::now();
        let (mut ranks, _) = start(links(3), &[]);
        let spokes = ranks.split_off(1);
        let (_, hub, hub_failure) = ranks.pop().unwrap();
        std::thread::scope(|scope| {
            scope.spawn(move || hub.finish(None, None));
            // The others end after more than the silence: rank 0 heartbeats while it lingers.
            std::thread::sleep(FAST.silence + FAST.silence / 2);
            let failures: Vec<_> = spokes.iter().map(|(_, _, f)| f.clone()).collect();
            finish_all(spokes, None);
            for failure in failures {
                assert!(failure.take().is_none());
            }
        });
        assert!(hub_failure.take().is_none());
        assert!(start_at.elapsed() < BOUND);
    }

    #[test]
    fn a_rank_that_crashes_is_named_by_every_other_rank() {
        let start_at = Instant::now();
        let (ranks, crashed) = start(links(3), &[2]);
        std::thread::sleep(FAST.heartbeat * 3);
        drop(crashed);
        for (rank, _, failure) in &ranks {
            let (dead, message) = reported(failure);
            assert_eq!(dead, 2, "rank {rank}: {message}");
            assert!(message.contains("died"), "rank {rank}: {message}");
        }
        assert!(start_at.elapsed() < BOUND);
        let err = ExecError::Rank {
            rank: 2,
            message: "died".into(),
        };
        finish_all(ranks, Some(&err));
    }

    #[test]
    fn rank_0_dying_is_named_by_the_others() {
        let (ranks, crashed) = start(links(3), &[0]);
        std::thread::sleep(FAST.heartbeat * 3);
        drop(crashed);
        for (rank, _, failure) in &ranks {
            let (dead, message) = reported(failure);
            assert_eq!(dead, 0, "rank {rank}: {message}");
            assert!(message.contains("died"), "rank {rank}: {message}");
        }
        finish_all(ranks, None);
    }

    #[test]
    fn a_silent_rank_is_unreachable() {
        let (ranks, silent) = start(links(3), &[1]);
        for (rank, _, failure) in &ranks {
            let (dead, message) = reported(failure);
            assert_eq!(dead, 1, "rank {rank}: {message}");
            assert!(message.contains("unreachable"), "rank {rank}: {message}");
        }
        drop(silent);
        finish_all(ranks, None);
    }

    #[test]
    fn a_foreign_peer_breaks_the_protocol() {
        let (ranks, mut foreign) = start(links(2), &[1]);
        let Some(Link::Spoke(stream)) = foreign.first_mut() else {
            panic!("rank 1 is a spoke")
        };
        stream.write_all(b"GET / HTTP/1.1\r\n").unwrap();
        let (rank, message) = reported(&ranks[0].2);
        assert_eq!(rank, 1);
        assert!(message.contains("broke the control protocol"), "{message}");
        finish_all(ranks, None);
    }

    #[test]
    fn a_failing_rank_s_error_reaches_every_rank() {
        let (mut ranks, _) = start(links(3), &[]);
        let (_, failing, _) = ranks.remove(1);
        let err = ExecError::Rank {
            rank: 1,
            message: "gradient element 7 is NaN".into(),
        };
        std::thread::scope(|scope| {
            scope.spawn(|| failing.finish(Some(&err), None));
            for (rank, _, failure) in &ranks {
                let (failed, message) = reported(failure);
                assert_eq!(failed, 1, "rank {rank}: {message}");
                assert!(
                    message == "failed: gradient element 7 is NaN",
                    "rank {rank}: {message}"
                );
            }
        });
        finish_all(ranks, Some(&err));
    }

    #[test]
    fn rank_0_receives_every_report_but_a_failed_rank_s() {
        let (mut ranks, _) = start(links(4), &[]);
        let (_, hub, hub_failure) = ranks.remove(0);
        let err = ExecError::Rank {
            rank: 3,
            message: "out of memory".into(),
        };
        // A report larger than a text frame may be, and one that is empty.
        let big: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let reports = std::thread::scope(|scope| {
            let hub = scope.spawn(move || hub.finish(None, Some(b"rank 0's own".to_vec())));
            for (rank, control, _) in ranks {
                let (big, err) = (&big, &err);
                scope.spawn(move || match rank {
                    1 => control.finish(None, Some(big.clone())),
                    2 => control.finish(None, Some(Vec::new())),
                    _ => control.finish(Some(err), Some(b"never sent".to_vec())),
                });
            }
            hub.join().unwrap()
        });
        assert_eq!(reports, vec![(1, big), (2, Vec::new())]);
        let (failed, message) = reported(&hub_failure);
        assert_eq!((failed, message.as_str()), (3, "failed: out of memory"));
    }
}
