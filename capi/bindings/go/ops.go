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

func keep(ts ...*Tensor) { runtime.KeepAlive(ts) }

// ---- the ops whose arguments are not one tensor, integer or option struct each (the others are in
// generated.go)

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
