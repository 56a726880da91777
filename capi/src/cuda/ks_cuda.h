/* ks_cuda.h: internal API of the CUDA half of libkernelset.so (not installed, not part of the ABI).
 *
 * The kernels are the Python package's own Triton kernels, compiled ahead of time by
 * capi/aot/generate.py into capi/generated/ (cubins for sm_80/89/90, PTX for sm_90, a variant
 * table, and per-op plan/launch functions whose policy is translated from the Python launchers).
 * The CUDA driver is loaded at run time with dlopen("libcuda.so.1"): the library links against
 * libc/libdl/libpthread only and loads on machines without CUDA, where every CUDA entry point
 * returns KS_ERR_CUDA with "libcuda.so.1 not found: ...".
 *
 * Layers, bottom up:
 *   driver  (driver.c)  ks_cuda_driver(): the dlopen'ed function table, loaded once (pthread_once).
 *   launch  (launch.c)  ks_cuda_launch(): one kernel variant on one device/stream; modules are
 *                       loaded lazily per (CUDA context, variant) and cached; the binary is picked
 *                       for the device (exact cubin for its sm, else the newest PTX <= its sm).
 *   plans   (generated) ks_cuda_<op>_plan(plan, sms, cc, ...) computes, exactly like the Python
 *                       launcher on a GPU with `sms` multiprocessors and compute capability `cc`,
 *                       which variants run with which grid and arguments (no CUDA call: testable
 *                       on any machine); ks_cuda_<op>_launch() = device lookup + plan +
 *                       ks_cuda_plan_run(); ks_cuda_<op>_query() = device lookup + plan +
 *                       ks_cuda_plan_check() (the dry run of ks_query_support).
 *
 * Every function returns a ks_status_t of kernelset.h and, on failure, writes a message into
 * (err, errlen) when err is not NULL. Nothing here prints, aborts or allocates per launch.
 */
#ifndef KS_CUDA_H_
#define KS_CUDA_H_

#include <stddef.h>
#include <stdint.h>

#include "kernelset.h"

/* ---- Element types of kernel pointer arguments (part of a variant's key). */
enum {
  KS_DT_F32 = 1,
  KS_DT_F16 = 2,
  KS_DT_BF16 = 3,
  KS_DT_F8E4M3 = 4, /* float8_e4m3fn (Triton fp8e4nv) */
  KS_DT_F8E5M2 = 5,
  KS_DT_I8 = 6,
  KS_DT_U8 = 7,
  KS_DT_I16 = 8,
  KS_DT_I32 = 9,
  KS_DT_I64 = 10
};
/* KS_DT_* of a DLPack dtype (lanes 1), or 0 if kernels never take it. */
int ks_cuda_dtype_from_dl(DLDataType t);
const char *ks_cuda_dtype_name(int dt); /* "bf16" ..., "?" */

/* ---- Kernel binaries and variants (tables generated into capi/generated/ks_cuda_blobs.c). */
enum { KS_IMAGE_CUBIN = 0, KS_IMAGE_PTX = 1 };
typedef struct {
  int32_t arch;   /* 80, 89, 90: sm_XY (the cubin of 90 is sm_90a: H100/H200 only) */
  int32_t kind;   /* KS_IMAGE_* */
  const unsigned char *data; /* PTX: NUL-terminated text */
  size_t size;
  int32_t shared; /* dynamic shared memory bytes this image needs (Triton metadata.shared) */
} ks_kernel_image;

enum { KS_ARG_PTR = 0, KS_ARG_I32 = 1, KS_ARG_I64 = 2, KS_ARG_F32 = 3 };

typedef struct ks_kernel_variant {
  int32_t index;          /* position in ks_cuda_variants[] (module cache slot) */
  int32_t kernel;         /* position in ks_cuda_kernels[] */
  const char *entry;      /* function name in the module */
  const char *spec;       /* readable specialization: dtypes, constexprs, warps, alignment */
  int32_t num_warps;      /* block = 32 * num_warps threads, 1 x 1 */
  int32_t num_stages;
  int32_t num_ctas;       /* always 1 (the generator refuses clusters) */
  int32_t num_params;     /* every .param of the entry, hidden ones included */
  int32_t num_user_params;/* the kernel's non-constexpr, non-None parameters, in order */
  const uint8_t *param_kinds; /* KS_ARG_* of each param; hidden params are pointers, passed NULL */
  int32_t num_images;
  const ks_kernel_image *images;
} ks_kernel_variant;

