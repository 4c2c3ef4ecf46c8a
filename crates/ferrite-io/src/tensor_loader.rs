//! From file tensors to device tensors: `map_location` and dtype-on-load, with views of one storage
//! kept as views of one storage.
//!
//! A `.pt` file can hold several tensors that view one storage (a weight and its transpose, tied
//! embeddings, slices of a fused QKV matrix). PyTorch restores them as views of one storage: one
//! allocation, and an in-place write through one is seen by the others. A [`TensorLoader`]
//! remembers which storages it has already placed on which device, so loading every tensor of a
//! file through one loader does the same, and the memory a load costs on a device is the size of
//! the storages in the file — what PyTorch would allocate. On `meta` the loader allocates the same
//! bytes without reading the file's data pages, which makes "does this checkpoint fit on that
//! GPU?" a question answered in milliseconds.

use std::collections::HashMap;

use bytes::Bytes;
use ferrite_memory::Device;
use ferrite_tensor::{Bool8, DType, Tensor};
use half::{bf16, f16};

use crate::error::{IoError, Result};
use crate::load_options::LoadOptions;
use crate::raw_tensor::RawTensor;

/// Places [`RawTensor`]s on devices according to [`LoadOptions`] (`map_location` and `dtype`;
/// key options are applied by the state_dict functions, not here).
///
/// The loader keeps every storage it placed (and the file bytes behind it) alive until it is
/// dropped, so it is meant to live for one load.
pub struct TensorLoader {
    options: LoadOptions,
    placed: HashMap<StorageKey, (Bytes, Tensor)>,
}

/// A storage of the file placed on one device. The bytes are kept in the map next to the tensor,
/// so their address cannot be reused by another mapping while the key exists.
#[derive(Hash, PartialEq, Eq)]
struct StorageKey {
    addr: usize,
    len: usize,
    dtype: DType,
    device: Device,
}

impl TensorLoader {
    pub fn new(options: &LoadOptions) -> TensorLoader {
        TensorLoader { options: options.clone(), placed: HashMap::new() }
    }

    /// The device a tensor saved at `location` goes to.
    pub fn device_for(&self, location: &str) -> Result<Device> {
        self.options.map_location.resolve(location)
    }

    /// The tensor on its target device, in its target dtype. Tensors that shared a storage in the
    /// file share one on the device (unless their storage was saved with different dtypes).
    /// `requires_grad` carries over for floating-point tensors (PyTorch's `Parameter`s).
    pub fn load(&mut self, raw: &RawTensor) -> Result<Tensor> {
        let device = self.device_for(raw.location())?;
        let key = StorageKey {
            addr: raw.storage().as_ptr() as usize,
            len: raw.storage().len(),
            dtype: raw.dtype(),
            device: device.clone(),
        };
        let base = match self.placed.get(&key) {
            Some((_, base)) => base.clone(),
            None => {
                let base = place_storage(raw, &device, self.options.target_dtype(raw.dtype()))?;
                self.placed.insert(key, (raw.storage().clone(), base.clone()));
                base
            }
        };
        let t = base.as_strided(raw.shape(), raw.strides(), raw.storage_offset())?;
        if raw.requires_grad() && t.dtype().is_floating_point() {
            t.requires_grad_(true)?;
        }
        Ok(t)
    }

    /// Bytes this loader has allocated on devices so far (the placed storages).
    pub fn allocated_bytes(&self) -> usize {
        self.placed.values().map(|(_, t)| t.storage().nbytes()).sum()
    }
}

/// The whole storage of `raw` as a 1-d tensor of `target` dtype on `device`.
fn place_storage(raw: &RawTensor, device: &Device, target: DType) -> Result<Tensor> {
    let es = raw.dtype().size_in_bytes();
    let n = raw.storage().len() / es;
    if matches!(device, Device::Meta) {
        // Shapes only: the allocation a real device would make, and no read of the data.
        return Ok(Tensor::zeros(&[n], target, device)?);
    }
    let bytes = &raw.storage()[..n * es];
    if target == raw.dtype() {
        return tensor_from_le_bytes(raw.dtype(), bytes, device);
    }
    // Convert on the host, then move: the device only ever holds the converted storage.
    let _no_grad = ferrite_tensor::no_grad();
    let host = tensor_from_le_bytes(raw.dtype(), bytes, &Device::Cpu)?;
    Ok(host.to_dtype(target)?.to_device(device)?)
}

/// A 1-d tensor on `device` holding `bytes` (little-endian elements of `dtype`).
pub(crate) fn tensor_from_le_bytes(dtype: DType, bytes: &[u8], device: &Device) -> Result<Tensor> {
    if cfg!(target_endian = "big") {
        return Err(IoError::ByteOrder { byteorder: "little (the machine is big)".to_string() });
    }
    match dtype {
        DType::F32 => typed::<f32>(bytes, device),
        DType::F64 => typed::<f64>(bytes, device),
        DType::F16 => typed::<f16>(bytes, device),
        DType::BF16 => typed::<bf16>(bytes, device),
        DType::I64 => typed::<i64>(bytes, device),
        DType::I32 => typed::<i32>(bytes, device),
        DType::U8 => typed::<u8>(bytes, device),
        DType::Bool => typed::<Bool8>(bytes, device),
    }
}

