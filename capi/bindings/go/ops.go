package kernelset

/*
#include "kernelset.h"
*/
import "C"

import (
	"runtime"
	"unsafe"
)

// Options is implemented by the option structs; nil options mean the library's defaults.
type Options interface {
	// cOptions: the C struct (size set) in Go memory holding no Go pointers, as cgo allows.
	cOptions() unsafe.Pointer
}

func initOptions(op Op, p unsafe.Pointer, size uintptr) error {
	return call(func() C.ks_status_t { return C.ks_options_init(C.ks_op_t(op), p, C.size_t(size)) })
}

// RmsNormOptions: rms_norm and fused_add_rms_norm.
type RmsNormOptions struct {
	Eps, Offset float32
	Cast        int32 // NormCastLlama or NormCastGemma
}

// NewRmsNormOptions returns the library's defaults for op.
func NewRmsNormOptions(op Op) (*RmsNormOptions, error) {
	var c C.ks_rms_norm_options
	if err := initOptions(op, unsafe.Pointer(&c), unsafe.Sizeof(c)); err != nil {
		return nil, err
	}
	return &RmsNormOptions{Eps: float32(c.eps), Offset: float32(c.offset), Cast: int32(c.cast)}, nil
}

func (o *RmsNormOptions) c() *C.ks_rms_norm_options {
	if o == nil {
		return nil
	}
	c := new(C.ks_rms_norm_options)
	c.size = C.size_t(unsafe.Sizeof(*c))
	c.eps = C.float(o.Eps)
	c.offset = C.float(o.Offset)
	c.cast = C.int32_t(o.Cast)
	return c
}

func (o *RmsNormOptions) cOptions() unsafe.Pointer { return unsafe.Pointer(o.c()) }

type LayerNormOptions struct{ Eps float32 }

func NewLayerNormOptions(op Op) (*LayerNormOptions, error) {
	var c C.ks_layer_norm_options
	if err := initOptions(op, unsafe.Pointer(&c), unsafe.Sizeof(c)); err != nil {
		return nil, err
	}
	return &LayerNormOptions{Eps: float32(c.eps)}, nil
}

func (o *LayerNormOptions) c() *C.ks_layer_norm_options {
	if o == nil {
		return nil
	}
	c := new(C.ks_layer_norm_options)
	c.size = C.size_t(unsafe.Sizeof(*c))
	c.eps = C.float(o.Eps)
	return c
}

func (o *LayerNormOptions) cOptions() unsafe.Pointer { return unsafe.Pointer(o.c()) }

// GeluOptions: gelu and gelu_and_mul.
type GeluOptions struct{ Approximate int32 } // GeluNone or GeluTanh

func NewGeluOptions(op Op) (*GeluOptions, error) {
	var c C.ks_gelu_options
	if err := initOptions(op, unsafe.Pointer(&c), unsafe.Sizeof(c)); err != nil {
		return nil, err
	}
	return &GeluOptions{Approximate: int32(c.approximate)}, nil
}

func (o *GeluOptions) c() *C.ks_gelu_options {
	if o == nil {
		return nil
	}
	c := new(C.ks_gelu_options)
	c.size = C.size_t(unsafe.Sizeof(*c))
	c.approximate = C.int32_t(o.Approximate)
	return c
}

func (o *GeluOptions) cOptions() unsafe.Pointer { return unsafe.Pointer(o.c()) }

type SwigluOaiOptions struct{ Alpha, Limit float32 }

func NewSwigluOaiOptions(op Op) (*SwigluOaiOptions, error) {
	var c C.ks_swiglu_oai_options
	if err := initOptions(op, unsafe.Pointer(&c), unsafe.Sizeof(c)); err != nil {
		return nil, err
	}
	return &SwigluOaiOptions{Alpha: float32(c.alpha), Limit: float32(c.limit)}, nil
}

func (o *SwigluOaiOptions) c() *C.ks_swiglu_oai_options {
	if o == nil {
		return nil
	}
	c := new(C.ks_swiglu_oai_options)
	c.size = C.size_t(unsafe.Sizeof(*c))
	c.alpha = C.float(o.Alpha)
	c.limit = C.float(o.Limit)
	return c
}

