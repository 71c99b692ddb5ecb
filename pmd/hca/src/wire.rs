//! What is plugged into the port: the wire kinds, the port's receive buffer, the process-wide
//! registry that lets two ports be cabled by name, and the pcap writer.

use std::fmt;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;

use crate::cable::Cable;
use crate::error::HcaError;
use crate::inbox::{FrameRing, Producer};
use crate::tap::Tap;

/// A closure that sees every transmitted frame.
pub type FrameSink = Box<dyn FnMut(&[u8]) + Send>;

/// What the port is cabled to.
pub enum Wire {
    /// Nothing: transmitted frames are counted and dropped; nothing is received.
    Null,
    /// A loopback plug: transmitted frames come back on the same port's RX.
    Loop,
    /// A cable to the port of the `Hca` whose [`crate::HcaConfig::name`] is this; resolved when
    /// the first frame is sent, so the peer may be opened later.
    Peer(String),
    /// Every transmitted frame is appended to this pcap file (created or truncated).
    Pcap(PathBuf),
    /// A Linux TAP interface of this name (created if absent; bringing it up is the caller's job).
    Tap(String),
    /// A cable through this file (created if absent): the other end is whichever port, in
    /// this process or another, with this library or another copy of it, plugs into the same
    /// path. Each file takes two ends.
    Cable(PathBuf),
    /// Every transmitted frame is handed to the closure (tests). It runs on the device loop with
    /// the adapter locked, so it must not call back into the same `Hca`.
    Sink(FrameSink),
}

impl fmt::Debug for Wire {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Wire::Null => f.write_str("Null"),
            Wire::Loop => f.write_str("Loop"),
            Wire::Peer(n) => f.debug_tuple("Peer").field(n).finish(),
            Wire::Pcap(p) => f.debug_tuple("Pcap").field(p).finish(),
            Wire::Tap(n) => f.debug_tuple("Tap").field(n).finish(),
            Wire::Cable(p) => f.debug_tuple("Cable").field(p).finish(),
            Wire::Sink(_) => f.write_str("Sink(..)"),
        }
    }
}

impl FromStr for Wire {
    type Err = HcaError;

    /// Parse the devarg form: `null`, `loop`, `peer:<name>`, `pcap:<path>`, `tap:<ifname>`,
    /// `cable:<path>`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |why: &str| {
            HcaError::InvalidArgument(format!(
                "wire {s:?}: {why}; expected null, loop, peer:<name>, pcap:<path>, tap:<ifname> or cable:<path>"
            ))
        };
        let (kind, arg) = match s.split_once(':') {
            Some((k, a)) => (k, Some(a)),
            None => (s, None),
        };
        match (kind, arg) {
            ("null", None) => Ok(Wire::Null),
            ("loop", None) => Ok(Wire::Loop),
            ("null" | "loop", Some(_)) => Err(bad("takes no argument")),
            ("peer" | "pcap" | "tap" | "cable", None | Some("")) => {
                Err(bad("missing argument after ':'"))
            }
            ("cable", Some(a)) => Ok(Wire::Cable(PathBuf::from(a))),
            ("peer", Some(a)) => Ok(Wire::Peer(a.to_owned())),
            ("pcap", Some(a)) => Ok(Wire::Pcap(PathBuf::from(a))),
            ("tap", Some(a)) if a.len() >= libc::IFNAMSIZ => {
                Err(bad("interface name longer than 15 bytes"))
            }
            ("tap", Some(a)) => Ok(Wire::Tap(a.to_owned())),
            _ => Err(bad("unknown wire kind")),
        }
    }
}

/// The receive side of a port, shared with whoever may deliver frames to it (its own loop wire,
/// a cabled port on another thread, a TAP reader): its receive buffer.
#[derive(Debug)]
pub(crate) struct RxPort {
    pub(crate) inbox: FrameRing,
    /// Peers holding the port right now ([`RxPort::enter`]): a `peer:` partner for a whole
    /// poll, from its first frame to the flush.
    holders: AtomicUsize,
    /// The adapter is closing: its inbox's memory may go as soon as the holders are gone.
    closed: AtomicBool,
}

