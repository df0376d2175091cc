//! Zero-copy access to the memory behind Python buffers (numpy arrays, and CPU tensors through `Tensor.numpy()`).

use crate::SyncopateError;
use pyo3::buffer::{Element, PyBuffer};
use pyo3::prelude::*;

/// The buffer of `object` as C-contiguous elements of `T`, writable when `write` is set.
fn buffer<T: Element>(object: &Bound<'_, PyAny>, what: &str, write: bool) -> PyResult<PyBuffer<T>> {
    let buffer = PyBuffer::<T>::get(object).map_err(|err| {
        SyncopateError::new_err(format!(
            "{what}: not a buffer of the expected element type ({err})"
        ))
    })?;
    if !buffer.is_c_contiguous() {
        return Err(SyncopateError::new_err(format!("{what}: not contiguous")));
    }
    if write && buffer.readonly() {
        return Err(SyncopateError::new_err(format!("{what}: read-only")));
    }
    Ok(buffer)
}

/// Runs `body` on the elements of `object` in place.
pub fn read<T: Element, R>(
    object: &Bound<'_, PyAny>,
    what: &str,
    body: impl FnOnce(&[T]) -> R,
) -> PyResult<R> {
    let buffer = buffer::<T>(object, what, false)?;
    // SAFETY: the buffer is C-contiguous with `item_count` elements of `T` (checked by
    // `PyBuffer::get` and above) and stays exported while `buffer` lives, which outlasts
    // `body`; the GIL is held throughout, so no Python code runs or frees it meanwhile.
    let slice =
        unsafe { std::slice::from_raw_parts(buffer.buf_ptr() as *const T, buffer.item_count()) };
    Ok(body(slice))
}

/// Runs `body` on the elements of writable `object` in place.
pub fn write<T: Element, R>(
    object: &Bound<'_, PyAny>,
    what: &str,
    body: impl FnOnce(&mut [T]) -> R,
) -> PyResult<R> {
    let buffer = buffer::<T>(object, what, true)?;
    // SAFETY: as in `read`, and the buffer is writable; the callers pass buffers owned by
    // Python, never memory Rust holds another reference to.
    let slice =
        unsafe { std::slice::from_raw_parts_mut(buffer.buf_ptr() as *mut T, buffer.item_count()) };
    Ok(body(slice))
}
