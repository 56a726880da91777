/* fake_cuda.c: a stand-in libcuda.so.1 for tests on machines without a GPU. It implements the
 * driver entry points capi/src/cuda loads (ks_cuda_driver.h) for one pretend device (sm_90, 132
 * SMs: an H100) and, instead of running kernels, records each cuLaunchKernel: the function's
 * entry name and image, grid, block, dynamic shared memory, stream and the first 8 bytes of every
 * argument (ks_cuda_launch NULL-terminates its parameter array; every argument is at most 8
 * bytes). cuMemAlloc hands out fake addresses and never touches them; copies to the device are
 * dropped and copies back read zeros (the smoke program runs, and mismatches, everywhere).
 *
 *   gcc -shared -fPIC -Wl,-soname,libcuda.so.1 fake_cuda.c -o libcuda.so.1
 *
 * tests/test_capi_aot.py loads it before libkernelset, so the library's dlopen("libcuda.so.1")
 * finds it, then reads the log with fake_cuda_launches / fake_cuda_launch. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
#define FAKE_MAX_LAUNCHES 256
#define FAKE_MAX_ARGS 64

typedef struct {
  const char *image;
  char name[128];
} fake_function;

typedef struct {
  char name[128];
  const void *image;
  unsigned grid[3], block[3], shared;
  void *stream;
  int num_args;
  uint64_t args[FAKE_MAX_ARGS];
} fake_launch;

static fake_launch g_log[FAKE_MAX_LAUNCHES];
static int g_count;
static void *g_current;
static uint64_t g_next_alloc = 0x7e0000000000ull;
static int g_ctx_token;
static int g_capturing, g_allocs;

/* what cuStreamIsCapturing answers (1: CU_STREAM_CAPTURE_STATUS_ACTIVE), and cuMemAlloc calls so far */
void fake_cuda_set_capturing(int on) { g_capturing = on; }
int fake_cuda_allocs(void) { return g_allocs; }

int fake_cuda_launches(void) { return g_count; }
void fake_cuda_reset(void) { g_count = 0; }
/* copies launch i into *out (sizeof(fake_launch) bytes: see the struct above); 0 or -1 */
int fake_cuda_launch(int i, fake_launch *out) {
  if (i < 0 || i >= g_count) return -1;
  *out = g_log[i];
  return 0;
}
int fake_cuda_launch_size(void) { return (int)sizeof(fake_launch); }

