//! Presents a ConnectX-3 backed by the software HCA to Debian's unmodified C mlx4 driver, with
//! `scripts/c-mlx4-env.sh`:
//!
//! - a sysfs tree of the test's own: the PCI function (`vendor`, `device`, ..., `uevent`, a
//!   `driver` link to `mlx4_core`, `net/<ifname>/dev_port`) linked from `bus/pci/devices`, which
//!   EAL scans through `SYSFS_PCI_DEVICES`, and the verbs device `class/infiniband/mlx4_0`
//!   whose `device` is that PCI function (rdma-core's `ibdev_path`, where the C driver finds its
//!   PCI address and netdev);
//! - a library directory where `libibverbs.so.1`, `libmlx4.so.1`, `libmlx5.so.1` and `libmana.so.1` are the
//!   stand-in (`pmd/verbs`), first on `LD_LIBRARY_PATH`;
//! - `MLX4RS_VERBS` naming the device, its wire and where the model's counters go.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use crate::common::{self, Output, Step};

/// The stand-in as cargo builds it.
pub const STAND_IN: &str = "libmlx4_verbs.so";

/// DPDK's PMD directory (`<libdir>/dpdk/pmds-<ABI>`), which EAL loads from on its own.
pub fn pmd_dir() -> PathBuf {
    let out = Command::new("pkg-config")
        .args(["--variable=libdir", "libdpdk"])
        .output()
        .expect("pkg-config not found: run scripts/setup.sh");
    let libdir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    let dpdk = libdir.join("dpdk");
    std::fs::read_dir(&dpdk)
        .unwrap_or_else(|e| panic!("{}: {e}: run scripts/setup.sh", dpdk.display()))
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("pmds-"))
        })
        .unwrap_or_else(|| panic!("no pmds-* directory under {}", dpdk.display()))
}

/// Fails, naming what is missing, unless Debian's C mlx4 driver and the stand-in are both here.
pub fn preflight() -> PathBuf {
    let c = pmd_dir().join("librte_net_mlx4.so");
    assert!(
        c.exists(),
        "{} is missing: Debian's C mlx4 driver comes with the dpdk package (scripts/setup.sh)",
        c.display()
    );
    let lib = common::plugin_dir().join(STAND_IN);
    assert!(
        lib.is_file(),
        "{} not built: run `cargo build --workspace` before the integration tests",
        lib.display()
    );
    lib
}

/// One ConnectX-3 function with one port, as the C driver will see it.
pub struct CDevice {
    pub dir: PathBuf,
    pub pci: String,
    pub ibdev: PathBuf,
    pub netdev: String,
    pub stats: PathBuf,
    pub libdir: PathBuf,
    pub sysfs_pci: PathBuf,
    pub wire: String,
    /// More `MLX4RS_VERBS` words (`mac=...`).
    pub extra: String,
}

impl CDevice {
    /// A device on `wire` (the `net_mlx4rs` wire syntax), PCI device ID `part`, presented by
    /// `scripts/c-mlx4-env.sh` (the same tree a user gets).
    pub fn new(tag: &str, wire: &str, part: u16) -> CDevice {
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let lib = preflight();
        let dir = common::scratch_dir(tag);
        let pci = format!("0000:00:{:02x}.0", 5 + n % 16);
        let netdev = format!("m4c{}{n}", std::process::id() % 100_000);
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/c-mlx4-env.sh");
        let out = Command::new("bash")
            .arg(&script)
            .arg(&dir)
            .arg(&lib)
            .arg(&pci)
            .arg(format!("{part:#06x}"))
            .arg(&netdev)
            .output()
            .expect("bash");
        assert!(out.status.success(), "{}: {out:?}", script.display());
        let text = String::from_utf8_lossy(&out.stdout);
        let var = |k: &str| -> String {
            text.lines()
                .find_map(|l| l.strip_prefix(&format!("export {k}='")))
                .and_then(|v| v.split('\'').next())
                .unwrap_or_else(|| panic!("{} printed no {k}:\n{text}", script.display()))
                .to_owned()
        };
        CDevice {
            ibdev: PathBuf::from(var("MLX4RS_IBDEV")),
            stats: dir.join("model.stats"),
            libdir: PathBuf::from(var("LD_LIBRARY_PATH")),
            sysfs_pci: PathBuf::from(var("SYSFS_PCI_DEVICES")),
            pci: var("MLX4RS_PCI"),
            netdev: var("MLX4RS_NETDEV"),
            wire: wire.to_owned(),
            extra: String::new(),
            dir,
        }
    }