fn typed<T: ferrite_tensor::Element>(bytes: &[u8], device: &Device) -> Result<Tensor> {
    let n = bytes.len() / std::mem::size_of::<T>();
    // Files ferrite and PyTorch write keep tensor data aligned, so this is normally one copy
    // straight from the mapped file into the device's block; unaligned data takes one more.
    Ok(match bytemuck::try_cast_slice::<u8, T>(bytes) {
        Ok(s) => Tensor::from_slice(s, &[n], device)?,
        Err(_) => {
            let mut v = vec![<T as bytemuck::Zeroable>::zeroed(); n];
            bytemuck::cast_slice_mut::<T, u8>(&mut v).copy_from_slice(&bytes[..n * std::mem::size_of::<T>()]);
            Tensor::from_vec(v, &[n], device)?
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::map_location::MapLocation;

    fn arange_storage(n: usize) -> Bytes {
        let mut b = Vec::new();
        for i in 0..n {
            b.extend_from_slice(&(i as f32).to_le_bytes());
        }
        Bytes::from(b)
    }

    #[test]
    fn views_of_one_storage_share_it_on_the_device() {
        let s = arange_storage(12);
        let a = RawTensor::new(DType::F32, vec![3, 4], vec![4, 1], 0, s.clone()).unwrap();
        let at = RawTensor::new(DType::F32, vec![4, 3], vec![1, 4], 0, s.clone()).unwrap();
        let row = RawTensor::new(DType::F32, vec![4], vec![1], 8, s).unwrap();
        let mut loader = TensorLoader::new(&LoadOptions::new());
        let (ta, tat, trow) = (loader.load(&a).unwrap(), loader.load(&at).unwrap(), loader.load(&row).unwrap());
        assert!(ta.shares_storage(&tat) && ta.shares_storage(&trow));
        assert_eq!(tat.to_vec::<f32>().unwrap(), at.to_vec::<f32>().unwrap());
        assert_eq!(trow.to_vec::<f32>().unwrap(), vec![8.0, 9.0, 10.0, 11.0]);
        assert_eq!(loader.allocated_bytes(), 48);
        // Like PyTorch: a write through one view is seen by the others.
        trow.fill_(-1.0).unwrap();
        assert_eq!(ta.to_vec::<f32>().unwrap()[8..], [-1.0; 4]);
    }

    #[test]
    fn dtype_conversion_applies_to_floats_only_and_keeps_sharing() {
        let s = arange_storage(6);
        let a = RawTensor::new(DType::F32, vec![2, 3], vec![3, 1], 0, s.clone()).unwrap();
        let b = RawTensor::new(DType::F32, vec![3], vec![1], 3, s).unwrap();
        let steps = RawTensor::from_values(vec![], &[7i64]).unwrap();
        let mut loader = TensorLoader::new(&LoadOptions::new().dtype(DType::BF16));
        let (ta, tb, ts) = (loader.load(&a).unwrap(), loader.load(&b).unwrap(), loader.load(&steps).unwrap());
        assert_eq!((ta.dtype(), ts.dtype()), (DType::BF16, DType::I64));
        assert!(ta.shares_storage(&tb));
        assert_eq!(tb.to_vec_f64().unwrap(), vec![3.0, 4.0, 5.0]);
        assert_eq!(ts.item().unwrap(), 7.0);
    }

    #[test]
    fn meta_allocates_without_data_and_cuda_needs_a_choice() {
        let mut raw = RawTensor::from_values(vec![2, 2], &[1.0f64, 2.0, 3.0, 4.0]).unwrap();
        raw.set_location("cuda:1");
        let err = TensorLoader::new(&LoadOptions::new()).load(&raw).unwrap_err().to_string();
        assert!(err.contains("cuda:1") && err.contains("map location"), "{err}");
        let t = TensorLoader::new(&LoadOptions::new().device(Device::Meta)).load(&raw).unwrap();
        assert!(t.is_meta() && t.shape() == [2, 2] && t.dtype() == DType::F64);
        let m = MapLocation::parse("cuda:1=cpu").unwrap();
        let t = TensorLoader::new(&LoadOptions::new().map_location(m)).load(&raw).unwrap();
        assert_eq!((t.device().clone(), t.to_vec::<f64>().unwrap()), (Device::Cpu, vec![1.0, 2.0, 3.0, 4.0]));
    }

    #[test]
    fn unaligned_bytes_and_every_dtype() {
        let mut v = vec![0u8];
        v.extend_from_slice(&1.5f64.to_le_bytes());
        v.extend_from_slice(&(-2.25f64).to_le_bytes());
        let unaligned = Bytes::from(v).slice(1..);
        let t = tensor_from_le_bytes(DType::F64, &unaligned, &Device::Cpu).unwrap();
        assert_eq!(t.to_vec::<f64>().unwrap(), vec![1.5, -2.25]);
        for dtype in DType::ALL {
            let raw = RawTensor::from_values(vec![3], &[1i64, 0, 3]).unwrap().to_dtype(dtype);
            let t = TensorLoader::new(&LoadOptions::new()).load(&raw).unwrap();
            let three = if dtype == DType::Bool { 1.0 } else { 3.0 };
            assert_eq!((t.dtype(), t.to_vec_f64().unwrap()), (dtype, vec![1.0, 0.0, three]), "{dtype}");
        }
    }
}
