//! Every recurrent layer runs on `meta` with exactly the allocations of a real run: a training
//! step through an LSTM (2 layers, bidirectional, dropout), a packed GRU and a relu RNN from an
//! initial state gives the same output shapes, the same peak allocated bytes and the same
//! bytes left in gradients on `meta` as on a `sim` device — which is what lets the planner
//! predict a recurrent model's memory without running it. Its own test binary, so no other test
//! touches the process-wide meta allocator meanwhile.

use ferrite_memory::allocator;
use ferrite_nn::{GRU, LSTM, Module, Nonlinearity, RNN, RecurrentConfig, pack_padded_sequence, pad_packed_sequence};
use ferrite_tensor::{DType, Device, Generator, Tensor};

fn step(d: &Device) -> (u64, u64, Vec<Vec<usize>>) {
    let a = allocator(d);
    let mut g = Generator::new(0);
    let lstm = LSTM::from_config(
        RecurrentConfig::new(16, 32).num_layers(2).bidirectional(true).dropout(0.2).batch_first(true),
        d,
        &mut g,
    )
    .unwrap();
    let gru = GRU::from_config(RecurrentConfig::new(16, 24).bidirectional(true).batch_first(true), d, &mut g).unwrap();
    let rnn = RNN::from_config(RecurrentConfig::new(16, 8).nonlinearity(Nonlinearity::Relu), d, &mut g).unwrap();
    let x = Tensor::randn_with(&[5, 12, 16], DType::F32, d, &mut g).unwrap();
    let h0 = Tensor::zeros(&[1, 5, 8], DType::F32, d).unwrap().requires_grad_(true).unwrap();
    let params = lstm.parameter_bytes() + gru.parameter_bytes() + rnn.parameter_bytes();
    let base = a.memory_allocated();
    a.reset_peak_memory_stats();
    let mut shapes = Vec::new();
    let (y1, (h1, c1)) = lstm.forward_with_state(&x, None).unwrap();
    let packed = pack_padded_sequence(&x, &[12, 3, 7, 1, 12], true, false).unwrap();
    let (p2, h2) = gru.forward_packed(&packed, None).unwrap();
    let (y2, _) = pad_packed_sequence(&p2, true, 0.0, Some(14)).unwrap();
    let (y3, h3) = rnn.forward_with_state(&x.transpose(0, 1).unwrap(), Some(&h0)).unwrap();
    for t in [&y1, &h1, &c1, &y2, &h2, &y3, &h3] {
        shapes.push(t.shape().to_vec());
    }
    let loss = y1.sum().unwrap().add(&y2.sum().unwrap()).unwrap().add(&y3.sum().unwrap()).unwrap();
    loss.backward().unwrap();
    let peak = a.max_memory_allocated() - base;
    drop((y1, h1, c1, p2, h2, y2, y3, h3, loss, packed));
    let after = a.memory_allocated() - base;
    assert!(h0.grad().is_some());
    println!("{d}: parameters {params} B, peak above them {peak} B, gradients held after {after} B");
    (peak, after, shapes)
}

#[test]
fn recurrent_layers_run_on_meta_with_the_allocations_of_a_real_device() {
    let real = step(&Device::parse("sim:1GiB:0").unwrap());
    let meta = step(&Device::Meta);
    assert!(real.0 > 0);
    assert_eq!(
        real.2,
        vec![
            vec![5, 12, 64],
            vec![4, 5, 32],
            vec![4, 5, 32],
            vec![5, 14, 48],
            vec![2, 5, 24],
            vec![12, 5, 8],
            vec![1, 5, 8]
        ]
    );
    assert_eq!(meta, real);
}
