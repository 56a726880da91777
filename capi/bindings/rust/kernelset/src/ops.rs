//! Op ids, option structs and one function per op of kernelset.h.
use std::ffi::c_void;
use std::mem::{size_of, MaybeUninit};
use std::ptr;

use crate::sys::{self, DLTensor};
use crate::tensor::{AsDLTensor, Opt, Stream, Tensor, TensorMut};
use crate::{check, invalid, Result};

// ---- op ids and options

/// Op identifiers (`KS_OP_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum Op {
    RmsNorm = sys::KS_OP_RMS_NORM,
    FusedAddRmsNorm = sys::KS_OP_FUSED_ADD_RMS_NORM,
    LayerNorm = sys::KS_OP_LAYER_NORM,
    SiluAndMul = sys::KS_OP_SILU_AND_MUL,
    GeluAndMul = sys::KS_OP_GELU_AND_MUL,
    Swiglu = sys::KS_OP_SWIGLU,
    Gelu = sys::KS_OP_GELU,
    SwigluOai = sys::KS_OP_SWIGLU_OAI,
    Softmax = sys::KS_OP_SOFTMAX,
    LogSoftmax = sys::KS_OP_LOG_SOFTMAX,
    CrossEntropy = sys::KS_OP_CROSS_ENTROPY,
    Embedding = sys::KS_OP_EMBEDDING,
    RotaryEmbedding = sys::KS_OP_ROTARY_EMBEDDING,
    Mrope = sys::KS_OP_MROPE,
    QkNormRope = sys::KS_OP_QK_NORM_ROPE,
    ReshapeAndCache = sys::KS_OP_RESHAPE_AND_CACHE,
    CopyBlocks = sys::KS_OP_COPY_BLOCKS,
    PagedAttention = sys::KS_OP_PAGED_ATTENTION,
    MergeAttnStates = sys::KS_OP_MERGE_ATTN_STATES,
    FlashAttention = sys::KS_OP_FLASH_ATTENTION,
    FlashAttentionVarlen = sys::KS_OP_FLASH_ATTENTION_VARLEN,
    MlaDecode = sys::KS_OP_MLA_DECODE,
}

impl Op {
    pub const ALL: [Op; 22] = [
        Op::RmsNorm,
        Op::FusedAddRmsNorm,
        Op::LayerNorm,
        Op::SiluAndMul,
        Op::GeluAndMul,
        Op::Swiglu,
        Op::Gelu,
        Op::SwigluOai,
        Op::Softmax,
        Op::LogSoftmax,
        Op::CrossEntropy,
        Op::Embedding,
        Op::RotaryEmbedding,
        Op::Mrope,
        Op::QkNormRope,
        Op::ReshapeAndCache,
        Op::CopyBlocks,
        Op::PagedAttention,
        Op::MergeAttnStates,
        Op::FlashAttention,
        Op::FlashAttentionVarlen,
        Op::MlaDecode,
    ];

    /// The op's C name without the `ks_` prefix ("rms_norm").
    pub fn name(self) -> &'static str {
        match self {
            Op::RmsNorm => "rms_norm",
            Op::FusedAddRmsNorm => "fused_add_rms_norm",
            Op::LayerNorm => "layer_norm",
            Op::SiluAndMul => "silu_and_mul",
            Op::GeluAndMul => "gelu_and_mul",
            Op::Swiglu => "swiglu",
            Op::Gelu => "gelu",
            Op::SwigluOai => "swiglu_oai",
            Op::Softmax => "softmax",
            Op::LogSoftmax => "log_softmax",
            Op::CrossEntropy => "cross_entropy",
            Op::Embedding => "embedding",
            Op::RotaryEmbedding => "rotary_embedding",
            Op::Mrope => "mrope",
            Op::QkNormRope => "qk_norm_rope",
            Op::ReshapeAndCache => "reshape_and_cache",
            Op::CopyBlocks => "copy_blocks",
            Op::PagedAttention => "paged_attention",
            Op::MergeAttnStates => "merge_attn_states",
            Op::FlashAttention => "flash_attention",
            Op::FlashAttentionVarlen => "flash_attention_varlen",
            Op::MlaDecode => "mla_decode",
        }
    }

    pub fn from_name(name: &str) -> Option<Op> {
        Op::ALL.iter().copied().find(|o| o.name() == name)
    }
}

