//! Moving batches to the training device before the training loop asks for them.
//!
//! PyTorch users get this with `pin_memory=True` plus `.to(device, non_blocking=True)`: the copy
//! overlaps with compute instead of stalling the step. Here the loader's workers perform the move
//! right after collation, so with `num_workers >= 1` a batch is already on the device when the
//! iterator hands it over. With `num_workers == 0` there is no background thread and the move
//! happens on the calling thread. Staged batches occupy device memory while they wait: at most
//! the loader's prefetch depth of them.

use std::sync::Arc;

use ferrite_memory::Device;
use ferrite_tensor::Tensor;

use crate::error::BoxError;

/// A batch that can be moved to a device.
pub trait ToDevice: Sized + Send + 'static {
    fn to_device(self, device: &Device) -> Result<Self, BoxError>;
}

/// The staging step the loader runs on each collated batch.
pub type Stager<B> = Arc<dyn Fn(B) -> Result<B, BoxError> + Send + Sync>;

/// The stager that moves batches to `device`.
pub fn stager_to<B: ToDevice>(device: Device) -> Stager<B> {
    Arc::new(move |batch: B| batch.to_device(&device))
}

impl ToDevice for Tensor {
    fn to_device(self, device: &Device) -> Result<Tensor, BoxError> {
        // A batch is data, not part of a graph: detach so the copy records no autograd history.
        Ok(Tensor::to_device(&self.detach(), device)?)
    }
}

impl<T: ToDevice> ToDevice for Vec<T> {
    fn to_device(self, device: &Device) -> Result<Self, BoxError> {
        self.into_iter().map(|t| t.to_device(device)).collect()
    }
}

impl<A: ToDevice, B: ToDevice> ToDevice for (A, B) {
    fn to_device(self, device: &Device) -> Result<Self, BoxError> {
        Ok((self.0.to_device(device)?, self.1.to_device(device)?))
    }
}

impl<A: ToDevice, B: ToDevice, C: ToDevice> ToDevice for (A, B, C) {
    fn to_device(self, device: &Device) -> Result<Self, BoxError> {
        Ok((self.0.to_device(device)?, self.1.to_device(device)?, self.2.to_device(device)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tensors_move_without_history() {
        let x = Tensor::from_vec(vec![1.0f32, 2.0], &[2], &Device::Cpu).unwrap().requires_grad_(true).unwrap();
        let (moved, same) = ToDevice::to_device((x.clone(), x), &Device::Meta).unwrap();
        assert_eq!((moved.device(), same.device()), (&Device::Meta, &Device::Meta));
        assert!(moved.grad_fn().is_none() && !moved.requires_grad());
    }
}
