//! Every op of kernelset.h through the safe layer on CPU, against the Python references'
//! outputs in capi/golden/golden.json (see capi/golden/make_golden.py for the format).
mod common;

use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap};

use common::{args_of, compare, f32s_of_hex, golden, read_f32, Arg, Json};
use kernelset::*;

/// Reads a case's options on top of the library's defaults, remembering which keys were used so
/// a field this test forgot to set fails the case instead of silently keeping its default.
struct Opts<'a> {
    json: &'a Json,
    used: RefCell<BTreeSet<String>>,
}

impl<'a> Opts<'a> {
    fn f(&self, k: &str) -> f32 {
        self.used.borrow_mut().insert(k.into());
        self.json[k].as_f64() as f32
    }
    fn f64(&self, k: &str) -> f64 {
        self.used.borrow_mut().insert(k.into());
        self.json[k].as_f64()
    }
    fn i(&self, k: &str) -> i32 {
        self.used.borrow_mut().insert(k.into());
        self.json[k].as_i64() as i32
    }
    fn i64(&self, k: &str) -> i64 {
        self.used.borrow_mut().insert(k.into());
        self.json[k].as_i64()
    }
    fn i3(&self, k: &str) -> [i32; 3] {
        self.used.borrow_mut().insert(k.into());
        let a = self.json[k].as_array();
        [a[0].as_i64() as i32, a[1].as_i64() as i32, a[2].as_i64() as i32]
    }
    fn unused(&self) -> Vec<String> {
        let used = self.used.borrow();
        self.json.as_object().keys().filter(|k| !used.contains(*k)).cloned().collect()
    }
}

#[derive(Clone, Copy)]
enum AnyOptions {
    None,
    Rms(RmsNormOptions),
    Ln(LayerNormOptions),
    Gelu(GeluOptions),
    Oai(SwigluOaiOptions),
    Softmax(SoftmaxOptions),
    Ce(CrossEntropyOptions),
    Rope(RopeOptions),
    Mrope(MropeOptions),
    Qk(QkNormRopeOptions),
    Attn(AttentionOptions),
    Mla(MlaOptions),
}

fn options_of(op: Op, json: &Json) -> Result<(AnyOptions, Vec<String>)> {
    if json.is_null() {
        return Ok((AnyOptions::None, vec![]));
    }
    let o = Opts { json, used: RefCell::new(BTreeSet::new()) };
    let any = match op {
        Op::RmsNorm | Op::FusedAddRmsNorm => {
            let mut v = RmsNormOptions::defaults(op)?;
            (v.eps, v.offset, v.cast) = (o.f("eps"), o.f("offset"), o.i("cast"));
            AnyOptions::Rms(v)
        }
        Op::LayerNorm => {
            let mut v = LayerNormOptions::defaults(op)?;
            v.eps = o.f("eps");
            AnyOptions::Ln(v)
        }
        Op::GeluAndMul | Op::Gelu => {
            let mut v = GeluOptions::defaults(op)?;
            v.approximate = o.i("approximate");
            AnyOptions::Gelu(v)
        }
        Op::SwigluOai => {
            let mut v = SwigluOaiOptions::defaults(op)?;
            (v.alpha, v.limit) = (o.f("alpha"), o.f("limit"));
            AnyOptions::Oai(v)
        }
        Op::Softmax | Op::LogSoftmax => {
            let mut v = SoftmaxOptions::defaults(op)?;
            v.temperature = o.f("temperature");
            AnyOptions::Softmax(v)
        }
        Op::CrossEntropy => {
            let mut v = CrossEntropyOptions::defaults(op)?;
            v.ignore_index = o.i64("ignore_index");
            (v.label_smoothing, v.z_loss, v.softcap) = (o.f("label_smoothing"), o.f("z_loss"), o.f("softcap"));
            v.reduction = o.i("reduction");
            AnyOptions::Ce(v)
        }
        Op::RotaryEmbedding => {
            let mut v = RopeOptions::defaults(op)?;
            (v.interleaved, v.rotary_dim, v.head_size) = (o.i("interleaved"), o.i("rotary_dim"), o.i("head_size"));
            AnyOptions::Rope(v)
        }
        Op::Mrope => {
            let mut v = MropeOptions::defaults(op)?;
            (v.interleaved, v.rotary_dim, v.head_size) = (o.i("interleaved"), o.i("rotary_dim"), o.i("head_size"));
            (v.mrope_section, v.mrope_interleaved) = (o.i3("mrope_section"), o.i("mrope_interleaved"));
            AnyOptions::Mrope(v)
        }
        Op::QkNormRope => {
            let mut v = QkNormRopeOptions::defaults(op)?;
            (v.eps, v.offset, v.cast) = (o.f("eps"), o.f("offset"), o.i("cast"));
            (v.interleaved, v.rotary_dim, v.head_size) = (o.i("interleaved"), o.i("rotary_dim"), o.i("head_size"));
            (v.mrope_section, v.mrope_interleaved) = (o.i3("mrope_section"), o.i("mrope_interleaved"));
            AnyOptions::Qk(v)
        }
        Op::PagedAttention | Op::FlashAttention | Op::FlashAttentionVarlen => {
            let mut v = AttentionOptions::defaults(op)?;
            (v.scale, v.causal, v.softcap) = (o.f("scale"), o.i("causal"), o.f("softcap"));
            (v.window_left, v.window_right) = (o.i("window_left"), o.i("window_right"));
            AnyOptions::Attn(v)
        }
        Op::MlaDecode => {
            let mut v = MlaOptions::defaults(op)?;
            (v.scale, v.kv_lora_rank, v.rope_dim) = (o.f64("scale"), o.i("kv_lora_rank"), o.i("rope_dim"));
            AnyOptions::Mla(v)
        }
        _ => panic!("{}: options given to an op without options", op.name()),
    };
    Ok((any, o.unused()))
}

