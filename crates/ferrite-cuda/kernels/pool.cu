// 2-D pooling (f32) over [N·C, H, W] planes, PyTorch's window arithmetic: max pooling with padding,
// dilation and the flat index of each maximum in its input plane (a NaN is the maximum, as in
// PyTorch); average pooling with padding, count_include_pad and divisor_override; adaptive average
// pooling (window [floor(o·H/OH), ceil((o+1)·H/OH))). The output size (ceil_mode included) is the
// host's to compute. Forward: one thread per output element. Backward: one thread per plane walks
// its outputs in order and adds into the zeroed input gradient, so overlapping windows accumulate
// in a fixed order (deterministic, no atomics).

struct Pool2d {
    long long planes, h, w, out_h, out_w;
    int kh, kw, sh, sw, ph, pw, dh, dw;
    int count_include_pad;
    int divisor_override;  // 0: none
};

extern "C" __global__ void max_pool2d_f32(Pool2d g, const float* __restrict__ x, float* __restrict__ y,
                                          long long* __restrict__ argmax) {
    long long total = g.planes * g.out_h * g.out_w;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        long long ow = i % g.out_w;
        long long oh = (i / g.out_w) % g.out_h;
        long long plane = i / (g.out_w * g.out_h);
        const float* xp = x + plane * g.h * g.w;
        long long hstart = oh * g.sh - g.ph, wstart = ow * g.sw - g.pw;
        long long hend = hstart + (long long)(g.kh - 1) * g.dh + 1, wend = wstart + (long long)(g.kw - 1) * g.dw + 1;
        while (hstart < 0) hstart += g.dh;
        while (wstart < 0) wstart += g.dw;
        if (hend > g.h) hend = g.h;
        if (wend > g.w) wend = g.w;
        long long best_at = hstart * g.w + wstart;
        float best = -__int_as_float(0x7f800000);
        for (long long ih = hstart; ih < hend; ih += g.dh) {
            for (long long iw = wstart; iw < wend; iw += g.dw) {
                float v = xp[ih * g.w + iw];
                if (v > best || v != v) {
                    best = v;
                    best_at = ih * g.w + iw;
                }
                if (best != best) break;
            }
            if (best != best) break;
        }
        y[i] = best;
        argmax[i] = best_at;
    }
}

extern "C" __global__ void max_pool2d_backward_f32(Pool2d g, const long long* __restrict__ argmax,
                                                   const float* __restrict__ dy, float* __restrict__ dx) {
    long long outs = g.out_h * g.out_w;
    for (long long plane = blockIdx.x * (long long)blockDim.x + threadIdx.x; plane < g.planes;
         plane += (long long)gridDim.x * blockDim.x) {
        float* dxp = dx + plane * g.h * g.w;
        for (long long o = 0; o < outs; ++o) dxp[argmax[plane * outs + o]] += dy[plane * outs + o];
    }
}

// The window of output (oh, ow) clipped to the input, and its divisor.
__device__ __forceinline__ void avg_window(const Pool2d& g, long long oh, long long ow, long long* h0, long long* h1,
                                           long long* w0, long long* w1, float* divisor) {
    long long hstart = oh * g.sh - g.ph, wstart = ow * g.sw - g.pw;
    long long hend = hstart + g.kh, wend = wstart + g.kw;
    if (hend > g.h + g.ph) hend = g.h + g.ph;
    if (wend > g.w + g.pw) wend = g.w + g.pw;
    long long padded = (hend - hstart) * (wend - wstart);
    if (hstart < 0) hstart = 0;
    if (wstart < 0) wstart = 0;
    if (hend > g.h) hend = g.h;
    if (wend > g.w) wend = g.w;
    *h0 = hstart;
    *h1 = hend;
    *w0 = wstart;
    *w1 = wend;
    if (g.divisor_override) *divisor = (float)g.divisor_override;
    else if (g.count_include_pad) *divisor = (float)padded;
    else *divisor = (float)((hend - hstart) * (wend - wstart));
}

