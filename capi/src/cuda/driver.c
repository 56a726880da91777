/* driver.c: the CUDA driver, loaded at run time (dlopen "libcuda.so.1"), once per process.
 *
 * No cuda.h: the prototypes come from ks_cuda_driver.h with ABI-identical plain types (checked
 * against a real cuda.h by tests/test_capi_aot.py). A machine without the driver gets
 * KS_ERR_CUDA and "libcuda.so.1 not found: <dlerror>" from every CUDA entry point, never a crash.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "ks_cuda.h"
#include "ks_cuda_internal.h"

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static ks_driver_table g_cu;
static ks_status_t g_status = KS_ERR_CUDA;
static char g_message[512];
static ks_cuda_tools g_tools;

void ks_cuda_errorf(char *err, size_t errlen, const char *fmt, ...) {
  if (!err || !errlen) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
}

static void load_driver(void) {
  /* RTLD_LOCAL: the driver's symbols stay out of the global namespace of the host process. */
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char *why = dlerror();
    snprintf(g_message, sizeof g_message, "libcuda.so.1 not found: %s (no NVIDIA driver on this machine?)",
             why ? why : "dlopen failed");
    return;
  }
#define KS_FN_LOAD(name, sym, params)                                                                \
  {                                                                                                  \
    void *p = dlsym(lib, sym);                                                                       \
    if (!p) {                                                                                        \
      snprintf(g_message, sizeof g_message, "libcuda.so.1 has no symbol %s (driver too old?)", sym); \
      return;                                                                                        \
    }                                                                                                \
    memcpy(&g_cu.name, &p, sizeof p);                                                                \
  }
  KS_CU_FUNCS(KS_FN_LOAD)
#undef KS_FN_LOAD
  int res = g_cu.cuInit(0);
  if (res != KS_CUDA_SUCCESS) {
    const char *name = NULL;
    if (g_cu.cuGetErrorName(res, &name) != KS_CUDA_SUCCESS) name = NULL;
    snprintf(g_message, sizeof g_message, "cuInit failed: %s (%d)", name ? name : "unknown CUresult", res);
    return;
  }
  /* The tool table re-types a few driver functions with stdint types of the same ABI. */
  memcpy(&g_tools.cuMemAlloc, &g_cu.cuMemAlloc, sizeof(void *));
  memcpy(&g_tools.cuMemFree, &g_cu.cuMemFree, sizeof(void *));
  memcpy(&g_tools.cuMemcpyHtoD, &g_cu.cuMemcpyHtoD, sizeof(void *));
  memcpy(&g_tools.cuMemcpyDtoH, &g_cu.cuMemcpyDtoH, sizeof(void *));
  memcpy(&g_tools.cuCtxSynchronize, &g_cu.cuCtxSynchronize, sizeof(void *));
  memcpy(&g_tools.cuCtxSetCurrent, &g_cu.cuCtxSetCurrent, sizeof(void *));
  memcpy(&g_tools.cuDevicePrimaryCtxRetain, &g_cu.cuDevicePrimaryCtxRetain, sizeof(void *));
  memcpy(&g_tools.cuDeviceGet, &g_cu.cuDeviceGet, sizeof(void *));
  memcpy(&g_tools.cuGetErrorName, &g_cu.cuGetErrorName, sizeof(void *));
  g_status = KS_OK;
}

ks_status_t ks_cuda_init(char *err, size_t errlen) {
  pthread_once(&g_once, load_driver);
  if (g_status != KS_OK) ks_cuda_errorf(err, errlen, "%s", g_message);
  return g_status;
}

const ks_cuda_tools *ks_cuda_tools_get(void) {
  return ks_cuda_init(NULL, 0) == KS_OK ? &g_tools : NULL;
}

const ks_driver_table *ks_cu(void) { return g_status == KS_OK ? &g_cu : NULL; }

ks_status_t ks_cuda_check(int res, const char *what, char *err, size_t errlen) {
  if (res == KS_CUDA_SUCCESS) return KS_OK;
  const char *name = NULL, *desc = NULL;
  if (g_status == KS_OK) {
    if (g_cu.cuGetErrorName(res, &name) != KS_CUDA_SUCCESS) name = NULL;
    if (g_cu.cuGetErrorString(res, &desc) != KS_CUDA_SUCCESS) desc = NULL;
  }
  ks_cuda_errorf(err, errlen, "%s: %s (%s)", what, name ? name : "CUDA error", desc ? desc : "no description");
  switch (res) {
    case KS_CUDA_ERROR_OUT_OF_MEMORY:
      return KS_ERR_OUT_OF_MEMORY;
    case KS_CUDA_ERROR_NO_BINARY_FOR_GPU:
    case KS_CUDA_ERROR_INVALID_PTX:
    case KS_CUDA_ERROR_UNSUPPORTED_PTX_VERSION:
      return KS_ERR_UNSUPPORTED_ARCH;
    default:
      return KS_ERR_CUDA;
  }
}

/* ---- Devices: attributes read once per ordinal. */
#define KS_MAX_DEVICES 64
static pthread_mutex_t g_dev_mu = PTHREAD_MUTEX_INITIALIZER;
static ks_cuda_device_info g_dev[KS_MAX_DEVICES];
static int g_dev_ok[KS_MAX_DEVICES];
static void *g_primary[KS_MAX_DEVICES];

