/* test_core.c: the C core of libkernelset.so from a C caller.
 *
 * Linked against the library (public API) and compiled together with capi/src/core/halfs.c,
 * whose conversions are hidden in the library and checked here exhaustively. Covers versioning
 * and ks_get_api, status names, options (defaults, older sizes, refusals), every failure class
 * of a tensor argument with its status and message, the CPU results of a few ops against values
 * computed here, query_support agreeing with calls, CUDA tensors on a machine without a driver,
 * and the error message being per thread.
 *
 *   gcc -std=c99 -Icapi/include -Icapi/src/core -Icapi/src/cuda capi/tests/test_core.c \
 *       capi/src/core/halfs.c -Lsrc/kernelset/capi/lib -lkernelset -ldl -lpthread -lm -o test_core
 *   LD_LIBRARY_PATH=src/kernelset/capi/lib ./test_core     (exit status 0: all passed)
 */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernelset.h"
#include "ks_internal.h"

static int failures, checks;

#define CHECK(cond)                                                        \
  do {                                                                     \
    checks++;                                                              \
    if (!(cond)) {                                                         \
      failures++;                                                          \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
    }                                                                      \
  } while (0)

/* status s and a message containing `part` */
#define CHECK_ERR(expr, s, part)                                                                  \
  do {                                                                                            \
    ks_status_t st_ = (expr);                                                                     \
    checks++;                                                                                     \
    if (st_ != (s) || strstr(ks_last_error(), (part)) == NULL) {                                  \
      failures++;                                                                                 \
      fprintf(stderr, "%s:%d: %s: got %s \"%s\", expected %s with \"%s\"\n", __FILE__, __LINE__, #expr, \
              ks_status_name(st_), ks_last_error(), ks_status_name(s), (part));                   \
    }                                                                                             \
  } while (0)

