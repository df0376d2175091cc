//! The collective micro-benchmarks over the MPI transport that `lab up` sweeps.
//!
//! They are fp32 allreduce and the backend's allgather: per size, a warm-up and then timed repeats,
//! each started together after a barrier; the median and spread as rank 0 saw them.

use super::records::{
    check_swept, CollectivePoint, CommBesideCompute, ContentionPoint, Pace, QueueBehind, Spread,
};
use crate::compress::codec_for;
use crate::error::{ExecError, Result};
use crate::runtime::host::busy::BusyWork;
use crate::runtime::mpi::transport::Stream;
use crate::runtime::mpi::world::World;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};
use syncopate_sim::collective_op::Op;
use syncopate_sim::compress::Compressor;
use syncopate_sim::SimError;

/// The largest size the sweep accepts (per rank): 1 GiB.
pub const MAX_BYTES: u64 = 1 << 30;

/// The most repeats per size.
pub const MAX_REPEATS: usize = 1000;

/// Checks the sweep's arguments, naming the flag at fault.
pub fn check(sizes: &[u64], repeats: usize, timeout: Duration) -> Result<()> {
    if let Some(&bad) = sizes.iter().find(|&&s| !(4..=MAX_BYTES).contains(&s)) {
        return Err(SimError::bad_value(
            "--sizes",
            bad,
            format!("each size is 4 to {MAX_BYTES} bytes"),
        )
        .into());
    }
    if sizes.is_empty() {
        return Err(SimError::bad_value("--sizes", "(none)", "give at least one size").into());
    }
    check_repeats(repeats, timeout)
}

/// Checks `--repeats` and `--timeout-s`.
fn check_repeats(repeats: usize, timeout: Duration) -> Result<()> {
    if repeats == 0 || repeats > MAX_REPEATS {
        return Err(
            SimError::bad_value("--repeats", repeats, format!("from 1 to {MAX_REPEATS}")).into(),
        );
    }
    if timeout.is_zero() {
        return Err(SimError::bad_value("--timeout-s", 0, "operations need time").into());
    }
    Ok(())
}

/// Times `op` (an fp32 allreduce, or the backend's allgather of payloads of any length) at
/// every size over all ranks of this MPI job: sizes as nccl-tests counts them, an allreduce's
/// buffer and an allgather's gathered total, rounded down to whole floats per rank. Rank 0
/// returns the sweep; the other ranks return an empty one.
pub fn sweep(
    world: &World,
    op: Op,
    sizes: &[u64],
    repeats: usize,
    timeout: Duration,
) -> Result<Vec<CollectivePoint>> {
    check(sizes, repeats, timeout)?;
    check_swept(op)?;
    let ranks = u64::from(world.size);
    if let Some(&small) = sizes
        .iter()
        .find(|&&s| op == Op::Allgather && s < 4 * ranks)
    {
        return Err(SimError::bad_value(
            "--sizes",
            small,
            format!("an allgather over {ranks} ranks gathers at least one float from each: 4 × {ranks} bytes or more"),
        )
        .into());
    }
    let streams = world.streams(1, timeout)?;
    let stream = &streams[0];
    let abort = AtomicBool::new(false);
    let codec = codec_for(&Compressor::None, 0);
    let mut points = Vec::new();
    for &size in sizes {
        let elements = match op {
            Op::Allgather => (size / 4 / ranks * ranks) as usize,
            _ => (size / 4) as usize,
        };
        let values: Vec<u8> = (0..elements)
            .flat_map(|i| ((i % 251) as f32 + world.rank as f32).to_le_bytes())
            .collect();
        let mine = &values[..values.len() / ranks as usize];
        let mut times = Vec::with_capacity(repeats);
        // One untimed run first: connection set-up and buffer first touch.
        for timed in std::iter::once(false).chain(std::iter::repeat_n(true, repeats)) {
            // Each call's buffer is made before its clock starts.
            let mut payload = match op {
                Op::Allgather => mine.to_vec(),
                _ => values.clone(),
            };
            stream.barrier(&abort)?;
            let start = Instant::now();
            match op {
                Op::Allgather => drop(stream.allgather(payload, &abort)?),
                _ => stream.allreduce(&mut payload, 4, &*codec, &abort)?,
            }
            if timed {
                times.push(start.elapsed().as_secs_f64());
            }
        }
        let seconds = Spread::of(&times);
        let bytes = elements as u64 * 4;
        points.push(CollectivePoint {
            bytes,
            seconds,
            busbw_gbps: op.bus_factor(world.size) * bytes as f64 * 8.0 / seconds.median / 1e9,
        });
    }
    drop(streams);
    Ok(if world.rank == 0 { points } else { Vec::new() })
}

