//! Logging through DPDK's `rte_log`, under the log type `pmd.net.mlx4rs`, so that
//! `--log-level=pmd.net.mlx4rs:debug` works as for any DPDK driver.

use std::ffi::CString;
use std::sync::atomic::{AtomicU32, Ordering};

use dpdk_sys as sys;

/// Log type id; 0 (= `RTE_LOGTYPE_EAL`) until the constructor registers ours.
static LOGTYPE: AtomicU32 = AtomicU32::new(0);

pub const ERR: u32 = sys::RTE_LOG_ERR;
pub const WARNING: u32 = sys::RTE_LOG_WARNING;
pub const NOTICE: u32 = sys::RTE_LOG_NOTICE;
pub const INFO: u32 = sys::RTE_LOG_INFO;
pub const DEBUG: u32 = sys::RTE_LOG_DEBUG;

/// Registers `pmd.net.mlx4rs` with NOTICE as its default level.
pub(crate) fn register() {
    let name = c"pmd.net.mlx4rs";
    // SAFETY: the name is a NUL-terminated static string; EAL copies it.
    let id = unsafe { sys::rte_log_register_type_and_pick_level(name.as_ptr(), NOTICE) };
    if id >= 0 {
        LOGTYPE.store(id as u32, Ordering::Relaxed);
    }
}

/// Writes one line. Called through `pmd_log!`.
pub fn write(level: u32, msg: &str) {
    let ty = LOGTYPE.load(Ordering::Relaxed);
    // SAFETY: pure query of EAL's log configuration.
    if !unsafe { sys::rte_log_can_log(ty, level) } {
        return;
    }
    let line = CString::new(format!("net_mlx4rs: {msg}"))
        .unwrap_or_else(|_| c"net_mlx4rs: (log line with NUL)".to_owned());
    // SAFETY: `line` is NUL-terminated and outlives the call; the glue formats it with "%s".
    unsafe { sys::mlx4rs_log(level, ty, line.as_ptr()) };
}

/// `pmd_log!(NOTICE, "port {}: ...", id)`: a DPDK log line under `pmd.net.mlx4rs`.
#[macro_export]
macro_rules! pmd_log {
    ($level:ident, $($arg:tt)*) => {
        $crate::log::write($crate::log::$level, &format!($($arg)*))
    };
}
