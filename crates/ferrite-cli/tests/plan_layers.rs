//! Activations by layer for every built-in model: the planner names each of the model's children
//! (the names of its state_dict), and the layers add up to the activations the step saved.
use ferrite_cli::commands::train::{ModelArgs, ModelKind, TrainArgs};
use ferrite_plan::{Category, Phase, STEPS, StepTrace, Target, evaluate, record};
use ferrite_tensor::Device;

fn args(model: ModelKind, hidden: usize, layers: usize, batch: usize, ckpt: bool) -> TrainArgs {
    TrainArgs {
        model,
        shape: ModelArgs { hidden: Some(hidden), layers: Some(layers), seq: 16, ..ModelArgs::default() },
        batch_size: batch,
        checkpoint_activations: ckpt,
        device: Device::parse("sim:a100-40gb").unwrap(),
        ..TrainArgs::default_demo()
    }
}

/// Requested bytes of the blocks the last forward pass saved for backward, from the trace.
fn saved_by_last_forward(t: &StepTrace) -> u64 {
    t.events
        .iter()
        .zip(&t.info)
        .filter_map(|(e, i)| i.as_ref().map(|i| (e, i)))
        .filter(|(_, i)| i.category == Category::Activations && i.phase == Phase::Forward && i.step == STEPS - 1)
        .map(|(e, _)| e.size)
        .sum()
}

/// Records `a`'s step; checks the layer names against the model's children and the sum
/// against the trace; returns (layer, bytes).
fn by_layer(a: &TrainArgs) -> Vec<(String, u64)> {
    let p = a.plan_context().unwrap();
    let w = p.workload;
    let cfg = p.step;
    let t = record(&*w, &cfg).unwrap();
    // The children, built on the CPU (the meta allocator is the planner's).
    let children: Vec<String> = w.build(&cfg, &Device::Cpu).unwrap().children().into_iter().map(|(n, _)| n).collect();
    let named: Vec<&str> = t
        .activations_by_layer
        .iter()
        .map(|(n, _)| n.as_str())
        .filter(|n| *n != "inputs and embeddings" && *n != "loss")
        .collect();
    assert_eq!(named, children, "{:?}", t.activations_by_layer);
    assert!(t.activations_by_layer.iter().any(|(n, b)| n == "loss" && *b > 0), "{:?}", t.activations_by_layer);
    let sum: u64 = t.activations_by_layer.iter().map(|(_, b)| b).sum();
    assert_eq!(sum, saved_by_last_forward(&t), "{:?}", t.activations_by_layer);
    // The rendered plan carries the same list.
    let plan = evaluate(&t, &Target::parse("sim:a100-40gb", Default::default()).unwrap()).unwrap();
    assert_eq!(plan.activations_by_layer.len(), t.activations_by_layer.len());
    t.activations_by_layer
}

fn bytes(list: &[(String, u64)], layer: &str) -> u64 {
    list.iter().find(|(n, _)| n == layer).map(|(_, b)| *b).unwrap_or_else(|| panic!("no {layer} in {list:?}"))
}

#[test]
fn mlp_activations_are_reported_per_block_and_head() {
    let l = by_layer(&args(ModelKind::Mlp, 256, 4, 64, false));
    // Every block saves its Linear input and ReLU output: batch × width f32 each at least.
    for b in ["0", "1", "2", "3"] {
        assert!(bytes(&l, b) >= 64 * 256 * 4, "{b}: {l:?}");
    }
    // Checkpointing keeps only the segments' inputs: the blocks save less in all.
    let c = by_layer(&args(ModelKind::Mlp, 256, 4, 64, true));
    let blocks = |l: &[(String, u64)]| ["0", "1", "2", "3"].iter().map(|b| bytes(l, b)).sum::<u64>();
    assert!(blocks(&c) < blocks(&l), "{c:?} vs {l:?}");
}

#[test]
fn cnn_activations_are_reported_per_conv_block() {
    let l = by_layer(&args(ModelKind::Cnn, 8, 2, 16, false));
    assert!(bytes(&l, "0") > bytes(&l, "1"), "the first block works on the largest maps: {l:?}");
    assert!(bytes(&l, "1") > 0 && bytes(&l, "3") > 0, "{l:?}");
}

#[test]
fn lstm_activations_are_reported_for_encoder_rnn_and_decoder() {
    let l = by_layer(&args(ModelKind::Lstm, 64, 1, 8, false));
    // The recurrence saves its inputs, gates and states per time step; the embedding's output is
    // copied into the recurrence's layout and the decoder's logits are consumed by the loss
    // (which saves its own), so those two keep nothing of their own.
    assert!(bytes(&l, "rnn") >= 8 * 16 * 4 * 64 * 4, "{l:?}");
    let checkpointed = by_layer(&args(ModelKind::Lstm, 64, 1, 8, true));
    assert!(bytes(&checkpointed, "rnn") < bytes(&l, "rnn"), "{checkpointed:?} vs {l:?}");
}

#[test]
fn transformer_activations_keep_their_block_names() {
    let mut a = args(ModelKind::Transformer, 32, 2, 4, false);
    (a.shape.d_model, a.shape.heads) = (32, 2);
    let p = a.plan_context().unwrap();
    let t = record(&*p.workload, &p.step).unwrap();
    let names: Vec<&str> = t.activations_by_layer.iter().map(|(n, _)| n.as_str()).collect();
    assert!(names.contains(&"blocks.0") && names.contains(&"blocks.1") && names.contains(&"loss"), "{names:?}");
    let sum: u64 = t.activations_by_layer.iter().map(|(_, b)| b).sum();
    assert_eq!(sum, saved_by_last_forward(&t));
}

#[test]
fn the_layers_add_up_to_the_activations_at_a_peak_in_backward() {
    // A wide batch puts the peak at the start of backward, where every saved activation is live.
    let a = args(ModelKind::Mlp, 1024, 3, 4096, false);
    let p = a.plan_context().unwrap();
    let plan = ferrite_plan::plan(&*p.workload, &p.step, &p.target().unwrap()).unwrap();
    let sum: u64 = plan.activations_by_layer.iter().map(|l| l.bytes).sum();
    let cat = plan.breakdown.activations;
    let diff = sum.abs_diff(cat) as f64 / cat.max(1) as f64;
    assert!(diff < 0.05, "layers {sum} vs activations category {cat} at the peak ({:?})", plan.peak_at);
}
