//! A sharded plan's parameters on the CPU backends: each rank's shard of a unit, and its gathers.
//!
//! The executors run no model, so a unit's parameters are seeded values. A unit is cut into one
//! shard per rank of `shard_numel` elements, the last padded with zeros as FSDP and ZeRO pad the
//! flat parameter, and a rank owns the shard whose gradient a ring reduce-scatter leaves it
//! holding summed (`ring::summed_chunk`), the one its optimizer updates. A gather is the ring's
//! all-gather half over a buffer of every shard's payload in shard order, each written by the
//! codec of the plan's parameter precision (a cast, or ZeRO++'s int8 blocks), as `cost.rs`
//! prices a gather on these backends. With torchao's float8 gathers a unit's float8 weights and
//! its other tensors are each cut so (`ShardCut`), every shard its float8 part first, cast with
//! the scales the ranks agreed on (`float8`).

use super::float8::{self, Float8Weights};
use super::gather_check::digest;
use super::pieces::mix;
use super::ring::{self, Ring, RingLink};
use crate::compress::codec_for;
use crate::compress::rng::Rng;
use crate::error::{ExecError, Result};
use std::ops::Range;
use std::sync::atomic::AtomicBool;
use std::sync::Mutex;
use syncopate_sim::schedule::{Buffer, ParamShard, Pass, Schedule};
use syncopate_sim::sharding::{ParamDtype, ShardCut};
use syncopate_sim::SimError;

/// How a unit is cut for one kind of gather: the ranks that split it, each one's shard and the
/// bytes of its payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Split {
    /// Ranks the unit is split over: every rank, or each node's (hybrid sharding, and hpZ's
    /// second shards); each such group of ranks gathers the same split among its own.
    ranks: usize,
    /// Elements of each shard.
    shard: usize,
    /// Those of its float8 part, which come first (torchao's float8 gathers; 0 without).
    float8: usize,
    /// Bytes of each shard's payload.
    payload: usize,
}

impl Split {
    /// Shard `s`'s bytes in a gathered buffer.
    fn shard_bytes(&self, s: usize) -> Range<usize> {
        s * self.payload..(s + 1) * self.payload
    }

    /// The shard the rank at `rank` owns: the chunk a ring reduce-scatter leaves it.
    fn owned(&self, rank: u32) -> usize {
        ring::summed_chunk(rank as usize % self.ranks, self.ranks)
    }
}

/// How one unit's parameters are sharded and gathered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unit {
    /// The unit's plan group.
    group: u32,
    /// Elements of the unit.
    numel: usize,
    /// The split the rank's own shard belongs to, which every gather but hpZ's uses.
    primary: Split,
    /// hpZ's second shards over the node's ranks, which the gathers before backward use.
    secondary: Option<Split>,
    /// The precision the shards travel and are gathered in.
    dtype: ParamDtype,
    /// Its float8 weights (none without torchao's float8 gathers).
    float8: Float8Weights,
    /// Whether its forward gather first agrees on every float8 weight's scale.
    agrees: bool,
}