/* A Triton kernel function and its compiled specializations, keyed for binary search. */
typedef struct {
  const char *name;         /* "_norm_fwd_kernel" */
  const char *module;       /* "kernelset.ops.norm.kernels" */
  int32_t num_params;       /* Python parameters, constexprs included */
  const char *const *param_names;
  const uint8_t *param_roles; /* KS_ROLE_* */
  const uint8_t *param_align; /* ints: 1 if the aligned specialization assumes value % 16 == 0 */
  int32_t key_len;          /* int64 slots in a key (see ks_cuda_kernel_key) */
  int32_t num_variants;
  const int64_t *keys;      /* num_variants * key_len, sorted */
  const int32_t *variants;  /* index into ks_cuda_variants[] of each key */
} ks_kernel_info;
enum { KS_ROLE_PTR = 0, KS_ROLE_INT = 1, KS_ROLE_FLOAT = 2, KS_ROLE_CONSTEXPR = 3 };
/* Key of a specialization, in the kernel's parameter order: one slot per pointer parameter (its
 * KS_DT_*, or KS_KEY_NONE when passed NULL: Triton then compiles it away), one per constexpr (its
 * value); then one spec slot per pointer and per int parameter; then num_warps, num_stages (-1:
 * Triton's default), fp_fusion (1: Triton's default, 0: disabled) and the mode:
 * - KS_MODE_EXACT: the specialization Triton's JIT makes for these very arguments, i.e. the
 *   Python path's machine code. Spec slots: a pointer 1 if 16-byte aligned, else 0 (None:
 *   KS_SPEC_ANY); an int KS_SPEC_ONE if it equals 1 (the JIT makes it a constexpr and the kernel
 *   takes no argument for it), KS_SPEC_DIV16 if divisible by 16, else KS_SPEC_PLAIN.
 * - KS_MODE_ALIGNED / KS_MODE_UNALIGNED: the fallbacks when no exact variant is compiled in (a
 *   build cannot hold every JIT specialization): ALIGNED assumes every pointer 16-byte aligned
 *   and the ints of the kernel's align list (row strides, contiguous extents) divisible by 16,
 *   UNALIGNED assumes nothing; spec slots KS_SPEC_ANY. Same results, not always the same code.
 * ks_cuda_plan_add looks the exact key up first, then the fallback its arguments allow. */
#define KS_KEY_NONE INT64_MIN
#define KS_KEY_TAIL 4
enum { KS_MODE_UNALIGNED = 0, KS_MODE_ALIGNED = 1, KS_MODE_EXACT = 2 };
enum { KS_SPEC_ANY = -1, KS_SPEC_PLAIN = 0, KS_SPEC_DIV16 = 1, KS_SPEC_ONE = 2 };

extern const ks_kernel_variant ks_cuda_variants[];
extern const int32_t ks_cuda_num_variants;
extern const ks_kernel_info ks_cuda_kernels[];
extern const int32_t ks_cuda_num_kernels;
extern const char ks_cuda_build_archs[]; /* "sm_80 sm_89 sm_90 ptx:sm_90" */
extern const char ks_cuda_build_hash[];  /* content hash of the generator's inputs */

/* ---- Plans: what an op launches, computed without touching the GPU. */
#define KS_CUDA_MAX_LAUNCHES 4
#define KS_CUDA_MAX_ARGS 48
#define KS_CUDA_MAX_KEY 96
typedef struct {
  uint8_t kind;    /* KS_ARG_* */
  uint8_t scratch; /* pointer into the library's discard buffer: v.ptr is an offset until the run */
  union {
    uint64_t ptr;
    int32_t i32;
    int64_t i64;
    float f32;
  } v;
} ks_cuda_arg;

