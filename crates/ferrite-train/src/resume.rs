//! Training checkpoints for `ferrite train --save-checkpoint / --resume`.
//!
//! Why this shape: resuming must continue bit-identically, so the file carries every piece of
//! state a step depends on — weights, AdamW moments and step counts, the GradScaler, the data
//! loader's generator (the next epoch's shuffle and worker seeds), the dropout generator and the
//! epoch counter — plus the settings that must not change across a resume (model shape, batch,
//! accumulation, precision, seed). A resume with different settings is refused with the setting
//! named, because it would silently train something else. The file is written through
//! `ferrite_io::Checkpoint::save` (temporary file, fsync, rename), so a crash mid-save leaves the
//! previous checkpoint intact.

use std::path::Path;

use ferrite_io::{Checkpoint, LoadOptions, MapLocation, Value};
use ferrite_optim::{GradScalerState, GroupState, HyperValue, OptimizerState, StateValue};
use ferrite_tensor::{Device, GeneratorState, Tensor};

use crate::error::TrainError;

/// Everything a resumed run needs, in memory.
pub struct TrainingState {
    /// Epochs completed.
    pub epoch: usize,
    /// Optimizer steps taken.
    pub step: u64,
    pub model: Vec<(String, Tensor)>,
    pub optimizer: OptimizerState,
    pub scaler: Option<GradScalerState>,
    pub loader_rng: GeneratorState,
    pub dropout_rng: GeneratorState,
    /// Settings that must match on resume, as (name, value) pairs.
    pub settings: Vec<(String, String)>,
}

const FORMAT: &str = "ferrite-train/1";

/// Writes `state` to `path` atomically.
pub fn save(path: &Path, state: &TrainingState) -> Result<(), TrainError> {
    to_checkpoint(state)?.save(path)?;
    Ok(())
}

/// `state` as the checkpoint tree [`save`] writes (e.g. for `ferrite convert` to write).
pub fn to_checkpoint(state: &TrainingState) -> Result<Checkpoint, TrainError> {
    let mut c = Checkpoint::new();
    c.set("format", FORMAT)?;
    c.set("epoch", state.epoch)?;
    c.set("step", state.step as i64)?;
    c.set_state_dict("model", state.model.iter().map(|(n, t)| (n.as_str(), t)))?;
    for (index, entries) in &state.optimizer.state {
        for (name, value) in entries {
            let path = format!("optimizer/state/{index}/{name}");
            match value {
                StateValue::Tensor(t) => c.set_tensor(&path, t)?,
                StateValue::Float(f) => c.set(&path, *f)?,
                StateValue::Int(i) => c.set(&path, *i)?,
            }
        }
    }
    let groups: Vec<Value> = state.optimizer.param_groups.iter().map(group_to_value).collect();
    c.set("optimizer/param_groups", Value::List(groups))?;
    if let Some(s) = &state.scaler {
        c.set("scaler/scale", s.scale)?;
        c.set("scaler/growth_factor", s.growth_factor)?;
        c.set("scaler/backoff_factor", s.backoff_factor)?;
        c.set("scaler/growth_interval", s.growth_interval)?;
        c.set("scaler/_growth_tracker", s.growth_tracker)?;
    }
    c.set("rng/data_loader", state.loader_rng)?;
    c.set("rng/dropout", state.dropout_rng)?;
    for (k, v) in &state.settings {
        c.set(&format!("settings/{k}"), v.as_str())?;
    }
    Ok(c)
}

/// Reads a checkpoint written by [`save`], placing model tensors on `device`, and checks that
/// its settings equal `settings`.
pub fn load(path: &Path, device: &Device, settings: &[(String, String)]) -> Result<TrainingState, TrainError> {
    read(&Checkpoint::load(path)?, path, device, settings)
}

/// [`load`] of a checkpoint already read from `path`: every entry a resume needs, checked for
/// presence, type and range, so a damaged or foreign file is a [`TrainError`] naming the entry.
pub fn read(
    c: &Checkpoint,
    path: &Path,
    device: &Device,
    settings: &[(String, String)],
) -> Result<TrainingState, TrainError> {
    read_format(c, FORMAT, path, device, settings)
}

