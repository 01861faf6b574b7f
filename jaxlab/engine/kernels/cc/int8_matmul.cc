// jaxlab's int8 x int8 -> int32 matrix product for XLA:CPU, called through the XLA FFI
// (jaxlab/engine/kernels/cpu.py builds, loads and registers it; benchmarks/NOTES.md 26 says why it exists).
//
//   y[r, n] = sum_k x[r, k] * w[n, k]        x: int8 [R, K], w: int8 [N, K], y: int32 [R, N]
//
// Integer arithmetic is exact, so y is the same, bit for bit, as XLA's s32 dot_general of the same operands: only
// the time differs. It is meant for a few rows (a decode step's one or two rows, each split into two int8 rows by
// quant.formats.split_activations), where XLA:CPU's int8 GEMM streams the weights at under half the memory
// bandwidth. Each 64-byte piece of a weight row meets every activation row in AVX-512 VNNI's vpdpbusd
// (unsigned x signed bytes): x + 128 is the unsigned operand and 128 * sum_k w[n, k] is taken back off, which
// is exact for every int8 value, -128 included. The weight rows are split over the calling thread and the
// library's helper threads (threads.h).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "threads.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int kColumns = 4;             // weight rows read side by side
constexpr int64_t kPrefetchBytes = 2048;  // how far ahead in a weight row (measured: 0, 1024, 2048, 4096, 8192)
// Below this many multiply-adds a call runs on the calling thread alone: waking a helper would cost more than the
// product (a toy model's; SmolLM2's smallest, two rows by 192 x 576, is 221,184).
constexpr int64_t kAloneProducts = 1 << 16;

template <int RB, int CB>
inline void Piece(const uint8_t* xu, const int8_t* w, int64_t K, int64_t r0, int64_t n0, int64_t k, __mmask64 m,
                  __m512i (&acc)[RB][CB], __m512i (&wsum)[CB]) {
  const __m512i ones = _mm512_set1_epi8(1);
  __m512i a[RB];
#pragma GCC unroll 8
  for (int i = 0; i < RB; ++i) a[i] = _mm512_maskz_loadu_epi8(m, xu + (r0 + i) * K + k);
#pragma GCC unroll 8
  for (int c = 0; c < CB; ++c) {
    const int8_t* row = w + (n0 + c) * K + k;
    _mm_prefetch(reinterpret_cast<const char*>(row + kPrefetchBytes), _MM_HINT_T0);
    const __m512i b = _mm512_maskz_loadu_epi8(m, row);
    wsum[c] = _mm512_dpbusd_epi32(wsum[c], ones, b);
#pragma GCC unroll 8
    for (int i = 0; i < RB; ++i) acc[i][c] = _mm512_dpbusd_epi32(acc[i][c], a[i], b);
  }
}

// rows [r0, r0 + RB) of y, columns [n0, n0 + CB)
template <int RB, int CB>
void Block(const uint8_t* xu, const int8_t* w, int32_t* y, int64_t K, int64_t N, int64_t r0, int64_t n0) {
  __m512i acc[RB][CB], wsum[CB];
#pragma GCC unroll 8
  for (int c = 0; c < CB; ++c) {
    wsum[c] = _mm512_setzero_si512();
#pragma GCC unroll 8
    for (int i = 0; i < RB; ++i) acc[i][c] = _mm512_setzero_si512();
  }
  const int64_t full = K / 64 * 64;
  int64_t k = 0;
  for (; k < full; k += 64) Piece<RB, CB>(xu, w, K, r0, n0, k, ~0ULL, acc, wsum);
  if (K % 64) Piece<RB, CB>(xu, w, K, r0, n0, k, ~0ULL >> (64 - K % 64), acc, wsum);
#pragma GCC unroll 8
  for (int c = 0; c < CB; ++c) {
    const __m512i offset = _mm512_slli_epi32(wsum[c], 7);  // 128 * sum_k w[n, k], lane by lane
#pragma GCC unroll 8
    for (int i = 0; i < RB; ++i) y[(r0 + i) * N + n0 + c] = _mm512_reduce_add_epi32(_mm512_sub_epi32(acc[i][c], offset));
  }
}

template <int RB>
void Rows(const uint8_t* xu, const int8_t* w, int32_t* y, int64_t K, int64_t N, int64_t r0, int64_t n0, int64_t n1) {
  int64_t n = n0;
  for (; n + kColumns <= n1; n += kColumns) Block<RB, kColumns>(xu, w, y, K, N, r0, n);
  for (; n < n1; ++n) Block<RB, 1>(xu, w, y, K, N, r0, n);
}

void Columns(const uint8_t* xu, const int8_t* w, int32_t* y, int64_t R, int64_t K, int64_t N, int64_t n0, int64_t n1) {
  int64_t r = 0;
  for (; r + 4 <= R; r += 4) Rows<4>(xu, w, y, K, N, r, n0, n1);
  for (; r + 2 <= R; r += 2) Rows<2>(xu, w, y, K, N, r, n0, n1);
  for (; r < R; ++r) Rows<1>(xu, w, y, K, N, r, n0, n1);
}

struct Product {
  const uint8_t* xu;
  const int8_t* w;
  int32_t* y;
  int64_t R, K, N, chunk;
};

void ProductChunk(const void* context, int64_t c) {
  const Product& p = *static_cast<const Product*>(context);
  const int64_t n0 = c * p.chunk;
  Columns(p.xu, p.w, p.y, p.R, p.K, p.N, n0, std::min(p.N, n0 + p.chunk));
}

ffi::Error Int8Matmul(ffi::Buffer<ffi::S8> x, ffi::Buffer<ffi::S8> w, ffi::ResultBuffer<ffi::S32> y) {
  const auto xd = x.dimensions(), wd = w.dimensions();
  if (xd.size() != 2 || wd.size() != 2 || xd[1] != wd[1])
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "jaxlab_int8_matmul: expected x [R, K] and w [N, K]");
  const int64_t R = xd[0], K = xd[1], N = wd[0];
  thread_local std::vector<uint8_t> shifted;
  shifted.resize(R * K);
  const int8_t* xs = x.typed_data();
  for (int64_t i = 0; i < R * K; ++i) shifted[i] = static_cast<uint8_t>(xs[i] + 128);
  const int64_t threads = jaxlab::Threads();
  Product p{shifted.data(), w.typed_data(), y->typed_data(), R, K, N,
            std::max<int64_t>(16, (N + 8 * threads - 1) / (8 * threads))};
  jaxlab::Job job(ProductChunk, &p, (N + p.chunk - 1) / p.chunk);
  jaxlab::RunSized(&job, R * K * N, kAloneProducts);
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxlabInt8Matmul, Int8Matmul,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::S8>>()  // x [R, K]
                                  .Arg<ffi::Buffer<ffi::S8>>()  // w [N, K]
                                  .Ret<ffi::Buffer<ffi::S32>>()  // y [R, N]
);
