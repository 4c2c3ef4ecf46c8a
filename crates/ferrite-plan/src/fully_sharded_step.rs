//! One rank's training step under ZeRO-3 (`mpirun -np W ferrite train --distributed --zero 3`),
//! with every allocation the rank's device sees, so the planner predicts each rank's own peak.
//!
//! A transcription of `ferrite-parallel`'s `FullySharded` (which this crate cannot depend on),
//! in the same order on the device: the model built and rank 0's weights copied in (f64
//! temporaries), one f32 shard per piece of the flat partition this rank owns, then every unit's
//! parameters released ([`ferrite_optim::zero3_units`] cuts the units, as the training side does).
//! Forward: at each unit's layer mark the unit computed before it is released and the unit is
//! gathered (one f32 tensor per parameter made on the device, cast to the parameter's dtype when
//! narrower, and moved into the parameter's storage). Backward: a per-node hook finds the unit of
//! each node; entering a unit, the others still gathered have their gradients read to the host
//! and freed and their parameters released, and this unit is gathered again. The reduced shares
//! come back as one f32 gradient per piece when the reduce-scatter is waited for (at most two in
//! flight, as on the training side). What runs on the host there (MPI, the prefetch buffers)
//! allocates nothing on the device and is left out. The full gradients are not marked as
//! gradients (they are gone before the step): the breakdown counts them with the activations.
use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::Arc;

use ferrite_nn::autocast;
use ferrite_optim::{Accumulator, FlatPartition, GradScaler, GradScalerConfig, ShardPiece, zero3_units};
use ferrite_tensor::autograd::{next_node_seq, set_backward_node_hook};
use ferrite_tensor::{DType, Device, Tensor, no_grad};

use crate::PlanError;
use crate::sharded_step::{DataParallel, RankLayout, RankModel, make_optimizer, run_rank_step};
use crate::step::{MarkKind, Phase, STEPS, TakenSteps, mark};
use crate::workload::{AmpMode, StepConfig, Workload};

struct Z3 {
    device: Device,
    params: Vec<Tensor>,
    units: Vec<(String, Vec<usize>)>,
    root: Vec<usize>,
    pieces: Vec<ShardPiece>,
    shards: Vec<Tensor>,
    gathered: Vec<bool>,
    open: Option<usize>,
    in_backward: bool,
    ranges: Vec<(u64, Option<usize>)>,
    bw_open: Option<usize>,
    done: Vec<bool>,
    synchronizing: bool,
    /// Parameter sets whose reduce-scatter is in flight.
    scatters: VecDeque<Vec<usize>>,
    error: Option<PlanError>,
}

type Shared = Rc<RefCell<Z3>>;

/// One rank's step of any layout: ZeRO-3's here, the others' in [`crate::sharded_step`].
pub(crate) fn run_layout_step(
    workload: &dyn Workload,
    config: &StepConfig,
    device: &Device,
    layout: RankLayout,
) -> Result<u64, PlanError> {
    if layout.mode == DataParallel::Zero3 {
        run_zero3_rank_step(workload, config, device, layout)
    } else {
        run_rank_step(workload, config, device, layout)
    }
}

