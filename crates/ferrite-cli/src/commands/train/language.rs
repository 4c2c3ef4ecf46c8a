//! Character-level language modelling: the LSTM (truncated BPTT) and the transformer on one text,
//! with training and validation loss, perplexity, a unigram model's loss for scale, and a line of
//! sampled text at the end.
//!
//! Why a unigram baseline: a loss figure alone says little to someone who has not trained this
//! model before. The unigram model — every character drawn from the training text's character
//! frequencies, ignoring context — is the simplest predictor there is; a language model whose
//! validation loss is not below it has learned nothing about context.

use std::path::{Path, PathBuf};
use std::time::Instant;

use ferrite_data::{CharText, DataLoader, Dataset, Tensors, TextCollate, TextStreams};
use ferrite_memory::{allocator, format_size};
use ferrite_models::{LstmLm, LstmSpec, LstmState, TransformerLm, TransformerSpec, build_lstm, build_transformer};
use ferrite_nn::{CrossEntropyLoss, Module, RngHandle};
use ferrite_optim::{Adam, AdamConfig};
use ferrite_tensor::{Device, Generator, Tensor, no_grad};
use ferrite_train::distributed::{Distributed, StreamShare, ValidationShare};
use ferrite_train::{Metrics, StepOutput, TrainStep, seconds, start_observer};

use super::settings::{describe_settings, run_settings, trainer_for};
use super::{During, Hint, ModelKind, TrainArgs, TrainError};

type TextLoader = DataLoader<TextStreams, Tensors<TextCollate>>;

/// Share of the text used for training; the rest is the validation text.
const TRAIN_FRACTION: f64 = 0.9;
/// Characters sampled at the end of a run.
const SAMPLE_CHARS: usize = 120;
/// Softmax temperature of the sample (below 1: fewer unlikely characters).
const SAMPLE_TEMPERATURE: f64 = 0.8;

/// The two language models behind one interface: a chunk in, logits and the carried state out.
#[derive(Clone)]
enum LanguageModel {
    Lstm(LstmLm),
    Transformer(TransformerLm),
}

impl LanguageModel {
    fn module(&self) -> &dyn Module {
        match self {
            LanguageModel::Lstm(m) => m,
            LanguageModel::Transformer(m) => m,
        }
    }

    fn module_mut(&mut self) -> &mut dyn Module {
        match self {
            LanguageModel::Lstm(m) => m,
            LanguageModel::Transformer(m) => m,
        }
    }

    /// The state a pass over the text starts from (`None` for a model without state).
    fn start_state(&self, batch: usize, device: &Device) -> Result<Option<LstmState>, TrainError> {
        Ok(match self {
            LanguageModel::Lstm(m) => Some(m.zero_state(batch, device)?),
            LanguageModel::Transformer(_) => None,
        })
    }

    /// Logits `[batch, seq, vocab]` for a chunk, and the state after it, detached: truncated
    /// BPTT keeps the state's values and drops its history.
    fn chunk(&self, ids: &Tensor, state: Option<LstmState>) -> Result<(Tensor, Option<LstmState>), TrainError> {
        match (self, state) {
            (LanguageModel::Lstm(m), Some(s)) => {
                let (logits, (h, c)) = m.forward_chunk(ids, &s)?;
                Ok((logits, Some((h.detach(), c.detach()))))
            }
            (LanguageModel::Lstm(m), None) => Ok((m.forward(ids)?, None)),
            (LanguageModel::Transformer(m), _) => Ok((m.forward(ids)?, None)),
        }
    }
}

/// The module tree is the inner model's (same parameter names), so the trainer checkpoints and
/// evaluates it as it is.
impl Module for LanguageModel {
    fn type_name(&self) -> &'static str {
        self.module().type_name()
    }
    fn forward(&self, x: &Tensor) -> ferrite_nn::Result<Tensor> {
        self.module().forward(x)
    }
    fn own_parameters(&self) -> Vec<(String, &Tensor)> {
        self.module().own_parameters()
    }
    fn own_parameters_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        self.module_mut().own_parameters_mut()
    }
    fn own_buffers(&self) -> Vec<(String, &Tensor)> {
        self.module().own_buffers()
    }
    fn own_buffers_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        self.module_mut().own_buffers_mut()
    }
    fn children(&self) -> Vec<(String, &dyn Module)> {
        self.module().children()
    }
    fn children_mut(&mut self) -> Vec<(String, &mut dyn Module)> {
        self.module_mut().children_mut()
    }
    fn is_training(&self) -> bool {
        self.module().is_training()
    }
    fn set_own_training(&mut self, training: bool) {
        self.module_mut().set_own_training(training)
    }
}

