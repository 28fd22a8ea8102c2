/*
 * dtype.c: element-wise reductions for every NCCL datatype. float16 and
 * bfloat16 are reduced in float and rounded back to nearest-even, once per
 * reduction step, as a GPU kernel working in half precision would.
 */
#include <string.h>

#include "internal.h"

size_t dtype_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
      return 8;
    default:
      return 0;
  }
}

const char *dtype_name(ncclDataType_t t) {
  static const char *names[] = {"int8",    "uint8",   "int32",   "uint32",  "int64",
                                "uint64",  "float16", "float32", "float64", "bfloat16"};
  if ((int)t < 0 || t >= ncclNumTypes) return "invalid";
  return names[t];
}

float half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff, x;
  if (exp == 0) {
    if (man == 0) {
      x = sign;
    } else { /* subnormal: shift until the implicit bit appears */
      int e = -1;
      do {
        e++;
        man <<= 1;
      } while (!(man & 0x400));
      x = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ff) << 13);
    }
  } else if (exp == 31) {
    x = sign | 0x7f800000 | (man << 13);
  } else {
    x = sign | ((exp + 112) << 23) | (man << 13);
  }
  float f;
  memcpy(&f, &x, sizeof f);
  return f;
}

uint16_t float_to_half(float f) {
  uint32_t x;
  memcpy(&x, &f, sizeof x);
  uint32_t sign = (x >> 16) & 0x8000;
  uint32_t exp = (x >> 23) & 0xff, man = x & 0x7fffff;
  if (exp == 0xff) return (uint16_t)(sign | 0x7c00 | (man ? 0x200 | (man >> 13) : 0));
  int e = (int)exp - 112;
  if (e >= 31) return (uint16_t)(sign | 0x7c00);
  if (e <= 0) {
    if (e < -10) return (uint16_t)sign;
    man |= 0x800000;
    int shift = 14 - e;
    uint32_t h = man >> shift, rem = man & ((1u << shift) - 1), halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (h & 1))) h++;
    return (uint16_t)(sign | h);
  }
  uint32_t h = ((uint32_t)e << 10) | (man >> 13), rem = man & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++; /* a carry into the exponent is right */
  return (uint16_t)(sign | h);
}

float bf16_to_float(uint16_t h) {
  uint32_t x = (uint32_t)h << 16;
  float f;
  memcpy(&f, &x, sizeof f);
  return f;
}

uint16_t float_to_bf16(float f) {
  uint32_t x;
  memcpy(&x, &f, sizeof x);
  if ((x & 0x7f800000) == 0x7f800000 && (x & 0x7fffff)) return (uint16_t)((x >> 16) | 0x40);
  x += 0x7fff + ((x >> 16) & 1);
  return (uint16_t)(x >> 16);
}

/* Integer sums and products wrap (computed unsigned), as on the GPU. */
#define REDUCE_INT(T, U)                                                   \
  static void reduce_##T(T *d, const T *s, size_t n, ncclRedOp_t op) {     \
    size_t i;                                                              \
    switch (op) {                                                          \
      case ncclSum:                                                        \
      case ncclAvg:                                                        \
        for (i = 0; i < n; i++) d[i] = (T)((U)d[i] + (U)s[i]);             \
        break;                                                             \
      case ncclProd:                                                       \
        for (i = 0; i < n; i++) d[i] = (T)((U)d[i] * (U)s[i]);             \
        break;                                                             \
      case ncclMax:                                                        \
        for (i = 0; i < n; i++) d[i] = d[i] > s[i] ? d[i] : s[i];          \
        break;                                                             \
      default:                                                             \
        for (i = 0; i < n; i++) d[i] = d[i] < s[i] ? d[i] : s[i];          \
        break;                                                             \
    }                                                                      \
  }

