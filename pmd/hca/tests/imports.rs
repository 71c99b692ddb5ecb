//! The model's modules import each other without a circle: a name two modules need lives below
//! both (`types.rs`, `error.rs`), so each module can be read, and tested, on top of the ones it
//! uses. A child module (`sq/bf.rs`) counts as its parent.

use std::path::Path;

#[test]
fn module_graph_has_no_circle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let modules = mlx4_srcgraph::check(&src, 1, &[]).unwrap_or_else(|e| panic!("{e}"));
    assert!(modules > 20, "read the modules of src/: {modules}");
}
