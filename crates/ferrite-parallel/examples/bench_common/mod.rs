//! What `ddp_bench` and `zero_bench` share, so the two compare the same thing: the model (two
//! causal transformer blocks and a linear head), each rank's batch, and how a step's time is
//! reduced over the runs (median) and over the ranks (the slowest). The model announces its
//! blocks (`blocks.0`, `blocks.1`, then `head`) with `ferrite_nn::mark_layer`, as every built-in
//! and HF model does, so ZeRO-3 can gather them one at a time.
#![allow(dead_code)]

use ferrite_nn::{Linear, Module, TransformerBlock, TransformerConfig};
use ferrite_parallel::distributed::Comm;
use ferrite_tensor::{DType, Device, Generator, Tensor};

pub const D_MODEL: usize = 128;
pub const SEQ: usize = 64;
pub const LOCAL_BATCH: usize = 8;
/// Steps run before timing starts.
pub const WARMUP: usize = 2;

pub type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// Two transformer blocks and a linear head.
#[derive(Clone)]
pub struct Blocks {
    blocks: Vec<TransformerBlock>,
    head: Linear,
    training: bool,
}

impl Module for Blocks {
    fn type_name(&self) -> &'static str {
        "Blocks"
    }
    fn forward(&self, x: &Tensor) -> ferrite_nn::Result<Tensor> {
        let mut h = x.clone();
        for (i, b) in self.blocks.iter().enumerate() {
            ferrite_nn::mark_layer(&format!("blocks.{i}"));
            h = b.forward(&h)?;
        }
        ferrite_nn::mark_layer("head");
        self.head.forward(&h)
    }
    fn children(&self) -> Vec<(String, &dyn Module)> {
        let mut c: Vec<(String, &dyn Module)> =
            self.blocks.iter().enumerate().map(|(i, b)| (format!("blocks.{i}"), b as &dyn Module)).collect();
        c.push(("head".into(), &self.head));
        c
    }
    fn children_mut(&mut self) -> Vec<(String, &mut dyn Module)> {
        let mut c: Vec<(String, &mut dyn Module)> =
            self.blocks.iter_mut().enumerate().map(|(i, b)| (format!("blocks.{i}"), b as &mut dyn Module)).collect();
        c.push(("head".into(), &mut self.head));
        c
    }
    fn is_training(&self) -> bool {
        self.training
    }
    fn set_own_training(&mut self, training: bool) {
        self.training = training;
    }
}

/// The benchmarked model; the same weights on every rank and in every replica.
pub fn model() -> Res<Blocks> {
    let mut g = Generator::new(1);
    let cfg = TransformerConfig::new(D_MODEL, 4).dim_feedforward(4 * D_MODEL).dropout(0.0).causal(true);
    Ok(Blocks {
        blocks: vec![
            TransformerBlock::new_with(cfg.clone(), &Device::Cpu, &mut g)?,
            TransformerBlock::new_with(cfg, &Device::Cpu, &mut g)?,
        ],
        head: Linear::new_with(D_MODEL, D_MODEL, true, &Device::Cpu, &mut g)?,
        training: true,
    })
}

/// This rank's inputs and regression targets, `[LOCAL_BATCH, SEQ, D_MODEL]` each (different
/// on every rank, as data-parallel batches are).
pub fn rank_batch(rank: usize) -> Res<(Tensor, Tensor)> {
    let mut g = Generator::new(100 + rank as u64);
    let x = Tensor::randn_with(&[LOCAL_BATCH, SEQ, D_MODEL], DType::F32, &Device::Cpu, &mut g)?;
    let y = Tensor::randn_with(&[LOCAL_BATCH, SEQ, D_MODEL], DType::F32, &Device::Cpu, &mut g)?;
    Ok((x, y))
}

pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// The largest of every rank's value (how long a synchronized step took).
pub fn slowest(comm: &Comm, v: f64) -> Res<f64> {
    Ok(comm.all_gather_f64(vec![v])?.into_iter().fold(0.0, f64::max))
}
