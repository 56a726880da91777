//! Every op of kernelset.h through the safe layer on CPU, against the Python references'
//! outputs in capi/golden/golden.json (see capi/golden/make_golden.py for the format). Each op's
//! call is generated from the ABI's declaration (calls.rs); the ops whose wrappers are written by
//! hand are called here.
mod calls;
#[path = "../common/mod.rs"]
mod common;

use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap};

use common::{args_of, compare, f32s_of_hex, golden, read_f32, Arg, Json};
use kernelset::*;

/// Reads a case's options on top of the library's defaults, remembering which keys were used so
/// a field this test forgot to set fails the case instead of silently keeping its default.
pub struct Opts<'a> {
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

enum View<'a> {
    Ref(Tensor<'a>),
    Mut(TensorMut<'a>),
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

/// A case's tensors by name: inputs as `Tensor`s, the tensors it writes as `TensorMut`s (each taken
/// once by the call), and its integer arguments.
pub struct Args<'a> {
    order: Vec<(String, bool)>, // (name, present) in signature order
    refs: HashMap<String, Tensor<'a>>,
    muts: RefCell<HashMap<String, TensorMut<'a>>>,
    case: &'a Json,
}

impl<'a> Args<'a> {
    /// ks_query_support on every tensor in signature order (must accept).
    pub fn query<O: OpOptions>(&self, op: Op, options: Option<&O>) -> Result<()> {
        let muts = self.muts.borrow();
        let list: Vec<Option<&dyn AsDLTensor>> = self
            .order
            .iter()
            .map(|(n, present)| {
                if !present {
                    return None;
                }
                match self.refs.get(n) {
                    Some(t) => Some(t as &dyn AsDLTensor),
                    None => Some(&muts[n] as &dyn AsDLTensor),
                }
            })
            .collect();
        query_support(op, &list, options)
    }
    pub fn r(&self, n: &str) -> &Tensor<'a> {
        self.refs.get(n).unwrap_or_else(|| panic!("input {n}"))
    }
    pub fn ro(&self, n: &str) -> Option<&Tensor<'a>> {
        self.refs.get(n)
    }
    pub fn m(&self, n: &str) -> TensorMut<'a> {
        self.muts.borrow_mut().remove(n).unwrap_or_else(|| panic!("output {n}"))
    }
    pub fn mo(&self, n: &str) -> Option<TensorMut<'a>> {
        self.muts.borrow_mut().remove(n)
    }
    pub fn sc(&self, n: &str) -> i64 {
        self.case["scalars"][n].as_i64()
    }
}

/// Runs one case's op: query_support first (must accept), then the call.
fn run(op: Op, case: &Json, args: &mut [Arg]) -> Result<()> {
    let written: BTreeSet<String> = case["expected"].as_object().keys().cloned().collect();
    let order = args.iter().map(|a| (a.name.clone(), a.dtype.is_some())).collect();
    let (mut refs, mut muts) = (HashMap::new(), HashMap::new());
    for a in args.iter_mut() {
        let name = a.name.clone();
        match view(a, written.contains(&name))? {
            Some(View::Ref(t)) => {
                refs.insert(name, t);
            }
            Some(View::Mut(t)) => {
                muts.insert(name, t);
            }
            None => {}
        }
    }
    let a = Args { order, refs, muts: RefCell::new(muts), case };
    let opts = if case["options"].is_null() {
        None
    } else {
        Some(Opts { json: &case["options"], used: RefCell::new(BTreeSet::new()) })
    };
    let r = match calls::call(op, &a, opts.as_ref()) {
        Some(r) => r,
        None => by_hand(op, &a, opts.as_ref()),
    };
    if let Some(o) = &opts {
        let unused = o.unused();
        assert!(unused.is_empty(), "{}: options this test does not set: {unused:?}", case["name"].as_str());
    }
    r
}

/// The ops whose wrappers are written by hand (ops.rs).
fn by_hand(op: Op, a: &Args, o: Option<&Opts>) -> Result<()> {
    let s = Stream::DEFAULT;
    match op {
        Op::CopyBlocks => {
            assert!(o.is_none(), "copy_blocks takes no options");
            a.query::<NoOptions>(op, None)?;
            let layers = a.sc("num_layers") as usize;
            let mut kc: Vec<TensorMut> = (0..layers).map(|i| a.m(&format!("k_caches.{i}"))).collect();
            let mut vc: Vec<TensorMut> = (0..layers).map(|i| a.m(&format!("v_caches.{i}"))).collect();
            copy_blocks(&mut kc, &mut vc, a.r("block_mapping"), s)
        }
        Op::PagedAttention => {
            let mut v = AttentionOptions::defaults(op)?;
            if let Some(o) = o {
                (v.scale, v.causal, v.softcap) = (o.f("scale"), o.i("causal"), o.f("softcap"));
                (v.window_left, v.window_right) = (o.i("window_left"), o.i("window_right"));
            }
            let options = o.map(|_| v);
            a.query(op, options.as_ref())?;
            let bytes = paged_attention_workspace_size(a.r("q"), a.r("k_cache"), a.sc("max_seq_len"))?;
            assert!(bytes < (1 << 30), "workspace of {bytes} bytes for a tiny problem");
            let extras = PagedExtras {
                cu_seqlens_q: a.ro("cu_seqlens_q"),
                sinks: a.ro("sinks"),
                k_scale: a.ro("k_scale"),
                v_scale: a.ro("v_scale"),
            };
            let mut lse = a.mo("lse");
            paged_attention(
                a.r("q"),
                a.r("k_cache"),
                a.r("v_cache"),
                a.r("block_table"),
                a.r("seq_lens"),
                &extras,
                a.sc("max_seqlen_q"),
                a.sc("max_seq_len"),
                &mut a.m("out"),
                lse.as_mut(),
                None,
                options.as_ref(),
                s,
            )
        }
        _ => panic!("{}: neither generated nor called by hand", op.name()),
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
