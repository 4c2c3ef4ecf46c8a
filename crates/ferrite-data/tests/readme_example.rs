//! The `## Data loading` section of the README shows `examples/data_loading.rs` verbatim, so the
//! README example is compiled and run (`cargo run --example data_loading`) rather than trusted.

#[test]
fn readme_shows_the_example_verbatim() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    let readme = std::fs::read_to_string(format!("{root}/README.md")).unwrap();
    let example = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/data_loading.rs")).unwrap();
    let body = &example[example.find("use ferrite_data").unwrap()..];
    let section = &readme[readme.find("## Data loading").expect("README has a `## Data loading` section")..];
    assert!(section.contains(body), "README's data-loading example differs from examples/data_loading.rs");
}