fn query(op: Op, tensors: &[Option<&dyn AsDLTensor>], o: &AnyOptions) -> Result<()> {
    match o {
        AnyOptions::None => query_support::<NoOptions>(op, tensors, None),
        AnyOptions::Rms(v) => query_support(op, tensors, Some(v)),
        AnyOptions::Ln(v) => query_support(op, tensors, Some(v)),
        AnyOptions::Gelu(v) => query_support(op, tensors, Some(v)),
        AnyOptions::Oai(v) => query_support(op, tensors, Some(v)),
        AnyOptions::Softmax(v) => query_support(op, tensors, Some(v)),
        AnyOptions::Ce(v) => query_support(op, tensors, Some(v)),
        AnyOptions::Rope(v) => query_support(op, tensors, Some(v)),
        AnyOptions::Mrope(v) => query_support(op, tensors, Some(v)),
        AnyOptions::Qk(v) => query_support(op, tensors, Some(v)),
        AnyOptions::Attn(v) => query_support(op, tensors, Some(v)),
        AnyOptions::Mla(v) => query_support(op, tensors, Some(v)),
    }
}

macro_rules! opt {
    ($o:expr, $variant:ident) => {
        match &$o {
            AnyOptions::$variant(v) => Some(v),
            _ => None,
        }
    };
}

enum View<'a> {
    Ref(Tensor<'a>),
    Mut(TensorMut<'a>),
}

impl View<'_> {
    fn as_dl(&self) -> &dyn AsDLTensor {
        match self {
            View::Ref(t) => t,
            View::Mut(t) => t,
        }
    }
}

fn view<'a>(a: &'a mut Arg, written: bool) -> Result<Option<View<'a>>> {
    let Some(dt) = a.dtype else { return Ok(None) };
    let (shape, strides) = (a.shape.clone(), a.strides.clone());
    Ok(Some(if written {
        let b = a.buf.bytes_mut();
        View::Mut(match strides {
            Some(s) => TensorMut::with_strides(b, dt, &shape, &s)?,
            None => TensorMut::new_as(b, dt, &shape)?,
        })
    } else {
        let b = a.buf.bytes();
        View::Ref(match strides {
            Some(s) => Tensor::with_strides(b, dt, &shape, &s)?,
            None => Tensor::new_as(b, dt, &shape)?,
        })
    }))
}

