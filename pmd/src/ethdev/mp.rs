//! Several processes: a secondary process attaches to the primary's ports and creates nothing.
//! It reads the port and its queues from DPDK shared memory like the primary does; what only
//! the primary's device handle knows (device counters, missed frames, link) it asks the
//! primary for over DPDK's multi-process IPC, as [`Remote`], the secondary's [`Device`].
//!
//! Requests (`mlx4rs_mp` action, answered by the primary):
//! - attach / detach: a secondary starts or stops using the port. A software HCA that runs in
//!   the primary's polling lcore gets a thread of its own while any secondary is attached,
//!   since a secondary's bursts cannot run a device that lives in another process.
//! - counters (paged), missed, reset, link.
//!
//! Messages: request `[op u8][port u16][index u16]`; reply `[status i32]` then the answer
//! (counters: `[total u16][n u16]` and n times `[name length u8][name][value u64]`).

use std::ffi::CStr;
use std::sync::OnceLock;
use std::time::Duration;

use super::eth;
use super::Error;
use crate::eal::mp::{self as ipc, PARAM};
use crate::hw::{Caps, CqDesc, Device, HwError, QueueState, RqDesc, RssHash, SqDesc, RSS_KEY_LEN};
use crate::mem::{DmaRange, Mr};
use crate::pmd_log;

/// How long a secondary waits for the primary's answer.
const TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Op {
    Attach = 1,
    Detach = 2,
    Counters = 3,
    Missed = 4,
    Reset = 5,
    Link = 6,
}

impl Op {
    fn from_u8(b: u8) -> Option<Op> {
        [
            Op::Attach,
            Op::Detach,
            Op::Counters,
            Op::Missed,
            Op::Reset,
            Op::Link,
        ]
        .into_iter()
        .find(|o| *o as u8 == b)
    }
}

pub(super) use eth::secondary;

/// Runs `f` with this process's handles to port `port_id`, if it is a port of this driver,
/// from a thread that is not running an op on it (the IPC thread).
fn with_proc<T>(port_id: u16, f: impl FnOnce(&eth::Proc) -> T) -> Option<T> {
    let _open = eth::CLOSING.read();
    // SAFETY: only a port whose ops are ours is taken (checked before its Proc is used), and
    // closing, excluded above, alone frees its Proc.
    let (_, ops, p) = unsafe { eth::port_of(port_id) }?;
    if !std::ptr::eq(ops, &*super::ops::OPS) {
        return None;
    }
    p.map(f)
}

/// In the primary: answer secondaries' requests from now on (once per process).
pub(super) fn serve() {
    static SERVING: OnceLock<()> = OnceLock::new();
    SERVING.get_or_init(|| match ipc::serve::<Primary>() {
        Ok(()) | Err(libc::EEXIST) => {}
        Err(libc::ENOTSUP) => {
            // EAL refuses IPC actions where it has no multi-process channel by configuration
            // (`--in-memory`, `--no-shconf`, as Open vSwitch always runs): there are no
            // secondary processes to serve, so nothing is lost.
            pmd_log!(
                INFO,
                "no secondary processes in this EAL configuration (multi-process IPC is off): none to serve"
            );
        }
        Err(errno) => {
            pmd_log!(
                WARNING,
                "cannot serve secondary processes (rte_mp_action_register: errno {errno}); they will see no device counters"
            );
        }
    });
}

/// Encodes one (name, value) pair, or None when it does not fit in `room` bytes.
fn put_counter(out: &mut Vec<u8>, room: usize, name: &str, value: u64) -> bool {
    let name = &name.as_bytes()[..name.len().min(255)];
    if out.len() + 1 + name.len() + 8 > room {
        return false;
    }
    out.push(name.len() as u8);
    out.extend_from_slice(name);
    out.extend_from_slice(&value.to_le_bytes());
    true
}

