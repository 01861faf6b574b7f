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

// y [R, N] = xu [R, K] (unsigned: x + 128) . w [N, K], the weight rows split over the calling thread and the helpers
void Multiply(const uint8_t* xu, const int8_t* w, int32_t* y, int64_t R, int64_t K, int64_t N) {
  const int64_t threads = jaxlab::Threads();
  Product p{xu, w, y, R, K, N, std::max<int64_t>(16, (N + 8 * threads - 1) / (8 * threads))};
  jaxlab::Job job(ProductChunk, &p, (N + p.chunk - 1) / p.chunk);
  jaxlab::RunSized(&job, R * K * N, kAloneProducts);
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
  Multiply(shifted.data(), w.typed_data(), y->typed_data(), R, K, N);
  return ffi::Error::Success();
}

// The int8 weight-only product of a few float32 rows: quant.formats's split of the activations into hi and lo int8
// rows and the product above in one call, instead of a custom call after five small XLA fusions (each distinct
// activation of a decode step: 121 of them). Every float operation is the one XLA:CPU runs for
// quant.formats.split_activations (its optimized HLO: the division by 127 becomes a product with its float32
// reciprocal, x / s becomes x * (1 / s)), in the same order, so the rows and scales are the same bits as XLA's:
//   s = max_k |x[r, k]| * (1 / 127), 1 where that is not > 0;   t = x * (1 / s)
//   hi = round_even(t), lo = round_even((t - hi) * 254)          (int8: |t| <= 127, |t - hi| <= 0.5)
// The join and the scaling, ((hi . w) + (lo . w) / 254) * s * scale, stay in XLA's program: there they fuse with what
// follows (a residual add, the rotary embedding) into the same multiply-adds whatever the row count, so a row is the
// same bits alone (on this kernel) and among others (XLA's dot). Returned joined and scaled here, the last product
// was rounded before the add: up to 1 ulp apart (measured).
constexpr float kInv127 = 1.0f / 127.0f;
constexpr float kSplit = 254.0f;

// the lanes of the 16 floats from k that lie before K
inline __mmask16 Lanes(int64_t k, int64_t K) {
  return K - k >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << (K - k)) - 1);
}

// x [R, K] float32 -> xu [2R, K] (hi rows, then lo rows, each + 128 for vpdpbusd) and s [R]
void Split(const float* x, int64_t R, int64_t K, uint8_t* xu, float* s) {
  const __m512i bias = _mm512_set1_epi32(128);
  for (int64_t r = 0; r < R; ++r) {
    const float* row = x + r * K;
    __m512 m = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k += 16) {
      const __mmask16 mask = Lanes(k, K);
      m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_maskz_loadu_ps(mask, row + k)));
    }
    float sr = _mm512_reduce_max_ps(m) * kInv127;
    sr = sr > 0.0f ? sr : 1.0f;
    s[r] = sr;
    const __m512 inv = _mm512_set1_ps(1.0f / sr), split = _mm512_set1_ps(kSplit);
    for (int64_t k = 0; k < K; k += 16) {
      const __mmask16 mask = Lanes(k, K);
      const __m512 t = _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, row + k), inv);
      const __m512 hi = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      const __m512 lo =
          _mm512_roundscale_ps(_mm512_mul_ps(_mm512_sub_ps(t, hi), split), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      _mm512_mask_cvtepi32_storeu_epi8(xu + r * K + k, mask, _mm512_add_epi32(_mm512_cvtps_epi32(hi), bias));
      _mm512_mask_cvtepi32_storeu_epi8(xu + (R + r) * K + k, mask, _mm512_add_epi32(_mm512_cvtps_epi32(lo), bias));
    }
  }
}

ffi::Error Int8SplitMatmul(ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::S8> w, ffi::ResultBuffer<ffi::S32> y,
                           ffi::ResultBuffer<ffi::F32> s) {
  const auto xd = x.dimensions(), wd = w.dimensions();
  if (xd.size() != 2 || wd.size() != 2 || xd[1] != wd[1])
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "jaxlab_int8_split_matmul: expected x [R, K] and w [N, K]");
  const int64_t R = xd[0], K = xd[1], N = wd[0];
  thread_local std::vector<uint8_t> xu;
  xu.resize(2 * R * K);
  Split(x.typed_data(), R, K, xu.data(), s->typed_data());
  Multiply(xu.data(), w.typed_data(), y->typed_data(), 2 * R, K, N);
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxlabInt8SplitMatmul, Int8SplitMatmul,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // x [R, K]
                                  .Arg<ffi::Buffer<ffi::S8>>()   // w [N, K]
                                  .Ret<ffi::Buffer<ffi::S32>>()  // y [2R, N]: the hi rows' products, then the lo rows'
                                  .Ret<ffi::Buffer<ffi::F32>>()  // s [R, 1]
);

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxlabInt8Matmul, Int8Matmul,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::S8>>()  // x [R, K]
                                  .Arg<ffi::Buffer<ffi::S8>>()  // w [N, K]
                                  .Ret<ffi::Buffer<ffi::S32>>()  // y [R, N]
);
