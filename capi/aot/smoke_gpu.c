/* smoke_gpu.c: run AOT-compiled kernels (rms_norm / fused_add_rms_norm, silu_and_mul, paged
 * attention decode) on a real GPU through kernelset's CUDA launcher alone (no torch, no Python)
 * and check them against a CPU computation.
 *
 *   scripts/capi_gpu_check.py builds and runs it (gcc smoke_gpu.c, the .c files of capi/src/cuda
 *   and capi/generated, -ldl -lpthread -lm), then ./smoke_gpu [device]
 *
 * Its shapes are cases of the generator's test set (capi/aot/ops): fused_add_rms_norm [1, 4096] runs
 * the fallback (align16) variant, everything else the exact ones; paged attention runs split-KV
 * through a workspace (4 splits + the reduce kernel) and one pass with the LSE discarded.
 *
 * Exit status: 0 every case matched; 1 a mismatch or a failed launch; 2 no usable CUDA device
 * (nothing was run). Inputs are pseudo-random, never zero; outputs are filled with NaN before
 * each launch, so an element a kernel does not write fails. The CPU side mirrors the kernels'
 * roundings (Llama: the normalized value is rounded to the storage dtype before the weight
 * multiply; silu_and_mul: silu(gate) is rounded before the multiply), with fp32 statistics, so
 * the tolerance only covers summation order and exp/sigmoid rounding (bf16: 2^-6 relative;
 * fp32: 2e-5 relative).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ks_cuda.h"
#include "ks_cuda_ops.h"

static const ks_cuda_tools *cu;
static int failures;

static uint16_t f2bf(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0; /* NaN */
  u += 0x7fffu + ((u >> 16) & 1u);                     /* round to nearest even */
  return (uint16_t)(u >> 16);
}
static float bf2f(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static float round_bf(float f) { return bf2f(f2bf(f)); }

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float uniform(void) { /* in [-2, 2), never exactly 0 */
  rng = rng * 6364136223846793005ull + 1442695040888963407ull;
  float v = (float)((rng >> 40) & 0xffffff) / 16777216.0f * 4.0f - 2.0f;
  return v == 0.0f ? 0.5f : v;
}

/* host buffers hold floats; device buffers hold `dt` (KS_DT_F32 or KS_DT_BF16) */
static size_t esize(int dt) { return dt == KS_DT_F32 ? 4 : 2; }

static uint64_t upload(const float *h, size_t n, int dt) {
  uint64_t d = 0;
  size_t bytes = n * esize(dt);
  if (cu->cuMemAlloc(&d, bytes ? bytes : 16) != 0) {
    fprintf(stderr, "cuMemAlloc(%zu) failed\n", bytes);
    exit(1);
  }
  void *tmp = malloc(bytes ? bytes : 1);
  for (size_t i = 0; i < n; i++) {
    if (dt == KS_DT_F32) ((float *)tmp)[i] = h[i];
    else ((uint16_t *)tmp)[i] = f2bf(h[i]);
  }
  if (bytes && cu->cuMemcpyHtoD(d, tmp, bytes) != 0) {
    fprintf(stderr, "cuMemcpyHtoD failed\n");
    exit(1);
  }
  free(tmp);
  return d;
}

static uint64_t poisoned(size_t n, int dt) {
  float *nan = malloc((n ? n : 1) * sizeof(float));
  for (size_t i = 0; i < n; i++) nan[i] = NAN;
  uint64_t d = upload(nan, n, dt);
  free(nan);
  return d;
}

static void download(float *h, uint64_t d, size_t n, int dt) {
  void *tmp = malloc(n * esize(dt) + 1);
  if (cu->cuCtxSynchronize() != 0 || cu->cuMemcpyDtoH(tmp, d, n * esize(dt)) != 0) {
    fprintf(stderr, "synchronize / cuMemcpyDtoH failed (a kernel faulted?)\n");
    exit(1);
  }
  for (size_t i = 0; i < n; i++) h[i] = dt == KS_DT_F32 ? ((float *)tmp)[i] : bf2f(((uint16_t *)tmp)[i]);
  free(tmp);
}

static float storage(float v, int dt) { return dt == KS_DT_F32 ? v : round_bf(v); }

static void compare_tol(const char *what, const float *got, const float *want, size_t n, double rel, double abs_tol) {
  double worst = 0.0;
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < n; i++) {
    double tol = rel * fabs(want[i]) + abs_tol;
    double e = fabs((double)got[i] - (double)want[i]);
    if (!(e <= tol)) { /* NaN fails too */
      if (!bad) first = i;
      bad++;
    }
    if (e > worst || isnan(e)) worst = isnan(e) ? INFINITY : e;
  }
  printf("  %-52s %s (max |error| %.3g over %zu values)\n", what, bad ? "MISMATCH" : "ok", worst, n);
  if (bad) {
    printf("    %zu bad; first at %zu: got %.8g want %.8g\n", bad, first, (double)got[first], (double)want[first]);
    failures++;
  }
}

