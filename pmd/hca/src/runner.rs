//! Who runs the device loop: a thread of the adapter's own, one thread for every adapter of the
//! process, or the lcore that polls the port, through [`SqRunner`] and [`RxRunner`] (which the
//! ethdev burst glue calls after `tx_burst` and before `rx_burst`; never the queue code, which
//! only stores to memory and device pages, as with a card).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::device::DevState;
use crate::dma::HostMem;
use crate::error::HcaError;
use crate::wire::RxPort;

/// Idle time a device thread spins before it starts yielding the CPU, and then before it
/// starts sleeping: times, not poll counts, so that a cheaper idle poll does not put the thread
/// to sleep sooner (a sleeping device thread leaves a driver that resumes posting with a full
/// ring until it wakes).
const SPIN_IDLE: Duration = Duration::from_micros(300);
const YIELD_IDLE: Duration = Duration::from_micros(600);
/// Idle polls between looks at the clock while spinning.
const CLOCK_EVERY: u32 = 32;
/// The shortest idle sleep; it doubles up to [`MAX_IDLE_SLEEP`] while nothing happens.
const MIN_IDLE_SLEEP: Duration = Duration::from_micros(50);
const MAX_IDLE_SLEEP: Duration = Duration::from_micros(200);

/// The adapter as the device loop sees it.
pub(crate) struct Inner {
    pub(crate) state: Mutex<DevState>,
    pub(crate) port: Arc<RxPort>,
    /// Tells the adapter's own thread to stop.
    pub(crate) stop: AtomicBool,
    pub(crate) busy_poll: bool,
    /// The wire brings frames in from outside (TAP), so receiving means polling it.
    pub(crate) wire_rx: AtomicBool,
    /// Port events and their fd.
    pub(crate) events: Arc<crate::events::Events>,
    /// A device thread runs the adapter (else the polled mode).
    pub(crate) threaded: bool,
}

impl Inner {
    /// What the process-wide monitor does for this adapter: look for link changes at the far
    /// end of the wire (`link`), and in the polled mode, while completion channels exist, run
    /// the device, so that frames arriving while the polling lcore sleeps on an event fd are
    /// received and raise their events. Returns whether the adapter wants the short period.
    pub(crate) fn service(&self, link: bool) -> bool {
        let mut st = self.state.lock();
        if link {
            st.check_link();
            // Going down, the link drops what the port buffered, and counts it.
            st.publish();
        }
        let run = !self.threaded && st.has_channels();
        drop(st);
        if run {
            self.charged(DevState::poll);
        }
        run
    }

    /// One pass over every queue and the receive buffer; the work done (0 = idle).
    pub(crate) fn poll(&self) -> usize {
        self.charged(DevState::poll)
    }

    /// `f` under the lock; the doorbell charge it leaves is spent with the lock released, and
    /// then `f` runs once more for the walks the charged doorbells asked for.
    #[inline]
    pub(crate) fn charged(&self, f: impl Fn(&mut DevState) -> usize) -> usize {
        let mut st = self.state.lock();
        let mut work = f(&mut st);
        let owed = st.take_owed();
        drop(st);
        if owed != 0 {
            spend(owed);
            let mut st = self.state.lock();
            work += f(&mut st);
            let owed = st.take_owed();
            drop(st);
            spend(owed);
        }
        work
    }
}

/// Spend `ns` of a doorbell charge ([`crate::HcaConfig::doorbell_ns`]): a spin, not a sleep,
/// since a card is busy for that long, not idle; never under the adapter's lock, which the
/// polling lcore and the control path take too.
pub(crate) fn spend(ns: u64) {
    if ns == 0 {
        return;
    }
    let until = Instant::now() + Duration::from_nanos(ns);
    while Instant::now() < until {
        std::hint::spin_loop();
    }
}

/// Spin, then yield, then sleep a little longer each time while there is nothing to do, so that
/// many emulated ports on two cores stay cheap; `busy_poll` only spins.
#[derive(Default)]
struct Backoff {
    /// Idle polls in a row.
    idle: u32,
    /// When the idle stretch began (looked at every [`CLOCK_EVERY`] idle polls).
    since: Option<Instant>,
    /// Sleeps in a row.
    sleeps: u32,
}

impl Backoff {
    fn after(&mut self, work: usize, busy_poll: bool) {
        if work > 0 {
            self.idle = 0;
            self.since = None;
            self.sleeps = 0;
            return;
        }
        self.idle = self.idle.saturating_add(1);
        if busy_poll || self.idle % CLOCK_EVERY != 0 {
            std::hint::spin_loop();
            return;
        }
        let since = *self.since.get_or_insert_with(Instant::now);
        let idle = since.elapsed();
        if idle < SPIN_IDLE {
            std::hint::spin_loop();
        } else if idle < YIELD_IDLE {
            std::thread::yield_now();
        } else {
            let doublings = (self.sleeps / 64).min(2);
            self.sleeps = self.sleeps.saturating_add(1);
            std::thread::sleep((MIN_IDLE_SLEEP * (1 << doublings)).min(MAX_IDLE_SLEEP));
        }
    }
}

/// Start a thread that runs this adapter's device loop until `inner.stop` is set.
pub(crate) fn own_thread(inner: Arc<Inner>) -> Result<JoinHandle<()>, HcaError> {
    std::thread::Builder::new()
        .name("mlx4-hca".into())
        .spawn(move || {
            let mut backoff = Backoff::default();
            while !inner.stop.load(Ordering::Acquire) {
                let work = inner.poll();
                backoff.after(work, inner.busy_poll);
            }
        })
        .map_err(|e| HcaError::Io(format!("spawning the device loop: {e}")))
}

