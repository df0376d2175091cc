//! Fitting GRACE's calibration on its calibration rows.
//!
//! In order: compute speed, MPI/TCP costs on a grid against the dense row, then one decode price
//! for every compressor and an encode price per compressor.

use super::calibration::{Calibration, CodecPrice, OpCost};
use super::compute::{self, ComputeTarget};
use super::measured::Measurement;
use super::{GraceSpec, MethodSpec};
use crate::base::error::{Result, SimError};
use crate::codec::Implementation;
use crate::inputs::topology::Library;
use rayon::prelude::*;
use std::collections::BTreeMap;

/// Grids of the MPI/TCP search: TCP goodput share, per-message overhead, CPU reduction rate.
const TCP_EFFICIENCY: [f64; 15] = [
    0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95,
];
const MESSAGE_OVERHEAD_US: [f64; 9] = [0.0, 1.0, 3.0, 10.0, 30.0, 100.0, 300.0, 1000.0, 3000.0];
const REDUCE_GBYTES_PER_S: [f64; 7] = [1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0];
/// Sizes of the three grids, for the provenance written into the cluster file.
pub(super) const GRID_SIZES: (usize, usize, usize) = (
    TCP_EFFICIENCY.len(),
    MESSAGE_OVERHEAD_US.len(),
    REDUCE_GBYTES_PER_S.len(),
);
/// Op and byte prices are searched on a log2 grid of multiples of the base price, then on a
/// grid four times finer around the best point.
pub(super) const PRICE_GRID_LOG2: std::ops::RangeInclusive<i32> = -4..=14;
const REFINE: i32 = 4;
/// The fitted MPI costs that sit on an end of their grid, named: a fit that wants to go further
/// than the grid allows says that the model's structure, not the data, limits it.
pub(super) fn mpi_on_bounds(tcp: f64, overhead: f64, reduce: f64) -> Vec<&'static str> {
    let ends = |grid: &[f64], value: f64| {
        grid.first().is_some_and(|&x| value <= x) || grid.last().is_some_and(|&x| value >= x)
    };
    [
        ("tcp_efficiency", ends(&TCP_EFFICIENCY, tcp)),
        ("message_overhead_us", ends(&MESSAGE_OVERHEAD_US, overhead)),
        ("reduce_gbytes_per_s", ends(&REDUCE_GBYTES_PER_S, reduce)),
    ]
    .into_iter()
    .filter_map(|(name, on)| on.then_some(name))
    .collect()
}

/// Whether a price, as a multiple of the base price, sits on an end of the price grid.
pub(super) fn price_on_bound(multiple: f64) -> bool {
    let log2 = multiple.log2();
    log2 <= f64::from(*PRICE_GRID_LOG2.start()) + 1e-9
        || log2 >= f64::from(*PRICE_GRID_LOG2.end()) - 1e-9
}

/// Errors within this many percentage points of the best count as ties; among ties the fit keeps
/// the point nearest its starting values, so parameters the calibration rows cannot tell apart
/// (three MPI costs from one dense row; an op price from one or two rows) move as little as fits.
pub(super) const TIE_PCT: f64 = 0.5;

/// What the fit produces.
pub(super) struct Fitted {
    pub calibration: Calibration,
    /// Each model's compute factor.
    pub factors: BTreeMap<String, f64>,
    /// Each fitted method's price: its own encode price and the shared decode price.
    pub prices: BTreeMap<String, CodecPrice>,
}

