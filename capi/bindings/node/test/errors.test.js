'use strict';
// Failure classes through the Node package: status, name and a message naming the argument.
const test = require('node:test');
const assert = require('node:assert/strict');
const ks = require('..');

const f32 = (n, fill = (i) => Math.sin(i * 0.37)) => Float32Array.from({ length: n }, (_, i) => fill(i));

function throwsKs(fn, status, names) {
  assert.throws(fn, (e) => {
    assert.ok(e instanceof ks.KsError, `not a KsError: ${e}`);
    assert.equal(e.status, ks.STATUS[status], e.message);
    assert.equal(e.statusName, status);
    assert.ok(e.detail.includes(names), `message ${JSON.stringify(e.detail)} does not name ${names}`);
    assert.ok(e.message.startsWith(`${status}: `));
    return true;
  });
}

test('wrong dtype is KS_ERR_UNSUPPORTED_DTYPE', () => {
  throwsKs(() => ks.softmax(ks.tensor(new Int32Array(32), [4, 8]), ks.tensor(new Float32Array(32), [4, 8])),
    'KS_ERR_UNSUPPORTED_DTYPE', 'x');
});

test('mismatched shape is KS_ERR_INVALID_ARGUMENT', () => {
  throwsKs(() => ks.rmsNorm(ks.tensor(f32(64), [4, 16]), null, ks.tensor(new Float32Array(32), [4, 8])),
    'KS_ERR_INVALID_ARGUMENT', 'out');
});

test('bad option value is KS_ERR_INVALID_ARGUMENT; unknown option keys are refused', () => {
  const d = ks.defaultOptions('rms_norm');
  assert.equal(d.eps, Math.fround(1e-6));
  assert.equal(d.cast, ks.OPTION_VALUES.KS_NORM_CAST_LLAMA);
  assert.equal(ks.defaultOptions('paged_attention').causal, 1);
  assert.equal(ks.defaultOptions('flash_attention').causal, 0);
  const x = ks.tensor(f32(32), [2, 16]);
  const y = ks.tensor(new Float32Array(32), [2, 16]);
  throwsKs(() => ks.rmsNorm(x, null, y, { eps: -1 }), 'KS_ERR_INVALID_ARGUMENT', 'eps');
  throwsKs(() => ks.rmsNorm(x, null, y, { epsilon: 1e-5 }), 'KS_ERR_INVALID_ARGUMENT', 'epsilon');
  throwsKs(() => ks.defaultOptions('swiglu'), 'KS_ERR_INVALID_ARGUMENT', 'swiglu');
});

test('overlapping output rows are KS_ERR_UNSUPPORTED_LAYOUT', () => {
  const out = ks.tensor(new Float32Array(16), [4, 16], { strides: [0, 1] });
  throwsKs(() => ks.rmsNorm(ks.tensor(f32(64), [4, 16]), null, out), 'KS_ERR_UNSUPPORTED_LAYOUT', 'out');
});

test('tensors on two devices are KS_ERR_UNSUPPORTED_DEVICE', () => {
  // memory labelled CUDA is never dereferenced on the CPU: the device check comes first
  const out = ks.tensor(new Float32Array(32), [2, 16], { device: 'cuda' });
  throwsKs(() => ks.rmsNorm(ks.tensor(f32(32), [2, 16]), null, out), 'KS_ERR_UNSUPPORTED_DEVICE', 'out');
});

test('versions, names and the table', () => {
  throwsKs(() => ks.getApi(ks.ABI_MAJOR + 1, 0), 'KS_ERR_VERSION', '');
  const t = ks.getApi(ks.ABI_MAJOR, 0);
  assert.equal(t.abiMajor, ks.ABI_MAJOR);
  assert.ok(t.abiMinor >= ks.ABI_MINOR && t.size > 0);
  assert.deepEqual(ks.abiVersion(), { major: ks.ABI_MAJOR, minor: ks.ABI_MINOR });
  assert.match(ks.buildInfo(), /^kernelset .*abi 1\./);
  for (const [name, code] of Object.entries(ks.STATUS)) assert.equal(ks.statusName(code), name);
});

test('query_support refuses without running', () => {
  const y = ks.tensor(new Float32Array(8), [2, 4]);
  throwsKs(() => ks.querySupport('softmax', [ks.tensor(new BigInt64Array(8), [2, 4]), y]), 'KS_ERR_UNSUPPORTED_DTYPE',
    'x');
  assert.throws(() => ks.querySupport('softmax', [y]), ks.KsError);
  ks.querySupport('softmax', [ks.tensor(f32(8), [2, 4]), y], { temperature: 2 });
});

test('views outside their array are refused before the call', () => {
  const a = new Float32Array(10);
  throwsKs(() => ks.tensor(a, [4, 4]), 'KS_ERR_INVALID_ARGUMENT', 'needs 64 bytes');
  throwsKs(() => ks.tensor(a, [2, 4], { strides: [8, 1] }), 'KS_ERR_INVALID_ARGUMENT', 'needs 48 bytes');
  throwsKs(() => ks.tensor(new Uint16Array(4), [4]), 'KS_ERR_INVALID_ARGUMENT', 'dtype');
  throwsKs(() => ks.tensor(new Uint8Array(new ArrayBuffer(16), 1, 8), [2], { dtype: 'float32' }),
    'KS_ERR_INVALID_ARGUMENT', 'byte offset');
});

test('a successful call clears the message', () => {
  const y = new Float32Array(8);
  assert.throws(() => ks.softmax(ks.tensor(new Int32Array(8), [2, 4]), ks.tensor(y, [2, 4])));
  assert.notEqual(ks.lastError(), '');
  ks.softmax(ks.tensor(f32(8), [2, 4]), ks.tensor(y, [2, 4]));
  assert.equal(ks.lastError(), '');
  assert.ok(Math.abs(y[0] + y[1] + y[2] + y[3] - 1) < 1e-6);
});

test('fused_add_rms_norm in place equals out of place', () => {
  const x = f32(96);
  const r0 = f32(96, (i) => Math.cos(i * 0.11));
  const w = ks.tensor(f32(32, (i) => 0.5 + i / 64), [32]);
  const r1 = r0.slice();
  const r2 = r0.slice();
  const out = new Float32Array(96);
  const xi = x.slice();
  ks.fusedAddRmsNorm(ks.tensor(x, [3, 32]), ks.tensor(r1, [3, 32]), w, ks.tensor(out, [3, 32]));
  const xt = ks.tensor(xi, [3, 32]);
  ks.fusedAddRmsNorm(xt, ks.tensor(r2, [3, 32]), w, xt);
  assert.deepEqual(xi, out);
  assert.deepEqual(r1, r2);
});
