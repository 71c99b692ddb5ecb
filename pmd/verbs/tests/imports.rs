//! The stand-in's modules import each other without a circle: the C entry points that reach
//! across objects (`open`, which fills a context's ops table) sit above the objects
//! (`queues`, `queries`), which sit above what hangs off a context (`context`). Every file is a
//! module of its own (`queues/cq.rs` too).

use std::path::Path;

#[test]
fn module_graph_has_no_circle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let modules = mlx4_srcgraph::check(&src, usize::MAX, &[]).unwrap_or_else(|e| panic!("{e}"));
    assert!(modules > 12, "read the modules of src/: {modules}");
}