static void compare(const char *what, const float *got, const float *want, size_t n, int dt) {
  /* bf16: two ulp at the bottom of a binade (a rounding flipped by the summation order, then
   * re-rounded after the weight); fp32: an fp32 sum over a row in another order */
  compare_tol(what, got, want, n, dt == KS_DT_F32 ? 2e-5 : 1.0 / 64, 1e-5);
}

static int check_status(ks_status_t s, const char *what, const char *err) {
  if (s == KS_OK) return 1;
  printf("  %-52s FAILED: status %d: %s\n", what, (int)s, err);
  failures++;
  return 0;
}

/* rms_norm (residual: fused_add_rms_norm) of an [m, n] tensor of dtype dt with weight in dt */
static void rms_norm_case(int device, int dt, int64_t m, int64_t n, int residual, int gemma, double offset) {
  char what[128], err[1024];
  snprintf(what, sizeof what, "%s %s [%lld, %lld]%s", residual ? "fused_add_rms_norm" : "rms_norm",
           dt == KS_DT_F32 ? "fp32" : "bf16", (long long)m, (long long)n, gemma ? " gemma" : "");
  size_t total = (size_t)(m * n);
  float *x = malloc(total * 4), *r = malloc(total * 4), *w = malloc((size_t)n * 4);
  float *y = malloc(total * 4), *h = malloc(total * 4), *want = malloc(total * 4), *want_h = malloc(total * 4);
  for (size_t i = 0; i < total; i++) x[i] = storage(uniform(), dt), r[i] = storage(uniform(), dt);
  for (int64_t i = 0; i < n; i++) w[i] = storage(uniform(), dt);
  uint64_t dx = upload(x, total, dt), dr = residual ? upload(r, total, dt) : 0, dw = upload(w, (size_t)n, dt);
  uint64_t dy = poisoned(total, dt), dh = residual ? poisoned(total, dt) : 0;
  const double eps = 1e-6;
  ks_status_t s = ks_cuda_norm_fwd_launch(device, NULL, err, sizeof err, dt, dt, (void *)(uintptr_t)dx,
                                          (void *)(uintptr_t)dr, (void *)(uintptr_t)dw, NULL, (void *)(uintptr_t)dy,
                                          (void *)(uintptr_t)dh, NULL, NULL, m, n, n, residual ? n : 0, n,
                                          residual ? n : 0, eps, offset, 1, gemma);
  if (check_status(s, what, err)) {
    for (int64_t i = 0; i < m; i++) {
      const float *xi = x + i * n;
      float *hi = want_h + i * n;
      double ss = 0.0;
      for (int64_t j = 0; j < n; j++) {
        hi[j] = residual ? storage(xi[j] + r[i * n + j], dt) : xi[j];
        ss += (double)hi[j] * hi[j];
      }
      float rstd = (float)(1.0 / sqrt(ss / (double)n + eps));
      for (int64_t j = 0; j < n; j++) {
        float xn = hi[j] * rstd, wj = (float)(w[j] + offset);
        want[i * n + j] = storage(gemma ? xn * wj : storage(xn, dt) * wj, dt);
      }
    }
    download(y, dy, total, dt);
    compare(what, y, want, total, dt);
    if (residual) {
      download(h, dh, total, dt);
      char hw[160];
      snprintf(hw, sizeof hw, "%s: residual out", what);
      compare(hw, h, want_h, total, dt);
    }
  }
  cu->cuMemFree(dx), cu->cuMemFree(dw), cu->cuMemFree(dy);
  if (residual) cu->cuMemFree(dr), cu->cuMemFree(dh);
  free(x), free(r), free(w), free(y), free(h), free(want), free(want_h);
}

