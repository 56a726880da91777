//! Shared by the integration tests: the golden data (capi/golden/golden.json) and its tensors.
#![allow(dead_code)]
pub mod json;

use std::path::PathBuf;

pub use json::Json;
use kernelset::DType;

pub fn repo_path(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../..").join(rel)
}

pub fn load_json(rel: &str) -> Json {
    let path = repo_path(rel);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    json::parse(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// capi/golden/golden.json, or the file named by $KS_GOLDEN.
pub fn golden() -> Json {
    match std::env::var("KS_GOLDEN") {
        Ok(path) => {
            let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
            json::parse(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
        }
        Err(_) => load_json("capi/golden/golden.json"),
    }
}

pub fn hex(s: &str) -> Vec<u8> {
    assert!(s.len() % 2 == 0, "odd hex length");
    (0..s.len() / 2).map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex digit")).collect()
}

/// Bytes in 8-byte aligned storage (a Vec<u8> is only 1-aligned; the library reads f32/i64).
pub struct Buf {
    words: Vec<u64>,
    len: usize,
}

impl Buf {
    pub fn from_bytes(b: &[u8]) -> Buf {
        let mut words = vec![0u64; b.len().div_ceil(8).max(1)];
        let mut buf = Buf { words: Vec::new(), len: b.len() };
        unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), words.as_mut_ptr() as *mut u8, b.len()) };
        buf.words = words;
        buf
    }
    pub fn bytes(&self) -> &[u8] {
        unsafe { std::slice::from_raw_parts(self.words.as_ptr() as *const u8, self.len) }
    }
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        unsafe { std::slice::from_raw_parts_mut(self.words.as_mut_ptr() as *mut u8, self.len) }
    }
}

/// One tensor argument of a golden case.
pub struct Arg {
    pub name: String,
    pub dtype: Option<DType>, // None: absent (NULL)
    pub shape: Vec<i64>,
    pub strides: Option<Vec<i64>>,
    pub buf: Buf,
}

pub fn args_of(case: &Json) -> Vec<Arg> {
    case["tensors"]
        .as_array()
        .iter()
        .map(|t| {
            let name = t["name"].as_str().to_string();
            if t["dtype"].is_null() {
                return Arg { name, dtype: None, shape: vec![], strides: None, buf: Buf::from_bytes(&[]) };
            }
            let dtype = DType::parse(t["dtype"].as_str()).expect("dtype");
            let shape = t["shape"].as_array().iter().map(|v| v.as_i64()).collect();
            let strides = if t["strides"].is_null() {
                None
            } else {
                Some(t["strides"].as_array().iter().map(|v| v.as_i64()).collect())
            };
            Arg { name, dtype: Some(dtype), shape, strides, buf: Buf::from_bytes(&hex(t["data"].as_str())) }
        })
        .collect()
}

pub fn f16_to_f32(h: u16) -> f32 {
    let sign = if h & 0x8000 != 0 { -1.0f32 } else { 1.0 };
    let exp = ((h >> 10) & 0x1f) as i32;
    let man = (h & 0x3ff) as f32;
    match exp {
        0 => sign * man * 2f32.powi(-24),
        31 => {
            if man == 0.0 {
                sign * f32::INFINITY
            } else {
                f32::NAN
            }
        }
        e => sign * (1.0 + man / 1024.0) * 2f32.powi(e - 15),
    }
}

pub fn fp8e4m3_to_f32(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0f32 } else { 1.0 };
    let exp = ((b >> 3) & 0xf) as i32;
    let man = (b & 7) as f32;
    if exp == 15 && b & 7 == 7 {
        return f32::NAN;
    }
    if exp == 0 {
        sign * man * 2f32.powi(-9)
    } else {
        sign * (1.0 + man / 8.0) * 2f32.powi(exp - 7)
    }
}

/// The logical elements (row-major over the shape, through the strides) as f32.
pub fn read_f32(arg: &Arg) -> Vec<f32> {
    let dt = arg.dtype.expect("present");
    let strides = arg.strides.clone().unwrap_or_else(|| kernelset::compact_strides(&arg.shape));
    let n: i64 = arg.shape.iter().product();
    let b = arg.buf.bytes();
    let mut out = Vec::with_capacity(n as usize);
    let mut idx = vec![0i64; arg.shape.len()];
    for _ in 0..n {
        let off = idx.iter().zip(&strides).map(|(i, s)| i * s).sum::<i64>() as usize;
        let s = dt.size();
        let e = &b[off * s..off * s + s];
        out.push(match dt {
            DType::F32 => f32::from_le_bytes([e[0], e[1], e[2], e[3]]),
            DType::F16 => f16_to_f32(u16::from_le_bytes([e[0], e[1]])),
            DType::BF16 => f32::from_bits((u16::from_le_bytes([e[0], e[1]]) as u32) << 16),
            DType::F8E4M3 => fp8e4m3_to_f32(e[0]),
            DType::I32 => i32::from_le_bytes([e[0], e[1], e[2], e[3]]) as f32,
            DType::I64 => i64::from_le_bytes(e.try_into().unwrap()) as f32,
            DType::U8 => e[0] as f32,
        });
        for d in (0..idx.len()).rev() {
            idx[d] += 1;
            if idx[d] < arg.shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    out
}

pub fn f32s_of_hex(s: &str) -> Vec<f32> {
    hex(s).chunks(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

/// golden.json's rule: non-finite expected elements match exactly; the rest within a relative
/// norm error. Returns the error or why it fails.
pub fn compare(got: &[f32], want: &[f32], tol: f64) -> Result<f64, String> {
    if got.len() != want.len() {
        return Err(format!("{} elements, expected {}", got.len(), want.len()));
    }
    let (mut num, mut den) = (0f64, 0f64);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        if !w.is_finite() {
            if !(w.is_nan() && g.is_nan()) && g != w {
                return Err(format!("element {i}: {g}, expected {w}"));
            }
            continue;
        }
        if !g.is_finite() {
            return Err(format!("element {i}: {g}, expected {w}"));
        }
        num += (g as f64 - w as f64).powi(2);
        den += (w as f64).powi(2);
    }
    let err = num.sqrt() / if den > 0.0 { den.sqrt() } else { 1.0 };
    if err <= tol {
        Ok(err)
    } else {
        Err(format!("relative error {err:.3e} > {tol:e}"))
    }
}
