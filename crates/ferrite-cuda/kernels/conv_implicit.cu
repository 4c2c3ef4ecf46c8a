// Convolution as implicit GEMM (f32): the three products every convolution pass is made of, with
// the unfolded image (im2col's matrix) never stored. Each product is a GEMM per (sample, group)
// or per group whose operand that would be the unfolded matrix is gathered from the image (or
// from dy) tile by tile straight into shared memory, with zeros for taps in the padding:
//
//   conv_forward_f32      y[n, g]  = A[g] · U(img[n])[g]                 (M × windows, depth K)
//   conv_input_grad_f32   img[n, g] = fold(A[g]ᵀ · y[n, g]), per pixel:  (C/g × pixels, depth M·taps)
//                         every (output channel, tap) whose window reads the pixel, gathered from y
//   conv_weight_grad_f32  Σₙ y[n, g] · U(img[n])[g]ᵀ                     (M × K, depth samples·windows)
//
// with A the weight [groups, M, K = C/g·kh·kw] and U's row c·kh·kw + i·kw + j holding tap (i, j) of
// channel c for every window (conv.cu's im2col). Why: the unfolded matrix is kh·kw times the input
// for a stride-1 convolution; gathering it per tile costs index arithmetic, not memory.
//
// Tiling (the classic SGEMM shape): a 64 × 64 output tile per block of 256 threads, each thread
// 4 × 4 outputs (rows ty + 16·i, columns tx + 16·j, so shared-memory reads and global stores are
// consecutive across a warp), the depth walked in slices of 16 staged in shared memory (rows padded
// to 65 floats against bank conflicts), the next slice's global loads issued before the current
// slice's products. Accumulation in f32 in a fixed order: results do not depend on the launch.
// Blocks walk the tiles grid-stride, so any grid size is correct (the emulator uses 2 blocks).
// __launch_bounds__(256, 2): two blocks per SM fit (≤ 128 registers); with the bound on threads
// alone ptxas picked 64 registers and spilled.
//
// The weight gradient's depth is samples·windows, often far larger than its M × K output; it is
// split into `splits` consecutive ranges (chosen from the shapes by the host) whose partial sums
// go to [splits, groups, M, K] and are added in split order by conv_sum_splits_f32: deterministic,
// no atomics. With splits = 1 the kernel writes the result directly.
//
// Every per-image extent (channels·h·w, M·K, M·windows, ...) fits in an int (the host checks and
// falls back to unfold + GEMM otherwise); offsets across samples are computed in 64 bits.

struct ConvGemm {
    int channels, h, w, out_h, out_w;  // the image (all groups' channels) and the window grid
    int kh, kw, sh, sw, ph, pw, dh, dw;
    int groups;
    int m;       // rows of A per group: the channels of y per group
    int images;  // samples
    int splits;  // depth ranges of the weight gradient (1 elsewhere)
};

#define CI_TILE 64
#define CI_DEPTH 16
#define CI_THREADS 256
#define CI_LD (CI_TILE + 1)

// acc += as[kk][rows] ⊗ bs[kk][cols] over one staged slice.
__device__ __forceinline__ void ci_slice(const float (*as)[CI_LD], const float (*bs)[CI_LD], float (*acc)[4], int tx,
                                         int ty) {
#pragma unroll
    for (int kk = 0; kk < CI_DEPTH; ++kk) {
        float a[4], b[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) a[i] = as[kk][ty + 16 * i];
#pragma unroll
        for (int j = 0; j < 4; ++j) b[j] = bs[kk][tx + 16 * j];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
#pragma unroll
            for (int j = 0; j < 4; ++j) acc[i][j] += a[i] * b[j];
        }
    }
}

// Writes the 4 × 4 outputs of thread (tx, ty) of the tile at (r0, c0) into out [rows, cols].
__device__ __forceinline__ void ci_store(float* __restrict__ out, const float (*acc)[4], int r0, int c0, int rows,
                                         int cols, int tx, int ty) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        int r = r0 + ty + 16 * i;
        if (r >= rows) continue;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            int c = c0 + tx + 16 * j;
            if (c < cols) out[(long long)r * cols + c] = acc[i][j];
        }
    }
}

// ------------------------------------------------------------------------------------ forward

