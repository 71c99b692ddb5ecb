//! The gather run: plain packets above the inline threshold, each a gather WQE of one data
//! segment over a buffer in the lkey cache's region, posted in a tight loop of their own. The
//! straight-line poster and the general path both reach for it.

use super::*;

/// Posts plain packets above the inline threshold whose buffer lies in the lkey cache's
/// region, as gather WQEs of one data segment, from `pkts[*n]` on, holding each in `elts`;
/// adds their bytes to `bytes`. The loop is out of line ([`gather_run_out`]): inside
/// `post_rest`, whose state fills the registers, it would keep more of its own on the stack.
/// A packet that is not for it (a long inline one, say) is told apart here, inline, so that
/// the general path does not pay a call per packet to hear it.
#[inline(always)]
pub(super) fn gather_run<B: TxBuf>(
    poster: &mut Poster<'_>,
    pkts: &[B],
    n: &mut usize,
    inline_max: usize,
    lkeys: &Lkeys,
    elts: &mut BufRing<B>,
    bytes: &mut u64,
) -> Stop {
    match pkts.get(*n).and_then(|p| p.plain()) {
        Some(data) if data.len() > inline_max => {
            gather_run_out(poster, pkts, n, inline_max, lkeys, elts, bytes)
        }
        _ => Stop::Other,
    }
}

/// [`gather_run`] proper, for a burst whose next packet may be for it.
#[inline(never)]
fn gather_run_out<B: TxBuf>(
    poster: &mut Poster<'_>,
    pkts: &[B],
    n: &mut usize,
    inline_max: usize,
    lkeys: &Lkeys,
    elts: &mut BufRing<B>,
    bytes: &mut u64,
) -> Stop {
    // The region in registers; a buffer outside it goes the general way, which looks it up.
    let Some(mr) = lkeys.cached() else {
        return Stop::Other;
    };
    let free = (elts.capacity() - elts.len()) as usize;
    let mut poster = poster.cursor();
    let mut held = elts.pusher();
    let todo = &pkts[*n..];
    // One TXBB and one held slot a packet: with room for all of them in both rings, the WQEs
    // need no check of either each.
    let (i, sum, stop) = if poster.room() >= todo.len() && free >= todo.len() {
        gather_loop::<B, false>(&mut poster, &mut held, todo, inline_max, mr)
    } else {
        gather_loop::<B, true>(&mut poster, &mut held, todo, inline_max, mr)
    };
    *n += i;
    *bytes += sum;
    stop
}

/// [`gather_run`]'s loop: how many packets it posted, their bytes, and why it stopped.
/// `CHECK`: whether each WQE checks the room and the held slots; without, the caller made
/// sure of one TXBB and one free slot for every packet of `todo`.
#[inline(always)]
fn gather_loop<B: TxBuf, const CHECK: bool>(
    poster: &mut Cursor<'_, '_>,
    held: &mut Pusher<'_, B>,
    todo: &[B],
    inline_max: usize,
    mr: Mr,
) -> (usize, u64, Stop) {
    if !CHECK {
        return gather_loop_unchecked(poster, held, todo, inline_max, mr);
    }
    let mut sum = 0u64;
    for (i, &pkt) in todo.iter().enumerate() {
        let Some(data) = pkt.plain() else {
            return (i, sum, Stop::Other);
        };
        let (addr, len) = (data.as_ptr() as usize, data.len());
        // `Mr::contains` without its saturation: a slice's end never wraps the address space.
        if len <= inline_max || addr < mr.start || addr + len > mr.end {
            return (i, sum, Stop::Other);
        }
        if CHECK && held.is_full() {
            return (i, sum, Stop::Full);
        }
        let mut w = if CHECK {
            let Some(w) = poster.take::<1>() else {
                return (i, sum, Stop::RunEnd(1));
            };
            w
        } else {
            // SAFETY: the caller found room for one TXBB per packet of `todo`, and each
            // packet takes one.
            #[allow(unsafe_code)]
            unsafe {
                poster.take_unchecked::<1>()
            }
        };
        wqe::write_plain_gather(&mut w, addr as u64, len as u32, mr.lkey);
        // SAFETY: with CHECK the test above found a free slot; without, the caller found one
        // per packet of `todo`.
        #[allow(unsafe_code)]
        unsafe {
            held.push_unchecked(pkt)
        };
        sum += len as u64;
    }
    (todo.len(), sum, Stop::End)
}

/// [`gather_loop`] without checks of the rings, which the caller made for every packet of
/// `todo`: the first WQE publishes the pending one of the poster, each later one the WQE in
/// the TXBB before it, so that no WQE pointer is carried from one packet to the next.
#[inline(always)]
fn gather_loop_unchecked<B: TxBuf>(
    poster: &mut Cursor<'_, '_>,
    held: &mut Pusher<'_, B>,
    todo: &[B],
    inline_max: usize,
    mr: Mr,
) -> (usize, u64, Stop) {
    // The packet's buffer if it is for this run.
    let fits = |pkt: &B| {
        let data = pkt.plain()?;
        let (addr, len) = (data.as_ptr() as usize, data.len());
        // `Mr::contains` without its saturation: a slice's end never wraps the address space.
        (len > inline_max && addr >= mr.start && addr + len <= mr.end).then_some((addr, len))
    };
    let Some(&first) = todo.first() else {
        return (0, 0, Stop::End);
    };
    let Some((addr, len)) = fits(&first) else {
        return (0, 0, Stop::Other);
    };
    // SAFETY: the caller found room for one TXBB per packet of `todo`.
    #[allow(unsafe_code)]
    let mut w = unsafe { poster.take_unchecked::<1>() };
    wqe::write_plain_gather(&mut w, addr as u64, len as u32, mr.lkey);
    // SAFETY: the caller found a free slot per packet of `todo`.
    #[allow(unsafe_code)]
    unsafe {
        held.push_unchecked(first)
    };
    let mut sum = len as u64;
    let mut stop = (todo.len(), Stop::End);
    for (i, &pkt) in todo.iter().enumerate().skip(1) {
        let Some((addr, len)) = fits(&pkt) else {
            stop = (i, Stop::Other);
            break;
        };
        // SAFETY: room for one TXBB per packet of `todo`; the TXBB before the cursor is the
        // WQE of the packet before, of one TXBB, taken from this cursor and not published.
        #[allow(unsafe_code)]
        let mut w = unsafe { poster.take_after_unchecked::<1>() };
        wqe::write_plain_gather(&mut w, addr as u64, len as u32, mr.lkey);
        // SAFETY: as for the first.
        #[allow(unsafe_code)]
        unsafe {
            held.push_unchecked(pkt)
        };
        sum += len as u64;
    }
    // SAFETY: the first WQE came from `take_unchecked`, every one is of one TXBB.
    #[allow(unsafe_code)]
    unsafe {
        poster.last_is_pending::<1>()
    };
    (stop.0, sum, stop.1)
}
