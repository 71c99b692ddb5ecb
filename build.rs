//! Link arguments for the plugin only: a missing DPDK library must be a link error, not a
//! load-time surprise inside testpmd.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,--no-undefined");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,librte_net_mlx4rs.so");
}
