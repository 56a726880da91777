package kernelset

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"strings"
	"testing"
	"unsafe"
)

func mustTensor(t *testing.T, dt DType, shape ...int64) *Tensor {
	t.Helper()
	x, err := NewTensor(dt, shape...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(x.Free)
	return x
}

func filled(t *testing.T, shape ...int64) *Tensor {
	x := mustTensor(t, Float32, shape...)
	for i := range x.Float32s() {
		x.Float32s()[i] = float32(math.Sin(float64(i) * 0.37))
	}
	return x
}

func expectErr(t *testing.T, err error, status Status, names string) *Error {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("expected a *kernelset.Error, got %v", err)
	}
	if e.Status != status {
		t.Fatalf("status %v, expected %v (%s)", e.Status, status, e.Message)
	}
	if !strings.Contains(e.Message, names) {
		t.Fatalf("message %q does not name %q", e.Message, names)
	}
	if !strings.HasPrefix(e.Error(), status.String()+": ") {
		t.Fatalf("Error() = %q", e.Error())
	}
	return e
}

func TestWrongDtypeIsUnsupportedDtype(t *testing.T) {
	err := Softmax(mustTensor(t, Int32, 4, 8), mustTensor(t, Float32, 4, 8), nil, nil)
	expectErr(t, err, ErrUnsupportedDtype, "x")
}

func TestMismatchedShapeIsInvalidArgument(t *testing.T) {
	err := RmsNorm(filled(t, 4, 16), nil, mustTensor(t, Float32, 4, 8), nil, nil)
	expectErr(t, err, ErrInvalidArgument, "out")
}

func TestBadOptionIsInvalidArgument(t *testing.T) {
	o, err := NewRmsNormOptions(OpRmsNorm)
	if err != nil {
		t.Fatal(err)
	}
	if o.Eps != 1e-6 || o.Offset != 0 || o.Cast != NormCastLlama {
		t.Fatalf("defaults %+v", *o)
	}
	o.Eps = -1
	expectErr(t, RmsNorm(filled(t, 2, 16), nil, mustTensor(t, Float32, 2, 16), o, nil), ErrInvalidArgument, "eps")
	_, err = NewGeluOptions(OpSwiglu) // swiglu takes no options
	expectErr(t, err, ErrInvalidArgument, "swiglu")
}

func TestOverlappingOutputIsUnsupportedLayout(t *testing.T) {
	buf := mustTensor(t, Float32, 16)
	out, err := buf.View([]int64{4, 16}, []int64{0, 1}, 0) // every row at one address
	if err != nil {
		t.Fatal(err)
	}
	defer out.Free()
	expectErr(t, RmsNorm(filled(t, 4, 16), nil, out, nil, nil), ErrUnsupportedLayout, "out")
}

func TestTwoDevicesIsUnsupportedDevice(t *testing.T) {
	// memory labelled CUDA is never dereferenced on the CPU: the device check comes first
	host := mustTensor(t, Float32, 2, 16)
	out := WrapPointer(unsafe.Pointer(&host.Bytes()[0]), Float32, []int64{2, 16}, nil, Device{CUDA: true})
	defer out.Free()
	expectErr(t, RmsNorm(filled(t, 2, 16), nil, out, nil, nil), ErrUnsupportedDevice, "out")
}

func TestVersions(t *testing.T) {
	_, _, _, err := GetAPI(ABIMajor+1, 0)
	var e *Error
	if !errors.As(err, &e) || e.Status != ErrVersion || e.Message == "" {
		t.Fatalf("GetAPI of the next major: %v", err)
	}
	size, ma, mi, err := GetAPI(ABIMajor, 0)
	if err != nil || size == 0 || ma != ABIMajor || mi < ABIMinor {
		t.Fatalf("GetAPI: %d %d.%d %v", size, ma, mi, err)
	}
	if ma, mi := ABIVersion(); ma != ABIMajor || mi != ABIMinor {
		t.Fatalf("ABIVersion %d.%d", ma, mi)
	}
	if info := BuildInfo(); !strings.HasPrefix(info, "kernelset ") || !strings.Contains(info, "abi 1.") {
		t.Fatalf("BuildInfo %q", info)
	}
	if ErrInvalidArgument.String() != "KS_ERR_INVALID_ARGUMENT" || OK.String() != "KS_OK" {
		t.Fatalf("status names %q %q", ErrInvalidArgument, OK)
	}
}

func TestAPITableIsTheLinkedLibrary(t *testing.T) {
	if err := VerifyAPITable(); err != nil {
		t.Fatal(err)
	}
}

func TestQuerySupport(t *testing.T) {
	x, y := mustTensor(t, Int64, 2, 4), mustTensor(t, Float32, 2, 4)
	expectErr(t, QuerySupport(OpSoftmax, []*Tensor{x, y}, nil), ErrUnsupportedDtype, "x")
	if err := QuerySupport(OpSoftmax, []*Tensor{x}, nil); err == nil {
		t.Fatal("one tensor for softmax was accepted")
	}
	if err := QuerySupport(OpSoftmax, []*Tensor{filled(t, 2, 4), y}, &SoftmaxOptions{Temperature: 2}); err != nil {
		t.Fatal(err)
	}
}

