//! The README's `ferrite-nn` snippet is the `nn_tour` example (which `cargo test` compiles), so
//! the documentation cannot drift from code that builds and runs.

#[test]
fn readme_snippet_is_the_nn_tour_example() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("../../README.md")).unwrap();
    let example = std::fs::read_to_string(root.join("examples/nn_tour.rs")).unwrap();
    let section = &readme[readme.find("## Neural-network modules").expect("README has the nn section")..];
    let start = section.find("```rust\n").expect("the section has a rust block") + "```rust\n".len();
    let len = section[start..].find("\n```").expect("the rust block is closed");
    let snippet = &section[start..start + len];
    assert!(snippet.lines().count() > 10);
    assert!(example.contains(snippet), "README snippet differs from examples/nn_tour.rs");
}