/// The answer to a request about port `port_id`, from this process's device handle.
fn answer(op: Op, dev: &dyn Device, index: u16) -> Vec<u8> {
    let mut out = 0i32.to_le_bytes().to_vec();
    match op {
        Op::Attach => dev.secondary_attached(true),
        Op::Detach => dev.secondary_attached(false),
        Op::Counters => {
            let all = dev.counters();
            let head = out.len();
            out.extend_from_slice(&(all.len() as u16).to_le_bytes());
            out.extend_from_slice(&0u16.to_le_bytes());
            let mut n = 0u16;
            for (name, value) in all.iter().skip(usize::from(index)) {
                if !put_counter(&mut out, PARAM, name, *value) {
                    break;
                }
                n += 1;
            }
            out[head + 2..head + 4].copy_from_slice(&n.to_le_bytes());
        }
        Op::Missed => out.extend_from_slice(&dev.missed().to_le_bytes()),
        Op::Reset => dev.reset_counters(),
        Op::Link => out.push(u8::from(dev.link_up())),
    }
    out
}

/// What the primary answers secondaries (the `mlx4rs_mp` action): a request's answer, or a
/// negative errno.
struct Primary;

impl ipc::Action for Primary {
    const NAME: &'static CStr = c"mlx4rs_mp";

    fn reply(request: &[u8]) -> Vec<u8> {
        match request {
            [op, p0, p1, i0, i1, ..] => {
                let port_id = u16::from_le_bytes([*p0, *p1]);
                let index = u16::from_le_bytes([*i0, *i1]);
                match Op::from_u8(*op) {
                    Some(op) => {
                        // Under the lock that keeps the port from closing meanwhile.
                        let a = with_proc(port_id, |p| answer(op, p.handles.dev.as_ref(), index));
                        a.unwrap_or_else(|| (-libc::ENODEV).to_le_bytes().to_vec())
                    }
                    None => (-libc::EINVAL).to_le_bytes().to_vec(),
                }
            }
            _ => (-libc::EINVAL).to_le_bytes().to_vec(),
        }
    }
}

/// Sends one request to the primary and returns the answer after its status.
fn request(op: Op, port_id: u16, index: u16) -> Result<Vec<u8>, Error> {
    let req = [
        &[op as u8][..],
        &port_id.to_le_bytes()[..],
        &index.to_le_bytes()[..],
    ]
    .concat();
    let got = ipc::request(<Primary as ipc::Action>::NAME, &req, TIMEOUT);
    let got = got.ok_or_else(|| {
        Error::Device(format!(
            "the primary process did not answer ({op:?} on port {port_id})"
        ))
    })?;
    let status = i32::from_le_bytes(
        got.get(..4)
            .and_then(|s| s.try_into().ok())
            .ok_or_else(|| Error::Device("a short answer from the primary process".into()))?,
    );
    if status != 0 {
        return Err(Error::Device(format!(
            "the primary process answered {op:?} on port {port_id} with errno {}",
            -status
        )));
    }
    Ok(got[4..].to_vec())
}

/// A secondary process's view of a port's device: what the primary's handle knows, asked
/// over IPC; everything that would create, change or destroy device state is the primary's.
pub(super) struct Remote {
    port_id: u16,
    caps: Caps,
}

impl Remote {
    pub fn new(port_id: u16, caps: Caps) -> Remote {
        Remote { port_id, caps }
    }

    fn ask(&self, op: Op, index: u16) -> Result<Vec<u8>, HwError> {
        request(op, self.port_id, index).map_err(|e| HwError::Device(e.to_string()))
    }
}

const PRIMARY_ONLY: HwError = HwError::Unsupported("changing the device from a secondary process");

