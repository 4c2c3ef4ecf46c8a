// Conversions between f32 and the 16-bit float formats (bf16, f16) with half.cuh's rounding
// (round to nearest, ties to even; NaN, infinities and signed zeros kept), and between f32 and the
// integer and bool dtypes. One thread per element, grid-stride loop.

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