/// Runs one case's op: query_support first (must accept), then the call.
fn run(op: Op, case: &Json, args: &mut [Arg]) -> Result<()> {
    let written: BTreeSet<String> = case["expected"].as_object().keys().cloned().collect();
    let (options, unused) = options_of(op, &case["options"])?;
    assert!(unused.is_empty(), "{}: options this test does not set: {unused:?}", case["name"].as_str());
    let mut views: Vec<(String, Option<View>)> = Vec::new();
    for a in args.iter_mut() {
        let w = written.contains(&a.name);
        let name = a.name.clone();
        views.push((name, view(a, w)?));
    }
    let list: Vec<Option<&dyn AsDLTensor>> = views.iter().map(|(_, v)| v.as_ref().map(|v| v.as_dl())).collect();
    query(op, &list, &options)?;
    drop(list);

    let mut refs: HashMap<String, Tensor> = HashMap::new();
    let mut muts: HashMap<String, TensorMut> = HashMap::new();
    for (n, v) in views {
        match v {
            Some(View::Ref(t)) => {
                refs.insert(n, t);
            }
            Some(View::Mut(t)) => {
                muts.insert(n, t);
            }
            None => {}
        }
    }
    let r = |n: &str| refs.get(n).unwrap_or_else(|| panic!("input {n}"));
    let ro = |n: &str| refs.get(n);
    let muts = RefCell::new(muts);
    let m = |n: &str| muts.borrow_mut().remove(n).unwrap_or_else(|| panic!("output {n}"));
    let mo = |n: &str| muts.borrow_mut().remove(n);
    let sc = |n: &str| case["scalars"][n].as_i64();
    let s = Stream::DEFAULT;
    match op {
        Op::RmsNorm => rms_norm(r("x"), ro("weight"), &mut m("out"), opt!(options, Rms), s),
        Op::FusedAddRmsNorm => {
            fused_add_rms_norm(r("x"), &mut m("residual"), ro("weight"), &mut m("out"), opt!(options, Rms), s)
        }
        Op::LayerNorm => layer_norm(r("x"), ro("weight"), ro("bias"), &mut m("out"), opt!(options, Ln), s),
        Op::SiluAndMul => silu_and_mul(r("x"), &mut m("out"), s),
        Op::GeluAndMul => gelu_and_mul(r("x"), &mut m("out"), opt!(options, Gelu), s),
        Op::Swiglu => swiglu(r("gate"), r("up"), &mut m("out"), s),
        Op::Gelu => gelu(r("x"), &mut m("out"), opt!(options, Gelu), s),
        Op::SwigluOai => swiglu_oai(r("x"), &mut m("out"), opt!(options, Oai), s),
        Op::Softmax => softmax(r("x"), &mut m("out"), opt!(options, Softmax), s),
        Op::LogSoftmax => log_softmax(r("x"), &mut m("out"), opt!(options, Softmax), s),
        Op::CrossEntropy => cross_entropy(r("logits"), r("target"), &mut m("loss"), opt!(options, Ce), s),
        Op::Embedding => embedding(r("ids"), r("weight"), &mut m("out"), s),
        Op::RotaryEmbedding => {
            let mut k = mo("k");
            rotary_embedding(r("positions"), &mut m("q"), k.as_mut(), r("cos_sin_cache"), opt!(options, Rope), s)
        }
        Op::Mrope => {
            let mut k = mo("k");
            mrope(r("positions"), &mut m("q"), k.as_mut(), r("cos_sin_cache"), opt!(options, Mrope), s)
        }
        Op::QkNormRope => {
            let mut k = mo("k");
            qk_norm_rope(
                &mut m("q"),
                k.as_mut(),
                r("q_weight"),
                ro("k_weight"),
                r("cos_sin_cache"),
                r("positions"),
                opt!(options, Qk),
                s,
            )
        }
        Op::ReshapeAndCache => reshape_and_cache(
            r("key"),
            r("value"),
            &mut m("k_cache"),
            &mut m("v_cache"),
            r("slot_mapping"),
            ro("k_scale"),
            ro("v_scale"),
            s,
        ),
        Op::CopyBlocks => {
            let layers = sc("num_layers") as usize;
            let mut kc: Vec<TensorMut> = (0..layers).map(|i| m(&format!("k_caches.{i}"))).collect();
            let mut vc: Vec<TensorMut> = (0..layers).map(|i| m(&format!("v_caches.{i}"))).collect();
            copy_blocks(&mut kc, &mut vc, r("block_mapping"), s)
        }
        Op::PagedAttention => {
            let bytes = paged_attention_workspace_size(r("q"), r("k_cache"), sc("max_seq_len"))?;
            assert!(bytes < (1 << 30), "workspace of {bytes} bytes for a tiny problem");
            let extras = PagedExtras {
                cu_seqlens_q: ro("cu_seqlens_q"),
                sinks: ro("sinks"),
                k_scale: ro("k_scale"),
                v_scale: ro("v_scale"),
            };
            let mut lse = mo("lse");
            paged_attention(
                r("q"),
                r("k_cache"),
                r("v_cache"),
                r("block_table"),
                r("seq_lens"),
                &extras,
                sc("max_seqlen_q"),
                sc("max_seq_len"),
                &mut m("out"),
                lse.as_mut(),
                None,
                opt!(options, Attn),
                s,
            )
        }
        Op::MergeAttnStates => {
            let mut lse = mo("lse");
            merge_attn_states(r("out_a"), r("lse_a"), r("out_b"), r("lse_b"), &mut m("out"), lse.as_mut(), s)
        }
        Op::FlashAttention => {
            let mut lse = mo("lse");
            flash_attention(r("q"), r("k"), r("v"), ro("sinks"), &mut m("out"), lse.as_mut(), opt!(options, Attn), s)
        }
        Op::FlashAttentionVarlen => {
            let mut lse = mo("lse");
            flash_attention_varlen(
                r("q"),
                r("k"),
                r("v"),
                r("cu_seqlens_q"),
                r("cu_seqlens_k"),
                sc("max_seqlen_q"),
                sc("max_seqlen_k"),
                ro("sinks"),
                &mut m("out"),
                lse.as_mut(),
                opt!(options, Attn),
                s,
            )
        }
        Op::MlaDecode => {
            let mut lse = mo("lse");
            mla_decode(
                r("q_nope"),
                r("q_pe"),
                r("kv_cache"),
                r("block_table"),
                r("seq_lens"),
                sc("max_seq_len"),
                ro("kv_scale"),
                &mut m("out"),
                lse.as_mut(),
                opt!(options, Mla),
                s,
            )
        }
    }
}

