//! Device profiles: a GPU's speed, compression kernel cost curves and contention factors.
//!
//! A profile may describe a CPU instead of a GPU.

use crate::base::data::{self, DataKind};
use crate::base::error::{Result, SimError};
use crate::base::limits;
use crate::base::time::SimTime;
use crate::compress::why_no_kept_cost;
use crate::inputs::achieved::AchievedFractions;
use crate::inputs::model::Provenance;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Cost of one kernel as a function of its element count: a fixed floor (launch and
/// synchronization) plus a per-element slope, and for a sparsifier a slope per element it keeps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CostCurve {
    /// Fixed cost per call (launch and synchronization), in µs.
    pub floor_us: f64,
    /// Cost per element of the tensor, in ns.
    pub ns_per_element: f64,
    /// Cost per element a sparsifier keeps (`sparse_count`, what its payload carries): the
    /// work after the selection, which gathers, writes and scatters the kept values, so that
    /// one curve serves every ratio. Zero when absent; only sparsifiers keep a share of the elements.
    #[serde(default, skip_serializing_if = "data::is_zero")]
    pub ns_per_kept_element: f64,
    /// What a call large enough to allocate new pages pays on top, per element (a codec set's
    /// tensors written into fresh memory, on a device with `fresh_memory`). Absent: nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fresh_pages: Option<FreshPages>,
}

/// The cost of fresh pages in a call of at least `from_elements` elements.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FreshPages {
    /// The fewest elements a call has for its allocation to be mapped anew.
    pub from_elements: u64,
    /// Extra cost per element of such a call, in ns.
    pub ns_per_element: f64,
}

impl CostCurve {
    /// This curve for a compressor that keeps `kept_fraction` of the elements: its per-kept
    /// slope folded into the per-element one.
    pub fn keeping(&self, kept_fraction: f64) -> CostCurve {
        CostCurve {
            floor_us: self.floor_us,
            ns_per_element: self.ns_per_element + self.ns_per_kept_element * kept_fraction,
            ns_per_kept_element: 0.0,
            fresh_pages: self.fresh_pages,
        }
    }

    /// One call over `elements` that keeps `kept` of them: a sparsifier's
    /// [`Compressor::kept_elements`](crate::compress::Compressor::kept_elements), 0 for the
    /// others.
    pub fn time(&self, elements: u64, kept: u64) -> SimTime {
        let fresh = self
            .fresh_pages
            .filter(|fresh| elements >= fresh.from_elements)
            .map_or(0.0, |fresh| fresh.ns_per_element);
        SimTime::from_ns(
            self.floor_us * 1e3
                + (self.ns_per_element + fresh) * elements as f64
                + self.ns_per_kept_element * kept as f64,
        )
    }

    fn is_zero(&self) -> bool {
        *self == CostCurve::default()
    }
}

/// Encode and decode costs of one compressor on this device.
///
/// A decode call combines one payload (allreduce, a parameter server's pull) or every rank's
/// (allgather): it pays `aggregate` once and `decode` once per payload, so at p ranks an
/// allgather's per-call floor is not multiplied by p.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CodecCost {
    /// Cost of encoding one tensor: its floor and its per-element cost.
    pub encode: CostCurve,
    /// Per payload decoded: its floor and its per-element cost (elements of the payload's tensor).
    pub decode: CostCurve,
    /// Once per decode call, however many payloads it combines: the call's fixed cost (a
    /// framework's op dispatch, a final kernel) and its passes over the aggregated result, per
    /// element (the final sum, averaging, a sign vote). Zero when absent: the kernels of
    /// `exec` decode each payload into the result and have no pass of their own.
    #[serde(default, skip_serializing_if = "CostCurve::is_zero")]
    pub aggregate: CostCurve,
    /// Whether the curves include the passes around the codec that the executors make apart
    /// (the gradient's copy or the memory's compensation, zeroing the result, the memory's
    /// update, scaling the output), as a codec set counts everything its source does with its
    /// memory: those passes are then not priced again. Set only by a codec set's pricing: a
    /// device file neither states nor stores it.
    #[serde(skip)]
    pub includes_passes: bool,
    /// Where these curves come from (measured, estimated or calibrated) and how.
    pub provenance: Provenance,
}

/// How much backward compute slows down while other kernels share the GPU.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Contention {
    /// Compute time multiplier while a collective kernel runs beside it, where it was measured
    /// on the device (`syncopate profile --backend cuda`); absent, NCCL's contention is priced
    /// from the device's SMs and memory bandwidth (the `contention` module).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_slowdown_with_collective: Option<f64>,
    /// Compute time multiplier while a compression kernel runs beside it.
    pub compute_slowdown_with_compression: f64,
    /// Where these factors come from and how they were obtained.
    pub provenance: Provenance,
}

