//! The CUDA C sources of the kernels, one file per family under `kernels/`, embedded in the
//! binary so that a machine with only the `ferrite` executable can compile them for its GPU.

/// One kernel source file.
#[derive(Debug, Clone, Copy)]
pub struct KernelSource {
    /// The file name under `kernels/`, e.g. `elementwise.cu`.
    pub name: &'static str,
    pub code: &'static str,
    /// The `extern "C"` kernels it defines (what the backend looks up after loading it).
    pub kernels: &'static [&'static str],
}

/// A source with `kernels/block_reduce.cuh` (the shared block-wide sum and max) in front, and a
/// `#line` so compile errors name the source's own lines.
macro_rules! with_block_reduce {
    ($file:literal) => {
        concat!(
            include_str!("../kernels/block_reduce.cuh"),
            "\n#line 1 \"",
            $file,
            "\"\n",
            include_str!(concat!("../kernels/", $file))
        )
    };
}

/// Every kernel source of the CUDA backend.
pub const KERNEL_SOURCES: &[KernelSource] = &[
    KernelSource {
        name: "elementwise.cu",
        code: include_str!("../kernels/elementwise.cu"),
        kernels: &[
            "add_f32",
            "sub_f32",
            "mul_f32",
            "div_f32",
            "maximum_f32",
            "minimum_f32",
            "pow_f32",
            "neg_f32",
            "exp_f32",
            "log_f32",
            "sqrt_f32",
            "rsqrt_f32",
            "relu_f32",
            "sigmoid_f32",
            "tanh_f32",
            "silu_f32",
            "gelu_f32",
            "gelu_tanh_f32",
            "abs_f32",
            "sin_f32",
            "cos_f32",
            "log1p_f32",
            "reciprocal_f32",
            "square_f32",
            "pow_scalar_f32",
            "leaky_relu_f32",
            "and_bool",
            "or_bool",
            "axpby_f32",
            "fill_f32",
            "eq_f32",
            "ne_f32",
            "lt_f32",
            "le_f32",
            "gt_f32",
            "ge_f32",
            "eq_i64",
            "ne_i64",
            "lt_i64",
            "le_i64",
            "gt_i64",
            "ge_i64",
            "where_f32",
            "where_b8",
            "where_b16",
            "where_b32",
            "where_b64",
            "clamp_f32",
        ],
    },
    KernelSource {
        name: "reduce.cu",
        code: with_block_reduce!("reduce.cu"),
        kernels: &[
            "sum_rows_f32",
            "max_rows_f32",
            "softmax_rows_f32",
            "softmax_rows_backward_f32",
            "cross_entropy_rows_f32",
            "cross_entropy_rows_backward_f32",
            "sum_middle_f32",
            "log_softmax_rows_f32",
            "log_softmax_rows_backward_f32",
            "max_rows_with_index_f32",
        ],
    },
    KernelSource {
        name: "activation_backward.cu",
        code: include_str!("../kernels/activation_backward.cu"),
        kernels: &[
            "relu_backward_f32",
            "sigmoid_backward_f32",
            "tanh_backward_f32",
            "silu_backward_f32",
            "gelu_backward_f32",
            "gelu_tanh_backward_f32",
            "unary_grad_f32",
        ],
    },
    KernelSource {
        name: "copy.cu",
        code: include_str!("../kernels/copy.cu"),
        kernels: &["strided_copy_f32", "copy_layout_b8", "copy_layout_b16", "copy_layout_b32", "copy_layout_b64"],
    },
    KernelSource {
        name: "batch_norm.cu",
        code: with_block_reduce!("batch_norm.cu"),
        kernels: &[
            "batch_norm_stats_f32",
            "batch_norm_eval_stats_f32",
            "batch_norm_apply_f32",
            "batch_norm_backward_reduce_f32",
            "batch_norm_backward_input_f32",
            "channel_affine_f32",
            "group_norm_backward_affine_f32",
        ],
    },
    KernelSource { name: "conv.cu", code: include_str!("../kernels/conv.cu"), kernels: &["im2col_f32", "col2im_f32"] },
    KernelSource {
        name: "conv_implicit.cu",
        code: include_str!("../kernels/conv_implicit.cu"),
        kernels: &["conv_forward_f32", "conv_input_grad_f32", "conv_weight_grad_f32", "conv_sum_splits_f32"],
    },
    KernelSource {
        name: "recurrent.cu",
        code: include_str!("../kernels/recurrent.cu"),
        kernels: &[
            "lstm_cell_f32",
            "gru_cell_f32",
            "rnn_cell_f32",
            "lstm_cell_backward_f32",
            "gru_cell_backward_f32",
            "rnn_cell_backward_f32",
        ],
    },
    KernelSource {
        name: "loss.cu",
        code: include_str!("../kernels/loss.cu"),
        kernels: &["pointwise_loss_f32", "pointwise_loss_backward_f32"],
    },
    KernelSource {
        name: "index.cu",
        code: include_str!("../kernels/index.cu"),
        kernels: &[
            "gather_f32",
            "scatter_add_f32",
            "index_select_f32",
            "index_add_f32",
            "one_hot_i64",
            "check_indices_i64",
            "flag_index_value_i64",
        ],
    },
    KernelSource {
        name: "pool.cu",
        code: include_str!("../kernels/pool.cu"),
        kernels: &[
            "max_pool2d_f32",
            "max_pool2d_backward_f32",
            "avg_pool2d_f32",
            "avg_pool2d_backward_f32",
            "adaptive_avg_pool2d_f32",
            "adaptive_avg_pool2d_backward_f32",
        ],
    },
    KernelSource {
        name: "cast.cu",
        code: include_str!("../kernels/cast.cu"),
        kernels: &[
            "f32_to_bf16",
            "bf16_to_f32",
            "f32_to_f16",
            "f16_to_f32",
            "i64_to_f32",
            "i32_to_f32",
            "u8_to_f32",
            "bool_to_f32",
            "f32_to_i64",
            "f32_to_i32",
            "f32_to_u8",
            "f32_to_bool",
            "i64_to_i32",
            "i32_to_i64",
            "bool_to_i64",
            "i64_to_bool",
            "u8_to_i64",
            "bool_to_u8",
        ],
    },
    KernelSource {
        name: "random.cu",
        code: include_str!("../kernels/random.cu"),
        kernels: &["uniform_f32", "bernoulli_f32", "dropout_f32", "normal_f32"],
    },
    KernelSource {
        name: "layer_norm.cu",
        code: with_block_reduce!("layer_norm.cu"),
        kernels: &[
            "layer_norm_f32",
            "layer_norm_backward_input_f32",
            "layer_norm_backward_affine_f32",
            "rms_norm_f32",
            "rms_norm_backward_input_f32",
            "rms_norm_backward_weight_f32",
        ],
    },
    KernelSource {
        name: "optimizer.cu",
        code: with_block_reduce!("optimizer.cu"),
        kernels: &[
            "sgd_step_f32",
            "adam_step_f32",
            "rmsprop_step_f32",
            "adagrad_step_f32",
            "unscale_and_check_f32",
            "norm_partial_f32",
            "clamp_abs_f32",
            "scale_f32",
        ],
    },
    KernelSource {
        name: "embedding.cu",
        code: include_str!("../kernels/embedding.cu"),
        kernels: &["embedding_f32", "embedding_backward_f32"],
    },
];
