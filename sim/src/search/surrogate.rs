//! A fast surrogate of one iteration's synchronization for contiguous groups, solved exactly by
//! dynamic programming: each group's collectives start when its last gradient is ready (plus
//! its encode) and the link is free, and the iteration ends with the last group's decode.

use crate::base::error::Result;
use crate::compress::{Compressor, Memory};
use crate::plan::{CompressOn, Group, Scheme};
use crate::predict::cost::piece_stages;
use crate::predict::scenario::Scenario;
use crate::schedule::Encoding;

/// A compressor and memory a group may use (the first option is always no compression).
pub type Choice = (Compressor, Memory);

/// Models with more tensors than this are searched over this many byte-balanced blocks of
/// consecutive tensors: the DP is cubic in its units and its cost table quadratic, so a
/// 10,000-tensor model would take hours and gigabytes at tensor granularity. Local search
/// then moves boundaries tensor by tensor.
pub(super) const MAX_UNITS: usize = 600;
const BLOCKS: usize = 256;

/// Costs of every contiguous group under every choice, in nanoseconds: `cost[c][a][b]` for the
/// group of units a..=b (backward order). Built once, queried by the DP.
pub(super) struct Costs {
    /// The tensors (first, last) each unit of the DP covers: one tensor each, or a block.
    units: Vec<(usize, usize)>,
    /// Gradient-ready time of each unit (its last tensor) from the start of backward.
    ready: Vec<f64>,
    /// (encode, communication, decode) per choice, per start, per end (end ≥ start).
    stages: Vec<Vec<Vec<[f64; 3]>>>,
}

impl Costs {
    pub(super) fn new(
        scenario: &Scenario,
        choices: &[Choice],
        encoding: Encoding,
    ) -> Result<Costs> {
        let model = &scenario.model;
        let units: Vec<(usize, usize)> = if model.num_tensors() <= MAX_UNITS {
            (0..model.num_tensors()).map(|t| (t, t)).collect()
        } else {
            crate::strategy::fixed_groups(model, BLOCKS, crate::strategy::GroupingRule::Bytes)?
                .iter()
                .map(|g| (g[0], g[g.len() - 1]))
                .collect()
        };
        let n = units.len();
        let ready_by_tensor = crate::strategy::ready_times_us(model);
        let ready = units
            .iter()
            .map(|&(_, last)| ready_by_tensor[last] * 1e3 * scenario.compute_scale)
            .collect();
        let mut stages = Vec::with_capacity(choices.len());
        for &(compressor, memory) in choices {
            let mut by_start = Vec::with_capacity(n);
            for a in 0..n {
                let mut by_end = Vec::with_capacity(n - a);
                for b in a..n {
                    let group = Group {
                        tensors: (units[a].0..=units[b].1).collect(),
                        compressor,
                        memory,
                        compress_on: CompressOn::Gpu,
                        scheme: Scheme::Auto,
                        partitions: 1,
                        priority: 0,
                    };
                    let [e, c, d] = piece_stages(scenario, &group, encoding)?[0];
                    by_end.push([e.as_ns() as f64, c.as_ns() as f64, d.as_ns() as f64]);
                }
                by_start.push(by_end);
            }
            stages.push(by_start);
        }
        Ok(Costs {
            units,
            ready,
            stages,
        })
    }

    fn stage(&self, choice: usize, a: usize, b: usize) -> [f64; 3] {
        self.stages[choice][a][b - a]
    }

    /// For every group count y (index y-1), the partition into y contiguous groups and the
    /// per-group choice that finish synchronization earliest under the surrogate: groups as
    /// (first tensor, last tensor, choice).
    pub(super) fn best_per_group_count(&self, choices: usize) -> Vec<Vec<(usize, usize, usize)>> {
        let n = self.units.len();
        // end[y][b]: earliest time the link is free after y groups covering tensors 0..=b;
        // from[y][b]: (start of the last group, its choice). Later link-free times never help
        // later groups (the recurrence is monotone), so the minimum is optimal.
        let mut end = vec![vec![f64::INFINITY; n]; n + 1];
        let mut from = vec![vec![(0usize, 0usize); n]; n + 1];
        for b in 0..n {
            for c in 0..choices {
                let [e, comm, _] = self.stage(c, 0, b);
                let t = self.ready[b] + e + comm;
                if t < end[1][b] {
                    end[1][b] = t;
                    from[1][b] = (0, c);
                }
            }
        }
        for y in 2..=n {
            for b in (y - 1)..n {
                for a in (y - 1)..=b {
                    let free = end[y - 1][a - 1];
                    if free.is_infinite() {
                        continue;
                    }
                    for c in 0..choices {
                        let [e, comm, _] = self.stage(c, a, b);
                        let t = (self.ready[b] + e).max(free) + comm;
                        if t < end[y][b] {
                            end[y][b] = t;
                            from[y][b] = (a, c);
                        }
                    }
                }
            }
        }
        (1..=n)
            .map(|y| {
                let mut groups = Vec::with_capacity(y);
                let (mut b, mut level) = (n - 1, y);
                while level > 0 {
                    let (a, c) = from[level][b];
                    groups.push((a, b, c));
                    level -= 1;
                    b = a.wrapping_sub(1);
                }
                groups.reverse();
                groups
                    .into_iter()
                    .map(|(a, b, c)| (self.units[a].0, self.units[b].1, c))
                    .collect()
            })
            .collect()
    }
}
