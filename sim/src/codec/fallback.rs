//! The cost curves a compressor follows on a device.
//!
//! They are the device profile's, or the catalog's memory-bandwidth estimate when the profile has
//! none.

use crate::base::time::SimTime;
use crate::compress::{Compressor, Work};
use crate::inputs::device::{CostCurve, DeviceKind, DeviceProfile};

/// Fraction of the GPU's peak memory bandwidth an elementwise kernel reaches (the shipped GPU
/// profiles' estimates use it).
pub const GPU_BANDWIDTH_EFFICIENCY: f64 = 0.7;
/// Launch and synchronization cost of one GPU kernel.
pub const GPU_LAUNCH_US: f64 = 5.0;
/// Median ratio of the bandwidth bound to the measured cost over `host-2core.json`'s curves
/// (0.49, rounded); CPU codecs are function calls, so they have no floor.
pub(super) const CPU_BANDWIDTH_EFFICIENCY: f64 = 0.5;

/// Encode and decode cost curves of one compressor on one device.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CodecCurves {
    encode: CostCurve,
    /// Per payload decoded.
    decode: CostCurve,
    /// Once per decode call (see [`crate::inputs::device::CodecCost`]); zero in the estimate, whose
    /// decode adds each payload into the result.
    aggregate: CostCurve,
    /// True when the device profile has no curve for the compressor and these are the
    /// memory-bandwidth estimate.
    pub fallback: bool,
    /// Whether the curves include the passes around the codec
    /// ([`CodecCost::includes_passes`](crate::inputs::device::CodecCost)).
    pub includes_passes: bool,
    /// Whose curves these are: a sparsifier's per-kept slopes are paid on the elements it keeps.
    compressor: Compressor,
}

impl CodecCurves {
    /// The device profile's curves for `c`, or else the estimate from the catalog row's work
    /// (the rule and where its constants come from are on the `CATALOG` table in
    /// `compress/catalog.rs`).
    pub fn on(c: &Compressor, device: &DeviceProfile) -> CodecCurves {
        match device.compression.get(c.key()) {
            Some(cost) => CodecCurves {
                encode: cost.encode,
                decode: cost.decode,
                aggregate: cost.aggregate,
                fallback: false,
                includes_passes: cost.includes_passes,
                compressor: *c,
            },
            None => {
                let entry = c.entry();
                CodecCurves {
                    encode: estimate(entry.encode, device),
                    decode: estimate(entry.decode, device),
                    aggregate: CostCurve::default(),
                    fallback: true,
                    includes_passes: false,
                    compressor: *c,
                }
            }
        }
    }

    /// One encode call over `numel` elements.
    pub fn encode_time(&self, numel: u64) -> SimTime {
        self.encode
            .time(numel, self.compressor.kept_elements(numel))
    }

    /// One payload of `numel` elements decoded.
    pub fn decode_time(&self, numel: u64) -> SimTime {
        self.decode
            .time(numel, self.compressor.kept_elements(numel))
    }

    /// Time of one decode call that combines `payloads` payloads of `numel` elements each: the
    /// call's cost once and each payload's decode (an allgather's p, a pull's one).
    pub fn call_time(&self, numel: u64, payloads: u64) -> SimTime {
        self.aggregate
            .time(numel, self.compressor.kept_elements(numel))
            + SimTime(self.decode_time(numel).as_ns().saturating_mul(payloads))
    }
}

/// How [`ns_per_byte`] prices a byte, as provenance words it.
pub(super) const BYTE_PRICE_SOURCE: &str =
    "the device's memory bandwidth at the catalog estimates' efficiency, 0.7 on a GPU and 0.5 on a CPU";

/// Time to move one byte through `device`'s memory in an elementwise kernel: bandwidth ×
/// efficiency, in ns.
pub(super) fn ns_per_byte(device: &DeviceProfile) -> f64 {
    let efficiency = match device.kind {
        DeviceKind::Gpu => GPU_BANDWIDTH_EFFICIENCY,
        DeviceKind::Cpu => CPU_BANDWIDTH_EFFICIENCY,
    };
    // B / (GB/s) is ns.
    1.0 / (device.memory_bandwidth_gbytes_per_s * efficiency)
}

/// The floor of one kernel on `device`: a GPU's launch; a CPU's codecs are function calls.
pub(super) fn launch_us(device: &DeviceProfile) -> f64 {
    match device.kind {
        DeviceKind::Gpu => GPU_LAUNCH_US,
        DeviceKind::Cpu => 0.0,
    }
}

