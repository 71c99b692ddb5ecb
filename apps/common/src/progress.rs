//! Progress lines for long runs and clean interruption: SIGINT sets a flag the measurement
//! loops poll, so a run stops between samples and still prints and writes what it has.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

static STOP: AtomicBool = AtomicBool::new(false);

/// Installs the SIGINT/SIGTERM handler once; a second Ctrl-C while stopping exits at once, for
/// a run stuck somewhere that never polls the flag.
pub fn install_interrupt() {
    let _ = ctrlc::set_handler(|| {
        if STOP.swap(true, Ordering::SeqCst) {
            eprintln!("\ninterrupted twice: exiting without a report");
            std::process::exit(130);
        }
        eprintln!("\ninterrupted: finishing the current sample, then writing partial results");
    });
}

pub fn interrupted() -> bool {
    STOP.load(Ordering::Relaxed)
}

/// `[k/n] elapsed, eta` lines on stderr, at most one per point.
pub struct Progress {
    total: usize,
    done: usize,
    start: Instant,
    quiet: bool,
}

impl Progress {
    pub fn new(total: usize, quiet: bool) -> Progress {
        Progress {
            total,
            done: 0,
            start: Instant::now(),
            quiet,
        }
    }

    pub fn step(&mut self, what: &str) {
        self.done += 1;
        if self.quiet {
            return;
        }
        let el = self.start.elapsed().as_secs_f64();
        let eta = el / self.done as f64 * (self.total - self.done.min(self.total)) as f64;
        let mut e = std::io::stderr().lock();
        let _ = writeln!(
            e,
            "[{:>3}/{}] {:>5.0}s elapsed, ~{:.0}s left | {what}",
            self.done, self.total, el, eta
        );
    }
}
