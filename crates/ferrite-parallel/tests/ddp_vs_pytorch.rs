//! DistributedDataParallel against PyTorch itself: `tests/data/ddp_gloo/` holds a 2-rank DDP run
//! made by real `torch.distributed` (gloo backend, CPU) with the script that made it
//! (`make_fixture.py`): the initial parameters, each rank's rows, each rank's loss before every
//! step, and the parameters after the run, for SGD with momentum and for AdamW.
//!
//! - `two_ferrite_ranks_match_pytorch_gloo_ddp` runs ferrite's DistributedDataParallel under
//!   `mpirun -np 2` (this test binary's `mpi_worker` entry) from the same parameters on the same
//!   per-rank rows, and checks every rank's losses and final parameters against PyTorch's. Without
//!   MPI (or without the `mpi` feature) it skips loudly, unless FERRITE_REQUIRE_SYSTEM_DEPS=1,
//!   where it fails.
//! - `one_process_on_the_concatenated_batches_matches_pytorch_ddp` needs no MPI: a plain ferrite
//!   run on the two ranks' rows concatenated takes the same steps (DDP averages equal-sized local
//!   mean losses' gradients, which is the gradient of the mean over the concatenated batch).
//!
//! Every expected number comes from the fixture files; the test holds only the tolerance.

use std::path::{Path, PathBuf};
use std::process::Command;

use ferrite_io::LoadOptions;
use ferrite_nn::{Linear, Module, Sequential, StateDict, Tanh};
use ferrite_optim::{Adam, AdamConfig, Optimizer, Sgd, SgdConfig};
use ferrite_tensor::{Device, Generator, Tensor};
use serde_json::Value;

/// Largest accepted `|ferrite - pytorch| / (1 + |pytorch|)`: f32 arithmetic whose reductions run
/// in a different order (matrix products, the all-reduce's sum) over a few steps.
const TOLERANCE: f32 = 2e-5;

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/ddp_gloo")
}

/// The PyTorch run: its settings (manifest.json) and its tensors (ddp_gloo.safetensors).
struct Fixture {
    manifest: Value,
    tensors: Vec<(String, Tensor)>,
}

impl Fixture {
    fn load() -> Fixture {
        let dir = fixture_dir();
        let text = std::fs::read_to_string(dir.join("manifest.json")).expect("manifest.json of the DDP fixture");
        let manifest: Value = serde_json::from_str(&text).expect("manifest.json is JSON");
        let tensors = ferrite_io::load_state_dict(dir.join("ddp_gloo.safetensors"), &LoadOptions::default())
            .expect("ddp_gloo.safetensors loads");
        Fixture { manifest, tensors }
    }

    fn tensor(&self, name: &str) -> &Tensor {
        &self.tensors.iter().find(|(n, _)| n == name).unwrap_or_else(|| panic!("fixture has no tensor {name}")).1
    }

    fn usize(&self, key: &str) -> usize {
        self.manifest[key].as_u64().unwrap_or_else(|| panic!("manifest.json: no whole number `{key}`")) as usize
    }

    fn steps(&self) -> usize {
        self.usize("steps")
    }

    fn local_batch(&self) -> usize {
        self.usize("local_batch")
    }

    fn world_size(&self) -> usize {
        self.usize("world_size")
    }

    /// PyTorch's parameter names, in the module's order.
    fn param_names(&self) -> Vec<String> {
        let names = self.manifest["params"].as_array().expect("manifest.json: params");
        names.iter().map(|n| n.as_str().expect("a parameter name").to_string()).collect()
    }

    fn cases(&self) -> Vec<Value> {
        self.manifest["cases"].as_array().expect("manifest.json: cases").clone()
    }

    /// Rank `rank`'s (inputs, targets) of step `step`.
    fn rows(&self, rank: usize, step: usize) -> (Tensor, Tensor) {
        let b = self.local_batch();
        let x = self.tensor(&format!("rank{rank}.x")).narrow(0, step * b, b).unwrap();
        let y = self.tensor(&format!("rank{rank}.y")).narrow(0, step * b, b).unwrap();
        (x, y)
    }

