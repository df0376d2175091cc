//! A sharded plan's parameters on the CPU backends: each rank's shard of a unit, and its gathers.
//!
//! The executors run no model, so a unit's parameters are seeded values. A unit is cut into one
//! shard per rank of `shard_numel` elements, the last padded with zeros as FSDP and ZeRO pad the
//! flat parameter, and a rank owns the shard whose gradient a ring reduce-scatter leaves it
//! holding summed (`ring::summed_chunk`), the one its optimizer updates. A gather is the ring's
//! all-gather half over a buffer of every shard's payload in shard order, each written by the
//! codec of the plan's parameter precision (a cast, or ZeRO++'s int8 blocks), as `cost.rs`
//! prices a gather on these backends.

use super::pieces::mix;
use super::ring::{self, Ring, RingLink};
use crate::compress::codec_for;
use crate::compress::rng::Rng;
use crate::error::{ExecError, Result};
use std::ops::Range;
use std::sync::atomic::AtomicBool;
use std::sync::Mutex;
use syncopate_sim::schedule::{Pass, Schedule};
use syncopate_sim::sharding::{shard_numel, ParamDtype};
use syncopate_sim::SimError;

/// How one unit's parameters are sharded and gathered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unit {
    /// The unit's plan group.
    group: u32,
    /// Elements of the unit.
    numel: usize,
    /// Elements of each shard.
    shard: usize,
    /// Bytes of each shard's payload.
    payload: usize,
    /// Ranks the unit is split over, and so shards: every rank, or each node's under hybrid
    /// sharding (each node then gathers the same split among its own ranks).
    ranks: usize,
    /// The precision the shards travel and are gathered in.
    dtype: ParamDtype,
}

/// Every unit of a sharded schedule (none for a replicated one). Each `param_shards` entry must
/// be its unit's shard in its precision, and every shard must fit in memory on each rank.
pub fn units(schedule: &Schedule) -> Result<Vec<Unit>> {
    let label = "the lowered plan";
    (0..schedule.param_shards.len())
        .map(|g| {
            let field = format!("param_shards[{g}].bytes");
            let bad = |message: String| ExecError::Sim(SimError::invalid(label, &field, message));
            let param_shard = schedule.param_shards[g];
            let (bytes, ranks) = (param_shard.bytes, param_shard.ranks(schedule.world));
            let numel = schedule.buffers.get(g).map(|b| b.numel).ok_or_else(|| {
                bad(format!(
                    "group {g} does not exist: the plan has {}",
                    schedule.buffers.len()
                ))
            })?;
            let shard = shard_numel(numel, ranks);
            let dtype = param_shard.dtype;
            if dtype.wire_bytes(shard) != Some(bytes) {
                return Err(bad(format!(
                    "{bytes} bytes are not a shard of group {g}'s {numel} elements over {ranks} ranks ({shard} elements) in {}",
                    dtype.name()
                )));
            }
            let fits = |n: Option<u64>| {
                n.and_then(|n| usize::try_from(n).ok()).ok_or_else(|| {
                    bad(format!("{ranks} shards of {bytes} bytes do not fit in memory"))
                })
            };
            // After a gather a rank holds every shard.
            fits(param_shard.gathered_bytes(schedule.world))?;
            Ok(Unit {
                group: g as u32,
                numel: fits(Some(numel))?,
                shard: fits(Some(shard))?,
                payload: fits(Some(bytes))?,
                ranks: ranks as usize,
                dtype,
            })
        })
        .collect()
}

/// The parameters' version a gather of `pass` in `iteration` moves: the optimizer steps taken
/// before it (a gather after the step moves that step's update).
pub fn version(pass: Pass, iteration: u32) -> u32 {
    match pass {
        Pass::Step => iteration.saturating_add(1),
        Pass::Forward | Pass::Backward => iteration,
    }
}

/// The factor of version `version`'s parameters, so that every version's differ (a stale
/// gathered chunk shows).
fn scale(version: u32) -> f32 {
    1.0 + 0.25 * version as f32
}

/// One rank's state of one unit: the seeded values of the shard it owns and the buffer its
/// gathers fill.
pub struct Held {
    /// The shard the rank owns.
    shard: usize,
    /// Its values at version 0 (zeros past the unit's end).
    own: Vec<f32>,
    /// Every shard after the last gather, in shard order and the plan's precision.
    pub buffer: Mutex<Vec<u8>>,
    /// A quantized unit's parameters dequantized from `buffer` (empty for a cast's, which
    /// forward and backward use as gathered).
    pub dequantized: Mutex<Vec<f32>>,
}

