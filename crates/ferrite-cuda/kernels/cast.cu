// Conversions between f32 and the 16-bit float formats (bf16, f16), on their bit patterns so the
// same code runs everywhere (NVRTC needs no cuda_fp16.h): round to nearest, ties to even, as
// PyTorch's `.to(torch.bfloat16)` / `.half()` and the `half` crate round; NaN stays NaN (quiet),
// infinities and signed zeros are kept, f16 overflow goes to infinity and its subnormals are exact.
// One thread per element, grid-stride loop.

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

extern "C" __global__ void f32_to_bf16(long long n, const float* __restrict__ in, unsigned short* __restrict__ out) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        out[i] = f32_to_bf16_bits(in[i]);
    }
}

extern "C" __global__ void bf16_to_f32(long long n, const unsigned short* __restrict__ in, float* __restrict__ out) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        out[i] = cast_bits_float((unsigned int)in[i] << 16);
    }
}

extern "C" __global__ void f32_to_f16(long long n, const float* __restrict__ in, unsigned short* __restrict__ out) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        out[i] = f32_to_f16_bits(in[i]);
    }
}

extern "C" __global__ void f16_to_f32(long long n, const unsigned short* __restrict__ in, float* __restrict__ out) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        out[i] = f16_bits_to_f32(in[i]);
    }
}

// Conversions between f32 and the integer and bool dtypes (contiguous buffers), with the CPU
// backend's rules: integers and bools to f32 round to nearest; f32 to an integer truncates toward
// zero and saturates at the type's range, NaN giving 0 (Rust's `as`); anything to bool is
// `x != 0`; bool bytes read any nonzero value as true.
#define FERRITE_CONVERT(name, S, D, expr)                                                        \
    extern "C" __global__ void name(long long n, const S* __restrict__ in, D* __restrict__ out) { \
        for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;              \
             i += (long long)gridDim.x * blockDim.x) {                                            \
            S x = in[i];                                                                          \
            out[i] = (expr);                                                                      \
        }                                                                                         \
    }

FERRITE_CONVERT(i64_to_f32, long long, float, (float)x)
FERRITE_CONVERT(i32_to_f32, int, float, (float)x)
FERRITE_CONVERT(u8_to_f32, unsigned char, float, (float)x)
FERRITE_CONVERT(bool_to_f32, unsigned char, float, x != 0 ? 1.0f : 0.0f)
FERRITE_CONVERT(f32_to_i64, float, long long,
                x != x ? 0LL
                       : (x >= 9223372036854775807.0f ? 9223372036854775807LL
                                                       : (x <= -9223372036854775808.0f ? (-9223372036854775807LL - 1LL)
                                                                                        : (long long)x)))
FERRITE_CONVERT(f32_to_i32, float, int,
                x != x ? 0 : (x >= 2147483647.0f ? 2147483647 : (x <= -2147483648.0f ? (-2147483647 - 1) : (int)x)))
FERRITE_CONVERT(f32_to_u8, float, unsigned char,
                x != x ? 0 : (x >= 255.0f ? 255 : (x <= 0.0f ? 0 : (unsigned char)x)))
FERRITE_CONVERT(f32_to_bool, float, unsigned char, x != 0.0f ? 1 : 0)
FERRITE_CONVERT(i64_to_i32, long long, int,
                x > 2147483647LL ? 2147483647 : (x < -2147483648LL ? (-2147483647 - 1) : (int)x))
FERRITE_CONVERT(i32_to_i64, int, long long, (long long)x)
FERRITE_CONVERT(bool_to_i64, unsigned char, long long, x != 0 ? 1LL : 0LL)
FERRITE_CONVERT(i64_to_bool, long long, unsigned char, x != 0 ? 1 : 0)
FERRITE_CONVERT(u8_to_i64, unsigned char, long long, (long long)x)
FERRITE_CONVERT(bool_to_u8, unsigned char, unsigned char, x != 0 ? 1 : 0)
