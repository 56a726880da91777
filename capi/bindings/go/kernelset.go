// Package kernelset binds libkernelset, kernelset's stable C ABI (capi/include/kernelset.h):
// fused inference kernels (norms, activations, softmax, cross-entropy, embedding, RoPE, paged KV
// cache, paged and flash attention) on CPU and CUDA tensors, without copies.
//
// Tensors live in C memory ([NewTensor], freed by [Tensor.Free] or the garbage collector), so
// calls pass them to the library as they are (cgo forbids C from holding Go pointers); device
// memory from another library is wrapped with [WrapPointer]. Every op returns an error, an
// *[Error] carrying the library's [Status] and its message naming the argument.
//
// Linking: by default the package links src/kernelset/capi/lib/libkernelset.so of this checkout
// (built by scripts/build_capi.sh) with an rpath to it; elsewhere set CGO_LDFLAGS="-L<dir>
// -Wl,-rpath,<dir>".
package kernelset

/*
#cgo CFLAGS: -I${SRCDIR}/../../include
#cgo LDFLAGS: -L${SRCDIR}/../../../src/kernelset/capi/lib -Wl,-rpath,${SRCDIR}/../../../src/kernelset/capi/lib -lkernelset
#include <stdlib.h>
#include "kernelset.h"
*/
import "C"

import (
	"fmt"
	"runtime"
	"unsafe"
)

// ABI version this package was built against.
const (
	ABIMajor = C.KS_ABI_VERSION_MAJOR
	ABIMinor = C.KS_ABI_VERSION_MINOR
)

// Status is a ks_status_t.
type Status int32

const (
	OK                   Status = C.KS_OK
	ErrInvalidArgument   Status = C.KS_ERR_INVALID_ARGUMENT
	ErrUnsupportedDtype  Status = C.KS_ERR_UNSUPPORTED_DTYPE
	ErrUnsupportedShape  Status = C.KS_ERR_UNSUPPORTED_SHAPE
	ErrUnsupportedLayout Status = C.KS_ERR_UNSUPPORTED_LAYOUT
	ErrUnsupportedDevice Status = C.KS_ERR_UNSUPPORTED_DEVICE
	ErrUnsupportedArch   Status = C.KS_ERR_UNSUPPORTED_ARCH
	ErrCUDA              Status = C.KS_ERR_CUDA
	ErrOutOfMemory       Status = C.KS_ERR_OUT_OF_MEMORY
	ErrNotImplemented    Status = C.KS_ERR_NOT_IMPLEMENTED
	ErrVersion           Status = C.KS_ERR_VERSION
	ErrInternal          Status = C.KS_ERR_INTERNAL
)

// String is the library's name of the status ("KS_ERR_INVALID_ARGUMENT").
func (s Status) String() string { return C.GoString(C.ks_status_name(C.ks_status_t(s))) }

// Error is a failed call: its status and message.
type Error struct {
	Status  Status
	Message string
}

func (e *Error) Error() string { return e.Status.String() + ": " + e.Message }

// call runs one C entry point and reads its message on the same OS thread: ks_last_error is per
// thread, and between two cgo calls the Go scheduler may move a goroutine to another thread (it
// would then read another call's message, or none).
func call(f func() C.ks_status_t) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	s := f()
	if s == C.KS_OK {
		return nil
	}
	return &Error{Status: Status(s), Message: C.GoString(C.ks_last_error())}
}

func invalid(format string, args ...interface{}) error {
	return &Error{Status: ErrInvalidArgument, Message: fmt.Sprintf(format, args...)}
}

// LastError is this OS thread's last message ("" after a successful call). Errors returned by
// this package already carry it; goroutines may move between threads, so prefer those.
func LastError() string { return C.GoString(C.ks_last_error()) }

// BuildInfo is "kernelset 0.1.0; abi 1.0; cuda: ...".
func BuildInfo() string { return C.GoString(C.ks_build_info()) }

// ABIVersion is the loaded library's ABI (major, minor).
func ABIVersion() (major, minor int32) {
	var ma, mi C.int32_t
	C.ks_abi_version(&ma, &mi)
	return int32(ma), int32(mi)
}

// Stream is a CUDA stream (CUstream); nil is the legacy default stream. CPU calls ignore it.
type Stream unsafe.Pointer

// apiPair is a function field of ks_api_t and the linked symbol it must hold (apiPairs, in generated.go).
type apiPair struct {
	name      string
	got, want unsafe.Pointer
}

// VerifyAPITable checks that ks_get_api's table of this major version is the linked library:
// its size, versions, and every function pointer equal to the symbol of the same name.
func VerifyAPITable() error {
	var t *C.ks_api_t
	if err := call(func() C.ks_status_t { return C.ks_get_api(ABIMajor, ABIMinor, &t) }); err != nil {
		return err
	}
	if uintptr(t.size) < unsafe.Sizeof(*t) || t.abi_major != ABIMajor || t.abi_minor < ABIMinor {
		return fmt.Errorf("ks_api_t: size %d, abi %d.%d; this package expects %d bytes of abi %d.%d",
			t.size, t.abi_major, t.abi_minor, unsafe.Sizeof(*t), ABIMajor, ABIMinor)
	}
	for _, p := range apiPairs(t) {
		if p.got == nil || p.got != p.want {
			return fmt.Errorf("ks_api_t.%s is %p, the linked ks_%s is %p", p.name, p.got, p.name, p.want)
		}
	}
	return nil
}

// GetAPI calls ks_get_api(major, minMinor) and returns the table's size and version.
func GetAPI(major, minMinor int32) (size uintptr, abiMajor, abiMinor int32, err error) {
	var t *C.ks_api_t
	if err := call(func() C.ks_status_t { return C.ks_get_api(C.int32_t(major), C.int32_t(minMinor), &t) }); err != nil {
		return 0, 0, 0, err
	}
	return uintptr(t.size), int32(t.abi_major), int32(t.abi_minor), nil
}

// QuerySupport says whether op can run on these tensors (only metadata is read) and options,
// without running it. tensors in the op's signature order, nil where an optional one is absent.
func QuerySupport(op Op, tensors []*Tensor, options Options) error {
	ptrs := make([]*C.DLTensor, len(tensors)+1) // C pointers in Go memory: allowed by cgo
	for i, t := range tensors {
		ptrs[i] = dl(t)
	}
	var o unsafe.Pointer
	if options != nil {
		o = options.cOptions()
	}
	err := call(func() C.ks_status_t {
		return C.ks_query_support(C.ks_op_t(op), (**C.DLTensor)(unsafe.Pointer(&ptrs[0])), C.int32_t(len(tensors)), o)
	})
	runtime.KeepAlive(tensors)
	return err
}

func dl(t *Tensor) *C.DLTensor {
	if t == nil {
		return nil
	}
	return t.dl
}

func stream(s Stream) C.ks_stream_t { return C.ks_stream_t(s) }
