//! Measurements of a lab's network over real sockets between its namespaces.
//!
//! They cover single-stream TCP goodput, small-message round trip, the time of messages around the
//! shaper's burst, and the MPI collective sweeps (allreduce, the backend's allgather).
//!
//! The probes run as hidden subcommands of the `syncopate` binary itself (`lab probe …`),
//! started inside the namespaces with `ip netns exec`; every socket wait has a timeout and the
//! orchestration bounds each probe process in time.

use super::run::{self, Output, RunSpec};
use super::state::LabState;
use crate::error::{ExecError, Result};
use crate::measure::profile_host::median;
use crate::measure::records::{CollectivePoint, ContentionPoint, Pace, Spread};
use crate::tool;
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};
use syncopate_sim::collective_op::Op;

/// The port the probe server listens on inside node 1's (fresh) namespace.
pub const PROBE_PORT: u16 = 47_000;

/// Bytes of each ping and pong of the round-trip probe.
pub const PING_BYTES: u32 = 64;

/// Message sizes whose one-way time shows the shaper's burst: below, around and far above it.
pub const BURST_PROBE_BYTES: [u32; 4] = [4 << 10, 64 << 10, 256 << 10, 1 << 20];

/// How long a socket waits for its peer before the probe fails.
const SOCKET_TIMEOUT: Duration = Duration::from_secs(10);

/// The buffer a goodput probe writes.
const GOODPUT_CHUNK: usize = 1 << 20;

/// The `syncopate` binary, whose hidden `lab probe` subcommands run inside the namespaces.
#[derive(Clone, Debug)]
pub struct SelfExe(pub PathBuf);

impl SelfExe {
    /// The running executable.
    pub fn current() -> Result<SelfExe> {
        std::env::current_exe()
            .map(SelfExe)
            .map_err(|source| ExecError::Io {
                what: "finding the syncopate executable".into(),
                source,
            })
    }

    /// `syncopate lab probe WHAT args…`
    pub fn probe(&self, what: &str, args: &[String]) -> Vec<String> {
        [self.path_str(), "lab".into(), "probe".into(), what.into()]
            .into_iter()
            .chain(args.iter().cloned())
            .collect()
    }

    fn path_str(&self) -> String {
        self.0.to_string_lossy().into_owned()
    }

    /// The executable's path.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

/// The one-way time of a message of `bytes` (with a 64-byte answer), against the shaped rate.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct BurstPoint {
    /// Bytes of the message.
    pub bytes: u32,
    /// Median round trip of the message and its small answer, µs.
    pub round_trip_us: f64,
    /// The message's bytes over (round trip − small-message round trip): the rate it saw.
    pub effective_gbps: f64,
}

/// What the TCP probe measured from node 0 to node 1.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NetworkProbe {
    /// Bytes acknowledged by the receiver per second of one stream, Gb/s.
    pub goodput_gbps: f64,
    /// Seconds from the first write to the receiver's count of the bytes it got.
    pub goodput_seconds: f64,
    /// Bytes the receiver got during the goodput probe.
    pub goodput_bytes: u64,
    /// Round trips of a 64-byte ping and pong, µs.
    pub rtt_us: Spread,
    /// One point per message size of [`BURST_PROBE_BYTES`].
    pub burst: Vec<BurstPoint>,
}

/// `lab probe serve`: listens on `listen`, prints `ready`, and serves probes (see [`serve_on`]).
pub fn serve(listen: SocketAddr, limit: Duration) -> Result<()> {
    let listener = TcpListener::bind(listen).map_err(|source| ExecError::Io {
        what: format!("probe server: binding {listen}"),
        source,
    })?;
    println!("ready");
    std::io::stdout().flush().map_err(|source| ExecError::Io {
        what: "probe server: stdout".into(),
        source,
    })?;
    serve_on(listener, limit)
}