impl Device for Remote {
    fn caps(&self) -> Caps {
        self.caps
    }
    fn reg_mr(&self, _: DmaRange) -> Result<Mr, HwError> {
        Err(PRIMARY_ONLY)
    }
    fn dereg_mr(&self, _: &Mr) -> Result<(), HwError> {
        Err(PRIMARY_ONLY)
    }
    fn create_cq(&self, _: u32, _: i32) -> Result<CqDesc, HwError> {
        Err(PRIMARY_ONLY)
    }
    fn destroy_cq(&self, _: CqDesc) -> Result<(), HwError> {
        Err(PRIMARY_ONLY)
    }
    fn create_sq(&self, _: u32, _: &CqDesc, _: i32) -> Result<SqDesc, HwError> {
        Err(PRIMARY_ONLY)
    }
    fn destroy_sq(&self, _: SqDesc) -> Result<(), HwError> {
        Err(PRIMARY_ONLY)
    }
    fn create_rq(&self, _: u32, _: u32, _: &CqDesc, _: i32) -> Result<RqDesc, HwError> {
        Err(PRIMARY_ONLY)
    }
    fn destroy_rq(&self, _: RqDesc) -> Result<(), HwError> {
        Err(PRIMARY_ONLY)
    }
    fn sq_state(&self, _: u32) -> Result<QueueState, HwError> {
        Err(HwError::Unsupported("queue state from a secondary process"))
    }
    fn rq_state(&self, _: u32) -> Result<QueueState, HwError> {
        Err(HwError::Unsupported("queue state from a secondary process"))
    }
    fn restart_rq(&self, _: u32) -> Result<(), HwError> {
        Err(PRIMARY_ONLY)
    }
    fn set_rx_filter(&self, _: [u8; 6], _: bool, _: bool) -> Result<(), HwError> {
        Err(PRIMARY_ONLY)
    }
    fn set_mtu(&self, _: u16) -> Result<(), HwError> {
        Err(PRIMARY_ONLY)
    }
    fn set_rss(&self, _: &[u8; RSS_KEY_LEN], _: RssHash) -> Result<(), HwError> {
        Err(PRIMARY_ONLY)
    }
    fn set_rx_steering(&self, _: &[u32]) -> Result<(), HwError> {
        Err(PRIMARY_ONLY)
    }
    fn start(&self) -> Result<(), HwError> {
        Err(PRIMARY_ONLY)
    }
    fn stop(&self) {}

    fn link_up(&self) -> bool {
        self.ask(Op::Link, 0)
            .map(|a| a.first() == Some(&1))
            .unwrap_or(false)
    }

    fn counters(&self) -> Vec<(String, u64)> {
        let mut out = Vec::new();
        loop {
            let Ok(a) = self.ask(Op::Counters, out.len() as u16) else {
                return out;
            };
            let (Some(total), Some(n)) = (a.get(0..2), a.get(2..4)) else {
                return out;
            };
            let total = usize::from(u16::from_le_bytes([total[0], total[1]]));
            let n = u16::from_le_bytes([n[0], n[1]]);
            let mut rest = &a[4..];
            for _ in 0..n {
                let Some((&len, tail)) = rest.split_first() else {
                    return out;
                };
                let len = usize::from(len);
                if tail.len() < len + 8 {
                    return out;
                }
                let name = String::from_utf8_lossy(&tail[..len]).into_owned();
                let value = u64::from_le_bytes(tail[len..len + 8].try_into().expect("8 bytes"));
                out.push((name, value));
                rest = &tail[len + 8..];
            }
            if n == 0 || out.len() >= total {
                return out;
            }
        }
    }

    fn reset_counters(&self) {
        if let Err(e) = self.ask(Op::Reset, 0) {
            pmd_log!(WARNING, "port {}: {e}", self.port_id);
        }
    }

    fn missed(&self) -> u64 {
        self.ask(Op::Missed, 0)
            .ok()
            .and_then(|a| {
                a.get(..8)
                    .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
            })
            .unwrap_or(0)
    }

    fn secondary_attached(&self, attached: bool) {
        let op = if attached { Op::Attach } else { Op::Detach };
        if let Err(e) = self.ask(op, 0) {
            pmd_log!(WARNING, "port {}: {e}", self.port_id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_page_within_one_message() {
        let mut out = vec![0u8; 8];
        let mut n = 0;
        while put_counter(&mut out, PARAM, "hca_rx_drops_no_wqe", n) {
            n += 1;
        }
        assert!(out.len() <= PARAM);
        assert_eq!(n as usize, (PARAM - 8) / (1 + 19 + 8));
        for op in [
            Op::Attach,
            Op::Detach,
            Op::Counters,
            Op::Missed,
            Op::Reset,
            Op::Link,
        ] {
            assert_eq!(Op::from_u8(op as u8), Some(op));
        }
        assert_eq!(Op::from_u8(0), None);
    }
}
