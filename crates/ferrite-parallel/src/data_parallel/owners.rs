//! Which replica owns each parameter (or each piece of one): the replica whose copy the optimizer
//! updates, and so the device where that parameter's reduced gradient and optimizer state
//! (momentum, Adam's moments) live.
//!
//! PyTorch's `DataParallel` gives everything to device 0, whose memory then grows by the whole
//! optimizer state (AdamW: twice the parameters). Spreading the owners balances that state across
//! the devices, with an ordinary optimizer: it is built over the owners' tensors and creates each
//! state tensor beside its parameter. Whole parameters balance only as finely as the largest
//! parameter; [`OwnerPolicy::Sharded`] cuts the parameters (flattened, in order) into one equal
//! run of elements per device, as ZeRO stage 1 does, which balances any model.

/// How [`DataParallel`](super::DataParallel) chooses the owner of each parameter.
///
/// ```
/// use ferrite_memory::{Device, select_devices};
/// use ferrite_nn::Linear;
/// use ferrite_optim::{Adam, AdamConfig};
/// use ferrite_parallel::{DataParallel, OwnerPolicy};
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let devices = select_devices(&Device::parse("sim:a100-40gb")?, Some("0,1,2,3"))?;
/// let dp = DataParallel::with_owners(Linear::new(512, 512)?, &devices, OwnerPolicy::Sharded)?;
/// let mut opt = Adam::new(dp.parameters(), AdamConfig::adamw(1e-3))?; // each piece's state on its owner
/// let saved = dp.optimizer_state_dict(&opt)?; // one entry per parameter, as on one device
/// dp.load_optimizer_state_dict(&mut opt, &saved)?;
/// assert_eq!(dp.owned_bytes(), vec![262656; 4]);
/// // Whole parameters: the 512x512 weight cannot be shared.
/// let whole = DataParallel::new(Linear::new(512, 512)?, &devices)?;
/// assert_eq!(whole.owned_bytes(), vec![1 << 20, 2048, 0, 0]);
/// # Ok(()) }
/// ```
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
    /// All parameters, flattened and concatenated in the module's order, are cut into one run of
    /// about `total / devices` bytes per device (ZeRO stage 1's partition): a parameter that
    /// crosses a cut is split into flat pieces, each a view into its owner replica's parameter.
    /// The optimizer then sees those pieces (more tensors than the module has parameters, 1-D
    /// where split); save and load its state with
    /// [`DataParallel::optimizer_state_dict`](super::DataParallel::optimizer_state_dict) /
    /// [`load_optimizer_state_dict`](super::DataParallel::load_optimizer_state_dict), which use
    /// the single-device layout. Every optimizer of ferrite-optim updates element by element, so
    /// pieces step exactly as whole parameters do.
    Sharded,
}

/// A run of one parameter's elements (flattened) that one replica owns: one tensor of the
/// optimizer's list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    /// The parameter's index in the module's order.
    pub param: usize,
    /// The owner replica (an index into the devices).
    pub owner: usize,
    /// First element (of the flattened parameter).
    pub start: usize,
    /// Elements in the piece.
    pub len: usize,
    /// Whether the piece is the whole parameter (then the optimizer gets the parameter itself,
    /// with its shape).
    pub whole: bool,
}

