// Attention through a page table for a few queries a row (decode steps, a speculative step's verify), for XLA:CPU
// through the XLA FFI (jaxlab/engine/kernels/cpu.py builds, loads and registers it; benchmarks/NOTES.md 27 says why it
// exists). Two handlers, one per page format of engine/paged.py:
//
//   q     [B, T, KVH, G, Hd]  queries: row b's query t, kv head h, its G query heads
//   pos   [B, T] int32         each query's position: it sees its row's keys at positions 0..pos (-1: padding,
//                              whose output is zeros)
//   JaxlabPagedAttention:      float32 pages, k [KVH, N, Hd, ps] (each page's keys transposed: key layout "ds"),
//                              v [KVH, N, ps, Hd]
//   JaxlabPagedAttentionInt8:  int8 pages, k and v [KVH, N, ps, Hd] (key layout "sd") and one float32 scale per
//                              stored vector, k_scale and v_scale [KVH, N, ps]
//   table [B, P] int32         row b's position p lives in page table[b, p / ps] at offset p % ps
//   out   [B, T, KVH, G, Hd]   softmax(q . k / sqrt(Hd)) . v over the visible keys
//
// A third handler reads the contiguous cache of engine/kvcache.py the same way, its slots taken 16 at a time as if
// they were pages:
//   JaxlabContiguousAttention: float32, k [B*KVH, Hd, S] (key layout "ds"), v [B*KVH, S, Hd], slot_pos [B, S] int32
//                              (each slot's position, -1 empty or padding), index [] int32 (slots written: the rest
//                              are not read); a query at position p sees the slots holding positions 0..p, and reads
//                              them only up to the last such slot (SlotsSeen: a prefill's queries, any number).
//
// XLA:CPU computes this by gathering every row's pages into a contiguous copy first, and writes that copy at under
// half the copy bandwidth (NOTES 22); this reads each page where it lies, once for the G query heads that share it.
// float32 pages: the scores of a page's ps keys are ps lanes of AVX-512 (q[d] broadcast times the page's row d of
// keys). int8 pages: each key's bytes converted to float and multiplied with q lane by lane, 16 keys' partial sums
// added across lanes at once (Sum16), times the key's scale; the values' bytes converted and weighted by the softmax
// weight times their scale. So int8 pages give the attention of their dequantized vectors within float32 rounding,
// where XLA's int8 path first rounds q and the weights to ~15 bits (kvcache.int8_bmm). Then one exact softmax over
// the row's scores (e^x by a polynomial, relative error < 3e-7) and the values weighted and summed in Hd / 16 vector
// accumulators. Each query's result is computed alone, in the same order whatever the batch and whichever thread
// runs it: a row's output is the same bits alone or among others (batch invariance).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "threads.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int64_t kMaxHeadDim = 128;  // 8 accumulators of 16 lanes (cpu.py checks it before calling)

// e^x for x <= 0 (a score minus the row's maximum): x = n ln2 + r with |r| <= ln2 / 2, e^r by its degree-6 Taylor
// polynomial, 2^n by scalef (which gives 0 below 2^-149, as expf does).
inline __m512 Exp(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-104.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);  // ln 2 in two parts: r exact
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187045e-06f), r);
  __m512 p = _mm512_set1_ps(1.0f / 720);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

inline __mmask16 Lanes(int64_t n) { return n >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << n) - 1); }

struct Problem {
  const float* q;
  const int32_t* pos;
  const float* k;  // float32 pages, keys transposed: [KVH, N, Hd, ps]
  const float* v;
  const int32_t* table;
  float* out;
  const int8_t* k8 = nullptr;  // int8 pages (instead of k and v): [KVH, N, ps, Hd] each, one scale per vector
  const int8_t* v8 = nullptr;
  const float* k_scale = nullptr;  // [KVH, N, ps]
  const float* v_scale = nullptr;
  const int32_t* slot_pos = nullptr;  // the contiguous cache (instead of a table): [B, S], each slot's position
  int64_t B, T, KVH, G, Hd, N, ps, P;
  int64_t heads_per_chunk;  // G (a chunk is a (row, query, kv head)) or 1 (a query head alone: few rows)
  float scale;
  int64_t S = 0;  // the contiguous cache's slots (ps = 16 of them a "page")
};