typedef struct {
  int32_t kernel;                       /* index into ks_cuda_kernels[] */
  const ks_kernel_variant *variant;     /* NULL: this specialization is not in this build */
  uint32_t grid[3];
  int32_t num_args;                     /* user args, None pointers removed */
  ks_cuda_arg args[KS_CUDA_MAX_ARGS];
  int32_t key_len;
  int64_t key[KS_CUDA_MAX_KEY];
} ks_cuda_launch_desc;

typedef struct {
  int32_t num_launches;
  int32_t missing; /* launches whose variant is not compiled in (plan functions then return
                      KS_ERR_NOT_IMPLEMENTED, and ks_cuda_plan_run launches nothing) */
  int64_t scratch_bytes; /* discard buffer the launches write (outputs the caller did not ask for) */
  ks_cuda_launch_desc launches[KS_CUDA_MAX_LAUNCHES];
} ks_cuda_plan;

/* Outputs a kernel always writes but the caller may leave out (an LSE passed as NULL) and
 * intermediates a plan reads back (per-row losses, split-KV partials) go to scratch memory.
 * ks_cuda_plan_scratch reserves `bytes` of it in the plan (256-byte aligned) and returns a marker
 * address (KS_CUDA_SCRATCH_BASE + offset, never a real device address) that ks_cuda_plan_add
 * records as a scratch argument; ks_cuda_plan_run substitutes the real address. Eager calls use
 * one buffer per (context, stream), grown on demand by cuMemAlloc and never freed; a call made
 * while its stream is capturing a CUDA graph allocates its scratch with cuMemAllocAsync and frees
 * it with cuMemFreeAsync after its launches, so the graph owns that memory (no warm-up needed,
 * replayable on any stream). */
#define KS_CUDA_SCRATCH_BASE 0xFFF0000000000000ull
void *ks_cuda_plan_scratch(ks_cuda_plan *plan, int64_t bytes);

/* Appends one launch of kernel `kernel` to `plan`: builds the key from the arguments (in the
 * kernel's parameter order: pointers with their KS_DT_*, ints, floats, constexprs), looks the
 * variant up, and stores the arguments. Called by the generated per-kernel helpers. A grid with
 * a zero dimension appends nothing (Triton launches nothing either). */
typedef struct {
  uint8_t role;      /* KS_ROLE_* */
  int32_t dtype;     /* pointers: KS_DT_* */
  const void *ptr;   /* pointers */
  int64_t i;         /* ints and constexprs (bool: 0/1) */
  double f;          /* floats (passed to the kernel as fp32, as Triton's launcher does) */
} ks_cuda_param;
ks_status_t ks_cuda_plan_add(ks_cuda_plan *plan, int32_t kernel, int64_t g0, int64_t g1, int64_t g2,
                             int64_t num_warps, int64_t num_stages, int64_t fp_fusion, const ks_cuda_param *params,
                             int32_t num_params, char *err, size_t errlen);

/* Launches every launch of a complete plan, in order, on `stream` of device `device`. */
ks_status_t ks_cuda_plan_run(const ks_cuda_plan *plan, int device, ks_stream_t stream, char *err, size_t errlen);

struct ks_cuda_device_info_s;
/* What a dry run (ks_query_support) checks of a plan for a device, without launching: every
 * launch has a compiled variant (else KS_ERR_NOT_IMPLEMENTED), an image for the device's arch
 * and shared memory it allows (else KS_ERR_UNSUPPORTED_ARCH). */
ks_status_t ks_cuda_plan_check(const ks_cuda_plan *plan, const struct ks_cuda_device_info_s *dev, char *err,
                               size_t errlen);

/* The plan as JSON (kernel, variant, spec, key, grid, args): tests compare it with the Python
 * launcher's recorded launches. Returns the length written (truncated to len - 1), or -1. */
int ks_cuda_plan_json(const ks_cuda_plan *plan, char *buf, size_t len);

/* The compiled variant `index` as JSON (entry, spec, warps, stages, parameter kinds, images with
 * arch, kind, size, shared bytes); same return convention. Tests compare it with the manifest. */
int ks_cuda_variant_json(int32_t index, char *buf, size_t len);