/// [`read`] of a tree whose `format` entry is `format` (a sharded checkpoint's index shares
/// this layout, with its own format).
pub(crate) fn read_format(
    c: &Checkpoint,
    format: &str,
    path: &Path,
    device: &Device,
    settings: &[(String, String)],
) -> Result<TrainingState, TrainError> {
    match c.get("format").and_then(Value::as_str) {
        Some(f) if f == format => {}
        other => {
            return Err(TrainError::NotATrainingCheckpoint {
                path: path.display().to_string(),
                found: other.map_or_else(|| "no `format` entry".to_string(), |f| format!("format `{f}`")),
            });
        }
    }
    for (k, v) in settings {
        let saved = c.str(&format!("settings/{k}"))?;
        if saved != v {
            return Err(TrainError::ResumeMismatch { setting: k.clone(), saved: saved.to_string(), given: v.clone() });
        }
    }
    let on_device = LoadOptions::new().map_location(MapLocation::To(device.clone()));
    let model = c.state_dict("model", &on_device)?;
    let optimizer = optimizer_state(c)?;
    let scaler = match c.get("scaler") {
        None => None,
        Some(_) => Some(GradScalerState {
            scale: c.float("scaler/scale")?,
            growth_factor: c.float("scaler/growth_factor")?,
            backoff_factor: c.float("scaler/backoff_factor")?,
            growth_interval: c.int("scaler/growth_interval")?,
            growth_tracker: c.int("scaler/_growth_tracker")?,
        }),
    };
    let epoch = usize::try_from(c.int("epoch")?).map_err(|_| TrainError::corrupt(path, "`epoch` is negative"))?;
    let step = u64::try_from(c.int("step")?).map_err(|_| TrainError::corrupt(path, "`step` is negative"))?;
    Ok(TrainingState {
        epoch,
        step,
        model,
        optimizer,
        scaler,
        loader_rng: c.generator_state("rng/data_loader")?,
        dropout_rng: c.generator_state("rng/dropout")?,
        settings: settings.to_vec(),
    })
}

fn optimizer_state(c: &Checkpoint) -> Result<OptimizerState, TrainError> {
    let cpu = LoadOptions::new().map_location(MapLocation::To(Device::Cpu));
    let mut state = Vec::new();
    if let Some(Value::Dict(items)) = c.get("optimizer/state") {
        for (key, _) in items {
            let key = match key {
                Value::Str(s) => s.clone(),
                Value::Int(i) => i.to_string(),
                other => {
                    return Err(TrainError::corrupt_entry("optimizer/state", format!("a key is a {}", other.kind())));
                }
            };
            let index: usize = key.parse().map_err(|_| {
                TrainError::corrupt_entry("optimizer/state", format!("key `{key}` is not a parameter index"))
            })?;
            let base = format!("optimizer/state/{key}");
            let Some(Value::Dict(entries)) = c.get(&base) else {
                return Err(TrainError::corrupt_entry(&base, "is not a dict"));
            };
            let mut values = Vec::new();
            for (name, v) in entries {
                let name = name
                    .as_str()
                    .ok_or_else(|| TrainError::corrupt_entry(&base, "an entry name is not a string"))?
                    .to_string();
                let value = match v {
                    Value::Tensor(_) => StateValue::Tensor(c.tensor(&format!("{base}/{name}"), &cpu)?),
                    Value::Float(f) => StateValue::Float(*f),
                    Value::Int(i) => StateValue::Int(*i),
                    other => {
                        return Err(TrainError::corrupt_entry(
                            format!("{base}/{name}"),
                            format!("is a {}", other.kind()),
                        ));
                    }
                };
                values.push((name, value));
            }
            state.push((index, values));
        }
    }
    let groups = c.require("optimizer/param_groups")?;
    let groups =
        groups.as_list().ok_or_else(|| TrainError::corrupt_entry("optimizer/param_groups", "is not a list"))?;
    let param_groups = groups.iter().map(group_from_value).collect::<Result<Vec<_>, _>>()?;
    Ok(OptimizerState { state, param_groups })
}

