//! The window geometry of a 2-D convolution, the one operand of the im2col/col2im kernels. The
//! trait takes it, so it lives on the backend side; `functional/conv.rs` computes it.

/// How the windows of a 2-D convolution sweep an image, the one description both
/// [`KernelBackend::im2col`] and [`KernelBackend::col2im`] take: an image of `channels` planes of
/// `input = [h, w]` pixels is read through `output = [oh, ow]` windows of `kernel = [kh, kw]` taps
/// spaced `dilation` apart; window `(p, q)` starts at pixel `(p·stride₀ − padding₀,
/// q·stride₁ − padding₁)`, and taps outside the image read 0. Padding after the image (PyTorch's
/// asymmetric `"same"` padding) needs no field: it only lengthens `output`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConvGeometry {
    pub channels: usize,
    pub input: [usize; 2],
    pub kernel: [usize; 2],
    pub stride: [usize; 2],
    pub padding: [usize; 2],
    pub dilation: [usize; 2],
    pub output: [usize; 2],
}

impl ConvGeometry {
    /// Taps of one window (`kh·kw`).
    pub fn taps(&self) -> usize {
        self.kernel[0] * self.kernel[1]
    }
    /// Windows per image and channel (`oh·ow`), the column count of the unfolded matrix.
    pub fn windows(&self) -> usize {
        self.output[0] * self.output[1]
    }
    /// Rows of the unfolded matrix of one image (`channels·kh·kw`).
    pub fn rows(&self) -> usize {
        self.channels * self.taps()
    }
    /// Pixels of one image plane (`h·w`).
    pub fn pixels(&self) -> usize {
        self.input[0] * self.input[1]
    }
}
