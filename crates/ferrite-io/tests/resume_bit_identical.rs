//! N steps, save, load, N more steps == 2N steps, bit for bit.
//!
//! ferrite-nn and ferrite-optim do not exist yet, so a small hand-written trainer stands in for
//! them: an MLP with dropout, Adam with bias correction, a dynamic loss scale (GradScaler's scale
//! and growth tracker), a decaying learning rate, a data-order RNG and a dropout RNG. Everything a
//! step depends on goes through one [`Checkpoint`] file; the resumed run must reproduce the
//! uninterrupted one exactly — also when it resumes on a simulated GPU, whose kernels are the CPU's.
//! A resume that forgets the RNG states must NOT reproduce it (the test can fail).

use ferrite_io::{Checkpoint, LoadOptions};
use ferrite_memory::Device;
use ferrite_tensor::{DType, Generator, Tensor, functional, no_grad};

const ROWS: usize = 64;
const IN: usize = 6;
const HID: usize = 16;
const OUT: usize = 3;
const BATCH: usize = 8;
const PARAMS: [&str; 4] = ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"];

struct Run {
    device: Device,
    params: Vec<Tensor>,
    exp_avg: Vec<Tensor>,
    exp_avg_sq: Vec<Tensor>,
    adam_step: i64,
    lr: f64,
    scale: f64,
    growth_tracker: i64,
    step: i64,
    data_rng: Generator,
    dropout_rng: Generator,
}

/// A fixed regression dataset (host memory, like a data loader's).
fn dataset() -> (Vec<f32>, Vec<f32>) {
    let mut g = Generator::new(1234);
    let x: Vec<f32> = (0..ROWS * IN).map(|_| g.normal_f64() as f32).collect();
    let y: Vec<f32> = (0..ROWS * OUT).map(|_| g.normal_f64() as f32).collect();
    (x, y)
}

fn fresh(device: &Device) -> Run {
    let mut init = Generator::new(7);
    let shapes: [&[usize]; 4] = [&[IN, HID], &[HID], &[HID, OUT], &[OUT]];
    let params: Vec<Tensor> = shapes
        .iter()
        .map(|s| Tensor::normal_with(s, 0.0, 0.3, DType::F32, device, &mut init).unwrap().requires_grad_(true).unwrap())
        .collect();
    let zeros = |p: &Tensor| Tensor::zeros(p.shape(), DType::F32, device).unwrap();
    Run {
        device: device.clone(),
        exp_avg: params.iter().map(zeros).collect(),
        exp_avg_sq: params.iter().map(zeros).collect(),
        params,
        adam_step: 0,
        lr: 0.05,
        scale: 1024.0,
        growth_tracker: 0,
        step: 0,
        data_rng: Generator::new(99),
        dropout_rng: Generator::new(5),
    }
}

fn train_step(r: &mut Run, data: &(Vec<f32>, Vec<f32>)) {
    let idx: Vec<usize> = (0..BATCH).map(|_| r.data_rng.below(ROWS as u64) as usize).collect();
    let xb: Vec<f32> = idx.iter().flat_map(|&i| data.0[i * IN..(i + 1) * IN].iter().copied()).collect();
    let yb: Vec<f32> = idx.iter().flat_map(|&i| data.1[i * OUT..(i + 1) * OUT].iter().copied()).collect();
    let x = Tensor::from_vec(xb, &[BATCH, IN], &r.device).unwrap();
    let y = Tensor::from_vec(yb, &[BATCH, OUT], &r.device).unwrap();
    let h = x.matmul(&r.params[0]).unwrap().add(&r.params[1]).unwrap().tanh().unwrap();
    let h = functional::dropout(&h, 0.2, true, &mut r.dropout_rng).unwrap();
    let out = h.matmul(&r.params[2]).unwrap().add(&r.params[3]).unwrap();
    let loss = functional::mse_loss(&out, &y).unwrap();
    loss.mul_scalar(r.scale).unwrap().backward().unwrap();

    let _g = no_grad();
    let grads: Vec<Tensor> = r.params.iter().map(|p| p.grad().unwrap().div_scalar(r.scale).unwrap()).collect();
    let finite = grads.iter().all(|g| g.to_vec::<f32>().unwrap().iter().all(|v| v.is_finite()));
    if finite {
        r.adam_step += 1;
        let (b1, b2, eps) = (0.9, 0.999, 1e-8);
        let c1 = 1.0 - f64::powi(b1, r.adam_step as i32);
        let c2 = 1.0 - f64::powi(b2, r.adam_step as i32);
        for (i, g) in grads.iter().enumerate() {
            r.exp_avg[i].mul_scalar_(b1).unwrap();
            r.exp_avg[i].add_scaled_(g, 1.0 - b1).unwrap();
            r.exp_avg_sq[i].mul_scalar_(b2).unwrap();
            r.exp_avg_sq[i].add_scaled_(&g.square().unwrap(), 1.0 - b2).unwrap();
            let denom = r.exp_avg_sq[i].div_scalar(c2).unwrap().sqrt().unwrap().add_scalar(eps).unwrap();
            let update = r.exp_avg[i].div(&denom).unwrap().mul_scalar(r.lr / c1).unwrap();
            r.params[i].sub_(&update).unwrap();
        }
        r.growth_tracker += 1;
        if r.growth_tracker == 3 {
            r.scale *= 2.0;
            r.growth_tracker = 0;
        }
    } else {
        r.scale *= 0.5;
        r.growth_tracker = 0;
    }
    for p in &r.params {
        p.set_grad(None).unwrap();
    }
    r.lr *= 0.97;
    r.step += 1;
}