/// One training chunk of `batch` streams: the state carried from the previous chunk (truncated
/// BPTT; reset to zero at each epoch's start) and the next-character loss.
struct ChunkStep {
    state: Option<LstmState>,
    batch: usize,
    vocab: usize,
    device: Device,
    loss_fn: CrossEntropyLoss,
}

impl TrainStep<LanguageModel, (Tensor, Tensor)> for ChunkStep {
    fn start_epoch(&mut self, model: &LanguageModel, _epoch: usize) -> Result<(), TrainError> {
        self.state = model.start_state(self.batch, &self.device)?;
        Ok(())
    }

    fn step(&mut self, model: &LanguageModel, (x, y): &(Tensor, Tensor)) -> Result<StepOutput, TrainError> {
        let (logits, next) = model.chunk(x, self.state.take())?;
        self.state = next;
        let loss = self.loss_fn.forward(&logits.reshape(&[-1, self.vocab as i64])?, &y.reshape(&[-1])?)?;
        Ok(StepOutput::new(loss, y.numel()))
    }
}

/// Trains `args.model` (a language model) on the text `args.data` or `args.dataset` names; with `dist`, as one
/// rank reading its [`StreamShare`] of the streams.
pub fn train(args: &TrainArgs, device: &Device, dist: Option<&Distributed>) -> Result<(), TrainError> {
    let epochs = args.epochs.unwrap_or(1);
    if args.model == ModelKind::Transformer {
        // The model's own settings are checked before the text is read.
        transformer_spec(args, 0)?;
    }
    let (text, dataset) = load_text(args)?;
    let mut seeds = Generator::new(args.seed);
    let loader_seed = seeds.next_u64();
    // Distributed: the text is cut into ranks x batch streams, of which this rank reads its batch.
    let share = dist.map(|d| StreamShare::new(d.world_size(), d.rank(), args.batch_size, loader_seed)).transpose()?;
    let all_streams = share.as_ref().map_or(args.batch_size, StreamShare::total_streams);
    let streams_text = match dist {
        Some(d) => format!("{} ranks x --batch-size {}", d.world_size(), args.batch_size),
        None => format!("--batch-size {}", args.batch_size),
    };
    // The split must leave a validation chunk and a training chunk per stream: say so in the
    // trainer's terms before the dataset says it in its own.
    let cut = (text.num_chars() as f64 * TRAIN_FRACTION).round() as usize;
    let needs = [
        (
            text.num_chars() - cut,
            args.shape.seq + 1,
            "the validation text (the last 10 %)",
            format!("one chunk of --seq {}", args.shape.seq),
        ),
        (
            args.train_subset.unwrap_or(cut).min(cut),
            all_streams.saturating_mul(args.shape.seq).saturating_add(1),
            "the training text",
            format!("{streams_text} streams of one --seq {} chunk", args.shape.seq),
        ),
    ];
    for (chars, needed, what, why) in needs {
        if chars < needed {
            return Err(TrainError::TextTooShort { what: format!("{what} of {dataset}"), chars, needed, why });
        }
    }
    let (train_text, val_text) = text.split(TRAIN_FRACTION)?;
    let train_text = match args.train_subset {
        Some(n) if n < train_text.num_chars() => train_text.split(n as f64 / train_text.num_chars() as f64)?.0,
        _ => train_text,
    };
    let vocab = text.vocab_size();
    let streams = TextStreams::new(&train_text, all_streams, args.shape.seq)?;
    let chunks = streams.chunks();
    // Validation streams: as many as the training streams of all ranks (so a distributed run
    // evaluates exactly what one process with that batch would), or fewer when the validation
    // text is short. Distributed, each rank evaluates its share of them (`ValidationShare`) and
    // the losses are summed over the ranks.
    let val_streams_all = all_streams.min(val_text.num_chars().saturating_sub(1) / args.shape.seq).max(1);
    let val_streams = TextStreams::new(&val_text, val_streams_all, args.shape.seq)?;
    let val_share = dist.map(|d| ValidationShare::new(d.world_size(), d.rank(), val_streams_all));
    let val_batch = val_share.as_ref().map_or(val_streams_all, ValidationShare::rows);
    let unigram = unigram_loss(&train_text, &val_text);

    let mut train_loader: TextLoader = {
        let b = streams.tensor_loader().seed(loader_seed).num_workers(args.workers);
        let b = match &share {
            Some(s) => b.batch_size(args.batch_size).sampler(s.clone()),
            None => b,
        };
        if *device == Device::Cpu { b.build()? } else { b.stage_to(device.clone()).build()? }
    };
    let mut val_loader: TextLoader = {
        let b = val_streams.tensor_loader().num_workers(args.workers);
        // A rank with no validation stream (fewer streams than ranks) keeps the whole loader and
        // does not read it (`evaluate` is given 0 rows).
        let b = match &val_share {
            Some(s) if s.rows() > 0 => b.batch_size(s.rows()).sampler(*s),
            _ => b,
        };
        if *device == Device::Cpu { b.build()? } else { b.stage_to(device.clone()).build()? }
    };

    // ---- model
    let ModelDescription { parameters: num_parameters, name: model_name, settings: specific } =
        describe_model(args, vocab)?;
    let param_bytes = num_parameters * 4;
    let state_bytes = 4 * param_bytes;
    println!(
        "ferrite train: {dataset} ({} train / {} validation characters, vocabulary {vocab}), {model_name} on {device}",
        train_text.num_chars(),
        val_text.num_chars(),
    );
    println!(
        "  {num_parameters} parameters: weights {}, with gradients and AdamW moments {} before activations",
        format_size(param_bytes),
        format_size(state_bytes),
    );
    println!(
        "  {} streams x {} characters per chunk ({} chunks per epoch); {}",
        dist.map_or(args.batch_size.to_string(), |d| format!("{} ranks x {}", d.world_size(), args.batch_size)),
        args.shape.seq,
        chunks,
        describe_settings(args)
    );
    println!("  unigram model (character frequencies, no context): validation loss {unigram:.4}");
    let run = start_observer(&args.observe.settings(), model_name, &dataset, device)?;
    let dropout_rng = RngHandle::new(seeds.next_u64());
    let mut init = Generator::new(seeds.next_u64());
    let too_big = Hint::OutOfMemory(format!(
        "\nThe model alone does not fit: its weights need {}, and training them needs about {} (weights, gradients, AdamW moments) before any activation. Batch size, accumulation and checkpointing cannot help with that; use a smaller model or a device with more memory (`ferrite memory gpus`).",
        format_size(param_bytes),
        format_size(state_bytes)
    ));
    let mut model = ferrite_nn::with_parameter_dtype(super::params_dtype(args), || {
        build_model(args, vocab, device, &mut init, &dropout_rng)
    })
    .during_hint("building the model", device, too_big)?;
    super::zero_params_dtype(args, model.module_mut())?;
    // Distributed: rank 0's weights are broadcast now, and gradients are averaged in backward.
    // With --zero: AdamW over this rank's shards only, and gradients sharded at stage 2.
    let sync = match args.zero {
        Some(stage) => {
            dist.map(|d| d.zero_for(model.module(), stage, args.zero_comm_dtype.unwrap_or_default())).transpose()?
        }
        None => dist.map(|d| d.sync_for(model.module())).transpose()?,
    };
    let opt = Adam::named(model.named_parameters(), AdamConfig::adamw(args.lr).weight_decay(args.weight_decay))?;
    let opt: Box<dyn ferrite_optim::Optimizer> = match &sync {
        Some(s) => s.optimizer(opt)?,
        None => Box::new(opt),
    };
    let mut trainer = trainer_for(args, model, opt, device, epochs, run_settings(args, &dataset, specific))
        .dropout_rng(dropout_rng)
        .run_observer(run)
        .rank0(dist.is_none_or(|d| d.rank() == 0))
        .on_epoch_start(|epoch| {
            if let Some(s) = &share {
                s.set_epoch(epoch as u64);
            }
        })
        .evaluate(|m| Ok(Metrics::new().with("loss", evaluate(m, &mut val_loader, vocab, val_batch, device, dist)?)))
        .on_epoch(|e| {
            let val_loss = e.eval.get("loss").unwrap_or(f64::NAN);
            println!(
                "epoch {:>3}/{}  loss {:.4}  validation loss {val_loss:.4} (perplexity {:.2}; unigram {unigram:.4})  | {}  | {}",
                e.epoch,
                e.epochs,
                e.mean_loss,
                val_loss.exp(),
                e.memory_line,
                seconds(e.elapsed.as_secs_f64()),
            )
        });
    if let Some(sync) = sync {
        trainer = trainer.gradient_sync(sync);
    }
    let mut trainer = trainer.build()?;

    // ---- training
    let start = Instant::now();
    let step = ChunkStep {
        state: None,
        batch: args.batch_size,
        vocab,
        device: device.clone(),
        loss_fn: CrossEntropyLoss::new(),
    };
    let report = trainer.fit(&mut train_loader, step)?;
    let sync = trainer.take_gradient_sync();
    // ZeRO-3: the model whole again before it is evaluated or saved.
    if let Some(s) = &sync {
        s.gather_whole_model()?;
    }
    if let Some(note) = &report.checkpoint_not_written {
        println!("{note}");
    }
    let run = trainer.take_run_observer();
    let mut model = trainer.into_model();
    let first_epoch = report.resumed_epochs;
    let mut val_loss = report.epochs.last().and_then(|e| e.eval.get("loss")).unwrap_or(f64::NAN);
    if first_epoch >= epochs {
        val_loss =
            evaluate(&mut model, &mut val_loader, vocab, val_batch, device, dist).during("evaluation", device)?;
    }

    // ---- results
    let weights = args.out.clone().unwrap_or_else(|| {
        let stem = Path::new(&dataset).file_stem().and_then(|s| s.to_str()).unwrap_or("text").to_string();
        PathBuf::from(format!("ferrite-{stem}-{}.safetensors", args.model.name()))
    });
    let sd = model.state_dict();
    if dist.is_none_or(|d| d.rank() == 0) {
        ferrite_io::save_state_dict(&weights, sd.iter())?;
    }
    let sample = sample_text(&mut model, &text, device, args.shape.seq, args.seed).during("sampling", device)?;
    println!("sample: {}", sample.replace('\n', " ").trim());
    println!(
        "validation loss {val_loss:.4} (perplexity {:.2}; unigram {unigram:.4}) after {epochs} epochs ({} run here, {:.1}s); weights written to {}",
        val_loss.exp(),
        epochs.saturating_sub(first_epoch),
        start.elapsed().as_secs_f64(),
        weights.display()
    );
    println!("{}", allocator(device).memory_summary(true));
    if let Some(d) = dist {
        d.finish_and_report(sync, device)?;
    }
    if let Some(run) = run {
        run.finish();
    }
    Ok(())
}

