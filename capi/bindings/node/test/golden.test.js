'use strict';
// Every op of kernelset.h through the Node package on CPU, against the Python references'
// outputs in capi/golden/golden.json (capi/golden/make_golden.py describes the format).
const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const ks = require('..');

const GOLDEN = process.env.KS_GOLDEN || path.join(__dirname, '..', '..', '..', 'golden', 'golden.json');
const doc = JSON.parse(fs.readFileSync(GOLDEN, 'utf8'));

const ARRAYS = {
  float32: Float32Array, float16: Uint16Array, bfloat16: Uint16Array, float8_e4m3fn: Uint8Array,
  int32: Int32Array, int64: BigInt64Array, uint8: Uint8Array,
};

function makeTensor(g) {
  const bytes = Buffer.from(g.data, 'hex');
  const Arr = ARRAYS[g.dtype];
  const storage = new ArrayBuffer(Math.max(8, Math.ceil(bytes.length / 8) * 8)); // 8-byte aligned
  new Uint8Array(storage).set(bytes);
  return ks.tensor(new Arr(storage, 0, bytes.length / Arr.BYTES_PER_ELEMENT), g.shape,
    { dtype: g.dtype, strides: g.strides });
}

function f16(h) {
  const s = h & 0x8000 ? -1 : 1;
  const e = (h >> 10) & 0x1f;
  const m = h & 0x3ff;
  if (e === 0) return s * m * 2 ** -24;
  if (e === 31) return m ? NaN : s * Infinity;
  return s * (1 + m / 1024) * 2 ** (e - 15);
}

function fp8(b) {
  const s = b & 0x80 ? -1 : 1;
  const e = (b >> 3) & 0xf;
  const m = b & 7;
  if (e === 15 && m === 7) return NaN;
  return e === 0 ? s * m * 2 ** -9 : s * (1 + m / 8) * 2 ** (e - 7);
}

const bf16 = (() => {
  const u = new Uint32Array(1);
  const f = new Float32Array(u.buffer);
  return (h) => { u[0] = h << 16; return f[0]; };
})();

