//! Behaviour of `RNN`, `GRU`, `LSTM` and the packing functions beyond the PyTorch numbers
//! (ferrite-conformance's check runs those on every device): PyTorch's parameter names and initialisation range,
//! packed and padded runs agreeing, sorted/unsorted indices (final states in the caller's
//! order), unbatched input, initial states and their gradients, inter-layer dropout, and every
//! bad input as a typed error naming the layer, the argument and the numbers — never a panic.

use ferrite_nn::{
    GRU, LSTM, Module, NnError, Nonlinearity, PackedSequence, RNN, RecurrentConfig, pack_padded_sequence,
    pack_sequence, pad_packed_sequence,
};
use ferrite_tensor::{DType, Device, Generator, Tensor};

fn randn(shape: &[usize], g: &mut Generator) -> Tensor {
    Tensor::randn_with(shape, DType::F32, &Device::Cpu, g).unwrap()
}

/// `e` is exactly `want`, every field (NnError carries tensor errors, so it has no `PartialEq`;
/// the derived `Debug` prints every field).
fn same(e: &NnError, want: NnError) {
    assert_eq!(format!("{e:?}"), format!("{want:?}"), "{e}");
}

fn values(t: &Tensor) -> Vec<f32> {
    t.to_vec::<f32>().unwrap()
}

fn assert_near(what: &str, a: &[f32], b: &[f32]) {
    assert_eq!(a.len(), b.len(), "{what}: length");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!((x - y).abs() <= 1e-5 + 1e-5 * y.abs(), "{what}: element {i}: {x} vs {y}");
    }
}

#[test]
fn parameter_names_shapes_and_initialisation_follow_pytorch() {
    let mut g = Generator::new(1);
    let cfg = RecurrentConfig::new(5, 6).num_layers(2).bidirectional(true);
    let lstm = LSTM::from_config(cfg.clone(), &Device::Cpu, &mut g).unwrap();
    let sd = lstm.state_dict();
    let keys: Vec<&str> = sd.keys().collect();
    assert_eq!(
        keys,
        [
            "weight_ih_l0",
            "weight_hh_l0",
            "bias_ih_l0",
            "bias_hh_l0",
            "weight_ih_l0_reverse",
            "weight_hh_l0_reverse",
            "bias_ih_l0_reverse",
            "bias_hh_l0_reverse",
            "weight_ih_l1",
            "weight_hh_l1",
            "bias_ih_l1",
            "bias_hh_l1",
            "weight_ih_l1_reverse",
            "weight_hh_l1_reverse",
            "bias_ih_l1_reverse",
            "bias_hh_l1_reverse"
        ]
    );
    assert_eq!(sd.get("weight_ih_l0").unwrap().shape(), [24, 5]);
    assert_eq!(sd.get("weight_ih_l1").unwrap().shape(), [24, 12], "layer 1 reads both directions");
    assert_eq!(sd.get("weight_hh_l1_reverse").unwrap().shape(), [24, 6]);
    let bound = 1.0 / 6f64.sqrt();
    for (name, p) in lstm.named_parameters() {
        let v = p.to_vec_f64().unwrap();
        assert!(v.iter().all(|x| x.abs() <= bound), "{name} outside ±1/sqrt(hidden)");
        assert!(v.iter().any(|x| x.abs() > bound * 0.5), "{name} looks unfilled");
    }
    let gru = GRU::from_config(RecurrentConfig::new(3, 4).bias(false), &Device::Cpu, &mut g).unwrap();
    let keys: Vec<String> = gru.state_dict().keys().map(String::from).collect();
    assert_eq!(keys, ["weight_ih_l0", "weight_hh_l0"]);
    assert_eq!(gru.params()[0].weight_ih.shape(), [12, 3]);
    let rnn =
        RNN::from_config(RecurrentConfig::new(3, 4).nonlinearity(Nonlinearity::Relu), &Device::Cpu, &mut g).unwrap();
    assert_eq!(rnn.params()[0].weight_hh.shape(), [4, 4]);
    assert_eq!(rnn.type_name(), "RNN");
    // A GRU or LSTM cannot be relu, a layer needs a hidden size, dropout is a probability.
    for bad in [
        GRU::from_config(RecurrentConfig::new(3, 4).nonlinearity(Nonlinearity::Relu), &Device::Cpu, &mut g).err(),
        GRU::from_config(RecurrentConfig::new(3, 0), &Device::Cpu, &mut g).err(),
        GRU::from_config(RecurrentConfig::new(3, 4).dropout(1.5), &Device::Cpu, &mut g).err(),
    ] {
        let e = bad.expect("a bad configuration is an error");
        assert!(matches!(e, NnError::InvalidConfig { layer: "GRU", .. }), "{e:?}");
    }
}

