//! Which replica owns each parameter: the replica whose copy the optimizer updates, and so the
//! device where that parameter's reduced gradient and optimizer state (momentum, Adam's moments)
//! live.
//!
//! PyTorch's `DataParallel` gives everything to device 0, whose memory then grows by the whole
//! optimizer state (AdamW: twice the parameters). Spreading the owners balances that state across
//! the devices, with an ordinary optimizer: it is built over the owners' tensors and creates each
//! state tensor beside its parameter.

/// How [`DataParallel`](super::DataParallel) chooses the owner of each parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OwnerPolicy {
    /// Spread the parameters over the devices so that each owns about the same number of bytes
    /// (greedy: largest parameter first, onto the device owning the fewest bytes so far; ties go
    /// to the lower index, so the assignment is deterministic). The default.
    #[default]
    Balanced,
    /// Device 0 owns every parameter, as in PyTorch: all gradients are reduced there and the whole
    /// optimizer state lives there.
    Primary,
}

/// The owner replica of every parameter, for parameters of `bytes` (in the module's order) over
/// `devices` replicas.
pub fn assign_owners(bytes: &[usize], devices: usize, policy: OwnerPolicy) -> Vec<usize> {
    let devices = devices.max(1);
    match policy {
        OwnerPolicy::Primary => vec![0; bytes.len()],
        OwnerPolicy::Balanced => {
            let mut order: Vec<usize> = (0..bytes.len()).collect();
            // Largest first; equal sizes in the module's order (the sort is stable).
            order.sort_by(|&a, &b| bytes[b].cmp(&bytes[a]));
            let mut owned = vec![0usize; devices];
            let mut owners = vec![0usize; bytes.len()];
            for j in order {
                // `min_by_key` returns the first minimum: ties go to the lower device index.
                let d = (0..devices).min_by_key(|&d| owned[d]).unwrap_or(0);
                owners[j] = d;
                owned[d] += bytes[j];
            }
            owners
        }
    }
}

/// The bytes each of `devices` replicas owns under `owners`.
pub fn owned_bytes(bytes: &[usize], owners: &[usize], devices: usize) -> Vec<usize> {
    let mut owned = vec![0usize; devices];
    for (&b, &o) in bytes.iter().zip(owners) {
        if let Some(slot) = owned.get_mut(o) {
            *slot += b;
        }
    }
    owned
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn balanced_owners_go_largest_first_onto_the_least_loaded_device() {
        // Two 4 MiB weights, a 2 MiB one and small biases over 2 devices.
        let bytes = [4 << 20, 1024, 4 << 20, 1024, 2 << 20, 512];
        let owners = assign_owners(&bytes, 2, OwnerPolicy::Balanced);
        assert_eq!(owners, vec![0, 1, 1, 1, 0, 1]);
        let owned = owned_bytes(&bytes, &owners, 2);
        assert_eq!(owned, vec![(4 << 20) + (2 << 20), (4 << 20) + 1024 + 1024 + 512]);
        // Deterministic: the same input gives the same owners.
        assert_eq!(assign_owners(&bytes, 2, OwnerPolicy::Balanced), owners);
    }

    #[test]
    fn equal_parameters_spread_evenly_and_the_primary_policy_keeps_everything_on_device_0() {
        let bytes = vec![1000; 8];
        let owners = assign_owners(&bytes, 4, OwnerPolicy::Balanced);
        assert_eq!(owned_bytes(&bytes, &owners, 4), vec![2000; 4]);
        assert_eq!(assign_owners(&bytes, 4, OwnerPolicy::Primary), vec![0; 8]);
        assert_eq!(assign_owners(&bytes, 1, OwnerPolicy::Balanced), vec![0; 8]);
        assert!(assign_owners(&[], 3, OwnerPolicy::Balanced).is_empty());
    }

    #[test]
    fn the_spread_of_owned_bytes_is_at_most_the_largest_parameter() {
        let bytes: Vec<usize> = (1..40).map(|i| (i * 7919) % 1000 + 1).collect();
        for k in 1..6 {
            let owned = owned_bytes(&bytes, &assign_owners(&bytes, k, OwnerPolicy::Balanced), k);
            let (max, min) = (owned.iter().max().copied().unwrap_or(0), owned.iter().min().copied().unwrap_or(0));
            assert!(max - min <= bytes.iter().max().copied().unwrap_or(0), "{k}: {owned:?}");
            assert_eq!(owned.iter().sum::<usize>(), bytes.iter().sum::<usize>());
        }
    }
}
