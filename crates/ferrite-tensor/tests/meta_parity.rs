//! A `meta` run makes exactly the allocations of a real run: the peak allocated bytes of an MLP's
//! forward + backward on `meta` equal those on a real (sim) device. Its own test binary, so no
//! other test touches the process-wide meta allocator meanwhile.

use ferrite_memory::allocator;
use ferrite_tensor::functional::{CrossEntropyOptions, cross_entropy};
use ferrite_tensor::{DType, Device, Generator, Tensor};

fn mlp_step_peak(d: &Device) -> (u64, u64) {
    let a = allocator(d);
    let mut g = Generator::new(0);
    let w1 = Tensor::randn_with(&[100, 64], DType::F32, d, &mut g).unwrap().requires_grad_(true).unwrap();
    let b1 = Tensor::zeros(&[100], DType::F32, d).unwrap().requires_grad_(true).unwrap();
    let w2 = Tensor::randn_with(&[10, 100], DType::F32, d, &mut g).unwrap().requires_grad_(true).unwrap();
    let x = Tensor::randn_with(&[32, 64], DType::F32, d, &mut g).unwrap();
    let target = Tensor::from_vec((0..32).map(|i| i % 10).collect::<Vec<i64>>(), &[32], d).unwrap();
    let base = a.memory_allocated();
    a.reset_peak_memory_stats();
    let h = x.linear(&w1, Some(&b1)).unwrap().relu().unwrap();
    let logits = h.linear(&w2, None).unwrap();
    let loss = cross_entropy(&logits, &target, &CrossEntropyOptions::default()).unwrap();
    loss.backward().unwrap();
    let peak = a.max_memory_allocated() - base;
    drop((h, logits, loss));
    let after = a.memory_allocated() - base;
    (peak, after)
}

#[test]
fn meta_run_reports_the_same_peak_as_a_real_run() {
    let real = mlp_step_peak(&Device::parse("sim:1GiB:0").unwrap());
    let meta = mlp_step_peak(&Device::Meta);
    println!(
        "peak allocated during an MLP step: sim {} B, meta {} B (grads held after: {} / {} B)",
        real.0, meta.0, real.1, meta.1
    );
    assert!(real.0 > 0);
    assert_eq!(real, meta);
}

/// A half-precision product takes only its output from the device allocator (the CPU backend
/// widens into workspace of its own, as cuBLAS takes half operands on cuda:N), so a `sim` plan
/// of a bf16 model counts what a CUDA run allocates; and the result has the bits of widening to
/// f32 first, one f32 product, one rounding. (Its own sim device: the test above uses index 0.)
#[test]
fn half_products_allocate_only_their_output_and_round_once() {
    let d = Device::parse("sim:1GiB:1").unwrap();
    let a = allocator(&d);
    let mut g = Generator::new(5);
    for dtype in [DType::BF16, DType::F16] {
        let cases = [
            (vec![64, 96], vec![96, 48], false),
            (vec![3, 17, 65], vec![65, 33], true),
            (vec![2, 1, 9, 40], vec![3, 40, 7], false),
        ];
        for (sa, sb, transpose_b) in cases {
            let x = Tensor::randn_with(&sa, DType::F32, &d, &mut g).unwrap().to_dtype(dtype).unwrap();
            let y = if transpose_b {
                let mut t = sb.clone();
                t.reverse();
                Tensor::randn_with(&t, DType::F32, &d, &mut g).unwrap().to_dtype(dtype).unwrap().t().unwrap()
            } else {
                Tensor::randn_with(&sb, DType::F32, &d, &mut g).unwrap().to_dtype(dtype).unwrap()
            };
            let base = a.memory_allocated();
            a.reset_peak_memory_stats();
            let z = x.matmul(&y).unwrap();
            let peak = a.max_memory_allocated() - base;
            // The output's block (the allocator rounds sizes up to 512 bytes) is all there is.
            let (held, out) = (a.memory_allocated() - base, (z.numel() * dtype.size_in_bytes()) as u64);
            assert!(held >= out && held < out + 512, "{dtype:?}: {held} B held for a {out}-byte output");
            assert_eq!(peak, held, "{dtype:?} {sa:?} x {sb:?}: peak {peak} B for a {out}-byte output");
            let want = x
                .to_dtype(DType::F32)
                .unwrap()
                .matmul(&y.to_dtype(DType::F32).unwrap())
                .unwrap()
                .to_dtype(dtype)
                .unwrap();
            let bits = |t: &Tensor| t.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
            assert_eq!(bits(&z), bits(&want), "{dtype:?} {sa:?} x {sb:?}");
        }
    }
}