// Where "page" j of row b, kv head h starts, in vectors of Hd (values, int8 keys, scales): the table's page in the
// pool, or the row's slots 16 j .. in the contiguous cache
inline int64_t PageAt(const Problem& pr, int64_t b, int64_t h, int64_t j) {
  if (pr.slot_pos != nullptr) return (b * pr.KVH + h) * pr.S + j * pr.ps;
  return (h * pr.N + pr.table[b * pr.P + j]) * pr.ps;
}

// Scores of GQ query heads q[g * Hd ...] against keys [0, n) of row b, kv head h -> s[g * stride + key]
// (the contiguous cache: a slot not holding one of positions 0 .. qpos gets -inf)
template <int GQ>
void Scores(const Problem& pr, const float* q, int64_t b, int64_t h, int64_t n, int64_t qpos, float* s,
            int64_t stride) {
  const int64_t ps = pr.ps, Hd = pr.Hd;
  const bool slots = pr.slot_pos != nullptr;
  const int64_t dstride = slots ? pr.S : ps;  // from a key's dimension d to d + 1
  for (int64_t j = 0; j * ps < n; ++j) {
    const float* page =
        slots ? pr.k + (b * pr.KVH + h) * Hd * pr.S + j * ps : pr.k + (h * pr.N + pr.table[b * pr.P + j]) * Hd * ps;
    const int64_t here = std::min(ps, n - j * ps);
    for (int64_t s0 = 0; s0 < here; s0 += 16) {
      const __mmask16 m = Lanes(here - s0);
      __m512 acc[GQ][2];
#pragma GCC unroll 4
      for (int g = 0; g < GQ; ++g) acc[g][0] = acc[g][1] = _mm512_setzero_ps();
      for (int64_t d = 0; d < Hd; ++d) {  // two accumulators a head (even and odd d): shorter dependency chains
        const __m512 key = _mm512_maskz_loadu_ps(m, page + d * dstride + s0);
#pragma GCC unroll 4
        for (int g = 0; g < GQ; ++g) acc[g][d & 1] = _mm512_fmadd_ps(_mm512_set1_ps(q[g * Hd + d]), key, acc[g][d & 1]);
      }
      __mmask16 visible = m;
      if (slots) {
        const __m512i p = _mm512_maskz_loadu_epi32(m, pr.slot_pos + b * pr.S + j * ps + s0);
        visible = _mm512_mask_cmpge_epi32_mask(m, p, _mm512_setzero_si512()) &
                  _mm512_cmple_epi32_mask(p, _mm512_set1_epi32(static_cast<int32_t>(qpos)));
      }
#pragma GCC unroll 4
      for (int g = 0; g < GQ; ++g)
        _mm512_mask_storeu_ps(s + g * stride + j * ps + s0, m,
                              _mm512_mask_mul_ps(_mm512_set1_ps(-INFINITY), visible,
                                                 _mm512_add_ps(acc[g][0], acc[g][1]), _mm512_set1_ps(pr.scale)));
    }
  }
}