extern "C" __global__ void avg_pool2d_f32(Pool2d g, const float* __restrict__ x, float* __restrict__ y) {
    long long total = g.planes * g.out_h * g.out_w;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        long long ow = i % g.out_w;
        long long oh = (i / g.out_w) % g.out_h;
        const float* xp = x + (i / (g.out_w * g.out_h)) * g.h * g.w;
        long long h0, h1, w0, w1;
        float divisor;
        avg_window(g, oh, ow, &h0, &h1, &w0, &w1, &divisor);
        float s = 0.0f;
        for (long long ih = h0; ih < h1; ++ih)
            for (long long iw = w0; iw < w1; ++iw) s += xp[ih * g.w + iw];
        y[i] = s / divisor;
    }
}

extern "C" __global__ void avg_pool2d_backward_f32(Pool2d g, const float* __restrict__ dy, float* __restrict__ dx) {
    for (long long plane = blockIdx.x * (long long)blockDim.x + threadIdx.x; plane < g.planes;
         plane += (long long)gridDim.x * blockDim.x) {
        float* dxp = dx + plane * g.h * g.w;
        const float* dyp = dy + plane * g.out_h * g.out_w;
        for (long long oh = 0; oh < g.out_h; ++oh) {
            for (long long ow = 0; ow < g.out_w; ++ow) {
                long long h0, h1, w0, w1;
                float divisor;
                avg_window(g, oh, ow, &h0, &h1, &w0, &w1, &divisor);
                float share = dyp[oh * g.out_w + ow] / divisor;
                for (long long ih = h0; ih < h1; ++ih)
                    for (long long iw = w0; iw < w1; ++iw) dxp[ih * g.w + iw] += share;
            }
        }
    }
}

extern "C" __global__ void adaptive_avg_pool2d_f32(Pool2d g, const float* __restrict__ x, float* __restrict__ y) {
    long long total = g.planes * g.out_h * g.out_w;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        long long ow = i % g.out_w;
        long long oh = (i / g.out_w) % g.out_h;
        const float* xp = x + (i / (g.out_w * g.out_h)) * g.h * g.w;
        long long h0 = oh * g.h / g.out_h, h1 = ((oh + 1) * g.h + g.out_h - 1) / g.out_h;
        long long w0 = ow * g.w / g.out_w, w1 = ((ow + 1) * g.w + g.out_w - 1) / g.out_w;
        float s = 0.0f;
        for (long long ih = h0; ih < h1; ++ih)
            for (long long iw = w0; iw < w1; ++iw) s += xp[ih * g.w + iw];
        y[i] = s / (float)((h1 - h0) * (w1 - w0));
    }
}

extern "C" __global__ void adaptive_avg_pool2d_backward_f32(Pool2d g, const float* __restrict__ dy,
                                                            float* __restrict__ dx) {
    for (long long plane = blockIdx.x * (long long)blockDim.x + threadIdx.x; plane < g.planes;
         plane += (long long)gridDim.x * blockDim.x) {
        float* dxp = dx + plane * g.h * g.w;
        const float* dyp = dy + plane * g.out_h * g.out_w;
        for (long long oh = 0; oh < g.out_h; ++oh) {
            long long h0 = oh * g.h / g.out_h, h1 = ((oh + 1) * g.h + g.out_h - 1) / g.out_h;
            for (long long ow = 0; ow < g.out_w; ++ow) {
                long long w0 = ow * g.w / g.out_w, w1 = ((ow + 1) * g.w + g.out_w - 1) / g.out_w;
                float share = dyp[oh * g.out_w + ow] / (float)((h1 - h0) * (w1 - w0));
                for (long long ih = h0; ih < h1; ++ih)
                    for (long long iw = w0; iw < w1; ++iw) dxp[ih * g.w + iw] += share;
            }
        }
    }
}
