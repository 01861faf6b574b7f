/* How fast this machine's cores read memory (benchmarks/NOTES.md 26): a 134 MB buffer, the size of the
 * model's int8 matrices, summed with AVX-512 loads by T threads, five passes.
 *
 *   gcc -O3 -mavx512f -fopenmp benchmarks/kernels/read_bandwidth.c -o /tmp/read_bandwidth
 *   /tmp/read_bandwidth 1 && /tmp/read_bandwidth 2
 */
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char** argv) {
  const size_t n = 134ull << 20;
  char* a = aligned_alloc(64, n);
  for (size_t i = 0; i < n; i++) a[i] = (char)i;
  const int threads = argc > 1 ? atoi(argv[1]) : 1;
  for (int rep = 0; rep < 5; rep++) {
    const double t0 = now();
    long long total = 0;
#pragma omp parallel for num_threads(threads) reduction(+ : total)
    for (int c = 0; c < threads; c++) {
      __m512i s = _mm512_setzero_si512();
      const size_t per = n / threads;
      for (size_t i = c * per; i < (c + 1) * per; i += 64) s = _mm512_add_epi32(s, _mm512_load_si512(a + i));
      total += _mm512_reduce_add_epi32(s);
    }
    const double t = now() - t0;
    printf("%d thread(s): %.2f ms, %.1f GB/s (checksum %lld)\n", threads, t * 1e3, n / t / 1e9, total);
  }
  free(a);
  return 0;
}
