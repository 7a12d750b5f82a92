//! Asking the CPU for a cache line before it is needed.
//!
//! With many connections, what one connection's message touches was last touched a thousand
//! messages ago and is no longer in the cache. Handled one after the other, each message
//! waits for its lines in turn. Where a batch of messages is at hand (the completions of one
//! round of progress), a first pass asks for the lines of all of them and a second does the
//! work: the misses of the batch overlap instead of adding up (eRPC's batching, DPDK's
//! prefetching receive loops). A prefetch is a hint: it never faults, changes nothing a program
//! can observe, and costs one instruction.

/// Asks for the cache line holding `p` (any address: nothing is read).
#[inline(always)]
pub(crate) fn line<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        // SAFETY: `prefetcht0` is SSE, part of the x86_64 baseline every target of this
        // architecture enables; for any address, mapped or not, it neither faults nor changes
        // memory or registers (Intel SDM, PREFETCHh).
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.cast::<i8>()) };
    }
    #[cfg(target_arch = "aarch64")]
    {
        // SAFETY: `prfm` is a hint: for any address, mapped or not, it neither faults nor
        // changes memory or registers (Arm ARM, "Prefetch memory"); it touches no stack.
        unsafe {
            std::arch::asm!(
                "prfm pldl1keep, [{0}]",
                in(reg) p,
                options(nostack, preserves_flags, readonly)
            );
        }
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let _ = p;
}

/// The most lines [`bytes`] asks for: a small message's, not a bulk transfer's.
const MAX_LINES: usize = 4;

/// Asks for the lines of `len` bytes from `p` (at most [`MAX_LINES`]).
#[inline]
pub(crate) fn bytes<T>(p: *const T, len: usize) {
    let start = p.cast::<u8>();
    for i in 0..lines(start as usize, len) {
        line(start.wrapping_add(i * 64));
    }
}

/// The 64-byte lines that `len` bytes from `addr` touch (one for none), at most [`MAX_LINES`].
fn lines(addr: usize, len: usize) -> usize {
    let first = addr / 64;
    let last = addr.saturating_add(len.max(1) - 1) / 64;
    (last - first + 1).min(MAX_LINES)
}

#[cfg(test)]
mod tests {
    use super::{bytes, line, lines, MAX_LINES};

    #[test]
    fn lines_count_what_a_range_touches() {
        assert_eq!(lines(0, 0), 1);
        assert_eq!(lines(0, 64), 1);
        assert_eq!(lines(0, 65), 2);
        assert_eq!(lines(63, 2), 2);
        assert_eq!(lines(100, 64), 2);
        assert_eq!(lines(128, 128), 2);
        assert_eq!(lines(1, 10_000), MAX_LINES);
        assert_eq!(lines(usize::MAX - 1, 10), 1);
    }

    /// A prefetch never faults: not at null, not at an unmapped address, not past the end.
    #[test]
    fn any_address_may_be_asked_for() {
        line(std::ptr::null::<u8>());
        line(usize::MAX as *const u8);
        bytes(0x10 as *const u8, 1 << 20);
        let value = [7u8; 3];
        bytes(value.as_ptr(), value.len());
        assert_eq!(value, [7; 3]);
    }
}
