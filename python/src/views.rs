//! Zero-copy access to the memory behind Python buffers.
//!
//! That is numpy arrays, and CPU tensors through `Tensor.numpy()`.

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

/// Runs `body` on the elements of `source` and of writable `target` at once; an error when the
/// two share memory (a slice and a mutable slice over the same bytes may not coexist).
pub fn read_write<S: Element, T: Element, R>(
    source: &Bound<'_, PyAny>,
    source_what: &str,
    target: &Bound<'_, PyAny>,
    target_what: &str,
    body: impl FnOnce(&[S], &mut [T]) -> R,
) -> PyResult<R> {
    let input = buffer::<S>(source, source_what, false)?;
    let output = buffer::<T>(target, target_what, true)?;
    let span = |b: usize, items: usize, size: usize| b..b + items * size;
    let a = span(
        input.buf_ptr() as usize,
        input.item_count(),
        std::mem::size_of::<S>(),
    );
    let b = span(
        output.buf_ptr() as usize,
        output.item_count(),
        std::mem::size_of::<T>(),
    );
    if a.start < b.end && b.start < a.end {
        return Err(SyncopateError::new_err(format!(
            "{source_what} and {target_what} share memory"
        )));
    }
    // SAFETY: as in `read` and `write` for each buffer; the two spans were just checked to be
    // disjoint, so the shared and the mutable slice never alias.
    let (i, o) = unsafe {
        (
            std::slice::from_raw_parts(input.buf_ptr() as *const S, input.item_count()),
            std::slice::from_raw_parts_mut(output.buf_ptr() as *mut T, output.item_count()),
        )
    };
    Ok(body(i, o))
}