/// A peer's hold on a port it delivers into or looks at: the port's adapter does not finish
/// closing (and so its memory stays) until every hold is dropped.
pub(crate) struct Held(Arc<RxPort>);

impl std::ops::Deref for Held {
    type Target = RxPort;
    fn deref(&self) -> &RxPort {
        &self.0
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.0.holders.fetch_sub(1, Ordering::SeqCst);
    }
}

impl RxPort {
    /// A port receiving into `inbox`.
    pub(crate) fn on(inbox: FrameRing) -> Self {
        RxPort {
            inbox,
            holders: AtomicUsize::new(0),
            closed: AtomicBool::new(false),
        }
    }

    /// A hold for a peer, or `None` once the port's adapter is closing. Sequentially
    /// consistent on both sides (the peer counts itself, then looks at `closed`; `retire`
    /// sets `closed`, then looks at the count), so either the peer sees the port closing or
    /// the closer sees the peer's hold and waits for it.
    pub(crate) fn enter(self: Arc<Self>) -> Option<Held> {
        self.holders.fetch_add(1, Ordering::SeqCst);
        let held = Held(self);
        if held.closed.load(Ordering::SeqCst) {
            return None;
        }
        Some(held)
    }

    /// The adapter's last handle is going: no peer may hold the port from now on, and those
    /// that do (each for the rest of one poll) are waited for, so that the memory the inbox
    /// lives in can be given back. A peer's poll always ends (its inbox lock has a deadline).
    pub(crate) fn retire(&self) {
        self.closed.store(true, Ordering::SeqCst);
        while self.holders.load(Ordering::SeqCst) != 0 {
            std::thread::yield_now();
        }
    }

    /// A port whose receive buffer (on the heap) takes `frames` frames.
    #[cfg(test)]
    pub(crate) fn new(frames: u32) -> Self {
        let bytes = (frames as usize * 2048).max(4 * (crate::types::MAX_FRAME + 64));
        RxPort::on(FrameRing::on_heap(bytes, frames))
    }

    /// Deliver one frame; false when the port is down or its buffer is full (then counted in
    /// the buffer as dropped), so a sender is never blocked by a slow receiver.
    #[cfg(test)]
    pub(crate) fn deliver(&self, frame: &[u8]) -> bool {
        self.inbox.producer().push(frame)
    }

    pub(crate) fn has_pending(&self) -> bool {
        self.inbox.pending() != 0
    }

    pub(crate) fn up(&self) -> bool {
        self.inbox.up()
    }
}

/// Ports that can be cabled to by name.
static REGISTRY: Mutex<Vec<(String, Weak<RxPort>)>> = parking_lot::const_mutex(Vec::new());

pub(crate) fn register(name: &str, port: &Arc<RxPort>) -> Result<(), HcaError> {
    let mut reg = REGISTRY.lock();
    reg.retain(|(_, w)| w.strong_count() > 0);
    if reg.iter().any(|(n, _)| n == name) {
        return Err(HcaError::NameInUse(name.to_owned()));
    }
    reg.push((name.to_owned(), Arc::downgrade(port)));
    Ok(())
}

pub(crate) fn unregister(port: &Arc<RxPort>) {
    let weak = Arc::downgrade(port);
    REGISTRY
        .lock()
        .retain(|(_, w)| !w.ptr_eq(&weak) && w.strong_count() > 0);
}

fn lookup(name: &str) -> Option<Weak<RxPort>> {
    let reg = REGISTRY.lock();
    reg.iter()
        .find(|(n, w)| n == name && w.strong_count() > 0)
        .map(|(_, w)| w.clone())
}

/// Appends frames to a pcap file (microsecond timestamps, LINKTYPE_ETHERNET).
pub(crate) struct PcapWriter {
    out: BufWriter<File>,
    dirty: bool,
}

const PCAP_MAGIC: u32 = 0xa1b2_c3d4;
const PCAP_SNAPLEN: u32 = 262_144;
const LINKTYPE_ETHERNET: u32 = 1;

