//! Sharded training checkpoints of ZeRO runs (`--zero 1|2 --save-checkpoint DIR`): every rank
//! writes its own shard, rank 0 the index once all shards are on disk; and the way back, at any
//! world size, or to the ordinary one-file checkpoint (`ferrite convert`).
//!
//! Why this shape: under ZeRO each rank holds the optimizer state of its piece of the flat
//! parameter space only (see `ferrite_parallel::distributed::ZeroRedundancy`); gathering it all on
//! rank 0 to write one file would need the memory ZeRO saves. A shard holds the rank's pieces —
//! which parameter, where in it, the f32 master values, their optimizer state — and rank 0's
//! also the model's other entries (buffers, frozen parameters). The index holds everything else
//! of an ordinary checkpoint (epoch, step, scaler, generators, settings, the optimizer's groups),
//! the table of trainable parameters (name, shape, dtype, index in the full optimizer) and the
//! shard files' names and lengths; the file layout and its crash safety are
//! `ferrite_io::sharded_checkpoint`'s.
//!
//! Reading joins the pieces back into the ordinary [`TrainingState`] (full parameters, full
//! optimizer state in the single-device layout): [`consolidate`] needs no MPI, so `ferrite
//! convert` writes it as one file, a DDP or single-process run resumes from it, and a ZeRO run
//! at any world size cuts its own pieces from it (`ZeroRedundancy::import_full_state`). The
//! pieces tile each parameter exactly once whatever the saving world size, and ferrite's update
//! rules are element-wise, so a run resumed at another size continues exactly as one that had
//! that state in memory.

use std::path::Path;

use ferrite_io::{Checkpoint, LoadOptions, MapLocation, SHARD_INDEX_FILE, Value};
use ferrite_optim::StateValue;
use ferrite_tensor::{DType, Device, Tensor};

use crate::error::TrainError;
use crate::resume::{self, TrainingState};

/// The `format` entry of a sharded checkpoint's index.
const INDEX_FORMAT: &str = "ferrite-train-sharded/1";

/// Whether `path` is a sharded checkpoint (a directory with an index).
pub fn is_sharded(path: &Path) -> bool {
    ferrite_io::is_sharded_checkpoint(path)
}

/// Whether `path` is, or was meant to be, a sharded checkpoint: a directory with an index, or
/// with shard files (also the hidden temporary ones of a save that was killed) but no index —
/// which [`load`] then reports as a save that never finished.
pub fn looks_sharded(path: &Path) -> bool {
    if is_sharded(path) {
        return true;
    }
    let Ok(entries) = std::fs::read_dir(path) else { return false };
    entries.flatten().any(|e| {
        let name = e.file_name();
        let name = name.to_string_lossy();
        name.starts_with("shard-") || name.starts_with(".shard-")
    })
}