// Element (row k, window) of U(img) for a thread whose window starts at (ih0, iw0); 0 outside.
__device__ __forceinline__ float ci_unfolded(const ConvGemm& g, const float* __restrict__ im, int taps, int k,
                                             int ih0, int iw0) {
    int c = k / taps, tap = k - c * taps;
    int i = tap / g.kw, j = tap - i * g.kw;
    int ih = ih0 + i * g.dh, iw = iw0 + j * g.dw;
    return (ih >= 0 && ih < g.h && iw >= 0 && iw < g.w) ? im[((long long)c * g.h + ih) * g.w + iw] : 0.0f;
}

extern "C" __global__ void __launch_bounds__(CI_THREADS, 2)
    conv_forward_f32(ConvGemm g, const float* __restrict__ a, const float* __restrict__ img, float* __restrict__ y) {
    __shared__ float as[CI_DEPTH][CI_LD];
    __shared__ float bs[CI_DEPTH][CI_LD];
    const int t = threadIdx.x, tx = t % 16, ty = t / 16;
    const int cg = g.channels / g.groups, taps = g.kh * g.kw, depth = cg * taps;
    const int rows = g.m, cols = g.out_h * g.out_w;
    const long long pixels = (long long)g.h * g.w;
    const long long tiles_r = (rows + CI_TILE - 1) / CI_TILE, tiles_c = (cols + CI_TILE - 1) / CI_TILE;
    const long long tiles = (long long)g.images * g.groups * tiles_r * tiles_c;
    for (long long tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const int r0 = (int)((tile / tiles_c) % tiles_r) * CI_TILE, c0 = (int)(tile % tiles_c) * CI_TILE;
        const long long ng = tile / (tiles_c * tiles_r);  // sample · groups + group
        const int grp = (int)(ng % g.groups);
        const long long n = ng / g.groups;
        const float* ag = a + (long long)grp * rows * depth;
        const float* im = img + (n * g.channels + (long long)grp * cg) * pixels;
        // This thread loads A at (r0 + t/16 + 16e, k0 + t%16) and U at (k0 + t/64 + 4e, c0 + t%64).
        const int ar = r0 + t / 16, ak = t % 16, bk = t / 64, bc = c0 + t % 64;
        const bool bc_ok = bc < cols;
        const int ih0 = bc_ok ? (bc / g.out_w) * g.sh - g.ph : 0;
        const int iw0 = bc_ok ? (bc % g.out_w) * g.sw - g.pw : 0;
        float ra[4], rb[4];
        float acc[4][4] = {};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            int r = ar + 16 * e, k = ak, kb = bk + 4 * e;
            ra[e] = (r < rows && k < depth) ? ag[(long long)r * depth + k] : 0.0f;
            rb[e] = (bc_ok && kb < depth) ? ci_unfolded(g, im, taps, kb, ih0, iw0) : 0.0f;
        }
        for (int k0 = 0; k0 < depth; k0 += CI_DEPTH) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                as[ak][t / 16 + 16 * e] = ra[e];
                bs[bk + 4 * e][t % 64] = rb[e];
            }
            __syncthreads();
            const int k1 = k0 + CI_DEPTH;
            if (k1 < depth) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    int r = ar + 16 * e, k = k1 + ak, kb = k1 + bk + 4 * e;
                    ra[e] = (r < rows && k < depth) ? ag[(long long)r * depth + k] : 0.0f;
                    rb[e] = (bc_ok && kb < depth) ? ci_unfolded(g, im, taps, kb, ih0, iw0) : 0.0f;
                }
            }
            ci_slice(as, bs, acc, tx, ty);
            __syncthreads();
        }
        ci_store(y + ng * rows * (long long)cols, acc, r0, c0, rows, cols, tx, ty);
    }
}

// ------------------------------------------------------------------------------- input gradient

// Element (r = o·taps + tap, pixel (ih, iw)) of the gathered y: y[o, window] when tap (i, j) of
// that window reads the pixel, else 0.
__device__ __forceinline__ float ci_gathered_y(const ConvGemm& g, const float* __restrict__ yg, int taps, int r,
                                               int ih, int iw) {
    int o = r / taps, tap = r - o * taps;
    int i = tap / g.kw, j = tap - i * g.kw;
    int th = ih + g.ph - i * g.dh, tw = iw + g.pw - j * g.dw;
    if (th < 0 || tw < 0 || th % g.sh != 0 || tw % g.sw != 0) return 0.0f;
    int oh = th / g.sh, ow = tw / g.sw;
    if (oh >= g.out_h || ow >= g.out_w) return 0.0f;
    return yg[((long long)o * g.out_h + oh) * g.out_w + ow];
}