    /// `Linear - Tanh - Linear` with the shapes and values of `init.*`.
    fn model(&self) -> Sequential {
        let w0 = self.tensor("init.0.weight").shape().to_vec();
        let w2 = self.tensor("init.2.weight").shape().to_vec();
        let (mut g, cpu) = (Generator::new(0), Device::Cpu);
        let mut m = Sequential::new()
            .append(Linear::new_with(w0[1], w0[0], true, &cpu, &mut g).unwrap())
            .append(Tanh::new())
            .append(Linear::new_with(w2[1], w2[0], true, &cpu, &mut g).unwrap());
        let mut sd = StateDict::new();
        for n in self.param_names() {
            sd.insert(n.clone(), self.tensor(&format!("init.{n}")).deep_clone().unwrap());
        }
        m.load_state_dict(&sd, true).expect("the fixture's init.* fit the model");
        m
    }

    /// PyTorch's per-rank losses of `case`: `[step][rank]`.
    fn losses(&self, case: &str) -> Vec<Vec<f32>> {
        let flat = self.tensor(&format!("{case}.losses")).to_vec::<f32>().unwrap();
        flat.chunks(self.world_size()).map(<[f32]>::to_vec).collect()
    }

    /// PyTorch's final parameters of `case`, in `param_names` order.
    fn final_params(&self, case: &str) -> Vec<Vec<f32>> {
        self.param_names().iter().map(|n| self.tensor(&format!("{case}.final.{n}")).to_vec::<f32>().unwrap()).collect()
    }
}

fn case_name(case: &Value) -> String {
    case["name"].as_str().expect("case name").to_string()
}

/// The optimizer `case` describes (manifest.json), over `params`.
fn optimizer(case: &Value, params: Vec<Tensor>) -> Box<dyn Optimizer> {
    let o = &case["optimizer"];
    let f = |k: &str| o[k].as_f64().unwrap_or_else(|| panic!("manifest.json: optimizer has no number `{k}`"));
    match o["kind"].as_str() {
        Some("sgd") => Box::new(
            Sgd::new(params, SgdConfig::new(f("lr")).momentum(f("momentum")).weight_decay(f("weight_decay"))).unwrap(),
        ),
        Some("adamw") => {
            let betas = o["betas"].as_array().expect("betas");
            let (b1, b2) = (betas[0].as_f64().unwrap(), betas[1].as_f64().unwrap());
            let c = AdamConfig::adamw(f("lr")).betas(b1, b2).eps(f("eps")).weight_decay(f("weight_decay"));
            Box::new(Adam::new(params, c).unwrap())
        }
        other => panic!("manifest.json: unknown optimizer kind {other:?}"),
    }
}

/// PyTorch's `mse_loss` with mean reduction.
fn mse(out: &Tensor, y: &Tensor) -> ferrite_tensor::Result<Tensor> {
    let d = out.sub(y)?;
    d.mul(&d)?.mean()
}

fn params_of(m: &dyn Module) -> Vec<Vec<f32>> {
    m.parameters().iter().map(|p| p.to_vec::<f32>().unwrap()).collect()
}

/// Largest `|got - want| / (1 + |want|)` over all parameters.
fn worst_difference(got: &[Vec<f32>], want: &[Vec<f32>]) -> f32 {
    assert_eq!(got.len(), want.len(), "parameter count");
    got.iter()
        .zip(want)
        .flat_map(|(g, w)| {
            assert_eq!(g.len(), w.len(), "parameter size");
            g.iter().zip(w).map(|(a, b)| (a - b).abs() / (1.0 + b.abs()))
        })
        .fold(0f32, f32::max)
}

fn assert_matches(what: &str, got: &[Vec<f32>], want: &[Vec<f32>], init: &[Vec<f32>]) {
    let worst = worst_difference(got, want);
    assert!(worst < TOLERANCE, "{what}: parameters differ from PyTorch's by up to {worst:e} (relative)");
    // The check has teeth: the run moved the parameters far more than the tolerance.
    let moved = worst_difference(want, init);
    assert!(moved > 100.0 * TOLERANCE, "{what}: PyTorch's run moved the parameters by only {moved:e}");
    println!("{what}: max relative difference to PyTorch {worst:.2e} (training moved them {moved:.2e})");
}