/* ---- Driver and devices. */
/* Loads libcuda.so.1 and calls cuInit(0), once per process (thread-safe); KS_OK or KS_ERR_CUDA. */
ks_status_t ks_cuda_init(char *err, size_t errlen);

typedef struct ks_cuda_device_info_s {
  int32_t ordinal;
  int32_t cc;           /* compute capability major * 10 + minor */
  int32_t sm_count;     /* multiprocessors: the policies' `sms` */
  int32_t max_shared_optin; /* bytes of shared memory one block may opt in to */
} ks_cuda_device_info;
ks_status_t ks_cuda_device(int device, ks_cuda_device_info *info, char *err, size_t errlen);

/* Device ordinal of a CUDA pointer (cuPointerGetAttribute); KS_ERR_UNSUPPORTED_DEVICE if the
 * driver does not know it (host memory, another process's pointer). */
ks_status_t ks_cuda_pointer_device(const void *ptr, int *device, char *err, size_t errlen);

/* Launches variant `v` with the kernel's user arguments `args` (args[i] points at the value of
 * user parameter i, as in cuLaunchKernel; the hidden scratch pointers Triton appends are added
 * here, as NULL) on `stream` (NULL: the legacy default stream) of device `device`. Uses the
 * calling thread's current context if it belongs to `device`, else the device's primary context
 * (pushed for the call and popped after). Errors: KS_ERR_CUDA (no driver, or a driver call
 * failed: the message names the call and the CUresult), KS_ERR_UNSUPPORTED_ARCH (no cubin or
 * PTX in this build for the device's sm, or the driver cannot JIT the PTX), KS_ERR_OUT_OF_MEMORY. */
ks_status_t ks_cuda_launch(const ks_kernel_variant *v, int device, const uint32_t grid[3], void **args,
                           ks_stream_t stream, char *err, size_t errlen);

/* Scratch (see ks_cuda_plan_scratch) of at least `bytes` for a call on `stream` of `device`: the
 * (context, stream) buffer, grown by cuMemAlloc; or, while `stream` is capturing, a stream-ordered
 * allocation (*graph_owned = 1) that the caller releases with ks_cuda_scratch_free after its
 * launches. */
ks_status_t ks_cuda_scratch(int device, ks_stream_t stream, int64_t bytes, uint64_t *ptr, int *graph_owned,
                            char *err, size_t errlen);
ks_status_t ks_cuda_scratch_free(int device, ks_stream_t stream, uint64_t ptr, char *err, size_t errlen);

/* The image ks_cuda_launch would load for compute capability `cc` (80 for sm_80 ...): the cubin
 * of exactly that arch, else the newest sm_8x cubin of the same major below it (sm_86 runs the
 * sm_80 cubin; sm_90's is sm_90a, for exactly sm_90), else the PTX of the newest arch <= cc (the
 * driver JIT-compiles it: Blackwell runs sm_90 PTX), else NULL. */
const ks_kernel_image *ks_cuda_select_image(const ks_kernel_variant *v, int cc);

/* ---- Driver entry points for tools and tests (the smoke program allocates through these).
 * Types are opaque here; see driver.c for the exact prototypes. NULL until ks_cuda_init succeeded. */
typedef struct {
  int (*cuMemAlloc)(uint64_t *dptr, size_t bytes);
  int (*cuMemFree)(uint64_t dptr);
  int (*cuMemcpyHtoD)(uint64_t dst, const void *src, size_t bytes);
  int (*cuMemcpyDtoH)(void *dst, uint64_t src, size_t bytes);
  int (*cuCtxSynchronize)(void);
  int (*cuCtxSetCurrent)(void *ctx);
  int (*cuDevicePrimaryCtxRetain)(void **ctx, int dev);
  int (*cuDeviceGet)(int *dev, int ordinal);
  int (*cuGetErrorName)(int res, const char **name);
} ks_cuda_tools;
const ks_cuda_tools *ks_cuda_tools_get(void);

/* Writes "what: CUDA_ERROR_X (description)" and maps the CUresult to a status. */
ks_status_t ks_cuda_check(int res, const char *what, char *err, size_t errlen);
void ks_cuda_errorf(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif /* KS_CUDA_H_ */