pub use sys::ks_attention_options as AttentionOptions;
pub use sys::ks_cross_entropy_options as CrossEntropyOptions;
pub use sys::ks_gelu_options as GeluOptions;
pub use sys::ks_layer_norm_options as LayerNormOptions;
pub use sys::ks_mla_options as MlaOptions;
pub use sys::ks_mrope_options as MropeOptions;
pub use sys::ks_qk_norm_rope_options as QkNormRopeOptions;
pub use sys::ks_rms_norm_options as RmsNormOptions;
pub use sys::ks_rope_options as RopeOptions;
pub use sys::ks_softmax_options as SoftmaxOptions;
pub use sys::ks_swiglu_oai_options as SwigluOaiOptions;

/// The option structs (plain data whose first field is their size).
pub trait OpOptions: Copy + Sized {
    /// The library's defaults for `op` (`ks_options_init`), with `size` set.
    fn defaults(op: Op) -> Result<Self> {
        let mut o = MaybeUninit::<Self>::zeroed();
        check(unsafe { sys::ks_options_init(op as i32, o.as_mut_ptr() as *mut c_void, size_of::<Self>()) })?;
        Ok(unsafe { o.assume_init() })
    }
}
impl OpOptions for RmsNormOptions {}
impl OpOptions for LayerNormOptions {}
impl OpOptions for GeluOptions {}
impl OpOptions for SwigluOaiOptions {}
impl OpOptions for SoftmaxOptions {}
impl OpOptions for CrossEntropyOptions {}
impl OpOptions for RopeOptions {}
impl OpOptions for MropeOptions {}
impl OpOptions for QkNormRopeOptions {}
impl OpOptions for AttentionOptions {}
impl OpOptions for MlaOptions {}

