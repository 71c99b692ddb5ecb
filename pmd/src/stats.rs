//! Counter definitions. Each counter is written once, in a `counters!` list: its field, its
//! kind (a basic ethdev statistic or an extended one) and its name follow from that line, and
//! so do summing and resetting. The ethdev layer maps the basic ones onto `rte_eth_stats`.

/// Where a counter shows up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A field of `rte_eth_stats` (packets, bytes, errors, ...): not repeated as an xstat.
    Basic,
    /// An extended statistic, named after the field (`tx_<name>` and `tx_q<N>_<name>`).
    Extended,
}

/// A set of counters that add up, field by field.
pub trait Counters: Default {
    fn add(&mut self, other: &Self);
}

/// The sum of each queue's counters: the port's totals.
pub fn sum<C: Counters>(each: impl IntoIterator<Item = C>) -> C {
    each.into_iter().fold(C::default(), |mut t, c| {
        t.add(&c);
        t
    })
}

/// Declares a set of `u64` counters: the struct, its names and kinds, iteration, sum and reset.
macro_rules! counters {
    ($(#[$meta:meta])* pub struct $name:ident {
        $($(#[doc = $doc:literal])* $field:ident: $kind:ident,)*
    }) => {
        $(#[$meta])*
        #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
        #[repr(C)]
        pub struct $name {
            $($(#[doc = $doc])* pub $field: u64,)*
        }

        impl $name {
            /// Every counter: its name and kind, in declaration order.
            pub const FIELDS: &'static [(&'static str, $crate::stats::Kind)] =
                &[$((stringify!($field), $crate::stats::Kind::$kind)),*];

            /// `(name, kind, value)` for every counter, in declaration order.
            pub fn iter(&self) -> impl Iterator<Item = (&'static str, $crate::stats::Kind, u64)> {
                [$((stringify!($field), $crate::stats::Kind::$kind, self.$field)),*].into_iter()
            }

            /// The extended counters only: `(name, value)`.
            pub fn extended(&self) -> impl Iterator<Item = (&'static str, u64)> {
                self.iter()
                    .filter(|(_, k, _)| *k == $crate::stats::Kind::Extended)
                    .map(|(n, _, v)| (n, v))
            }

            /// Adds `other` into `self`, counter by counter.
            pub fn add(&mut self, other: &Self) {
                $(self.$field += other.$field;)*
            }

            /// Zeroes every counter.
            pub fn reset(&mut self) {
                *self = Self::default();
            }

            /// Reads the counters at `p` word by word, as a thread beside their writer does.
            ///
            /// # Safety
            /// `p` points to a live, aligned set of these counters.
            #[allow(unsafe_code)]
            pub unsafe fn read_volatile(p: *const Self) -> Self {
                // SAFETY: the caller's pointer; each field is an aligned u64.
                unsafe { Self { $($field: std::ptr::addr_of!((*p).$field).read_volatile(),)* } }
            }

            /// Writes `v` over the counters at `p` word by word.
            ///
            /// # Safety
            /// As for `read_volatile`.
            #[allow(unsafe_code)]
            pub unsafe fn write_volatile(p: *mut Self, v: Self) {
                // SAFETY: as for read_volatile.
                unsafe { $(std::ptr::addr_of_mut!((*p).$field).write_volatile(v.$field);)* }
            }
        }

        impl $crate::stats::Counters for $name {
            fn add(&mut self, other: &Self) {
                $name::add(self, other)
            }
        }
    };
}
counters! {
    /// One TX queue's counters.
    pub struct TxStats {
        /// Packets posted to the device (`opackets`).
        packets: Basic,
        /// Their bytes (`obytes`).
        bytes: Basic,
        /// Packets dropped because they can never be sent, and error completions (`oerrors`).
        errors: Basic,
        /// UAR doorbell writes.
        doorbells: Extended,
        /// BlueFlame copies (each one also acts as the doorbell).
        bf_writes: Extended,
        /// Packets copied into their WQE.
        inline_packets: Extended,
        /// Packets sent by gather WQEs (data segments pointing at the buffers).
        gather_packets: Extended,
        /// Completions consumed.
        completions: Extended,
        /// Bursts cut short because the ring (or the completion bookkeeping) was full.
        ring_full: Extended,
        /// Error completions (the queue is recreated after one).
        error_cqes: Extended,
        /// Of `inline_packets`, those the general path posted (offloads, VLAN, several
        /// segments, inline WQEs beyond two TXBBs); the others took the straight-line path.
        general_inline: Extended,
        /// Of `gather_packets`, those the general path posted (the others: one segment, no
        /// offload, a buffer in the lkey cache's region).
        general_gather: Extended,
        /// Malformed packets refused (also in `oerrors`): segments whose data leaves their
        /// buffer, a chain that is not `nb_segs` long (or loops), a `pkt_len` that is not the
        /// segments' sum, a TSO request a card refuses. Each is freed, once per segment.
        bad_mbufs: Extended,
        /// Packets posted (so in `opackets`) and then lost with a queue an error completion
        /// stopped: the failed WQE's and those posted after it. Also in `oerrors`. Frames on
        /// the wire are `opackets - flushed`.
        flushed: Extended,
        /// Times the queue was recreated after an error completion.
        queue_resets: Extended,
        /// Doorbells written again because posted WQEs made no progress between two looks
        /// (a lost doorbell; see `TxQueue::kick`).
        doorbell_rerings: Extended,
        /// Bursts that left their doorbell to a later call, the last one still outstanding
        /// (devarg `tx_db_avoid`, `txq::DbAvoid`).
        doorbells_avoided: Extended,
        /// Completions that did not name the next WQE that asked for one: requests a later
        /// completion covered (a CQE the device lost), or a CQE no request names (one it
        /// added, ignored). Nothing is freed early; what a lost one held goes with the next
        /// completion, on an idle queue the one of the NOP a look without progress posts
        /// (`TxQueue::kick`). 0 on a card.
        cqe_mismatches: Extended,
    }
}

counters! {
    /// One RX queue's counters.
    pub struct RxStats {
        /// Frames handed to the application (`ipackets`).
        packets: Basic,
        /// Their bytes (`ibytes`).
        bytes: Basic,
        /// Frames the device completed in error, or whose buffer could not be re-posted
        /// (`ierrors`).
        errors: Basic,
        /// Frames dropped because the mempool had no buffers to replace them (`rx_nombuf`).
        nombuf: Basic,
        /// Error completions (each also in `ierrors`).
        error_cqes: Extended,
        /// Times the receive queue was restarted in place after an error completion left it
        /// in the error state.
        queue_resets: Extended,
        /// Frames the device had completed into the queue that no `rx_burst` took before the
        /// port stopped: the reset at stop hands their buffers back to the next start, so
        /// they are dropped, and counted here rather than vanish.
        discarded: Extended,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_kinds_sum_and_reset_follow_the_definition() {
        let mut a = TxStats {
            packets: 3,
            doorbells: 1,
            error_cqes: 2,
            ..TxStats::default()
        };
        let names: Vec<_> = a.iter().map(|(n, _, _)| n).collect();
        let fields: Vec<_> = TxStats::FIELDS.iter().map(|(n, _)| *n).collect();
        assert_eq!(names, fields);
        assert_eq!(names.first(), Some(&"packets"));
        assert_eq!(names.last(), Some(&"cqe_mismatches"));
        let ext: Vec<_> = a.extended().collect();
        assert_eq!(
            ext.len(),
            15,
            "every TX counter but packets, bytes, errors: {ext:?}"
        );
        assert_eq!(ext[0], ("doorbells", 1));
        assert!(ext
            .iter()
            .all(|(n, _)| !["packets", "bytes", "errors"].contains(n)));
        let b = a;
        a.add(&b);
        assert_eq!((a.packets, a.doorbells, a.error_cqes), (6, 2, 4));
        a.reset();
        assert_eq!(a, TxStats::default());
        assert_eq!(RxStats::FIELDS.len(), 7);
        assert_eq!(
            RxStats::FIELDS
                .iter()
                .filter(|(_, k)| *k == Kind::Basic)
                .count(),
            4
        );
    }
}
