// jaxlab's float32 matrix product of a few rows for XLA:CPU, called through the XLA FFI
// (jaxlab/engine/kernels/cpu.py builds, loads and registers it; benchmarks/NOTES.md 28 and 29 say why it exists).
//
//   y[r, n] = sum_k x[r, k] * w[k, n]        x: float32 [R, K], w: float32 [K, N] (a linear layer's kernel), y [R, N]
//
// Each output is two fused multiply-add chains from zero, one over k = 0 .. h-1 and one over k = h .. K-1 (h = Half(K),
// about K / 2), then their sum, whatever R, the tiling or the thread, so a row is the same bits alone and among others
// (XLA:CPU's dot sums in an order that follows the row count, NOTES 11). Up to kStreamRows rows, the two halves of w
// are read by two threads, each front to back, kStreamK rows of w at a time against every row's chains kept in L1:
// a one-row product then reads its weights at a plain read's bandwidth (NOTES 29; column tiles, each thread reading
// every row of w in pieces, were 25-40 % slower). From kStreamRows + 1 rows, a tile of rows x 16 NB columns keeps its
// accumulators in registers (kTileNB = 3, 8 rows a block); k is walked in blocks of kKBlock rows so every row block
// reads a tile's rows of w from L1; the columns' tiles are split over the threads (threads.h). The second chains go
// to z, a scratch output of the call.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "threads.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int64_t kStreamRows = 8;  // up to this many rows, each thread streams its half of w (measured: 4, 8, 16)
constexpr int kStreamK = 4;  // k rows of w a streamed product reads at a time (each row's chains read and written once)
constexpr int kRowBlock = 8;  // rows of a register tile
constexpr int kTileNB = 3;  // 16-column vectors of a register tile (8 rows x 3: 24 accumulators)
constexpr int64_t kKBlock = 128;  // k rows of a tile's columns kept in L1 while every row block uses them
constexpr int kPrefetchRows = 16;  // how many k rows ahead the first row block prefetches (measured: 4, 8, 16, 32, 64)
// Below this many multiply-adds a call runs on the calling thread alone: waking a helper would cost more than the
// product (a toy model's; the smallest of SmolLM2's, one row by 576 x 192, is 110,592).
constexpr int64_t kAloneProducts = 1 << 16;

// the lanes of a 16-float vector that hold one of the next ``left`` columns
inline __mmask16 Mask(int64_t left) {
  return left >= 16 ? 0xFFFF : left <= 0 ? 0 : static_cast<__mmask16>((1u << left) - 1);
}

// y[i] += z[i] for i < n: the second chains added to the first
inline void AddInto(float* y, const float* z, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = Mask(n - i);
    _mm512_mask_storeu_ps(y + i, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, y + i), _mm512_maskz_loadu_ps(m, z + i)));
  }
}