/// Collectives timed back to back beside compute per repeat, of which the median is kept: each
/// waits for the scheduler in steps of its tick (4 ms here), so one call is a draw.
const BESIDE_COMPUTE_CALLS: usize = 5;

/// The compute work of one contention measurement.
const CONTENTION_COMPUTE_NS: u64 = 200_000_000;

/// The small allreduce timed behind another stream's large ones: a bias's or a norm's gradient.
const QUEUE_SMALL_BYTES: u64 = 4096;
/// Repeats of the queue measurement, and small allreduces timed in each, a gap apart. A small
/// allreduce waits behind what the large one has queued at that moment: a whole ring step's
/// message (about 17 ms of a 1 Gb/s link for 4 MiB on 2 ranks) or nothing, between steps. The
/// mean over many calls is the wait to expect.
const QUEUE_REPEATS: usize = 3;
const QUEUE_CALLS: usize = 12;
const QUEUE_GAP: Duration = Duration::from_millis(2);
/// The large allreduces start this much earlier than the small ones, so that they have filled
/// the connections.
const QUEUE_HEAD_START: Duration = Duration::from_millis(20);

/// Measures, `repeats` times each, with every rank doing the same at once: calibrated compute
/// alone; compute while a second thread runs allreduces of the largest of `sizes` (enough of
/// them to span the compute); compute beside a second computing thread; one allreduce and one
/// allgather (of payloads of any length, as the backend's exchanges gather them) of every size,
/// alone and while a second thread computes; an allreduce of `QUEUE_SMALL_BYTES` alone and while
/// a second stream runs allreduces of the largest size. The compute loop is the MPI backend's own
/// (calibrated with every rank running it), the collectives the transport's: what a run of the
/// backend does. Each time is the slowest rank's; rank 0 returns the point.
pub fn contention(
    world: &World,
    sizes: &[u64],
    repeats: usize,
    timeout: Duration,
) -> Result<Option<ContentionPoint>> {
    check(sizes, repeats, timeout)?;
    if sizes.iter().all(|&s| s < 2 * QUEUE_SMALL_BYTES) {
        return Err(SimError::bad_value(
            "--sizes",
            sizes.iter().max().copied().unwrap_or(0),
            format!(
                "the largest size must be at least {} bytes: a {QUEUE_SMALL_BYTES}-byte allreduce is timed behind it",
                2 * QUEUE_SMALL_BYTES
            ),
        )
        .into());
    }
    let mut streams = world.streams(3, timeout)?;
    // The collectives run on threads of their own, which own their streams while they run.
    let second = streams.pop().expect("three streams");
    let mut comm = streams.pop().expect("three streams");
    let control = streams.pop().expect("three streams");
    let abort = AtomicBool::new(false);
    let largest = sizes.iter().copied().max().expect("checked: a size") / 4 * 4;
    let payload: Vec<u8> = (0..largest / 4)
        .flat_map(|i| (i as f32).to_le_bytes())
        .collect();
    control.barrier(&abort)?;
    let busy = BusyWork::for_rank_process();
    // Sizes as nccl-tests count them: an allreduce's buffer, an allgather's gathered total.
    let collectives: Vec<(Op, u64)> = [Op::Allreduce, Op::Allgather]
        .into_iter()
        .flat_map(|op| sizes.iter().map(move |&s| (op, s / 4 * 4)))
        .collect();
    let ranks = u64::from(world.size);
    // Each call's buffer and codec are made before its clock starts.
    let collective = |comm: &Stream, (op, bytes): (Op, u64)| -> Result<f64> {
        if op == Op::Allgather {
            let mine = payload[..(bytes / ranks) as usize].to_vec();
            let start = Instant::now();
            comm.allgather(mine, &abort)?;
            return Ok(start.elapsed().as_secs_f64());
        }
        let mut p = payload[..bytes as usize].to_vec();
        let codec = codec_for(&Compressor::None, 0);
        let start = Instant::now();
        comm.allreduce(&mut p, 4, &*codec, &abort)?;
        Ok(start.elapsed().as_secs_f64())
    };
    let mut compute_alone = Vec::new();
    let mut compute_beside = Vec::new();
    let mut compute_twice = Vec::new();
    let mut comm_alone = vec![Vec::new(); collectives.len()];
    let mut comm_beside = vec![Vec::new(); collectives.len()];
    // A second thread's work until told to stop, in 1 ms slices.
    let work_until = |stop: &AtomicBool| {
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            busy.run_for(1_000_000);
        }
    };
    for &c in &collectives {
        collective(&comm, c)?;
    }
    for _ in 0..repeats {
        control.barrier(&abort)?;
        let start = Instant::now();
        busy.run_for(CONTENTION_COMPUTE_NS);
        compute_alone.push(start.elapsed().as_secs_f64());
        for (times, &c) in comm_alone.iter_mut().zip(&collectives) {
            control.barrier(&abort)?;
            times.push(collective(&comm, c)?);
        }
    }
    // Enough allreduces to span the compute, the same count on every rank (rank 0's).
    let spanning = (Op::Allreduce, largest);
    let spanning_index = collectives
        .iter()
        .position(|&c| c == spanning)
        .expect("the largest size's allreduce is one of the collectives");
    let largest_alone = Spread::of(&comm_alone[spanning_index]).median;
    let mut count =
        vec![((CONTENTION_COMPUTE_NS as f64 / 1e9 / largest_alone).ceil() as u8).max(2)];
    control.broadcast(&mut count, 0, &abort)?;
    let count = count.first().copied().unwrap_or(2);
    for _ in 0..repeats {
        control.barrier(&abort)?;
        // Compute beside a stream of allreduces.
        let (computed, back) = std::thread::scope(|scope| {
            let comm_thread = scope.spawn(move || -> Result<Stream> {
                for _ in 0..count {
                    collective(&comm, spanning)?;
                }
                Ok(comm)
            });
            let start = Instant::now();
            busy.run_for(CONTENTION_COMPUTE_NS);
            let took = start.elapsed().as_secs_f64();
            (took, comm_thread.join().expect("the allreduce thread"))
        });
        comm = back?;
        compute_beside.push(computed);
        control.barrier(&abort)?;
        // Compute beside a second computing thread (a CPU rank's compression).
        let stop = AtomicBool::new(false);
        compute_twice.push(std::thread::scope(|scope| {
            let other = scope.spawn(|| work_until(&stop));
            let start = Instant::now();
            busy.run_for(CONTENTION_COMPUTE_NS);
            let took = start.elapsed().as_secs_f64();
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            other.join().expect("the second compute thread");
            took
        }));
        // Every collective beside compute that outlasts it.
        for (times, &c) in comm_beside.iter_mut().zip(&collectives) {
            control.barrier(&abort)?;
            let stop = AtomicBool::new(false);
            times.push(std::thread::scope(|scope| -> Result<f64> {
                let compute_thread = scope.spawn(|| work_until(&stop));
                let mut each = Vec::new();
                for _ in 0..BESIDE_COMPUTE_CALLS {
                    each.push(collective(&comm, c)?);
                }
                stop.store(true, std::sync::atomic::Ordering::Relaxed);
                compute_thread.join().expect("the compute thread");
                Ok(Spread::of(&each).median)
            })?);
        }
    }
    // Enough large allreduces to outlast the small calls, each of which waits at most about one
    // of them (the same count on every rank, rank 0's).
    let small_calls_s = QUEUE_HEAD_START.as_secs_f64()
        + QUEUE_CALLS as f64 * (QUEUE_GAP.as_secs_f64() + largest_alone);
    let mut large_count = vec![((small_calls_s / largest_alone).ceil() as u8).saturating_add(1)];
    control.broadcast(&mut large_count, 0, &abort)?;
    let large = (Op::Allreduce, largest);
    let (small_alone, small_beside) = queue_behind(
        [&control, &comm],
        second,
        |comm: &Stream| collective(comm, (Op::Allreduce, QUEUE_SMALL_BYTES)),
        |second: &Stream| {
            for _ in 0..large_count.first().copied().unwrap_or(2) {
                collective(second, large)?;
            }
            Ok(())
        },
        &abort,
    )?;
    drop(comm);
    let slowest = |times: &[f64]| slowest_rank(&control, times, &abort);
    let mut comm_points = Vec::with_capacity(collectives.len());
    for ((alone, beside), &(op, bytes)) in comm_alone.iter().zip(&comm_beside).zip(&collectives) {
        comm_points.push(CommBesideCompute {
            op,
            bytes,
            alone: Spread::of(&slowest(alone)?),
            beside_compute: Spread::of(&slowest(beside)?),
        });
    }
    let point = ContentionPoint {
        bytes: largest,
        compute_ns: CONTENTION_COMPUTE_NS,
        compute_alone: Spread::of(&slowest(&compute_alone)?),
        compute_beside_comm: Spread::of(&slowest(&compute_beside)?),
        compute_beside_compute: Spread::of(&slowest(&compute_twice)?),
        comm: comm_points,
        queue: Some(QueueBehind {
            small_bytes: QUEUE_SMALL_BYTES,
            large_bytes: largest,
            alone: Spread::of(&slowest(&small_alone)?),
            beside_large: Spread::of(&slowest(&small_beside)?),
        }),
        // Timed by `pace`, whose draws calibrate afresh.
        pace: None,
        probes: 1,
    };
    Ok((world.rank == 0).then_some(point))
}