#[test]
fn one_process_on_the_concatenated_batches_matches_pytorch_ddp() {
    let fx = Fixture::load();
    let init = params_of(&fx.model());
    let cases = fx.cases();
    assert!(cases.len() >= 2, "the fixture has the SGD-momentum and AdamW runs");
    for case in &cases {
        let name = case_name(case);
        let m = fx.model();
        let mut opt = optimizer(case, m.parameters());
        let want_losses = fx.losses(&name);
        for (s, want) in want_losses.iter().enumerate().take(fx.steps()) {
            let rows: Vec<(Tensor, Tensor)> = (0..fx.world_size()).map(|r| fx.rows(r, s)).collect();
            let x = Tensor::cat(&rows.iter().map(|(x, _)| x).collect::<Vec<_>>(), 0).unwrap();
            let y = Tensor::cat(&rows.iter().map(|(_, y)| y).collect::<Vec<_>>(), 0).unwrap();
            let loss = mse(&m.forward(&x).unwrap(), &y).unwrap();
            loss.backward().unwrap();
            opt.step().unwrap();
            opt.zero_grad().unwrap();
            // Equal local batches: the global mean is the mean of the ranks' means.
            let pytorch = want.iter().map(|&l| f64::from(l)).sum::<f64>() / want.len() as f64;
            let got = loss.item().unwrap();
            assert!((got - pytorch).abs() <= 1e-5 * (1.0 + pytorch.abs()), "{name} step {s}: loss {got} vs {pytorch}");
        }
        assert_matches(&format!("{name}, one process"), &params_of(&m), &fx.final_params(&name), &init);
    }
}

fn mpi_available() -> bool {
    Command::new("mpirun").arg("--version").output().map(|o| o.status.success()).unwrap_or(false)
}

/// `true` when the MPI test can run here; else it skips loudly (or fails when required).
fn require_mpi(test: &str) -> bool {
    let why = if !cfg!(feature = "mpi") {
        "ferrite-parallel was built without the `mpi` feature (cargo test --features ferrite-parallel/mpi)"
    } else if !mpi_available() {
        "`mpirun` is not installed (apt-get install openmpi-bin libopenmpi-dev libclang-dev)"
    } else {
        return true;
    };
    ferrite_test_support::present_or_skip(false, &format!("{test}: {why}"), "see the README's test command")
}

/// What one rank wrote for `case`: its losses (one per step) and its final parameters.
fn read_rank(out: &Path, rank: usize, case: &str, log: &str) -> (Vec<f32>, Vec<f32>) {
    let read = |what: &str| {
        let f = out.join(format!("rank{rank}.{case}.{what}"));
        let bytes = std::fs::read(&f).unwrap_or_else(|e| {
            let error = std::fs::read_to_string(out.join(format!("rank{rank}.error"))).unwrap_or_default();
            panic!("rank {rank} wrote no {} ({e}); its error: {error}\nmpirun output:\n{log}", f.display())
        });
        bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect::<Vec<f32>>()
    };
    (read("losses"), read("params"))
}

