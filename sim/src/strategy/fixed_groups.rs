//! N contiguous groups in backward order, balanced by bytes or by tensor count.

use crate::base::error::{Result, SimError};
use crate::inputs::model::ModelProfile;
use std::fmt;

/// What `fixed-groups:N` balances across its groups.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupingRule {
    /// Group g ends at the first tensor where the running byte total reaches (g+1)/N of the model.
    Bytes,
    /// Groups hold ⌈n/N⌉ or ⌊n/N⌋ tensors.
    Count,
}

impl fmt::Display for GroupingRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            GroupingRule::Bytes => "bytes",
            GroupingRule::Count => "count",
        })
    }
}

/// Splits the model's tensors, in backward order, into `count` contiguous groups balanced
/// by `rule`; errs unless 1 ≤ `count` ≤ the number of tensors.
pub fn groups(model: &ModelProfile, count: usize, rule: GroupingRule) -> Result<Vec<Vec<usize>>> {
    let n = model.num_tensors();
    if count == 0 || count > n {
        return Err(SimError::bad_value(
            "fixed-groups count",
            count,
            format!("must be between 1 and the model's {n} tensors"),
        ));
    }
    let ends = match rule {
        GroupingRule::Count => (1..=count).map(|g| g * n / count).collect::<Vec<_>>(),
        GroupingRule::Bytes => byte_balanced_ends(model, count),
    };
    let mut start = 0;
    Ok(ends
        .into_iter()
        .map(|end| {
            let group = (start..end).collect();
            start = end;
            group
        })
        .collect())
}

/// Exclusive end index of each group; every group keeps at least one tensor even when one huge
/// tensor would cross several byte targets.
fn byte_balanced_ends(model: &ModelProfile, count: usize) -> Vec<usize> {
    let n = model.num_tensors();
    let total: u64 = model.total_gradient_bytes();
    let mut ends = Vec::with_capacity(count);
    let mut running = 0u64;
    let mut t = 0;
    for g in 0..count {
        let target = total as u128 * (g as u128 + 1) / count as u128;
        // Leave one tensor for each group still to come.
        let last_allowed = n - (count - g);
        loop {
            running += model.tensors[t].bytes();
            t += 1;
            if t > last_allowed || running as u128 >= target {
                break;
            }
        }
        ends.push(t);
    }
    if let Some(last) = ends.last_mut() {
        *last = n;
    }
    ends
}
