//! Each memory-saving technique, measured by the allocator of its own `sim` device (tests run as
//! threads of one process; every `sim:1GiB:<n>` has its own allocator and statistics). The
//! figures are printed (`cargo test -p ferrite-nn --release --test memory_effects -- --nocapture`).

mod common;

use common::{assert_bits_equal, mib};
use ferrite_memory::allocator;
use ferrite_nn::{
    AttentionBackend, AttentionConfig, Checkpointed, Dropout, Linear, MSELoss, Module, MultiheadAttention, ReLU,
    Sequential, autocast, checkpoint, inference,
};
use ferrite_tensor::{DType, Device, Generator, Tensor, no_grad};

const WIDTH: usize = 256;
const BATCH: usize = 1024;
const LAYERS: usize = 8;

fn sim(n: usize) -> Device {
    Device::parse(&format!("sim:1GiB:{n}")).unwrap()
}

/// One block of the MLP: Linear → ReLU (→ Dropout).
fn block(d: &Device, g: &mut Generator, dropout: f64) -> Sequential {
    let mut b = Sequential::new().append(Linear::new_with(WIDTH, WIDTH, true, d, g).unwrap()).append(ReLU::new());
    if dropout > 0.0 {
        b.push(Dropout::new_with(dropout, g).unwrap());
    }
    b
}

/// An 8-block MLP grouped into segments of `segment` blocks (`Sequential` of `Sequential`s);
/// with `checkpointed`, every segment is wrapped in `Checkpointed` (same parameter names).
/// Built from the same seed, both variants have identical parameters and dropout streams.
fn mlp(d: &Device, seed: u64, dropout: f64, segment: usize, checkpointed: bool) -> Sequential {
    let mut g = Generator::new(seed);
    let mut m = Sequential::new();
    for _ in 0..LAYERS / segment {
        let mut seg = Sequential::new();
        for _ in 0..segment {
            seg.push(block(d, &mut g, dropout));
        }
        if checkpointed {
            m.push(Checkpointed::new(seg));
        } else {
            m.push(seg);
        }
    }
    m
}

/// Peak allocated bytes above the starting point while `f` runs.
fn peak_during<R>(d: &Device, f: impl FnOnce() -> R) -> (R, u64) {
    let a = allocator(d);
    let base = a.memory_allocated();
    a.reset_peak_memory_stats();
    let r = f();
    (r, a.max_memory_allocated() - base)
}

fn train_step(model: &Sequential, x: &Tensor) -> f64 {
    let y = model.forward(x).unwrap();
    let loss = MSELoss::new().forward(&y, &y.zeros_like().unwrap()).unwrap();
    loss.backward().unwrap();
    loss.item().unwrap()
}

#[test]
fn checkpointing_lowers_peak_and_keeps_gradients_bit_identical() {
    // Segments of two blocks: the graph keeps 4 segment inputs instead of every activation, and
    // backward recomputes one segment at a time.
    for (dev_index, dropout, max_ratio) in [(1, 0.0, 0.9), (2, 0.2, 0.6)] {
        let d = sim(dev_index);
        let x = Tensor::randn_with(&[BATCH, WIDTH], DType::F32, &d, &mut Generator::new(7)).unwrap();
        let plain = mlp(&d, 42, dropout, 2, false);
        let ckpt = mlp(&d, 42, dropout, 2, true);
        let (loss_p, peak_p) = peak_during(&d, || train_step(&plain, &x));
        let (loss_c, peak_c) = peak_during(&d, || train_step(&ckpt, &x));
        println!(
            "checkpointing, 8-layer MLP {BATCH}x{WIDTH} in 4 checkpointed segments, dropout {dropout}: peak allocated during forward+backward {:.2} MiB plain, {:.2} MiB checkpointed ({:.0}%)",
            mib(peak_p),
            mib(peak_c),
            100.0 * peak_c as f64 / peak_p as f64
        );
        assert!(
            (peak_c as f64) < max_ratio * peak_p as f64,
            "checkpointing should cut the peak below {max_ratio} of plain: {peak_c} vs {peak_p}"
        );
        assert_eq!(loss_p.to_bits(), loss_c.to_bits());
        let (gp, gc) = (plain.named_parameters(), ckpt.named_parameters());
        assert_eq!(gp.len(), 2 * LAYERS);
        for ((name, p), (name_c, c)) in gp.iter().zip(&gc) {
            assert_eq!(name, name_c);
            assert_bits_equal(name, &p.grad().unwrap(), &c.grad().unwrap());
        }
        // Replaying the dropout masks in backward left the generators where the forward left
        // them: the next step draws the same masks in both models.
        plain.zero_grad().unwrap();
        ckpt.zero_grad().unwrap();
        let (a, b) = {
            let _g = no_grad();
            (plain.forward(&x).unwrap(), ckpt.forward(&x).unwrap())
        };
        assert_bits_equal("second step output", &a, &b);
    }
}