/// Times the MPI backend's compute as a run of it meets it, `repeats` draws: every rank
/// calibrates its loop at once, as each rank of a run does when it starts, then computes
/// `CONTENTION_COMPUTE_NS` of it at once (see [`Pace`]; a launch with one repeat is a run's
/// start, later repeats calibrate after the draw before). Each time is the slowest rank's;
/// rank 0 returns them.
pub fn pace(world: &World, repeats: usize, timeout: Duration) -> Result<Option<Pace>> {
    check_repeats(repeats, timeout)?;
    let control = world.streams(1, timeout)?.pop().expect("one stream");
    let abort = AtomicBool::new(false);
    let mut times = Vec::with_capacity(repeats);
    for _ in 0..repeats {
        control.barrier(&abort)?;
        let busy = BusyWork::for_rank_process();
        control.barrier(&abort)?;
        let start = Instant::now();
        busy.run_for(CONTENTION_COMPUTE_NS);
        times.push(start.elapsed().as_secs_f64());
    }
    let seconds = Spread::of(&slowest_rank(&control, &times, &abort)?);
    Ok((world.rank == 0).then_some(Pace {
        compute_ns: CONTENTION_COMPUTE_NS,
        seconds,
    }))
}

/// Per repeat, the mean time of `small` on `comm` alone and while `large` runs on `second`
/// (starting `QUEUE_HEAD_START` earlier); calls that ended after `large` did are left out, and a
/// repeat none of whose calls did is an error.
fn queue_behind(
    [control, comm]: [&Stream; 2],
    mut second: Stream,
    small: impl Fn(&Stream) -> Result<f64>,
    large: impl Fn(&Stream) -> Result<()> + Send + Copy,
    abort: &AtomicBool,
) -> Result<(Vec<f64>, Vec<f64>)> {
    let mut alone = Vec::with_capacity(QUEUE_REPEATS);
    let mut beside = Vec::with_capacity(QUEUE_REPEATS);
    for _ in 0..QUEUE_REPEATS {
        control.barrier(abort)?;
        let times = (0..QUEUE_CALLS)
            .map(|_| small(comm))
            .collect::<Result<Vec<_>>>()?;
        alone.push(mean(&times));
        control.barrier(abort)?;
        let (calls, back) = std::thread::scope(|scope| {
            let large_thread = scope.spawn(move || -> Result<(Stream, Instant)> {
                large(&second)?;
                Ok((second, Instant::now()))
            });
            std::thread::sleep(QUEUE_HEAD_START);
            let calls: Result<Vec<(f64, Instant)>> = (0..QUEUE_CALLS)
                .map(|_| {
                    std::thread::sleep(QUEUE_GAP);
                    small(comm).map(|t| (t, Instant::now()))
                })
                .collect();
            (
                calls,
                large_thread.join().expect("the large allreduces' thread"),
            )
        });
        let (stream, large_ended) = back?;
        second = stream;
        let calls = calls?;
        let within: Vec<f64> = calls
            .iter()
            .filter(|(_, ended)| *ended <= large_ended)
            .map(|&(t, _)| t)
            .collect();
        if within.is_empty() {
            return Err(ExecError::Rank {
                rank: comm.rank,
                message: "the queue probe's large allreduces ended before its first small one: nothing was timed behind them".into(),
            });
        }
        beside.push(mean(&within));
    }
    Ok((alone, beside))
}

fn mean(values: &[f64]) -> f64 {
    values.iter().sum::<f64>() / values.len().max(1) as f64
}

/// Per repeat, the time of the slowest rank. Ranks that share cores do not share them evenly
/// (on a 2-core lab one rank's compute beside its compression slowed 1.6x while the other's
/// slowed 1.1x), and a synchronous job runs at the pace of its slowest rank: the symmetric
/// model's slowdowns are that rank's.
fn slowest_rank(control: &Stream, times: &[f64], abort: &AtomicBool) -> Result<Vec<f64>> {
    let mine: Vec<u8> = times.iter().flat_map(|t| t.to_le_bytes()).collect();
    let all = control.allgather(mine, abort)?;
    Ok((0..times.len())
        .map(|i| {
            all.iter()
                .filter_map(|rank| rank.get(8 * i..8 * i + 8))
                .map(|b| f64::from_le_bytes(b.try_into().expect("8 bytes")))
                .fold(times[i], f64::max)
        })
        .collect())
}
