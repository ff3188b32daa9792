//! Locks that never panic: kbind's critical sections are single map/set operations, so a lock a
//! panicking thread held still guards consistent data and is used as it is.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// `lock()` that takes a poisoned lock's data instead of panicking.
pub trait Locked<T> {
    /// The guard.
    fn locked(&self) -> MutexGuard<'_, T>;
}

impl<T> Locked<T> for Mutex<T> {
    fn locked(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poisoned_lock_still_yields_its_data() {
        let m = std::sync::Arc::new(Mutex::new(1));
        let m2 = m.clone();
        let _ = std::thread::spawn(move || {
            let _g = m2.lock();
            panic!("poison it");
        })
        .join();
        assert!(m.is_poisoned());
        *m.locked() += 1;
        assert_eq!(*m.locked(), 2);
    }
}
