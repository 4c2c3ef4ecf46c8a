//! A tensor as it sits in a file: element type, layout, and the bytes of its storage.
//!
//! The readers produce `RawTensor`s before anything touches a device, so the format code can be
//! tested against PyTorch's files on its own and the bytes can stay in the memory map until a tensor
//! is really needed. Several `RawTensor`s may share one storage (views in a `.pt` file); each keeps
//! its own shape, strides and offset, exactly like PyTorch's `_rebuild_tensor_v2` arguments, and
//! every constructor checks that the layout stays inside the storage.

use std::borrow::Cow;

use bytes::Bytes;
use ferrite_tensor::DType;
use half::{bf16, f16};

use crate::error::{IoError, Result};

/// A tensor's dtype, layout and storage bytes (little-endian), independent of any device.
#[derive(Clone, PartialEq)]
pub struct RawTensor {
    dtype: DType,
    shape: Vec<usize>,
    /// In elements, like PyTorch.
    strides: Vec<usize>,
    /// In elements.
    offset: usize,
    /// The whole storage (possibly shared with other tensors).
    storage: Bytes,
    requires_grad: bool,
    /// Where the tensor lived when it was saved (`cpu`, `cuda:0`, …), for device remapping.
    location: String,
}

impl std::fmt::Debug for RawTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawTensor")
            .field("dtype", &self.dtype)
            .field("shape", &self.shape)
            .field("strides", &self.strides)
            .field("offset", &self.offset)
            .field("storage_bytes", &self.storage.len())
            .field("location", &self.location)
            .finish()
    }
}

/// The largest tensor (in bytes, when materialised) that may view a smaller storage: repeated
/// elements (stride 0) beyond this are refused as malformed rather than materialised.
pub const MAX_EXPANDED_VIEW_BYTES: u128 = 1 << 30;

/// Row-major (C-contiguous) strides for `shape`, in elements.
pub fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![0; shape.len()];
    let mut acc = 1usize;
    for (s, &d) in strides.iter_mut().zip(shape).rev() {
        *s = acc;
        acc = acc.saturating_mul(d);
    }
    strides
}

impl RawTensor {
    /// A view into `storage` (PyTorch's `_rebuild_tensor_v2`). Fails if any element the layout
    /// addresses lies past the end of the storage.
    pub fn new(
        dtype: DType,
        shape: Vec<usize>,
        strides: Vec<usize>,
        offset: usize,
        storage: Bytes,
    ) -> Result<RawTensor> {
        if shape.len() != strides.len() {
            return Err(IoError::structure(
                "",
                format!("tensor has {} dimensions but {} strides", shape.len(), strides.len()),
            ));
        }
        let available = storage.len() / dtype.size_in_bytes();
        let needed = required_elements(&shape, &strides, offset);
        if needed > available as u128 {
            return Err(IoError::ShapeStorageMismatch { name: None, shape, strides, offset, needed, available });
        }
        // Views may repeat elements (stride 0 from `expand`), so a layout inside a small storage can
        // still describe an enormous tensor; everything that visits or copies the elements would
        // then hang or allocate the claimed size. Such views are allowed up to a size no
        // legitimate broadcast buffer reaches.
        let numel = shape.iter().try_fold(1u128, |acc, &d| acc.checked_mul(d as u128));
        let logical = numel.and_then(|n| n.checked_mul(dtype.size_in_bytes() as u128));
        let limit = (storage.len() as u128).max(MAX_EXPANDED_VIEW_BYTES);
        if logical.is_none_or(|b| b > limit) {
            return Err(IoError::LimitExceeded {
                what: format!(
                    "a {dtype} view of shape {shape:?} (strides {strides:?}) over a storage of {} bytes, {} bytes when materialised,",
                    storage.len(),
                    logical.map_or_else(|| "more than 2^128".to_string(), |b| b.to_string())
                ),
                limit: limit.min(u64::MAX as u128) as u64,
            });
        }
        Ok(RawTensor { dtype, shape, strides, offset, storage, requires_grad: false, location: "cpu".to_string() })
    }

    /// A contiguous tensor whose storage is exactly `bytes`.
    pub fn from_contiguous_bytes(dtype: DType, shape: Vec<usize>, bytes: Bytes) -> Result<RawTensor> {
        let numel: u128 = shape.iter().map(|&d| d as u128).product();
        let expected = numel * dtype.size_in_bytes() as u128;
        if expected != bytes.len() as u128 {
            return Err(IoError::SizeExceedsData {
                what: format!("a {dtype} tensor of shape {shape:?} ({expected} bytes)"),
                claimed: expected,
                available: bytes.len() as u128,
            });
        }
        let strides = contiguous_strides(&shape);
        RawTensor::new(dtype, shape, strides, 0, bytes)
    }

