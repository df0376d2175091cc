//! Horovod's tensor fusion: at every cycle the ready, unsent tensors are packed in order into
//! fusion buffers of at most the threshold (a larger tensor goes alone).

use super::{ready_times_us, StrategyOptions};
use crate::base::error::{Result, SimError};
use crate::compress::Family;
use crate::inputs::model::ModelProfile;
use serde::{Deserialize, Serialize};

/// The Horovod release whose fusion defaults a plan uses, with where that release comes from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HorovodRelease {
    /// `MAJOR.MINOR[.PATCH]`, e.g. `0.19.4`.
    pub release: String,
    /// Which document says the system ran that release.
    pub source: String,
}

/// The first release with HOROVOD_FUSION_THRESHOLD 128 MiB and HOROVOD_CYCLE_TIME 1 ms
/// (horovod/horovod#2468, merged 2020-11-19); the releases before it used 64 MiB and 5 ms.
const NEW_DEFAULTS_SINCE: (u32, u32) = (0, 21);

impl HorovodRelease {
    /// Horovod's default fusion threshold (bytes) and cycle time (µs) in this release.
    pub fn defaults(&self, field: &str) -> Result<(u64, f64)> {
        let bad = || {
            SimError::bad_value(
                field,
                &self.release,
                "a Horovod release is MAJOR.MINOR or MAJOR.MINOR.PATCH, e.g. 0.19.4",
            )
        };
        let numbers: Option<Vec<u32>> = self.release.split('.').map(|p| p.parse().ok()).collect();
        let version = match numbers.as_deref() {
            Some(&[major, minor]) | Some(&[major, minor, _]) => (major, minor),
            _ => return Err(bad()),
        };
        Ok(if version >= NEW_DEFAULTS_SINCE {
            (128 << 20, 1000.0)
        } else {
            (64 << 20, 5000.0)
        })
    }

    /// `base` with this release's fusion defaults.
    pub fn options(&self, field: &str, base: StrategyOptions) -> Result<StrategyOptions> {
        let (fusion_bytes, cycle_us) = self.defaults(field)?;
        Ok(StrategyOptions {
            fusion_bytes,
            cycle_us,
            ..base
        })
    }
}

/// Groups as Horovod's background thread forms them, using the profile's ready times and cycle
/// ticks measured from the start of backward.
pub(super) fn groups(model: &ModelProfile, options: &StrategyOptions) -> Vec<Vec<usize>> {
    let ready = ready_times_us(model);
    let mut groups = Vec::new();
    let mut next = 0;
    while next < ready.len() {
        // The first tick at or after the next unsent tensor becomes ready.
        let tick = if options.cycle_us > 0.0 {
            (ready[next] / options.cycle_us).ceil() * options.cycle_us
        } else {
            ready[next]
        };
        let mut current: Vec<usize> = Vec::new();
        let mut bytes = 0;
        while next < ready.len() && ready[next] <= tick {
            let size = enqueued_bytes(model, next, options);
            if !current.is_empty() && bytes + size > options.fusion_bytes {
                groups.push(std::mem::take(&mut current));
                bytes = 0;
            }
            current.push(next);
            bytes += size;
            next += 1;
        }
        groups.push(current);
    }
    groups
}

/// The bytes of a tensor as Horovod enqueues it: `hvd.Compression.fp16` casts each gradient in
/// its hook, before `allreduce_async_` (horovod/torch/optimizer.py), so the fusion threshold
/// counts the cast tensor (2 bytes an element). Only casts are counted so: the other
/// compressors our Horovod plans carry are priced as codecs around a fused buffer.
fn enqueued_bytes(model: &ModelProfile, t: usize, options: &StrategyOptions) -> u64 {
    let tensor = &model.tensors[t];
    match options.compressor.family() {
        Family::Cast => options.compressor.wire_bytes(tensor.numel),
        _ => tensor.bytes(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn release(text: &str) -> HorovodRelease {
        HorovodRelease {
            release: text.into(),
            source: "a test".into(),
        }
    }

    /// Releases before 0.21 fuse 64 MiB every 5 ms, later ones 128 MiB every 1 ms; anything
    /// but MAJOR.MINOR[.PATCH] is refused naming the field.
    #[test]
    fn the_defaults_follow_the_release() {
        for (text, defaults) in [
            ("0.18.2", (64 << 20, 5000.0)),
            ("0.19", (64 << 20, 5000.0)),
            ("0.20.3", (64 << 20, 5000.0)),
            ("0.21.0", (128 << 20, 1000.0)),
            ("0.28.1", (128 << 20, 1000.0)),
            ("1.0", (128 << 20, 1000.0)),
        ] {
            assert_eq!(
                release(text).defaults("horovod.release").unwrap(),
                defaults,
                "{text}"
            );
        }
        for text in ["", "0", "0.19.4.1", "0.x", "v0.19", "0.19."] {
            let err = release(text)
                .defaults("horovod.release")
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("horovod.release") && err.contains("MAJOR.MINOR"),
                "{text}: {err}"
            );
        }
    }
}
