//! Safe Rust bindings of libkernelset: fused inference kernels (norms, activations, softmax,
//! cross-entropy, embedding, RoPE, paged KV cache, paged/flash attention) behind a stable C ABI.
//!
//! Tensors are borrowed views ([`Tensor`] over `&[T]`, [`TensorMut`] over `&mut [T]`) with a
//! shape and optional strides (in elements), checked on construction to stay inside the slice,
//! so the library never touches memory outside what was lent. Device memory (CUDA) is wrapped
//! with the `unsafe` [`Tensor::from_raw`]. Every op returns `Result<(), KsError>`; the error
//! carries the library's status and its message naming the argument.
//!
//! ```no_run
//! use kernelset::{rms_norm, Op, OpOptions, RmsNormOptions, Stream, Tensor, TensorMut};
//! let x = vec![1.0f32; 4 * 64];
//! let w = vec![1.0f32; 64];
//! let mut y = vec![0.0f32; 4 * 64];
//! let opts = RmsNormOptions::defaults(Op::RmsNorm)?;
//! rms_norm(&Tensor::new(&x, &[4, 64])?, Some(&Tensor::new(&w, &[64])?),
//!          &mut TensorMut::new(&mut y, &[4, 64])?, Some(&opts), Stream::DEFAULT)?;
//! # Ok::<(), kernelset::KsError>(())
//! ```
use std::ffi::CStr;
use std::fmt;
use std::ptr;

pub use kernelset_sys as sys;

mod generated;
mod ops;
mod tensor;
pub use generated::*;
pub use ops::*;
pub use tensor::*;

// ---- errors

/// A status of the C ABI (`KS_ERR_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Status {
    InvalidArgument,
    UnsupportedDtype,
    UnsupportedShape,
    UnsupportedLayout,
    UnsupportedDevice,
    UnsupportedArch,
    Cuda,
    OutOfMemory,
    NotImplemented,
    Version,
    Internal,
    /// A code this binding does not know (a newer library).
    Other(i32),
}

impl Status {
    pub fn from_code(code: sys::ks_status_t) -> Option<Status> {
        Some(match code {
            sys::KS_OK => return None,
            sys::KS_ERR_INVALID_ARGUMENT => Status::InvalidArgument,
            sys::KS_ERR_UNSUPPORTED_DTYPE => Status::UnsupportedDtype,
            sys::KS_ERR_UNSUPPORTED_SHAPE => Status::UnsupportedShape,
            sys::KS_ERR_UNSUPPORTED_LAYOUT => Status::UnsupportedLayout,
            sys::KS_ERR_UNSUPPORTED_DEVICE => Status::UnsupportedDevice,
            sys::KS_ERR_UNSUPPORTED_ARCH => Status::UnsupportedArch,
            sys::KS_ERR_CUDA => Status::Cuda,
            sys::KS_ERR_OUT_OF_MEMORY => Status::OutOfMemory,
            sys::KS_ERR_NOT_IMPLEMENTED => Status::NotImplemented,
            sys::KS_ERR_VERSION => Status::Version,
            sys::KS_ERR_INTERNAL => Status::Internal,
            other => Status::Other(other),
        })
    }

    pub fn code(self) -> sys::ks_status_t {
        match self {
            Status::InvalidArgument => sys::KS_ERR_INVALID_ARGUMENT,
            Status::UnsupportedDtype => sys::KS_ERR_UNSUPPORTED_DTYPE,
            Status::UnsupportedShape => sys::KS_ERR_UNSUPPORTED_SHAPE,
            Status::UnsupportedLayout => sys::KS_ERR_UNSUPPORTED_LAYOUT,
            Status::UnsupportedDevice => sys::KS_ERR_UNSUPPORTED_DEVICE,
            Status::UnsupportedArch => sys::KS_ERR_UNSUPPORTED_ARCH,
            Status::Cuda => sys::KS_ERR_CUDA,
            Status::OutOfMemory => sys::KS_ERR_OUT_OF_MEMORY,
            Status::NotImplemented => sys::KS_ERR_NOT_IMPLEMENTED,
            Status::Version => sys::KS_ERR_VERSION,
            Status::Internal => sys::KS_ERR_INTERNAL,
            Status::Other(c) => c,
        }
    }

    /// The library's name of the status ("KS_ERR_INVALID_ARGUMENT").
    pub fn name(self) -> String {
        status_name(self.code())
    }
}

/// A failed call: the status and the library's message (thread-local `ks_last_error()` at the
/// time of the failure), or this binding's message for a view it refused to build.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KsError {
    pub status: Status,
    pub message: String,
}

impl fmt::Display for KsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.status.name(), self.message)
    }
}

impl std::error::Error for KsError {}

pub type Result<T> = std::result::Result<T, KsError>;

pub(crate) fn invalid(message: String) -> KsError {
    KsError { status: Status::InvalidArgument, message }
}

pub(crate) fn check(code: sys::ks_status_t) -> Result<()> {
    match Status::from_code(code) {
        None => Ok(()),
        Some(status) => Err(KsError { status, message: last_error() }),
    }
}

unsafe fn cstr(p: *const std::ffi::c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        CStr::from_ptr(p).to_string_lossy().into_owned()
    }
}

/// This thread's last error message ("" after a successful call).
pub fn last_error() -> String {
    unsafe { cstr(sys::ks_last_error()) }
}

/// The library's name of a status code.
pub fn status_name(code: sys::ks_status_t) -> String {
    unsafe { cstr(sys::ks_status_name(code)) }
}

/// "kernelset 0.1.0; abi 1.0; cuda: ..."
pub fn build_info() -> String {
    unsafe { cstr(sys::ks_build_info()) }
}

/// The loaded library's ABI (major, minor).
pub fn abi_version() -> (i32, i32) {
    let (mut major, mut minor) = (0, 0);
    unsafe { sys::ks_abi_version(&mut major, &mut minor) };
    (major, minor)
}

/// The library's function table of ABI `major` with at least `min_minor`.
pub fn api_table(major: i32, min_minor: i32) -> Result<&'static sys::ks_api_t> {
    let mut t: *const sys::ks_api_t = ptr::null();
    check(unsafe { sys::ks_get_api(major, min_minor, &mut t) })?;
    if t.is_null() {
        return Err(KsError { status: Status::Internal, message: "ks_get_api returned no table".into() });
    }
    Ok(unsafe { &*t })
}
