//! The standard image augmentation (`ferrite train --augment`): a random crop of the image
//! padded with zeros on every side, then a horizontal flip half of the time — torchvision's
//! `RandomCrop(size, padding=p)` followed by `RandomHorizontalFlip()`.
//!
//! Why here and why on bytes: the random choices come from the generator `Dataset::get`
//! receives, the sample's own stream for the epoch, so an augmented epoch is the same for 0, 1
//! or 8 workers (the PyTorch footgun of workers sharing a random state cannot happen); and the
//! crop works on the raw pixels before normalisation, so the padding is black, as torchvision's
//! `fill=0` before `ToTensor`/`Normalize`.

use ferrite_tensor::Generator;

/// Random crop with zero padding and random horizontal flip.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Augment {
    /// Pixels of zero padding on each side before the crop back to the original size.
    pub pad: usize,
    /// Mirror left-right with probability 1/2.
    pub flip: bool,
}

impl Augment {
    /// The usual setting for `height × width` images: a padding of an eighth of the shorter side
    /// (4 px for 28×28 and 32×32, 1 px for 8×8), at least 1, and flips.
    pub fn standard(height: usize, width: usize) -> Augment {
        let side = height.min(width);
        Augment { pad: ((side + 4) / 8).max(1), flip: true }
    }

    /// `raw` (one image, `[channels, height, width]` bytes) cropped and flipped as drawn from
    /// `rng`: three draws per image, whatever the outcome.
    pub fn apply(&self, raw: &[u8], shape: [usize; 3], rng: &mut Generator) -> Vec<u8> {
        let [channels, height, width] = shape;
        let span = 2 * self.pad as u64 + 1;
        // The window's top-left corner in the padded image, and the flip: always drawn, so the
        // stream position after a sample does not depend on what was drawn.
        let dy = rng.below(span) as isize - self.pad as isize;
        let dx = rng.below(span) as isize - self.pad as isize;
        let flip = self.flip && rng.next_u32() & 1 == 1;
        let mut out = vec![0u8; channels * height * width];
        for c in 0..channels {
            let plane = &raw[c * height * width..(c + 1) * height * width];
            let out_plane = &mut out[c * height * width..(c + 1) * height * width];
            for y in 0..height {
                let sy = y as isize + dy;
                if sy < 0 || sy >= height as isize {
                    continue;
                }
                let row = &plane[sy as usize * width..(sy as usize + 1) * width];
                for x in 0..width {
                    let ox = if flip { width - 1 - x } else { x };
                    let sx = x as isize + dx;
                    if sx >= 0 && sx < width as isize {
                        out_plane[y * width + ox] = row[sx as usize];
                    }
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn padding_scales_with_the_image() {
        assert_eq!(Augment::standard(28, 28).pad, 4);
        assert_eq!(Augment::standard(32, 32).pad, 4);
        assert_eq!(Augment::standard(8, 8).pad, 1);
        assert_eq!(Augment::standard(64, 96).pad, 8);
        assert_eq!(Augment::standard(1, 1).pad, 1);
    }

    #[test]
    fn no_padding_no_flip_is_the_identity_and_flip_mirrors() {
        let raw: Vec<u8> = (1..=12).collect();
        let mut g = Generator::new(0);
        assert_eq!(Augment { pad: 0, flip: false }.apply(&raw, [2, 2, 3], &mut g), raw);
        // With pad 0 a flip is the only change: find a seed that flips.
        let flipped = (0..64)
            .map(|s| Augment { pad: 0, flip: true }.apply(&raw, [2, 2, 3], &mut Generator::new(s)))
            .find(|o| *o != raw)
            .unwrap();
        assert_eq!(flipped, [3, 2, 1, 6, 5, 4, 9, 8, 7, 12, 11, 10]);
    }

    #[test]
    fn crops_keep_pixels_or_pad_with_zeros_and_are_reproducible() {
        let raw: Vec<u8> = (1..=16).collect();
        let a = Augment { pad: 1, flip: false };
        let mut shifted = 0;
        for seed in 0..50 {
            let out = a.apply(&raw, [1, 4, 4], &mut Generator::new(seed));
            assert_eq!(out, a.apply(&raw, [1, 4, 4], &mut Generator::new(seed)));
            // Every output pixel is either padding or an input pixel, and a shift keeps order.
            assert!(out.iter().all(|&p| p == 0 || raw.contains(&p)));
            assert!(out.iter().filter(|&&p| p != 0).count() >= 9);
            shifted += usize::from(out != raw);
        }
        assert!(shifted > 30, "{shifted} of 50 crops moved the image");
    }
}
