//! Data movement on `cuda:N`: copies between layouts and dtypes, fills (a kernel per element
//! width, for every dtype), and uploads of host values. Same-dtype copies move raw elements by
//! width (`copy_layout_b8..b64` of copy.cu), so every dtype — f64 included — can be stored, moved
//! and read back; conversions go through cast.cu's kernels on contiguous buffers (through f32
//! when no direct kernel exists).
use ferrite_cuda::KernelArg;

use super::launch::{COPY_MAX_DIMS, Ctx, addr, base, merge_dims, n_arg, strided};
use crate::error::{Result, TensorError};
use crate::layout::contiguous_strides;
use crate::{DType, Tensor};

/// The name a dtype has in cast.cu's kernel names.
fn cast_name(d: DType) -> Option<&'static str> {
    Some(match d {
        DType::F32 => "f32",
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        DType::I64 => "i64",
        DType::I32 => "i32",
        DType::U8 => "u8",
        DType::Bool => "bool",
        DType::F64 => return None,
    })
}

/// Whether cast.cu has `{from}_to_{to}`.
fn has_cast(from: DType, to: DType) -> Option<String> {
    let name = format!("{}_to_{}", cast_name(from)?, cast_name(to)?);
    let cast = ferrite_cuda::KERNEL_SOURCES.iter().find(|s| s.name == "cast.cu")?;
    cast.kernels.contains(&name.as_str()).then_some(name)
}

/// `dst = src` elementwise (see [`crate::backend::KernelBackend::copy`]).
pub(super) fn copy(cx: Ctx<'_>, dst: &Tensor, src: &Tensor) -> Result<()> {
    const OP: &str = "copy_";
    if dst.numel() == 0 {
        return Ok(());
    }
    let src_layout = src.layout().broadcast_to(dst.shape(), OP)?;
    if src.dtype() == dst.dtype() {
        return copy_layout(
            cx,
            OP,
            dst,
            dst.shape(),
            &dst.layout().strides,
            dst.storage_offset(),
            src,
            &src_layout.strides,
            src_layout.offset,
        );
    }
    // A conversion: the source as a contiguous buffer of dst's shape, converted into dst (or a
    // contiguous scratch written back into a strided dst).
    let shape = dst.shape();
    let plain = if src.is_contiguous() && src.shape() == shape {
        src.clone()
    } else {
        let t = cx.scratch(dst, shape, src.dtype())?;
        copy_layout(cx, OP, &t, shape, &contiguous_strides(shape), 0, src, &src_layout.strides, src_layout.offset)?;
        t
    };
    if dst.is_contiguous() {
        return convert(cx, dst, &plain);
    }
    let t = cx.scratch(dst, shape, dst.dtype())?;
    convert(cx, &t, &plain)?;
    copy_layout(cx, OP, dst, shape, &dst.layout().strides, dst.storage_offset(), &t, &contiguous_strides(shape), 0)
}

/// Raw element copy from `src` (its storage under `src_strides` from element `src_offset`) into
/// `dst` (its storage under `dst_strides` from `dst_offset`), both over `shape`, same dtype.
#[allow(clippy::too_many_arguments)]
fn copy_layout(
    cx: Ctx<'_>,
    op: &'static str,
    dst: &Tensor,
    shape: &[usize],
    dst_strides: &[usize],
    dst_offset: usize,
    src: &Tensor,
    src_strides: &[usize],
    src_offset: usize,
) -> Result<()> {
    let n: usize = shape.iter().product();
    if n == 0 {
        return Ok(());
    }
    let (s, st) = merge_dims(shape, &[dst_strides, src_strides]);
    if s.len() > COPY_MAX_DIMS {
        return Err(cx.too_many_dims(op, shape.len(), COPY_MAX_DIMS));
    }
    let kernel = match dst.dtype().size_in_bytes() {
        1 => "copy_layout_b8",
        2 => "copy_layout_b16",
        4 => "copy_layout_b32",
        _ => "copy_layout_b64",
    };
    let args = [
        n_arg(n),
        KernelArg::record(&strided(&s, &st[1], src_offset)),
        KernelArg::record(&strided(&s, &st[0], dst_offset)),
        KernelArg::Ptr(base(src, op)?),
        KernelArg::Ptr(base(dst, op)?),
    ];
    cx.launch_n(op, "copy.cu", kernel, n, &args)
}