#[test]
fn packed_runs_match_padded_runs_of_each_sequence_in_the_callers_order() {
    let mut g = Generator::new(2);
    let lengths = [2usize, 5, 3];
    let x = randn(&[3, 5, 4], &mut g); // batch-first, padded to 5 steps
    for bidirectional in [false, true] {
        let cfg = RecurrentConfig::new(4, 3).num_layers(2).bidirectional(bidirectional).batch_first(true);
        let lstm = LSTM::from_config(cfg, &Device::Cpu, &mut Generator::new(3)).unwrap();
        let packed = pack_padded_sequence(&x, &lengths, true, false).unwrap();
        assert_eq!(packed.batch_sizes(), [3, 3, 2, 1, 1]);
        assert_eq!(packed.sorted_indices().unwrap(), [1, 2, 0]);
        assert_eq!(packed.unsorted_indices().unwrap(), [2, 0, 1]);
        let (out, (h_n, c_n)) = lstm.forward_packed(&packed, None).unwrap();
        let (padded, back) = pad_packed_sequence(&out, true, 0.0, None).unwrap();
        assert_eq!(back, lengths);
        let dirs = if bidirectional { 2 } else { 1 };
        for (b, &len) in lengths.iter().enumerate() {
            // The same sequence alone, unpadded.
            let xb = x.narrow(0, b, 1).unwrap().narrow(1, 0, len).unwrap();
            let (yb, (hb, cb)) = lstm.forward_with_state(&xb, None).unwrap();
            let got = padded.narrow(0, b, 1).unwrap();
            assert_near(&format!("seq {b} output"), &values(&got.narrow(1, 0, len).unwrap()), &values(&yb));
            assert!(values(&got.narrow(1, len, 5 - len).unwrap()).iter().all(|&v| v == 0.0), "padding is zero");
            for (what, all, one) in [("h_n", &h_n, &hb), ("c_n", &c_n, &cb)] {
                assert_eq!(all.shape(), [2 * dirs, 3, 3]);
                assert_near(&format!("seq {b} {what}"), &values(&all.narrow(1, b, 1).unwrap()), &values(one));
            }
        }
    }
}

#[test]
fn initial_state_is_read_in_the_callers_order_and_gets_gradients() {
    let mut g = Generator::new(4);
    let gru = GRU::from_config(RecurrentConfig::new(2, 3).batch_first(true), &Device::Cpu, &mut g).unwrap();
    let x = randn(&[3, 4, 2], &mut g);
    let lengths = [1usize, 4, 2];
    let h0 = randn(&[1, 3, 3], &mut g).requires_grad_(true).unwrap();
    let packed = pack_padded_sequence(&x, &lengths, true, false).unwrap();
    let (_, h_n) = gru.forward_packed(&packed, Some(&h0)).unwrap();
    h_n.sum().unwrap().backward().unwrap();
    assert_eq!(h0.grad().unwrap().shape(), [1, 3, 3]);
    for (b, &len) in lengths.iter().enumerate() {
        let xb = x.narrow(0, b, 1).unwrap().narrow(1, 0, len).unwrap();
        let hb = h0.detach().narrow(1, b, 1).unwrap();
        let (_, h_b) = gru.forward_with_state(&xb, Some(&hb)).unwrap();
        assert_near(&format!("seq {b} h_n"), &values(&h_n.narrow(1, b, 1).unwrap()), &values(&h_b));
    }
    // A padded run from a state carries gradients to it too, and an unbatched sequence works.
    let h0 = randn(&[1, 3], &mut g).requires_grad_(true).unwrap();
    let xs = randn(&[5, 2], &mut g);
    let (y, h) = gru.forward_with_state(&xs, Some(&h0)).unwrap();
    assert_eq!((y.shape(), h.shape()), (&[5usize, 3][..], &[1usize, 3][..]));
    y.sum().unwrap().backward().unwrap();
    assert!(h0.grad().unwrap().to_vec::<f32>().unwrap().iter().any(|v| *v != 0.0));
}