/// Accepts probe connections one after another until a client says it is done or `limit`
/// passes.
pub fn serve_on(listener: TcpListener, limit: Duration) -> Result<()> {
    let listen = listener
        .local_addr()
        .map_or_else(|_| "?".to_string(), |a| a.to_string());
    let io = |what: &str| {
        let what = format!("probe server on {listen}: {what}");
        move |source| ExecError::Io { what, source }
    };
    listener.set_nonblocking(true).map_err(io("listen"))?;
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        match listener.accept() {
            Ok((stream, _)) => {
                if !answer(stream, deadline).map_err(io("connection"))? {
                    return Ok(());
                }
            }
            Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(err) => return Err(io("accept")(err)),
        }
    }
    Err(ExecError::Timeout {
        rank: 0,
        waiting: 1,
        what: format!("the probe client to finish (server {listen})"),
        seconds: limit.as_secs_f64(),
    })
}

/// Serves one connection; false when the client said it is done.
fn answer(mut stream: TcpStream, deadline: Instant) -> std::io::Result<bool> {
    stream.set_nonblocking(false)?;
    stream.set_nodelay(true)?;
    let left = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1));
    stream.set_read_timeout(Some(left.min(SOCKET_TIMEOUT)))?;
    stream.set_write_timeout(Some(left.min(SOCKET_TIMEOUT)))?;
    let mut mode = [0u8; 1];
    stream.read_exact(&mut mode)?;
    match mode[0] {
        b'G' => {
            let mut buffer = vec![0u8; GOODPUT_CHUNK];
            let mut total: u64 = 0;
            loop {
                let n = stream.read(&mut buffer)?;
                if n == 0 {
                    break;
                }
                total += n as u64;
            }
            stream.write_all(&total.to_le_bytes())?;
        }
        b'P' => {
            let mut sizes = [0u8; 8];
            stream.read_exact(&mut sizes)?;
            let request = u32::from_le_bytes(sizes[..4].try_into().expect("4 bytes")) as usize;
            let reply = u32::from_le_bytes(sizes[4..].try_into().expect("4 bytes")) as usize;
            let mut message = vec![0u8; request.max(1)];
            let pong = vec![0u8; reply];
            // Until the client closes: one message in, one reply out.
            while read_message(&mut stream, &mut message[..request])? {
                stream.write_all(&pong)?;
            }
        }
        b'Q' => return Ok(false),
        other => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("unknown probe mode byte {other}"),
            ))
        }
    }
    Ok(true)
}