/// The contiguous `src` converted into the contiguous `dst` (same shape, other dtype).
fn convert(cx: Ctx<'_>, dst: &Tensor, src: &Tensor) -> Result<()> {
    const OP: &str = "copy_";
    let n = dst.numel();
    let (from, to) = (src.dtype(), dst.dtype());
    if let Some(kernel) = has_cast(from, to) {
        return cx.launch_n(
            OP,
            "cast.cu",
            &kernel,
            n,
            &[n_arg(n), KernelArg::Ptr(addr(src, OP)?), KernelArg::Ptr(addr(dst, OP)?)],
        );
    }
    match (has_cast(from, DType::F32), has_cast(DType::F32, to)) {
        (Some(k1), Some(k2)) => {
            let mid = cx.scratch(dst, dst.shape(), DType::F32)?;
            cx.launch_n(
                OP,
                "cast.cu",
                &k1,
                n,
                &[n_arg(n), KernelArg::Ptr(addr(src, OP)?), KernelArg::Ptr(addr(&mid, OP)?)],
            )?;
            cx.launch_n(
                OP,
                "cast.cu",
                &k2,
                n,
                &[n_arg(n), KernelArg::Ptr(addr(&mid, OP)?), KernelArg::Ptr(addr(dst, OP)?)],
            )
        }
        _ => Err(TensorError::UnsupportedDType { op: OP, dtype: if from == DType::F64 { from } else { to } }),
    }
}

/// Upload `bytes` (exactly `dst.nbytes()`) into the contiguous `dst`.
pub(super) fn write(cx: Ctx<'_>, dst: &Tensor, bytes: &[u8]) -> Result<()> {
    if bytes.is_empty() {
        return Ok(());
    }
    let at = addr(dst, "write")?;
    // SAFETY: `dst` is a contiguous live tensor of this device whose `bytes.len()` bytes start at
    // `at` (the caller checked the length against `dst.nbytes()`).
    unsafe { cx.rt.copy_to_device(at, bytes) }.map_err(|e| cx.fail("write", e))
}

/// Read the contiguous `src` into `bytes` (exactly `src.nbytes()`), after all queued work: a
/// synchronisation point, where the first device-side error queued since the last one is
/// reported instead (see `deferred.rs`).
pub(super) fn read(cx: Ctx<'_>, src: &Tensor, bytes: &mut [u8]) -> Result<()> {
    cx.drain()?;
    if bytes.is_empty() {
        return cx.rt.synchronize().map_err(|e| cx.fail("read", e));
    }
    let at = addr(src, "read")?;
    // SAFETY: `src` is a contiguous live tensor of this device holding `bytes.len()` bytes at `at`.
    unsafe { cx.rt.copy_to_host(bytes, at) }.map_err(|e| cx.fail("read", e))
}

/// Upload the contiguous host tensor `host` into `dst` (same shape and dtype).
pub(super) fn upload(cx: Ctx<'_>, dst: &Tensor, host: &Tensor) -> Result<()> {
    let n = host.nbytes();
    if n == 0 {
        return Ok(());
    }
    let p = host.ptr::<u8>("write")?;
    // SAFETY: `host` is a contiguous CPU tensor of `n` initialised bytes, borrowed for the call.
    let bytes = unsafe { std::slice::from_raw_parts(p, n) };
    write(cx, dst, bytes)
}