// The softmax's unnormalised weights e^(s - max s) in place (a -inf score, a slot not seen, weighs 0); returns
// their sum (0 when no score is finite).
float Weights(float* s, int64_t n) {
  __m512 mx = _mm512_set1_ps(-INFINITY);
  for (int64_t i = 0; i < n; i += 16)
    mx = _mm512_mask_max_ps(mx, Lanes(n - i), mx, _mm512_maskz_loadu_ps(Lanes(n - i), s + i));
  const float top = _mm512_reduce_max_ps(mx);
  if (top == -INFINITY) {
    std::memset(s, 0, sizeof(float) * n);
    return 0.0f;
  }
  const __m512 m = _mm512_set1_ps(top), none = _mm512_set1_ps(-INFINITY);
  __m512 total = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 l = Lanes(n - i);
    const __m512 x = _mm512_maskz_loadu_ps(l, s + i);
    const __m512 e = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, none, _CMP_NEQ_OQ), Exp(_mm512_sub_ps(x, m)));
    _mm512_mask_storeu_ps(s + i, l, e);
    total = _mm512_mask_add_ps(total, l, total, e);
  }
  return _mm512_reduce_add_ps(total);
}

// out[i] = the sum of v[i]'s 16 lanes, for 16 vectors: three rounds of pairwise shuffles and adds (45 instructions
// instead of 16 horizontal reductions).
inline __m512 Sum16(const __m512 (&v)[16]) {
  __m512 a[8], b[4], c[2];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i)  // per 128-bit block: [x0+x2, y0+y2, x1+x3, y1+y3] of x = v[2i], y = v[2i+1]
    a[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {  // per block: the partial sums of v[4i], ..., v[4i + 3] in order
    const __m512d x = _mm512_castps_pd(a[2 * i]), y = _mm512_castps_pd(a[2 * i + 1]);
    b[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
  }
#pragma GCC unroll 2
  for (int i = 0; i < 2; ++i)  // blocks: b[2i]'s 0+2, 1+3, then b[2i+1]'s
    c[i] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0x44),
                         _mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0xEE));
  return _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], 0x88), _mm512_shuffle_f32x4(c[0], c[1], 0xDD));
}

inline __m512 Int8Lanes(const int8_t* p, __mmask16 m) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, p)));
}

// int8 pages: scores of GQ query heads against keys [0, n): (q . k8) * k_scale * scale, the keys' bytes converted
// to float as they are read (the same quantity XLA's int8 path computes, without its 15-bit split of q)
template <int GQ, int NC>
void Int8Scores(const Problem& pr, const float* q, int64_t b, int64_t h, int64_t n, float* s, int64_t stride) {
  const int64_t ps = pr.ps, Hd = pr.Hd;
  const __mmask16 tail = Lanes(Hd - (NC - 1) * 16);
  __m512 qv[GQ][NC];
#pragma GCC unroll 4
  for (int g = 0; g < GQ; ++g)
#pragma GCC unroll 8
    for (int c = 0; c < NC; ++c) qv[g][c] = _mm512_maskz_loadu_ps(c == NC - 1 ? tail : 0xFFFF, q + g * Hd + c * 16);
  for (int64_t j = 0; j * ps < n; ++j) {
    const int64_t at = PageAt(pr, b, h, j);
    const int64_t here = std::min(ps, n - j * ps);
    for (int64_t s0 = 0; s0 < here; s0 += 16) {
      const int64_t keys = std::min<int64_t>(16, here - s0);
      __m512 part[GQ][16];
      for (int64_t i = 0; i < 16; ++i) {
        if (i >= keys) {
#pragma GCC unroll 4
          for (int g = 0; g < GQ; ++g) part[g][i] = _mm512_setzero_ps();
          continue;
        }
        const int8_t* key = pr.k8 + (at + s0 + i) * Hd;
        __m512 kf[NC];
#pragma GCC unroll 8
        for (int c = 0; c < NC; ++c) kf[c] = Int8Lanes(key + c * 16, c == NC - 1 ? tail : 0xFFFF);
#pragma GCC unroll 4
        for (int g = 0; g < GQ; ++g) {
          __m512 acc = _mm512_mul_ps(qv[g][0], kf[0]);
#pragma GCC unroll 8
          for (int c = 1; c < NC; ++c) acc = _mm512_fmadd_ps(qv[g][c], kf[c], acc);
          part[g][i] = acc;
        }
      }
      const __mmask16 m = Lanes(keys);
      const __m512 ks = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, pr.k_scale + at + s0), _mm512_set1_ps(pr.scale));
#pragma GCC unroll 4
      for (int g = 0; g < GQ; ++g)
        _mm512_mask_storeu_ps(s + g * stride + j * ps + s0, m, _mm512_mul_ps(Sum16(part[g]), ks));
    }
  }
}

