//! What a compressor's encode and decode cost on a device: its curves, or a codec set's ops.
//!
//! The curves are the device profile's, the catalog's memory-bandwidth estimate, or a codec
//! set's ops priced by the framework. They read device and framework profiles and plans, which
//! name compressors of the catalog (`compress`), so they sit above all of them.

mod fallback;
mod implementation;

pub use fallback::{CodecCurves, GPU_BANDWIDTH_EFFICIENCY, GPU_LAUNCH_US};
pub use implementation::{CodecSet, Implementation, OpWork, NATIVE};