    /// `MLX4RS_VERBS` for this device.
    pub fn verbs_env(&self) -> String {
        let mut v = format!(
            "ibdev={},wire={},stats={}",
            self.ibdev.display(),
            self.wire,
            self.stats.display()
        );
        if !self.extra.is_empty() {
            v.push(',');
            v.push_str(&self.extra);
        }
        v
    }

    /// The environment and EAL arguments that present the device; `vdevs` are `net_mlx4rs`
    /// ports in the same process.
    pub fn command(&self, program: &str, vdevs: &[&str]) -> Command {
        let mut cmd = Command::new("stdbuf");
        cmd.args(["-oL", program])
            .current_dir(std::env::temp_dir())
            .env(
                "LD_LIBRARY_PATH",
                format!(
                    "{}:{}",
                    self.libdir.display(),
                    common::plugin_dir().display()
                ),
            )
            .env("SYSFS_PCI_DEVICES", &self.sysfs_pci)
            .env("MLX4RS_VERBS", self.verbs_env())
            .args(["-l", "0-1", "--no-huge", "-m", "512"])
            .arg(format!("--file-prefix={}", common::file_prefix("cmlx4")))
            .args(["-a", &self.pci])
            // The C driver logs its probe (device, MAC, netdev, MTU) at INFO.
            .arg("--log-level=pmd.net.mlx4:info");
        if !vdevs.is_empty() {
            // net_mlx4rs claims the ConnectX-3 IDs too: naming Debian's driver first makes it
            // the one that gets the card (EAL probes with drivers in registration order).
            cmd.arg("-d").arg(pmd_dir().join("librte_net_mlx4.so"));
            cmd.args(["-d", common::PLUGIN]);
            for v in vdevs {
                cmd.arg("--vdev").arg(v);
            }
        }
        cmd
    }

    /// testpmd on this device (and `vdevs`), fed `steps` at its prompt.
    pub fn testpmd(
        &self,
        vdevs: &[&str],
        app_args: &[&str],
        steps: &[Step],
        limit: Duration,
    ) -> Output {
        let mut cmd = self.command("dpdk-testpmd", vdevs);
        cmd.arg("--").arg("-i").args(app_args);
        common::run_interactive(cmd, steps, limit)
    }

    /// The model's counters, written when the last verbs context closed.
    pub fn counters(&self) -> HashMap<String, u64> {
        let text = std::fs::read_to_string(&self.stats).unwrap_or_else(|e| {
            panic!(
                "{}: {e}: the stand-in writes the model's counters when the C driver closes \
                 its last context",
                self.stats.display()
            )
        });
        text.lines()
            .filter_map(|l| {
                let (k, v) = l.split_once(' ')?;
                Some((k.to_owned(), v.parse().ok()?))
            })
            .collect()
    }
}

impl Drop for CDevice {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// What went wrong, for a failure message: lines of the dynamic loader, of the stand-in and of
/// the C driver that name a missing entry point or a refused request, then the whole output.
pub fn diagnose(out: &Output) -> String {
    let all = out.all();
    let why: Vec<&str> = all
        .lines()
        .filter(|l| {
            l.contains("symbol lookup error")
                || l.contains("undefined symbol")
                || (l.contains("version `") && l.contains("not found"))
                || l.contains("mlx4rs-verbs:")
                || (l.contains("net_mlx4:")
                    && [
                        "fail",
                        "cannot",
                        "error",
                        "unable",
                        "not supported",
                        "rejected",
                    ]
                    .iter()
                    .any(|w| l.to_lowercase().contains(w)))
        })
        .collect();
    format!(
        "exit status {}\nwhat the loader, the stand-in and the C driver said:\n  {}\n\
         ---- full output ----\n{all}",
        out.status,
        if why.is_empty() {
            "(nothing)".into()
        } else {
            why.join("\n  ")
        }
    )
}

/// Asserts the C driver probed the device as a port and says which entry point or behaviour
/// stopped it otherwise.
pub fn assert_probed(out: &Output, dev: &CDevice) {
    let all = out.all();
    let probed = all.contains("using device \"mlx4_0\"") && all.contains("port 1 MAC address is");
    assert!(
        probed && !all.contains("Fail to start port") && !all.contains("failed to process device"),
        "DPDK's C mlx4 did not come up on the model (device {}):\n{}",
        dev.pci,
        diagnose(out)
    );
}