// o[g * Hd ...] = sum over keys [0, n) of w[g * stride + key] * v[key] / total[g], for GQ heads and Hd <= 16 NC;
// int8 pages: v[key] = its bytes times its scale (folded into the weight)
template <int GQ, int NC>
void Values(const Problem& pr, const float* w, int64_t stride, const float* total, int64_t b, int64_t h, int64_t n,
            float* o) {
  const int64_t ps = pr.ps, Hd = pr.Hd;
  const __mmask16 tail = Lanes(Hd - (NC - 1) * 16);
  __m512 acc[GQ][NC];
#pragma GCC unroll 4
  for (int g = 0; g < GQ; ++g)
#pragma GCC unroll 8
    for (int c = 0; c < NC; ++c) acc[g][c] = _mm512_setzero_ps();
  for (int64_t j = 0; j * ps < n; ++j) {
    const int64_t at = PageAt(pr, b, h, j);
    const int64_t here = std::min(ps, n - j * ps);
    for (int64_t s = 0; s < here; ++s) {
      __m512 row[NC];
      float scale = 1.0f;
      if (pr.v8 != nullptr) {
#pragma GCC unroll 8
        for (int c = 0; c < NC; ++c) row[c] = Int8Lanes(pr.v8 + (at + s) * Hd + c * 16, c == NC - 1 ? tail : 0xFFFF);
        scale = pr.v_scale[at + s];
      } else {
#pragma GCC unroll 8
        for (int c = 0; c < NC; ++c)
          row[c] = _mm512_maskz_loadu_ps(c == NC - 1 ? tail : 0xFFFF, pr.v + (at + s) * Hd + c * 16);
      }
#pragma GCC unroll 4
      for (int g = 0; g < GQ; ++g) {
        const __m512 p = _mm512_set1_ps(w[g * stride + j * ps + s] * scale);
#pragma GCC unroll 8
        for (int c = 0; c < NC; ++c) acc[g][c] = _mm512_fmadd_ps(p, row[c], acc[g][c]);
      }
    }
  }
#pragma GCC unroll 4
  for (int g = 0; g < GQ; ++g) {
    const __m512 inv = _mm512_set1_ps(total[g] > 0 ? 1.0f / total[g] : 0.0f);  // none seen: zeros
#pragma GCC unroll 8
    for (int c = 0; c < NC; ++c)
      _mm512_mask_storeu_ps(o + g * Hd + c * 16, c == NC - 1 ? tail : 0xFFFF, _mm512_mul_ps(acc[g][c], inv));
  }
}

template <int GQ, int NC>
void Heads(const Problem& pr, const float* q, int64_t b, int64_t h, int64_t n, int64_t qpos, float* o, float* s,
           int64_t stride) {
  if (pr.k8 != nullptr)
    Int8Scores<GQ, NC>(pr, q, b, h, n, s, stride);
  else
    Scores<GQ>(pr, q, b, h, n, qpos, s, stride);
  float total[GQ];
  for (int g = 0; g < GQ; ++g) total[g] = Weights(s + g * stride, n);
  Values<GQ, NC>(pr, s, stride, total, b, h, n, o);
}