func (o *SwigluOaiOptions) cOptions() unsafe.Pointer { return unsafe.Pointer(o.c()) }

// SoftmaxOptions: softmax and log_softmax.
type SoftmaxOptions struct{ Temperature float32 }

func NewSoftmaxOptions(op Op) (*SoftmaxOptions, error) {
	var c C.ks_softmax_options
	if err := initOptions(op, unsafe.Pointer(&c), unsafe.Sizeof(c)); err != nil {
		return nil, err
	}
	return &SoftmaxOptions{Temperature: float32(c.temperature)}, nil
}

func (o *SoftmaxOptions) c() *C.ks_softmax_options {
	if o == nil {
		return nil
	}
	c := new(C.ks_softmax_options)
	c.size = C.size_t(unsafe.Sizeof(*c))
	c.temperature = C.float(o.Temperature)
	return c
}

func (o *SoftmaxOptions) cOptions() unsafe.Pointer { return unsafe.Pointer(o.c()) }

type CrossEntropyOptions struct {
	IgnoreIndex                    int64
	LabelSmoothing, ZLoss, Softcap float32
	Reduction                      int32 // ReductionNone, ReductionMean or ReductionSum
}

func NewCrossEntropyOptions(op Op) (*CrossEntropyOptions, error) {
	var c C.ks_cross_entropy_options
	if err := initOptions(op, unsafe.Pointer(&c), unsafe.Sizeof(c)); err != nil {
		return nil, err
	}
	return &CrossEntropyOptions{IgnoreIndex: int64(c.ignore_index), LabelSmoothing: float32(c.label_smoothing),
		ZLoss: float32(c.z_loss), Softcap: float32(c.softcap), Reduction: int32(c.reduction)}, nil
}

func (o *CrossEntropyOptions) c() *C.ks_cross_entropy_options {
	if o == nil {
		return nil
	}
	c := new(C.ks_cross_entropy_options)
	c.size = C.size_t(unsafe.Sizeof(*c))
	c.ignore_index = C.int64_t(o.IgnoreIndex)
	c.label_smoothing = C.float(o.LabelSmoothing)
	c.z_loss = C.float(o.ZLoss)
	c.softcap = C.float(o.Softcap)
	c.reduction = C.int32_t(o.Reduction)
	return c
}

func (o *CrossEntropyOptions) cOptions() unsafe.Pointer { return unsafe.Pointer(o.c()) }

type RopeOptions struct {
	Interleaved, RotaryDim, HeadSize int32
}

func NewRopeOptions(op Op) (*RopeOptions, error) {
	var c C.ks_rope_options
	if err := initOptions(op, unsafe.Pointer(&c), unsafe.Sizeof(c)); err != nil {
		return nil, err
	}
	return &RopeOptions{Interleaved: int32(c.interleaved), RotaryDim: int32(c.rotary_dim),
		HeadSize: int32(c.head_size)}, nil
}

func (o *RopeOptions) c() *C.ks_rope_options {
	if o == nil {
		return nil
	}
	c := new(C.ks_rope_options)
	c.size = C.size_t(unsafe.Sizeof(*c))
	c.interleaved = C.int32_t(o.Interleaved)
	c.rotary_dim = C.int32_t(o.RotaryDim)
	c.head_size = C.int32_t(o.HeadSize)
	return c
}

func (o *RopeOptions) cOptions() unsafe.Pointer { return unsafe.Pointer(o.c()) }

type MropeOptions struct {
	Interleaved, RotaryDim, HeadSize int32
	MropeSection                     [3]int32
	MropeInterleaved                 int32
}

func NewMropeOptions(op Op) (*MropeOptions, error) {
	var c C.ks_mrope_options
	if err := initOptions(op, unsafe.Pointer(&c), unsafe.Sizeof(c)); err != nil {
		return nil, err
	}
	o := &MropeOptions{Interleaved: int32(c.interleaved), RotaryDim: int32(c.rotary_dim), HeadSize: int32(c.head_size),
		MropeInterleaved: int32(c.mrope_interleaved)}
	for i := range o.MropeSection {
		o.MropeSection[i] = int32(c.mrope_section[i])
	}
	return o, nil
}

