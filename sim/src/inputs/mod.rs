//! What a run is given: the model, the devices, the cluster, the framework.

pub mod achieved;
pub mod carry;
pub mod device;
pub mod flops;
pub mod framework;
pub mod model;
pub mod real_run;
// Below `topology`, which counts the rings of a cluster's NVLink mesh when it reads the file.
mod rings;
pub mod topology;