/// The text `--data` or `--dataset` names (`jargon` by default, a file, or with `--data` a folder
/// of .txt files) and the name to report it by.
fn load_text(args: &TrainArgs) -> Result<(CharText, String), TrainError> {
    if let Some(path) = &args.data {
        return Ok((CharText::from_path(path, args.shape.seq)?, path.display().to_string()));
    }
    match args.dataset.as_deref() {
        None | Some("jargon") => Ok((CharText::jargon(args.shape.seq)?, "jargon".to_string())),
        Some(name @ ("digits" | "fashion-mnist")) => Err(TrainError::InvalidArgument {
            flag: "dataset",
            value: name.to_string(),
            expected: "a text for a language model: `jargon` (Debian's jargon-text) or the path of a UTF-8 text file; use --model mlp or cnn for images",
        }),
        Some(path) => Ok((CharText::from_file(Path::new(path), args.shape.seq)?, path.to_string())),
    }
}

/// What the log, the metrics and a resume need to know of a language model.
struct ModelDescription {
    parameters: u64,
    /// The model's name for the log and the metrics.
    name: String,
    /// The model's settings a resume must keep.
    settings: Vec<(String, String)>,
}

/// The [`ModelDescription`] of `args.model` over `vocab` characters.
fn describe_model(args: &TrainArgs, vocab: usize) -> Result<ModelDescription, TrainError> {
    let too_large = |flag: &'static str, value: usize| TrainError::InvalidArgument {
        flag,
        value: value.to_string(),
        expected: "too large: the model's size does not fit in 64 bits",
    };
    let setting = |k: &str, v: usize| (k.to_string(), v.to_string());
    match args.model {
        ModelKind::Lstm => {
            let spec = lstm_spec(args, vocab);
            let n = spec
                .num_parameters()
                .filter(|n| n.checked_mul(16).is_some())
                .ok_or(too_large("hidden", spec.hidden))?;
            let name = format!(
                "LSTM {}x{} (vocabulary {vocab}, truncated BPTT every {} characters)",
                spec.layers, spec.hidden, args.shape.seq
            );
            let settings =
                vec![setting("hidden", spec.hidden), setting("layers", spec.layers), setting("seq", args.shape.seq)];
            Ok(ModelDescription { parameters: n, name, settings })
        }
        ModelKind::Transformer => {
            let spec = transformer_spec(args, vocab)?;
            let n = spec
                .num_parameters()
                .filter(|n| n.checked_mul(16).is_some())
                .ok_or(too_large("d-model", spec.d_model))?;
            let name = format!(
                "transformer {} blocks x d_model {} x {} heads (context {}, vocabulary {vocab})",
                spec.layers, spec.d_model, spec.heads, spec.seq
            );
            let specific = vec![
                setting("layers", spec.layers),
                setting("d-model", spec.d_model),
                setting("heads", spec.heads),
                setting("seq", spec.seq),
            ];
            Ok(ModelDescription { parameters: n, name, settings: specific })
        }
        other => Err(TrainError::InvalidArgument {
            flag: "model",
            value: other.name().to_string(),
            expected: "a language model (lstm, transformer)",
        }),
    }
}

