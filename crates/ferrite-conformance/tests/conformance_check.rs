//! The conformance check from outside: every reference case passes on every device under test
//! (`FERRITE_TEST_DEVICES`, default cpu and every GPU adapter — CI runs it on Mesa's lavapipe),
//! and the check is not one that cannot fail: a copy of the fixture folder with one expected value
//! moved per suite fails exactly those cases, a folder that lost a family fails, and a folder that
//! is not the fixtures is a typed error.

use std::path::Path;

use ferrite_conformance::{ConformanceError, Outcome, Suite, check_device, read_safetensors};
use ferrite_tensor::Device;
use serde_json::Value;

fn cases(dir: &Path, rel: &str) -> Vec<Value> {
    let m: Value = serde_json::from_str(&std::fs::read_to_string(dir.join(rel)).unwrap()).unwrap();
    m["cases"].as_array().unwrap().clone()
}

#[test]
fn every_reference_case_passes_on_every_device_under_test() {
    let Some(dir) = ferrite_test_support::reference_or_skip("ops/manifest.json") else { return };
    let expected = cases(&dir, "ops/manifest.json").len()
        + cases(&dir, "models/manifest.json").len()
        + cases(&dir, "train/manifest.json").len()
        + 1;
    ferrite_test_support::for_each_device_where(
        |d| !matches!(d, Device::Meta),
        |dev| {
            let report = check_device(dev, &dir).unwrap();
            print!("{}", report.text());
            assert_eq!(report.cases.len(), expected, "one result per fixture case and one for the GradScaler");
            let failed: Vec<String> =
                report.failed().map(|c| format!("{} {}: {:?}", c.suite.name(), c.name, c.outcome)).collect();
            assert!(failed.is_empty(), "{} cases failed on {dev}:\n  {}", failed.len(), failed.join("\n  "));
        },
    );
}

/// Copies `from` into `to`, recursively.
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let dest = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &dest);
        } else {
            std::fs::copy(entry.path(), dest).unwrap();
        }
    }
}