func (o *MropeOptions) c() *C.ks_mrope_options {
	if o == nil {
		return nil
	}
	c := new(C.ks_mrope_options)
	c.size = C.size_t(unsafe.Sizeof(*c))
	c.interleaved = C.int32_t(o.Interleaved)
	c.rotary_dim = C.int32_t(o.RotaryDim)
	c.head_size = C.int32_t(o.HeadSize)
	for i, s := range o.MropeSection {
		c.mrope_section[i] = C.int32_t(s)
	}
	c.mrope_interleaved = C.int32_t(o.MropeInterleaved)
	return c
}

func (o *MropeOptions) cOptions() unsafe.Pointer { return unsafe.Pointer(o.c()) }

type QkNormRopeOptions struct {
	Eps, Offset                      float32
	Cast                             int32
	Interleaved, RotaryDim, HeadSize int32
	MropeSection                     [3]int32 // all 0: plain RoPE with positions [T]
	MropeInterleaved                 int32
}

func NewQkNormRopeOptions(op Op) (*QkNormRopeOptions, error) {
	var c C.ks_qk_norm_rope_options
	if err := initOptions(op, unsafe.Pointer(&c), unsafe.Sizeof(c)); err != nil {
		return nil, err
	}
	o := &QkNormRopeOptions{Eps: float32(c.eps), Offset: float32(c.offset), Cast: int32(c.cast),
		Interleaved: int32(c.interleaved), RotaryDim: int32(c.rotary_dim), HeadSize: int32(c.head_size),
		MropeInterleaved: int32(c.mrope_interleaved)}
	for i := range o.MropeSection {
		o.MropeSection[i] = int32(c.mrope_section[i])
	}
	return o, nil
}

func (o *QkNormRopeOptions) c() *C.ks_qk_norm_rope_options {
	if o == nil {
		return nil
	}
	c := new(C.ks_qk_norm_rope_options)
	c.size = C.size_t(unsafe.Sizeof(*c))
	c.eps = C.float(o.Eps)
	c.offset = C.float(o.Offset)
	c.cast = C.int32_t(o.Cast)
	c.interleaved = C.int32_t(o.Interleaved)
	c.rotary_dim = C.int32_t(o.RotaryDim)
	c.head_size = C.int32_t(o.HeadSize)
	for i, s := range o.MropeSection {
		c.mrope_section[i] = C.int32_t(s)
	}
	c.mrope_interleaved = C.int32_t(o.MropeInterleaved)
	return c
}

func (o *QkNormRopeOptions) cOptions() unsafe.Pointer { return unsafe.Pointer(o.c()) }

// AttentionOptions: paged_attention, flash_attention, flash_attention_varlen.
type AttentionOptions struct {
	Scale                   float32 // 0: 1/sqrt(D)
	Causal                  int32
	WindowLeft, WindowRight int32 // -1: unbounded
	Softcap                 float32
}

func NewAttentionOptions(op Op) (*AttentionOptions, error) {
	var c C.ks_attention_options
	if err := initOptions(op, unsafe.Pointer(&c), unsafe.Sizeof(c)); err != nil {
		return nil, err
	}
	return &AttentionOptions{Scale: float32(c.scale), Causal: int32(c.causal), WindowLeft: int32(c.window_left),
		WindowRight: int32(c.window_right), Softcap: float32(c.softcap)}, nil
}

func (o *AttentionOptions) c() *C.ks_attention_options {
	if o == nil {
		return nil
	}
	c := new(C.ks_attention_options)
	c.size = C.size_t(unsafe.Sizeof(*c))
	c.scale = C.float(o.Scale)
	c.causal = C.int32_t(o.Causal)
	c.window_left = C.int32_t(o.WindowLeft)
	c.window_right = C.int32_t(o.WindowRight)
	c.softcap = C.float(o.Softcap)
	return c
}

