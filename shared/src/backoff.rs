//! Retries of failing objects: an exponential delay with jitter up to a cap, and a log line only
//! when an object's error message changes — a persistent error is neither a hot loop nor a log
//! flood.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use crate::sync::Locked;

/// Per-object failure streaks.
#[derive(Debug)]
pub struct Retries {
    base: Duration,
    cap: Duration,
    streaks: Mutex<HashMap<String, (u32, String)>>,
}

/// What to do about one failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retry {
    /// When to try again.
    pub after: Duration,
    /// Whether this failure is worth a log line (its message differs from the last one).
    pub log: bool,
}

impl Retries {
    /// Delays from `base`, doubling per consecutive failure, at most `cap`.
    pub fn new(base: Duration, cap: Duration) -> Self {
        Self {
            base,
            cap,
            streaks: Mutex::default(),
        }
    }

    /// Records a failure of `key` with `message`.
    pub fn failed(&self, key: &str, message: &str) -> Retry {
        let mut streaks = self.streaks.locked();
        let entry = streaks.entry(key.to_owned()).or_insert((0, String::new()));
        entry.0 = entry.0.saturating_add(1);
        let log = entry.1 != message;
        if log {
            message.clone_into(&mut entry.1);
        }
        Retry {
            after: delay(self.base, self.cap, entry.0, jitter_seed(key, entry.0)),
            log,
        }
    }

    /// Whether a failure of `key` with `message` would be news: no streak, or a streak whose last
    /// message differs (for a Warning Event once per refusal, not per retry).
    pub fn is_new(&self, key: &str, message: &str) -> bool {
        self.streaks
            .locked()
            .get(key)
            .is_none_or(|(_, last)| last != message)
    }

    /// `key` succeeded (or is gone): its streak ends.
    pub fn succeeded(&self, key: &str) {
        self.streaks.locked().remove(key);
    }
}

/// The wait after the `attempt`th failure in a row of `key`: [`delay`] with its jitter.
pub fn jittered(base: Duration, cap: Duration, key: &str, attempt: u32) -> Duration {
    delay(base, cap, attempt, jitter_seed(key, attempt))
}

/// A seed that differs between objects and attempts, so that retries of many objects spread out.
fn jitter_seed(key: &str, attempt: u32) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut h);
    attempt.hash(&mut h);
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default()
        .hash(&mut h);
    h.finish()
}

/// `base · 2^(attempt−1)`, at most `cap`, then between 80 % and 100 % of that (by `seed`).
pub fn delay(base: Duration, cap: Duration, attempt: u32, seed: u64) -> Duration {
    let doubled = base.saturating_mul(1u32 << attempt.saturating_sub(1).min(20));
    let full = doubled.min(cap);
    let fraction = 0.8 + 0.2 * ((seed % 1000) as f64 / 1000.0);
    full.mul_f64(fraction)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_is_news_until_the_same_message_was_recorded() {
        let r = Retries::new(Duration::from_secs(1), Duration::from_secs(300));
        assert!(r.is_new("a", "denied"));
        r.failed("a", "denied");
        assert!(!r.is_new("a", "denied"));
        assert!(r.is_new("a", "denied otherwise"));
        assert!(r.is_new("b", "denied"));
        r.succeeded("a");
        assert!(r.is_new("a", "denied"));
    }

    #[test]
    fn delays_double_up_to_the_cap_with_bounded_jitter() {
        let (base, cap) = (Duration::from_secs(1), Duration::from_secs(60));
        for (attempt, full) in [(1, 1), (2, 2), (3, 4), (6, 32), (7, 60), (40, 60), (0, 1)] {
            for seed in [0, 499, 999, u64::MAX] {
                let d = delay(base, cap, attempt, seed);
                let full = Duration::from_secs(full);
                assert!(
                    d <= full && d >= full.mul_f64(0.8),
                    "{attempt} {seed}: {d:?}"
                );
            }
        }
    }

    #[test]
    fn a_persistent_error_is_logged_once_per_message() {
        let r = Retries::new(Duration::from_secs(1), Duration::from_secs(60));
        let logged: Vec<bool> = ["a", "a", "a", "b", "b", "a"]
            .iter()
            .map(|m| r.failed("ns/x", m).log)
            .collect();
        assert_eq!(logged, [true, false, false, true, false, true]);
        assert!(r.failed("ns/x", "a").after >= Duration::from_secs(32).mul_f64(0.8));
        r.succeeded("ns/x");
        assert!(r.failed("ns/x", "a").log, "a new streak logs again");
        assert!(r.failed("ns/y", "a").after <= Duration::from_secs(1));
    }
}
