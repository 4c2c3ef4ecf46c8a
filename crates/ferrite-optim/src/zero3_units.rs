//! ZeRO-3's units: which trainable parameters are gathered together, one repeated block of the
//! model at a time (PyTorch FSDP's auto-wrap of transformer blocks).
//!
//! Why here: the training side (`ferrite-parallel`'s `FullySharded`) and the planner's
//! transcription of a ZeRO-3 rank (`ferrite-plan`) must cut the model the same way, and this crate
//! already holds the other layout both share ([`crate::FlatPartition`]).
//!
//! A unit is named by the prefix of a parameter name up to its first numeric component
//! (`blocks.3`, `model.layers.11`, `encoder.block.0`, an MLP's `2`) — the name under which the
//! built-in and HF models announce the block their forward enters (`ferrite_nn::mark_layer`).
//! Parameters without such a component (embeddings, final norm, a tied head) belong to no unit:
//! the *root*, always gathered.

/// `blocks.3.attn.weight` → `blocks.3`: the prefix up to the first numeric component, when
/// something follows it.
pub fn zero3_unit_of(name: &str) -> Option<String> {
    let parts: Vec<&str> = name.split('.').collect();
    let k = parts.iter().position(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))?;
    (k + 1 < parts.len()).then(|| parts[..=k].join("."))
}

/// The units of parameters named `names` (in order of first appearance), each with the indices
/// of its parameters; the indices in no unit are the root.
pub fn zero3_units(names: &[String]) -> Vec<(String, Vec<usize>)> {
    let mut units: Vec<(String, Vec<usize>)> = Vec::new();
    for (i, n) in names.iter().enumerate() {
        if let Some(u) = zero3_unit_of(n) {
            match units.iter_mut().find(|(name, _)| *name == u) {
                Some((_, members)) => members.push(i),
                None => units.push((u, vec![i])),
            }
        }
    }
    units
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_are_the_prefix_up_to_the_first_index() {
        assert_eq!(zero3_unit_of("blocks.3.attn.weight").as_deref(), Some("blocks.3"));
        assert_eq!(zero3_unit_of("model.layers.11.mlp.up_proj.weight").as_deref(), Some("model.layers.11"));
        assert_eq!(
            zero3_unit_of("encoder.block.0.layer.1.DenseReluDense.wi.weight").as_deref(),
            Some("encoder.block.0")
        );
        assert_eq!(zero3_unit_of("2.0.weight").as_deref(), Some("2"));
        assert_eq!(zero3_unit_of("embed.weight"), None);
        assert_eq!(zero3_unit_of("h.3"), None, "a parameter named by its index alone is no unit");
        let names: Vec<String> = ["embed.weight", "blocks.0.w", "blocks.1.w", "blocks.0.b", "head.w"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(zero3_units(&names), vec![("blocks.0".to_string(), vec![1, 3]), ("blocks.1".to_string(), vec![2])]);
    }
}