    /// A contiguous tensor holding `values` (row-major).
    pub fn from_values<T: FileElement>(shape: Vec<usize>, values: &[T]) -> Result<RawTensor> {
        let mut bytes = Vec::with_capacity(std::mem::size_of_val(values));
        for v in values {
            v.write_le(&mut bytes);
        }
        RawTensor::from_contiguous_bytes(T::DTYPE, shape, Bytes::from(bytes))
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }
    pub fn strides(&self) -> &[usize] {
        &self.strides
    }
    /// Offset of the first element in the storage, in elements.
    pub fn storage_offset(&self) -> usize {
        self.offset
    }
    /// The whole storage this tensor views (shared with other views of it).
    pub fn storage(&self) -> &Bytes {
        &self.storage
    }
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
    pub fn nbytes(&self) -> usize {
        self.numel() * self.dtype.size_in_bytes()
    }
    pub fn requires_grad(&self) -> bool {
        self.requires_grad
    }
    pub fn set_requires_grad(&mut self, requires_grad: bool) {
        self.requires_grad = requires_grad;
    }
    /// The device tag the tensor was saved from (`cpu`, `cuda:0`, …).
    pub fn location(&self) -> &str {
        &self.location
    }
    pub fn set_location(&mut self, location: impl Into<String>) {
        self.location = location.into();
    }

    /// True when the elements are laid out row-major with no gaps (size-1 dims may have any stride).
    pub fn is_contiguous(&self) -> bool {
        let mut expected = 1usize;
        for (&d, &s) in self.shape.iter().zip(&self.strides).rev() {
            if d != 1 && s != expected {
                return false;
            }
            expected = expected.saturating_mul(d);
        }
        true
    }

    /// The elements in row-major order as little-endian bytes. Borrows the storage when the tensor
    /// is contiguous, copies otherwise.
    pub fn contiguous_bytes(&self) -> Cow<'_, [u8]> {
        let es = self.dtype.size_in_bytes();
        if self.numel() == 0 {
            return Cow::Borrowed(&[]);
        }
        if self.is_contiguous() {
            let start = self.offset * es;
            return Cow::Borrowed(&self.storage[start..start + self.nbytes()]);
        }
        let mut out = Vec::with_capacity(self.nbytes());
        self.for_each_storage_index(|i| out.extend_from_slice(&self.storage[i * es..(i + 1) * es]));
        Cow::Owned(out)
    }

    /// A contiguous copy that owns only its own elements (drops the rest of a shared storage).
    pub fn to_contiguous(&self) -> RawTensor {
        let bytes = match self.contiguous_bytes() {
            Cow::Borrowed(b) if b.len() == self.storage.len() => self.storage.clone(),
            Cow::Borrowed([]) => Bytes::new(),
            Cow::Borrowed(_) => {
                let es = self.dtype.size_in_bytes();
                self.storage.slice(self.offset * es..self.offset * es + self.nbytes())
            }
            Cow::Owned(v) => Bytes::from(v),
        };
        RawTensor {
            dtype: self.dtype,
            strides: contiguous_strides(&self.shape),
            shape: self.shape.clone(),
            offset: 0,
            storage: bytes,
            requires_grad: self.requires_grad,
            location: self.location.clone(),
        }
    }

    /// Every element converted to f64, row-major.
    pub fn to_f64_vec(&self) -> Vec<f64> {
        let mut out = Vec::with_capacity(self.numel());
        let decode = decoder(self.dtype);
        let es = self.dtype.size_in_bytes();
        self.for_each_storage_index(|i| out.push(decode(&self.storage[i * es..(i + 1) * es])));
        out
    }

    /// The sum of all elements as f64 (what `ferrite inspect` prints).
    pub fn sum_f64(&self) -> f64 {
        let decode = decoder(self.dtype);
        let es = self.dtype.size_in_bytes();
        let mut sum = 0.0f64;
        self.for_each_storage_index(|i| sum += decode(&self.storage[i * es..(i + 1) * es]));
        sum
    }

    /// The elements as `T`, row-major. Fails if `T` is not this tensor's dtype.
    pub fn to_vec<T: FileElement>(&self) -> Result<Vec<T>> {
        if T::DTYPE != self.dtype {
            return Err(IoError::structure(
                "",
                format!("tensor has dtype {} but {} was requested", self.dtype, T::DTYPE),
            ));
        }
        let bytes = self.contiguous_bytes();
        Ok(bytes.chunks_exact(T::DTYPE.size_in_bytes()).map(T::read_le).collect())
    }

    /// A contiguous copy converted to `dtype` (floats round to nearest, float→int truncates toward
    /// zero and saturates, anything→bool is `!= 0`). Same dtype returns a cheap clone.
    pub fn to_dtype(&self, dtype: DType) -> RawTensor {
        if dtype == self.dtype {
            return self.clone();
        }
        let mut out = Vec::with_capacity(self.numel() * dtype.size_in_bytes());
        let es = self.dtype.size_in_bytes();
        let int_source = !self.dtype.is_floating_point();
        self.for_each_storage_index(|i| {
            let b = &self.storage[i * es..(i + 1) * es];
            if int_source && !dtype.is_floating_point() {
                encode_i64(dtype, decode_i64(self.dtype, b), &mut out);
            } else {
                encode_f64(dtype, decoder(self.dtype)(b), &mut out);
            }
        });
        RawTensor {
            dtype,
            strides: contiguous_strides(&self.shape),
            shape: self.shape.clone(),
            offset: 0,
            storage: Bytes::from(out),
            requires_grad: self.requires_grad,
            location: self.location.clone(),
        }
    }

    /// Calls `f` with the storage index (in elements) of every element, row-major.
    fn for_each_storage_index(&self, mut f: impl FnMut(usize)) {
        let numel = self.numel();
        if numel == 0 {
            return;
        }
        if self.is_contiguous() {
            (self.offset..self.offset + numel).for_each(f);
            return;
        }
        let nd = self.shape.len();
        let mut idx = vec![0usize; nd];
        let mut pos = self.offset;
        for _ in 0..numel {
            f(pos);
            // Odometer increment, last dimension fastest.
            for d in (0..nd).rev() {
                // Wrapping arithmetic: a size-1 dimension may carry any stride (even usize::MAX);
                // the add and subtract below cancel exactly.
                idx[d] += 1;
                pos = pos.wrapping_add(self.strides[d]);
                if idx[d] < self.shape[d] {
                    break;
                }
                pos = pos.wrapping_sub(self.strides[d].wrapping_mul(self.shape[d]));
                idx[d] = 0;
            }
        }
    }
}