func TestViewsAreChecked(t *testing.T) {
	x := mustTensor(t, Float32, 10)
	if _, err := x.View([]int64{4, 4}, nil, 0); err == nil {
		t.Fatal("16 elements from 10")
	}
	if _, err := x.View([]int64{2, 4}, []int64{8, 1}, 0); err == nil {
		t.Fatal("row 1 ends at element 12")
	}
	if _, err := x.View([]int64{2}, []int64{-1}, 1); err == nil {
		t.Fatal("negative stride")
	}
	if _, err := TensorFromBytes(Float32, []int64{2}, nil, make([]byte, 7)); err == nil {
		t.Fatal("7 bytes for 2 float32")
	}
}

func TestMessagesArePerThreadAndCleared(t *testing.T) {
	runtime.LockOSThread() // ks_last_error is per OS thread
	defer runtime.UnlockOSThread()
	y := mustTensor(t, Float32, 2, 4)
	err := Softmax(mustTensor(t, Int32, 2, 4), y, nil, nil)
	var e *Error
	if !errors.As(err, &e) || LastError() != e.Message {
		t.Fatalf("LastError %q, error %v", LastError(), err)
	}
	// The other goroutine is locked to its own OS thread (two locked goroutines never share
	// one). That thread may be a pooled one holding an earlier test's message, so it first
	// clears its own with a successful call, then waits for this thread's failure.
	ready, failed, other := make(chan error), make(chan struct{}), make(chan string)
	ox, oy := filled(t, 2, 4), mustTensor(t, Float32, 2, 4) // made here: t.Fatal belongs to this goroutine
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		ready <- Softmax(ox, oy, nil, nil)
		<-failed
		other <- LastError()
	}()
	if err := <-ready; err != nil {
		t.Fatal(err)
	}
	if err := Softmax(mustTensor(t, Int32, 2, 4), y, nil, nil); err == nil || LastError() == "" {
		t.Fatalf("a second int32 softmax: %v, LastError %q", err, LastError())
	}
	close(failed)
	if m := <-other; m != "" {
		t.Fatalf("another thread sees %q", m)
	}
	if err := Softmax(filled(t, 2, 4), y, nil, nil); err != nil {
		t.Fatal(err)
	}
	if LastError() != "" {
		t.Fatalf("message after success: %q", LastError())
	}
	sum := float32(0)
	for _, v := range y.Float32s()[:4] {
		sum += v
	}
	if math.Abs(float64(sum-1)) > 1e-6 {
		t.Fatalf("softmax row sums to %v", sum)
	}
}

// Errors carry their own call's message whatever thread the goroutine ran on: goroutines that
// are not locked to a thread fail in two different ways, and succeed, concurrently.
func TestErrorsCarryTheirOwnMessageAcrossGoroutines(t *testing.T) {
	const workers, calls = 8, 3000
	type io struct{ i32, f32, good, small *Tensor }
	ins := make([]io, workers)
	for w := range ins { // made here: t.Fatal belongs to this goroutine
		ins[w] = io{mustTensor(t, Int32, 2, 4), mustTensor(t, Float32, 2, 4), filled(t, 2, 4), mustTensor(t, Float32, 2, 2)}
	}
	bad := make(chan string, workers)
	for w := 0; w < workers; w++ {
		go func(in io) {
			for i := 0; i < calls; i++ {
				var err error
				var want string
				switch i % 3 {
				case 0:
					err, want = Softmax(in.i32, in.f32, nil, nil), "x"
				case 1:
					err, want = Softmax(in.good, in.small, nil, nil), "out"
				default:
					if err = Softmax(in.good, in.f32, nil, nil); err != nil {
						bad <- "a valid softmax failed: " + err.Error()
						return
					}
					continue
				}
				var e *Error
				if !errors.As(err, &e) || !strings.HasPrefix(e.Message, want) {
					bad <- fmt.Sprintf("call %d expected a message about %q, got %v", i, want, err)
					return
				}
			}
			bad <- ""
		}(ins[w])
	}
	for w := 0; w < workers; w++ {
		if m := <-bad; m != "" {
			t.Fatal(m)
		}
	}
}

func TestFusedAddRmsNormInPlace(t *testing.T) {
	x, r1, r2, w := filled(t, 3, 32), filled(t, 3, 32), filled(t, 3, 32), filled(t, 32)
	xi, out := mustTensor(t, Float32, 3, 32), mustTensor(t, Float32, 3, 32)
	copy(xi.Float32s(), x.Float32s())
	if err := FusedAddRmsNorm(x, r1, w, out, nil, nil); err != nil {
		t.Fatal(err)
	}
	if err := FusedAddRmsNorm(xi, r2, w, xi, nil, nil); err != nil { // out aliases x
		t.Fatal(err)
	}
	for i := range out.Float32s() {
		if out.Float32s()[i] != xi.Float32s()[i] || r1.Float32s()[i] != r2.Float32s()[i] {
			t.Fatalf("element %d: in place %v, out of place %v", i, xi.Float32s()[i], out.Float32s()[i])
		}
	}
}
