//! Your own model and your own data, trained by ferrite's `Trainer`:
//! `cargo run --release --example custom_model [-- --epochs N]`.
//!
//! The model is defined here (a small residual MLP), the data too (points on two interleaved
//! spirals, a classic non-linear toy problem); the trainer brings accumulation, clipping, the
//! per-epoch memory line, evaluation, the best checkpoint and a resumable training checkpoint.
use ferrite::prelude::*;

/// A user-defined module: input projection, one residual block, a head. (Modules are `Clone`:
/// clones share the parameters, which activation checkpointing and DataParallel rely on.)
#[derive(Clone)]
struct SpiralNet {
    input: Linear,
    block: Sequential,
    head: Linear,
    training: bool,
}

impl SpiralNet {
    fn new(hidden: usize, rng: &RngHandle, g: &mut Generator) -> ferrite::nn::Result<SpiralNet> {
        let cpu = Device::Cpu;
        Ok(SpiralNet {
            input: Linear::new_with(2, hidden, true, &cpu, g)?,
            block: Sequential::new()
                .append(Linear::new_with(hidden, hidden, true, &cpu, g)?)
                .append(ReLU::new())
                .append(Dropout::with_rng(0.1, rng.clone())?)
                .append(Linear::new_with(hidden, hidden, true, &cpu, g)?),
            head: Linear::new_with(hidden, 2, true, &cpu, g)?,
            training: true,
        })
    }
}

impl Module for SpiralNet {
    fn type_name(&self) -> &'static str {
        "SpiralNet"
    }
    fn forward(&self, x: &Tensor) -> ferrite::nn::Result<Tensor> {
        let h = self.input.forward(x)?.relu()?;
        let h = h.add(&self.block.forward(&h)?)?.relu()?;
        self.head.forward(&h)
    }
    fn children(&self) -> Vec<(String, &dyn Module)> {
        vec![("input".into(), &self.input), ("block".into(), &self.block), ("head".into(), &self.head)]
    }
    fn children_mut(&mut self) -> Vec<(String, &mut dyn Module)> {
        vec![("input".into(), &mut self.input), ("block".into(), &mut self.block), ("head".into(), &mut self.head)]
    }
    fn is_training(&self) -> bool {
        self.training
    }
    fn set_own_training(&mut self, training: bool) {
        self.training = training;
    }
}

/// `n` points of two interleaved spirals with a little noise: `(x, y)` and the arm (0 or 1).
fn spirals(n: usize, seed: u64) -> Vec<(Tensor, usize)> {
    let mut g = Generator::new(seed);
    (0..n)
        .map(|i| {
            let arm = i % 2;
            let t = g.uniform_f32() * 3.0 * std::f32::consts::PI;
            let sign = if arm == 0 { 1.0 } else { -1.0 };
            let (x, y) = (sign * t * t.cos() / 10.0, sign * t * t.sin() / 10.0);
            let jitter = (g.uniform_f32() - 0.5) * 0.05;
            (Tensor::from_vec(vec![x + jitter, y - jitter], &[2], &Device::Cpu).expect("a 2-vector"), arm)
        })
        .collect()
}

fn main() -> Result<(), TrainError> {
    let epochs = std::env::args()
        .skip_while(|a| a != "--epochs")
        .nth(1)
        .map(|n| {
            n.parse::<usize>().map_err(|_| TrainError::InvalidArgument {
                flag: "epochs",
                value: n.clone(),
                expected: "a whole number of at least 1",
            })
        })
        .transpose()?
        .unwrap_or(40);
    let out = std::env::temp_dir();
    let (best, checkpoint) = (out.join("spiral-best.safetensors"), out.join("spiral.ckpt"));

    let mut loader = DataLoader::builder(InMemory::new(spirals(2048, 1)))
        .batch_size(64)
        .shuffle(true)
        .seed(0)
        .collate(StackCollate)
        .build()?;
    let val = spirals(512, 2);
    let rng = RngHandle::new(7);
    let model = SpiralNet::new(64, &rng, &mut Generator::new(0))?;
    let opt = Adam::named(model.named_parameters(), AdamConfig::adamw(1e-2).weight_decay(1e-4))?;

    let mut trainer = Trainer::builder(model, opt)
        .epochs(epochs)
        .accum_steps(2)
        .clip_grad_norm(1.0)
        .dropout_rng(rng)
        .save_checkpoint(&checkpoint)
        .keep_best(&best, "accuracy", Goal::Maximize)
        .evaluate(move |m: &mut SpiralNet| {
            let xs: Vec<&Tensor> = val.iter().map(|(x, _)| x).collect();
            let x = Tensor::stack(&xs, 0)?;
            let pred = inference(m, |m| m.forward(&x))?.argmax(1, false)?.to_vec::<i64>()?;
            let hits = pred.iter().zip(&val).filter(|(p, (_, arm))| **p == *arm as i64).count();
            Ok(Metrics::new().with("accuracy", hits as f64 / val.len() as f64))
        })
        .on_epoch(|e| {
            if e.epoch % 10 == 0 || e.epoch == e.epochs {
                println!(
                    "epoch {:>3}/{}  loss {:.4}  val acc {:5.2}%  | {}",
                    e.epoch,
                    e.epochs,
                    e.mean_loss,
                    100.0 * e.eval.get("accuracy").unwrap_or(f64::NAN),
                    e.memory_line
                );
            }
        })
        .build()?;
    let loss_fn = CrossEntropyLoss::new();
    let report = trainer.fit(&mut loader, move |m: &SpiralNet, (x, y): &(Tensor, Tensor)| {
        let loss = loss_fn.forward(&m.forward(x)?, y)?;
        Ok(StepOutput::new(loss, y.numel()))
    })?;
    let (acc, epoch) = report.best.unwrap_or((f64::NAN, 0));
    println!(
        "best validation accuracy {:.2}% after epoch {epoch} ({} steps, {:.1}s); best weights {}, checkpoint {}",
        100.0 * acc,
        report.steps,
        report.elapsed.as_secs_f64(),
        best.display(),
        checkpoint.display()
    );
    Ok(())
}