impl Unit {
    /// Bytes of every shard: what a gather leaves on each rank.
    fn gathered_bytes(&self) -> usize {
        self.ranks * self.payload
    }

    /// Every shard's bytes in a gathered buffer, in shard order.
    pub fn shards<'b>(&self, buffer: &'b [u8]) -> std::slice::ChunksExact<'b, u8> {
        buffer.chunks_exact(self.payload)
    }

    /// Shard `s`'s bytes in a gathered buffer.
    fn shard_bytes(&self, s: usize) -> Range<usize> {
        s * self.payload..(s + 1) * self.payload
    }

    /// Rank `rank`'s state of the unit, its values drawn from `seed`.
    pub fn held(&self, seed: u64, rank: u32) -> Held {
        let s = ring::summed_chunk(rank as usize % self.ranks, self.ranks);
        let mut rng = Rng::for_stream(mix(seed, u64::from(self.group)), s as u64);
        let first = s * self.shard;
        let own = (first..first + self.shard)
            .map(|i| match i < self.numel {
                true => rng.normal() as f32,
                false => 0.0,
            })
            .collect();
        let dequantized = match self.dtype.quantizer() {
            Some(_) => vec![0.0; self.ranks * self.shard],
            None => Vec::new(),
        };
        Held {
            shard: s,
            own,
            buffer: Mutex::new(vec![0; self.gathered_bytes()]),
            dequantized: Mutex::new(dequantized),
        }
    }

    /// After a gather, decodes every shard of a quantized unit's `buffer` into `held`'s
    /// parameters, as ZeRO++ dequantizes what it gathered (the decodes `cost.rs` prices on
    /// the gather); nothing for a cast.
    pub fn dequantize(&self, held: &Held, buffer: &[u8]) -> Result<()> {
        let Some(quantizer) = self.dtype.quantizer() else {
            return Ok(());
        };
        let mut codec = codec_for(&quantizer, 0);
        let mut params = held.dequantized.lock().expect("a dequantized unit's lock");
        params.fill(0.0);
        for (shard, out) in self.shards(buffer).zip(params.chunks_mut(self.shard)) {
            codec.decode_add(shard, out)?;
        }
        Ok(())
    }

    /// Writes the shard `held` owns at version `version` into its chunk of `buffer`, scaled to
    /// the version and encoded by its precision's codec, as FSDP casts it into the gather's
    /// input and ZeRO++ quantizes it; returns those bytes, what the rank sends.
    pub fn put_own<'b>(&self, held: &Held, version: u32, buffer: &'b mut [u8]) -> Result<&'b [u8]> {
        let mine = &mut buffer[self.shard_bytes(held.shard)];
        let scale = scale(version);
        let values: Vec<f32> = held.own.iter().map(|&x| x * scale).collect();
        // The casts and int8 are deterministic: the seed draws nothing.
        codec_for(&self.dtype.codec(), 0).encode_into(&values, mine, &mut Vec::new())?;
        Ok(mine)
    }

    /// This rank's part of the gather over `link`, its own shard in `buffer`
    /// ([`Unit::put_own`]): the ring's all-gather half brings every other rank's.
    pub fn gather(&self, link: &dyn RingLink, buffer: &mut [u8], abort: &AtomicBool) -> Result<()> {
        // The split's ranks: every rank, or the node's (hybrid sharding).
        let ring = Ring::node(link.rank(), self.ranks);
        // One chunk a shard: a quantized payload is not cut between elements.
        ring::allgather_chunks(link, &ring, buffer, self.payload, abort)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compress::minifloat::{bf16_to_f32, f32_to_bf16};
    use crate::runtime::host::comm::on_host;
    use crate::runtime::test_plans::small_sharded;

    /// A gathered buffer decoded shard by shard.
    fn read(unit: &Unit, bytes: &[u8]) -> Vec<f32> {
        let mut codec = codec_for(&unit.dtype.codec(), 0);
        let mut values = vec![0.0; unit.ranks * unit.shard];
        for (shard, out) in unit.shards(bytes).zip(values.chunks_mut(unit.shard)) {
            codec.decode_add(shard, out).unwrap();
        }
        values
    }

    /// On three ranks, in fp32, bf16 and ZeRO++'s int8, every unit (each padded): after a
    /// gather every rank holds the same bytes, as many as the plan's shards make; shard s of
    /// them holds what its owner drew, scaled to the version and cast to the precision (int8:
    /// within half a step of its block's scale); past the unit's end, zeros.
    #[test]
    fn a_gather_gives_every_rank_every_shard_in_shard_order() {
        for dtype in [ParamDtype::Fp32, ParamDtype::Bf16, ParamDtype::Int8] {
            let schedule = small_sharded("fsdp", "none", dtype, (1, 3));
            let units = units(&schedule).unwrap();
            assert_eq!(units.len(), 3, "{dtype:?}");
            for (unit, shard) in units.iter().zip(&schedule.param_shards) {
                assert_eq!(unit.dtype, dtype);
                assert_eq!(unit.gathered_bytes() as u64, 3 * shard.bytes);
                assert_ne!(unit.numel % 3, 0, "a padded unit");
                let held: Vec<Held> = (0..3).map(|r| unit.held(7, r)).collect();
                let version = version(Pass::Step, 4);
                let gathered = on_host(3, |mesh, abort| {
                    let held = &held[mesh.rank as usize];
                    let mut buffer = held.buffer.lock().unwrap();
                    let sent = unit.put_own(held, version, &mut buffer)?.to_vec();
                    unit.gather(mesh, &mut buffer, abort)?;
                    assert_eq!(buffer[unit.shard_bytes(held.shard)], sent, "its own shard");
                    unit.dequantize(held, &buffer)?;
                    let dequantized = held.dequantized.lock().unwrap();
                    match unit.dtype.quantizer() {
                        Some(_) => assert_eq!(*dequantized, read(unit, &buffer)),
                        None => assert!(dequantized.is_empty()),
                    }
                    Ok(buffer.clone())
                })
                .unwrap();
                assert!(gathered.iter().all(|g| *g == gathered[0]));
                let values = read(unit, &gathered[0]);
                assert_eq!(unit.shards(&gathered[0]).len(), 3);
                assert_eq!(values.len(), 3 * unit.shard);
                let mut owned: Vec<usize> = held.iter().map(|h| h.shard).collect();
                owned.sort_unstable();
                assert_eq!(owned, [0, 1, 2], "each shard has one owner");
                for (r, held) in held.iter().enumerate() {
                    let s = held.shard * unit.shard;
                    let step = held.own.iter().fold(0f32, |m, x| m.max(x.abs())) * 2.25 / 254.0;
                    for (i, &x) in held.own.iter().enumerate() {
                        let (sent, got) = (x * 2.25, values[s + i]);
                        match dtype {
                            ParamDtype::Fp32 => assert_eq!(got.to_bits(), sent.to_bits()),
                            ParamDtype::Bf16 => {
                                let cast = bf16_to_f32(f32_to_bf16(sent));
                                assert_eq!(got.to_bits(), cast.to_bits(), "rank {r}, {i}");
                            }
                            ParamDtype::Int8 => {
                                assert!((got - sent).abs() <= step * 1.0001, "rank {r}, {i}")
                            }
                        }
                    }
                }
                // (int8 rounds a value under half its block's step to zero.)
                let zeros = values[..unit.numel].iter().filter(|&&x| x == 0.0).count();
                assert!(zeros == 0 || dtype == ParamDtype::Int8, "{dtype:?}");
                assert!(values[unit.numel..].iter().all(|&x| x == 0.0));
            }
        }
    }

    #[test]
    fn the_step_gathers_the_update_and_the_passes_before_it_the_parameters_it_updates() {
        assert_eq!(version(Pass::Forward, 3), 3);
        assert_eq!(version(Pass::Backward, 3), 3);
        assert_eq!(version(Pass::Step, 3), 4);
        assert_eq!(scale(4), 2.0);
    }

    #[test]
    fn a_shard_that_is_not_its_units_is_refused_naming_the_field() {
        let mut schedule = small_sharded("zero2", "none", ParamDtype::Fp32, (1, 3));
        assert_eq!(units(&schedule).unwrap().len(), 1);
        schedule.param_shards[0].bytes += 1;
        let err = units(&schedule).unwrap_err().to_string();
        assert!(
            err.contains("param_shards[0].bytes") && err.contains("in fp32"),
            "{err}"
        );
        schedule.param_shards[0].bytes -= 1;
        schedule.param_shards.push(schedule.param_shards[0]);
        let err = units(&schedule).unwrap_err().to_string();
        assert!(
            err.contains("param_shards[1].bytes") && err.contains("group 1 does not exist"),
            "{err}"
        );
    }
}