/// bytes / (bandwidth × efficiency) per element, plus a launch floor per kernel on a GPU.
fn estimate(work: Work, device: &DeviceProfile) -> CostCurve {
    let ns_per_byte = ns_per_byte(device);
    CostCurve {
        floor_us: launch_us(device) * f64::from(work.kernels),
        ns_per_element: work.bytes_per_element * ns_per_byte,
        ns_per_kept_element: work.bytes_per_kept_element * ns_per_byte,
        fresh_pages: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::data::DataKind;
    use crate::base::time::SimTime;
    use crate::compress::catalog;
    use crate::inputs::model::Status;

    fn without(device: &str, key: &str) -> DeviceProfile {
        let mut profile = DeviceProfile::load(device).unwrap();
        assert!(profile.compression.remove(key).is_some());
        profile
    }

    #[test]
    fn a_gpu_profile_without_a_curve_gets_the_bandwidth_estimate() {
        let v100 = without("v100-sxm2-32gb", "topk");
        let topk: Compressor = "topk:0.01".parse().unwrap();
        assert!(CodecCurves::on(&topk, &v100).fallback);
        // Encode: 6 kernels × 5 µs + 24.08 B / (900 GB/s × 0.7) per element
        // = 30 000 + 38 222.2 ns for 10^6 elements.
        assert_eq!(
            CodecCurves::on(&topk, &v100).encode_time(1_000_000),
            SimTime(68_222)
        );
        // Decode: 1 kernel × 5 µs + 4.08 B / 630 GB/s = 5 000 + 6 476.2 ns.
        assert_eq!(
            CodecCurves::on(&topk, &v100).decode_time(1_000_000),
            SimTime(11_476)
        );
        // The other curves are still the profile's.
        let dgc: Compressor = "dgc:0.01".parse().unwrap();
        assert!(!CodecCurves::on(&dgc, &v100).fallback);
        let cost = &v100.compression["dgc"].encode;
        assert_eq!(
            CodecCurves::on(&dgc, &v100).encode_time(1_000_000),
            cost.time(1_000_000, 10_000)
        );
    }

    #[test]
    fn a_cpu_profile_without_a_curve_gets_the_bandwidth_estimate() {
        let host = without("host-2core", "dgc");
        let dgc: Compressor = "dgc:0.01".parse().unwrap();
        // 8.12 B / (15.5403 GB/s × 0.5) = 1.045 ns per element, no floor.
        assert_eq!(
            CodecCurves::on(&dgc, &host).encode_time(1_000_000),
            SimTime(1_045_023)
        );
        assert_eq!(CodecCurves::on(&dgc, &host).encode_time(0), SimTime::ZERO);
    }

    fn gpu_profiles() -> Vec<DeviceProfile> {
        DataKind::Device
            .shipped_names()
            .into_iter()
            .map(|name| DeviceProfile::load(name).unwrap())
            .filter(|d| d.kind == DeviceKind::Gpu)
            .collect()
    }

    #[test]
    fn a_sparsifier_costs_more_the_more_it_keeps() {
        // topk's from the catalog's estimate, dgc's from a profile with a per-kept slope.
        let mut curves = without("v100-sxm2-32gb", "topk");
        let per_kept = CostCurve {
            floor_us: 5.0,
            ns_per_element: 0.05,
            ns_per_kept_element: 2.0,
            fresh_pages: None,
        };
        let cost = curves.compression.get_mut("dgc").unwrap();
        (cost.encode, cost.decode) = (per_kept, per_kept);
        let n = 1_000_000;
        for key in ["topk", "dgc"] {
            let at = |ratio: f64| {
                let c: Compressor = format!("{key}:{ratio}").parse().unwrap();
                let curves = CodecCurves::on(&c, &curves);
                (curves.encode_time(n), curves.decode_time(n))
            };
            let (low, high) = (at(0.01), at(0.5));
            assert!(high.0 > low.0 && high.1 > low.1, "{key}: {low:?} {high:?}");
        }
        // The profile's per-kept slope on the 500 000 elements kept: 0.05 × n + 2 × n / 2 ns.
        let c: Compressor = "dgc:0.5".parse().unwrap();
        assert_eq!(
            CodecCurves::on(&c, &curves).encode_time(n),
            SimTime::from_ns(5e3 + 1.05 * n as f64)
        );
    }

    #[test]
    fn a_sparsifier_pays_per_kept_on_the_elements_its_payload_carries() {
        let mut profile = DeviceProfile::load("host-2core").unwrap();
        let per_kept = CostCurve {
            floor_us: 0.0,
            ns_per_element: 0.0,
            ns_per_kept_element: 1000.0,
            fresh_pages: None,
        };
        let cost = profile.compression.get_mut("topk").unwrap();
        (cost.encode, cost.decode, cost.aggregate) = (per_kept, per_kept, per_kept);
        let topk: Compressor = "topk:0.01".parse().unwrap();
        let curves = CodecCurves::on(&topk, &profile);
        // 50 elements at 1 % keep one (ceil), which the payload carries; 1001 keep 11.
        for (n, kept) in [(50, 1), (1001, 11), (0, 0)] {
            assert_eq!(topk.kept_elements(n), kept);
            assert_eq!(curves.encode_time(n), SimTime(1000 * kept));
            assert_eq!(
                topk.wire_bytes(n),
                8 * kept,
                "the payload holds what is priced"
            );
        }
        // A decode call of 4 payloads pays the kept elements once for the call and once per
        // payload.
        assert_eq!(curves.call_time(50, 4), SimTime(5 * 1000));
        // Compressors that keep no share pay no per-kept cost.
        assert_eq!(
            "signsgd".parse::<Compressor>().unwrap().kept_elements(50),
            0
        );
    }

    /// The catalog's kernel counts are the ones the shipped GPU floors assume, and its bytes give
    /// back every curve those profiles estimated from memory bandwidth alone (the H200's were
    /// measured).
    #[test]
    fn the_fallback_reproduces_the_shipped_gpu_estimates() {
        // (key, encode?, decode?) curves whose provenance is bytes / (bandwidth × 0.7).
        let bandwidth_only = [
            ("fp16", true, true),
            ("bf16", true, true),
            ("fp8", true, true),
            ("natural", true, true),
            ("qsgd", true, true),
            ("terngrad", true, true),
            ("threshold", true, true),
            ("powersgd", true, true),
            ("tbq", false, true),
            ("none", true, true),
        ];
        let profiles = gpu_profiles();
        assert_eq!(profiles.len(), 6);
        let estimated = |d: &DeviceProfile| {
            d.compression
                .values()
                .all(|c| c.provenance.status != Status::Measured)
        };
        assert_eq!(profiles.iter().filter(|d| estimated(d)).count(), 5);
        for device in &profiles {
            // A compressor newer than the profiles has no curve to compare with.
            for entry in catalog() {
                let Some(shipped) = device.compression.get(entry.key) else {
                    continue;
                };
                // A measured curve (the H200's) is not an estimate to reproduce.
                if shipped.provenance.status == Status::Measured {
                    continue;
                }
                let c: Compressor = entry.example.parse().unwrap();
                let mut bare = device.clone();
                bare.compression.clear();
                let estimate = CodecCurves::on(&c, &bare);
                let which = bandwidth_only.iter().find(|(k, _, _)| *k == entry.key);
                for (name, shipped, estimate, by_bandwidth) in [
                    (
                        "encode",
                        shipped.encode,
                        estimate.encode,
                        which.is_some_and(|w| w.1),
                    ),
                    (
                        "decode",
                        shipped.decode,
                        estimate.decode,
                        which.is_some_and(|w| w.2),
                    ),
                ] {
                    let what = format!("{} {} {name}", device.name, entry.key);
                    assert_eq!(shipped.floor_us, estimate.floor_us, "{what}");
                    let slope = (shipped.ns_per_element, estimate.ns_per_element);
                    if by_bandwidth {
                        assert!(
                            (slope.0 - slope.1).abs() <= 1e-3 * slope.1,
                            "{what}: {slope:?}"
                        );
                    }
                }
            }
        }
    }

    /// The CPU efficiency is the median over the measured host profile's curves.
    #[test]
    fn the_cpu_efficiency_is_the_measured_median() {
        let host = DeviceProfile::load("host-2core").unwrap();
        let mut ratios: Vec<f64> = catalog()
            .iter()
            .filter_map(|e| Some((e, host.compression.get(e.key)?)))
            .flat_map(|(e, cost)| {
                // The host profile was measured at the catalog example's ratio.
                let c: Compressor = e.example.parse().unwrap();
                let kept = c.kept_fraction().unwrap_or(0.0);
                [(e.encode, cost.encode, kept), (e.decode, cost.decode, kept)]
            })
            .filter(|(work, _, _)| work.bytes_per_element > 0.0)
            .map(|(work, measured, kept)| {
                (work.bytes_per_element + work.bytes_per_kept_element * kept)
                    / host.memory_bandwidth_gbytes_per_s
                    / measured.keeping(kept).ns_per_element
            })
            .collect();
        ratios.sort_by(f64::total_cmp);
        assert!(ratios.len() >= 34, "{} curves", ratios.len());
        let middle = ratios.len() / 2;
        let median = (ratios[(ratios.len() - 1) / 2] + ratios[middle]) / 2.0;
        assert!(
            (median - CPU_BANDWIDTH_EFFICIENCY).abs() < 0.05,
            "median {median}"
        );
    }
}