#[test]
fn two_ferrite_ranks_match_pytorch_gloo_ddp() {
    if !require_mpi("two_ferrite_ranks_match_pytorch_gloo_ddp") {
        return;
    }
    let fx = Fixture::load();
    assert_eq!(fx.world_size(), 2, "the fixture is a 2-rank run");
    let out = tempfile::tempdir().unwrap();
    let o = ferrite_test_support::mpirun_command()
        .args(["--allow-run-as-root", "--oversubscribe", "-np", "2"])
        .args(["-x", "FERRITE_DDP_PYTORCH_OUT"])
        .arg(std::env::current_exe().unwrap())
        .args(["--exact", "mpi_worker", "--nocapture", "--test-threads=1"])
        .env("FERRITE_DDP_PYTORCH_OUT", out.path())
        .output()
        .expect("mpirun starts");
    let log = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "mpirun failed:\n{log}");
    let init = params_of(&fx.model());
    let sizes: Vec<usize> = init.iter().map(Vec::len).collect();
    for case in fx.cases() {
        let name = case_name(&case);
        let want = fx.final_params(&name);
        let want_losses = fx.losses(&name);
        for rank in 0..2 {
            let (losses, flat) = read_rank(out.path(), rank, &name, &log);
            assert_eq!(losses.len(), fx.steps(), "rank {rank} {name}: one loss per step");
            for (s, (got, step)) in losses.iter().zip(&want_losses).enumerate() {
                let pytorch = step[rank];
                assert!(
                    (got - pytorch).abs() <= TOLERANCE * (1.0 + pytorch.abs()),
                    "rank {rank} {name} step {s}: loss {got} vs PyTorch's {pytorch}"
                );
            }
            let mut rest = flat.as_slice();
            let got: Vec<Vec<f32>> = sizes
                .iter()
                .map(|&n| {
                    let (p, r) = rest.split_at(n.min(rest.len()));
                    rest = r;
                    p.to_vec()
                })
                .collect();
            assert!(rest.is_empty(), "rank {rank} {name}: more parameters than the fixture's");
            assert_matches(&format!("{name}, rank {rank} of 2"), &got, &want, &init);
        }
    }
}

/// The body of each rank (runs only under `two_ferrite_ranks_match_pytorch_gloo_ddp`'s mpirun,
/// which sets FERRITE_DDP_PYTORCH_OUT).
#[test]
fn mpi_worker() {
    let Ok(out) = std::env::var("FERRITE_DDP_PYTORCH_OUT") else { return };
    #[cfg(feature = "mpi")]
    worker::run(Path::new(&out));
    #[cfg(not(feature = "mpi"))]
    panic!("mpi_worker ({out}): built without the mpi feature");
}

#[cfg(feature = "mpi")]
mod worker {
    use super::*;
    use ferrite_parallel::distributed::{DdpOptions, DistributedDataParallel, DistributedError, ProcessGroup};

    pub(super) fn run(out: &Path) {
        let group = ProcessGroup::init().expect("MPI starts");
        let rank = group.rank();
        assert_eq!(group.world_size(), 2);
        if let Err(e) = cases(&group, out) {
            std::fs::write(out.join(format!("rank{rank}.error")), e.to_string()).expect("writes its error");
        }
    }

    fn bytes(v: impl IntoIterator<Item = f32>) -> Vec<u8> {
        v.into_iter().flat_map(f32::to_le_bytes).collect()
    }

    fn cases(group: &ProcessGroup, out: &Path) -> Result<(), DistributedError> {
        let fx = Fixture::load();
        let rank = group.rank();
        for case in fx.cases() {
            let name = case_name(&case);
            let m = fx.model();
            if rank == 1 {
                // A different start on rank 1: wrapping must broadcast rank 0's parameters, as
                // PyTorch's DDP does.
                let _no_grad = ferrite_tensor::no_grad();
                for p in m.parameters() {
                    p.add_scalar_(1.0)?;
                }
            }
            // Small buckets: several all-reduces per step, as PyTorch's 25 MiB would not give here.
            let ddp = DistributedDataParallel::new(m, group, DdpOptions::default().bucket_cap_mb(0.0005))?;
            let mut opt = optimizer(&case, ddp.module().parameters());
            let mut losses = Vec::new();
            for s in 0..fx.steps() {
                let (x, y) = fx.rows(rank, s);
                let loss = mse(&ddp.forward(&x)?, &y)?;
                ddp.backward(&loss)?;
                losses.push(loss.item()? as f32);
                opt.step().expect("optimizer step");
                opt.zero_grad().expect("zero_grad");
            }
            let m = ddp.finish()?;
            std::fs::write(out.join(format!("rank{rank}.{name}.losses")), bytes(losses)).expect("writes losses");
            let params = params_of(&m).into_iter().flatten();
            std::fs::write(out.join(format!("rank{rank}.{name}.params")), bytes(params)).expect("writes params");
        }
        Ok(())
    }
}
