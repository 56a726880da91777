/* launch.c: plans (which variant, grid and arguments; no CUDA call) and launches (modules loaded
 * lazily per (context, variant), cached for the process, thread-safe). */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ks_cuda.h"
#include "ks_cuda_internal.h"

/* ---- dtypes */
int ks_cuda_dtype_from_dl(DLDataType t) {
  if (t.lanes != 1) return 0;
  switch (t.code) {
    case kDLFloat:
      return t.bits == 32 ? KS_DT_F32 : t.bits == 16 ? KS_DT_F16 : 0;
    case kDLBfloat:
      return t.bits == 16 ? KS_DT_BF16 : 0;
    case kDLFloat8_e4m3fn:
      return t.bits == 8 ? KS_DT_F8E4M3 : 0;
    case kDLFloat8_e5m2:
      return t.bits == 8 ? KS_DT_F8E5M2 : 0;
    case kDLInt:
      return t.bits == 8 ? KS_DT_I8 : t.bits == 16 ? KS_DT_I16 : t.bits == 32 ? KS_DT_I32 : t.bits == 64 ? KS_DT_I64 : 0;
    case kDLUInt:
      return t.bits == 8 ? KS_DT_U8 : 0;
    default:
      return 0;
  }
}

const char *ks_cuda_dtype_name(int dt) {
  switch (dt) {
    case KS_DT_F32: return "fp32";
    case KS_DT_F16: return "fp16";
    case KS_DT_BF16: return "bf16";
    case KS_DT_F8E4M3: return "fp8e4nv";
    case KS_DT_F8E5M2: return "fp8e5";
    case KS_DT_I8: return "i8";
    case KS_DT_U8: return "u8";
    case KS_DT_I16: return "i16";
    case KS_DT_I32: return "i32";
    case KS_DT_I64: return "i64";
    default: return "?";
  }
}

/* ---- plans */
static int key_cmp(const int64_t *a, const int64_t *b, int32_t n) {
  for (int32_t i = 0; i < n; i++) {
    if (a[i] < b[i]) return -1;
    if (a[i] > b[i]) return 1;
  }
  return 0;
}

static int32_t find_variant(const ks_kernel_info *k, const int64_t *key) {
  int32_t lo = 0, hi = k->num_variants - 1;
  while (lo <= hi) {
    int32_t mid = lo + (hi - lo) / 2;
    int c = key_cmp(k->keys + (size_t)mid * (size_t)k->key_len, key, k->key_len);
    if (c == 0) return k->variants[mid];
    if (c < 0) lo = mid + 1;
    else hi = mid - 1;
  }
  return -1;
}

/* "X=bf16 R=None ... BLOCK_N=4096 M=1 N:16 num_warps=8 num_stages=default fp_fusion=default exact" */
static void describe_key(const ks_kernel_info *k, const int64_t *key, char *buf, size_t len) {
  size_t used = 0;
  buf[0] = '\0';
#define KS_APPEND(...)                                                    \
  do {                                                                    \
    if (used < len) {                                                     \
      int w_ = snprintf(buf + used, len - used, __VA_ARGS__);             \
      if (w_ > 0) used += (size_t)w_ < len - used ? (size_t)w_ : len - used; \
    }                                                                     \
  } while (0)
  int32_t slot = 0, n_spec = 0;
  for (int32_t i = 0; i < k->num_params; i++) {
    int64_t v;
    switch (k->param_roles[i]) {
      case KS_ROLE_PTR:
        v = key[slot++];
        n_spec++;
        KS_APPEND("%s=%s ", k->param_names[i], v == KS_KEY_NONE ? "None" : ks_cuda_dtype_name((int)v));
        break;
      case KS_ROLE_CONSTEXPR:
        v = key[slot++];
        if (v == KS_KEY_NONE) KS_APPEND("%s=None ", k->param_names[i]);
        else KS_APPEND("%s=%lld ", k->param_names[i], (long long)v);
        break;
      case KS_ROLE_INT:
        n_spec++;
        break;
      default:
        break;
    }
  }
  const int64_t *spec = key + slot, *tail = key + slot + n_spec;
  if (tail[3] == KS_MODE_EXACT) {
    int32_t j = 0;
    for (int32_t i = 0; i < k->num_params; i++) {
      const uint8_t r = k->param_roles[i];
      if (r != KS_ROLE_PTR && r != KS_ROLE_INT) continue;
      const int64_t c = spec[j++];
      if (r == KS_ROLE_PTR && c == 1) KS_APPEND("%s:16 ", k->param_names[i]);
      if (r == KS_ROLE_INT && c == KS_SPEC_ONE) KS_APPEND("%s=1 ", k->param_names[i]);
      if (r == KS_ROLE_INT && c == KS_SPEC_DIV16) KS_APPEND("%s:16 ", k->param_names[i]);
    }
  }
  KS_APPEND("num_warps=%lld num_stages=", (long long)tail[0]);
  if (tail[1] < 0) KS_APPEND("default");
  else KS_APPEND("%lld", (long long)tail[1]);
  KS_APPEND(" fp_fusion=%s %s", tail[2] ? "default" : "off",
            tail[3] == KS_MODE_EXACT ? "exact" : tail[3] == KS_MODE_ALIGNED ? "align16" : "unaligned");
#undef KS_APPEND
}