fn opt_ptr<T>(o: Option<&T>) -> *const T {
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

/// y = x * rsqrt(mean(x^2) + eps) * (offset + weight) over the last dim; `x [..., H]`, out like x.
pub fn rms_norm(
    x: &Tensor,
    weight: Option<&Tensor>,
    out: &mut TensorMut,
    options: Option<&RmsNormOptions>,
    stream: Stream,
) -> Result<()> {
    let (x, w, mut o) = (x.dl_tensor(), Opt::of(weight), out.dl_tensor());
    check(unsafe { sys::ks_rms_norm(&x, w.ptr(), &mut o, opt_ptr(options), stream.0) })
}

/// h = x + residual (written into residual), out = rms_norm(h).
pub fn fused_add_rms_norm(
    x: &Tensor,
    residual: &mut TensorMut,
    weight: Option<&Tensor>,
    out: &mut TensorMut,
    options: Option<&RmsNormOptions>,
    stream: Stream,
) -> Result<()> {
    let (x, mut r, w, mut o) = (x.dl_tensor(), residual.dl_tensor(), Opt::of(weight), out.dl_tensor());
    check(unsafe { sys::ks_fused_add_rms_norm(&x, &mut r, w.ptr(), &mut o, opt_ptr(options), stream.0) })
}

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

/// y = (x - mean) * rsqrt(var + eps) * weight + bias over the last dim.
pub fn layer_norm(
    x: &Tensor,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    out: &mut TensorMut,
    options: Option<&LayerNormOptions>,
    stream: Stream,
) -> Result<()> {
    let (x, w, b, mut o) = (x.dl_tensor(), Opt::of(weight), Opt::of(bias), out.dl_tensor());
    check(unsafe { sys::ks_layer_norm(&x, w.ptr(), b.ptr(), &mut o, opt_ptr(options), stream.0) })
}

/// `x [..., 2I]` -> `out [..., I]` = silu(gate) * up.
pub fn silu_and_mul(x: &Tensor, out: &mut TensorMut, stream: Stream) -> Result<()> {
    let (x, mut o) = (x.dl_tensor(), out.dl_tensor());
    check(unsafe { sys::ks_silu_and_mul(&x, &mut o, stream.0) })
}

pub fn gelu_and_mul(x: &Tensor, out: &mut TensorMut, options: Option<&GeluOptions>, stream: Stream) -> Result<()> {
    let (x, mut o) = (x.dl_tensor(), out.dl_tensor());
    check(unsafe { sys::ks_gelu_and_mul(&x, &mut o, opt_ptr(options), stream.0) })
}

pub fn swiglu(gate: &Tensor, up: &Tensor, out: &mut TensorMut, stream: Stream) -> Result<()> {
    let (g, u, mut o) = (gate.dl_tensor(), up.dl_tensor(), out.dl_tensor());
    check(unsafe { sys::ks_swiglu(&g, &u, &mut o, stream.0) })
}

pub fn gelu(x: &Tensor, out: &mut TensorMut, options: Option<&GeluOptions>, stream: Stream) -> Result<()> {
    let (x, mut o) = (x.dl_tensor(), out.dl_tensor());
    check(unsafe { sys::ks_gelu(&x, &mut o, opt_ptr(options), stream.0) })
}

/// gpt-oss: `x [..., 2I]` interleaved (gate, up) pairs -> `out [..., I]`.
pub fn swiglu_oai(x: &Tensor, out: &mut TensorMut, options: Option<&SwigluOaiOptions>, stream: Stream) -> Result<()> {
    let (x, mut o) = (x.dl_tensor(), out.dl_tensor());
    check(unsafe { sys::ks_swiglu_oai(&x, &mut o, opt_ptr(options), stream.0) })
}

pub fn softmax(x: &Tensor, out: &mut TensorMut, options: Option<&SoftmaxOptions>, stream: Stream) -> Result<()> {
    let (x, mut o) = (x.dl_tensor(), out.dl_tensor());
    check(unsafe { sys::ks_softmax(&x, &mut o, opt_ptr(options), stream.0) })
}

pub fn log_softmax(x: &Tensor, out: &mut TensorMut, options: Option<&SoftmaxOptions>, stream: Stream) -> Result<()> {
    let (x, mut o) = (x.dl_tensor(), out.dl_tensor());
    check(unsafe { sys::ks_log_softmax(&x, &mut o, opt_ptr(options), stream.0) })
}

/// `logits [T, V]`, `target [T]` int32/int64 -> loss float32 (`[T]`, or 0-d when reduced).
pub fn cross_entropy(
    logits: &Tensor,
    target: &Tensor,
    loss: &mut TensorMut,
    options: Option<&CrossEntropyOptions>,
    stream: Stream,
) -> Result<()> {
    let (l, t, mut o) = (logits.dl_tensor(), target.dl_tensor(), loss.dl_tensor());
    check(unsafe { sys::ks_cross_entropy(&l, &t, &mut o, opt_ptr(options), stream.0) })
}

/// `ids [...]` int32/int64, `weight [V, H]` -> `out [..., H]`.
pub fn embedding(ids: &Tensor, weight: &Tensor, out: &mut TensorMut, stream: Stream) -> Result<()> {
    let (i, w, mut o) = (ids.dl_tensor(), weight.dl_tensor(), out.dl_tensor());
    check(unsafe { sys::ks_embedding(&i, &w, &mut o, stream.0) })
}

/// RoPE in place on q and k (optional) at `positions [T]`.
pub fn rotary_embedding(
    positions: &Tensor,
    q: &mut TensorMut,
    k: Option<&mut TensorMut>,
    cos_sin_cache: &Tensor,
    options: Option<&RopeOptions>,
    stream: Stream,
) -> Result<()> {
    let (p, mut qd, c) = (positions.dl_tensor(), q.dl_tensor(), cos_sin_cache.dl_tensor());
    let mut kd = Opt(k.map(|k| k.dl_tensor()));
    check(unsafe { sys::ks_rotary_embedding(&p, &mut qd, kd.ptr_mut(), &c, opt_ptr(options), stream.0) })
}

/// Multimodal RoPE (`positions [3, T]`) in place on q and k.
pub fn mrope(
    positions: &Tensor,
    q: &mut TensorMut,
    k: Option<&mut TensorMut>,
    cos_sin_cache: &Tensor,
    options: Option<&MropeOptions>,
    stream: Stream,
) -> Result<()> {
    let (p, mut qd, c) = (positions.dl_tensor(), q.dl_tensor(), cos_sin_cache.dl_tensor());
    let mut kd = Opt(k.map(|k| k.dl_tensor()));
    check(unsafe { sys::ks_mrope(&p, &mut qd, kd.ptr_mut(), &c, opt_ptr(options), stream.0) })
}

/// Per-head RMSNorm of q and k (`weights [D]`) then RoPE, in place.
#[allow(clippy::too_many_arguments)]
pub fn qk_norm_rope(
    q: &mut TensorMut,
    k: Option<&mut TensorMut>,
    q_weight: &Tensor,
    k_weight: Option<&Tensor>,
    cos_sin_cache: &Tensor,
    positions: &Tensor,
    options: Option<&QkNormRopeOptions>,
    stream: Stream,
) -> Result<()> {
    let (mut qd, qw, kw) = (q.dl_tensor(), q_weight.dl_tensor(), Opt::of(k_weight));
    let mut kd = Opt(k.map(|k| k.dl_tensor()));
    let (c, p) = (cos_sin_cache.dl_tensor(), positions.dl_tensor());
    check(unsafe { sys::ks_qk_norm_rope(&mut qd, kd.ptr_mut(), &qw, kw.ptr(), &c, &p, opt_ptr(options), stream.0) })
}

/// Writes `key/value [T, Hkv, D]` into the paged caches at `slot_mapping [T]` (-1 skips).
#[allow(clippy::too_many_arguments)]
pub fn reshape_and_cache(
    key: &Tensor,
    value: &Tensor,
    k_cache: &mut TensorMut,
    v_cache: &mut TensorMut,
    slot_mapping: &Tensor,
    k_scale: Option<&Tensor>,
    v_scale: Option<&Tensor>,
    stream: Stream,
) -> Result<()> {
    let (k, v, mut kc, mut vc) = (key.dl_tensor(), value.dl_tensor(), k_cache.dl_tensor(), v_cache.dl_tensor());
    let (s, ks, vs) = (slot_mapping.dl_tensor(), Opt::of(k_scale), Opt::of(v_scale));
    check(unsafe { sys::ks_reshape_and_cache(&k, &v, &mut kc, &mut vc, &s, ks.ptr(), vs.ptr(), stream.0) })
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

/// Attention over the union of two key sets from its parts: `out [T, H, D]`, `lse [T, H]` (optional).
pub fn merge_attn_states(
    out_a: &Tensor,
    lse_a: &Tensor,
    out_b: &Tensor,
    lse_b: &Tensor,
    out: &mut TensorMut,
    lse: Option<&mut TensorMut>,
    stream: Stream,
) -> Result<()> {
    let (oa, la, ob, lb) = (out_a.dl_tensor(), lse_a.dl_tensor(), out_b.dl_tensor(), lse_b.dl_tensor());
    let mut od = out.dl_tensor();
    let mut ld = Opt(lse.map(|t| t.dl_tensor()));
    check(unsafe { sys::ks_merge_attn_states(&oa, &la, &ob, &lb, &mut od, ld.ptr_mut(), stream.0) })
}

/// Dense attention: `q [B, S, Hq, D]`, `k/v [B, Sk, Hkv, D(v)]` -> `out [B, S, Hq, Dv]`, `lse [B, Hq, S]`.
#[allow(clippy::too_many_arguments)]
pub fn flash_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    sinks: Option<&Tensor>,
    out: &mut TensorMut,
    lse: Option<&mut TensorMut>,
    options: Option<&AttentionOptions>,
    stream: Stream,
) -> Result<()> {
    let (qd, kd, vd, sk) = (q.dl_tensor(), k.dl_tensor(), v.dl_tensor(), Opt::of(sinks));
    let mut od = out.dl_tensor();
    let mut ld = Opt(lse.map(|t| t.dl_tensor()));
    check(unsafe {
        sys::ks_flash_attention(&qd, &kd, &vd, sk.ptr(), &mut od, ld.ptr_mut(), opt_ptr(options), stream.0)
    })
}

/// Packed sequences: `q [T, Hq, D]`, `k/v [Tk, Hkv, D(v)]`, `cu_seqlens [B+1]` -> out, `lse [Hq, T]`.
#[allow(clippy::too_many_arguments)]
pub fn flash_attention_varlen(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    cu_seqlens_q: &Tensor,
    cu_seqlens_k: &Tensor,
    max_seqlen_q: i64,
    max_seqlen_k: i64,
    sinks: Option<&Tensor>,
    out: &mut TensorMut,
    lse: Option<&mut TensorMut>,
    options: Option<&AttentionOptions>,
    stream: Stream,
) -> Result<()> {
    let (qd, kd, vd) = (q.dl_tensor(), k.dl_tensor(), v.dl_tensor());
    let (cq, ck, sk) = (cu_seqlens_q.dl_tensor(), cu_seqlens_k.dl_tensor(), Opt::of(sinks));
    let mut od = out.dl_tensor();
    let mut ld = Opt(lse.map(|t| t.dl_tensor()));
    check(unsafe {
        sys::ks_flash_attention_varlen(
            &qd,
            &kd,
            &vd,
            &cq,
            &ck,
            max_seqlen_q,
            max_seqlen_k,
            sk.ptr(),
            &mut od,
            ld.ptr_mut(),
            opt_ptr(options),
            stream.0,
        )
    })
}

/// MLA decode (DeepSeek-V2/V3, weight-absorbed) over a paged latent cache: q_nope [B, H, R],
/// q_pe [B, H, P], kv_cache [num_blocks, block_size, R + P] (fp8 e4m3fn with `kv_scale`), out
/// [B, H, R]; `options` must carry the scale (the defaults have none).
#[allow(clippy::too_many_arguments)]
pub fn mla_decode(
    q_nope: &Tensor,
    q_pe: &Tensor,
    kv_cache: &Tensor,
    block_table: &Tensor,
    seq_lens: &Tensor,
    max_seq_len: i64,
    kv_scale: Option<&Tensor>,
    out: &mut TensorMut,
    lse: Option<&mut TensorMut>,
    options: Option<&MlaOptions>,
    stream: Stream,
) -> Result<()> {
    let (qn, qp, kv) = (q_nope.dl_tensor(), q_pe.dl_tensor(), kv_cache.dl_tensor());
    let (bt, sl, ks) = (block_table.dl_tensor(), seq_lens.dl_tensor(), Opt::of(kv_scale));
    let mut od = out.dl_tensor();
    let mut ld = Opt(lse.map(|t| t.dl_tensor()));
    check(unsafe {
        sys::ks_mla_decode(
            &qn,
            &qp,
            &kv,
            &bt,
            &sl,
            max_seq_len,
            ks.ptr(),
            &mut od,
            ld.ptr_mut(),
            opt_ptr(options),
            stream.0,
        )
    })
}