/// Reads one whole message; false on a clean end of stream before its first byte.
fn read_message(stream: &mut TcpStream, message: &mut [u8]) -> std::io::Result<bool> {
    let mut got = 0;
    while got < message.len() {
        let n = stream.read(&mut message[got..])?;
        if n == 0 {
            if got == 0 {
                return Ok(false);
            }
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        got += n;
    }
    Ok(true)
}

/// How long and how often the client probes.
#[derive(Clone, Copy, Debug)]
pub struct ProbeOptions {
    /// Seconds the goodput probe streams for.
    pub goodput_seconds: f64,
    /// Timed round trips of the 64-byte ping.
    pub round_trips: usize,
    /// Timed round trips of each burst-probe message size.
    pub burst_repeats: usize,
}

impl Default for ProbeOptions {
    fn default() -> ProbeOptions {
        ProbeOptions {
            goodput_seconds: 3.0,
            round_trips: 2000,
            burst_repeats: 20,
        }
    }
}

/// `lab probe client`: measures goodput, round trip and burst against the server at `server`.
pub fn probe(server: SocketAddr, options: &ProbeOptions) -> Result<NetworkProbe> {
    let io = |what: &str| {
        let what = format!("probe of {server}: {what}");
        move |source| ExecError::Io { what, source }
    };
    let (goodput_bytes, goodput_seconds) =
        goodput(server, options.goodput_seconds).map_err(io("goodput"))?;
    let rtts = round_trips(server, PING_BYTES, options.round_trips).map_err(io("round trip"))?;
    let rtt_us = Spread::of(&rtts);
    let mut burst = Vec::new();
    for bytes in BURST_PROBE_BYTES {
        let times = round_trips(server, bytes, options.burst_repeats).map_err(io("burst"))?;
        let round_trip_us = median(times);
        let one_way = (round_trip_us - rtt_us.median).max(1e-3);
        burst.push(BurstPoint {
            bytes,
            round_trip_us,
            effective_gbps: f64::from(bytes) * 8.0 / one_way / 1e3,
        });
    }
    let mut done = TcpStream::connect_timeout(&server, SOCKET_TIMEOUT).map_err(io("connect"))?;
    done.write_all(b"Q").map_err(io("finish"))?;
    Ok(NetworkProbe {
        goodput_gbps: goodput_bytes as f64 * 8.0 / goodput_seconds / 1e9,
        goodput_seconds,
        goodput_bytes,
        rtt_us,
        burst,
    })
}

fn connect(server: SocketAddr, mode: u8) -> std::io::Result<TcpStream> {
    let mut stream = TcpStream::connect_timeout(&server, SOCKET_TIMEOUT)?;
    stream.set_read_timeout(Some(SOCKET_TIMEOUT))?;
    stream.set_write_timeout(Some(SOCKET_TIMEOUT))?;
    stream.write_all(&[mode])?;
    Ok(stream)
}

/// Streams for `seconds`, then waits for the receiver's count: bytes the receiver got over
/// the time from the first write to its acknowledgement.
fn goodput(server: SocketAddr, seconds: f64) -> std::io::Result<(u64, f64)> {
    let mut stream = connect(server, b'G')?;
    let chunk = vec![0x5au8; GOODPUT_CHUNK];
    let start = Instant::now();
    let stop = Duration::from_secs_f64(seconds);
    while start.elapsed() < stop {
        stream.write_all(&chunk)?;
    }
    stream.shutdown(Shutdown::Write)?;
    let mut count = [0u8; 8];
    stream.read_exact(&mut count)?;
    Ok((u64::from_le_bytes(count), start.elapsed().as_secs_f64()))
}

/// `count` round trips of a `bytes` message and a 64-byte answer (after a few to warm up),
/// each in µs.
fn round_trips(server: SocketAddr, bytes: u32, count: usize) -> std::io::Result<Vec<f64>> {
    let mut stream = connect(server, b'P')?;
    stream.set_nodelay(true)?;
    let mut sizes = bytes.to_le_bytes().to_vec();
    sizes.extend(PING_BYTES.to_le_bytes());
    stream.write_all(&sizes)?;
    let message = vec![0xa5u8; bytes as usize];
    let mut pong = vec![0u8; PING_BYTES as usize];
    let warmup = (count / 10).clamp(2, 50);
    let mut times = Vec::with_capacity(count);
    for i in 0..warmup + count.max(1) {
        let start = Instant::now();
        stream.write_all(&message)?;
        stream.read_exact(&mut pong)?;
        if i >= warmup {
            times.push(start.elapsed().as_secs_f64() * 1e6);
        }
    }
    Ok(times)
}

/// Runs the TCP probe from node 0 to node 1 of `lab`, each side in its namespace.
pub fn network(lab: &LabState, exe: &SelfExe, options: &ProbeOptions) -> Result<NetworkProbe> {
    let server_node = &lab.nodes[1];
    let server = format!("{}:{PROBE_PORT}", server_node.address);
    // Generous: the probes' own work plus start-up; the client's sockets time out sooner.
    let limit_s = options.goodput_seconds + 60.0;
    let serve = exe.probe(
        "serve",
        &[
            "--listen".into(),
            server.clone(),
            "--seconds".into(),
            format!("{limit_s}"),
        ],
    );
    let mut server_process = in_namespace(&server_node.namespace, &serve)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|err| ExecError::Tool {
            command: serve.join(" "),
            message: format!("cannot start the probe server: {err}"),
        })?;
    let result = client_against(lab, exe, &mut server_process, &server, options, limit_s);
    match result {
        Ok(probe) => {
            let status = tool::wait_bounded(&mut server_process, Duration::from_secs(10)).map_err(
                |message| ExecError::Tool {
                    command: serve.join(" "),
                    message,
                },
            );
            if status.is_err() {
                tool::kill(&mut server_process);
            }
            status?;
            Ok(probe)
        }
        Err(err) => {
            tool::kill(&mut server_process);
            Err(err)
        }
    }
}