ks_status_t ks_cuda_device(int device, ks_cuda_device_info *info, char *err, size_t errlen) {
  ks_status_t s = ks_cuda_init(err, errlen);
  if (s != KS_OK) return s;
  if (device < 0 || device >= KS_MAX_DEVICES) {
    ks_cuda_errorf(err, errlen, "CUDA device %d out of range [0, %d)", device, KS_MAX_DEVICES);
    return KS_ERR_UNSUPPORTED_DEVICE;
  }
  pthread_mutex_lock(&g_dev_mu);
  if (!g_dev_ok[device]) {
    int count = 0;
    s = ks_cuda_check(g_cu.cuDeviceGetCount(&count), "cuDeviceGetCount", err, errlen);
    if (s == KS_OK && device >= count) {
      ks_cuda_errorf(err, errlen, "CUDA device %d does not exist (%d device%s)", device, count, count == 1 ? "" : "s");
      s = KS_ERR_UNSUPPORTED_DEVICE;
    }
    KS_CUdevice dev = 0;
    int major = 0, minor = 0, sms = 0, optin = 0;
    if (s == KS_OK) s = ks_cuda_check(g_cu.cuDeviceGet(&dev, device), "cuDeviceGet", err, errlen);
    if (s == KS_OK)
      s = ks_cuda_check(g_cu.cuDeviceGetAttribute(&major, KS_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev),
                        "cuDeviceGetAttribute(COMPUTE_CAPABILITY_MAJOR)", err, errlen);
    if (s == KS_OK)
      s = ks_cuda_check(g_cu.cuDeviceGetAttribute(&minor, KS_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev),
                        "cuDeviceGetAttribute(COMPUTE_CAPABILITY_MINOR)", err, errlen);
    if (s == KS_OK)
      s = ks_cuda_check(g_cu.cuDeviceGetAttribute(&sms, KS_CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev),
                        "cuDeviceGetAttribute(MULTIPROCESSOR_COUNT)", err, errlen);
    if (s == KS_OK)
      s = ks_cuda_check(
          g_cu.cuDeviceGetAttribute(&optin, KS_CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, dev),
          "cuDeviceGetAttribute(MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)", err, errlen);
    if (s == KS_OK) {
      g_dev[device].ordinal = device;
      g_dev[device].cc = major * 10 + minor;
      g_dev[device].sm_count = sms;
      g_dev[device].max_shared_optin = optin;
      g_dev_ok[device] = 1;
    }
  }
  if (s == KS_OK && info) *info = g_dev[device];
  pthread_mutex_unlock(&g_dev_mu);
  return s;
}

ks_status_t ks_cuda_pointer_device(const void *ptr, int *device, char *err, size_t errlen) {
  ks_status_t s = ks_cuda_init(err, errlen);
  if (s != KS_OK) return s;
  int ordinal = -1;
  int res = g_cu.cuPointerGetAttribute(&ordinal, KS_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, (KS_CUdeviceptr)(uintptr_t)ptr);
  if (res != KS_CUDA_SUCCESS) {
    char why[256];
    ks_cuda_check(res, "cuPointerGetAttribute(DEVICE_ORDINAL)", why, sizeof why);
    ks_cuda_errorf(err, errlen, "pointer %p is not CUDA memory the driver knows (%s)", ptr, why);
    return KS_ERR_UNSUPPORTED_DEVICE;
  }
  if (device) *device = ordinal;
  return KS_OK;
}

/* The context to run on `device` from the calling thread: the current one when it belongs to
 * `device`, else the device's primary context (retained once, kept for the process), pushed. */
ks_status_t ks_cuda_enter(int device, void **ctx, int *pushed, char *err, size_t errlen) {
  *pushed = 0;
  KS_CUcontext cur = NULL;
  ks_status_t s = ks_cuda_check(g_cu.cuCtxGetCurrent(&cur), "cuCtxGetCurrent", err, errlen);
  if (s != KS_OK) return s;
  if (cur) {
    KS_CUdevice d = -1;
    s = ks_cuda_check(g_cu.cuCtxGetDevice(&d), "cuCtxGetDevice", err, errlen);
    if (s != KS_OK) return s;
    KS_CUdevice want = 0;
    s = ks_cuda_check(g_cu.cuDeviceGet(&want, device), "cuDeviceGet", err, errlen);
    if (s != KS_OK) return s;
    if (d == want) {
      *ctx = cur;
      return KS_OK;
    }
  }
  pthread_mutex_lock(&g_dev_mu);
  if (!g_primary[device]) {
    KS_CUdevice dev = 0;
    s = ks_cuda_check(g_cu.cuDeviceGet(&dev, device), "cuDeviceGet", err, errlen);
    KS_CUcontext p = NULL;
    if (s == KS_OK) s = ks_cuda_check(g_cu.cuDevicePrimaryCtxRetain(&p, dev), "cuDevicePrimaryCtxRetain", err, errlen);
    if (s == KS_OK) g_primary[device] = p;
  }
  KS_CUcontext primary = g_primary[device];
  pthread_mutex_unlock(&g_dev_mu);
  if (s != KS_OK) return s;
  s = ks_cuda_check(g_cu.cuCtxPushCurrent(primary), "cuCtxPushCurrent", err, errlen);
  if (s != KS_OK) return s;
  *pushed = 1;
  *ctx = primary;
  return KS_OK;
}

void ks_cuda_leave(int pushed) {
  if (pushed) {
    KS_CUcontext popped = NULL;
    (void)g_cu.cuCtxPopCurrent(&popped);
  }
}
