//! The syncs of one worker in progress, each held by a guard that ends it when dropped — on every
//! way out of a sync, an early return, an error or a panic alike — and the stop that waits for
//! them: no new sync starts once it began, and it returns when the last one ends (woken, not
//! polled) or its grace is over.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use prometheus::Gauge;
use tokio::sync::Notify;

/// The syncs in progress.
#[derive(Debug, Default)]
pub struct InFlight {
    count: AtomicUsize,
    stopping: AtomicBool,
    idle: Notify,
}

/// One sync in progress; it ends when dropped.
#[derive(Debug)]
pub struct Sync<'a> {
    in_flight: &'a InFlight,
    gauge: Option<Gauge>,
}

impl InFlight {
    /// A sync starts, counted in `gauge` too while it runs; `None` once the worker is stopping
    /// (it does not start). Counted first, then checked: a stop that sees no sync in flight has
    /// seen every sync that got past this check.
    pub fn start(&self, gauge: Option<Gauge>) -> Option<Sync<'_>> {
        self.count.fetch_add(1, Ordering::SeqCst);
        if let Some(gauge) = &gauge {
            gauge.inc();
        }
        let sync = Sync {
            in_flight: self,
            gauge,
        };
        (!self.stopping.load(Ordering::SeqCst)).then_some(sync)
    }

    /// How many syncs are in progress.
    pub fn count(&self) -> usize {
        self.count.load(Ordering::SeqCst)
    }

    /// Stops new syncs and waits, at most `grace`, for those in progress; whether they all ended.
    pub async fn drain(&self, grace: Duration) -> bool {
        self.stopping.store(true, Ordering::SeqCst);
        let deadline = tokio::time::Instant::now() + grace;
        loop {
            // Asked for before the count is read: an end between the two still wakes it.
            let ended = self.idle.notified();
            if self.count() == 0 {
                return true;
            }
            if tokio::time::timeout_at(deadline, ended).await.is_err() {
                return false;
            }
        }
    }
}

impl Drop for Sync<'_> {
    fn drop(&mut self) {
        if let Some(gauge) = &self.gauge {
            gauge.dec();
        }
        if self.in_flight.count.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.in_flight.idle.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_stop_waits_for_every_sync_in_progress_and_starts_none() {
        let in_flight = InFlight::default();
        let gauge = Gauge::new("g", "syncs").unwrap();
        let first = in_flight.start(Some(gauge.clone())).unwrap();
        let second = in_flight.start(Some(gauge.clone())).unwrap();
        assert_eq!((in_flight.count(), gauge.get()), (2, 2.0));
        // An early way out ends its sync as surely as the last line.
        drop(second);
        assert_eq!((in_flight.count(), gauge.get()), (1, 1.0));
        let drained = async {
            tokio::join!(in_flight.drain(Duration::from_secs(5)), async {
                tokio::task::yield_now().await;
                // Stopping: nothing new starts, and the refused start leaves no count behind.
                assert!(in_flight.start(Some(gauge.clone())).is_none());
                assert_eq!(in_flight.count(), 1);
                drop(first);
            })
            .0
        };
        assert!(
            tokio::time::timeout(Duration::from_secs(1), drained)
                .await
                .unwrap()
        );
        assert_eq!((in_flight.count(), gauge.get()), (0, 0.0));
    }

    #[tokio::test]
    async fn a_stop_gives_up_after_its_grace() {
        let in_flight = InFlight::default();
        let _stuck = in_flight.start(None).unwrap();
        assert!(!in_flight.drain(Duration::from_millis(50)).await);
        assert_eq!(in_flight.count(), 1);
        assert!(InFlight::default().drain(Duration::ZERO).await);
    }
}