/* silu_and_mul: x [m, 2i] -> y [m, i] */
static void silu_and_mul_case(int device, int dt, int64_t m, int64_t i) {
  char what[128], err[1024];
  snprintf(what, sizeof what, "silu_and_mul %s [%lld, 2*%lld]", dt == KS_DT_F32 ? "fp32" : "bf16", (long long)m,
           (long long)i);
  size_t nx = (size_t)(m * 2 * i), ny = (size_t)(m * i);
  float *x = malloc(nx * 4), *y = malloc(ny * 4), *want = malloc(ny * 4);
  for (size_t k = 0; k < nx; k++) x[k] = storage(uniform(), dt);
  uint64_t dx = upload(x, nx, dt), dy = poisoned(ny, dt);
  ks_status_t s = ks_cuda_act_fwd_launch(device, NULL, err, sizeof err, dt, (void *)(uintptr_t)dx, NULL,
                                         (void *)(uintptr_t)dy, m, i, 2 * i, 0, i, 0.0, 0.0, KS_ACT_SILU,
                                         KS_ACT_LAYOUT_HALVES);
  if (check_status(s, what, err)) {
    for (int64_t r = 0; r < m; r++)
      for (int64_t c = 0; c < i; c++) {
        float g = x[r * 2 * i + c], u = x[r * 2 * i + i + c];
        float a = g / (1.0f + expf(-g));
        want[r * i + c] = storage(storage(a, dt) * u, dt);
      }
    download(y, dy, ny, dt);
    compare(what, y, want, ny, dt);
  }
  cu->cuMemFree(dx), cu->cuMemFree(dy);
  free(x), free(y), free(want);
}

/* paged attention decode, the generator's LLAMA test case: q [3, 32, 128] bf16 over bf16 caches
 * [256, 16, 8, 128], block table [3, 64], max_seq_len 1024; with a workspace (split-KV) and LSE,
 * or without either. The reference is exact softmax attention in double over the bf16 inputs;
 * the kernel rounds P to bf16 before the PV product, hence the bf16 tolerance. */