#[test]
fn closure_checkpoint_of_segments_lowers_peak() {
    // The closure form: two checkpointed segments of four blocks, input requiring grad.
    let d = sim(3);
    let x = Tensor::randn_with(&[BATCH, WIDTH], DType::F32, &d, &mut Generator::new(8))
        .unwrap()
        .requires_grad_(true)
        .unwrap();
    let model = mlp(&d, 5, 0.1, 1, false);
    let (loss_p, peak_p) = peak_during(&d, || train_step(&model, &x));
    let gx = x.grad().unwrap();
    let grads: Vec<Tensor> = model.parameters().iter().map(|p| p.grad().unwrap()).collect();
    x.set_grad(None).unwrap();
    // A fresh copy from the same seed: same parameters, dropout streams at the same position.
    let model = mlp(&d, 5, 0.1, 1, false);
    let layers = model.clone().into_layers();
    let seg1 = Sequential::from_layers(layers[..4].to_vec());
    let seg2 = Sequential::from_layers(layers[4..].to_vec());
    let (loss_c, peak_c) = peak_during(&d, || {
        let h = checkpoint(move |xs| seg1.forward(&xs[0]), &[&x]).unwrap();
        let y = checkpoint(move |xs| seg2.forward(&xs[0]), &[&h]).unwrap();
        drop(h);
        let loss = MSELoss::new().forward(&y, &y.zeros_like().unwrap()).unwrap();
        loss.backward().unwrap();
        loss.item().unwrap()
    });
    println!(
        "checkpoint(closure), 2 segments of 4 blocks: peak {:.2} MiB plain, {:.2} MiB checkpointed",
        mib(peak_p),
        mib(peak_c)
    );
    assert!(peak_c < peak_p);
    assert_eq!(loss_p.to_bits(), loss_c.to_bits());
    assert_bits_equal("input grad", &gx, &x.grad().unwrap());
    for (i, (g, p)) in grads.iter().zip(model.parameters()).enumerate() {
        assert_bits_equal(&format!("param {i}"), g, &p.grad().unwrap());
    }
}

#[test]
fn bf16_autocast_lowers_activation_memory() {
    let d = sim(4);
    let model = mlp(&d, 11, 0.0, 1, false);
    // A larger batch, so the bf16 copies of the weights (kept for backward) weigh less.
    let x = Tensor::randn_with(&[2 * BATCH, WIDTH], DType::F32, &d, &mut Generator::new(9)).unwrap();
    let a = allocator(&d);
    // Peak during forward, and what stays allocated after it: the activations the graph keeps
    // for backward (plus the output).
    let base = a.memory_allocated();
    let (y32, peak32) = peak_during(&d, || model.forward(&x).unwrap());
    let held32 = a.memory_allocated() - base;
    let base = a.memory_allocated();
    let (y16, peak16) = peak_during(&d, || {
        let _ac = autocast(DType::BF16).unwrap();
        model.forward(&x).unwrap()
    });
    let held16 = a.memory_allocated() - base;
    println!(
        "autocast, 8-layer MLP {}x{WIDTH}: peak allocated during forward {:.2} MiB f32, {:.2} MiB bf16 ({:.0}%); activations kept for backward {:.2} MiB f32, {:.2} MiB bf16 ({:.0}%)",
        2 * BATCH,
        mib(peak32),
        mib(peak16),
        100.0 * peak16 as f64 / peak32 as f64,
        mib(held32),
        mib(held16),
        100.0 * held16 as f64 / held32 as f64
    );
    assert_eq!(y16.dtype(), DType::BF16);
    assert!(peak16 * 10 < peak32 * 9, "bf16 autocast should lower the forward peak: {peak16} vs {peak32}");
    assert!(
        held16 * 10 < held32 * 7,
        "bf16 activations (+ bf16 weight copies) should take well under 70% of f32's: {held16} vs {held32}"
    );
    // Numerically close, and the gradients reach the f32 parameters in f32.
    let (a, b) = (y32.to_vec_f64().unwrap(), y16.to_vec_f64().unwrap());
    let scale = a.iter().fold(0f64, |m, v| m.max(v.abs()));
    assert!(a.iter().zip(&b).all(|(p, q)| (p - q).abs() <= 0.05 * scale));
    drop(y32);
    let loss = {
        // The loss belongs inside the autocast region (it then runs in f32); backward outside.
        let _ac = autocast(DType::BF16).unwrap();
        MSELoss::new().forward(&y16, &y16.zeros_like().unwrap()).unwrap()
    };
    assert_eq!(loss.dtype(), DType::F32);
    loss.backward().unwrap();
    assert!(model.parameters().iter().all(|p| p.grad().unwrap().dtype() == DType::F32));
}