ks_status_t ks_cuda_plan_add(ks_cuda_plan *plan, int32_t kernel, int64_t g0, int64_t g1, int64_t g2,
                             int64_t num_warps, int64_t num_stages, int64_t fp_fusion, const ks_cuda_param *params,
                             int32_t num_params, char *err, size_t errlen) {
  if (kernel < 0 || kernel >= ks_cuda_num_kernels) {
    ks_cuda_errorf(err, errlen, "internal: kernel index %d out of range", (int)kernel);
    return KS_ERR_INTERNAL;
  }
  const ks_kernel_info *k = &ks_cuda_kernels[kernel];
  if (num_params != k->num_params || num_params > KS_CUDA_MAX_ARGS) {
    ks_cuda_errorf(err, errlen, "internal: %s takes %d parameters, got %d", k->name, (int)k->num_params,
                   (int)num_params);
    return KS_ERR_INTERNAL;
  }
  if (g0 < 0 || g1 < 0 || g2 < 0) {
    ks_cuda_errorf(err, errlen, "internal: negative grid (%lld, %lld, %lld) for %s", (long long)g0, (long long)g1,
                   (long long)g2, k->name);
    return KS_ERR_INTERNAL;
  }
  if (g0 == 0 || g1 == 0 || g2 == 0) return KS_OK; /* an empty grid launches nothing (as in Triton) */
  if (g0 > 2147483647LL || g1 > 65535 || g2 > 65535) {
    ks_cuda_errorf(err, errlen, "%s: grid (%lld, %lld, %lld) exceeds CUDA's limits (2^31-1, 65535, 65535)", k->name,
                   (long long)g0, (long long)g1, (long long)g2);
    return KS_ERR_UNSUPPORTED_SHAPE;
  }
  if (plan->num_launches >= KS_CUDA_MAX_LAUNCHES) {
    ks_cuda_errorf(err, errlen, "internal: more than %d launches in one plan", KS_CUDA_MAX_LAUNCHES);
    return KS_ERR_INTERNAL;
  }
  ks_cuda_launch_desc *d = &plan->launches[plan->num_launches];
  memset(d, 0, sizeof *d);
  /* the key: dtypes and constexprs, then the spec slots, then the tail (see ks_cuda.h) */
  int64_t spec[KS_CUDA_MAX_ARGS];
  int32_t slot = 0, n_spec = 0, aligned = 1;
  for (int32_t i = 0; i < num_params; i++) {
    const ks_cuda_param *p = &params[i];
    if (p->role != k->param_roles[i]) {
      ks_cuda_errorf(err, errlen, "internal: %s parameter %s has the wrong role", k->name, k->param_names[i]);
      return KS_ERR_INTERNAL;
    }
    if (slot >= KS_CUDA_MAX_KEY) {
      ks_cuda_errorf(err, errlen, "internal: %s has too many parameters", k->name);
      return KS_ERR_INTERNAL;
    }
    switch (p->role) {
      case KS_ROLE_PTR:
        /* a NULL pointer is None: Triton compiles it away, no argument */
        d->key[slot++] = p->ptr ? p->dtype : KS_KEY_NONE;
        spec[n_spec++] = p->ptr ? ((uintptr_t)p->ptr % 16 == 0) : KS_SPEC_ANY;
        if (p->ptr && (uintptr_t)p->ptr % 16) aligned = 0;
        break;
      case KS_ROLE_INT:
        if (p->i < INT32_MIN || p->i > INT32_MAX) {
          ks_cuda_errorf(err, errlen, "%s: %s = %lld does not fit the int32 this build's kernels take", k->name,
                         k->param_names[i], (long long)p->i);
          return KS_ERR_UNSUPPORTED_SHAPE;
        }
        spec[n_spec++] = p->i == 1 ? KS_SPEC_ONE : p->i % 16 == 0 ? KS_SPEC_DIV16 : KS_SPEC_PLAIN;
        if (k->param_align[i] && p->i % 16) aligned = 0;
        break;
      case KS_ROLE_CONSTEXPR:
        d->key[slot++] = p->i;
        break;
      case KS_ROLE_FLOAT:
        break;
      default:
        ks_cuda_errorf(err, errlen, "internal: bad role");
        return KS_ERR_INTERNAL;
    }
  }
  const int32_t key_len = slot + n_spec + KS_KEY_TAIL;
  if (key_len != k->key_len || key_len > KS_CUDA_MAX_KEY) {
    ks_cuda_errorf(err, errlen, "internal: %s key has %d slots, table has %d", k->name, (int)key_len, (int)k->key_len);
    return KS_ERR_INTERNAL;
  }
  int64_t *tail = d->key + slot + n_spec;
  tail[0] = num_warps;
  tail[1] = num_stages;
  tail[2] = fp_fusion;
  /* the exact specialization first (the Python path's machine code), else the fallback */
  for (int32_t j = 0; j < n_spec; j++) d->key[slot + j] = spec[j];
  tail[3] = KS_MODE_EXACT;
  int32_t vi = find_variant(k, d->key);
  const int exact = vi >= 0;
  if (!exact) {
    for (int32_t j = 0; j < n_spec; j++) d->key[slot + j] = KS_SPEC_ANY;
    tail[3] = aligned ? KS_MODE_ALIGNED : KS_MODE_UNALIGNED;
    vi = find_variant(k, d->key);
  }
  d->key_len = key_len;
  d->kernel = kernel;
  d->grid[0] = (uint32_t)g0;
  d->grid[1] = (uint32_t)g1;
  d->grid[2] = (uint32_t)g2;
  /* the arguments the compiled kernel takes: no None pointer, no int the JIT made a constexpr */
  int32_t j = 0;
  for (int32_t i = 0; i < num_params; i++) {
    const ks_cuda_param *p = &params[i];
    ks_cuda_arg *a = &d->args[d->num_args];
    switch (p->role) {
      case KS_ROLE_PTR:
        j++;
        if (!p->ptr) break;
        a->kind = KS_ARG_PTR;
        a->v.ptr = (uint64_t)(uintptr_t)p->ptr;
        if (a->v.ptr >= KS_CUDA_SCRATCH_BASE) { /* ks_cuda_plan_scratch's marker: an offset */
          a->scratch = 1;
          a->v.ptr -= KS_CUDA_SCRATCH_BASE;
        }
        d->num_args++;
        break;
      case KS_ROLE_INT:
        if (exact && spec[j] == KS_SPEC_ONE) {
          j++;
          break;
        }
        j++;
        a->kind = KS_ARG_I32;
        a->v.i32 = (int32_t)p->i;
        d->num_args++;
        break;
      case KS_ROLE_FLOAT:
        a->kind = KS_ARG_F32;
        a->v.f32 = (float)p->f; /* Triton's launcher narrows a Python float the same way */
        d->num_args++;
        break;
      default:
        break;
    }
  }
  if (vi >= 0) {
    const ks_kernel_variant *v = &ks_cuda_variants[vi];
    if (v->num_user_params != d->num_args) {
      ks_cuda_errorf(err, errlen, "internal: %s variant takes %d arguments, plan has %d", k->name,
                     (int)v->num_user_params, (int)d->num_args);
      return KS_ERR_INTERNAL;
    }
    for (int32_t i = 0; i < d->num_args; i++) {
      if (v->param_kinds[i] != d->args[i].kind) {
        ks_cuda_errorf(err, errlen, "internal: %s argument %d kind differs from the compiled kernel", k->name, (int)i);
        return KS_ERR_INTERNAL;
      }
    }
    d->variant = v;
  } else {
    if (!plan->missing && err && errlen) {
      char what[1024];
      describe_key(k, d->key, what, sizeof what);
      ks_cuda_errorf(err, errlen,
                     "no compiled variant of %s for %s in this build (capi/aot/generate.py --set full compiles "
                     "the whole sweep)",
                     k->name, what);
    }
    plan->missing++;
  }
  plan->num_launches++;
  return KS_OK;
}

