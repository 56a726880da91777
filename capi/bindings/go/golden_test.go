package kernelset

import (
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"testing"
)

// golden.json (capi/golden/make_golden.py describes the format)
type goldenTensor struct {
	Name    string  `json:"name"`
	DType   *string `json:"dtype"`
	Shape   []int64 `json:"shape"`
	Strides []int64 `json:"strides"`
	Data    string  `json:"data"`
}

type goldenCase struct {
	Name           string                     `json:"name"`
	Op             string                     `json:"op"`
	ToleranceClass string                     `json:"tolerance_class"`
	Options        map[string]json.RawMessage `json:"options"`
	Scalars        map[string]int64           `json:"scalars"`
	Tensors        []goldenTensor             `json:"tensors"`
	Expected       map[string]string          `json:"expected"`
}

type goldenDoc struct {
	Ops        []string                      `json:"ops"`
	Tolerances map[string]map[string]float64 `json:"tolerances"`
	Cases      []goldenCase                  `json:"cases"`
}

func loadGolden(t *testing.T) goldenDoc {
	path := os.Getenv("KS_GOLDEN")
	if path == "" {
		path = filepath.Join("..", "..", "golden", "golden.json")
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var doc goldenDoc
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return doc
}

// opts reads a case's options, remembering the keys used: a field the test forgot fails the case.
type opts struct {
	m    map[string]json.RawMessage
	used map[string]bool
	err  error
}

func (o *opts) get(k string, v interface{}) {
	o.used[k] = true
	raw, ok := o.m[k]
	if !ok {
		o.err = fmt.Errorf("option %s missing", k)
		return
	}
	if err := json.Unmarshal(raw, v); err != nil {
		o.err = err
	}
}
func (o *opts) f32(k string) float32 { var v float64; o.get(k, &v); return float32(v) }
func (o *opts) f64(k string) float64 { var v float64; o.get(k, &v); return v }
func (o *opts) i32(k string) int32   { var v int32; o.get(k, &v); return v }
func (o *opts) i64(k string) int64   { var v int64; o.get(k, &v); return v }
func (o *opts) sec(k string) (s [3]int32) {
	var v []int32
	o.get(k, &v)
	if len(v) == 3 {
		copy(s[:], v)
	}
	return
}
func (o *opts) finish() error {
	if o.err != nil {
		return o.err
	}
	for k := range o.m {
		if !o.used[k] {
			return fmt.Errorf("option %s is not set by this test", k)
		}
	}
	return nil
}

func opOf(name string) (Op, bool) {
	for _, p := range OpNames {
		if p.Name == name {
			return p.Op, true
		}
	}
	return 0, false
}

// runCase calls QuerySupport then the op: through callGenerated (golden_calls_test.go, generated
// from the ABI's declaration), or here for the ops whose wrappers are written by hand.
func runCase(c goldenCase, ts map[string]*Tensor, order []*Tensor) error {
	op, ok := opOf(c.Op)
	if !ok {
		return fmt.Errorf("unknown op %s", c.Op)
	}
	t := func(n string) *Tensor { return ts[n] }
	if handled, err := callGenerated(op, c, t, order); handled {
		return err
	}
	s := Stream(nil)
	switch op {
	case OpCopyBlocks:
		if c.Options != nil {
			return fmt.Errorf("options for %s, which takes none", c.Op)
		}
		if err := QuerySupport(op, order, nil); err != nil {
			return fmt.Errorf("query_support: %w", err)
		}
		n := int(c.Scalars["num_layers"])
		var kc, vc []*Tensor
		for i := 0; i < n; i++ {
			kc = append(kc, t(fmt.Sprintf("k_caches.%d", i)))
			vc = append(vc, t(fmt.Sprintf("v_caches.%d", i)))
		}
		return CopyBlocks(kc, vc, t("block_mapping"), s)
	case OpPagedAttention:
		var at *AttentionOptions
		if c.Options != nil {
			var err error
			if at, err = readAttentionOptions(op, &opts{m: c.Options, used: map[string]bool{}}); err != nil {
				return err
			}
		}
		if err := QuerySupport(op, order, at); err != nil {
			return fmt.Errorf("query_support: %w", err)
		}
		ws, err := PagedAttentionWorkspaceSize(t("q"), t("k_cache"), c.Scalars["max_seq_len"])
		if err != nil {
			return err
		}
		if ws >= 1<<30 {
			return fmt.Errorf("workspace of %d bytes for a tiny problem", ws)
		}
		in := PagedInputs{Q: t("q"), KCache: t("k_cache"), VCache: t("v_cache"), BlockTable: t("block_table"),
			SeqLens: t("seq_lens"), CuSeqlensQ: t("cu_seqlens_q"), Sinks: t("sinks"), KScale: t("k_scale"),
			VScale: t("v_scale"), MaxSeqlenQ: c.Scalars["max_seqlen_q"], MaxSeqLen: c.Scalars["max_seq_len"]}
		return PagedAttention(in, t("out"), t("lse"), t("workspace"), at, s)
	}
	return fmt.Errorf("no call for %s", c.Op)
}

func f16ToF32(h uint16) float32 {
	sign := float32(1)
	if h&0x8000 != 0 {
		sign = -1
	}
	e, m := int(h>>10)&0x1f, float32(h&0x3ff)
	switch e {
	case 0:
		return sign * m * float32(math.Ldexp(1, -24))
	case 31:
		if m == 0 {
			return sign * float32(math.Inf(1))
		}
		return float32(math.NaN())
	}
	return sign * (1 + m/1024) * float32(math.Ldexp(1, e-15))
}

func fp8ToF32(b byte) float32 {
	sign := float32(1)
	if b&0x80 != 0 {
		sign = -1
	}
	e, m := int(b>>3)&0xf, float32(b&7)
	if e == 15 && b&7 == 7 {
		return float32(math.NaN())
	}
	if e == 0 {
		return sign * m * float32(math.Ldexp(1, -9))
	}
	return sign * (1 + m/8) * float32(math.Ldexp(1, e-7))
}

// readF32 is the tensor's logical elements (row-major, through its strides) as float32.
func readF32(t *Tensor) []float32 {
	shape, strides := t.Shape(), t.Strides()
	if len(strides) == 0 {
		strides = CompactStrides(shape)
	}
	n := int64(1)
	for _, d := range shape {
		n *= d
	}
	b, sz := t.Bytes(), t.DType().Size()
	idx := make([]int64, len(shape))
	out := make([]float32, 0, n)
	for i := int64(0); i < n; i++ {
		off := int64(0)
		for d := range idx {
			off += idx[d] * strides[d]
		}
		e := b[int(off)*sz : int(off)*sz+sz]
		var v float32
		switch t.DType() {
		case Float32:
			v = math.Float32frombits(binary.LittleEndian.Uint32(e))
		case Float16:
			v = f16ToF32(binary.LittleEndian.Uint16(e))
		case BFloat16:
			v = math.Float32frombits(uint32(binary.LittleEndian.Uint16(e)) << 16)
		case Float8E4M3:
			v = fp8ToF32(e[0])
		case Int32:
			v = float32(int32(binary.LittleEndian.Uint32(e)))
		case Int64:
			v = float32(int64(binary.LittleEndian.Uint64(e)))
		case Uint8:
			v = float32(e[0])
		}
		out = append(out, v)
		for d := len(idx) - 1; d >= 0; d-- {
			idx[d]++
			if idx[d] < shape[d] {
				break
			}
			idx[d] = 0
		}
	}
	return out
}

// compare: non-finite expected elements exactly, the rest within a relative norm error.
func compare(got, want []float32, tol float64) (float64, error) {
	if len(got) != len(want) {
		return 0, fmt.Errorf("%d elements, expected %d", len(got), len(want))
	}
	var num, den float64
	for i := range want {
		g, w := float64(got[i]), float64(want[i])
		if math.IsNaN(w) || math.IsInf(w, 0) {
			if !(math.IsNaN(w) && math.IsNaN(g)) && g != w {
				return 0, fmt.Errorf("element %d: %v, expected %v", i, g, w)
			}
			continue
		}
		if math.IsNaN(g) || math.IsInf(g, 0) {
			return 0, fmt.Errorf("element %d: %v, expected %v", i, g, w)
		}
		num += (g - w) * (g - w)
		den += w * w
	}
	err := math.Sqrt(num)
	if den > 0 {
		err /= math.Sqrt(den)
	}
	if err > tol {
		return err, fmt.Errorf("relative error %.3g > %g", err, tol)
	}
	return err, nil
}

func TestGoldenEveryOp(t *testing.T) {
	doc := loadGolden(t)
	var ours []string
	for _, p := range OpNames {
		ours = append(ours, p.Name)
	}
	if fmt.Sprint(ours) != fmt.Sprint(doc.Ops) {
		t.Fatalf("the package's ops %v differ from kernelset.h's %v", ours, doc.Ops)
	}
	passed := map[string]bool{}
	for _, c := range doc.Cases {
		ok := t.Run(c.Name, func(t *testing.T) {
			ts := map[string]*Tensor{}
			var order []*Tensor
			for _, g := range c.Tensors {
				if g.DType == nil {
					order = append(order, nil)
					continue
				}
				dt, ok := ParseDType(*g.DType)
				if !ok {
					t.Fatalf("%s: dtype %s", g.Name, *g.DType)
				}
				data, err := hex.DecodeString(g.Data)
				if err != nil {
					t.Fatal(err)
				}
				tt, err := TensorFromBytes(dt, g.Shape, g.Strides, data)
				if err != nil {
					t.Fatalf("%s: %v", g.Name, err)
				}
				defer tt.Free()
				ts[g.Name] = tt
				order = append(order, tt)
			}
			if err := runCase(c, ts, order); err != nil {
				t.Fatal(err)
			}
			names := make([]string, 0, len(c.Expected))
			for n := range c.Expected {
				names = append(names, n)
			}
			sort.Strings(names)
			for _, n := range names {
				raw, _ := hex.DecodeString(c.Expected[n])
				want := make([]float32, len(raw)/4)
				for i := range want {
					want[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
				}
				tol := doc.Tolerances[c.ToleranceClass][ts[n].DType().String()]
				if e, err := compare(readF32(ts[n]), want, tol); err != nil {
					t.Errorf("%s: %v", n, err)
				} else {
					t.Logf("%s: relative error %.2e (tolerance %g)", n, e, tol)
				}
			}
		})
		if ok {
			passed[c.Op] = true
		}
	}
	for _, op := range doc.Ops {
		if !passed[op] {
			t.Errorf("%s: no passing case", op)
		}
	}
	runtime.GC() // finalizers of any tensor a failed case left behind
}
