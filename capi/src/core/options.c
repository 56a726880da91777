/* options.c: ks_options_init (an op's defaults into a caller's struct) and ks_read_options (a
 * caller's struct of any older size over the defaults). Fields are only ever appended, so a shorter
 * struct is a prefix of ours; the fields it lacks keep their defaults. Each op's struct layout and
 * defaults come from ops_table.c (generated from capi/abi/ksabi/ops.py). */
#include <stdio.h>

#include "ks_internal.h"

/* The bytes of a caller's struct of `size` bytes to take: whole fields only; a size that ends
 * inside a field is refused (0). Padding between or after fields is fine. */
static size_t prefix_bytes(const ks_op_info *i, size_t size) {
  size_t take = 0;
  for (int f = 0; f < i->num_fields; f++) {
    const size_t start = i->fields[f].offset, end = start + i->fields[f].size;
    if (size >= end) {
      take = end;
    } else if (size > start) {
      return 0;
    }
  }
  return take;
}

static ks_status_t check_size(const ks_op_info *i, size_t size, const char *name) {
  if (size < sizeof(size_t))
    return ks_fail(KS_ERR_INVALID_ARGUMENT, "%s: size %zu is smaller than its size field (%zu bytes); set size to "
                   "sizeof(%s) or use ks_options_init", name, size, sizeof(size_t), i->type);
  if (size > i->size)
    return ks_fail(KS_ERR_INVALID_ARGUMENT, "%s: size %zu is larger than this library's %s (%zu bytes); the caller "
                   "was built against a newer kernelset.h", name, size, i->type, i->size);
  if (prefix_bytes(i, size) == 0)
    return ks_fail(KS_ERR_INVALID_ARGUMENT, "%s: size %zu ends inside a field of %s", name, size, i->type);
  return KS_OK;
}

KS_API ks_status_t ks_options_init(ks_op_t op, void *options, size_t size) {
  ks_clear_error();
  const ks_op_info i = ks_op_info_of(op);
  if (i.op == NULL) return ks_fail(KS_ERR_INVALID_ARGUMENT, "op: unknown op id %d", (int)op);
  if (i.type == NULL) return ks_fail(KS_ERR_INVALID_ARGUMENT, "op: %s takes no options", i.op);
  if (options == NULL) return ks_fail(KS_ERR_INVALID_ARGUMENT, "options: NULL");
  KS_TRY(check_size(&i, size, "options"));
  unsigned char full[256];
  memset(full, 0, sizeof full);
  i.defaults(full);
  memcpy(options, full, size); /* an older caller's struct gets the defaults of the fields it has */
  memcpy(options, &size, sizeof size);
  return KS_OK;
}

ks_status_t ks_read_options(ks_op_t op, const void *user, void *out, size_t ours, const char *name) {
  const ks_op_info i = ks_op_info_of(op);
  if (i.type == NULL || ours != i.size)
    return ks_fail(KS_ERR_INTERNAL, "%s: internal: op %d read with a struct of %zu bytes", name, (int)op, ours);
  memset(out, 0, ours);
  i.defaults(out);
  if (user == NULL) return KS_OK;
  size_t size;
  memcpy(&size, user, sizeof size);
  KS_TRY(check_size(&i, size, name));
  memcpy((char *)out + sizeof(size_t), (const char *)user + sizeof(size_t), prefix_bytes(&i, size) - sizeof(size_t));
  return KS_OK;
}

ks_status_t ks_check_positive(float v, const char *name) {
  if (v > 0.0f && v < INFINITY) return KS_OK;
  return ks_fail(KS_ERR_INVALID_ARGUMENT, "%s: expected a finite number > 0, got %g", name, (double)v);
}

ks_status_t ks_check_finite(float v, const char *name) {
  if (v > -INFINITY && v < INFINITY) return KS_OK;
  return ks_fail(KS_ERR_INVALID_ARGUMENT, "%s: expected a finite number, got %g", name, (double)v);
}

ks_status_t ks_check_range_i32(int32_t v, int32_t lo, int32_t hi, const char *name) {
  if (v >= lo && v <= hi) return KS_OK;
  return ks_fail(KS_ERR_INVALID_ARGUMENT, "%s: expected %d to %d, got %d", name, (int)lo, (int)hi, (int)v);
}