impl PcapWriter {
    pub(crate) fn create(path: &std::path::Path) -> io::Result<Self> {
        let mut out = BufWriter::new(File::create(path)?);
        let mut hdr = Vec::with_capacity(24);
        hdr.extend_from_slice(&PCAP_MAGIC.to_le_bytes());
        hdr.extend_from_slice(&2u16.to_le_bytes());
        hdr.extend_from_slice(&4u16.to_le_bytes());
        hdr.extend_from_slice(&0i32.to_le_bytes()); // thiszone
        hdr.extend_from_slice(&0u32.to_le_bytes()); // sigfigs
        hdr.extend_from_slice(&PCAP_SNAPLEN.to_le_bytes());
        hdr.extend_from_slice(&LINKTYPE_ETHERNET.to_le_bytes());
        out.write_all(&hdr)?;
        out.flush()?;
        Ok(PcapWriter { out, dirty: false })
    }

    pub(crate) fn write(&mut self, frame: &[u8]) -> io::Result<()> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let incl = frame.len().min(PCAP_SNAPLEN as usize);
        let mut rec = [0u8; 16];
        rec[0..4].copy_from_slice(&(now.as_secs() as u32).to_le_bytes());
        rec[4..8].copy_from_slice(&now.subsec_micros().to_le_bytes());
        rec[8..12].copy_from_slice(&(incl as u32).to_le_bytes());
        rec[12..16].copy_from_slice(&(frame.len() as u32).to_le_bytes());
        self.out.write_all(&rec)?;
        self.out.write_all(&frame[..incl])?;
        self.dirty = true;
        Ok(())
    }

    /// Push buffered records to the file so a concurrent reader sees every frame sent so far.
    pub(crate) fn flush(&mut self) -> io::Result<()> {
        if self.dirty {
            self.dirty = false;
            self.out.flush()?;
        }
        Ok(())
    }
}

/// What is plugged into the port, as the device loop drives it.
enum Link {
    Null,
    Loop,
    Peer {
        name: String,
        target: Option<Weak<RxPort>>,
    },
    Pcap(PcapWriter),
    Tap(Tap),
    Sink(FrameSink),
    Cable(Cable),
}

/// The port's wire as the device loop drives it. Frames a walk sends to a port's receive buffer
/// (its own, or a cabled one) go in under one lock taken at the first frame and released by
/// [`WirePort::flush`] at the end of the walk.
pub(crate) struct WirePort {
    link: Link,
    /// The receive buffer frames are going into during the current batch, and the hold on a
    /// peer's port it lives in (dropped after the producer, which writes there as it goes).
    batch: Option<(Producer, Option<Held>)>,
}

/// What happened to a transmitted frame at the sending port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TxOutcome {
    /// It left the port (if the receiving side then refused it, that side counts the drop).
    Sent,
    /// The port could not put it on the wire (no peer, TAP refused, pcap write failed).
    Dropped,
}

impl WirePort {
    pub(crate) fn null() -> Self {
        WirePort {
            link: Link::Null,
            batch: None,
        }
    }

    pub(crate) fn open(wire: Wire) -> Result<Self, HcaError> {
        let link = match wire {
            Wire::Null => Link::Null,
            Wire::Loop => Link::Loop,
            Wire::Peer(name) => Link::Peer { name, target: None },
            Wire::Pcap(path) => Link::Pcap(
                PcapWriter::create(&path)
                    .map_err(|e| HcaError::Io(format!("pcap wire {}: {e}", path.display())))?,
            ),
            Wire::Tap(name) => Link::Tap(
                Tap::open(&name).map_err(|e| HcaError::Io(format!("tap wire {name}: {e}")))?,
            ),
            Wire::Sink(f) => Link::Sink(f),
            Wire::Cable(path) => Link::Cable(Cable::open(&path)?),
        };
        Ok(WirePort { link, batch: None })
    }

    /// Whether transmitted frames need their bytes at all (the null wire only counts them, so
    /// the device skips the copy and stays cheap on a TX benchmark).
    pub(crate) fn wants_bytes(&self) -> bool {
        !matches!(self.link, Link::Null)
    }