fn hyper_to_value(h: &HyperValue) -> Value {
    match h {
        HyperValue::Float(f) => Value::Float(*f),
        HyperValue::Int(i) => Value::Int(*i),
        HyperValue::Bool(b) => Value::Bool(*b),
        HyperValue::Floats(v) => Value::Tuple(v.iter().map(|f| Value::Float(*f)).collect()),
        HyperValue::Ints(v) => Value::List(v.iter().map(|i| Value::Int(*i)).collect()),
        HyperValue::None => Value::None,
        HyperValue::Str(s) => Value::Str(s.clone()),
    }
}

fn hyper_from_value(path: &str, v: &Value) -> Result<HyperValue, TrainError> {
    Ok(match v {
        Value::Float(f) => HyperValue::Float(*f),
        Value::Int(i) => HyperValue::Int(*i),
        Value::Bool(b) => HyperValue::Bool(*b),
        Value::None => HyperValue::None,
        Value::Str(s) => HyperValue::Str(s.clone()),
        Value::Tuple(items) => HyperValue::Floats(
            items
                .iter()
                .map(|x| x.as_float().ok_or_else(|| TrainError::corrupt_entry(path, "a tuple holds a non-number")))
                .collect::<Result<_, _>>()?,
        ),
        Value::List(items) => HyperValue::Ints(
            items
                .iter()
                .map(|x| x.as_int().ok_or_else(|| TrainError::corrupt_entry(path, "a list holds a non-integer")))
                .collect::<Result<_, _>>()?,
        ),
        other => return Err(TrainError::corrupt_entry(path, format!("is a {}", other.kind()))),
    })
}

fn group_to_value(g: &GroupState) -> Value {
    let mut d = Value::dict();
    let mut hyper = Value::dict();
    for (k, v) in &g.hyper {
        // Keys are unique in a group, so insertion cannot collide.
        let _ = hyper.insert(k.as_str(), hyper_to_value(v));
    }
    let _ = d.insert("hyper", hyper);
    let _ = d.insert("params", Value::List(g.params.iter().map(|p| Value::Int(*p as i64)).collect()));
    if let Some(names) = &g.param_names {
        let _ = d.insert("param_names", Value::List(names.iter().map(|n| Value::Str(n.clone())).collect()));
    }
    d
}

fn group_from_value(v: &Value) -> Result<GroupState, TrainError> {
    let path = "optimizer/param_groups";
    let hyper_items = v
        .get("hyper")
        .and_then(Value::as_dict)
        .ok_or_else(|| TrainError::corrupt_entry(path, "a group has no `hyper` dict"))?;
    let mut hyper = Vec::new();
    for (k, val) in hyper_items {
        let k = k.as_str().ok_or_else(|| TrainError::corrupt_entry(path, "a hyperparameter name is not a string"))?;
        hyper.push((k.to_string(), hyper_from_value(&format!("{path}/{k}"), val)?));
    }
    let params = v
        .get("params")
        .and_then(Value::as_list)
        .ok_or_else(|| TrainError::corrupt_entry(path, "a group has no `params` list"))?
        .iter()
        .map(|p| {
            p.as_int()
                .and_then(|i| usize::try_from(i).ok())
                .ok_or_else(|| TrainError::corrupt_entry(path, "a parameter index is not a non-negative integer"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let param_names = match v.get("param_names") {
        None => None,
        Some(list) => Some(
            list.as_list()
                .ok_or_else(|| TrainError::corrupt_entry(path, "`param_names` is not a list"))?
                .iter()
                .map(|n| {
                    n.as_str()
                        .map(str::to_string)
                        .ok_or_else(|| TrainError::corrupt_entry(path, "a parameter name is not a string"))
                })
                .collect::<Result<Vec<_>, _>>()?,
        ),
    };
    Ok(GroupState { hyper, params, param_names })
}
