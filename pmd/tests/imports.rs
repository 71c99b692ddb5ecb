//! The driver's modules import each other without a circle, so each can be read, and tested,
//! on top of the ones it uses: the formats and memory at the bottom, the rings and queues on
//! them, the hardware boundary and its backends, the port, and the ethdev glue on top. Every
//! file is a module of its own: a backend (`hw/soft/`) sits above the boundary it implements
//! (`hw/mod.rs`), and opening one (`hw/backend.rs`) above both.

use std::path::Path;

/// Circles allowed, each as its modules: none. (The check fails when a listed circle is gone,
/// so that a list, if one is needed again, stays true.)
const KNOWN: &[&[&str]] = &[];

#[test]
fn module_graph_has_no_circle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let modules = mlx4_srcgraph::check(&src, usize::MAX, KNOWN).unwrap_or_else(|e| panic!("{e}"));
    assert!(modules > 40, "read the modules of src/: {modules}");
}