/// Run one ZeRO-3 rank's step of `layout` on `device`; the parameter count, as `run_step_inner`.
pub(crate) fn run_zero3_rank_step(
    workload: &dyn Workload,
    config: &StepConfig,
    device: &Device,
    layout: RankLayout,
) -> Result<u64, PlanError> {
    let rm = RankModel::build(workload, config, device, layout)?;
    let params = rm.params.clone();
    let names: Vec<String> = rm.trainable.iter().map(|(n, _)| n.clone()).collect();
    let units = zero3_units(&names);
    if units.is_empty() {
        return Err(PlanError::setting(
            "--zero 3",
            format!(
                "model {} has no wrappable units (repeated blocks named like `blocks.3.…`); plan --zero 2",
                rm.model.type_name()
            ),
        ));
    }
    rm.replicate(device)?;
    let partition = FlatPartition::new(&rm.numels, layout.world);
    let pieces = partition.pieces(layout.rank);
    let shards = RankModel::shards(&pieces, device)?;
    let in_unit: Vec<bool> = (0..params.len()).map(|i| units.iter().any(|(_, m)| m.contains(&i))).collect();
    for (i, p) in params.iter().enumerate() {
        if in_unit[i] {
            p.release_storage();
        }
    }
    let mut opt = make_optimizer(config, rm.shard_opt_params(&pieces, &shards, device)?)?;
    let n_units = units.len();
    let z: Shared = Rc::new(RefCell::new(Z3 {
        device: device.clone(),
        params: params.clone(),
        root: (0..params.len()).filter(|&i| !in_unit[i]).collect(),
        units,
        pieces,
        shards: shards.clone(),
        gathered: vec![false; n_units],
        open: None,
        in_backward: false,
        ranges: Vec::new(),
        bw_open: None,
        done: vec![false; n_units],
        synchronizing: true,
        scatters: VecDeque::new(),
        error: None,
    }));
    let on_mark = z.clone();
    let _marks = ferrite_nn::listen_for_layer_marks(move |name| {
        // The planner's own label of the activations, as `run_step`'s listener sets it.
        mark(MarkKind::Layer(name.to_string()));
        let r = on_layer_mark(&on_mark, name);
        if let Err(e) = r {
            on_mark.borrow_mut().error.get_or_insert(e);
        }
    });
    let on_node = z.clone();
    // The hook lives on this thread only (a thread-local of autograd); the API takes an `Arc`.
    #[allow(clippy::arc_with_non_send_sync)]
    let _hook = set_backward_node_hook(Arc::new(move |seq| {
        before_node(&on_node, seq).map_err(|e| {
            let text = e.to_string();
            on_node.borrow_mut().error.get_or_insert(e);
            text
        })
    }));

    let scaling = config.amp == Some(AmpMode::F16);
    let mut scaler = GradScaler::new(GradScalerConfig { enabled: scaling, ..GradScalerConfig::default() })?;
    let acc = Accumulator::new(config.accum_steps)?;
    let mut steps = TakenSteps::default();
    while let Some(step) = steps.next() {
        let mut held = Vec::new();
        for k in 0..config.accum_steps {
            held.clear();
            mark(MarkKind::Phase { phase: Phase::Forward, step });
            let (x, y) = workload.batch(config, device)?;
            let (loss, keep) = {
                let _amp = config.amp.map(|a| autocast(a.dtype())).transpose()?;
                workload.loss(&*rm.model, &x, &y)?
            };
            take_error(&z)?;
            mark(MarkKind::Phase { phase: Phase::Backward, step });
            {
                let mut s = z.borrow_mut();
                s.synchronizing = k + 1 == config.accum_steps;
                s.in_backward = true;
                s.bw_open = None;
                s.done.iter_mut().for_each(|d| *d = false);
                s.ranges.push((next_node_seq(), None));
            }
            let r = scaler.scale(&acc.scale_loss(&loss)?)?.backward();
            take_error(&z)?;
            r?;
            end_backward(&z)?;
            {
                let mut s = z.borrow_mut();
                s.in_backward = false;
                s.ranges.clear();
            }
            held.push(x);
            held.push(y);
            held.push(loss);
            held.extend(keep);
        }
        mark(MarkKind::Phase { phase: Phase::OptimizerStep, step });
        if scaling {
            scaler.unscale_(&mut *opt)?;
            let found = scaler.found_inf(&*opt).unwrap_or(false);
            scaler.set_found_inf(&*opt, found)?;
            steps.finish(scaler.step(&mut *opt)?);
        } else {
            opt.step()?;
            steps.finish(true);
        }
        // `gather_params`: the root's parameters written from the host, rounded to their dtype
        // there (`host_values::write_f32`): nothing allocated on the device.
        scaler.update()?;
        opt.zero_grad()?;
        let _g = no_grad();
        for t in params.iter().chain(&shards) {
            t.set_grad(None)?;
        }
        drop(held);
    }
    mark(MarkKind::Phase { phase: Phase::Build, step: STEPS });
    drop(_hook);
    drop(_marks);
    drop(z);
    drop(opt);
    drop(shards);
    drop(params);
    let parameters = rm.parameters;
    drop(rm);
    Ok(parameters)
}

