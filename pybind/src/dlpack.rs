//! The DLPack protocol for received buffers (`__dlpack__`, `__dlpack_device__`), so that
//! `numpy.from_dlpack`, `torch.from_dlpack` and `jax.numpy.from_dlpack` take them: a
//! one-dimensional `uint8` CPU tensor, which the capsule keeps alive until the consumer's
//! deleter runs.
//!
//! Every consumer gets the data on every path; what it gets depends on what it can promise:
//!
//! | buffer | consumer | export |
//! |---|---|---|
//! | writable (PTR1, HTTP/2 receive memory) | any | zero-copy, writable |
//! | read-only (shared memory, a sender's memory in this process) | versioned DLPack 1.x that honours the read-only flag (numpy) | zero-copy, flagged read-only |
//! | read-only | unversioned DLPack (JAX asks for it) | a copy it owns |
//! | read-only | torch (asks for 1.x, but has no read-only tensors and ignores the flag) | a copy it owns |
//! | any | `copy=True` | a copy it owns, flagged as copied |
//! | read-only, a copy needed | `copy=False` | `BufferError` |
//!
//! The array API lets a producer copy when `copy` is `None` and it cannot share the memory
//! safely. A consumer writing through a shared read-only export would fault on a sealed
//! shared-memory mapping, or change the sender's bytes in this process.

use std::ffi::{CStr, c_void};

use bytes::Bytes;
use pyo3::exceptions::PyBufferError;
use pyo3::prelude::*;
use pyo3::{Bound, ffi};

const KDL_CPU: i32 = 1;
const KDL_UINT: u8 = 1;
const FLAG_READ_ONLY: u64 = 1 << 0;
const FLAG_IS_COPIED: u64 = 1 << 1;
const LEGACY: &CStr = c"dltensor";
const VERSIONED: &CStr = c"dltensor_versioned";

#[repr(C)]
struct DlPackVersion {
    major: u32,
    minor: u32,
}

#[repr(C)]
struct DlDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
struct DlDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DlTensor {
    data: *mut c_void,
    device: DlDevice,
    ndim: i32,
    dtype: DlDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

#[repr(C)]
struct DlManagedTensor {
    dl_tensor: DlTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut Self)>,
}

#[repr(C)]
struct DlManagedTensorVersioned {
    version: DlPackVersion,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut Self)>,
    flags: u64,
    dl_tensor: DlTensor,
}

/// What a capsule owns: the managed tensor (first, so its address is the allocation's), the
/// shape it points to, and the bytes that keep the memory alive.
#[repr(C)]
struct Exported<M> {
    managed: M,
    shape: [i64; 1],
    _bytes: Bytes,
}

/// What `__dlpack__` was asked for.
pub(crate) struct Request {
    /// The highest DLPack version the consumer understands (`None`: only the unversioned
    /// format).
    pub(crate) max_version: Option<(u32, u32)>,
    /// `Some(true)`: the consumer wants a copy; `Some(false)`: never copy.
    pub(crate) copy: Option<bool>,
    /// The device the consumer wants it on, if it said.
    pub(crate) device: Option<(i32, i32)>,
    /// The consumer asks for DLPack 1.x but makes writable tensors of read-only memory
    /// (torch: it has no read-only tensors).
    pub(crate) ignores_read_only: bool,
}

/// Whether the Python code calling `__dlpack__` right now is a consumer that ignores the
/// read-only flag: torch's `from_dlpack` (in `torch.utils.dlpack`, `torch._tensor`).
pub(crate) fn caller_ignores_read_only(py: Python<'_>) -> bool {
    let module = || -> PyResult<String> {
        // A method implemented in Rust pushes no frame: frame 0 is its Python caller's.
        let frame = py.import("sys")?.getattr("_getframe")?.call1((0,))?;
        frame.getattr("f_globals")?.get_item("__name__")?.extract()
    };
    module().is_ok_and(|name| name == "torch" || name.starts_with("torch."))
}

/// The `(device_type, device_id)` of every buffer: the CPU.
pub(crate) fn device() -> (i32, i32) {
    (KDL_CPU, 0)
}

