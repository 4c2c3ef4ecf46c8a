//! `ferrite inspect FILE [--json]`: every tensor of a checkpoint — name, dtype, shape, sum.
//!
//! Works on `.pt`/`.pth` (zip or legacy, through the safe reader: files that would run code are
//! refused with the reason), safetensors files and ferrite training checkpoints. The sums let you
//! compare a file with what PyTorch reports (`t.double().sum()`) without loading PyTorch.

use std::path::PathBuf;

use ferrite_io::Value;

use super::CliResult;

#[derive(clap::Args, Debug, Clone)]
pub struct InspectArgs {
    /// A .pt, .pth or .safetensors file (the format is recognised from its contents).
    pub file: PathBuf,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: InspectArgs) -> CliResult {
    print!("{}", render(&args)?);
    Ok(())
}

/// The text (or JSON) `run` prints.
fn render(args: &InspectArgs) -> Result<String, Box<dyn std::error::Error + Send + Sync>> {
    use std::fmt::Write;
    let mut o = String::new();
    let (format, tree) = ferrite_io::read_with_format(&args.file)?;
    let tensors = tree.tensors();
    let scalars = scalar_entries(&tree);
    if args.json {
        let list: Vec<serde_json::Value> = tensors
            .iter()
            .map(|(name, t)| {
                serde_json::json!({
                    "name": name,
                    "dtype": t.dtype().name(),
                    "shape": t.shape(),
                    "sum": t.sum_f64(),
                    "device": t.location(),
                })
            })
            .collect();
        let values: serde_json::Map<String, serde_json::Value> =
            scalars.iter().map(|(k, v)| (k.clone(), scalar_json(v))).collect();
        let out = serde_json::json!({
            "file": args.file.display().to_string(),
            "format": format.name(),
            "tensors": list,
            "values": values,
        });
        writeln!(o, "{}", serde_json::to_string_pretty(&out)?)?;
        return Ok(o);
    }
    let total: usize = tensors.iter().map(|(_, t)| t.numel()).sum();
    let bytes: usize = tensors.iter().map(|(_, t)| t.nbytes()).sum();
    writeln!(
        o,
        "{} ({}): {} tensors, {} elements, {:.2} MiB",
        args.file.display(),
        format.name(),
        tensors.len(),
        total,
        bytes as f64 / (1 << 20) as f64
    )?;
    let name_w = tensors.iter().map(|(n, _)| n.len()).max().unwrap_or(4).max(4);
    let shape_w = tensors.iter().map(|(_, t)| format!("{:?}", t.shape()).len()).max().unwrap_or(5).max(5);
    // Where tensors were saved matters only when it is not the CPU (a map location is then needed).
    let devices = tensors.iter().any(|(_, t)| t.location() != "cpu");
    let dev_w = tensors.iter().map(|(_, t)| t.location().len()).max().unwrap_or(6).max(6);
    let device = |d: &str| if devices { format!("{d:<dev_w$}  ") } else { String::new() };
    writeln!(o, "{:<name_w$}  {:<8}  {:<shape_w$}  {}sum", "name", "dtype", "shape", device("device"))?;
    for (name, t) in &tensors {
        writeln!(
            o,
            "{:<name_w$}  {:<8}  {:<shape_w$}  {}{}",
            name,
            t.dtype().name(),
            format!("{:?}", t.shape()),
            device(t.location()),
            t.sum_f64()
        )?;
    }
    if !scalars.is_empty() {
        writeln!(o)?;
        for (k, v) in &scalars {
            writeln!(o, "{k} = {}", scalar_text(v))?;
        }
    }
    Ok(o)
}

/// Non-tensor leaves outside state_dicts (epoch, loss, learning rates, …), by path. A list or
/// tuple of plain values is one leaf (`betas = (0.9, 0.999)`); one that holds containers is
/// walked into, so printing a leaf never recurses.
fn scalar_entries(tree: &Value) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    tree.walk(|path, v| match v {
        Value::Dict(_) => true,
        Value::List(items) | Value::Tuple(items)
            if items
                .iter()
                .any(|x| matches!(x, Value::Dict(_) | Value::List(_) | Value::Tuple(_) | Value::Tensor(_))) =>
        {
            true
        }
        Value::Tensor(_) => false,
        leaf => {
            out.push((path.join("/"), leaf.clone()));
            false
        }
    });
    out
}

