//! Seeded, bounded rte_flow fuzzing: `tests/flow_fuzz/flowfuzz.c`, built
//! here against the installed DPDK, drives random rules through `rte_flow_validate`,
//! `rte_flow_create` and `rte_flow_destroy` on a looped port with four RX queues. The program
//! checks that validate and create agree, that every refusal carries an errno, an error type
//! and a message, that every rule made is destroyed, that the port takes as many rules at the
//! end as when fresh (nothing leaked), and that it stops and closes cleanly; a crash or a hang
//! shows here as no PASS line. `scripts/flow-fuzz.sh` runs it longer, on random seeds.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use common::{number_after, plugin_dir, run_interactive, EalPrefix, ScratchDir, PLUGIN};

/// Seeds of the CI run, and rules per seed.
const SEEDS: [u64; 3] = [1, 2, 3];
const ITERATIONS: u64 = 3000;

fn flowfuzz() -> &'static Path {
    static BIN: OnceLock<(ScratchDir, PathBuf)> = OnceLock::new();
    let (_, bin) = BIN.get_or_init(|| {
        let dir = ScratchDir::new("flowfuzz-build");
        let bin = common::build_c_program(&dir, "flowfuzz", "flow_fuzz/flowfuzz.c");
        (dir, bin)
    });
    bin
}

#[test]
fn random_rules_are_validated_created_and_destroyed_consistently() {
    for seed in SEEDS {
        let prefix = EalPrefix::new(&format!("flowfuzz-{seed}"));
        let mut cmd = Command::new(flowfuzz());
        cmd.current_dir(std::env::temp_dir())
            .env("LD_LIBRARY_PATH", plugin_dir())
            .args(["-l", "0", "--no-huge", "-m", "256", "--no-pci"])
            .arg(prefix.arg())
            .args(["-d", PLUGIN, "--vdev", "net_mlx4rs0,wire=loop", "--"])
            .args([seed.to_string(), ITERATIONS.to_string()]);
        let out = run_interactive(cmd, &[], Duration::from_secs(120));
        let text = out.all();
        let pass = format!("flowfuzz: PASS seed {seed} iterations {ITERATIONS}");
        assert!(
            text.contains(&pass) && out.status.success(),
            "seed {seed}: no PASS line (exit {:?}; a crash, or a hang the limit killed, shows \
             so):\n{text}",
            out.status
        );
        let line = text.lines().find(|l| l.starts_with(&pass)).unwrap();
        let created = number_after(line, "created").unwrap();
        let refused = number_after(line, "refused").unwrap();
        // Both paths must have been exercised for the run to mean anything.
        assert!(
            created >= ITERATIONS / 10 && refused >= ITERATIONS / 10,
            "seed {seed}: {created} created, {refused} refused:\n{text}"
        );
        assert!(
            !text.contains("panicked"),
            "seed {seed}: a panic in the driver:\n{text}"
        );
        println!("seed {seed}: {created} rules created, {refused} refused");
    }
}