/// Number of storage elements a layout reaches (0 for an empty tensor), computed without overflow.
pub(crate) fn required_elements(shape: &[usize], strides: &[usize], offset: usize) -> u128 {
    if shape.contains(&0) {
        return 0;
    }
    let mut last = offset as u128;
    for (&d, &s) in shape.iter().zip(strides) {
        last += (d as u128 - 1) * s as u128;
    }
    last + 1
}

fn decoder(dtype: DType) -> fn(&[u8]) -> f64 {
    match dtype {
        DType::F32 => |b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64,
        DType::F64 => |b| f64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]),
        DType::F16 => |b| f16::from_le_bytes([b[0], b[1]]).to_f64(),
        DType::BF16 => |b| bf16::from_le_bytes([b[0], b[1]]).to_f64(),
        DType::I64 => |b| i64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]) as f64,
        DType::I32 => |b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64,
        DType::U8 => |b| b[0] as f64,
        DType::Bool => |b| if b[0] != 0 { 1.0 } else { 0.0 },
    }
}

fn decode_i64(dtype: DType, b: &[u8]) -> i64 {
    match dtype {
        DType::I64 => i64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]),
        DType::I32 => i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as i64,
        DType::U8 => b[0] as i64,
        DType::Bool => (b[0] != 0) as i64,
        _ => decoder(dtype)(b) as i64,
    }
}

fn encode_i64(dtype: DType, v: i64, out: &mut Vec<u8>) {
    match dtype {
        DType::I64 => out.extend_from_slice(&v.to_le_bytes()),
        DType::I32 => out.extend_from_slice(&(v as i32).to_le_bytes()),
        DType::U8 => out.push(v as u8),
        DType::Bool => out.push((v != 0) as u8),
        _ => encode_f64(dtype, v as f64, out),
    }
}

fn encode_f64(dtype: DType, v: f64, out: &mut Vec<u8>) {
    match dtype {
        DType::F32 => out.extend_from_slice(&(v as f32).to_le_bytes()),
        DType::F64 => out.extend_from_slice(&v.to_le_bytes()),
        DType::F16 => out.extend_from_slice(&f16::from_f64(v).to_le_bytes()),
        DType::BF16 => out.extend_from_slice(&bf16::from_f64(v).to_le_bytes()),
        DType::I64 => out.extend_from_slice(&(v as i64).to_le_bytes()),
        DType::I32 => out.extend_from_slice(&(v as i32).to_le_bytes()),
        DType::U8 => out.push(v as u8),
        DType::Bool => out.push((v != 0.0) as u8),
    }
}