    /// Frames arrive from outside the process's ports (a TAP interface, a cable's far end),
    /// so receiving means looking at the wire, not only at the port's receive buffer.
    pub(crate) fn brings_frames(&self) -> bool {
        matches!(self.link, Link::Tap(_) | Link::Cable(_))
    }

    /// The receive buffer this batch delivers into, locked at the first frame.
    #[inline(always)]
    fn batch_into(&mut self, own: &RxPort) -> Option<&mut Producer> {
        if self.batch.is_none() {
            self.open_batch(own);
        }
        self.batch.as_mut().map(|(p, _)| p)
    }

    /// Lock the receive buffer a batch delivers into, at its first frame.
    #[cold]
    fn open_batch(&mut self, own: &RxPort) {
        self.batch = match &mut self.link {
            Link::Loop => Some((own.inbox.producer(), None)),
            Link::Peer { name, target } => {
                let port = target.as_ref().and_then(Weak::upgrade).or_else(|| {
                    *target = lookup(name);
                    target.as_ref().and_then(Weak::upgrade)
                });
                port.and_then(|p| p.enter())
                    .map(|held| (held.inbox.producer(), Some(held)))
            }
            Link::Cable(c) => Some((c.tx.producer(), None)),
            _ => None,
        };
    }

    pub(crate) fn transmit(&mut self, own: &RxPort, frame: &[u8]) -> TxOutcome {
        let ok = match &mut self.link {
            Link::Null => true,
            Link::Loop | Link::Peer { .. } | Link::Cable(_) => match self.batch_into(own) {
                Some(p) => {
                    // Refused frames are the receiving side's drops, counted there.
                    p.push(frame);
                    true
                }
                None => false,
            },
            Link::Pcap(w) => w.write(frame).is_ok(),
            Link::Tap(t) => t.send(frame),
            Link::Sink(f) => {
                f(frame);
                true
            }
        };
        if ok {
            TxOutcome::Sent
        } else {
            TxOutcome::Dropped
        }
    }

    /// [`WirePort::transmit`] of the `len`-byte frame that is `spans` of `src` (byte offset,
    /// length), copied straight into the receiving port's buffer or the cable; `None` where
    /// the wire takes frames whole (pcap, TAP, a sink, the null wire), for the caller to
    /// assemble.
    pub(crate) fn transmit_spans(
        &mut self,
        own: &RxPort,
        src: &[u8],
        spans: &[(u16, u16)],
        len: usize,
    ) -> Option<TxOutcome> {
        if !matches!(self.link, Link::Loop | Link::Peer { .. } | Link::Cable(_)) {
            return None;
        }
        Some(match self.batch_into(own) {
            Some(p) => {
                // Refused frames are the receiving side's drops, counted there.
                p.push_spans(src, spans, len);
                TxOutcome::Sent
            }
            None => TxOutcome::Dropped,
        })
    }

    /// Where a run's frames go on a wire that takes them straight into a receive buffer (the
    /// loop, a peer, a cable): `None` on any other wire, `Some(None)` when nothing receives
    /// (the frames are dropped), else the open batch's producer.
    pub(crate) fn run_into(&mut self, own: &RxPort) -> Option<Option<&mut Producer>> {
        if !matches!(self.link, Link::Loop | Link::Peer { .. } | Link::Cable(_)) {
            return None;
        }
        Some(self.batch_into(own))
    }

    /// Bring frames from the outside world into the port's receive buffer (TAP only); returns
    /// how many arrived.
    pub(crate) fn poll_rx(&mut self, own: &RxPort, budget: usize) -> usize {
        let Link::Tap(t) = &mut self.link else {
            return 0;
        };
        let mut n = 0;
        let mut into: Option<Producer> = None;
        while n < budget {
            let Some((scratch, len)) = t.recv() else {
                break;
            };
            into.get_or_insert_with(|| own.inbox.producer())
                .push(&scratch[..len]);
            n += 1;
        }
        n
    }