/// Runs the whole fit on the calibration rows.
pub(super) fn fit(
    spec: &GraceSpec,
    base: &Calibration,
    calibration: &[Measurement],
    methods: &BTreeMap<String, MethodSpec>,
    targets: &BTreeMap<String, ComputeTarget>,
) -> Result<Fitted> {
    let (cal, factors) = compute::with_compute(spec, base, targets)?;
    let mut cal = fit_mpi(spec, &cal, calibration, &methods["none"])?;
    let start = OpCost::base(&cal.device);
    // A price from log2 multiples of the start's op and byte prices.
    let price = |(op, byte): (f64, f64)| OpCost {
        us_per_op: start.us_per_op * op.exp2(),
        ns_per_byte: start.ns_per_byte * byte.exp2(),
    };
    let priced = priced_methods(calibration, methods)?;
    let rows: usize = priced.iter().map(|p| p.rows.len()).sum();
    // A compressor's price from its encode op multiple and the shared (decode op, byte) pair.
    let codec = |encode: f64, (decode, byte): (f64, f64)| CodecPrice {
        encode: price((encode, byte)),
        decode: price((decode, byte)),
    };
    // At one shared pair, each method's best encode op multiple and the error over every priced
    // row.
    let at_shared = |shared: (f64, f64)| -> Result<(f64, Vec<f64>)> {
        let encodes = priced
            .par_iter()
            .map(|p| {
                let error = |encode: f64| -> Result<(f64, f64)> {
                    let error = cal
                        .with_codec(p.key, p.implementation, codec(encode, shared))?
                        .mape(spec, &p.rows)?;
                    Ok((error, error))
                };
                let (encode, error) = search(&error, p.name)?;
                Ok((error * p.rows.len() as f64, encode))
            })
            .collect::<Result<Vec<_>>>()?;
        let error = encodes.iter().map(|o| o.0).sum::<f64>() / rows.max(1) as f64;
        Ok((error, encodes.into_iter().map(|o| o.1).collect()))
    };
    let (shared, encodes) = search_pair(&at_shared, "methods")?;
    let mut prices = BTreeMap::new();
    for (p, encode) in priced.iter().zip(encodes) {
        let price = codec(encode, shared);
        cal = cal.with_codec(p.key, p.implementation, price)?;
        prices.insert(p.name.clone(), price);
    }
    Ok(Fitted {
        calibration: cal,
        factors,
        prices,
    })
}

/// A method the fit prices: its consistent calibration rows with more than one worker, its
/// codec's key and its implementation.
struct Priced<'a> {
    name: &'a String,
    key: &'static str,
    implementation: &'a Implementation,
    rows: Vec<(&'a Measurement, &'a MethodSpec)>,
}

/// The methods with an implementation and calibration rows to price it on.
fn priced_methods<'a>(
    calibration: &'a [Measurement],
    methods: &'a BTreeMap<String, MethodSpec>,
) -> Result<Vec<Priced<'a>>> {
    let mut priced = Vec::new();
    for (name, method) in methods {
        let Some(implementation) = &method.implementation else {
            continue;
        };
        let rows: Vec<(&Measurement, &MethodSpec)> = calibration
            .iter()
            .filter(|m| &m.method == name && m.workers > 1 && m.excluded.is_none())
            .map(|m| (m, method))
            .collect();
        if let Some((first, _)) = rows.first() {
            let key = method.resolve(&first.ratio, &first.memory)?.0.key();
            priced.push(Priced {
                name,
                key,
                implementation,
                rows,
            });
        }
    }
    Ok(priced)
}

/// The log2 price multiple of the lowest `error` (which gives the error at a multiple and what
/// came with it), and what came with it: on [`PRICE_GRID_LOG2`], then on a grid [`REFINE`] times finer around
/// the best point; ties go to the multiple nearest 0 (the start).
fn search<T: Clone>(error: &dyn Fn(f64) -> Result<(f64, T)>, what: &str) -> Result<(f64, T)> {
    let score = |multiple: f64| {
        error(multiple).map(|(error, with)| (error, multiple.abs(), (multiple, with)))
    };
    let mut scored = PRICE_GRID_LOG2
        .map(|k| score(f64::from(k)))
        .collect::<Result<Vec<_>>>()?;
    let (coarse, _) = pick(&scored, what)?;
    for k in -REFINE..=REFINE {
        scored.push(score(coarse + f64::from(k) / f64::from(REFINE))?);
    }
    pick(&scored, what)
}

/// Rounds of [`search_pair`] at most: each moves the op multiple, then the byte multiple.
const PAIR_ROUNDS: usize = 4;

/// The (op, byte) pair of log2 price multiples of the lowest `error` found by turns, and what
/// came with it: the op multiple at the current byte multiple (0 at first), then the byte
/// multiple at that op multiple, each by [`search`], until a round moves neither or after
/// [`PAIR_ROUNDS`] rounds. A fixed procedure, so the fit is the same every time.
fn search_pair<T: Clone>(
    error: &dyn Fn((f64, f64)) -> Result<(f64, T)>,
    what: &str,
) -> Result<((f64, f64), T)> {
    let round = |byte: f64| -> Result<(f64, f64, T)> {
        let (op, _) = search(&|op| error((op, byte)), what)?;
        let (byte, with) = search(&|byte| error((op, byte)), what)?;
        Ok((op, byte, with))
    };
    let (mut op, mut byte, mut with) = round(0.0)?;
    for _ in 1..PAIR_ROUNDS {
        let (next_op, next_byte, next_with) = round(byte)?;
        let settled = next_op == op && next_byte == byte;
        (op, byte, with) = (next_op, next_byte, next_with);
        if settled {
            break;
        }
    }
    Ok(((op, byte), with))
}