fn lstm_spec(args: &TrainArgs, vocab: usize) -> LstmSpec {
    LstmSpec {
        vocab,
        hidden: args.hidden(),
        layers: args.layers(),
        dropout: args.shape.dropout,
        checkpoint_activations: args.checkpoint_activations,
    }
}

fn transformer_spec(args: &TrainArgs, vocab: usize) -> Result<TransformerSpec, TrainError> {
    if args.shape.d_model == 0 || args.shape.heads == 0 || !args.shape.d_model.is_multiple_of(args.shape.heads) {
        return Err(TrainError::InvalidArgument {
            flag: "heads",
            value: format!("{} with --d-model {}", args.shape.heads, args.shape.d_model),
            expected: "must be at least 1 and divide --d-model (each head gets d_model / heads dimensions)",
        });
    }
    Ok(TransformerSpec {
        vocab,
        d_model: args.shape.d_model,
        heads: args.shape.heads,
        layers: args.layers(),
        seq: args.shape.seq,
        dropout: args.shape.dropout,
        checkpoint_activations: args.checkpoint_activations,
    })
}

fn build_model(
    args: &TrainArgs,
    vocab: usize,
    device: &Device,
    g: &mut Generator,
    dropout_rng: &RngHandle,
) -> Result<LanguageModel, TrainError> {
    Ok(match args.model {
        ModelKind::Lstm => LanguageModel::Lstm(build_lstm(&lstm_spec(args, vocab), device, g, dropout_rng)?),
        _ => LanguageModel::Transformer(build_transformer(&transformer_spec(args, vocab)?, device, g, dropout_rng)?),
    })
}