fn save(r: &Run, path: &std::path::Path) {
    let mut c = Checkpoint::new();
    c.set_state_dict("model", PARAMS.iter().copied().zip(r.params.iter())).unwrap();
    for i in 0..r.params.len() {
        c.set_tensor(&format!("optimizer/state/{i}/exp_avg"), &r.exp_avg[i]).unwrap();
        c.set_tensor(&format!("optimizer/state/{i}/exp_avg_sq"), &r.exp_avg_sq[i]).unwrap();
    }
    c.set("optimizer/step", r.adam_step).unwrap();
    c.set("optimizer/lr", r.lr).unwrap();
    c.set("scaler/scale", r.scale).unwrap();
    c.set("scaler/growth_tracker", r.growth_tracker).unwrap();
    c.set("step", r.step).unwrap();
    c.set_generator("rng/data", &r.data_rng).unwrap();
    c.set_generator("rng/dropout", &r.dropout_rng).unwrap();
    c.save(path).unwrap();
}

fn resume(path: &std::path::Path, device: &Device, restore_rngs: bool) -> Run {
    let c = Checkpoint::load(path).unwrap();
    let opts = LoadOptions::new().device(device.clone());
    let model = c.state_dict("model", &opts).unwrap();
    let params = PARAMS.iter().map(|n| model.iter().find(|(k, _)| k == n).unwrap().1.clone()).collect::<Vec<_>>();
    assert!(params.iter().all(Tensor::requires_grad), "parameters come back requiring grad");
    let state = |i: usize, k: &str| c.tensor(&format!("optimizer/state/{i}/{k}"), &opts).unwrap();
    let mut r = fresh(device);
    r.exp_avg = (0..4).map(|i| state(i, "exp_avg")).collect();
    r.exp_avg_sq = (0..4).map(|i| state(i, "exp_avg_sq")).collect();
    r.params = params;
    r.adam_step = c.int("optimizer/step").unwrap();
    r.lr = c.float("optimizer/lr").unwrap();
    r.scale = c.float("scaler/scale").unwrap();
    r.growth_tracker = c.int("scaler/growth_tracker").unwrap();
    r.step = c.int("step").unwrap();
    if restore_rngs {
        c.restore_generator("rng/data", &mut r.data_rng).unwrap();
        c.restore_generator("rng/dropout", &mut r.dropout_rng).unwrap();
    }
    r
}

/// Every bit of state a step depends on: tensors, counters, float scalars, RNG states.
type Fingerprint = (Vec<Vec<u32>>, i64, u64, u64, i64, i64, [u8; 24], [u8; 24]);

fn fingerprint(r: &Run) -> Fingerprint {
    let bits = |ts: &[Tensor]| {
        ts.iter()
            .map(|t| t.to_vec::<f32>().unwrap().iter().map(|v| v.to_bits()).collect::<Vec<u32>>())
            .collect::<Vec<_>>()
    };
    let mut all = bits(&r.params);
    all.extend(bits(&r.exp_avg));
    all.extend(bits(&r.exp_avg_sq));
    (
        all,
        r.adam_step,
        r.lr.to_bits(),
        r.scale.to_bits(),
        r.growth_tracker,
        r.step,
        r.data_rng.state().to_bytes(),
        r.dropout_rng.state().to_bytes(),
    )
}

#[test]
fn n_plus_n_steps_with_save_and_resume_equal_2n_steps_bit_for_bit() {
    const N: usize = 12;
    let data = dataset();
    let mut straight = fresh(&Device::Cpu);
    for _ in 0..2 * N {
        train_step(&mut straight, &data);
    }
    let want = fingerprint(&straight);
    assert!(straight.scale > 1024.0, "the loss scale moved, so the scaler state is exercised");

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("last.ckpt");
    let mut first = fresh(&Device::Cpu);
    for _ in 0..N {
        train_step(&mut first, &data);
    }
    save(&first, &path);
    drop(first);

    let sim = Device::parse("sim:a100-40gb").unwrap();
    for device in [Device::Cpu, sim] {
        let mut resumed = resume(&path, &device, true);
        for _ in 0..N {
            train_step(&mut resumed, &data);
        }
        assert_eq!(resumed.params[0].device(), &device);
        assert!(fingerprint(&resumed) == want, "resumed run on {device} differs from the uninterrupted one");
    }

    // Without the RNG states the continuation differs: the test sees what a checkpoint lacks.
    let mut forgetful = resume(&path, &Device::Cpu, false);
    for _ in 0..N {
        train_step(&mut forgetful, &data);
    }
    assert!(fingerprint(&forgetful).0 != want.0, "a resume without RNG states should not match");
}
