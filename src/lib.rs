//! `librte_net_mlx4rs.so`: the DPDK plugin. Thin on purpose: the driver lives in `pmd/`.
//! Loading this library runs the driver's constructor, which registers `net_mlx4rs` with EAL.

pub use mlx4rs::*;
