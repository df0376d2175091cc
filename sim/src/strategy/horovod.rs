//! Horovod's tensor fusion: at every cycle the ready, unsent tensors are packed in order into
//! fusion buffers of at most the threshold (a larger tensor goes alone).

use super::{ready_times_us, StrategyOptions};
use crate::compress::Family;
use crate::inputs::model::ModelProfile;

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
