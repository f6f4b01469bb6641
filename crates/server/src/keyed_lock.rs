//! One async lock per key (a sandbox id, an idempotency key), created on first use and
//! dropped when nobody holds or waits for it, so the map never grows with keys that
//! are done.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

/// Async mutexes by key.
pub struct KeyedLocks<K> {
    locks: Mutex<HashMap<K, Arc<AsyncMutex<()>>>>,
}

impl<K> Default for KeyedLocks<K> {
    fn default() -> Self {
        KeyedLocks {
            locks: Mutex::new(HashMap::new()),
        }
    }
}

impl<K: Eq + Hash + Clone> KeyedLocks<K> {
    /// Wait for and hold `key`'s lock until the guard drops.
    pub async fn lock(&self, key: K) -> KeyGuard<'_, K> {
        let lock = self.locks.lock().entry(key.clone()).or_default().clone();
        KeyGuard {
            guard: Some(lock.lock_owned().await),
            locks: self,
            key,
        }
    }

    /// Keys with a lock held or awaited (for tests).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.locks.lock().len()
    }
}

/// A held key lock; the map entry goes when nobody else waits on it.
pub struct KeyGuard<'a, K: Eq + Hash> {
    guard: Option<OwnedMutexGuard<()>>,
    locks: &'a KeyedLocks<K>,
    key: K,
}

impl<K: Eq + Hash> Drop for KeyGuard<'_, K> {
    fn drop(&mut self) {
        let mut locks = self.locks.locks.lock();
        drop(self.guard.take());
        // The map holds the only reference left: nobody holds or waits for this key.
        if locks
            .get(&self.key)
            .is_some_and(|lock| Arc::strong_count(lock) == 1)
        {
            locks.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test]
    async fn one_holder_per_key_and_entries_go_when_done() {
        let locks = Arc::new(KeyedLocks::<String>::default());
        let inside = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for _ in 0..8 {
            let (locks, inside) = (locks.clone(), inside.clone());
            tasks.push(tokio::spawn(async move {
                let _guard = locks.lock("a".to_string()).await;
                assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders of one key");
                tokio::task::yield_now().await;
                inside.fetch_sub(1, Ordering::SeqCst);
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
        assert_eq!(locks.len(), 0);
    }

    #[tokio::test]
    async fn different_keys_do_not_wait_for_each_other() {
        let locks = KeyedLocks::<&str>::default();
        let _a = locks.lock("a").await;
        let b = tokio::time::timeout(std::time::Duration::from_secs(1), locks.lock("b")).await;
        assert!(b.is_ok());
    }
}
