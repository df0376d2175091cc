//! The MPI transport checked against the host backend's in-process mesh.
//!
//! It runs under `mpirun -np 2` or `3` (`syncopate lab probe mpi-check`): every rank computes the
//! host ring's answer for all ranks' inputs in threads and compares its own MPI result with it.

use super::transport::Stream;
use super::world::World;
use crate::compress::rng::Rng;
use crate::compress::{codec_for, Codec};
use crate::error::{ExecError, Result};
use crate::runtime::host::comm::on_host;
use crate::runtime::push_pull::push_pull;
use crate::runtime::ring::{allgather_chunks, allreduce, reduce_scatter, Ring};
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};
use syncopate_sim::compress::Compressor;

/// Elements of the test tensors: not a multiple of 2 or 3, so chunks are uneven.
const ELEMENTS: usize = 1001;

/// How long a silent peer stays silent in the timeout check.
const SILENT_TIMEOUT: Duration = Duration::from_millis(800);

/// Runs every check; returns one line per passed check (on every rank). With `kill_rank`,
/// that rank kills itself at the start of an allreduce and the others must fail within
/// `timeout` with an error (returned as this function's error).
pub fn run(world: &World, timeout: Duration, kill_rank: Option<u32>) -> Result<Vec<String>> {
    let mut streams = world.streams(3, timeout)?;
    let abort = AtomicBool::new(false);
    let p = world.size;
    if p < 2 {
        return Err(fail("world", format!("needs at least 2 ranks, has {p}")));
    }
    if let Some(victim) = kill_rank {
        return killed_peer(&streams[0], victim, &abort);
    }
    let mut passed = Vec::new();
    for c in [Compressor::None, Compressor::Fp16, Compressor::Bf16] {
        passed.push(allreduce_matches(&streams[0], c, Inputs::Integers, &abort)?);
        passed.push(allreduce_matches(&streams[1], c, Inputs::Random, &abort)?);
        passed.push(halves_match(&streams[0], c, &abort)?);
    }
    passed.push(allgather_matches(&streams[1], &abort)?);
    passed.push(push_pull_matches(&streams[0], &abort)?);
    passed.push(broadcast_matches(&streams[1], &abort)?);
    let (first, rest) = streams.split_at_mut(2);
    passed.push(silent_peer_times_out(&mut rest[0], &first[0], &abort)?);
    streams[0].barrier(&abort)?;
    Ok(passed)
}