/// What writing memory just allocated costs beyond its bytes: the operating system maps and
/// zeroes each new page on its first write, which a CPU framework's large tensors meet every
/// time they are allocated. A GPU framework's caching allocator hands back memory it already
/// holds, so GPU profiles leave it out.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FreshMemory {
    /// Time per byte written into freshly allocated memory beyond the same write into memory
    /// in use, in ns (its page faults, zeroing and unmapping, per byte).
    pub ns_per_byte: f64,
    /// The smallest allocation that gets new pages every time, in bytes: glibc maps each one
    /// at or above its largest dynamic mmap threshold anew and unmaps it when freed, and
    /// serves smaller ones from memory freed before.
    pub from_bytes: u64,
    /// How it was measured.
    pub provenance: Provenance,
}

/// Most extra ns per byte of fresh memory (about a thousand times this machine's 0.4).
const MAX_FRESH_NS_PER_BYTE: f64 = 1_000.0;
/// Largest allocation threshold of fresh memory (1 TiB).
const MAX_FRESH_FROM_BYTES: u64 = 1 << 40;

/// Whether a profile describes a GPU or a CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceKind {
    /// A GPU, with kernel launches and SMs.
    Gpu,
    /// A CPU (host) device.
    Cpu,
}

/// Most memory a device profile may state, in GiB (a thousand times an H200's).
const MAX_MEMORY_GIB: f64 = 141_000.0;

/// A device profile as stored in `profiles/devices/*.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceProfile {
    /// Version of the data file format; this build reads only its own.
    pub format_version: u32,
    /// Short name of the profile, as given on the command line (`a100-sxm4-40gb`).
    pub name: String,
    /// Whether the device is a GPU or a CPU.
    pub kind: DeviceKind,
    /// Marketing name of the part, e.g. "Tesla V100-SXM2-32GB".
    pub model: String,
    /// Where the figures come from: datasheets, measurements, estimates.
    pub source: String,
    /// Memory bandwidth, in GB/s.
    pub memory_bandwidth_gbytes_per_s: f64,
    /// Memory the device offers in GiB (the datasheet's capacity); absent for hosts, whose
    /// memory the profile does not record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_gib: Option<f64>,
    /// Peak FP32 throughput, in TFLOPS.
    pub peak_fp32_tflops: f64,
    /// Peak FP16 throughput (dense tensor cores on a GPU), in TFLOPS.
    pub peak_fp16_tflops: f64,
    /// Streaming multiprocessors of a GPU (datasheet), which NCCL's channels take one each of;
    /// absent for a CPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sm_count: Option<u32>,
    /// Dense TF32 tensor-core peak; absent on devices without TF32 (before Ampere).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_tf32_tflops: Option<f64>,
    /// Dense FP8 tensor-core peak; absent on devices without float8 matrix products (before
    /// compute capability 8.9: Ada, Hopper).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_fp8_tflops: Option<f64>,
    /// Training compute speed relative to a V100, used to carry a model profile measured on one
    /// device to another where the `carry` module cannot split its steps (a profile without FLOP
    /// counts, a CPU); 1.0 for the V100 itself.
    pub compute_speed_vs_v100: f64,
    /// Where `compute_speed_vs_v100` comes from and how it was obtained.
    pub compute_speed_provenance: Provenance,
    /// The fraction of its peaks each class of operation reached where it was measured, which
    /// a model carried to or from this device computes at (`achieved`); absent, every class
    /// takes `achieved::DEFAULT_FRACTION`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub achieved_fraction_of_peak: Option<AchievedFractions>,
    /// What writing freshly allocated memory costs beyond its bytes; absent, priced as memory
    /// in use (a GPU's caching allocator; a host profile measured before this was).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fresh_memory: Option<FreshMemory>,
    /// Compression encode/decode curves, keyed by compressor name (`fp16`, `topk`, ...).
    pub compression: BTreeMap<String, CodecCost>,
    /// How much compute slows down beside collective and compression kernels.
    pub contention: Contention,
}

impl DeviceProfile {
    /// Loads a shipped profile by name, or a JSON file by path, and validates it.
    pub fn load(name_or_path: &str) -> Result<DeviceProfile> {
        data::load(DataKind::Device, name_or_path, DeviceProfile::validate)
    }