CUresult cuInit(unsigned int flags) { return flags == 0 ? 0 : 1; }
CUresult cuDriverGetVersion(int *v) { *v = 12080; return 0; }
CUresult cuGetErrorName(CUresult e, const char **s) { *s = e ? "CUDA_ERROR_FAKE" : "CUDA_SUCCESS"; return 0; }
CUresult cuGetErrorString(CUresult e, const char **s) { *s = e ? "fake driver error" : "no error"; return 0; }
CUresult cuDeviceGet(int *dev, int ordinal) {
  if (ordinal != 0) return 101; /* CUDA_ERROR_INVALID_DEVICE */
  *dev = 0;
  return 0;
}
CUresult cuDeviceGetCount(int *n) { *n = 1; return 0; }
CUresult cuDeviceGetAttribute(int *v, int attr, int dev) {
  (void)dev;
  switch (attr) {
    case 16: *v = 132; return 0;    /* MULTIPROCESSOR_COUNT */
    case 75: *v = 9; return 0;      /* COMPUTE_CAPABILITY_MAJOR */
    case 76: *v = 0; return 0;      /* COMPUTE_CAPABILITY_MINOR */
    case 97: *v = 232448; return 0; /* MAX_SHARED_MEMORY_PER_BLOCK_OPTIN */
    default: return 1;
  }
}
CUresult cuDevicePrimaryCtxRetain(void **ctx, int dev) {
  (void)dev;
  *ctx = &g_ctx_token;
  return 0;
}
CUresult cuCtxGetCurrent(void **ctx) { *ctx = g_current; return 0; }
CUresult cuCtxSetCurrent(void *ctx) { g_current = ctx; return 0; }
CUresult cuCtxPushCurrent_v2(void *ctx) { g_current = ctx; return 0; }
CUresult cuCtxPopCurrent_v2(void **ctx) {
  if (ctx) *ctx = g_current;
  g_current = NULL;
  return 0;
}
CUresult cuCtxGetDevice(int *dev) { *dev = 0; return 0; }
CUresult cuCtxSynchronize(void) { return 0; }
CUresult cuModuleLoadData(void **mod, const void *image) { *mod = (void *)image; return 0; }
CUresult cuModuleLoadDataEx(void **mod, const void *image, unsigned n, int *o, void **v) {
  (void)n, (void)o, (void)v;
  *mod = (void *)image;
  return 0;
}
CUresult cuModuleGetFunction(void **f, void *mod, const char *name) {
  fake_function *fn = calloc(1, sizeof *fn);
  if (!fn) return 2;
  fn->image = mod;
  strncpy(fn->name, name, sizeof fn->name - 1);
  *f = fn;
  return 0;
}
CUresult cuFuncSetAttribute(void *f, int attr, int value) { (void)f, (void)attr, (void)value; return 0; }
CUresult cuFuncGetAttribute(int *v, int attr, void *f) { (void)attr, (void)f; *v = 0; return 0; }
CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned shared, void *stream, void **params, void **extra) {
  if (extra || g_count == FAKE_MAX_LAUNCHES || !g_current) return 1;
  fake_launch *l = &g_log[g_count++];
  const fake_function *fn = f;
  memset(l, 0, sizeof *l);
  memcpy(l->name, fn->name, sizeof l->name);
  l->image = fn->image;
  l->grid[0] = gx, l->grid[1] = gy, l->grid[2] = gz;
  l->block[0] = bx, l->block[1] = by, l->block[2] = bz;
  l->shared = shared;
  l->stream = stream;
  for (int i = 0; params && params[i] && i < FAKE_MAX_ARGS; i++) {
    memcpy(&l->args[i], params[i], 8);
    l->num_args = i + 1;
  }
  return 0;
}
CUresult cuPointerGetAttribute(void *data, int attr, uint64_t ptr) {
  (void)attr, (void)ptr;
  *(int *)data = 0;
  return 0;
}
CUresult cuMemAlloc_v2(uint64_t *p, size_t bytes) {
  if (g_capturing) return 900; /* CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: the library must not get here */
  g_allocs++;
  *p = g_next_alloc;
  g_next_alloc += (bytes + 0xfffff) & ~(uint64_t)0xfffff;
  return 0;
}
CUresult cuMemFree_v2(uint64_t p) { (void)p; return 0; }
/* stream-ordered allocations (what a captured call uses): allowed during capture, counted */
static int g_async_allocs, g_async_frees;
int fake_cuda_async_allocs(void) { return g_async_allocs; }
int fake_cuda_async_frees(void) { return g_async_frees; }
CUresult cuMemAllocAsync(uint64_t *p, size_t bytes, void *stream) {
  (void)stream;
  g_async_allocs++;
  *p = g_next_alloc;
  g_next_alloc += (bytes + 0xfffff) & ~(uint64_t)0xfffff;
  return 0;
}
CUresult cuMemFreeAsync(uint64_t p, void *stream) {
  (void)p, (void)stream;
  g_async_frees++;
  return 0;
}
/* no memory behind the fake addresses: copies in are dropped, copies out read zeros */
CUresult cuMemcpyHtoD_v2(uint64_t d, const void *s, size_t n) { (void)d, (void)s, (void)n; return 0; }
CUresult cuMemcpyDtoH_v2(void *d, uint64_t s, size_t n) {
  (void)s;
  memset(d, 0, n);
  return 0;
}
CUresult cuStreamIsCapturing(void *stream, int *status) {
  (void)stream;
  *status = g_capturing;
  return 0;
}