/// Rewrites the safetensors file `path` with `add` added to element 0 of tensor `name`.
fn nudge(path: &Path, name: &str, add: f32) {
    let tensors = read_safetensors(path).unwrap();
    let mut owned: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    for (n, t) in &tensors {
        let (dtype, bytes) = match t.dtype() {
            ferrite_tensor::DType::F32 => {
                let mut v = t.to_vec::<f32>().unwrap();
                if n == name {
                    v[0] += add;
                }
                (safetensors::Dtype::F32, v.iter().flat_map(|x| x.to_le_bytes()).collect())
            }
            _ => (safetensors::Dtype::I64, t.to_vec::<i64>().unwrap().iter().flat_map(|x| x.to_le_bytes()).collect()),
        };
        owned.push((n.clone(), dtype, t.shape().to_vec(), bytes));
    }
    assert!(owned.iter().any(|(n, ..)| n == name), "{}: no `{name}`", path.display());
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = owned
        .iter()
        .map(|(n, d, s, b)| (n.clone(), safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    std::fs::write(path, safetensors::serialize(views, None).unwrap()).unwrap();
}

#[test]
fn a_moved_expected_value_fails_exactly_its_case_in_every_suite() {
    let Some(dir) = ferrite_test_support::reference_or_skip("ops/manifest.json") else { return };
    let tmp = tempfile::tempdir().unwrap();
    let copy = tmp.path().join("fixtures");
    copy_dir(&dir, &copy);
    // One expected value moved far outside its tolerance per suite.
    let first = |rel: &str, op: &[&str]| -> String {
        cases(&copy, rel)
            .iter()
            .find(|c| op.is_empty() || op.contains(&c["op"].as_str().unwrap()))
            .map(|c| c["name"].as_str().unwrap().to_string())
            .unwrap()
    };
    let op_case = first("ops/manifest.json", &[]);
    nudge(&copy.join("ops").join(format!("{op_case}.safetensors")), "output", 1.0);
    let conv_case = first("models/manifest.json", &["conv2d"]);
    nudge(&copy.join("models").join(format!("{conv_case}.safetensors")), "grad_input.1", 1.0);
    let rnn_case = first("models/manifest.json", &["lstm", "gru"]);
    nudge(&copy.join("models").join(format!("{rnn_case}.safetensors")), "extra.h_n", 1.0);
    let train_case = first("train/manifest.json", &[]);
    nudge(&copy.join("train").join(format!("{train_case}.safetensors")), "final.2.bias", 1e-3);
    let gs_path = copy.join("train/grad_scaler.json");
    let mut gs: Value = serde_json::from_str(&std::fs::read_to_string(&gs_path).unwrap()).unwrap();
    let last = gs["steps"].as_array().unwrap().len() - 1;
    let scale = gs["steps"][last]["scale_after"].as_f64().unwrap();
    gs["steps"][last]["scale_after"] = Value::from(scale * 2.0);
    std::fs::write(&gs_path, gs.to_string()).unwrap();

    let report = check_device(&Device::Cpu, &copy).unwrap();
    let mut failed: Vec<(Suite, String, String)> = report
        .failed()
        .map(|c| match &c.outcome {
            Outcome::Failed { reason } => (c.suite, c.name.clone(), reason.clone()),
            Outcome::Passed { .. } => unreachable!(),
        })
        .collect();
    failed.sort_by_key(|f| f.1.clone());
    let mut want = vec![
        (Suite::Ops, op_case, "output: element 0".to_string()),
        (Suite::Convolution, conv_case, "grad_input.1: element 0".to_string()),
        (Suite::Recurrent, rnn_case, "h_n: element 0".to_string()),
        (Suite::Optimizers, train_case, "final.2.bias: element 0".to_string()),
        (Suite::GradScaler, "grad_scaler".to_string(), format!("step {last}: scale")),
    ];
    want.sort_by_key(|f| f.1.clone());
    assert_eq!(failed.len(), want.len(), "{failed:#?}");
    for ((suite, name, reason), (ws, wn, wr)) in failed.iter().zip(&want) {
        assert_eq!((suite, name), (ws, wn));
        assert!(reason.starts_with(wr.as_str()), "{name}: {reason}");
    }
    assert_eq!(report.passed(), report.cases.len() - want.len());
}

#[test]
fn a_folder_that_lost_a_family_or_a_runner_fails_and_a_wrong_folder_is_a_typed_error() {
    let Some(dir) = ferrite_test_support::reference_or_skip("ops/manifest.json") else { return };
    let tmp = tempfile::tempdir().unwrap();
    let copy = tmp.path().join("fixtures");
    copy_dir(&dir, &copy);
    let path = copy.join("models/manifest.json");
    let mut m: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let cases = m["cases"].as_array_mut().unwrap();
    cases.retain(|c| c["op"] != "conv1d");
    // A kind of case no suite knows.
    let mut new = cases[0].clone();
    new["op"] = Value::from("conv3d");
    new["name"] = Value::from("conv3d__new");
    cases.push(new);
    std::fs::write(&path, m.to_string()).unwrap();
    let report = check_device(&Device::Cpu, &copy).unwrap();
    let failed: Vec<(Suite, &str)> = report.failed().map(|c| (c.suite, c.name.as_str())).collect();
    assert_eq!(failed, vec![(Suite::Convolution, "conv1d (no case)"), (Suite::Unrun, "conv3d__new")]);

    let wrong = tmp.path().join("elsewhere");
    std::fs::create_dir_all(&wrong).unwrap();
    let e = check_device(&Device::Cpu, &wrong).unwrap_err();
    assert!(matches!(&e, ConformanceError::NotAFixtureFolder { dir } if *dir == wrong), "{e}");
    assert!(e.to_string().contains("FERRITE_PYTORCH_REFERENCE"), "{e}");
}

#[test]
fn a_truncated_fixture_file_fails_its_case_alone() {
    let Some(dir) = ferrite_test_support::reference_or_skip("ops/manifest.json") else { return };
    let tmp = tempfile::tempdir().unwrap();
    let copy = tmp.path().join("fixtures");
    copy_dir(&dir, &copy);
    // A truncated file: the case that reads it fails with the reader's error, the rest pass.
    let name = cases(&copy, "ops/manifest.json")[0]["name"].as_str().unwrap().to_string();
    let f = copy.join("ops").join(format!("{name}.safetensors"));
    let bytes = std::fs::read(&f).unwrap();
    std::fs::write(&f, &bytes[..bytes.len() / 2]).unwrap();
    let report = ferrite_conformance::check_suites(&Device::Cpu, &copy, &[Suite::Ops]).unwrap();
    let failed: Vec<&str> = report.failed().map(|c| c.name.as_str()).collect();
    assert_eq!(failed, vec![name.as_str()]);
    assert!(matches!(&report.cases[0].outcome, Outcome::Failed { reason } if reason.contains("cannot read")));
}
