//! LoRA (Hu et al. 2021) with Hugging Face PEFT's semantics: a frozen base layer plus a trainable
//! low-rank update, `y = W x + b + (alpha / r) · B A dropout(x)`, and [`apply_lora`], which puts
//! adapters on the layers of any module tree chosen by PEFT's `target_modules` rules.
//!
//! Why PEFT's semantics: an adapter trained here is meant to load in `peft.PeftModel` and the
//! other way round, so the names (`….q_proj.lora_A.weight`), the initialisation (A Kaiming-uniform
//! with a = √5, B zero), the scaling (`lora_alpha / r`, or `/ √r` with rsLoRA), the dropout (on the
//! adapter's input only), the target matching (a name equal to the pattern or ending in
//! `.pattern`; `all-linear` = every adaptable layer but the output head) and the dtype rule (the
//! input cast to the adapter's dtype, the sum cast back to the base output's) are PEFT's.
//!
//! The base weights are frozen by [`apply_lora`]: they stop requiring gradients, so backward
//! makes none for them and an optimizer keeps no state for them — the memory LoRA saves.
use ferrite_tensor::{DType, Device, Generator, Tensor, no_grad};

use crate::error::{NnError, Result};
use crate::init::{FanMode, Nonlinearity, kaiming_uniform_};
use crate::lora_host::LoraParams;
use crate::module::{Module, training_flag};
use crate::rng::RngHandle;

/// One factor of an adapter (`lora_A` or `lora_B`): a bias-free linear layer, named as PEFT's
/// `nn.Linear` factors are (`weight`).
#[derive(Clone, Debug)]
pub struct LoraFactor {
    pub weight: Tensor,
    training: bool,
}

impl Module for LoraFactor {
    fn type_name(&self) -> &'static str {
        "Linear"
    }
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(x.linear(&self.weight, None)?)
    }
    fn own_parameters(&self) -> Vec<(String, &Tensor)> {
        vec![("weight".into(), &self.weight)]
    }
    fn own_parameters_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        vec![("weight".into(), &mut self.weight)]
    }
    training_flag!();
}

/// A LoRA adapter: `lora_A [r, in]`, `lora_B [out, r]` (f32, trainable), its scaling and dropout.
/// The layer carrying it (a `Linear`, GPT-2's `Conv1D`) adds [`Lora::add_to`] to its output and
/// lists the factors as its children `lora_A` and `lora_B`.
#[derive(Clone, Debug)]
pub struct Lora {
    pub lora_a: LoraFactor,
    pub lora_b: LoraFactor,
    pub params: LoraParams,
    rng: RngHandle,
}

impl Lora {
    /// A fresh adapter for a layer of `in_features` → `out_features` on `device`: `A`
    /// Kaiming-uniform (a = √5, PEFT's `init_lora_weights=True`), `B` zero; the dropout draws from
    /// a generator seeded by one draw from `g`.
    pub fn new(
        in_features: usize,
        out_features: usize,
        params: &LoraParams,
        device: &Device,
        g: &mut Generator,
    ) -> Result<Lora> {
        check_rank(params.r, in_features, out_features, "")?;
        let a = Tensor::zeros(&[params.r, in_features], DType::F32, device)?;
        kaiming_uniform_(&a, 5f64.sqrt(), FanMode::FanIn, Nonlinearity::LeakyRelu, g)?;
        let b = Tensor::zeros(&[out_features, params.r], DType::F32, device)?;
        Ok(Lora {
            lora_a: LoraFactor { weight: a.requires_grad_(true)?, training: true },
            lora_b: LoraFactor { weight: b.requires_grad_(true)?, training: true },
            params: *params,
            rng: RngHandle::derived_from(g),
        })
    }

    /// The adapter's dropout draws from `rng` from now on.
    pub fn set_rng(&mut self, rng: &RngHandle) {
        self.rng = rng.clone();
    }

    /// `base + scaling · B A dropout(x)`: `x` cast to the adapter's dtype, the sum cast back to
    /// `base`'s dtype (PEFT's `lora.Linear.forward`). Dropout only when `training`.
    pub fn add_to(&self, base: Tensor, x: &Tensor, training: bool) -> Result<Tensor> {
        let dtype = self.lora_a.weight.dtype();
        let x = if x.dtype() != dtype { x.to_dtype(dtype)? } else { x.clone() };
        let x = if training && self.params.dropout > 0.0 {
            self.rng.with(|g| ferrite_tensor::functional::dropout(&x, self.params.dropout, true, g))?
        } else {
            x
        };
        let delta = x.linear(&self.lora_a.weight, None)?.linear(&self.lora_b.weight, None)?;
        let delta = delta.mul_scalar(self.params.scaling)?;
        if base.dtype() == delta.dtype() {
            Ok(base.add(&delta)?)
        } else {
            Ok(base.to_dtype(delta.dtype())?.add(&delta)?.to_dtype(base.dtype())?)
        }
    }

    /// `scaling · B A` (`[out, in]`, f32): what merging adds to the base weight.
    pub fn delta_weight(&self) -> Result<Tensor> {
        let _g = no_grad();
        Ok(self.lora_b.weight.matmul(&self.lora_a.weight)?.mul_scalar(self.params.scaling)?)
    }

