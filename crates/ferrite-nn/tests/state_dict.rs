//! State dicts seen from outside: PyTorch's key names for nested models (checked against
//! PyTorch-written fixtures and listings), round trips that keep optimizer handles valid, strict
//! and non-strict errors worded like PyTorch, and the `module.` prefix hint.

mod common;

use common::{assert_bits_equal, get, load_safetensors, reference_or_skip};
use ferrite_nn::{
    AttentionConfig, Checkpointed, CrossEntropyLoss, Dropout, Embedding, GELU, LayerNorm, Linear, LoadOptions, Module,
    MultiheadAttention, NnError, ReLU, Result, Sequential, StateDict, Tanh, TransformerBlock, TransformerConfig,
};
use ferrite_tensor::{DType, Device, Generator, Tensor};

/// A user-defined model: fields are children, named as in PyTorch's attribute names.
#[derive(Clone)]
struct Net {
    emb: Embedding,
    encoder: Sequential,
    head: Linear,
    training: bool,
}

impl Net {
    fn new(g: &mut Generator) -> Result<Net> {
        let d = Device::Cpu;
        Ok(Net {
            emb: Embedding::new_with(10, 8, None, &d, g)?,
            encoder: Sequential::new()
                .append(Linear::new_with(8, 8, true, &d, g)?)
                .append(GELU::new())
                .append(Dropout::new_with(0.1, g)?)
                .append(Sequential::new().append(LayerNorm::new(&[8])?).append(Linear::new_with(8, 4, false, &d, g)?)),
            head: Linear::new_with(4, 3, true, &d, g)?,
            training: true,
        })
    }
}

impl Module for Net {
    fn type_name(&self) -> &'static str {
        "Net"
    }
    fn forward(&self, idx: &Tensor) -> Result<Tensor> {
        self.head.forward(&self.encoder.forward(&self.emb.forward(idx)?)?)
    }
    fn children(&self) -> Vec<(String, &dyn Module)> {
        vec![("emb".into(), &self.emb), ("encoder".into(), &self.encoder), ("head".into(), &self.head)]
    }
    fn children_mut(&mut self) -> Vec<(String, &mut dyn Module)> {
        vec![("emb".into(), &mut self.emb), ("encoder".into(), &mut self.encoder), ("head".into(), &mut self.head)]
    }
    fn is_training(&self) -> bool {
        self.training
    }
    fn set_own_training(&mut self, t: bool) {
        self.training = t;
    }
}

fn keys(sd: &StateDict) -> Vec<String> {
    sd.keys().map(String::from).collect()
}

#[test]
fn nested_model_names_equal_pytorchs() {
    let net = Net::new(&mut Generator::new(0)).unwrap();
    // Printed by PyTorch 2.15 for the same model (`list(net.state_dict())`).
    let want = [
        "emb.weight",
        "encoder.0.weight",
        "encoder.0.bias",
        "encoder.3.0.weight",
        "encoder.3.0.bias",
        "encoder.3.1.weight",
        "head.weight",
        "head.bias",
    ];
    assert_eq!(keys(&net.state_dict()), want);
    let named: Vec<String> = net.named_parameters().into_iter().map(|(n, _)| n).collect();
    assert_eq!(named, want);
    let modules: Vec<String> = net.named_modules().into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        modules,
        ["emb", "encoder", "encoder.0", "encoder.1", "encoder.2", "encoder.3", "encoder.3.0", "encoder.3.1", "head"]
    );
    assert_eq!(net.num_parameters(), 80 + 72 + 16 + 32 + 15);
}

#[test]
fn transformer_and_attention_names_equal_pytorchs() {
    let mut g = Generator::new(0);
    let block =
        TransformerBlock::new_with(TransformerConfig::new(16, 4).dim_feedforward(32), &Device::Cpu, &mut g).unwrap();
    // nn.TransformerEncoderLayer(16, 4, 32, norm_first=True, batch_first=True).state_dict()
    let want: [(&str, &[usize]); 12] = [
        ("self_attn.in_proj_weight", &[48, 16]),
        ("self_attn.in_proj_bias", &[48]),
        ("self_attn.out_proj.weight", &[16, 16]),
        ("self_attn.out_proj.bias", &[16]),
        ("linear1.weight", &[32, 16]),
        ("linear1.bias", &[32]),
        ("linear2.weight", &[16, 32]),
        ("linear2.bias", &[16]),
        ("norm1.weight", &[16]),
        ("norm1.bias", &[16]),
        ("norm2.weight", &[16]),
        ("norm2.bias", &[16]),
    ];
    let sd = block.state_dict();
    let got: Vec<(&str, &[usize])> = sd.iter().map(|(k, t)| (k, t.shape())).collect();
    assert_eq!(got, want);
    let mha = MultiheadAttention::new_with(AttentionConfig::new(16, 4).bias(false), &Device::Cpu, &mut g).unwrap();
    assert_eq!(keys(&mha.state_dict()), ["in_proj_weight", "out_proj.weight"]);
}