func (o *AttentionOptions) cOptions() unsafe.Pointer { return unsafe.Pointer(o.c()) }

// MlaOptions: mla_decode. Scale has no default (the library refuses 0).
type MlaOptions struct {
	Scale      float64
	KvLoraRank int32 // 512 by default
	RopeDim    int32 // 64 by default
}

func NewMlaOptions(op Op) (*MlaOptions, error) {
	var c C.ks_mla_options
	if err := initOptions(op, unsafe.Pointer(&c), unsafe.Sizeof(c)); err != nil {
		return nil, err
	}
	return &MlaOptions{Scale: float64(c.scale), KvLoraRank: int32(c.kv_lora_rank), RopeDim: int32(c.rope_dim)}, nil
}

func (o *MlaOptions) c() *C.ks_mla_options {
	if o == nil {
		return nil
	}
	c := new(C.ks_mla_options)
	c.size = C.size_t(unsafe.Sizeof(*c))
	c.scale = C.double(o.Scale)
	c.kv_lora_rank = C.int32_t(o.KvLoraRank)
	c.rope_dim = C.int32_t(o.RopeDim)
	return c
}

func (o *MlaOptions) cOptions() unsafe.Pointer { return unsafe.Pointer(o.c()) }

func keep(ts ...*Tensor) { runtime.KeepAlive(ts) }

// ---- ops: tensors in the C signature's order; nil for an absent optional tensor.

// RmsNorm: out = x * rsqrt(mean(x^2) + eps) * (offset + weight) over the last dim.
func RmsNorm(x, weight, out *Tensor, o *RmsNormOptions, s Stream) error {
	defer keep(x, weight, out)
	return call(func() C.ks_status_t { return C.ks_rms_norm(dl(x), dl(weight), dl(out), o.c(), stream(s)) })
}

// FusedAddRmsNorm: residual = x + residual, out = rms_norm(residual); out may be x.
func FusedAddRmsNorm(x, residual, weight, out *Tensor, o *RmsNormOptions, s Stream) error {
	defer keep(x, residual, weight, out)
	return call(func() C.ks_status_t {
		return C.ks_fused_add_rms_norm(dl(x), dl(residual), dl(weight), dl(out), o.c(), stream(s))
	})
}

func LayerNorm(x, weight, bias, out *Tensor, o *LayerNormOptions, s Stream) error {
	defer keep(x, weight, bias, out)
	return call(func() C.ks_status_t { return C.ks_layer_norm(dl(x), dl(weight), dl(bias), dl(out), o.c(), stream(s)) })
}

// SiluAndMul: x [..., 2I] -> out [..., I] = silu(gate) * up.
func SiluAndMul(x, out *Tensor, s Stream) error {
	defer keep(x, out)
	return call(func() C.ks_status_t { return C.ks_silu_and_mul(dl(x), dl(out), stream(s)) })
}

func GeluAndMul(x, out *Tensor, o *GeluOptions, s Stream) error {
	defer keep(x, out)
	return call(func() C.ks_status_t { return C.ks_gelu_and_mul(dl(x), dl(out), o.c(), stream(s)) })
}

func Swiglu(gate, up, out *Tensor, s Stream) error {
	defer keep(gate, up, out)
	return call(func() C.ks_status_t { return C.ks_swiglu(dl(gate), dl(up), dl(out), stream(s)) })
}

func Gelu(x, out *Tensor, o *GeluOptions, s Stream) error {
	defer keep(x, out)
	return call(func() C.ks_status_t { return C.ks_gelu(dl(x), dl(out), o.c(), stream(s)) })
}

func SwigluOai(x, out *Tensor, o *SwigluOaiOptions, s Stream) error {
	defer keep(x, out)
	return call(func() C.ks_status_t { return C.ks_swiglu_oai(dl(x), dl(out), o.c(), stream(s)) })
}

func Softmax(x, out *Tensor, o *SoftmaxOptions, s Stream) error {
	defer keep(x, out)
	return call(func() C.ks_status_t { return C.ks_softmax(dl(x), dl(out), o.c(), stream(s)) })
}