fn scalar_text(v: &Value) -> String {
    match v {
        Value::None => "None".into(),
        Value::Bool(b) => b.to_string(),
        Value::Int(i) => i.to_string(),
        Value::Float(f) => format!("{f:?}"),
        Value::Str(s) => format!("{s:?}"),
        Value::Bytes(b) => format!("<{} bytes>", b.len()),
        Value::List(items) | Value::Tuple(items) => {
            let parts: Vec<String> = items.iter().map(scalar_text).collect();
            if matches!(v, Value::Tuple(_)) {
                format!("({})", parts.join(", "))
            } else {
                format!("[{}]", parts.join(", "))
            }
        }
        other => other.kind().to_string(),
    }
}

fn scalar_json(v: &Value) -> serde_json::Value {
    match v {
        Value::None => serde_json::Value::Null,
        Value::Bool(b) => (*b).into(),
        Value::Int(i) => (*i).into(),
        Value::Float(f) => {
            serde_json::Number::from_f64(*f).map(serde_json::Value::Number).unwrap_or_else(|| f.to_string().into())
        }
        Value::Str(s) => s.clone().into(),
        Value::List(items) | Value::Tuple(items) => items.iter().map(scalar_json).collect(),
        other => scalar_text(other).into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_lists_every_tensor_with_dtype_shape_and_sum() {
        // Every figure is compared with PyTorch's own listing of the file (expected.json `files`).
        let Some(file) = ferrite_test_support::pytorch_file_or_skip("training_checkpoint.pt") else { return };
        let listing: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(file.with_file_name("expected.json")).unwrap()).unwrap();
        let listing = &listing["files"]["training_checkpoint.pt"];
        let out = render(&InspectArgs { file, json: true }).unwrap();
        let j: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(j["format"], "pytorch-zip");
        let tensors = j["tensors"].as_array().unwrap();
        let want = listing["tensors"].as_object().unwrap();
        assert_eq!(tensors.len(), want.len());
        for (path, w) in want {
            let t = tensors.iter().find(|t| t["name"] == path.as_str()).unwrap_or_else(|| panic!("{path} missing"));
            assert_eq!(t["dtype"], w["dtype"], "{path}");
            assert_eq!(t["shape"], w["shape"], "{path}");
            let (got, want) = (t["sum"].as_f64().unwrap(), w["sum"].as_f64().unwrap());
            assert!((got - want).abs() <= 1e-9 * want.abs().max(1.0), "{path}: {got} vs {want}");
        }
        for key in ["epoch", "loss"] {
            assert_eq!(j["values"][key], listing["values"][key], "{key}");
        }
    }

    #[test]
    fn saved_devices_are_shown_when_not_all_cpu() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.ckpt");
        let mut w = ferrite_io::RawTensor::from_values(vec![2], &[1.0f32, 2.0]).unwrap();
        w.set_location("cuda:1");
        let mut tree = Value::dict();
        tree.insert("w", w).unwrap();
        tree.insert("b", ferrite_io::RawTensor::from_values(vec![1], &[0.5f32]).unwrap()).unwrap();
        ferrite_io::save_checkpoint(&file, &tree).unwrap();
        let out = render(&InspectArgs { file: file.clone(), json: false }).unwrap();
        assert!(out.contains("device") && out.contains("cuda:1") && out.contains("cpu"), "{out}");
        let j: serde_json::Value = serde_json::from_str(&render(&InspectArgs { file, json: true }).unwrap()).unwrap();
        assert_eq!(j["tensors"][0]["device"], "cuda:1");
    }

    #[test]
    fn table_and_refusals() {
        let Some(file) = ferrite_test_support::pytorch_file_or_skip("bf16_state_dict.pt") else { return };
        let out = render(&InspectArgs { file, json: false }).unwrap();
        assert!(out.contains("7 tensors") && out.contains("bfloat16") && out.contains("[11, 6]"), "{out}");
        assert!(!out.contains("device"), "no device column when everything was saved on the CPU: {out}");
        for bad in ["malicious_reduce.pt", "full_model_pickle.pt"] {
            let err =
                render(&InspectArgs { file: ferrite_test_support::pytorch_file_or_skip(bad).unwrap(), json: false })
                    .unwrap_err()
                    .to_string();
            assert!(err.contains("refused to load"), "{err}");
        }
    }
}
