//! DPDK's multi-process IPC as plain bytes: an action this process answers ([`Action`],
//! [`serve`]), and a request to the other processes, answered by one ([`request`]).
//!
//! A message is its action's name and up to [`PARAM`] bytes; what those bytes mean is the
//! caller's (file descriptors are never passed).

use std::ffi::{c_char, c_int, c_void, CStr};
use std::time::Duration;

use dpdk_sys as sys;

/// Bytes a message carries at most.
pub(crate) const PARAM: usize = sys::RTE_MP_MAX_PARAM_LEN as usize;

/// An IPC action: requests named [`Action::NAME`], each answered with what
/// [`Action::reply`] makes of its bytes. Replies longer than [`PARAM`] are cut there.
pub(crate) trait Action {
    const NAME: &'static CStr;
    fn reply(request: &[u8]) -> Vec<u8>;
}

/// The bytes of a message (`len_param`, clamped to the array, since the peer wrote it).
fn param(msg: &sys::rte_mp_msg) -> &[u8] {
    &msg.param[..(msg.len_param.clamp(0, PARAM as c_int) as usize)]
}

/// A message named `name` (NUL-padded, as the array comes) with the first [`PARAM`] of `bytes`.
fn message(name: [c_char; sys::RTE_MP_MAX_NAME_LEN as usize], bytes: &[u8]) -> sys::rte_mp_msg {
    let n = bytes.len().min(PARAM);
    let mut msg = sys::rte_mp_msg {
        name,
        len_param: n as c_int,
        ..Default::default()
    };
    msg.param[..n].copy_from_slice(&bytes[..n]);
    msg
}

/// `name` as a message's name field; None when it does not fit with its NUL.
fn name_field(name: &CStr) -> Option<[c_char; sys::RTE_MP_MAX_NAME_LEN as usize]> {
    let bytes = name.to_bytes();
    let mut field = [0 as c_char; sys::RTE_MP_MAX_NAME_LEN as usize];
    if bytes.len() >= field.len() {
        return None;
    }
    for (d, s) in field.iter_mut().zip(bytes) {
        *d = *s as c_char;
    }
    Some(field)
}

unsafe extern "C" fn answer<A: Action>(msg: *const sys::rte_mp_msg, peer: *const c_void) -> c_int {
    // SAFETY: EAL calls an action with a valid request and the requester's address, which
    // rte_mp_reply takes back, with a valid reply.
    unsafe {
        let msg = &*msg;
        let mut reply = message(msg.name, &A::reply(param(msg)));
        sys::rte_mp_reply(&mut reply, peer.cast())
    }
}

/// Answers `A`'s requests from now on (EAL's IPC thread runs [`Action::reply`]). An error
/// is EAL's errno: `EEXIST` when the action is already served, `ENOTSUP` where EAL runs without
/// a multi-process channel (`--in-memory`, `--no-shconf`).
pub(crate) fn serve<A: Action>() -> Result<(), c_int> {
    // SAFETY: a NUL-terminated static name (EAL refuses one too long); the handler is a
    // function of this library, which a process does not unload while EAL runs; then EAL's
    // per-thread errno.
    let (rc, errno) = unsafe {
        let rc = sys::rte_mp_action_register(A::NAME.as_ptr(), Some(answer::<A>));
        (rc, sys::mlx4rs_errno())
    };
    if rc < 0 {
        return Err(errno);
    }
    Ok(())
}

/// Sends `bytes` as a request named `name` and waits up to `timeout` for the answer; None
/// unless exactly one process answered (a secondary asking its primary), or when the request
/// does not fit in a message.
pub(crate) fn request(name: &CStr, bytes: &[u8], timeout: Duration) -> Option<Vec<u8>> {
    if bytes.len() > PARAM {
        return None;
    }
    let mut msg = message(name_field(name)?, bytes);
    let mut reply = sys::rte_mp_reply::default();
    let ts = sys::timespec {
        tv_sec: timeout.as_secs() as _,
        tv_nsec: timeout.subsec_nanos() as _,
    };
    // SAFETY: a valid request, with no file descriptors, and a reply record for EAL to fill:
    // it mallocs `reply.msgs` (NULL, or `nb_received` messages), which is copied from and
    // freed here once.
    unsafe {
        let rc = sys::rte_mp_request_sync(&mut msg, &mut reply, &ts);
        let got = (rc == 0 && reply.nb_received == 1 && !reply.msgs.is_null())
            .then(|| param(&*reply.msgs).to_vec());
        libc::free(reply.msgs.cast());
        got
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_keeps_its_name_and_at_most_a_message_of_bytes() {
        let name = name_field(c"mlx4rs_mp").unwrap();
        let m = message(name, &[7; PARAM + 10]);
        assert_eq!(m.len_param as usize, PARAM);
        assert_eq!(param(&m), &[7; PARAM][..]);
        assert_eq!(
            m.name[..10].iter().map(|&c| c as u8).collect::<Vec<_>>(),
            b"mlx4rs_mp\0"
        );
        let long = std::ffi::CString::new(vec![b'a'; sys::RTE_MP_MAX_NAME_LEN as usize]).unwrap();
        assert!(name_field(&long).is_none());
        let peer = sys::rte_mp_msg {
            len_param: -1,
            ..message(name, &[1, 2])
        };
        assert!(param(&peer).is_empty());
        let peer = sys::rte_mp_msg {
            len_param: c_int::MAX,
            ..message(name, &[1, 2])
        };
        assert_eq!(param(&peer).len(), PARAM);
    }
}
