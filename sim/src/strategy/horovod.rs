//! Horovod's tensor fusion: at every cycle the ready, unsent tensors are packed in order into
//! fusion buffers of at most the threshold (a larger tensor goes alone).

use super::{ready_times_us, StrategyOptions};
use crate::base::error::{Result, SimError};
use crate::base::limits;
use crate::compress::Family;
use crate::inputs::model::ModelProfile;
use serde::{Deserialize, Serialize};

/// Horovod's HOROVOD_FUSION_THRESHOLD and HOROVOD_CYCLE_TIME since v0.21.0 (128 MiB and 1 ms,
/// horovod/horovod#2468, merged 2020-11-19): the defaults of `StrategyOptions` and the CLI.
pub const FUSION_BYTES: u64 = 128 << 20;
/// See [`FUSION_BYTES`].
pub const CYCLE_US: f64 = 1000.0;
/// The defaults before v0.21.0: 64 MiB and 5 ms.
const FUSION_BYTES_BEFORE_0_21: u64 = 64 << 20;
const CYCLE_US_BEFORE_0_21: f64 = 5000.0;

/// The tensor-fusion settings of the Horovod a system ran: a release's defaults, or the
/// threshold and cycle read from its code or scripts; `source` says where they come from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HorovodFusion {
    /// `MAJOR.MINOR[.PATCH]`, e.g. `0.19.4`: the release whose defaults apply.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release: Option<String>,
    /// Or the fusion threshold in MiB, with `cycle_ms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fusion_mib: Option<f64>,
    /// Or the cycle time in ms, with `fusion_mib`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cycle_ms: Option<f64>,
    /// Which document or code says so.
    pub source: String,
}

impl HorovodFusion {
    /// The fusion threshold (bytes) and cycle time (µs); `field` names the spec entry in errors.
    pub fn settings(&self, field: &str) -> Result<(u64, f64)> {
        match (&self.release, self.fusion_mib, self.cycle_ms) {
            (Some(release), None, None) => release_defaults(&format!("{field}.release"), release),
            (None, Some(mib), Some(ms)) => Ok((
                limits::mib(&format!("{field}.fusion_mib"), mib)?,
                limits::flag_duration_us(&format!("{field}.cycle_ms"), ms, ms * 1e3)?,
            )),
            _ => Err(SimError::bad_value(
                field,
                "these fields",
                "give either `release` or both `fusion_mib` and `cycle_ms`",
            )),
        }
    }

    /// The default strategy options with the fusion settings of `fusion`, a spec's `horovod`
    /// entry (absent: the current release's).
    pub fn options(fusion: Option<&HorovodFusion>) -> Result<StrategyOptions> {
        let base = StrategyOptions::default();
        let Some(fusion) = fusion else {
            return Ok(base);
        };
        let (fusion_bytes, cycle_us) = fusion.settings("horovod")?;
        Ok(StrategyOptions {
            fusion_bytes,
            cycle_us,
            ..base
        })
    }
}

/// A release's default fusion threshold and cycle time.
fn release_defaults(field: &str, release: &str) -> Result<(u64, f64)> {
    let numbers: Option<Vec<u32>> = release.split('.').map(|p| p.parse().ok()).collect();
    let version = match numbers.as_deref() {
        Some(&[major, minor]) | Some(&[major, minor, _]) => (major, minor),
        _ => {
            return Err(SimError::bad_value(
                field,
                release,
                "a Horovod release is MAJOR.MINOR or MAJOR.MINOR.PATCH, e.g. 0.19.4",
            ))
        }
    };
    Ok(if version >= (0, 21) {
        (FUSION_BYTES, CYCLE_US)
    } else {
        (FUSION_BYTES_BEFORE_0_21, CYCLE_US_BEFORE_0_21)
    })
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

    fn release(text: &str) -> HorovodFusion {
        HorovodFusion {
            release: Some(text.into()),
            fusion_mib: None,
            cycle_ms: None,
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
                release(text).settings("horovod").unwrap(),
                defaults,
                "{text}"
            );
        }
        for text in ["", "0", "0.19.4.1", "0.x", "v0.19", "0.19."] {
            let err = release(text).settings("horovod").unwrap_err().to_string();
            assert!(
                err.contains("horovod.release") && err.contains("MAJOR.MINOR"),
                "{text}: {err}"
            );
        }
    }

    /// Settings read from code stand without a release; half of them, both ways, or a bad
    /// number are refused naming the field.
    #[test]
    fn explicit_settings_stand_alone() {
        let explicit = |mib: Option<f64>, ms: Option<f64>, release: Option<&str>| HorovodFusion {
            release: release.map(str::to_string),
            fusion_mib: mib,
            cycle_ms: ms,
            source: "a test".into(),
        };
        assert_eq!(
            explicit(Some(64.0), Some(5.0), None)
                .settings("horovod")
                .unwrap(),
            (64 << 20, 5000.0)
        );
        for (spec, says) in [
            (explicit(Some(64.0), None, None), "either `release`"),
            (
                explicit(Some(64.0), Some(5.0), Some("0.19")),
                "either `release`",
            ),
            (explicit(None, None, None), "either `release`"),
            (
                explicit(Some(f64::NAN), Some(5.0), None),
                "horovod.fusion_mib",
            ),
            (explicit(Some(64.0), Some(-1.0), None), "horovod.cycle_ms"),
        ] {
            let err = spec.settings("horovod").unwrap_err().to_string();
            assert!(err.contains(says), "{err}");
        }
    }
}
