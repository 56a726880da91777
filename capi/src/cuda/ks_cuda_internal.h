/* ks_cuda_internal.h: what driver.c shares with launch.c (the loaded driver table, contexts). */
#ifndef KS_CUDA_INTERNAL_H_
#define KS_CUDA_INTERNAL_H_

#include <stddef.h>

#include "ks_cuda.h"
#include "ks_cuda_driver.h"

/* Plain C types of the same ABI as cuda.h's (x86-64 and aarch64 Linux). */
typedef int KS_CUresult;
typedef int KS_CUdevice;
typedef void *KS_CUcontext;
typedef void *KS_CUmodule;
typedef void *KS_CUfunction;
typedef void *KS_CUstream;
typedef unsigned long long KS_CUdeviceptr;
typedef int KS_CUdevice_attribute;
typedef int KS_CUfunction_attribute;
typedef int KS_CUpointer_attribute;
typedef int KS_CUjit_option;
typedef int KS_CUstreamCaptureStatus;

#define KS_CONST_ENUM(ours, theirs, value) ours = value,
enum { KS_CU_CONSTS(KS_CONST_ENUM) KS_CU_CONSTS_END_ };
#undef KS_CONST_ENUM

#define KS_FN_FIELD(name, sym, params) KS_CUresult(*name) params;
typedef struct {
  KS_CU_FUNCS(KS_FN_FIELD)
} ks_driver_table;
#undef KS_FN_FIELD

/* The loaded table, or NULL before a successful ks_cuda_init. */
const ks_driver_table *ks_cu(void);

/* Makes a context of `device` current on this thread (see driver.c); ks_cuda_leave undoes it. */
ks_status_t ks_cuda_enter(int device, void **ctx, int *pushed, char *err, size_t errlen);
void ks_cuda_leave(int pushed);

#endif /* KS_CUDA_INTERNAL_H_ */