/// The MPI/TCP costs that best fit the network model's dense calibration rows, ties broken
/// toward the base cluster's estimates.
fn fit_mpi(
    spec: &GraceSpec,
    cal: &Calibration,
    calibration: &[Measurement],
    none: &MethodSpec,
) -> Result<Calibration> {
    let dense: Vec<(&Measurement, &MethodSpec)> = calibration
        .iter()
        .filter(|m| {
            m.model == spec.network_model
                && m.workers > 1
                && m.method == "none"
                && m.excluded.is_none()
        })
        .map(|m| (m, none))
        .collect();
    if dense.is_empty() {
        return Err(SimError::invalid(
            "spec.json",
            "network_model",
            format!(
                "{} has no consistent multi-worker `none` row with at most {} workers to fit the MPI costs on",
                spec.network_model, spec.fit_workers
            ),
        ));
    }
    let Library::Mpi(start) = &cal.cluster.library else {
        return Err(SimError::invalid(
            "spec.json",
            "base_cluster",
            "GRACE ran Horovod over MPI: the base cluster needs an `mpi` library",
        ));
    };
    // Distance from the base estimates in log units (the overhead may be 0).
    let distance = |t: f64, o: f64, r: f64| {
        (t / start.tcp_efficiency).ln().abs()
            + ((1.0 + o) / (1.0 + start.message_overhead_us)).ln().abs()
            + (r / start.reduce_gbytes_per_s).ln().abs()
    };
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
            let error = cal.with_mpi(t, o, r).mape(spec, &dense)?;
            Ok((error, distance(t, o, r), (t, o, r)))
        })
        .collect::<Result<Vec<_>>>()?;
    let (t, o, r) = pick(&scored, "base_cluster")?;
    Ok(cal.with_mpi(t, o, r))
}

/// The point of the lowest error; among points within [`TIE_PCT`] of it, the one nearest the
/// start (smallest distance; the first of equals, so the grid order decides determinately).
/// An error names `what` when no point has a finite error.
fn pick<T: Clone>(scored: &[(f64, f64, T)], what: &str) -> Result<T> {
    let lowest = scored.iter().map(|s| s.0).fold(f64::INFINITY, f64::min);
    scored
        .iter()
        .filter(|s| s.0 <= lowest + TIE_PCT)
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .map(|s| s.2.clone())
        .ok_or_else(|| SimError::invalid("spec.json", what, "no grid point gives a finite error"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lowest_error_wins_outside_the_tie_band() {
        let scored = [(5.0, 0.0, 'a'), (3.0, 6.0, 'b'), (4.0, 2.0, 'c')];
        assert_eq!(pick(&scored, "t").unwrap(), 'b');
    }

    #[test]
    fn ties_go_to_the_point_nearest_the_start() {
        let within = 3.0 + TIE_PCT / 2.0;
        let scored = [(3.0, 6.0, 'a'), (within, 2.0, 'b'), (within, 3.0, 'c')];
        assert_eq!(pick(&scored, "t").unwrap(), 'b');
    }

    #[test]
    fn parameters_on_the_ends_of_their_grids_are_named() {
        assert!(mpi_on_bounds(0.8, 30.0, 5.0).is_empty());
        assert_eq!(
            mpi_on_bounds(0.95, 0.0, 5.0),
            vec!["tcp_efficiency", "message_overhead_us"]
        );
        assert!(price_on_bound(2f64.powi(*PRICE_GRID_LOG2.end())));
        assert!(price_on_bound(2f64.powi(*PRICE_GRID_LOG2.start() - 1)));
        assert!(!price_on_bound(1.0));
    }

    #[test]
    fn a_pair_of_prices_is_found_by_turns() {
        // A bowl whose lowest point is off the start on both axes and between grid points on
        // one (the coarse grid finds the op multiple, the finer one the byte multiple), steep
        // enough that no neighbour ties with it.
        let bowl = |(op, byte): (f64, f64)| -> Result<(f64, (f64, f64))> {
            let error = 100.0 * ((op - 3.0).powi(2) + (byte + 1.75).powi(2));
            Ok((error, (op, byte)))
        };
        let ((op, byte), with) = search_pair(&bowl, "t").unwrap();
        assert_eq!((op, byte), (3.0, -1.75));
        assert_eq!(with, (op, byte));
    }

    #[test]
    fn no_finite_error_is_an_error_naming_the_fit() {
        let scored = [(f64::NAN, 0.0, 'a')];
        let err = pick(&scored, "methods").unwrap_err().to_string();
        assert!(err.contains("methods"), "{err}");
    }
}
