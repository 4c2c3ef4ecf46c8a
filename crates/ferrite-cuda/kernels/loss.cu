// The elementwise losses of ferrite's PointwiseLoss (f32) and their gradients, one thread per
// element, with the formulas of PyTorch's kernels as the CPU backend writes them
// (backend/cpu/loss.rs): binary cross entropy (on probabilities and on logits), smooth L1, Huber
// and KL divergence. Every operand is a contiguous buffer of the output's n elements (the host
// materialises broadcast weights); absent weight / pos_weight are null (1). The reduction is the
// ordinary sum/mean afterwards.
//
// binary_cross_entropy's inputs and targets must lie in [0, 1]: the CPU stops with an error, a
// kernel cannot, so it records the offence in `bad` (bad[0] = 1 and bad[1] = the value for an
// input, bad[2] = 1 and bad[3] = the value for a target; any offending value) for the host to
// report as the CPU's error at the next synchronisation (`bad` is null for the other losses).

#define FERRITE_LOSS_BCE 0
#define FERRITE_LOSS_BCE_LOGITS 1
#define FERRITE_LOSS_SMOOTH_L1 2
#define FERRITE_LOSS_HUBER 3
#define FERRITE_LOSS_KL_DIV 4
#define FERRITE_LOSS_KL_DIV_LOG_TARGET 5

// max(ln v, -100) as PyTorch's std::max(std::log(v), -100) (NaN stays NaN).
__device__ __forceinline__ float loss_clog(float v) { return v < -100.0f ? -100.0f : v; }

// PyTorch's log_sigmoid: min(x, 0) − ln(1 + e^−|x|).
__device__ __forceinline__ float loss_log_sigmoid(float x) { return (x < 0.0f ? x : 0.0f) - log1pf(expf(-fabsf(x))); }

// xlogy(t, t): 0 where t is 0, t ln t elsewhere.
__device__ __forceinline__ float loss_xlogx(float t) { return t == 0.0f ? 0.0f : t * logf(t); }

// out = loss(input, target) · weight. `k` is smooth L1's beta or Huber's delta.
extern "C" __global__ void pointwise_loss_f32(long long n, int kind, float k, const float* __restrict__ input,
                                              const float* __restrict__ target, const float* __restrict__ weight,
                                              const float* __restrict__ pos_weight, float* __restrict__ out,
                                              float* __restrict__ bad) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        float x = input[i], t = target[i];
        float w = weight ? weight[i] : 1.0f;
        float l;
        switch (kind) {
        case FERRITE_LOSS_BCE:
            if (!(x >= 0.0f && x <= 1.0f)) {
                bad[0] = 1.0f;
                bad[1] = x;
            }
            if (!(t >= 0.0f && t <= 1.0f)) {
                bad[2] = 1.0f;
                bad[3] = t;
            }
            l = ((t - 1.0f) * loss_clog(log1pf(-x)) - t * loss_clog(logf(x))) * w;
            break;
        case FERRITE_LOSS_BCE_LOGITS: {
            float ls = loss_log_sigmoid(x);
            if (pos_weight) ls = ls * ((pos_weight[i] - 1.0f) * t + 1.0f);
            l = ((1.0f - t) * x - ls) * w;
            break;
        }
        case FERRITE_LOSS_SMOOTH_L1: {
            float z = fabsf(x - t);
            l = k == 0.0f ? z : (z < k ? 0.5f * z * z / k : z - 0.5f * k);
            break;
        }
        case FERRITE_LOSS_HUBER: {
            float z = fabsf(x - t);
            l = z < k ? 0.5f * z * z : k * (z - 0.5f * k);
            break;
        }
        case FERRITE_LOSS_KL_DIV: l = loss_xlogx(t) - t * x; break;
        default: l = expf(t) * (t - x); break;
        }
        out[i] = l;
    }
}

// out = grad · ∂loss/∂input (wrt_target == 0) or ∂loss/∂target (wrt_target != 0).
extern "C" __global__ void pointwise_loss_backward_f32(long long n, int kind, int wrt_target, float k,
                                                       const float* __restrict__ grad, const float* __restrict__ input,
                                                       const float* __restrict__ target,
                                                       const float* __restrict__ weight,
                                                       const float* __restrict__ pos_weight, float* __restrict__ out) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        float g = grad[i], x = input[i], t = target[i];
        float w = weight ? weight[i] : 1.0f;
        float d;
        switch (kind) {
        case FERRITE_LOSS_BCE: {
            float v = wrt_target ? g * (loss_clog(log1pf(-x)) - loss_clog(logf(x)))
                                 : g * (x - t) / fmaxf((1.0f - x) * x, 1e-12f);
            d = v * w;
            break;
        }
        case FERRITE_LOSS_BCE_LOGITS: {
            float pw = pos_weight ? pos_weight[i] : 1.0f;
            // ∂logsigmoid(x)/∂x = sigmoid(−x).
            float v = wrt_target ? -x - (pw - 1.0f) * loss_log_sigmoid(x)
                                 : (1.0f - t) - ((pw - 1.0f) * t + 1.0f) * (1.0f / (1.0f + expf(x)));
            d = g * v * w;
            break;
        }
        case FERRITE_LOSS_SMOOTH_L1: {
            float z = x - t, v;
            if (k == 0.0f) v = z > 0.0f ? g : (z < 0.0f ? -g : 0.0f * g);
            else if (z <= -k) v = -g;
            else if (z >= k) v = g;
            else v = z * g / k;
            d = wrt_target ? -v : v;
            break;
        }
        case FERRITE_LOSS_HUBER: {
            float z = x - t, v;
            if (z <= -k) v = -g * k;
            else if (z >= k) v = g * k;
            else v = z * g;
            d = wrt_target ? -v : v;
            break;
        }
        case FERRITE_LOSS_KL_DIV:
            // xlogy(t, t)'s two partial derivatives (ln t where t != 0, and t / t: NaN at 0), minus x.
            d = wrt_target ? g * ((t == 0.0f ? 0.0f : logf(t)) + t / t - x) : -(g * t);
            break;
        default: d = wrt_target ? g * expf(t) * (t - x + 1.0f) : -(g * expf(t)); break;
        }
        out[i] = d;
    }
}