/** Logical elements (row-major, through the strides) as numbers. */
function readValues(t) {
  const strides = t.strides || ks.compactStrides(t.shape);
  const n = t.shape.reduce((a, b) => a * b, 1);
  const idx = new Array(t.shape.length).fill(0);
  const out = new Array(n);
  const decode = { float16: f16, bfloat16: bf16, float8_e4m3fn: fp8 }[t.dtype] || ((v) => Number(v));
  for (let i = 0; i < n; i++) {
    let off = 0;
    for (let d = 0; d < idx.length; d++) off += idx[d] * strides[d];
    out[i] = decode(t.data[off]);
    for (let d = idx.length - 1; d >= 0; d--) {
      if (++idx[d] < t.shape[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

function expected(hex) {
  const b = Buffer.from(hex, 'hex');
  const a = new Float32Array(b.length / 4);
  for (let i = 0; i < a.length; i++) a[i] = b.readFloatLE(4 * i);
  return a;
}

/** golden.json's rule: non-finite expected values exactly, the rest within a relative norm error. */
function compare(got, want, tol) {
  assert.equal(got.length, want.length, 'element count');
  let num = 0;
  let den = 0;
  for (let i = 0; i < want.length; i++) {
    const g = got[i];
    const w = want[i];
    if (!Number.isFinite(w)) {
      assert.ok((Number.isNaN(w) && Number.isNaN(g)) || g === w, `element ${i}: ${g}, expected ${w}`);
      continue;
    }
    assert.ok(Number.isFinite(g), `element ${i}: ${g}, expected ${w}`);
    num += (g - w) ** 2;
    den += w * w;
  }
  const err = Math.sqrt(num) / (den > 0 ? Math.sqrt(den) : 1);
  assert.ok(err <= tol, `relative error ${err.toExponential(3)} > ${tol}`);
  return err;
}

// BEGIN GENERATED: calls (capi/abi/generate.py, from capi/abi/ksabi/ops.py; do not edit)
const GENERATED_CALLS = {
  rms_norm: (t, o, sc) => ks.rmsNorm(t.x, t.weight, t.out, o),
  fused_add_rms_norm: (t, o, sc) => ks.fusedAddRmsNorm(t.x, t.residual, t.weight, t.out, o),
  layer_norm: (t, o, sc) => ks.layerNorm(t.x, t.weight, t.bias, t.out, o),
  silu_and_mul: (t, o, sc) => ks.siluAndMul(t.x, t.out),
  gelu_and_mul: (t, o, sc) => ks.geluAndMul(t.x, t.out, o),
  swiglu: (t, o, sc) => ks.swiglu(t.gate, t.up, t.out),
  gelu: (t, o, sc) => ks.gelu(t.x, t.out, o),
  swiglu_oai: (t, o, sc) => ks.swigluOai(t.x, t.out, o),
  softmax: (t, o, sc) => ks.softmax(t.x, t.out, o),
  log_softmax: (t, o, sc) => ks.logSoftmax(t.x, t.out, o),
  cross_entropy: (t, o, sc) => ks.crossEntropy(t.logits, t.target, t.loss, o),
  embedding: (t, o, sc) => ks.embedding(t.ids, t.weight, t.out),
  rotary_embedding: (t, o, sc) => ks.rotaryEmbedding(t.positions, t.q, t.k, t.cos_sin_cache, o),
  mrope: (t, o, sc) => ks.mrope(t.positions, t.q, t.k, t.cos_sin_cache, o),
  qk_norm_rope: (t, o, sc) => ks.qkNormRope(t.q, t.k, t.q_weight, t.k_weight, t.cos_sin_cache, t.positions, o),
  reshape_and_cache: (t, o, sc) => ks.reshapeAndCache(t.key, t.value, t.k_cache, t.v_cache, t.slot_mapping, t.k_scale,
    t.v_scale),
  paged_attention: (t, o, sc) => ks.pagedAttention(t.q, t.k_cache, t.v_cache, t.block_table, t.seq_lens, t.cu_seqlens_q,
    sc.max_seqlen_q, sc.max_seq_len, t.sinks, t.k_scale, t.v_scale, t.out, t.lse, t.workspace, o),
  merge_attn_states: (t, o, sc) => ks.mergeAttnStates(t.out_a, t.lse_a, t.out_b, t.lse_b, t.out, t.lse),
  flash_attention: (t, o, sc) => ks.flashAttention(t.q, t.k, t.v, t.sinks, t.out, t.lse, o),
  flash_attention_varlen: (t, o, sc) => ks.flashAttentionVarlen(t.q, t.k, t.v, t.cu_seqlens_q, t.cu_seqlens_k,
    sc.max_seqlen_q, sc.max_seqlen_k, t.sinks, t.out, t.lse, o),
  mla_decode: (t, o, sc) => ks.mlaDecode(t.q_nope, t.q_pe, t.kv_cache, t.block_table, t.seq_lens, sc.max_seq_len,
    t.kv_scale, t.out, t.lse, o),
};
// END GENERATED: calls

/** query_support (must accept), then the op: through GENERATED_CALLS, or here for the ops whose wrappers
 * are written by hand. */
function call(c, t, list) {
  const o = c.options;
  const sc = c.scalars;
  ks.querySupport(c.op, list, o);
  if (c.op in GENERATED_CALLS) return GENERATED_CALLS[c.op](t, o, sc);
  switch (c.op) {
    case 'copy_blocks': {
      const n = sc.num_layers;
      const layers = (kind) => Array.from({ length: n }, (_, i) => t[`${kind}.${i}`]);
      return ks.copyBlocks(layers('k_caches'), layers('v_caches'), t.block_mapping);
    }
    default: throw new Error(`no call for ${c.op}`);
  }
}

test('the paged attention workspace is sized for every paged case', () => {
  for (const c of doc.cases.filter((x) => x.op === 'paged_attention')) {
    const g = (n) => c.tensors.find((x) => x.name === n);
    const ws = ks.pagedAttentionWorkspaceSize(makeTensor(g('q')), makeTensor(g('k_cache')), c.scalars.max_seq_len);
    assert.ok(ws >= 0 && ws < 2 ** 30, `${c.name}: workspace of ${ws} bytes for a tiny problem`);
  }
});

test('the package has every op of kernelset.h', () => {
  assert.deepEqual(Object.keys(ks.OP_IDS), doc.ops);
  assert.deepEqual(new Set(doc.cases.map((c) => c.op)), new Set(doc.ops));
});

for (const c of doc.cases) {
  test(`golden ${c.name}`, () => {
    const t = {};
    const list = [];
    for (const g of c.tensors) {
      const x = g.dtype === null ? null : makeTensor(g);
      t[g.name] = x;
      list.push(x);
    }
    call(c, t, list);
    for (const [name, hex] of Object.entries(c.expected)) {
      const tol = doc.tolerances[c.tolerance_class][t[name].dtype];
      try {
        compare(readValues(t[name]), expected(hex), tol);
      } catch (e) {
        e.message = `${name}: ${e.message}`;
        throw e;
      }
    }
  });
}