/// The pieces of parameters of `numels` elements of `element_sizes` bytes each (in the module's
/// order) over `devices` replicas: one whole piece per parameter, except under
/// [`OwnerPolicy::Sharded`]. `splittable[j]` false keeps parameter `j` whole (a parameter that is
/// not contiguous cannot be viewed flat).
pub fn assign_pieces(
    numels: &[usize],
    element_sizes: &[usize],
    splittable: &[bool],
    devices: usize,
    policy: OwnerPolicy,
) -> Vec<Piece> {
    let whole = |param: usize, owner: usize| Piece { param, owner, start: 0, len: numels[param], whole: true };
    if policy != OwnerPolicy::Sharded {
        let bytes: Vec<usize> = numels.iter().zip(element_sizes).map(|(n, e)| n * e).collect();
        return assign_owners(&bytes, devices, policy).into_iter().enumerate().map(|(j, o)| whole(j, o)).collect();
    }
    let devices = devices.max(1);
    let total: usize = numels.iter().zip(element_sizes).map(|(n, e)| n * e).sum();
    let share = total.div_ceil(devices).max(1);
    let mut pieces = Vec::new();
    let mut offset = 0usize; // bytes before this parameter
    for (j, (&n, &e)) in numels.iter().zip(element_sizes).enumerate() {
        let e = e.max(1);
        let device_of = |byte: usize| (byte / share).min(devices - 1);
        if n == 0 || !splittable.get(j).copied().unwrap_or(false) {
            pieces.push(whole(j, device_of(offset)));
            offset += n * e;
            continue;
        }
        let mut start = 0usize;
        while start < n {
            let d = device_of(offset + start * e);
            // Elements of this parameter before the next cut (the last device takes the rest).
            let end = if d + 1 == devices { n } else { ((d + 1) * share - offset).div_ceil(e).clamp(start + 1, n) };
            pieces.push(Piece { param: j, owner: d, start, len: end - start, whole: start == 0 && end == n });
            start = end;
        }
        offset += n * e;
    }
    pieces
}

/// The owner replica of every whole parameter, for parameters of `bytes` (in the module's order)
/// over `devices` replicas ([`OwnerPolicy::Sharded`], which splits parameters, is given the
/// balanced whole-parameter owners here; see [`assign_pieces`]).
pub fn assign_owners(bytes: &[usize], devices: usize, policy: OwnerPolicy) -> Vec<usize> {
    let devices = devices.max(1);
    match policy {
        OwnerPolicy::Primary => vec![0; bytes.len()],
        OwnerPolicy::Balanced | OwnerPolicy::Sharded => {
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
    fn sharded_pieces_cut_the_flat_parameters_into_equal_runs() {
        // 64x128 weight, 128 bias, 128x128 weight, 128 bias, 10x128 weight, 10 bias (f32).
        let numels = [8192, 128, 16384, 128, 1280, 10];
        let pieces = assign_pieces(&numels, &[4; 6], &[true; 6], 4, OwnerPolicy::Sharded);
        let mut owned = [0usize; 4];
        for p in &pieces {
            owned[p.owner] += p.len;
        }
        let total: usize = numels.iter().sum();
        assert_eq!(owned.iter().sum::<usize>(), total);
        assert!(owned.iter().all(|&o| o.abs_diff(total / 4) <= 1), "{owned:?}");
        // Pieces cover every parameter in order, without gaps.
        for (j, &n) in numels.iter().enumerate() {
            let mine: Vec<&Piece> = pieces.iter().filter(|p| p.param == j).collect();
            assert_eq!(mine.first().map(|p| p.start), Some(0));
            assert_eq!(mine.iter().map(|p| p.len).sum::<usize>(), n);
            assert!(mine.windows(2).all(|w| w[0].start + w[0].len == w[1].start && w[0].owner < w[1].owner));
            assert_eq!(mine.len() == 1, mine[0].whole);
        }
        // The 128x128 weight crosses two cuts: three pieces.
        assert_eq!(pieces.iter().filter(|p| p.param == 2).count(), 3);
        // A parameter that cannot be split stays whole; other policies never split.
        let kept = assign_pieces(&numels, &[4; 6], &[true, true, false, true, true, true], 4, OwnerPolicy::Sharded);
        assert_eq!(kept.iter().filter(|p| p.param == 2).count(), 1);
        let whole = assign_pieces(&numels, &[4; 6], &[true; 6], 4, OwnerPolicy::Balanced);
        assert!(whole.len() == 6 && whole.iter().all(|p| p.whole));
    }

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