static void paged_case(int device, const ks_cuda_device_info *info, int workspace) {
  enum { B = 3, HQ = 32, HKV = 8, D = 128, NB = 256, BS = 16, W = 64 };
  char what[128], err[1024];
  snprintf(what, sizeof what, "paged_attention decode bf16 [3, 32, 128] %s", workspace ? "split-KV" : "one pass");
  const int32_t lens[B] = {1024, 777, 1};
  const size_t nq = (size_t)B * HQ * D, ncache = (size_t)NB * BS * HKV * D;
  float *q = malloc(nq * 4), *kc = malloc(ncache * 4), *vc = malloc(ncache * 4), *out = malloc(nq * 4);
  float *want = malloc(nq * 4), *lse = malloc((size_t)B * HQ * 4), *want_lse = malloc((size_t)B * HQ * 4);
  int32_t table[B * W];
  for (size_t i = 0; i < nq; i++) q[i] = round_bf(uniform());
  for (size_t i = 0; i < ncache; i++) kc[i] = round_bf(uniform()), vc[i] = round_bf(uniform());
  for (int i = 0; i < B * W; i++) table[i] = (int32_t)((i * 37 + 11) % NB); /* scattered blocks */
  const double scale = 1.0 / sqrt((double)D);
  double *p = malloc(sizeof(double) * 1024);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < HQ; h++) {
      const int kvh = h / (HQ / HKV);
      const float *qv = q + ((size_t)b * HQ + h) * D;
      double m = -INFINITY, l = 0.0;
      for (int j = 0; j < lens[b]; j++) {
        const float *kv = kc + (((size_t)table[b * W + j / BS] * BS + j % BS) * HKV + kvh) * D;
        double s = 0.0;
        for (int d = 0; d < D; d++) s += (double)qv[d] * kv[d];
        p[j] = s * scale;
        if (p[j] > m) m = p[j];
      }
      for (int j = 0; j < lens[b]; j++) l += (p[j] = exp(p[j] - m));
      for (int d = 0; d < D; d++) {
        double acc = 0.0;
        for (int j = 0; j < lens[b]; j++)
          acc += p[j] * vc[(((size_t)table[b * W + j / BS] * BS + j % BS) * HKV + kvh) * D + d];
        want[((size_t)b * HQ + h) * D + d] = round_bf((float)(acc / l));
      }
      want_lse[b * HQ + h] = (float)(m + log(l));
    }
  uint64_t dq = upload(q, nq, KS_DT_BF16), dk = upload(kc, ncache, KS_DT_BF16), dv = upload(vc, ncache, KS_DT_BF16);
  uint64_t dout = poisoned(nq, KS_DT_BF16), dlse = workspace ? poisoned((size_t)B * HQ, KS_DT_F32) : 0, dbt = 0, dlen = 0,
           dws = 0;
  const int64_t ws_bytes = workspace ? ks_cuda_paged_attention_workspace_bytes(B, HQ, D, W * BS) : 0;
  if (cu->cuMemAlloc(&dbt, sizeof table) != 0 || cu->cuMemAlloc(&dlen, sizeof lens) != 0 ||
      (workspace && cu->cuMemAlloc(&dws, (size_t)ws_bytes) != 0) || cu->cuMemcpyHtoD(dbt, table, sizeof table) != 0 ||
      cu->cuMemcpyHtoD(dlen, lens, sizeof lens) != 0) {
    fprintf(stderr, "cuMemAlloc / cuMemcpyHtoD failed\n");
    exit(1);
  }
#define KS_P(x) ((void *)(uintptr_t)(x))
  ks_status_t s = ks_cuda_paged_attention_launch(
      device, NULL, err, sizeof err, KS_DT_BF16, KS_DT_BF16, KS_P(dq), KS_P(dk), KS_P(dv), KS_P(dbt), KS_P(dlen), NULL,
      NULL, NULL, NULL, KS_P(dout), KS_P(dlse), KS_P(dws), ws_bytes, B, B, HQ, HKV, D, NB, BS, W, 1, W * BS, HQ * D, D,
      BS * HKV * D, HKV * D, D, BS * HKV * D, HKV * D, D, W, scale, 0.0, -1, -1, 1);