#[test]
fn chunked_attention_peak_is_below_naive_at_seq_1024() {
    let d = sim(5);
    let (seq, embed, heads) = (1024, 64, 4);
    let x = Tensor::randn_with(&[1, seq, embed], DType::F32, &d, &mut Generator::new(1))
        .unwrap()
        .requires_grad_(true)
        .unwrap();
    let run = |backend: AttentionBackend| {
        let attn = MultiheadAttention::new_with(
            AttentionConfig::new(embed, heads).causal(true).backend(backend),
            &d,
            &mut Generator::new(2),
        )
        .unwrap();
        x.set_grad(None).unwrap();
        let (y, peak) = peak_during(&d, || {
            let y = attn.forward(&x).unwrap();
            y.sum().unwrap().backward().unwrap();
            y
        });
        (y, x.grad().unwrap(), peak)
    };
    let (y_naive, g_naive, peak_naive) = run(AttentionBackend::Math);
    let (y_chunk, g_chunk, peak_chunk) = run(AttentionBackend::Chunked { chunk: 128 });
    println!(
        "attention, seq {seq}, {heads} heads x {}: peak allocated during forward+backward {:.2} MiB naive (math), {:.2} MiB chunked (128 rows)",
        embed / heads,
        mib(peak_naive),
        mib(peak_chunk)
    );
    assert!(peak_chunk * 2 < peak_naive, "{peak_chunk} vs {peak_naive}");
    for (what, a, b) in [("output", &y_naive, &y_chunk), ("input grad", &g_naive, &g_chunk)] {
        let (a, b) = (a.to_vec_f64().unwrap(), b.to_vec_f64().unwrap());
        assert!(
            a.iter().zip(&b).all(|(p, q)| (p - q).abs() <= 1e-4 + 1e-4 * p.abs()),
            "{what} differs between backends"
        );
    }
}

#[test]
fn eval_no_grad_inference_keeps_no_activations() {
    let d = sim(6);
    let a = allocator(&d);
    // A flat Sequential (Linear, ReLU, Dropout) x 8, so no enclosing forward holds a block input.
    let mut g = Generator::new(3);
    let mut model = Sequential::new();
    for _ in 0..LAYERS {
        model.push(Linear::new_with(WIDTH, WIDTH, true, &d, &mut g).unwrap());
        model.push(ReLU::new());
        model.push(Dropout::new_with(0.1, &mut g).unwrap());
    }
    let x = Tensor::randn_with(&[BATCH, WIDTH], DType::F32, &d, &mut Generator::new(4)).unwrap();
    let act = (BATCH * WIDTH * 4) as u64;

    let base = a.memory_allocated();
    let (y, peak_inf) = peak_during(&d, || inference(&mut model, |m| m.forward(&x)).unwrap());
    let held_inf = a.memory_allocated() - base;
    assert!(model.is_training(), "inference restores the previous mode");
    assert!(!y.requires_grad());
    drop(y);

    let (y, peak_train) = peak_during(&d, || model.forward(&x).unwrap());
    let held_train = a.memory_allocated() - base;
    println!(
        "inference, 8-layer MLP {BATCH}x{WIDTH} (activation {:.2} MiB): eval+no_grad holds {:.2} MiB after forward (peak {:.2}); train-mode forward holds {:.2} MiB (peak {:.2})",
        mib(act),
        mib(held_inf),
        mib(peak_inf),
        mib(held_train),
        mib(peak_train)
    );
    assert_eq!(held_inf, act, "only the output survives an inference forward");
    assert!(
        peak_inf <= 2 * act,
        "at most a layer's input and output are alive at once (the bias is added in place): {peak_inf}"
    );
    assert!(held_train >= LAYERS as u64 * act, "a training forward keeps the activations for backward");
    drop(y);
    assert_eq!(a.memory_allocated(), base, "dropping the output frees the graph");
}

#[test]
fn models_build_and_train_on_meta_with_the_allocations_of_a_real_device() {
    // The planner runs a step on `meta` to predict memory: same allocations, no data. (The only
    // test of this binary on `meta`, whose allocator is process-wide.)
    let step = |d: &Device| {
        let a = allocator(d);
        let base = a.memory_allocated();
        a.reset_peak_memory_stats();
        let mut g = Generator::new(0);
        let cfg = ferrite_nn::TransformerConfig::new(64, 4).dim_feedforward(128).dropout(0.1);
        let block = ferrite_nn::TransformerBlock::new_with(cfg, d, &mut g).unwrap();
        let x = Tensor::zeros(&[2, 32, 64], DType::F32, d).unwrap();
        let y = Checkpointed::new(block.clone()).forward(&x).unwrap();
        y.sum().unwrap().backward().unwrap();
        let grads: u64 = block.parameters().iter().map(|p| p.grad().unwrap().nbytes() as u64).sum();
        (a.max_memory_allocated() - base, grads)
    };
    let (peak_meta, grads_meta) = step(&Device::Meta);
    let (peak_sim, grads_sim) = step(&sim(7));
    println!("transformer block step: peak {:.3} MiB on meta, {:.3} MiB on sim", mib(peak_meta), mib(peak_sim));
    assert_eq!(grads_meta, grads_sim);
    assert_eq!(peak_meta, peak_sim);
}
