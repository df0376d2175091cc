//! The `syncopate._syncopate` extension: what `syncopate.torch` takes from the Rust crates.
//!
//! That is lowering, codecs, dependency rules, launch policy, check and trace.

mod check;
mod dependencies;
mod device_rank;
mod launch;
mod lowering;
mod rank;
mod trace;
mod views;

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

create_exception!(
    _syncopate,
    SyncopateError,
    PyException,
    "Bad input or a failed step, with the file, field, tensor or rank it concerns."
);
create_exception!(
    _syncopate,
    PlanMismatch,
    SyncopateError,
    "The plan was made for another model or another world size than this run's."
);
create_exception!(
    _syncopate,
    NonFiniteError,
    SyncopateError,
    "A gradient element is NaN or infinite; args are (message, element index in the piece)."
);

/// A Rust error as the Python exception that names it.
pub(crate) fn exec_error(err: syncopate_exec::ExecError) -> PyErr {
    match err {
        syncopate_exec::ExecError::NonFinite { index, value } => NonFiniteError::new_err((
            format!("non-finite value {value} at element {index}"),
            index,
        )),
        other => SyncopateError::new_err(other.to_string()),
    }
}

pub(crate) fn sim_error(err: syncopate_sim::SimError) -> PyErr {
    SyncopateError::new_err(err.to_string())
}

/// Whether this module was compiled with optimizations: timed experiments refuse a debug build,
/// whose codecs run several times slower than a release build's.
#[pyfunction]
fn release_build() -> bool {
    !cfg!(debug_assertions)
}

#[pymodule]
fn _syncopate(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("SyncopateError", m.py().get_type::<SyncopateError>())?;
    m.add("PlanMismatch", m.py().get_type::<PlanMismatch>())?;
    m.add("NonFiniteError", m.py().get_type::<NonFiniteError>())?;
    m.add_function(wrap_pyfunction!(lowering::lower, m)?)?;
    m.add_function(wrap_pyfunction!(lowering::compressors, m)?)?;
    m.add_function(wrap_pyfunction!(lowering::encode_reference, m)?)?;
    m.add_function(wrap_pyfunction!(trace::write_trace, m)?)?;
    m.add_function(wrap_pyfunction!(release_build, m)?)?;
    m.add_class::<rank::Rank>()?;
    m.add_class::<device_rank::DeviceRank>()?;
    m.add_function(wrap_pyfunction!(device_rank::device_refusal, m)?)?;
    m.add_class::<launch::Launcher>()?;
    m.add_class::<dependencies::Dependencies>()?;
    m.add_class::<check::Checker>()?;
    Ok(())
}
