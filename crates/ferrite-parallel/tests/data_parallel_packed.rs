//! Packed sequences inside DataParallel: an LSTM fed `pack_padded_sequence` on every replica
//! returns the whole batch's `total_length` steps, although the replicas see different longest
//! sequences, so outputs gather (PyTorch's replicas each unpack to their own longest and the
//! gather fails); forward and gradients equal the single-device run.

use ferrite_memory::{Device, select_devices};
use ferrite_nn::{LSTM, Module, RecurrentConfig, pack_padded_sequence, pad_packed_sequence};
use ferrite_parallel::DataParallel;
use ferrite_tensor::{DType, Generator, Tensor};

/// Five sequences padded to 6 steps; over two devices the shards are lengths [2, 3, 6] (longest 6)
/// and [1, 4] (longest 4).
const LENGTHS: [usize; 5] = [2, 3, 6, 1, 4];

fn lstm() -> LSTM {
    let mut g = Generator::new(11);
    LSTM::from_config(RecurrentConfig::new(3, 4).batch_first(true), &Device::Cpu, &mut g).unwrap()
}

fn input() -> Tensor {
    let mut g = Generator::new(12);
    Tensor::randn_with(&[5, 6, 3], DType::F32, &Device::Cpu, &mut g).unwrap()
}

fn close(a: &[f32], b: &[f32], what: &str) {
    ferrite_test_support::assert_slices_close(what, a, b, 1e-5, 1e-5);
}

#[test]
fn every_replica_returns_total_length_steps_and_the_outputs_gather() {
    let devices = select_devices(&Device::parse("sim:h100-80gb").unwrap(), Some("0,1")).unwrap();
    let dp = DataParallel::new(lstm(), &devices).unwrap();
    let x = input();
    // What PyTorch's replicas would do: each unpacks to its own longest sequence.
    let own: Vec<usize> = [&LENGTHS[..3], &LENGTHS[3..]]
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let shard = x.narrow(0, if i == 0 { 0 } else { 3 }, l.len()).unwrap();
            let p = pack_padded_sequence(&shard, l, true, false).unwrap();
            let (y, _) = lstm().forward_packed(&p, None).unwrap();
            pad_packed_sequence(&y, true, 0.0, None).unwrap().0.shape()[1]
        })
        .collect();
    assert_eq!(own, vec![6, 4], "the shards' longest sequences differ");

    let (y, lengths) = dp.forward_packed(&x, &LENGTHS, |m, p| Ok(m.forward_packed(p, None)?.0)).unwrap();
    assert_eq!(y.shape(), [5, 6, 4]);
    assert_eq!(lengths, LENGTHS);
    assert_eq!(y.device(), &devices[0]);

    let single = lstm();
    let p = pack_padded_sequence(&x, &LENGTHS, true, false).unwrap();
    let (want, _) = pad_packed_sequence(&single.forward_packed(&p, None).unwrap().0, true, 0.0, None).unwrap();
    close(&y.to_vec::<f32>().unwrap(), &want.to_vec::<f32>().unwrap(), "gathered output");
}

#[test]
fn training_on_packed_sequences_equals_the_single_device_gradients() {
    let devices = select_devices(&Device::parse("sim:a100-80gb").unwrap(), Some("0,1")).unwrap();
    let dp = DataParallel::new(lstm(), &devices).unwrap();
    let x = input();
    let target = Tensor::ones(&[5, 6, 4], DType::F32, &Device::Cpu).unwrap();
    // Mean over samples of the summed squared error on the valid steps (padding is 0 in both).
    let loss = |out: &Tensor, t: &Tensor, mask: &Tensor, n: usize| -> ferrite_parallel::Result<Tensor> {
        Ok(out.sub(t)?.mul(mask)?.square()?.sum()?.mul_scalar(1.0 / n as f64)?)
    };
    let mask_of = |lengths: &[usize], device: &Device| {
        let v: Vec<f32> = lengths
            .iter()
            .flat_map(|&l| (0..6).flat_map(move |t| std::iter::repeat_n(if t < l { 1.0 } else { 0.0 }, 4)))
            .collect();
        Tensor::from_vec(v, &[lengths.len(), 6, 4], device).unwrap()
    };
    let step = dp
        .forward_backward_sequences(&[&x, &target], &LENGTHS, |m, s| {
            let lengths = s.lengths.as_deref().unwrap_or_default();
            let p = pack_padded_sequence(&s.tensors[0], lengths, true, false)?;
            let (out, _) = s.pad_packed(&m.forward_packed(&p, None)?.0, 0.0)?;
            assert_eq!(out.shape()[1], 6, "replica {} unpacks to total_length", s.replica);
            loss(&out, &s.tensors[1], &mask_of(lengths, &s.device), s.samples)
        })
        .unwrap();
    assert_eq!(step.replicas.len(), 2);

    let single = lstm();
    let p = pack_padded_sequence(&x, &LENGTHS, true, false).unwrap();
    let (out, _) = pad_packed_sequence(&single.forward_packed(&p, None).unwrap().0, true, 0.0, None).unwrap();
    let l = loss(&out, &target, &mask_of(&LENGTHS, &Device::Cpu), 5).unwrap();
    l.backward().unwrap();
    assert!((step.loss - l.item().unwrap()).abs() < 1e-4, "{} vs {}", step.loss, l.item().unwrap());
    // The reduced gradients live on each parameter's owner: the tensors `dp.parameters()` gives.
    let names = dp.module().named_parameters().into_iter().map(|(n, _)| n);
    for ((name, ours), theirs) in names.zip(dp.parameters()).zip(single.parameters()) {
        close(
            &ours.grad().unwrap().to_vec::<f32>().unwrap(),
            &theirs.grad().unwrap().to_vec::<f32>().unwrap(),
            &format!("grad of {name}"),
        );
    }
}