/// A DLPack capsule of `bytes` for `request`.
///
/// # Errors
///
/// `BufferError` when the request cannot be met without breaking the buffer's read-only
/// promise (or on another device); a size past `i64`.
pub(crate) fn capsule<'py>(
    py: Python<'py>,
    bytes: &Bytes,
    writable: bool,
    request: &Request,
) -> PyResult<Bound<'py, PyAny>> {
    if let Some(device) = request.device
        && device != self::device()
    {
        return Err(PyBufferError::new_err(format!(
            "tensorwire buffers are CPU memory; cannot export to device {device:?}"
        )));
    }
    let versioned = request.max_version.is_some_and(|(major, _)| major >= 1);
    // Read-only memory is shared only with a consumer that can mark it so and honours it.
    let must_copy = !writable && (!versioned || request.ignores_read_only);
    if must_copy && request.copy == Some(false) {
        return Err(PyBufferError::new_err(
            "this buffer is read-only (shared memory, or a sender's memory in this process) and \
             the consumer cannot keep it read-only (unversioned DLPack, or torch, which has no \
             read-only tensors): it needs a copy, and copy=False forbids one",
        ));
    }
    let copied = must_copy || request.copy == Some(true);
    let bytes = if copied {
        Bytes::from(bytes.to_vec())
    } else {
        bytes.clone()
    };
    let read_only = !writable && !copied;
    let len = i64::try_from(bytes.len()).map_err(|_| PyBufferError::new_err("buffer too large"))?;
    let tensor = DlTensor {
        data: bytes.as_ptr().cast_mut().cast(),
        device: DlDevice {
            device_type: KDL_CPU,
            device_id: 0,
        },
        ndim: 1,
        dtype: DlDataType {
            code: KDL_UINT,
            bits: 8,
            lanes: 1,
        },
        shape: std::ptr::null_mut(),
        strides: std::ptr::null_mut(),
        byte_offset: 0,
    };
    let flags =
        if read_only { FLAG_READ_ONLY } else { 0 } | if copied { FLAG_IS_COPIED } else { 0 };
    let (raw, name) = if versioned {
        let exported = Box::into_raw(Box::new(Exported {
            managed: DlManagedTensorVersioned {
                version: DlPackVersion { major: 1, minor: 0 },
                manager_ctx: std::ptr::null_mut(),
                deleter: Some(delete_versioned),
                flags,
                dl_tensor: tensor,
            },
            shape: [len],
            _bytes: bytes,
        }));
        // SAFETY: `exported` was just allocated and is exclusively ours; the shape pointer
        // refers into the same allocation, which lives until the deleter frees it.
        unsafe {
            (*exported).managed.dl_tensor.shape = (*exported).shape.as_mut_ptr();
            (*exported).managed.manager_ctx = exported.cast();
        }
        (exported.cast::<c_void>(), VERSIONED)
    } else {
        let exported = Box::into_raw(Box::new(Exported {
            managed: DlManagedTensor {
                dl_tensor: tensor,
                manager_ctx: std::ptr::null_mut(),
                deleter: Some(delete_legacy),
            },
            shape: [len],
            _bytes: bytes,
        }));
        // SAFETY: as above.
        unsafe {
            (*exported).managed.dl_tensor.shape = (*exported).shape.as_mut_ptr();
            (*exported).managed.manager_ctx = exported.cast();
        }
        (exported.cast::<c_void>(), LEGACY)
    };
    let destructor: ffi::PyCapsule_Destructor = if versioned {
        drop_unused_versioned
    } else {
        drop_unused_legacy
    };
    // SAFETY: `raw` points to a live managed tensor that the capsule now owns until a consumer
    // takes it (renaming the capsule) or the capsule dies unused (the destructor frees it);
    // the name is a static C string, as the capsule requires.
    let capsule = unsafe { ffi::PyCapsule_New(raw, name.as_ptr(), Some(destructor)) };
    if capsule.is_null() {
        // SAFETY: the capsule was not made, so nothing else owns `raw`: free it here.
        unsafe { free(raw, versioned) };
        return Err(PyErr::fetch(py));
    }
    // SAFETY: PyCapsule_New returned a new, owned reference.
    Ok(unsafe { Bound::from_owned_ptr(py, capsule) })
}

/// Frees an export that nobody took.
///
/// # Safety
///
/// `raw` must come from [`capsule`] (versioned as said) and not have been freed.
unsafe fn free(raw: *mut c_void, versioned: bool) {
    if versioned {
        // SAFETY: per the contract, `raw` is a boxed `Exported` of the versioned kind.
        drop(unsafe { Box::from_raw(raw.cast::<Exported<DlManagedTensorVersioned>>()) });
    } else {
        // SAFETY: per the contract, `raw` is a boxed `Exported` of the legacy kind.
        drop(unsafe { Box::from_raw(raw.cast::<Exported<DlManagedTensor>>()) });
    }
}

/// The deleter a consumer calls when it is done with a versioned tensor.
///
/// # Safety
///
/// Called once by the consumer with the tensor it took from the capsule.
unsafe extern "C" fn delete_versioned(managed: *mut DlManagedTensorVersioned) {
    if !managed.is_null() {
        // SAFETY: the managed tensor is the first field of its `Exported` allocation, and
        // the consumer calls this once.
        unsafe { free(managed.cast(), true) };
    }
}

/// The deleter a consumer calls when it is done with an unversioned tensor.
///
/// # Safety
///
/// Called once by the consumer with the tensor it took from the capsule.
unsafe extern "C" fn delete_legacy(managed: *mut DlManagedTensor) {
    if !managed.is_null() {
        // SAFETY: as `delete_versioned`.
        unsafe { free(managed.cast(), false) };
    }
}

/// The capsule's destructor: frees the tensor only if no consumer took it (a consumer renames
/// the capsule to `used_…` and calls the deleter itself).
///
/// # Safety
///
/// Called by CPython with a capsule made by [`capsule`].
unsafe extern "C" fn drop_unused_versioned(capsule: *mut ffi::PyObject) {
    // SAFETY: `capsule` is a live capsule; asking for its pointer under our name fails
    // (returns null, with an error we clear) once a consumer renamed it.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, VERSIONED.as_ptr()) == 1 {
            let raw = ffi::PyCapsule_GetPointer(capsule, VERSIONED.as_ptr());
            free(raw, true);
        }
    }
}

/// As [`drop_unused_versioned`], for the unversioned name.
///
/// # Safety
///
/// Called by CPython with a capsule made by [`capsule`].
unsafe extern "C" fn drop_unused_legacy(capsule: *mut ffi::PyObject) {
    // SAFETY: as in `drop_unused_versioned`.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, LEGACY.as_ptr()) == 1 {
            let raw = ffi::PyCapsule_GetPointer(capsule, LEGACY.as_ptr());
            free(raw, false);
        }
    }
}
