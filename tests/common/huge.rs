//! 2 MiB hugepages for the tests whose programs cannot run `--no-huge`: secondary processes
//! (DPDK shares no `--no-huge` memory between processes) and OVS (it forces `--in-memory`).

use std::cell::RefCell;
use std::process::Command;
use std::time::{Duration, Instant};

use super::{cleanup, file_prefix};

/// Hugepages reserved for a test; on drop, the hugepage files and run directories of the EAL
/// prefixes it was given go (a program killed mid-test leaves them), then what was added to
/// `nr_hugepages` goes back.
pub struct Hugepages {
    restore: Option<u64>,
    prefixes: RefCell<Vec<String>>,
}

impl Hugepages {
    /// Makes `need` 2 MiB pages free, mounting hugetlbfs on `/dev/hugepages` where nothing
    /// mounted it (a machine without systemd), or fails saying why; `who` names what needs
    /// them in that message.
    pub fn reserve(need: u64, who: &str) -> Hugepages {
        cleanup::sweep_dead_prefixes();
        if !hugetlbfs_mounted() {
            let _ = std::fs::create_dir_all("/dev/hugepages");
            let out = Command::new("mount")
                .args(["-t", "hugetlbfs", "nodev", "/dev/hugepages"])
                .output();
            assert!(
                hugetlbfs_mounted(),
                "{who} need hugepages: hugetlbfs is not mounted on /dev/hugepages and \
                 mounting it failed ({out:?}); run as root, or mount it \
                 (mount -t hugetlbfs nodev /dev/hugepages)"
            );
        }
        assert_eq!(
            meminfo("Hugepagesize:"),
            2048,
            "{who}: these tests reserve 2 MiB hugepages"
        );
        let path = "/proc/sys/vm/nr_hugepages";
        let total: u64 = std::fs::read_to_string(path)
            .expect(path)
            .trim()
            .parse()
            .expect("nr_hugepages");
        let mut pages = Hugepages {
            restore: None,
            prefixes: RefCell::default(),
        };
        let free = meminfo("HugePages_Free:");
        if free < need {
            let want = total + (need - free);
            pages.restore = Some(total);
            // On a busy machine memory is fragmented: compacting gives the kernel whole 2 MiB
            // runs to hand out, and each new attempt takes what the last compaction freed. It
            // comes only after a plain attempt fell short, since it drains every CPU's page
            // lists, waiting for a worker on each, which was seen to take minutes while the
            // cores busy-poll.
            let start = Instant::now();
            let (mut wrote, mut now);
            let mut compact = false;
            loop {
                if compact {
                    let _ = std::fs::write("/proc/sys/vm/compact_memory", "1");
                }
                compact = true;
                wrote = std::fs::write(path, want.to_string());
                now = meminfo("HugePages_Free:");
                if now >= need || wrote.is_err() || start.elapsed() > Duration::from_secs(10) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            // On failure the guard gives back what was raised.
            assert!(
                wrote.is_ok() && now >= need,
                "{who} need {need} free 2 MiB hugepages; writing {want} to {path} gave {now} \
                 free ({wrote:?}): run as root on a machine with {} MB to spare",
                need * 2
            );
        }
        pages
    }

    /// A unique EAL `--file-prefix`, cleaned up with the reservation.
    pub fn prefix(&self, tag: &str) -> String {
        let p = file_prefix(tag);
        self.adopt(&p);
        p
    }

    /// Cleans up `prefix` (chosen elsewhere) with the reservation.
    pub fn adopt(&self, prefix: &str) {
        self.prefixes.borrow_mut().push(prefix.to_owned());
    }
}

impl Drop for Hugepages {
    fn drop(&mut self) {
        for p in self.prefixes.borrow().iter() {
            cleanup::remove_eal_prefix(p);
        }
        if let Some(n) = self.restore {
            let _ = std::fs::write("/proc/sys/vm/nr_hugepages", n.to_string());
        }
    }
}

pub fn meminfo(key: &str) -> u64 {
    let m = std::fs::read_to_string("/proc/meminfo").expect("/proc/meminfo");
    m.lines()
        .find_map(|l| l.strip_prefix(key)?.trim().split(' ').next()?.parse().ok())
        .unwrap_or(0)
}

fn hugetlbfs_mounted() -> bool {
    std::fs::read_to_string("/proc/mounts").is_ok_and(|m| {
        m.lines()
            .any(|l| l.contains(" /dev/hugepages ") && l.contains("hugetlbfs"))
    })
}
