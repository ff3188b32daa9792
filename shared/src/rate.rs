//! A token bucket: a burst, then a steady rate — what bounds work another party can cause
//! (provider Events mirrored, the reaper's deletes).

use std::time::Instant;

/// A token bucket, refilled by the monotonic clock (only ever used for pacing, never to decide
/// what is true).
#[derive(Debug, Clone, Copy)]
pub struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    /// A bucket holding `burst` tokens at `now`.
    pub fn full(burst: f64, now: Instant) -> Self {
        Bucket {
            tokens: burst,
            at: now,
        }
    }

    /// When it was last used.
    pub fn last_used(&self) -> Instant {
        self.at
    }

    /// Refills for the time since it was last used, then takes a token if there is one.
    pub fn take(&mut self, now: Instant, burst: f64, per_second: f64) -> bool {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * per_second).min(burst);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_burst_then_the_rate() {
        let t0 = Instant::now();
        let mut bucket = Bucket::full(2.0, t0);
        assert!(bucket.take(t0, 2.0, 1.0));
        assert!(bucket.take(t0, 2.0, 1.0));
        assert!(!bucket.take(t0, 2.0, 1.0), "the burst is spent");
        assert!(!bucket.take(t0 + Duration::from_millis(500), 2.0, 1.0));
        assert!(bucket.take(t0 + Duration::from_millis(1000), 2.0, 1.0));
        // Never more than the burst, however long it rested.
        let later = t0 + Duration::from_secs(3600);
        assert!(bucket.take(later, 2.0, 1.0));
        assert!(bucket.take(later, 2.0, 1.0));
        assert!(!bucket.take(later, 2.0, 1.0));
    }
}