/// Mean cross-entropy per character over the validation streams (`batch` of them on this rank),
/// the state carried from chunk to chunk as in training; distributed, over every rank's streams.
fn evaluate(
    model: &mut LanguageModel,
    loader: &mut TextLoader,
    vocab: usize,
    batch: usize,
    device: &Device,
    dist: Option<&Distributed>,
) -> Result<f64, TrainError> {
    let was_training = model.module().is_training();
    model.module_mut().eval();
    // (loss summed over characters, characters) of this rank's streams.
    let local = (|| {
        if batch == 0 {
            return Ok((0.0, 0.0));
        }
        let _g = no_grad();
        let mut state = model.start_state(batch, device)?;
        let (mut sum, mut n) = (0.0f64, 0usize);
        let loss_fn = CrossEntropyLoss::new();
        for b in loader {
            let (x, y) = b?;
            let (logits, next) = model.chunk(&x, state.take())?;
            state = next;
            let chars = y.numel();
            sum += loss_fn.forward(&logits.reshape(&[-1, vocab as i64])?, &y.reshape(&[-1])?)?.item()? * chars as f64;
            n += chars;
            // Testing hook (FERRITE_FAULT_INJECT=at:eval): die mid-evaluation.
            ferrite_io::fault_point(ferrite_io::FaultPoint::Eval);
        }
        Ok((sum, n as f64))
    })();
    model.module_mut().train(was_training);
    let (sum, n) = match dist {
        Some(d) => d.sum_pairs(local)?,
        None => local?,
    };
    Ok(sum / n.max(1.0))
}

