/* halfs.c: float16 and float8 e4m3fn <-> float32, round-to-nearest-even, no FPU mode assumed.
 * (bfloat16 is inline in ks_internal.h: it is a truncated float32.) */
#include "ks_internal.h"

static uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

static float bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* Rounds `v` >= 0 (exactly representable in double, < 2^52) to the nearest integer, ties to even. */
static double round_even(double v) {
  double q = floor(v);
  double frac = v - q;
  if (frac > 0.5 || (frac == 0.5 && fmod(q, 2.0) != 0.0)) q += 1.0;
  return q;
}

float ks_f16_to_f32(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  const uint32_t em = h & 0x7fffu;
  if (em >= 0x7c00u) return bits_f32(sign | 0x7f800000u | ((em & 0x3ffu) << 13)); /* inf, NaN */
  if (em >= 0x0400u) return bits_f32(sign | ((em << 13) + ((127u - 15u) << 23)));  /* normal */
  /* subnormal or zero: em * 2^-24 is exact in float32 */
  return bits_f32(sign | f32_bits((float)em * 5.9604644775390625e-8f));
}

uint16_t ks_f32_to_f16(float f) {
  uint32_t u = f32_bits(f);
  const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  u &= 0x7fffffffu;
  if (u > 0x7f800000u) return (uint16_t)(sign | 0x7e00u); /* NaN (quiet) */
  if (u >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 rounds to inf */
  if (u < 0x38800000u) {
    /* below 2^-14: a subnormal, the value in units of 2^-24 rounded to even */
    const double units = (double)bits_f32(u) * 16777216.0;
    return (uint16_t)(sign | (uint16_t)round_even(units));
  }
  /* normal: rebias the exponent, round the 13 dropped mantissa bits to even */
  const uint32_t odd = (u >> 13) & 1u;
  u = u - ((127u - 15u) << 23) + 0xfffu + odd;
  return (uint16_t)(sign | (uint16_t)(u >> 13));
}

float ks_f8e4m3_to_f32(uint8_t b) {
  const float sign = (b & 0x80u) ? -1.0f : 1.0f;
  const int e = (b >> 3) & 0xf;
  const int m = b & 0x7;
  if (e == 0xf && m == 0x7) return NAN; /* e4m3fn: no infinities, one NaN pattern per sign */
  if (e == 0) return sign * ldexpf((float)m, -9);
  return sign * ldexpf(1.0f + (float)m / 8.0f, e - 7);
}

uint8_t ks_f32_to_f8e4m3(float f) {
  const uint8_t sign = (f32_bits(f) >> 24) & 0x80u;
  if (f != f) return (uint8_t)(sign | 0x7fu);
  const double a = fabs((double)f);
  if (a >= 448.0) return (uint8_t)(sign | 0x7eu); /* saturate (inf included) */
  if (a < 0.015625) {                              /* below 2^-6: subnormal, units of 2^-9 */
    return (uint8_t)(sign | (uint8_t)round_even(a * 512.0)); /* 8 units = the smallest normal: same bits */
  }
  int e;
  const double m = frexp(a, &e); /* a = m * 2^e, m in [0.5, 1) */
  double q = round_even((m * 2.0 - 1.0) * 8.0);
  e -= 1;
  if (q == 8.0) {
    q = 0.0;
    e += 1;
  }
  int bits = ((e + 7) << 3) | (int)q;
  if (bits > 0x7e) bits = 0x7e; /* 480 would be the NaN pattern: saturate to 448 */
  return (uint8_t)(sign | bits);
}
