package kernelset

/*
#include <stdlib.h>
#include <string.h>
#include "kernelset.h"
*/
import "C"

import (
	"runtime"
	"unsafe"
)

// DType is an element type of the ABI.
type DType int

const (
	Float32 DType = iota
	Float16
	BFloat16
	Float8E4M3
	Int32
	Int64
	Uint8
)

var dtypeInfo = [...]struct {
	name       string
	code, bits uint8
}{
	Float32:    {"float32", C.kDLFloat, 32},
	Float16:    {"float16", C.kDLFloat, 16},
	BFloat16:   {"bfloat16", C.kDLBfloat, 16},
	Float8E4M3: {"float8_e4m3fn", C.kDLFloat8_e4m3fn, 8},
	Int32:      {"int32", C.kDLInt, 32},
	Int64:      {"int64", C.kDLInt, 64},
	Uint8:      {"uint8", C.kDLUInt, 8},
}

// Size is the element size in bytes.
func (d DType) Size() int { return int(dtypeInfo[d].bits) / 8 }

func (d DType) String() string { return dtypeInfo[d].name }

// ParseDType reads "float32", "bfloat16", "float8_e4m3fn", "int64" ...
func ParseDType(name string) (DType, bool) {
	for i, info := range dtypeInfo {
		if info.name == name {
			return DType(i), true
		}
	}
	return 0, false
}

// Device is where a tensor's memory lives.
type Device struct {
	CUDA bool
	ID   int32
}

// CPU is the host.
var CPU = Device{}

// Tensor is a DLTensor in C memory (with its shape and strides), over C memory it owns or
// memory it wraps.
type Tensor struct {
	dl      *C.DLTensor
	owned   unsafe.Pointer // data allocated here (nil for wrapped memory)
	nbytes  int            // bytes from the data pointer the layout reaches
	dtype   DType
	shape   []int64
	strides []int64 // nil: compact row-major
	base    *Tensor // a View keeps its owner alive
}

// CompactStrides are the row-major strides of shape, in elements.
func CompactStrides(shape []int64) []int64 {
	s := make([]int64, len(shape))
	acc := int64(1)
	for i := len(shape) - 1; i >= 0; i-- {
		s[i] = acc
		if shape[i] > 1 {
			acc *= shape[i]
		}
	}
	return s
}

// extent: bytes from the data pointer that a layout reaches (strides non-negative).
func extent(dtype DType, shape, strides []int64) (int, error) {
	if len(shape) > 32 {
		return 0, invalid("shape %v: more than 32 dimensions", shape)
	}
	if strides != nil && len(strides) != len(shape) {
		return 0, invalid("strides %v for shape %v", strides, shape)
	}
	st := strides
	if st == nil {
		st = CompactStrides(shape)
	}
	last := int64(0)
	for i, n := range shape {
		if n < 0 {
			return 0, invalid("shape %v: negative dimension", shape)
		}
		if n == 0 {
			return 0, nil
		}
		if st[i] < 0 {
			return 0, invalid("strides %v: negative strides need WrapPointer", strides)
		}
		last += (n - 1) * st[i]
	}
	return int(last+1) * dtype.Size(), nil
}

func newTensor(data unsafe.Pointer, dtype DType, shape, strides []int64, dev Device, nbytes int) *Tensor {
	nd := len(shape)
	// one C allocation: the DLTensor, then its shape and strides arrays
	size := C.size_t(unsafe.Sizeof(C.DLTensor{})) + C.size_t(16*nd)
	mem := C.calloc(1, size)
	d := (*C.DLTensor)(mem)
	dims := unsafe.Slice((*C.int64_t)(unsafe.Add(mem, unsafe.Sizeof(C.DLTensor{}))), 2*nd)
	for i, n := range shape {
		dims[i] = C.int64_t(n)
	}
	d.data = data
	d.device.device_type = C.kDLCPU
	if dev.CUDA {
		d.device.device_type = C.kDLCUDA
	}
	d.device.device_id = C.int32_t(dev.ID)
	d.ndim = C.int32_t(nd)
	d.dtype.code = C.uint8_t(dtypeInfo[dtype].code)
	d.dtype.bits = C.uint8_t(dtypeInfo[dtype].bits)
	d.dtype.lanes = 1
	if nd > 0 {
		d.shape = &dims[0]
	}
	if strides != nil && nd > 0 {
		for i, s := range strides {
			dims[nd+i] = C.int64_t(s)
		}
		d.strides = &dims[nd]
	}
	t := &Tensor{dl: d, nbytes: nbytes, dtype: dtype, shape: append([]int64(nil), shape...)}
	if strides != nil {
		t.strides = append([]int64(nil), strides...)
	}
	runtime.SetFinalizer(t, (*Tensor).Free)
	return t
}