fn client_against(
    lab: &LabState,
    exe: &SelfExe,
    server_process: &mut std::process::Child,
    server: &str,
    options: &ProbeOptions,
    limit_s: f64,
) -> Result<NetworkProbe> {
    wait_ready(server_process, Duration::from_secs(10))?;
    let client = exe.probe(
        "client",
        &[
            "--connect".into(),
            server.to_string(),
            "--seconds".into(),
            format!("{}", options.goodput_seconds),
            "--round-trips".into(),
            options.round_trips.to_string(),
            "--burst-repeats".into(),
            options.burst_repeats.to_string(),
        ],
    );
    let mut child = in_namespace(&lab.nodes[0].namespace, &client)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|err| ExecError::Tool {
            command: client.join(" "),
            message: format!("cannot start the probe client: {err}"),
        })?;
    let mut stdout = child.stdout.take().expect("piped");
    let mut stderr = child.stderr.take().expect("piped");
    let reader = std::thread::spawn(move || {
        let (mut out, mut err) = (String::new(), String::new());
        let _ = stdout.read_to_string(&mut out);
        let _ = stderr.read_to_string(&mut err);
        (out, err)
    });
    let status = tool::wait_bounded(&mut child, Duration::from_secs_f64(limit_s));
    if status.is_err() {
        tool::kill(&mut child);
    }
    let (out, err) = reader.join().unwrap_or_default();
    let status = status.map_err(|message| ExecError::Tool {
        command: client.join(" "),
        message,
    })?;
    if !status.success() {
        return Err(ExecError::Tool {
            command: client.join(" "),
            message: format!("{status}: {}", tool::first_line_or(&err, "no message")),
        });
    }
    serde_json::from_str(out.trim()).map_err(|e| ExecError::Tool {
        command: client.join(" "),
        message: format!("unreadable probe result ({e}): {}", out.trim()),
    })
}

/// `ip netns exec NS argv…`
fn in_namespace(namespace: &str, argv: &[String]) -> Command {
    let mut command = Command::new("ip");
    command
        .args(["netns", "exec", namespace])
        .args(argv)
        .stdin(Stdio::null());
    command
}

/// Waits for the probe server's `ready` line, at most `limit`.
fn wait_ready(server: &mut std::process::Child, limit: Duration) -> Result<()> {
    let stdout = server.stdout.take().expect("piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    match rx.recv_timeout(limit) {
        Ok(line) if line.trim() == "ready" => Ok(()),
        Ok(line) => Err(ExecError::Tool {
            command: "syncopate lab probe serve".into(),
            message: format!("did not start listening (said `{}`)", line.trim()),
        }),
        Err(_) => Err(ExecError::Tool {
            command: "syncopate lab probe serve".into(),
            message: format!("not listening after {:.0} s", limit.as_secs_f64()),
        }),
    }
}

/// The sweep's sizes: 4 KiB to 32 MiB, fourfold apart, and the last (largest) repeated more.
pub fn sweep_sizes() -> Vec<u64> {
    let mut sizes = vec![4u64 << 10];
    while let Some(&last) = sizes.last().filter(|&&s| s < 32 << 20) {
        sizes.push((last * 4).min(32 << 20));
    }
    sizes
}