func LogSoftmax(x, out *Tensor, o *SoftmaxOptions, s Stream) error {
	defer keep(x, out)
	return call(func() C.ks_status_t { return C.ks_log_softmax(dl(x), dl(out), o.c(), stream(s)) })
}

// CrossEntropy: logits [T, V], target [T] int32/int64 -> loss float32 ([T] or 0-d).
func CrossEntropy(logits, target, loss *Tensor, o *CrossEntropyOptions, s Stream) error {
	defer keep(logits, target, loss)
	return call(func() C.ks_status_t { return C.ks_cross_entropy(dl(logits), dl(target), dl(loss), o.c(), stream(s)) })
}

func Embedding(ids, weight, out *Tensor, s Stream) error {
	defer keep(ids, weight, out)
	return call(func() C.ks_status_t { return C.ks_embedding(dl(ids), dl(weight), dl(out), stream(s)) })
}

// RotaryEmbedding rotates q and k (may be nil) in place.
func RotaryEmbedding(positions, q, k, cosSinCache *Tensor, o *RopeOptions, s Stream) error {
	defer keep(positions, q, k, cosSinCache)
	return call(func() C.ks_status_t {
		return C.ks_rotary_embedding(dl(positions), dl(q), dl(k), dl(cosSinCache), o.c(), stream(s))
	})
}

func Mrope(positions, q, k, cosSinCache *Tensor, o *MropeOptions, s Stream) error {
	defer keep(positions, q, k, cosSinCache)
	return call(func() C.ks_status_t {
		return C.ks_mrope(dl(positions), dl(q), dl(k), dl(cosSinCache), o.c(), stream(s))
	})
}

func QkNormRope(q, k, qWeight, kWeight, cosSinCache, positions *Tensor, o *QkNormRopeOptions, s Stream) error {
	defer keep(q, k, qWeight, kWeight, cosSinCache, positions)
	return call(func() C.ks_status_t {
		return C.ks_qk_norm_rope(dl(q), dl(k), dl(qWeight), dl(kWeight), dl(cosSinCache), dl(positions), o.c(),
			stream(s))
	})
}

func ReshapeAndCache(key, value, kCache, vCache, slotMapping, kScale, vScale *Tensor, s Stream) error {
	defer keep(key, value, kCache, vCache, slotMapping, kScale, vScale)
	return call(func() C.ks_status_t {
		return C.ks_reshape_and_cache(dl(key), dl(value), dl(kCache), dl(vCache), dl(slotMapping), dl(kScale),
			dl(vScale), stream(s))
	})
}

// CopyBlocks: cache[dst] = cache[src] for each (src, dst) row of blockMapping, in every layer.
func CopyBlocks(kCaches, vCaches []*Tensor, blockMapping *Tensor, s Stream) error {
	if len(kCaches) != len(vCaches) {
		return invalid("v_caches: expected %d layers like k_caches, got %d", len(kCaches), len(vCaches))
	}
	ks := make([]*C.DLTensor, len(kCaches)+1) // C pointers in Go memory
	vs := make([]*C.DLTensor, len(vCaches)+1)
	for i := range kCaches {
		ks[i], vs[i] = dl(kCaches[i]), dl(vCaches[i])
	}
	defer keep(blockMapping)
	defer runtime.KeepAlive(kCaches)
	defer runtime.KeepAlive(vCaches)
	return call(func() C.ks_status_t {
		return C.ks_copy_blocks(&ks[0], &vs[0], C.int32_t(len(kCaches)), dl(blockMapping), stream(s))
	})
}

// PagedAttentionWorkspaceSize: bytes of the split-KV workspace for these shapes.
func PagedAttentionWorkspaceSize(q, kCache *Tensor, maxSeqLen int64) (int, error) {
	defer keep(q, kCache)
	var n C.size_t
	if err := call(func() C.ks_status_t {
		return C.ks_paged_attention_workspace_size(dl(q), dl(kCache), C.int64_t(maxSeqLen), &n)
	}); err != nil {
		return 0, err
	}
	return int(n), nil
}