    /// Adds [`delta_weight`](Self::delta_weight) into `weight` in place, transposed first when
    /// the weight is stored `[in, out]` (`fan_in_fan_out`, GPT-2's `Conv1D`).
    pub fn merge_into(&self, weight: &Tensor, fan_in_fan_out: bool) -> Result<()> {
        let d = self.delta_weight()?;
        let d = if fan_in_fan_out { d.t()?.contiguous()? } else { d };
        let _g = no_grad();
        weight.add_(&d.to_dtype(weight.dtype())?)?;
        Ok(())
    }

    /// The factors as the carrying layer's children, under PEFT's names.
    pub fn children(&self) -> Vec<(String, &dyn Module)> {
        vec![("lora_A".into(), &self.lora_a as &dyn Module), ("lora_B".into(), &self.lora_b)]
    }

    /// [`children`](Self::children), mutable.
    pub fn children_mut(&mut self) -> Vec<(String, &mut dyn Module)> {
        vec![("lora_A".into(), &mut self.lora_a as &mut dyn Module), ("lora_B".into(), &mut self.lora_b)]
    }
}

fn check_rank(r: usize, in_features: usize, out_features: usize, module: &str) -> Result<()> {
    if r == 0 || r > in_features.min(out_features) {
        return Err(NnError::LoraRank { module: module.to_string(), rank: r, in_features, out_features });
    }
    Ok(())
}

/// Which layers get adapters: PEFT's `target_modules`.
#[derive(Clone, Debug, PartialEq)]
pub enum LoraTargets {
    /// Module-name patterns: a module is chosen when its dotted name equals a pattern or ends in
    /// `.pattern` (`q_proj` chooses `model.layers.3.self_attn.q_proj`; `attn.c_attn` works too).
    Modules(Vec<String>),
    /// PEFT's `all-linear`: every adaptable layer except the output head (`lm_head`).
    AllLinear,
}

impl LoraTargets {
    /// `all-linear`, or a comma-separated list of patterns (`q_proj,v_proj`).
    pub fn parse(text: &str) -> LoraTargets {
        if text.trim() == "all-linear" {
            return LoraTargets::AllLinear;
        }
        LoraTargets::Modules(text.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect())
    }

    /// The patterns as PEFT's `target_modules` value: a list, or the string `all-linear`.
    pub fn names(&self) -> Vec<String> {
        match self {
            LoraTargets::Modules(v) => v.clone(),
            LoraTargets::AllLinear => vec!["all-linear".into()],
        }
    }

    fn pattern_matches(pattern: &str, name: &str) -> bool {
        name == pattern || name.ends_with(&format!(".{pattern}"))
    }
}

/// Everything [`apply_lora`] needs: PEFT's `r`, `lora_alpha`, `lora_dropout`, `use_rslora` and
/// `target_modules`.
#[derive(Clone, Debug, PartialEq)]
pub struct LoraConfig {
    pub r: usize,
    pub alpha: f64,
    pub dropout: f64,
    /// rsLoRA (Kalajdzievski 2023): scaling `alpha / √r` instead of `alpha / r`.
    pub use_rslora: bool,
    pub targets: LoraTargets,
}

impl LoraConfig {
    /// Rank `r` on `targets`, PEFT's defaults otherwise (`lora_alpha` 8, no dropout).
    pub fn new(r: usize, targets: LoraTargets) -> LoraConfig {
        LoraConfig { r, alpha: 8.0, dropout: 0.0, use_rslora: false, targets }
    }

    /// The scaling of the adapters' output.
    pub fn scaling(&self) -> f64 {
        if self.use_rslora { self.alpha / (self.r as f64).sqrt() } else { self.alpha / self.r as f64 }
    }

    /// The numbers each adapter is built from.
    pub fn params(&self) -> LoraParams {
        LoraParams { r: self.r, alpha: self.alpha, scaling: self.scaling(), dropout: self.dropout }
    }

    fn check(&self) -> Result<()> {
        if self.r == 0 {
            return Err(NnError::LoraRank { module: String::new(), rank: 0, in_features: 0, out_features: 0 });
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return Err(NnError::config(
                "LoRA",
                format!("lora_dropout must be in [0, 1), got {}; 0 turns it off", self.dropout),
            ));
        }
        if !self.alpha.is_finite() {
            return Err(NnError::config("LoRA", format!("lora_alpha must be a finite number, got {}", self.alpha)));
        }
        if let LoraTargets::Modules(v) = &self.targets
            && v.is_empty()
        {
            return Err(NnError::LoraTargets {
                unmatched: Vec::new(),
                available: Vec::new(),
                detail: "no target module given".into(),
            });
        }
        Ok(())
    }
}