/// The adapters the process-wide device thread serves.
static SERVED: Mutex<Vec<Arc<Inner>>> = parking_lot::const_mutex(Vec::new());
/// The process-wide device thread, if running. Held while it is started or stopped, so there
/// is never more than one; the thread itself never takes it.
static THREAD: Mutex<Option<JoinHandle<()>>> = parking_lot::const_mutex(None);
/// Bumped whenever `SERVED` changes.
static GENERATION: AtomicU64 = AtomicU64::new(0);
/// The generation the shared thread works from.
static SEEN: AtomicU64 = AtomicU64::new(0);
/// Tells the shared thread to end (its list is empty).
static SHARED_STOP: AtomicBool = AtomicBool::new(false);

fn shared_loop() {
    let mut list: Vec<Arc<Inner>> = Vec::new();
    let mut seen = u64::MAX;
    let mut backoff = Backoff::default();
    while !SHARED_STOP.load(Ordering::Acquire) {
        let g = GENERATION.load(Ordering::Acquire);
        if g != seen {
            list = SERVED.lock().clone();
            seen = g;
            SEEN.store(g, Ordering::Release);
        }
        let work: usize = list.iter().map(|a| a.poll()).sum();
        backoff.after(work, list.iter().any(|a| a.busy_poll));
    }
}

/// Serve `inner` from the process-wide device thread, starting it if needed; idempotent.
pub(crate) fn join_shared(inner: &Arc<Inner>) -> Result<(), HcaError> {
    let mut thread = THREAD.lock();
    {
        let mut served = SERVED.lock();
        if served.iter().any(|a| Arc::ptr_eq(a, inner)) {
            return Ok(());
        }
        served.push(inner.clone());
        GENERATION.fetch_add(1, Ordering::AcqRel);
    }
    if thread.is_none() {
        SHARED_STOP.store(false, Ordering::Release);
        match std::thread::Builder::new()
            .name("mlx4-hca-all".into())
            .spawn(shared_loop)
        {
            Ok(h) => *thread = Some(h),
            Err(e) => {
                SERVED.lock().retain(|a| !Arc::ptr_eq(a, inner));
                GENERATION.fetch_add(1, Ordering::AcqRel);
                return Err(HcaError::Io(format!(
                    "spawning the shared device loop: {e}"
                )));
            }
        }
    }
    Ok(())
}

/// Stop serving `inner` from the process-wide thread; when this returns the thread no longer
/// polls it (the thread ends with its last adapter). Idempotent.
pub(crate) fn leave_shared(inner: &Arc<Inner>) {
    let mut thread = THREAD.lock();
    let (gen, empty) = {
        let mut served = SERVED.lock();
        let before = served.len();
        served.retain(|a| !Arc::ptr_eq(a, inner));
        if served.len() == before {
            return;
        }
        (
            GENERATION.fetch_add(1, Ordering::AcqRel) + 1,
            served.is_empty(),
        )
    };
    if empty {
        if let Some(h) = thread.take() {
            SHARED_STOP.store(true, Ordering::Release);
            let _ = h.join();
        }
        return;
    }
    // The thread picks the new list up at its next pass (at most one idle sleep away).
    while thread.is_some() && SEEN.load(Ordering::Acquire) < gen {
        std::thread::yield_now();
    }
}

/// Runs one send queue's share of the device in the caller's thread: whatever its doorbell and
/// BlueFlame register asked for since the last run. The ethdev burst glue calls it after
/// `tx_burst` posted, in the polled mode (`HcaConfig::threaded` false); it is safe in any mode
/// and from any thread, and cheap when there is nothing to do: a few loads of the doorbell word
/// and the BlueFlame halves, no lock.
#[derive(Clone)]
pub struct SqRunner {
    pub(crate) inner: Arc<Inner>,
    pub(crate) qpn: u32,
    /// The send doorbell word and BlueFlame halves: device pages that live as long as the
    /// adapter, which `inner` keeps.
    pub(crate) db: HostMem,
    pub(crate) bf: Option<[HostMem; 2]>,
    /// The queue left work unfinished (its CQ was full).
    pub(crate) busy: Arc<AtomicBool>,
}

impl std::fmt::Debug for SqRunner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqRunner").field("qpn", &self.qpn).finish()
    }
}

impl SqRunner {
    /// Execute what this SQ has been told to do; returns the work done (doorbells, BlueFlame
    /// writes, WQEs), 0 when there was nothing. A destroyed SQ does nothing.
    #[inline]
    pub fn run(&self) -> usize {
        if !self.wanted() {
            return 0;
        }
        let qpn = self.qpn;
        self.inner.charged(|st| st.poll_sq(qpn))
    }

    #[inline]
    fn wanted(&self) -> bool {
        let armed = |m: &HostMem| m.load_bytes8(0).is_some_and(|q| q != [0; 8]);
        self.db.load_be32(0).is_some_and(|v| v != 0)
            || self.busy.load(Ordering::Acquire)
            || self
                .bf
                .as_ref()
                .is_some_and(|h| armed(&h[0]) || armed(&h[1]))
    }
}

/// Runs the port's receive side in the caller's thread: delivers frames waiting in the port's
/// receive buffer to the RQs (and, on a TAP wire, reads the interface first). The ethdev burst
/// glue calls it before `rx_burst` polls, in the polled mode; safe in any mode and from any
/// thread, and cheap (two loads, no lock) when nothing is waiting.
#[derive(Clone)]
pub struct RxRunner {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for RxRunner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RxRunner")
    }
}

impl RxRunner {
    /// Deliver what is waiting; returns the frames handled, 0 when there were none.
    #[inline]
    pub fn run(&self) -> usize {
        if self.inner.port.inbox.pending() == 0 && !self.inner.wire_rx.load(Ordering::Relaxed) {
            return 0;
        }
        self.inner.state.lock().run_rx()
    }
}