#[test]
fn pack_sequence_and_enforce_sorted() {
    let mut g = Generator::new(5);
    let seqs = [randn(&[4, 2], &mut g), randn(&[2, 2], &mut g), randn(&[1, 2], &mut g)];
    let sorted = pack_sequence(&seqs, true).unwrap();
    assert_eq!(sorted.batch_sizes(), [3, 2, 1, 1]);
    assert!(sorted.sorted_indices().is_none() && sorted.batch_first().is_none());
    let shuffled = [seqs[1].clone(), seqs[0].clone(), seqs[2].clone()];
    let p = pack_sequence(&shuffled, false).unwrap();
    assert_eq!(p.sorted_indices().unwrap(), [1, 0, 2]);
    assert_eq!(values(p.data()), values(sorted.data()), "same packed rows once sorted");
    assert_eq!(p.lengths(), [2, 4, 1]);
    let (padded, lengths) = pad_packed_sequence(&p, false, -7.0, Some(6)).unwrap();
    assert_eq!(padded.shape(), [6, 3, 2]);
    assert_eq!(lengths, [2, 4, 1]);
    assert_eq!(values(&padded.narrow(1, 0, 1).unwrap().narrow(0, 0, 2).unwrap()), values(&seqs[1]));
    assert!(values(&padded.narrow(0, 4, 2).unwrap()).iter().all(|&v| v == -7.0));
    // A list-packed batch fits layers of either layout.
    for batch_first in [false, true] {
        let rnn = RNN::from_config(RecurrentConfig::new(2, 3).batch_first(batch_first), &Device::Cpu, &mut g).unwrap();
        let (out, h) = rnn.forward_packed(&p, None).unwrap();
        assert_eq!((out.data().shape(), h.shape()), (&[7usize, 3][..], &[1usize, 3, 3][..]));
    }
    // Hand-built packed sequences are checked.
    let e = PackedSequence::new(randn(&[5, 2], &mut g), vec![2, 3], None).unwrap_err();
    assert!(matches!(e, NnError::InvalidBatchSizes { .. }), "{e}");
    let e = PackedSequence::new(randn(&[5, 2], &mut g), vec![3, 2], Some(vec![0, 0, 1])).unwrap_err();
    assert!(matches!(e, NnError::InvalidIndices { batch: 3, .. }), "{e}");
}

#[test]
fn dropout_between_layers_only_in_training() {
    let mut g = Generator::new(6);
    let cfg = RecurrentConfig::new(4, 8).num_layers(3).dropout(0.5);
    let mut lstm = LSTM::from_config(cfg, &Device::Cpu, &mut g).unwrap();
    let x = randn(&[6, 2, 4], &mut g);
    let a = values(&lstm.forward(&x).unwrap());
    let b = values(&lstm.forward(&x).unwrap());
    assert_ne!(a, b, "training: fresh dropout masks each call");
    lstm.eval();
    let c = values(&lstm.forward(&x).unwrap());
    let d = values(&lstm.forward(&x).unwrap());
    assert_eq!(c, d, "eval: no dropout");
    // The last layer's output is never dropped: with one layer, dropout changes nothing.
    let mut one = LSTM::from_config(RecurrentConfig::new(4, 8).dropout(0.9), &Device::Cpu, &mut g).unwrap();
    let t = values(&one.forward(&x).unwrap());
    one.eval();
    assert_eq!(t, values(&one.forward(&x).unwrap()));
}