// NewTensor allocates a zeroed CPU tensor in C memory (compact row-major).
func NewTensor(dtype DType, shape ...int64) (*Tensor, error) {
	return NewStridedTensor(dtype, shape, nil)
}

// NewStridedTensor allocates zeroed C memory for every element strides (in elements,
// non-negative; nil: compact) reach.
func NewStridedTensor(dtype DType, shape, strides []int64) (*Tensor, error) {
	n, err := extent(dtype, shape, strides)
	if err != nil {
		return nil, err
	}
	data := C.calloc(C.size_t(n+1), 1) // +1: a valid pointer for empty tensors
	if data == nil {
		return nil, &Error{Status: ErrOutOfMemory, Message: "tensor allocation failed"}
	}
	t := newTensor(data, dtype, shape, strides, CPU, n)
	t.owned = data
	return t, nil
}

// TensorFromBytes allocates a CPU tensor holding a copy of data (its storage: every element the
// strides reach, little-endian).
func TensorFromBytes(dtype DType, shape, strides []int64, data []byte) (*Tensor, error) {
	t, err := NewStridedTensor(dtype, shape, strides)
	if err != nil {
		return nil, err
	}
	if len(data) != t.nbytes {
		t.Free()
		return nil, invalid("%d bytes for a %s tensor of shape %v strides %v (%d bytes)", len(data), dtype, shape,
			strides, t.nbytes)
	}
	copy(t.Bytes(), data)
	return t, nil
}

// WrapPointer describes memory this package does not own (a CUDA allocation, another library's
// buffer); the caller keeps it alive and valid for every element the layout reaches.
func WrapPointer(data unsafe.Pointer, dtype DType, shape, strides []int64, dev Device) *Tensor {
	return newTensor(data, dtype, shape, strides, dev, -1)
}

// View is a tensor over the same memory with another shape/strides, starting `offset` elements
// in; checked to stay inside the owner's memory.
func (t *Tensor) View(shape, strides []int64, offset int64) (*Tensor, error) {
	n, err := extent(t.dtype, shape, strides)
	if err != nil {
		return nil, err
	}
	start := int(offset) * t.dtype.Size()
	if offset < 0 || (t.nbytes >= 0 && start+n > t.nbytes) {
		return nil, invalid("view of %d bytes at element %d outside a tensor of %d bytes", n, offset, t.nbytes)
	}
	v := newTensor(unsafe.Add(t.dl.data, start), t.dtype, shape, strides,
		Device{CUDA: t.dl.device.device_type == C.kDLCUDA, ID: int32(t.dl.device.device_id)}, n)
	v.base = t
	return v, nil
}

// Free releases the C memory now (the garbage collector does it otherwise). Idempotent.
func (t *Tensor) Free() {
	if t.dl != nil {
		C.free(unsafe.Pointer(t.dl))
		t.dl = nil
	}
	if t.owned != nil {
		C.free(t.owned)
		t.owned = nil
	}
	runtime.SetFinalizer(t, nil)
}

func (t *Tensor) DType() DType     { return t.dtype }
func (t *Tensor) Shape() []int64   { return append([]int64(nil), t.shape...) }
func (t *Tensor) Strides() []int64 { return append([]int64(nil), t.strides...) }
func (t *Tensor) NumBytes() int    { return t.nbytes }

// Bytes is the tensor's CPU memory (every element the layout reaches), without a copy; valid
// until Free.
func (t *Tensor) Bytes() []byte {
	if t.nbytes < 0 || t.dl == nil {
		return nil
	}
	return unsafe.Slice((*byte)(t.dl.data), t.nbytes)
}

func (t *Tensor) Float32s() []float32 {
	if t.nbytes < 0 || t.dl == nil {
		return nil
	}
	return unsafe.Slice((*float32)(t.dl.data), t.nbytes/4)
}

func (t *Tensor) Int32s() []int32 {
	if t.nbytes < 0 || t.dl == nil {
		return nil
	}
	return unsafe.Slice((*int32)(t.dl.data), t.nbytes/4)
}

func (t *Tensor) Int64s() []int64 {
	if t.nbytes < 0 || t.dl == nil {
		return nil
	}
	return unsafe.Slice((*int64)(t.dl.data), t.nbytes/8)
}

// Uint16s is float16/bfloat16 storage.
func (t *Tensor) Uint16s() []uint16 {
	if t.nbytes < 0 || t.dl == nil {
		return nil
	}
	return unsafe.Slice((*uint16)(t.dl.data), t.nbytes/2)
}
