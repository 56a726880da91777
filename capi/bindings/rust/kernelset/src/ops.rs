//! The hand-written part of the safe layer: the option trait, query_support, and the ops whose
//! arguments are not one tensor, integer or option struct each (a list of caches, an out-value, a
//! struct of optional inputs); the other ops, their ids and option structs are in generated.rs.
use std::ffi::c_void;
use std::mem::{size_of, MaybeUninit};
use std::ptr;

use crate::sys::{self, DLTensor};
use crate::tensor::{AsDLTensor, Opt, Stream, Tensor, TensorMut};
use crate::{check, invalid, AttentionOptions, Op, Result, RmsNormOptions};

// ---- options

/// The option structs (plain data whose first field is their size).
pub trait OpOptions: Copy + Sized {
    /// The library's defaults for `op` (`ks_options_init`), with `size` set.
    fn defaults(op: Op) -> Result<Self> {
        let mut o = MaybeUninit::<Self>::zeroed();
        check(unsafe { sys::ks_options_init(op as i32, o.as_mut_ptr() as *mut c_void, size_of::<Self>()) })?;
        Ok(unsafe { o.assume_init() })
    }
}

pub(crate) fn opt_ptr<T>(o: Option<&T>) -> *const T {
    o.map_or(ptr::null(), |o| o as *const T)
}

/// Whether `op` can run on these tensors (only their metadata is read) and options, without
/// running it. `tensors` in the op's signature order, None where an optional one is absent.
pub fn query_support<O: OpOptions>(op: Op, tensors: &[Option<&dyn AsDLTensor>], options: Option<&O>) -> Result<()> {
    let raws: Vec<Option<DLTensor>> = tensors.iter().map(|t| t.map(|t| t.dl_tensor())).collect();
    let ptrs: Vec<*const DLTensor> =
        raws.iter().map(|t| t.as_ref().map_or(ptr::null(), |t| t as *const DLTensor)).collect();
    let n = i32::try_from(ptrs.len()).map_err(|_| invalid("too many tensors".into()))?;
    check(unsafe { sys::ks_query_support(op as i32, ptrs.as_ptr(), n, opt_ptr(options) as *const c_void) })
}

/// For ops without options: `query_support::<NoOptions>(...)`.
#[derive(Clone, Copy, Debug)]
pub enum NoOptions {}
impl OpOptions for NoOptions {
    fn defaults(op: Op) -> Result<Self> {
        Err(invalid(format!("{} has no options", op.name())))
    }
}

// ---- ops

/// fused_add_rms_norm writing out over x (the vLLM convention).
pub fn fused_add_rms_norm_inplace(
    x: &mut TensorMut,
    residual: &mut TensorMut,
    weight: Option<&Tensor>,
    options: Option<&RmsNormOptions>,
    stream: Stream,
) -> Result<()> {
    let (mut xo, mut r, w) = (x.dl_tensor(), residual.dl_tensor(), Opt::of(weight));
    let p: *mut DLTensor = &mut xo;
    check(unsafe { sys::ks_fused_add_rms_norm(p, &mut r, w.ptr(), p, opt_ptr(options), stream.0) })
}

/// cache`[dst]` = cache`[src]` for each (src, dst) row of `block_mapping [N, 2]` int64, in every layer.
pub fn copy_blocks(
    k_caches: &mut [TensorMut],
    v_caches: &mut [TensorMut],
    block_mapping: &Tensor,
    stream: Stream,
) -> Result<()> {
    if k_caches.len() != v_caches.len() {
        return Err(invalid(format!(
            "v_caches: expected {} layers like k_caches, got {}",
            k_caches.len(),
            v_caches.len()
        )));
    }
    let n = i32::try_from(k_caches.len()).map_err(|_| invalid("k_caches: too many layers".into()))?;
    let mut kd: Vec<DLTensor> = k_caches.iter().map(|t| t.dl_tensor()).collect();
    let mut vd: Vec<DLTensor> = v_caches.iter().map(|t| t.dl_tensor()).collect();
    let kp: Vec<*mut DLTensor> = kd.iter_mut().map(|t| t as *mut DLTensor).collect();
    let vp: Vec<*mut DLTensor> = vd.iter_mut().map(|t| t as *mut DLTensor).collect();
    let m = block_mapping.dl_tensor();
    check(unsafe { sys::ks_copy_blocks(kp.as_ptr(), vp.as_ptr(), n, &m, stream.0) })
}

/// Bytes of the split-KV workspace paged_attention can use for these shapes.
pub fn paged_attention_workspace_size(q: &Tensor, k_cache: &Tensor, max_seq_len: i64) -> Result<usize> {
    let (qd, kc) = (q.dl_tensor(), k_cache.dl_tensor());
    let mut bytes = 0usize;
    check(unsafe { sys::ks_paged_attention_workspace_size(&qd, &kc, max_seq_len, &mut bytes) })?;
    Ok(bytes)
}

/// The optional inputs of paged_attention.
#[derive(Default)]
pub struct PagedExtras<'t, 'a> {
    pub cu_seqlens_q: Option<&'t Tensor<'a>>,
    pub sinks: Option<&'t Tensor<'a>>,
    pub k_scale: Option<&'t Tensor<'a>>,
    pub v_scale: Option<&'t Tensor<'a>>,
}

/// Attention of `q [B or T, Hq, D]` to the paged caches; out like q, `lse [T, Hq]` (optional).
#[allow(clippy::too_many_arguments)]
pub fn paged_attention(
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    block_table: &Tensor,
    seq_lens: &Tensor,
    extras: &PagedExtras,
    max_seqlen_q: i64,
    max_seq_len: i64,
    out: &mut TensorMut,
    lse: Option<&mut TensorMut>,
    workspace: Option<&mut TensorMut>,
    options: Option<&AttentionOptions>,
    stream: Stream,
) -> Result<()> {
    let (qd, kc, vc) = (q.dl_tensor(), k_cache.dl_tensor(), v_cache.dl_tensor());
    let (bt, sl) = (block_table.dl_tensor(), seq_lens.dl_tensor());
    let (cu, sk) = (Opt::of(extras.cu_seqlens_q), Opt::of(extras.sinks));
    let (ks, vs) = (Opt::of(extras.k_scale), Opt::of(extras.v_scale));
    let mut od = out.dl_tensor();
    let mut ld = Opt(lse.map(|t| t.dl_tensor()));
    let mut wd = Opt(workspace.map(|t| t.dl_tensor()));
    check(unsafe {
        sys::ks_paged_attention(
            &qd,
            &kc,
            &vc,
            &bt,
            &sl,
            cu.ptr(),
            max_seqlen_q,
            max_seq_len,
            sk.ptr(),
            ks.ptr(),
            vs.ptr(),
            &mut od,
            ld.ptr_mut(),
            wd.ptr_mut(),
            opt_ptr(options),
            stream.0,
        )
    })
}
