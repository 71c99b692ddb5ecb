//! Why a control-path request failed: the one error type of the model's control channel.

use std::fmt;

/// Why a control-path request failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HcaError {
    /// A parameter is out of range, misaligned, null or not a power of two.
    InvalidArgument(String),
    /// No such queue, CQ or memory region.
    NotFound(&'static str, u32),
    /// A limit from [`Caps`](crate::Caps) was reached.
    NoResources(&'static str),
    /// The CQ still has queues reporting to it.
    Busy(u32),
    /// Another open adapter already uses this name.
    NameInUse(String),
    /// Opening a wire failed.
    Io(String),
}

impl fmt::Display for HcaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HcaError::InvalidArgument(s) => write!(f, "invalid argument: {s}"),
            HcaError::NotFound(what, n) => write!(f, "no {what} {n:#x}"),
            HcaError::NoResources(what) => write!(f, "out of {what}"),
            HcaError::Busy(cqn) => write!(f, "CQ {cqn:#x} still has queues attached"),
            HcaError::NameInUse(n) => write!(f, "an adapter named {n:?} is already open"),
            HcaError::Io(s) => f.write_str(s),
        }
    }
}

impl std::error::Error for HcaError {}

impl HcaError {
    /// The positive errno a DPDK callback would return (negated) for this error.
    pub fn errno(&self) -> i32 {
        match self {
            HcaError::InvalidArgument(_) => libc::EINVAL,
            HcaError::NotFound(..) => libc::ENOENT,
            HcaError::NoResources(_) => libc::ENOMEM,
            HcaError::Busy(_) => libc::EBUSY,
            HcaError::NameInUse(_) => libc::EEXIST,
            HcaError::Io(_) => libc::EIO,
        }
    }
}

pub(crate) fn invalid(s: impl Into<String>) -> HcaError {
    HcaError::InvalidArgument(s.into())
}
