//! What the `Trainer` costs a training run: the digits epoch of `ferrite train`'s default demo
//! (MLP 64-128-128-10, AdamW lr 1e-3 wd 0.01, batch 64, shuffled), once through `Trainer::fit`
//! and once through the plain loop a user would write by hand (forward, loss, backward, step,
//! zero_grad), alternating in one process so both see the same machine.
//!
//! `cargo bench -p ferrite-train --bench trainer_overhead -- [ROUNDS] [EPOCHS]` (default 15 × 20):
//! prints the median epoch time of each and their ratio.
use std::time::Instant;

use ferrite_data::{DatasetKind, builtin_dataset};
use ferrite_models::{MlpSpec, build_mlp};
use ferrite_nn::{CrossEntropyLoss, Module, RngHandle};
use ferrite_optim::{Adam, AdamConfig, Optimizer};
use ferrite_tensor::{Device, Generator, Tensor};
use ferrite_train::{StepOutput, Trainer};

type Loader =
    ferrite_data::DataLoader<ferrite_data::ImageClassification, ferrite_data::Tensors<ferrite_data::ImageCollate>>;

fn setup() -> (ferrite_models::Mlp, Adam, Loader) {
    let splits = builtin_dataset(DatasetKind::Digits).expect("the built-in digits");
    let spec = MlpSpec { inputs: 64, hidden: 128, layers: 2, classes: 10, dropout: 0.0, checkpoint_activations: false };
    let model = build_mlp(&spec, &Device::Cpu, &mut Generator::new(1), &RngHandle::new(2)).expect("the MLP");
    let opt = Adam::named(model.named_parameters(), AdamConfig::adamw(1e-3).weight_decay(0.01)).expect("AdamW");
    let loader = splits.train.tensor_loader(64).shuffle(true).seed(3).build().expect("a loader");
    (model, opt, loader)
}

/// Median seconds per epoch of `epochs` epochs by hand.
fn by_hand(epochs: usize) -> f64 {
    let (model, mut opt, mut loader) = setup();
    let loss_fn = CrossEntropyLoss::new();
    let mut times = Vec::new();
    for _ in 0..epochs {
        let t = Instant::now();
        for batch in loader.epoch() {
            let (x, y) = batch.expect("a batch");
            let loss = loss_fn.forward(&model.forward(&x).expect("forward"), &y).expect("loss");
            loss.backward().expect("backward");
            opt.step().expect("step");
            opt.zero_grad().expect("zero_grad");
            std::hint::black_box(loss.item().expect("the loss"));
        }
        times.push(t.elapsed().as_secs_f64());
    }
    median(times)
}

/// Median seconds per epoch of `epochs` epochs through `Trainer::fit`.
fn with_trainer(epochs: usize) -> f64 {
    let (model, opt, mut loader) = setup();
    let loss_fn = CrossEntropyLoss::new();
    let mut trainer = Trainer::builder(model, opt).epochs(epochs).build().expect("a trainer");
    let report = trainer
        .fit(&mut loader, |m: &ferrite_models::Mlp, (x, y): &(Tensor, Tensor)| {
            Ok(StepOutput::new(loss_fn.forward(&m.forward(x)?, y)?, y.numel()))
        })
        .expect("fit");
    median(report.epochs.iter().map(|e| e.elapsed.as_secs_f64()).collect())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let (rounds, epochs) = (args.first().copied().unwrap_or(15), args.get(1).copied().unwrap_or(20));
    let (mut hand, mut trainer) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        // Alternate which goes first, so neither always runs on a warmer machine.
        if round % 2 == 0 {
            hand.push(by_hand(epochs));
            trainer.push(with_trainer(epochs));
        } else {
            trainer.push(with_trainer(epochs));
            hand.push(by_hand(epochs));
        }
    }
    let ratios: Vec<f64> = trainer.iter().zip(&hand).map(|(t, h)| t / h).collect();
    let (h, t) = (median(hand.clone()), median(trainer.clone()));
    println!("digits epoch, {rounds} rounds x {epochs} epochs (median of per-round medians):");
    println!("  by hand        {:.3} ms", h * 1e3);
    println!("  Trainer::fit   {:.3} ms", t * 1e3);
    println!(
        "  Trainer / hand {:.3} (per-round ratios {:.3} .. {:.3})",
        median(ratios.clone()),
        ratios.iter().cloned().fold(f64::INFINITY, f64::min),
        ratios.iter().cloned().fold(f64::NEG_INFINITY, f64::max)
    );
}
