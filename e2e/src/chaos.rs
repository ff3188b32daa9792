//! Seeded chaos for the e2e tests: a small deterministic generator, and the seed a run uses
//! (`KBIND_CHAOS_SEED` replays one).

/// A linear congruential generator: the same seed, the same choices.
pub struct Lcg(pub u64);

impl Lcg {
    /// A number in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n.max(1)
    }
}

/// `KBIND_CHAOS_SEED`, else `default`; printed, so that a failed run says how to replay it.
pub fn seed(default: u64) -> u64 {
    let seed = std::env::var("KBIND_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default);
    eprintln!("chaos seed {seed} (KBIND_CHAOS_SEED replays it)");
    seed
}
