//! A 4-ary min-heap for the engine's event queues: half the levels of a binary heap per pop.
//!
//! With one event per rank queued, a pop walks log4(ranks) levels whose four children share a
//! cache line or two, where `std`'s binary heap walks twice as many levels.

/// Items kept so that the least comes out first; ties come out in no particular order, so the
/// items must order completely (the engine's carry a sequence number).
#[derive(Debug)]
pub(super) struct QuadHeap<T> {
    items: Vec<T>,
}

impl<T> Default for QuadHeap<T> {
    fn default() -> QuadHeap<T> {
        QuadHeap { items: Vec::new() }
    }
}

impl<T: Ord + Copy> QuadHeap<T> {
    pub(super) fn new() -> QuadHeap<T> {
        QuadHeap::default()
    }

    pub(super) fn peek(&self) -> Option<&T> {
        self.items.first()
    }

    pub(super) fn push(&mut self, item: T) {
        let mut at = self.items.len();
        self.items.push(item);
        while at > 0 {
            let parent = (at - 1) / 4;
            if self.items[parent] <= item {
                break;
            }
            self.items[at] = self.items[parent];
            at = parent;
        }
        self.items[at] = item;
    }

    pub(super) fn pop(&mut self) -> Option<T> {
        let last = self.items.pop()?;
        let Some(&top) = self.items.first() else {
            return Some(last);
        };
        // Moves the last item down from the root, lifting the least child at each level.
        let n = self.items.len();
        let mut at = 0;
        loop {
            let first = 4 * at + 1;
            if first >= n {
                break;
            }
            let mut least = first;
            for child in first + 1..(first + 4).min(n) {
                if self.items[child] < self.items[least] {
                    least = child;
                }
            }
            if self.items[least] >= last {
                break;
            }
            self.items[at] = self.items[least];
            at = least;
        }
        self.items[at] = last;
        Some(top)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_come_out_least_first_whatever_the_order_they_went_in() {
        let mut heap = QuadHeap::new();
        let mut expected = Vec::new();
        // A fixed scramble of 0..1000 with repeats.
        for i in 0u64..1000 {
            let item = (i * 7919) % 613;
            heap.push(item);
            expected.push(item);
            if i % 3 == 0 {
                expected.sort_unstable();
                assert_eq!(heap.pop(), Some(expected.remove(0)));
            }
        }
        expected.sort_unstable();
        let mut out = Vec::new();
        while let Some(item) = heap.pop() {
            out.push(item);
        }
        assert_eq!(out, expected);
        assert_eq!(heap.peek(), None);
    }
}