    /// Checks the format version and that every rate, curve and slowdown is in range.
    pub fn validate(&self, label: &str) -> Result<()> {
        data::check_format_version(label, self.format_version)?;
        limits::check_rate(
            label,
            "memory_bandwidth_gbytes_per_s",
            self.memory_bandwidth_gbytes_per_s,
            "GB/s",
        )?;
        // Speeds may be tiny (a measured CPU) but not zero; bounded so times stay in range.
        let tf32 = self.peak_tf32_tflops.map(|v| ("peak_tf32_tflops", v));
        let fp8 = self.peak_fp8_tflops.map(|v| ("peak_fp8_tflops", v));
        for (field, value) in [
            ("peak_fp32_tflops", self.peak_fp32_tflops),
            ("peak_fp16_tflops", self.peak_fp16_tflops),
            ("compute_speed_vs_v100", self.compute_speed_vs_v100),
        ]
        .into_iter()
        .chain(tf32)
        .chain(fp8)
        {
            limits::check_positive_at_most(label, field, value, limits::MAX_RATE)?;
        }
        if let Some(gib) = self.memory_gib {
            limits::check_positive_at_most(label, "memory_gib", gib, MAX_MEMORY_GIB)?;
        }
        if let Some(achieved) = &self.achieved_fraction_of_peak {
            achieved.validate(label)?;
        }
        if let Some(fresh) = &self.fresh_memory {
            limits::check_within(
                label,
                "fresh_memory.ns_per_byte",
                fresh.ns_per_byte,
                0.0..=MAX_FRESH_NS_PER_BYTE,
                || format!("a cost per byte is 0 to {MAX_FRESH_NS_PER_BYTE} ns"),
            )?;
            if fresh.from_bytes > MAX_FRESH_FROM_BYTES {
                return Err(SimError::invalid(
                    label,
                    "fresh_memory.from_bytes",
                    format!(
                        "is at most {MAX_FRESH_FROM_BYTES}, got {}",
                        fresh.from_bytes
                    ),
                ));
            }
        }
        if self.sm_count == Some(0) {
            return Err(SimError::invalid(
                label,
                "sm_count",
                "a GPU has at least one SM",
            ));
        }
        for (name, cost) in &self.compression {
            for (which, curve) in [
                ("encode", &cost.encode),
                ("decode", &cost.decode),
                ("aggregate", &cost.aggregate),
            ] {
                let field = format!("compression.{name}.{which}");
                limits::check_duration_us(label, &format!("{field}.floor_us"), curve.floor_us)?;
                // Bounded so that the largest model's curve stays within the duration limit.
                let fresh = curve
                    .fresh_pages
                    .map(|f| ("fresh_pages.ns_per_element", f.ns_per_element));
                for (slope, per) in [
                    ("ns_per_element", curve.ns_per_element),
                    ("ns_per_kept_element", curve.ns_per_kept_element),
                ]
                .into_iter()
                .chain(fresh)
                {
                    limits::check_ns_per_element(label, &format!("{field}.{slope}"), per)?;
                }
                // A sparsifier keeping every element pays both slopes per element, and a large
                // call its fresh pages too.
                let both = curve.ns_per_element
                    + curve.ns_per_kept_element
                    + curve.fresh_pages.map_or(0.0, |f| f.ns_per_element);
                if both > limits::MAX_NS_PER_ELEMENT {
                    return Err(SimError::invalid(
                        label,
                        format!("{field}.ns_per_kept_element"),
                        format!(
                            "with ns_per_element, a per-element cost is at most {} ns, got {both}",
                            limits::MAX_NS_PER_ELEMENT
                        ),
                    ));
                }
                let why = (curve.ns_per_kept_element > 0.0)
                    .then(|| why_no_kept_cost(name))
                    .flatten();
                if let Some(why) = why {
                    return Err(SimError::invalid(
                        label,
                        format!("{field}.ns_per_kept_element"),
                        why,
                    ));
                }
            }
        }
        for (field, value) in [
            (
                "contention.compute_slowdown_with_collective",
                self.contention
                    .compute_slowdown_with_collective
                    .unwrap_or(1.0),
            ),
            (
                "contention.compute_slowdown_with_compression",
                self.contention.compute_slowdown_with_compression,
            ),
        ] {
            if !(value.is_finite() && (1.0..=limits::MAX_SLOWDOWN).contains(&value)) {
                return Err(SimError::invalid(
                    label,
                    field,
                    format!(
                        "a slowdown is a factor from 1 to {}, got {value}",
                        limits::MAX_SLOWDOWN
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The encode/decode cost of a compressor, or an error naming the compressors this profile has.
    pub fn codec_cost(&self, compressor: &str) -> Result<&CodecCost> {
        self.compression
            .get(compressor)
            .ok_or_else(|| SimError::UnknownName {
                kind: "compressor in this device profile",
                name: format!("{compressor} (device {})", self.name),
                valid: self
                    .compression
                    .keys()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", "),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fresh(ns_per_byte: f64) -> FreshMemory {
        FreshMemory {
            ns_per_byte,
            from_bytes: 32 << 20,
            provenance: Provenance {
                status: crate::inputs::model::Status::Measured,
                method: "test".into(),
            },
        }
    }

    #[test]
    fn a_gpu_without_sms_or_with_a_bad_tf32_peak_is_an_error_naming_the_field() {
        let good = DeviceProfile::load("a100-sxm4-40gb").unwrap();
        for (field, mutate) in [
            (
                "sm_count",
                (|d: &mut DeviceProfile| d.sm_count = Some(0)) as fn(&mut _),
            ),
            ("peak_tf32_tflops", |d| d.peak_tf32_tflops = Some(-1.0)),
            ("peak_tf32_tflops", |d| d.peak_tf32_tflops = Some(f64::NAN)),
            ("peak_fp8_tflops", |d| d.peak_fp8_tflops = Some(0.0)),
            ("fresh_memory.ns_per_byte", |d| {
                d.fresh_memory = Some(fresh(-0.1))
            }),
            ("fresh_memory.ns_per_byte", |d| {
                d.fresh_memory = Some(fresh(f64::NAN))
            }),
            ("fresh_memory.ns_per_byte", |d| {
                d.fresh_memory = Some(fresh(1e6))
            }),
            ("fresh_memory.from_bytes", |d| {
                d.fresh_memory = Some(FreshMemory {
                    from_bytes: 1 << 41,
                    ..fresh(0.4)
                })
            }),
            ("compression.fp16.encode.fresh_pages.ns_per_element", |d| {
                d.compression.get_mut("fp16").unwrap().encode.fresh_pages = Some(FreshPages {
                    from_elements: 1,
                    ns_per_element: 1e9,
                })
            }),
        ] {
            let mut device = good.clone();
            mutate(&mut device);
            let err = device.validate("a100").unwrap_err().to_string();
            assert!(err.contains(field), "{field}: {err}");
        }
    }

    #[test]
    fn fresh_pages_are_paid_from_their_threshold_and_survive_a_round_trip() {
        let curve = CostCurve {
            floor_us: 1.0,
            ns_per_element: 2.0,
            ns_per_kept_element: 0.0,
            fresh_pages: Some(FreshPages {
                from_elements: 100,
                ns_per_element: 3.0,
            }),
        };
        assert_eq!(curve.time(99, 0), SimTime::from_ns(1e3 + 2.0 * 99.0));
        assert_eq!(curve.time(100, 0), SimTime::from_ns(1e3 + 5.0 * 100.0));
        assert_eq!(curve.keeping(0.5).fresh_pages, curve.fresh_pages);
        let text = serde_json::to_string(&curve).unwrap();
        assert_eq!(serde_json::from_str::<CostCurve>(&text).unwrap(), curve);
        // Without fresh pages the stored curve is what it always was.
        let plain = CostCurve {
            fresh_pages: None,
            ..curve
        };
        assert!(!serde_json::to_string(&plain).unwrap().contains("fresh"));
    }

    #[test]
    fn only_a_sparsifier_may_cost_per_kept_element() {
        let mut device = DeviceProfile::load("v100-sxm2-32gb").unwrap();
        device
            .compression
            .get_mut("topk")
            .unwrap()
            .encode
            .ns_per_kept_element = 2.0;
        device.validate("v100").unwrap();
        let mut fp16 = device.clone();
        fp16.compression
            .get_mut("fp16")
            .unwrap()
            .decode
            .ns_per_kept_element = 2.0;
        let err = fp16.validate("v100").unwrap_err().to_string();
        assert!(
            err.contains("compression.fp16.decode.ns_per_kept_element") && err.contains("topk"),
            "{err}"
        );
        for bad in [f64::NAN, -1.0, f64::INFINITY, limits::MAX_NS_PER_ELEMENT] {
            let mut topk = device.clone();
            topk.compression
                .get_mut("topk")
                .unwrap()
                .encode
                .ns_per_kept_element = bad;
            let err = topk.validate("v100").unwrap_err().to_string();
            assert!(
                err.contains("compression.topk.encode.ns_per_kept_element"),
                "{err}"
            );
        }
    }
}