// GQ query heads of kv head h against keys [0, n) of row b -> o
template <int GQ>
void Heads(const Problem& pr, const float* q, int64_t b, int64_t h, int64_t n, int64_t qpos, float* o,
           std::vector<float>& s) {
  const int64_t stride = (n + 15) / 16 * 16;
  s.resize(GQ * stride);
  switch ((pr.Hd + 15) / 16) {  // the head's 16-lane accumulators
    case 1: Heads<GQ, 1>(pr, q, b, h, n, qpos, o, s.data(), stride); break;
    case 2: Heads<GQ, 2>(pr, q, b, h, n, qpos, o, s.data(), stride); break;
    case 3: Heads<GQ, 3>(pr, q, b, h, n, qpos, o, s.data(), stride); break;
    case 4: Heads<GQ, 4>(pr, q, b, h, n, qpos, o, s.data(), stride); break;
    case 5: Heads<GQ, 5>(pr, q, b, h, n, qpos, o, s.data(), stride); break;
    case 6: Heads<GQ, 6>(pr, q, b, h, n, qpos, o, s.data(), stride); break;
    case 7: Heads<GQ, 7>(pr, q, b, h, n, qpos, o, s.data(), stride); break;
    default: Heads<GQ, 8>(pr, q, b, h, n, qpos, o, s.data(), stride); break;
  }
}

// The contiguous cache: 1 + the last of slots [0, n) whose position a query at qpos sees (0 .. qpos), 0 if none. The
// slots after it would weigh 0 (a prefill's query sees the slots before its own): not reading them gives the same
// bits and, over a prompt, about half the work.
inline int64_t SlotsSeen(const int32_t* slot_pos, int64_t n, int64_t qpos) {
  if (qpos < 0) return 0;
  const __m512i zero = _mm512_setzero_si512(), top = _mm512_set1_epi32(static_cast<int32_t>(qpos));
  for (int64_t i = (n - 1) / 16 * 16; i >= 0; i -= 16) {
    const __mmask16 m = Lanes(n - i);
    const __m512i p = _mm512_maskz_loadu_epi32(m, slot_pos + i);
    const __mmask16 seen = _mm512_mask_cmpge_epi32_mask(m, p, zero) & _mm512_cmple_epi32_mask(p, top);
    if (seen) return i + 32 - __builtin_clz(static_cast<uint32_t>(seen));
  }
  return 0;
}

// Chunk c: query heads [g0, g0 + heads_per_chunk) of kv head h, query t of row b.
void AttendChunk(const void* context, int64_t c) {
  const Problem& pr = *static_cast<const Problem*>(context);
  const int64_t groups = pr.G / pr.heads_per_chunk;
  const int64_t g0 = c % groups * pr.heads_per_chunk, bth = c / groups;
  const int64_t h = bth % pr.KVH, bt = bth / pr.KVH, b = bt / pr.T;
  const int64_t at = (bt * pr.KVH + h) * pr.G * pr.Hd + g0 * pr.Hd;
  const float* q = pr.q + at;
  float* o = pr.out + at;
  // keys to read: positions 0 .. pos through the table; the contiguous cache's written slots (masked by position)
  // up to the last one this query sees
  const int64_t qpos = pr.pos[bt];
  const int64_t n = pr.slot_pos != nullptr ? SlotsSeen(pr.slot_pos + b * pr.S, pr.N, qpos)
                                           : std::min<int64_t>(qpos + 1, pr.P * pr.ps);
  if (n <= 0) {
    std::memset(o, 0, sizeof(float) * pr.heads_per_chunk * pr.Hd);
    return;
  }
  thread_local std::vector<float> scores;
  int64_t g = 0;
  for (; g + 4 <= pr.heads_per_chunk; g += 4) Heads<4>(pr, q + g * pr.Hd, b, h, n, qpos, o + g * pr.Hd, scores);
  switch (pr.heads_per_chunk - g) {
    case 3: Heads<3>(pr, q + g * pr.Hd, b, h, n, qpos, o + g * pr.Hd, scores); break;
    case 2: Heads<2>(pr, q + g * pr.Hd, b, h, n, qpos, o + g * pr.Hd, scores); break;
    case 1: Heads<1>(pr, q + g * pr.Hd, b, h, n, qpos, o + g * pr.Hd, scores); break;
    default: break;
  }
}

// Below this many query-head x key products a call runs on the calling thread alone (a one-row decode step's
// ~20 microseconds: waking a helper would cost more than it saves).
constexpr int64_t kAloneProducts = 1 << 15;

