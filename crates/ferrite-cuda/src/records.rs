//! The `struct`s the convolution kernels take by value, declared once on the Rust side: the
//! `cuda:N` backend (ferrite-tensor) fills them for its launches and this crate's kernel tests
//! (`tests/kernels_on_host.rs`) fill them for theirs, so both pass the very layout the `.cu`
//! files declare. Why here: the layout belongs to the kernel sources, which live in this crate;
//! the backend sits above it and may use it, the tests may not reach up into the backend.
//!
//! Each is `repr(C)` and `Pod` (no padding), passed as [`crate::KernelArg::record`]; the fields
//! are those of the kernel's struct, in its order and with its widths.

/// `ConvGeometry` of conv.cu (im2col/col2im of one `[channels, h, w]` image).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct ConvGeometry {
    pub channels: i64,
    pub h: i64,
    pub w: i64,
    pub out_h: i64,
    pub out_w: i64,
    pub kh: i32,
    pub kw: i32,
    pub sh: i32,
    pub sw: i32,
    pub ph: i32,
    pub pw: i32,
    pub dh: i32,
    pub dw: i32,
}

/// `ConvGemm` of conv_implicit.cu: the image and window geometry of an implicit-GEMM product,
/// the groups, `m` (rows of the weight matrix per group), the images of one launch and the
/// weight gradient's depth splits. 32-bit, as the kernels index one image with `int`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct ConvGemm {
    pub channels: i32,
    pub h: i32,
    pub w: i32,
    pub out_h: i32,
    pub out_w: i32,
    pub kh: i32,
    pub kw: i32,
    pub sh: i32,
    pub sw: i32,
    pub ph: i32,
    pub pw: i32,
    pub dh: i32,
    pub dw: i32,
    pub groups: i32,
    pub m: i32,
    pub images: i32,
    pub splits: i32,
}
