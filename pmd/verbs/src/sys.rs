//! rdma-core's ABI types and constants (`infiniband/verbs.h`, `infiniband/mlx4dv.h`), from the
//! one binding crate the driver's rdma-core backend uses too (`ffi/rdma`), where the test that
//! holds bindgen's layout against the C compiler's lives. Only types and constants: the
//! functions are ours.
pub use rdma_sys::types::*;
