// jaxlab's float32 matrix product of a few rows for XLA:CPU, called through the XLA FFI
// (jaxlab/engine/kernels/cpu.py builds, loads and registers it; benchmarks/NOTES.md 28 says why it exists).
//
//   y[r, n] = sum_k x[r, k] * w[k, n]        x: float32 [R, K], w: float32 [K, N] (a linear layer's kernel), y [R, N]
//
// Each output is one fused multiply-add chain over k = 0 .. K-1 from zero, whatever R, the tiling or the thread, so
// a row is the same bits alone and among others (XLA:CPU's dot sums in an order that follows the row count,
// NOTES 11), and a one-row product is the same bits as XLA's matrix-vector product. A tile of rows x 16 NB columns
// keeps its accumulators in registers (NB 8 at 1-2 rows, 6 at 3-4, 3 from 5, 8 rows a block); k is walked in blocks
// of kKBlock rows so every row block reads a tile's rows of w from L1; the first row block prefetches w's rows ahead.
// The columns' tiles are split over the calling thread and the library's helper threads (threads.h).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "threads.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int64_t kKBlock = 128;  // k rows of a tile's columns kept in L1 while every row block uses them
constexpr int kPrefetchRows = 16;  // how many k rows ahead the first row block prefetches (measured: 4, 8, 16, 32, 64)
// Below this many multiply-adds a call runs on the calling thread alone: waking a helper would cost more than the
// product (a toy model's; the smallest of SmolLM2's, one row by 576 x 192, is 110,592).
constexpr int64_t kAloneProducts = 1 << 16;

// the lanes of a 16-float vector that hold one of the next ``left`` columns
inline __mmask16 Mask(int64_t left) {
  return left >= 16 ? 0xFFFF : left <= 0 ? 0 : static_cast<__mmask16>((1u << left) - 1);
}

// rows [r0, r0 + MB), columns [n0, n0 + 16 NB) (masked at N), k in [k0, k1): the chains go on from y unless k0 == 0
template <int MB, int NB>
void Tile(const float* x, const float* w, float* y, int64_t K, int64_t N, int64_t r0, int64_t n0, int64_t k0,
            int64_t k1, bool prefetch) {
  __m512 acc[MB][NB];
  __mmask16 m[NB];
#pragma GCC unroll 32
  for (int j = 0; j < NB; ++j) m[j] = Mask(N - n0 - 16 * j);
#pragma GCC unroll 32
  for (int i = 0; i < MB; ++i)
#pragma GCC unroll 32
    for (int j = 0; j < NB; ++j)
      acc[i][j] = k0 == 0 ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(m[j], y + (r0 + i) * N + n0 + 16 * j);
  const float* xr = x + r0 * K;
  for (int64_t k = k0; k < k1; ++k) {
    const float* wk = w + k * N + n0;
    if (prefetch && k + kPrefetchRows < K) {
#pragma GCC unroll 32
      for (int j = 0; j < NB; ++j)
        _mm_prefetch(reinterpret_cast<const char*>(wk + kPrefetchRows * N + 16 * j), _MM_HINT_T0);
    }
    __m512 b[NB];
#pragma GCC unroll 32
    for (int j = 0; j < NB; ++j) b[j] = _mm512_maskz_loadu_ps(m[j], wk + 16 * j);
#pragma GCC unroll 32
    for (int i = 0; i < MB; ++i) {
      const __m512 a = _mm512_set1_ps(xr[i * K + k]);
#pragma GCC unroll 32
      for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_fmadd_ps(a, b[j], acc[i][j]);
    }
  }
#pragma GCC unroll 32
  for (int i = 0; i < MB; ++i)
#pragma GCC unroll 32
    for (int j = 0; j < NB; ++j) _mm512_mask_storeu_ps(y + (r0 + i) * N + n0 + 16 * j, m[j], acc[i][j]);
}

template <int NB>
void Rows(const float* x, const float* w, float* y, int64_t R, int64_t K, int64_t N, int64_t r0, int64_t rows,
          int64_t n0, int64_t k0, int64_t k1, bool prefetch) {
  switch (rows) {
    case 1: return Tile<1, NB>(x, w, y, K, N, r0, n0, k0, k1, prefetch);
    case 2: return Tile<2, NB>(x, w, y, K, N, r0, n0, k0, k1, prefetch);
    case 3: return Tile<3, NB>(x, w, y, K, N, r0, n0, k0, k1, prefetch);
    case 4: return Tile<4, NB>(x, w, y, K, N, r0, n0, k0, k1, prefetch);
    case 5: return Tile<5, NB>(x, w, y, K, N, r0, n0, k0, k1, prefetch);
    case 6: return Tile<6, NB>(x, w, y, K, N, r0, n0, k0, k1, prefetch);
    case 7: return Tile<7, NB>(x, w, y, K, N, r0, n0, k0, k1, prefetch);
    default: return Tile<8, NB>(x, w, y, K, N, r0, n0, k0, k1, prefetch);
  }
}

struct Product {
  const float* x;
  const float* w;
  float* y;
  int64_t R, K, N, columns;  // columns a chunk
  int nb, mb;
};

// columns [n0, n0 + 16 NB) of every row, k block by k block
template <int NB>
void TileColumns(const Product& p, int64_t n0) {
  for (int64_t k0 = 0; k0 < p.K; k0 += kKBlock) {
    const int64_t k1 = std::min(p.K, k0 + kKBlock);
    for (int64_t r = 0; r < p.R; r += p.mb)
      Rows<NB>(p.x, p.w, p.y, p.R, p.K, p.N, r, std::min<int64_t>(p.mb, p.R - r), n0, k0, k1, r == 0);
  }
}

void ProductChunk(const void* context, int64_t c) {
  const Product& p = *static_cast<const Product*>(context);
  const int64_t n_end = std::min(p.N, (c + 1) * p.columns);
  for (int64_t n0 = c * p.columns; n0 < n_end; n0 += 16 * p.nb) {
    switch (p.nb) {
      case 8: TileColumns<8>(p, n0); break;
      case 6: TileColumns<6>(p, n0); break;
      default: TileColumns<3>(p, n0); break;
    }
  }
}

ffi::Error Matmul(ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> w, ffi::ResultBuffer<ffi::F32> y) {
  const auto xd = x.dimensions(), wd = w.dimensions();
  if (xd.size() != 2 || wd.size() != 2 || xd[1] != wd[0])
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "jaxlab_f32_matmul: expected x [R, K] and w [K, N]");
  const int64_t R = xd[0], K = xd[1], N = wd[1];
  // a tile: R rows at most 8 at a time, 16 nb columns; its accumulators (rows x nb) fill the registers
  const int nb = R <= 2 ? 8 : R <= 4 ? 6 : 3;  // measured at 1 row: 24, 8, 4 columns of 16
  const int64_t tile = 16 * nb, tiles = (N + tile - 1) / tile;
  const int64_t per = std::max<int64_t>(1, tiles / (4 * jaxlab::Threads()));
  Product p{x.typed_data(), w.typed_data(), y->typed_data(), R, K, N, per * tile, nb, 8};
  jaxlab::Job job(ProductChunk, &p, (tiles + per - 1) / per);
  jaxlab::RunSized(&job, R * K * N, kAloneProducts);
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxlabF32Matmul, Matmul,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // x [R, K]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // w [K, N]
                                  .Ret<ffi::Buffer<ffi::F32>>()  // y [R, N]
);