/// Fill the contiguous `dst` with `value` converted to its dtype: one `fill_b8..b64` launch
/// (copy.cu) writing the element's bit pattern, for every dtype. Never an upload: an upload waits
/// for the device on a real driver, and fills run in every training step (`zeros`, a loss's
/// constants, an integer comparison's bound).
pub(super) fn fill(cx: Ctx<'_>, dst: &Tensor, value: f64) -> Result<()> {
    let n = dst.numel();
    if n == 0 {
        return Ok(());
    }
    let (kernel, bits) = element_bits(dst.dtype(), value);
    cx.launch_n("fill", "copy.cu", kernel, n, &[n_arg(n), KernelArg::U64(bits), KernelArg::Ptr(addr(dst, "fill")?)])
}

/// The fill kernel for `dtype`'s width and `value` stored as `dtype` — converted exactly as the
/// CPU backend's fill converts it (`Element::from_f64`: rounding to nearest even for the floats,
/// f16 overflow to infinity, NaN kept, integers truncated and saturated, bool as `value != 0`) —
/// as the element's bits (the native-endian integer of its bytes).
fn element_bits(dtype: DType, value: f64) -> (&'static str, u64) {
    let mut b = [0u8; 8];
    crate::dispatch_all!(dtype, T => {
        let v = <T as crate::element::Element>::from_f64(value);
        let bytes = bytemuck::bytes_of(&v);
        let w = bytes.len().min(8);
        b[..w].copy_from_slice(&bytes[..w]);
    });
    match dtype.size_in_bytes() {
        1 => ("fill_b8", u64::from(b[0])),
        2 => ("fill_b16", u64::from(u16::from_ne_bytes([b[0], b[1]]))),
        4 => ("fill_b32", u64::from(u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))),
        _ => ("fill_b64", u64::from_ne_bytes(b)),
    }
}

/// `dst[i] = start + i·step` in `dst`'s dtype, with the CPU's values (copy.cu's `arange_*`
/// kernels; f16/bf16/bool, rare for ranges, are made on the host and uploaded).
pub(super) fn arange(cx: Ctx<'_>, dst: &Tensor, start: f64, step: f64) -> Result<()> {
    let n = dst.numel();
    if n == 0 {
        return Ok(());
    }
    let kernel = match dst.dtype() {
        DType::F64 => "arange_f64",
        DType::F32 => "arange_f32",
        DType::I64 => "arange_i64",
        DType::I32 => "arange_i32",
        DType::U8 => "arange_u8",
        _ => {
            let host = Tensor::empty(dst.shape(), dst.dtype(), &crate::Device::Cpu)?;
            crate::backend::host_side::arange(&host, start, step)?;
            return upload(cx, dst, &host);
        }
    };
    let args = [n_arg(n), KernelArg::F64(start), KernelArg::F64(step), KernelArg::Ptr(addr(dst, "arange")?)];
    cx.launch_n("arange", "copy.cu", kernel, n, &args)
}

/// A contiguous f32 copy of `t` (`t` itself when it already is one).
pub(super) fn f32_contiguous(cx: Ctx<'_>, t: &Tensor) -> Result<Tensor> {
    contiguous_as(cx, t, DType::F32)
}

/// A contiguous copy of `t` in `dtype` (`t` itself when it already is one): a converting copy
/// into scratch otherwise.
pub(super) fn contiguous_as(cx: Ctx<'_>, t: &Tensor, dtype: DType) -> Result<Tensor> {
    if t.dtype() == dtype && t.is_contiguous() {
        return Ok(t.clone());
    }
    let c = cx.scratch(t, t.shape(), dtype)?;
    copy(cx, &c, t)?;
    Ok(c)
}

/// A one-element f32 device tensor holding `value` (the scalar operand of `binary_scalar` and
/// `compare_scalar`).
pub(super) fn scalar_f32(cx: Ctx<'_>, like: &Tensor, value: f64) -> Result<Tensor> {
    let s = cx.scratch(like, &[], DType::F32)?;
    fill(cx, &s, value)?;
    Ok(s)
}