/// A sharded checkpoint joined into the ordinary single-device state, with the settings it was
/// saved with (nothing is checked against a run).
pub fn consolidate(dir: &Path) -> Result<TrainingState, TrainError> {
    let sc = ferrite_io::read_sharded_checkpoint(dir)?;
    let index_path = dir.join(SHARD_INDEX_FILE);
    let mut state = resume::read_format(&sc.index, INDEX_FORMAT, &index_path, &Device::Cpu, &[])?;
    state.settings = saved_settings(&sc.index);
    let table = param_table(&sc.index)?;
    let cpu = LoadOptions::new().map_location(MapLocation::To(Device::Cpu));
    // Per trainable parameter: master values, how many were covered, and optimizer slots.
    let mut masters: Vec<Vec<f32>> = table.iter().map(|p| vec![0f32; p.numel()]).collect();
    let mut covered = vec![0usize; table.len()];
    let mut slots: Vec<Vec<(String, Slot)>> = vec![Vec::new(); table.len()];
    for (rank, shard) in sc.shards.iter().enumerate() {
        let file = dir.join(ferrite_io::shard_file_name(shard.str("shard/tag")?, rank, sc.world_size()));
        let bad = |reason: String| TrainError::corrupt(&file, &reason);
        for k in 0..count_at(shard, "pieces/count")? {
            let base = format!("pieces/{k}");
            let param = count_at(shard, &format!("{base}/param"))?;
            let start = count_at(shard, &format!("{base}/start"))?;
            let Some(p) = table.get(param) else {
                return Err(bad(format!(
                    "piece {k} names trainable parameter {param}; the index lists {}",
                    table.len()
                )));
            };
            let master = shard.tensor(&format!("{base}/master"), &cpu)?;
            let values = master.to_dtype(DType::F32)?.to_vec::<f32>()?;
            let len = values.len();
            if start + len > p.numel() {
                return Err(bad(format!(
                    "piece {k} covers values {start}..{} of `{}`, which has {}",
                    start + len,
                    p.name,
                    p.numel()
                )));
            }
            masters[param][start..start + len].copy_from_slice(&values);
            covered[param] += len;
            let Some(Value::Dict(entries)) = shard.get(&format!("{base}/state")) else { continue };
            for (name, v) in entries {
                let name = name.as_str().ok_or_else(|| bad(format!("{base}/state has a key that is not a name")))?;
                let value = match v {
                    Value::Tensor(_) => {
                        let t = shard.tensor(&format!("{base}/state/{name}"), &cpu)?;
                        if t.numel() == len && t.rank() > 0 {
                            Slot::Elementwise(vec![(start, t.to_dtype(DType::F32)?.to_vec::<f32>()?)])
                        } else {
                            Slot::Scalar(StateValue::Tensor(t))
                        }
                    }
                    Value::Float(f) => Slot::Scalar(StateValue::Float(*f)),
                    Value::Int(i) => Slot::Scalar(StateValue::Int(*i)),
                    other => return Err(bad(format!("{base}/state/{name} is a {}", other.kind()))),
                };
                match slots[param].iter_mut().find(|(n, _)| n == name) {
                    Some((_, Slot::Elementwise(parts))) => match value {
                        Slot::Elementwise(more) => parts.extend(more),
                        Slot::Scalar(_) => {
                            return Err(bad(format!("{base}/state/{name}: a scalar where other pieces hold values")));
                        }
                    },
                    Some((_, Slot::Scalar(_))) => {}
                    None => slots[param].push((name.to_string(), value)),
                }
            }
        }
    }
    let mut model = Vec::new();
    let mut optimizer_state = Vec::new();
    for (i, p) in table.iter().enumerate() {
        if covered[i] != p.numel() {
            return Err(TrainError::corrupt(
                dir,
                &format!(
                    "the shards hold {} of the {} values of `{}`: a shard is missing pieces",
                    covered[i],
                    p.numel(),
                    p.name
                ),
            ));
        }
        let values = std::mem::take(&mut masters[i]);
        // The f32 masters, also when the run's parameters were narrower (`--zero-comm-dtype
        // bf16`): a resume continues from them, and `convert` gives full precision (DeepSpeed's
        // zero_to_fp32); loading into a bf16 model rounds as the run itself did.
        model.push((p.name.clone(), Tensor::from_vec(values, &p.shape, &Device::Cpu)?));
        let Some(index) = p.opt_index else { continue };
        if slots[i].is_empty() {
            continue;
        }
        let mut entries = Vec::new();
        for (name, slot) in std::mem::take(&mut slots[i]) {
            let value = match slot {
                Slot::Scalar(v) => v,
                Slot::Elementwise(parts) => {
                    let mut full = vec![0f32; p.numel()];
                    let mut n = 0;
                    for (start, v) in parts {
                        full[start..start + v.len()].copy_from_slice(&v);
                        n += v.len();
                    }
                    if n != p.numel() {
                        return Err(TrainError::corrupt(
                            dir,
                            &format!(
                                "optimizer state `{name}` of `{}`: the shards hold {n} of its {} values",
                                p.name,
                                p.numel()
                            ),
                        ));
                    }
                    StateValue::Tensor(Tensor::from_vec(full, &p.shape, &Device::Cpu)?)
                }
            };
            entries.push((name, value));
        }
        optimizer_state.push((index, entries));
    }
    optimizer_state.sort_by_key(|(i, _)| *i);
    state.optimizer.state = optimizer_state;
    // The model's other entries (buffers, frozen parameters), kept by rank 0.
    if sc.shards[0].get("replicated").is_some() {
        for (name, t) in sc.shards[0].state_dict("replicated", &cpu)? {
            model.push((name, t));
        }
    }
    // The order of the model's own state_dict.
    if let Some(keys) = sc.index.get("model_keys").and_then(Value::as_list) {
        let position = |n: &str| keys.iter().position(|k| k.as_str() == Some(n)).unwrap_or(usize::MAX);
        model.sort_by_key(|(n, _)| position(n));
    }
    state.model = model;
    Ok(state)
}