// The input gradient's loads of depth slice k0: A' (channel ar + 16e, r = k0 + ak) = A[o, c·taps + tap]
// and the gathered y at (k0 + bk + 4e, pixel (ih, iw)).
__device__ __forceinline__ void ci_input_grad_load(const ConvGemm& g, const float* __restrict__ ag,
                                                   const float* __restrict__ yg, int taps, int kdim, int rows,
                                                   int depth, int k0, int ar, int ak, int bk, bool bc_ok, int ih,
                                                   int iw, float* ra, float* rb) {
    const int k = k0 + ak;
    const int o = k / taps, tap = k - o * taps;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        int r = ar + 16 * e, kb = k0 + bk + 4 * e;
        ra[e] = (r < rows && k < depth) ? ag[(long long)o * kdim + (long long)r * taps + tap] : 0.0f;
        rb[e] = (bc_ok && kb < depth) ? ci_gathered_y(g, yg, taps, kb, ih, iw) : 0.0f;
    }
}

extern "C" __global__ void __launch_bounds__(CI_THREADS, 2)
    conv_input_grad_f32(ConvGemm g, const float* __restrict__ a, const float* __restrict__ y, float* __restrict__ img) {
    __shared__ float as[CI_DEPTH][CI_LD];
    __shared__ float bs[CI_DEPTH][CI_LD];
    const int t = threadIdx.x, tx = t % 16, ty = t / 16;
    const int cg = g.channels / g.groups, taps = g.kh * g.kw, kdim = cg * taps;
    const int rows = cg, cols = g.h * g.w, depth = g.m * taps;
    const long long windows = (long long)g.out_h * g.out_w;
    const long long tiles_r = (rows + CI_TILE - 1) / CI_TILE, tiles_c = (cols + CI_TILE - 1) / CI_TILE;
    const long long tiles = (long long)g.images * g.groups * tiles_r * tiles_c;
    for (long long tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const int r0 = (int)((tile / tiles_c) % tiles_r) * CI_TILE, c0 = (int)(tile % tiles_c) * CI_TILE;
        const long long ng = tile / (tiles_c * tiles_r);
        const int grp = (int)(ng % g.groups);
        const long long n = ng / g.groups;
        const float* ag = a + (long long)grp * g.m * kdim;
        const float* yg = y + ng * g.m * windows;
        const int ar = r0 + t / 16, ak = t % 16, bk = t / 64, bc = c0 + t % 64;
        const bool bc_ok = bc < cols;
        const int ih = bc_ok ? bc / g.w : 0, iw = bc_ok ? bc % g.w : 0;
        float ra[4], rb[4];
        float acc[4][4] = {};
        ci_input_grad_load(g, ag, yg, taps, kdim, rows, depth, 0, ar, ak, bk, bc_ok, ih, iw, ra, rb);
        for (int k0 = 0; k0 < depth; k0 += CI_DEPTH) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                as[ak][t / 16 + 16 * e] = ra[e];
                bs[bk + 4 * e][t % 64] = rb[e];
            }
            __syncthreads();
            if (k0 + CI_DEPTH < depth)
                ci_input_grad_load(g, ag, yg, taps, kdim, rows, depth, k0 + CI_DEPTH, ar, ak, bk, bc_ok, ih, iw, ra, rb);
            ci_slice(as, bs, acc, tx, ty);
            __syncthreads();
        }
        ci_store(img + (n * g.channels + (long long)grp * cg) * cols, acc, r0, c0, rows, cols, tx, ty);
    }
}

// ------------------------------------------------------------------------------ weight gradient

// The columns (channel, tap) of U one thread loads, the same for every depth slice of a tile.
struct CiColumns {
    int c[4], di[4], dj[4];
    bool ok[4];
};