void Run(Problem& pr) {
  // Whole kv heads a chunk (each page read once for its G query heads) unless that leaves a thread idle.
  pr.heads_per_chunk = pr.B * pr.T * pr.KVH < 4 * jaxlab::Threads() ? 1 : pr.G;
  jaxlab::Job job(AttendChunk, &pr, pr.B * pr.T * pr.KVH * (pr.G / pr.heads_per_chunk), /*linger=*/0);
  const int64_t keys = pr.slot_pos != nullptr ? pr.N : pr.P * pr.ps;
  jaxlab::RunSized(&job, pr.B * pr.T * pr.KVH * pr.G * keys, kAloneProducts);
}

ffi::Error PagedAttention(ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::S32> pos, ffi::Buffer<ffi::F32> k,
                          ffi::Buffer<ffi::F32> v, ffi::Buffer<ffi::S32> table, ffi::ResultBuffer<ffi::F32> out) {
  const auto qd = q.dimensions(), pd = pos.dimensions(), kd = k.dimensions(), vd = v.dimensions(),
             td = table.dimensions();
  if (qd.size() != 5 || pd.size() != 2 || kd.size() != 4 || vd.size() != 4 || td.size() != 2 || pd[0] != qd[0] ||
      pd[1] != qd[1] || td[0] != qd[0] || kd[0] != qd[2] || kd[2] != qd[4] || vd[0] != kd[0] || vd[1] != kd[1] ||
      vd[2] != kd[3] || vd[3] != qd[4] || qd[4] > kMaxHeadDim)
    return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                      "jaxlab_paged_attention: expected q [B, T, KVH, G, Hd <= 128], pos [B, T], k [KVH, N, Hd, ps], "
                      "v [KVH, N, ps, Hd], table [B, P]");
  Problem pr{q.typed_data(), pos.typed_data(), k.typed_data(), v.typed_data(), table.typed_data(), out->typed_data(),
             nullptr, nullptr, nullptr, nullptr, nullptr,
             qd[0], qd[1], qd[2], qd[3], qd[4], kd[1], kd[3], td[1], qd[3],
             1.0f / std::sqrt(static_cast<float>(qd[4]))};
  Run(pr);
  return ffi::Error::Success();
}

ffi::Error PagedAttentionInt8(ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::S32> pos, ffi::Buffer<ffi::S8> k,
                              ffi::Buffer<ffi::S8> v, ffi::Buffer<ffi::F32> k_scale, ffi::Buffer<ffi::F32> v_scale,
                              ffi::Buffer<ffi::S32> table, ffi::ResultBuffer<ffi::F32> out) {
  const auto qd = q.dimensions(), pd = pos.dimensions(), kd = k.dimensions(), vd = v.dimensions(),
             sd = k_scale.dimensions(), td = table.dimensions();
  bool ok = qd.size() == 5 && pd.size() == 2 && kd.size() == 4 && vd.size() == 4 && sd.size() == 3 &&
            td.size() == 2 && pd[0] == qd[0] && pd[1] == qd[1] && td[0] == qd[0] && kd[0] == qd[2] &&
            kd[3] == qd[4] && qd[4] <= kMaxHeadDim && v_scale.dimensions().size() == 3;
  for (int i = 0; ok && i < 4; ++i) ok = vd[i] == kd[i];
  for (int i = 0; ok && i < 3; ++i) ok = sd[i] == kd[i] && v_scale.dimensions()[i] == kd[i];
  if (!ok)
    return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                      "jaxlab_paged_attention_int8: expected q [B, T, KVH, G, Hd <= 128], pos [B, T], k and v "
                      "[KVH, N, ps, Hd] int8, their scales [KVH, N, ps], table [B, P]");
  Problem pr{q.typed_data(), pos.typed_data(), nullptr, nullptr, table.typed_data(), out->typed_data(),
             k.typed_data(), v.typed_data(), k_scale.typed_data(), v_scale.typed_data(), nullptr,
             qd[0], qd[1], qd[2], qd[3], qd[4], kd[1], kd[2], td[1], qd[3],
             1.0f / std::sqrt(static_cast<float>(qd[4]))};
  Run(pr);
  return ffi::Error::Success();
}

