/* errors.c: the thread-local error message behind ks_last_error(). */
#include <stdarg.h>
#include <stdio.h>

#include "ks_internal.h"

/* One buffer per thread: a call on one thread never overwrites another thread's message. */
static __thread char ks_err_buf[KS_ERRLEN];

KS_API const char *ks_last_error(void) { return ks_err_buf; }

char *ks_error_buffer(void) { return ks_err_buf; }

void ks_clear_error(void) { ks_err_buf[0] = '\0'; }

ks_status_t ks_fail(ks_status_t s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(ks_err_buf, KS_ERRLEN, fmt, ap);
  va_end(ap);
  return s;
}