/// The dotted names of `model`'s modules chosen by `targets`, checked: every pattern must choose
/// at least one module, and every chosen module must be adaptable.
pub fn lora_target_names(model: &dyn Module, targets: &LoraTargets) -> Result<Vec<String>> {
    let modules = model.named_modules();
    let adaptable: Vec<&str> =
        modules.iter().filter(|(_, m)| m.lora_host().is_some()).map(|(n, _)| n.as_str()).collect();
    let available = || {
        let mut short: Vec<String> = adaptable.iter().map(|n| n.rsplit('.').next().unwrap_or(n).to_string()).collect();
        short.sort();
        short.dedup();
        short
    };
    match targets {
        LoraTargets::AllLinear => {
            let chosen: Vec<String> = adaptable
                .iter()
                .filter(|n| !LoraTargets::pattern_matches("lm_head", n))
                .map(|n| n.to_string())
                .collect();
            if chosen.is_empty() {
                return Err(NnError::LoraTargets {
                    unmatched: vec!["all-linear".into()],
                    available: Vec::new(),
                    detail: format!("{} has no linear layer besides its output head", model.type_name()),
                });
            }
            Ok(chosen)
        }
        LoraTargets::Modules(patterns) => {
            let unmatched: Vec<String> = patterns
                .iter()
                .filter(|p| !modules.iter().any(|(n, _)| LoraTargets::pattern_matches(p, n)))
                .cloned()
                .collect();
            if !unmatched.is_empty() {
                return Err(NnError::LoraTargets {
                    unmatched,
                    available: available(),
                    detail: format!("no module of {} has that name", model.type_name()),
                });
            }
            let mut chosen = Vec::new();
            for (n, m) in &modules {
                if patterns.iter().any(|p| LoraTargets::pattern_matches(p, n)) {
                    if m.lora_host().is_none() {
                        return Err(NnError::LoraUnsupportedTarget {
                            module: n.clone(),
                            type_name: m.type_name(),
                            available: available(),
                        });
                    }
                    chosen.push(n.clone());
                }
            }
            Ok(chosen)
        }
    }
}

/// PEFT's `get_peft_model` for LoRA: freezes every parameter of `model` and attaches a fresh
/// adapter (drawn from `g`, in module order) to each layer `config.targets` chooses. Returns the
/// adapted modules' names. Checked before anything changes: on error the model is untouched.
pub fn apply_lora(model: &mut dyn Module, config: &LoraConfig, g: &mut Generator) -> Result<Vec<String>> {
    config.check()?;
    let chosen = lora_target_names(model, &config.targets)?;
    for (n, m) in model.named_modules() {
        if chosen.contains(&n)
            && let Some(h) = m.lora_host()
        {
            if h.lora_params().is_some() {
                return Err(NnError::config(
                    "LoRA",
                    format!("{n} already carries an adapter; merge it (merge_lora) before adding another"),
                ));
            }
            let (i, o) = h.lora_features();
            check_rank(config.r, i, o, &n)?;
        }
    }
    for p in model.parameters() {
        p.requires_grad_(false)?;
    }
    let params = config.params();
    let mut err = None;
    visit_mut(model, "", &mut |name, m| {
        if err.is_none()
            && chosen.iter().any(|c| c == name)
            && let Some(h) = m.lora_host_mut()
            && let Err(e) = h.attach_lora(&params, g)
        {
            err = Some(e);
        }
    });
    match err {
        Some(e) => Err(e),
        None => Ok(chosen),
    }
}

/// Merges every adapter of `model` into its base weight and removes it (PEFT's
/// `merge_and_unload`); returns how many were merged. The model is then a plain model again
/// (its state dict has the base model's keys only).
pub fn merge_lora(model: &mut dyn Module) -> Result<usize> {
    let mut merged = 0;
    let mut err = None;
    visit_mut(model, "", &mut |_, m| {
        if err.is_none()
            && let Some(h) = m.lora_host_mut()
        {
            match h.merge_lora() {
                Ok(true) => merged += 1,
                Ok(false) => {}
                Err(e) => err = Some(e),
            }
        }
    });
    match err {
        Some(e) => Err(e),
        None => Ok(merged),
    }
}

/// Every adapter's dropout of `model` draws from `rng` from now on (share the trainer's dropout
/// generator, so a resumed run draws the same masks).
pub fn set_lora_dropout_rng(model: &mut dyn Module, rng: &RngHandle) {
    visit_mut(model, "", &mut |_, m| {
        if let Some(h) = m.lora_host_mut() {
            h.set_lora_rng(rng);
        }
    });
}

/// The parameters that train (require gradients), with their names: after [`apply_lora`], the
/// adapters' factors only. What an optimizer should be given.
pub fn trainable_parameters(model: &dyn Module) -> Vec<(String, Tensor)> {
    model.named_parameters().into_iter().filter(|(_, p)| p.requires_grad()).collect()
}

/// Whether any layer of `model` carries an adapter.
pub fn has_lora(model: &dyn Module) -> bool {
    model.named_modules().iter().any(|(_, m)| m.lora_host().is_some_and(|h| h.lora_params().is_some()))
}

fn visit_mut(m: &mut dyn Module, prefix: &str, f: &mut dyn FnMut(&str, &mut dyn Module)) {
    for (cn, c) in m.children_mut() {
        let name = if prefix.is_empty() { cn } else { format!("{prefix}.{cn}") };
        f(&name, &mut *c);
        visit_mut(c, &name, f);
    }
}
