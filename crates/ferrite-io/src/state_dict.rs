//! state_dicts: named tensors with PyTorch's parameter names, and matching them to a model.
//!
//! A state_dict saved from `nn.DataParallel`/`DistributedDataParallel` carries a `module.` prefix
//! on every key, and the usual symptom is a wall of "Unexpected key(s)". ferrite never adds such a
//! prefix; loading one that has it is an explicit option ([`strip_prefix`]), and a strict key check
//! whose unexpected keys all carry one common prefix says so and names the option.

use ferrite_nn::IncompatibleKeys;

use crate::error::{IoError, Result};
use crate::raw_tensor::RawTensor;
use crate::value::{Value, key_to_string};

/// Parameter and buffer names → tensors as a file holds them (bytes, dtype, layout; on no device),
/// in the order they were saved. Not to be confused with [`TensorStateDict`](crate::TensorStateDict)
/// (the same names → ferrite `Tensor`s on devices) or `ferrite_nn::StateDict` (a module's own map).
pub type RawStateDict = Vec<(String, RawTensor)>;

/// Interprets `v` as a state_dict: a dict whose values are all tensors.
///
/// A nested training checkpoint is refused with the list of its entries that hold tensors, so the
/// caller can pick one (`v.get("model")`).
pub fn state_dict_from_value(v: &Value) -> Result<RawStateDict> {
    let Value::Dict(items) = v else {
        return Err(IoError::structure(
            "",
            format!("expected a state_dict (a dict of tensors) but the file holds a {}", v.kind()),
        ));
    };
    let mut out = Vec::with_capacity(items.len());
    let mut nested = Vec::new();
    let mut other = Vec::new();
    for (k, val) in items {
        let key = key_to_string(k);
        match val {
            Value::Tensor(t) => out.push((key, t.clone())),
            v if !v.tensors().is_empty() => nested.push(key),
            _ => other.push(key),
        }
    }
    if !nested.is_empty() {
        return Err(IoError::structure(
            "",
            format!(
                "this is a nested checkpoint, not a flat state_dict: tensors are under {} (other entries: {}); select one of them: `LoadOptions::new().key(\"{}\")`, or `--key {}` on the command line",
                nested.iter().map(|k| format!("`{k}`")).collect::<Vec<_>>().join(", "),
                if other.is_empty() { "none".to_string() } else { other.join(", ") },
                nested[0],
                nested[0]
            ),
        ));
    }
    if !other.is_empty() {
        return Err(IoError::structure("", format!("state_dict entries {} are not tensors", other.join(", "))));
    }
    Ok(out)
}

/// Removes `prefix` from every key that starts with it (PyTorch's
/// `consume_prefix_in_state_dict_if_present`); other keys are kept as they are.
pub fn strip_prefix(sd: RawStateDict, prefix: &str) -> RawStateDict {
    sd.into_iter().map(|(k, t)| (k.strip_prefix(prefix).map(str::to_string).unwrap_or(k), t)).collect()
}

/// Strips `prefix` from the keys of every state_dict inside `tree` (every dict whose values are
/// all tensors), e.g. the `model` entry of a DataParallel training checkpoint. Returns how many
/// keys changed.
pub fn strip_prefix_in_tree(tree: &mut Value, prefix: &str) -> usize {
    let mut n = 0;
    tree.walk_mut(|node| {
        if let Value::Dict(items) = node
            && !items.is_empty()
            && items.iter().all(|(_, v)| matches!(v, Value::Tensor(_)))
        {
            for (k, _) in items.iter_mut() {
                if let Value::Str(s) = k
                    && let Some(rest) = s.strip_prefix(prefix)
                {
                    *s = rest.to_string();
                    n += 1;
                }
            }
        }
    });
    n
}

