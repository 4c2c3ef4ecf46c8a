// Convolution's data movement (f32): im2col unfolds an image [C, H, W] into columns
// [C·KH·KW, OH·OW] so a convolution is one matrix product per image and group (cuBLAS), and col2im
// folds columns back, summing the entries that refer to the same input element — the input
// gradient of a convolution and the forward of a transposed one. Stride, zero padding and dilation
// as PyTorch's. col2im gathers: one thread per image element adds its column entries in a fixed
// order (deterministic, no atomics).

struct ConvGeometry {
    long long channels, h, w, out_h, out_w;
    int kh, kw, sh, sw, ph, pw, dh, dw;
};

extern "C" __global__ void im2col_f32(ConvGeometry g, const float* __restrict__ image, float* __restrict__ cols) {
    long long plane = g.out_h * g.out_w;
    long long total = g.channels * g.kh * g.kw * plane;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        long long p = i % plane;
        long long row = i / plane;  // (c, ki, kj)
        int kj = (int)(row % g.kw);
        int ki = (int)((row / g.kw) % g.kh);
        long long c = row / ((long long)g.kw * g.kh);
        long long oh = p / g.out_w, ow = p % g.out_w;
        long long ih = oh * g.sh - g.ph + (long long)ki * g.dh;
        long long iw = ow * g.sw - g.pw + (long long)kj * g.dw;
        cols[i] = (ih >= 0 && ih < g.h && iw >= 0 && iw < g.w) ? image[(c * g.h + ih) * g.w + iw] : 0.0f;
    }
}

extern "C" __global__ void col2im_f32(ConvGeometry g, const float* __restrict__ cols, float* __restrict__ image) {
    long long plane = g.out_h * g.out_w;
    long long total = g.channels * g.h * g.w;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        long long iw = i % g.w;
        long long ih = (i / g.w) % g.h;
        long long c = i / (g.w * g.h);
        float acc = 0.0f;
        for (int ki = 0; ki < g.kh; ++ki) {
            long long th = ih + g.ph - (long long)ki * g.dh;
            if (th < 0 || th % g.sh != 0) continue;
            long long oh = th / g.sh;
            if (oh >= g.out_h) continue;
            for (int kj = 0; kj < g.kw; ++kj) {
                long long tw = iw + g.pw - (long long)kj * g.dw;
                if (tw < 0 || tw % g.sw != 0) continue;
                long long ow = tw / g.sw;
                if (ow >= g.out_w) continue;
                acc += cols[((c * g.kh + ki) * g.kw + kj) * plane + oh * g.out_w + ow];
            }
        }
        image[i] = acc;
    }
}
