// The 16-bit float formats (bf16, f16) as the kernels read and write them, put in front of every
// source that stores them (kernel_sources.rs): conversions on their bit patterns, so the same code
// runs everywhere (NVRTC needs no cuda_fp16.h), rounding f32 to nearest, ties to even, as
// PyTorch's `.to(torch.bfloat16)` / `.half()` and the `half` crate round; NaN stays NaN (quiet),
// infinities and signed zeros are kept, f16 overflow goes to infinity and its subnormals are exact.
// The element types below let one kernel body serve f32, f16 and bf16: load widens to f32
// (exactly), the op computes in f32 in registers, and store rounds once — what the CPU backend
// does for half tensors, with no f32 copy of any operand.

__device__ __forceinline__ unsigned int cast_float_bits(float f) {
    union { float f; unsigned int u; } v;
    v.f = f;
    return v.u;
}

__device__ __forceinline__ float cast_bits_float(unsigned int u) {
    union { float f; unsigned int u; } v;
    v.u = u;
    return v.f;
}

__device__ __forceinline__ unsigned short f32_to_bf16_bits(float f) {
    unsigned int u = cast_float_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x0040u);  // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
}

__device__ __forceinline__ unsigned short f32_to_f16_bits(float f) {
    unsigned int u = cast_float_bits(f);
    unsigned int sign = (u >> 16) & 0x8000u;
    unsigned int a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (unsigned short)(sign | 0x7e00u | ((a >> 13) & 0x03ffu));  // NaN
    if (a >= 0x477ff000u) return (unsigned short)(sign | 0x7c00u);  // rounds to inf (or is inf)
    if (a < 0x38800000u) {
        // A subnormal f16 (or zero): the value in units of 2^-24, rounded to nearest even.
        if (a < 0x33000000u) return (unsigned short)sign;  // below half the smallest subnormal
        unsigned int mant = (a & 0x007fffffu) | 0x00800000u;
        int shift = 126 - (int)(a >> 23);  // 14 + (113 - exponent)
        unsigned int half = mant >> shift;
        unsigned int rem = mant & ((1u << shift) - 1u);
        unsigned int mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1u))) ++half;
        return (unsigned short)(sign | half);
    }
    // Normal: rebias the exponent (127 -> 15) and round the 23-bit mantissa to 10 bits.
    unsigned int r = a - 0x38000000u;
    r += 0x0fffu + ((r >> 13) & 1u);
    return (unsigned short)(sign | (r >> 13));
}

__device__ __forceinline__ float f16_bits_to_f32(unsigned short h) {
    unsigned int sign = ((unsigned int)h & 0x8000u) << 16;
    unsigned int e = (h >> 10) & 0x1fu;
    unsigned int m = h & 0x03ffu;
    if (e == 0x1fu) return cast_bits_float(sign | 0x7f800000u | (m << 13));
    if (e == 0) {
        if (m == 0) return cast_bits_float(sign);
        // Subnormal: normalise.
        int shift = 0;
        while (!(m & 0x0400u)) {
            m <<= 1;
            ++shift;
        }
        m &= 0x03ffu;
        return cast_bits_float(sign | ((unsigned int)(113 - shift) << 23) | (m << 13));
    }
    return cast_bits_float(sign | ((e + 112u) << 23) | (m << 13));
}

// One element type: its storage `T`, `load` to f32 and `store` from f32.
struct ElemF32 {
    typedef float T;
    static __device__ __forceinline__ float load(float v) { return v; }
    static __device__ __forceinline__ float store(float v) { return v; }
};

struct ElemF16 {
    typedef unsigned short T;
    static __device__ __forceinline__ float load(unsigned short v) { return f16_bits_to_f32(v); }
    static __device__ __forceinline__ unsigned short store(float v) { return f32_to_f16_bits(v); }
};

struct ElemBF16 {
    typedef unsigned short T;
    static __device__ __forceinline__ float load(unsigned short v) { return cast_bits_float((unsigned int)v << 16); }
    static __device__ __forceinline__ unsigned short store(float v) { return f32_to_bf16_bits(v); }
};
