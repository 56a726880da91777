/* example.c: calling kernelset from C through its one dynamic entry point, ks_get_api.
 *
 * Loads libkernelset.so with dlopen (as a plugin host or a language runtime would), asks for the
 * ABI 1 function table, and runs rms_norm on a small CPU tensor with Gemma-style options,
 * checking the result against a plain loop.
 *
 *   gcc -std=c99 -Icapi/include capi/examples/example.c -ldl -lm -o example
 *   ./example src/kernelset/capi/lib/libkernelset.so
 */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>

#include "kernelset.h"

typedef ks_status_t (*get_api_fn)(int32_t, int32_t, const ks_api_t **);

int main(int argc, char **argv) {
  const char *path = argc > 1 ? argv[1] : "libkernelset.so";
  void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    fprintf(stderr, "example: cannot load %s: %s\n", path, dlerror());
    return 2;
  }
  get_api_fn get_api;
  *(void **)(&get_api) = dlsym(lib, "ks_get_api"); /* POSIX: data and function pointers convert */
  const ks_api_t *ks = NULL;
  if (!get_api || get_api(KS_ABI_VERSION_MAJOR, KS_ABI_VERSION_MINOR, &ks) != KS_OK) {
    fprintf(stderr, "example: no ABI %d.%d table in %s\n", KS_ABI_VERSION_MAJOR, KS_ABI_VERSION_MINOR, path);
    return 2;
  }
  printf("%s\n", ks->build_info());

  /* x [2, 4] float32 on the CPU, weight [4]; Gemma: y = x * rstd * (1 + w), rounded once */
  float x[8] = {1, 2, 3, 4, -1, 0.5f, 0.25f, 2};
  float w[4] = {0.1f, -0.2f, 0.3f, 0.0f};
  float y[8];
  int64_t xshape[2] = {2, 4}, wshape[1] = {4};
  DLTensor tx = {x, {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, xshape, NULL, 0};
  DLTensor tw = {w, {kDLCPU, 0}, 1, {kDLFloat, 32, 1}, wshape, NULL, 0};
  DLTensor ty = {y, {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, xshape, NULL, 0};

  ks_rms_norm_options opt;
  ks->options_init(KS_OP_RMS_NORM, &opt, sizeof opt);
  opt.eps = 1e-5f;
  opt.offset = 1.0f;
  opt.cast = KS_NORM_CAST_GEMMA;

  const DLTensor *args[3] = {&tx, &tw, &ty};
  ks_status_t s = ks->query_support(KS_OP_RMS_NORM, args, 3, &opt);
  if (s == KS_OK) s = ks->rms_norm(&tx, &tw, &ty, &opt, NULL);
  if (s != KS_OK) {
    fprintf(stderr, "example: rms_norm failed: %s: %s\n", ks->status_name(s), ks->last_error());
    return 1;
  }
  int wrong = 0;
  for (int r = 0; r < 2; r++) {
    float ss = 0;
    for (int j = 0; j < 4; j++) ss += x[r * 4 + j] * x[r * 4 + j];
    const float rstd = 1.0f / sqrtf(ss / 4 + opt.eps);
    for (int j = 0; j < 4; j++) {
      const float want = x[r * 4 + j] * rstd * (1.0f + w[j]);
      printf("%s%.6f", j ? " " : "y[0..3] = ", (double)y[r * 4 + j]);
      wrong += fabsf(y[r * 4 + j] - want) > 1e-5f;
    }
    printf("\n");
  }

  /* a bad call: the status and the thread's message say what is wrong */
  int64_t bad_shape[1] = {3};
  DLTensor tbad = {w, {kDLCPU, 0}, 1, {kDLFloat, 32, 1}, bad_shape, NULL, 0};
  s = ks->rms_norm(&tx, &tbad, &ty, &opt, NULL);
  printf("bad weight -> %s: %s\n", ks->status_name(s), ks->last_error());
  wrong += s != KS_ERR_INVALID_ARGUMENT;

  dlclose(lib);
  printf(wrong ? "example: MISMATCH\n" : "example: ok\n");
  return wrong ? 1 : 0;
}
