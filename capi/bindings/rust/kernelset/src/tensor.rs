//! Tensor views: dtypes, devices, streams and the borrowed views the ops take.
use std::ffi::c_void;
use std::marker::PhantomData;
use std::mem::size_of;
use std::ptr;

use crate::sys::{self, DLTensor};
use crate::{invalid, Result};

// ---- dtypes, devices, streams

/// Element types of the ABI.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F16,
    BF16,
    F8E4M3,
    I32,
    I64,
    U8,
}

impl DType {
    pub fn size(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::F8E4M3 | DType::U8 => 1,
            DType::I64 => 8,
        }
    }

    pub fn dl(self) -> sys::DLDataType {
        let (code, bits) = match self {
            DType::F32 => (sys::kDLFloat, 32),
            DType::F16 => (sys::kDLFloat, 16),
            DType::BF16 => (sys::kDLBfloat, 16),
            DType::F8E4M3 => (sys::kDLFloat8_e4m3fn, 8),
            DType::I32 => (sys::kDLInt, 32),
            DType::I64 => (sys::kDLInt, 64),
            DType::U8 => (sys::kDLUInt, 8),
        };
        sys::DLDataType { code: code as u8, bits, lanes: 1 }
    }

    /// "float32", "float16", "bfloat16", "float8_e4m3fn", "int32", "int64", "uint8"
    pub fn parse(name: &str) -> Option<DType> {
        Some(match name {
            "float32" => DType::F32,
            "float16" => DType::F16,
            "bfloat16" => DType::BF16,
            "float8_e4m3fn" => DType::F8E4M3,
            "int32" => DType::I32,
            "int64" => DType::I64,
            "uint8" => DType::U8,
            _ => return None,
        })
    }
}

/// Plain element types a slice can hold (f16/bf16 storage: `u16` with [`Tensor::new_as`]).
pub trait Element: Copy + 'static {
    const DTYPE: DType;
}
impl Element for f32 {
    const DTYPE: DType = DType::F32;
}
impl Element for i32 {
    const DTYPE: DType = DType::I32;
}
impl Element for i64 {
    const DTYPE: DType = DType::I64;
}
impl Element for u8 {
    const DTYPE: DType = DType::U8;
}
impl Element for u16 {
    const DTYPE: DType = DType::F16;
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Device {
    Cpu,
    Cuda(i32),
}

impl Device {
    fn dl(self) -> sys::DLDevice {
        match self {
            Device::Cpu => sys::DLDevice { device_type: sys::kDLCPU, device_id: 0 },
            Device::Cuda(id) => sys::DLDevice { device_type: sys::kDLCUDA, device_id: id },
        }
    }
}

/// A CUDA stream (`CUstream`/`cudaStream_t`); ignored for CPU tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stream(pub sys::ks_stream_t);

impl Stream {
    /// The legacy default stream (NULL).
    pub const DEFAULT: Stream = Stream(ptr::null_mut());
}

// ---- tensor views

#[derive(Clone, Debug)]
struct Layout {
    dtype: DType,
    device: Device,
    shape: Vec<i64>,
    strides: Option<Vec<i64>>,
}

impl Layout {
    /// Bytes needed from the data pointer, with every stride checked non-negative.
    fn extent_bytes(&self) -> Result<usize> {
        if self.shape.iter().any(|&d| d < 0) {
            return Err(invalid(format!("shape {:?}: negative dimension", self.shape)));
        }
        if self.shape.len() > 32 {
            return Err(invalid(format!("shape {:?}: more than 32 dimensions", self.shape)));
        }
        if self.shape.contains(&0) {
            return Ok(0);
        }
        let strides = match &self.strides {
            Some(s) => {
                if s.len() != self.shape.len() {
                    return Err(invalid(format!("strides {:?} for shape {:?}", s, self.shape)));
                }
                if s.iter().any(|&v| v < 0) {
                    return Err(invalid(format!("strides {s:?}: negative strides need Tensor::from_raw")));
                }
                s.clone()
            }
            None => compact_strides(&self.shape),
        };
        let mut last: i64 = 0;
        for (&n, &s) in self.shape.iter().zip(&strides) {
            last = (n - 1)
                .checked_mul(s)
                .and_then(|v| v.checked_add(last))
                .ok_or_else(|| invalid(format!("shape {:?} strides {:?} overflow", self.shape, strides)))?;
        }
        ((last as usize) + 1)
            .checked_mul(self.dtype.size())
            .ok_or_else(|| invalid("tensor extent overflows usize".into()))
    }

    fn raw(&self, data: *mut c_void) -> DLTensor {
        DLTensor {
            data,
            device: self.device.dl(),
            ndim: self.shape.len() as i32,
            dtype: self.dtype.dl(),
            shape: self.shape.as_ptr() as *mut i64,
            strides: self.strides.as_ref().map_or(ptr::null_mut(), |s| s.as_ptr() as *mut i64),
            byte_offset: 0,
        }
    }
}

/// Row-major strides of a shape, in elements.
pub fn compact_strides(shape: &[i64]) -> Vec<i64> {
    let mut s = vec![1i64; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1].max(1);
    }
    s
}

fn slice_layout<T: Element>(
    len: usize,
    addr: usize,
    dtype: DType,
    shape: &[i64],
    strides: Option<&[i64]>,
) -> Result<Layout> {
    let l = Layout { dtype, device: Device::Cpu, shape: shape.to_vec(), strides: strides.map(|s| s.to_vec()) };
    let need = l.extent_bytes()?;
    let have = len * size_of::<T>();
    if need > have {
        return Err(invalid(format!(
            "a {:?} tensor of shape {:?} strides {:?} needs {need} bytes, the slice has {have}",
            dtype, l.shape, l.strides
        )));
    }
    if addr % dtype.size() != 0 {
        return Err(invalid(format!("data at {addr:#x} is not aligned to {} bytes for {dtype:?}", dtype.size())));
    }
    Ok(l)
}