    /// Whether the wire has a carrier (the far end is there and up), and whether it is gone
    /// for good (a cable whose file was deleted or cut short).
    pub(crate) fn carrier(&mut self) -> (bool, bool) {
        match &mut self.link {
            Link::Null | Link::Loop | Link::Pcap(_) | Link::Sink(_) => (true, false),
            Link::Peer { name, target } => {
                let port = target.as_ref().and_then(Weak::upgrade).or_else(|| {
                    *target = lookup(name);
                    target.as_ref().and_then(Weak::upgrade)
                });
                (port.and_then(RxPort::enter).is_some_and(|p| p.up()), false)
            }
            Link::Tap(t) => (t.is_up(), false),
            Link::Cable(c) => {
                let gone = c.unlinked() || c.cut();
                (!gone && c.peer_present(), gone)
            }
        }
    }

    /// The port went down or up: a TAP's carrier follows (the kernel queues nothing for a port
    /// that is down), and what it had queued is discarded going down. Returns the frames
    /// discarded.
    pub(crate) fn set_port_up(&mut self, up: bool) -> u64 {
        let Link::Tap(t) = &mut self.link else {
            return 0;
        };
        t.set_carrier(up);
        if up {
            0
        } else {
            t.drain()
        }
    }

    /// The port's MTU changed: a TAP interface takes it too (wherever it is now), so the
    /// kernel side sends and takes frames of the same size.
    pub(crate) fn set_mtu(&mut self, mtu: u16) -> io::Result<()> {
        match &mut self.link {
            Link::Tap(t) => t.set_mtu(mtu),
            _ => Ok(()),
        }
    }

    /// The cable end frames from outside arrive on, if this wire is a cable.
    pub(crate) fn cable(&mut self) -> Option<&mut Cable> {
        match &mut self.link {
            Link::Cable(c) => Some(c),
            _ => None,
        }
    }

    /// End of a batch: publish frames delivered to receive buffers, make buffered output
    /// visible.
    pub(crate) fn flush(&mut self) {
        self.batch = None;
        if let Link::Pcap(w) = &mut self.link {
            let _ = w.flush();
        }
    }

    pub(crate) fn describe(&self) -> String {
        match &self.link {
            Link::Null => "null".into(),
            Link::Loop => "loop".into(),
            Link::Peer { name, .. } => format!("peer:{name}"),
            Link::Pcap(_) => "pcap".into(),
            Link::Tap(t) => format!("tap:{}", t.name()),
            Link::Sink(_) => "sink".into(),
            Link::Cable(c) => format!("cable:{}", c.path().display()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_wires() {
        assert!(matches!("null".parse::<Wire>(), Ok(Wire::Null)));
        assert!(matches!("loop".parse::<Wire>(), Ok(Wire::Loop)));
        assert!(
            matches!("peer:net_mlx4rs1".parse::<Wire>(), Ok(Wire::Peer(n)) if n == "net_mlx4rs1")
        );
        assert!(
            matches!("pcap:/tmp/a:b.pcap".parse::<Wire>(), Ok(Wire::Pcap(p)) if p == std::path::Path::new("/tmp/a:b.pcap"))
        );
        assert!(matches!("tap:mlx0".parse::<Wire>(), Ok(Wire::Tap(n)) if n == "mlx0"));
        for bad in [
            "",
            "nul",
            "peer",
            "peer:",
            "null:x",
            "tap:0123456789abcdef",
            "wire:x",
        ] {
            let e = bad.parse::<Wire>().unwrap_err().to_string();
            assert!(e.contains("expected null, loop"), "{bad}: {e}");
        }
    }

    #[test]
    fn inbox_bounded() {
        let p = RxPort::new(2);
        assert!(p.deliver(&[1]));
        assert!(p.deliver(&[2]));
        assert!(!p.deliver(&[3]));
        assert_eq!(p.inbox.dropped(), 1);
        let mut got = Vec::new();
        p.inbox.consume(10, |f| {
            got.push(f.to_vec());
            true
        });
        assert_eq!(got, [vec![1], vec![2]]);
        assert!(!p.has_pending());
    }
}