#[test]
fn every_op_matches_the_python_reference() {
    let doc = golden();
    let header_ops: Vec<&str> = doc["ops"].as_array().iter().map(|v| v.as_str()).collect();
    let ours: Vec<&str> = Op::ALL.iter().map(|o| o.name()).collect();
    assert_eq!(ours, header_ops, "the binding's ops differ from kernelset.h's");
    let mut failures = Vec::new();
    let mut passed: BTreeSet<&str> = BTreeSet::new();
    for case in doc["cases"].as_array() {
        let name = case["name"].as_str();
        let op = Op::from_name(case["op"].as_str()).expect("op");
        let mut args = args_of(case);
        if let Err(e) = run(op, case, &mut args) {
            failures.push(format!("{name}: {e}"));
            continue;
        }
        let mut ok = true;
        for (out, want_hex) in case["expected"].as_object() {
            let arg = args.iter().find(|a| &a.name == out).expect("expected tensor");
            let dtype =
                case["tensors"].as_array().iter().find(|t| t["name"].as_str() == out).unwrap()["dtype"].as_str();
            let tol = doc["tolerances"][case["tolerance_class"].as_str()][dtype].as_f64();
            match compare(&read_f32(arg), &f32s_of_hex(want_hex.as_str()), tol) {
                Ok(err) => eprintln!("{name}: {out}: relative error {err:.2e} (tolerance {tol:e})"),
                Err(e) => {
                    failures.push(format!("{name}: {out}: {e}"));
                    ok = false;
                }
            }
        }
        if ok {
            passed.insert(case["op"].as_str());
        }
    }
    assert!(failures.is_empty(), "{} golden failures:\n{}", failures.len(), failures.join("\n"));
    assert_eq!(passed.len(), header_ops.len(), "ops without a passing case");
}