/// Compares a model's expected keys with a state_dict's keys, like `load_state_dict`. With
/// `strict`, any difference is an [`IoError::IncompatibleKeys`] in PyTorch's wording; when all
/// unexpected keys share a prefix whose removal would make them expected keys (`module.` from
/// DataParallel, `_orig_mod.` from `torch.compile`), the error says so and names the option.
/// Without `strict` the differences come back as the [`IncompatibleKeys`] that
/// `ferrite_nn::Module::load_state_dict` returns.
pub fn check_keys<E: AsRef<str>, P: AsRef<str>>(
    expected: &[E],
    provided: &[P],
    strict: bool,
) -> Result<IncompatibleKeys> {
    let exp: std::collections::HashSet<&str> = expected.iter().map(AsRef::as_ref).collect();
    let prov: std::collections::HashSet<&str> = provided.iter().map(AsRef::as_ref).collect();
    let missing_keys: Vec<String> =
        expected.iter().map(AsRef::as_ref).filter(|k| !prov.contains(k)).map(str::to_string).collect();
    let unexpected_keys: Vec<String> =
        provided.iter().map(AsRef::as_ref).filter(|k| !exp.contains(k)).map(str::to_string).collect();
    let report = IncompatibleKeys { missing_keys, unexpected_keys };
    if !strict || report.is_empty() {
        return Ok(report);
    }
    let hint = prefix_hint(&report.unexpected_keys, &exp);
    Err(IoError::IncompatibleKeys { missing: report.missing_keys, unexpected: report.unexpected_keys, hint })
}

fn prefix_hint(unexpected: &[String], expected: &std::collections::HashSet<&str>) -> Option<String> {
    let first = unexpected.first()?;
    let prefix = format!("{}.", first.split('.').next()?);
    let all = unexpected.iter().all(|k| k.strip_prefix(prefix.as_str()).is_some_and(|rest| expected.contains(rest)));
    if !all {
        return None;
    }
    let origin = match prefix.as_str() {
        "module." => " (the checkpoint was saved from a DataParallel/DistributedDataParallel wrapper)",
        "_orig_mod." => " (the checkpoint was saved from a torch.compile'd module)",
        _ => "",
    };
    Some(format!(
        "All unexpected keys start with `{prefix}`{origin}; load with the prefix stripped: `LoadOptions::new().strip_prefix(\"{prefix}\")` in ferrite-io, or `--strip-prefix {prefix}` on the command line."
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn module_prefix_is_diagnosed_and_strippable() {
        let expected = ["fc.weight", "fc.bias"];
        let saved = ["module.fc.weight", "module.fc.bias"];
        let err = check_keys(&expected, &saved, true).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.starts_with(
                "Error(s) in loading state_dict:\n\tMissing key(s) in state_dict: \"fc.weight\", \"fc.bias\"."
            ),
            "{msg}"
        );
        assert!(msg.contains("Unexpected key(s) in state_dict: \"module.fc.weight\", \"module.fc.bias\"."), "{msg}");
        assert!(msg.contains("start with `module.`") && msg.contains("--strip-prefix module."), "{msg}");

        let t = RawTensor::from_values(vec![1], &[0.0f32]).unwrap();
        let sd: RawStateDict = saved.iter().map(|k| (k.to_string(), t.clone())).collect();
        let stripped = strip_prefix(sd, "module.");
        let keys: Vec<&str> = stripped.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(check_keys(&expected, &keys, true).unwrap(), IncompatibleKeys::default());
    }

    #[test]
    fn prefix_stripped_inside_nested_checkpoints() {
        let t = RawTensor::from_values(vec![1], &[0.0f32]).unwrap();
        let mut model = Value::dict();
        model.insert("module.w", t.clone()).unwrap();
        model.insert("module.b", t).unwrap();
        let mut root = Value::dict();
        root.insert("module.epoch", 1i64).unwrap();
        root.insert("model", model).unwrap();
        assert_eq!(strip_prefix_in_tree(&mut root, "module."), 2);
        assert!(root.at("model/w").is_some() && root.get("module.epoch").is_some());
    }

    #[test]
    fn unrelated_mismatch_has_no_hint_and_non_strict_reports() {
        let err = check_keys(&["a.w"], &["b.w", "module.c"], true).unwrap_err();
        assert!(!err.to_string().contains("start with"), "{err}");
        let r = check_keys(&["a.w"], &["b.w"], false).unwrap();
        assert_eq!(r.missing_keys, vec!["a.w"]);
        assert_eq!(r.unexpected_keys, vec!["b.w"]);
    }

    #[test]
    fn nested_checkpoints_name_their_tensor_entries() {
        let t = RawTensor::from_values(vec![1], &[0.0f32]).unwrap();
        let mut model = Value::dict();
        model.insert("w", t).unwrap();
        let mut root = Value::dict();
        root.insert("epoch", 1i64).unwrap();
        root.insert("model", model.clone()).unwrap();
        let err = state_dict_from_value(&root).unwrap_err().to_string();
        assert!(err.contains("`model`") && err.contains("epoch"), "{err}");
        assert_eq!(state_dict_from_value(&model).unwrap().len(), 1);
    }
}