void *ks_cuda_plan_scratch(ks_cuda_plan *plan, int64_t bytes) {
  const int64_t offset = plan->scratch_bytes;
  plan->scratch_bytes += (bytes > 0 ? bytes : 0) + 255 - ((bytes > 0 ? bytes : 0) + 255) % 256;
  return (void *)(uintptr_t)(KS_CUDA_SCRATCH_BASE + (uint64_t)offset);
}

/* ---- module cache: one CUfunction per (context, variant), filled on first use */
typedef struct {
  void *func;
  int32_t shared;
} fn_entry;
typedef struct {
  void *ctx;
  fn_entry *fns; /* ks_cuda_num_variants entries */
} ctx_slot;
#define KS_MAX_CONTEXTS 64
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static ctx_slot g_slots[KS_MAX_CONTEXTS];
static int g_num_slots;

const ks_kernel_image *ks_cuda_select_image(const ks_kernel_variant *v, int cc) {
  const ks_kernel_image *cubin = NULL, *ptx = NULL;
  for (int32_t i = 0; i < v->num_images; i++) {
    const ks_kernel_image *im = &v->images[i];
    if (im->kind == KS_IMAGE_CUBIN) {
      if (im->arch == cc) return im;
      /* an sm_8x cubin runs on any later 8.y (binary compatibility within a major version);
       * Triton's sm_90 (and newer) cubins are arch-specific (sm_90a): exactly that arch only */
      if (im->arch < 90 && im->arch / 10 == cc / 10 && im->arch < cc && (!cubin || im->arch > cubin->arch)) cubin = im;
    } else if (im->arch <= cc && (!ptx || im->arch > ptx->arch)) {
      ptx = im;
    }
  }
  return cubin ? cubin : ptx;
}