// PagedInputs are paged attention's tensor inputs (CuSeqlensQ, Sinks, KScale, VScale optional).
type PagedInputs struct {
	Q, KCache, VCache, BlockTable, SeqLens, CuSeqlensQ, Sinks, KScale, VScale *Tensor
	MaxSeqlenQ, MaxSeqLen                                                     int64
}

// PagedAttention writes out (like q) and lse ([T, Hq] float32, may be nil); workspace may be nil.
func PagedAttention(in PagedInputs, out, lse, workspace *Tensor, o *AttentionOptions, s Stream) error {
	defer keep(in.Q, in.KCache, in.VCache, in.BlockTable, in.SeqLens, in.CuSeqlensQ, in.Sinks, in.KScale, in.VScale,
		out, lse, workspace)
	return call(func() C.ks_status_t {
		return C.ks_paged_attention(dl(in.Q), dl(in.KCache), dl(in.VCache), dl(in.BlockTable), dl(in.SeqLens),
			dl(in.CuSeqlensQ), C.int64_t(in.MaxSeqlenQ), C.int64_t(in.MaxSeqLen), dl(in.Sinks), dl(in.KScale),
			dl(in.VScale), dl(out), dl(lse), dl(workspace), o.c(), stream(s))
	})
}

func MergeAttnStates(outA, lseA, outB, lseB, out, lse *Tensor, s Stream) error {
	defer keep(outA, lseA, outB, lseB, out, lse)
	return call(func() C.ks_status_t {
		return C.ks_merge_attn_states(dl(outA), dl(lseA), dl(outB), dl(lseB), dl(out), dl(lse), stream(s))
	})
}

// FlashAttention: q [B, S, Hq, D], k/v [B, Sk, Hkv, D(v)] -> out [B, S, Hq, Dv], lse [B, Hq, S].
func FlashAttention(q, k, v, sinks, out, lse *Tensor, o *AttentionOptions, s Stream) error {
	defer keep(q, k, v, sinks, out, lse)
	return call(func() C.ks_status_t {
		return C.ks_flash_attention(dl(q), dl(k), dl(v), dl(sinks), dl(out), dl(lse), o.c(), stream(s))
	})
}

// FlashAttentionVarlen: packed sequences, cu_seqlens [B+1] int32; lse [Hq, T].
func FlashAttentionVarlen(q, k, v, cuSeqlensQ, cuSeqlensK *Tensor, maxSeqlenQ, maxSeqlenK int64, sinks, out,
	lse *Tensor, o *AttentionOptions, s Stream) error {
	defer keep(q, k, v, cuSeqlensQ, cuSeqlensK, sinks, out, lse)
	return call(func() C.ks_status_t {
		return C.ks_flash_attention_varlen(dl(q), dl(k), dl(v), dl(cuSeqlensQ), dl(cuSeqlensK),
			C.int64_t(maxSeqlenQ), C.int64_t(maxSeqlenK), dl(sinks), dl(out), dl(lse), o.c(), stream(s))
	})
}

// MlaDecode: DeepSeek MLA decode over a paged latent cache. qNope [B, H, R], qPe [B, H, P],
// kvCache [num_blocks, block_size, R + P] (fp8 e4m3fn with kvScale, else kvScale nil); out
// [B, H, R]; lse [B, H] or nil. maxSeqLen 0: the block table's capacity.
func MlaDecode(qNope, qPe, kvCache, blockTable, seqLens *Tensor, maxSeqLen int64, kvScale, out, lse *Tensor,
	o *MlaOptions, s Stream) error {
	defer keep(qNope, qPe, kvCache, blockTable, seqLens, kvScale, out, lse)
	return call(func() C.ks_status_t {
		return C.ks_mla_decode(dl(qNope), dl(qPe), dl(kvCache), dl(blockTable), dl(seqLens), C.int64_t(maxSeqLen),
			dl(kvScale), dl(out), dl(lse), o.c(), stream(s))
	})
}
