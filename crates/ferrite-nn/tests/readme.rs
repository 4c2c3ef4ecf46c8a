//! The README's `ferrite-nn` snippets are the `nn_tour` and `recurrent_tour` examples (which
//! `cargo test` compiles), so the documentation cannot drift from code that builds and runs.

/// The first rust block after `heading` in the README must be part of `examples/{example}.rs`.
fn snippet_is_example(heading: &str, example: &str) {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("../../README.md")).unwrap();
    let code = std::fs::read_to_string(root.join(format!("examples/{example}.rs"))).unwrap();
    let section = &readme[readme.find(heading).unwrap_or_else(|| panic!("README has no `{heading}`"))..];
    let start = section.find("```rust\n").expect("the section has a rust block") + "```rust\n".len();
    let len = section[start..].find("\n```").expect("the rust block is closed");
    let snippet = &section[start..start + len];
    assert!(snippet.lines().count() > 10);
    assert!(code.contains(snippet), "README snippet differs from examples/{example}.rs");
}

#[test]
fn readme_snippet_is_the_nn_tour_example() {
    snippet_is_example("## Neural-network modules", "nn_tour");
}

#[test]
fn readme_recurrent_snippet_is_the_recurrent_tour_example() {
    snippet_is_example("### Recurrent layers, packed sequences, truncated BPTT", "recurrent_tour");
}
