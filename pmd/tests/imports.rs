//! The driver's modules import each other without a circle, so each can be read, and tested,
//! on top of the ones it uses: the formats and memory at the bottom, the rings and queues on
//! them, the hardware boundary and its backends, the port, and the ethdev glue on top. Every
//! file is a module of its own: a backend (`hw/soft/`) sits above the boundary it implements
//! (`hw/mod.rs`), and opening one (`hw/backend.rs`) above both.

use std::path::Path;

/// Circles known and being taken apart on another branch, each as its modules; the test fails
/// when one of them is gone, so that it leaves this list too.
const KNOWN: &[&[&str]] = &[
    // The WQE writer and the ring views it writes into each use the other.
    &["ring", "wqe"],
];

#[test]
fn module_graph_has_no_circle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let modules = mlx4_srcgraph::check(&src, usize::MAX, KNOWN).unwrap_or_else(|e| panic!("{e}"));
    assert!(modules > 40, "read the modules of src/: {modules}");
}