/// Every unit of a sharded schedule (none for a replicated one). Each `param_shards` entry must
/// be its unit's shard in its precision (and its secondary shard over a node's ranks), every
/// shard must fit in memory on each rank, and with float8 weights one forward gather must agree
/// on all of their scales.
pub fn units(schedule: &Schedule) -> Result<Vec<Unit>> {
    let label = "the lowered plan";
    let bad =
        |field: String, message: String| ExecError::Sim(SimError::invalid(label, field, message));
    let float8_weights: usize = schedule.buffers.iter().map(Buffer::float8_weights).sum();
    let agreeing = schedule
        .param_shards
        .iter()
        .filter(|s| s.amaxes > 0)
        .count();
    if float8_weights > 0 && agreeing != 1 {
        return Err(bad(
            "param_shards".into(),
            format!("{agreeing} units' forward gathers agree on the scales of the {float8_weights} float8 weights: one must"),
        ));
    }
    (0..schedule.param_shards.len())
        .map(|g| {
            let param_shard = schedule.param_shards[g];
            let buffer = schedule.buffers.get(g).ok_or_else(|| {
                bad(
                    format!("param_shards[{g}]"),
                    format!(
                        "group {g} does not exist: the plan has {}",
                        schedule.buffers.len()
                    ),
                )
            })?;
            let (numel, float8_numel) = (buffer.numel, buffer.float8_numel());
            if float8_numel > numel {
                return Err(bad(
                    format!("buffers[{g}].slots"),
                    format!("{float8_numel} float8 elements in a unit of {numel}"),
                ));
            }
            if param_shard.amaxes > 0 && param_shard.amaxes as usize != float8_weights {
                return Err(bad(
                    format!("param_shards[{g}].amaxes"),
                    format!(
                        "{} is not the plan's {float8_weights} float8 weights",
                        param_shard.amaxes
                    ),
                ));
            }
            if float8_numel > 0 && param_shard.secondary_bytes.is_some() {
                return Err(bad(
                    format!("param_shards[{g}].secondary_bytes"),
                    "float8 weights have no second shard (hpZ is DeepSpeed's)".into(),
                ));
            }
            let memory = |n: u64, what: &str| {
                usize::try_from(n).map_err(|_| {
                    bad(
                        format!("param_shards[{g}]"),
                        format!("{n} {what} do not fit in memory"),
                    )
                })
            };
            let split = |shard: ParamShard, field: &str, float8_numel: u64| -> Result<Split> {
                let field = format!("param_shards[{g}].{field}");
                let (bytes, ranks) = (shard.bytes, shard.ranks(schedule.world));
                let cut = ShardCut::of(numel, float8_numel, ranks);
                let elements = cut.float8 + cut.rest;
                if cut.wire_bytes(shard.dtype) != Some(bytes) {
                    return Err(bad(field, format!(
                        "{bytes} bytes are not a shard of group {g}'s {numel} elements ({float8_numel} of them float8) over {ranks} ranks ({elements} elements) in {}",
                        shard.dtype.name()
                    )));
                }
                // After a gather a rank holds every shard.
                let gathered = shard.gathered_bytes(schedule.world).unwrap_or(u64::MAX);
                memory(gathered, "gathered bytes")?;
                Ok(Split {
                    ranks: ranks as usize,
                    shard: memory(elements, "elements")?,
                    float8: memory(cut.float8, "elements")?,
                    payload: memory(bytes, "bytes")?,
                })
            };
            let secondary = match param_shard.secondary_bytes {
                Some(_) => Some(split(
                    param_shard.for_pass(Pass::Backward),
                    "secondary_bytes",
                    0,
                )?),
                None => None,
            };
            let float8 = buffer
                .slots
                .iter()
                .filter(|s| s.float8)
                .map(|s| memory(s.numel, "elements"))
                .collect::<Result<Vec<usize>>>()?;
            Ok(Unit {
                group: g as u32,
                numel: memory(numel, "elements")?,
                primary: split(param_shard, "bytes", float8_numel)?,
                secondary,
                dtype: param_shard.dtype,
                float8: Float8Weights::new(float8),
                agrees: param_shard.amaxes > 0,
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

/// One rank's state of one unit: the seeded values of the shard it owns and the buffers its
/// gathers fill.
pub struct Held {
    /// The shard the rank owns.
    shard: usize,
    /// Its hpZ second shard among its node's (0 without hpZ).
    secondary_shard: usize,
    /// Its values at version 0 (zeros past the unit's end).
    own: Vec<f32>,
    /// Every shard after the last gather of the primary split, in shard order and the plan's
    /// precision.
    buffer: Mutex<Vec<u8>>,
    /// Every secondary shard after the last hpZ gather (empty without hpZ).
    secondary_buffer: Mutex<Vec<u8>>,
    /// The unit's parameters decoded from the last gather, when they are read: a quantized
    /// unit's, as ZeRO++ dequantizes what it gathers, and under hpZ, whose second shard is cut
    /// from them (empty otherwise: a cast is used as gathered).
    pub decoded: Mutex<Vec<f32>>,
    /// The scale of each of the unit's float8 weights and the parameters' version they were
    /// agreed on for (none before the first agreement).
    scales: Mutex<Option<(u32, Vec<f32>)>>,
}

impl Held {
    /// The buffer a gather of `pass` fills: hpZ's before backward, else the primary one.
    pub fn buffer(&self, unit: &Unit, pass: Pass) -> &Mutex<Vec<u8>> {
        match unit.uses_secondary(pass) {
            true => &self.secondary_buffer,
            false => &self.buffer,
        }
    }
}

impl Unit {
    /// Whether a gather of `pass` takes the secondary shards (hpZ, before backward).
    fn uses_secondary(&self, pass: Pass) -> bool {
        pass == Pass::Backward && self.secondary.is_some()
    }

    /// The split a gather of `pass` joins.
    fn split(&self, pass: Pass) -> Split {
        match self.uses_secondary(pass) {
            true => self.secondary.expect("checked above"),
            false => self.primary,
        }
    }

    /// Whether gathered shards are decoded: quantized, or cut again for hpZ.
    fn decodes(&self) -> bool {
        self.dtype.quantizer().is_some() || self.secondary.is_some()
    }

    /// Every shard's bytes in a buffer gathered before `pass`, in shard order.
    pub fn shards<'b>(&self, pass: Pass, buffer: &'b [u8]) -> std::slice::ChunksExact<'b, u8> {
        buffer.chunks_exact(self.split(pass).payload)
    }

    /// Rank `rank`'s state of the unit, its values drawn from `seed`: its shard of the float8
    /// weights, then of the rest.
    pub fn held(&self, seed: u64, rank: u32) -> Held {
        let (primary, s) = (self.primary, self.primary.owned(rank));
        let mut rng = Rng::for_stream(mix(seed, u64::from(self.group)), s as u64);
        let float8 = self.float8.numel();
        let rest = primary.shard - primary.float8;
        let mut draw = |first: usize, len: usize, end: usize| -> Vec<f32> {
            (first..first + len)
                .map(|i| match i < end {
                    true => rng.normal() as f32,
                    false => 0.0,
                })
                .collect()
        };
        let mut own = draw(s * primary.float8, primary.float8, float8);
        own.extend(draw(s * rest, rest, self.numel - float8));
        let gathered = |split: Option<Split>| split.map_or(0, |s| s.ranks * s.payload);
        let decoded = match self.decodes() {
            true => vec![0.0; primary.ranks * primary.shard],
            false => Vec::new(),
        };
        Held {
            shard: s,
            secondary_shard: self.secondary.map_or(0, |split| split.owned(rank)),
            own,
            buffer: Mutex::new(vec![0; gathered(Some(primary))]),
            secondary_buffer: Mutex::new(vec![0; gathered(self.secondary)]),
            decoded: Mutex::new(decoded),
            scales: Mutex::new(None),
        }
    }

    /// The largest magnitude of the rank's shard of each float8 weight at `version`.
    fn maxima(&self, held: &Held, version: u32) -> Vec<f32> {
        let (f, scale) = (self.primary.float8, scale(version));
        let values: Vec<f32> = held.own[..f].iter().map(|&x| x * scale).collect();
        self.float8.maxima(&values, held.shard * f)
    }

    /// After a gather before `pass`, decodes every shard of `buffer` into `held`'s parameters
    /// when they are read ([`Unit::decodes`]): ZeRO++ dequantizes what it gathered (the decodes
    /// `cost.rs` prices on the gather), and hpZ cuts its second shard from them.
    pub fn decode(&self, held: &Held, pass: Pass, buffer: &[u8]) -> Result<()> {
        if !self.decodes() {
            return Ok(());
        }
        let split = self.split(pass);
        let mut codec = codec_for(&self.dtype.codec(), 0);
        let mut params = held.decoded.lock().expect("a decoded unit's lock");
        params.fill(0.0);
        for (shard, out) in self
            .shards(pass, buffer)
            .zip(params.chunks_mut(split.shard))
        {
            codec.decode_add(shard, out)?;
        }
        Ok(())
    }

    /// Writes the shard `held` owns for a gather before `pass` into its chunk of `buffer`,
    /// encoded by its precision's codec, as FSDP casts it into the gather's input and ZeRO++
    /// quantizes it; returns those bytes, what the rank sends. The shard is its own at version
    /// `version` (scaled to it), or under hpZ before backward its second shard, cut from what
    /// the forward gather brought.
    pub fn put_own<'b>(
        &self,
        held: &Held,
        (pass, version): (Pass, u32),
        buffer: &'b mut [u8],
    ) -> Result<&'b [u8]> {
        let split = self.split(pass);
        let (shard, values): (usize, Vec<f32>) = match self.uses_secondary(pass) {
            true => {
                let decoded = held.decoded.lock().expect("a decoded unit's lock");
                let first = held.secondary_shard * split.shard;
                let values = (first..first + split.shard)
                    .map(|i| match i < self.numel {
                        true => decoded[i],
                        false => 0.0,
                    })
                    .collect();
                (held.secondary_shard, values)
            }
            false => {
                let scale = scale(version);
                (held.shard, held.own.iter().map(|&x| x * scale).collect())
            }
        };
        let mine = &mut buffer[split.shard_bytes(shard)];
        let (float8, rest) = mine.split_at_mut(split.float8);
        let (float8_values, values) = values.split_at(split.float8);
        if split.float8 > 0 {
            self.cast_float8(held, version, (float8_values, shard * split.float8), float8)?;
        }
        // The casts and int8 are deterministic: the seed draws nothing.
        codec_for(&self.dtype.codec(), 0).encode_into(values, rest, &mut Vec::new())?;
        Ok(mine)
    }

    /// Casts `values`, the float8 part's elements from `first` on, into `out` with the scales
    /// `held` agreed on for `version`; scales of another version (or none) are an error, not a
    /// cast with stale ones.
    fn cast_float8(
        &self,
        held: &Held,
        version: u32,
        (values, first): (&[f32], usize),
        out: &mut [u8],
    ) -> Result<()> {
        let scales = held.scales.lock().expect("a unit's scales lock");
        match &*scales {
            Some((agreed, scales)) if *agreed == version => {
                self.float8.cast(values, first, scales, out);
                Ok(())
            }
            other => Err(ExecError::Check {
                group: self.group as usize,
                message: format!(
                    "a gather of version {version}'s float8 weights found the scales of {}",
                    other
                        .as_ref()
                        .map_or("none".into(), |(v, _)| format!("version {v}"))
                ),
            }),
        }
    }

    /// A digest of the float8 scales `held` last agreed on (of none without float8 weights).
    pub fn scales_digest(&self, held: &Held) -> u64 {
        let scales = held.scales.lock().expect("a unit's scales lock");
        let bytes: Vec<u8> = scales
            .iter()
            .flat_map(|(_, scales)| scales.iter().flat_map(|x| x.to_le_bytes()))
            .collect();
        digest(&bytes)
    }

    /// Whether the gather before `pass` first agrees on every float8 weight's scale.
    pub fn agrees_before(&self, pass: Pass) -> bool {
        self.agrees && pass == Pass::Forward
    }

    /// This rank's part of the gather before `pass` over `link`, its own shard in `buffer`
    /// ([`Unit::put_own`]): the ring's all-gather half brings every other rank's.
    pub fn gather(
        &self,
        link: &dyn RingLink,
        pass: Pass,
        buffer: &mut [u8],
        abort: &AtomicBool,
    ) -> Result<()> {
        let split = self.split(pass);
        // The split's ranks: every rank, or the node's; one chunk a shard, so that a quantized
        // payload is not cut between elements.
        let ring = Ring::node(link.rank(), split.ranks);
        ring::allgather_chunks(link, &ring, buffer, split.payload, abort)
    }
}

/// The scales of every unit's float8 weights at `version`, agreed on with every rank over
/// `link` from each rank's maxima of its shards and kept in `held`, unit by unit.
pub fn agree_scales(
    units: &[Unit],
    held: &[Held],
    link: &dyn RingLink,
    version: u32,
    abort: &AtomicBool,
) -> Result<()> {
    let maxima: Vec<f32> = units
        .iter()
        .zip(held)
        .flat_map(|(unit, held)| unit.maxima(held, version))
        .collect();
    let ranks = units.first().map_or(1, |u| u.primary.ranks);
    let scales = float8::agree(link, ranks, &maxima, abort)?;
    let mut rest = &scales[..];
    for (unit, held) in units.iter().zip(held) {
        let (mine, after) = rest.split_at(unit.float8.count());
        *held.scales.lock().expect("a unit's scales lock") = Some((version, mine.to_vec()));
        rest = after;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compress::minifloat::{bf16_to_f32, f32_to_bf16};
    use crate::runtime::host::comm::on_host;
    use crate::runtime::test_plans::{small_float8, small_sharded, small_sharded_with};
    use syncopate_sim::strategy::ShardOptions;

    /// A buffer gathered before `pass` decoded shard by shard.
    fn read(unit: &Unit, pass: Pass, bytes: &[u8]) -> Vec<f32> {
        let mut codec = codec_for(&unit.dtype.codec(), 0);
        let split = unit.split(pass);
        let mut values = vec![0.0; split.ranks * split.shard];
        for (shard, out) in unit.shards(pass, bytes).zip(values.chunks_mut(split.shard)) {
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
                let primary = unit.primary;
                assert_eq!((primary.ranks * primary.payload) as u64, 3 * shard.bytes);
                assert_ne!(unit.numel % 3, 0, "a padded unit");
                let held: Vec<Held> = (0..3).map(|r| unit.held(7, r)).collect();
                let at = (Pass::Step, version(Pass::Step, 4));
                let gathered = on_host(3, |mesh, abort| {
                    let held = &held[mesh.rank as usize];
                    let mut buffer = held.buffer(unit, Pass::Step).lock().unwrap();
                    let sent = unit.put_own(held, at, &mut buffer)?.to_vec();
                    unit.gather(mesh, Pass::Step, &mut buffer, abort)?;
                    let own = primary.shard_bytes(held.shard);
                    assert_eq!(buffer[own], sent, "its own shard");
                    unit.decode(held, Pass::Step, &buffer)?;
                    let decoded = held.decoded.lock().unwrap();
                    match unit.dtype.quantizer() {
                        Some(_) => assert_eq!(*decoded, read(unit, Pass::Step, &buffer)),
                        None => assert!(decoded.is_empty()),
                    }
                    Ok(buffer.clone())
                })
                .unwrap();
                assert!(gathered.iter().all(|g| *g == gathered[0]));
                let values = read(unit, Pass::Step, &gathered[0]);
                assert_eq!(unit.shards(Pass::Step, &gathered[0]).len(), 3);
                assert_eq!(values.len(), 3 * primary.shard);
                let mut owned: Vec<usize> = held.iter().map(|h| h.shard).collect();
                owned.sort_unstable();
                assert_eq!(owned, [0, 1, 2], "each shard has one owner");
                for (r, held) in held.iter().enumerate() {
                    let s = held.shard * primary.shard;
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

    /// hpZ on two nodes of three: what the gather before backward brings from the second
    /// shards, cut from the forward gather, is the unit the forward gather brought, bit for bit
    /// in fp32; in int8 its re-quantization keeps within half a step of each block's scale.
    #[test]
    fn hpz_brings_back_for_backward_the_unit_forward_gathered() {
        for dtype in [ParamDtype::Fp32, ParamDtype::Int8] {
            let sharding = ShardOptions {
                param_dtype: dtype,
                secondary_within_node: true,
                ..ShardOptions::default()
            };
            let schedule = small_sharded_with("fsdp", "none", sharding, (2, 3));
            for unit in units(&schedule).unwrap() {
                let held: Vec<Held> = (0..6).map(|r| unit.held(3, r)).collect();
                let both = on_host(6, |mesh, abort| {
                    let held = &held[mesh.rank as usize];
                    let mut passes = Vec::new();
                    for pass in [Pass::Forward, Pass::Backward] {
                        let mut buffer = held.buffer(&unit, pass).lock().unwrap();
                        unit.put_own(held, (pass, 2), &mut buffer)?;
                        unit.gather(mesh, pass, &mut buffer, abort)?;
                        unit.decode(held, pass, &buffer)?;
                        passes.push(held.decoded.lock().unwrap()[..unit.numel].to_vec());
                    }
                    Ok(passes)
                })
                .unwrap();
                for (r, passes) in both.iter().enumerate() {
                    let (forward, backward) = (&passes[0], &passes[1]);
                    assert_eq!(
                        forward, &both[0][0],
                        "rank {r}: every rank gathered the unit"
                    );
                    let step = forward.iter().fold(0f32, |m, x| m.max(x.abs())) / 254.0;
                    for (i, (f, b)) in forward.iter().zip(backward).enumerate() {
                        match dtype {
                            ParamDtype::Int8 => assert!((f - b).abs() <= step * 1.0001, "{i}"),
                            _ => assert_eq!(f.to_bits(), b.to_bits(), "rank {r}, {i}"),
                        }
                    }
                }
            }
        }
    }

    /// torchao's float8 gathers on three ranks, the rest in fp32 and bf16: after the ranks
    /// agree on the scales, every rank holds the same bytes; a float8 weight's element is its
    /// owner's value times 448 / the weight's largest magnitude over every rank, cast to e4m3;
    /// the rest is cast as before; padding is zeros. A gather of a version whose scales were not
    /// agreed on fails instead of casting with stale ones.
    #[test]
    fn float8_gathers_cast_each_weight_with_the_scale_every_rank_agreed_on() {
        use crate::compress::minifloat::{bf16_to_f32, e4m3_to_f32, f32_to_bf16, f32_to_e4m3};
        for dtype in [ParamDtype::Fp32, ParamDtype::Bf16] {
            // On one rank there is nothing to gather, nor any scale to agree on.
            assert!(units(&small_float8(dtype, (1, 1))).unwrap().is_empty());
            let schedule = small_float8(dtype, (1, 3));
            let units = units(&schedule).unwrap();
            let float8: Vec<usize> = units.iter().map(|u| u.float8.count()).collect();
            assert_eq!(
                float8,
                [1, 1, 0],
                "the blocks' weights; not the head's 10 rows"
            );
            assert_eq!(units.iter().filter(|u| u.agrees).count(), 1);
            let held: Vec<Vec<Held>> = (0..3)
                .map(|r| units.iter().map(|u| u.held(5, r)).collect())
                .collect();
            let version = 3;
            let gathered = on_host(3, |mesh, abort| {
                let held = &held[mesh.rank as usize];
                let unit = &units[0];
                let mut buffer = held[0].buffer(unit, Pass::Forward).lock().unwrap();
                let early = unit.put_own(&held[0], (Pass::Forward, version), &mut buffer);
                assert!(early
                    .unwrap_err()
                    .to_string()
                    .contains("found the scales of none"));
                agree_scales(&units, held, mesh, version, abort)?;
                drop(buffer);
                let mut all = Vec::new();
                for (unit, held) in units.iter().zip(held) {
                    let mut buffer = held.buffer(unit, Pass::Forward).lock().unwrap();
                    unit.put_own(held, (Pass::Forward, version), &mut buffer)?;
                    unit.gather(mesh, Pass::Forward, &mut buffer, abort)?;
                    all.push(buffer.clone());
                }
                Ok(all)
            })
            .unwrap();
            assert!(gathered.iter().all(|g| *g == gathered[0]), "{dtype:?}");
            for (u, unit) in units.iter().enumerate() {
                let split = unit.primary;
                let (f, rest) = (split.float8, split.shard - split.float8);
                // Every rank's shard of the float8 part and of the rest, in shard order.
                let mut part = vec![0f32; 3 * f];
                let mut others = vec![0f32; 3 * rest];
                for held in held.iter().map(|h| &h[u]) {
                    let values: Vec<f32> = held.own.iter().map(|x| x * scale(version)).collect();
                    part[held.shard * f..][..f].copy_from_slice(&values[..f]);
                    others[held.shard * rest..][..rest].copy_from_slice(&values[f..]);
                }
                let weight = unit.float8.numel();
                let largest = part[..weight].iter().fold(0f32, |m, x| m.max(x.abs()));
                let scale = float8::scale(largest);
                for (s, shard) in unit.shards(Pass::Forward, &gathered[0][u]).enumerate() {
                    let (codes, cast) = shard.split_at(f);
                    for (i, &code) in codes.iter().enumerate() {
                        let x = part[s * f + i];
                        let want = if s * f + i < weight {
                            f32_to_e4m3(x * scale)
                        } else {
                            0
                        };
                        assert_eq!(code, want, "unit {u}, shard {s}, element {i}");
                    }
                    for (i, bytes) in cast
                        .chunks_exact(dtype.wire_bytes(1).unwrap() as usize)
                        .enumerate()
                    {
                        let x = others[s * rest + i];
                        let got = match dtype {
                            ParamDtype::Bf16 => {
                                let want = bf16_to_f32(f32_to_bf16(x));
                                (bf16_to_f32(u16::from_le_bytes([bytes[0], bytes[1]])), want)
                            }
                            _ => (f32::from_le_bytes(bytes.try_into().unwrap()), x),
                        };
                        assert_eq!(got.0.to_bits(), got.1.to_bits(), "unit {u}, shard {s}, {i}");
                    }
                }
                // The largest magnitude lands on e4m3's largest.
                if weight > 0 {
                    let codes = gathered[0][u]
                        .chunks_exact(split.payload)
                        .flat_map(|s| &s[..f]);
                    let top = codes.map(|&c| e4m3_to_f32(c).abs()).fold(0f32, f32::max);
                    assert_eq!(top, 448.0, "unit {u}");
                }
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
            err.contains("param_shards[1]") && err.contains("group 1 does not exist"),
            "{err}"
        );
    }
}