/// Runs a collective micro-benchmark over MPI with one rank per node of `lab` (the binary's
/// hidden `lab probe sweep --op OP`, built with the `mpi` feature) and returns its sweep.
pub fn sweep(
    lab: &LabState,
    exe: &SelfExe,
    op: Op,
    sizes: &[u64],
    repeats: usize,
    timeout: Duration,
    interrupted: &AtomicBool,
) -> Result<Vec<CollectivePoint>> {
    let list: Vec<String> = sizes.iter().map(u64::to_string).collect();
    let args = [
        "--op".into(),
        op.name().into(),
        "--sizes".into(),
        list.join(","),
    ];
    mpi_probe(lab, exe, "sweep", &args, repeats, timeout, interrupted)
}

/// Runs the contention probe over MPI with one rank per node of `lab` (the hidden `lab probe
/// contention`): how compute and allreduces of `sizes` slow each other on its ranks.
pub fn contention(
    lab: &LabState,
    exe: &SelfExe,
    sizes: &[u64],
    repeats: usize,
    timeout: Duration,
    interrupted: &AtomicBool,
) -> Result<ContentionPoint> {
    let list: Vec<String> = sizes.iter().map(u64::to_string).collect();
    let args = ["--sizes".into(), list.join(",")];
    mpi_probe(lab, exe, "contention", &args, repeats, timeout, interrupted)
}

/// Runs the pace probe over MPI with one rank per node of `lab` (the hidden `lab probe pace`):
/// one launch, one draw, as one run's start.
pub fn pace(
    lab: &LabState,
    exe: &SelfExe,
    timeout: Duration,
    interrupted: &AtomicBool,
) -> Result<Pace> {
    mpi_probe(lab, exe, "pace", &[], 1, timeout, interrupted)
}

/// Runs the hidden `lab probe NAME ARGS --repeats R --timeout-s T` over MPI with one rank per
/// node and parses rank 0's JSON.
fn mpi_probe<T: serde::de::DeserializeOwned>(
    lab: &LabState,
    exe: &SelfExe,
    name: &str,
    args: &[String],
    repeats: usize,
    timeout: Duration,
    interrupted: &AtomicBool,
) -> Result<T> {
    let mut args = args.to_vec();
    args.extend([
        "--repeats".into(),
        repeats.to_string(),
        "--timeout-s".into(),
        format!("{}", timeout.as_secs_f64()),
    ]);
    let command = exe.probe(name, &args);
    let spec = RunSpec {
        ranks_per_node: 1,
        mpi: true,
        timeout,
        command,
        master_port: run::DEFAULT_MASTER_PORT,
        output: Output::Capture,
    };
    let outcome = run::run(lab, &spec, interrupted)?;
    serde_json::from_str(outcome.stdout.trim()).map_err(|e| ExecError::Tool {
        command: format!("syncopate lab probe {name}"),
        message: format!(
            "unreadable output ({e}): {}",
            tool::first_line_or(&outcome.stdout, "(no output)")
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes_measure_a_loopback_server() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || serve_on(listener, Duration::from_secs(60)));
        let options = ProbeOptions {
            goodput_seconds: 0.1,
            round_trips: 20,
            burst_repeats: 2,
        };
        let result = probe(address, &options).unwrap();
        server.join().unwrap().unwrap();
        assert!(result.goodput_bytes > 0 && result.goodput_gbps > 0.0);
        assert_eq!(result.rtt_us.repeats, 20);
        assert!(result.rtt_us.min > 0.0 && result.rtt_us.min <= result.rtt_us.max);
        assert_eq!(result.burst.len(), BURST_PROBE_BYTES.len());
    }

    #[test]
    fn sweep_sizes_span_kilobytes_to_tens_of_megabytes() {
        let sizes = sweep_sizes();
        assert_eq!(sizes.first(), Some(&4096));
        assert_eq!(sizes.last(), Some(&(32 << 20)));
        assert!(sizes.windows(2).all(|w| w[1] > w[0]));
    }
}
