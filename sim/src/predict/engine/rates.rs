//! The engine's rates: how compute, codecs and collectives slow each other on a shared device.
//!
//! Compute slows while collectives or compression kernels share the device, codecs while
//! compute does, collectives beside busy CPU cores and while they share links or queue behind
//! each other's bytes. A rate change rescheduling a running task's end is what moves the
//! engine's clock differently from the tasks' own durations.

use super::{Engine, Event, LocalStream};
use crate::collective::{shared_slowdowns, Links};

impl Engine<'_> {
    pub(super) fn active_collectives(&self) -> u32 {
        self.active
    }

    /// Compression slows while the rank's compute, or other ranks, share its cores.
    pub(super) fn codec_rate(&self, rank: u32) -> f64 {
        let computing = self.ranks[rank as usize].compute.is_running();
        match self.config.shared_cores {
            Some(share) => 1.0 / share.slowdown(1 + u32::from(computing)),
            None if computing => 1.0 / self.config.codec_slowdown_with_compute,
            None => 1.0,
        }
    }

    /// Called at every compute task's start and end, where most ranks run no codec task: the
    /// check inlines, the rerating does not.
    #[inline(always)]
    pub(super) fn rerate_codec(&mut self, rank: u32) {
        if self.codec_active[rank as usize] {
            self.rerate_running_codec(rank);
        }
    }

    #[inline(never)]
    fn rerate_running_codec(&mut self, rank: u32) {
        let rate = self.codec_rate(rank);
        self.rerate_local(rank, LocalStream::Codec, rate);
    }

    /// Moves a running local task to `rate`, rescheduling its end.
    fn rerate_local(&mut self, rank: u32, which: LocalStream, rate: f64) {
        let now = self.now;
        let version = self.versions + 1;
        if let Some(running) = self.ranks[rank as usize].stream(which).running.as_mut() {
            if running.rate != rate {
                self.versions = version;
                let end = running.rerate(now, rate, version);
                self.push_local_end(end, rank, which, version);
            }
        }
    }

    /// Concurrent collectives share the links they use (`collective::shared_slowdowns`); one
    /// paying its fixed part shares none.
    pub(super) fn rerate_comm(&mut self) {
        if self.active_collectives() == 0 {
            return;
        }
        let active = self.transferring;
        if self.push_pulls {
            self.comm_links.clear();
            for stream in 0..self.comm.len() {
                let transferring = self.transfer_after[stream].is_none();
                if let Some(running) = self.comm[stream].filter(|_| transferring) {
                    self.comm_links.push(self.graph.task(running.task).links);
                }
            }
            shared_slowdowns(
                &self.comm_links,
                self.config.push_pulls_at_once,
                &mut self.comm_shared,
            );
        }
        let slowdown = self.comm_slowdown();
        let now = self.now;
        let mut nth = 0;
        for stream in 0..self.comm.len() {
            let version = self.versions + 1;
            let transferring = self.transfer_after[stream].is_none();
            if let Some(running) = self.comm[stream].as_mut() {
                let shared = match (transferring, self.push_pulls) {
                    (false, _) => 1.0,
                    (true, true) => self.comm_shared[nth],
                    (true, false) => f64::from(active),
                };
                let rate = 1.0 / (shared * slowdown);
                nth += usize::from(transferring);
                if running.rate != rate {
                    self.versions = version;
                    let end = running.rerate(now, rate, version);
                    self.push(
                        end,
                        Event::Comm {
                            stream: stream as u32,
                            version,
                        },
                    );
                }
            }
        }
    }

    /// Collective time multiplier now: CPU work on the ranks' cores slows them.
    pub(super) fn comm_slowdown(&self) -> f64 {
        let busy = f64::from(self.cpu_busy_ranks) / f64::from(self.ranks_n);
        1.0 + (self.config.comm_slowdown_with_compute - 1.0) * busy
    }

    /// Counts the rank in or out of the CPU-busy ranks after one of its streams started or
    /// stopped, and rerates the collectives when that changed.
    #[inline(always)]
    pub(super) fn refresh_cpu_busy(&mut self, rank: u32) {
        // Only CPU ranks' collectives slow beside busy cores (GPU clusters have 1): elsewhere
        // the count is never read, and this runs at every local task's start and end.
        if self.config.comm_slowdown_with_compute != 1.0 {
            self.count_cpu_busy(rank);
        }
    }

    #[inline(never)]
    fn count_cpu_busy(&mut self, rank: u32) {
        let r = rank as usize;
        let busy = self.ranks[r].compute.is_running() || self.codec_active[r];
        if busy != self.cpu_busy[r] {
            self.cpu_busy[r] = busy;
            if busy {
                self.cpu_busy_ranks += 1;
            } else {
                self.cpu_busy_ranks -= 1;
            }
            self.rerate_comm();
        }
    }

    /// How long a collective over `links` starting now waits behind what the transferring
    /// collectives that share its connections have queued ahead of it: their transfers left at
    /// the full rate of the links (queued bytes drain in order, at full speed), at most
    /// `queue_behind_ns` (what the connections hold).
    pub(super) fn queued_ahead(&self, links: Links) -> f64 {
        // Also none for a NaN or negative setting.
        let queues = self.config.queue_behind_ns > 0.0;
        if !queues || self.transferring == 0 {
            return 0.0;
        }
        let now = self.now;
        let left: f64 = (0..self.comm.len())
            .filter(|&stream| self.transfer_after[stream].is_none())
            .filter_map(|stream| self.comm[stream])
            .filter(|r| links.share_connections(self.graph.task(r.task).links))
            .map(|r| (r.remaining - (now - r.since).as_ns() as f64 * r.rate).max(0.0))
            .sum();
        left.min(self.config.queue_behind_ns)
    }
}