/// A read-only tensor: a borrowed slice with a dtype, shape and optional strides.
#[derive(Clone, Debug)]
pub struct Tensor<'a> {
    data: *const c_void,
    layout: Layout,
    _borrow: PhantomData<&'a [u8]>,
}

/// A writable tensor over a mutably borrowed slice.
#[derive(Debug)]
pub struct TensorMut<'a> {
    data: *mut c_void,
    layout: Layout,
    _borrow: PhantomData<&'a mut [u8]>,
}

impl<'a> Tensor<'a> {
    /// A compact row-major tensor over `data` (dtype from T: f32, i32, i64, u8).
    pub fn new<T: Element>(data: &'a [T], shape: &[i64]) -> Result<Self> {
        Self::new_as(data, T::DTYPE, shape)
    }

    /// Storage of another dtype: f16/bf16 in `&[u16]`, fp8 in `&[u8]`, or raw bytes of any dtype.
    pub fn new_as<T: Element>(data: &'a [T], dtype: DType, shape: &[i64]) -> Result<Self> {
        let layout = slice_layout::<T>(data.len(), data.as_ptr() as usize, dtype, shape, None)?;
        Ok(Tensor { data: data.as_ptr() as *const c_void, layout, _borrow: PhantomData })
    }

    /// The same slice seen through `strides` (in elements, non-negative), checked to stay inside
    /// the slice.
    pub fn with_strides<T: Element>(data: &'a [T], dtype: DType, shape: &[i64], strides: &[i64]) -> Result<Self> {
        let layout = slice_layout::<T>(data.len(), data.as_ptr() as usize, dtype, shape, Some(strides))?;
        Ok(Tensor { data: data.as_ptr() as *const c_void, layout, _borrow: PhantomData })
    }

    /// Memory this binding cannot see (a CUDA allocation, another library's buffer).
    ///
    /// # Safety
    /// `data` must address every element the shape and strides reach on `device` for `'a`.
    pub unsafe fn from_raw(
        data: *const c_void,
        dtype: DType,
        shape: &[i64],
        strides: Option<&[i64]>,
        device: Device,
    ) -> Self {
        let layout = Layout { dtype, device, shape: shape.to_vec(), strides: strides.map(|s| s.to_vec()) };
        Tensor { data, layout, _borrow: PhantomData }
    }

    pub fn dtype(&self) -> DType {
        self.layout.dtype
    }
    pub fn shape(&self) -> &[i64] {
        &self.layout.shape
    }
    pub fn strides(&self) -> Option<&[i64]> {
        self.layout.strides.as_deref()
    }
}

impl<'a> TensorMut<'a> {
    pub fn new<T: Element>(data: &'a mut [T], shape: &[i64]) -> Result<Self> {
        Self::new_as(data, T::DTYPE, shape)
    }

    pub fn new_as<T: Element>(data: &'a mut [T], dtype: DType, shape: &[i64]) -> Result<Self> {
        let layout = slice_layout::<T>(data.len(), data.as_ptr() as usize, dtype, shape, None)?;
        Ok(TensorMut { data: data.as_mut_ptr() as *mut c_void, layout, _borrow: PhantomData })
    }

    pub fn with_strides<T: Element>(data: &'a mut [T], dtype: DType, shape: &[i64], strides: &[i64]) -> Result<Self> {
        let layout = slice_layout::<T>(data.len(), data.as_ptr() as usize, dtype, shape, Some(strides))?;
        Ok(TensorMut { data: data.as_mut_ptr() as *mut c_void, layout, _borrow: PhantomData })
    }

    /// # Safety
    /// As [`Tensor::from_raw`], and the memory must be writable and not aliased by other views.
    pub unsafe fn from_raw(
        data: *mut c_void,
        dtype: DType,
        shape: &[i64],
        strides: Option<&[i64]>,
        device: Device,
    ) -> Self {
        let layout = Layout { dtype, device, shape: shape.to_vec(), strides: strides.map(|s| s.to_vec()) };
        TensorMut { data, layout, _borrow: PhantomData }
    }

    pub fn dtype(&self) -> DType {
        self.layout.dtype
    }
    pub fn shape(&self) -> &[i64] {
        &self.layout.shape
    }
    pub fn strides(&self) -> Option<&[i64]> {
        self.layout.strides.as_deref()
    }
}

/// Anything that can describe itself as a DLTensor for the duration of a call.
pub trait AsDLTensor {
    /// The DLTensor pointing into `self` (its shape/strides arrays borrow from `self`).
    fn dl_tensor(&self) -> DLTensor;
}

impl AsDLTensor for Tensor<'_> {
    fn dl_tensor(&self) -> DLTensor {
        self.layout.raw(self.data as *mut c_void)
    }
}

impl AsDLTensor for TensorMut<'_> {
    fn dl_tensor(&self) -> DLTensor {
        self.layout.raw(self.data)
    }
}

/// Optional tensors: the DLTensor (kept alive by the caller) and the pointer to pass.
pub(crate) struct Opt(pub(crate) Option<DLTensor>);

impl Opt {
    pub(crate) fn of<T: AsDLTensor>(t: Option<&T>) -> Opt {
        Opt(t.map(|t| t.dl_tensor()))
    }
    pub(crate) fn ptr(&self) -> *const DLTensor {
        self.0.as_ref().map_or(ptr::null(), |t| t as *const DLTensor)
    }
    pub(crate) fn ptr_mut(&mut self) -> *mut DLTensor {
        self.0.as_mut().map_or(ptr::null_mut(), |t| t as *mut DLTensor)
    }
}