// rows [r0, r0 + MB), columns [n0, n0 + 16 NB) (masked at N), k in [k0, k1): the chains go on from y unless fresh
template <int MB, int NB>
void Tile(const float* x, const float* w, float* y, int64_t K, int64_t N, int64_t r0, int64_t n0, int64_t k0,
          int64_t k1, bool fresh, bool prefetch) {
  __m512 acc[MB][NB];
  __mmask16 m[NB];
#pragma GCC unroll 32
  for (int j = 0; j < NB; ++j) m[j] = Mask(N - n0 - 16 * j);
#pragma GCC unroll 32
  for (int i = 0; i < MB; ++i)
#pragma GCC unroll 32
    for (int j = 0; j < NB; ++j)
      acc[i][j] = fresh ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(m[j], y + (r0 + i) * N + n0 + 16 * j);
  const float* xr = x + r0 * K;
  for (int64_t k = k0; k < k1; ++k) {
    const float* wk = w + k * N + n0;
    if (prefetch && k + kPrefetchRows < k1) {
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
void Rows(const float* x, const float* w, float* y, int64_t K, int64_t N, int64_t r0, int64_t rows, int64_t n0,
          int64_t k0, int64_t k1, bool fresh, bool prefetch) {
  switch (rows) {
    case 1: return Tile<1, NB>(x, w, y, K, N, r0, n0, k0, k1, fresh, prefetch);
    case 2: return Tile<2, NB>(x, w, y, K, N, r0, n0, k0, k1, fresh, prefetch);
    case 3: return Tile<3, NB>(x, w, y, K, N, r0, n0, k0, k1, fresh, prefetch);
    case 4: return Tile<4, NB>(x, w, y, K, N, r0, n0, k0, k1, fresh, prefetch);
    case 5: return Tile<5, NB>(x, w, y, K, N, r0, n0, k0, k1, fresh, prefetch);
    case 6: return Tile<6, NB>(x, w, y, K, N, r0, n0, k0, k1, fresh, prefetch);
    case 7: return Tile<7, NB>(x, w, y, K, N, r0, n0, k0, k1, fresh, prefetch);
    default: return Tile<8, NB>(x, w, y, K, N, r0, n0, k0, k1, fresh, prefetch);
  }
}

// Where each output's first chain stops and its second starts: half of K, a multiple of kStreamK
inline int64_t Half(int64_t K) { return (K / 2) / kStreamK * kStreamK; }

struct Product {
  const float* x;
  const float* w;
  float* y;  // the first half's chains, then the sums
  float* z;  // the second half's chains
  int64_t R, K, N, half, columns;  // half: Half(K); columns: a chunk's columns
};

// columns [n0, n0 + 16 NB) of every row: both halves' chains, k block by k block, then their sum
template <int NB>
void TileColumns(const Product& p, int64_t n0) {
  for (int h = 0; h < 2; ++h) {
    const int64_t ks = h ? p.half : 0, ke = h ? p.K : p.half;
    float* out = h ? p.z : p.y;
    if (ks == ke) {  // an empty half (K < 2 kStreamK): its chains are zero
      for (int64_t r = 0; r < p.R; ++r)
        for (int64_t n = n0; n < std::min(p.N, n0 + 16 * NB); ++n) out[r * p.N + n] = 0.0f;
    }
    for (int64_t k0 = ks; k0 < ke; k0 += kKBlock) {
      const int64_t k1 = std::min(ke, k0 + kKBlock);
      for (int64_t r = 0; r < p.R; r += kRowBlock)
        Rows<NB>(p.x, p.w, out, p.K, p.N, r, std::min<int64_t>(kRowBlock, p.R - r), n0, k0, k1, k0 == ks, r == 0);
    }
  }
  const int64_t n1 = std::min(p.N, n0 + 16 * NB);
  for (int64_t r = 0; r < p.R; ++r) AddInto(p.y + r * p.N + n0, p.z + r * p.N + n0, n1 - n0);
}

// A few rows: k rows [k0, k1) of columns [c0, c1), read in order (a thread's half of w is one stream), kStreamK rows
// of w at a time against every row's chains, which live in out (L1)
template <int R>
void Stream(const float* x, const float* w, float* out, int64_t K, int64_t N, int64_t k0, int64_t k1, int64_t c0,
            int64_t c1) {
  for (int r = 0; r < R; ++r)
    for (int64_t n = c0; n < c1; n += 16) _mm512_mask_storeu_ps(out + r * N + n, Mask(c1 - n), _mm512_setzero_ps());
  int64_t k = k0;
  for (; k + kStreamK <= k1; k += kStreamK) {
    const float* wk = w + k * N;
    __m512 a[R][kStreamK];
#pragma GCC unroll 32
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 32
      for (int j = 0; j < kStreamK; ++j) a[r][j] = _mm512_set1_ps(x[r * K + k + j]);
    for (int64_t n = c0; n < c1; n += 16) {
      const __mmask16 m = Mask(c1 - n);
      __m512 b[kStreamK];
#pragma GCC unroll 32
      for (int j = 0; j < kStreamK; ++j) b[j] = _mm512_maskz_loadu_ps(m, wk + j * N + n);
#pragma GCC unroll 32
      for (int r = 0; r < R; ++r) {
        __m512 acc = _mm512_maskz_loadu_ps(m, out + r * N + n);
#pragma GCC unroll 32
        for (int j = 0; j < kStreamK; ++j) acc = _mm512_fmadd_ps(a[r][j], b[j], acc);
        _mm512_mask_storeu_ps(out + r * N + n, m, acc);
      }
    }
  }
  for (; k < k1; ++k)
    for (int64_t n = c0; n < c1; n += 16) {
      const __mmask16 m = Mask(c1 - n);
      const __m512 b = _mm512_maskz_loadu_ps(m, w + k * N + n);
      for (int r = 0; r < R; ++r) {
        float* o = out + r * N + n;
        _mm512_mask_storeu_ps(o, m, _mm512_fmadd_ps(_mm512_set1_ps(x[r * K + k]), b, _mm512_maskz_loadu_ps(m, o)));
      }
    }
}

// chunk c of a few rows' product: half c % 2 of k, column group c / 2
void StreamChunk(const void* context, int64_t c) {
  const Product& p = *static_cast<const Product*>(context);
  const int h = c % 2;
  const int64_t c0 = (c / 2) * p.columns, c1 = std::min(p.N, c0 + p.columns);
  const int64_t ks = h ? p.half : 0, ke = h ? p.K : p.half;
  float* out = h ? p.z : p.y;
  switch (p.R) {
    case 1: return Stream<1>(p.x, p.w, out, p.K, p.N, ks, ke, c0, c1);
    case 2: return Stream<2>(p.x, p.w, out, p.K, p.N, ks, ke, c0, c1);
    case 3: return Stream<3>(p.x, p.w, out, p.K, p.N, ks, ke, c0, c1);
    case 4: return Stream<4>(p.x, p.w, out, p.K, p.N, ks, ke, c0, c1);
    case 5: return Stream<5>(p.x, p.w, out, p.K, p.N, ks, ke, c0, c1);
    case 6: return Stream<6>(p.x, p.w, out, p.K, p.N, ks, ke, c0, c1);
    case 7: return Stream<7>(p.x, p.w, out, p.K, p.N, ks, ke, c0, c1);
    default: return Stream<8>(p.x, p.w, out, p.K, p.N, ks, ke, c0, c1);
  }
}

// chunk c of a product of more rows: its columns' tiles
void TileChunk(const void* context, int64_t c) {
  const Product& p = *static_cast<const Product*>(context);
  const int64_t n_end = std::min(p.N, (c + 1) * p.columns);
  for (int64_t n0 = c * p.columns; n0 < n_end; n0 += 16 * kTileNB) TileColumns<kTileNB>(p, n0);
}

ffi::Error Matmul(ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> w, ffi::ResultBuffer<ffi::F32> y,
                  ffi::ResultBuffer<ffi::F32> z) {
  const auto xd = x.dimensions(), wd = w.dimensions();
  if (xd.size() != 2 || wd.size() != 2 || xd[1] != wd[0])
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "jaxlab_f32_matmul: expected x [R, K] and w [K, N]");
  const int64_t R = xd[0], K = xd[1], N = wd[1];
  float* const out = y->typed_data();
  float* const part = z->typed_data();
  if (R <= kStreamRows) {  // each thread reads one half of w (or of a column group) front to back
    const int64_t groups = std::max(1, jaxlab::Threads() / 2);
    const int64_t columns = ((N + groups - 1) / groups + 15) / 16 * 16;
    Product p{x.typed_data(), w.typed_data(), out, part, R, K, N, Half(K), columns};
    jaxlab::Job job(StreamChunk, &p, 2 * ((N + columns - 1) / columns));
    jaxlab::RunSized(&job, R * K * N, kAloneProducts);
    AddInto(out, part, R * N);
    return ffi::Error::Success();
  }
  const int64_t tile = 16 * kTileNB, tiles = (N + tile - 1) / tile;
  const int64_t per = std::max<int64_t>(1, tiles / (4 * jaxlab::Threads()));
  Product p{x.typed_data(), w.typed_data(), out, part, R, K, N, Half(K), per * tile};
  jaxlab::Job job(TileChunk, &p, (tiles + per - 1) / per);
  jaxlab::RunSized(&job, R * K * N, kAloneProducts);
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxlabF32Matmul, Matmul,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // x [R, K]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // w [K, N]
                                  .Ret<ffi::Buffer<ffi::F32>>()  // y [R, N]
                                  .Ret<ffi::Buffer<ffi::F32>>()  // z [R, N]: the second half's chains (scratch)
);