#[test]
fn bad_inputs_are_typed_errors() {
    let mut g = Generator::new(7);
    let lstm =
        LSTM::from_config(RecurrentConfig::new(4, 3).num_layers(2).batch_first(true), &Device::Cpu, &mut g).unwrap();
    let x = randn(&[2, 5, 4], &mut g);

    let e = pack_padded_sequence(&x, &[3, 5], true, true).unwrap_err();
    same(&e, NnError::UnsortedLengths { op: "pack_padded_sequence", lengths: vec![3, 5] });
    println!("{e}");
    let e = pack_padded_sequence(&x, &[5, 0], true, false).unwrap_err();
    same(&e, NnError::EmptySequence { op: "pack_padded_sequence", what: "sequence", index: 1 });
    println!("{e}");
    let e = pack_padded_sequence(&x, &[6, 2], true, false).unwrap_err();
    assert!(matches!(e, NnError::LengthTooLong { index: 0, length: 6, steps: 5, .. }), "{e}");
    println!("{e}");
    let e = pack_padded_sequence(&x, &[5, 2, 1], true, false).unwrap_err();
    assert!(matches!(e, NnError::LengthsCount { lengths: 3, batch: 2, .. }), "{e}");
    println!("{e}");
    let e = pack_sequence(&[], false).unwrap_err();
    assert!(matches!(e, NnError::NoSequences { .. }), "{e}");

    let packed = pack_padded_sequence(&x, &[5, 2], true, true).unwrap();
    let e = pad_packed_sequence(&packed, true, 0.0, Some(4)).unwrap_err();
    same(&e, NnError::TotalLengthTooShort { total_length: 4, longest: 5 });
    println!("{e}");

    // A packed batch whose source layout is not the layer's.
    let seq_first = pack_padded_sequence(&x.transpose(0, 1).unwrap(), &[5, 2], false, true).unwrap();
    let e = lstm.forward_packed(&seq_first, None).unwrap_err();
    same(&e, NnError::PackedLayout { layer: "LSTM", packed_batch_first: false, layer_batch_first: true });
    println!("{e}");

    // Wrong feature size, padded and packed; wrong rank.
    let e = lstm.forward_with_state(&randn(&[2, 5, 3], &mut g), None).unwrap_err();
    same(&e, NnError::InputShape { layer: "LSTM", shape: vec![2, 5, 3], layout: "batch, seq", input_size: 4 });
    println!("{e}");
    let e = lstm.forward_with_state(&randn(&[2, 5, 4, 1], &mut g), None).unwrap_err();
    assert!(matches!(e, NnError::InputShape { .. }), "{e}");
    let narrow = pack_padded_sequence(&randn(&[2, 5, 3], &mut g), &[5, 2], true, true).unwrap();
    let e = lstm.forward_packed(&narrow, None).unwrap_err();
    same(&e, NnError::PackedShape { layer: "LSTM", shape: vec![7, 3], input_size: 4 });
    println!("{e}");

    // Wrong initial states.
    let (h_bad, c_ok) = (randn(&[1, 2, 3], &mut g), randn(&[2, 2, 3], &mut g));
    let e = lstm.forward_with_state(&x, Some((&h_bad, &c_ok))).unwrap_err();
    same(&e, NnError::StateShape { layer: "LSTM", arg: "h_0", shape: vec![1, 2, 3], expected: vec![2, 2, 3] });
    println!("{e}");
    let (h_ok, c_bad) = (randn(&[2, 2, 3], &mut g), randn(&[2, 3, 3], &mut g));
    let e = lstm.forward_packed(&packed, Some((&h_ok, &c_bad))).unwrap_err();
    assert!(matches!(e, NnError::StateShape { arg: "c_0", .. }), "{e}");
    let gru = GRU::from_config(RecurrentConfig::new(4, 3), &Device::Cpu, &mut g).unwrap();
    let e = gru.forward_with_state(&x, Some(&randn(&[1, 2, 3], &mut g))).unwrap_err();
    same(&e, NnError::StateShape { layer: "GRU", arg: "h_0", shape: vec![1, 2, 3], expected: vec![1, 5, 3] });
    // Empty sequences.
    let e = gru.forward_with_state(&randn(&[0, 2, 4], &mut g), None).unwrap_err();
    assert!(matches!(e, NnError::EmptySequence { .. }), "{e}");
}
