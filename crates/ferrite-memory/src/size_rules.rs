//! PyTorch's size arithmetic: how a request is rounded and how big a segment it causes.
//!
//! These numbers are what make ferrite's `allocated`/`reserved` figures comparable with what a
//! PyTorch user sees on a real GPU, so they are kept bit-for-bit identical to
//! `c10/cuda/CUDACachingAllocator.cpp` (`round_size`, `get_allocation_size`, `should_split`).

/// All sizes are rounded to a multiple of this (PyTorch `kMinBlockSize`).
pub const MIN_BLOCK_SIZE: u64 = 512;
/// Largest request served from the small pool (PyTorch `kSmallSize`, 1 MiB).
pub const SMALL_SIZE: u64 = 1 << 20;
/// Segment size of the small pool (PyTorch `kSmallBuffer`, 2 MiB).
pub const SMALL_BUFFER: u64 = 2 << 20;
/// Requests below this (and above [`SMALL_SIZE`]) get a [`LARGE_BUFFER`] segment (10 MiB).
pub const MIN_LARGE_ALLOC: u64 = 10 << 20;
/// Segment size for mid-sized large requests (PyTorch `kLargeBuffer`, 20 MiB).
pub const LARGE_BUFFER: u64 = 20 << 20;
/// Granularity of segments for requests of 10 MiB and more (PyTorch `kRoundLarge`, 2 MiB).
pub const ROUND_LARGE: u64 = 2 << 20;
/// Number of power-of-two intervals in the `roundup_power2_divisions` table (1 MiB .. 64 GiB).
pub const ROUNDUP_POWER2_INTERVALS: usize = 16;
/// Requests at or above this are refused outright, like PyTorch's "more than 1EB" check.
pub const MAX_REQUEST: u64 = 1 << 60;

/// Round a request to the size the allocator will hand out.
///
/// `divisions` is the `roundup_power2_divisions` table of the active configuration.
pub fn round_size(size: u64, divisions: &[u32; ROUNDUP_POWER2_INTERVALS]) -> u64 {
    if size < MIN_BLOCK_SIZE {
        return MIN_BLOCK_SIZE;
    }
    let d = u64::from(divisions[power2_interval(size)]);
    if d > 1 && size > MIN_BLOCK_SIZE * d {
        roundup_power2_next_division(size, d)
    } else {
        size.div_ceil(MIN_BLOCK_SIZE) * MIN_BLOCK_SIZE
    }
}

/// Index into the divisions table: `log2(size) - log2(1 MiB)`, clamped to `[0, 15]`.
pub fn power2_interval(size: u64) -> usize {
    let log = 63 - size.max(1).leading_zeros() as i64;
    (log - 20).clamp(0, ROUNDUP_POWER2_INTERVALS as i64 - 1) as usize
}

/// Round `size` up to the next of `divisions` equal steps between two powers of two
/// (1200 with 4 divisions → 1280).
pub fn roundup_power2_next_division(size: u64, divisions: u64) -> u64 {
    if size.is_power_of_two() {
        return size;
    }
    let floor = 1u64 << (63 - size.leading_zeros());
    let step = floor >> (63 - divisions.max(1).leading_zeros());
    if step == 0 {
        return floor << 1;
    }
    let rounded_floor = size & !(step - 1);
    if rounded_floor == size { size } else { rounded_floor + step }
}

/// Whether a rounded size belongs to the small pool.
#[inline]
pub fn is_small(size: u64) -> bool {
    size <= SMALL_SIZE
}

/// Size of the segment that a (rounded) request makes the allocator reserve when nothing cached
/// fits: 2 MiB for the small pool, 20 MiB below 10 MiB, otherwise the request rounded up to 2 MiB.
pub fn allocation_size(size: u64) -> u64 {
    if size <= SMALL_SIZE {
        SMALL_BUFFER
    } else if size < MIN_LARGE_ALLOC {
        LARGE_BUFFER
    } else {
        size.div_ceil(ROUND_LARGE) * ROUND_LARGE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OFF: [u32; ROUNDUP_POWER2_INTERVALS] = [0; ROUNDUP_POWER2_INTERVALS];

    #[test]
    fn rounds_to_512_bytes() {
        assert_eq!(round_size(0, &OFF), 512);
        assert_eq!(round_size(1, &OFF), 512);
        assert_eq!(round_size(512, &OFF), 512);
        assert_eq!(round_size(513, &OFF), 1024);
        assert_eq!(round_size(614_400, &OFF), 614_400);
        assert_eq!(round_size(1_000_001, &OFF), 1_000_448);
    }

    #[test]
    fn power2_divisions_round_up_to_the_next_division() {
        assert_eq!(roundup_power2_next_division(1200, 4), 1280);
        assert_eq!(roundup_power2_next_division(1024, 4), 1024);
        assert_eq!(roundup_power2_next_division(1025, 2), 1536);
        // step would be 0: falls back to the next power of two
        assert_eq!(roundup_power2_next_division(3, 4), 4);
        let four = [4u32; ROUNDUP_POWER2_INTERVALS];
        // 1 MiB + 1 byte with 4 divisions → 1.25 MiB
        assert_eq!(round_size((1 << 20) + 1, &four), 1_310_720);
        // small sizes: size <= 512*d keeps 512-byte rounding
        assert_eq!(round_size(1200, &four), 1536);
        // 5000 > 2048: power-of-two rounding applies (4096..8192 in 1024 steps)
        assert_eq!(round_size(5000, &four), 5120);
    }

    #[test]
    fn interval_index_is_clamped() {
        assert_eq!(power2_interval(1), 0);
        assert_eq!(power2_interval(1 << 20), 0);
        assert_eq!(power2_interval(3 << 20), 1);
        assert_eq!(power2_interval(256 << 20), 8);
        assert_eq!(power2_interval(1 << 40), 15);
    }

    #[test]
    fn segment_sizes_follow_pytorch() {
        assert_eq!(allocation_size(614_400), 2 << 20);
        assert_eq!(allocation_size(1 << 20), 2 << 20);
        assert_eq!(allocation_size((1 << 20) + 512), 20 << 20);
        assert_eq!(allocation_size(5 << 20), 20 << 20);
        assert_eq!(allocation_size((10 << 20) - 512), 20 << 20);
        assert_eq!(allocation_size(10 << 20), 10 << 20);
        assert_eq!(allocation_size(30 << 20), 30 << 20);
        assert_eq!(allocation_size((30 << 20) + 512), 32 << 20);
    }
}