#undef KS_P
  if (s == KS_ERR_NOT_IMPLEMENTED && !(info->cc == 90 && info->sm_count == 132)) {
    /* the split count follows the SM count: the test set holds the variants of an H100/H200 */
    printf("  %-52s skipped: sm_%d with %d SMs needs variants the test set (recorded for sm_90, 132 SMs) lacks\n",
           what, (int)info->cc, (int)info->sm_count);
  } else if (check_status(s, what, err)) {
    download(out, dout, nq, KS_DT_BF16);
    /* outputs are averages of ~N(0, 1) values (small): P's bf16 rounding is an absolute error */
    compare_tol(what, out, want, nq, 1.0 / 64, 2e-3);
    if (workspace) {
      char lw[160];
      snprintf(lw, sizeof lw, "%s: lse", what);
      download(lse, dlse, (size_t)B * HQ, KS_DT_F32);
      double worst = 0.0;
      for (int i = 0; i < B * HQ; i++) worst = fmax(worst, fabs((double)lse[i] - want_lse[i]));
      printf("  %-52s %s (max |error| %.3g)\n", lw, worst < 1e-3 ? "ok" : "MISMATCH", worst);
      if (!(worst < 1e-3)) failures++;
    }
  }
  cu->cuMemFree(dq), cu->cuMemFree(dk), cu->cuMemFree(dv), cu->cuMemFree(dout), cu->cuMemFree(dbt), cu->cuMemFree(dlen);
  if (workspace) cu->cuMemFree(dlse), cu->cuMemFree(dws);
  free(q), free(kc), free(vc), free(out), free(want), free(lse), free(want_lse), free(p);
}

int main(int argc, char **argv) {
  int device = argc > 1 ? atoi(argv[1]) : 0;
  char err[1024];
  if (ks_cuda_init(err, sizeof err) != KS_OK) {
    printf("smoke_gpu: no CUDA driver: %s\n", err);
    return 2;
  }
  ks_cuda_device_info info;
  if (ks_cuda_device(device, &info, err, sizeof err) != KS_OK) {
    printf("smoke_gpu: no CUDA device %d: %s\n", device, err);
    return 2;
  }
  cu = ks_cuda_tools_get();
  int dev = 0;
  void *ctx = NULL;
  if (cu->cuDeviceGet(&dev, device) != 0 || cu->cuDevicePrimaryCtxRetain(&ctx, dev) != 0 || cu->cuCtxSetCurrent(ctx) != 0) {
    printf("smoke_gpu: cannot make device %d's primary context current\n", device);
    return 2;
  }
  printf("smoke_gpu: device %d sm_%d, %d SMs; build %s; %d variants\n", device, info.cc, info.sm_count,
         ks_cuda_build_archs, (int)ks_cuda_num_variants);
  if (ks_cuda_num_variants > 0) {
    const ks_kernel_image *im = ks_cuda_select_image(&ks_cuda_variants[0], info.cc);
    printf("smoke_gpu: this device loads %s sm_%d images\n", im ? (im->kind == KS_IMAGE_CUBIN ? "cubin" : "PTX") : "no",
           im ? im->arch : 0);
  }
  rms_norm_case(device, KS_DT_BF16, 37, 4096, 0, 0, 0.0);     /* aligned variant, two-pass, 8 warps */
  rms_norm_case(device, KS_DT_BF16, 37, 4096, 0, 1, 1.0);     /* Gemma's (1 + w) */
  rms_norm_case(device, KS_DT_BF16, 37, 4096, 1, 0, 0.0);     /* fused add */
  rms_norm_case(device, KS_DT_F32, 5, 1000, 1, 0, 0.0);       /* unaligned variant */
  rms_norm_case(device, KS_DT_BF16, 3, 40000, 0, 0, 0.0);     /* looped kernel */
  rms_norm_case(device, KS_DT_BF16, 1, 4096, 1, 0, 0.0);      /* the fallback variant (no exact one for M = 1) */
  silu_and_mul_case(device, KS_DT_BF16, 37, 1024);
  silu_and_mul_case(device, KS_DT_F32, 5, 1000);
  silu_and_mul_case(device, KS_DT_BF16, 1, 14336);
  paged_case(device, &info, 1);
  paged_case(device, &info, 0);
  if (failures) {
    printf("smoke_gpu: %d FAILED\n", failures);
    return 1;
  }
  printf("smoke_gpu: all cases match\n");
  return 0;
}
