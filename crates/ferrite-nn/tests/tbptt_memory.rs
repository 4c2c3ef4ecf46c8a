//! Truncated backpropagation through time keeps memory flat and gradients local, measured by the
//! allocator of a `sim` device (each run on its own `sim:1GiB:<n>`, so allocators and statistics
//! are separate):
//! - training an LSTM over a 1,000-step and a 10,000-step sequence in chunks of the same `k`
//!   reaches exactly the same peak allocated bytes (the carried state is detached at every
//!   chunk boundary, so no chunk's graph outlives it); the sequence itself stays on the host and
//!   each chunk is moved to the device as it is used;
//! - the gradients of one chunk equal bit for bit those of an explicit `k`-step run from the
//!   same starting state (nothing flows in from earlier chunks).
//!
//! `cargo test -p ferrite-nn --release --test tbptt_memory -- --nocapture` prints the figures.

use ferrite_memory::MemoryScope;
use ferrite_nn::tbptt::{Chunk, tbptt};
use ferrite_nn::{LSTM, Module, RecurrentConfig};
use ferrite_tensor::{DType, Device, Generator, Tensor, no_grad};

const BATCH: usize = 4;
const INPUT: usize = 8;
const HIDDEN: usize = 32;
const K: usize = 50;

fn model(d: &Device) -> LSTM {
    LSTM::from_config(RecurrentConfig::new(INPUT, HIDDEN).num_layers(2), d, &mut Generator::new(11)).unwrap()
}

fn sequence(steps: usize) -> Tensor {
    Tensor::randn_with(&[steps, BATCH, INPUT], DType::F32, &Device::Cpu, &mut Generator::new(12)).unwrap()
}

/// One chunk of training: forward from `state`, loss, backward; returns the final state.
/// An LSTM's `(h, c)`.
type State = (Tensor, Tensor);

fn refs(s: &Option<State>) -> Option<(&Tensor, &Tensor)> {
    s.as_ref().map(|(h, c)| (h, c))
}

fn chunk_step(lstm: &LSTM, seq: &Tensor, chunk: Chunk, state: &Option<State>, d: &Device) -> State {
    let x = chunk.of(seq, 0).unwrap().to_device(d).unwrap();
    let (y, state) = lstm.forward_with_state(&x, refs(state)).unwrap();
    y.square().unwrap().mean().unwrap().backward().unwrap();
    state
}

/// SGD on every parameter, then free the gradients.
fn sgd(lstm: &LSTM) {
    let _g = no_grad();
    for p in lstm.parameters() {
        let step = p.grad().unwrap().mul_scalar(0.05).unwrap();
        p.sub_(&step).unwrap();
    }
    lstm.zero_grad().unwrap();
}

/// Peak allocated bytes above the model's parameters while training over `steps` steps.
fn train_peak(steps: usize, sim: usize) -> u64 {
    let d = Device::parse(&format!("sim:1GiB:{sim}")).unwrap();
    let lstm = model(&d);
    let seq = sequence(steps);
    let scope = MemoryScope::new(format!("tbptt over {steps} steps"), &d).quiet();
    let last = tbptt(steps, K, None, |chunk, state: Option<State>| {
        let s = chunk_step(&lstm, &seq, chunk, &state, &d);
        sgd(&lstm);
        Ok(Some(s))
    })
    .unwrap();
    let report = scope.finish();
    assert_eq!(last.unwrap().0.shape(), [2, BATCH, HIDDEN]);
    println!("{report}");
    report.peak_above_entry()
}

#[test]
fn peak_memory_does_not_grow_with_the_sequence() {
    let short = train_peak(1_000, 21);
    let long = train_peak(10_000, 22);
    println!(
        "TBPTT, 2-layer LSTM {INPUT}->{HIDDEN}, batch {BATCH}, chunks of {K} steps: peak allocated above entry {short} B over 1,000 steps, {long} B over 10,000 steps"
    );
    assert!(short > 0);
    assert_eq!(short, long, "the peak must not depend on the sequence length");
}

#[test]
fn a_chunks_gradients_equal_an_explicit_k_step_run() {
    let d = Device::Cpu;
    let seq = sequence(4 * K);
    let lstm = model(&d);
    let target = 2;
    let mut captured: Vec<Vec<f32>> = Vec::new();
    let mut start_state: Option<State> = None;
    tbptt(4 * K, K, None, |chunk, state: Option<State>| {
        if chunk.index == target {
            start_state = state.clone();
        }
        let s = chunk_step(&lstm, &seq, chunk, &state, &d);
        if chunk.index == target {
            captured = lstm.parameters().iter().map(|p| p.grad().unwrap().to_vec::<f32>().unwrap()).collect();
        }
        lstm.zero_grad().unwrap();
        Ok(Some(s))
    })
    .unwrap();
    // The state at the chunk's start, computed again chunk by chunk without a graph.
    let mut state: Option<State> = None;
    {
        let _g = no_grad();
        for t in 0..target {
            let x = seq.narrow(0, t * K, K).unwrap();
            state = Some(lstm.forward_with_state(&x, refs(&state)).unwrap().1);
        }
    }
    let state = state.unwrap();
    let carried = start_state.unwrap();
    assert_eq!(state.0.to_vec::<f32>().unwrap(), carried.0.to_vec::<f32>().unwrap());
    assert!(carried.0.grad_fn().is_none() && !carried.0.requires_grad(), "the carried state is detached");
    // An explicit k-step run from it.
    let x = seq.narrow(0, target * K, K).unwrap();
    let (y, _) = lstm.forward_with_state(&x, Some((&state.0, &state.1))).unwrap();
    y.square().unwrap().mean().unwrap().backward().unwrap();
    let explicit: Vec<Vec<f32>> =
        lstm.parameters().iter().map(|p| p.grad().unwrap().to_vec::<f32>().unwrap()).collect();
    assert_eq!(captured.len(), 8);
    for (i, (a, b)) in captured.iter().zip(&explicit).enumerate() {
        assert!(a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()), "parameter {i}: chunk gradients differ");
    }
    println!("chunk {target}'s gradients equal an explicit {K}-step run bit for bit ({} parameters)", captured.len());
}