/// Key order, shapes and dtypes of `pytorch/plain_state_dict.pt` as recorded in expected.json.
#[test]
fn names_match_a_pytorch_written_state_dict() {
    let Some(dir) = reference_or_skip() else { return };
    let text = std::fs::read_to_string(dir.join("pytorch/expected.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let entries = v["plain_state_dict"].as_object().unwrap();
    // serde_json sorts keys; recover the file's order from their positions in the text.
    let section = &text[text.find("\"plain_state_dict\"").unwrap()..];
    let mut want: Vec<(&String, &serde_json::Value)> = entries.iter().collect();
    want.sort_by_key(|(k, _)| section.find(&format!("\"{k}\"")).unwrap());

    #[derive(Clone)]
    struct Plain {
        emb: Embedding,
        fc1: Linear,
        fc2: Linear,
        norm: LayerNorm,
    }
    impl Module for Plain {
        fn type_name(&self) -> &'static str {
            "Plain"
        }
        fn forward(&self, x: &Tensor) -> Result<Tensor> {
            self.fc2.forward(&self.norm.forward(&self.fc1.forward(&self.emb.forward(x)?)?)?)
        }
        fn children(&self) -> Vec<(String, &dyn Module)> {
            vec![
                ("emb".into(), &self.emb),
                ("fc1".into(), &self.fc1),
                ("fc2".into(), &self.fc2),
                ("norm".into(), &self.norm),
            ]
        }
        fn children_mut(&mut self) -> Vec<(String, &mut dyn Module)> {
            vec![
                ("emb".into(), &mut self.emb),
                ("fc1".into(), &mut self.fc1),
                ("fc2".into(), &mut self.fc2),
                ("norm".into(), &mut self.norm),
            ]
        }
        fn is_training(&self) -> bool {
            true
        }
        fn set_own_training(&mut self, _: bool) {}
    }
    let mut g = Generator::new(0);
    let d = Device::Cpu;
    let m = Plain {
        emb: Embedding::new_with(11, 4, None, &d, &mut g).unwrap(),
        fc1: Linear::new_with(4, 6, true, &d, &mut g).unwrap(),
        fc2: Linear::new_with(6, 11, true, &d, &mut g).unwrap(),
        norm: LayerNorm::new(&[6]).unwrap(),
    };
    let sd = m.state_dict();
    assert_eq!(sd.len(), want.len());
    for ((k, t), (wk, wv)) in sd.iter().zip(&want) {
        assert_eq!(k, wk.as_str());
        let shape: Vec<usize> = wv["shape"].as_array().unwrap().iter().map(|s| s.as_u64().unwrap() as usize).collect();
        assert_eq!(t.shape(), shape.as_slice(), "{k}");
        assert_eq!(t.dtype().name(), wv["dtype"].as_str().unwrap(), "{k}");
    }
}

/// The optimizer fixtures were written from `nn.Sequential(Linear(8,16), Tanh(), Linear(16,3))`
/// with PyTorch's names; loading `init.*` strictly and computing the first loss must match.
#[test]
fn loads_pytorch_sequential_weights_and_reproduces_its_first_loss() {
    let Some(dir) = reference_or_skip() else { return };
    let fx = load_safetensors(&dir.join("train/sgd_momentum.safetensors"));
    let mut init: StateDict =
        fx.iter().filter(|(k, _)| k.starts_with("init.")).map(|(k, t)| (k.to_string(), t.clone())).collect();
    assert_eq!(init.strip_prefix("init."), 4);
    let mut g = Generator::new(1);
    let d = Device::Cpu;
    let mut model = Sequential::new()
        .append(Linear::new_with(8, 16, true, &d, &mut g).unwrap())
        .append(Tanh::new())
        .append(Linear::new_with(16, 3, true, &d, &mut g).unwrap());
    let report = model.load_state_dict(&init, true).unwrap();
    assert!(report.is_empty());
    let x = get(&fx, "X").narrow(0, 0, 4).unwrap();
    let y = get(&fx, "Y").narrow(0, 0, 4).unwrap();
    let loss = CrossEntropyLoss::new().forward(&model.forward(&x).unwrap(), &y).unwrap().item().unwrap();
    let want = get(&fx, "losses").to_vec_f64().unwrap()[0];
    println!("first loss: ferrite {loss:.7}, PyTorch {want:.7}");
    assert!((loss - want).abs() < 1e-5);
}

#[test]
fn round_trip_copies_in_place_across_devices_and_dtypes() {
    let src = Net::new(&mut Generator::new(1)).unwrap();
    let mut dst = Net::new(&mut Generator::new(2)).unwrap();
    let sim = Device::parse("sim:1GiB:40").unwrap();
    dst.to_device(&sim).unwrap();
    let handles = dst.parameters();
    // PyTorch's `param.copy_(cpu_tensor)`: the weights go straight into the parameters' memory,
    // the device allocates nothing while the model loads (no staging copy of any weight).
    let device_memory = ferrite_memory::allocator(&sim);
    device_memory.reset_peak_memory_stats();
    let (held, allocs) = (device_memory.memory_allocated(), device_memory.memory_stats().allocation.all.allocated);
    let report = dst.load_state_dict(&src.state_dict(), true).unwrap();
    assert!(report.is_empty());
    assert_eq!(device_memory.max_memory_allocated(), held, "loading must not allocate on the device");
    assert_eq!(device_memory.memory_stats().allocation.all.allocated, allocs);
    for (h, p) in handles.iter().zip(dst.parameters()) {
        assert!(h.shares_storage(&p), "load copies into the existing tensors (optimizer handles stay valid)");
        assert!(p.requires_grad() && p.is_leaf());
        assert_eq!(p.device(), &Device::parse("sim:1GiB:40").unwrap());
    }
    for ((k, a), (_, b)) in src.state_dict().iter().zip(dst.state_dict().iter()) {
        assert_bits_equal(k, a, &b.to_device(&Device::Cpu).unwrap());
    }
    // A bf16 checkpoint loads into f32 parameters (converted on copy).
    let mut half = src.clone();
    half.to_dtype(DType::BF16).unwrap();
    assert!(half.state_dict().iter().all(|(_, t)| t.dtype() == DType::BF16));
    dst.load_state_dict(&half.state_dict(), true).unwrap();
    assert!(dst.state_dict().iter().all(|(_, t)| t.dtype() == DType::F32));
    assert_eq!(device_memory.max_memory_allocated(), held, "the bf16 → f32 conversion happens on the host side");
    for ((k, a), (_, b)) in half.state_dict().iter().zip(dst.state_dict().iter()) {
        assert_bits_equal(k, &a.to_dtype(DType::F32).unwrap(), &b.to_device(&Device::Cpu).unwrap());
    }
}

#[test]
fn strict_errors_list_missing_then_unexpected_like_pytorch() {
    let mut lin = Linear::new_with(3, 2, true, &Device::Cpu, &mut Generator::new(0)).unwrap();
    let before = lin.weight.to_vec::<f32>().unwrap();
    let mut sd = StateDict::new();
    sd.insert("weight", Tensor::zeros(&[2, 4], DType::F32, &Device::Cpu).unwrap());
    sd.insert("extra", Tensor::zeros(&[1], DType::F32, &Device::Cpu).unwrap());
    let err = lin.load_state_dict(&sd, true).unwrap_err().to_string();
    assert_eq!(
        err,
        "Error(s) in loading state_dict for Linear:\n\tMissing key(s) in state_dict: \"bias\". \n\tUnexpected key(s) in state_dict: \"extra\". \n\tsize mismatch for weight: copying a param with shape [2, 4] from checkpoint, the shape in current model is [2, 3]."
    );
    // Size mismatches are an error even when not strict; nothing is copied.
    let e = lin.load_state_dict(&sd, false).unwrap_err();
    let NnError::LoadStateDict(detail) = &e else { panic!("{e}") };
    assert!(detail.missing.is_empty() && detail.unexpected.is_empty() && detail.size_mismatches.len() == 1);
    assert_eq!(lin.weight.to_vec::<f32>().unwrap(), before);
    // Non-strict with matching shapes: copies what matches, reports the rest.
    sd.insert("weight", Tensor::ones(&[2, 3], DType::F32, &Device::Cpu).unwrap());
    let r = lin.load_state_dict(&sd, false).unwrap();
    assert_eq!(r.missing_keys, ["bias"]);
    assert_eq!(r.unexpected_keys, ["extra"]);
    assert_eq!(lin.weight.to_vec::<f32>().unwrap(), vec![1.0; 6]);
}

#[test]
fn module_prefix_is_diagnosed_and_stripped_by_an_option() {
    let src = Sequential::new()
        .append(Linear::new_with(3, 2, true, &Device::Cpu, &mut Generator::new(0)).unwrap())
        .append(ReLU::new());
    let dp = src.state_dict().with_prefix("module.");
    let mut dst = Sequential::new()
        .append(Linear::new_with(3, 2, true, &Device::Cpu, &mut Generator::new(1)).unwrap())
        .append(ReLU::new());
    let err = dst.load_state_dict(&dp, true).unwrap_err();
    let msg = err.to_string();
    println!("{msg}");
    assert!(msg.starts_with(
        "Error(s) in loading state_dict for Sequential:\n\tMissing key(s) in state_dict: \"0.weight\", \"0.bias\". \n\tUnexpected key(s) in state_dict: \"module.0.weight\", \"module.0.bias\". "
    ));
    assert!(msg.contains("All unexpected keys start with \"module.\""));
    assert!(msg.contains("strip_prefix: Some(\"module.\".into())"));
    let opts = LoadOptions { strip_prefix: Some("module.".into()), ..Default::default() };
    assert!(dst.load_state_dict_with(&dp, &opts).unwrap().is_empty());
    assert_bits_equal(
        "weight",
        &dst.state_dict().get("0.weight").unwrap().clone(),
        src.state_dict().get("0.weight").unwrap(),
    );
    // No hint when the unexpected keys are something else.
    let mut other = src.state_dict();
    other.insert("head.weight", Tensor::zeros(&[1], DType::F32, &Device::Cpu).unwrap());
    let msg = dst.load_state_dict(&other, true).unwrap_err().to_string();
    assert!(!msg.contains("module."), "{msg}");
}

#[test]
fn train_eval_zero_grad_and_checkpointed_wrapper() {
    let mut net = Net::new(&mut Generator::new(3)).unwrap();
    net.eval();
    assert!(net.named_modules().iter().all(|(_, m)| !m.is_training()) && !net.is_training());
    net.train(true);
    assert!(net.named_modules().iter().all(|(_, m)| m.is_training()));
    let idx = Tensor::from_vec(vec![1i64, 2, 3], &[3], &Device::Cpu).unwrap();
    net.forward(&idx).unwrap().sum().unwrap().backward().unwrap();
    assert!(net.parameters().iter().all(|p| p.grad().is_some()));
    net.zero_grad().unwrap();
    assert!(net.parameters().iter().all(|p| p.grad().is_none()));
    // Checkpointing a module does not change its state-dict keys.
    let plain = Sequential::new().append(Linear::new(4, 4).unwrap()).append(ReLU::new());
    let wrapped = Sequential::new().append(Checkpointed::new(plain.clone())).append(Linear::new(4, 2).unwrap());
    assert_eq!(keys(&wrapped.state_dict()), ["0.0.weight", "0.0.bias", "1.weight", "1.bias"]);
}

#[test]
fn tied_parameters_are_listed_once_and_stay_tied_when_moved() {
    let mut a = Linear::new(4, 4).unwrap();
    let mut b = a.clone(); // shares a's tensors
    b.bias = None;
    let mut tied = Sequential::new().append(a.clone()).append(b);
    assert_eq!(keys(&tied.state_dict()), ["0.weight", "0.bias", "1.weight"]);
    assert_eq!(tied.parameters().len(), 2);
    tied.to_device(&Device::parse("sim:1GiB:41").unwrap()).unwrap();
    let sd = tied.state_dict();
    assert!(sd.get("0.weight").unwrap().shares_storage(sd.get("1.weight").unwrap()));
    a.to_dtype(DType::F16).unwrap();
    assert_eq!(a.weight.dtype(), DType::F16);
    assert!(a.weight.requires_grad());
}

#[test]
fn modules_are_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Box<dyn Module>>();
    check::<Sequential>();
    check::<TransformerBlock>();
    check::<Checkpointed<Sequential>>();
    check::<StateDict>();
    // And actually usable from another thread.
    let m = Sequential::new().append(Linear::new(2, 2).unwrap()).append(Tanh::new());
    let x = Tensor::ones(&[1, 2], DType::F32, &Device::Cpu).unwrap();
    let y = std::thread::spawn(move || m.forward(&x).unwrap().to_vec::<f32>().unwrap()).join().unwrap();
    assert_eq!(y.len(), 2);
}