fn take_error(z: &Shared) -> Result<(), PlanError> {
    match z.borrow_mut().error.take() {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

fn on_layer_mark(z: &Shared, name: &str) -> Result<(), PlanError> {
    let unit = z.borrow().units.iter().position(|(u, _)| u == name);
    let (in_backward, open) = {
        let mut s = z.borrow_mut();
        if s.error.is_some() {
            return Ok(());
        }
        if !s.in_backward {
            // A unit before the last one marked: a new forward (see `FullySharded`).
            let last = s.ranges.iter().rev().find_map(|(_, u)| *u);
            if let (Some(k), Some(l)) = (unit, last)
                && k < l
            {
                s.ranges.clear();
            }
            s.ranges.push((next_node_seq(), unit));
        }
        (s.in_backward, s.open)
    };
    if in_backward {
        if let Some(k) = unit {
            gather(z, k)?;
        }
        return Ok(());
    }
    if let Some(j) = open
        && Some(j) != unit
    {
        release(z, j);
        z.borrow_mut().open = None;
    }
    if let Some(k) = unit {
        gather(z, k)?;
        z.borrow_mut().open = Some(k);
    }
    Ok(())
}

fn before_node(z: &Shared, seq: u64) -> Result<(), PlanError> {
    let unit = {
        let s = z.borrow();
        if s.error.is_some() {
            return Ok(());
        }
        let at = s.ranges.partition_point(|(start, _)| *start <= seq);
        let Some(&(_, Some(k))) = at.checked_sub(1).and_then(|i| s.ranges.get(i)) else { return Ok(()) };
        if s.bw_open == Some(k) {
            return Ok(());
        }
        k
    };
    let others: Vec<usize> = {
        let s = z.borrow();
        (0..s.units.len()).filter(|&j| j != unit && s.gathered[j]).collect()
    };
    for j in others {
        finish_unit(z, j)?;
    }
    gather(z, unit)?;
    z.borrow_mut().bw_open = Some(unit);
    Ok(())
}

fn end_backward(z: &Shared) -> Result<(), PlanError> {
    let n = z.borrow().units.len();
    let synchronizing = z.borrow().synchronizing;
    for k in 0..n {
        let (gathered, done) = {
            let s = z.borrow();
            (s.gathered[k], s.done[k])
        };
        if gathered {
            finish_unit(z, k)?;
        } else if synchronizing && !done {
            let members = z.borrow().units[k].1.clone();
            scatter(z, members)?;
            z.borrow_mut().done[k] = true;
        }
    }
    if synchronizing {
        let root = z.borrow().root.clone();
        scatter(z, root)?;
    }
    wait_scatters(z, 0)?;
    let mut s = z.borrow_mut();
    s.open = None;
    s.bw_open = None;
    Ok(())
}

fn finish_unit(z: &Shared, k: usize) -> Result<(), PlanError> {
    let (sync, done) = {
        let s = z.borrow();
        (s.synchronizing, s.done[k])
    };
    if sync && !done {
        let members = z.borrow().units[k].1.clone();
        scatter(z, members)?;
        z.borrow_mut().done[k] = true;
    }
    release(z, k);
    Ok(())
}

fn release(z: &Shared, k: usize) {
    let mut s = z.borrow_mut();
    for &i in &s.units[k].1 {
        s.params[i].release_storage();
    }
    s.gathered[k] = false;
}

/// `finish_gather`: one f32 tensor per parameter on the device, cast when narrower, moved in.
fn gather(z: &Shared, k: usize) -> Result<(), PlanError> {
    if z.borrow().gathered[k] {
        return Ok(());
    }
    let _g = no_grad();
    let (members, params, device) = {
        let s = z.borrow();
        (s.units[k].1.clone(), s.params.clone(), s.device.clone())
    };
    for i in members {
        let p = &params[i];
        // `host_values::fresh_like`: rounded on the host, one allocation of the parameter's size.
        p.refill_storage_from(Tensor::zeros(p.shape(), p.dtype(), &device)?)?;
    }
    z.borrow_mut().gathered[k] = true;
    Ok(())
}

/// `scatter`: the gradients read to the host (widened there: `host_values::read_f32`) and
/// freed; the share comes back when waited for.
fn scatter(z: &Shared, members: Vec<usize>) -> Result<(), PlanError> {
    let _g = no_grad();
    let params = z.borrow().params.clone();
    // One reduce-scatter per run of consecutive parameters, as the training side queues them.
    let mut runs: Vec<Vec<usize>> = Vec::new();
    for &i in &members {
        match runs.last_mut() {
            Some(run) if run.last().is_some_and(|&l| l + 1 == i) => run.push(i),
            _ => runs.push(vec![i]),
        }
    }
    for run in runs {
        for &i in &run {
            if let Some(g) = params[i].grad() {
                drop(g);
                params[i].set_grad(None)?;
            }
        }
        z.borrow_mut().scatters.push_back(run);
        wait_scatters(z, 2)?;
    }
    Ok(())
}

/// `wait_scatters`: each piece of the waited sets gets its f32 gradient (added in place after
/// the first).
fn wait_scatters(z: &Shared, keep: usize) -> Result<(), PlanError> {
    loop {
        let members = {
            let mut s = z.borrow_mut();
            if s.scatters.len() <= keep {
                return Ok(());
            }
            match s.scatters.pop_front() {
                Some(m) => m,
                None => return Ok(()),
            }
        };
        let _g = no_grad();
        let (pieces, shards) = {
            let s = z.borrow();
            (s.pieces.clone(), s.shards.clone())
        };
        let mut fresh = Vec::new();
        for (piece, shard) in pieces.iter().zip(&shards) {
            if !members.contains(&piece.param) {
                continue;
            }
            let g = Tensor::zeros(&[piece.len], DType::F32, shard.device())?;
            match shard.grad() {
                Some(old) => old.add_(&g)?,
                None => {
                    fresh.push(g.storage().addr());
                    shard.set_grad(Some(g))?;
                }
            }
        }
        mark(MarkKind::Grads(fresh));
    }
}
