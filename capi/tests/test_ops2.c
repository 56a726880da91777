/* test_ops2.c: C tests of the RoPE, KV-cache and attention ops of libkernelset.so on the CPU.
 *
 * Small handwritten cases whose expected values are worked out by hand (rotations by 0 and 90
 * degrees, fp8 bytes of exact values, softmax weights of scores 0, 1, 2), plus the status and
 * message of each failure class, and ks_query_support agreeing with the call.
 *
 *   gcc -std=c99 -Wall -Wextra -Werror -Icapi/include capi/tests/test_ops2.c \
 *       -Lsrc/kernelset/capi/lib -lkernelset -Wl,-rpath,$PWD/src/kernelset/capi/lib -lm -o /tmp/test_ops2
 *   /tmp/test_ops2        # prints each failure, exits 1 if any
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "kernelset.h"

static int failures = 0, checks = 0;

#define CHECK(cond, ...)                         \
  do {                                           \
    checks++;                                    \
    if (!(cond)) {                               \
      failures++;                                \
      printf("FAIL %s:%d: ", __FILE__, __LINE__); \
      printf(__VA_ARGS__);                       \
      printf("\n");                              \
    }                                            \
  } while (0)

/* status s and a message that contains `arg` */
#define CHECK_STATUS(s, want, arg)                                                                        \
  CHECK((s) == (want) && strstr(ks_last_error(), (arg)) != NULL, "status %s (want %s), message '%s' (want '%s')", \
        ks_status_name(s), ks_status_name(want), ks_last_error(), (arg))

static void check_close(const float *got, const float *want, int n, float tol, const char *what, int line) {
  for (int i = 0; i < n; i++) {
    checks++;
    const int both_inf = isinf(got[i]) && isinf(want[i]) && (got[i] > 0) == (want[i] > 0);
    if (!both_inf && !(fabsf(got[i] - want[i]) <= tol)) {
      failures++;
      printf("FAIL %s:%d: %s[%d] = %.7g, want %.7g\n", __FILE__, line, what, i, (double)got[i], (double)want[i]);
    }
  }
}
#define CLOSE(got, want, n, tol) check_close((got), (want), (n), (tol), #got, __LINE__)

/* ---- tensors */

typedef struct {
  DLTensor t;
  int64_t shape[4];
  int64_t strides[4];
} tens;

enum { F32, F16, BF16, FP8, I32, I64, U8 };

static DLDataType dtype_of(int k) {
  DLDataType d = {kDLFloat, 32, 1};
  switch (k) {
    case F16: d.bits = 16; break;
    case BF16: d.code = kDLBfloat; d.bits = 16; break;
    case FP8: d.code = kDLFloat8_e4m3fn; d.bits = 8; break;
    case I32: d.code = kDLInt; break;
    case I64: d.code = kDLInt; d.bits = 64; break;
    case U8: d.code = kDLUInt; d.bits = 8; break;
    default: break;
  }
  return d;
}

/* compact row-major tensor over data */
static tens mk(void *data, int kind, int ndim, int64_t d0, int64_t d1, int64_t d2, int64_t d3) {
  tens x;
  memset(&x, 0, sizeof x);
  const int64_t dims[4] = {d0, d1, d2, d3};
  int64_t st = 1;
  for (int d = ndim - 1; d >= 0; d--) {
    x.shape[d] = dims[d];
    x.strides[d] = st;
    st *= dims[d];
  }
  x.t.data = data;
  x.t.device.device_type = kDLCPU;
  x.t.ndim = ndim;
  x.t.dtype = dtype_of(kind);
  x.t.shape = x.shape;
  x.t.strides = x.strides;
  return x;
}
/* the same tensor with the descriptor's pointers fixed up after a copy */
static DLTensor *T(tens *x) {
  x->t.shape = x->shape;
  x->t.strides = x->strides;
  return &x->t;
}

static void fill(float *x, int n, float v) {
  for (int i = 0; i < n; i++) x[i] = v;
}

/* ---- RoPE */