/// [`consolidate`], checking the saved settings against `settings` as a resume does.
pub fn load(dir: &Path, settings: &[(String, String)]) -> Result<TrainingState, TrainError> {
    let state = consolidate(dir)?;
    for (k, v) in settings {
        let saved = state.settings.iter().find(|(n, _)| n == k).map(|(_, s)| s.clone());
        match saved {
            Some(s) if &s == v => {}
            Some(s) => return Err(TrainError::ResumeMismatch { setting: k.clone(), saved: s, given: v.clone() }),
            None => return Err(TrainError::corrupt_entry(format!("settings/{k}"), "is missing from the index")),
        }
    }
    Ok(TrainingState { settings: settings.to_vec(), ..state })
}

/// One optimizer state entry of a parameter, gathered from its pieces.
#[derive(Clone)]
enum Slot {
    /// Per element: `(first element, values)` of each piece.
    Elementwise(Vec<(usize, Vec<f32>)>),
    /// The same in every piece (a step count).
    Scalar(StateValue),
}

/// One row of the index's table of trainable parameters.
struct ParamRow {
    name: String,
    shape: Vec<usize>,
    opt_index: Option<usize>,
}

impl ParamRow {
    fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

fn param_table(index: &Checkpoint) -> Result<Vec<ParamRow>, TrainError> {
    let rows =
        index.require("params")?.as_list().ok_or_else(|| TrainError::corrupt_entry("params", "is not a list"))?;
    rows.iter()
        .map(|r| {
            let bad = |what: &str| TrainError::corrupt_entry("params", format!("a row has no valid `{what}`"));
            let name = r.get("name").and_then(Value::as_str).ok_or_else(|| bad("name"))?.to_string();
            let shape = r
                .get("shape")
                .and_then(Value::as_list)
                .ok_or_else(|| bad("shape"))?
                .iter()
                .map(|d| d.as_int().and_then(|d| usize::try_from(d).ok()).ok_or_else(|| bad("shape")))
                .collect::<Result<Vec<_>, _>>()?;
            // Checked for a well-formed index; the masters come back in f32 whatever the run's
            // parameters were (see `consolidate`).
            r.get("dtype").and_then(Value::as_str).and_then(DType::parse).ok_or_else(|| bad("dtype"))?;
            let opt_index = r.get("opt_index").and_then(Value::as_int).ok_or_else(|| bad("opt_index"))?;
            Ok(ParamRow { name, shape, opt_index: usize::try_from(opt_index).ok() })
        })
        .collect()
}

fn saved_settings(index: &Checkpoint) -> Vec<(String, String)> {
    let Some(items) = index.get("settings").and_then(Value::as_dict) else { return Vec::new() };
    items.iter().filter_map(|(k, v)| Some((k.as_str()?.to_string(), v.as_str()?.to_string()))).collect()
}

fn count_at(c: &Checkpoint, path: &str) -> Result<usize, TrainError> {
    usize::try_from(c.int(path)?).map_err(|_| TrainError::corrupt_entry(path, "is negative"))
}

/// Writing: every rank its shard, rank 0 the index (MPI runs only).
#[cfg(feature = "mpi")]
pub(crate) mod save {
    use std::path::Path;

    use ferrite_io::{Checkpoint, Value};
    use ferrite_nn::Module;
    use ferrite_optim::{GradScalerState, Optimizer, OptimizerState, StateValue};
    use ferrite_parallel::distributed::ZeroRedundancy;
    use ferrite_tensor::GeneratorState;

    use super::INDEX_FORMAT;
    use crate::error::TrainError;
    use crate::resume::{self, TrainingState};

    /// What the index records besides the shards (the ordinary checkpoint's scalars).
    pub(crate) struct Common<'a> {
        pub(crate) epoch: usize,
        pub(crate) step: u64,
        pub(crate) stage: u32,
        pub(crate) scaler: Option<GradScalerState>,
        pub(crate) loader_rng: GeneratorState,
        pub(crate) dropout_rng: GeneratorState,
        pub(crate) settings: &'a [(String, String)],
    }