ffi::Error ContiguousAttention(ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::S32> pos, ffi::Buffer<ffi::F32> k,
                               ffi::Buffer<ffi::F32> v, ffi::Buffer<ffi::S32> slot_pos, ffi::Buffer<ffi::S32> index,
                               ffi::ResultBuffer<ffi::F32> out) {
  const auto qd = q.dimensions(), pd = pos.dimensions(), kd = k.dimensions(), vd = v.dimensions(),
             sd = slot_pos.dimensions();
  if (qd.size() != 5 || pd.size() != 2 || kd.size() != 3 || vd.size() != 3 || sd.size() != 2 ||
      index.element_count() != 1 || pd[0] != qd[0] || pd[1] != qd[1] || kd[0] != qd[0] * qd[2] || kd[1] != qd[4] ||
      vd[0] != kd[0] || vd[1] != kd[2] || vd[2] != qd[4] || sd[0] != qd[0] || sd[1] != kd[2] || qd[4] > kMaxHeadDim)
    return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                      "jaxlab_contiguous_attention: expected q [B, T, KVH, G, Hd <= 128], pos [B, T], "
                      "k [B*KVH, Hd, S], v [B*KVH, S, Hd], slot_pos [B, S], index []");
  const int64_t S = kd[2], written = std::clamp<int64_t>(index.typed_data()[0], 0, S);
  // N: the slots read (those written); P "pages" of 16 slots
  Problem pr{q.typed_data(), pos.typed_data(), k.typed_data(), v.typed_data(), nullptr, out->typed_data(),
             nullptr, nullptr, nullptr, nullptr, slot_pos.typed_data(),
             qd[0], qd[1], qd[2], qd[3], qd[4], written, 16, (S + 15) / 16, qd[3],
             1.0f / std::sqrt(static_cast<float>(qd[4])), S};
  Run(pr);
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxlabContiguousAttention, ContiguousAttention,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // q [B, T, KVH, G, Hd]
                                  .Arg<ffi::Buffer<ffi::S32>>()  // pos [B, T]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // k [B*KVH, Hd, S]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // v [B*KVH, S, Hd]
                                  .Arg<ffi::Buffer<ffi::S32>>()  // slot_pos [B, S]
                                  .Arg<ffi::Buffer<ffi::S32>>()  // index []
                                  .Ret<ffi::Buffer<ffi::F32>>()  // out [B, T, KVH, G, Hd]
);

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxlabPagedAttentionInt8, PagedAttentionInt8,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // q [B, T, KVH, G, Hd]
                                  .Arg<ffi::Buffer<ffi::S32>>()  // pos [B, T]
                                  .Arg<ffi::Buffer<ffi::S8>>()   // k [KVH, N, ps, Hd]
                                  .Arg<ffi::Buffer<ffi::S8>>()   // v [KVH, N, ps, Hd]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // k_scale [KVH, N, ps]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // v_scale [KVH, N, ps]
                                  .Arg<ffi::Buffer<ffi::S32>>()  // table [B, P]
                                  .Ret<ffi::Buffer<ffi::F32>>()  // out [B, T, KVH, G, Hd]
);

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxlabPagedAttention, PagedAttention,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // q [B, T, KVH, G, Hd]
                                  .Arg<ffi::Buffer<ffi::S32>>()  // pos [B, T]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // k [KVH, N, Hd, ps]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // v [KVH, N, ps, Hd]
                                  .Arg<ffi::Buffer<ffi::S32>>()  // table [B, P]
                                  .Ret<ffi::Buffer<ffi::F32>>()  // out [B, T, KVH, G, Hd]
);
