// Random numbers on the device from ferrite's generator (ChaCha8, the word stream of rand_chacha's
// ChaCha8Rng): element i of a draw reads the stream's words starting at `start + words * i`, as
// the CPU backend does (backend/host_side.rs), so a seed gives the same values on cuda:N as on cpu
// — dropout masks included — whatever the launch. The host passes the 256-bit key (what
// `seed_from_u64` expands the seed into) and the generator's word position as (block, word):
// position = block * 16 + word.
//
// Conversions are the CPU's: a 64-bit draw is the low word then the high word; uniform = (v >> 11)
// * 2^-53 in double; Bernoulli(p) = uniform < p; normal = Box-Muller in double over two draws
// (1 - u1, u2); the double result is rounded to float once.

struct ChachaKey {
    unsigned int k[8];
};

__device__ __forceinline__ unsigned int chacha_rotl(unsigned int v, int c) { return (v << c) | (v >> (32 - c)); }

#define FERRITE_QR(a, b, c, d)                                                                      \
    a += b; d ^= a; d = chacha_rotl(d, 16);                                                         \
    c += d; b ^= c; b = chacha_rotl(b, 12);                                                         \
    a += b; d ^= a; d = chacha_rotl(d, 8);                                                          \
    c += d; b ^= c; b = chacha_rotl(b, 7);

// One 16-word ChaCha8 block: the constants, the key, a 64-bit block counter, a zero stream id.
__device__ __forceinline__ void chacha8_block(const ChachaKey& key, unsigned long long counter, unsigned int out[16]) {
    unsigned int s[16] = {0x61707865u, 0x3320646eu, 0x79622d32u, 0x6b206574u,
                          key.k[0], key.k[1], key.k[2], key.k[3], key.k[4], key.k[5], key.k[6], key.k[7],
                          (unsigned int)counter, (unsigned int)(counter >> 32), 0u, 0u};
    unsigned int x[16];
    for (int i = 0; i < 16; ++i) x[i] = s[i];
    for (int round = 0; round < 4; ++round) {
        FERRITE_QR(x[0], x[4], x[8], x[12])
        FERRITE_QR(x[1], x[5], x[9], x[13])
        FERRITE_QR(x[2], x[6], x[10], x[14])
        FERRITE_QR(x[3], x[7], x[11], x[15])
        FERRITE_QR(x[0], x[5], x[10], x[15])
        FERRITE_QR(x[1], x[6], x[11], x[12])
        FERRITE_QR(x[2], x[7], x[8], x[13])
        FERRITE_QR(x[3], x[4], x[9], x[14])
    }
    for (int i = 0; i < 16; ++i) out[i] = x[i] + s[i];
}

// `count` (at most 4) consecutive words of the stream, from `offset` words past (block0, word0).
__device__ __forceinline__ void chacha_words(const ChachaKey& key, unsigned long long block0, unsigned int word0,
                                             unsigned long long offset, int count, unsigned int* out) {
    unsigned long long w = word0 + offset;
    unsigned long long block = block0 + (w >> 4);
    int idx = (int)(w & 15);
    unsigned int buf[16];
    chacha8_block(key, block, buf);
    for (int j = 0; j < count; ++j) {
        if (idx == 16) {
            chacha8_block(key, ++block, buf);
            idx = 0;
        }
        out[j] = buf[idx++];
    }
}

// Uniform [0, 1) from 53 bits of a 64-bit draw (low word first).
__device__ __forceinline__ double chacha_uniform(unsigned int lo, unsigned int hi) {
    unsigned long long v = ((unsigned long long)hi << 32) | lo;
    return (double)(v >> 11) * (1.0 / 9007199254740992.0);
}

// out[i] = low + (high - low) * uniform (2 words per element).
extern "C" __global__ void uniform_f32(long long n, ChachaKey key, unsigned long long block0, unsigned int word0,
                                       double low, double high, float* __restrict__ out) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        unsigned int w[2];
        chacha_words(key, block0, word0, 2ull * i, 2, w);
        out[i] = (float)(low + (high - low) * chacha_uniform(w[0], w[1]));
    }
}

// out[i] = 1 with probability p, else 0 (2 words per element).
extern "C" __global__ void bernoulli_f32(long long n, ChachaKey key, unsigned long long block0, unsigned int word0,
                                         double p, float* __restrict__ out) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        unsigned int w[2];
        chacha_words(key, block0, word0, 2ull * i, 2, w);
        out[i] = chacha_uniform(w[0], w[1]) < p ? 1.0f : 0.0f;
    }
}

// Dropout in one pass: mask[i] = scale where uniform < keep, else 0 (the CPU's Bernoulli(keep)
// mask times scale = 1 / keep rounded to float), out[i] = x[i] * mask[i] (so -0 where x < 0, as
// on the CPU). The mask is kept for backward.
extern "C" __global__ void dropout_f32(long long n, ChachaKey key, unsigned long long block0, unsigned int word0,
                                       double keep, float scale, const float* __restrict__ x,
                                       float* __restrict__ out, float* __restrict__ mask) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        unsigned int w[2];
        chacha_words(key, block0, word0, 2ull * i, 2, w);
        float m = chacha_uniform(w[0], w[1]) < keep ? scale : 0.0f;
        mask[i] = m;
        out[i] = x[i] * m;
    }
}

// Normal(mean, std) by Box-Muller over two 64-bit draws (4 words per element).
extern "C" __global__ void normal_f32(long long n, ChachaKey key, unsigned long long block0, unsigned int word0,
                                      double mean, double std, float* __restrict__ out) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        unsigned int w[4];
        chacha_words(key, block0, word0, 4ull * i, 4, w);
        double u1 = 1.0 - chacha_uniform(w[0], w[1]);
        double u2 = chacha_uniform(w[2], w[3]);
        out[i] = (float)(mean + std * (sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2)));
    }
}
