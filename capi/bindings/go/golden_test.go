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

// runCase calls QuerySupport then the op.
func runCase(c goldenCase, ts map[string]*Tensor, order []*Tensor) error {
	op, ok := opOf(c.Op)
	if !ok {
		return fmt.Errorf("unknown op %s", c.Op)
	}
	var options Options
	o := &opts{m: c.Options, used: map[string]bool{}}
	var (
		rms  *RmsNormOptions
		ln   *LayerNormOptions
		gl   *GeluOptions
		oai  *SwigluOaiOptions
		sm   *SoftmaxOptions
		ce   *CrossEntropyOptions
		rope *RopeOptions
		mr   *MropeOptions
		qk   *QkNormRopeOptions
		at   *AttentionOptions
		ml   *MlaOptions
		err  error
	)
	if c.Options != nil {
		switch op {
		case OpRmsNorm, OpFusedAddRmsNorm:
			if rms, err = NewRmsNormOptions(op); err == nil {
				rms.Eps, rms.Offset, rms.Cast = o.f32("eps"), o.f32("offset"), o.i32("cast")
				options = rms
			}
		case OpLayerNorm:
			if ln, err = NewLayerNormOptions(op); err == nil {
				ln.Eps = o.f32("eps")
				options = ln
			}
		case OpGelu, OpGeluAndMul:
			if gl, err = NewGeluOptions(op); err == nil {
				gl.Approximate = o.i32("approximate")
				options = gl
			}
		case OpSwigluOai:
			if oai, err = NewSwigluOaiOptions(op); err == nil {
				oai.Alpha, oai.Limit = o.f32("alpha"), o.f32("limit")
				options = oai
			}
		case OpSoftmax, OpLogSoftmax:
			if sm, err = NewSoftmaxOptions(op); err == nil {
				sm.Temperature = o.f32("temperature")
				options = sm
			}
		case OpCrossEntropy:
			if ce, err = NewCrossEntropyOptions(op); err == nil {
				ce.IgnoreIndex, ce.Reduction = o.i64("ignore_index"), o.i32("reduction")
				ce.LabelSmoothing, ce.ZLoss, ce.Softcap = o.f32("label_smoothing"), o.f32("z_loss"), o.f32("softcap")
				options = ce
			}
		case OpRotaryEmbedding:
			if rope, err = NewRopeOptions(op); err == nil {
				rope.Interleaved, rope.RotaryDim, rope.HeadSize = o.i32("interleaved"), o.i32("rotary_dim"), o.i32("head_size")
				options = rope
			}
		case OpMrope:
			if mr, err = NewMropeOptions(op); err == nil {
				mr.Interleaved, mr.RotaryDim, mr.HeadSize = o.i32("interleaved"), o.i32("rotary_dim"), o.i32("head_size")
				mr.MropeSection, mr.MropeInterleaved = o.sec("mrope_section"), o.i32("mrope_interleaved")
				options = mr
			}
		case OpQkNormRope:
			if qk, err = NewQkNormRopeOptions(op); err == nil {
				qk.Eps, qk.Offset, qk.Cast = o.f32("eps"), o.f32("offset"), o.i32("cast")
				qk.Interleaved, qk.RotaryDim, qk.HeadSize = o.i32("interleaved"), o.i32("rotary_dim"), o.i32("head_size")
				qk.MropeSection, qk.MropeInterleaved = o.sec("mrope_section"), o.i32("mrope_interleaved")
				options = qk
			}
		case OpPagedAttention, OpFlashAttention, OpFlashAttentionVarlen:
			if at, err = NewAttentionOptions(op); err == nil {
				at.Scale, at.Causal, at.Softcap = o.f32("scale"), o.i32("causal"), o.f32("softcap")
				at.WindowLeft, at.WindowRight = o.i32("window_left"), o.i32("window_right")
				options = at
			}
		case OpMlaDecode:
			if ml, err = NewMlaOptions(op); err == nil {
				ml.Scale, ml.KvLoraRank, ml.RopeDim = o.f64("scale"), o.i32("kv_lora_rank"), o.i32("rope_dim")
				options = ml
			}
		default:
			return fmt.Errorf("options for %s, which takes none", c.Op)
		}
		if err != nil {
			return err
		}
		if err := o.finish(); err != nil {
			return err
		}
	}
	if err := QuerySupport(op, order, options); err != nil {
		return fmt.Errorf("query_support: %w", err)
	}
	t := func(n string) *Tensor { return ts[n] }
	s := Stream(nil)
	switch op {
	case OpRmsNorm:
		return RmsNorm(t("x"), t("weight"), t("out"), rms, s)
	case OpFusedAddRmsNorm:
		return FusedAddRmsNorm(t("x"), t("residual"), t("weight"), t("out"), rms, s)
	case OpLayerNorm:
		return LayerNorm(t("x"), t("weight"), t("bias"), t("out"), ln, s)
	case OpSiluAndMul:
		return SiluAndMul(t("x"), t("out"), s)
	case OpGeluAndMul:
		return GeluAndMul(t("x"), t("out"), gl, s)
	case OpSwiglu:
		return Swiglu(t("gate"), t("up"), t("out"), s)
	case OpGelu:
		return Gelu(t("x"), t("out"), gl, s)
	case OpSwigluOai:
		return SwigluOai(t("x"), t("out"), oai, s)
	case OpSoftmax:
		return Softmax(t("x"), t("out"), sm, s)
	case OpLogSoftmax:
		return LogSoftmax(t("x"), t("out"), sm, s)
	case OpCrossEntropy:
		return CrossEntropy(t("logits"), t("target"), t("loss"), ce, s)
	case OpEmbedding:
		return Embedding(t("ids"), t("weight"), t("out"), s)
	case OpRotaryEmbedding:
		return RotaryEmbedding(t("positions"), t("q"), t("k"), t("cos_sin_cache"), rope, s)
	case OpMrope:
		return Mrope(t("positions"), t("q"), t("k"), t("cos_sin_cache"), mr, s)
	case OpQkNormRope:
		return QkNormRope(t("q"), t("k"), t("q_weight"), t("k_weight"), t("cos_sin_cache"), t("positions"), qk, s)
	case OpReshapeAndCache:
		return ReshapeAndCache(t("key"), t("value"), t("k_cache"), t("v_cache"), t("slot_mapping"), t("k_scale"),
			t("v_scale"), s)
	case OpCopyBlocks:
		n := int(c.Scalars["num_layers"])
		var kc, vc []*Tensor
		for i := 0; i < n; i++ {
			kc = append(kc, t(fmt.Sprintf("k_caches.%d", i)))
			vc = append(vc, t(fmt.Sprintf("v_caches.%d", i)))
		}
		return CopyBlocks(kc, vc, t("block_mapping"), s)
	case OpPagedAttention:
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
	case OpMergeAttnStates:
		return MergeAttnStates(t("out_a"), t("lse_a"), t("out_b"), t("lse_b"), t("out"), t("lse"), s)
	case OpFlashAttention:
		return FlashAttention(t("q"), t("k"), t("v"), t("sinks"), t("out"), t("lse"), at, s)
	case OpFlashAttentionVarlen:
		return FlashAttentionVarlen(t("q"), t("k"), t("v"), t("cu_seqlens_q"), t("cu_seqlens_k"),
			c.Scalars["max_seqlen_q"], c.Scalars["max_seqlen_k"], t("sinks"), t("out"), t("lse"), at, s)
	case OpMlaDecode:
		return MlaDecode(t("q_nope"), t("q_pe"), t("kv_cache"), t("block_table"), t("seq_lens"),
			c.Scalars["max_seq_len"], t("kv_scale"), t("out"), t("lse"), ml, s)
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
