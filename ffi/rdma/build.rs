//! Generates the bindings over the installed rdma-core headers (`infiniband/verbs.h`,
//! `infiniband/mlx4dv.h`):
//! - `types.rs`: the structs, enums and constants;
//! - `ibverbs.rs`, `mlx4.rs`: one struct per library whose fields are the entry points the
//!   driver calls, resolved with `dlopen`/`dlsym` at run time (bindgen's dynamic-library mode),
//!   so the plugin has no link-time dependency on rdma-core and loads on a machine without it.
//!
//! The types are shared by the two users of rdma-core's ABI: the driver's rdma-core backend,
//! which calls the libraries, and the verbs stand-in (`pmd/verbs`), which implements them over
//! the software HCA. The tests compare bindgen's layout of the structs they exchange with the C
//! compiler's: `layout.c` is the table of `offsetof`/`sizeof`, compiled here.

use std::env;
use std::path::{Path, PathBuf};

/// The exported entry points of `libibverbs.so.1` the driver calls. The rest of what it uses
/// (work queues, indirection tables, extended QPs, flows) are `static inline` functions of
/// `verbs.h` that call through the context's `verbs_context` ops; the driver does the same.
const IBVERBS: &[&str] = &[
    "ibv_get_device_list",
    "ibv_free_device_list",
    "ibv_get_device_name",
    "ibv_open_device",
    "ibv_close_device",
    "ibv_query_device",
    "ibv_query_port",
    "ibv_alloc_pd",
    "ibv_dealloc_pd",
    "ibv_reg_mr",
    "ibv_dereg_mr",
    "ibv_create_cq",
    "ibv_destroy_cq",
    "ibv_create_qp",
    "ibv_modify_qp",
    "ibv_query_qp",
    "ibv_destroy_qp",
];

/// The exported entry points of `libmlx4.so.1`.
const MLX4: &[&str] = &[
    "mlx4dv_init_obj",
    "mlx4dv_set_context_attr",
    "mlx4dv_query_device",
];

fn functions(out: &Path, file: &str, library: &str, names: &[&str]) {
    let mut b = bindgen::Builder::default()
        .header("wrapper.h")
        .allowlist_recursively(false)
        .dynamic_library_name(library)
        .dynamic_link_require_all(false)
        .generate_comments(false)
        .layout_tests(false);
    for n in names {
        b = b.allowlist_function(format!("^{n}$"));
    }
    b.generate()
        .unwrap_or_else(|e| panic!("rdma-sys: bindgen over the {library} entry points: {e}"))
        .write_to_file(out.join(file))
        .unwrap_or_else(|e| panic!("rdma-sys: writing {file}: {e}"));
}

fn main() {
    println!("cargo:rerun-if-changed=wrapper.h");
    println!("cargo:rerun-if-changed=layout.c");
    for h in ["verbs.h", "mlx4dv.h"] {
        let p = Path::new("/usr/include/infiniband").join(h);
        if !p.is_file() {
            panic!(
                "rdma-sys: {} is missing; install libibverbs-dev (scripts/setup.sh)",
                p.display()
            );
        }
    }
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR"));

    bindgen::Builder::default()
        .header("wrapper.h")
        .allowlist_type("ibv_.*|_ibv_.*|verbs_context|_compat_ibv_port_attr|mlx4dv_.*")
        // The WQE and CQE structs of mlx4dv.h: the stand-in checks its formats against them.
        .allowlist_type("mlx4_wqe_.*|mlx4_cqe|mlx4_err_cqe")
        .allowlist_var("IBV_.*|MLX4DV_.*|MLX4_.*")
        .blocklist_function(".*")
        .derive_default(true)
        .derive_debug(false)
        .prepend_enum_name(false)
        .layout_tests(true)
        .generate_comments(false)
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()))
        .generate()
        .expect("rdma-sys: bindgen over infiniband/verbs.h and mlx4dv.h failed")
        .write_to_file(out.join("types.rs"))
        .expect("rdma-sys: writing types.rs");
    functions(&out, "ibverbs.rs", "Ibverbs", IBVERBS);
    functions(&out, "mlx4.rs", "Mlx4", MLX4);

    // Only the tests reference the table, so nothing of it reaches the plugin.
    cc::Build::new()
        .file("layout.c")
        .warnings(true)
        .compile("rdma_sys_layout");
}
