//! The process-wide monitor thread: it finds link changes at the far end of each watched
//! adapter's wire (a cable's peer unplugged or gone with its process, a TAP interface set down, a
//! cable file removed), and runs polled-mode adapters that have completion channels, so that
//! frames arriving while the polling lcore sleeps on an event fd still raise their events.

use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::Mutex;

use crate::error::HcaError;
use crate::runner::Inner;

/// How often the monitor looks for link changes at the far end.
pub const MONITOR_PERIOD: Duration = Duration::from_millis(10);
/// How often it runs a polled-mode adapter that has completion channels.
pub const SERVICE_PERIOD: Duration = Duration::from_micros(200);

/// Adapters the monitor looks at.
static WATCHED: Mutex<Vec<Weak<Inner>>> = parking_lot::const_mutex(Vec::new());
/// The monitor thread, while it runs.
static MONITOR: Mutex<Option<JoinHandle<()>>> = parking_lot::const_mutex(None);

/// Have the monitor look at `inner` from now on (starting it if needed); idempotent.
pub(crate) fn watch(inner: &Arc<Inner>) -> Result<(), HcaError> {
    let mut m = MONITOR.lock();
    {
        let mut w = WATCHED.lock();
        w.retain(|x| x.strong_count() > 0);
        if !w
            .iter()
            .any(|x| std::ptr::eq(x.as_ptr(), Arc::as_ptr(inner)))
        {
            w.push(Arc::downgrade(inner));
        }
    }
    if m.is_none() {
        let h = std::thread::Builder::new()
            .name("mlx4-hca-link".into())
            .spawn(monitor)
            .map_err(|e| HcaError::Io(format!("spawning the link monitor: {e}")))?;
        *m = Some(h);
    }
    Ok(())
}

/// The monitor: every period, each watched adapter re-checks its link (and polled adapters
/// with completion channels run, every [`SERVICE_PERIOD`]). It ends when no adapter is left to
/// watch.
fn monitor() {
    let mut period = MONITOR_PERIOD;
    let mut last_link = std::time::Instant::now();
    loop {
        std::thread::sleep(period);
        let list: Vec<Arc<Inner>> = {
            let mut w = WATCHED.lock();
            w.retain(|x| x.strong_count() > 0);
            w.iter().filter_map(Weak::upgrade).collect()
        };
        if list.is_empty() {
            let mut m = MONITOR.lock();
            // Under the lock: an adapter watched meanwhile would see a running monitor.
            if WATCHED.lock().iter().all(|x| x.strong_count() == 0) {
                // Detach: this thread is the one ending.
                m.take();
                return;
            }
            continue;
        }
        let link = last_link.elapsed() >= MONITOR_PERIOD;
        if link {
            last_link = std::time::Instant::now();
        }
        let mut fast = false;
        for a in list {
            fast |= a.service(link);
        }
        period = if fast { SERVICE_PERIOD } else { MONITOR_PERIOD };
    }
}
