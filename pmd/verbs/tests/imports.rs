//! The stand-in's modules import each other without a circle: the C entry points that reach
//! across objects (`open`, which fills a context's ops table) sit above the objects
//! (`queues`, `queries`), which sit above what hangs off a context (`context`). Child modules
//! (`queues/cq.rs`) are modules of their own.

use std::path::Path;

#[test]
fn module_graph_has_no_circle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let modules = mlx4_srcgraph::check(&src, 2, &[]).unwrap_or_else(|e| panic!("{e}"));
    assert!(modules > 12, "read the modules of src/: {modules}");
}