fn fail(check: &str, message: String) -> ExecError {
    ExecError::Check {
        group: 0,
        message: format!("MPI conformance `{check}`: {message}"),
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Inputs {
    /// Small integers: every partial sum is exact, so any summation order agrees bit for bit.
    Integers,
    /// Normal random values: orders may differ by rounding (see `transport`'s documentation).
    Random,
}

/// Rank `rank`'s gradient.
fn gradient(rank: u32, inputs: Inputs) -> Vec<f32> {
    let mut rng = Rng::for_stream(7, u64::from(rank));
    (0..ELEMENTS)
        .map(|i| match inputs {
            Inputs::Integers => ((i * 7 + rank as usize * 13) % 17) as f32 - 8.0,
            Inputs::Random => rng.normal() as f32,
        })
        .collect()
}

fn encoded(c: Compressor, grad: &[f32]) -> Result<Vec<u8>> {
    let mut payload = Vec::new();
    codec_for(&c, 0).encode(grad, &mut payload)?;
    Ok(payload)
}

fn element(c: Compressor) -> usize {
    match c {
        Compressor::Fp16 | Compressor::Bf16 => 2,
        _ => 4,
    }
}

/// The unit roundoff of the wire type.
fn roundoff(c: Compressor) -> f64 {
    match c {
        Compressor::Fp16 => 2f64.powi(-11),
        Compressor::Bf16 => 2f64.powi(-8),
        _ => 2f64.powi(-24),
    }
}

fn decoded(c: Compressor, payload: &[u8]) -> Result<Vec<f32>> {
    let mut out = vec![0.0f32; ELEMENTS];
    codec_for(&c, 0).decode_add(payload, &mut out)?;
    Ok(out)
}

fn allreduce_matches(
    stream: &Stream,
    c: Compressor,
    inputs: Inputs,
    abort: &AtomicBool,
) -> Result<String> {
    let (p, r) = (stream.world, stream.rank);
    let check = format!("allreduce {c} ({inputs:?})");
    let codec = codec_for(&c, 0);
    let mut mine = encoded(c, &gradient(r, inputs))?;
    stream.allreduce(&mut mine, element(c), &*codec, abort)?;
    let host = on_host(p, |mesh, abort| {
        let mut payload = encoded(c, &gradient(mesh.rank, inputs))?;
        let ring = Ring::world(mesh.rank as usize, p as usize);
        allreduce(
            mesh,
            &ring,
            &mut payload,
            element(c),
            &*codec_for(&c, 0),
            abort,
        )?;
        Ok(payload)
    })?;
    let expected = &host[r as usize];
    if inputs == Inputs::Integers || p == 2 {
        if mine != *expected {
            return Err(fail(&check, "differs from the host ring's bytes".into()));
        }
        return Ok(format!(
            "{check}: bit-identical to the host ring on {p} ranks"
        ));
    }
    let (got, want) = (decoded(c, &mine)?, decoded(c, expected)?);
    let magnitude: Vec<f64> = (0..ELEMENTS)
        .map(|i| {
            (0..p)
                .map(|q| f64::from(gradient(q, inputs)[i]).abs())
                .sum()
        })
        .collect();
    let bound = 2.0 * f64::from(p - 1) * roundoff(c);
    for i in 0..ELEMENTS {
        let diff = (f64::from(got[i]) - f64::from(want[i])).abs();
        // The host's inputs were already rounded to the wire type; its rounding is part of
        // both sides, so the bound covers the additions only.
        if diff > bound * magnitude[i] * 1.01 + f64::EPSILON {
            return Err(fail(
                &check,
                format!(
                    "element {i}: {} vs the host ring's {} (bound {:.3e})",
                    got[i],
                    want[i],
                    bound * magnitude[i]
                ),
            ));
        }
    }
    Ok(format!(
        "{check}: within 2(p−1)·u·Σ|x| of the host ring on {p} ranks"
    ))
}

/// The ring's reduce-scatter then all-gather over MPI: the same owned chunk and the same final
/// sum as over the in-process mesh.
fn halves_match(stream: &Stream, c: Compressor, abort: &AtomicBool) -> Result<String> {
    let (p, r) = (stream.world, stream.rank);
    let check = format!("reduce-scatter + allgather {c}");
    let codec = codec_for(&c, 0);
    let e = element(c);
    let mut mine = encoded(c, &gradient(r, Inputs::Integers))?;
    let ring = Ring::world(r as usize, p as usize);
    reduce_scatter(stream, &ring, &mut mine, e, &*codec, abort)?;
    let after_half = mine.clone();
    allgather_chunks(stream, &ring, &mut mine, e, abort)?;
    let host = on_host(p, |mesh, abort| {
        let mut payload = encoded(c, &gradient(mesh.rank, Inputs::Integers))?;
        let ring = Ring::world(mesh.rank as usize, p as usize);
        reduce_scatter(mesh, &ring, &mut payload, e, &*codec_for(&c, 0), abort)?;
        let half = payload.clone();
        allgather_chunks(mesh, &ring, &mut payload, e, abort)?;
        Ok((half, payload))
    })?;
    let (host_half, host_full) = &host[r as usize];
    let elements = mine.len() / e;
    let owned = (r as usize + 1) % p as usize;
    let range = (elements * owned / p as usize) * e..(elements * (owned + 1) / p as usize) * e;
    if after_half[range.clone()] != host_half[range] {
        return Err(fail(
            &check,
            "the owned chunk differs from the host ring's".into(),
        ));
    }
    if mine != *host_full {
        return Err(fail(
            &check,
            "the gathered result differs from the host ring's".into(),
        ));
    }
    Ok(format!(
        "{check}: owned chunk (r+1 mod p) and result bit-identical to the host ring"
    ))
}

fn allgather_matches(stream: &Stream, abort: &AtomicBool) -> Result<String> {
    let (p, r) = (stream.world, stream.rank);
    let block = |rank: u32| -> Vec<u8> {
        (0..rank as usize * 37 + 5)
            .map(|i| (i as u8) ^ rank as u8)
            .collect()
    };
    let got = stream.allgather(block(r), abort)?;
    let host = on_host(p, |mesh, abort| mesh.allgather(block(mesh.rank), abort))?;
    if got != host[r as usize] {
        return Err(fail("allgather", "differs from the host ring's".into()));
    }
    let sizes: Vec<usize> = got.iter().map(Vec::len).collect();
    Ok(format!(
        "allgather of unequal sizes {sizes:?}: identical to the host ring"
    ))
}

fn push_pull_matches(stream: &Stream, abort: &AtomicBool) -> Result<String> {
    let (p, r) = (stream.world, stream.rank);
    let c = Compressor::TopK { ratio: 0.1 };
    let server = p as usize - 1;
    let push = |rank: u32| -> Result<Vec<u8>> { encoded(c, &gradient(rank, Inputs::Random)) };
    let mut codec: Box<dyn Codec> = codec_for(&c, 0);
    let mut server_codec: Box<dyn Codec> = codec_for(&c, 0);
    let got = push_pull(
        stream,
        push(r)?,
        server,
        &mut *codec,
        &mut *server_codec,
        ELEMENTS,
        abort,
    )?;
    let host = on_host(p, |mesh, abort| {
        let (mut codec, mut server_codec) = (codec_for(&c, 0), codec_for(&c, 0));
        push_pull(
            mesh,
            push(mesh.rank)?,
            server,
            &mut *codec,
            &mut *server_codec,
            ELEMENTS,
            abort,
        )
    })?;
    if got != host[r as usize] {
        return Err(fail(
            "push/pull",
            "the pulled payload differs from the host's".into(),
        ));
    }
    Ok(format!(
        "push/pull with {c} through server rank {server}: pulled payload identical to the host's"
    ))
}

fn broadcast_matches(stream: &Stream, abort: &AtomicBool) -> Result<String> {
    let root = 1;
    let sent: Vec<u8> = (0..777u32).map(|i| (i * 3) as u8).collect();
    let mut payload = if stream.rank == root {
        sent.clone()
    } else {
        Vec::new()
    };
    stream.broadcast(&mut payload, root as usize, abort)?;
    if payload != sent {
        return Err(fail("broadcast", "a rank received other bytes".into()));
    }
    Ok(format!(
        "broadcast of {} bytes from rank {root}",
        sent.len()
    ))
}

/// The last rank stays silent past the others' timeout: their barrier must fail in time,
/// naming the operation. Then it joins: their abandoned barrier is still in flight inside MPI
/// and completes with it, so the job ends cleanly.
fn silent_peer_times_out(short: &mut Stream, after: &Stream, abort: &AtomicBool) -> Result<String> {
    let quiet = short.world - 1;
    short.timeout = SILENT_TIMEOUT;
    if short.rank == quiet {
        std::thread::sleep(SILENT_TIMEOUT * 2);
        short
            .barrier(abort)
            .map_err(|e| fail("silent peer", format!("the late rank's own barrier: {e}")))?;
    } else {
        let start = Instant::now();
        let err = match short.barrier(abort) {
            Ok(()) => {
                return Err(fail(
                    "silent peer",
                    "the barrier completed without the silent rank".into(),
                ))
            }
            Err(err) => err,
        };
        let waited = start.elapsed();
        if waited > SILENT_TIMEOUT + Duration::from_millis(500) || waited < SILENT_TIMEOUT {
            return Err(fail(
                "silent peer",
                format!("gave up after {waited:?}, the timeout is {SILENT_TIMEOUT:?}"),
            ));
        }
        if !err.to_string().contains("did not complete within") {
            return Err(fail("silent peer", format!("unexpected error: {err}")));
        }
    }
    after.barrier(abort)?;
    Ok(format!(
        "a rank silent for {:?} makes the others fail within the {SILENT_TIMEOUT:?} timeout",
        SILENT_TIMEOUT * 2
    ))
}

/// `victim` dies with SIGKILL at the start of an allreduce; the survivors' allreduce must end
/// in an error within the stream's timeout (unless the launcher ends them first).
fn killed_peer(stream: &Stream, victim: u32, abort: &AtomicBool) -> Result<Vec<String>> {
    if victim >= stream.world {
        return Err(fail(
            "killed peer",
            format!("--kill-rank {victim} is not a rank of {}", stream.world),
        ));
    }
    stream.barrier(abort)?;
    if stream.rank == victim {
        // SAFETY: raising SIGKILL on ourselves has no memory-safety preconditions.
        unsafe {
            libc::kill(libc::getpid(), libc::SIGKILL);
        }
    }
    let codec = codec_for(&Compressor::None, 0);
    let mut payload = encoded(Compressor::None, &gradient(stream.rank, Inputs::Integers))?;
    let start = Instant::now();
    let result = stream.allreduce(&mut payload, 4, &*codec, abort);
    match result {
        Ok(()) => Err(fail(
            "killed peer",
            format!("allreduce completed although rank {victim} was killed"),
        )),
        Err(err) => Err(ExecError::Rank {
            rank: victim,
            message: format!(
                "killed; rank {} noticed after {:.1} s: {err}",
                stream.rank,
                start.elapsed().as_secs_f64()
            ),
        }),
    }
}