    /// Every rank writes its shard of `opt` (the sharded optimizer) into `dir`; once all have,
    /// rank 0 writes the index. Called on every rank; a rank whose part fails stops every rank,
    /// each with an error (its own, or one naming it).
    pub(crate) fn save(
        dir: &Path,
        zero: &ZeroRedundancy,
        opt: &dyn Optimizer,
        model: &dyn Module,
        common: Common<'_>,
    ) -> Result<(), TrainError> {
        let (rank, world) = (zero.rank(), zero.world_size());
        let proposal = if rank == 0 { new_tag(common.step) } else { String::new() };
        let tag = zero.broadcast_text(&proposal)?;
        let written = write_own_shard(dir, &tag, zero, opt, model);
        let message = written.as_ref().err().map(ToString::to_string);
        let agreed = zero.agree_all(message.as_deref(), "writing its checkpoint shard");
        written?;
        agreed?;
        let indexed = if rank == 0 { write_index(dir, &tag, world, zero, opt, model, &common) } else { Ok(()) };
        let message = indexed.as_ref().err().map(ToString::to_string);
        let agreed = zero.agree_all(message.as_deref(), "writing the checkpoint's index");
        indexed?;
        Ok(agreed?)
    }

    /// A name no earlier save in the directory has: the step and the time.
    fn new_tag(step: u64) -> String {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        format!("s{step}-{:x}", (nanos as u64) ^ u64::from(std::process::id()))
    }

    fn write_own_shard(
        dir: &Path,
        tag: &str,
        zero: &ZeroRedundancy,
        opt: &dyn Optimizer,
        model: &dyn Module,
    ) -> Result<u64, TrainError> {
        let mut c = Checkpoint::new();
        let pieces = zero.export_shard(opt)?;
        c.set("pieces/count", pieces.len())?;
        for (k, p) in pieces.iter().enumerate() {
            let base = format!("pieces/{k}");
            c.set(&format!("{base}/param"), p.param)?;
            c.set(&format!("{base}/start"), p.start)?;
            c.set_tensor(&format!("{base}/master"), &p.master)?;
            c.set(&format!("{base}/state"), Value::dict())?;
            for (name, v) in &p.state {
                let path = format!("{base}/state/{name}");
                match v {
                    StateValue::Tensor(t) => c.set_tensor(&path, t)?,
                    StateValue::Float(f) => c.set(&path, *f)?,
                    StateValue::Int(i) => c.set(&path, *i)?,
                }
            }
        }
        if zero.rank() == 0 {
            let trainable = zero.trainable_names();
            let sd = model.state_dict();
            let others: Vec<(&str, &ferrite_tensor::Tensor)> =
                sd.iter().filter(|(n, _)| !trainable.iter().any(|t| t.as_str() == *n)).collect();
            c.set_state_dict("replicated", others)?;
        }
        Ok(ferrite_io::write_shard(dir, tag, zero.rank(), zero.world_size(), &c)?)
    }

    fn write_index(
        dir: &Path,
        tag: &str,
        world: usize,
        zero: &ZeroRedundancy,
        opt: &dyn Optimizer,
        model: &dyn Module,
        common: &Common<'_>,
    ) -> Result<(), TrainError> {
        let state = TrainingState {
            epoch: common.epoch,
            step: common.step,
            model: Vec::new(),
            optimizer: OptimizerState { state: Vec::new(), param_groups: zero.full_param_groups(opt)? },
            scaler: common.scaler.clone(),
            loader_rng: common.loader_rng,
            dropout_rng: common.dropout_rng,
            settings: common.settings.to_vec(),
        };
        let mut c = resume::to_checkpoint(&state)?;
        c.set("format", INDEX_FORMAT)?;
        c.set("zero_stage", common.stage as i64)?;
        let indices = zero.full_optimizer_indices()?;
        let rows: Vec<Value> = zero
            .trainable_names()
            .iter()
            .zip(zero.trainable_params())
            .zip(&indices)
            .map(|((name, p), index)| {
                let mut row = Value::dict();
                let _ = row.insert("name", name.as_str());
                let _ = row.insert("shape", Value::List(p.shape().iter().map(|d| Value::from(*d)).collect()));
                let _ = row.insert("dtype", p.dtype().to_string());
                let _ = row.insert("opt_index", index.map_or(-1, |i| i as i64));
                row
            })
            .collect();
        c.set("params", Value::List(rows))?;
        let keys: Vec<Value> = model.state_dict().iter().map(|(n, _)| Value::from(n.to_string())).collect();
        c.set("model_keys", Value::List(keys))?;
        let mut bytes = Vec::with_capacity(world);
        for r in 0..world {
            let path = dir.join(ferrite_io::shard_file_name(tag, r, world));
            let len = std::fs::metadata(&path)
                .map_err(|_| ferrite_io::IoError::ShardMissing { path, rank: r, world_size: world })?
                .len();
            bytes.push(len);
        }
        ferrite_io::write_shard_index(dir, tag, &bytes, &c)?;
        Ok(())
    }
}
