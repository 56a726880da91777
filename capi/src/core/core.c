/* core.c: library-level entry points (version, build info, status names, ks_get_api,
 * ks_query_support) and the helpers every op file uses around one call. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L /* pthread_once */
#endif
#include <pthread.h>
#include <stdio.h>

#include "ks_internal.h"

#ifndef KS_VERSION_STRING
#define KS_VERSION_STRING "unknown"
#endif

void ks_call_begin(ks_call *c, ks_stream_t stream, int dry_run) {
  memset(c, 0, sizeof *c);
  c->stream = stream;
  c->dry_run = dry_run;
  ks_clear_error();
}

KS_API const char *ks_status_name(ks_status_t s) {
  switch (s) {
    case KS_OK: return "KS_OK";
    case KS_ERR_INVALID_ARGUMENT: return "KS_ERR_INVALID_ARGUMENT";
    case KS_ERR_UNSUPPORTED_DTYPE: return "KS_ERR_UNSUPPORTED_DTYPE";
    case KS_ERR_UNSUPPORTED_SHAPE: return "KS_ERR_UNSUPPORTED_SHAPE";
    case KS_ERR_UNSUPPORTED_LAYOUT: return "KS_ERR_UNSUPPORTED_LAYOUT";
    case KS_ERR_UNSUPPORTED_DEVICE: return "KS_ERR_UNSUPPORTED_DEVICE";
    case KS_ERR_UNSUPPORTED_ARCH: return "KS_ERR_UNSUPPORTED_ARCH";
    case KS_ERR_CUDA: return "KS_ERR_CUDA";
    case KS_ERR_OUT_OF_MEMORY: return "KS_ERR_OUT_OF_MEMORY";
    case KS_ERR_NOT_IMPLEMENTED: return "KS_ERR_NOT_IMPLEMENTED";
    case KS_ERR_VERSION: return "KS_ERR_VERSION";
    case KS_ERR_INTERNAL: return "KS_ERR_INTERNAL";
    default: return "KS_ERR_UNKNOWN";
  }
}

static char build_info[512];
static pthread_once_t build_once = PTHREAD_ONCE_INIT;

static void make_build_info(void) {
  if (ks_cuda_num_variants > 0) {
    snprintf(build_info, sizeof build_info, "kernelset %s; abi %d.%d; cuda: %s (%d kernel variants, generated %.12s)",
             KS_VERSION_STRING, KS_ABI_VERSION_MAJOR, KS_ABI_VERSION_MINOR, ks_cuda_build_archs,
             (int)ks_cuda_num_variants, ks_cuda_build_hash);
  } else {
    snprintf(build_info, sizeof build_info, "kernelset %s; abi %d.%d; cuda: none (no kernels compiled in)",
             KS_VERSION_STRING, KS_ABI_VERSION_MAJOR, KS_ABI_VERSION_MINOR);
  }
}

KS_API const char *ks_build_info(void) {
  pthread_once(&build_once, make_build_info);
  return build_info;
}

KS_API void ks_abi_version(int32_t *major, int32_t *minor) {
  if (major) *major = KS_ABI_VERSION_MAJOR;
  if (minor) *minor = KS_ABI_VERSION_MINOR;
}

ks_status_t ks_not_on_cuda(const ks_call *c, const char *op) {
  (void)c;
  return ks_fail(KS_ERR_NOT_IMPLEMENTED, "%s: no CUDA kernel for this op in this build (CPU tensors are supported)",
                 op);
}

ks_status_t ks_query_arity(int32_t n, int32_t want, const char *op) {
  if (n == want) return KS_OK;
  return ks_fail(KS_ERR_INVALID_ARGUMENT, "tensors: %s takes %d tensors, got %d", op, (int)want, (int)n);
}

KS_API ks_status_t ks_query_support(ks_op_t op, const DLTensor *const *tensors, int32_t num_tensors,
                                    const void *options) {
  ks_clear_error();
  if (num_tensors < 0) return ks_fail(KS_ERR_INVALID_ARGUMENT, "num_tensors: negative (%d)", (int)num_tensors);
  if (tensors == NULL && num_tensors > 0) return ks_fail(KS_ERR_INVALID_ARGUMENT, "tensors: NULL");
  return ks_query_op(op, tensors, num_tensors, options);
}

/* ---- CUDA dispatch helpers (KS_CUDA_DISPATCH) */

ks_status_t ks_cuda_result(ks_status_t s, const char *op) {
  if (s != KS_OK && ks_error_buffer()[0] == '\0') ks_fail(s, "%s: %s", op, ks_status_name(s));
  return s;
}

/* ---- the function table (ks_api_table_v1: ops_table.c) */

KS_API ks_status_t ks_get_api(int32_t major, int32_t min_minor, const ks_api_t **table) {
  ks_clear_error();
  if (table == NULL) return ks_fail(KS_ERR_INVALID_ARGUMENT, "table: NULL");
  *table = NULL;
  if (major != KS_ABI_VERSION_MAJOR)
    return ks_fail(KS_ERR_VERSION, "major: this library implements ABI %d.%d, not major %d", KS_ABI_VERSION_MAJOR,
                   KS_ABI_VERSION_MINOR, (int)major);
  if (min_minor > KS_ABI_VERSION_MINOR)
    return ks_fail(KS_ERR_VERSION, "min_minor: this library implements ABI %d.%d, older than the %d.%d requested",
                   KS_ABI_VERSION_MAJOR, KS_ABI_VERSION_MINOR, (int)major, (int)min_minor);
  *table = &ks_api_table_v1;
  return KS_OK;
}
