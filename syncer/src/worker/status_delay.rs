//! How long a delivery record waits for the provider's status change to carry it, learned from how
//! long the provider has taken to change an object's status after kbind wrote its spec.
//!
//! A record that waits in vain costs a consumer write of its own (the record alone, then the
//! status when it comes); one that waits too long shows the delivery late. A fixed wait fits one
//! load only: a provider whose controller answers in 100 ms at rest may take several seconds while
//! thousands of objects arrive at once. So the wait follows the provider's recent answers the way
//! TCP's retransmission timer follows round trips (RFC 6298): a smoothed delay plus four times its
//! mean deviation, never below [`FLOOR`] (the wait before any answer was seen) and never above
//! [`CEILING`] (the longest a record is held back).

use std::time::Duration;

/// The wait with no answer seen yet, and the shortest there is.
pub const FLOOR: Duration = Duration::from_secs(2);
/// The longest a delivery record waits.
pub const CEILING: Duration = Duration::from_secs(10);
/// A status change later than this after the spec write is not taken as the provider's answer to
/// it (a provider that changes status on its own schedule): how long a write is remembered.
pub const REMEMBERED: Duration = Duration::from_secs(20);

/// The provider's recent status delays for one API.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct StatusDelay {
    /// The smoothed delay; `None` before the first answer.
    smoothed: Option<Duration>,
    /// Its smoothed mean deviation.
    deviation: Duration,
}

impl StatusDelay {
    /// The provider changed a status `took` after kbind wrote the spec.
    pub fn observe(&mut self, took: Duration) {
        let took = took.min(REMEMBERED);
        match self.smoothed {
            None => {
                self.smoothed = Some(took);
                self.deviation = took / 2;
            }
            Some(smoothed) => {
                let error = took.abs_diff(smoothed);
                self.deviation = self.deviation - self.deviation / 4 + error / 4;
                self.smoothed = Some(smoothed - smoothed / 8 + took / 8);
            }
        }
    }

    /// How long a record waits after the spec was written.
    pub fn wait(&self) -> Duration {
        self.smoothed
            .map_or(FLOOR, |smoothed| smoothed + self.deviation * 4)
            .clamp(FLOOR, CEILING)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    fn after(samples: &[u64]) -> Duration {
        let mut delay = StatusDelay::default();
        for &sample in samples {
            delay.observe(ms(sample));
        }
        delay.wait()
    }

    #[test]
    fn the_wait_follows_the_providers_answers_within_its_bounds() {
        let cases: &[(&str, &[u64], Duration)] = &[
            ("no answer seen yet", &[], FLOOR),
            ("quick answers keep the floor", &[100, 80, 120, 90], FLOOR),
            ("one answer of 1 s: 1 s + 4 × 0.5 s", &[1000], ms(3000)),
            (
                "answers of 3 s under load lengthen it",
                &[3000, 3000, 3000, 3000, 3000, 3000, 3000, 3000],
                Duration::from_secs_f64(3.0 + 4.0 * 1.5 * 0.75f64.powi(7)),
            ),
            (
                "no longer than the ceiling, however slow",
                &[60_000, 60_000, 60_000],
                CEILING,
            ),
        ];
        for (what, samples, want) in cases {
            let got = after(samples);
            // The deviation decays in integer nanoseconds: compare to the millisecond.
            assert!(
                got.abs_diff(*want) < ms(1),
                "{what}: {got:?}, want {want:?}"
            );
        }
    }

    #[test]
    fn once_the_load_is_gone_the_wait_comes_back_to_the_floor() {
        let mut delay = StatusDelay::default();
        for _ in 0..20 {
            delay.observe(ms(4000));
        }
        assert!(delay.wait() > ms(4000), "{:?}", delay.wait());
        let mut steps = 0;
        while delay.wait() > FLOOR {
            delay.observe(ms(100));
            steps += 1;
            assert!(
                steps < 50,
                "still {:?} after {steps} quick answers",
                delay.wait()
            );
        }
        assert!(
            steps > 3,
            "one quick answer should not undo a trend ({steps})"
        );
    }
}