#define REDUCE_FLOAT(T)                                                    \
  static void reduce_##T(T *d, const T *s, size_t n, ncclRedOp_t op) {     \
    size_t i;                                                              \
    switch (op) {                                                          \
      case ncclSum:                                                        \
      case ncclAvg:                                                        \
        for (i = 0; i < n; i++) d[i] += s[i];                              \
        break;                                                             \
      case ncclProd:                                                       \
        for (i = 0; i < n; i++) d[i] *= s[i];                              \
        break;                                                             \
      case ncclMax:                                                        \
        for (i = 0; i < n; i++) d[i] = d[i] > s[i] ? d[i] : s[i];          \
        break;                                                             \
      default:                                                             \
        for (i = 0; i < n; i++) d[i] = d[i] < s[i] ? d[i] : s[i];          \
        break;                                                             \
    }                                                                      \
  }

typedef unsigned int uint_t;
REDUCE_INT(int8_t, uint_t)
REDUCE_INT(uint8_t, uint_t)
REDUCE_INT(int32_t, uint32_t)
REDUCE_INT(uint32_t, uint32_t)
REDUCE_INT(int64_t, uint64_t)
REDUCE_INT(uint64_t, uint64_t)
REDUCE_FLOAT(float)
REDUCE_FLOAT(double)

static float apply_f(float a, float b, ncclRedOp_t op) {
  switch (op) {
    case ncclSum:
    case ncclAvg:
      return a + b;
    case ncclProd:
      return a * b;
    case ncclMax:
      return a > b ? a : b;
    default:
      return a < b ? a : b;
  }
}

static void reduce_half(uint16_t *d, const uint16_t *s, size_t n, ncclRedOp_t op, int bf) {
  for (size_t i = 0; i < n; i++) {
    if (bf)
      d[i] = float_to_bf16(apply_f(bf16_to_float(d[i]), bf16_to_float(s[i]), op));
    else
      d[i] = float_to_half(apply_f(half_to_float(d[i]), half_to_float(s[i]), op));
  }
}

void reduce_into(void *dst, const void *src, size_t n, ncclDataType_t t, ncclRedOp_t op) {
  switch (t) {
    case ncclInt8: reduce_int8_t(dst, src, n, op); break;
    case ncclUint8: reduce_uint8_t(dst, src, n, op); break;
    case ncclInt32: reduce_int32_t(dst, src, n, op); break;
    case ncclUint32: reduce_uint32_t(dst, src, n, op); break;
    case ncclInt64: reduce_int64_t(dst, src, n, op); break;
    case ncclUint64: reduce_uint64_t(dst, src, n, op); break;
    case ncclFloat16: reduce_half(dst, src, n, op, 0); break;
    case ncclFloat32: reduce_float(dst, src, n, op); break;
    case ncclFloat64: reduce_double(dst, src, n, op); break;
    case ncclBfloat16: reduce_half(dst, src, n, op, 1); break;
    default: break;
  }
}

#define DIVIDE(T, buf, n, div)                              \
  do {                                                      \
    T *p_ = (T *)(buf);                                     \
    for (size_t i_ = 0; i_ < (n); i_++) p_[i_] /= (T)(div); \
  } while (0)

void divide_by(void *buf, size_t n, ncclDataType_t t, int div) {
  uint16_t *h = buf;
  switch (t) {
    case ncclInt8: DIVIDE(int8_t, buf, n, div); break;
    case ncclUint8: DIVIDE(uint8_t, buf, n, div); break;
    case ncclInt32: DIVIDE(int32_t, buf, n, div); break;
    case ncclUint32: DIVIDE(uint32_t, buf, n, div); break;
    case ncclInt64: DIVIDE(int64_t, buf, n, div); break;
    case ncclUint64: DIVIDE(uint64_t, buf, n, div); break;
    case ncclFloat32: DIVIDE(float, buf, n, div); break;
    case ncclFloat64: DIVIDE(double, buf, n, div); break;
    case ncclFloat16:
      for (size_t i = 0; i < n; i++) h[i] = float_to_half(half_to_float(h[i]) / (float)div);
      break;
    case ncclBfloat16:
      for (size_t i = 0; i < n; i++) h[i] = float_to_bf16(bf16_to_float(h[i]) / (float)div);
      break;
    default: break;
  }
}
