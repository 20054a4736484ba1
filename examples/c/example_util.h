/*
 * example_util.h — what the C examples share: a check of every moekit call that prints the library's own message
 * and exits, a SplitMix64 random stream (the same numbers on every platform) and bf16 <-> float conversions.
 * C99, header only (every function is static), and it needs nothing but moekit.h.
 *
 * Define EXAMPLE_NAME (the program's name, which starts every error line) before including it. Set rng_state
 * to the program's seed before drawing numbers.
 */
#ifndef MOEKIT_EXAMPLE_UTIL_H
#define MOEKIT_EXAMPLE_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <moekit/moekit.h>

#ifndef EXAMPLE_NAME
#error "define EXAMPLE_NAME before including example_util.h"
#endif

/* Every moekit call goes through here: on failure, print the status and the library's own message. */
static void check(moekit_status_t status, const char* call) {
  char message[1024];
  if (status == MOEKIT_SUCCESS) return;
  moekit_get_last_error(message, sizeof message);
  fprintf(stderr, EXAMPLE_NAME ": %s failed: %s: %s\n", call, moekit_status_string(status), message);
  exit(EXIT_FAILURE);
}
#define CHECK(call) check((call), #call)

/* SplitMix64: small, and the same sequence on every platform. */
static uint64_t rng_state = 0;

static uint64_t rng_next(void) {
  uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* Uniform in [-scale, scale). */
static float rng_uniform(float scale) {
  const double unit = (double)(rng_next() >> 11) * (1.0 / 9007199254740992.0); /* [0, 1) from 53 bits */
  return (float)((2.0 * unit - 1.0) * scale);
}

/* bf16 is the top half of an fp32; round to nearest, ties to even. */
static uint16_t float_to_bf16(float value) {
  uint32_t bits;
  memcpy(&bits, &value, sizeof bits);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0; /* NaN stays a (quiet) NaN */
  bits += 0x7FFFu + ((bits >> 16) & 1u);
  return (uint16_t)(bits >> 16);
}

static float bf16_to_float(uint16_t value) {
  const uint32_t bits = (uint32_t)value << 16;
  float result;
  memcpy(&result, &bits, sizeof result);
  return result;
}

#endif /* MOEKIT_EXAMPLE_UTIL_H */