/// Cross-entropy (nats per character) of the validation text under the training text's
/// character frequencies (add-one smoothed, so no validation character has probability 0).
fn unigram_loss(train: &CharText, val: &CharText) -> f64 {
    let v = train.vocab_size();
    let mut counts = vec![1.0f64; v];
    let mut g = Generator::new(0);
    for ids in (0..train.len()).filter_map(|i| train.get(i, &mut g).ok()).map(|e| e.input) {
        for id in ids {
            counts[id as usize] += 1.0;
        }
    }
    let total: f64 = counts.iter().sum();
    let (mut nll, mut n) = (0.0, 0usize);
    for ids in (0..val.len()).filter_map(|i| val.get(i, &mut g).ok()).map(|e| e.target) {
        for id in ids {
            nll -= (counts.get(id as usize).copied().unwrap_or(1.0) / total).ln();
            n += 1;
        }
    }
    nll / n.max(1) as f64
}

/// `SAMPLE_CHARS` characters drawn from the model after a newline, one at a time.
fn sample_text(
    model: &mut LanguageModel,
    text: &CharText,
    device: &Device,
    context: usize,
    seed: u64,
) -> Result<String, TrainError> {
    let mut g = Generator::new(seed ^ 0x5a4d_504c_4520);
    let start = text.encode("\n").ok().and_then(|v| v.first().copied()).unwrap_or(0);
    let mut ids = vec![start];
    let was_training = model.module().is_training();
    model.module_mut().eval();
    let result = (|| {
        let _g = no_grad();
        let mut state = model.start_state(1, device)?;
        for _ in 0..SAMPLE_CHARS {
            // The LSTM reads one new character with its carried state; the transformer rereads its
            // window.
            let window: Vec<i64> = match &state {
                Some(_) => vec![i64::from(*ids.last().unwrap_or(&start))],
                None => ids[ids.len().saturating_sub(context)..].iter().map(|&i| i64::from(i)).collect(),
            };
            let n = window.len();
            let x = Tensor::from_vec(window, &[1, n], device)?;
            let (logits, next) = model.chunk(&x, state.take())?;
            state = next;
            let last = logits.select(1, n as i64 - 1)?.reshape(&[-1])?.to_vec_f64()?;
            ids.push(draw(&last, &mut g));
        }
        Ok(text.decode(&ids[1..]))
    })();
    model.module_mut().train(was_training);
    result
}

/// An index drawn from `softmax(logits / temperature)`.
fn draw(logits: &[f64], g: &mut Generator) -> u32 {
    let max = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let weights: Vec<f64> = logits.iter().map(|&l| ((l - max) / SAMPLE_TEMPERATURE).exp()).collect();
    let total: f64 = weights.iter().sum();
    let mut r = g.uniform_f64() * total;
    for (i, w) in weights.iter().enumerate() {
        r -= w;
        if r <= 0.0 {
            return i as u32;
        }
    }
    weights.len().saturating_sub(1) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_unigram_loss_is_the_entropy_of_the_frequencies() {
        // Two characters, equally frequent: ln 2 nats per character (with add-one smoothing,
        // both counts stay equal).
        let t = CharText::from_text("mem", &"ab".repeat(50), 4).unwrap();
        let (a, b) = t.split(0.5).unwrap();
        assert!((unigram_loss(&a, &b) - 2f64.ln()).abs() < 1e-12);
    }

    #[test]
    fn draws_follow_the_softmax() {
        let mut g = Generator::new(3);
        let logits = [0.0, 100.0, 0.0];
        assert!((0..50).all(|_| draw(&logits, &mut g) == 1));
    }
}