static void test_rotary(void) {
  /* one token, one head of 4, rotary_dim 4; cache row 1 rotates frequency 0 by 90 degrees
   * (cos 0, sin 1) and frequency 1 by 0 (cos 1, sin 0): row = [cos0, cos1, sin0, sin1] */
  float cache[2 * 4] = {1, 1, 0, 0, 0, 1, 1, 0};
  tens tc = mk(cache, F32, 2, 2, 4, 0, 0);
  int64_t pos[2] = {1, 1};
  tens tp = mk(pos, I64, 1, 1, 0, 0, 0);
  ks_rope_options o;
  ks_status_t s = ks_options_init(KS_OP_ROTARY_EMBEDDING, &o, sizeof o);
  CHECK(s == KS_OK && o.interleaved == 0 && o.rotary_dim == 0 && o.head_size == 0, "rope defaults");

  /* NeoX pairs (x0, x2), (x1, x3): (1, 3) -> (1*0 - 3*1, 3*0 + 1*1) = (-3, 1); (2, 4) stays */
  float q[4] = {1, 2, 3, 4};
  tens tq = mk(q, F32, 3, 1, 1, 4, 0);
  s = ks_rotary_embedding(T(&tp), T(&tq), NULL, T(&tc), &o, NULL);
  const float neox[4] = {-3, 2, 1, 4};
  CHECK(s == KS_OK, "rotary: %s", ks_last_error());
  CLOSE(q, neox, 4, 1e-6f);

  /* GPT-J pairs (x0, x1), (x2, x3): (1, 2) -> (-2, 1); (3, 4) stays; k as [T, H * D] */
  float q2[4] = {1, 2, 3, 4}, k2[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  tens tq2 = mk(q2, F32, 3, 1, 1, 4, 0), tk2 = mk(k2, F32, 2, 1, 8, 0, 0);
  o.interleaved = 1;
  s = ks_rotary_embedding(T(&tp), T(&tq2), T(&tk2), T(&tc), &o, NULL);
  const float gptj[4] = {-2, 1, 3, 4}, gptj_k[8] = {-2, 1, 3, 4, -6, 5, 7, 8};
  CHECK(s == KS_OK, "rotary interleaved: %s", ks_last_error());
  CLOSE(q2, gptj, 4, 1e-6f);
  CLOSE(k2, gptj_k, 8, 1e-6f);
  o.interleaved = 0;

  /* partial rotary: head of 6, rotary_dim 4 (the tail stays); a position outside the cache
   * leaves its token unrotated (the Python package's semantics); bf16 storage */
  uint16_t qb[2 * 6] = {0x3F80, 0x4000, 0x4040, 0x4080, 0x40A0, 0x40C0,  /* 1 2 3 4 5 6 */
                        0x3F80, 0x4000, 0x4040, 0x4080, 0x40A0, 0x40C0};
  int32_t pos2[2] = {1, 7};
  tens tqb = mk(qb, BF16, 2, 2, 6, 0, 0), tp2 = mk(pos2, I32, 1, 2, 0, 0, 0);
  o.head_size = 6;
  s = ks_rotary_embedding(T(&tp2), T(&tqb), NULL, T(&tc), &o, NULL);
  const uint16_t want_b[12] = {0xC040, 0x4000, 0x3F80, 0x4080, 0x40A0, 0x40C0,  /* -3 2 1 4 5 6 */
                               0x3F80, 0x4000, 0x4040, 0x4080, 0x40A0, 0x40C0};
  CHECK(s == KS_OK && memcmp(qb, want_b, sizeof qb) == 0, "rotary bf16 partial: %s %04x %04x %04x", ks_last_error(),
        qb[0], qb[1], qb[2]);

  /* strided q: [T, H, D] with a token stride of 8 (a view into a wider buffer): the padding stays */
  float buf[2 * 8];
  for (int i = 0; i < 16; i++) buf[i] = (float)(i % 8 + 1);
  tens tv = mk(buf, F32, 3, 2, 1, 4, 0);
  tv.strides[0] = 8;
  int64_t pos3[2] = {1, 0};
  tens tp3 = mk(pos3, I64, 1, 2, 0, 0, 0);
  o.head_size = 0;
  s = ks_rotary_embedding(T(&tp3), T(&tv), NULL, T(&tc), &o, NULL);
  const float want_v[16] = {-3, 2, 1, 4, 5, 6, 7, 8, 1, 2, 3, 4, 5, 6, 7, 8};
  CHECK(s == KS_OK, "rotary strided: %s", ks_last_error());
  CLOSE(buf, want_v, 16, 1e-6f);

  /* failures: each names its argument */
  float qx[4] = {1, 2, 3, 4};
  tens tqx = mk(qx, F32, 2, 1, 4, 0, 0);
  s = ks_rotary_embedding(T(&tp), T(&tqx), NULL, T(&tc), &o, NULL); /* 2-D q without head_size */
  CHECK_STATUS(s, KS_ERR_INVALID_ARGUMENT, "head_size");
  s = ks_rotary_embedding(T(&tp), NULL, NULL, T(&tc), &o, NULL);
  CHECK_STATUS(s, KS_ERR_INVALID_ARGUMENT, "q:");
  tens tpf = mk(cache, F32, 1, 1, 0, 0, 0); /* float positions */
  s = ks_rotary_embedding(T(&tpf), T(&tq), NULL, T(&tc), &o, NULL);
  CHECK_STATUS(s, KS_ERR_UNSUPPORTED_DTYPE, "positions");
  tens tp5 = mk(pos, I64, 1, 2, 0, 0, 0); /* 2 positions for 1 token */
  s = ks_rotary_embedding(T(&tp5), T(&tq), NULL, T(&tc), &o, NULL);
  CHECK_STATUS(s, KS_ERR_INVALID_ARGUMENT, "positions");
  o.rotary_dim = 2;
  s = ks_rotary_embedding(T(&tp), T(&tq), NULL, T(&tc), &o, NULL);
  CHECK_STATUS(s, KS_ERR_INVALID_ARGUMENT, "rotary_dim");
  o.rotary_dim = 0;
  tens tc3 = mk(cache, F32, 2, 1, 3, 0, 0); /* odd rotary_dim */
  s = ks_rotary_embedding(T(&tp), T(&tq), NULL, T(&tc3), &o, NULL);
  CHECK_STATUS(s, KS_ERR_INVALID_ARGUMENT, "cos_sin_cache");
  tens tk16 = mk(qb, BF16, 3, 1, 1, 4, 0); /* k of another dtype than q */
  s = ks_rotary_embedding(T(&tp), T(&tq), T(&tk16), T(&tc), &o, NULL);
  CHECK_STATUS(s, KS_ERR_UNSUPPORTED_DTYPE, "k:");
  tens tcd = mk(cache, F32, 2, 2, 4, 0, 0);
  tcd.t.device.device_type = kDLCUDA; /* mixed devices */
  s = ks_rotary_embedding(T(&tp), T(&tq), NULL, T(&tcd), &o, NULL);
  CHECK_STATUS(s, KS_ERR_UNSUPPORTED_DEVICE, "cos_sin_cache");
  ks_rope_options big;
  memset(&big, 0, sizeof big);
  big.size = sizeof big + 8; /* a struct from a newer header */
  s = ks_rotary_embedding(T(&tp), T(&tq), NULL, T(&tc), &big, NULL);
  CHECK_STATUS(s, KS_ERR_INVALID_ARGUMENT, "options");
}

static void test_mrope(void) {
  /* rotary_dim 6 (3 frequencies); cache rows: 0 identity, 1 rotates every frequency by 90
   * degrees: row = [cos0 cos1 cos2 sin0 sin1 sin2] */
  float cache[2 * 6] = {1, 1, 1, 0, 0, 0, 0, 0, 0, 1, 1, 1};
  tens tc = mk(cache, F32, 2, 2, 6, 0, 0);
  /* positions [3, T=1]: temporal 1, height 0, width 0 */
  int64_t pos[3] = {1, 0, 0};
  tens tp = mk(pos, I64, 2, 3, 1, 0, 0);
  ks_mrope_options o;
  ks_options_init(KS_OP_MROPE, &o, sizeof o);
  o.mrope_section[0] = 2;
  o.mrope_section[1] = 1;
  o.mrope_section[2] = 0;
  /* bands: frequencies 0, 1 temporal (rotated), 2 height (not): NeoX pairs (x0, x3) (x1, x4) (x2, x5) */
  float q[6] = {1, 2, 3, 4, 5, 6};
  tens tq = mk(q, F32, 3, 1, 1, 6, 0);
  ks_status_t s = ks_mrope(T(&tp), T(&tq), NULL, T(&tc), &o, NULL);
  const float bands[6] = {-4, -5, 3, 1, 2, 6};
  CHECK(s == KS_OK, "mrope: %s", ks_last_error());
  CLOSE(q, bands, 6, 1e-6f);
  /* interleaved (Qwen3-VL): frequency 1 is height (1 % 3 == 1, 1 < 3 * 1), 0 and 2 temporal */
  float q2[6] = {1, 2, 3, 4, 5, 6};
  tens tq2 = mk(q2, F32, 3, 1, 1, 6, 0);
  o.mrope_interleaved = 1;
  s = ks_mrope(T(&tp), T(&tq2), NULL, T(&tc), &o, NULL);
  const float inter[6] = {-4, 2, -6, 1, 5, 3};
  CHECK(s == KS_OK, "mrope interleaved: %s", ks_last_error());
  CLOSE(q2, inter, 6, 1e-6f);
  o.mrope_section[2] = 1; /* sums to 4 != 3 */
  s = ks_mrope(T(&tp), T(&tq2), NULL, T(&tc), &o, NULL);
  CHECK_STATUS(s, KS_ERR_INVALID_ARGUMENT, "mrope_section");
}

static void test_qk_norm_rope(void) {
  float cache[4] = {0, 1, 1, 0}; /* frequency 0 by 90 degrees, frequency 1 by 0 */
  tens tc = mk(cache, F32, 2, 1, 4, 0, 0);
  int32_t pos[1] = {0};
  tens tp = mk(pos, I32, 1, 1, 0, 0, 0);
  /* x = [1, 1, 1, 1]: mean(x^2) = 1, rstd = 1 / sqrt(1 + eps); w = [1, 2, 1, 1]:
   * y = [1, 2, 1, 1] rstd, then (y0, y2) -> (-y2, y0), (y1, y3) stay */
  float q[4] = {1, 1, 1, 1}, k[4] = {2, 2, 2, 2};
  float w[4] = {1, 2, 1, 1}, kw[4] = {0, 0, 0, 0};
  tens tq = mk(q, F32, 3, 1, 1, 4, 0), tk = mk(k, F32, 3, 1, 1, 4, 0);
  tens tw = mk(w, F32, 1, 4, 0, 0, 0), tkw = mk(kw, F32, 1, 4, 0, 0, 0);
  ks_qk_norm_rope_options o;
  ks_options_init(KS_OP_QK_NORM_ROPE, &o, sizeof o);
  o.offset = 1.0f; /* Gemma's (1 + w): k's weights 0 scale by 1 */
  o.cast = KS_NORM_CAST_GEMMA;
  ks_status_t s = ks_qk_norm_rope(T(&tq), T(&tk), T(&tw), T(&tkw), T(&tc), T(&tp), &o, NULL);
  const float r = 1.0f / sqrtf(1.0f + 1e-6f);
  const float want_q[4] = {-2 * r, 3 * r, 2 * r, 2 * r}, want_k[4] = {-r, r, r, r};
  CHECK(s == KS_OK, "qk_norm_rope: %s", ks_last_error());
  CLOSE(q, want_q, 4, 1e-6f);
  CLOSE(k, want_k, 4, 1e-6f);
  s = ks_qk_norm_rope(T(&tq), NULL, T(&tw), T(&tkw), T(&tc), T(&tp), &o, NULL); /* k_weight without k */
  CHECK_STATUS(s, KS_ERR_INVALID_ARGUMENT, "k_weight");
  o.eps = 0.0f;
  s = ks_qk_norm_rope(T(&tq), T(&tk), T(&tw), T(&tkw), T(&tc), T(&tp), &o, NULL);
  CHECK_STATUS(s, KS_ERR_INVALID_ARGUMENT, "eps");
  o.eps = 1e-6f;
  o.cast = 7;
  s = ks_qk_norm_rope(T(&tq), T(&tk), T(&tw), T(&tkw), T(&tc), T(&tp), &o, NULL);
  CHECK_STATUS(s, KS_ERR_INVALID_ARGUMENT, "cast");
}

/* ---- KV cache */

static void test_reshape_and_cache(void) {
  /* caches [2 blocks, 2 slots, 1 head, 2]: token 0 -> slot 3 (block 1, offset 1), token 1
   * skipped (-1), token 2 -> slot 0 */
  float key[3 * 2] = {1, 2, 3, 4, 5, 6}, value[3 * 2] = {-1, -2, -3, -4, -5, -6};
  float kc[8], vc[8];
  fill(kc, 8, 9);
  fill(vc, 8, 9);
  int64_t slots[3] = {3, -1, 0};
  tens tk = mk(key, F32, 3, 3, 1, 2, 0), tv = mk(value, F32, 3, 3, 1, 2, 0);
  tens tkc = mk(kc, F32, 4, 2, 2, 1, 2), tvc = mk(vc, F32, 4, 2, 2, 1, 2);
  tens ts = mk(slots, I64, 1, 3, 0, 0, 0);
  ks_status_t s = ks_reshape_and_cache(T(&tk), T(&tv), T(&tkc), T(&tvc), T(&ts), NULL, NULL, NULL);
  const float want_k[8] = {5, 6, 9, 9, 9, 9, 1, 2}, want_v[8] = {-5, -6, 9, 9, 9, 9, -1, -2};
  CHECK(s == KS_OK, "reshape_and_cache: %s", ks_last_error());
  CLOSE(kc, want_k, 8, 0.0f);
  CLOSE(vc, want_v, 8, 0.0f);

  /* a slot past the cache: refused, naming slot_mapping and the token, and nothing written */
  int64_t bad[3] = {0, 4, 1};
  tens tb = mk(bad, I64, 1, 3, 0, 0, 0);
  fill(kc, 8, 9);
  s = ks_reshape_and_cache(T(&tk), T(&tv), T(&tkc), T(&tvc), T(&tb), NULL, NULL, NULL);
  CHECK_STATUS(s, KS_ERR_INVALID_ARGUMENT, "slot_mapping");
  CHECK(strstr(ks_last_error(), "index 1") != NULL, "message names the token: %s", ks_last_error());
  CHECK(kc[0] == 9.0f, "nothing written before the bad slot was found");

  /* fp8 e4m3fn cache, scale 2: 1 / 2 = 0.5 -> 0x30, 500 / 2 = 250 rounds to 256 -> 0x78,
   * -1000 / 2 saturates to -448 -> 0xFE, 0 -> 0x00 */
  float k8[4] = {1, 500, -1000, 0};
  uint8_t c8[4] = {0x11, 0x11, 0x11, 0x11}, cv8[4] = {0x11, 0x11, 0x11, 0x11};
  float scale = 2.0f, vscale = 1.0f;
  int32_t slot8[2] = {1, 0};
  tens tk8 = mk(k8, F32, 3, 2, 1, 2, 0), tc8 = mk(c8, FP8, 4, 1, 2, 1, 2), tcv8 = mk(cv8, FP8, 4, 1, 2, 1, 2);
  tens tsc = mk(&scale, F32, 0, 0, 0, 0, 0), tvsc = mk(&vscale, F32, 1, 1, 0, 0, 0), ts8 = mk(slot8, I32, 1, 2, 0, 0, 0);
  s = ks_reshape_and_cache(T(&tk8), T(&tk8), T(&tc8), T(&tcv8), T(&ts8), T(&tsc), T(&tvsc), NULL);
  const uint8_t want8[4] = {0xFE, 0x00, 0x30, 0x78};  /* slot 0 <- token 1, slot 1 <- token 0 */
  const uint8_t wantv8[4] = {0xFE, 0x00, 0x38, 0x7E}; /* scale 1: 1 -> 0x38, 500 -> 448 = 0x7E */
  CHECK(s == KS_OK && memcmp(c8, want8, 4) == 0 && memcmp(cv8, wantv8, 4) == 0,
        "fp8 cache: %s [%02x %02x %02x %02x] [%02x %02x %02x %02x]", ks_last_error(), c8[0], c8[1], c8[2], c8[3],
        cv8[0], cv8[1], cv8[2], cv8[3]);
  s = ks_reshape_and_cache(T(&tk8), T(&tk8), T(&tc8), T(&tcv8), T(&ts8), NULL, T(&tvsc), NULL);
  CHECK_STATUS(s, KS_ERR_INVALID_ARGUMENT, "k_scale");
  s = ks_reshape_and_cache(T(&tk), T(&tv), T(&tkc), T(&tvc), T(&ts), T(&tsc), NULL, NULL);
  CHECK_STATUS(s, KS_ERR_INVALID_ARGUMENT, "k_scale"); /* a scale for a non-fp8 cache */

  /* a key whose last dim is strided: refused as a layout */
  tens tks = mk(key, F32, 3, 1, 1, 2, 0);
  tks.strides[2] = 2;
  int64_t one[1] = {0};
  tens t1 = mk(one, I64, 1, 1, 0, 0, 0);
  s = ks_reshape_and_cache(T(&tks), T(&tks), T(&tkc), T(&tvc), T(&t1), NULL, NULL, NULL);
  CHECK_STATUS(s, KS_ERR_UNSUPPORTED_LAYOUT, "key:");
  tens tk16 = mk(key, F16, 3, 3, 1, 2, 0); /* fp16 key into an fp32 cache */
  s = ks_reshape_and_cache(T(&tk16), T(&tk16), T(&tkc), T(&tvc), T(&ts), NULL, NULL, NULL);
  CHECK_STATUS(s, KS_ERR_UNSUPPORTED_DTYPE, "k_cache");
}

static void test_copy_blocks(void) {
  /* two layers of 4 blocks of [1 slot, 1 head, 2]; block i of layer l holds (10 l + i, -(10 l + i)) */
  float k0[8], v0[8], k1[8], v1[8];
  for (int i = 0; i < 4; i++) {
    k0[2 * i] = (float)i, k0[2 * i + 1] = (float)-i;
    v0[2 * i] = (float)(100 + i), v0[2 * i + 1] = 0;
    k1[2 * i] = (float)(10 + i), k1[2 * i + 1] = (float)-(10 + i);
    v1[2 * i] = (float)(110 + i), v1[2 * i + 1] = 0;
  }
  tens tk0 = mk(k0, F32, 4, 4, 1, 1, 2), tv0 = mk(v0, F32, 4, 4, 1, 1, 2);
  tens tk1 = mk(k1, F32, 4, 4, 1, 1, 2), tv1 = mk(v1, F32, 4, 4, 1, 1, 2);
  DLTensor *ks[2] = {T(&tk0), T(&tk1)}, *vs[2] = {T(&tv0), T(&tv1)};
  int64_t map[4] = {0, 2, 1, 3}; /* 0 -> 2, 1 -> 3 */
  tens tm = mk(map, I64, 2, 2, 2, 0, 0);
  ks_status_t s = ks_copy_blocks(ks, vs, 2, T(&tm), NULL);
  const float want_k1[8] = {10, -10, 11, -11, 10, -10, 11, -11};
  const float want_v0[8] = {100, 0, 101, 0, 100, 0, 101, 0};
  CHECK(s == KS_OK, "copy_blocks: %s", ks_last_error());
  CLOSE(k1, want_k1, 8, 0.0f);
  CLOSE(v0, want_v0, 8, 0.0f);

  int64_t bad[4] = {0, 1, 2, 4};
  tens tbad = mk(bad, I64, 2, 2, 2, 0, 0);
  s = ks_copy_blocks(ks, vs, 2, T(&tbad), NULL);
  CHECK_STATUS(s, KS_ERR_INVALID_ARGUMENT, "block_mapping");
  CHECK(strstr(ks_last_error(), "row 1") != NULL, "names the row: %s", ks_last_error());
  CHECK(k0[2] == 1.0f && k0[3] == -1.0f, "block 1 untouched after a refused mapping");
  s = ks_copy_blocks(ks, vs, 0, T(&tm), NULL);
  CHECK_STATUS(s, KS_ERR_INVALID_ARGUMENT, "num_layers");
  tens tm32 = mk(map, I32, 2, 2, 2, 0, 0);
  s = ks_copy_blocks(ks, vs, 2, T(&tm32), NULL);
  CHECK_STATUS(s, KS_ERR_UNSUPPORTED_DTYPE, "block_mapping");
  tens tk3 = mk(k1, F32, 4, 3, 1, 1, 2); /* layer 1 with 3 blocks */
  DLTensor *ks3[2] = {T(&tk0), T(&tk3)};
  s = ks_copy_blocks(ks3, vs, 2, T(&tm), NULL);
  CHECK_STATUS(s, KS_ERR_INVALID_ARGUMENT, "k_caches[1]");
  /* a cache whose blocks are not one contiguous run ([2 blocks, 2 slots, 1, 2] with slots 4
   * apart: the k half of a [block, slot, {k, v}, head, D] buffer): the CPU takes it; the CUDA
   * kernel, which copies whole blocks, does not. Queries read no data, so CUDA descriptors over
   * host memory are safe here. */
  float kvbuf[16];
  tens tks = mk(kvbuf, F32, 4, 2, 2, 1, 2), tvs = mk(v0, F32, 4, 2, 2, 1, 2), tms = mk(map, I64, 2, 1, 2, 0, 0);
  tks.strides[0] = 8;
  tks.strides[1] = 4;
  const DLTensor *cq[3] = {T(&tks), T(&tvs), T(&tms)};
  ks_status_t qs = ks_query_support(KS_OP_COPY_BLOCKS, cq, 3, NULL);
  CHECK(qs == KS_OK, "copy_blocks query (cpu): %s", ks_last_error());
  tks.t.device.device_type = tvs.t.device.device_type = tms.t.device.device_type = kDLCUDA;
  qs = ks_query_support(KS_OP_COPY_BLOCKS, cq, 3, NULL);
  CHECK_STATUS(qs, KS_ERR_UNSUPPORTED_LAYOUT, "k_caches[0]:");
}

/* ---- attention */

/* keys with scores 0, 1, 2 against q = [1, 0] (scale 1); values e0, e1, e0 + e1 */
static const float K3[3][2] = {{0, 0}, {1, 0}, {2, 0}};
static const float V3[3][2] = {{1, 0}, {0, 1}, {1, 1}};

/* expected out/lse of q = [1, 0] over keys [lo, hi) of K3/V3, with an optional sink */
static void expect3(int lo, int hi, int has_sink, float sink, float *out, float *lse) {
  double z = has_sink ? exp(sink) : 0.0, o0 = 0, o1 = 0;
  for (int j = lo; j < hi; j++) {
    const double w = exp((double)K3[j][0]);
    z += w;
    o0 += w * V3[j][0];
    o1 += w * V3[j][1];
  }
  out[0] = z > 0 ? (float)(o0 / z) : 0.0f;
  out[1] = z > 0 ? (float)(o1 / z) : 0.0f;
  *lse = z > 0 ? (float)log(z) : -INFINITY;
}

static void test_paged_attention(void) {
  /* one KV head, D = 2, blocks of 2 slots; the sequence's 3 keys live in blocks 2 then 0 */
  float kc[3 * 2 * 2], vc[3 * 2 * 2];
  fill(kc, 12, 1e6f); /* unused slots: a read of them would show */
  fill(vc, 12, 1e6f);
  const int slot_of[3] = {4, 5, 0}; /* block 2 offsets 0, 1; block 0 offset 0 */
  for (int j = 0; j < 3; j++) {
    kc[2 * slot_of[j]] = K3[j][0], kc[2 * slot_of[j] + 1] = K3[j][1];
    vc[2 * slot_of[j]] = V3[j][0], vc[2 * slot_of[j] + 1] = V3[j][1];
  }
  tens tkc = mk(kc, F32, 4, 3, 2, 1, 2), tvc = mk(vc, F32, 4, 3, 2, 1, 2);
  int32_t bt[2] = {2, 0}, lens[1] = {3};
  tens tbt = mk(bt, I32, 2, 1, 2, 0, 0), tl = mk(lens, I32, 1, 1, 0, 0, 0);
  float q[2] = {1, 0}, out[2], lse[1];
  tens tq = mk(q, F32, 3, 1, 1, 2, 0), to = mk(out, F32, 3, 1, 1, 2, 0), tlse = mk(lse, F32, 2, 1, 1, 0, 0);
  ks_attention_options o;
  ks_options_init(KS_OP_PAGED_ATTENTION, &o, sizeof o);
  CHECK(o.causal == 1 && o.window_left == -1 && o.scale == 0.0f, "paged defaults");
  o.scale = 1.0f;
  float want[2], want_lse;

  /* decode: all 3 keys */
  ks_status_t s = ks_paged_attention(T(&tq), T(&tkc), T(&tvc), T(&tbt), T(&tl), NULL, 0, 0, NULL, NULL, NULL, T(&to),
                                     T(&tlse), NULL, &o, NULL);
  expect3(0, 3, 0, 0, want, &want_lse);
  CHECK(s == KS_OK, "paged decode: %s", ks_last_error());
  CLOSE(out, want, 2, 1e-5f);
  CLOSE(lse, &want_lse, 1, 1e-5f);

  /* sliding window of 1 to the left: keys 1, 2; a sink of logit 0.5 */
  float sink = 0.5f;
  tens tsk = mk(&sink, F32, 1, 1, 0, 0, 0);
  o.window_left = 1;
  s = ks_paged_attention(T(&tq), T(&tkc), T(&tvc), T(&tbt), T(&tl), NULL, 0, 0, T(&tsk), NULL, NULL, T(&to),
                         T(&tlse), NULL, &o, NULL);
  expect3(1, 3, 1, sink, want, &want_lse);
  CHECK(s == KS_OK, "paged window+sink: %s", ks_last_error());
  CLOSE(out, want, 2, 1e-5f);
  CLOSE(lse, &want_lse, 1, 1e-5f);
  o.window_left = -1;

  /* prefill chunk: 2 new tokens of the 3 (positions 1 and 2), causal: token 0 sees keys 0, 1 */
  float q2[4] = {1, 0, 1, 0}, out2[4], lse2[2];
  int32_t cu[2] = {0, 2};
  tens tq2 = mk(q2, F32, 3, 2, 1, 2, 0), to2 = mk(out2, F32, 3, 2, 1, 2, 0), tl2 = mk(lse2, F32, 2, 2, 1, 0, 0);
  tens tcu = mk(cu, I32, 1, 2, 0, 0, 0);
  s = ks_paged_attention(T(&tq2), T(&tkc), T(&tvc), T(&tbt), T(&tl), T(&tcu), 2, 0, NULL, NULL, NULL, T(&to2),
                         T(&tl2), NULL, &o, NULL);
  float w2[4], wl2[2];
  expect3(0, 2, 0, 0, w2, &wl2[0]);
  expect3(0, 3, 0, 0, w2 + 2, &wl2[1]);
  CHECK(s == KS_OK, "paged prefill: %s", ks_last_error());
  CLOSE(out2, w2, 4, 1e-5f);
  CLOSE(lse2, wl2, 2, 1e-5f);
  s = ks_paged_attention(T(&tq2), T(&tkc), T(&tvc), T(&tbt), T(&tl), T(&tcu), 1, 0, NULL, NULL, NULL, T(&to2),
                         T(&tl2), NULL, &o, NULL); /* 2 tokens but max_seqlen_q 1 */
  CHECK_STATUS(s, KS_ERR_INVALID_ARGUMENT, "max_seqlen_q");
  int32_t cu_bad[2] = {0, 1};
  tens tcub = mk(cu_bad, I32, 1, 2, 0, 0, 0);
  s = ks_paged_attention(T(&tq2), T(&tkc), T(&tvc), T(&tbt), T(&tl), T(&tcub), 2, 0, NULL, NULL, NULL, T(&to2),
                         T(&tl2), NULL, &o, NULL);
  CHECK_STATUS(s, KS_ERR_INVALID_ARGUMENT, "cu_seqlens_q");

  /* a block id out of range in a block the sequence uses, and a length past the table */
  int32_t bt_bad[2] = {2, 3};
  tens tbtb = mk(bt_bad, I32, 2, 1, 2, 0, 0);
  s = ks_paged_attention(T(&tq), T(&tkc), T(&tvc), T(&tbtb), T(&tl), NULL, 0, 0, NULL, NULL, NULL, T(&to), NULL, NULL,
                         &o, NULL);
  CHECK_STATUS(s, KS_ERR_INVALID_ARGUMENT, "block_table");
  CHECK(strstr(ks_last_error(), "[0, 1]") != NULL, "names the entry: %s", ks_last_error());
  int32_t lens_bad[1] = {5};
  tens tlb = mk(lens_bad, I32, 1, 1, 0, 0, 0);
  s = ks_paged_attention(T(&tq), T(&tkc), T(&tvc), T(&tbt), T(&tlb), NULL, 0, 0, NULL, NULL, NULL, T(&to), NULL, NULL,
                         &o, NULL);
  CHECK_STATUS(s, KS_ERR_INVALID_ARGUMENT, "seq_lens");
  s = ks_paged_attention(T(&tq), T(&tkc), T(&tvc), T(&tbt), T(&tl), NULL, 0, 2, NULL, NULL, NULL, T(&to), NULL, NULL,
                         &o, NULL); /* max_seq_len 2 < 3 keys */
  CHECK_STATUS(s, KS_ERR_INVALID_ARGUMENT, "seq_lens");
  o.scale = -1.0f;
  s = ks_paged_attention(T(&tq), T(&tkc), T(&tvc), T(&tbt), T(&tl), NULL, 0, 0, NULL, NULL, NULL, T(&to), NULL, NULL,
                         &o, NULL);
  CHECK_STATUS(s, KS_ERR_INVALID_ARGUMENT, "scale");
  o.scale = 1.0f;
  int32_t q32[2] = {1, 0};
  tens tqi = mk(q32, I32, 3, 1, 1, 2, 0);
  s = ks_paged_attention(T(&tqi), T(&tkc), T(&tvc), T(&tbt), T(&tl), NULL, 0, 0, NULL, NULL, NULL, T(&to), NULL, NULL,
                         &o, NULL);
  CHECK_STATUS(s, KS_ERR_UNSUPPORTED_DTYPE, "q:");

  /* the same keys in an fp8 cache with k_scale 2 (stored 0, 0.5, 1), bf16 q and out */
  uint8_t k8[3 * 2 * 2], v8[3 * 2 * 2];
  memset(k8, 0x7F, sizeof k8); /* NaN in unused slots */
  memset(v8, 0x7F, sizeof v8);
  const uint8_t kb[3] = {0x00, 0x30, 0x38}; /* 0, 0.5, 1 */
  for (int j = 0; j < 3; j++) {
    k8[2 * slot_of[j]] = kb[j], k8[2 * slot_of[j] + 1] = 0;
    v8[2 * slot_of[j]] = V3[j][0] != 0 ? 0x38 : 0, v8[2 * slot_of[j] + 1] = V3[j][1] != 0 ? 0x38 : 0;
  }
  float ksc = 2.0f, vsc = 1.0f;
  uint16_t qb[2] = {0x3F80, 0}, ob[2];
  tens tk8 = mk(k8, FP8, 4, 3, 2, 1, 2), tv8 = mk(v8, FP8, 4, 3, 2, 1, 2);
  tens tks = mk(&ksc, F32, 1, 1, 0, 0, 0), tvs = mk(&vsc, F32, 1, 1, 0, 0, 0);
  tens tqb = mk(qb, BF16, 3, 1, 1, 2, 0), tob = mk(ob, BF16, 3, 1, 1, 2, 0);
  s = ks_paged_attention(T(&tqb), T(&tk8), T(&tv8), T(&tbt), T(&tl), NULL, 0, 0, NULL, T(&tks), T(&tvs), T(&tob),
                         T(&tlse), NULL, &o, NULL);
  expect3(0, 3, 0, 0, want, &want_lse);
  float got[2];
  for (int i = 0; i < 2; i++) {
    uint32_t u = (uint32_t)ob[i] << 16;
    memcpy(&got[i], &u, 4);
  }
  CHECK(s == KS_OK, "paged fp8: %s", ks_last_error());
  CLOSE(got, want, 2, 4e-3f); /* bf16 output: 8 bits of mantissa */
  CLOSE(lse, &want_lse, 1, 1e-5f);
  s = ks_paged_attention(T(&tq), T(&tk8), T(&tv8), T(&tbt), T(&tl), NULL, 0, 0, NULL, T(&tks), T(&tvs), T(&to), NULL,
                         NULL, &o, NULL); /* fp32 q with an fp8 cache */
  CHECK_STATUS(s, KS_ERR_UNSUPPORTED_DTYPE, "q:");

  /* workspace size: T 2 x Hq 4 rows, D 8, 1000 keys -> ceil(1000 / 256) = 4 splits:
   * 2*4*4*8*4 = 1024 bytes of partials, then 2*4*4*4 = 128 of log-sum-exps */
  float qs[2 * 4 * 8];
  uint16_t kcs[1];
  tens tqs = mk(qs, F32, 3, 2, 4, 8, 0), tkcs = mk(kcs, F16, 4, 10, 16, 2, 8);
  size_t bytes = 1;
  s = ks_paged_attention_workspace_size(T(&tqs), T(&tkcs), 1000, &bytes);
  CHECK(s == KS_OK && bytes == 1152, "workspace bytes %zu (%s)", bytes, ks_last_error());
  s = ks_paged_attention_workspace_size(T(&tqs), T(&tkcs), 200, &bytes); /* 1 split: 256 + 32 */
  CHECK(s == KS_OK && bytes == 288, "one split: %zu", bytes);
  s = ks_paged_attention_workspace_size(T(&tqs), T(&tkcs), 0, &bytes); /* unknown: 64 splits */
  CHECK(s == KS_OK && bytes == 2 * 4 * 64 * 9 * 4, "64 splits: %zu", bytes);
  s = ks_paged_attention_workspace_size(T(&tqs), T(&tkcs), -1, &bytes);
  CHECK_STATUS(s, KS_ERR_INVALID_ARGUMENT, "max_seq_len");
  s = ks_paged_attention_workspace_size(T(&tqs), T(&tkcs), 0, NULL);
  CHECK_STATUS(s, KS_ERR_INVALID_ARGUMENT, "bytes");

  /* query_support: same answers as the calls, without running */
  const DLTensor *args[12] = {T(&tq), T(&tkc), T(&tvc), T(&tbt), T(&tl), NULL, NULL, NULL, NULL, T(&to), T(&tlse), NULL};
  CHECK(ks_query_support(KS_OP_PAGED_ATTENTION, args, 12, &o) == KS_OK, "query ok: %s", ks_last_error());
  args[0] = T(&tqi);
  s = ks_query_support(KS_OP_PAGED_ATTENTION, args, 12, &o);
  CHECK_STATUS(s, KS_ERR_UNSUPPORTED_DTYPE, "q:");
  s = ks_query_support(KS_OP_PAGED_ATTENTION, args, 11, &o);
  CHECK_STATUS(s, KS_ERR_INVALID_ARGUMENT, "12");
}

static void test_merge(void) {
  /* a: out [1, 0] with lse 0 (weight 1), b: out [0, 1] with lse ln 3: lse ln 4, out [1/4, 3/4];
   * row 2: both empty (-inf): out 0, lse -inf */
  float oa[4] = {1, 0, 5, 5}, ob[4] = {0, 1, 7, 7};
  float la[2] = {0, -INFINITY}, lb[2] = {logf(3.0f), -INFINITY}, out[4], lse[2];
  tens toa = mk(oa, F32, 3, 2, 1, 2, 0), tob = mk(ob, F32, 3, 2, 1, 2, 0), to = mk(out, F32, 3, 2, 1, 2, 0);
  tens tla = mk(la, F32, 2, 2, 1, 0, 0), tlb = mk(lb, F32, 2, 2, 1, 0, 0), tl = mk(lse, F32, 2, 2, 1, 0, 0);
  ks_status_t s = ks_merge_attn_states(T(&toa), T(&tla), T(&tob), T(&tlb), T(&to), T(&tl), NULL);
  const float want[4] = {0.25f, 0.75f, 0, 0}, want_l[2] = {logf(4.0f), -INFINITY};
  CHECK(s == KS_OK, "merge: %s", ks_last_error());
  CLOSE(out, want, 4, 1e-6f);
  CLOSE(lse, want_l, 2, 1e-6f);
  tens tl16 = mk(la, F16, 2, 2, 1, 0, 0);
  s = ks_merge_attn_states(T(&toa), T(&tl16), T(&tob), T(&tlb), T(&to), NULL, NULL);
  CHECK_STATUS(s, KS_ERR_UNSUPPORTED_DTYPE, "lse_a");
  tens tob3 = mk(ob, F32, 3, 1, 2, 2, 0);
  s = ks_merge_attn_states(T(&toa), T(&tla), T(&tob3), T(&tlb), T(&to), NULL, NULL);
  CHECK_STATUS(s, KS_ERR_INVALID_ARGUMENT, "out_b");
}

static void test_flash(void) {
  /* dense: B 1, Sq 2, Sk 3, one head, D 2, Dv 2, K3/V3; causal bottom-right: query 0 sits at
   * position 1 (keys 0, 1), query 1 at position 2 (all) */
  float q[4] = {1, 0, 1, 0}, k[6], v[6], out[4], lse[2];
  for (int j = 0; j < 3; j++) k[2 * j] = K3[j][0], k[2 * j + 1] = K3[j][1], v[2 * j] = V3[j][0], v[2 * j + 1] = V3[j][1];
  tens tq = mk(q, F32, 4, 1, 2, 1, 2), tk = mk(k, F32, 4, 1, 3, 1, 2), tv = mk(v, F32, 4, 1, 3, 1, 2);
  tens to = mk(out, F32, 4, 1, 2, 1, 2), tl = mk(lse, F32, 3, 1, 1, 2, 0);
  ks_attention_options o;
  ks_options_init(KS_OP_FLASH_ATTENTION, &o, sizeof o);
  CHECK(o.causal == 0, "flash default: not causal");
  o.scale = 1.0f;
  o.causal = 1;
  ks_status_t s = ks_flash_attention(T(&tq), T(&tk), T(&tv), NULL, T(&to), T(&tl), &o, NULL);
  float want[4], wl[2];
  expect3(0, 2, 0, 0, want, &wl[0]);
  expect3(0, 3, 0, 0, want + 2, &wl[1]);
  CHECK(s == KS_OK, "flash causal: %s", ks_last_error());
  CLOSE(out, want, 4, 1e-5f);
  CLOSE(lse, wl, 2, 1e-5f);

  /* not causal, window (0, 0): each query sees only the key at its own position */
  o.causal = 0;
  o.window_left = 0;
  o.window_right = 0;
  s = ks_flash_attention(T(&tq), T(&tk), T(&tv), NULL, T(&to), T(&tl), &o, NULL);
  expect3(1, 2, 0, 0, want, &wl[0]);
  expect3(2, 3, 0, 0, want + 2, &wl[1]);
  CHECK(s == KS_OK, "flash window: %s", ks_last_error());
  CLOSE(out, want, 4, 1e-5f);
  CLOSE(lse, wl, 2, 1e-5f);
  o.window_left = o.window_right = -1;

  /* softcap 1: scores 0, 1, 2 become tanh(0), tanh(1), tanh(2); Dv 1 (values V3[:, 1]) */
  float v1[3] = {0, 1, 1}, out1[2];
  tens tv1 = mk(v1, F32, 4, 1, 3, 1, 1), to1 = mk(out1, F32, 4, 1, 2, 1, 1);
  o.softcap = 1.0f;
  s = ks_flash_attention(T(&tq), T(&tk), T(&tv1), NULL, T(&to1), NULL, &o, NULL);
  const double e0 = 1.0, e1 = exp(tanh(1.0)), e2 = exp(tanh(2.0));
  const float want1[2] = {(float)((e1 + e2) / (e0 + e1 + e2)), (float)((e1 + e2) / (e0 + e1 + e2))};
  CHECK(s == KS_OK, "flash softcap: %s", ks_last_error());
  CLOSE(out1, want1, 2, 1e-5f);
  o.softcap = 0.0f;

  /* no key at all (Sk 0) with a sink: out 0, lse = the sink */
  float sink = 0.25f;
  tens tk0 = mk(k, F32, 4, 1, 0, 1, 2), tv0 = mk(v, F32, 4, 1, 0, 1, 2), ts = mk(&sink, F32, 1, 1, 0, 0, 0);
  s = ks_flash_attention(T(&tq), T(&tk0), T(&tv0), T(&ts), T(&to), T(&tl), &o, NULL);
  const float zeros[4] = {0, 0, 0, 0}, sinks2[2] = {0.25f, 0.25f};
  CHECK(s == KS_OK, "flash no keys: %s", ks_last_error());
  CLOSE(out, zeros, 4, 0.0f);
  CLOSE(lse, sinks2, 2, 0.0f);

  /* failures */
  tens tlw = mk(lse, F32, 3, 1, 2, 1, 0); /* lse [B, S, H] instead of [B, H, S] */
  s = ks_flash_attention(T(&tq), T(&tk), T(&tv), NULL, T(&to), T(&tlw), &o, NULL);
  CHECK_STATUS(s, KS_ERR_INVALID_ARGUMENT, "lse");
  tens tk2 = mk(k, F32, 4, 1, 3, 1, 1); /* head size 1, q's is 2 */
  s = ks_flash_attention(T(&tq), T(&tk2), T(&tv), NULL, T(&to), NULL, &o, NULL);
  CHECK_STATUS(s, KS_ERR_INVALID_ARGUMENT, "k:");
  tens tkd = tk;
  tkd.t.dtype = dtype_of(F16);
  s = ks_flash_attention(T(&tq), T(&tkd), T(&tv), NULL, T(&to), NULL, &o, NULL);
  CHECK_STATUS(s, KS_ERR_UNSUPPORTED_DTYPE, "k:");
  o.window_left = -2;
  s = ks_flash_attention(T(&tq), T(&tk), T(&tv), NULL, T(&to), NULL, &o, NULL);
  CHECK_STATUS(s, KS_ERR_INVALID_ARGUMENT, "window_left");
  const DLTensor *args[6] = {T(&tq), T(&tk), T(&tv), NULL, T(&to), NULL};
  ks_status_t qs = ks_query_support(KS_OP_FLASH_ATTENTION, args, 6, &o);
  CHECK(qs == s, "query agrees with the call: %s", ks_status_name(qs));
  o.window_left = -1;
  CHECK(ks_query_support(KS_OP_FLASH_ATTENTION, args, 6, &o) == KS_OK, "query ok: %s", ks_last_error());
}

static void test_flash_varlen(void) {
  /* two sequences packed: sequence 0 has 1 query (q row 0) over keys 0..1, sequence 1 has 2
   * queries (rows 1, 2) over keys 2..4 = K3; causal bottom-right per sequence; row 3 belongs to
   * no sequence (out 0, lse -inf) */
  float q[8] = {1, 0, 1, 0, 1, 0, 9, 9}, k[10], v[10], out[8], lse[4];
  for (int j = 0; j < 2; j++) k[2 * j] = K3[j][0], k[2 * j + 1] = K3[j][1], v[2 * j] = V3[j][0], v[2 * j + 1] = V3[j][1];
  for (int j = 0; j < 3; j++)
    k[4 + 2 * j] = K3[j][0], k[5 + 2 * j] = K3[j][1], v[4 + 2 * j] = V3[j][0], v[5 + 2 * j] = V3[j][1];
  int32_t cq[3] = {0, 1, 3}, ck[3] = {0, 2, 5};
  tens tq = mk(q, F32, 3, 4, 1, 2, 0), tk = mk(k, F32, 3, 5, 1, 2, 0), tv = mk(v, F32, 3, 5, 1, 2, 0);
  tens to = mk(out, F32, 3, 4, 1, 2, 0), tl = mk(lse, F32, 2, 1, 4, 0, 0);
  tens tcq = mk(cq, I32, 1, 3, 0, 0, 0), tck = mk(ck, I32, 1, 3, 0, 0, 0);
  ks_attention_options o;
  ks_options_init(KS_OP_FLASH_ATTENTION_VARLEN, &o, sizeof o);
  o.scale = 1.0f;
  o.causal = 1;
  ks_status_t s = ks_flash_attention_varlen(T(&tq), T(&tk), T(&tv), T(&tcq), T(&tck), 2, 3, NULL, T(&to), T(&tl), &o,
                                            NULL);
  float want[8], wl[4];
  expect3(0, 2, 0, 0, want, &wl[0]);     /* sequence 0: 1 query at position 1 of 2 keys */
  expect3(0, 2, 0, 0, want + 2, &wl[1]); /* sequence 1: positions 1, 2 of 3 keys */
  expect3(0, 3, 0, 0, want + 4, &wl[2]);
  want[6] = want[7] = 0.0f;
  wl[3] = -INFINITY;
  CHECK(s == KS_OK, "varlen: %s", ks_last_error());
  CLOSE(out, want, 8, 1e-5f);
  CLOSE(lse, wl, 4, 1e-5f);
  s = ks_flash_attention_varlen(T(&tq), T(&tk), T(&tv), T(&tcq), T(&tck), 1, 3, NULL, T(&to), T(&tl), &o, NULL);
  CHECK_STATUS(s, KS_ERR_INVALID_ARGUMENT, "max_seqlen_q");
  int32_t ck_bad[3] = {0, 3, 2};
  tens tckb = mk(ck_bad, I32, 1, 3, 0, 0, 0);
  s = ks_flash_attention_varlen(T(&tq), T(&tk), T(&tv), T(&tcq), T(&tckb), 2, 3, NULL, T(&to), T(&tl), &o, NULL);
  CHECK_STATUS(s, KS_ERR_INVALID_ARGUMENT, "cu_seqlens_k");
  CHECK(strstr(ks_last_error(), "index 2") != NULL, "names the offset: %s", ks_last_error());
  int32_t cq_past[3] = {0, 1, 5};
  tens tcqp = mk(cq_past, I32, 1, 3, 0, 0, 0);
  s = ks_flash_attention_varlen(T(&tq), T(&tk), T(&tv), T(&tcqp), T(&tck), 4, 3, NULL, T(&to), T(&tl), &o, NULL);
  CHECK_STATUS(s, KS_ERR_INVALID_ARGUMENT, "cu_seqlens_q");
  tens tcq2 = mk(cq, I32, 1, 2, 0, 0, 0);
  s = ks_flash_attention_varlen(T(&tq), T(&tk), T(&tv), T(&tcq2), T(&tck), 2, 3, NULL, T(&to), T(&tl), &o, NULL);
  CHECK_STATUS(s, KS_ERR_INVALID_ARGUMENT, "cu_seqlens_k");
}

int main(void) {
  test_rotary();
  test_mrope();
  test_qk_norm_rope();
  test_reshape_and_cache();
  test_copy_blocks();
  test_paged_attention();
  test_merge();
  test_flash();
  test_flash_varlen();
  printf("test_ops2: %d checks, %d failures\n", checks, failures);
  return failures ? 1 : 0;
}
