//! How a checkpoint is loaded onto devices: PyTorch's `map_location`, a dtype, a key prefix and,
//! for nested training checkpoints, which entry holds the state_dict.
//!
//! Every one of these is an explicit choice of the caller. Nothing is guessed: a `module.` prefix
//! is only removed when asked (a strict key check that finds one names this option), and a tensor
//! saved on `cuda:0` only loads once the caller says where it should go.

use ferrite_memory::Device;
use ferrite_tensor::DType;

use crate::map_location::MapLocation;

/// Options for [`load_state_dict`](crate::load_state_dict), [`TensorLoader`](crate::TensorLoader)
/// and [`Checkpoint`](crate::Checkpoint) reads.
///
/// ```
/// use ferrite_io::{LoadOptions, MapLocation};
/// use ferrite_memory::Device;
/// use ferrite_tensor::DType;
/// let opts = LoadOptions::new()
///     .map_location(MapLocation::parse("cuda:1=sim:a100-40gb:0,cuda=cpu").unwrap())
///     .dtype(DType::BF16)
///     .strip_prefix("module.")
///     .key("model");
/// assert_eq!(LoadOptions::new().device(Device::Meta).map_location, MapLocation::To(Device::Meta));
/// # let _ = opts;
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LoadOptions {
    /// Where tensors go. Default: where they were saved (`cpu`, `sim:…`, `meta`); a tensor saved
    /// on a CUDA device is an error that names this option.
    pub map_location: MapLocation,
    /// Convert floating-point tensors to this dtype on load. Integer and bool tensors (token ids,
    /// BatchNorm's `num_batches_tracked`) keep their dtype, as with PyTorch's `module.to(dtype)`.
    pub dtype: Option<DType>,
    /// Remove this prefix from every state_dict key that has it (`module.` from
    /// DataParallel/DistributedDataParallel, `_orig_mod.` from `torch.compile`).
    pub strip_prefix: Option<String>,
    /// For a nested checkpoint, the `/`-separated path of the entry that holds the state_dict
    /// (`model`, `state_dict`, `model/encoder`).
    pub key: Option<String>,
}

impl LoadOptions {
    /// Defaults: tensors where they were saved, dtypes as saved, keys as saved, the file's root.
    pub fn new() -> LoadOptions {
        LoadOptions::default()
    }

    /// Every tensor onto `device` (PyTorch: `map_location="cpu"`).
    pub fn device(mut self, device: Device) -> LoadOptions {
        self.map_location = MapLocation::To(device);
        self
    }

    pub fn map_location(mut self, map_location: MapLocation) -> LoadOptions {
        self.map_location = map_location;
        self
    }

    pub fn dtype(mut self, dtype: DType) -> LoadOptions {
        self.dtype = Some(dtype);
        self
    }

    pub fn strip_prefix(mut self, prefix: impl Into<String>) -> LoadOptions {
        self.strip_prefix = Some(prefix.into());
        self
    }

    pub fn key(mut self, key: impl Into<String>) -> LoadOptions {
        self.key = Some(key.into());
        self
    }

    /// The dtype a tensor saved as `saved` is loaded as.
    pub fn target_dtype(&self, saved: DType) -> DType {
        match self.dtype {
            Some(d) if saved.is_floating_point() => d,
            _ => saved,
        }
    }
}