/// A Rust element type with a ferrite [`DType`] and a little-endian byte encoding: how a value is
/// written into and read out of a file's bytes. (`ferrite_tensor::Element` is the other side: how
/// a value lives in device memory and takes part in kernels.)
pub trait FileElement: Copy {
    const DTYPE: DType;
    fn write_le(&self, out: &mut Vec<u8>);
    /// `bytes` has exactly `DTYPE.size_in_bytes()` bytes.
    fn read_le(bytes: &[u8]) -> Self;
}

macro_rules! element {
    ($t:ty, $d:expr, $n:expr) => {
        impl FileElement for $t {
            const DTYPE: DType = $d;
            fn write_le(&self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn read_le(bytes: &[u8]) -> Self {
                let mut a = [0u8; $n];
                a.copy_from_slice(bytes);
                <$t>::from_le_bytes(a)
            }
        }
    };
}
element!(f32, DType::F32, 4);
element!(f64, DType::F64, 8);
element!(f16, DType::F16, 2);
element!(bf16, DType::BF16, 2);
element!(i64, DType::I64, 8);
element!(i32, DType::I32, 4);
element!(u8, DType::U8, 1);

impl FileElement for bool {
    const DTYPE: DType = DType::Bool;
    fn write_le(&self, out: &mut Vec<u8>) {
        out.push(*self as u8);
    }
    fn read_le(bytes: &[u8]) -> Self {
        bytes[0] != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arange(n: usize) -> Bytes {
        let v: Vec<f32> = (0..n).map(|i| i as f32).collect();
        let mut b = Vec::new();
        for x in v {
            b.extend_from_slice(&x.to_le_bytes());
        }
        Bytes::from(b)
    }

    #[test]
    fn views_read_through_strides_and_offset() {
        let s = arange(24);
        let t = RawTensor::new(DType::F32, vec![6, 4], vec![1, 6], 0, s.clone()).unwrap();
        assert!(!t.is_contiguous());
        let v = t.to_f64_vec();
        assert_eq!(&v[..5], &[0.0, 6.0, 12.0, 18.0, 1.0]);
        let col = RawTensor::new(DType::F32, vec![4], vec![6], 2, s.clone()).unwrap();
        assert_eq!(col.to_vec::<f32>().unwrap(), vec![2.0, 8.0, 14.0, 20.0]);
        let row = RawTensor::new(DType::F32, vec![6], vec![1], 6, s).unwrap();
        assert!(row.is_contiguous());
        assert_eq!(row.sum_f64(), (6..12).sum::<i32>() as f64);
        assert_eq!(row.to_contiguous().storage().len(), 24);
    }

    #[test]
    fn layouts_past_the_storage_are_refused() {
        let s = arange(24);
        let err = RawTensor::new(DType::F32, vec![5, 5], vec![5, 1], 0, s.clone()).unwrap_err();
        assert!(matches!(err, IoError::ShapeStorageMismatch { needed: 25, available: 24, .. }), "{err}");
        let huge = RawTensor::new(DType::F32, vec![usize::MAX, usize::MAX], vec![usize::MAX, 1], usize::MAX, s.clone());
        assert!(huge.is_err());
        assert!(RawTensor::new(DType::F32, vec![0, usize::MAX], vec![1, 1], 0, s.clone()).is_ok());
        // Expanded views: small ones are fine, ones that would materialise to terabytes are not.
        let e = RawTensor::new(DType::F32, vec![1000, 24], vec![0, 1], 0, s.clone()).unwrap();
        assert_eq!(e.sum_f64(), 1000.0 * 276.0);
        let err = RawTensor::new(DType::F32, vec![1 << 31, 1 << 31], vec![0, 0], 0, s.clone()).unwrap_err();
        assert!(matches!(err, IoError::LimitExceeded { .. }) && err.to_string().contains("materialised"), "{err}");
        assert!(
            RawTensor::new(DType::F32, vec![usize::MAX, usize::MAX, usize::MAX], vec![0, 0, 0], 0, s.clone()).is_err()
        );
        assert!(RawTensor::new(DType::F32, vec![2], vec![1, 1], 0, s).is_err());
    }

    #[test]
    fn dtype_conversion() {
        let t = RawTensor::from_values(vec![4], &[1.5f32, -2.7, 0.0, 300.0]).unwrap();
        assert_eq!(t.to_dtype(DType::I64).to_vec::<i64>().unwrap(), vec![1, -2, 0, 300]);
        assert_eq!(t.to_dtype(DType::Bool).to_vec::<bool>().unwrap(), vec![true, true, false, true]);
        assert_eq!(t.to_dtype(DType::F16).to_vec::<f16>().unwrap()[0], f16::from_f32(1.5));
        let big = RawTensor::from_values(vec![1], &[(1i64 << 60) + 1]).unwrap();
        assert_eq!(big.to_dtype(DType::I64).to_vec::<i64>().unwrap(), vec![(1i64 << 60) + 1]);
    }
}
