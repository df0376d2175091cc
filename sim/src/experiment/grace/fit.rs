//! Fitting GRACE's calibration: batch and MPI/TCP costs on a grid against the dense rows, then one codec-cost scale pair per compressor.

use super::calibration::{Calibration, CodecScale};
use super::compute;
use super::measured::Measurement;
use super::{GraceSpec, MethodSpec};
use crate::error::{Result, SimError};
use rayon::prelude::*;
use std::collections::BTreeMap;

/// Grids of the MPI/TCP search: TCP goodput share, per-message overhead, CPU reduction rate.
const TCP_EFFICIENCY: [f64; 15] = [
    0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95,
];
const MESSAGE_OVERHEAD_US: [f64; 9] = [0.0, 1.0, 3.0, 10.0, 30.0, 100.0, 300.0, 1000.0, 3000.0];
const REDUCE_GBYTES_PER_S: [f64; 7] = [1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0];
/// Sizes of the three grids, for the provenance written into the cluster file.
pub const GRID_SIZES: (usize, usize, usize) = (
    TCP_EFFICIENCY.len(),
    MESSAGE_OVERHEAD_US.len(),
    REDUCE_GBYTES_PER_S.len(),
);
/// Codec scales (per-kernel floor, per-element slope) are searched on a log2 grid, then on a
/// grid four times finer around the best point.
const SCALE_GRID_LOG2: std::ops::RangeInclusive<i32> = -10..=14;
const REFINE: i32 = 4;
/// Codec scales whose error is within this many percentage points of the best count as ties;
/// among ties the fit keeps the pair nearest the base curve (smallest |log2 floor| + |log2 slope|),
/// so a compressor with fewer fit rows than parameters gets the smallest change that fits.
const TIE_PCT: f64 = 0.5;

/// Runs the whole fit. Returns the calibration, the chosen batch, and each method's codec scale.
pub fn fit(
    spec: &GraceSpec,
    base: &Calibration,
    data: &[Measurement],
    methods: &BTreeMap<String, MethodSpec>,
) -> Result<(Calibration, u32, BTreeMap<String, CodecScale>)> {
    let none = &methods["none"];
    let targets = compute::targets(spec, data)?;
    let dense: Vec<(&Measurement, &MethodSpec)> = data
        .iter()
        .filter(|m| {
            m.model == spec.network_model
                && m.workers > 1
                && m.method == "none"
                && m.excluded.is_none()
        })
        .map(|m| (m, none))
        .collect();
    let mut best: Option<(f64, Calibration, u32)> = None;
    for &batch in &spec.batch_sizes {
        let cal = compute::with_compute(spec, base, &targets, batch)?;
        let grid: Vec<(f64, f64, f64)> = TCP_EFFICIENCY
            .iter()
            .flat_map(|&t| {
                MESSAGE_OVERHEAD_US
                    .iter()
                    .flat_map(move |&o| REDUCE_GBYTES_PER_S.iter().map(move |&r| (t, o, r)))
            })
            .collect();
        let scored = grid
            .par_iter()
            .map(|&(t, o, r)| {
                let c = cal.with_mpi(t, o, r);
                Ok((c.mape(spec, &dense)?, c))
            })
            .collect::<Result<Vec<_>>>()?;
        for (error, c) in scored {
            if best.as_ref().is_none_or(|b| error < b.0) {
                best = Some((error, c, batch));
            }
        }
    }
    let (_, mut cal, batch) = best.ok_or_else(|| {
        SimError::invalid("spec.json", "batch_sizes", "needs at least one batch size")
    })?;
    let base_device = cal.device.clone();
    let fitted = methods
        .par_iter()
        .filter(|(name, m)| m.compressor.is_some() && name.as_str() != "none")
        .map(|(name, method)| {
            let rows: Vec<(&Measurement, &MethodSpec)> = data
                .iter()
                .filter(|m| {
                    m.workers == spec.fit_workers && &m.method == name && m.excluded.is_none()
                })
                .map(|m| (m, method))
                .collect();
            if rows.is_empty() {
                return Ok(None);
            }
            let key = method.resolve(&rows[0].0.ratio, &rows[0].0.memory)?.0.key();
            let error = |floor: f64, slope: f64| -> Result<f64> {
                let scale = CodecScale {
                    floor: floor.exp2(),
                    slope: slope.exp2(),
                };
                cal.with_codec_scale(&base_device, key, scale)?
                    .mape(spec, &rows)
            };
            let mut scored = Vec::new();
            for f in SCALE_GRID_LOG2 {
                for l in SCALE_GRID_LOG2 {
                    let (f, l) = (f64::from(f), f64::from(l));
                    scored.push((error(f, l)?, f, l));
                }
            }
            let (_, f0, l0) = pick(&scored);
            for i in -REFINE..=REFINE {
                for j in -REFINE..=REFINE {
                    let step = |k: i32| f64::from(k) / f64::from(REFINE);
                    let (f, l) = (f0 + step(i), l0 + step(j));
                    scored.push((error(f, l)?, f, l));
                }
            }
            let best = pick(&scored);
            let scale = CodecScale {
                floor: best.1.exp2(),
                slope: best.2.exp2(),
            };
            Ok(Some((name.clone(), key, scale)))
        })
        .collect::<Result<Vec<_>>>()?;
    let mut scales = BTreeMap::new();
    for (name, key, scale) in fitted.into_iter().flatten() {
        cal = cal.with_codec_scale(&base_device, key, scale)?;
        scales.insert(name, scale);
    }
    Ok((cal, batch, scales))
}

/// The best (error, log2 floor, log2 slope): the lowest error, ties (within [`TIE_PCT`]) broken
/// toward the base curve.
fn pick(scored: &[(f64, f64, f64)]) -> (f64, f64, f64) {
    let lowest = scored.iter().map(|s| s.0).fold(f64::INFINITY, f64::min);
    scored
        .iter()
        .filter(|s| s.0 <= lowest + TIE_PCT)
        .min_by(|a, b| (a.1.abs() + a.2.abs()).total_cmp(&(b.1.abs() + b.2.abs())))
        .copied()
        .unwrap_or((lowest, 0.0, 0.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lowest_error_wins_outside_the_tie_band() {
        let scored = [(5.0, 0.0, 0.0), (3.0, 4.0, -2.0), (4.0, 1.0, 1.0)];
        assert_eq!(pick(&scored), (3.0, 4.0, -2.0));
    }

    #[test]
    fn ties_go_to_the_pair_nearest_the_base_curve() {
        let within = 3.0 + TIE_PCT / 2.0;
        let scored = [(3.0, 4.0, -2.0), (within, -1.0, 1.0), (within, 0.0, 3.0)];
        assert_eq!(pick(&scored), (within, -1.0, 1.0));
    }
}