static void list_images(const ks_kernel_variant *v, char *buf, size_t len) {
  size_t used = 0;
  buf[0] = '\0';
  for (int32_t i = 0; i < v->num_images && used < len; i++) {
    int w = snprintf(buf + used, len - used, "%s%s sm_%d", i ? ", " : "",
                     v->images[i].kind == KS_IMAGE_CUBIN ? "cubin" : "ptx", (int)v->images[i].arch);
    if (w > 0) used += (size_t)w;
  }
}

static ks_status_t load_function(const ks_kernel_variant *v, const ks_cuda_device_info *dev, fn_entry *out, char *err,
                                 size_t errlen) {
  const ks_driver_table *cu = ks_cu();
  const ks_kernel_image *im = ks_cuda_select_image(v, dev->cc);
  if (!im) {
    char have[256];
    list_images(v, have, sizeof have);
    ks_cuda_errorf(err, errlen,
                   "%s: no kernel image for sm_%d in this build (have: %s); the build embeds cubins for exactly those "
                   "archs and PTX that newer GPUs compile",
                   v->entry, (int)dev->cc, have);
    return KS_ERR_UNSUPPORTED_ARCH;
  }
  if (im->shared > dev->max_shared_optin) {
    ks_cuda_errorf(err, errlen, "%s needs %d bytes of shared memory per block; sm_%d device %d allows %d", v->entry,
                   (int)im->shared, (int)dev->cc, (int)dev->ordinal, (int)dev->max_shared_optin);
    return KS_ERR_UNSUPPORTED_ARCH;
  }
  KS_CUmodule mod = NULL;
  ks_status_t s;
  if (im->kind == KS_IMAGE_PTX) {
    char log[1024];
    log[0] = '\0';
    KS_CUjit_option opts[2] = {KS_CU_JIT_ERROR_LOG_BUFFER, KS_CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
    void *vals[2] = {log, (void *)(uintptr_t)sizeof log};
    int res = cu->cuModuleLoadDataEx(&mod, im->data, 2, opts, vals);
    if (res != KS_CUDA_SUCCESS) {
      char what[160];
      snprintf(what, sizeof what, "cuModuleLoadDataEx(PTX sm_%d of %s on sm_%d)", (int)im->arch, v->entry, (int)dev->cc);
      s = ks_cuda_check(res, what, err, errlen);
      size_t n = err ? strlen(err) : 0;
      if (log[0] && err && n + 8 < errlen) snprintf(err + n, errlen - n, "; JIT log: %s", log);
      return s;
    }
  } else {
    char what[160];
    snprintf(what, sizeof what, "cuModuleLoadData(cubin sm_%d of %s)", (int)im->arch, v->entry);
    s = ks_cuda_check(cu->cuModuleLoadData(&mod, im->data), what, err, errlen);
    if (s != KS_OK) return s;
  }
  KS_CUfunction f = NULL;
  s = ks_cuda_check(cu->cuModuleGetFunction(&f, mod, v->entry), "cuModuleGetFunction", err, errlen);
  if (s != KS_OK) return s;
  if (im->shared > 49152) {
    /* beyond 48 KB a block must opt in to dynamic shared memory */
    s = ks_cuda_check(cu->cuFuncSetAttribute(f, KS_CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, im->shared),
                      "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)", err, errlen);
    if (s != KS_OK) return s;
  }
  out->shared = im->shared;
  out->func = f; /* the module stays loaded for the life of the process */
  return KS_OK;
}

static ks_status_t get_function(const ks_kernel_variant *v, const ks_cuda_device_info *dev, void *ctx, fn_entry *out,
                                char *err, size_t errlen) {
  ks_status_t s = KS_OK;
  pthread_mutex_lock(&g_mu);
  ctx_slot *slot = NULL;
  for (int i = 0; i < g_num_slots; i++) {
    if (g_slots[i].ctx == ctx) {
      slot = &g_slots[i];
      break;
    }
  }
  if (!slot) {
    if (g_num_slots == KS_MAX_CONTEXTS) {
      ks_cuda_errorf(err, errlen, "more than %d CUDA contexts used with kernelset", KS_MAX_CONTEXTS);
      s = KS_ERR_UNSUPPORTED_DEVICE;
    } else {
      fn_entry *fns = calloc((size_t)(ks_cuda_num_variants > 0 ? ks_cuda_num_variants : 1), sizeof(fn_entry));
      if (!fns) {
        ks_cuda_errorf(err, errlen, "out of host memory for the module cache");
        s = KS_ERR_OUT_OF_MEMORY;
      } else {
        slot = &g_slots[g_num_slots++];
        slot->ctx = ctx;
        slot->fns = fns;
      }
    }
  }
  if (s == KS_OK) {
    fn_entry *e = &slot->fns[v->index];
    if (!e->func) s = load_function(v, dev, e, err, errlen);
    if (s == KS_OK) *out = *e;
  }
  pthread_mutex_unlock(&g_mu);
  return s;
}

ks_status_t ks_cuda_launch(const ks_kernel_variant *v, int device, const uint32_t grid[3], void **args,
                           ks_stream_t stream, char *err, size_t errlen) {
  if (!v || !grid || (v->num_user_params > 0 && !args)) {
    ks_cuda_errorf(err, errlen, "internal: ks_cuda_launch without a variant, grid or arguments");
    return KS_ERR_INTERNAL;
  }
  int32_t hidden = v->num_params - v->num_user_params;
  if (v->num_ctas != 1 || hidden < 0 || hidden > 4 || v->num_params > KS_CUDA_MAX_ARGS) {
    ks_cuda_errorf(err, errlen, "internal: %s has an unsupported launch shape", v->entry);
    return KS_ERR_INTERNAL;
  }
  if (grid[0] == 0 || grid[1] == 0 || grid[2] == 0) return KS_OK;
  if (grid[0] > 2147483647u || grid[1] > 65535u || grid[2] > 65535u) {
    ks_cuda_errorf(err, errlen, "%s: grid (%u, %u, %u) exceeds CUDA's limits", v->entry, grid[0], grid[1], grid[2]);
    return KS_ERR_UNSUPPORTED_SHAPE;
  }
  ks_cuda_device_info dev;
  ks_status_t s = ks_cuda_device(device, &dev, err, errlen);
  if (s != KS_OK) return s;
  void *ctx = NULL;
  int pushed = 0;
  s = ks_cuda_enter(device, &ctx, &pushed, err, errlen);
  if (s != KS_OK) return s;
  fn_entry fn;
  s = get_function(v, &dev, ctx, &fn, err, errlen);
  if (s == KS_OK) {
    /* Triton appends hidden pointer parameters (global scratch, profile scratch): the generator
     * only accepts kernels that need no scratch, so each is NULL. */
    void *params[KS_CUDA_MAX_ARGS + 5];
    KS_CUdeviceptr none[4] = {0, 0, 0, 0};
    for (int32_t i = 0; i < v->num_user_params; i++) params[i] = args[i];
    for (int32_t i = 0; i < hidden; i++) params[v->num_user_params + i] = &none[i];
    params[v->num_params] = NULL; /* the driver reads num_params entries; a test driver counts them */
    char what[160];
    snprintf(what, sizeof what, "cuLaunchKernel(%s)", v->entry);
    s = ks_cuda_check(ks_cu()->cuLaunchKernel(fn.func, grid[0], grid[1], grid[2], 32u * (unsigned)v->num_warps, 1, 1,
                                              (unsigned)fn.shared, (KS_CUstream)stream, params, NULL),
                      what, err, errlen);
  }
  ks_cuda_leave(pushed);
  return s;
}

ks_status_t ks_cuda_plan_run(const ks_cuda_plan *plan, int device, ks_stream_t stream, char *err, size_t errlen) {
  if (plan->missing) {
    ks_cuda_errorf(err, errlen, "internal: running an incomplete plan");
    return KS_ERR_NOT_IMPLEMENTED;
  }
  uint64_t scratch = 0;
  int graph_owned = 0;
  if (plan->scratch_bytes > 0) {
    ks_status_t s = ks_cuda_scratch(device, stream, plan->scratch_bytes, &scratch, &graph_owned, err, errlen);
    if (s != KS_OK) return s;
  }
  ks_status_t s = KS_OK;
  for (int32_t l = 0; l < plan->num_launches && s == KS_OK; l++) {
    const ks_cuda_launch_desc *d = &plan->launches[l];
    ks_cuda_arg values[KS_CUDA_MAX_ARGS];
    void *args[KS_CUDA_MAX_ARGS];
    for (int32_t i = 0; i < d->num_args; i++) {
      values[i] = d->args[i];
      if (values[i].scratch) values[i].v.ptr += scratch;
      args[i] = (void *)&values[i].v;
    }
    s = ks_cuda_launch(d->variant, device, d->grid, args, stream, err, errlen);
  }
  if (graph_owned) { /* freed in stream order after the launches: the graph gets a free node */
    char ferr[256];
    ks_status_t f = ks_cuda_scratch_free(device, stream, scratch, ferr, sizeof ferr);
    if (s == KS_OK && f != KS_OK) {
      ks_cuda_errorf(err, errlen, "%s", ferr);
      s = f;
    }
  }
  return s;
}

ks_status_t ks_cuda_plan_check(const ks_cuda_plan *plan, const ks_cuda_device_info *dev, char *err, size_t errlen) {
  for (int32_t l = 0; l < plan->num_launches; l++) {
    const ks_cuda_launch_desc *d = &plan->launches[l];
    if (!d->variant) {
      char what[1024];
      describe_key(&ks_cuda_kernels[d->kernel], d->key, what, sizeof what);
      ks_cuda_errorf(err, errlen,
                     "no compiled variant of %s for %s in this build (capi/aot/generate.py --set full compiles "
                     "the whole sweep)",
                     ks_cuda_kernels[d->kernel].name, what);
      return KS_ERR_NOT_IMPLEMENTED;
    }
    const ks_kernel_image *im = ks_cuda_select_image(d->variant, dev->cc);
    if (!im) {
      char have[256];
      list_images(d->variant, have, sizeof have);
      ks_cuda_errorf(err, errlen, "%s: no kernel image for sm_%d in this build (have: %s)", d->variant->entry,
                     (int)dev->cc, have);
      return KS_ERR_UNSUPPORTED_ARCH;
    }
    if (im->shared > dev->max_shared_optin) {
      ks_cuda_errorf(err, errlen, "%s needs %d bytes of shared memory per block; sm_%d device %d allows %d",
                     d->variant->entry, (int)im->shared, (int)dev->cc, (int)dev->ordinal, (int)dev->max_shared_optin);
      return KS_ERR_UNSUPPORTED_ARCH;
    }
  }
  return KS_OK;
}

/* ---- scratch (the discard buffer): eager calls use one buffer per (context, stream), grown by
 * doubling, old buffers kept. Per stream because some plans read their scratch back
 * (cross_entropy's per-row losses before the mean/sum, split-KV partials): calls on one stream
 * are ordered, calls on two streams would race on one buffer. A call captured into a CUDA graph
 * gets its own scratch instead, allocated and freed in stream order (cuMemAllocAsync /
 * cuMemFreeAsync become the graph's memory nodes): the graph owns it, so it replays on any stream,
 * next to eager calls and other graphs, and capture needs no warm-up call. */
#define KS_MAX_SCRATCH 256
typedef struct {
  void *ctx;
  ks_stream_t stream;
  uint64_t ptr;
  int64_t bytes;
} scratch_slot;
static scratch_slot g_scratch[KS_MAX_SCRATCH];
static int g_num_scratch;

ks_status_t ks_cuda_scratch(int device, ks_stream_t stream, int64_t bytes, uint64_t *ptr, int *graph_owned,
                            char *err, size_t errlen) {
  *graph_owned = 0;
  ks_status_t s = ks_cuda_device(device, NULL, err, errlen);
  if (s != KS_OK) return s;
  void *ctx = NULL;
  int pushed = 0;
  s = ks_cuda_enter(device, &ctx, &pushed, err, errlen);
  if (s != KS_OK) return s;
  const ks_driver_table *cu = ks_cu();
  int capturing = 0;
  s = ks_cuda_check(cu->cuStreamIsCapturing((KS_CUstream)stream, &capturing), "cuStreamIsCapturing", err, errlen);
  if (s == KS_OK && capturing != KS_CU_STREAM_CAPTURE_STATUS_NONE) {
    KS_CUdeviceptr p = 0;
    s = ks_cuda_check(cu->cuMemAllocAsync(&p, (size_t)bytes, (KS_CUstream)stream),
                      "cuMemAllocAsync (scratch of a captured call)", err, errlen);
    if (s == KS_OK) {
      *ptr = (uint64_t)p;
      *graph_owned = 1;
    }
    ks_cuda_leave(pushed);
    return s;
  }
  if (s != KS_OK) {
    ks_cuda_leave(pushed);
    return s;
  }
  pthread_mutex_lock(&g_mu);
  scratch_slot *slot = NULL;
  for (int i = 0; i < g_num_scratch; i++)
    if (g_scratch[i].ctx == ctx && g_scratch[i].stream == stream) slot = &g_scratch[i];
  if (!slot) {
    if (g_num_scratch == KS_MAX_SCRATCH) {
      ks_cuda_errorf(err, errlen, "more than %d (CUDA context, stream) pairs used with kernelset's discard buffer "
                     "(pass the optional outputs, or reuse streams)", KS_MAX_SCRATCH);
      s = KS_ERR_UNSUPPORTED_DEVICE;
    } else {
      slot = &g_scratch[g_num_scratch++];
      slot->ctx = ctx;
      slot->stream = stream;
    }
  }
  if (s == KS_OK && slot->bytes < bytes) {
    int64_t want = slot->bytes * 2 > bytes ? slot->bytes * 2 : bytes;
    if (want < (1 << 20)) want = 1 << 20;
    KS_CUdeviceptr p = 0;
    s = ks_cuda_check(cu->cuMemAlloc(&p, (size_t)want), "cuMemAlloc (discard buffer)", err, errlen);
    if (s == KS_OK) {
      slot->ptr = (uint64_t)p;
      slot->bytes = want;
    }
  }
  if (s == KS_OK) *ptr = slot->ptr;
  pthread_mutex_unlock(&g_mu);
  ks_cuda_leave(pushed);
  return s;
}

ks_status_t ks_cuda_scratch_free(int device, ks_stream_t stream, uint64_t ptr, char *err, size_t errlen) {
  void *ctx = NULL;
  int pushed = 0;
  ks_status_t s = ks_cuda_enter(device, &ctx, &pushed, err, errlen);
  if (s != KS_OK) return s;
  s = ks_cuda_check(ks_cu()->cuMemFreeAsync((KS_CUdeviceptr)ptr, (KS_CUstream)stream),
                    "cuMemFreeAsync (scratch of a captured call)", err, errlen);
  ks_cuda_leave(pushed);
  return s;
}

/* ---- JSON view of a plan */
int ks_cuda_plan_json(const ks_cuda_plan *plan, char *buf, size_t len) {
  if (!plan || !buf || !len) return -1;
  size_t used = 0;
#define KS_J(...)                                                           \
  do {                                                                      \
    if (used < len) {                                                       \
      int w_ = snprintf(buf + used, len - used, __VA_ARGS__);               \
      if (w_ < 0) return -1;                                                \
      used += (size_t)w_ < len - used ? (size_t)w_ : len - 1 - used;        \
    }                                                                       \
  } while (0)
  KS_J("{\"missing\": %d, \"scratch_bytes\": %lld, \"launches\": [", (int)plan->missing,
       (long long)plan->scratch_bytes);
  for (int32_t l = 0; l < plan->num_launches; l++) {
    const ks_cuda_launch_desc *d = &plan->launches[l];
    const ks_kernel_info *k = &ks_cuda_kernels[d->kernel];
    KS_J("%s{\"kernel\": \"%s\", \"variant\": %d, \"grid\": [%u, %u, %u], \"key\": [", l ? ", " : "", k->name,
         d->variant ? (int)d->variant->index : -1, d->grid[0], d->grid[1], d->grid[2]);
    for (int32_t i = 0; i < d->key_len; i++) {
      if (d->key[i] == KS_KEY_NONE) KS_J("%snull", i ? ", " : "");
      else KS_J("%s%lld", i ? ", " : "", (long long)d->key[i]);
    }
    KS_J("], \"args\": [");
    for (int32_t i = 0; i < d->num_args; i++) {
      const ks_cuda_arg *a = &d->args[i];
      const char *sep = i ? ", " : "";
      switch (a->kind) {
        case KS_ARG_PTR:
          KS_J("%s[\"%s\", %llu]", sep, a->scratch ? "scratch" : "ptr", (unsigned long long)a->v.ptr);
          break;
        case KS_ARG_I32: KS_J("%s[\"i32\", %d]", sep, (int)a->v.i32); break;
        case KS_ARG_I64: KS_J("%s[\"i64\", %lld]", sep, (long long)a->v.i64); break;
        default: KS_J("%s[\"f32\", %.9g]", sep, (double)a->v.f32); break;
      }
    }
    KS_J("]}");
  }
  KS_J("]}");
#undef KS_J
  return (int)used;
}

int ks_cuda_variant_json(int32_t index, char *buf, size_t len) {
  if (index < 0 || index >= ks_cuda_num_variants || !buf || !len) return -1;
  const ks_kernel_variant *v = &ks_cuda_variants[index];
  size_t used = 0;
#define KS_J(...)                                                           \
  do {                                                                      \
    if (used < len) {                                                       \
      int w_ = snprintf(buf + used, len - used, __VA_ARGS__);               \
      if (w_ < 0) return -1;                                                \
      used += (size_t)w_ < len - used ? (size_t)w_ : len - 1 - used;        \
    }                                                                       \
  } while (0)
  KS_J("{\"index\": %d, \"kernel\": \"%s\", \"entry\": \"%s\", \"spec\": \"%s\", \"num_warps\": %d, "
       "\"num_stages\": %d, \"num_ctas\": %d, \"num_params\": %d, \"num_user_params\": %d, \"param_kinds\": [",
       (int)v->index, ks_cuda_kernels[v->kernel].name, v->entry, v->spec, (int)v->num_warps, (int)v->num_stages,
       (int)v->num_ctas, (int)v->num_params, (int)v->num_user_params);
  for (int32_t i = 0; i < v->num_params; i++) KS_J("%s%d", i ? ", " : "", (int)v->param_kinds[i]);
  KS_J("], \"images\": [");
  for (int32_t i = 0; i < v->num_images; i++) {
    const ks_kernel_image *im = &v->images[i];
    KS_J("%s{\"arch\": %d, \"kind\": %d, \"size\": %zu, \"shared\": %d, \"address\": %llu}", i ? ", " : "",
         (int)im->arch, (int)im->kind, im->size, (int)im->shared, (unsigned long long)(uintptr_t)im->data);
  }
  KS_J("]}");
#undef KS_J
  return (int)used;
}