#define CHECK_OK(expr)                                                                             \
  do {                                                                                             \
    ks_status_t st_ = (expr);                                                                      \
    checks++;                                                                                      \
    if (st_ != KS_OK) {                                                                            \
      failures++;                                                                                  \
      fprintf(stderr, "%s:%d: %s: %s \"%s\"\n", __FILE__, __LINE__, #expr, ks_status_name(st_), ks_last_error()); \
    }                                                                                              \
  } while (0)

static const DLDataType F32 = {kDLFloat, 32, 1}, F16 = {kDLFloat, 16, 1}, BF16 = {kDLBfloat, 16, 1},
                        I32 = {kDLInt, 32, 1}, I64 = {kDLInt, 64, 1}, F64 = {kDLFloat, 64, 1};

static DLTensor tensor(void *data, DLDataType dt, int32_t ndim, int64_t *shape, int64_t *strides) {
  DLTensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.device.device_type = kDLCPU;
  t.ndim = ndim;
  t.dtype = dt;
  t.shape = shape;
  t.strides = strides;
  return t;
}

static int close_to(float a, float b, float tol) { return fabsf(a - b) <= tol * (1.0f + fabsf(b)); }

/* ---- versioning, status names, build info */
static void test_versions(void) {
  int32_t major = -1, minor = -1;
  ks_abi_version(&major, &minor);
  CHECK(major == KS_ABI_VERSION_MAJOR && minor == KS_ABI_VERSION_MINOR);
  ks_abi_version(NULL, NULL); /* tolerated */
  CHECK(strstr(ks_build_info(), "kernelset ") == ks_build_info());
  CHECK(strstr(ks_build_info(), "abi 1.1") != NULL);
  CHECK(strstr(ks_build_info(), "cuda: ") != NULL);

  const ks_api_t *api = NULL;
  CHECK_OK(ks_get_api(1, 0, &api));
  CHECK(api != NULL && api->size == sizeof(ks_api_t) && api->abi_major == 1 && api->abi_minor == 1);
  CHECK(api && api->rms_norm == ks_rms_norm && api->flash_attention_varlen == ks_flash_attention_varlen);
  CHECK(api && api->mla_decode == ks_mla_decode); /* ABI 1.1 */
  CHECK(api && api->last_error == ks_last_error && api->query_support == ks_query_support);
  const ks_api_t *none = api;
  CHECK_ERR(ks_get_api(2, 0, &none), KS_ERR_VERSION, "major");
  CHECK(none == NULL);
  CHECK_ERR(ks_get_api(0, 0, &none), KS_ERR_VERSION, "major");
  CHECK_ERR(ks_get_api(1, KS_ABI_VERSION_MINOR + 1, &none), KS_ERR_VERSION, "min_minor");
  CHECK_ERR(ks_get_api(1, 0, NULL), KS_ERR_INVALID_ARGUMENT, "table");
  CHECK_OK(ks_get_api(1, 0, &none)); /* a success clears the message */
  CHECK(ks_last_error()[0] == '\0');

  CHECK(strcmp(ks_status_name(KS_OK), "KS_OK") == 0);
  CHECK(strcmp(ks_status_name(KS_ERR_UNSUPPORTED_LAYOUT), "KS_ERR_UNSUPPORTED_LAYOUT") == 0);
  CHECK(strcmp(ks_status_name(KS_ERR_INTERNAL), "KS_ERR_INTERNAL") == 0);
  CHECK(strcmp(ks_status_name(999), "KS_ERR_UNKNOWN") == 0);
}

/* ---- options */
static void test_options(void) {
  ks_rms_norm_options o;
  memset(&o, 0xff, sizeof o);
  CHECK_OK(ks_options_init(KS_OP_RMS_NORM, &o, sizeof o));
  CHECK(o.size == sizeof o && o.eps == 1e-6f && o.offset == 0.0f && o.cast == KS_NORM_CAST_LLAMA);
  ks_cross_entropy_options ce;
  CHECK_OK(ks_options_init(KS_OP_CROSS_ENTROPY, &ce, sizeof ce));
  CHECK(ce.ignore_index == -100 && ce.reduction == KS_REDUCTION_MEAN && ce.softcap == 0.0f);
  ks_attention_options pa, fa;
  CHECK_OK(ks_options_init(KS_OP_PAGED_ATTENTION, &pa, sizeof pa));
  CHECK_OK(ks_options_init(KS_OP_FLASH_ATTENTION, &fa, sizeof fa));
  CHECK(pa.causal == 1 && fa.causal == 0 && pa.window_left == -1 && fa.window_right == -1);
  ks_swiglu_oai_options oai;
  CHECK_OK(ks_options_init(KS_OP_SWIGLU_OAI, &oai, sizeof oai));
  CHECK(oai.alpha == 1.702f && oai.limit == 7.0f);

  /* an older caller's struct (only size and eps): the rest of its memory is not touched */
  unsigned char old[sizeof(ks_rms_norm_options)];
  memset(old, 0xab, sizeof old);
  const size_t old_size = offsetof(ks_rms_norm_options, offset);
  CHECK_OK(ks_options_init(KS_OP_RMS_NORM, old, old_size));
  CHECK(((ks_rms_norm_options *)(void *)old)->eps == 1e-6f && ((ks_rms_norm_options *)(void *)old)->size == old_size);
  CHECK(old[old_size] == 0xab && old[sizeof old - 1] == 0xab);

  CHECK_ERR(ks_options_init(KS_OP_RMS_NORM, &o, 4), KS_ERR_INVALID_ARGUMENT, "smaller than its size field");
  CHECK_ERR(ks_options_init(KS_OP_RMS_NORM, &o, sizeof o + 8), KS_ERR_INVALID_ARGUMENT, "newer kernelset.h");
  CHECK_ERR(ks_options_init(KS_OP_RMS_NORM, &o, sizeof(size_t) + 2), KS_ERR_INVALID_ARGUMENT, "inside a field");
  CHECK_ERR(ks_options_init(KS_OP_RMS_NORM, NULL, sizeof o), KS_ERR_INVALID_ARGUMENT, "options");
  CHECK_ERR(ks_options_init(KS_OP_SILU_AND_MUL, &o, sizeof o), KS_ERR_INVALID_ARGUMENT, "silu_and_mul takes no options");
  CHECK_ERR(ks_options_init(99, &o, sizeof o), KS_ERR_INVALID_ARGUMENT, "unknown op id 99");
}

/* ---- rms_norm on CPU against a loop here; layouts; options of an older size */
static void test_rms_norm(void) {
  enum { R = 3, H = 8 };
  float x[R * H], w[H], y[R * H], want[R * H];
  for (int i = 0; i < R * H; i++) x[i] = (float)((i * 37) % 17) / 7.0f - 1.0f;
  for (int j = 0; j < H; j++) w[j] = 0.5f + 0.125f * (float)j;
  for (int r = 0; r < R; r++) {
    double ss = 0;
    for (int j = 0; j < H; j++) ss += (double)x[r * H + j] * x[r * H + j];
    const float rstd = 1.0f / sqrtf((float)(ss / H) + 1e-6f);
    for (int j = 0; j < H; j++) want[r * H + j] = x[r * H + j] * rstd * w[j];
  }
  int64_t xs[2] = {R, H}, ws[1] = {H};
  DLTensor tx = tensor(x, F32, 2, xs, NULL), tw = tensor(w, F32, 1, ws, NULL), ty = tensor(y, F32, 2, xs, NULL);
  CHECK_OK(ks_rms_norm(&tx, &tw, &ty, NULL, NULL));
  int ok = 1;
  for (int i = 0; i < R * H; i++) ok &= close_to(y[i], want[i], 1e-6f);
  CHECK(ok);

  /* through the table, with options of the older size (eps only: offset and cast keep defaults) */
  const ks_api_t *api = NULL;
  CHECK_OK(ks_get_api(1, 0, &api));
  struct {
    size_t size;
    float eps;
  } old = {sizeof old, 1e-6f};
  memset(y, 0, sizeof y);
  CHECK_OK(api->rms_norm(&tx, &tw, &ty, (const ks_rms_norm_options *)(const void *)&old, NULL));
  ok = 1;
  for (int i = 0; i < R * H; i++) ok &= close_to(y[i], want[i], 1e-6f);
  CHECK(ok);

  /* strided rows: x is every other row of a [2R, H] buffer, out rows padded to 2H */
  float big[2 * R * H], ypad[R * 2 * H];
  for (int r = 0; r < R; r++)
    for (int j = 0; j < H; j++) big[2 * r * H + j] = x[r * H + j], big[(2 * r + 1) * H + j] = 1e30f;
  for (int i = 0; i < R * 2 * H; i++) ypad[i] = -7.0f;
  int64_t st_x[2] = {2 * H, 1}, st_y[2] = {2 * H, 1};
  DLTensor tbig = tensor(big, F32, 2, xs, st_x), typ = tensor(ypad, F32, 2, xs, st_y);
  CHECK_OK(ks_rms_norm(&tbig, &tw, &typ, NULL, NULL));
  ok = 1;
  for (int r = 0; r < R; r++)
    for (int j = 0; j < H; j++) ok &= close_to(ypad[r * 2 * H + j], want[r * H + j], 1e-6f) && ypad[r * 2 * H + H + j] == -7.0f;
  CHECK(ok);

  /* byte_offset: skip the first row */
  float x2[(R + 1) * H];
  memcpy(x2 + H, x, sizeof x);
  DLTensor toff = tensor(x2, F32, 2, xs, NULL);
  toff.byte_offset = H * sizeof(float);
  memset(y, 0, sizeof y);
  CHECK_OK(ks_rms_norm(&toff, &tw, &ty, NULL, NULL));
  CHECK(close_to(y[0], want[0], 1e-6f) && close_to(y[R * H - 1], want[R * H - 1], 1e-6f));

  /* in place (out = x) */
  float xi[R * H];
  memcpy(xi, x, sizeof x);
  DLTensor txi = tensor(xi, F32, 2, xs, NULL);
  CHECK_OK(ks_rms_norm(&txi, &tw, &txi, NULL, NULL));
  CHECK(close_to(xi[5], want[5], 1e-6f));
}

/* ---- every failure class of a tensor argument, and query_support agreeing */
static void test_failures(void) {
  float x[12] = {0}, w[4] = {0}, y[12] = {0};
  int64_t xs[2] = {3, 4}, ws[1] = {4};
  DLTensor tx = tensor(x, F32, 2, xs, NULL), tw = tensor(w, F32, 1, ws, NULL), ty = tensor(y, F32, 2, xs, NULL);

  CHECK_ERR(ks_rms_norm(NULL, &tw, &ty, NULL, NULL), KS_ERR_INVALID_ARGUMENT, "x: required tensor is NULL");
  CHECK_ERR(ks_rms_norm(&tx, &tw, NULL, NULL, NULL), KS_ERR_INVALID_ARGUMENT, "out: required tensor is NULL");

  int64_t nine[9] = {1, 1, 1, 1, 1, 1, 1, 3, 4};
  DLTensor t9 = tensor(x, F32, 9, nine, NULL);
  CHECK_ERR(ks_rms_norm(&t9, &tw, &ty, NULL, NULL), KS_ERR_INVALID_ARGUMENT, "x: ndim 9");
  DLTensor tneg_nd = tensor(x, F32, -1, xs, NULL);
  CHECK_ERR(ks_rms_norm(&tneg_nd, &tw, &ty, NULL, NULL), KS_ERR_INVALID_ARGUMENT, "x: ndim -1");
  DLTensor tnoshape = tensor(x, F32, 2, NULL, NULL);
  CHECK_ERR(ks_rms_norm(&tnoshape, &tw, &ty, NULL, NULL), KS_ERR_INVALID_ARGUMENT, "x: shape is NULL");

  int64_t neg[2] = {3, -4};
  DLTensor tneg = tensor(x, F32, 2, neg, NULL);
  CHECK_ERR(ks_rms_norm(&tneg, &tw, &ty, NULL, NULL), KS_ERR_INVALID_ARGUMENT, "x: dim 1 is negative");

  DLTensor tnull = tensor(NULL, F32, 2, xs, NULL);
  CHECK_ERR(ks_rms_norm(&tnull, &tw, &ty, NULL, NULL), KS_ERR_INVALID_ARGUMENT, "x: data is NULL");

  DLTensor ty16 = tensor(y, F16, 2, xs, NULL);
  CHECK_ERR(ks_rms_norm(&tx, &tw, &ty16, NULL, NULL), KS_ERR_UNSUPPORTED_DTYPE, "out: expected float32 (the dtype of x), got float16");
  DLTensor tx64 = tensor(x, F64, 2, xs, NULL);
  CHECK_ERR(ks_rms_norm(&tx64, &tw, &ty, NULL, NULL), KS_ERR_UNSUPPORTED_DTYPE, "x: dtype float64 is not supported");
  DLTensor txi = tensor(x, I32, 2, xs, NULL);
  CHECK_ERR(ks_rms_norm(&txi, &tw, &ty, NULL, NULL), KS_ERR_UNSUPPORTED_DTYPE,
            "x: expected float32, float16 or bfloat16, got int32");
  DLTensor tlanes = tx;
  tlanes.dtype.lanes = 4;
  CHECK_ERR(ks_rms_norm(&tlanes, &tw, &ty, NULL, NULL), KS_ERR_UNSUPPORTED_DTYPE, "x: expected lanes 1");

  int64_t ws5[1] = {5};
  DLTensor tw5 = tensor(w, F32, 1, ws5, NULL);
  CHECK_ERR(ks_rms_norm(&tx, &tw5, &ty, NULL, NULL), KS_ERR_INVALID_ARGUMENT, "weight: dim 0 must be 4");
  int64_t ys[2] = {4, 3};
  DLTensor tyT = tensor(y, F32, 2, ys, NULL);
  CHECK_ERR(ks_rms_norm(&tx, &tw, &tyT, NULL, NULL), KS_ERR_INVALID_ARGUMENT, "out: expected shape [3, 4]");

  DLTensor tcuda = tw;
  tcuda.device.device_type = kDLCUDA;
  CHECK_ERR(ks_rms_norm(&tx, &tcuda, &ty, NULL, NULL), KS_ERR_UNSUPPORTED_DEVICE, "weight: on cuda:0 but x is on cpu:0");
  DLTensor tvk = tw;
  tvk.device.device_type = (DLDeviceType)9; /* kDLVulkan */
  CHECK_ERR(ks_rms_norm(&tx, &tvk, &ty, NULL, NULL), KS_ERR_UNSUPPORTED_DEVICE, "weight: device type 9");

  DLTensor tmis = tx;
  tmis.byte_offset = 2; /* not a multiple of 4 bytes */
  CHECK_ERR(ks_rms_norm(&tmis, &tw, &ty, NULL, NULL), KS_ERR_UNSUPPORTED_LAYOUT, "x: byte_offset 2");
  int64_t bcast[2] = {0, 1}; /* every row of out at the same address */
  DLTensor tyb = tensor(y, F32, 2, xs, bcast);
  CHECK_ERR(ks_rms_norm(&tx, &tw, &tyb, NULL, NULL), KS_ERR_UNSUPPORTED_LAYOUT, "out: elements overlap");

  ks_rms_norm_options o;
  ks_options_init(KS_OP_RMS_NORM, &o, sizeof o);
  o.size = 3;
  CHECK_ERR(ks_rms_norm(&tx, &tw, &ty, &o, NULL), KS_ERR_INVALID_ARGUMENT, "options: size 3");
  o.size = sizeof o + 16;
  CHECK_ERR(ks_rms_norm(&tx, &tw, &ty, &o, NULL), KS_ERR_INVALID_ARGUMENT, "options: size");
  o.size = sizeof o;
  o.eps = -1.0f;
  CHECK_ERR(ks_rms_norm(&tx, &tw, &ty, &o, NULL), KS_ERR_INVALID_ARGUMENT, "options.eps");
  o.eps = 1e-6f;
  o.cast = 7;
  CHECK_ERR(ks_rms_norm(&tx, &tw, &ty, &o, NULL), KS_ERR_INVALID_ARGUMENT, "options.cast");
  o.cast = KS_NORM_CAST_LLAMA;
  o.offset = 1.0f;
  CHECK_ERR(ks_rms_norm(&tx, NULL, &ty, &o, NULL), KS_ERR_INVALID_ARGUMENT, "options.offset");

  /* query_support: the same answers without running; data may be NULL */
  DLTensor qx = tensor(NULL, F32, 2, xs, NULL), qw = tensor(NULL, F32, 1, ws, NULL), qy = tensor(NULL, F32, 2, xs, NULL);
  const DLTensor *good[3] = {&qx, &qw, &qy};
  CHECK_OK(ks_query_support(KS_OP_RMS_NORM, good, 3, NULL));
  const DLTensor *bad[3] = {&qx, &qw, &ty16};
  CHECK_ERR(ks_query_support(KS_OP_RMS_NORM, bad, 3, NULL), KS_ERR_UNSUPPORTED_DTYPE, "out: expected float32");
  const DLTensor *noweight[3] = {&qx, NULL, &qy};
  CHECK_OK(ks_query_support(KS_OP_RMS_NORM, noweight, 3, NULL));
  CHECK_ERR(ks_query_support(KS_OP_RMS_NORM, good, 2, NULL), KS_ERR_INVALID_ARGUMENT, "rms_norm takes 3 tensors, got 2");
  CHECK_ERR(ks_query_support(KS_OP_RMS_NORM, NULL, 3, NULL), KS_ERR_INVALID_ARGUMENT, "tensors: NULL");
  CHECK_ERR(ks_query_support(77, good, 3, NULL), KS_ERR_INVALID_ARGUMENT, "unknown op id 77");
  o.offset = 0.0f;
  o.size = 2;
  CHECK_ERR(ks_query_support(KS_OP_RMS_NORM, good, 3, &o), KS_ERR_INVALID_ARGUMENT, "options: size 2");
}

/* ---- CUDA tensors on a machine without a driver: the plan is made, the device query fails */
static void test_cuda(void) {
  int64_t xs[2] = {2, 16}, ts[1] = {2}, one[1] = {1};
  DLTensor lg = tensor(NULL, F32, 2, xs, NULL), tg = tensor(NULL, I64, 1, ts, NULL), ls = tensor(NULL, F32, 1, one, NULL);
  lg.device.device_type = tg.device.device_type = ls.device.device_type = kDLCUDA;
  const DLTensor *ce[3] = {&lg, &tg, &ls};
  void *cuda = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (cuda) { /* a GPU machine: the GPU suite runs the kernels */
    dlclose(cuda);
    return;
  }
  DLTensor x = tensor((void *)(uintptr_t)4096, BF16, 2, xs, NULL), y = x;
  x.device.device_type = y.device.device_type = kDLCUDA;
  CHECK_ERR(ks_rms_norm(&x, NULL, &y, NULL, NULL), KS_ERR_CUDA, "libcuda.so.1");
  const DLTensor *q[3] = {&x, NULL, &y};
  CHECK_ERR(ks_query_support(KS_OP_RMS_NORM, q, 3, NULL), KS_ERR_CUDA, "libcuda.so.1");
  /* cross_entropy's mean (the default) runs the per-row kernel and the reduction kernel */
  CHECK_ERR(ks_query_support(KS_OP_CROSS_ENTROPY, ce, 3, NULL), KS_ERR_CUDA, "libcuda.so.1");
}

/* ---- a few more ops with values computed here */
static void test_ops(void) {
  /* softmax of [log .25, log .75] in fp32 -> fp16 out: exactly (0.25, 0.75) */
  float x[2] = {logf(0.25f), logf(0.75f)};
  uint16_t y16[2];
  int64_t s[1] = {2};
  DLTensor tx = tensor(x, F32, 1, s, NULL), ty = tensor(y16, F16, 1, s, NULL);
  CHECK_OK(ks_softmax(&tx, &ty, NULL, NULL));
  CHECK(y16[0] == 0x3400 && y16[1] == 0x3a00);

  /* embedding: int32 ids, an out-of-range id refused before anything is written */
  float w[6] = {1, 2, 3, 4, 5, 6}, out[4] = {0, 0, 0, 0};
  int32_t ids[2] = {2, 0};
  int64_t ws[2] = {3, 2}, is[1] = {2}, os[2] = {2, 2};
  DLTensor tw = tensor(w, F32, 2, ws, NULL), ti = tensor(ids, I32, 1, is, NULL), to = tensor(out, F32, 2, os, NULL);
  CHECK_OK(ks_embedding(&ti, &tw, &to, NULL));
  CHECK(out[0] == 5 && out[1] == 6 && out[2] == 1 && out[3] == 2);
  ids[1] = 3;
  out[0] = -1;
  CHECK_ERR(ks_embedding(&ti, &tw, &to, NULL), KS_ERR_INVALID_ARGUMENT, "ids: id 3 (flat index 1) is outside [0, 3)");
  CHECK(out[0] == -1);

  /* cross_entropy: uniform logits give log(V); an ignored row is 0 and not counted by the mean */
  float lg[2 * 4] = {0};
  int64_t tg[2] = {1, -100};
  float loss = 0;
  int64_t ls[2] = {2, 4}, tsh[1] = {2};
  DLTensor tl = tensor(lg, F32, 2, ls, NULL), tt = tensor(tg, I64, 1, tsh, NULL), tlo = tensor(&loss, F32, 0, NULL, NULL);
  CHECK_OK(ks_cross_entropy(&tl, &tt, &tlo, NULL, NULL));
  CHECK(close_to(loss, logf(4.0f), 1e-6f));
  ks_cross_entropy_options ce;
  ks_options_init(KS_OP_CROSS_ENTROPY, &ce, sizeof ce);
  ce.label_smoothing = 1.5f;
  CHECK_ERR(ks_cross_entropy(&tl, &tt, &tlo, &ce, NULL), KS_ERR_INVALID_ARGUMENT, "options.label_smoothing");
  ce.label_smoothing = 0;
  ce.reduction = KS_REDUCTION_NONE;
  CHECK_ERR(ks_cross_entropy(&tl, &tt, &tlo, &ce, NULL), KS_ERR_INVALID_ARGUMENT, "loss: expected shape [2]");

  /* silu_and_mul: odd last dim refused */
  int64_t odd[2] = {1, 3}, half[2] = {1, 1};
  float xo[3] = {0}, yo[1];
  DLTensor txo = tensor(xo, F32, 2, odd, NULL), tyo = tensor(yo, F32, 2, half, NULL);
  CHECK_ERR(ks_silu_and_mul(&txo, &tyo, NULL), KS_ERR_INVALID_ARGUMENT, "x: expected an even last dim");
}

/* ---- the message is per thread */
static void *other_thread(void *arg) {
  (void)arg;
  ks_status_t s = ks_rms_norm(NULL, NULL, NULL, NULL, NULL);
  return (void *)(intptr_t)(s == KS_ERR_INVALID_ARGUMENT && strstr(ks_last_error(), "x: required") != NULL);
}

static void test_threads(void) {
  const ks_api_t *api;
  ks_get_api(7, 0, &api); /* this thread: a version message */
  pthread_t th;
  void *ok = NULL;
  CHECK(pthread_create(&th, NULL, other_thread, NULL) == 0);
  CHECK(pthread_join(th, &ok) == 0);
  CHECK(ok == (void *)1);
  CHECK(strstr(ks_last_error(), "major") != NULL);
}

/* ---- conversions (halfs.c, compiled into this test) */
static float f32_of(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static void test_halfs(void) {
  int bad = 0;
  /* float16: every pattern round-trips; midpoints round to even; just above rounds up */
  for (uint32_t h = 0; h < 0x10000u; h++) {
    const float f = ks_f16_to_f32((uint16_t)h);
    if ((h & 0x7c00u) == 0x7c00u && (h & 0x3ffu)) {
      bad += !(f != f) || (ks_f32_to_f16(f) & 0x7fffu) <= 0x7c00u;
      continue;
    }
    bad += ks_f32_to_f16(f) != h;
    if ((h & 0x7fffu) < 0x7bffu) { /* finite with a finite successor */
      const float up = ks_f16_to_f32((uint16_t)(h + 1));
      const double mid = ((double)f + (double)up) / 2;
      const uint16_t even = (h & 1u) ? (uint16_t)(h + 1) : (uint16_t)h;
      bad += ks_f32_to_f16((float)mid) != even;
      bad += ks_f32_to_f16(nextafterf((float)mid, (h & 0x8000u) ? -INFINITY : INFINITY)) != (uint16_t)(h + 1);
    }
  }
  CHECK(bad == 0);
  CHECK(ks_f32_to_f16(65504.0f) == 0x7bffu && ks_f32_to_f16(65519.0f) == 0x7bffu && ks_f32_to_f16(65520.0f) == 0x7c00u);
  CHECK(ks_f32_to_f16(INFINITY) == 0x7c00u && ks_f32_to_f16(-INFINITY) == 0xfc00u && ks_f32_to_f16(-0.0f) == 0x8000u);
  CHECK(ks_f32_to_f16(f32_of(0x33000000u)) == 0 && ks_f32_to_f16(f32_of(0x33000001u)) == 1); /* 2^-25 ties to 0 */

  /* bfloat16 */
  bad = 0;
  for (uint32_t h = 0; h < 0x10000u; h++) {
    const float f = ks_bf16_to_f32((uint16_t)h);
    if ((h & 0x7f80u) == 0x7f80u && (h & 0x7fu)) {
      const float g = ks_bf16_to_f32(ks_f32_to_bf16(f));
      bad += !(g != g);
      continue;
    }
    bad += ks_f32_to_bf16(f) != h;
    if ((h & 0x7fffu) < 0x7f7fu) {
      const uint32_t mid = (h << 16) | 0x8000u; /* exactly halfway to h + 1 */
      bad += ks_f32_to_bf16(f32_of(mid)) != ((h & 1u) ? h + 1 : h);
      bad += ks_f32_to_bf16(f32_of(mid + 1)) != h + 1;
    }
  }
  CHECK(bad == 0);

  /* float8 e4m3fn: 256 patterns, 0x7f/0xff NaN, saturation at 448 */
  bad = 0;
  for (uint32_t b = 0; b < 256; b++) {
    const float f = ks_f8e4m3_to_f32((uint8_t)b);
    if ((b & 0x7fu) == 0x7fu) {
      bad += !(f != f) || (ks_f32_to_f8e4m3(f) & 0x7fu) != 0x7fu;
      continue;
    }
    bad += ks_f32_to_f8e4m3(f) != b;
    if ((b & 0x7fu) < 0x7eu) {
      const float up = ks_f8e4m3_to_f32((uint8_t)(b + 1));
      const float mid = (f + up) / 2; /* exact in float32 */
      bad += ks_f32_to_f8e4m3(mid) != ((b & 1u) ? b + 1 : b);
      bad += ks_f32_to_f8e4m3(nextafterf(mid, (b & 0x80u) ? -INFINITY : INFINITY)) != b + 1;
    }
  }
  CHECK(bad == 0);
  CHECK(ks_f8e4m3_to_f32(0x7e) == 448.0f && ks_f8e4m3_to_f32(0x01) == ldexpf(1.0f, -9));
  CHECK(ks_f32_to_f8e4m3(1e6f) == 0x7e && ks_f32_to_f8e4m3(-INFINITY) == 0xfe && ks_f32_to_f8e4m3(470.0f) == 0x7e);
}

int main(void) {
  test_versions();
  test_options();
  test_rms_norm();
  test_failures();
  test_cuda();
  test_ops();
  test_threads();
  test_halfs();
  printf("test_core: %d checks, %d failures\n", checks, failures);
  return failures ? 1 : 0;
}