// The weight gradient's loads at depth d = sample · windows + window (< d1): y at rows ar + 16e and
// U at the thread's columns.
__device__ __forceinline__ void ci_weight_grad_load(const ConvGemm& g, const float* __restrict__ y,
                                                    const float* __restrict__ img, const CiColumns& cols, int grp,
                                                    int rows, int windows, long long pixels, long long d, long long d1,
                                                    int ar, float* ra, float* rb) {
    const bool d_ok = d < d1;
    const long long n = d_ok ? d / windows : 0;
    const int p = d_ok ? (int)(d - n * windows) : 0;
    const int ih0 = (p / g.out_w) * g.sh - g.ph, iw0 = (p % g.out_w) * g.sw - g.pw;
    const float* yn = y + (n * g.groups + grp) * (long long)rows * windows + p;
    const float* imn = img + n * g.channels * pixels;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        int r = ar + 16 * e;
        ra[e] = (d_ok && r < rows) ? yn[(long long)r * windows] : 0.0f;
        int ih = ih0 + cols.di[e], iw = iw0 + cols.dj[e];
        bool in = d_ok && cols.ok[e] && ih >= 0 && ih < g.h && iw >= 0 && iw < g.w;
        rb[e] = in ? imn[((long long)cols.c[e] * g.h + ih) * g.w + iw] : 0.0f;
    }
}

extern "C" __global__ void __launch_bounds__(CI_THREADS, 2) conv_weight_grad_f32(ConvGemm g, const float* __restrict__ y,
                                                                             const float* __restrict__ img,
                                                                             float* __restrict__ out) {
    __shared__ float as[CI_DEPTH][CI_LD];
    __shared__ float bs[CI_DEPTH][CI_LD];
    const int t = threadIdx.x, tx = t % 16, ty = t / 16;
    const int cg = g.channels / g.groups, taps = g.kh * g.kw;
    const int rows = g.m, cols = cg * taps, windows = g.out_h * g.out_w;
    const long long pixels = (long long)g.h * g.w;
    const long long depth = (long long)g.images * windows;
    const long long per_split = ((depth + g.splits - 1) / g.splits + CI_DEPTH - 1) / CI_DEPTH * CI_DEPTH;
    const long long tiles_r = (rows + CI_TILE - 1) / CI_TILE, tiles_c = (cols + CI_TILE - 1) / CI_TILE;
    const long long tiles = (long long)g.splits * g.groups * tiles_r * tiles_c;
    for (long long tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const int r0 = (int)((tile / tiles_c) % tiles_r) * CI_TILE, c0 = (int)(tile % tiles_c) * CI_TILE;
        const long long sg = tile / (tiles_c * tiles_r);  // split · groups + group
        const int grp = (int)(sg % g.groups);
        const long long split = sg / g.groups;
        const long long d0 = split * per_split;
        const long long d1 = d0 + per_split < depth ? d0 + per_split : depth;
        // This thread loads y at (r0 + t/16 + 16e, d + t%16) and U at (d + t%16, c0 + t/16 + 16e):
        // one depth index for both, so one (sample, window) decode per slice.
        const int ar = r0 + t / 16, ad = t % 16;
        CiColumns cc;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            int k = c0 + t / 16 + 16 * e;
            cc.ok[e] = k < cols;
            int c = cc.ok[e] ? k / taps : 0, tap = cc.ok[e] ? k - c * taps : 0;
            cc.c[e] = grp * cg + c;
            cc.di[e] = (tap / g.kw) * g.dh;
            cc.dj[e] = (tap % g.kw) * g.dw;
        }
        float ra[4], rb[4];
        float acc[4][4] = {};
        ci_weight_grad_load(g, y, img, cc, grp, rows, windows, pixels, d0 + ad, d1, ar, ra, rb);
        for (long long k0 = d0; k0 < d1; k0 += CI_DEPTH) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                as[ad][t / 16 + 16 * e] = ra[e];
                bs[ad][t / 16 + 16 * e] = rb[e];
            }
            __syncthreads();
            if (k0 + CI_DEPTH < d1)
                ci_weight_grad_load(g, y, img, cc, grp, rows, windows, pixels, k0 + CI_DEPTH + ad, d1, ar, ra, rb);
            ci_slice(as, bs, acc, tx, ty);
            __syncthreads();
        }
        ci_store(out + sg * rows * (long long)cols, acc, r0, c0, rows, cols, tx, ty);
    }
}

// out[i] = Σ_s partial[s·n + i] in split order (the weight gradient's split depth ranges).
extern "C" __global__ void conv_sum_splits_f32(long long n, int splits, const float* __restrict__ partial,
                                               float* __restrict__ out) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        float acc = 0.0f;
        for (int s = 0; s < splits; ++s) acc += partial[(long long)s * n + i];
        out[i] = acc;
    }
}
