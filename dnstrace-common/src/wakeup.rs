//! When a program wakes the ring buffer's reader. Waking on every event
//! costs more than the event (an irq_work, a self-IPI, a VM exit on a
//! guest), so the reader drains on its own clock and is woken only when
//! the backlog grows past a step.

/// Does an event of `size` bytes, queued behind `queued` bytes, take the
/// backlog past a multiple of `step` (a power of two)? Past any multiple,
/// not only the first: each CPU reads the backlog before it reserves, so
/// two CPUs can cross the first step together, each seeing the backlog
/// below it with its own event, and neither wakes the reader.
#[inline(always)]
pub fn wakes_reader(queued: u64, size: u64, step: u64) -> bool {
    let step = !step.wrapping_sub(1);
    (queued + size) & step > queued & step
}

#[cfg(test)]
mod tests {
    use super::*;

    const STEP: u64 = 1 << 20;

    #[test]
    fn wakes_past_each_step_only() {
        assert!(!wakes_reader(0, 300, STEP));
        assert!(!wakes_reader(STEP - 300, 300 - 1, STEP));
        assert!(wakes_reader(STEP - 300, 300, STEP));
        assert!(!wakes_reader(STEP, 300, STEP));
        assert!(wakes_reader(2 * STEP - 1, 8, STEP));
        assert!(wakes_reader(3 * STEP - 8, 8, STEP));
    }

    /// Two CPUs read the backlog, then both reserve: the first step goes
    /// by unseen, and the next one wakes the reader while the ring (four
    /// steps) still has room.
    #[test]
    fn a_step_two_cpus_cross_together_is_made_up_at_the_next() {
        let size = 300;
        let mut queued = 0;
        let mut woken_at = None;
        while queued < 4 * STEP && woken_at.is_none() {
            let seen = queued;
            let together = seen < STEP && seen + 2 * size >= STEP && seen + size < STEP;
            let events = if together { 2 } else { 1 };
            for _ in 0..events {
                if wakes_reader(seen, size, STEP) {
                    woken_at = Some(queued);
                }
            }
            queued += events * size;
        }
        let woken_at = woken_at.expect("the reader was never woken");
        assert!(woken_at > STEP && woken_at < 2 * STEP + size);
    }
}
